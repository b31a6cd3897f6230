#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::line_decoder(data));
