//! Elections on the single-mode server, over bytes: an election's name is
//! an ordinary key, its holder the leader and the holder's token the term;
//! `O` (capability OBSERVE) tells who leads, read from the lock table and
//! the holding connection's label, or that nobody does. A connection that
//! did not negotiate OBSERVE cannot send `O` (an unknown op closes it, as
//! for a published client). Time is injected; the clock jumps.

use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::testing::net::{SingleNet, acquire, release};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, ErrorCode, Key, LeaderLabel, LeaderState, NegotiateRequest,
    ObserveRequest, Observed, Reply, Request,
};

fn negotiate(rid: u64, wanted: Capabilities, label: &str) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version: EXTENSION_VERSION,
        wanted,
        label: label.to_owned(),
    })
}

fn observe(rid: u64, name: &str) -> Request {
    Request::Observe(ObserveRequest {
        rid,
        name: Key::from_text(name).unwrap(),
    })
}

/// A connection that negotiated every capability under `label`.
fn candidate(h: &mut SingleNet, label: &str) -> ConnId {
    let conn = h.connect();
    assert_eq!(
        h.call(conn, &negotiate(1, Capabilities::KNOWN, label)),
        [Reply::Negotiated {
            rid: 1,
            granted: Capabilities::KNOWN
        }]
    );
    conn
}

/// The one `O` answer in `replies`.
fn observed(replies: &[Reply]) -> Observed {
    match replies {
        [Reply::Observed { observed, .. }] => *observed,
        other => panic!("expected one observe answer, got {other:?}"),
    }
}

fn granted(replies: &[Reply]) -> u64 {
    match replies {
        [Reply::Acquired { token, .. }] => *token,
        other => panic!("expected one grant, got {other:?}"),
    }
}

#[test]
fn observing_a_free_name_says_there_is_no_leader() {
    let mut h = SingleNet::default();
    let watcher = candidate(&mut h, "watcher");
    assert_eq!(
        h.call(watcher, &observe(2, "election")),
        [Reply::Observed {
            rid: 2,
            observed: Observed::NO_LEADER
        }]
    );
}

#[test]
fn observing_names_the_leaders_label_term_and_lease_left() {
    let mut h = SingleNet::default();
    let a = candidate(&mut h, "host-a/1");
    let watcher = candidate(&mut h, "watcher");
    let term = granted(&h.call(a, &acquire(2, &["election"], 0, 10)));
    h.advance(Duration::from_secs(4));
    let seen = observed(&h.call(watcher, &observe(2, "election")));
    assert_eq!(
        seen,
        Observed {
            state: LeaderState::Connected,
            term,
            lease_ms: 6_000,
            label: LeaderLabel::new("host-a/1").unwrap(),
        }
    );
    // Read-only: the leader still holds, under the same term.
    assert_eq!(observed(&h.call(a, &observe(3, "election"))).term, term);
}

#[test]
fn after_a_resign_the_next_candidate_leads_with_a_larger_term() {
    let mut h = SingleNet::default();
    let a = candidate(&mut h, "a");
    let b = candidate(&mut h, "b");
    let watcher = candidate(&mut h, "watcher");
    let first = granted(&h.call(a, &acquire(2, &["election"], 0, 10)));
    assert!(
        h.call(b, &acquire(2, &["election"], 30, 10)).is_empty(),
        "b campaigns: queued"
    );
    // A resign is a release: the key goes straight to the next in line.
    assert_eq!(
        h.call(a, &release(3, &["election"], first)),
        [Reply::Released { rid: 3 }]
    );
    let second = granted(&h.replies(b));
    assert!(second > first);
    let seen = observed(&h.call(watcher, &observe(2, "election")));
    assert_eq!(seen.state, LeaderState::Connected);
    assert_eq!(seen.term, second);
    assert_eq!(seen.label.as_str(), "b");
}

#[test]
fn when_the_leaders_lease_runs_out_the_waiting_candidate_leads_and_then_nobody() {
    let mut h = SingleNet::default();
    let a = candidate(&mut h, "a");
    let b = candidate(&mut h, "b");
    let watcher = candidate(&mut h, "watcher");
    let first = granted(&h.call(a, &acquire(2, &["election"], 0, 5)));
    assert!(h.call(b, &acquire(2, &["election"], 30, 5)).is_empty());
    h.advance(Duration::from_secs(5));
    let second = granted(&h.replies(b));
    assert!(second > first);
    let seen = observed(&h.call(watcher, &observe(2, "election")));
    assert_eq!((seen.term, seen.label.as_str()), (second, "b"));
    // Nobody renews or waits: when that lease ends too, nobody leads,
    // though the table may not have swept the key yet.
    h.advance(Duration::from_secs(5));
    assert_eq!(
        observed(&h.call(watcher, &observe(3, "election"))),
        Observed::NO_LEADER
    );
}

#[test]
fn a_leader_whose_connection_closed_leads_under_its_label_until_its_lease_ends() {
    let mut h = SingleNet::default();
    let a = candidate(&mut h, "dead-leader");
    let watcher = candidate(&mut h, "watcher");
    let term = granted(&h.call(a, &acquire(2, &["election"], 0, 10)));
    // The process dies: its delivered grant stays until the lease ends.
    h.server.handle_closed(h.now, a);
    let seen = observed(&h.call(watcher, &observe(2, "election")));
    assert_eq!(seen.state, LeaderState::Departed);
    assert_eq!((seen.term, seen.label.as_str()), (term, "dead-leader"));
    h.advance(Duration::from_secs(10));
    assert_eq!(
        observed(&h.call(watcher, &observe(3, "election"))),
        Observed::NO_LEADER
    );
}

#[test]
fn a_leader_that_gave_no_label_is_reported_with_an_empty_one() {
    let mut h = SingleNet::default();
    // A published client: no `X`, so no label.
    let plain = h.connect();
    let watcher = candidate(&mut h, "watcher");
    let term = granted(&h.call(plain, &acquire(1, &["election"], 0, 10)));
    let seen = observed(&h.call(watcher, &observe(2, "election")));
    assert_eq!(seen.state, LeaderState::Connected);
    assert_eq!(seen.term, term);
    assert!(seen.label.is_empty());
}

#[test]
fn o_is_an_unknown_op_without_observe_and_an_empty_name_gets_e_1() {
    let mut h = SingleNet::default();
    // A connection that negotiated nothing, as every published client:
    // `O` closes it like any unknown op.
    let plain = h.connect();
    let (_, state) = h.call_bytes(plain, &observe(2, "election").to_frame());
    assert_eq!(state, ConnState::CloseAfterFlush);
    let without = h.connect();
    let wanted = Capabilities::EXTEND
        .union(Capabilities::PUSH)
        .union(Capabilities::PERMITS);
    h.call(without, &negotiate(1, wanted, "no-observe"));
    let (_, state) = h.call_bytes(without, &observe(2, "election").to_frame());
    assert_eq!(state, ConnState::CloseAfterFlush);

    let conn = candidate(&mut h, "c");
    // rid 2 and no key at all.
    let frame = [&[b'O', 0, 8][..], &2u64.to_be_bytes()].concat();
    let (replies, state) = h.call_bytes(conn, &frame);
    assert_eq!(
        replies,
        [Reply::Error {
            rid: 2,
            code: ErrorCode::BadKey
        }]
    );
    assert_eq!(state, ConnState::Open);
}
