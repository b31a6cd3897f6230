//! What the published client never sends, sent from a raw socket: bad
//! proofs, malformed and oversized frames, out-of-range fields. Each test
//! checks the server's answer (or its silence and close) and that nothing
//! already granted is lost.

mod common;

use std::time::Duration;

use common::raw::{Raw, acquire, release};
use common::{loopback_server, loopback_settings, wait_for_connections};
use ticketing_core::auth::{ClientHandshakeStatus, HELLO_LEN, PROOF_LEN, RESULT_REJECTED};
use ticketing_core::wire::{ErrorCode, Reply};
use ticketing_tokio::{RunningServer, spawn_server};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Takes `name` with wait 0 on `raw` and returns the token.
async fn hold(raw: &mut Raw, rid: u64, name: &str) -> u64 {
    raw.send(&acquire(rid, name, 0, 30)).await;
    match raw.reply().await {
        Reply::Acquired { rid: got, token } if got == rid => token,
        other => panic!("expected A for rid {rid}, got {other:?}"),
    }
}

/// Asks for `name` with wait 0 on a new connection and returns the reply.
async fn try_now(server: &RunningServer, name: &str) -> Reply {
    let mut other = Raw::connect(server, b"").await;
    other.send(&acquire(1, name, 0, 30)).await;
    other.reply().await
}

#[tokio::test]
async fn a_bad_proof_is_rejected_then_closed() {
    let server = loopback_server().await;
    // No tokens configured: only the empty token is accepted.
    let (raw, status) = Raw::try_connect(&server, b"not-the-empty-token-at-all").await;
    assert_eq!(status, ClientHandshakeStatus::Rejected);
    assert_eq!(raw.read_until_closed().await, b"");
    server.shutdown().await;
}

#[tokio::test]
async fn a_frame_in_place_of_the_proof_is_rejected_and_never_served() {
    let server = loopback_server().await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    // Sent before the hello is even read; exactly proof-sized so that the
    // server consumes all of it (no reset hides its reply).
    let frame = acquire(1, "k-sent-as-the-proof", 0, 30).to_frame();
    assert_eq!(frame.len(), PROOF_LEN);
    stream.write_all(&frame).await.unwrap();
    let raw = Raw {
        stream,
        buf: Vec::new(),
    };
    let received = raw.read_until_closed().await;
    assert_eq!(received.len(), HELLO_LEN + 1, "{received:?}");
    assert_eq!(received[HELLO_LEN], RESULT_REJECTED);
    assert_eq!(server.stats().lock.keys, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn a_partial_proof_is_closed_at_the_handshake_deadline() {
    let mut settings = loopback_settings();
    settings.server.handshake_timeout = Duration::from_millis(300);
    let server = spawn_server(settings).await.unwrap();
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    stream.write_all(&[0u8; PROOF_LEN - 1]).await.unwrap();
    let raw = Raw {
        stream,
        buf: Vec::new(),
    };
    // The hello and nothing else: no result byte for an unfinished proof.
    assert_eq!(raw.read_until_closed().await.len(), HELLO_LEN);
    server.shutdown().await;
}

/// Sends `bytes` on an accepted session and expects the server to close it
/// without a reply.
async fn closes_without_reply(server: &RunningServer, bytes: &[u8]) {
    let mut raw = Raw::connect(server, b"").await;
    // The server may close before it has read everything; a failed write is
    // then part of the expected outcome.
    let _ = raw.stream.write_all(bytes).await;
    assert_eq!(raw.read_until_closed().await, b"", "reply to {bytes:?}");
}

#[tokio::test]
async fn an_oversized_set_frame_closes_the_connection() {
    let server = loopback_server().await;
    closes_without_reply(&server, &[b'S', 0xFF, 0xFF]).await;
    server.shutdown().await;
}

#[tokio::test]
async fn an_acquire_one_byte_over_its_maximum_closes_the_connection() {
    let server = loopback_server().await;
    // rid · wait · lease · 129-byte key: body_len 139, one over A's 138.
    let mut frame = vec![b'A', 0, 139];
    frame.extend_from_slice(&1u64.to_be_bytes());
    frame.extend_from_slice(&[0, 30]);
    frame.extend_from_slice(&[b'x'; 129]);
    closes_without_reply(&server, &frame).await;
    assert_eq!(server.stats().lock.keys, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn a_zero_body_len_closes_the_connection() {
    let server = loopback_server().await;
    closes_without_reply(&server, &[b'A', 0, 0]).await;
    server.shutdown().await;
}

#[tokio::test]
async fn rid_zero_closes_the_connection() {
    let server = loopback_server().await;
    closes_without_reply(&server, &acquire(0, "k", 0, 30).to_frame()).await;
    assert_eq!(server.stats().lock.keys, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn an_unknown_op_closes_the_connection() {
    let server = loopback_server().await;
    let mut frame = vec![b'X', 0, 10];
    frame.extend_from_slice(&1u64.to_be_bytes());
    frame.extend_from_slice(&[0, 30]);
    closes_without_reply(&server, &frame).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_truncated_frame_then_eof_grants_nothing() {
    let server = loopback_server().await;
    let mut raw = Raw::connect(&server, b"").await;
    // The frame announces the key "abcde" but only "abc" arrives; a server
    // that acted on the partial body would grant "abc" and reply.
    let frame = acquire(1, "abcde", 0, 30).to_frame();
    raw.stream
        .write_all(&frame[..frame.len() - 2])
        .await
        .unwrap();
    raw.stream.shutdown().await.unwrap();
    assert_eq!(raw.read_until_closed().await, b"");
    wait_for_connections(&server, 0).await;
    assert_eq!(server.stats().lock.keys, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn an_out_of_range_lease_is_e2_and_the_session_goes_on() {
    let server = loopback_server().await;
    let mut raw = Raw::connect(&server, b"").await;
    for (rid, lease) in [(1, 0), (2, 251)] {
        raw.send(&acquire(rid, "k", 0, lease)).await;
        assert_eq!(
            raw.reply().await,
            Reply::Error {
                rid,
                code: ErrorCode::BadLease
            },
            "lease {lease}"
        );
    }
    assert_eq!(server.stats().lock.keys, 0);
    let token = hold(&mut raw, 3, "k").await;
    raw.send(&release(4, "k", token)).await;
    assert_eq!(raw.reply().await, Reply::Released { rid: 4 });
    server.shutdown().await;
}

#[tokio::test]
async fn a_release_with_token_zero_is_e7_and_changes_nothing() {
    let server = loopback_server().await;
    let mut raw = Raw::connect(&server, b"").await;
    let token = hold(&mut raw, 1, "k").await;
    raw.send(&release(2, "k", 0)).await;
    assert_eq!(
        raw.reply().await,
        Reply::Error {
            rid: 2,
            code: ErrorCode::BadToken
        }
    );
    assert_eq!(server.stats().lock.held_keys, 1);
    raw.send(&release(3, "k", token)).await;
    assert_eq!(raw.reply().await, Reply::Released { rid: 3 });
    server.shutdown().await;
}

#[tokio::test]
async fn a_delivered_grant_outlives_a_bad_frame_on_its_connection() {
    let server = loopback_server().await;
    let mut holder = Raw::connect(&server, b"").await;
    let token = hold(&mut holder, 1, "k").await;
    // Unknown op: the server closes the holder's connection.
    let _ = holder.stream.write_all(&[b'X', 0, 1, 0]).await;
    assert_eq!(holder.read_until_closed().await, b"");
    wait_for_connections(&server, 0).await;

    assert_eq!(server.stats().lock.held_keys, 1);
    assert_eq!(try_now(&server, "k").await, Reply::TimedOut { rid: 1 });
    // Only the token can free it, from any connection.
    let mut other = Raw::connect(&server, b"").await;
    other.send(&release(1, "k", token)).await;
    assert_eq!(other.reply().await, Reply::Released { rid: 1 });
    assert_eq!(server.stats().lock.keys, 0);
    server.shutdown().await;
}
