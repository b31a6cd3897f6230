//! Three `ClusterNode`s over an in-memory network with injected time
//! (`ticketing_core::testing::net::ClusterNet`): bytes are shuttled between
//! their connections exactly as a driver would, and clients speak the real
//! wire protocol. The token reserve, silent peer links, the line dialect
//! and operations have files of their own (`cluster_node_*.rs`).

mod cluster_common;

use cluster_common::*;
use ticketing_core::budget::{AbuseKind, CloseReason, LogEvent};
use ticketing_core::cluster::ClusterNode;
use ticketing_core::machine::Machine;
use ticketing_core::raft::{NodeId, RaftConfig};
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::testing::net::{
    BOOT_US, ClusterNet, Endpoint, LOOPBACK, REJOIN_GENERATION, cluster_config as config,
};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    AcquireRequest, ErrorCode, Key, KeyGroup, NO_LEADER_SLOT, ReleaseRequest, Reply, Request,
};

#[test]
fn a_grant_is_replied_only_after_commit_and_apply() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    assert_eq!(
        net.clients[c].replies,
        vec![Reply::Leader {
            leader_slot: leader as u8
        }]
    );
    net.send_only(c, acquire(1, "k", 0, 10));
    // The leader has only proposed: nothing for the client yet.
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "replied before commit: {out:?}");
    assert_eq!(net.node(leader).lock_state().held_keys(), 0);
    net.run_for(Duration::from_millis(100));
    let token = token_of(net.answers(c)[0]);
    assert!(
        token >= BOOT_US,
        "the counter starts at the bootstrap clock"
    );
    for node in net.nodes.iter().flatten() {
        let (held, _) = node.lock_state().holder(&Key::new(b"k").unwrap()).unwrap();
        assert_eq!(held, token, "every replica applied the grant");
    }
}

/// The commit path batches: requests that arrive in one input are
/// proposed together and leave in one append per follower; nobody is
/// answered before the entries are applied; then every request is granted,
/// with strictly increasing tokens, on every replica.
#[test]
fn requests_that_arrive_together_travel_in_one_append_per_follower() {
    const REQUESTS: u64 = 10;
    let (mut net, leader, c) = leader_with_a_client();
    let before = net.node(leader).raft().counters();
    let mut bytes = Vec::new();
    for k in 0..REQUESTS {
        bytes.extend(acquire(k + 1, &format!("k{k}"), 0, 10).to_frame());
    }
    net.send_bytes(c, &bytes);
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    assert!(out.is_empty(), "replied before apply: {out:?}");
    assert_eq!(net.node(leader).lock_state().held_keys(), 0);
    // The first answer commits all of them (a commit of many entries: no
    // notice before the delay).
    net.settle();
    assert_eq!(
        appends_since(&mut net, leader, before),
        (2, 2 * REQUESTS),
        "one per follower, each carrying every request"
    );
    // The followers learn the commit index (an idle cluster tells it in an
    // empty append, once the commit-notice delay has passed) and apply them
    // too.
    net.run_for(RaftConfig::fast().commit_notice_delay);
    for i in 0..3 {
        assert_eq!(
            net.node(i).lock_state().held_keys(),
            REQUESTS as usize,
            "node {i} applied every grant"
        );
    }
    let tokens: Vec<u64> = net.answers(c).into_iter().map(token_of).collect();
    assert_eq!(tokens.len() as u64, REQUESTS);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// What clients send before the driver next takes a peer link's bytes
/// leaves in one append per follower: the proposals of several client
/// inputs of one wake-up are not sent one append each.
#[test]
fn inputs_of_several_clients_before_a_peer_take_share_one_append_per_follower() {
    let (mut net, leader, c1) = leader_with_a_client();
    let c2 = net.connect(leader);
    net.run_for(Duration::from_millis(300));
    let before = net.node(leader).raft().counters();
    net.send_bytes(c1, &acquire(1, "j", 0, 10).to_frame());
    net.send_bytes(c2, &acquire(1, "k", 0, 10).to_frame());
    assert_eq!(
        net.node(leader).raft().counters().appends_sent,
        before.appends_sent,
        "nothing built before a peer link is taken"
    );
    net.settle();
    assert_eq!(
        appends_since(&mut net, leader, before),
        (2, 2 * 2),
        "one per follower, each carrying both acquires (a commit of two \
         entries: no notice yet)"
    );
    assert_eq!(net.answers(c1).len(), 1);
    assert_eq!(net.answers(c2).len(), 1);
}

/// The driver is handed each peer link once for held messages: the first
/// take routes them into every link, and the links already handed are not
/// woken again for it (their takes come anyway).
#[test]
fn held_messages_wake_each_peer_link_once() {
    let (mut net, leader, c) = leader_with_a_client();
    net.send_bytes(c, &acquire(1, "j", 0, 10).to_frame());
    let woken: Vec<ConnId> = net.outputs(leader).wakes.drain(..).collect();
    let peers: Vec<ConnId> = woken
        .iter()
        .copied()
        .filter(|&conn| matches!(net.links.get(&(leader, conn)), Some(Endpoint::Peer(..))))
        .collect();
    assert!(peers.len() >= 2, "every peer link handed: {woken:?}");
    let mut carrying = 0;
    for (n, &conn) in peers.iter().enumerate() {
        let mut out = Vec::new();
        net.node(leader).poll_transmit(conn, &mut out);
        if n == 0 {
            assert_eq!(
                net.outputs(leader).wakes.pop_front(),
                None,
                "no second wake"
            );
        }
        if !out.is_empty() {
            carrying += 1;
            let now = net.now;
            if let Some(Endpoint::Peer(j, other)) = net.links.get(&(leader, conn)).copied() {
                net.node(j).handle_input(now, other, &out);
            }
        }
    }
    assert_eq!(carrying, 2, "one link per follower carries the append");
    net.settle();
    assert_eq!(net.answers(c).len(), 1, "granted once committed");
}

/// Waiting Raft messages do not wait past the next timer, nor past a
/// client input on a node with no peer link to take.
#[test]
fn a_timer_sends_what_waits_and_a_node_without_peer_links_does_not_wait() {
    let (mut net, leader, c) = leader_with_a_client();
    let before = net.node(leader).raft().counters();
    net.send_bytes(c, &acquire(1, "j", 0, 10).to_frame());
    let now = net.now;
    net.node(leader).handle_timeout(now);
    assert_eq!(
        net.node(leader).raft().counters().appends_sent - before.appends_sent,
        2,
        "the timer built one append per follower"
    );
    net.settle();
    assert_eq!(net.answers(c).len(), 1);
    // Every peer link of the leader closed: a client's input builds its
    // appends at once (they find no link and are dropped; Raft retries).
    let peers: Vec<ConnId> = net
        .links
        .iter()
        .filter(|((n, _), e)| *n == leader && matches!(e, Endpoint::Peer(..)))
        .map(|((_, conn), _)| *conn)
        .collect();
    assert!(peers.len() >= 2, "{peers:?}");
    for conn in peers {
        net.close_link(leader, conn);
    }
    let before = net.node(leader).raft().counters();
    net.send_bytes(c, &acquire(2, "k", 0, 10).to_frame());
    assert_eq!(
        net.node(leader).raft().counters().appends_sent - before.appends_sent,
        2,
        "built at the input"
    );
}

/// The commit of a lone request goes to the followers at once, in one
/// empty append each: one client alone gets no faster by waiting for
/// entries that are not coming.
#[test]
fn a_lone_request_is_committed_on_every_replica_at_once() {
    let (mut net, leader, c) = leader_with_a_client();
    let before = net.node(leader).raft().counters();
    net.send_bytes(c, &acquire(1, "k", 0, 10).to_frame());
    net.settle();
    assert_eq!(net.answers(c).len(), 1, "granted once committed");
    for i in 0..3 {
        assert_eq!(net.node(i).lock_state().held_keys(), 1, "node {i} told");
    }
    let after = net.node(leader).raft().counters();
    assert_eq!(
        after.appends_sent - before.appends_sent,
        4,
        "the entry and the commit notice, to each follower"
    );
    assert_eq!(after.append_entries_sent - before.append_entries_sent, 2);
}

/// A commit of several entries waits `commit_notice_delay` for entries
/// to carry it: until then only the leader has applied the grants, then
/// every replica has, through one empty append per follower.
#[test]
fn a_batch_is_told_to_idle_followers_after_the_notice_delay() {
    let delay = RaftConfig::fast().commit_notice_delay;
    assert!(!delay.is_zero());
    let (mut net, leader, c) = leader_with_a_client();
    net.send_bytes(c, &two_acquires_in_one_input());
    net.settle();
    assert_eq!(net.answers(c).len(), 2, "granted once committed");
    let before = net.node(leader).raft().counters();
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    net.run_for(delay.saturating_sub(Duration::from_micros(1)));
    for &i in &followers {
        assert_eq!(net.node(i).lock_state().held_keys(), 0, "node {i} early");
    }
    net.run_for(Duration::from_micros(1));
    for &i in &followers {
        assert_eq!(net.node(i).lock_state().held_keys(), 2, "node {i} told");
    }
    let after = net.node(leader).raft().counters();
    assert_eq!(
        after.appends_sent - before.appends_sent,
        2,
        "one per follower"
    );
    assert_eq!(after.append_entries_sent, before.append_entries_sent);
}

/// Under load the commit index rides on the next entries: a release sent
/// within the notice delay after a batch of grants leaves in one append
/// per follower, and no empty append goes out for the batch's commit.
#[test]
fn a_batch_commit_rides_on_the_next_entries_within_the_notice_delay() {
    let (mut net, leader, c) = leader_with_a_client();
    let before = net.node(leader).raft().counters();
    net.send_bytes(c, &two_acquires_in_one_input());
    net.settle();
    let token = token_of(net.answers(c)[1]);
    net.send_bytes(c, &release(3, "k", token).to_frame());
    net.settle();
    assert_eq!(net.answers(c).last(), Some(&Reply::Released { rid: 3 }));
    let after = net.node(leader).raft().counters();
    assert_eq!(
        after.appends_sent - before.appends_sent,
        6,
        "the batch's and the release's, one per follower each, and the \
         release's own commit notice (one entry: at once)"
    );
    assert_eq!(after.append_entries_sent - before.append_entries_sent, 6);
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), None, "node {i}");
        assert!(net.holder_token(i, "j").is_some(), "node {i}");
    }
}

#[test]
fn a_follower_answers_moved_with_the_leader_slot() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let c = net.connect(follower);
    assert_eq!(
        net.clients[c].replies,
        vec![Reply::Leader {
            leader_slot: leader as u8
        }]
    );
    assert_eq!(
        net.request(c, acquire(1, "k", 5, 10)),
        Reply::Moved {
            rid: 1,
            leader_slot: leader as u8
        }
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0, "no effect");
}

#[test]
fn a_new_leader_grants_with_a_larger_token_and_keeps_the_old_grant() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    let first = token_of(net.request(c, acquire(1, "a", 0, 60)));
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    let c2 = net.connect(new_leader);
    let second = token_of(net.request(c2, acquire(1, "b", 0, 60)));
    assert!(second > first, "{second} > {first}");
    // The grant made under the old leader is still held.
    assert_eq!(
        net.request(c2, acquire(2, "a", 0, 60)),
        Reply::TimedOut { rid: 2 }
    );
    assert_eq!(
        net.request(c2, release(3, "a", first)),
        Reply::Released { rid: 3 }
    );
}

#[test]
fn leases_expire_through_a_committed_expire_and_the_waiter_gets_the_key() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 1)));
    net.send_only(c2, acquire(1, "k", 5, 10));
    net.run_for(Duration::from_millis(500));
    assert!(net.answers(c2).is_empty(), "still queued");
    net.run_for(Duration::from_millis(600));
    let second = token_of(net.answers(c2)[0]);
    assert!(second > first);
    for node in net.nodes.iter().flatten() {
        let (held, _) = node.lock_state().holder(&Key::new(b"k").unwrap()).unwrap();
        assert_eq!(held, second);
    }
    // The stale holder's release is refused; the current one succeeds.
    assert_eq!(
        net.request(c1, release(2, "k", first)),
        Reply::NotFound { rid: 2 }
    );
    assert_eq!(
        net.request(c2, release(2, "k", second)),
        Reply::Released { rid: 2 }
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0);
}

#[test]
fn release_hands_the_key_to_the_front_waiter_and_wait_ends_with_t() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let c3 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.send_only(c2, acquire(1, "k", 10, 60));
    net.send_only(c3, acquire(1, "k", 1, 60));
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        net.request(c1, release(2, "k", first)),
        Reply::Released { rid: 2 }
    );
    net.run_for(Duration::from_millis(100));
    let second = token_of(net.answers(c2)[0]);
    assert!(second > first);
    // c3 waited behind c2 and times out a margin before its 1 s.
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.answers(c3), vec![Reply::TimedOut { rid: 1 }]);
}

/// A release whose keys a waiter queues for is followed, in the same
/// append, by the waiter's Grant: one commit hands the key over.
#[test]
fn a_release_and_its_hand_over_grant_travel_in_one_append() {
    let (mut net, leader, c1, c2, first) = holder_and_waiter();
    let before = net.node(leader).raft().counters();
    net.send_bytes(c1, &release(2, "k", first).to_frame());
    net.settle();
    assert_eq!(
        appends_since(&mut net, leader, before),
        (2, 2 * 2),
        "one per follower, each carrying the Release and the Grant (a \
         commit of two entries: no notice yet)"
    );
    net.run_for(RaftConfig::fast().commit_notice_delay);
    assert_eq!(net.answers(c1).last(), Some(&Reply::Released { rid: 2 }));
    let second = token_of(net.answers(c2)[0]);
    assert!(second > first, "{second} > {first}");
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(second), "node {i}");
    }
    assert_eq!(net.node(leader).metrics().release_handovers, 1);
}

/// A release naming other keys than its grant holds frees nothing: the
/// waiter gets no Grant until the holder's own release.
#[test]
fn a_mismatched_release_hands_nothing_over() {
    let (mut net, leader, c1, c2, first) = holder_and_waiter();
    let wrong = Request::Release(ReleaseRequest {
        rid: 2,
        token: first,
        keys: KeyGroup::new(vec![Key::new(b"j").unwrap(), Key::new(b"k").unwrap()]).unwrap(),
        set: true,
    });
    let before = net.node(leader).raft().counters();
    net.send_bytes(c1, &wrong.to_frame());
    net.settle();
    let after = net.node(leader).raft().counters();
    assert_eq!(
        after.append_entries_sent - before.append_entries_sent,
        2,
        "the Release alone"
    );
    assert!(net.answers(c2).is_empty(), "still queued");
    assert_eq!(
        net.request(c1, release(3, "k", first)),
        Reply::Released { rid: 3 }
    );
    net.run_for(Duration::from_millis(100));
    assert!(token_of(net.answers(c2)[0]) > first);
}

#[test]
fn a_grant_for_a_closed_connection_is_released_at_once() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    net.send_only(c, acquire(1, "k", 0, 60));
    let conn = net.clients[c].conn;
    let now = net.now;
    net.links.remove(&(leader, conn));
    net.node(leader).handle_closed(now, conn);
    net.run_for(Duration::from_millis(200));
    for node in net.nodes.iter().flatten() {
        assert_eq!(node.lock_state().held_keys(), 0, "ghost lock released");
    }
    assert!(net.node(leader).lock_state().next_token() > BOOT_US);
}

#[test]
fn lost_leadership_answers_proposed_requests_indeterminate() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let held = token_of(net.request(c1, acquire(1, "held", 0, 60)));
    net.send_only(c2, acquire(1, "held", 30, 60));
    for i in 0..3 {
        if i != leader {
            net.kill(i);
        }
    }
    net.send_only(c1, acquire(2, "new", 0, 60));
    net.run_for(Duration::from_secs(2));
    assert!(!net.node(leader).is_leader(), "check-quorum stepped down");
    // Proposed: outcome unknown. Queued: no effect, no leader known.
    assert_eq!(net.answers(c1)[1], Reply::Indeterminate { rid: 2 });
    assert_eq!(
        net.answers(c2),
        vec![Reply::Error {
            rid: 1,
            code: ErrorCode::NoLeader
        }]
    );
    assert!(net.clients[c1].replies.contains(&Reply::Leader {
        leader_slot: NO_LEADER_SLOT
    }));
    let _ = held;
}

#[test]
fn a_new_generation_answers_not_active_until_it_is_a_voter() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let id = NodeId::new(victim as u8, 2);
    net.nodes[victim] = Some(ClusterNode::join(config(id), 99, net.now));
    let c = net.connect(victim);
    assert_eq!(
        net.request(c, acquire(1, "k", 0, 10)),
        Reply::Error {
            rid: 1,
            code: ErrorCode::NotActive
        }
    );
    // The leader adds it as a learner and replaces the dead generation.
    net.run_for(Duration::from_secs(3));
    let raft = net.node(victim).raft();
    assert!(raft.is_voter(), "config: {:?}", raft.config());
    assert!(!raft.config().contains(NodeId::new(victim as u8, 1)));
}

#[test]
fn a_key_set_waits_for_all_its_keys_in_fifo_order() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let a = token_of(net.request(c1, acquire(1, "a", 0, 60)));
    let set = KeyGroup::new(vec![Key::new(b"a").unwrap(), Key::new(b"b").unwrap()]).unwrap();
    net.send_only(
        c2,
        Request::Acquire(AcquireRequest {
            rid: 1,
            wait_s: 10,
            lease_s: 60,
            keys: set.clone(),
            set: true,
        }),
    );
    net.run_for(Duration::from_millis(100));
    // "b" is free, but a later single acquire of it queues behind the set.
    assert_eq!(
        net.request(c1, acquire(2, "b", 0, 60)),
        Reply::TimedOut { rid: 2 }
    );
    assert_eq!(
        net.request(c1, release(3, "a", a)),
        Reply::Released { rid: 3 }
    );
    net.run_for(Duration::from_millis(100));
    let Reply::AcquiredSet { rid: 1, token } = net.answers(c2)[0] else {
        panic!("{:?}", net.answers(c2));
    };
    assert!(token > a);
    // Releasing one key of the set with the set's token is a group mismatch.
    assert_eq!(
        net.request(c2, release(2, "a", token)),
        Reply::Error {
            rid: 2,
            code: ErrorCode::GroupMismatch
        }
    );
    let release_set = Request::Release(ReleaseRequest {
        rid: 3,
        token,
        keys: set,
        set: true,
    });
    assert_eq!(net.request(c2, release_set), Reply::ReleasedSet { rid: 3 });
}

#[test]
fn runs_are_deterministic() {
    let run = || {
        let mut net = ClusterNet::new();
        let leader = net.elect();
        let c1 = net.connect(leader);
        let c2 = net.connect((leader + 1) % 3);
        net.send_only(c1, acquire(1, "k", 0, 1));
        net.send_only(c1, acquire(2, "k", 5, 1));
        net.send_only(c2, acquire(1, "k", 5, 1));
        net.run_for(Duration::from_secs(4));
        (
            leader,
            net.clients[c1].replies.clone(),
            net.clients[c2].replies.clone(),
        )
    };
    let first = run();
    // The run did the work it is compared on: c1 was granted the key at
    // once and again after its one-second lease ran out (with a larger
    // token), and c2, on a follower, was sent to the leader.
    let (leader, c1, c2) = &first;
    let slot = *leader as u8;
    let [
        Reply::Leader { leader_slot: s1 },
        Reply::Acquired { rid: 1, token: t1 },
        Reply::Acquired { rid: 2, token: t2 },
    ] = c1[..]
    else {
        panic!("c1: {c1:?}");
    };
    assert!(t2 > t1 && s1 == slot, "c1: {c1:?}");
    let [
        Reply::Leader { leader_slot: s2 },
        Reply::Moved {
            rid: 1,
            leader_slot: moved_to,
        },
    ] = c2[..]
    else {
        panic!("c2: {c2:?}");
    };
    assert_eq!((s2, moved_to), (slot, slot), "c2: {c2:?}");
    assert_eq!(run(), first);
}

/// A take written in parts: a grant whose reply frame went out whole may be
/// in the client's hands and stays held when the connection dies; a grant
/// cut off mid-frame is released.
#[test]
fn a_short_write_keeps_grants_written_whole_and_releases_the_rest() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    let observer = net.connect(leader);
    net.clients[c].stalled = true;
    net.send_only(c, acquire(1, "first", 0, 60));
    net.send_only(c, acquire(2, "second", 0, 60));
    net.run_for(Duration::from_millis(200));
    let conn = net.clients[c].conn;
    let mut out = Vec::new();
    net.node(leader).poll_transmit(conn, &mut out);
    let first_frame = match Reply::decode(&out).unwrap() {
        Some((Reply::Acquired { rid: 1, .. }, used)) => used,
        other => panic!("expected the first grant, got {other:?}"),
    };
    let now = net.now;
    net.node(leader).handle_written(now, conn, first_frame + 3);
    net.links.remove(&(leader, conn));
    net.node(leader).handle_closed(now, conn);
    net.run_for(Duration::from_millis(200));
    assert_eq!(
        net.request(observer, acquire(1, "first", 0, 60)),
        Reply::TimedOut { rid: 1 },
        "a grant written whole stays held"
    );
    assert!(
        matches!(
            net.request(observer, acquire(2, "second", 0, 60)),
            Reply::Acquired { rid: 2, .. }
        ),
        "a grant cut off mid-frame is released"
    );
}

#[test]
fn bootstrap_members_started_together_stay_generation_one() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    for i in 0..3 {
        let node = net.node(i);
        assert!(!node.checking_genesis(), "node {i} still checking");
        assert_eq!(node.id(), NodeId::new(i as u8, 1));
    }
    let c = net.connect(leader);
    assert!(matches!(
        net.request(c, acquire(1, "k", 0, 10)),
        Reply::Acquired { rid: 1, .. }
    ));
}

/// What a restart with `--bootstrap` by mistake (or a bootstrap member
/// started after the others already elected a leader) must do: never act as
/// generation 1, join as the new generation and be swapped in.
#[test]
fn a_bootstrap_member_that_finds_a_running_cluster_joins_as_a_new_generation() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    let first = token_of(net.request(c, acquire(1, "k", 0, 30)));
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
    let old_id = NodeId::new(victim as u8, 1);
    net.nodes[victim] = Some(ClusterNode::bootstrap(
        config(old_id),
        voters,
        REJOIN_GENERATION,
        42,
        net.now,
    ));
    assert!(net.node(victim).checking_genesis());
    // The leader's heartbeats show a running cluster.
    net.run_for(Duration::from_millis(500));
    let new_id = NodeId::new(victim as u8, REJOIN_GENERATION);
    assert_eq!(net.node(victim).id(), new_id);
    assert!(!net.node(victim).checking_genesis());
    // Replaced as a voter like any restart; the old identity is gone.
    net.run_for(Duration::from_secs(3));
    let leader_config = net.node(leader).raft().config().clone();
    assert!(leader_config.is_voter(new_id), "config: {leader_config:?}");
    assert!(!leader_config.contains(old_id), "config: {leader_config:?}");
    assert!(net.node(victim).raft().is_voter());
    // The grant made before is still held: nothing committed was lost.
    assert_eq!(
        net.request(c, acquire(2, "k", 0, 30)),
        Reply::TimedOut { rid: 2 }
    );
    let other = (leader + 2) % 3;
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("the two survivors elect a leader");
    assert!(new_leader == victim || new_leader == other);
    let c2 = net.connect(new_leader);
    assert_eq!(
        net.request(c2, release(3, "k", first)),
        Reply::Released { rid: 3 }
    );
}

#[test]
fn idle_sockets_on_every_peer_port_do_not_keep_a_restarted_node_out() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    for i in 0..3 {
        for _ in 0..20 {
            let (now, nonce) = (net.now, net.nonce());
            // Never answered: nobody reads or writes these sockets.
            net.node(i)
                .handle_peer_accept(now, nonce, LOOPBACK)
                .unwrap();
        }
    }
    net.settle();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let id = NodeId::new(victim as u8, 2);
    net.nodes[victim] = Some(ClusterNode::join(config(id), 99, net.now));
    // More idle sockets arrive while it rejoins.
    for i in 0..3 {
        if i != victim {
            for _ in 0..20 {
                let (now, nonce) = (net.now, net.nonce());
                net.node(i)
                    .handle_peer_accept(now, nonce, LOOPBACK)
                    .unwrap();
            }
        }
    }
    net.run_for(Duration::from_secs(3));
    let raft = net.node(victim).raft();
    assert!(raft.is_voter(), "config: {:?}", raft.config());
}

#[test]
fn the_leader_caps_keys_held_per_client_connection() {
    let mut net = ClusterNet::with_config(|config| config.budget.held_per_connection_max = 2);
    let leader = net.elect();
    let c = net.connect(leader);
    let a = token_of(net.request(c, acquire(1, "a", 0, 60)));
    net.request(c, acquire(2, "b", 0, 60));
    assert_eq!(
        net.request(c, acquire(3, "c", 0, 60)),
        Reply::Busy { rid: 3 }
    );
    assert_eq!(
        net.request(c, release(4, "a", a)),
        Reply::Released { rid: 4 }
    );
    assert!(matches!(
        net.request(c, acquire(5, "c", 0, 60)),
        Reply::Acquired { rid: 5, .. }
    ));
    // Expiry frees the count too (leases of 1 s).
    let d = net.connect(leader);
    net.request(d, acquire(6, "x", 0, 1));
    net.request(d, acquire(7, "y", 0, 1));
    assert_eq!(
        net.request(d, acquire(8, "z", 0, 1)),
        Reply::Busy { rid: 8 }
    );
    net.run_for(Duration::from_secs(2));
    assert!(matches!(
        net.request(d, acquire(9, "z", 0, 1)),
        Reply::Acquired { rid: 9, .. }
    ));
    // Both `B`s counted under the per-connection limit, and only there.
    let m = net.node(leader).metrics();
    assert_eq!(m.busy_per_connection, 2);
    assert_eq!(m.busy, ticketing_core::metrics::BusyByLimit::default());
}

#[test]
fn a_run_of_release_misses_closes_a_cluster_client_after_exactly_k() {
    let mut net = ClusterNet::with_config(|config| config.budget.release_misses_in_row_max = 3);
    let leader = net.elect();
    let c = net.connect(leader);
    let own = token_of(net.request(c, acquire(1, "own", 0, 60)));
    for rid in 2..4 {
        assert_eq!(
            net.request(c, release(rid, "v", own + rid)),
            Reply::NotFound { rid }
        );
    }
    assert_eq!(
        net.request(c, release(4, "own", own)),
        Reply::Released { rid: 4 }
    );
    for rid in 5..7 {
        assert_eq!(
            net.request(c, release(rid, "v", own + rid)),
            Reply::NotFound { rid }
        );
    }
    assert!(!net.clients[c].closed);
    assert_eq!(
        net.request(c, release(7, "v", own + 7)),
        Reply::NotFound { rid: 7 }
    );
    assert!(
        net.clients[c].closed,
        "closed after the third miss in a row"
    );
}

#[test]
fn unfinished_peer_handshakes_are_capped_per_source_oldest_first() {
    let mut net = ClusterNet::new();
    let now = net.now;
    let from = |n: u8| std::net::IpAddr::from([192, 0, 2, n]);
    let mut opened = Vec::new();
    for _ in 0..6 {
        let nonce = net.nonce();
        opened.push(net.node(0).handle_peer_accept(now, nonce, from(1)).unwrap());
    }
    let nonce = net.nonce();
    let other = net.node(0).handle_peer_accept(now, nonce, from(2)).unwrap();
    let state = |net: &mut ClusterNet, conn| {
        let mut out = Vec::new();
        net.node(0).poll_transmit(conn, &mut out)
    };
    // Four per source: the two oldest of source 1 are gone.
    for (i, conn) in opened.iter().enumerate() {
        let expected = if i < 2 {
            ConnState::CloseAfterFlush
        } else {
            ConnState::Open
        };
        assert_eq!(state(&mut net, *conn), expected, "connection {i}");
    }
    assert_eq!(state(&mut net, other), ConnState::Open);
    let evicted: Vec<_> = net
        .outputs(0)
        .logs
        .drain(..)
        .filter(|e| {
            matches!(
                e,
                LogEvent::Abuse {
                    kind: AbuseKind::HandshakeEvicted,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        evicted,
        vec![LogEvent::Abuse {
            source: Some(from(1)),
            kind: AbuseKind::HandshakeEvicted,
            count: 1
        }]
    );
}

#[test]
fn a_failed_peer_handshake_is_reported_with_its_source() {
    let mut net = ClusterNet::new();
    let (now, nonce) = (net.now, net.nonce());
    let source = std::net::IpAddr::from([192, 0, 2, 77]);
    let conn = net.node(1).handle_peer_accept(now, nonce, source).unwrap();
    net.node(1).handle_input(now, conn, &[0xab; 256]);
    let mut out = Vec::new();
    assert_eq!(
        net.node(1).poll_transmit(conn, &mut out),
        ConnState::CloseAfterFlush
    );
    net.node(1).handle_closed(now, conn);
    let events: Vec<_> = net.outputs(1).logs.drain(..).collect();
    assert!(
        events.contains(&LogEvent::Abuse {
            source: Some(source),
            kind: AbuseKind::FailedPeerHandshake,
            count: 1
        }),
        "{events:?}"
    );
    assert!(events.contains(&LogEvent::Closed {
        conn,
        source: Some(source),
        reason: CloseReason::PeerHandshakeFailed
    }));
}

/// A cluster bootstrapped again while one member's clock is an hour ahead
/// of the others (as if tokens up to there had been issued before): the
/// first leader, one of the slow ones, starts its tokens above the floor
/// the fast member sent in its (authenticated) hello, not at its own clock.
#[test]
fn the_first_token_starts_above_every_peer_token_floor() {
    const AHEAD_US: u64 = BOOT_US + 3_600_000_000;
    let mut clocks = [BOOT_US; 3];
    // Which slot leads is a pure function of the seeds; put the fast clock
    // on one that does not.
    let probe = ClusterNet::new().elect();
    let ahead = (probe + 1) % 3;
    clocks[ahead] = AHEAD_US;
    let mut net = ClusterNet::with_boot_clocks(clocks);
    let leader = net.elect();
    assert_eq!(leader, probe, "same seeds, same leader");
    assert_ne!(leader, ahead);
    assert_eq!(net.node(leader).peer_token_floor_max(), AHEAD_US);
    let c = net.connect(leader);
    let first = token_of(net.request(c, acquire(1, "k", 0, 30)));
    assert!(
        first >= AHEAD_US,
        "first token {first} below the peer floor {AHEAD_US}"
    );
}

/// The floor a node sends grows with the replicated token counter, and a
/// node that connects later learns it from its peers' hellos.
#[test]
fn token_floors_follow_the_replicated_counter() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    let mut last = 0;
    for rid in 1..=3 {
        last = token_of(net.request(c, acquire(rid, &format!("k{rid}"), 0, 30)));
    }
    for i in 0..3 {
        assert!(net.node(i).local_token_floor() > last, "node {i}");
    }
    // A fresh process for a follower slot hears the floor on its handshakes.
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let fresh = NodeId::new(victim as u8, REJOIN_GENERATION);
    net.nodes[victim] = Some(ClusterNode::join(config(fresh), 5, net.now));
    assert_eq!(net.node(victim).peer_token_floor_max(), 0);
    net.run_for(Duration::from_millis(500));
    assert!(
        net.node(victim).peer_token_floor_max() > last,
        "{} > {last}",
        net.node(victim).peer_token_floor_max()
    );
}
