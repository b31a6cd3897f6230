//! Shared locks on the single-mode server, over bytes (`Y` and `D`,
//! docs/protocol.md §8.7): sharers overlap while a writer waits; a shared
//! grant is released by token (`G`), renewed (`W`), released when
//! undelivered (a ghost), force-released and downgraded to; a connection
//! that did not negotiate SHARED cannot send `Y` (an unknown op closes it,
//! as for a published client), and fields out of range get their `E`.
//! Time is injected; the clock jumps.

use ticketing_core::inspect::ForceReleaseOutcome;
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::testing::net::{SingleNet, decode_replies};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    AcquireRequest, AcquireSharedRequest, Capabilities, DowngradeRequest, EXTENSION_VERSION,
    ErrorCode, ExtendRequest, Key, KeyGroup, NegotiateRequest, ReleaseRequest, Reply, Request,
};

fn negotiate(rid: u64, wanted: Capabilities) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version: EXTENSION_VERSION,
        wanted,
        label: String::new(),
    })
}

fn keys(names: &[&str]) -> KeyGroup {
    KeyGroup::new(names.iter().map(|n| Key::from_text(n).unwrap()).collect()).unwrap()
}

/// `Y` of `names` with mode mask `modes`.
fn shared(rid: u64, names: &[&str], modes: u16, wait_s: u8) -> Request {
    Request::AcquireShared(AcquireSharedRequest {
        rid,
        wait_s,
        lease_s: 10,
        max_hold_s: 0,
        modes,
        keys: keys(names),
    })
}

fn exclusive(rid: u64, name: &str, wait_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s: 10,
        keys: keys(&[name]),
        set: false,
    })
}

fn release(rid: u64, names: &[&str], token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: keys(names),
        set: true,
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

fn set_token(replies: &[Reply]) -> u64 {
    match replies {
        [Reply::AcquiredSet { token, .. }] => *token,
        other => panic!("expected one set grant, got {other:?}"),
    }
}

#[test]
fn two_sharers_overlap_while_a_writer_waits_for_both() {
    let mut h = SingleNet::default();
    let [a, b, w] = [(); 3].map(|()| connect_all(&mut h));
    let ta = set_token(&h.call(a, &shared(2, &["k"], 1, 0)));
    let tb = set_token(&h.call(b, &shared(2, &["k"], 1, 0)));
    assert!(tb > ta);
    assert!(
        h.call(w, &exclusive(2, "k", 30)).is_empty(),
        "the writer waits"
    );
    assert_eq!(
        h.call(a, &release(3, &["k"], ta)),
        [Reply::ReleasedSet { rid: 3 }]
    );
    assert!(h.replies(w).is_empty(), "one sharer is still in");
    assert_eq!(
        h.call(b, &release(3, &["k"], tb)),
        [Reply::ReleasedSet { rid: 3 }]
    );
    assert!(matches!(h.replies(w)[..], [Reply::Acquired { rid: 2, token }] if token > tb));
}

#[test]
fn a_sharer_renews_by_token_and_its_lease_then_hands_the_key_on() {
    let mut h = SingleNet::default();
    let [a, w] = [(); 2].map(|()| connect_all(&mut h));
    let ta = set_token(&h.call(a, &shared(2, &["k"], 1, 0)));
    assert!(h.call(w, &exclusive(2, "k", 60)).is_empty());
    let renew = Request::Extend(ExtendRequest {
        rid: 3,
        token: ta,
        lease_s: 20,
        keys: keys(&["k"]),
    });
    assert!(matches!(
        h.call(a, &renew)[..],
        [Reply::Extended { rid: 3, .. }]
    ));
    h.advance(Duration::from_secs(15));
    assert!(h.replies(w).is_empty(), "renewed past its first lease");
    h.advance(Duration::from_secs(6));
    assert!(matches!(h.replies(w)[..], [Reply::Acquired { rid: 2, .. }]));
}

#[test]
fn an_undelivered_shared_grant_is_released_as_a_ghost() {
    let mut h = SingleNet::default();
    let [x, r, w] = [(); 3].map(|()| connect_all(&mut h));
    let tx = set_token(&h.call(x, &shared(2, &["k"], 0, 0)));
    assert!(h.call(r, &shared(2, &["k"], 1, 60)).is_empty());
    assert!(h.call(w, &exclusive(2, "k", 60)).is_empty());
    h.call(x, &release(3, &["k"], tx));
    // The reader is granted, but its connection ends before the reply is
    // written whole: its share is released and the writer gets in.
    let (bytes, _) = h.take_unflushed(r);
    assert!(matches!(
        decode_replies(&bytes)[..],
        [Reply::AcquiredSet { .. }]
    ));
    h.server.handle_closed(h.now, r);
    assert!(matches!(h.replies(w)[..], [Reply::Acquired { rid: 2, .. }]));
}

#[test]
fn an_operator_force_releases_one_sharer() {
    let mut h = SingleNet::default();
    let [a, b, w] = [(); 3].map(|()| connect_all(&mut h));
    let ta = set_token(&h.call(a, &shared(2, &["k"], 1, 0)));
    let tb = set_token(&h.call(b, &shared(2, &["k"], 1, 0)));
    assert!(h.call(w, &exclusive(2, "k", 60)).is_empty());
    let outcome = h.force_release("k", Some(tb));
    assert!(matches!(outcome, ForceReleaseOutcome::Released { revoked, .. } if revoked == tb));
    assert!(h.replies(w).is_empty());
    // Without a token: the oldest sharer.
    let outcome = h.force_release("k", None);
    assert!(matches!(outcome, ForceReleaseOutcome::Released { revoked, .. } if revoked == ta));
    assert!(matches!(h.replies(w)[..], [Reply::Acquired { rid: 2, .. }]));
}

#[test]
fn a_downgrade_lets_the_readers_behind_in_but_not_a_writer() {
    let mut h = SingleNet::default();
    let [x, r, w, r2] = [(); 4].map(|()| connect_all(&mut h));
    let tx = set_token(&h.call(x, &shared(2, &["k"], 0, 0)));
    assert!(h.call(r, &shared(2, &["k"], 1, 60)).is_empty());
    assert!(h.call(w, &exclusive(2, "k", 60)).is_empty());
    assert!(h.call(r2, &shared(2, &["k"], 1, 60)).is_empty());
    let downgrade = Request::Downgrade(DowngradeRequest {
        rid: 3,
        token: tx,
        keys: keys(&["k"]),
    });
    assert_eq!(h.call(x, &downgrade), [Reply::Downgraded { rid: 3 }]);
    assert!(matches!(
        h.replies(r)[..],
        [Reply::AcquiredSet { rid: 2, .. }]
    ));
    assert!(h.replies(w).is_empty(), "the writer waits for both sharers");
    assert!(h.replies(r2).is_empty(), "a reader behind the writer waits");
    let not_current = Request::Downgrade(DowngradeRequest {
        rid: 4,
        token: tx + 100,
        keys: keys(&["k"]),
    });
    assert_eq!(h.call(x, &not_current), [Reply::NotFound { rid: 4 }]);
}

#[test]
fn a_mixed_set_is_one_grant_of_both_modes() {
    let mut h = SingleNet::default();
    let [a, b] = [(); 2].map(|()| connect_all(&mut h));
    // `catalog` (key 0) shared, `orders/42` exclusive.
    let t = set_token(&h.call(a, &shared(2, &["catalog", "orders/42"], 0b01, 0)));
    let reader = set_token(&h.call(b, &shared(2, &["catalog"], 1, 0)));
    assert!(reader > t);
    assert_eq!(
        h.call(b, &exclusive(3, "orders/42", 0)),
        [Reply::TimedOut { rid: 3 }]
    );
    assert_eq!(
        h.call(a, &release(3, &["catalog", "orders/42"], t)),
        [Reply::ReleasedSet { rid: 3 }]
    );
}

#[test]
fn fields_out_of_range_get_their_code() {
    let mut h = SingleNet::default();
    let a = connect_all(&mut h);
    // A mode bit past the last key.
    assert_eq!(
        h.call(a, &shared(2, &["k"], 0b10, 0)),
        [Reply::Error {
            rid: 2,
            code: ErrorCode::BadModes
        }]
    );
    let zero_token = Request::Downgrade(DowngradeRequest {
        rid: 3,
        token: 0,
        keys: keys(&["k"]),
    });
    assert_eq!(
        h.call(a, &zero_token),
        [Reply::Error {
            rid: 3,
            code: ErrorCode::BadToken
        }]
    );
}

#[test]
fn without_shared_negotiated_a_y_is_an_unknown_op() {
    let mut h = SingleNet::default();
    let plain = h.connect();
    let (replies, state) = h.call_bytes(plain, &shared(2, &["k"], 1, 0).to_frame());
    assert!(replies.is_empty());
    assert_ne!(state, ConnState::Open);
    let others = h.connect();
    let wanted = Capabilities::EXTEND.union(Capabilities::PUSH);
    assert!(matches!(
        h.call(others, &negotiate(1, wanted))[..],
        [Reply::Negotiated { granted, .. }] if granted == wanted
    ));
    let (_, state) = h.call_bytes(others, &shared(2, &["k"], 1, 0).to_frame());
    assert_ne!(state, ConnState::Open);
}

#[test]
fn inspection_shows_the_sharer_batch_and_each_waiter_s_mode() {
    let mut h = SingleNet::default();
    let [a, b, w, r] = [(); 4].map(|()| connect_all(&mut h));
    let ta = set_token(&h.call(a, &shared(2, &["k"], 1, 0)));
    let tb = set_token(&h.call(b, &shared(2, &["k"], 1, 0)));
    assert!(h.call(w, &exclusive(2, "k", 60)).is_empty());
    assert!(h.call(r, &shared(2, &["k"], 1, 60)).is_empty());
    let view = h.show("k");
    let tokens: Vec<u64> = view.sharers.iter().map(|s| s.token).collect();
    assert_eq!(tokens, [ta, tb]);
    assert_eq!(
        view.holder.as_ref().map(|h| h.token),
        Some(ta),
        "the oldest"
    );
    assert!(view.sharers.iter().all(|s| s.conn.is_some()));
    let modes: Vec<bool> = view.waiters.iter().map(|w| w.shared).collect();
    assert_eq!(modes, [false, true]);
    // Held exclusive: no sharers.
    h.call(a, &release(3, &["k"], ta));
    h.call(b, &release(3, &["k"], tb));
    assert!(matches!(h.replies(w)[..], [Reply::Acquired { .. }]));
    let view = h.show("k");
    assert!(view.sharers.is_empty());
    assert!(view.holder.is_some());
}

#[test]
fn each_sharer_hears_its_own_lease_ending_and_its_loss() {
    use ticketing_core::wire::PushKind;
    let mut h = SingleNet::default();
    let [a, b] = [(); 2].map(|()| connect_all(&mut h));
    let ta = set_token(&h.call(a, &shared(2, &["k"], 1, 0)));
    h.advance(Duration::from_secs(5));
    let tb = set_token(&h.call(b, &shared(2, &["k"], 1, 0)));
    // `a`'s lease (10 s) has a quarter left at 7.5 s; `b`'s not yet.
    h.advance(Duration::from_secs(3));
    assert!(matches!(
        h.replies(a)[..],
        [Reply::Push { token, kind: PushKind::LeaseEnding, .. }] if token == ta
    ));
    assert!(h.replies(b).is_empty());
    // An operator revokes `b` alone: it hears so; `a` hears nothing.
    let outcome = h.force_release("k", Some(tb));
    assert!(matches!(outcome, ForceReleaseOutcome::Released { revoked, .. } if revoked == tb));
    assert!(matches!(
        h.replies(b)[..],
        [Reply::Push { token, kind: PushKind::ForceReleased, .. }] if token == tb
    ));
    assert!(h.replies(a).is_empty());
    // `a`'s lease runs out.
    h.advance(Duration::from_secs(3));
    assert!(matches!(
        h.replies(a)[..],
        [Reply::Push { token, kind: PushKind::Expired, .. }] if token == ta
    ));
}
