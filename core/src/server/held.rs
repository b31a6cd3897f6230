//! Keys held per connection in single mode, for the per-connection cap
//! ([`crate::budget::BudgetConfig::held_per_connection_max`]). The lock
//! table records each grant's connection, so this keeps only a count per
//! connection and one small expiry-heap entry per grant.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::conn::ConnId;
use crate::hash::IdMap;
use crate::lock::HOLDER_MAX;
use crate::time::Instant;

/// Stale expiry-heap entries of [`HeldCounts`] (of grants released before
/// their lease ended) allowed beyond the live ones before the heap is
/// rebuilt.
const RELEASED_EARLY_SLACK: usize = 64;

/// A [`HeldCounts`] heap entry: (lease end, connection id shifted left 8
/// bits | key count). Connection ids are below 2^48 (the lock table's
/// holder tags, [`HOLDER_MAX`]) and a grant has at most 16 keys, so the
/// pair is 16 bytes per grant.
type HeldEntry = (Instant, u64);

/// The heap entry of a grant to `conn` on `keys` keys ending at `expires`.
fn held_entry(conn: ConnId, keys: usize, expires: Instant) -> HeldEntry {
    let keys = u64::try_from(keys).unwrap_or(u64::MAX).min(0xff);
    let conn = conn.0.min(HOLDER_MAX);
    (expires, (conn << 8) | keys)
}

/// Keys held by the grants delivered to each connection, until released
/// (by anyone) or expired: the single-mode server's count for
/// [`crate::budget::BudgetConfig::held_per_connection_max`]. Its lock table records each
/// grant's connection ([`crate::lock::LockTable::grant_of`]), so unlike
/// [`crate::budget::HeldKeys`] nothing here is keyed by token.
///
/// Layout: a key count per connection and a min-heap with one 16-byte
/// entry per grant ([`held_entry`]). A grant released before its lease
/// ends leaves its heap entry behind; the release is noted in a multiset
/// of heap entries, and the entry is dropped against that note when it
/// comes to the top instead of being counted off a second time. Entries
/// with the same lease end, connection and key count are interchangeable,
/// which makes the multiset exact. Once noted releases outnumber the live
/// grants, the heap is rebuilt without them. A closed connection's grants
/// stay until their lease ends or they are released (connection ids are
/// never reused, so they count against nobody).
#[derive(Debug, Default)]
pub(crate) struct HeldCounts {
    per_conn: IdMap<ConnId, usize>,
    by_expiry: BinaryHeap<Reverse<HeldEntry>>,
    /// Heap entries of grants released before their lease ended, with how
    /// many of each. Only looked up, never walked; keyed by the core's own
    /// clock readings and connection ids (a client picks no more than its
    /// lease seconds), so the id hasher.
    released_early: IdMap<HeldEntry, u32>,
    /// The sum of `released_early`'s counts.
    released_early_total: usize,
    /// Every lease ending at or before this was counted off.
    expired_through: Instant,
}

impl HeldCounts {
    /// `conn` received a grant on `keys` keys whose lease ends at `expires`.
    pub(crate) fn add(&mut self, conn: ConnId, keys: usize, expires: Instant) {
        let entry = held_entry(conn, keys, expires);
        *self.per_conn.entry(conn).or_default() += (entry.1 & 0xff) as usize;
        self.by_expiry.push(Reverse(entry));
    }

    /// The grant `conn` received on `keys` keys, lease ending at `expires`,
    /// was released (by anyone).
    pub(crate) fn released(&mut self, conn: ConnId, keys: usize, expires: Instant) {
        let entry = held_entry(conn, keys, expires);
        if entry.0 <= self.expired_through {
            // Counted off already, when its lease ended.
            return;
        }
        self.count_off(entry.1);
        if self.by_expiry.peek() == Some(&Reverse(entry)) {
            // The grant ending first (the usual case with few grants): its
            // entry leaves now instead of being noted. Equal entries are
            // interchangeable, and the heap holds more of them than notes
            // (this grant's is not noted), so the count stays exact.
            self.by_expiry.pop();
            return;
        }
        *self.released_early.entry(entry).or_default() += 1;
        self.released_early_total += 1;
        let live = self
            .by_expiry
            .len()
            .saturating_sub(self.released_early_total);
        if self.released_early_total > live + RELEASED_EARLY_SLACK {
            let mut entries = std::mem::take(&mut self.by_expiry).into_vec();
            entries.retain(|&Reverse(entry)| !self.take_released_early(entry));
            debug_assert_eq!(
                self.released_early_total, 0,
                "a noted release without its grant"
            );
            self.by_expiry = BinaryHeap::from(entries);
        }
    }

    /// Counts off grants whose lease ended by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.expired_through = self.expired_through.max(now);
        while let Some(&Reverse(entry)) = self.by_expiry.peek() {
            if entry.0 > now {
                break;
            }
            self.by_expiry.pop();
            if !self.take_released_early(entry) {
                self.count_off(entry.1);
            }
        }
    }

    /// `conn` is gone for good: its grants no longer count against anybody.
    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        self.per_conn.remove(&conn);
    }

    /// Keys held by `conn`'s delivered grants (after [`HeldCounts::expire`]).
    pub(crate) fn held(&self, conn: ConnId) -> usize {
        self.per_conn.get(&conn).copied().unwrap_or(0)
    }

    /// Subtracts a grant (the second half of its heap entry) from its
    /// connection's count.
    fn count_off(&mut self, conn_and_keys: u64) {
        // A count that reaches zero stays (until the connection is
        // forgotten): the next grant to it needs no new entry. It never
        // goes below zero, even if a grant were counted off twice (the
        // simulator plants such a bug for its checkers to catch).
        let conn = ConnId(conn_and_keys >> 8);
        if let Some(held) = self.per_conn.get_mut(&conn) {
            *held = held.saturating_sub((conn_and_keys & 0xff) as usize);
        }
    }

    /// Whether `entry` stands for a grant released early (and forgets one
    /// such note).
    fn take_released_early(&mut self, entry: HeldEntry) -> bool {
        let Some(count) = self.released_early.get_mut(&entry) else {
            return false;
        };
        *count -= 1;
        if *count == 0 {
            self.released_early.remove(&entry);
        }
        self.released_early_total -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_counts_count_until_release_expiry_or_close() {
        let mut held = HeldCounts::default();
        let t = |s: u64| Instant::from_micros(s * 1_000_000);
        held.add(ConnId(1), 3, t(5));
        held.add(ConnId(1), 1, t(9));
        held.add(ConnId(2), 2, t(9));
        assert_eq!(held.held(ConnId(1)), 4);
        held.released(ConnId(1), 3, t(5));
        assert_eq!(held.held(ConnId(1)), 1);
        // The released grant's heap entry is not counted off again.
        held.expire(t(5));
        assert_eq!(held.held(ConnId(1)), 1);
        held.expire(t(9));
        assert_eq!(held.held(ConnId(1)), 0);
        assert_eq!(held.held(ConnId(2)), 0);
        // Released after its lease ended: counted off once, at the end.
        held.add(ConnId(4), 2, t(10));
        held.add(ConnId(4), 1, t(12));
        held.expire(t(11));
        held.released(ConnId(4), 2, t(10));
        assert_eq!(held.held(ConnId(4)), 1);
        held.add(ConnId(2), 2, t(20));
        held.forget_conn(ConnId(2));
        assert_eq!(held.held(ConnId(2)), 0);
        // The closed connection's grant leaves when its lease ends, and
        // releasing it then or before touches nobody's count.
        held.add(ConnId(3), 1, t(30));
        held.released(ConnId(2), 2, t(20));
        assert_eq!(held.held(ConnId(3)), 1);
        held.expire(t(30));
        assert_eq!(held.held(ConnId(3)), 0);
        assert_eq!(held.held(ConnId(4)), 0);
        assert!(held.by_expiry.is_empty());
        assert!(held.released_early.is_empty());
        assert!(held.per_conn.values().all(|&count| count == 0));
        // What is left is the connections not forgotten, at zero.
        held.forget_conn(ConnId(1));
        held.forget_conn(ConnId(3));
        held.forget_conn(ConnId(4));
        assert!(held.per_conn.is_empty());
    }

    #[test]
    fn a_grant_counted_off_twice_leaves_the_count_at_zero() {
        let mut held = HeldCounts::default();
        held.add(ConnId(7), 2, Instant::from_micros(5_000_000));
        let entry = (7u64 << 8) | 2;
        held.count_off(entry);
        held.count_off(entry);
        assert_eq!(held.held(ConnId(7)), 0);
        held.add(ConnId(7), 1, Instant::from_micros(6_000_000));
        assert_eq!(held.held(ConnId(7)), 1);
    }

    #[test]
    fn a_release_of_the_grant_ending_first_leaves_no_note() {
        let mut held = HeldCounts::default();
        let t = |s: u64| Instant::from_micros(s * 1_000_000);
        for round in 1..=1_000 {
            held.add(ConnId(1), 1, t(round + 30));
            assert_eq!(held.held(ConnId(1)), 1);
            held.released(ConnId(1), 1, t(round + 30));
            assert_eq!(held.held(ConnId(1)), 0);
            assert!(held.by_expiry.is_empty());
            assert!(held.released_early.is_empty());
        }
        // Equal entries: releasing one of two leaves the other counted,
        // whichever of them the heap gives up.
        held.add(ConnId(2), 1, t(5));
        held.add(ConnId(2), 1, t(5));
        held.released(ConnId(2), 1, t(5));
        assert_eq!(held.held(ConnId(2)), 1);
        held.expire(t(5));
        assert_eq!(held.held(ConnId(2)), 0);
        assert!(held.released_early.is_empty());
    }

    #[test]
    fn held_counts_match_equal_grants_one_for_one() {
        // Two grants of one connection with the same lease end and size:
        // releasing one leaves exactly the other counted until it ends.
        let mut held = HeldCounts::default();
        let end = Instant::from_micros(7_000_000);
        held.add(ConnId(1), 1, end);
        held.add(ConnId(1), 1, end);
        held.add(ConnId(1), 2, end);
        held.released(ConnId(1), 1, end);
        assert_eq!(held.held(ConnId(1)), 3);
        held.expire(Instant::from_micros(6_999_999));
        assert_eq!(held.held(ConnId(1)), 3);
        held.expire(end);
        assert_eq!(held.held(ConnId(1)), 0);
        assert!(held.released_early.is_empty());
    }

    #[test]
    fn held_counts_heap_stays_bounded_by_live_grants() {
        let mut held = HeldCounts::default();
        let far = Instant::from_micros(1_000_000_000);
        for n in 1..10_000u64 {
            let expires = Instant::from_micros(far.as_micros() + n);
            held.add(ConnId(1), 1, expires);
            if n % 100 != 0 {
                held.released(ConnId(1), 1, expires);
            }
            let live = held.by_expiry.len() - held.released_early_total;
            assert!(held.released_early_total <= live + RELEASED_EARLY_SLACK + 1);
        }
        assert_eq!(held.held(ConnId(1)), 99);
        held.expire(Instant::from_micros(far.as_micros() + 10_000));
        assert_eq!(held.held(ConnId(1)), 0);
        assert!(held.by_expiry.is_empty());
        assert!(held.released_early.is_empty());
    }

    #[test]
    fn held_counts_heap_entry_is_16_bytes() {
        // One per held grant: it counts against the goal of at most 120 bytes per
        // held key (docs/performance.md), so it must not grow unnoticed.
        assert!(std::mem::size_of::<Reverse<HeldEntry>>() <= 16);
        let (at, conn_and_keys) = held_entry(ConnId(HOLDER_MAX), 16, Instant::from_micros(5));
        assert_eq!(
            (at, conn_and_keys >> 8, conn_and_keys & 0xff),
            (Instant::from_micros(5), HOLDER_MAX, 16)
        );
    }
}
