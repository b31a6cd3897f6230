//! Faults chosen per event.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Whether crashing `slot` (losing its state) leaves, in every
    /// configuration some running node holds (any of them may be the one
    /// in effect), a quorum of voters that still have their state. A
    /// bootstrap member still checking that the cluster is new is no such
    /// voter: it may yet join as a new generation and leave its generation
    /// 1 behind, like a restart.
    pub(super) fn crash_is_survivable(&self, slot: u8) -> bool {
        self.nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .map(|node| node.raft().config())
            .filter(|config| !config.voters.is_empty())
            .all(|config| {
                let healthy = config
                    .voters
                    .iter()
                    .filter(|id| {
                        let proc = &self.nodes[usize::from(id.slot)];
                        id.slot != slot
                            && proc
                                .node
                                .as_ref()
                                .is_some_and(|node| node.id() == **id && !node.checking_genesis())
                    })
                    .count();
                healthy >= config.quorum()
            })
    }
}
