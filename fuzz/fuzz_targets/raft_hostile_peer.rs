#![no_main]

use libfuzzer_sys::fuzz_target;

// Three Raft nodes on a network the fuzzer schedules, fed hostile peer
// messages: election safety, committed entries and the counter never
// change or go down, out-of-bounds numbers are refused, and a leader is
// elected again once the hostile input stops.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::raft_hostile_peer(data));
