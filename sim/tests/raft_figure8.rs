//! Figure 8 of the Raft paper, found by a randomized schedule rather than
//! written out: five real `Raft` nodes on core's test network
//! (`core/tests/raft_harness`, whose checks run after every input: state
//! machine safety and leader completeness among them), driven through
//! schedules biased toward what Figure 8 needs — leaders that append
//! entries a minority receives and then lose their majority, new leaders
//! elected around them, and old leaders coming back to spread their tails.
//! With the planted `CommitOlderTerm` (a leader commits an older term's
//! entry because a majority holds it) a share of the seeds breaks safety;
//! without it none does, so the schedules are fair and the catch is the
//! bug's.

#[path = "../../core/tests/raft_harness/mod.rs"]
mod raft_harness;

use raft_harness::{Net, Rng};
use std::cell::Cell;
use std::rc::Rc;

use ticketing_core::raft::{MessageBody, NodeId, RaftConfig};
use ticketing_core::testing::planted::{self, PlantedBug};

/// Seeds run per measurement.
const SEEDS: u64 = 100;

/// Rounds of one schedule.
const ROUNDS: u32 = 200;

/// Switches a core mutation on for this thread while alive.
struct Plant;

impl Plant {
    fn new(bug: PlantedBug) -> Self {
        planted::set(Some(bug));
        Plant
    }
}

impl Drop for Plant {
    fn drop(&mut self) {
        planted::set(None);
    }
}

/// One randomized schedule. Each round: a random group of two or three of
/// the five nodes can talk among themselves (sometimes the whole cluster),
/// the rest are cut off; whoever leads appends one to three entries and
/// the network runs for less than an election timeout, so the entries
/// reach only part of the group — the uncommitted tails Figure 8 is made
/// of; then the partition changes. Every few rounds the network heals
/// briefly, so a returning leader can spread an old tail.
fn run_schedule(seed: u64) {
    let mut pick = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x8888);
    // One entry per append and one append in flight: a new leader's
    // appends carry an old tail entry by entry, its no-op last, so a
    // majority can hold an older term's entry before it holds the no-op.
    let config = RaftConfig {
        append_entries_max: 1,
        inflight_appends_max: 1,
        ..RaftConfig::fast()
    };
    let mut net = Net::new(5, config, seed);
    net.latency_min_ms = 2;
    net.latency_max_ms = 2 + pick.below(20);
    // Appends lost at a rate redrawn each round (votes get through): a
    // leader elected in a lossy round may win its votes and then reach
    // almost no one with its entries, its no-op included.
    let append_loss = Rc::new(Cell::new(0u64));
    let loss = Rc::clone(&append_loss);
    let mut lose = Rng(seed ^ 0x0F1E_2D3C);
    net.filter = Some(Box::new(move |message| {
        !matches!(message.body, MessageBody::Append { .. }) || !lose.chance(loss.get())
    }));
    let mut payload = 0u32;
    for round in 0..ROUNDS {
        net.recover();
        append_loss.set([0, 80, 95, 99][pick.below(4) as usize]);
        let ids = net.ids();
        if round % 5 != 4 {
            let size = 2 + pick.below(2) as usize;
            let mut order: Vec<NodeId> = ids.clone();
            for i in (1..order.len()).rev() {
                order.swap(i, pick.below(i as u64 + 1) as usize);
            }
            // Half the time the leader is left out: its tail stays where
            // it reached, and a leader without it may be elected.
            if let Some(leader) = net.leader()
                && pick.chance(50)
            {
                order.retain(|&node| node != leader);
                order.push(leader);
            }
            let (group, rest) = order.split_at(size);
            // Sometimes the rest are cut off from each other too, so no
            // one outside the group makes progress meanwhile.
            let mut groups = vec![group.to_vec()];
            if pick.chance(50) {
                groups.extend(rest.iter().map(|&node| vec![node]));
            } else {
                groups.push(rest.to_vec());
            }
            net.partition(&groups);
        }
        // Let an election happen where it can.
        net.run_ms(200 + pick.below(700));
        if let Some(leader) = net.leader() {
            for _ in 0..1 + pick.below(3) {
                payload += 1;
                let _ = net.try_propose(leader, &payload.to_be_bytes());
            }
        }
        // Less than a heartbeat or two: the new entries are half way.
        net.run_ms(1 + pick.below(60));
    }
    net.check_log_matching();
}

/// How many of the first [`SEEDS`] schedules break a safety check: a
/// schedule that stops for anything else fails the test.
fn broken_schedules() -> u64 {
    let mut broken = 0;
    for seed in 0..SEEDS {
        let Err(panic) = std::panic::catch_unwind(|| run_schedule(seed)) else {
            continue;
        };
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
            .unwrap_or_default();
        assert!(
            [
                "leader completeness",
                "state machine safety",
                "log matching"
            ]
            .iter()
            .any(|check| message.contains(check)),
            "seed {seed} stopped for another reason: {message}"
        );
        broken += 1;
    }
    broken
}

/// The schedules alone are safe: the real commit rule survives all of
/// them.
#[test]
fn figure_8_schedules_keep_raft_safe() {
    for seed in 0..SEEDS {
        run_schedule(seed);
    }
}

/// With the commit rule's term check dropped, a share of the schedules
/// breaks state machine safety or leader completeness (31 of 100
/// measured; the floor is 15).
#[test]
fn figure_8_schedules_catch_a_commit_of_an_older_term() {
    let broken = {
        let _plant = Plant::new(PlantedBug::CommitOlderTerm);
        broken_schedules()
    };
    println!(
        "CommitOlderTerm (commit-older-term): {broken} of {SEEDS} Figure-8 schedules break Raft safety"
    );
    assert!(
        broken >= 15,
        "only {broken} of {SEEDS} schedules caught a commit of an older term"
    );
}
