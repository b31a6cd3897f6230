//! The client state machines driven directly: a `Session` against the real
//! in-process `Server` (bytes shuttled by the test) and against a scripted
//! peer for the replies a correct server never sends; the logical acquire and
//! release operations; routing; backoff; parameter validation. Time is
//! injected and jumped; nothing sleeps.

use ticketing_core::auth::{ClientTokens, Hello, SINGLE_FINGERPRINT, WireMode, client_proof};
use ticketing_core::client::HandshakeClue;
use ticketing_core::client::{
    AcquireOperation, AcquireParams, AcquireStep, Backoff, BrokerConfig, BrokerMode, BrokerState,
    COALESCE_MAX_UNSENT, CancelOutcome, ClientError, CloseReason, Compensation, ExtendOperation,
    ExtendStep, Grant, KeySet, Outcome, OutcomeSender, ProtocolError, ROUTE_RUN_REQUESTS,
    ReleaseOperation, ReleaseOutcome, ReleaseQueue, ReleaseStep, Router, Session, SessionConfig,
    SessionEvent, WRITE_PROGRESS_TIMEOUT, X_CLOSES_MAX, lease_covers,
};
use ticketing_core::server::ServerConfig;
use ticketing_core::testing::net::{FIRST_TOKEN, SingleNet};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    Capabilities, Decoded, EXTENSION_VERSION, ErrorCode, ExtendStatus, NO_LEADER_SLOT, PushKind,
    Reply, ReplyError, Request, RequestDecoder,
};

const TOKEN_A: &str = "0123456789abcdef0123456789abcdef";
const CLUSTER_ID: [u8; 32] = [7; 32];

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn key(name: &str) -> KeySet {
    KeySet::single(name).unwrap()
}

fn params(wait: Duration, lease: Duration, budget: Duration) -> AcquireParams {
    AcquireParams::new(wait, lease, budget).unwrap()
}

fn drain(session: &mut Session) -> Vec<SessionEvent> {
    std::iter::from_fn(|| session.poll_event()).collect()
}

fn outcome(rid: u64, outcome: Outcome) -> SessionEvent {
    SessionEvent::Outcome { rid, outcome }
}

fn decode_requests(bytes: &[u8]) -> Vec<Request> {
    let mut decoder = RequestDecoder::new();
    decoder.push(bytes);
    let mut requests = Vec::new();
    while let Some(decoded) = decoder.next().expect("client sends valid frames") {
        match decoded {
            Decoded::Request(request) => requests.push(request),
            Decoded::Rejected { code, .. } => {
                panic!("client sent a request rejected with {code:?}")
            }
        }
    }
    assert_eq!(decoder.buffered(), 0, "client sent a partial frame");
    requests
}

// ---------------------------------------------------------------------------
// A session against the real server
// ---------------------------------------------------------------------------

// Sessions on `SingleNet` links: the net's server, one connection each,
// bytes pumped both ways until quiet after every step.

fn granted(events: &[SessionEvent], rid: u64) -> Grant {
    match events {
        [
            SessionEvent::Outcome {
                rid: got,
                outcome: Outcome::Acquired(grant),
            },
        ] if *got == rid => grant.clone(),
        other => panic!("expected a grant for rid {rid}, got {other:?}"),
    }
}

#[test]
fn handshake_with_a_real_server_then_acquire_and_release() {
    let mut live = SingleNet::new(ServerConfig::default());
    let a = live.connect_session(SessionConfig::single(b""));
    assert_eq!(drain(live.session(a)), [SessionEvent::Ready]);
    assert!(live.session(a).is_ready());

    let sent_at = live.now;
    let rid = live.acquire_on(a, key("door"), 0, 30);
    assert_eq!(rid, 1, "rids count up from 1 per connection");
    let grant = granted(&drain(live.session(a)), rid);
    assert_eq!(grant.token, FIRST_TOKEN);
    assert_eq!(grant.keys, key("door"));
    assert_eq!(grant.valid_before, sent_at.saturating_add(secs(30)));

    // Held: an immediate try is answered T at once.
    let busy = live.acquire_on(a, key("door"), 0, 30);
    assert_eq!(drain(live.session(a)), [outcome(busy, Outcome::Timeout)]);

    let released = live.release_on(a, key("door"), grant.token);
    assert_eq!(
        drain(live.session(a)),
        [outcome(released, Outcome::Released)]
    );
    let again = live.release_on(a, key("door"), grant.token);
    assert_eq!(drain(live.session(a)), [outcome(again, Outcome::NotFound)]);
    assert_eq!((busy, released, again), (2, 3, 4));
    assert_eq!(live.session(a).pending_len(), 0);
    // Every request answered: no timer is left behind.
    assert_eq!(live.session(a).poll_timeout(), None);
}

#[test]
fn key_sets_travel_as_s_and_g_and_a_deduplicated_set_as_a() {
    let mut live = SingleNet::new(ServerConfig::default());
    let a = live.connect_session(SessionConfig::single(b""));
    drain(live.session(a));

    let set = KeySet::new(&["b", "a", "c", "a"]).unwrap();
    assert!(set.is_set());
    let rid = live.acquire_on(a, set.clone(), 0, 10);
    let grant = granted(&drain(live.session(a)), rid);
    // One of the set's keys is now held: a single-key try on it fails.
    let probe = live.acquire_on(a, key("c"), 0, 10);
    assert_eq!(drain(live.session(a)), [outcome(probe, Outcome::Timeout)]);
    let released = live.release_on(a, set, grant.token);
    assert_eq!(
        drain(live.session(a)),
        [outcome(released, Outcome::Released)]
    );

    // A set that dedups to one key is a plain `A` on the wire.
    let one = KeySet::new(&["x", "x"]).unwrap();
    assert!(!one.is_set());
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    ready_single(&mut session, Instant::ZERO);
    let p = params(Duration::ZERO, secs(5), Duration::ZERO);
    session
        .submit_acquire(Instant::ZERO, one, &p, p.operation_deadline(Instant::ZERO))
        .unwrap();
    let mut out = Vec::new();
    session.poll_transmit(Instant::ZERO, &mut out);
    assert_eq!(out[0], b'A');
    assert_eq!(&out[3 + 10..], b"x");
}

#[test]
fn a_waiter_on_the_second_connection_is_granted_when_the_first_releases() {
    let mut live = SingleNet::new(ServerConfig::default());
    // One address: two connections, as the broker keeps them.
    let endpoints = BrokerConfig {
        allow_loopback_no_auth: true,
        ..BrokerConfig::single("127.0.0.1:5225", "")
    }
    .endpoints()
    .unwrap();
    let a = live.connect_session(endpoints[0].session.clone());
    let b = live.connect_session(endpoints[1].session.clone());
    drain(live.session(a));
    drain(live.session(b));

    let first = live.acquire_on(a, key("k"), 0, 30);
    let grant = granted(&drain(live.session(a)), first);
    let waiter = live.acquire_on(b, key("k"), 10, 30);
    assert!(drain(live.session(b)).is_empty(), "queued on the server");
    live.advance(secs(2));
    let released = live.release_on(a, key("k"), grant.token);
    assert_eq!(
        drain(live.session(a)),
        [outcome(released, Outcome::Released)]
    );
    let next = granted(&drain(live.session(b)), waiter);
    assert!(next.token > grant.token);
}

#[test]
fn server_timeout_of_a_queued_acquire_comes_before_the_local_deadline() {
    let mut live = SingleNet::new(ServerConfig::default());
    let a = live.connect_session(SessionConfig::single(b""));
    drain(live.session(a));
    let held = live.acquire_on(a, key("k"), 0, 30);
    granted(&drain(live.session(a)), held);
    let waiter = live.acquire_on(a, key("k"), 1, 30);
    live.advance(ms(899));
    assert!(drain(live.session(a)).is_empty());
    // The server answers T 100 ms before the wait ends; the session stays.
    live.advance(ms(1));
    assert_eq!(drain(live.session(a)), [outcome(waiter, Outcome::Timeout)]);
    assert!(live.session(a).is_ready());
}

#[test]
fn a_wrong_token_is_an_auth_failure_and_the_router_reports_auth() {
    let config = ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    };
    let mut live = SingleNet::new(config);
    let good = live.connect_session(SessionConfig::single(TOKEN_A.as_bytes()));
    assert_eq!(drain(live.session(good)), [SessionEvent::Ready]);
    let bad = live.connect_session(SessionConfig::single(b"fedcba9876543210fedcba9876543210"));
    let events = drain(live.session(bad));
    assert_eq!(events, [SessionEvent::Closed(CloseReason::AuthRejected)]);
    assert!(live.session(bad).is_closed());
    assert_eq!(live.session(bad).lived(), None);

    let mut router = Router::new(1);
    for event in &events {
        router.handle_event(0, event);
    }
    assert_eq!(router.pick(), None);
    assert_eq!(router.no_connection_error(), ClientError::Auth);
}

// ---------------------------------------------------------------------------
// A session against a scripted peer
// ---------------------------------------------------------------------------

/// Completes a single-mode handshake on `session` with a scripted hello.
fn ready_single(session: &mut Session, now: Instant) {
    handshake(
        session,
        now,
        WireMode::Single,
        NO_LEADER_SLOT,
        &SINGLE_FINGERPRINT,
    );
}

fn handshake(
    session: &mut Session,
    now: Instant,
    mode: WireMode,
    slot: u8,
    fingerprint: &[u8; 32],
) {
    let hello = Hello {
        mode,
        self_slot: slot,
        nonce: [0x42; 16],
    };
    session.handle_input(now, &hello.encode());
    let mut proof = Vec::new();
    session.poll_transmit(now, &mut proof);
    session.handle_written(now, true);
    assert_eq!(proof, client_proof(b"", fingerprint, &hello));
    session.handle_input(now, &[1]);
    assert_eq!(drain(session), [SessionEvent::Ready]);
}

/// A session whose server is played by the test.
struct Scripted {
    session: Session,
    now: Instant,
}

impl Scripted {
    fn single() -> Self {
        Self::with_config(SessionConfig::single(b""))
    }

    fn cluster(slot: u8, size: usize) -> Self {
        let mut scripted = Scripted {
            session: Session::new(
                Instant::from_millis(1_000),
                SessionConfig::cluster(b"", CLUSTER_ID, slot, size),
            ),
            now: Instant::from_millis(1_000),
        };
        handshake(
            &mut scripted.session,
            scripted.now,
            WireMode::Cluster,
            slot,
            &CLUSTER_ID,
        );
        scripted
    }

    fn with_config(config: SessionConfig) -> Self {
        let now = Instant::from_millis(1_000);
        let mut session = Session::new(now, config);
        ready_single(&mut session, now);
        Scripted { session, now }
    }

    fn acquire(&mut self, name: &str, wait_s: u64) -> u64 {
        let p = params(secs(wait_s), secs(10), Duration::ZERO);
        self.session
            .submit_acquire(self.now, key(name), &p, p.operation_deadline(self.now))
            .unwrap()
    }

    fn release(&mut self, name: &str, token: u64) -> u64 {
        let op = ReleaseOperation::new(self.now, key(name), token);
        op.submit(self.now, &mut self.session).unwrap()
    }

    /// What the session hands out now, decoded.
    fn transmit(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        self.session.poll_transmit(self.now, &mut out);
        // The scripted server reads every byte at once.
        self.session.handle_written(self.now, true);
        decode_requests(&out)
    }

    fn reply(&mut self, reply: Reply) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        self.session.handle_input(self.now, &bytes);
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.session.handle_input(self.now, bytes);
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        self.session.handle_timeout(self.now);
    }

    fn events(&mut self) -> Vec<SessionEvent> {
        drain(&mut self.session)
    }
}

#[test]
fn submit_before_the_handshake_is_not_connected_and_bytes_start_with_the_proof() {
    let now = Instant::ZERO;
    let mut session = Session::new(now, SessionConfig::single(b""));
    let p = params(Duration::ZERO, secs(5), Duration::ZERO);
    assert_eq!(
        session.submit_acquire(now, key("k"), &p, p.operation_deadline(now)),
        Err(ClientError::NotConnected)
    );
    // Hello, result byte and a first frame in one segment.
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: NO_LEADER_SLOT,
        nonce: [9; 16],
    };
    session.handle_input(now, &hello.encode()[..10]);
    session.handle_input(now, &hello.encode()[10..]);
    let mut out = Vec::new();
    assert_eq!(session.poll_transmit(now, &mut out), 32);
    let mut rest = vec![1];
    Reply::Leader {
        leader_slot: NO_LEADER_SLOT,
    }
    .encode(&mut rest);
    session.handle_input(now, &rest);
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Ready, SessionEvent::LeaderHint(None)]
    );
    assert!(
        session
            .submit_acquire(now, key("k"), &p, p.operation_deadline(now))
            .is_ok()
    );
}

#[test]
fn the_wait_byte_is_what_remains_of_the_wait_at_the_send_boundary() {
    let mut s = Scripted::single();
    let started = s.now;
    let p = params(secs(3), secs(10), Duration::ZERO);
    let deadline = p.operation_deadline(started);
    assert_eq!(deadline, started.saturating_add(secs(3)));
    s.session
        .submit_acquire(started, key("k"), &p, deadline)
        .unwrap();
    s.now = started.saturating_add(ms(1_200));
    match s.transmit().as_slice() {
        [Request::Acquire(req)] => assert_eq!((req.wait_s, req.lease_s), (2, 10)),
        other => panic!("{other:?}"),
    }
    // wait 0 stays 0, and its local deadline is the 5 s transport bound.
    let immediate = params(Duration::ZERO, secs(10), Duration::ZERO);
    assert_eq!(
        immediate.operation_deadline(started),
        started.saturating_add(secs(5))
    );
    s.session
        .submit_acquire(
            s.now,
            key("j"),
            &immediate,
            immediate.operation_deadline(s.now),
        )
        .unwrap();
    match s.transmit().as_slice() {
        [Request::Acquire(req)] => assert_eq!(req.wait_s, 0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_lost_reply_after_send_is_indeterminate_and_never_resent() {
    // A silence timeout beyond the 5 s transport deadline, so that the
    // deadline is what ends the request here (the silence rule has its own
    // tests).
    let mut config = SessionConfig::single(b"");
    config.silence_timeout = secs(10);
    let mut s = Scripted::with_config(config);
    let rid = s.acquire("k", 0);
    assert_eq!(s.transmit().len(), 1);
    s.advance(ms(4_999));
    assert!(s.events().is_empty());
    assert_eq!(s.session.poll_timeout(), Some(s.now.saturating_add(ms(1))));
    s.advance(ms(1));
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::DeadlineAfterSend),
        ]
    );
    assert!(s.transmit().is_empty(), "nothing is resent");
    assert_eq!(s.session.poll_timeout(), None);

    // The logical acquire ends there: no retry of a possibly-sent request.
    let mut op = AcquireOperation::new(
        s.now,
        key("k"),
        params(Duration::ZERO, secs(10), Duration::ZERO),
    );
    assert_eq!(
        op.on_outcome(s.now, Outcome::Indeterminate),
        AcquireStep::Failed(ClientError::Indeterminate)
    );
}

#[test]
fn an_unsent_request_past_its_deadline_times_out_without_closing() {
    let mut s = Scripted::single();
    let rid = s.acquire("k", 1);
    s.advance(secs(1));
    assert_eq!(s.events(), [outcome(rid, Outcome::Timeout)]);
    assert!(s.session.is_ready());
    assert!(s.transmit().is_empty());
}

#[test]
fn when_the_session_dies_sent_requests_are_indeterminate_and_unsent_ones_retry() {
    let mut s = Scripted::single();
    let sent_acquire = s.acquire("a", 5);
    let sent_release = s.release("b", 77);
    assert_eq!(s.transmit().len(), 2);
    let unsent = s.acquire("c", 5);
    s.session.handle_transport_closed(s.now);
    assert_eq!(
        s.events(),
        [
            outcome(sent_acquire, Outcome::Indeterminate),
            outcome(sent_release, Outcome::Indeterminate),
            outcome(unsent, Outcome::Retry),
            SessionEvent::Closed(CloseReason::TransportClosed),
        ]
    );
    assert_eq!(
        s.session
            .submit_release(s.now, key("b"), 77, s.now.saturating_add(secs(1))),
        Err(ClientError::NotConnected)
    );
}

/// `M` answers one request; the server keeps serving the connection
/// (docs/protocol.md §5), so the others in flight on it get their own replies, not
/// Indeterminate, and the session stays up.
#[test]
fn moved_is_retry_with_a_leader_hint_for_that_request_only() {
    let mut s = Scripted::cluster(1, 3);
    let moved = s.acquire("a", 5);
    let other = s.acquire("b", 5);
    assert_eq!(s.transmit().len(), 2);
    let unsent = s.acquire("c", 5);
    s.reply(Reply::Moved {
        rid: moved,
        leader_slot: 2,
    });
    let events = s.events();
    assert_eq!(
        events,
        [
            outcome(moved, Outcome::Retry),
            SessionEvent::LeaderHint(Some(2)),
        ]
    );
    assert!(s.session.is_ready(), "the session goes on");
    assert_eq!(s.session.pending_len(), 2);
    // The request in flight beside it gets its own reply: here a grant
    // (the node applied it before it lost the lead).
    s.reply(Reply::Acquired {
        rid: other,
        token: 41,
    });
    assert_eq!(granted(&s.events(), other).token, 41);
    // The one not yet sent still leaves, and is answered on its own too.
    assert_eq!(s.transmit().len(), 1);
    s.reply(Reply::Moved {
        rid: unsent,
        leader_slot: 2,
    });
    assert_eq!(
        s.events(),
        [
            outcome(unsent, Outcome::Retry),
            SessionEvent::LeaderHint(Some(2)),
        ]
    );
    assert!(s.session.is_ready());
    assert_eq!(s.session.pending_len(), 0);
    // Retries go to the leader it named.
    let mut router = Router::new(3);
    for index in 0..3 {
        router.handle_event(index, &SessionEvent::Ready);
    }
    for event in &events {
        router.handle_event(1, event);
    }
    assert_eq!(router.leader(), Some(2));
    assert_eq!(router.pick(), Some(2));
    assert!(router.is_ready(1), "the node that answered M stays usable");
}

/// A second reply to a rid that `M` already answered is an unknown rid,
/// as after any other final reply.
#[test]
fn a_reply_after_moved_to_the_same_rid_closes_the_session() {
    let mut s = Scripted::cluster(1, 3);
    let moved = s.acquire("a", 5);
    s.transmit();
    s.reply(Reply::Moved {
        rid: moved,
        leader_slot: NO_LEADER_SLOT,
    });
    assert_eq!(
        s.events(),
        [
            outcome(moved, Outcome::Retry),
            SessionEvent::LeaderHint(None),
        ]
    );
    s.reply(Reply::Acquired {
        rid: moved,
        token: 5,
    });
    assert_eq!(
        s.events(),
        [SessionEvent::Closed(CloseReason::Protocol(
            ProtocolError::UnknownRid(moved)
        ))]
    );
}

/// `E 3` and `E 4` both say "no effect, not the leader": the request is
/// retried and the node, if remembered as leader, forgotten. `E 3` (a
/// learner, or a node shutting down) also ends the session; over `E 4` it
/// stays up (an election: the winner's `L` comes on it, see
/// `client_retry.rs`).
#[test]
fn not_active_and_no_leader_errors_are_retry_and_only_not_active_closes_the_session() {
    for code in [ErrorCode::NotActive, ErrorCode::NoLeader] {
        let mut s = Scripted::cluster(0, 3);
        let rid = s.release("a", 5);
        s.transmit();
        s.reply(Reply::Error { rid, code });
        let events = s.events();
        let mut expected = vec![outcome(rid, Outcome::Retry), SessionEvent::NotLeader];
        if code == ErrorCode::NotActive {
            expected.push(SessionEvent::Closed(CloseReason::ServerError(code)));
        }
        assert_eq!(events, expected);
        assert_eq!(s.session.is_ready(), code == ErrorCode::NoLeader);
        // The node was the remembered leader: it is forgotten.
        let mut router = Router::new(3);
        router.handle_event(0, &SessionEvent::Ready);
        router.handle_event(1, &SessionEvent::Ready);
        assert!(router.set_leader_hint(Some(0)));
        for event in &events {
            router.handle_event(0, event);
        }
        assert_eq!(router.leader(), None);
        // Closed on `E 3`, so the other serves; still up over `E 4`.
        assert_eq!(router.is_ready(0), code == ErrorCode::NoLeader);
        if code == ErrorCode::NotActive {
            assert_eq!(router.pick(), Some(1));
        }
    }
}

#[test]
fn any_other_error_code_is_reported_and_closes_the_session() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 5);
    s.transmit();
    s.reply(Reply::Error {
        rid,
        code: ErrorCode::BadLease,
    });
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Error(ErrorCode::BadLease)),
            SessionEvent::Closed(CloseReason::ServerError(ErrorCode::BadLease)),
        ]
    );
    let mut op = AcquireOperation::new(s.now, key("a"), params(secs(5), secs(10), Duration::ZERO));
    assert!(matches!(
        op.on_outcome(s.now, Outcome::Error(ErrorCode::BadLease)),
        AcquireStep::Failed(ClientError::Protocol(_))
    ));
}

#[test]
fn an_indeterminate_reply_is_indeterminate_and_the_session_goes_on() {
    let mut s = Scripted::cluster(0, 5);
    let rid = s.acquire("a", 5);
    s.transmit();
    s.reply(Reply::Indeterminate { rid });
    assert_eq!(s.events(), [outcome(rid, Outcome::Indeterminate)]);
    assert!(s.session.is_ready());
    let next = s.acquire("b", 5);
    assert_eq!(next, rid + 1);
}

#[test]
fn leader_notices_move_the_hint_and_only_the_latest_is_kept() {
    let mut s = Scripted::cluster(0, 5);
    s.reply(Reply::Leader { leader_slot: 3 });
    assert_eq!(s.events(), [SessionEvent::LeaderHint(Some(3))]);
    s.reply(Reply::Leader { leader_slot: 1 });
    s.reply(Reply::Leader { leader_slot: 4 });
    assert_eq!(s.events(), [SessionEvent::LeaderHint(Some(4))]);
    s.reply(Reply::Leader {
        leader_slot: NO_LEADER_SLOT,
    });
    let events = s.events();
    assert_eq!(events, [SessionEvent::LeaderHint(None)]);

    let mut router = Router::new(5);
    router.handle_event(0, &SessionEvent::Ready);
    router.handle_event(0, &SessionEvent::LeaderHint(Some(4)));
    assert_eq!(router.leader(), Some(4));
    router.handle_event(0, &events[0]);
    assert_eq!(router.leader(), None);
    assert!(s.session.is_ready());
}

/// A fresh cluster session (slot 0 of 3) with one acquire sent (rid 1) and
/// one unsent (rid 2), fed `bytes`; returns the events.
fn fed(bytes: &[u8]) -> Vec<SessionEvent> {
    let mut s = Scripted::cluster(0, 3);
    s.acquire("sent", 5);
    assert_eq!(s.transmit().len(), 1);
    s.acquire("unsent", 5);
    s.raw(bytes);
    assert!(s.session.is_closed());
    s.events()
}

fn frame(reply: Reply) -> Vec<u8> {
    let mut bytes = Vec::new();
    reply.encode(&mut bytes);
    bytes
}

#[test]
fn every_session_fatal_reply_fails_the_session() {
    let granted_then_again = [
        frame(Reply::Acquired { rid: 1, token: 9 }),
        frame(Reply::Acquired { rid: 1, token: 9 }),
    ]
    .concat();
    let cases: Vec<(&str, Vec<u8>, ProtocolError)> = vec![
        (
            "unknown rid",
            frame(Reply::TimedOut { rid: 9 }),
            ProtocolError::UnknownRid(9),
        ),
        (
            "reply to a request never handed out",
            frame(Reply::TimedOut { rid: 2 }),
            ProtocolError::UnknownRid(2),
        ),
        (
            "wrong kind",
            frame(Reply::Released { rid: 1 }),
            ProtocolError::WrongKind { rid: 1, op: b'R' },
        ),
        (
            "error code that cannot answer an acquire",
            frame(Reply::Error {
                rid: 1,
                code: ErrorCode::BadToken,
            }),
            ProtocolError::WrongKind { rid: 1, op: b'E' },
        ),
        (
            "bad slot in M",
            frame(Reply::Moved {
                rid: 1,
                leader_slot: 3,
            }),
            ProtocolError::BadSlot(3),
        ),
        (
            "bad slot in L",
            frame(Reply::Leader { leader_slot: 7 }),
            ProtocolError::BadSlot(7),
        ),
        (
            "garbage",
            b"HTTP/1.1 400".to_vec(),
            ProtocolError::Frame(ReplyError::UnknownOp(b'H')),
        ),
        (
            "wrong length",
            vec![b'T', 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            ProtocolError::Frame(ReplyError::BadLength {
                op: b'T',
                body_len: 9,
            }),
        ),
        (
            "rid 0",
            frame(Reply::TimedOut { rid: 0 }),
            ProtocolError::Frame(ReplyError::Zero),
        ),
        (
            "token 0",
            frame(Reply::Acquired { rid: 1, token: 0 }),
            ProtocolError::Frame(ReplyError::Zero),
        ),
        (
            "unknown error code",
            vec![b'E', 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 99],
            ProtocolError::Frame(ReplyError::UnknownCode(99)),
        ),
    ];
    for (name, bytes, error) in cases {
        assert_eq!(
            fed(&bytes),
            [
                outcome(1, Outcome::Indeterminate),
                outcome(2, Outcome::Retry),
                SessionEvent::Closed(CloseReason::Protocol(error)),
            ],
            "{name}"
        );
    }
    // A second reply to one request: the first is delivered, the second
    // finds no request.
    let events = fed(&granted_then_again);
    assert!(
        matches!(
            events.as_slice(),
            [
                SessionEvent::Outcome {
                    rid: 1,
                    outcome: Outcome::Acquired(_)
                },
                SessionEvent::Outcome {
                    rid: 2,
                    outcome: Outcome::Retry
                },
                SessionEvent::Closed(CloseReason::Protocol(ProtocolError::UnknownRid(1))),
            ]
        ),
        "{events:?}"
    );
}

#[test]
fn a_single_mode_session_refuses_any_leader_slot() {
    let mut s = Scripted::single();
    s.reply(Reply::Leader { leader_slot: 0 });
    assert_eq!(
        s.events(),
        [SessionEvent::Closed(CloseReason::Protocol(
            ProtocolError::BadSlot(0)
        ))]
    );
}

#[test]
fn replies_split_at_every_byte_are_decoded() {
    let mut s = Scripted::single();
    let a = s.acquire("a", 5);
    let b = s.release("b", 5);
    let c = s.acquire("c", 5);
    s.transmit();
    let stream = [
        frame(Reply::Acquired { rid: a, token: 11 }),
        frame(Reply::Leader {
            leader_slot: NO_LEADER_SLOT,
        }),
        frame(Reply::NotFound { rid: b }),
        frame(Reply::Busy { rid: c }),
    ]
    .concat();
    for byte in &stream {
        s.raw(std::slice::from_ref(byte));
    }
    let events = s.events();
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(
        matches!(&events[0], SessionEvent::Outcome { rid, outcome: Outcome::Acquired(grant) } if *rid == a && grant.token == 11)
    );
    assert_eq!(
        &events[1..],
        [
            SessionEvent::LeaderHint(None),
            outcome(b, Outcome::NotFound),
            outcome(c, Outcome::Busy),
        ]
    );
    assert!(s.session.is_ready());
}

#[test]
fn a_reply_frame_that_stalls_for_three_seconds_closes_the_session() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 30);
    s.transmit();
    let grant = frame(Reply::Acquired { rid, token: 5 });
    s.raw(&grant[..4]);
    assert_eq!(
        s.session.poll_timeout(),
        Some(s.now.saturating_add(secs(3)))
    );
    s.advance(ms(2_999));
    assert!(s.session.is_ready());
    s.advance(ms(1));
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::StalledReply),
        ]
    );
}

/// What the session hands out now, left unwritten: the driver's socket
/// takes nothing.
fn transmit_unwritten(s: &mut Scripted) -> usize {
    s.session.poll_transmit(s.now, &mut Vec::new())
}

#[test]
fn bytes_never_reported_written_close_the_session_after_the_write_progress_timeout() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 30);
    assert!(transmit_unwritten(&mut s) > 0);
    assert_eq!(
        s.session.poll_timeout(),
        Some(s.now.saturating_add(WRITE_PROGRESS_TIMEOUT))
    );
    s.advance(WRITE_PROGRESS_TIMEOUT - ms(1));
    assert!(s.session.is_ready());
    s.advance(ms(1));
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::WriteStalled),
        ]
    );
}

#[test]
fn each_write_that_takes_bytes_restarts_the_write_progress_clock() {
    let mut s = Scripted::single();
    s.acquire("a", 30);
    transmit_unwritten(&mut s);
    s.advance(secs(2));
    // Part of the bytes left; the rest still waits.
    s.session.handle_written(s.now, false);
    assert_eq!(
        s.session.poll_timeout(),
        Some(s.now.saturating_add(WRITE_PROGRESS_TIMEOUT))
    );
    s.advance(secs(2));
    assert!(s.session.is_ready(), "progress 2 s ago: not stalled");
    s.advance(secs(1));
    assert_eq!(
        s.events().last(),
        Some(&SessionEvent::Closed(CloseReason::WriteStalled))
    );
}

#[test]
fn bytes_reported_all_written_stop_the_write_progress_clock_until_more_are_handed_out() {
    let mut s = Scripted::single();
    let first = s.acquire("a", 200);
    transmit_unwritten(&mut s);
    s.session.handle_written(s.now, true);
    // Only the acquire's own deadline and its silence rule remain.
    assert!(
        s.session
            .poll_timeout()
            .is_some_and(|at| at > s.now.saturating_add(WRITE_PROGRESS_TIMEOUT))
    );
    s.advance(secs(10));
    assert!(s.session.is_ready(), "everything written: nothing stalls");
    // New bytes start the clock at the moment they are handed out.
    let second = s.acquire("b", 200);
    transmit_unwritten(&mut s);
    s.advance(WRITE_PROGRESS_TIMEOUT);
    assert_eq!(
        s.events(),
        [
            outcome(first, Outcome::Indeterminate),
            outcome(second, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::WriteStalled),
        ]
    );
}

#[test]
fn handshake_failures_close_the_session_and_say_whether_it_is_auth() {
    // Times out.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    assert_eq!(session.poll_timeout(), Some(Instant::from_millis(10_000)));
    session.handle_timeout(Instant::from_millis(9_999));
    assert!(!session.is_closed());
    session.handle_timeout(Instant::from_millis(10_000));
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Closed(CloseReason::HandshakeTimeout)]
    );
    assert!(!CloseReason::HandshakeTimeout.is_auth_failure());

    // A cluster node where a single server was configured.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    let hello = Hello {
        mode: WireMode::Cluster,
        self_slot: 0,
        nonce: [0; 16],
    };
    session.handle_input(Instant::ZERO, &hello.encode());
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Closed(CloseReason::UnexpectedServer)]
    );
    let mut out = Vec::new();
    assert_eq!(
        session.poll_transmit(Instant::ZERO, &mut out),
        0,
        "no proof for a wrong server"
    );

    // A result byte other than 0 or 1.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: NO_LEADER_SLOT,
        nonce: [0; 16],
    };
    let mut bytes = hello.encode().to_vec();
    bytes.push(7);
    session.handle_input(Instant::ZERO, &bytes);
    let events = drain(&mut session);
    assert_eq!(events, [SessionEvent::Closed(CloseReason::BadResult(7))]);
    assert!(CloseReason::BadResult(7).is_auth_failure());
    assert_eq!(CloseReason::BadResult(7).to_error(), ClientError::Auth);
}

#[test]
fn a_handshake_that_did_not_finish_gives_a_clue_about_the_server() {
    // Not a byte: what a TLS server does to a plain client, open or closed.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    assert_eq!(session.handshake_clue(), Some(HandshakeClue::Silent));
    session.handle_transport_closed(Instant::from_millis(3_000));
    assert_eq!(session.handshake_clue(), Some(HandshakeClue::Silent));

    // Bytes that are not a hello: another service.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    session.handle_input(Instant::ZERO, b"HTTP/1.1 400 Bad Request\r\n\r\n");
    assert!(session.is_closed());
    assert_eq!(session.handshake_clue(), Some(HandshakeClue::NotAHello));

    // Part of a hello, then closed: no clue.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: NO_LEADER_SLOT,
        nonce: [0; 16],
    };
    session.handle_input(Instant::ZERO, &hello.encode()[..5]);
    session.handle_transport_closed(Instant::ZERO);
    assert_eq!(session.handshake_clue(), None);

    // Once ready, never.
    let mut session = Session::new(Instant::ZERO, SessionConfig::single(b""));
    ready_single(&mut session, Instant::ZERO);
    session.handle_transport_closed(Instant::ZERO);
    assert_eq!(session.handshake_clue(), None);
}

#[test]
fn cancel_before_send_is_silent_and_after_send_closes_the_session() {
    let mut s = Scripted::single();
    let sent = s.acquire("a", 5);
    s.transmit();
    let unsent = s.acquire("b", 5);
    assert_eq!(s.session.cancel(s.now, unsent), CancelOutcome::Unsent);
    assert!(
        s.transmit().is_empty(),
        "a cancelled request is never handed out"
    );
    assert!(s.session.is_ready());
    assert!(s.events().is_empty());

    let queued = s.acquire("c", 5);
    assert_eq!(s.session.cancel(s.now, sent), CancelOutcome::PossiblySent);
    assert_eq!(
        s.events(),
        [
            outcome(queued, Outcome::Retry),
            SessionEvent::Closed(CloseReason::CancelledAfterSend),
        ]
    );
    assert_eq!(s.session.cancel(s.now, sent), CancelOutcome::Unknown);
}

#[test]
fn cancelling_a_grant_not_yet_polled_turns_it_into_a_compensation() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 5);
    s.transmit();
    s.reply(Reply::Acquired { rid, token: 42 });
    assert_eq!(s.session.cancel(s.now, rid), CancelOutcome::Withdrawn);
    assert_eq!(
        s.events(),
        [SessionEvent::Compensate(Compensation {
            keys: key("a"),
            token: 42
        })]
    );
    assert!(s.session.is_ready());
}

#[test]
fn a_grant_that_arrives_at_the_deadline_is_indeterminate_and_compensated() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 2);
    s.transmit();
    // The bytes arrive exactly at the deadline, before the timer fired.
    s.now = s.now.saturating_add(secs(2));
    s.reply(Reply::Acquired { rid, token: 42 });
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Compensate(Compensation {
                keys: key("a"),
                token: 42
            }),
        ]
    );
    s.session.handle_timeout(s.now);
    assert!(
        s.session.is_ready(),
        "the request was answered, nothing to drop"
    );
}

#[test]
fn pending_acquires_and_releases_are_bounded_separately() {
    let mut config = SessionConfig::single(b"");
    config.pending_acquires_max = 2;
    config.pending_releases_max = 1;
    let mut s = Scripted::with_config(config);
    s.acquire("a", 5);
    s.acquire("b", 5);
    let p = params(secs(5), secs(10), Duration::ZERO);
    assert_eq!(
        s.session
            .submit_acquire(s.now, key("c"), &p, p.operation_deadline(s.now)),
        Err(ClientError::ClientCapacity)
    );
    let release = s.release("a", 1);
    assert_eq!(
        s.session
            .submit_release(s.now, key("b"), 1, s.now.saturating_add(secs(2))),
        Err(ClientError::ClientCapacity)
    );
    assert_eq!(
        s.session
            .submit_release(s.now, key("b"), 0, s.now.saturating_add(secs(2))),
        Err(ClientError::InvalidInput("token must not be zero"))
    );
    s.transmit();
    s.reply(Reply::Released { rid: release });
    assert_eq!(s.events(), [outcome(release, Outcome::Released)]);
    assert!(s.release("b", 1) > release);
}

#[test]
fn a_release_attempt_lost_after_send_ends_indeterminate_after_two_seconds() {
    let mut s = Scripted::single();
    let mut op = ReleaseOperation::new(s.now, key("a"), 9);
    let rid = op.submit(s.now, &mut s.session).unwrap();
    assert!(matches!(s.transmit().as_slice(), [Request::Release(req)] if req.token == 9));
    s.advance(secs(2));
    let events = s.events();
    assert_eq!(
        events,
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::DeadlineAfterSend),
        ]
    );
    // Retried (the exact token is safe to send again) …
    assert_eq!(
        op.on_outcome(s.now, Outcome::Indeterminate),
        ReleaseStep::RetryAt(s.now.saturating_add(ms(10)))
    );
    // … and `N` on the retry means the first attempt (or the lease) won.
    assert_eq!(
        op.on_outcome(s.now, Outcome::NotFound),
        ReleaseStep::Done(Ok(ReleaseOutcome::AlreadyGoneOrNotCurrent))
    );
}

// ---------------------------------------------------------------------------
// The silence rule
// ---------------------------------------------------------------------------

/// A release whose own deadline is far away, so that only the silence rule
/// can end it.
fn release_with_a_minute(s: &mut Scripted, name: &str, token: u64) -> u64 {
    let deadline = s.now.saturating_add(secs(60));
    s.session
        .submit_release(s.now, key(name), token, deadline)
        .unwrap()
}

#[test]
fn an_overdue_release_on_a_silent_connection_closes_it_after_the_silence_timeout() {
    assert_eq!(
        SessionConfig::single(b"").silence_timeout,
        secs(3),
        "the documented default"
    );
    let mut s = Scripted::single();
    // A long acquire wait rides along: it ends with the connection.
    let waiting = s.acquire("held-elsewhere", 30);
    let release = release_with_a_minute(&mut s, "a", 9);
    assert_eq!(s.transmit().len(), 2);
    // The release is overdue 3 s after it was handed out; nothing arrived
    // since the handshake.
    assert_eq!(
        s.session.poll_timeout(),
        Some(s.now.saturating_add(secs(3)))
    );
    s.advance(ms(2_999));
    assert!(s.session.is_ready());
    assert_eq!(s.events(), []);
    s.advance(ms(1));
    let events = s.events();
    assert!(events.contains(&outcome(release, Outcome::Indeterminate)));
    assert!(events.contains(&outcome(waiting, Outcome::Indeterminate)));
    assert_eq!(
        events.last(),
        Some(&SessionEvent::Closed(CloseReason::Silent))
    );
    assert_eq!(events.len(), 3);
    assert!(!CloseReason::Silent.is_routing() && !CloseReason::Silent.is_auth_failure());
}

#[test]
fn an_unsent_request_is_not_overdue_and_ends_as_retry_when_silence_closes() {
    let mut s = Scripted::single();
    let sent = release_with_a_minute(&mut s, "a", 9);
    s.transmit();
    s.advance(secs(2));
    // Submitted but never handed out: it cannot be overdue, and the close
    // proves it had no effect.
    let unsent = release_with_a_minute(&mut s, "b", 10);
    s.advance(secs(1));
    assert_eq!(
        s.events(),
        [
            outcome(sent, Outcome::Indeterminate),
            outcome(unsent, Outcome::Retry),
            SessionEvent::Closed(CloseReason::Silent),
        ]
    );
}

#[test]
fn a_long_legitimate_acquire_wait_on_a_silent_connection_is_not_silence() {
    let mut s = Scripted::single();
    let rid = s.acquire("a", 30);
    let sent = s.transmit();
    assert!(matches!(sent.as_slice(), [Request::Acquire(req)] if req.wait_s == 30));
    // The server may take the whole wait to answer: no silence close before
    // it, whatever the quiet.
    s.advance(secs(29));
    assert!(s.session.is_ready());
    assert_eq!(s.events(), []);
    // The server's `T` comes a margin before the wait ends: a plain timeout,
    // the connection goes on.
    s.reply(Reply::TimedOut { rid });
    assert_eq!(s.events(), [outcome(rid, Outcome::Timeout)]);
    s.advance(secs(60));
    assert!(s.session.is_ready());
    assert_eq!(s.session.poll_timeout(), None);
}

/// A single-mode session with a 1 s silence timeout.
fn quiet_second() -> SessionConfig {
    let mut config = SessionConfig::single(b"");
    config.silence_timeout = secs(1);
    config
}

#[test]
fn an_acquire_is_overdue_only_past_the_wait_it_sent_plus_the_silence_timeout() {
    // A shorter bound shows the acquire's own overdue instant: wait 0 asks
    // for an answer at once, so 1 s of silence after it ends it, long
    // before its 5 s transport deadline.
    let mut s = Scripted::with_config(quiet_second());
    let rid = s.acquire("a", 0);
    s.transmit();
    s.advance(ms(999));
    assert!(s.session.is_ready());
    s.advance(ms(1));
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::Silent),
        ]
    );
    // Wait 2: overdue 2 s + 1 s after it was handed out.
    let mut s = Scripted::with_config(quiet_second());
    let p = params(secs(10), secs(10), Duration::ZERO);
    let deadline = s.now.saturating_add(secs(2));
    let rid = s
        .session
        .submit_acquire(s.now, key("b"), &p, deadline)
        .unwrap();
    let sent = s.transmit();
    assert!(matches!(sent.as_slice(), [Request::Acquire(req)] if req.wait_s == 2));
    // Its own deadline (2 s) comes first and is the existing rule.
    s.advance(secs(2));
    assert_eq!(
        s.events(),
        [
            outcome(rid, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::DeadlineAfterSend),
        ]
    );
}

#[test]
fn bytes_arriving_keep_a_connection_with_an_overdue_request_alive() {
    let mut s = Scripted::cluster(0, 3);
    let release = release_with_a_minute(&mut s, "a", 9);
    s.transmit();
    // The server is alive and talking (leader notices, replies to others):
    // the overdue release alone does not close the connection.
    for _ in 0..5 {
        s.advance(secs(2));
        s.reply(Reply::Leader { leader_slot: 0 });
        assert!(s.session.is_ready());
    }
    s.events();
    // The bound runs from the last byte.
    assert_eq!(
        s.session.poll_timeout(),
        Some(s.now.saturating_add(secs(3)))
    );
    s.advance(ms(2_999));
    assert!(s.session.is_ready());
    s.advance(ms(1));
    assert_eq!(
        s.events(),
        [
            outcome(release, Outcome::Indeterminate),
            SessionEvent::Closed(CloseReason::Silent),
        ]
    );
}

#[test]
fn the_broker_configures_the_silence_timeout_within_bounds() {
    let config = |silence_timeout| BrokerConfig {
        silence_timeout,
        ..BrokerConfig::single("h:1", TOKEN_A)
    };
    assert_eq!(
        BrokerConfig::single("h:1", TOKEN_A).silence_timeout,
        secs(3)
    );
    let endpoints = config(ms(750)).endpoints().unwrap();
    assert!(
        endpoints
            .iter()
            .all(|e| e.session.silence_timeout == ms(750))
    );
    for bad in [Duration::ZERO, ms(99), secs(301)] {
        assert!(
            matches!(config(bad).endpoints(), Err(ClientError::InvalidInput(_))),
            "{bad:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Logical operations, routing, backoff
// ---------------------------------------------------------------------------

#[test]
fn release_retries_stop_at_the_absolute_five_second_deadline_with_an_error() {
    let start = Instant::from_millis(7_000);
    let mut op = ReleaseOperation::new(start, key("a"), 3);
    assert_eq!(op.deadline(), start.saturating_add(secs(5)));
    assert_eq!(op.attempt_deadline(start), start.saturating_add(secs(2)));
    assert_eq!(
        op.attempt_deadline(start.saturating_add(ms(4_000))),
        op.deadline(),
        "an attempt never runs past the absolute deadline"
    );
    let mut now = start;
    let mut delays_ms = Vec::new();
    let result = loop {
        // Nobody answers: every attempt finds no connection.
        match op.on_error(now, ClientError::NotConnected) {
            ReleaseStep::RetryAt(at) => {
                delays_ms.push(at.saturating_duration_since(now).as_millis());
                now = at;
            }
            ReleaseStep::Done(result) => break result,
        }
    };
    assert_eq!(&delays_ms[..6], [10, 20, 40, 80, 160, 200]);
    assert!(delays_ms[6..].iter().all(|&d| d <= 200));
    assert_eq!(now, start.saturating_add(secs(5)));
    assert_eq!(result, Err(ClientError::NotConnected));

    // Once an attempt may have applied, the final error says so.
    let mut op = ReleaseOperation::new(start, key("a"), 3);
    assert!(matches!(
        op.on_outcome(start, Outcome::Indeterminate),
        ReleaseStep::RetryAt(_)
    ));
    let late = start.saturating_add(secs(5));
    assert_eq!(
        op.on_outcome(late, Outcome::Retry),
        ReleaseStep::Done(Err(ClientError::Indeterminate))
    );
}

#[test]
fn release_outcomes_map_to_their_results() {
    let now = Instant::ZERO;
    let mut op = ReleaseOperation::new(now, key("a"), 3);
    assert_eq!(
        op.on_outcome(now, Outcome::Released),
        ReleaseStep::Done(Ok(ReleaseOutcome::Released))
    );
    assert!(matches!(
        op.on_outcome(now, Outcome::Error(ErrorCode::GroupMismatch)),
        ReleaseStep::Done(Err(ClientError::Protocol(_)))
    ));
    assert_eq!(
        op.on_error(now, ClientError::Auth),
        ReleaseStep::Done(Err(ClientError::Auth))
    );
    assert!(matches!(
        op.on_outcome(now, Outcome::Timeout),
        ReleaseStep::RetryAt(_)
    ));
}

#[test]
fn the_release_queue_is_bounded_and_drops_expired_jobs() {
    let now = Instant::ZERO;
    let mut queue = ReleaseQueue::new(2);
    assert!(queue.push(now, ReleaseOperation::new(now, key("a"), 1)));
    assert!(queue.push(
        now,
        ReleaseOperation::new(now.saturating_add(secs(1)), key("b"), 2)
    ));
    assert!(
        !queue.push(now, ReleaseOperation::new(now, key("c"), 3)),
        "full"
    );
    assert_eq!(queue.len(), 2);
    // At `later` the first job's deadline has passed; the second's has not.
    let later = now.saturating_add(secs(5));
    assert_eq!(queue.pop(later).map(|job| job.token()), Some(2));
    assert!(queue.is_empty());
    assert!(
        !queue.push(later, ReleaseOperation::new(now, key("d"), 4)),
        "expired"
    );
    assert!(queue.is_empty());
}

#[test]
fn an_acquire_retries_only_certainly_unsent_attempts_within_its_wait() {
    let start = Instant::from_millis(500);
    let p = params(secs(1), secs(10), Duration::ZERO);
    let mut op = AcquireOperation::new(start, key("a"), p);
    assert_eq!(op.deadline(), start.saturating_add(secs(1)));
    let mut now = start;
    let mut delays_ms = Vec::new();
    let failed = loop {
        let step = if delays_ms.len() % 2 == 0 {
            op.on_outcome(now, Outcome::Retry)
        } else {
            op.on_error(now, ClientError::NotConnected)
        };
        match step {
            AcquireStep::RetryAt(at) => {
                delays_ms.push(at.saturating_duration_since(now).as_millis());
                now = at;
            }
            AcquireStep::Failed(error) => break error,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(&delays_ms[..5], [10, 20, 40, 80, 100]);
    assert_eq!(now, start.saturating_add(secs(1)));
    assert_eq!(failed, ClientError::Timeout);

    // Definite answers are final at once.
    let mut op = AcquireOperation::new(start, key("a"), p);
    assert_eq!(
        op.on_outcome(start, Outcome::Busy),
        AcquireStep::Failed(ClientError::Busy)
    );
    assert_eq!(
        op.on_outcome(start, Outcome::Timeout),
        AcquireStep::Failed(ClientError::Timeout)
    );
    assert_eq!(
        op.on_error(start, ClientError::Auth),
        AcquireStep::Failed(ClientError::Auth)
    );
    // Out of client capacity until the deadline: that is the error.
    let end = start.saturating_add(secs(1));
    assert_eq!(
        op.on_error(end, ClientError::ClientCapacity),
        AcquireStep::Failed(ClientError::ClientCapacity)
    );
}

#[test]
fn a_retried_acquire_is_sent_with_only_the_wait_that_remains() {
    let mut s = Scripted::cluster(0, 3);
    let start = s.now;
    let mut op = AcquireOperation::new(start, key("k"), params(secs(3), secs(10), Duration::ZERO));
    let rid = op.submit(s.now, &mut s.session).unwrap();
    assert!(matches!(s.transmit().as_slice(), [Request::Acquire(req)] if req.wait_s == 3));
    s.now = start.saturating_add(ms(800));
    s.reply(Reply::Moved {
        rid,
        leader_slot: 1,
    });
    assert_eq!(s.events()[0], outcome(rid, Outcome::Retry));
    let AcquireStep::RetryAt(at) = op.on_outcome(s.now, Outcome::Retry) else {
        panic!("a Moved acquire is retried");
    };
    let mut leader = Scripted::cluster(1, 3);
    leader.now = at;
    op.submit(leader.now, &mut leader.session).unwrap();
    match leader.transmit().as_slice() {
        [Request::Acquire(req)] => assert_eq!(req.wait_s, 3, "ceil(3 s - 0.81 s)"),
        other => panic!("{other:?}"),
    }
    leader.now = start.saturating_add(ms(1_000));
    let later = AcquireOperation::new(start, key("k"), params(secs(3), secs(10), Duration::ZERO));
    later.submit(leader.now, &mut leader.session).unwrap();
    match leader.transmit().as_slice() {
        [Request::Acquire(req)] => assert_eq!(req.wait_s, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn covers_uses_the_lease_from_just_before_sending() {
    let sent_at = Instant::from_millis(10_000);
    let valid_before = sent_at.saturating_add(secs(10));
    let at = |millis: u64| sent_at.saturating_add(ms(millis));
    assert!(lease_covers(valid_before, at(2_000), secs(8)));
    assert!(!lease_covers(
        valid_before,
        Instant::from_micros(at(2_000).as_micros() + 1),
        secs(8)
    ));
    assert!(lease_covers(valid_before, at(9_999), ms(1)));
    assert!(
        !lease_covers(valid_before, at(10_000), Duration::ZERO),
        "expired covers nothing"
    );

    let grant = Grant {
        keys: key("a"),
        token: 5,
        valid_before,
        permits: None,
    };
    let p = params(secs(30), secs(10), secs(8));
    let mut op = AcquireOperation::new(sent_at, key("a"), p);
    assert_eq!(
        op.on_outcome(at(2_000), Outcome::Acquired(grant.clone())),
        AcquireStep::Granted(grant.clone())
    );
    assert_eq!(
        op.on_outcome(at(2_001), Outcome::Acquired(grant.clone())),
        AcquireStep::Compensate {
            error: ClientError::InsufficientLease,
            grant: grant.clone()
        }
    );
    // A grant handed over at or after the acquire's deadline is never used.
    let late = sent_at.saturating_add(secs(30));
    let mut op = AcquireOperation::new(
        sent_at,
        key("a"),
        params(secs(30), secs(250), Duration::ZERO),
    );
    let long = Grant {
        valid_before: sent_at.saturating_add(secs(250)),
        ..grant
    };
    assert_eq!(
        op.on_outcome(late, Outcome::Acquired(long.clone())),
        AcquireStep::Compensate {
            error: ClientError::Indeterminate,
            grant: long
        }
    );
}

#[test]
fn durations_round_up_and_out_of_range_values_are_rejected_not_clamped() {
    let p = params(ms(1), Duration::from_micros(1_500_001), ms(1_500));
    assert_eq!((p.wait_s(), p.lease_s()), (1, 2));
    assert_eq!(p.lease(), secs(2));
    assert_eq!(p.work_budget_min(), ms(1_500));
    let p = params(secs(255), secs(250), secs(250));
    assert_eq!((p.wait_s(), p.lease_s()), (255, 250));
    assert_eq!(params(Duration::ZERO, secs(1), Duration::ZERO).wait_s(), 0);
    // Budget equal to the normalized (rounded-up) lease is fine.
    assert!(AcquireParams::new(Duration::ZERO, ms(1_200), secs(2)).is_ok());

    let cases = [
        (
            secs(255) + ms(1),
            secs(10),
            Duration::ZERO,
            ClientError::UnsupportedDuration {
                field: "wait",
                s_max: 255,
            },
        ),
        (
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            ClientError::InvalidInput("lease must be greater than zero"),
        ),
        (
            Duration::ZERO,
            secs(250) + Duration::from_nanos(1),
            Duration::ZERO,
            ClientError::UnsupportedDuration {
                field: "lease",
                s_max: 250,
            },
        ),
        (
            Duration::ZERO,
            secs(251),
            Duration::ZERO,
            ClientError::UnsupportedDuration {
                field: "lease",
                s_max: 250,
            },
        ),
        (
            Duration::ZERO,
            Duration::MAX,
            Duration::ZERO,
            ClientError::UnsupportedDuration {
                field: "lease",
                s_max: 250,
            },
        ),
        (
            Duration::ZERO,
            secs(250),
            secs(250) + Duration::from_nanos(1),
            ClientError::UnsupportedDuration {
                field: "min_work_budget",
                s_max: 250,
            },
        ),
        (
            Duration::ZERO,
            ms(1_200),
            secs(2) + Duration::from_nanos(1),
            ClientError::InsufficientLease,
        ),
        (
            Duration::MAX,
            secs(10),
            Duration::ZERO,
            ClientError::UnsupportedDuration {
                field: "wait",
                s_max: 255,
            },
        ),
    ];
    for (wait, lease, budget, error) in cases {
        assert_eq!(
            AcquireParams::new(wait, lease, budget),
            Err(error.clone()),
            "{wait:?} {lease:?} {budget:?}"
        );
        assert!(!error.to_string().is_empty());
    }
}

#[test]
fn keys_are_validated_and_sets_made_canonical() {
    assert_eq!(
        KeySet::single(""),
        Err(ClientError::InvalidInput("key must be 1..=128 bytes"))
    );
    assert!(KeySet::single(&"k".repeat(128)).is_ok());
    assert_eq!(
        KeySet::single(&"k".repeat(129)),
        Err(ClientError::InvalidInput("key must be 1..=128 bytes"))
    );
    for bad in ["a b", "a\nb", "a\rb"] {
        assert_eq!(
            KeySet::single(bad),
            Err(ClientError::InvalidInput(
                "key must not contain spaces or newlines"
            ))
        );
    }
    let set = KeySet::new(&["b", "a", "b", "c"]).unwrap();
    let names: Vec<&str> = set.keys().iter().map(|key| key.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let empty: [&str; 0] = [];
    assert_eq!(
        KeySet::new(&empty),
        Err(ClientError::InvalidInput(
            "key set must contain 1..=16 keys"
        ))
    );
    // Counted before dedup, like the official client.
    let seventeen = vec!["same"; 17];
    assert_eq!(
        KeySet::new(&seventeen),
        Err(ClientError::InvalidInput(
            "key set must contain 1..=16 keys"
        ))
    );
    let sixteen: Vec<String> = (0..16).map(|i| format!("k{i:02}")).collect();
    assert_eq!(KeySet::new(&sixteen).unwrap().len(), 16);
    assert!(KeySet::new(&["ok", "not ok"]).is_err());
}

#[test]
fn backoff_doubles_to_its_cap_and_a_long_session_resets_it() {
    let mut backoff = Backoff::new();
    let delays: Vec<u128> = (0..7)
        .map(|_| backoff.after_connect_failure().as_millis())
        .collect();
    assert_eq!(delays, [100, 200, 400, 800, 1_600, 3_200, 3_200]);
    // A session shorter than 1 s counts as a failure …
    assert_eq!(backoff.after_session(Some(ms(999)), None), ms(3_200));
    // … one that lived 1 s reconnects at once and starts over.
    assert_eq!(backoff.after_session(Some(secs(1)), None), Duration::ZERO);
    assert_eq!(backoff.after_connect_failure(), ms(100));
    assert_eq!(
        backoff.after_session(None, None),
        ms(200),
        "never ready = failure"
    );
}

#[test]
fn session_lifetime_feeds_the_backoff() {
    let mut s = Scripted::single();
    s.advance(secs(1));
    s.session.close_local(s.now);
    assert_eq!(s.session.lived(), Some(secs(1)));
    assert_eq!(s.events(), [SessionEvent::Closed(CloseReason::Local)]);
    let mut backoff = Backoff::new();
    backoff.after_connect_failure();
    assert_eq!(
        backoff.after_session(s.session.lived(), s.session.close_reason()),
        Duration::ZERO
    );
}

/// During an election every node answers `E 4` for a while; those
/// short sessions must not grow the backoff, or the client would stay away
/// from the new leader for seconds after it is elected.
#[test]
fn routing_answers_do_not_grow_the_backoff() {
    let mut backoff = Backoff::new();
    for _ in 0..5 {
        backoff.after_connect_failure();
    }
    let no_leader = CloseReason::ServerError(ErrorCode::NoLeader);
    let not_active = CloseReason::ServerError(ErrorCode::NotActive);
    for reason in [&no_leader, &not_active, &no_leader] {
        assert_eq!(backoff.after_session(Some(ms(10)), Some(reason)), ms(100));
    }
    // Any other short session is still a failure and doubles it.
    let other = CloseReason::ServerError(ErrorCode::BadLease);
    assert_eq!(backoff.after_session(Some(ms(10)), Some(&other)), ms(100));
    assert_eq!(backoff.after_session(Some(ms(10)), Some(&other)), ms(200));
}

#[test]
fn routing_prefers_the_leader_then_round_robins_over_ready_connections() {
    let mut router = Router::new(3);
    assert_eq!(router.pick(), None);
    assert_eq!(router.no_connection_error(), ClientError::NotConnected);
    router.set_ready(0, true);
    router.set_ready(2, true);
    let picks: Vec<_> = (0..4).map(|_| router.pick()).collect();
    // The cursor moved past 0 on the empty pick above: 1 (down) → 2, 2, 0, 1 (down) → 2.
    assert_eq!(picks, [Some(2), Some(2), Some(0), Some(2)]);
    assert!(router.set_leader_hint(Some(2)));
    assert_eq!((router.pick(), router.pick()), (Some(2), Some(2)));
    assert!(!router.set_leader_hint(Some(3)), "no such slot");
    assert_eq!(router.leader(), Some(2));
    // The leader's connection drops: it is forgotten, the others serve.
    router.handle_event(2, &SessionEvent::Closed(CloseReason::TransportClosed));
    assert_eq!(router.leader(), None);
    assert_eq!(router.pick(), Some(0));
    assert!(!router.auth_failed());
}

#[test]
fn coalescing_routing_keeps_runs_on_one_connection_then_moves_to_the_next_ready_one() {
    let mut router = Router::new(3);
    let none_unsent = |_: usize| 0;
    assert_eq!(router.pick_coalescing(none_unsent), None);
    router.set_ready(0, true);
    router.set_ready(2, true);
    // A run of requests stays on one connection, then moves round-robin to
    // the next ready one, so every ready connection carries requests.
    let first = router.pick_coalescing(none_unsent).unwrap();
    for _ in 1..ROUTE_RUN_REQUESTS {
        assert_eq!(router.pick_coalescing(none_unsent), Some(first));
    }
    let second = router.pick_coalescing(none_unsent).unwrap();
    assert_ne!(second, first);
    assert!([0, 2].contains(&first) && [0, 2].contains(&second));
    // A run ends as soon as its connection has too many requests waiting
    // for a write (its writes stall) …
    let stalled = |index: usize| {
        if index == second {
            COALESCE_MAX_UNSENT
        } else {
            0
        }
    };
    assert_eq!(router.pick_coalescing(stalled), Some(first));
    // … or goes down.
    router.set_ready(first, false);
    assert_eq!(router.pick_coalescing(none_unsent), Some(second));
    router.set_ready(first, true);
    // The leader comes first, whatever the run.
    assert!(router.set_leader_hint(Some(1)));
    router.set_ready(1, true);
    assert_eq!(router.pick_coalescing(none_unsent), Some(1));
    assert_eq!(router.pick_coalescing(|_| COALESCE_MAX_UNSENT), Some(1));
}

#[test]
fn a_session_counts_the_requests_waiting_for_the_next_write() {
    let mut s = Scripted::single();
    assert_eq!(s.session.unsent_len(), 0);
    let first = s.acquire("a", 5);
    s.release("b", 77);
    assert_eq!(s.session.unsent_len(), 2);
    assert_eq!(s.transmit().len(), 2);
    assert_eq!(s.session.unsent_len(), 0);
    let cancelled = s.acquire("c", 5);
    s.acquire("d", 1);
    assert_eq!(s.session.unsent_len(), 2);
    assert_eq!(s.session.cancel(s.now, cancelled), CancelOutcome::Unsent);
    assert_eq!(s.session.unsent_len(), 1);
    // An unsent request past its deadline leaves the count too.
    s.advance(secs(1));
    assert_eq!(s.session.unsent_len(), 0);
    s.acquire("e", 5);
    assert_eq!(s.session.unsent_len(), 1);
    assert_eq!(s.session.cancel(s.now, first), CancelOutcome::PossiblySent);
    assert_eq!(
        s.session.unsent_len(),
        0,
        "a closed session has nothing to send"
    );
}

#[test]
fn broker_configuration_is_validated_and_one_address_means_two_connections() {
    let single = BrokerConfig::single("db.internal:5225", TOKEN_A)
        .endpoints()
        .unwrap();
    assert_eq!(single.len(), 2);
    assert!(
        single
            .iter()
            .all(|e| e.addr == "db.internal:5225" && e.session.mode == WireMode::Single)
    );
    assert!(!format!("{:?}", BrokerConfig::single("h:1", TOKEN_A)).contains(TOKEN_A));
    assert!(!format!("{:?}", single[0].session).contains(TOKEN_A));
    let session = Session::new(Instant::ZERO, single[0].session.clone());
    let shown = format!("{session:?}");
    assert!(shown.contains("Handshake"));
    assert!(
        !shown.contains(TOKEN_A) && !shown.contains("48, 49, 50"),
        "{shown}"
    );

    let cluster = BrokerConfig {
        addrs: vec!["a:1".into(), "b:1".into(), "[::1]:1".into()],
        mode: BrokerMode::Cluster {
            identity_fingerprint: CLUSTER_ID,
        },
        ..BrokerConfig::single("x:1", TOKEN_A)
    };
    let endpoints = cluster.endpoints().unwrap();
    let slots: Vec<u8> = endpoints.iter().map(|e| e.session.expected_slot).collect();
    assert_eq!(slots, [0, 1, 2]);
    assert!(
        endpoints
            .iter()
            .all(|e| e.session.cluster_size == 3 && e.session.fingerprint == CLUSTER_ID)
    );

    let invalid = |config: BrokerConfig| {
        assert!(
            matches!(config.endpoints(), Err(ClientError::InvalidInput(_))),
            "{config:?}"
        )
    };
    invalid(BrokerConfig {
        addrs: vec![],
        ..BrokerConfig::single("h:1", TOKEN_A)
    });
    invalid(BrokerConfig {
        addrs: vec!["a:1".into(), "b:1".into()],
        ..cluster.clone()
    });
    invalid(BrokerConfig {
        addrs: vec!["a:1".into(), "b:1".into()],
        ..BrokerConfig::single("h:1", TOKEN_A)
    });
    invalid(BrokerConfig::single("h:1", "short"));
    invalid(BrokerConfig::single("127.0.0.1:1", ""));
    invalid(BrokerConfig {
        allow_loopback_no_auth: true,
        ..BrokerConfig::single("db.internal:1", "")
    });
    invalid(BrokerConfig::single("h:0", TOKEN_A));
    invalid(BrokerConfig::single("h", TOKEN_A));
    invalid(BrokerConfig::single("::1:5225", TOKEN_A));
    invalid(BrokerConfig::single("h :1", TOKEN_A));
    invalid(BrokerConfig {
        pending_max: 0,
        ..BrokerConfig::single("h:1", TOKEN_A)
    });
    invalid(BrokerConfig {
        pending_max: 16_385,
        ..BrokerConfig::single("h:1", TOKEN_A)
    });
    // Loopback by IP, or by the name that means it.
    for loopback in ["[::1]:1", "127.0.0.1:1", "localhost:5225", "LOCALHOST:1"] {
        assert!(
            BrokerConfig {
                allow_loopback_no_auth: true,
                ..BrokerConfig::single(loopback, "")
            }
            .endpoints()
            .is_ok(),
            "{loopback}"
        );
    }
    invalid(BrokerConfig {
        allow_loopback_no_auth: true,
        ..BrokerConfig::single("localhost.example.com:1", "")
    });
}

#[test]
fn errors_display_and_convert() {
    let io: ClientError =
        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer reset").into();
    assert!(matches!(
        &io,
        ClientError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            ..
        }
    ));
    assert_eq!(io.to_string(), "io error: peer reset");
    assert_eq!(
        ClientError::UnsupportedDuration {
            field: "lease",
            s_max: 250
        }
        .to_string(),
        "lease exceeds the supported maximum of 250 seconds"
    );
    let reason = CloseReason::Protocol(ProtocolError::UnknownRid(4));
    assert_eq!(
        reason.to_error(),
        ClientError::Protocol("reply for unknown request id 4".into())
    );
    assert_eq!(
        CloseReason::TransportClosed.to_error(),
        ClientError::NotConnected
    );
}

// ---------------------------------------------------------------------------
// Broker state
// ---------------------------------------------------------------------------

/// A test's outcome channel: a std channel whose receiver may be dropped.
struct Tx(std::sync::mpsc::Sender<Outcome>);

impl OutcomeSender for Tx {
    fn send(self, outcome: Outcome) -> Result<(), Outcome> {
        self.0.send(outcome).map_err(|e| e.0)
    }
}

/// Sends what `state`'s only session has to send and answers it with `reply`.
fn answer(state: &mut BrokerState<Tx>, now: Instant, reply: Reply) {
    let session = state.sessions[0].as_mut().unwrap();
    session.poll_transmit(now, &mut Vec::new());
    let mut bytes = Vec::new();
    reply.encode(&mut bytes);
    session.handle_input(now, &bytes);
}

#[test]
fn the_broker_state_bounds_acquires_delivers_outcomes_and_releases_abandoned_grants() {
    let s = Scripted::single();
    let now = s.now;
    let mut state = BrokerState::new(1, 1);
    state.sessions[0] = Some(s.session);
    state.router.handle_event(0, &SessionEvent::Ready);
    let mut notices = Vec::new();
    let p = params(secs(5), secs(10), Duration::ZERO);
    let acquire = |now, session: &mut Session| {
        session.submit_acquire(now, key("a"), &p, p.operation_deadline(now))
    };

    // One acquire in flight at most.
    let (tx, rx) = std::sync::mpsc::channel();
    let (index, rid) = state.submit(now, true, acquire, Tx(tx)).unwrap();
    assert_eq!(index, 0);
    let (tx, _rx) = std::sync::mpsc::channel();
    assert_eq!(
        state.submit(now, true, acquire, Tx(tx)),
        Err(ClientError::ClientCapacity)
    );

    // The grant reaches its caller and frees the slot.
    answer(&mut state, now, Reply::Acquired { rid, token: 42 });
    state.dispatch(0, now, &mut |n| notices.push(format!("{n:?}")));
    assert!(notices.is_empty(), "{notices:?}");
    assert!(matches!(rx.try_recv(), Ok(Outcome::Acquired(grant)) if grant.token == 42));

    // A grant whose caller is gone is released in the background.
    let (tx, rx) = std::sync::mpsc::channel();
    let (_, rid) = state.submit(now, true, acquire, Tx(tx)).unwrap();
    drop(rx);
    answer(&mut state, now, Reply::Acquired { rid, token: 43 });
    state.dispatch(0, now, &mut |n| notices.push(format!("{n:?}")));
    assert_eq!(notices, ["Release { token: 43, queued: true }"]);
    assert_eq!(state.releases.len(), 1);

    // A cancel frees the slot once; after that it is the caller's receiver
    // that may hold the outcome.
    let (tx, _rx) = std::sync::mpsc::channel();
    let (index, rid) = state.submit(now, true, acquire, Tx(tx)).unwrap();
    assert!(state.cancel(now, index, rid));
    assert!(!state.cancel(now, index, rid));
    let (tx, _rx) = std::sync::mpsc::channel();
    assert!(state.submit(now, true, acquire, Tx(tx)).is_ok());
}

#[test]
fn a_direct_attempt_hands_its_outcome_to_finish_direct_or_waits_like_any_other() {
    let s = Scripted::single();
    let now = s.now;
    let mut state = BrokerState::new(1, 1);
    state.sessions[0] = Some(s.session);
    state.router.handle_event(0, &SessionEvent::Ready);
    let mut notices = Vec::new();
    let p = params(secs(5), secs(10), Duration::ZERO);
    let acquire = |now, session: &mut Session| {
        session.submit_acquire(now, key("a"), &p, p.operation_deadline(now))
    };

    // Answered before finish_direct: the outcome comes back from it, no
    // sender is made, and the acquire no longer counts against the bound.
    let (_, rid) = state.submit_direct(now, true, acquire).unwrap();
    answer(&mut state, now, Reply::Acquired { rid, token: 42 });
    state.dispatch(0, now, &mut |n| notices.push(format!("{n:?}")));
    let outcome = state.finish_direct(|| panic!("no sender needed"));
    assert!(matches!(outcome, Some(Outcome::Acquired(grant)) if grant.token == 42));
    assert!(notices.is_empty(), "{notices:?}");

    // Not answered yet: it waits on the sender finish_direct asked for,
    // still counting against the bound, and its outcome arrives there.
    let (tx, rx) = std::sync::mpsc::channel();
    let (index, rid) = state.submit_direct(now, true, acquire).unwrap();
    assert!(state.finish_direct(|| Tx(tx)).is_none());
    let (other_tx, _other_rx) = std::sync::mpsc::channel();
    assert_eq!(
        state.submit(now, true, acquire, Tx(other_tx)),
        Err(ClientError::ClientCapacity)
    );
    answer(&mut state, now, Reply::Acquired { rid, token: 43 });
    state.dispatch(index, now, &mut |n| notices.push(format!("{n:?}")));
    assert!(matches!(rx.try_recv(), Ok(Outcome::Acquired(grant)) if grant.token == 43));

    // A session that closes while the attempt is direct ends it as
    // Indeterminate (possibly sent), handed to finish_direct as well.
    let (_, _rid) = state.submit_direct(now, true, acquire).unwrap();
    let session = state.sessions[0].as_mut().unwrap();
    session.poll_transmit(now, &mut Vec::new());
    session.handle_transport_closed(now);
    state.dispatch(0, now, &mut |n| notices.push(format!("{n:?}")));
    assert_eq!(
        state.finish_direct(|| panic!("no sender needed")),
        Some(Outcome::Indeterminate)
    );
}

/// A broker whose server answers every attempt with `reply` while it is
/// submitted (the in-process shape), counting its attempts; each reading of
/// its clock is one second after the one before.
struct AnsweringBroker {
    now_s: std::sync::atomic::AtomicU64,
    attempts: std::sync::atomic::AtomicUsize,
    reply: Outcome,
}

impl AnsweringBroker {
    fn new(reply: Outcome) -> std::sync::Arc<Self> {
        std::sync::Arc::new(AnsweringBroker {
            now_s: std::sync::atomic::AtomicU64::new(1),
            attempts: std::sync::atomic::AtomicUsize::new(0),
            reply,
        })
    }
    fn attempts(&self) -> usize {
        self.attempts.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// How many times its clock was read.
    fn readings(&self) -> u64 {
        self.now_s.load(std::sync::atomic::Ordering::Relaxed) - 1
    }
    fn answer(&self) -> Outcome {
        self.attempts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reply.clone()
    }
}

impl ticketing_core::client::Broker for AnsweringBroker {
    fn now(&self) -> Instant {
        let s = self
            .now_s
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Instant::from_millis(s * 1_000)
    }
    fn to_std(&self, _at: Instant) -> std::time::Instant {
        std::time::Instant::now()
    }
    fn submit(
        &self,
        _acquire: bool,
        _submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<impl std::future::Future<Output = Outcome> + Send + '_, ClientError> {
        Ok(std::future::ready(self.answer()))
    }
    fn submit_at(
        &self,
        _now: Instant,
        _acquire: bool,
        _submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<
        ticketing_core::client::Submitted<impl std::future::Future<Output = Outcome> + Send + '_>,
        ClientError,
    > {
        Ok(ticketing_core::client::Submitted::<
            std::future::Ready<Outcome>,
        >::Ready(self.answer()))
    }
    fn sleep_until(&self, _at: Instant) -> impl std::future::Future<Output = ()> + Send + '_ {
        std::future::ready(())
    }
    fn release_in_background(&self, _grant: Grant) {
        panic!("nothing is released in the background here");
    }
}

/// Polls `future` once.
fn poll_once<F: std::future::Future>(future: F) -> std::task::Poll<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    future.as_mut().poll(&mut cx)
}

#[test]
fn a_release_answered_while_submitting_ends_on_its_first_poll_and_a_retry_still_runs() {
    let grant = |token| Grant {
        keys: key("a"),
        token,
        valid_before: Instant::from_millis(600_000),
        permits: None,
    };
    let broker = AnsweringBroker::new(Outcome::Released);
    let ticket = ticketing_core::client::Ticket::new(std::sync::Arc::clone(&broker), grant(7));
    assert_eq!(
        poll_once(ticket.release()),
        std::task::Poll::Ready(Ok(ReleaseOutcome::Released))
    );
    assert_eq!(broker.attempts(), 1);

    // An answer that is not final is retried until the 5 s window closes
    // (this clock moves a second per reading), then the release fails: it
    // never reports a success it did not get.
    let broker = AnsweringBroker::new(Outcome::Retry);
    let ticket = ticketing_core::client::Ticket::new(std::sync::Arc::clone(&broker), grant(8));
    assert_eq!(
        poll_once(ticket.release()),
        std::task::Poll::Ready(Err(ClientError::NotConnected))
    );
    assert!(broker.attempts() > 1, "{} attempts", broker.attempts());
}

#[test]
fn an_outcome_handed_back_while_submitting_is_judged_at_the_submits_reading() {
    // The acquire's deadline is one reading (one second) after it starts:
    // the grant handed back by the submit was decided at the submit's own
    // reading, inside the deadline, so it is granted without a second
    // reading (at which the deadline would have passed).
    let granted = Grant {
        keys: key("a"),
        token: 9,
        valid_before: Instant::from_millis(31_000),
        permits: None,
    };
    let broker = AnsweringBroker::new(Outcome::Acquired(granted.clone()));
    let result = poll_once(ticketing_core::client::run_acquire(
        &*broker,
        key("a"),
        params(secs(1), secs(30), Duration::ZERO),
    ));
    assert_eq!(result, std::task::Poll::Ready(Ok(granted.clone())));
    assert_eq!(broker.readings(), 1);

    // A final release reply needs no reading after the one that starts it
    // (the ticket reads the clock once when made, for its drift margin).
    let broker = AnsweringBroker::new(Outcome::Released);
    let ticket = ticketing_core::client::Ticket::new(std::sync::Arc::clone(&broker), granted);
    let made = broker.readings();
    assert_eq!(
        poll_once(ticket.release()),
        std::task::Poll::Ready(Ok(ReleaseOutcome::Released))
    );
    assert_eq!(broker.readings(), made + 1);
}

#[test]
fn an_ended_session_sets_the_backoff_unless_authentication_failed() {
    let mut backoff = Backoff::new();
    assert_eq!(backoff.after_ended(None), Some(ms(100)), "never connected");
    let mut s = Scripted::single();
    s.advance(secs(1));
    s.session.close_local(s.now);
    assert_eq!(backoff.after_ended(Some(&s.session)), Some(Duration::ZERO));

    let config = ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    };
    let mut live = SingleNet::new(config);
    let bad = live.connect_session(SessionConfig::single(b"fedcba9876543210fedcba9876543210"));
    drain(live.session(bad));
    assert_eq!(backoff.after_ended(Some(live.session(bad))), None);
}

// ---------------------------------------------------------------------------
// Renewal: the negotiation (`X`) and `W`
// ---------------------------------------------------------------------------

fn extending(mut config: SessionConfig) -> SessionConfig {
    config.extensions = Capabilities::EXTEND;
    config
}

/// The handshake bytes up to the server's result byte, without the
/// `Ready` check (a negotiating session is not ready yet).
fn accept_single(session: &mut Session, now: Instant) {
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: NO_LEADER_SLOT,
        nonce: [0x42; 16],
    };
    session.handle_input(now, &hello.encode());
    let mut proof = Vec::new();
    session.poll_transmit(now, &mut proof);
    session.handle_input(now, &[1]);
}

/// `reply`'s frame.
fn reply_bytes(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    reply.encode(&mut out);
    out
}

/// A scripted session that sent its `X` (returned) and has not been
/// answered.
fn negotiating() -> (Scripted, Request) {
    let now = Instant::from_millis(1_000);
    let config = extending(SessionConfig::single(b""))
        .with_label("host/42/job")
        .unwrap();
    let mut session = Session::new(now, config);
    accept_single(&mut session, now);
    let mut scripted = Scripted { session, now };
    let sent = scripted.transmit();
    assert_eq!(sent.len(), 1, "only the X leaves first: {sent:?}");
    (scripted, sent[0].clone())
}

/// A scripted session granted EXTEND.
fn granted_extend() -> Scripted {
    let (mut scripted, x) = negotiating();
    scripted.reply(Reply::Negotiated {
        rid: x.rid(),
        granted: Capabilities::EXTEND,
    });
    assert_eq!(drain(&mut scripted.session), [SessionEvent::Ready]);
    scripted
}

/// Decodes `W` frames too (the server's decoder after granting EXTEND).
fn decode_extended(bytes: &[u8]) -> Vec<Request> {
    let mut decoder = RequestDecoder::new();
    decoder.grant(Capabilities::EXTEND);
    decoder.push(bytes);
    let mut requests = Vec::new();
    while let Some(Decoded::Request(request)) = decoder.next().unwrap() {
        requests.push(request);
    }
    requests
}

#[test]
fn the_negotiation_is_the_first_request_and_the_session_is_ready_once_it_is_answered() {
    let (mut scripted, x) = negotiating();
    let Request::Negotiate(negotiate) = &x else {
        panic!("expected X first, got {x:?}");
    };
    assert_eq!(negotiate.version, EXTENSION_VERSION);
    assert_eq!(negotiate.wanted, Capabilities::EXTEND);
    assert_eq!(negotiate.label, "host/42/job");
    // Not ready while X is unanswered: requests wait (nothing is
    // pipelined behind X that a server closing on it would leave
    // Indeterminate).
    assert!(!scripted.session.is_ready());
    assert_eq!(drain(&mut scripted.session), []);
    let p = params(secs(0), secs(10), Duration::ZERO);
    assert_eq!(
        scripted.session.submit_acquire(
            scripted.now,
            key("k"),
            &p,
            p.operation_deadline(scripted.now)
        ),
        Err(ClientError::NotConnected)
    );
    // Bits we did not ask for are not ours.
    scripted.reply(Reply::Negotiated {
        rid: x.rid(),
        granted: Capabilities(0b11),
    });
    assert_eq!(drain(&mut scripted.session), [SessionEvent::Ready]);
    assert_eq!(scripted.session.capabilities(), Capabilities::EXTEND);
    let rid = scripted.acquire("k", 0);
    assert_eq!(rid, x.rid() + 1);
}

#[test]
fn a_label_must_fit_the_rules() {
    let config = SessionConfig::single(b"");
    assert!(config.clone().with_label(&"a".repeat(64)).is_ok());
    assert!(config.clone().with_label(&"a".repeat(65)).is_err());
    assert!(config.with_label("a\nb").is_err());
}

#[test]
fn the_real_server_grants_extend_and_renews_by_token() {
    let mut live = SingleNet::new(ServerConfig::default());
    let a = live.connect_session(extending(SessionConfig::single(b"")));
    assert_eq!(drain(live.session(a)), [SessionEvent::Ready]);
    assert_eq!(live.session(a).capabilities(), Capabilities::EXTEND);
    let rid = live.acquire_on(a, key("door"), 0, 2);
    let grant = granted(&drain(live.session(a)), rid);

    live.advance(ms(1_500));
    let sent_at = live.now;
    let deadline = sent_at.saturating_add(secs(5));
    let rid = live
        .session(a)
        .submit_extend(sent_at, key("door"), grant.token, secs(10), deadline)
        .unwrap();
    live.pump();
    assert_eq!(
        drain(live.session(a)),
        [outcome(
            rid,
            Outcome::Extended {
                status: ExtendStatus::Extended,
                valid_before: sent_at.saturating_add(secs(10)),
            }
        )]
    );
    // Past the first lease, the grant holds.
    live.advance(ms(1_000));
    let busy = live.acquire_on(a, key("door"), 0, 2);
    assert_eq!(drain(live.session(a)), [outcome(busy, Outcome::Timeout)]);

    // Released: a renewal is answered N and nothing comes back.
    let release = live.release_on(a, key("door"), grant.token);
    assert_eq!(
        drain(live.session(a)),
        [outcome(release, Outcome::Released)]
    );
    let now = live.now;
    let mut op = ExtendOperation::new(
        key("door"),
        grant.token,
        secs(10),
        now.saturating_add(secs(5)),
    )
    .unwrap();
    let rid = op.submit(now, live.session(a)).unwrap();
    live.pump();
    let events = drain(live.session(a));
    assert_eq!(events, [outcome(rid, Outcome::NotFound)]);
    assert_eq!(
        op.on_outcome(now, Outcome::NotFound),
        ExtendStep::Done(Err(ClientError::Lost))
    );
}

#[test]
fn a_renewal_is_refused_locally_without_extend() {
    // A session that did not negotiate (as against a published-protocol
    // server) never sends W.
    let mut scripted = Scripted::single();
    let deadline = scripted.now.saturating_add(secs(5));
    assert!(matches!(
        scripted
            .session
            .submit_extend(scripted.now, key("k"), 7, secs(10), deadline),
        Err(ClientError::Unsupported(_))
    ));
    assert_eq!(scripted.transmit(), []);
    assert_eq!(scripted.session.pending_len(), 0);

    // Negotiated, but the server granted nothing.
    let (mut scripted, x) = negotiating();
    scripted.reply(Reply::Negotiated {
        rid: x.rid(),
        granted: Capabilities::NONE,
    });
    assert_eq!(drain(&mut scripted.session), [SessionEvent::Ready]);
    assert!(matches!(
        scripted
            .session
            .submit_extend(scripted.now, key("k"), 7, secs(10), deadline),
        Err(ClientError::Unsupported(_))
    ));
    assert_eq!(scripted.transmit(), []);
}

#[test]
fn the_renewed_deadline_counts_from_when_the_w_was_sent() {
    let mut scripted = granted_extend();
    let deadline = scripted.now.saturating_add(secs(5));
    let rid = scripted
        .session
        .submit_extend(scripted.now, key("k"), 7, secs(10), deadline)
        .unwrap();
    // Handed out 100 ms after the submit, answered 300 ms later with the
    // lease left as the server answers.
    scripted.now = scripted.now.saturating_add(ms(100));
    let sent_at = scripted.now;
    let mut out = Vec::new();
    scripted.session.poll_transmit(sent_at, &mut out);
    let sent = decode_extended(&out);
    assert!(
        matches!(&sent[..], [Request::Extend(w)] if w.rid == rid && w.token == 7 && w.lease_s == 10),
        "{sent:?}"
    );
    scripted.now = scripted.now.saturating_add(ms(300));
    scripted.reply(Reply::Extended {
        rid,
        status: ExtendStatus::Clipped,
        lease_ms: 9_900,
    });
    assert_eq!(
        drain(&mut scripted.session),
        [outcome(
            rid,
            Outcome::Extended {
                status: ExtendStatus::Clipped,
                valid_before: sent_at.saturating_add(ms(9_900)),
            }
        )]
    );
}

#[test]
fn a_server_answering_more_lease_than_asked_does_not_lengthen_the_clients_deadline() {
    let mut scripted = granted_extend();
    let deadline = scripted.now.saturating_add(secs(5));
    let rid = scripted
        .session
        .submit_extend(scripted.now, key("k"), 7, secs(10), deadline)
        .unwrap();
    let sent_at = scripted.now;
    let mut out = Vec::new();
    scripted.session.poll_transmit(sent_at, &mut out);
    scripted.reply(Reply::Extended {
        rid,
        status: ExtendStatus::Extended,
        lease_ms: u32::MAX,
    });
    assert_eq!(
        drain(&mut scripted.session),
        [outcome(
            rid,
            Outcome::Extended {
                status: ExtendStatus::Extended,
                valid_before: sent_at.saturating_add(secs(10)),
            }
        )]
    );
}

#[test]
fn a_renewal_ends_like_an_acquire_when_its_reply_is_lost() {
    let mut scripted = granted_extend();
    let deadline = scripted.now.saturating_add(secs(5));
    let mut op = ExtendOperation::new(key("k"), 7, secs(10), deadline).unwrap();
    let rid = op.submit(scripted.now, &mut scripted.session).unwrap();
    scripted.transmit_extended();
    scripted.session.handle_transport_closed(scripted.now);
    let events = drain(&mut scripted.session);
    assert_eq!(events[0], outcome(rid, Outcome::Indeterminate));
    assert_eq!(
        op.on_outcome(scripted.now, Outcome::Indeterminate),
        ExtendStep::Done(Err(ClientError::Indeterminate))
    );
    // Certainly no effect (M, E 3/4, never sent): retried within the
    // deadline, then given up.
    assert!(matches!(
        op.on_outcome(scripted.now, Outcome::Retry),
        ExtendStep::RetryAt(_)
    ));
    assert_eq!(
        op.on_outcome(deadline, Outcome::Retry),
        ExtendStep::Done(Err(ClientError::Timeout))
    );
}

impl Scripted {
    fn transmit_extended(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        self.session.poll_transmit(self.now, &mut out);
        // The scripted server reads every byte at once.
        self.session.handle_written(self.now, true);
        decode_extended(&out)
    }
}

#[test]
fn a_server_that_closes_on_x_is_reported_and_its_endpoint_stops_negotiating() {
    let (mut scripted, _x) = negotiating();
    scripted.session.handle_transport_closed(scripted.now);
    assert_eq!(
        drain(&mut scripted.session),
        [SessionEvent::Closed(CloseReason::ExtensionsUnsupported)],
        "no outcome for our own X"
    );
    assert!(CloseReason::ExtensionsUnsupported.refuses_extensions());
    assert!(CloseReason::ServerError(ErrorCode::BadExtension).refuses_extensions());

    // A close before the X left is an ordinary one.
    let now = Instant::from_millis(1_000);
    let mut session = Session::new(now, extending(SessionConfig::single(b"")));
    accept_single(&mut session, now);
    session.handle_transport_closed(now);
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Closed(CloseReason::TransportClosed)]
    );

    // The broker remembers it per endpoint once it happened X_CLOSES_MAX
    // times in a row (one could be a reset): the next session sends no X.
    let config = extending(SessionConfig::single(b""));
    let mut state = BrokerState::<Tx>::new(2, 16);
    state.open_session(1, now, &config);
    for close in 1..=X_CLOSES_MAX {
        assert!(!state.extensions_refused(0), "refused after {close} closes");
        state.open_session(0, now, &config);
        let session = state.sessions[0].as_mut().unwrap();
        accept_single(session, now);
        let mut out = Vec::new();
        session.poll_transmit(now, &mut out);
        assert_eq!(decode_requests(&out).len(), 1, "our X goes out");
        state.transport_closed(0, now, &mut |_| {});
    }
    assert!(state.extensions_refused(0));
    assert!(!state.extensions_refused(1));
    state.open_session(0, now, &config);
    let session = state.sessions[0].as_mut().unwrap();
    assert_eq!(session.config().extensions, Capabilities::NONE);
    ready_single(session, now);
    assert_eq!(
        state.sessions[1].as_ref().unwrap().config().extensions,
        Capabilities::EXTEND
    );
}

#[test]
fn one_close_on_x_then_an_answered_negotiation_keeps_the_endpoint_negotiating() {
    // A reset that hits one negotiation, then a server that answers the
    // next: renewal is not lost, and the count starts again.
    let now = Instant::from_millis(1_000);
    let config = extending(SessionConfig::single(b""));
    let mut state = BrokerState::<Tx>::new(1, 16);
    for _ in 0..3 {
        state.open_session(0, now, &config);
        let session = state.sessions[0].as_mut().unwrap();
        accept_single(session, now);
        let mut out = Vec::new();
        session.poll_transmit(now, &mut out);
        state.transport_closed(0, now, &mut |_| {});
        assert!(!state.extensions_refused(0));
        state.open_session(0, now, &config);
        let session = state.sessions[0].as_mut().unwrap();
        assert_eq!(session.config().extensions, Capabilities::EXTEND);
        accept_single(session, now);
        let mut out = Vec::new();
        session.poll_transmit(now, &mut out);
        let sent = decode_requests(&out);
        assert_eq!(sent.len(), 1, "X asked again");
        let answer = Reply::Negotiated {
            rid: sent[0].rid(),
            granted: Capabilities::EXTEND,
        };
        session.handle_input(now, &reply_bytes(&answer));
        state.dispatch(0, now, &mut |_| {});
        assert!(!state.extensions_refused(0));
    }
    // E 8 refuses at once.
    state.open_session(0, now, &config);
    let session = state.sessions[0].as_mut().unwrap();
    accept_single(session, now);
    let mut out = Vec::new();
    session.poll_transmit(now, &mut out);
    let refused = Reply::Error {
        rid: decode_requests(&out)[0].rid(),
        code: ErrorCode::BadExtension,
    };
    session.handle_input(now, &reply_bytes(&refused));
    state.dispatch(0, now, &mut |_| {});
    assert!(state.extensions_refused(0));
}

#[test]
fn the_broker_asks_for_every_capability_with_its_label() {
    let config = BrokerConfig {
        label: "host/1/job".into(),
        ..BrokerConfig::single("h:1", TOKEN_A)
    };
    for endpoint in config.endpoints().unwrap() {
        let every = Capabilities::EXTEND
            .union(Capabilities::PUSH)
            .union(Capabilities::PERMITS)
            .union(Capabilities::OBSERVE)
            .union(Capabilities::SHARED);
        assert_eq!(endpoint.session.extensions, every);
        assert_eq!(endpoint.session.label(), "host/1/job");
    }
    let bad = BrokerConfig {
        label: "tab\there".into(),
        ..BrokerConfig::single("h:1", TOKEN_A)
    };
    assert!(matches!(bad.endpoints(), Err(ClientError::InvalidInput(_))));
    // The sessions a bare SessionConfig makes send no X (the published
    // clients' behaviour).
    assert_eq!(SessionConfig::single(b"").extensions, Capabilities::NONE);
}

// ---------------------------------------------------------------------------
// Pushes (`P`) and the hold cap (`H`)
// ---------------------------------------------------------------------------

/// A scripted session that asked for `wanted` and was granted `granted`.
fn negotiated(wanted: Capabilities, granted: Capabilities) -> Scripted {
    let now = Instant::from_millis(1_000);
    let mut config = SessionConfig::single(b"");
    config.extensions = wanted;
    let mut session = Session::new(now, config);
    accept_single(&mut session, now);
    let mut scripted = Scripted { session, now };
    let x = scripted.transmit();
    scripted.reply(Reply::Negotiated {
        rid: x[0].rid(),
        granted,
    });
    assert_eq!(drain(&mut scripted.session), [SessionEvent::Ready]);
    scripted
}

fn push(token: u64, kind: PushKind, lease_ms: u32) -> Reply {
    Reply::Push {
        token,
        kind,
        lease_ms,
    }
}

#[test]
fn a_push_reaches_the_driver_only_on_a_session_granted_push() {
    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let mut pushed = negotiated(both, both);
    pushed.reply(push(7, PushKind::LeaseEnding, 2_500));
    pushed.reply(push(7, PushKind::ForceReleased, 0));
    assert_eq!(
        pushed.events(),
        [
            SessionEvent::Push {
                token: 7,
                kind: PushKind::LeaseEnding,
                lease_ms: 2_500
            },
            SessionEvent::Push {
                token: 7,
                kind: PushKind::ForceReleased,
                lease_ms: 0
            },
        ]
    );
    // Asked but not granted, or never asked: dropped, and the session
    // goes on.
    for mut quiet in [
        negotiated(both, Capabilities::EXTEND),
        negotiated(Capabilities::EXTEND, Capabilities::EXTEND),
    ] {
        quiet.reply(push(7, PushKind::Expired, 0));
        assert_eq!(quiet.events(), []);
        assert!(quiet.session.is_ready());
    }
}

#[test]
fn the_broker_keeps_each_push_for_the_ticket_of_its_token() {
    use ticketing_core::client::{LossCause, PushNews};

    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let scripted = negotiated(both, both);
    let now = scripted.now;
    let mut state = BrokerState::<Tx>::new(1, 16);
    state.sessions[0] = Some(scripted.session);
    let feed = |state: &mut BrokerState<Tx>, reply: Reply| {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        state.sessions[0]
            .as_mut()
            .unwrap()
            .handle_input(now, &bytes);
        state.dispatch(0, now, &mut |_| {});
    };
    // Nothing is kept for a grant nobody heard of.
    assert_eq!(state.news(7, None), PushNews::default());
    assert_eq!(state.news_len(), 0);
    // A warning: the end is its receipt plus the lease it says is left.
    feed(&mut state, push(7, PushKind::LeaseEnding, 4_000));
    assert_eq!(
        state.news(7, None),
        PushNews {
            valid_before: Some(now.saturating_add(secs(4))),
            lost: None
        }
    );
    feed(&mut state, push(7, PushKind::ForceReleased, 0));
    assert_eq!(
        state.news(7, None),
        PushNews {
            valid_before: Some(now),
            lost: Some(LossCause::ForceReleased)
        }
    );
    assert_eq!(state.news(8, None), PushNews::default());
}

#[test]
fn a_capped_acquire_is_sent_as_h_and_granted_like_any_other() {
    let mut scripted = granted_extend();
    let capped = params(secs(5), secs(10), Duration::ZERO)
        .with_max_hold(Duration::from_secs(3_600))
        .unwrap();
    let sent_at = scripted.now;
    let rid = scripted
        .session
        .submit_acquire(
            sent_at,
            key("k"),
            &capped,
            capped.operation_deadline(sent_at),
        )
        .unwrap();
    let mut out = Vec::new();
    scripted.session.poll_transmit(scripted.now, &mut out);
    let sent = decode_extended(&out);
    assert!(
        matches!(&sent[..], [Request::AcquireCapped(h)]
            if h.rid == rid && h.max_hold_s == 3_600 && h.lease_s == 10 && h.wait_s == 5),
        "{sent:?}"
    );
    scripted.advance(ms(300));
    scripted.reply(Reply::AcquiredSet { rid, token: 12 });
    assert_eq!(
        scripted.events(),
        [outcome(
            rid,
            Outcome::Acquired(Grant {
                keys: key("k"),
                token: 12,
                valid_before: sent_at.saturating_add(secs(10)),
                permits: None,
            })
        )]
    );
}

#[test]
fn a_capped_acquire_without_extend_is_refused_locally_and_a_zero_cap_is_invalid() {
    let mut scripted = Scripted::single();
    let capped = params(secs(5), secs(10), Duration::ZERO)
        .with_max_hold(Duration::from_secs(60))
        .unwrap();
    assert!(matches!(
        scripted.session.submit_acquire(
            scripted.now,
            key("k"),
            &capped,
            capped.operation_deadline(scripted.now)
        ),
        Err(ClientError::Unsupported(_))
    ));
    assert!(scripted.transmit().is_empty());
    assert!(matches!(
        params(secs(5), secs(10), Duration::ZERO).with_max_hold(Duration::ZERO),
        Err(ClientError::InvalidInput(_))
    ));
    // Sub-second caps round up, like every other time.
    let rounded = params(secs(5), secs(10), Duration::ZERO)
        .with_max_hold(ms(1_500))
        .unwrap();
    assert_eq!(rounded.max_hold_s(), Some(2));
}

/// Our `X` that the driver never handed out within a handshake's allowance
/// (a socket that would not take a byte) ends the session as a handshake
/// timeout: no outcome for its rid, which no caller submitted, and no
/// session left waiting forever for an answer to a request never sent.
#[test]
fn an_x_never_sent_within_the_handshake_allowance_closes_the_session_without_an_outcome() {
    let now = Instant::from_millis(1_000);
    let mut config = SessionConfig::single(b"");
    config.extensions = Capabilities::EXTEND;
    let allowance = config.handshake_timeout;
    let mut session = Session::new(now, config);
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: NO_LEADER_SLOT,
        nonce: [0x42; 16],
    };
    session.handle_input(now, &hello.encode());
    session.handle_input(now, &[1]);
    assert!(!session.is_ready(), "waits for the X's answer");
    let later = now.saturating_add(allowance);
    session.handle_timeout(later);
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Closed(CloseReason::HandshakeTimeout)]
    );
    assert!(session.is_closed());
}
