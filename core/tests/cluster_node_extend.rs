//! The negotiated extension on `ClusterNode`s over the test network
//! (`ticketing_core::testing::net::ClusterNet`, time injected, nothing
//! sleeping): a `W` is a committed `Extend`, answered only once applied; a
//! new leader ends an extended lease at its own apply plus the lease; a
//! renewal that races a force-release or an expiry gets the answer the
//! committed order gives, on every node alike; and the leader pushes
//! `P` frames to holders that asked for them, and to nobody else.

mod cluster_common;

use cluster_common::*;
use ticketing_core::inspect::{ForceRelease, ForceReleaseOutcome};
use ticketing_core::machine::Machine;
use ticketing_core::testing::net::ClusterNet;
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    Capabilities, ExtendRequest, ExtendStatus, Key, PushKind, Reply, Request,
};

const ONE_MICRO: Duration = Duration::from_micros(1);

fn extend(rid: u64, key: &str, token: u64, lease_s: u8) -> Request {
    Request::Extend(ExtendRequest {
        rid,
        token,
        lease_s,
        keys: keys(key),
    })
}

fn push(token: u64, kind: PushKind, lease_ms: u32) -> Reply {
    Reply::Push {
        token,
        kind,
        lease_ms,
    }
}

/// Node `i`'s lease deadline of grant `token`, if it holds it.
fn deadline(net: &mut ClusterNet, i: usize, token: u64) -> Option<Instant> {
    net.node(i).lock_state().grant(token).map(|h| h.deadline)
}

/// Runs the net until its clock reads `at` (which must not be past).
fn run_until(net: &mut ClusterNet, at: Instant) {
    assert!(at >= net.now, "{at:?} is past ({:?})", net.now);
    let by = at.saturating_duration_since(net.now);
    net.run_for(by);
    assert_eq!(net.now, at);
}

/// The pushes client `c` got since reply `from`.
fn pushes_since(net: &ClusterNet, c: usize, from: usize) -> Vec<Reply> {
    net.clients[c].replies[from..]
        .iter()
        .copied()
        .filter(|r| matches!(r, Reply::Push { .. }))
        .collect()
}

// ------------------------------------------------------------- commit first

/// A `W` is a committed command: while no follower hears the leader, the
/// leader neither applies it nor answers it, however long it waits (here
/// less than an election timeout, so it keeps leading); once the followers
/// get its appends, the `Extend` commits, every node applies it and the
/// `W` is answered.
#[test]
fn an_extend_is_answered_only_once_committed_and_applied() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    let token = token_of(net.request(c, acquire(2, "k", 0, 10)));
    net.run_for(Duration::from_millis(100));
    let before: Vec<Option<Instant>> = (0..3).map(|i| deadline(&mut net, i, token)).collect();
    assert!(before.iter().all(Option::is_some), "every node applied");

    net.send_only(c, extend(3, "k", token, 60));
    let sent_at = net.now;
    // 100 ms of the leader's clock; the followers hear nothing (and their
    // own timers have nothing due in that span, shorter than an election
    // timeout).
    let held = leader_alone_for(&mut net, leader, Duration::from_millis(100));
    assert!(!held.is_empty(), "the Extend was proposed to the followers");
    assert!(net.node(leader).is_leader());
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "answered before commit: {out:?}");
    for (i, &end) in before.iter().enumerate() {
        assert_eq!(
            deadline(&mut net, i, token),
            end,
            "node {i} applied an uncommitted Extend"
        );
    }

    deliver(&mut net, leader, held);
    net.run_for(Duration::from_millis(100));
    match net.answers(c).last() {
        Some(&Reply::Extended {
            rid: 3,
            status: ExtendStatus::Extended,
            lease_ms,
        }) => assert!(
            (59_000..=60_000).contains(&lease_ms),
            "the lease left as the leader answers: {lease_ms}"
        ),
        other => panic!("expected the W's answer, got {other:?}"),
    }
    // The renewed lease runs from the leader's apply, when the followers'
    // acks came: the send plus the 100 ms without them, not the send.
    assert_eq!(
        deadline(&mut net, leader, token),
        Some(sent_at.saturating_add(Duration::from_millis(100 + 60_000)))
    );
    for (i, end) in before.iter().enumerate() {
        let moved = deadline(&mut net, i, token).unwrap();
        assert!(moved > end.unwrap(), "node {i} applied the Extend");
    }
    assert_every_node_agrees(&mut net);
}

// -------------------------------------------------- a new leader's timing

/// Each node times an extended lease from its own apply of the `Extend`.
/// After the leader that answered the `W` dies, the new leader ends the
/// lease at exactly its own apply plus the renewed lease: a waiter on it
/// gets the key neither at the old leader's (earlier) deadline nor a
/// microsecond before its own, and at that instant it does.
#[test]
fn a_new_leader_expires_an_extended_lease_at_its_own_apply_plus_the_lease() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    let token = token_of(net.request(c1, acquire(2, "k", 0, 5)));
    net.run_for(Duration::from_millis(100));
    let first: Vec<Option<Instant>> = (0..3).map(|i| deadline(&mut net, i, token)).collect();

    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    // The Extend reaches the followers and their acks the leader, which
    // applies it at once; the followers learn it committed 5 ms later.
    net.send_only(c1, extend(3, "k", token, 30));
    let leader_applied = net.now;
    let append = take_peer_bytes(&mut net, leader);
    deliver(&mut net, leader, append);
    for &f in &followers {
        let acks = take_peer_bytes(&mut net, f);
        deliver(&mut net, f, acks);
    }
    let lease = Duration::from_secs(30);
    let old_end = deadline(&mut net, leader, token).unwrap();
    assert_eq!(old_end, leader_applied.saturating_add(lease));
    let notice = leader_alone_for(&mut net, leader, Duration::from_millis(5));
    for &f in &followers {
        assert_eq!(deadline(&mut net, f, token), first[f], "not applied yet");
    }
    let followers_applied = net.now;
    deliver(&mut net, leader, notice);
    net.settle();
    for &f in &followers {
        assert_eq!(
            deadline(&mut net, f, token),
            Some(followers_applied.saturating_add(lease)),
            "node {f} times the lease from its own apply"
        );
    }
    assert!(matches!(
        net.answers(c1).last(),
        Some(Reply::Extended {
            rid: 3,
            status: ExtendStatus::Extended,
            ..
        })
    ));

    net.kill(leader);
    let new = net.elect();
    assert_ne!(new, leader);
    let end = deadline(&mut net, new, token).expect("the new leader knows the grant");
    assert_eq!(end, followers_applied.saturating_add(lease));
    let c2 = net.connect(new);
    net.send_only(c2, acquire(1, "k", 60, 10));
    run_until(&mut net, old_end);
    assert!(
        net.answers(c2).is_empty(),
        "not at the old leader's deadline"
    );
    run_until(&mut net, end.saturating_sub(ONE_MICRO));
    assert!(net.answers(c2).is_empty(), "not before its own deadline");
    for &f in &followers {
        assert_eq!(net.holder_token(f, "k"), Some(token), "node {f}");
    }
    run_until(&mut net, end);
    let handed = token_of(net.answers(c2)[0]);
    assert!(handed > token);
    net.run_for(Duration::from_millis(100));
    for &f in &followers {
        assert_eq!(net.holder_token(f, "k"), Some(handed), "node {f}");
    }
    assert_every_node_agrees(&mut net);
}

// ------------------------------------------------------------------- races

/// A `W` and an operator's force-release of the same grant, arriving at
/// the leader together, are answered in the order they commit: the
/// renewal first is `Extended` and then the grant is revoked anyway; the
/// force-release first makes the renewal `N`. Either way no node keeps the
/// grant and every node holds the same state.
#[test]
fn an_extend_racing_a_force_release_is_answered_in_commit_order_on_every_node() {
    for extend_first in [true, false] {
        let (mut net, leader, _) = leader_with_a_client();
        let c = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
        let token = token_of(net.request(c, acquire(2, "k", 0, 10)));
        let revoke = ForceRelease {
            key: Key::new(b"k").unwrap(),
            token: None,
        };
        if extend_first {
            net.send_only(c, extend(3, "k", token, 60));
            net.force_release(leader, 9, revoke);
        } else {
            net.force_release(leader, 9, revoke);
            net.send_only(c, extend(3, "k", token, 60));
        }
        net.run_for(Duration::from_millis(200));
        let answer = *net.answers(c).last().unwrap();
        if extend_first {
            assert!(
                matches!(
                    answer,
                    Reply::Extended {
                        rid: 3,
                        status: ExtendStatus::Extended,
                        ..
                    }
                ),
                "{answer:?}"
            );
        } else {
            assert_eq!(answer, Reply::NotFound { rid: 3 });
        }
        match net.admin_replies(leader).as_slice() {
            [(id, ForceReleaseOutcome::Released { revoked, .. })] => {
                assert_eq!((id.0, *revoked), (9, token));
            }
            other => panic!("expected the revocation, got {other:?}"),
        }
        for i in 0..3 {
            assert_eq!(net.holder_token(i, "k"), None, "node {i}");
            assert!(net.node(i).lock_state().grant(token).is_none());
        }
        assert_every_node_agrees(&mut net);
        // And the token stays gone: renewing it again changes nothing.
        assert_eq!(
            net.request(c, extend(4, "k", token, 60)),
            Reply::NotFound { rid: 4 }
        );
    }
}

/// A `W` read at the very instant the lease ends, before the driver served
/// the leader's timer, is refused like one whose `Expire` is under way
/// (the leader catches up on its timers before it reads a request): the
/// lease ended on the leader's clock, and a renewal never brings back a
/// lapsed grant. Every node then drops the grant.
#[test]
fn an_extend_arriving_as_the_lease_ends_is_refused_and_the_grant_expires_everywhere() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    let token = token_of(net.request(c, acquire(2, "k", 0, 2)));
    let end = deadline(&mut net, leader, token).unwrap();
    run_until(&mut net, end.saturating_sub(ONE_MICRO));
    // The driver reads the socket before it serves the timer.
    net.now = end;
    net.send_only(c, extend(3, "k", token, 60));
    net.run_for(Duration::from_millis(100));
    assert_eq!(*net.answers(c).last().unwrap(), Reply::NotFound { rid: 3 });
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), None, "node {i}");
    }
    assert_every_node_agrees(&mut net);
}

/// A `W` that reaches the leader after its timer proposed the `Expire`,
/// before that commits, is `N` at once; a `W` a microsecond before the
/// lease ends renews it, and the leader holds its `Expire` back until the
/// `Extend` applied, so the renewal holds on every node.
#[test]
fn an_extend_just_before_or_after_the_expiry_is_proposed_gets_the_matching_answer() {
    // After: the Expire is in flight.
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    let token = token_of(net.request(c, acquire(2, "k", 0, 2)));
    let end = deadline(&mut net, leader, token).unwrap();
    run_until(&mut net, end.saturating_sub(ONE_MICRO));
    net.now = end;
    net.node(leader).handle_timeout(end);
    net.send_only(c, extend(3, "k", token, 60));
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    net.node(leader).handle_flushed(end, conn);
    assert_eq!(
        ticketing_core::testing::net::decode_replies(&out),
        vec![Reply::NotFound { rid: 3 }],
        "answered at once, before the Expire commits"
    );
    net.run_for(Duration::from_millis(100));
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), None, "node {i}");
    }
    assert_every_node_agrees(&mut net);

    // Before: the renewal is proposed first and the expiry waits for it.
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    let token = token_of(net.request(c, acquire(2, "k", 0, 2)));
    let end = deadline(&mut net, leader, token).unwrap();
    run_until(&mut net, end.saturating_sub(ONE_MICRO));
    net.send_only(c, extend(3, "k", token, 60));
    // The leader's timer fires with the Extend proposed, not applied.
    net.now = end;
    net.node(leader).handle_timeout(end);
    net.run_for(Duration::from_millis(100));
    assert!(matches!(
        net.answers(c).last(),
        Some(Reply::Extended {
            rid: 3,
            status: ExtendStatus::Extended,
            ..
        })
    ));
    net.run_for(Duration::from_secs(10));
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(token), "node {i}");
    }
    assert_every_node_agrees(&mut net);
}

// ------------------------------------------------------------------ pushes

/// A holder on the leader that negotiated PUSH hears, with its token, that
/// its lease is ending when a quarter of it is left on the leader's clock
/// (2 s of 8 s), and that it ran out when the `Expire` applies; then
/// nothing more.
#[test]
fn a_pushed_holder_hears_its_lease_ending_then_expired() {
    let (mut net, leader, _) = leader_with_a_client();
    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let c = connect_negotiated(&mut net, leader, both);
    let token = token_of(net.request(c, acquire(2, "k", 0, 8)));
    let from = net.clients[c].replies.len();
    let end = deadline(&mut net, leader, token).unwrap();
    let warn_at = end.saturating_sub(Duration::from_secs(2));
    run_until(&mut net, warn_at.saturating_sub(ONE_MICRO));
    assert_eq!(
        pushes_since(&net, c, from),
        [],
        "not before a quarter is left"
    );
    run_until(&mut net, warn_at);
    assert_eq!(
        pushes_since(&net, c, from),
        [push(token, PushKind::LeaseEnding, 2_000)]
    );
    run_until(&mut net, end.saturating_sub(ONE_MICRO));
    assert_eq!(pushes_since(&net, c, from).len(), 1);
    run_until(&mut net, end);
    assert_eq!(
        pushes_since(&net, c, from),
        [
            push(token, PushKind::LeaseEnding, 2_000),
            push(token, PushKind::Expired, 0)
        ]
    );
    net.run_for(Duration::from_secs(30));
    assert_eq!(pushes_since(&net, c, from).len(), 2, "told once");
    assert!(net.clients[c].buf.is_empty());
}

/// An operator's force-release is pushed to the pushed holder at once
/// (when it applies), as `ForceReleased` with its token; a release by the
/// holder is not pushed.
#[test]
fn a_pushed_holder_hears_a_force_release_but_not_its_own_release() {
    let (mut net, leader, _) = leader_with_a_client();
    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let c = connect_negotiated(&mut net, leader, both);
    let revoked = token_of(net.request(c, acquire(2, "a", 0, 60)));
    let released = token_of(net.request(c, acquire(3, "b", 0, 60)));
    let from = net.clients[c].replies.len();
    net.force_release(
        leader,
        1,
        ForceRelease {
            key: Key::new(b"a").unwrap(),
            token: None,
        },
    );
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        pushes_since(&net, c, from),
        [push(revoked, PushKind::ForceReleased, 0)]
    );
    assert_eq!(
        net.request(c, release(4, "b", released)),
        Reply::Released { rid: 4 }
    );
    net.run_for(Duration::from_secs(120));
    assert_eq!(pushes_since(&net, c, from).len(), 1, "nothing more");
}

/// Connections that negotiated nothing, or renewal without pushes, never
/// get a `P` (nor, unasked, a `W`) byte: not when their lease ends, nor
/// when an operator revokes their grant.
#[test]
fn no_connection_that_did_not_ask_for_pushes_gets_one_in_a_cluster() {
    let (mut net, leader, plain) = leader_with_a_client();
    let renewing = connect_negotiated(&mut net, leader, Capabilities::EXTEND);
    token_of(net.request(plain, acquire(1, "a", 0, 2)));
    token_of(net.request(plain, acquire(2, "b", 0, 60)));
    token_of(net.request(renewing, acquire(2, "c", 0, 2)));
    token_of(net.request(renewing, acquire(3, "d", 0, 60)));
    for (id, key) in [(1, "b"), (2, "d")] {
        net.force_release(
            leader,
            id,
            ForceRelease {
                key: Key::new(key.as_bytes()).unwrap(),
                token: None,
            },
        );
    }
    net.run_for(Duration::from_secs(10));
    for c in [plain, renewing] {
        assert!(net.clients[c].buf.is_empty(), "undecoded bytes");
        for reply in &net.clients[c].replies {
            assert!(
                matches!(
                    reply,
                    Reply::Leader { .. } | Reply::Acquired { .. } | Reply::Negotiated { .. }
                ),
                "client {c} got {reply:?}"
            );
        }
    }
    assert!(
        !net.clients[plain]
            .replies
            .iter()
            .any(|r| matches!(r, Reply::Negotiated { .. }))
    );
}

/// A grant of `k` (10 s lease) delivered by a leader to a connection that
/// negotiated pushes, every node applying it; then that leader dies and
/// another is elected. The net, the new leader and the grant's token.
fn pushed_grant_then_a_new_leader() -> (ClusterNet, usize, u64) {
    let (mut net, leader, _) = leader_with_a_client();
    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let first = connect_negotiated(&mut net, leader, both);
    let token = token_of(net.request(first, acquire(2, "k", 0, 10)));
    net.run_for(Duration::from_millis(100));
    net.kill(leader);
    let new = net.elect();
    assert_ne!(new, leader);
    (net, new, token)
}

/// A pushed holder whose grant an earlier leader delivered renews it on
/// the new leader from a connection that takes pushes: from then on the
/// new leader watches it for that connection, which hears its lease
/// ending (a quarter of the renewed lease before its end) and then that it
/// expired.
#[test]
fn a_holder_renewing_on_a_new_leader_hears_its_pushes_from_it() {
    let (mut net, new, token) = pushed_grant_then_a_new_leader();
    let both = Capabilities::EXTEND.union(Capabilities::PUSH);
    let again = connect_negotiated(&mut net, new, both);
    let from = net.clients[again].replies.len();
    let reply = net.request(again, extend(3, "k", token, 20));
    assert!(
        matches!(
            reply,
            Reply::Extended {
                rid: 3,
                status: ExtendStatus::Extended,
                ..
            }
        ),
        "{reply:?}"
    );
    let end = deadline(&mut net, new, token).unwrap();
    let warn_at = end.saturating_sub(Duration::from_secs(5));
    run_until(&mut net, warn_at.saturating_sub(ONE_MICRO));
    assert_eq!(pushes_since(&net, again, from), [], "not before a quarter");
    run_until(&mut net, warn_at);
    assert_eq!(
        pushes_since(&net, again, from),
        [push(token, PushKind::LeaseEnding, 5_000)]
    );
    run_until(&mut net, end);
    assert_eq!(
        pushes_since(&net, again, from),
        [
            push(token, PushKind::LeaseEnding, 5_000),
            push(token, PushKind::Expired, 0)
        ]
    );
}

/// A grant renewed on a new leader from a connection that did not
/// negotiate pushes is not watched for it: it hears no push (pushes only
/// ever go to a connection that asked for them).
#[test]
fn a_renewal_without_pushes_on_a_new_leader_brings_no_pushes() {
    let (mut net, new, token) = pushed_grant_then_a_new_leader();
    let again = connect_negotiated(&mut net, new, Capabilities::EXTEND);
    let from = net.clients[again].replies.len();
    let reply = net.request(again, extend(3, "k", token, 20));
    assert!(matches!(reply, Reply::Extended { rid: 3, .. }), "{reply:?}");
    let end = deadline(&mut net, new, token).unwrap();
    run_until(&mut net, end);
    assert!(net.node(new).lock_state().grant(token).is_none(), "expired");
    assert_eq!(pushes_since(&net, again, from), []);
}
