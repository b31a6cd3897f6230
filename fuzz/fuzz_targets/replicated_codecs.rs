#![no_main]

use libfuzzer_sys::fuzz_target;

// The replicated-command and lock-snapshot codecs: round trips, one
// encoding per value, the token counter never goes down.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::replicated_codecs(data));
