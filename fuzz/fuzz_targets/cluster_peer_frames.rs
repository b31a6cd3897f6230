#![no_main]

use libfuzzer_sys::fuzz_target;

// Sealed hostile messages on extra authenticated peer connections into a
// three-node in-memory cluster, with clock jumps and client acquires and
// releases: one leader per term, committed entries never change, tokens
// only grow, and a leader grants again once the hostile input stops.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::cluster_peer_frames(data));
