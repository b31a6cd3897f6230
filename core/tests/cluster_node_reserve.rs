//! Cluster nodes on the test network: the token reserve (no grant above
//! what was made durable) and peer frames with impossible numbers.

mod cluster_common;

use cluster_common::*;
use ticketing_core::cluster::ClusterNode;
use ticketing_core::machine::Machine;
use ticketing_core::raft::NodeId;
use ticketing_core::server::ConnState;
use ticketing_core::testing::net::{
    BOOT_US, ClusterNet, REJOIN_GENERATION, cluster_config as config,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::Reply;

// ---------------------------------------------------------------------------
// The token reserve: no token above what the driver made durable
// ---------------------------------------------------------------------------

#[test]
fn a_leader_proposes_no_grant_above_its_durable_reserve() {
    let mut net = ClusterNet::with_reserves(1_000);
    net.hold_reserve_writes = true;
    let leader = net.elect();
    // The followers' writes land (they append only what their durable
    // reserve covers); the leader's stay held.
    net.hold_reserve_writes_of = Some(leader);
    net.run_for(Duration::from_millis(10));
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
    net.hold_reserve_writes_of = Some(leader);
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

/// Every token the entries in a follower's log could allocate (one per
/// entry past the applied counter) is covered by its durable reserve, also
/// while its writes stall: the Appends it cannot cover are dropped, and
/// the cluster commits with the other follower meanwhile. This is what
/// makes a surviving state file evidence for a recovery.
#[test]
fn a_follower_appends_nothing_its_durable_reserve_does_not_cover() {
    // A step of 4: every few grants need a new write.
    let mut net = ClusterNet::with_reserves(4);
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let c = net.connect(leader);
    token_of(net.request(c, acquire(1, "warm", 0, 60)));
    net.hold_reserve_writes = true;
    net.hold_reserve_writes_of = Some(follower);
    let covered = |net: &ClusterNet| {
        let node = net.nodes[follower].as_ref().unwrap();
        let raft = node.raft();
        let bound = node.lock_state().next_token() + (raft.last_index() - raft.applied_index());
        (bound, net.durable[follower].unwrap())
    };
    let mut tokens = Vec::new();
    for rid in 10..40 {
        tokens.push(token_of(
            net.request(c, acquire(rid, &format!("k{rid}"), 0, 60)),
        ));
        let (bound, durable) = covered(&net);
        assert!(
            bound <= durable,
            "log bound {bound} above durable {durable}"
        );
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let stalled = net.node(follower).stats().appends_uncovered;
    assert!(stalled > 0, "the follower never had to drop an Append");
    assert_eq!(
        net.node(follower).metrics().appends_uncovered,
        stalled,
        "operators see the same count"
    );
    assert!(
        net.node(follower).raft().last_index() < net.node(leader).raft().last_index(),
        "the stalled follower is behind"
    );
    // Once its writes land it catches up.
    net.hold_reserve_writes = false;
    net.run_for(Duration::from_millis(500));
    assert_eq!(
        net.node(follower).raft().last_index(),
        net.node(leader).raft().last_index()
    );
    let (bound, durable) = covered(&net);
    assert!(bound <= durable);
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

/// A hostile peer: a Heartbeat with term `u64::MAX`, then acknowledgements with
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
