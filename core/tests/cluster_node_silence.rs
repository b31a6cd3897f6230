//! Cluster nodes on the test network: silent peer links (a cut link
//! shows silent then down, is closed and redialed; a live one never is).

use ticketing_core::budget::{CloseReason, LogEvent};
use ticketing_core::cluster::{PeerLiveness, default_peer_silence_timeout};
use ticketing_core::raft::RaftConfig;
use ticketing_core::server::ConnId;
use ticketing_core::testing::net::{ClusterNet, Endpoint};
use ticketing_core::time::Duration;

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
