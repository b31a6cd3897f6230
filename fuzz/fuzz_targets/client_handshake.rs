#![no_main]

use libfuzzer_sys::fuzz_target;

// Both sides of the client handshake with three tokens configured and
// both byte streams split, corrupted or replaced.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::client_handshake(data));
