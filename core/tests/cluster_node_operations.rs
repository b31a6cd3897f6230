//! Cluster nodes on the test network: operations (force-release,
//! inspection, metrics, node events, snapshots).

mod cluster_common;

use cluster_common::*;
use ticketing_core::cluster::{ClusterConfig, ClusterNode, NodeEvent};
use ticketing_core::raft::NodeId;
use ticketing_core::testing::net::{
    ClusterNet, LOOPBACK, REJOIN_GENERATION, cluster_config as config,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, LEASE_S_MAX, Reply, Request};

// ----------------------------------------------------------------------
// Operations: force-release, inspection, metrics
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
