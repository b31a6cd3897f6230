//! The single-mode server state machine driven directly: handshake, routing of
//! replies, connection lifecycle and ghost grants. Time is injected; nothing
//! sleeps.

use ticketing_core::auth::{ClientHandshake, ClientTokens, SINGLE_FINGERPRINT, WireMode};
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnState, Server, ServerConfig};
use ticketing_core::testing::net::{FIRST_TOKEN, LOOPBACK, SingleNet, decode_replies};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    AcquireRequest, ErrorCode, Key, KeyGroup, ReleaseRequest, Reply, Request,
};

const TOKEN_A: &str = "0123456789abcdef0123456789abcdef";

fn keys(names: &[&str]) -> KeyGroup {
    let keys = names
        .iter()
        .map(|name| Key::new(name.as_bytes()).unwrap())
        .collect();
    KeyGroup::new(keys).unwrap()
}

fn acquire(rid: u64, key: &str, wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: keys(&[key]),
        set: false,
    })
}

fn acquire_set(rid: u64, names: &[&str], wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: keys(names),
        set: true,
    })
}

fn release(rid: u64, key: &str, token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: keys(&[key]),
        set: false,
    })
}

fn encode(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(&mut out);
    out
}

/// A server that accepts [`TOKEN_A`] and no other token.
fn token_a_only() -> ServerConfig {
    ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    }
}

/// Asserts that `replies` is one grant, for request `rid`.
fn assert_granted(replies: &[Reply], rid: u64) {
    assert!(
        matches!(replies, [Reply::Acquired { rid: got, .. }] if *got == rid),
        "expected one grant for rid {rid}, got {replies:?}"
    );
}

fn granted_token(replies: &[Reply]) -> u64 {
    match replies {
        [Reply::Acquired { token, .. }] => *token,
        other => panic!("expected one grant, got {other:?}"),
    }
}

#[test]
fn hello_is_single_mode_and_handshake_accepts_the_empty_token() {
    let mut h = SingleNet::default();
    let (_, hello) = h.open();
    assert_eq!(hello.len(), 28);
    assert_eq!(&hello[..8], b"TCKCLI3\0");
    assert_eq!(&hello[8..10], &[0, 3]);
    assert_eq!(hello[10], 0, "mode single");
    assert_eq!(hello[11], 0xFF, "single mode has no slot");
    // The shared hello: the nonce is also a line challenge (space first,
    // LF last), the CSPRNG bytes between mapped away from line ends.
    let mut shaped = [0x5a; 16];
    ticketing_core::line::shape_shared_nonce(&mut shaped);
    assert_eq!(hello[12..], shaped);
    assert_eq!(hello[12], b' ');
    assert_eq!(hello[27], b'\n');
    let conn = h.connect();
    let token = granted_token(&h.call(conn, &acquire(1, "k", 0, 30)));
    assert_eq!(token, FIRST_TOKEN);
}

#[test]
fn a_wrong_proof_is_answered_zero_and_the_connection_closes() {
    let mut h = SingleNet::new(token_a_only());
    let (conn, _hello) = h.open();
    h.server.handle_input(h.now, conn, &[7u8; 32]);
    let (bytes, state) = h.take_unflushed(conn);
    assert_eq!(bytes, vec![0x00]);
    assert_eq!(state, ConnState::CloseAfterFlush);
    // Nothing it sends afterwards is read.
    h.send(conn, &acquire(1, "k", 0, 30));
    assert!(h.take_unflushed(conn).0.is_empty());
    h.server.handle_closed(h.now, conn);
    assert_eq!(h.server.stats().connections, 0);
}

#[test]
fn configured_token_is_accepted_and_empty_token_refused() {
    let mut h = SingleNet::new(token_a_only());
    // The configured token: the server answers the acceptance byte 1 and
    // keeps the connection open, and the session is served.
    let (conn, hello) = h.open();
    assert_eq!(
        h.prove(conn, &hello, TOKEN_A.as_bytes()),
        (vec![0x01], ConnState::Open)
    );
    let token = granted_token(&h.call(conn, &acquire(1, "k", 0, 30)));
    assert_eq!(token, FIRST_TOKEN);

    // The empty token: the refusal byte 0, and the connection closes.
    let (conn, hello) = h.open();
    let mut client = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    client.handle_input(&hello);
    h.server.handle_input(h.now, conn, &client.proof().unwrap());
    assert_eq!(
        h.take_unflushed(conn),
        (vec![0x00], ConnState::CloseAfterFlush)
    );
}

#[test]
fn a_frame_sent_instead_of_the_proof_is_rejected() {
    let mut h = SingleNet::default();
    let (conn, _) = h.open();
    let long_key = "k".repeat(100);
    h.send(conn, &acquire(1, &long_key, 0, 30));
    assert_eq!(
        h.take_unflushed(conn),
        (vec![0x00], ConnState::CloseAfterFlush)
    );
}

#[test]
fn an_unfinished_handshake_is_closed_after_three_seconds() {
    let mut h = SingleNet::default();
    let (conn, _) = h.open();
    h.server.handle_input(h.now, conn, &[1, 2, 3]);
    assert!(h.server.poll_timeout() <= Some(h.now.saturating_add(Duration::from_secs(3))));
    h.advance(Duration::from_millis(2_999));
    assert_eq!(h.take_unflushed(conn), (vec![], ConnState::Open));
    h.advance(Duration::from_millis(1));
    assert_eq!(
        h.take_unflushed(conn),
        (vec![], ConnState::CloseAfterFlush),
        "no result byte, just closed"
    );
}

#[test]
fn proof_and_pipelined_requests_in_one_segment_byte_by_byte() {
    let mut h = SingleNet::default();
    let (conn, hello) = h.open();
    let mut client = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    client.handle_input(&hello);
    let mut bytes = client.proof().unwrap().to_vec();
    for rid in 1..=3 {
        bytes.extend(encode(&acquire(rid, &format!("k{rid}"), 0, 30)));
    }
    for byte in bytes {
        h.server.handle_input(h.now, conn, &[byte]);
    }
    let (out, state) = h.take_unflushed(conn);
    assert_eq!(state, ConnState::Open);
    assert_eq!(out[0], 0x01);
    let replies = decode_replies(&out[1..]);
    let tokens: Vec<(u64, u64)> = replies
        .iter()
        .map(|reply| match reply {
            Reply::Acquired { rid, token } => (*rid, *token),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        tokens,
        vec![(1, FIRST_TOKEN), (2, FIRST_TOKEN + 1), (3, FIRST_TOKEN + 2)]
    );
}

#[test]
fn release_on_the_other_connection_hands_over_to_the_waiter() {
    let mut h = SingleNet::default();
    let [a, b, c] = h.connections();
    let token = granted_token(&h.call(a, &acquire(1, "k", 5, 30)));
    assert!(
        h.call(c, &acquire(1, "k", 5, 30)).is_empty(),
        "queued, no reply yet"
    );
    // The holder's release arrives on another connection of the same client.
    assert_eq!(
        h.call(b, &release(9, "k", token)),
        vec![Reply::Released { rid: 9 }]
    );
    assert_eq!(h.woken(), vec![c]);
    let handed = granted_token(&h.replies(c));
    assert!(handed > token);
}

#[test]
fn out_of_range_fields_get_their_error_code_and_the_session_goes_on() {
    let mut h = SingleNet::default();
    let conn = h.connect();
    // lease 0 on the wire: build the frame by hand, the encoder is for valid requests.
    let mut frame = vec![b'A', 0, 11];
    frame.extend(5u64.to_be_bytes());
    frame.extend([0, 0, b'k']);
    h.server.handle_input(h.now, conn, &frame);
    assert_eq!(
        h.replies(conn),
        vec![Reply::Error {
            rid: 5,
            code: ErrorCode::BadLease
        }]
    );
    assert_eq!(h.call(conn, &acquire(6, "k", 0, 30)).len(), 1);
}

#[test]
fn an_unparsable_frame_closes_but_keeps_delivered_grants_and_frees_undelivered_ones() {
    let mut h = SingleNet::default();
    let [observer, conn] = h.connections();
    let delivered = granted_token(&h.call(conn, &acquire(1, "delivered", 0, 30)));
    h.send(conn, &acquire(2, "undelivered", 0, 30));
    // The grant for "undelivered" is queued for sending; now garbage arrives.
    h.server.handle_input(h.now, conn, &[b'X', 0, 1, 0]);
    let (bytes, state) = h.take_unflushed(conn);
    assert_eq!(state, ConnState::CloseAfterFlush);
    assert_granted(&decode_replies(&bytes), 2);
    // The write never completes: the transport dies.
    h.server.handle_closed(h.now, conn);
    assert_eq!(
        h.call(observer, &acquire(1, "delivered", 0, 30)),
        vec![Reply::TimedOut { rid: 1 }]
    );
    let again = granted_token(&h.call(observer, &acquire(2, "undelivered", 0, 30)));
    assert!(again > delivered);
    // The delivered grant is still releasable by its holder's token.
    assert_eq!(
        h.call(observer, &release(3, "delivered", delivered)),
        vec![Reply::Released { rid: 3 }]
    );
}

#[test]
fn a_closed_waiter_leaves_the_queue_and_the_next_one_is_served() {
    let mut h = SingleNet::default();
    let [holder, quitter, patient] = h.connections();
    let token = granted_token(&h.call(holder, &acquire(1, "k", 0, 30)));
    h.call(quitter, &acquire(1, "k", 10, 30));
    h.call(patient, &acquire(1, "k", 10, 30));
    h.server.handle_closed(h.now, quitter);
    h.call(holder, &release(2, "k", token));
    assert_granted(&h.replies(patient), 1);
    assert_eq!(h.server.stats().lock.waiters, 0);
}

#[test]
fn a_handoff_grant_to_a_connection_that_dies_before_flushing_moves_on() {
    let mut h = SingleNet::default();
    let [holder, doomed, next] = h.connections();
    let token = granted_token(&h.call(holder, &acquire(1, "k", 0, 30)));
    h.call(doomed, &acquire(1, "k", 10, 30));
    h.call(next, &acquire(1, "k", 10, 30));
    h.call(holder, &release(2, "k", token));
    // The driver took the bytes for `doomed` but the write failed.
    let (bytes, _) = h.take_unflushed(doomed);
    assert!(matches!(
        decode_replies(&bytes)[..],
        [Reply::Acquired { .. }]
    ));
    assert!(h.replies(next).is_empty());
    h.server.handle_closed(h.now, doomed);
    assert_granted(&h.replies(next), 1);
}

#[test]
fn a_flushed_grant_survives_its_connection() {
    let mut h = SingleNet::default();
    let [holder, other] = h.connections();
    h.call(holder, &acquire(1, "k", 0, 30));
    h.server.handle_closed(h.now, holder);
    assert_eq!(
        h.call(other, &acquire(1, "k", 0, 30)),
        vec![Reply::TimedOut { rid: 1 }]
    );
    // ... until its lease ends.
    h.advance(Duration::from_secs(30));
    assert_eq!(h.call(other, &acquire(2, "k", 0, 30)).len(), 1);
}

#[test]
fn in_flight_limit_answers_busy() {
    let config = ServerConfig {
        in_flight_per_connection_max: 2,
        ..ServerConfig::default()
    };
    let mut h = SingleNet::new(config);
    let [holder, conn] = h.connections();
    h.call(holder, &acquire(1, "k", 0, 30));
    assert!(h.call(conn, &acquire(1, "k", 10, 30)).is_empty());
    assert!(h.call(conn, &acquire(2, "k", 10, 30)).is_empty());
    assert_eq!(
        h.call(conn, &acquire(3, "k", 10, 30)),
        vec![Reply::Busy { rid: 3 }]
    );
}

#[test]
fn connection_limit_refuses_the_next_connection() {
    let config = ServerConfig {
        connections_max: 2,
        ..ServerConfig::default()
    };
    let mut h = SingleNet::new(config);
    let first = h.connect();
    h.connect();
    assert_eq!(h.server.handle_connect(h.now, [0; 16], LOOPBACK), None);
    h.server.handle_closed(h.now, first);
    assert!(h.server.handle_connect(h.now, [0; 16], LOOPBACK).is_some());
}

#[test]
fn a_single_server_refuses_peer_and_dialed_connections_and_never_counts_as_quiesced() {
    let mut h = SingleNet::default();
    let conn = h.connect();
    assert_eq!(h.server.handle_peer_accept(h.now, [0; 16], LOOPBACK), None);
    assert_eq!(h.server.handle_dialed(h.now, 1, [0; 16]), None);
    assert_eq!(h.outputs.dial(&mut h.server, h.now), None);
    assert_eq!(h.server.stats().connections, 1, "nothing but the client");
    // Shutdown waits for every connection: the server never says the rest
    // may be dropped, not even once they are all gone.
    h.server.begin_shutdown(h.now);
    assert!(!h.server.quiesced());
    h.server.handle_closed(h.now, conn);
    assert_eq!(h.server.stats().connections, 0);
    assert!(!h.server.quiesced());
    assert_eq!(h.server.node_id(), None);
    assert!(h.outputs.node_events(&mut h.server, h.now).is_empty());
}

#[test]
fn queued_waiter_gets_timeout_reply_at_wait_minus_margin() {
    let mut h = SingleNet::default();
    let [holder, waiter] = h.connections();
    h.call(holder, &acquire(1, "k", 0, 60));
    h.call(waiter, &acquire(7, "k", 2, 30));
    h.advance(Duration::from_millis(1_899));
    assert!(h.replies(waiter).is_empty());
    h.advance(Duration::from_millis(1));
    assert_eq!(h.replies(waiter), vec![Reply::TimedOut { rid: 7 }]);
}

#[test]
fn shutdown_answers_waiters_and_closes_everything() {
    let mut h = SingleNet::default();
    let [holder, waiter] = h.connections();
    h.call(holder, &acquire(1, "k", 0, 60));
    h.call(waiter, &acquire(7, "k", 30, 30));
    h.server.begin_shutdown(h.now);
    let (bytes, state) = h.take_unflushed(waiter);
    assert_eq!(decode_replies(&bytes), vec![Reply::TimedOut { rid: 7 }]);
    assert_eq!(state, ConnState::CloseAfterFlush);
    assert_eq!(h.take_unflushed(holder).1, ConnState::CloseAfterFlush);
    assert_eq!(h.server.handle_connect(h.now, [0; 16], LOOPBACK), None);
}

#[test]
fn a_reader_that_does_not_drain_replies_stops_being_read() {
    let config = ServerConfig {
        outbound_bytes_per_connection_max: 64,
        ..ServerConfig::default()
    };
    let mut h = SingleNet::new(config);
    let conn = h.connect();
    assert!(h.server.wants_input(conn));
    for rid in 1..=4 {
        h.send(conn, &acquire(rid, &format!("k{rid}"), 0, 30));
    }
    assert!(
        !h.server.wants_input(conn),
        "4 replies of 19 bytes are over 64"
    );
    h.replies(conn);
    assert!(h.server.wants_input(conn));
}

#[test]
fn each_connection_is_woken_once_until_its_bytes_are_taken() {
    let mut h = SingleNet::default();
    let conn = h.connect();
    h.send(conn, &acquire(1, "a", 0, 30));
    h.send(conn, &acquire(2, "b", 0, 30));
    assert_eq!(h.woken(), vec![conn]);
    assert_eq!(decode_replies(&h.take_unflushed(conn).0).len(), 2);
    h.send(conn, &acquire(3, "c", 0, 30));
    assert_eq!(h.woken(), vec![conn]);
}

/// Found by fuzzing: cancelling a closing connection's first waiter granted
/// its second one, whose grant then had nobody to go to and blocked the key.
#[test]
fn closing_a_connection_passes_on_grants_made_to_its_own_later_waiters() {
    let mut h = SingleNet::default();
    let [holder, closing, patient] = h.connections();
    granted_token(&h.call(holder, &acquire(1, "a", 0, 60)));
    let set = acquire_set(1, &["a", "k"], 10, 30);
    // "k" is free but the set is first in its queue, so both wait.
    assert!(h.call(closing, &set).is_empty());
    assert!(h.call(closing, &acquire(2, "k", 10, 30)).is_empty());
    assert!(h.call(patient, &acquire(1, "k", 10, 30)).is_empty());
    h.server.handle_closed(h.now, closing);
    assert_granted(&h.replies(patient), 1);
    assert_eq!(h.server.stats().lock.waiters, 0);
}

/// Found by the simulator: a take written in parts. A grant whose frame went
/// out whole may be in the client's hands and must stay held; a grant whose
/// frame did not go out whole is released when the connection dies.
#[test]
fn a_short_write_keeps_grants_written_whole_and_releases_the_rest() {
    let mut h = SingleNet::default();
    let [observer, conn] = h.connections();
    h.send(conn, &acquire(1, "first", 0, 30));
    h.send(conn, &acquire(2, "second", 0, 30));
    let (bytes, _) = h.take_unflushed(conn);
    let first_frame = match Reply::decode(&bytes).unwrap() {
        Some((Reply::Acquired { rid: 1, .. }, used)) => used,
        other => panic!("expected the first grant, got {other:?}"),
    };
    // The first frame and part of the second reach the socket, then it dies.
    h.server.handle_written(h.now, conn, first_frame + 3);
    h.server.handle_closed(h.now, conn);
    assert_eq!(
        h.call(observer, &acquire(1, "first", 0, 30)),
        vec![Reply::TimedOut { rid: 1 }],
        "a grant written whole stays held"
    );
    assert!(
        matches!(
            h.call(observer, &acquire(2, "second", 0, 30))[..],
            [Reply::Acquired { rid: 2, .. }]
        ),
        "a grant cut off mid-frame is released"
    );
}

/// Found by the simulator: with two waiters of one connection on one key, the
/// order of cancelling them on close decided whether a token was burned, and
/// that order came from hashing. Cancelling the latest first burns none.
#[test]
fn closing_a_connection_with_two_waiters_on_one_key_burns_no_token() {
    let mut h = SingleNet::default();
    let [holder, closing, next] = h.connections();
    let held = granted_token(&h.call(holder, &acquire(1, "a", 0, 60)));
    let set = acquire_set(1, &["a", "k"], 10, 30);
    // "k" is free, but the set is first in its queue and waits for "a".
    h.call(closing, &set);
    h.call(closing, &acquire(2, "k", 10, 30));
    h.call(next, &acquire(1, "k", 10, 30));
    h.server.handle_closed(h.now, closing);
    assert_eq!(granted_token(&h.replies(next)), held + 1);
}

// ---------------------------------------------------------------------------
// The token reserve: no token above what the driver made durable
// ---------------------------------------------------------------------------

const STEP: u64 = 1_000;

/// A server whose reserve starts with nothing durable (a first start).
fn with_reserve(stored: Option<u64>) -> SingleNet {
    let mut h = SingleNet::default();
    let first = ticketing_core::reserve::start_token(Duration::from_micros(FIRST_TOKEN), stored);
    h.server = Server::new(ServerConfig::default(), first, h.now)
        .with_token_reserve(h.now, TokenReserve::new(STEP, stored));
    h
}

use ticketing_core::reserve::{TokenAlert, TokenReserve};

/// A server that starts at `first` with `durable` already stored.
fn with_durable(first: u64, durable: u64) -> SingleNet {
    let mut h = SingleNet::default();
    h.server = Server::new(ServerConfig::default(), first, h.now)
        .with_token_reserve(h.now, TokenReserve::new(STEP, Some(durable)));
    h
}

#[test]
fn nothing_is_granted_before_the_first_reserve_is_durable() {
    let mut h = with_reserve(None);
    let conn = h.connect();
    assert_eq!(
        h.call(conn, &acquire(1, "k", 0, 30)),
        [Reply::Busy { rid: 1 }]
    );
    assert_eq!(
        h.outputs.reserve(&mut h.server, h.now),
        Some(FIRST_TOKEN + STEP)
    );
    // One write at a time.
    assert_eq!(h.outputs.reserve(&mut h.server, h.now), None);
    h.server.handle_reserve_persisted(h.now, FIRST_TOKEN + STEP);
    assert_eq!(
        granted_token(&h.call(conn, &acquire(2, "k", 0, 30))),
        FIRST_TOKEN
    );
    assert!(matches!(
        h.outputs.alerts(&mut h.server, h.now).first().copied(),
        Some(TokenAlert::Exhausted { .. })
    ));
}

#[test]
fn the_next_reserve_is_asked_for_half_a_step_early_and_never_overrun() {
    let mut h = with_reserve(None);
    let limit = FIRST_TOKEN + STEP;
    h.outputs.reserve(&mut h.server, h.now);
    h.server.handle_reserve_persisted(h.now, limit);
    let conn = h.connect();
    let mut asked = None;
    let mut last = 0;
    for rid in 1..=STEP + 10 {
        let replies = h.call(conn, &acquire(rid, &format!("k{rid}"), 0, 30));
        match replies[..] {
            [Reply::Acquired { token, .. }] => {
                assert!(token <= limit, "token {token} above the durable {limit}");
                last = token;
            }
            [Reply::Busy { .. }] => {
                assert_eq!(last, limit, "refused before the reserve was used up");
                break;
            }
            ref other => panic!("unexpected {other:?}"),
        }
        if asked.is_none() {
            asked = h
                .outputs
                .reserve(&mut h.server, h.now)
                .map(|value| (value, last));
        }
    }
    // Asked once the next token came within STEP / 2 of the reserve: the
    // grant of `limit - STEP / 2` made the next token `limit - STEP / 2 + 1`.
    let (value, at_token) = asked.expect("a write was asked for");
    assert_eq!(at_token, limit - STEP / 2);
    assert_eq!(value, limit - STEP / 2 + 1 + STEP);
    assert_eq!(last, limit);
    // The write lands: grants resume right above the old reserve.
    h.server.handle_reserve_persisted(h.now, value);
    let token = granted_token(&h.call(conn, &acquire(1, "again", 0, 30)));
    assert_eq!(token, limit + 1);
}

#[test]
fn a_queued_waiter_keeps_its_place_until_the_reserve_grows() {
    // Only `start` itself is durable and the next write is slow: one
    // grant, then none.
    let start = FIRST_TOKEN;
    let mut h = with_durable(start, start);
    let asked = h
        .outputs
        .reserve(&mut h.server, h.now)
        .expect("a write is asked for");
    let [holder, waiter] = h.connections();
    let token = granted_token(&h.call(holder, &acquire(1, "k", 0, 30)));
    assert_eq!(token, start);
    h.send(waiter, &acquire(7, "k", 10, 30));
    assert!(h.replies(waiter).is_empty(), "queued");
    assert_eq!(
        h.call(holder, &release(2, "k", token)),
        [Reply::Released { rid: 2 }]
    );
    // The key is free but no token is durable: the waiter keeps waiting.
    assert!(h.replies(waiter).is_empty());
    h.advance(Duration::from_secs(1));
    assert!(h.replies(waiter).is_empty());
    // The asked-for write lands: the waiter is granted at once.
    assert_eq!(asked, start + STEP);
    h.server.handle_reserve_persisted(h.now, asked);
    assert_eq!(h.woken(), vec![waiter]);
    let replies = h.replies(waiter);
    assert!(matches!(replies[..], [Reply::Acquired { rid: 7, token }] if token == start + 1));
}

#[test]
fn a_waiter_held_back_by_the_reserve_still_times_out() {
    let mut h = with_durable(FIRST_TOKEN, FIRST_TOKEN);
    let [holder, waiter] = h.connections();
    let token = granted_token(&h.call(holder, &acquire(1, "k", 0, 30)));
    h.send(waiter, &acquire(7, "k", 2, 30));
    h.call(holder, &release(2, "k", token));
    // The write keeps failing; the wait ends with T (minus the margin).
    h.outputs
        .reserve(&mut h.server, h.now)
        .expect("a write is asked for");
    h.server.handle_reserve_failed(h.now);
    assert_eq!(
        h.outputs.reserve(&mut h.server, h.now),
        None,
        "not at once again"
    );
    assert!(matches!(
        h.outputs.alerts(&mut h.server, h.now).into_iter().last(),
        Some(TokenAlert::PersistFailed { .. })
    ));
    h.advance(Duration::from_millis(1_900));
    assert_eq!(h.replies(waiter), [Reply::TimedOut { rid: 7 }]);
    // Retried after the pause the core asks for (1 s, already passed).
    assert!(h.outputs.reserve(&mut h.server, h.now).is_some());
    assert_eq!(h.server.stats().reserve.persist_failures, 1);
}
