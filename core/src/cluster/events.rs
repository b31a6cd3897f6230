//! What a cluster node tells its driver about itself: leader, voter and
//! generation changes and refused peer input, queued when they happen so a
//! driver logs them without diffing the node's state after every wake.
//!
//! Every event carries the new state in full (not a delta), so coalescing
//! two events of one kind loses no state: the queue is bounded by
//! [`NODE_EVENTS_MAX`] and on overflow drops the oldest event that a newer
//! one of the same kind supersedes; the newest event of every kind is
//! always kept.

use std::collections::VecDeque;

use crate::raft::NodeId;

/// Most node events queued for the driver. There are six kinds, so a full
/// queue always holds a superseded event to drop.
pub const NODE_EVENTS_MAX: usize = 64;

pub use crate::machine::NodeEvent;

impl NodeEvent {
    /// Events of one kind supersede each other.
    fn same_kind(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    /// Counter events, coalesced into one until the driver drains them (as
    /// often as the driver's own per-wake diff used to log them).
    fn is_counter(&self) -> bool {
        matches!(
            self,
            Self::PeerFramesRefused { .. } | Self::RaftMessagesRefused { .. }
        )
    }
}

/// The node's event queue and the state it last reported.
#[derive(Debug)]
pub(crate) struct NodeEvents {
    queue: VecDeque<NodeEvent>,
    /// The leader as last reported (the driver starts knowing none).
    leader: Option<NodeId>,
    /// The voter status as last reported (the driver starts knowing the
    /// node's initial one).
    is_voter: bool,
    /// Raft's refused-message count as last reported.
    raft_refused: u64,
    /// A waiting recovering leader's evidence as last reported.
    recovery_evidence: Option<(u8, u8)>,
    /// Events dropped on overflow (each superseded by a newer one).
    coalesced: u64,
}

impl NodeEvents {
    pub(crate) fn new(is_voter: bool) -> Self {
        Self {
            queue: VecDeque::new(),
            leader: None,
            is_voter,
            raft_refused: 0,
            recovery_evidence: None,
            coalesced: 0,
        }
    }

    /// Queues a leader change if `leader` differs from the one last
    /// reported; true if it did.
    pub(crate) fn note_leader(&mut self, leader: Option<NodeId>, term: u64) -> bool {
        if leader == self.leader {
            return false;
        }
        self.leader = leader;
        self.push(NodeEvent::LeaderChanged { leader, term });
        true
    }

    /// Queues a voter change if `is_voter` differs from the one last
    /// reported.
    pub(crate) fn note_voter(&mut self, is_voter: bool) {
        if is_voter != self.is_voter {
            self.is_voter = is_voter;
            self.push(NodeEvent::VoterChanged { is_voter });
        }
    }

    /// Queues a refused-message event if Raft's count grew.
    pub(crate) fn note_raft_refused(&mut self, refused: u64) {
        if refused != self.raft_refused {
            self.raft_refused = refused;
            self.push(NodeEvent::RaftMessagesRefused { refused });
        }
    }

    /// Queues a recovery-evidence event if a waiting recovering leader's
    /// count of slots heard differs from the one last reported.
    pub(crate) fn note_recovery_evidence(&mut self, heard: u8, needed: u8) {
        if self.recovery_evidence != Some((heard, needed)) {
            self.recovery_evidence = Some((heard, needed));
            self.push(NodeEvent::RecoveryEvidence { heard, needed });
        }
    }

    /// Queues `event`: a counter event replaces an undrained one of its
    /// kind; on overflow the oldest superseded event goes.
    pub(crate) fn push(&mut self, event: NodeEvent) {
        if event.is_counter()
            && let Some(queued) = self.queue.iter_mut().find(|e| e.same_kind(&event))
        {
            *queued = event;
            return;
        }
        if self.queue.len() >= NODE_EVENTS_MAX {
            let superseded = (0..self.queue.len()).find(|&i| {
                let old = &self.queue[i];
                old.same_kind(&event) || self.queue.iter().skip(i + 1).any(|e| e.same_kind(old))
            });
            // Always found: six kinds, more slots than that.
            self.queue.remove(superseded.unwrap_or(0));
            self.coalesced += 1;
        }
        self.queue.push_back(event);
    }

    pub(crate) fn poll(&mut self) -> Option<NodeEvent> {
        self.queue.pop_front()
    }

    pub(crate) fn coalesced(&self) -> u64 {
        self.coalesced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_keeps_the_newest_event_of_every_kind() {
        let mut events = NodeEvents::new(false);
        events.push(NodeEvent::GenerationChanged { generation: 7 });
        events.note_voter(true);
        for term in 0..200 {
            let leader = Some(NodeId::new(u8::try_from(term % 3).unwrap(), 1));
            events.note_leader(leader, term);
        }
        assert_eq!(events.coalesced(), 200 + 2 - NODE_EVENTS_MAX as u64);
        let drained: Vec<NodeEvent> = std::iter::from_fn(|| events.poll()).collect();
        assert_eq!(drained.len(), NODE_EVENTS_MAX);
        assert_eq!(drained[0], NodeEvent::GenerationChanged { generation: 7 });
        assert_eq!(drained[1], NodeEvent::VoterChanged { is_voter: true });
        assert_eq!(
            drained.last(),
            Some(&NodeEvent::LeaderChanged {
                leader: Some(NodeId::new(199 % 3, 1)),
                term: 199
            })
        );
    }

    #[test]
    fn counter_events_coalesce_until_drained() {
        let mut events = NodeEvents::new(false);
        events.note_raft_refused(1);
        events.note_raft_refused(3);
        events.note_raft_refused(3);
        assert_eq!(
            events.poll(),
            Some(NodeEvent::RaftMessagesRefused { refused: 3 })
        );
        assert_eq!(events.poll(), None);
        events.note_raft_refused(4);
        assert_eq!(
            events.poll(),
            Some(NodeEvent::RaftMessagesRefused { refused: 4 })
        );
    }

    #[test]
    fn recovery_evidence_is_queued_when_the_count_changes() {
        let mut events = NodeEvents::new(true);
        events.note_recovery_evidence(2, 4);
        events.note_recovery_evidence(2, 4);
        events.note_recovery_evidence(3, 4);
        assert_eq!(
            events.poll(),
            Some(NodeEvent::RecoveryEvidence {
                heard: 2,
                needed: 4
            })
        );
        assert_eq!(
            events.poll(),
            Some(NodeEvent::RecoveryEvidence {
                heard: 3,
                needed: 4
            })
        );
        assert_eq!(events.poll(), None);
    }

    #[test]
    fn unchanged_state_queues_nothing() {
        let mut events = NodeEvents::new(true);
        events.note_voter(true);
        events.note_leader(None, 3);
        assert_eq!(events.poll(), None);
    }
}
