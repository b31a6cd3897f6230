//! Assembly of a cluster node's metrics snapshot
//! ([`crate::metrics::ClusterMetrics`]) from Raft, the replicated lock state
//! and the node's counts.

use crate::budget::AbuseCounts;
use crate::cluster::state::ReplicatedLocks;
use crate::metrics::{ClusterMetrics, PeerReplication, PushCounts, ReplyCounts};
use crate::raft::Raft;

/// Assembles a cluster node's snapshot from its parts
/// ([`crate::cluster::ClusterNode::metrics`]).
#[expect(
    clippy::too_many_arguments,
    reason = "the node's private parts, passed one by one so the node file keeps one call"
)]
pub(crate) fn cluster_metrics(
    raft: &Raft,
    state: &ReplicatedLocks,
    applied_index: u64,
    replies: ReplyCounts,
    abuse: AbuseCounts,
    checking_genesis: bool,
    (waiters, sessions, line_sessions): (usize, usize, usize),
    shutting_down: bool,
) -> ClusterMetrics {
    let id = raft.id();
    let last_index = raft.last_index();
    let peers = if raft.is_leader() {
        raft.config()
            .members()
            .filter(|&member| member != id)
            .filter_map(|member| {
                let matched = raft.match_index(member)?;
                Some(PeerReplication {
                    slot: member.slot,
                    generation: member.generation,
                    lag_entries: last_index.saturating_sub(matched),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    ClusterMetrics {
        slot: id.slot,
        generation: id.generation,
        is_leader: raft.is_leader(),
        has_leader: raft.leader().is_some(),
        is_voter: raft.is_voter(),
        checking_genesis,
        term: raft.term(),
        commit_index: raft.commit_index(),
        applied_index,
        last_index,
        raft: raft.counters(),
        peers,
        locks: state.metrics().clone(),
        pushes: PushCounts::default(),
        replies,
        abuse,
        held_keys: state.held_keys() as u64,
        waiters: waiters as u64,
        sessions: sessions as u64,
        line_sessions: line_sessions as u64,
        shutting_down,
        ..ClusterMetrics::default()
    }
}
