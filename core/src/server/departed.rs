//! Labels of connections that closed while their grants still held keys,
//! so that observing a key (`O`, docs/protocol.md §8.6) names the holder
//! by its label for as long as its grant runs: a delivered grant outlives
//! its connection until its lease ends (only an undelivered one is
//! released at the close), and an election whose leader's process died
//! still has that leader until then.

use std::collections::VecDeque;

use crate::conn::ConnId;
use crate::hash::IdMap;

/// Most labels kept at once; past it the oldest is forgotten (its holder,
/// if it still holds a key, is then reported without a label, and said to
/// be gone).
pub const DEPARTED_LABELS_MAX: usize = 4_096;

/// The labels of closed connections that held keys when they closed, in
/// the order they closed. Each entry stays until the connection holds
/// nothing any more (checked from the oldest, as entries are added and
/// read) or [`DEPARTED_LABELS_MAX`] newer ones push it out.
#[derive(Debug, Default)]
pub(crate) struct DepartedLabels {
    labels: IdMap<ConnId, Box<str>>,
    order: VecDeque<ConnId>,
}

impl DepartedLabels {
    /// `conn` closed holding keys, with `label`. Returns the connections
    /// forgotten to stay within the bound.
    pub(crate) fn insert(&mut self, conn: ConnId, label: &str) -> Option<ConnId> {
        let mut evicted = None;
        if self.order.len() >= DEPARTED_LABELS_MAX
            && let Some(oldest) = self.order.pop_front()
        {
            self.labels.remove(&oldest);
            evicted = Some(oldest);
        }
        self.labels.insert(conn, Box::from(label));
        self.order.push_back(conn);
        evicted
    }

    /// Forgets the oldest entries while `holds_nothing` says their
    /// connection holds no key any more; calls `forgotten` for each.
    pub(crate) fn prune(
        &mut self,
        holds_nothing: impl Fn(ConnId) -> bool,
        mut forgotten: impl FnMut(ConnId),
    ) {
        while let Some(&oldest) = self.order.front() {
            if !holds_nothing(oldest) {
                break;
            }
            self.order.pop_front();
            self.labels.remove(&oldest);
            forgotten(oldest);
        }
    }

    /// The label `conn` had, if it is kept.
    pub(crate) fn label(&self, conn: ConnId) -> Option<&str> {
        self.labels.get(&conn).map(|label| &**label)
    }

    /// Labels kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.labels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departed_labels_are_kept_until_their_connection_holds_nothing_and_bounded() {
        let mut departed = DepartedLabels::default();
        assert_eq!(departed.insert(ConnId(1), "a"), None);
        assert_eq!(departed.insert(ConnId(2), "b"), None);
        assert_eq!(departed.label(ConnId(1)), Some("a"));
        // Connection 1 still holds: nothing is pruned behind it either.
        let mut gone = Vec::new();
        departed.prune(|conn| conn != ConnId(1), |conn| gone.push(conn));
        assert!(gone.is_empty());
        departed.prune(|_| true, |conn| gone.push(conn));
        assert_eq!(gone, [ConnId(1), ConnId(2)]);
        assert_eq!(departed.label(ConnId(2)), None);
        for id in 0..DEPARTED_LABELS_MAX as u64 {
            assert_eq!(departed.insert(ConnId(10 + id), "x"), None);
        }
        assert_eq!(departed.insert(ConnId(1), "again"), Some(ConnId(10)));
        assert_eq!(departed.len(), DEPARTED_LABELS_MAX);
        assert_eq!(departed.label(ConnId(10)), None);
        assert_eq!(departed.label(ConnId(1)), Some("again"));
    }
}
