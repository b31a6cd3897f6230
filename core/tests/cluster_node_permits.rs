//! FIFO semaphores on `ClusterNode`s over the test network
//! (`ticketing_core::testing::net::ClusterNet`, time injected, nothing
//! sleeping): a `Q` on the leader is a committed `Grant` of slot keys that
//! carries the semaphore's capacity, answered with the slots only once
//! applied; a new leader keeps the held slots, derives the capacity from
//! them and hands freed slots out FIFO under higher tokens; a multi-permit
//! head blocks smaller requests behind it; another capacity is refused
//! while the semaphore is in use, naming both; slots freed by a release,
//! an expiry, a force-release or a closed connection go to the next
//! waiter; a plain lock of a slot key takes that slot; and a leader that
//! steps down answers its permit waiters "no leader".

mod cluster_common;

use cluster_common::*;
use ticketing_core::inspect::{ForceRelease, ForceReleaseOutcome};
use ticketing_core::machine::Machine;
use ticketing_core::testing::net::ClusterNet;
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, ErrorCode, Key, KeyGroup, PermitsRequest, ReleaseRequest, Reply, Request,
    slot_key,
};

/// A `Q` for `permits` of semaphore `name` declared with `capacity`.
fn permits(rid: u64, name: &str, permits: u8, capacity: u16, wait_s: u8) -> Request {
    permits_leased(rid, name, (permits, capacity), wait_s, 60)
}

fn permits_leased(
    rid: u64,
    name: &str,
    (permits, capacity): (u8, u16),
    wait_s: u8,
    lease_s: u8,
) -> Request {
    Request::AcquirePermits(PermitsRequest {
        rid,
        wait_s,
        lease_s,
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

fn release_slots(rid: u64, name: &str, slots: &[u16], token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        set: true,
        keys: slot_keys(name, slots),
    })
}

/// A client of `node` that negotiated PERMITS.
fn connect_permits(net: &mut ClusterNet, node: usize) -> usize {
    connect_negotiated(net, node, Capabilities::PERMITS)
}

/// A permit grant's token, slots and free count.
fn permit_grant(reply: Reply) -> (u64, Vec<u16>, u16) {
    match reply {
        Reply::Permits {
            token, slots, free, ..
        } => (token, slots.as_slice().to_vec(), free),
        other => panic!("expected a permit grant, got {other:?}"),
    }
}

/// The answers client `c` got since it had `from` of them.
fn answers_since(net: &ClusterNet, c: usize, from: usize) -> Vec<Reply> {
    net.answers(c).split_off(from)
}

/// The capacity node `i`'s applied grant of `token` carries, if it holds
/// that grant.
fn applied_capacity(net: &mut ClusterNet, i: usize, token: u64) -> Option<Option<u16>> {
    let state = net.node(i).lock_state();
    state.grant(token).map(|holding| holding.options.capacity)
}

// ------------------------------------------------------------- commit first

/// A `Q` is a committed Grant: while no follower hears the leader, the
/// leader neither applies it nor answers it; once the followers get its
/// appends, every node applies a grant of the slot key carrying the
/// capacity, and the `Q` is answered with its slot and the free count.
#[test]
fn a_permit_grant_is_answered_only_once_its_grant_commits() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_permits(&mut net, leader);
    net.run_for(Duration::from_millis(100));
    let next_token = net.node(leader).lock_state().next_token();

    net.send_only(c, permits(2, "jobs", 1, 3, 0));
    let held = leader_alone_for(&mut net, leader, Duration::from_millis(100));
    assert!(!held.is_empty(), "the Grant was proposed to the followers");
    assert!(net.node(leader).is_leader());
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "answered before commit: {out:?}");
    for i in 0..3 {
        assert_eq!(applied_capacity(&mut net, i, next_token), None, "node {i}");
    }

    deliver(&mut net, leader, held);
    net.run_for(Duration::from_millis(100));
    let (token, slots, free) = permit_grant(*net.answers(c).last().unwrap());
    assert_eq!((token, slots, free), (next_token, vec![0], 2));
    for i in 0..3 {
        assert_eq!(
            applied_capacity(&mut net, i, token),
            Some(Some(3)),
            "node {i} holds the slot with the capacity"
        );
        let holding = net.node(i).lock_state().grant(token).unwrap().keys.clone();
        assert_eq!(holding, slot_keys("jobs", &[0]));
    }
}

// ------------------------------------------------------------ leader change

/// Slots held under one leader stay held under the next, which derives
/// the capacity from them: it refuses another capacity naming the old
/// one, never hands a held slot out again, issues strictly higher tokens,
/// and hands the slots freed later to its waiters in arrival order.
#[test]
fn permits_survive_a_leader_change() {
    let (mut net, leader, _) = leader_with_a_client();
    let c = connect_permits(&mut net, leader);
    let (first, slots, free) = permit_grant(net.request(c, permits(2, "jobs", 2, 3, 0)));
    assert_eq!((slots, free), (vec![0, 1], 1));

    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    let c2 = connect_permits(&mut net, new_leader);
    assert_eq!(
        net.request(c2, permits(2, "jobs", 1, 5, 0)),
        Reply::CapacityMismatch {
            rid: 2,
            asked: 5,
            capacity: 3
        }
    );
    assert_eq!(
        net.request(c2, permits(3, "jobs", 2, 3, 0)),
        Reply::TimedOut { rid: 3 },
        "one slot free, two wanted"
    );
    let (second, slots, free) = permit_grant(net.request(c2, permits(4, "jobs", 1, 3, 0)));
    assert_eq!((slots, free), (vec![2], 0), "the slot nobody held");
    assert!(second > first, "{second} > {first}");

    // Two waiters, then the old holder's slots are freed.
    let c3 = connect_permits(&mut net, new_leader);
    let c4 = connect_permits(&mut net, new_leader);
    net.send_only(c3, permits(2, "jobs", 1, 3, 30));
    net.run_for(Duration::from_millis(50));
    net.send_only(c4, permits(2, "jobs", 1, 3, 30));
    net.run_for(Duration::from_millis(50));
    assert_eq!(net.answers(c3).len(), 1, "c3 waits");
    assert_eq!(net.answers(c4).len(), 1, "c4 waits");
    assert_eq!(
        net.request(c2, release_slots(5, "jobs", &[0, 1], first)),
        Reply::ReleasedSet { rid: 5 }
    );
    net.run_for(Duration::from_millis(100));
    let (third, slots, _) = permit_grant(*net.answers(c3).last().unwrap());
    assert_eq!(slots, vec![0], "the first waiter gets the lowest slot");
    let (fourth, slots, free) = permit_grant(*net.answers(c4).last().unwrap());
    assert_eq!((slots, free), (vec![1], 0));
    assert!(
        second < third && third < fourth,
        "{second} {third} {fourth}"
    );
}

// ------------------------------------------------------------------- FIFO

/// A head asking for two blocks a request for one behind it, although one
/// slot is free; a newcomer that may not wait gets `T`. Once two slots
/// free, the head gets them, then the one behind it the next.
#[test]
fn a_multi_permit_head_blocks_a_smaller_request_behind_it() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    let c3 = connect_permits(&mut net, leader);
    let (held, _, free) = permit_grant(net.request(c1, permits(2, "s", 2, 3, 0)));
    assert_eq!(free, 1);
    net.send_only(c2, permits(2, "s", 2, 3, 30));
    net.run_for(Duration::from_millis(50));
    net.send_only(c3, permits(2, "s", 1, 3, 30));
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.answers(c2).len(), 1, "the head waits");
    assert_eq!(net.answers(c3).len(), 1, "nothing granted past the head");
    assert_eq!(
        net.request(c1, permits(3, "s", 1, 3, 0)),
        Reply::TimedOut { rid: 3 },
        "a newcomer queues behind the waiters"
    );

    assert_eq!(
        net.request(c1, release_slots(4, "s", &[0, 1], held)),
        Reply::ReleasedSet { rid: 4 }
    );
    net.run_for(Duration::from_millis(100));
    let (_, slots, _) = permit_grant(*net.answers(c2).last().unwrap());
    assert_eq!(slots, vec![0, 1]);
    let (_, slots, free) = permit_grant(*net.answers(c3).last().unwrap());
    assert_eq!((slots, free), (vec![2], 0));
}

// --------------------------------------------------------------- capacity

/// While the semaphore is in use (a held slot, or a waiter), a request
/// declaring another capacity is answered `C` naming both, and changes
/// nothing; once nobody uses it, the new capacity is the one.
#[test]
fn another_capacity_is_refused_naming_both_while_the_semaphore_is_in_use() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    let (held, _, _) = permit_grant(net.request(c1, permits(2, "s", 1, 1, 0)));
    let mismatch = Reply::CapacityMismatch {
        rid: 3,
        asked: 4,
        capacity: 1,
    };
    assert_eq!(net.request(c2, permits(3, "s", 1, 4, 0)), mismatch);
    // A waiter keeps it in use too, once the slot is free again.
    net.send_only(c2, permits(4, "s", 1, 1, 30));
    net.run_for(Duration::from_millis(100));
    let c3 = connect_permits(&mut net, leader);
    assert_eq!(net.request(c3, permits(3, "s", 1, 4, 0)), mismatch);
    assert_eq!(
        net.request(c1, release_slots(5, "s", &[0], held)),
        Reply::ReleasedSet { rid: 5 }
    );
    net.run_for(Duration::from_millis(100));
    let (taken, slots, _) = permit_grant(*net.answers(c2).last().unwrap());
    assert_eq!(slots, vec![0], "the waiter got the slot");
    assert_eq!(
        net.request(c3, permits(4, "s", 1, 4, 0)),
        Reply::CapacityMismatch {
            rid: 4,
            asked: 4,
            capacity: 1
        }
    );
    assert_eq!(
        net.request(c2, release_slots(5, "s", &[0], taken)),
        Reply::ReleasedSet { rid: 5 }
    );
    // Nobody uses it: capacity 4 is the one now.
    let (_, slots, free) = permit_grant(net.request(c3, permits(5, "s", 3, 4, 0)));
    assert_eq!((slots, free), (vec![0, 1, 2], 1));
}

// ------------------------------------------------------------ freed slots

/// A released permit's slot goes to the next waiter under a higher token.
#[test]
fn a_released_permit_frees_its_slot_for_the_next_waiter() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    let (first, _, _) = permit_grant(net.request(c1, permits(2, "s", 1, 1, 0)));
    net.send_only(c2, permits(2, "s", 1, 1, 30));
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.answers(c2).len(), 1, "c2 waits");
    assert_eq!(
        net.request(c1, release_slots(3, "s", &[0], first)),
        Reply::ReleasedSet { rid: 3 }
    );
    let (second, slots, free) = permit_grant(*net.answers(c2).last().unwrap());
    assert_eq!((slots, free), (vec![0], 0));
    assert!(second > first);
}

/// A permit whose lease runs out is expired by a committed `Expire`, and
/// its slot goes to the waiter; a waiter whose connection closes leaves
/// the queue, and the one behind it is served instead.
#[test]
fn an_expired_permit_goes_to_the_next_live_waiter() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    let c3 = connect_permits(&mut net, leader);
    let leased = permits_leased(2, "s", (1, 1), 0, 2);
    let (first, _, _) = permit_grant(net.request(c1, leased));
    net.send_only(c2, permits(2, "s", 1, 1, 30));
    net.run_for(Duration::from_millis(50));
    net.send_only(c3, permits(2, "s", 1, 1, 30));
    net.run_for(Duration::from_millis(50));
    let conn = net.clients[c2].conn;
    net.close_link(leader, conn);
    net.run_for(Duration::from_millis(1_000));
    assert_eq!(net.answers(c3).len(), 1, "the lease has not ended yet");
    net.run_for(Duration::from_millis(1_500));
    let (second, slots, _) = permit_grant(*net.answers(c3).last().unwrap());
    assert_eq!(slots, vec![0]);
    assert!(second > first);
    assert_eq!(
        net.node(leader).lock_state().grant(first),
        None,
        "the expired grant is gone"
    );
}

/// A waiter whose wait runs out gets `T`, and leaves nothing queued.
#[test]
fn a_permit_wait_that_runs_out_is_answered_t() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    permit_grant(net.request(c1, permits(2, "s", 1, 1, 0)));
    let from = net.answers(c2).len();
    net.send_only(c2, permits(2, "s", 1, 1, 1));
    net.run_for(Duration::from_millis(500));
    assert!(answers_since(&net, c2, from).is_empty(), "still waiting");
    assert_eq!(net.node(leader).stats().waiters, 1);
    net.run_for(Duration::from_millis(1_000));
    assert_eq!(
        answers_since(&net, c2, from),
        vec![Reply::TimedOut { rid: 2 }]
    );
    assert_eq!(net.node(leader).stats().waiters, 0);
}

/// An operator's force-release of one slot revokes the whole permit
/// grant, and its slots go to the waiting head under a higher token.
#[test]
fn a_force_released_permit_goes_to_the_head() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    let (held, _, _) = permit_grant(net.request(c1, permits(2, "s", 2, 2, 0)));
    net.send_only(c2, permits(2, "s", 2, 2, 30));
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.answers(c2).len(), 1, "c2 waits");
    let key = slot_key(&Key::from_text("s").unwrap(), 1).unwrap();
    net.force_release(leader, 1, ForceRelease { key, token: None });
    net.run_for(Duration::from_millis(200));
    assert!(matches!(
        net.admin_replies(leader)[..],
        [(_, ForceReleaseOutcome::Released { revoked, .. })] if revoked == held
    ));
    let (handed, slots, free) = permit_grant(*net.answers(c2).last().unwrap());
    assert_eq!((slots, free), (vec![0, 1], 0));
    assert!(handed > held);
}

/// A plain acquire of a slot key is a lock like any other, as in single
/// mode: the slot it holds is taken for the semaphore, which grants the
/// next free one.
#[test]
fn a_plain_lock_of_a_slot_key_takes_that_slot() {
    let (mut net, leader, c) = leader_with_a_client();
    let plain = token_of(net.request(c, acquire(1, "s[0000]", 0, 60)));
    let p = connect_permits(&mut net, leader);
    let (token, slots, free) = permit_grant(net.request(p, permits(2, "s", 1, 2, 0)));
    assert_eq!((slots, free), (vec![1], 0));
    assert!(token > plain);
    assert_eq!(
        net.request(p, permits(3, "s", 1, 2, 0)),
        Reply::TimedOut { rid: 3 }
    );
}

/// A leader that loses its majority answers its queued permit request
/// "no leader" (it had no effect: waiters are not replicated) and its
/// proposed permit Grant "indeterminate".
#[test]
fn lost_leadership_answers_permit_waiters_no_leader() {
    let (mut net, leader, _) = leader_with_a_client();
    let c1 = connect_permits(&mut net, leader);
    let c2 = connect_permits(&mut net, leader);
    permit_grant(net.request(c1, permits(2, "s", 1, 1, 0)));
    net.send_only(c2, permits(2, "s", 1, 1, 30));
    net.run_for(Duration::from_millis(100));
    for i in (0..3).filter(|&i| i != leader) {
        net.kill(i);
    }
    net.send_only(c1, permits(3, "t", 1, 1, 0));
    net.run_for(Duration::from_secs(2));
    assert!(!net.node(leader).is_leader(), "check-quorum stepped down");
    assert_eq!(
        net.answers(c1).last(),
        Some(&Reply::Indeterminate { rid: 3 })
    );
    assert_eq!(
        net.answers(c2).last(),
        Some(&Reply::Error {
            rid: 2,
            code: ErrorCode::NoLeader
        })
    );
    assert_eq!(net.node(leader).stats().waiters, 0);
}
