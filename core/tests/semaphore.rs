//! FIFO semaphores on the single-mode server, over bytes: `Q` grants the
//! lowest free slots under one token; the grant is a key set of slot keys,
//! released with `G`, renewed with `W`, force-released and released when
//! undelivered like any grant; a connection that did not negotiate PERMITS
//! cannot send `Q` (an unknown op closes it, as for a published client).
//! Time is injected; the clock jumps.

use ticketing_core::inspect::{ForceRelease, ForceReleaseOutcome};
use ticketing_core::lock::{Limits, LockConfig};
use ticketing_core::machine::{Machine, Output};
use ticketing_core::metrics::ReplyKind;
use ticketing_core::server::{ConnId, ConnState, ServerConfig};
use ticketing_core::testing::net::{SingleNet, decode_replies};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, ErrorCode, ExtendRequest, ExtendStatus, Key, KeyGroup,
    NegotiateRequest, PermitsRequest, ReleaseRequest, Reply, Request, slot_key,
};

fn negotiate(rid: u64, wanted: Capabilities) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version: EXTENSION_VERSION,
        wanted,
        label: String::new(),
    })
}

fn permits(rid: u64, name: &str, permits: u8, capacity: u16, wait_s: u8) -> Request {
    Request::AcquirePermits(PermitsRequest {
        rid,
        wait_s,
        lease_s: 10,
        max_hold_s: 0,
        permits,
        capacity,
        name: Key::from_text(name).unwrap(),
    })
}

fn slot_keys(name: &str, slots: &[u16]) -> KeyGroup {
    let name = Key::from_text(name).unwrap();
    KeyGroup::new(slots.iter().map(|&s| slot_key(&name, s).unwrap()).collect()).unwrap()
}

fn release(rid: u64, keys: KeyGroup, token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        set: true,
        keys,
    })
}

/// A connection that negotiated every capability this build has.
fn connect_all(h: &mut SingleNet) -> ConnId {
    let conn = h.connect();
    assert_eq!(
        h.call(conn, &negotiate(1, Capabilities::KNOWN)),
        [Reply::Negotiated {
            rid: 1,
            granted: Capabilities::KNOWN
        }]
    );
    conn
}

/// The one `Q` grant in `replies`: token and slots.
fn permit_grant(replies: &[Reply]) -> (u64, Vec<u16>, u16) {
    match replies {
        [
            Reply::Permits {
                token, slots, free, ..
            },
        ] => (*token, slots.as_slice().to_vec(), *free),
        other => panic!("expected one permit grant, got {other:?}"),
    }
}

#[test]
fn three_workers_on_two_slots_the_third_waits_its_turn() {
    let mut h = SingleNet::default();
    let [a, b, c] = [(); 3].map(|()| connect_all(&mut h));
    let (ta, slots_a, free) = permit_grant(&h.call(a, &permits(2, "jobs", 1, 2, 30)));
    assert_eq!((slots_a.as_slice(), free), (&[0][..], 1));
    let (tb, slots_b, free) = permit_grant(&h.call(b, &permits(2, "jobs", 1, 2, 30)));
    assert_eq!((slots_b.as_slice(), free), (&[1][..], 0));
    assert!(tb > ta);
    assert!(
        h.call(c, &permits(2, "jobs", 1, 2, 30)).is_empty(),
        "queued"
    );
    // The first releases its slot with `G` on its slot key: the third gets
    // it at once, under a larger token.
    assert_eq!(
        h.call(a, &release(3, slot_keys("jobs", &[0]), ta)),
        [Reply::ReleasedSet { rid: 3 }]
    );
    let (tc, slots_c, _) = permit_grant(&h.replies(c));
    assert_eq!(slots_c, [0]);
    assert_eq!(h.server.stats().permit_waiters, 0);
    assert!(tc > tb);
    // Never more than the capacity: both slots are taken again.
    assert_eq!(
        h.call(a, &permits(4, "jobs", 1, 2, 0)),
        [Reply::TimedOut { rid: 4 }]
    );
}

#[test]
fn a_capacity_mismatch_names_both_and_changes_nothing() {
    let mut h = SingleNet::default();
    let [a, b] = [(); 2].map(|()| connect_all(&mut h));
    let (token, _, _) = permit_grant(&h.call(a, &permits(2, "pool", 2, 4, 0)));
    assert_eq!(
        h.call(b, &permits(2, "pool", 1, 8, 0)),
        [Reply::CapacityMismatch {
            rid: 2,
            asked: 8,
            capacity: 4
        }]
    );
    // The holder is untouched and the connection goes on.
    assert_eq!(
        h.call(a, &release(3, slot_keys("pool", &[0, 1]), token)),
        [Reply::ReleasedSet { rid: 3 }]
    );
    // Nobody uses it now: the new capacity is taken.
    let (_, slots, free) = permit_grant(&h.call(b, &permits(3, "pool", 6, 8, 0)));
    assert_eq!((slots.len(), free), (6, 2));
}

#[test]
fn permits_are_renewed_by_token_and_run_out_with_their_lease() {
    let mut h = SingleNet::default();
    let [a, b] = [(); 2].map(|()| connect_all(&mut h));
    let (token, slots, _) = permit_grant(&h.call(a, &permits(2, "s", 1, 1, 0)));
    assert!(h.call(b, &permits(2, "s", 1, 1, 60)).is_empty(), "queued");
    h.advance(Duration::from_secs(8));
    let renew = Request::Extend(ExtendRequest {
        rid: 3,
        token,
        lease_s: 10,
        keys: slot_keys("s", &slots),
    });
    let mut renewed = h.call(a, &renew);
    // The holder negotiated pushes: it was told its lease is ending, as
    // for any grant.
    assert!(matches!(
        renewed.first(),
        Some(Reply::Push { token: pushed, kind: ticketing_core::wire::PushKind::LeaseEnding, .. }) if *pushed == token
    ));
    renewed.remove(0);
    assert!(
        matches!(
            renewed[..],
            [Reply::Extended {
                rid: 3,
                status: ExtendStatus::Extended,
                ..
            }]
        ),
        "{renewed:?}"
    );
    // The first lease would have ended at 10 s; renewed, it ends at 18 s.
    h.advance(Duration::from_secs(9));
    assert!(h.replies(b).is_empty(), "still held at 17 s");
    h.advance(Duration::from_secs(1));
    let (next, slots, _) = permit_grant(&h.replies(b));
    assert_eq!(slots, [0]);
    assert!(next > token);
}

#[test]
fn a_force_released_permit_goes_to_the_head_under_a_larger_token() {
    let mut h = SingleNet::default();
    let [a, b] = [(); 2].map(|()| connect_all(&mut h));
    let (token, _, _) = permit_grant(&h.call(a, &permits(2, "s", 1, 1, 0)));
    assert!(h.call(b, &permits(2, "s", 1, 1, 60)).is_empty(), "queued");
    let id = ticketing_core::inspect::AdminRequestId(1);
    let key = slot_keys("s", &[0]).keys()[0].clone();
    h.server.handle_force_release(
        h.now,
        id,
        ForceRelease {
            key,
            token: Some(token),
        },
    );
    let answered = std::iter::from_fn(|| h.server.poll_output(h.now)).any(|output| {
        matches!(
            output,
            Output::AdminReply {
                outcome: ForceReleaseOutcome::Released { revoked, .. },
                ..
            } if revoked == token
        )
    });
    assert!(answered, "the force-release was answered");
    let (next, _, _) = permit_grant(&h.replies(b));
    assert!(next > token);
}

#[test]
fn an_undelivered_permit_grant_is_released_for_the_next_waiter() {
    let mut h = SingleNet::default();
    let [a, b, c] = [(); 3].map(|()| connect_all(&mut h));
    let (token, _, _) = permit_grant(&h.call(a, &permits(2, "s", 1, 1, 0)));
    h.send(b, &permits(2, "s", 1, 1, 60));
    h.send(c, &permits(2, "s", 1, 1, 60));
    h.call(a, &release(3, slot_keys("s", &[0]), token));
    // `b` is granted, but its connection ends before the reply is written.
    let (bytes, _) = h.take_unflushed(b);
    assert!(matches!(
        decode_replies(&bytes)[..],
        [Reply::Permits { .. }]
    ));
    h.server.handle_closed(h.now, b);
    let (next, slots, _) = permit_grant(&h.replies(c));
    assert_eq!(slots, [0]);
    assert!(next > token);
}

#[test]
fn a_closed_waiter_leaves_the_queue_and_the_next_is_served() {
    let mut h = SingleNet::default();
    let [a, b, c] = [(); 3].map(|()| connect_all(&mut h));
    permit_grant(&h.call(a, &permits(2, "s", 2, 3, 0)));
    // `b` wants two and heads the queue; `c` wants one, which would fit,
    // but waits behind it.
    assert!(h.call(b, &permits(2, "s", 2, 3, 60)).is_empty());
    assert!(h.call(c, &permits(2, "s", 1, 3, 60)).is_empty());
    h.server.handle_closed(h.now, b);
    let (_, slots, _) = permit_grant(&h.replies(c));
    assert_eq!(slots, [2]);
}

#[test]
fn q_is_an_unknown_op_without_permits_and_bad_fields_get_e_9() {
    let mut h = SingleNet::default();
    // A connection that negotiated nothing, as every published client:
    // `Q` closes it like any unknown op.
    let plain = h.connect();
    let (_, state) = h.call_bytes(plain, &permits(2, "s", 1, 1, 0).to_frame());
    assert_eq!(state, ConnState::CloseAfterFlush);
    let only_extend = h.connect();
    h.call(only_extend, &negotiate(1, Capabilities::EXTEND));
    let (_, state) = h.call_bytes(only_extend, &permits(2, "s", 1, 1, 0).to_frame());
    assert_eq!(state, ConnState::CloseAfterFlush);

    let conn = connect_all(&mut h);
    for (rid, request) in [
        (2, permits(2, "s", 0, 1, 0)),
        (3, permits(3, "s", 17, 20, 0)),
        (4, permits(4, "s", 3, 2, 0)),
        (5, permits(5, "s", 1, 0, 0)),
        (6, permits(6, "s", 1, 1025, 0)),
    ] {
        assert_eq!(
            h.call(conn, &request),
            [Reply::Error {
                rid,
                code: ErrorCode::BadPermits
            }],
            "{request:?}"
        );
    }
    // A name that leaves no room for the slot suffix is a bad key.
    let long = "n".repeat(123);
    assert_eq!(
        h.call(conn, &permits(7, &long, 1, 1, 0)),
        [Reply::Error {
            rid: 7,
            code: ErrorCode::BadKey
        }]
    );
    // Nothing was granted by any of them.
    assert_eq!(h.server.lock_table().key_count(), 0);
}

/// A `B` from a semaphore's own limit is counted under that limit, not as
/// a per-connection refusal; one from the connection's in-flight limit
/// still is.
#[test]
fn permit_refusals_are_counted_by_the_limit_that_was_reached() {
    let config = ServerConfig {
        lock: LockConfig {
            limits: Limits {
                keys_max: 8,
                waiters_per_key_max: 1,
                waiters_total_max: 10,
            },
            ..LockConfig::default()
        },
        in_flight_per_connection_max: 1,
        ..ServerConfig::default()
    };
    let mut h = SingleNet::new(config);
    let [a, b, c] = [(); 3].map(|()| connect_all(&mut h));
    permit_grant(&h.call(a, &permits(2, "jobs", 1, 1, 30)));
    assert!(
        h.call(b, &permits(2, "jobs", 1, 1, 30)).is_empty(),
        "queued"
    );
    // The semaphore's queue is full (one waiter per key).
    assert_eq!(
        h.call(c, &permits(2, "jobs", 1, 1, 30)),
        [Reply::Busy { rid: 2 }]
    );
    // b already has a request in flight: its own limit.
    assert_eq!(
        h.call(b, &permits(3, "other", 1, 1, 30)),
        [Reply::Busy { rid: 3 }]
    );
    let m = h.metrics();
    assert_eq!(m.busy_semaphores.waiters_per_semaphore_max, 1);
    assert_eq!(m.busy_semaphores.total(), 1);
    assert_eq!(m.busy_per_connection, 1);
    assert_eq!(m.replies.of(ReplyKind::Busy), 2);
}
