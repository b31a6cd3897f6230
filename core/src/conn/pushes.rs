//! Pushes to holders (docs/protocol.md §8.3), for the single-mode server
//! and a cluster leader alike: the grants delivered to connections that
//! negotiated [`crate::wire::Capabilities::PUSH`], and when each is due to
//! hear that its lease ends soon, or that it is lost.
//!
//! Nothing here decides whether a grant is current: the owner's lock
//! state does, when a watch comes due. A watch is dropped when its holder
//! releases it, and answered at once when an operator revokes it;
//! otherwise it comes due at the warning time and at the lease's end, and
//! is re-armed when the lease moved (a renewal).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::conn::ConnId;
use crate::hash::IdMap;
use crate::time::{Duration, Instant};
use crate::wire::Key;

/// The shortest warning before a lease ends.
pub(crate) const LEASE_ENDING_WARNING_MIN: Duration = Duration::from_secs(1);

/// How long before a lease of `lease` ends its holder hears of it: a
/// quarter of the lease, at least [`LEASE_ENDING_WARNING_MIN`].
pub(crate) fn warning_before(lease: Duration) -> Duration {
    (lease / 4).max(LEASE_ENDING_WARNING_MIN)
}

/// One watched grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The connection it was delivered to.
    pub(crate) conn: ConnId,
    /// A key of the grant, to ask the table about it.
    pub(crate) key: Key,
    /// The lease it was granted or last renewed for.
    pub(crate) lease: Duration,
    /// When that lease ends.
    pub(crate) deadline: Instant,
    /// The holder was told this lease is ending.
    pub(crate) warned: bool,
    /// The grant's hold cap, if it has one: a lease ending there is lost
    /// to the cap.
    pub(crate) cap_at: Option<Instant>,
}

impl Watch {
    /// When this watch is next due.
    fn due_at(&self) -> Instant {
        if self.warned {
            self.deadline
        } else {
            self.deadline.saturating_sub(warning_before(self.lease))
        }
    }
}

/// The watched grants by token, and when each is due. Bounded by the
/// grants held (one entry per grant; the heap's stale entries are skipped
/// and it is rebuilt once they outnumber the live ones).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    by_token: IdMap<u64, Watch>,
    due: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Watches {
    /// Watches `token`, delivered to `conn`, whose lease `lease` ends at
    /// `deadline`.
    pub(crate) fn watch(&mut self, token: u64, watch: Watch) {
        let at = watch.due_at();
        self.by_token.insert(token, watch);
        self.schedule(token, at);
    }

    /// The lease of `token` was renewed to `lease`, ending at `deadline`:
    /// the holder hears of it ending again.
    pub(crate) fn renewed(&mut self, token: u64, lease: Duration, deadline: Instant) {
        if let Some(watch) = self.by_token.get_mut(&token) {
            watch.lease = lease;
            watch.deadline = deadline;
            watch.warned = false;
            let at = watch.due_at();
            self.schedule(token, at);
        }
    }

    /// Keeps watching `token` with nothing more scheduled: its end is
    /// learned from the owner's state (a cluster leader applying the
    /// `Expire`), not from a timer.
    pub(crate) fn keep(&mut self, token: u64, watch: Watch) {
        self.by_token.insert(token, watch);
    }

    /// Stops watching `token` (released by its holder, or its holder is
    /// told it is lost); the watch, if there was one.
    pub(crate) fn forget(&mut self, token: u64) -> Option<Watch> {
        self.by_token.remove(&token)
    }

    /// The earliest instant a watch is due.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    /// The next watch due at `now`, taken out of the schedule (put it back
    /// with [`Watches::watch`] to keep it).
    pub(crate) fn next_due(&mut self, now: Instant) -> Option<(u64, Watch)> {
        while let Some(&Reverse((at, token))) = self.due.peek() {
            if at > now {
                return None;
            }
            self.due.pop();
            // Stale unless the watch is still there and due at this time.
            if self
                .by_token
                .get(&token)
                .is_some_and(|watch| watch.due_at() == at)
            {
                return self.by_token.remove(&token).map(|watch| (token, watch));
            }
        }
        None
    }

    /// Grants watched.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_token.len()
    }

    fn schedule(&mut self, token: u64, at: Instant) {
        if self.due.len() > 2 * self.by_token.len() + 64 {
            self.due = self
                .by_token
                .iter()
                .map(|(&token, watch)| Reverse((watch.due_at(), token)))
                .collect();
        } else {
            self.due.push(Reverse((at, token)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(deadline_ms: u64, lease_s: u64) -> Watch {
        Watch {
            conn: ConnId(1),
            key: Key::new(b"k").unwrap(),
            lease: Duration::from_secs(lease_s),
            deadline: Instant::from_millis(deadline_ms),
            warned: false,
            cap_at: None,
        }
    }

    #[test]
    fn the_warning_is_a_quarter_of_the_lease_and_at_least_a_second() {
        assert_eq!(
            warning_before(Duration::from_secs(40)),
            Duration::from_secs(10)
        );
        assert_eq!(
            warning_before(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_watch_comes_due_at_its_warning_and_a_renewal_moves_it() {
        let mut watches = Watches::default();
        watches.watch(7, watch(40_000, 40));
        assert_eq!(watches.poll_timeout(), Some(Instant::from_millis(30_000)));
        assert_eq!(watches.next_due(Instant::from_millis(29_999)), None);
        watches.renewed(7, Duration::from_secs(40), Instant::from_millis(60_000));
        // The old time is stale now.
        assert_eq!(watches.next_due(Instant::from_millis(30_000)), None);
        let (token, due) = watches.next_due(Instant::from_millis(50_000)).unwrap();
        assert_eq!((token, due.deadline), (7, Instant::from_millis(60_000)));
    }

    #[test]
    fn a_forgotten_watch_never_comes_due() {
        let mut watches = Watches::default();
        watches.watch(7, watch(4_000, 4));
        assert!(watches.forget(7).is_some());
        assert_eq!(watches.next_due(Instant::from_millis(10_000)), None);
        assert_eq!(watches.len(), 0);
    }

    #[test]
    fn stale_schedule_entries_stay_bounded() {
        let mut watches = Watches::default();
        watches.watch(7, watch(4_000, 4));
        for step in 0..1_000 {
            watches.renewed(
                7,
                Duration::from_secs(4),
                Instant::from_millis(5_000 + step),
            );
        }
        assert!(watches.due.len() <= 2 + 64 + 1, "{}", watches.due.len());
    }
}
