#![no_main]

use libfuzzer_sys::fuzz_target;

// The lock table against a naive reference model, on arbitrary operation
// sequences.
fuzz_target!(|data: &[u8]| ticketing_sim::fuzzing::sim_lock_table(data));
