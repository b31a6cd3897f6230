//! Shared locks on `ClusterNode`s over the test network
//! (`ticketing_core::testing::net::ClusterNet`, time injected, nothing
//! sleeping): a shared grant and a downgrade are committed commands,
//! answered only once applied; sharers survive a change of leader; the
//! leader's queues follow single mode's rules across modes (consecutive
//! shared heads granted together, a writer waits for every sharer and a
//! reader behind a queued writer waits, a downgrade never lets a writer
//! in); a key set may mix modes; every node holds the same sharers.

mod cluster_common;

use cluster_common::*;
use ticketing_core::inspect::{ForceRelease, ForceReleaseOutcome};
use ticketing_core::machine::Machine;
use ticketing_core::testing::net::ClusterNet;
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    AcquireSharedRequest, Capabilities, DowngradeRequest, Key, KeyGroup, Reply, Request,
};

const SETTLE: Duration = Duration::from_millis(200);

fn key(name: &str) -> Key {
    Key::new(name.as_bytes()).unwrap()
}

fn group(names: &[&str]) -> KeyGroup {
    KeyGroup::new(names.iter().map(|name| key(name)).collect()).unwrap()
}

/// A `Y` for `names` (ascending) with `modes` (bit `i`: key `i` shared),
/// waiting up to `wait_s`, for a 60 s lease.
fn acquire_modes(rid: u64, names: &[&str], modes: u16, wait_s: u8) -> Request {
    acquire_for(rid, names, modes, (wait_s, 60))
}

/// A `Y` as [`acquire_modes`], with its lease.
fn acquire_for(rid: u64, names: &[&str], modes: u16, (wait_s, lease_s): (u8, u8)) -> Request {
    Request::AcquireShared(AcquireSharedRequest {
        rid,
        wait_s,
        lease_s,
        max_hold_s: 0,
        modes,
        keys: group(names),
    })
}

/// A `Y` wanting `name` shared.
fn reader(rid: u64, name: &str, wait_s: u8) -> Request {
    acquire_modes(rid, &[name], 1, wait_s)
}

/// A `Y` wanting `name` exclusive.
fn writer(rid: u64, name: &str, wait_s: u8) -> Request {
    acquire_modes(rid, &[name], 0, wait_s)
}

fn downgrade(rid: u64, names: &[&str], token: u64) -> Request {
    Request::Downgrade(DowngradeRequest {
        rid,
        token,
        keys: group(names),
    })
}

/// A client of `node` that negotiated SHARED.
fn shared_client(net: &mut ClusterNet, node: usize) -> usize {
    connect_negotiated(net, node, Capabilities::SHARED)
}

/// The token client `c` got for request `rid`, if it was answered a grant.
fn granted(net: &ClusterNet, c: usize, rid: u64) -> Option<u64> {
    net.answers(c)
        .into_iter()
        .find(|reply| reply.rid() == Some(rid))
        .map(token_of)
}

/// Node `i`'s sharers of `name`, oldest first.
fn sharers(net: &mut ClusterNet, i: usize, name: &str) -> Vec<u64> {
    net.node(i).lock_state().sharers_of(&key(name)).to_vec()
}

/// Every node's sharers of `name` are `expected`.
fn assert_sharers_everywhere(net: &mut ClusterNet, name: &str, expected: &[u64]) {
    for i in 0..3 {
        assert_eq!(sharers(net, i, name), expected, "node {i}, key {name}");
    }
}

// ------------------------------------------------------------- commit first

/// A shared grant and a downgrade are committed commands: while no
/// follower hears the leader, the leader neither applies nor answers
/// them; once the followers get its appends, every node applies them and
/// the client is answered.
#[test]
fn a_shared_grant_and_a_downgrade_are_answered_only_once_committed() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = shared_client(&mut net, leader);
    let conn = net.clients[c].conn;

    net.send_only(c, reader(2, "k", 0));
    let held = leader_alone_for(&mut net, leader, Duration::from_millis(100));
    assert!(!held.is_empty(), "the Grant was proposed to the followers");
    assert!(net.node(leader).is_leader());
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "answered before commit: {out:?}");
    assert_sharers_everywhere(&mut net, "k", &[]);
    deliver(&mut net, leader, held);
    net.run_for(SETTLE);
    let token = granted(&net, c, 2).expect("granted once committed");
    assert_sharers_everywhere(&mut net, "k", &[token]);

    let exclusive = token_of(net.request(c, writer(3, "x", 0)));
    assert_sharers_everywhere(&mut net, "x", &[]);
    net.send_only(c, downgrade(4, &["x"], exclusive));
    let held = leader_alone_for(&mut net, leader, Duration::from_millis(100));
    assert!(!held.is_empty(), "the Downgrade was proposed");
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "answered before commit: {out:?}");
    assert_sharers_everywhere(&mut net, "x", &[]);
    deliver(&mut net, leader, held);
    net.run_for(SETTLE);
    assert_eq!(net.answers(c).last(), Some(&Reply::Downgraded { rid: 4 }));
    assert_sharers_everywhere(&mut net, "x", &[exclusive]);
    assert_every_node_agrees(&mut net);
}

/// A downgrade naming another group is refused as single mode refuses
/// it (`E 6` for part of the grant, `N` for keys it does not hold), and
/// changes nothing anywhere.
#[test]
fn a_downgrade_of_part_of_a_grant_is_refused_and_changes_nothing() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = shared_client(&mut net, leader);
    let token = token_of(net.request(c, acquire_modes(2, &["a", "b"], 0, 0)));
    assert!(matches!(
        net.request(c, downgrade(3, &["a"], token)),
        Reply::Error { rid: 3, .. }
    ));
    assert_eq!(
        net.request(c, downgrade(4, &["z"], token)),
        Reply::NotFound { rid: 4 }
    );
    assert_eq!(
        net.request(c, downgrade(5, &["a", "b"], token + 1)),
        Reply::NotFound { rid: 5 }
    );
    assert_sharers_everywhere(&mut net, "a", &[]);
    assert_sharers_everywhere(&mut net, "b", &[]);
    assert_eq!(
        net.request(c, downgrade(6, &["a", "b"], token)),
        Reply::Downgraded { rid: 6 }
    );
    // A second one is answered as the first.
    assert_eq!(
        net.request(c, downgrade(7, &["a", "b"], token)),
        Reply::Downgraded { rid: 7 }
    );
    assert_sharers_everywhere(&mut net, "a", &[token]);
    assert_sharers_everywhere(&mut net, "b", &[token]);
    assert_every_node_agrees(&mut net);
}

// ----------------------------------------------------------- leader change

/// Two sharers granted by one leader still hold under the next: it
/// queues a writer behind both, and grants it, with a token above both,
/// only once both released.
#[test]
fn shared_holders_survive_a_leader_change_and_a_writer_waits_for_both() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = shared_client(&mut net, leader);
    let c2 = shared_client(&mut net, leader);
    let first = token_of(net.request(c1, reader(2, "k", 0)));
    let second = token_of(net.request(c2, reader(2, "k", 0)));
    assert!(second > first);
    net.run_for(SETTLE);

    net.kill(leader);
    let new = net.elect();
    assert_ne!(new, leader);
    assert_eq!(sharers(&mut net, new, "k"), [first, second]);
    let c3 = shared_client(&mut net, new);
    net.send_only(c3, writer(2, "k", 60));
    net.run_for(SETTLE);
    assert_eq!(granted(&net, c3, 2), None, "the writer waits");
    let c4 = net.connect(new);
    assert_eq!(
        net.request(c4, release(1, "k", first)),
        Reply::Released { rid: 1 }
    );
    assert_eq!(granted(&net, c3, 2), None, "one sharer still holds");
    assert_eq!(
        net.request(c4, release(2, "k", second)),
        Reply::Released { rid: 2 }
    );
    let handed = granted(&net, c3, 2).expect("granted after both released");
    assert!(handed > second, "{handed} after {second}");
    for i in (0..3).filter(|&i| i != leader) {
        assert_eq!(net.holder_token(i, "k"), Some(handed), "node {i}");
    }
    assert_every_node_agrees(&mut net);
}

// -------------------------------------------------------------- queue rules

/// Behind a writer, two readers then a writer then a reader queue: the
/// writer's release grants both readers together (each its own token),
/// the second writer waits for both, and the last reader waits behind it.
#[test]
fn consecutive_shared_heads_are_granted_together_while_a_writer_waits() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..5).map(|_| shared_client(&mut net, leader)).collect();
    let holder = token_of(net.request(clients[0], writer(2, "k", 0)));
    net.send_only(clients[1], reader(2, "k", 60));
    net.send_only(clients[2], reader(2, "k", 60));
    net.send_only(clients[3], writer(2, "k", 60));
    net.send_only(clients[4], reader(2, "k", 60));
    net.run_for(SETTLE);
    assert!((1..5).all(|i| granted(&net, clients[i], 2).is_none()));

    net.request(clients[0], release(3, "k", holder));
    let r1 = granted(&net, clients[1], 2).expect("the first reader");
    let r2 = granted(&net, clients[2], 2).expect("the second reader, with it");
    assert!(holder < r1 && r1 < r2);
    assert_eq!(granted(&net, clients[3], 2), None, "the writer waits");
    assert_eq!(granted(&net, clients[4], 2), None, "behind the writer");
    assert_sharers_everywhere(&mut net, "k", &[r1, r2]);

    net.request(clients[1], release(3, "k", r1));
    assert_eq!(granted(&net, clients[3], 2), None, "one reader still holds");
    net.request(clients[2], release(3, "k", r2));
    let w = granted(&net, clients[3], 2).expect("the writer, after both");
    assert!(w > r2);
    assert_eq!(granted(&net, clients[4], 2), None, "the reader waits");
    net.request(clients[3], release(3, "k", w));
    let last = granted(&net, clients[4], 2).expect("the last reader");
    assert!(last > w);
    assert_every_node_agrees(&mut net);
}

/// A reader arriving while the key is held shared but a writer queues
/// does not join the batch: it waits behind the writer.
#[test]
fn a_shared_request_behind_a_queued_exclusive_one_waits() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..3).map(|_| shared_client(&mut net, leader)).collect();
    let sharer = token_of(net.request(clients[0], reader(2, "k", 0)));
    net.send_only(clients[1], writer(2, "k", 60));
    net.run_for(SETTLE);
    net.send_only(clients[2], reader(2, "k", 60));
    net.run_for(SETTLE);
    assert_eq!(granted(&net, clients[1], 2), None);
    assert_eq!(
        granted(&net, clients[2], 2),
        None,
        "no jump past the writer"
    );
    assert_sharers_everywhere(&mut net, "k", &[sharer]);
    // Without waiting it is `T`, not a grant.
    let c = shared_client(&mut net, leader);
    assert_eq!(
        net.request(c, reader(2, "k", 0)),
        Reply::TimedOut { rid: 2 }
    );

    net.request(clients[0], release(3, "k", sharer));
    let w = granted(&net, clients[1], 2).expect("the writer");
    assert_eq!(granted(&net, clients[2], 2), None);
    net.request(clients[1], release(3, "k", w));
    assert!(granted(&net, clients[2], 2).is_some_and(|r| r > w));
}

/// A downgrade arriving with a writer's request, while a reader queues
/// directly behind the holder: the reader joins the downgraded holder,
/// the writer stays out until both release.
#[test]
fn a_downgrade_racing_a_queued_writer_does_not_let_it_in() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..3).map(|_| shared_client(&mut net, leader)).collect();
    let holder = token_of(net.request(clients[0], writer(2, "k", 0)));
    net.send_only(clients[1], reader(2, "k", 60));
    net.run_for(SETTLE);
    net.send_only(clients[0], downgrade(3, &["k"], holder));
    net.send_only(clients[2], writer(2, "k", 60));
    net.run_for(SETTLE);
    assert_eq!(
        net.answers(clients[0]).last(),
        Some(&Reply::Downgraded { rid: 3 })
    );
    let joined = granted(&net, clients[1], 2).expect("the reader joins");
    assert_eq!(granted(&net, clients[2], 2), None, "no writer beside them");
    assert_sharers_everywhere(&mut net, "k", &[holder, joined]);

    net.request(clients[0], release(4, "k", holder));
    assert_eq!(granted(&net, clients[2], 2), None);
    net.request(clients[1], release(3, "k", joined));
    assert!(granted(&net, clients[2], 2).is_some_and(|w| w > joined));
    assert_every_node_agrees(&mut net);
}

/// A downgraded holder keeps its place: a writer at the head of the
/// queue stays at the head, and the reader behind it waits too.
#[test]
fn a_downgrade_keeps_a_queued_writer_ahead_of_the_readers_behind_it() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..3).map(|_| shared_client(&mut net, leader)).collect();
    let holder = token_of(net.request(clients[0], writer(2, "k", 0)));
    net.send_only(clients[1], writer(2, "k", 60));
    net.run_for(SETTLE);
    net.send_only(clients[2], reader(2, "k", 60));
    net.run_for(SETTLE);
    assert_eq!(
        net.request(clients[0], downgrade(3, &["k"], holder)),
        Reply::Downgraded { rid: 3 }
    );
    assert_eq!(granted(&net, clients[1], 2), None, "no writer beside it");
    assert_eq!(granted(&net, clients[2], 2), None, "behind the writer");
    net.request(clients[0], release(4, "k", holder));
    let w = granted(&net, clients[1], 2).expect("the writer");
    assert!(w > holder);
    assert_eq!(granted(&net, clients[2], 2), None);
}

/// A key set holding `a` shared and `b` exclusive under one token: a
/// reader of `a` joins it at once, a reader of `b` and a writer of `a`
/// wait; every node holds the same sharers.
#[test]
fn a_key_set_mixing_modes_shares_one_key_and_keeps_the_other() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..4).map(|_| shared_client(&mut net, leader)).collect();
    // Bit 0: "a" shared; "b" exclusive.
    let set = token_of(net.request(clients[0], acquire_modes(2, &["a", "b"], 0b01, 0)));
    let joined = token_of(net.request(clients[1], reader(2, "a", 0)));
    net.send_only(clients[2], reader(2, "b", 60));
    net.send_only(clients[3], writer(2, "a", 60));
    net.run_for(SETTLE);
    assert_eq!(granted(&net, clients[2], 2), None, "b is held exclusive");
    assert_eq!(granted(&net, clients[3], 2), None, "a is held shared");
    assert_sharers_everywhere(&mut net, "a", &[set, joined]);
    assert_sharers_everywhere(&mut net, "b", &[]);
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "b"), Some(set), "node {i}");
    }
    let release_set = Request::Release(ticketing_core::wire::ReleaseRequest {
        rid: 3,
        token: set,
        keys: group(&["a", "b"]),
        set: true,
    });
    net.request(clients[0], release_set);
    assert!(granted(&net, clients[2], 2).is_some(), "b is free");
    assert_eq!(granted(&net, clients[3], 2), None, "a reader still holds a");
    net.request(clients[1], release(3, "a", joined));
    assert!(granted(&net, clients[3], 2).is_some());
    assert_every_node_agrees(&mut net);
}

/// An operator's force-release of a key held shared, without a token,
/// revokes the oldest sharer only (as in single mode); the other keeps it.
#[test]
fn a_force_release_without_a_token_revokes_the_oldest_sharer() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = shared_client(&mut net, leader);
    let c2 = shared_client(&mut net, leader);
    let first = token_of(net.request(c1, reader(2, "k", 0)));
    let second = token_of(net.request(c2, reader(2, "k", 0)));
    let revoke = ForceRelease {
        key: key("k"),
        token: None,
    };
    net.force_release(leader, 9, revoke);
    net.run_for(SETTLE);
    let replies = net.admin_replies(leader);
    assert!(
        matches!(
            replies.last(),
            Some((_, ForceReleaseOutcome::Released { revoked, .. })) if *revoked == first
        ),
        "{replies:?}"
    );
    assert_sharers_everywhere(&mut net, "k", &[second]);
    assert_every_node_agrees(&mut net);
}

/// The leader's inspection of a key held shared shows the oldest sharer
/// as its holder, every sharer oldest first, and each waiter's mode.
#[test]
fn inspection_shows_the_sharers_and_each_waiters_mode() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..4).map(|_| shared_client(&mut net, leader)).collect();
    let first = token_of(net.request(clients[0], reader(2, "k", 0)));
    let second = token_of(net.request(clients[1], reader(2, "k", 0)));
    net.send_only(clients[2], writer(2, "k", 60));
    net.send_only(clients[3], reader(2, "k", 60));
    net.run_for(SETTLE);
    let now = net.now;
    let view = net
        .node(leader)
        .lock(now, &key("k"))
        .expect("the leader answers")
        .expect("the key is held");
    assert_eq!(view.holder.map(|h| h.token), Some(first));
    let sharers: Vec<u64> = view.sharers.iter().map(|s| s.token).collect();
    assert_eq!(sharers, [first, second]);
    let modes: Vec<bool> = view.waiters.iter().map(|w| w.shared).collect();
    assert_eq!(modes, [false, true]);
}

/// Of two sharers whose leases end one after the other, with a writer
/// waiting: the first expiry hands nothing over (the other sharer still
/// holds), the second hands the key to the writer, and only that one is
/// counted as an expiry handed over.
#[test]
fn only_the_last_sharers_expiry_hands_the_key_to_a_waiting_writer() {
    let (mut net, leader, _) = leader_with_a_client();
    let clients: Vec<usize> = (0..3).map(|_| shared_client(&mut net, leader)).collect();
    let short = token_of(net.request(clients[0], acquire_for(2, &["k"], 1, (0, 2))));
    let long = token_of(net.request(clients[1], acquire_for(2, &["k"], 1, (0, 5))));
    net.send_only(clients[2], writer(2, "k", 60));
    let before = net.node(leader).metrics();
    net.run_for(Duration::from_secs(3));
    assert_sharers_everywhere(&mut net, "k", &[long]);
    assert_eq!(granted(&net, clients[2], 2), None, "one sharer still holds");
    let after_first = net.node(leader).metrics();
    assert_eq!(
        after_first.expiries_handed_over,
        before.expiries_handed_over
    );
    assert_eq!(
        after_first.expiries_not_handed_over,
        before.expiries_not_handed_over + 1
    );
    net.run_for(Duration::from_secs(3));
    let writer_token = granted(&net, clients[2], 2).expect("the writer, at the last expiry");
    assert!(writer_token > long && long > short);
    let after_last = net.node(leader).metrics();
    assert_eq!(
        after_last.expiries_handed_over,
        before.expiries_handed_over + 1
    );
}
