//! Three `ClusterNode`s over an in-memory network with injected time:
//! bytes are shuttled between their connections exactly as a driver would,
//! and clients speak the real wire protocol.

use ticketing_core::testing::net::{
    BOOT_US, ClusterNet, Endpoint, LOOPBACK, REJOIN_GENERATION, cluster_config as config,
};

use ticketing_core::budget::{AbuseKind, CloseReason, LogEvent};
use ticketing_core::cluster::{
    ClusterConfig, ClusterNode, NodeEvent, PeerLiveness, default_peer_silence_timeout,
};
use ticketing_core::line::{encode_line_acquire, encode_line_release};
use ticketing_core::machine::Machine;
use ticketing_core::metrics::RaftCounters;
use ticketing_core::raft::{NodeId, RaftConfig};
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    AcquireRequest, ErrorCode, Key, KeyGroup, LEASE_S_MAX, NO_LEADER_SLOT, ReleaseRequest, Reply,
    Request,
};

fn keys(key: &str) -> KeyGroup {
    KeyGroup::single(Key::new(key.as_bytes()).unwrap())
}

fn acquire(rid: u64, key: &str, wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: keys(key),
        set: false,
    })
}

fn release(rid: u64, key: &str, token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: keys(key),
        set: false,
    })
}

/// A cluster whose leader's client `c1` holds "k" (token `first`, 60 s)
/// and whose client `c2` queues for it (wait 10 s): `(net, leader, c1, c2,
/// first)`.
/// An elected cluster, settled, with one client connected to the leader:
/// `(net, leader, client)`.
fn leader_with_a_client() -> (ClusterNet, usize, usize) {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    net.run_for(Duration::from_millis(300));
    (net, leader, c)
}

/// Acquires of keys `j` (rid 1) and `k` (rid 2) in one read: a commit of
/// two entries.
fn two_acquires_in_one_input() -> Vec<u8> {
    let mut bytes = acquire(1, "j", 0, 10).to_frame();
    bytes.extend(acquire(2, "k", 0, 10).to_frame());
    bytes
}

fn holder_and_waiter() -> (ClusterNet, usize, usize, usize, u64) {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.send_only(c2, acquire(1, "k", 10, 60));
    net.run_for(Duration::from_millis(100));
    assert!(net.answers(c2).is_empty(), "c2 queues behind c1");
    (net, leader, c1, c2, first)
}

/// The appends the leader sent since `before`, and the entries they
/// carried.
fn appends_since(net: &mut ClusterNet, leader: usize, before: RaftCounters) -> (u64, u64) {
    let after = net.node(leader).raft().counters();
    (
        after.appends_sent - before.appends_sent,
        after.append_entries_sent - before.append_entries_sent,
    )
}

fn token_of(reply: Reply) -> u64 {
    match reply {
        Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => token,
        other => panic!("not a grant: {other:?}"),
    }
}

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
    assert_eq!(run(), run());
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

// ---------------------------------------------------------------------------
// The token reserve (issue 10)
// ---------------------------------------------------------------------------

#[test]
fn a_leader_proposes_no_grant_above_its_durable_reserve() {
    let mut net = ClusterNet::with_reserves(1_000);
    net.hold_reserve_writes = true;
    let leader = net.elect();
    let c = net.connect(leader);
    // Nothing durable yet: a definite "no", nothing proposed.
    assert_eq!(
        net.request(c, acquire(1, "k", 0, 10)),
        Reply::Busy { rid: 1 }
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0);
    assert_eq!(net.node(leader).stats().reserve.exhausted, 1);
    let m = net.node(leader).metrics();
    assert_eq!((m.busy.token_reserve, m.busy_per_connection), (1, 0));
    net.hold_reserve_writes = false;
    net.run_for(Duration::from_millis(10));
    let durable = net.durable[leader].expect("the leader stored a reserve");
    let token = token_of(net.request(c, acquire(2, "k", 0, 10)));
    assert_eq!(token, BOOT_US);
    assert!(token <= durable, "{token} above the durable {durable}");
    // Every node keeps a reserve ahead of the counter it applied.
    for (i, node) in net.nodes.iter().enumerate() {
        let node = node.as_ref().unwrap();
        let stored = net.durable[i].expect("every node stored a reserve");
        assert!(stored >= node.lock_state().next_token(), "node {i}");
    }
}

#[test]
fn a_queue_head_waits_for_the_reserve_then_gets_the_key() {
    // A step of 4: the reserve runs out after a few grants.
    let mut net = ClusterNet::with_reserves(4);
    let leader = net.elect();
    let [a, b] = [net.connect(leader), net.connect(leader)];
    let first = token_of(net.request(a, acquire(1, "k", 0, 60)));
    net.hold_reserve_writes = true;
    // Use up what is durable on other keys.
    let durable = net.durable[leader].unwrap();
    let mut rid = 10;
    loop {
        rid += 1;
        match net.request(a, acquire(rid, &format!("x{rid}"), 0, 60)) {
            Reply::Acquired { token, .. } => assert!(token <= durable),
            Reply::Busy { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    net.send_only(b, acquire(2, "k", 5, 60));
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        net.request(a, release(3, "k", first)),
        Reply::Released { rid: 3 }
    );
    net.run_for(Duration::from_millis(500));
    assert!(
        net.answers(b).is_empty(),
        "granted above the reserve: {:?}",
        net.answers(b)
    );
    net.hold_reserve_writes = false;
    net.run_for(Duration::from_millis(200));
    let granted = token_of(net.answers(b)[0]);
    assert!(granted > durable);
    assert!(granted <= net.durable[leader].unwrap());
}

#[test]
fn the_bootstrap_counter_starts_above_a_stored_floor() {
    // The slot stored a reserve an hour ahead of its (stepped back) clock.
    let clock_us = BOOT_US;
    let stored = BOOT_US + 3_600_000_000;
    let floor = ticketing_core::reserve::start_token(Duration::from_micros(clock_us), Some(stored));
    assert_eq!(floor, stored + 1);
    let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
    let mut net = ClusterNet::new();
    for (slot, node) in net.nodes.iter_mut().enumerate() {
        let mut config = config(voters[slot]);
        config.bootstrap_wall_clock_us = floor;
        *node = Some(ClusterNode::bootstrap(
            config,
            voters.clone(),
            REJOIN_GENERATION,
            slot as u64 + 11,
            Instant::ZERO,
        ));
    }
    let leader = net.elect();
    let c = net.connect(leader);
    let token = token_of(net.request(c, acquire(1, "k", 0, 10)));
    assert_eq!(token, stored + 1);
}

/// Issue 16: a Heartbeat with term `u64::MAX`, then acknowledgements with
/// index and hint `u64::MAX`, each sent on an established peer connection
/// in the name of its authenticated peer. Each is refused and counted, the
/// connection is closed (and dialed again), and the cluster still elects a
/// new leader and grants with a larger token.
#[test]
fn a_peer_frame_with_an_impossible_number_closes_that_connection_only() {
    use ticketing_core::cluster::peer::PeerError;
    use ticketing_core::raft::{Message, MessageBody};

    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    let first = token_of(net.request(c, acquire(1, "a", 0, 60)));
    let term = net.node(leader).raft().term();
    let hostile = [
        MessageBody::Heartbeat { commit: 0 },
        MessageBody::AppendResponse {
            reject: false,
            index: u64::MAX,
            hint_index: 0,
            hint_term: 0,
        },
        MessageBody::AppendResponse {
            reject: true,
            index: u64::MAX,
            hint_index: u64::MAX,
            hint_term: 0,
        },
    ];
    for (round, body) in hostile.into_iter().enumerate() {
        // A heartbeat goes to a follower, the acknowledgements to the leader.
        let heartbeat = matches!(body, MessageBody::Heartbeat { .. });
        let (from, to) = if heartbeat {
            (leader, (leader + 1) % 3)
        } else {
            ((leader + 1) % 3, leader)
        };
        // An authenticated peer (it holds the peer token) that misbehaves.
        let (conn, mut sealer) = net.authenticated_peer(from, to);
        let msg = Message {
            from: net.node(from).id(),
            to: net.node(to).id(),
            term: if heartbeat { u64::MAX } else { term },
            body,
        };
        let mut frame = Vec::new();
        sealer.seal(&msg, &mut frame).unwrap();
        let refused = net.node(to).refused_peer_frames();
        let now = net.now;
        net.node(to).handle_input(now, conn, &frame);
        assert_eq!(
            net.node(to).refused_peer_frames(),
            refused + 1,
            "round {round}"
        );
        assert_eq!(
            net.node(to).last_refused_peer_frame(),
            Some((from as u8, PeerError::Malformed))
        );
        assert!(net.node(to).raft().term() < 1_000, "term not taken");
        let mut out = Vec::new();
        assert_ne!(
            net.node(to).poll_transmit(conn, &mut out),
            ConnState::Open,
            "the connection that sent it is closed"
        );
        net.run_for(Duration::from_millis(500));
    }
    // The links were dialed again; the leader still leads and grants.
    assert_eq!(net.leader(), Some(leader));
    let c = net.connect(leader);
    let second = token_of(net.request(c, acquire(2, "b", 0, 60)));
    assert!(second > first);
    // A failover works too: every election timeout fires on the survivors.
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    let c = net.connect(new_leader);
    let third = token_of(net.request(c, acquire(3, "c", 0, 60)));
    assert!(third > second, "{third} > {second}");
}

// ----------------------------------------------------------------------
// Silent peer links
// ----------------------------------------------------------------------

/// Cuts the leader off for `cut`, heals, and returns how long after the
/// heal every node followed one leader (`None`: not within `give_up`).
fn rejoin_after_cut(net: &mut ClusterNet, cut: Duration, give_up: Duration) -> Option<Duration> {
    // Long enough for a first election with the production timing too.
    net.run_for(Duration::from_secs(4));
    let old = net.elect();
    net.partition(old);
    net.dials_at_cut = net.dials_connected;
    net.run_for(cut);
    assert!(
        !net.all_follow_the_leader(),
        "the cut-off node cannot follow the leader the others elected"
    );
    net.heal();
    let healed = net.now;
    let step = Duration::from_millis(10);
    while net.now < healed.saturating_add(give_up) {
        net.run_for(step);
        if net.all_follow_the_leader() {
            return Some(net.now.saturating_duration_since(healed));
        }
    }
    None
}

#[test]
fn a_healed_partition_of_the_leader_rejoins_within_3_s() {
    for cut_s in [5, 30, 60] {
        let mut net = ClusterNet::new();
        let took = rejoin_after_cut(&mut net, Duration::from_secs(cut_s), Duration::from_secs(3));
        eprintln!("cut {cut_s} s: every node follows the leader {took:?} after the heal");
        assert!(took.is_some(), "cut {cut_s} s: not rejoined within 3 s");
        // The stale sockets were given up on, not waited for.
        let closed_silent = (0..3).any(|i| {
            net.outputs(i).logs.drain(..).any(|e| {
                matches!(
                    e,
                    LogEvent::Closed {
                        reason: CloseReason::PeerSilent,
                        ..
                    }
                )
            })
        });
        assert!(closed_silent, "cut {cut_s} s: no link closed as silent");
    }
}

#[test]
fn without_the_silence_rule_a_stale_link_is_never_redialed() {
    let mut net =
        ClusterNet::with_config(|c| c.peer_silence_timeout = Duration::from_secs(1_000_000));
    let took = rejoin_after_cut(&mut net, Duration::from_secs(30), Duration::from_secs(60));
    assert_eq!(took, None, "a stale link healed without the rule");
    assert_eq!(
        net.dials_connected, net.dials_at_cut,
        "nothing redialed: every slot still has its (stale) connection"
    );
}

/// A link the node closed for silence, whose transport never reports the
/// close (a write stuck on it), does not keep its slot from being dialed
/// again once the other link to that slot closes: both ends dial anew and
/// the two nodes hear each other again.
#[test]
fn a_close_that_never_completes_does_not_stop_the_redial_of_its_slot() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    net.run_for(Duration::from_secs(1));
    // The followers' link carries keepalives only.
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    let between: Vec<(ConnId, usize, ConnId)> = net
        .links
        .iter()
        .filter_map(|(&(n, conn), endpoint)| match *endpoint {
            Endpoint::Peer(j, other) if n == a && j == b => Some((conn, j, other)),
            _ => None,
        })
        .collect();
    assert_eq!(between.len(), 2, "one link dialed each way");
    let (conn, _, other) = between[0];
    for end in [(a, conn), (b, other)] {
        net.stale.insert(end);
        net.stuck.insert(end);
    }
    // Past the silence bound (1.2 s): both ends give the stale link up,
    // and its closes never complete.
    net.run_for(Duration::from_secs(2));
    assert!(
        net.links.contains_key(&(a, conn)),
        "its close was not reported"
    );
    let now = net.now;
    assert_eq!(net.node(a).peer_liveness(now, b as u8), PeerLiveness::Live);
    // Then the healthy link resets.
    let dials = net.dials_connected;
    net.close_link(a, between[1].0);
    net.run_for(Duration::from_secs(2));
    assert!(net.dials_connected > dials, "the slot was dialed again");
    let now = net.now;
    assert_eq!(net.node(a).peer_liveness(now, b as u8), PeerLiveness::Live);
    assert_eq!(net.node(b).peer_liveness(now, a as u8), PeerLiveness::Live);
}

#[test]
fn a_cut_link_shows_silent_then_down() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    net.run_for(Duration::from_secs(1));
    let other = (leader + 1) % 3;
    let slot = other as u8;
    let now = net.now;
    assert_eq!(
        net.node(leader).peer_liveness(now, slot),
        PeerLiveness::Live
    );
    assert_eq!(net.node(leader).live_peers(now), 2);
    net.partition(leader);
    // Past the live window (5 heartbeats of 50 ms), before the bound (1.2 s).
    net.run_for(Duration::from_millis(600));
    let now = net.now;
    assert_eq!(
        net.node(leader).peer_liveness(now, slot),
        PeerLiveness::Silent
    );
    assert_eq!(net.node(leader).live_peers(now), 0);
    // The connections still exist: the old status line counted them.
    assert!(net.node(leader).stats().peers_established > 0);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    assert_eq!(
        net.node(leader).peer_liveness(now, slot),
        PeerLiveness::Down
    );
}

#[test]
fn a_live_link_is_never_closed_by_the_silence_rule() {
    let mut net = ClusterNet::new();
    net.elect();
    net.run_for(Duration::from_secs(1));
    for i in 0..3 {
        net.outputs(i).logs.clear();
    }
    let dials_before = net.dials_connected;
    // Ten minutes with no client traffic: heartbeats leader to followers,
    // keepalives on the follower-to-follower links.
    for _ in 0..600 {
        net.run_for(Duration::from_secs(1));
        let now = net.now;
        for i in 0..3 {
            assert_eq!(net.node(i).live_peers(now), 2, "node {i} at {now:?}");
        }
    }
    assert_eq!(net.dials_connected, dials_before, "no link was redialed");
    for i in 0..3 {
        let closes: Vec<_> = net
            .outputs(i)
            .logs
            .drain(..)
            .filter(|e| matches!(e, LogEvent::Closed { .. }))
            .collect();
        assert!(closes.is_empty(), "node {i} closed {closes:?}");
    }
}

#[test]
fn a_healed_partition_rejoins_within_3_s_with_the_production_timing() {
    // Silence bound 5 s, election timeout 2.4-2.5 s, heartbeat 100 ms.
    for cut_s in [5, 30, 60] {
        let mut net = ClusterNet::with_config(|c| {
            c.raft = RaftConfig::default();
            c.peer_silence_timeout = default_peer_silence_timeout(&c.raft);
        });
        let took = rejoin_after_cut(&mut net, Duration::from_secs(cut_s), Duration::from_secs(3));
        eprintln!(
            "production timing, cut {cut_s} s: every node follows the leader {took:?} after the heal"
        );
        assert!(took.is_some(), "cut {cut_s} s: not rejoined within 3 s");
    }
}

// ---------------------------------------------------------------------
// The line dialect in cluster mode
// ---------------------------------------------------------------------

const ADDRESSES: [&str; 3] = ["10.0.0.1:5225", "10.0.0.2:5225", "10.0.0.3:5225"];

fn with_addresses(config: &mut ClusterConfig) {
    config.client_addresses = ADDRESSES.iter().map(|a| Box::from(*a)).collect();
}

fn line_acquire(wait_s: u16, lease_s: u16, owner: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_acquire(&mut out, wait_s, lease_s, owner, key.as_bytes());
    out
}

fn line_release(token: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_release(&mut out, token, key.as_bytes());
    out
}

fn leader_line(slot: usize) -> (u8, u64, Vec<u8>) {
    (b'L', 0, ADDRESSES[slot].as_bytes().to_vec())
}

fn e_line(reason: &str) -> (u8, u64, Vec<u8>) {
    (b'E', 0, reason.as_bytes().to_vec())
}

#[test]
fn a_line_client_is_told_the_leader_address_at_once_and_on_every_change() {
    let mut net = ClusterNet::with_config(with_addresses);
    // No leader yet: nothing is announced.
    let early = net.connect_line(0);
    assert!(net.clients[early].lines.is_empty());
    let leader = net.elect();
    assert_eq!(net.clients[early].lines, vec![leader_line(leader)]);
    let follower = (leader + 1) % 3;
    let c = net.connect_line(follower);
    assert_eq!(net.clients[c].lines, vec![leader_line(leader)]);
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    // The leader change shows as L lines only (no M without a request),
    // the last one naming the new leader.
    let lines = &net.clients[c].lines;
    assert!(lines.iter().all(|l| l.0 == b'L'), "{lines:?}");
    assert_eq!(lines.last(), Some(&leader_line(new_leader)));
}

#[test]
fn a_follower_answers_a_line_request_with_m_and_the_leader_address_and_no_effect() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let c = net.connect_line(follower);
    net.clients[c].lines.clear();
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(
        net.clients[c].lines,
        vec![(b'M', 0, ADDRESSES[leader].as_bytes().to_vec())]
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0, "no effect");
}

#[test]
fn without_a_leader_a_line_request_gets_no_leader() {
    let mut net = ClusterNet::with_config(with_addresses);
    let c = net.connect_line(1);
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.settle();
    assert_eq!(net.clients[c].lines, vec![e_line("no_leader")]);
}

#[test]
fn a_cluster_without_client_addresses_answers_no_leader_instead_of_m() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect_line((leader + 1) % 3);
    assert!(net.clients[c].lines.is_empty(), "no address, no L");
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.clients[c].lines, vec![e_line("no_leader")]);
}

#[test]
fn the_leader_grants_a_line_client_after_commit_and_hands_over_to_v3() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let line = net.connect_line(leader);
    let v3 = net.connect(leader);
    net.clients[line].lines.clear();
    net.send_bytes(line, &line_acquire(5, 30, 0x0A0A, "shared"));
    net.run_for(Duration::from_millis(200));
    let token = match &net.clients[line].lines[..] {
        [(b'A', token, key)] if key == b"shared" => *token,
        other => panic!("{other:?}"),
    };
    assert!(token >= BOOT_US);
    net.send_only(v3, acquire(1, "shared", 10, 30));
    net.run_for(Duration::from_millis(200));
    assert!(net.answers(v3).is_empty(), "queued behind the line holder");
    net.send_bytes(line, &line_release(token, "shared"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(
        net.clients[line].lines[1],
        (b'R', token, b"shared".to_vec())
    );
    match net.answers(v3)[..] {
        [Reply::Acquired { rid: 1, token: t }] => assert!(t > token),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn lost_leadership_closes_a_line_connection_whose_outcome_is_unknown() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let c1 = net.connect_line(leader);
    let c2 = net.connect_line(leader);
    net.send_bytes(c1, &line_acquire(0, 60, 1, "held"));
    net.run_for(Duration::from_millis(200));
    net.send_bytes(c2, &line_acquire(30, 60, 2, "held"));
    net.settle();
    for i in 0..3 {
        if i != leader {
            net.kill(i);
        }
    }
    // Proposed, never committed: the line dialect cannot say "unknown".
    net.send_bytes(c1, &line_acquire(0, 60, 3, "new"));
    net.run_for(Duration::from_secs(2));
    assert!(!net.node(leader).is_leader(), "check-quorum stepped down");
    assert!(net.clients[c1].closed, "closed: the client resends");
    let new_replies: Vec<_> = net.clients[c1]
        .lines
        .iter()
        .filter(|l| l.0 != b'L')
        .collect();
    assert_eq!(
        new_replies.len(),
        1,
        "only the first grant: {new_replies:?}"
    );
    // The queued request had no effect: told so, in the line's words.
    assert!(
        net.clients[c2].lines.contains(&e_line("no_leader")),
        "{:?}",
        net.clients[c2].lines
    );
}

#[test]
fn a_new_generation_answers_a_line_request_not_active() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let id = NodeId::new(victim as u8, 2);
    let mut config = config(id);
    with_addresses(&mut config);
    net.nodes[victim] = Some(ClusterNode::join(config, 99, net.now));
    let c = net.connect_line(victim);
    net.clients[c].lines.clear();
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.settle();
    assert_eq!(net.clients[c].lines, vec![e_line("not_active")]);
}

#[test]
fn shutdown_tells_line_clients_not_active() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let holder = net.connect(leader);
    let waiter = net.connect_line(leader);
    token_of(net.request(holder, acquire(1, "k", 0, 60)));
    net.clients[waiter].lines.clear();
    net.send_bytes(waiter, &line_acquire(30, 60, 2, "k"));
    net.run_for(Duration::from_millis(200));
    let now = net.now;
    net.node(leader).begin_shutdown(now);
    net.settle();
    let lines = &net.clients[waiter].lines;
    assert!(
        lines.iter().all(|l| *l == e_line("not_active")),
        "{lines:?}"
    );
    assert!(!lines.is_empty());
    assert!(net.clients[waiter].closed);
}

#[test]
fn a_shutting_down_leader_is_quiesced_once_its_clients_are_closed_and_it_no_longer_leads() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let client = net.connect(leader);
    token_of(net.request(client, acquire(1, "k", 0, 60)));
    assert!(!net.node(leader).quiesced(), "it leads and has a client");
    let now = net.now;
    net.node(leader).begin_shutdown(now);
    net.settle();
    assert!(net.clients[client].closed);
    net.run_for(Duration::from_secs(2));
    let node = net.node(leader);
    assert!(!node.is_leader(), "leadership was handed over");
    assert!(node.quiesced());
    assert_eq!(Machine::node_id(node), Some(node.id()));
}

#[test]
fn client_addresses_are_validated() {
    let mut config = config(NodeId::new(0, 1));
    config.client_addresses = vec![Box::from("a:1"), Box::from("b:1")];
    assert!(config.validate().is_err(), "every slot or none");
    config.client_addresses = vec![Box::from("a:1"), Box::from("b\n:1"), Box::from("c:1")];
    assert!(config.validate().is_err(), "no LF");
    with_addresses(&mut config);
    assert!(config.validate().is_ok());
}

#[test]
fn line_sessions_survive_a_rejoin_and_are_counted_down_once() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
    let mut config = config(NodeId::new(victim as u8, 1));
    with_addresses(&mut config);
    net.nodes[victim] = Some(ClusterNode::bootstrap(
        config,
        voters,
        REJOIN_GENERATION,
        42,
        net.now,
    ));
    let line = net.connect_line(victim);
    let v3 = net.connect(victim);
    assert_eq!(net.node(victim).metrics().line_sessions, 1);
    // The leader's heartbeats show a running cluster: a new generation.
    net.run_for(Duration::from_millis(500));
    assert_eq!(
        net.node(victim).id(),
        NodeId::new(victim as u8, REJOIN_GENERATION)
    );
    let metrics = net.node(victim).metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (2, 1));
    let now = net.now;
    for c in [line, v3] {
        let conn = net.clients[c].conn;
        net.node(victim).handle_closed(now, conn);
    }
    let metrics = net.node(victim).metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (0, 0));
}

// ----------------------------------------------------------------------
// Operations: force-release, inspection, metrics (issue 12)
// ----------------------------------------------------------------------

use ticketing_core::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, ListingCursor, NotLeader,
};

const ADMIN: [&str; 3] = ["10.0.0.1:9225", "10.0.0.2:9225", "10.0.0.3:9225"];

fn with_admin_addresses(config: &mut ClusterConfig) {
    config.admin_addresses = ADMIN.iter().map(|a| Box::from(*a)).collect();
}

fn key(k: &str) -> Key {
    Key::new(k.as_bytes()).unwrap()
}

fn force(k: &str, token: Option<u64>) -> ForceRelease {
    ForceRelease { key: key(k), token }
}

#[test]
fn a_force_release_is_answered_after_commit_and_hands_over_with_a_larger_token() {
    let (mut net, leader, c1, c2, first) = holder_and_waiter();

    net.force_release(leader, 7, force("k", None));
    // Proposed only: no answer, no effect on any replica yet.
    assert!(net.admin_replies(leader).is_empty());
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(first));
    }
    net.run_for(Duration::from_millis(100));
    let second = token_of(net.answers(c2)[0]);
    assert!(second > first, "{second} > {first}");
    // Answered once the hand-over's Grant applied too, naming its token.
    assert_eq!(
        net.admin_replies(leader),
        vec![(
            AdminRequestId(7),
            ForceReleaseOutcome::Released {
                revoked: first,
                keys: vec![key("k")],
                handed_to: Some(second),
            }
        )]
    );
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(second), "node {i}");
        assert_eq!(net.node(i).metrics().locks.force_releases, 1, "node {i}");
        assert_eq!(net.node(i).metrics().locks.releases, 1, "node {i}");
    }
    // The leader handed the keys over, as a release would have.
    assert_eq!(net.node(leader).metrics().release_handovers, 1);
    // The old holder is fenced: its release gets N, the new one's R.
    assert_eq!(
        net.request(c1, release(2, "k", first)),
        Reply::NotFound { rid: 2 }
    );
    assert_eq!(
        net.request(c2, release(2, "k", second)),
        Reply::Released { rid: 2 }
    );
}

#[test]
fn a_force_release_with_the_followers_cut_off_has_no_effect_and_ends_indeterminate() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.partition(leader);
    net.force_release(leader, 1, force("k", Some(first)));
    // Less than an election timeout: the leader still leads, nothing
    // committed, nothing changed anywhere.
    net.run_for(Duration::from_millis(150));
    assert!(net.node(leader).is_leader());
    assert!(net.admin_replies(leader).is_empty());
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(first), "node {i}");
    }
    // Check-quorum deposes it before the entry was seen applied.
    net.run_for(Duration::from_secs(2));
    assert!(!net.node(leader).is_leader());
    assert_eq!(
        net.admin_replies(leader),
        vec![(AdminRequestId(1), ForceReleaseOutcome::Indeterminate)]
    );
    // The log decides: the majority never had the entry, so the grant holds.
    let new_leader = net.leader().expect("the majority elected a leader");
    assert_ne!(new_leader, leader);
    assert_eq!(net.holder_token(new_leader, "k"), Some(first));
    net.heal();
    net.run_for(Duration::from_secs(3));
    assert!(net.all_follow_the_leader());
    for i in 0..3 {
        assert_eq!(net.holder_token(i, "k"), Some(first), "node {i}");
        assert_eq!(net.node(i).metrics().locks.force_releases, 0);
    }
}

#[test]
fn a_committed_force_release_survives_a_leader_change() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.force_release(leader, 3, force("k", None));
    net.run_for(Duration::from_millis(100));
    assert!(matches!(
        net.admin_replies(leader)[..],
        [(AdminRequestId(3), ForceReleaseOutcome::Released { revoked, .. })] if revoked == first
    ));
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    assert_eq!(net.holder_token(new_leader, "k"), None, "applied there too");
    let c2 = net.connect(new_leader);
    assert_eq!(
        net.request(c2, release(1, "k", first)),
        Reply::NotFound { rid: 1 }
    );
    let second = token_of(net.request(c2, acquire(2, "k", 0, 60)));
    assert!(second > first);
}

#[test]
fn a_force_release_names_the_holder_on_a_token_mismatch_and_reports_a_free_key() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.force_release(leader, 1, force("k", Some(first - 1)));
    net.force_release(leader, 2, force("free", None));
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        net.admin_replies(leader),
        vec![
            (
                AdminRequestId(1),
                ForceReleaseOutcome::TokenMismatch { held: first }
            ),
            (AdminRequestId(2), ForceReleaseOutcome::NotHeld),
        ]
    );
    assert_eq!(
        net.holder_token(leader, "k"),
        Some(first),
        "nothing changed"
    );
    assert_eq!(
        net.request(c1, release(2, "k", first)),
        Reply::Released { rid: 2 }
    );
}

#[test]
fn a_force_release_of_a_set_member_releases_the_whole_set() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let set = KeyGroup::new(vec![key("a"), key("b")]).unwrap();
    let token = token_of(net.request(
        c1,
        Request::Acquire(AcquireRequest {
            rid: 1,
            wait_s: 0,
            lease_s: 60,
            keys: set,
            set: true,
        }),
    ));
    net.force_release(leader, 1, force("b", Some(token)));
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        net.admin_replies(leader),
        vec![(
            AdminRequestId(1),
            ForceReleaseOutcome::Released {
                revoked: token,
                keys: vec![key("a"), key("b")],
                handed_to: None,
            }
        )]
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0);
}

#[test]
fn a_follower_answers_force_release_and_inspection_with_the_leader() {
    let mut net = ClusterNet::with_config(with_admin_addresses);
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let c = net.connect(leader);
    let token = token_of(net.request(c, acquire(1, "k", 0, 60)));
    net.force_release(follower, 9, force("k", None));
    assert_eq!(
        net.admin_replies(follower),
        vec![(
            AdminRequestId(9),
            ForceReleaseOutcome::NotLeader {
                leader_slot: Some(leader as u8)
            }
        )],
        "at once, without proposing"
    );
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.holder_token(leader, "k"), Some(token));
    let expected = NotLeader {
        leader_slot: Some(leader as u8),
        leader_admin: Some(Box::from(ADMIN[leader])),
    };
    let now = net.now;
    assert_eq!(
        net.node(follower).lock(now, &key("k")),
        Err(expected.clone())
    );
    assert_eq!(
        net.node(follower).locks(now, b"", 10, ListingCursor::START),
        Err(expected)
    );
    assert_eq!(
        net.node(follower).admin_address(leader as u8),
        Some(ADMIN[leader])
    );
    // With no leader known there is nobody to point at.
    for i in 0..3 {
        if i != follower {
            net.kill(i);
        }
    }
    net.run_for(Duration::from_secs(2));
    let now = net.now;
    assert_eq!(
        net.node(follower).lock(now, &key("k")),
        Err(NotLeader {
            leader_slot: None,
            leader_admin: None
        })
    );
    net.force_release(follower, 10, force("k", None));
    assert_eq!(
        net.admin_replies(follower),
        vec![(
            AdminRequestId(10),
            ForceReleaseOutcome::NotLeader { leader_slot: None }
        )]
    );
}

#[test]
fn admin_addresses_are_validated() {
    let mut config = config(NodeId::new(0, 1));
    config.admin_addresses = vec![Box::from("a:1")];
    assert_eq!(
        config.validate(),
        Err("admin_addresses must name every slot, or none")
    );
    config.admin_addresses = vec![Box::from("a:1"), Box::from(""), Box::from("c:1")];
    assert!(config.validate().is_err());
    config.admin_addresses = ADMIN.iter().map(|a| Box::from(*a)).collect();
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn inspection_on_the_leader_lists_the_holder_and_waiters_in_fifo_order_with_ages() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let c3 = net.connect(leader);
    let sent_at = net.now;
    let token = token_of(net.request(c1, acquire(1, "orders/42", 0, 30)));
    let replied_by = net.now;
    net.send_only(c2, acquire(1, "orders/42", 20, 30));
    let c2_at = net.now;
    net.run_for(Duration::from_millis(500));
    net.send_only(c3, acquire(1, "orders/42", 10, 30));
    let c3_at = net.now;
    net.run_for(Duration::from_millis(100));
    // Jump the clock: ages and remaining times are computed at `now`.
    let now = net.now.saturating_add(Duration::from_secs(4));
    let view = net
        .node(leader)
        .lock(now, &key("orders/42"))
        .unwrap()
        .expect("held");
    let holder = view.holder.expect("a holder");
    assert_eq!(holder.token, token);
    assert_eq!(holder.keys, vec![key("orders/42")]);
    let ms = |from: Instant| (now.saturating_duration_since(from).as_micros() / 1_000) as u64;
    // The leader's clock started the hold when it applied the grant:
    // after the acquire was sent, before the client had its reply.
    assert!(holder.held_ms <= ms(sent_at) && holder.held_ms >= ms(replied_by));
    assert_eq!(holder.held_ms + holder.lease_remaining_ms, 30_000);
    let conn = holder
        .conn
        .expect("granted by this leader to a live connection");
    assert_eq!(conn.conn, net.clients[c1].conn);
    assert_eq!(conn.source, LOOPBACK);
    assert_eq!(view.waiters_total, 2);
    let ages: Vec<u64> = view.waiters.iter().map(|w| w.waited_ms).collect();
    assert_eq!(ages, vec![ms(c2_at), ms(c3_at)], "FIFO, oldest first");
    assert_eq!(
        view.waiters[0].conn.as_ref().map(|c| c.conn),
        Some(net.clients[c2].conn)
    );
    // `T` comes a margin (100 ms) before the wait runs out.
    assert_eq!(
        view.waiters[0].waited_ms + view.waiters[0].wait_remaining_ms,
        19_900
    );
    assert_eq!(
        view.waiters[1].waited_ms + view.waiters[1].wait_remaining_ms,
        9_900
    );
    // Listing by prefix, ascending, truncated at the limit.
    let c4 = net.connect(leader);
    token_of(net.request(c4, acquire(1, "orders/7", 0, 30)));
    token_of(net.request(c4, acquire(2, "other", 0, 30)));
    let now = net.now;
    let listing = net
        .node(leader)
        .locks(now, b"orders/", 10, ListingCursor::START)
        .unwrap();
    let listed: Vec<&str> = listing.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(listed, vec!["orders/42", "orders/7"], "one page, ascending");
    assert_eq!(listing.next, None);
    // A limit of one pages through every key once.
    let mut cursor = Some(ListingCursor::START);
    let mut paged = Vec::new();
    while let Some(at) = cursor {
        let page = net.node(leader).locks(now, b"", 1, at).unwrap();
        assert!(page.locks.len() <= 1);
        paged.extend(page.locks.into_iter().map(|l| l.key.as_str().to_owned()));
        cursor = page.next;
    }
    paged.sort();
    assert_eq!(paged, vec!["orders/42", "orders/7", "other"]);
    assert_eq!(net.node(leader).lock(now, &key("free")), Ok(None));
}

#[test]
fn cluster_metrics_move_exactly_as_the_events_they_count() {
    let mut net = ClusterNet::with_config(|config| config.limits.waiters_per_key_max = 1);
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let c3 = net.connect(leader);
    let before = net.node(leader).metrics();
    assert_eq!(before.wait.count(), 0);

    // A grant: one wait observation and one commit latency more.
    let t1 = token_of(net.request(c1, acquire(1, "k", 0, 1)));
    let m = net.node(leader).metrics();
    assert_eq!(m.wait.count(), 1);
    let latency_after_grant = m.commit_latency.count();
    assert_eq!(
        latency_after_grant,
        before.commit_latency.count() + 1,
        "the Grant"
    );
    // A queued waiter, and a second one over the per-key limit: B.
    net.send_only(c2, acquire(1, "k", 10, 60));
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        net.request(c3, acquire(1, "k", 10, 60)),
        Reply::Busy { rid: 1 }
    );
    let m = net.node(leader).metrics();
    assert_eq!(m.busy.waiters_per_key_max, 1);
    assert_eq!(
        m.busy.waiters_total_max + m.busy.keys_max + m.busy_per_connection,
        0
    );
    // The lease runs out with a waiter: handed over.
    net.run_for(Duration::from_millis(1_100));
    let t2 = token_of(net.answers(c2)[0]);
    assert!(t2 > t1);
    let m = net.node(leader).metrics();
    assert_eq!((m.expiries_handed_over, m.expiries_not_handed_over), (1, 0));
    assert_eq!(m.wait.count(), 2);
    // A release with nobody waiting: no hand-over.
    assert_eq!(
        net.request(c2, release(2, "k", t2)),
        Reply::Released { rid: 2 }
    );
    assert_eq!(net.node(leader).metrics().release_handovers, 0);
    // A release with a waiter: one hand-over.
    let t3 = token_of(net.request(c1, acquire(2, "k", 0, 60)));
    net.send_only(c3, acquire(2, "k", 10, 60));
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        net.request(c1, release(3, "k", t3)),
        Reply::Released { rid: 3 }
    );
    let t4 = token_of(net.answers(c3)[1]);
    let m = net.node(leader).metrics();
    assert_eq!(m.release_handovers, 1);
    assert_eq!(m.wait.count(), 4);
    // A lease running out with nobody waiting.
    assert_eq!(
        net.request(c3, release(3, "k", t4)),
        Reply::Released { rid: 3 }
    );
    token_of(net.request(c1, acquire(4, "short", 0, 1)));
    net.run_for(Duration::from_millis(1_200));
    let m = net.node(leader).metrics();
    assert_eq!((m.expiries_handed_over, m.expiries_not_handed_over), (1, 1));
    assert_eq!(m.locks.expiries, 2);
    // Followers count applied commands, not the leader's hand-overs.
    let follower = net.node((leader + 1) % 3).metrics();
    assert_eq!(follower.locks.expiries, 2);
    assert_eq!(
        follower.expiries_handed_over + follower.expiries_not_handed_over,
        0
    );
    assert!(m.generation == 1 && m.is_leader);
}

#[test]
fn a_listing_shows_the_front_of_each_queue_and_one_key_shows_all() {
    use ticketing_core::inspect::WAITERS_PER_LISTED_LOCK_MAX;
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let holder = net.connect(leader);
    let waiters = net.connect(leader);
    token_of(net.request(holder, acquire(1, "q", 0, 60)));
    let queued = WAITERS_PER_LISTED_LOCK_MAX as u64 + 2;
    for rid in 1..=queued {
        net.send_only(waiters, acquire(rid, "q", 30, 60));
    }
    net.run_for(Duration::from_millis(100));
    let now = net.now;
    let listing = net
        .node(leader)
        .locks(now, b"q", 10, ListingCursor::START)
        .unwrap();
    assert_eq!(listing.locks[0].waiters.len(), WAITERS_PER_LISTED_LOCK_MAX);
    assert_eq!(listing.locks[0].waiters_total as u64, queued);
    let view = net.node(leader).lock(now, &key("q")).unwrap().unwrap();
    assert_eq!(view.waiters.len() as u64, queued);
}

#[test]
fn busy_is_counted_by_the_limit_that_answered_it() {
    let mut net = ClusterNet::with_config(|config| {
        config.limits.keys_max = 2;
        config.limits.waiters_total_max = 1;
    });
    let leader = net.elect();
    let c = net.connect(leader);
    token_of(net.request(c, acquire(1, "a", 0, 60)));
    token_of(net.request(c, acquire(2, "b", 0, 60)));
    // A third key does not fit the table.
    assert_eq!(
        net.request(c, acquire(3, "c", 0, 60)),
        Reply::Busy { rid: 3 }
    );
    let m = net.node(leader).metrics();
    assert_eq!((m.busy.keys_max, m.busy.waiters_total_max), (1, 0));
    // One waiter fits, the second does not.
    net.send_only(c, acquire(4, "a", 30, 60));
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        net.request(c, acquire(5, "b", 30, 60)),
        Reply::Busy { rid: 5 }
    );
    let m = net.node(leader).metrics();
    assert_eq!((m.busy.keys_max, m.busy.waiters_total_max), (1, 1));
    assert_eq!(
        m.busy.waiters_per_key_max + m.busy.token_reserve + m.busy_per_connection,
        0
    );
    assert_eq!(m.busy_backpressure, 0);
}

/// Every node event queued on node `i` so far.
fn drain_events(net: &mut ClusterNet, i: usize) -> Vec<NodeEvent> {
    net.outputs(i).node_events.drain(..).collect()
}

#[test]
fn an_election_yields_exactly_one_leader_changed_event_on_each_node() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    assert!(net.all_follow_the_leader());
    let leader_id = net.node(leader).id();
    for i in 0..3 {
        let term = net.node(i).raft().term();
        // Bootstrap members start as voters: the leader is the only news.
        assert_eq!(
            drain_events(&mut net, i),
            vec![NodeEvent::LeaderChanged {
                leader: Some(leader_id),
                term
            }],
            "node {i}"
        );
    }
    // Nothing changes while the leader stays: no more events.
    net.run_for(Duration::from_secs(2));
    for i in 0..3 {
        assert_eq!(drain_events(&mut net, i), Vec::new(), "node {i}");
    }
}

#[test]
fn a_killed_leader_is_reported_replaced_on_the_survivors() {
    let mut net = ClusterNet::new();
    let old = net.elect();
    for i in 0..3 {
        drain_events(&mut net, i);
    }
    net.kill(old);
    net.run_for(Duration::from_secs(3));
    let new = net.leader().expect("the survivors elect a leader");
    let new_id = net.node(new).id();
    for i in (0..3).filter(|&i| i != old) {
        let leaders: Vec<Option<NodeId>> = drain_events(&mut net, i)
            .into_iter()
            .map(|event| match event {
                NodeEvent::LeaderChanged { leader, .. } => leader,
                other => panic!("node {i}: unexpected {other:?}"),
            })
            .collect();
        // Possibly "none known" in between, the new leader last.
        assert_eq!(leaders.last(), Some(&Some(new_id)), "node {i}: {leaders:?}");
        assert!(leaders.len() <= 2, "node {i}: {leaders:?}");
    }
}

#[test]
fn a_bootstrap_member_that_rejoins_reports_its_new_generation_once() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
    net.nodes[victim] = Some(ClusterNode::bootstrap(
        config(NodeId::new(victim as u8, 1)),
        voters,
        REJOIN_GENERATION,
        42,
        net.now,
    ));
    net.run_for(Duration::from_millis(500));
    assert_eq!(net.node(victim).id().generation, REJOIN_GENERATION);
    assert!(net.node(victim).raft().is_voter());
    let leader_id = net.node(leader).id();
    let term = net.node(leader).raft().term();
    // The fresh joining Raft is a learner until the leader promotes it.
    assert_eq!(
        drain_events(&mut net, victim),
        vec![
            NodeEvent::GenerationChanged {
                generation: REJOIN_GENERATION
            },
            NodeEvent::VoterChanged { is_voter: false },
            NodeEvent::LeaderChanged {
                leader: Some(leader_id),
                term
            },
            NodeEvent::VoterChanged { is_voter: true },
        ]
    );
    net.run_for(Duration::from_secs(3));
    assert_eq!(drain_events(&mut net, victim), Vec::new());
}

#[test]
fn a_learner_promoted_to_voter_reports_voter_changed_true() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let leader_id = net.node(leader).id();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let id = NodeId::new(victim as u8, 2);
    net.nodes[victim] = Some(ClusterNode::join(config(id), 99, net.now));
    assert!(!net.node(victim).raft().is_voter());
    assert_eq!(drain_events(&mut net, victim), Vec::new());
    net.run_for(Duration::from_secs(3));
    assert!(net.node(victim).raft().is_voter());
    let events = drain_events(&mut net, victim);
    let voter_changes: Vec<&NodeEvent> = events
        .iter()
        .filter(|e| matches!(e, NodeEvent::VoterChanged { .. }))
        .collect();
    assert_eq!(
        voter_changes,
        vec![&NodeEvent::VoterChanged { is_voter: true }],
        "{events:?}"
    );
    let leaders: Vec<Option<NodeId>> = events
        .iter()
        .filter_map(|e| match e {
            NodeEvent::LeaderChanged { leader, .. } => Some(*leader),
            _ => None,
        })
        .collect();
    assert_eq!(leaders, vec![Some(leader_id)], "{events:?}");
}

#[test]
fn a_leader_lists_a_key_that_only_a_set_waiter_waits_for_once_in_its_second_phase() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let holder = net.connect(leader);
    let waiter = net.connect(leader);
    token_of(net.request(holder, acquire(1, "b", 0, 60)));
    let set = KeyGroup::new(vec![key("b"), key("d")]).unwrap();
    net.send_only(
        waiter,
        Request::Acquire(AcquireRequest {
            rid: 1,
            wait_s: 30,
            lease_s: 60,
            keys: set.clone(),
            set: true,
        }),
    );
    net.run_for(Duration::from_millis(100));
    let now = net.now;
    for limit in [1, 10] {
        let mut cursor = Some(ListingCursor::START);
        let mut seen = Vec::new();
        while let Some(at) = cursor {
            let page = net.node(leader).locks(now, b"", limit, at).unwrap();
            seen.extend(page.locks);
            cursor = page.next;
        }
        seen.sort_by(|a, b| a.key.cmp(&b.key));
        let names: Vec<&str> = seen.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(names, vec!["b", "d"], "held b once, waited-only d once");
        assert!(seen[0].holder.is_some());
        assert_eq!(seen[1].holder, None);
        assert_eq!(seen[1].waiters.len(), 1);
        assert_eq!(seen[1].waiters[0].keys, set.keys().to_vec());
    }
}

/// The index of node `i`'s latest snapshot (0 before any).
fn snapshot_index(net: &mut ClusterNet, i: usize) -> u64 {
    net.node(i).raft().snapshot_meta().map_or(0, |m| m.index)
}

/// Client `c` of the leader acquires `key` for the longest lease.
fn hold(net: &mut ClusterNet, c: usize, rid: u64, key: &str) -> u64 {
    net.send_only(c, acquire(rid, key, 0, LEASE_S_MAX));
    net.run_for(Duration::from_millis(10));
    token_of(*net.answers(c).last().expect("answered"))
}

/// Client `c` of `leader` acquires and releases "pulse" one entry at a
/// time, the state's grants changing by at most one, until the leader
/// takes its next snapshot: returns the entries applied since its previous
/// one. Asserts that every entry was one command and that no snapshot came
/// before `not_before_entries`.
fn entries_until_snapshot(
    net: &mut ClusterNet,
    leader: usize,
    c: usize,
    not_before_entries: u64,
) -> u64 {
    let base = snapshot_index(net, leader);
    let mut rid = 1_000_000;
    for _ in 0..500 {
        let before = net.node(leader).raft().applied_index();
        rid += 1;
        let token = hold(net, c, rid, "pulse");
        rid += 1;
        net.send_only(c, release(rid, "pulse", token));
        net.run_for(Duration::from_millis(10));
        assert_eq!(net.answers(c).last(), Some(&Reply::Released { rid }));
        let applied = net.node(leader).raft().applied_index();
        assert_eq!(applied, before + 2, "one entry a request");
        let snapshot = snapshot_index(net, leader);
        if snapshot != base {
            let entries = snapshot - base;
            assert!(
                entries >= not_before_entries,
                "a snapshot {entries} entries after the last"
            );
            return entries;
        }
    }
    panic!("no snapshot in 1,000 entries");
}

/// The leader snapshots every `snapshot_threshold_entries` (here 20) while
/// it holds few grants, every two entries per grant once that is more,
/// and never later than `snapshot_threshold_entries_max` (here 100): the
/// snapshot work per entry stays bounded however many keys are held.
#[test]
fn a_leader_snapshots_at_twice_its_grants_between_the_base_and_the_cap() {
    let mut net = ClusterNet::with_config(|config| {
        config.raft.snapshot_threshold_entries = 20;
        config.raft.snapshot_entries_per_state_item = 2;
        config.raft.snapshot_threshold_entries_max = 100;
    });
    let leader = net.elect();
    let c = net.connect(leader);
    let mut rid = 0;
    let mut hold_more = |net: &mut ClusterNet, grants: usize| {
        for _ in 0..grants {
            rid += 1;
            hold(net, c, rid, &format!("held/{rid}"));
        }
    };
    // A small state (3-4 grants): every 20 entries, as before.
    hold_more(&mut net, 3);
    entries_until_snapshot(&mut net, leader, c, 0);
    assert_eq!(entries_until_snapshot(&mut net, leader, c, 0), 20);
    assert_eq!(entries_until_snapshot(&mut net, leader, c, 0), 20);

    // 30-31 grants: not at 20 entries, but at twice the grants.
    hold_more(&mut net, 27);
    entries_until_snapshot(&mut net, leader, c, 0);
    let entries = entries_until_snapshot(&mut net, leader, c, 21);
    assert!((60..=62).contains(&entries), "{entries} entries");

    // 80-81 grants: at the cap, 100, not at 160.
    hold_more(&mut net, 50);
    entries_until_snapshot(&mut net, leader, c, 0);
    assert_eq!(entries_until_snapshot(&mut net, leader, c, 0), 100);
    assert_eq!(net.node(leader).raft().snapshot_threshold_entries(), 100);

    // The followers apply the same grants and follow the same rule.
    for i in (0..3).filter(|&i| i != leader) {
        net.run_for(Duration::from_millis(100));
        let raft = net.node(i).raft();
        assert_eq!(raft.snapshot_threshold_entries(), 100);
        assert!(raft.snapshot_meta().is_some(), "follower {i} snapshots too");
    }
}
