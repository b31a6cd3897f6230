//! The start rule (`ClusterNode::start`): which generation a start takes
//! and where the domain's tokens start, as every driver uses it.

mod cluster_common;

use cluster_common::*;
use ticketing_core::cluster::recovery::RECOVERY_GENERATION;
use ticketing_core::cluster::{BOOTSTRAP_GENERATION, ClusterNode, StartFacts, StartMode};
use ticketing_core::raft::NodeId;
use ticketing_core::testing::net::{BOOT_US, ClusterNet, cluster_config as config};
use ticketing_core::time::{Duration, Instant};

const HOUR_US: u64 = 3_600_000_000;

fn facts(mode: StartMode, wall_clock_us: u64, floor_first_token: Option<u64>) -> StartFacts {
    StartFacts {
        mode,
        wall_clock_us,
        floor_first_token,
    }
}

/// Three nodes started by the rule with `mode`, on a test network.
fn started(mode: StartMode, wall_clock_us: u64) -> ClusterNet {
    let mut net = ClusterNet::new();
    for slot in 0..3u8 {
        let start = facts(mode, wall_clock_us, None);
        let node = ClusterNode::start(
            config(NodeId::new(slot, 99)),
            &start,
            u64::from(slot) + 11,
            Instant::ZERO,
        )
        .expect("valid configuration");
        net.nodes[usize::from(slot)] = Some(node);
    }
    net
}

#[test]
fn bootstrap_members_start_as_generation_one_with_every_slot_as_voter_and_tokens_from_the_clock() {
    let mut net = started(StartMode::Bootstrap, BOOT_US + 500);
    for slot in 0..3 {
        assert_eq!(
            net.node(slot).id(),
            NodeId::new(slot as u8, BOOTSTRAP_GENERATION)
        );
    }
    let leader = net.elect();
    let voters = &net.node(leader).raft().config().voters;
    assert_eq!(
        voters.iter().copied().collect::<Vec<_>>(),
        (0..3).map(|s| NodeId::new(s, 1)).collect::<Vec<_>>()
    );
    let c = net.connect(leader);
    let token = token_of(net.request(c, acquire(1, "k", 0, 10)));
    assert!(token >= BOOT_US + 500, "token {token}");
}

#[test]
fn a_restart_with_its_clock_stepped_back_comes_back_newer_from_its_floor_and_replaces_itself() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    // The clock went back an hour; the state file's floor did not.
    let floor = BOOT_US + 1_000;
    let start = facts(StartMode::Join, BOOT_US - HOUR_US, Some(floor));
    assert_eq!(start.generation(), floor);
    assert_eq!(start.token_floor(), floor);
    let id = NodeId::new(victim as u8, 1);
    let node = ClusterNode::start(config(id), &start, 99, net.now).expect("valid");
    assert_eq!(node.id(), NodeId::new(victim as u8, floor));
    net.nodes[victim] = Some(node);
    net.run_for(Duration::from_secs(3));
    let raft = net.node(victim).raft();
    assert!(raft.is_voter(), "config: {:?}", raft.config());
    assert!(!raft.config().contains(NodeId::new(victim as u8, 1)));
}

#[test]
fn a_joining_generation_is_above_the_bootstrap_and_recovery_generations_whatever_the_clock() {
    for wall_clock_us in [0, 1, RECOVERY_GENERATION] {
        let start = facts(StartMode::Join, wall_clock_us, None);
        assert_eq!(start.generation(), RECOVERY_GENERATION + 1);
        // A bootstrap member that finds the cluster running joins newer
        // than itself too.
        let start = facts(StartMode::Bootstrap, wall_clock_us, None);
        assert!(start.join_generation() > BOOTSTRAP_GENERATION);
    }
    // Without a state file the wall clock is the generation.
    assert_eq!(facts(StartMode::Join, BOOT_US, None).generation(), BOOT_US);
}

#[test]
fn a_recovery_starts_in_the_recovery_generation_with_tokens_above_its_floor_not_its_clock() {
    let token_floor = BOOT_US + 2 * HOUR_US;
    let mode = StartMode::Recover { token_floor };
    let start = facts(mode, BOOT_US, Some(BOOT_US + 7));
    assert_eq!(start.generation(), RECOVERY_GENERATION);
    assert_eq!(start.token_floor(), token_floor);
    assert!(start.join_generation() >= token_floor);
    let mut net = started(mode, BOOT_US);
    for slot in 0..3 {
        assert_eq!(
            net.node(slot).id(),
            NodeId::new(slot as u8, RECOVERY_GENERATION)
        );
    }
    let leader = net.elect();
    // A recovered leader initialises the counter only once it heard the
    // floors of every slot but one; none is stored here, so give it time.
    net.run_for(Duration::from_secs(1));
    let c = net.connect(leader);
    let token = token_of(net.request(c, acquire(1, "k", 0, 10)));
    assert!(token >= token_floor, "token {token} below {token_floor}");
}

#[test]
fn an_invalid_configuration_is_refused_with_its_reason_instead_of_starting() {
    let mut bad = config(NodeId::new(0, 1));
    bad.peer_silence_timeout = Duration::ZERO;
    let refused = ClusterNode::start(
        bad,
        &facts(StartMode::Join, BOOT_US, None),
        1,
        Instant::ZERO,
    );
    let reason = refused.expect_err("refused");
    assert!(reason.contains("peer_silence_timeout"), "reason: {reason}");
}
