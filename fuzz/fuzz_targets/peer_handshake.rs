#![no_main]

use libfuzzer_sys::fuzz_target;

// A real dialer and acceptor peer handshake with rotated, wrong and shared
// tokens over a network that chunks, corrupts, drops, injects, replays and
// swaps: established exactly when a token is shared and nothing was altered,
// the acceptor proves only after verifying, and the sessions match.
fuzz_target!(|data: &[u8]| ticketing_core::testing::fuzzing::peer_handshake(data));
