//! Randomized safety: many seeds of random partitions, drops, delays
//! (reordering), proposals, compactions, leadership transfers and node
//! replacements, then a liveness phase on a healed network.
//!
//! Checked after every input by the harness: election safety (at most one
//! leader per term), state machine safety (the same entry applied at each
//! index everywhere), leader completeness (a new leader holds every applied
//! entry), monotonic commit. Checked after every chunk: log matching.
//!
//! `RAFT_SEEDS=n` runs more seeds; a failure names its seed.

mod raft_harness;

use raft_harness::{Net, Rng, id};
use ticketing_core::raft::{ConfChange, NodeId, RaftConfig};
use ticketing_core::time::Duration;

fn run_seed(seed: u64, base: RaftConfig) {
    let mut pick = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5555);
    let n: u8 = if pick.chance(50) { 3 } else { 5 };
    let slow = base.election_timeout_min > Duration::from_secs(1);
    let cfg = RaftConfig {
        append_entries_max: 1 + pick.below(8) as usize,
        inflight_appends_max: 1 + pick.below(4) as usize,
        snapshot_threshold_entries: 10 + pick.below(50),
        snapshot_chunk_bytes: 64,
        uncommitted_entries_max: 64,
        ..base
    };
    let mut net = Net::new(n, cfg.clone(), seed);
    net.latency_min_ms = 1;
    net.latency_max_ms = 1 + pick.below(if slow { 80 } else { 30 });
    // Chunks of the run scale with the election timeout.
    let scale = if slow { 8 } else { 1 };
    let mut next_generation = 2u64;
    // (old, new) while a replacement is under way.
    let mut replacing: Option<(NodeId, NodeId)> = None;
    let mut payload = 0u32;
    let mut replacements_done = 0u32;

    // Safety phase.
    for _chunk in 0..120 {
        let roll = pick.below(100);
        net.recover();
        net.drop_percent = if pick.chance(30) { pick.below(25) } else { 0 };
        net.duplicate_percent = if pick.chance(20) { pick.below(20) } else { 0 };
        let alive = net.alive_ids();
        match roll {
            0..=29 => {}
            30..=54 => {
                let victim = alive[pick.below(alive.len() as u64) as usize];
                net.isolate(victim);
            }
            55..=74 => {
                let mut a = Vec::new();
                let mut b = Vec::new();
                for &x in &alive {
                    if pick.chance(50) {
                        a.push(x)
                    } else {
                        b.push(x)
                    }
                }
                net.partition(&[a, b]);
            }
            75..=84 => {
                if let Some(l) = net.leader() {
                    let _ = net.with(l, |r, now| r.transfer_leadership(now, None));
                }
            }
            _ => {
                // Kill a voter and start a new generation for its slot.
                // Only while the configuration is committed and all its
                // voters are up: a second failure before a replacement is
                // complete may legitimately cost the majority.
                if replacing.is_none()
                    && let Some(l) = net.leader()
                    && !net.raft(l).conf_change_pending()
                    && net
                        .raft(l)
                        .config()
                        .voters
                        .iter()
                        .all(|v| net.nodes[v].alive)
                {
                    let voters: Vec<NodeId> = net.raft(l).config().voters.iter().copied().collect();
                    let victim = voters[pick.below(voters.len() as u64) as usize];
                    net.kill(victim);
                    let new = net.join(
                        victim.slot,
                        next_generation,
                        cfg.clone(),
                        seed ^ next_generation,
                    );
                    next_generation += 1;
                    replacing = Some((victim, new));
                }
            }
        }
        // Drive the replacement the way the server would: add the new
        // generation as a learner when a leader can take it.
        if let Some((old, new)) = replacing
            && let Some(l) = net.leader()
        {
            let config = net.raft(l).config().clone();
            if !config.contains(new) {
                let _ = net.with(l, |r, now| {
                    r.propose_conf_change(now, ConfChange::AddLearner(new))
                });
            } else if !config.contains(old)
                && config.is_voter(new)
                && !net.raft(l).conf_change_pending()
            {
                replacing = None;
                replacements_done += 1;
            }
        }
        // Proposals, to whoever leads.
        for _ in 0..pick.below(8) {
            if let Some(l) = net.leader() {
                payload += 1;
                let _ = net.try_propose(l, &payload.to_be_bytes());
            }
            net.run_ms(pick.below(20));
        }
        net.run_ms((50 + pick.below(600)) * scale);
        net.check_log_matching();
    }

    // Liveness phase: heal everything; the cluster must elect a leader,
    // finish any replacement and converge.
    net.recover();
    net.run_ms(15_000 * scale);
    let leader = net.run_until_leader(20_000 * scale);
    payload += 1;
    let (index, _) = net.propose(leader, &payload.to_be_bytes());
    net.run_ms(3_000 * scale);
    net.check_log_matching();
    let members: Vec<NodeId> = net
        .raft(leader)
        .config()
        .members()
        .filter(|m| net.nodes.get(m).is_some_and(|n| n.alive))
        .collect();
    for m in &members {
        assert!(
            net.raft(*m).commit_index() >= index,
            "seed {seed}: {m:?} did not converge"
        );
    }
    net.assert_converged(&members);
    let snapshots: u64 = net.nodes.values().map(|n| n.snapshots_installed).sum();
    eprintln!(
        "seed {seed}: n={n} terms={} leaders={} snapshots_installed={snapshots} \
         replacements={replacements_done} commit={}",
        net.raft(leader).term(),
        net.leader_log.len(),
        net.raft(leader).commit_index()
    );
    let _ = id;
}

fn run_seeds(default_count: u64, base: RaftConfig) {
    let seeds: u64 = std::env::var("RAFT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_count);
    let from: u64 = std::env::var("RAFT_SEED_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for seed in from..from + seeds {
        let base = base.clone();
        let result = std::panic::catch_unwind(|| run_seed(seed, base));
        if let Err(e) = result {
            eprintln!("raft_random_safety: failing seed {seed}");
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn random_partitions_drops_and_delays_never_break_safety() {
    run_seeds(24, RaftConfig::fast());
}

#[test]
fn random_faults_with_the_default_timing_never_break_safety() {
    run_seeds(6, RaftConfig::default());
}
