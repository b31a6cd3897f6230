//! The end of a run: settling, liveness and linearizability.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Every node's configuration has exactly the running generations as
    /// voters: every restarted node replaced its old self.
    pub(super) fn replaced(&self) -> bool {
        let current: BTreeSet<NodeId> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(slot, proc)| {
                proc.node
                    .as_ref()
                    .map_or(NodeId::new(slot as u8, proc.generation), |node| node.id())
            })
            .collect();
        self.nodes.iter().all(|proc| {
            proc.node.as_ref().is_some_and(|node| {
                let config = node.raft().config();
                config.voters == current && config.learners.is_empty()
            })
        })
    }

    /// Every node up with one leader, no client work left, every request a
    /// node received answered, no waiter queued.
    pub(super) fn quiescent(&self) -> bool {
        let mut leaders = 0;
        for proc in &self.nodes {
            let Some(node) = proc.node.as_ref() else {
                return false;
            };
            if node.stats().waiters > 0 || node.raft().conf_change_pending() {
                return false;
            }
            leaders += usize::from(node.is_leader());
        }
        leaders == 1
            && self.replaced()
            && self.pending.is_empty()
            && self
                .clients
                .iter()
                .all(|proc| !proc.crashed && proc.ops.is_empty())
    }
}
