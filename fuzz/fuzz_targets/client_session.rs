#![no_main]

use libfuzzer_sys::fuzz_target;

// The client session against a hostile server: each request id resolves
// exactly once, nothing after Closed, the Indeterminate rules hold.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::client_session(data));
