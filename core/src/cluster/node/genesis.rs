//! A bootstrap member's check that the cluster is new before it steps any
//! peer message (see [`ClusterNode::bootstrap`]), and rejoining as a new
//! generation of its slot when the cluster turns out to be running.

use std::collections::BTreeSet;

use crate::budget::{CloseReason, Reports};
use crate::cluster::events::{NodeEvent, NodeEvents};
use crate::cluster::recovery;
use crate::conn::ConnId;
use crate::raft::{Message, MessageBody, NodeId};
use crate::time::{Duration, Instant};

use super::ClusterNode;
use super::connections::ConnKind;

/// Where a bootstrap member stands in checking that the cluster is new (see
/// [`ClusterNode::bootstrap`]).
#[derive(Debug)]
pub(super) enum GenesisCheck {
    /// Nothing to check: a joining node, or a bootstrap member that saw a
    /// majority with bootstrap-only logs.
    Done,
    /// Still checking; peer messages are observed, not stepped.
    Pending {
        /// Slots seen with a log holding only the bootstrap entry.
        empty_logs: BTreeSet<u8>,
        /// The generation to join under if the cluster is already running.
        rejoin_generation: u64,
        /// Raft's seed, reused for the joining Raft.
        seed: u64,
    },
}

/// What one peer message says about whether the cluster is new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GenesisEvidence {
    /// The sender's log holds only the bootstrap entry.
    BootstrapLog,
    /// A leader exists or existed: the cluster is running.
    Running,
    /// Nothing either way.
    Nothing,
}

/// Index of the bootstrap configuration entry every bootstrap log starts
/// with; an entry after it was appended by a leader.
const BOOTSTRAP_INDEX: u64 = 1;

fn genesis_evidence(body: &MessageBody) -> GenesisEvidence {
    match body {
        MessageBody::PreVote { last_index, .. } | MessageBody::Vote { last_index, .. } => {
            if *last_index <= BOOTSTRAP_INDEX {
                GenesisEvidence::BootstrapLog
            } else {
                GenesisEvidence::Running
            }
        }
        // Only sent to a pre-candidate, and granted only when the granter's
        // log is no longer than ours: bootstrap-only.
        MessageBody::PreVoteResponse { reject: false } => GenesisEvidence::BootstrapLog,
        MessageBody::Append { .. }
        | MessageBody::Heartbeat { .. }
        | MessageBody::InstallSnapshot { .. } => GenesisEvidence::Running,
        _ => GenesisEvidence::Nothing,
    }
}

impl ClusterNode {
    /// Steps `msg` into Raft, unless this bootstrap member is still checking
    /// that the cluster is new (see [`ClusterNode::bootstrap`]).
    pub(super) fn step_peer_message(&mut self, now: Instant, msg: Message) {
        let GenesisCheck::Pending {
            empty_logs,
            rejoin_generation,
            seed,
        } = &mut self.genesis
        else {
            self.step_covered(now, msg);
            return;
        };
        match genesis_evidence(&msg.body) {
            GenesisEvidence::Running => {
                let (generation, seed) = (*rejoin_generation, *seed);
                self.rejoin(now, generation, seed);
            }
            GenesisEvidence::BootstrapLog => {
                empty_logs.insert(msg.from.slot);
                // This node's own log is bootstrap-only too.
                if 2 * (empty_logs.len() + 1) > usize::from(self.config.slot_count) {
                    self.genesis = GenesisCheck::Done;
                    self.step_covered(now, msg);
                } else if matches!(msg.body, MessageBody::PreVote { .. }) {
                    // Answering a pre-vote changes no term and casts no
                    // vote, so it is safe while checking; and the answer is
                    // what lets the asker count this node and finish its
                    // own check (otherwise the first pre-candidate of a
                    // five-node cluster, heard by nobody, would end up
                    // joining as a new generation).
                    self.step_covered(now, msg);
                }
            }
            GenesisEvidence::Nothing => {}
        }
    }

    /// Steps `msg` into Raft, unless it is an `Append` whose entries could
    /// allocate a token this node's durable reserve does not cover: then
    /// it is dropped (Raft sends it again) and the reserve is asked to
    /// cover it. So every entry in this node's log, and so every entry it
    /// acknowledged, is below its durable token floor, which is what makes
    /// the floors evidence for a recovery ([`crate::cluster::recovery`]).
    fn step_covered(&mut self, now: Instant, msg: Message) {
        if let MessageBody::Append { entries, .. } = &msg.body
            && let Some(bound) =
                recovery::log_token_bound(self.state.next_token(), self.applied_index, entries)
            && !self.reserve.covers(bound)
        {
            self.log_bound_wanted = self.log_bound_wanted.max(bound);
            self.counts.appends_uncovered += 1;
            return;
        }
        self.raft.step(now, msg);
    }

    /// Becomes the new generation `generation` of this slot, joining the
    /// running cluster: a fresh joining Raft and empty replicated state;
    /// client connections stay, peer connections (whose handshakes named
    /// the old generation) are closed and dialed again.
    fn rejoin(&mut self, now: Instant, generation: u64, seed: u64) {
        let mut config = self.config.clone();
        config.id = NodeId::new(config.id.slot, generation);
        let mut fresh = ClusterNode::join(config, seed, now);
        // Client connections and dialing state carry over whole; the peer
        // connections among them are closed below.
        std::mem::swap(&mut fresh.conns, &mut self.conns);
        fresh.next_waiter_seq = self.next_waiter_seq;
        fresh.replies = self.replies;
        fresh.counts = std::mem::take(&mut self.counts);
        fresh.admin_replies = std::mem::take(&mut self.admin_replies);
        fresh.reports = std::mem::replace(&mut self.reports, Reports::new(Duration::ZERO));
        fresh.shutting_down = self.shutting_down;
        fresh.peer_token_floor_max = self.peer_token_floor_max;
        fresh.log_bound_wanted = self.log_bound_wanted;
        fresh.reserve = std::mem::take(&mut self.reserve);
        fresh.events = std::mem::replace(&mut self.events, NodeEvents::new(false));
        *self = fresh;
        self.events
            .push(NodeEvent::GenerationChanged { generation });
        self.note_role(now);
        let peers: Vec<ConnId> = self
            .conns
            .by_id
            .iter()
            .filter(|(_, conn)| matches!(conn.kind, ConnKind::Peer(_)))
            .map(|(id, _)| *id)
            .collect();
        for conn_id in peers {
            self.close_conn(conn_id, CloseReason::Rejoin);
        }
    }

    /// Whether this node was started as a bootstrap member and is still
    /// checking that the cluster is new (it steps no peer message yet).
    pub fn checking_genesis(&self) -> bool {
        matches!(self.genesis, GenesisCheck::Pending { .. })
    }
}
