//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) through the
//! same entry points the cargo-fuzz targets call, plus a fixed batch of
//! pseudo-random inputs, so that stable CI exercises them without nightly.

#[path = "../../fuzz/corpus_replay.rs"]
mod corpus_replay;

use corpus_replay::{pseudo_random_inputs, replay};
use ticketing_core::testing::fuzzing;

#[test]
fn request_decoder_corpus() {
    replay("request_decoder", fuzzing::request_decoder);
    for input in pseudo_random_inputs(1, 2_000, 512) {
        fuzzing::request_decoder(&input);
    }
}

#[test]
fn reply_decoder_corpus() {
    replay("reply_decoder", fuzzing::reply_decoder);
    for input in pseudo_random_inputs(2, 2_000, 256) {
        fuzzing::reply_decoder(&input);
    }
}

#[test]
fn server_session_corpus() {
    replay("server_session", fuzzing::server_session);
    for input in pseudo_random_inputs(3, 1_000, 400) {
        fuzzing::server_session(&input);
    }
}

#[test]
fn peer_decoder_corpus() {
    replay("peer_decoder", fuzzing::peer_decoder);
    for input in pseudo_random_inputs(4, 2_000, 512) {
        fuzzing::peer_decoder(&input);
    }
}

#[test]
fn raft_hostile_peer_corpus() {
    replay("raft_hostile_peer", fuzzing::raft_hostile_peer);
    for input in pseudo_random_inputs(5, 300, 600) {
        fuzzing::raft_hostile_peer(&input);
    }
}

#[test]
fn client_session_corpus() {
    replay("client_session", fuzzing::client_session);
    for input in pseudo_random_inputs(6, 2_000, 400) {
        fuzzing::client_session(&input);
    }
}

#[test]
fn client_handshake_corpus() {
    replay("client_handshake", fuzzing::client_handshake);
    for input in pseudo_random_inputs(7, 2_000, 200) {
        fuzzing::client_handshake(&input);
    }
}

#[test]
fn replicated_codecs_corpus() {
    replay("replicated_codecs", fuzzing::replicated_codecs);
    for input in pseudo_random_inputs(8, 2_000, 400) {
        fuzzing::replicated_codecs(&input);
    }
}

#[test]
fn cluster_clients_corpus() {
    replay("cluster_clients", fuzzing::cluster_clients);
    for input in pseudo_random_inputs(9, 50, 400) {
        fuzzing::cluster_clients(&input);
    }
}

#[test]
fn peer_handshake_corpus() {
    replay("peer_handshake", fuzzing::peer_handshake);
    for input in pseudo_random_inputs(10, 3_000, 200) {
        fuzzing::peer_handshake(&input);
    }
    // Untouched handshakes, every token pairing, delivered in one go or
    // byte by byte: each completes exactly when a token is shared.
    for config in 0..=u8::MAX {
        fuzzing::peer_handshake(&[config]);
        let mut bytes = vec![config, 1, 2, 3, 4];
        for _ in 0..60 {
            bytes.extend_from_slice(&[0, 0, 0x10, 0]);
        }
        fuzzing::peer_handshake(&bytes);
    }
}

#[test]
fn cluster_peer_frames_corpus() {
    replay("cluster_peer_frames", fuzzing::cluster_peer_frames);
    for input in pseudo_random_inputs(11, 60, 300) {
        fuzzing::cluster_peer_frames(&input);
    }
}

#[test]
fn line_decoder_corpus() {
    replay("line_decoder", fuzzing::line_decoder);
    for input in pseudo_random_inputs(21, 2_000, 512) {
        fuzzing::line_decoder(&input);
    }
}

#[test]
fn line_session_corpus() {
    replay("line_session", fuzzing::line_session);
    for input in pseudo_random_inputs(22, 1_000, 400) {
        fuzzing::line_session(&input);
    }
}
