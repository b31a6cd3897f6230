#![no_main]

use libfuzzer_sys::fuzz_target;

// Client connections to a three-node in-memory cluster fed raw bytes,
// handshakes and requests: well-formed output, unique tokens, nothing held
// or waiting once every connection closed and every lease ran out.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::cluster_clients(data));
