//! The table's clock: moving `now` forward, handling the wait and lease
//! deadlines and sweeps due by then in time order, keeping the deadline
//! heaps' tops live and their size bounded by live state, and counting
//! lease ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::entry::KeyEntry;
use super::extend::Extensions;
use super::shared::expire_holder;
use super::{LeaseDeadline, LockTable, SetGrants, lease_duration, note_expiry_handover};
use crate::metrics::LockMetrics;
use crate::time::{Duration, Instant, duration_micros};

/// A deadline heap is rebuilt from live state once it holds more than twice
/// its live entries plus this many, so stale entries stay bounded while the
/// rebuild cost stays amortised O(1) per push.
pub(super) const HEAP_SLACK: usize = 1_024;

impl LockTable {
    /// Moves the table's clock to `now` (never backwards) and processes every
    /// deadline due by then. Returns the effective `now`.
    pub(super) fn advance(&mut self, now: Instant) -> Instant {
        let now = now.max(self.now_last);
        self.now_last = now;
        self.process_due(now);
        now
    }

    /// Handles wait deadlines, lease deadlines and sweeps due at or before
    /// `now`, each at its own instant, in time order.
    fn process_due(&mut self, now: Instant) {
        // The heap tops are live on entry (every call into the table ends
        // in `tidy`, and nothing changes between calls); after each step
        // they are made live again.
        let mut tops_live = true;
        loop {
            if !tops_live {
                self.drop_stale_heap_tops();
            }
            tops_live = false;
            let wait_at = self
                .wait_deadlines
                .peek()
                .map(|Reverse((at, _))| *at)
                .filter(|&at| at <= now);
            let lease_at = self
                .lease_deadlines
                .peek()
                .map(|Reverse(lease)| lease.deadline)
                .filter(|&at| at <= now);
            let event_at = match (wait_at, lease_at) {
                (Some(w), Some(l)) => Some(w.min(l)),
                (w, l) => w.or(l),
            };
            if self.sweep_next <= now && event_at.is_none_or(|at| self.sweep_next < at) {
                // Consecutive sweeps with nothing in between collapse into the
                // last of them: it removes a superset of what they would.
                // `at` is after `sweep_next`, so one microsecond before it is
                // not before `sweep_next`.
                let last = event_at.map_or(now, |at| at.saturating_sub(Duration::from_micros(1)));
                let interval_us = duration_micros(self.sweep_interval);
                let missed =
                    duration_micros(last.saturating_duration_since(self.sweep_next)) / interval_us;
                let sweep_at = self
                    .sweep_next
                    .saturating_add(Duration::from_micros(missed * interval_us));
                self.sweep(sweep_at);
                self.sweep_next = sweep_at.saturating_add(self.sweep_interval);
                continue;
            }
            match (wait_at, lease_at) {
                (None, None) => break,
                (Some(wait_at), lease_at) if lease_at.is_none_or(|l| wait_at <= l) => {
                    let Some(Reverse((_, seq))) = self.wait_deadlines.pop() else {
                        unreachable!("peeked above");
                    };
                    self.remove_waiter(seq, wait_at, now, true);
                }
                (_, _) => {
                    let Some(Reverse(lease)) = self.lease_deadlines.pop() else {
                        unreachable!("peeked above");
                    };
                    let mut expired = None;
                    let mut expired_sharers = Vec::new();
                    // The sharer whose lease ended last: the key's token.
                    let mut last_sharer = None;
                    if let Some(entry) = self.keys.find_mut(lease.hash, &lease.key)
                        && entry.token != 0
                    {
                        if entry.is_shared() {
                            // The batch's last lease ran out: every sharer's did.
                            expired_sharers =
                                self.sharers.remove(&lease.key[..]).unwrap_or_default();
                            last_sharer = Some(entry.token);
                            entry.set_shared(false);
                        } else {
                            expired = Some(ExpiredGrant::of(entry));
                        }
                        entry.token = 0;
                        self.holder_keys -= 1;
                    }
                    let handed_over = self.grant_front(lease.hash, &lease.key, lease.deadline, now);
                    // The grant whose expiry operators hear of: the
                    // exclusive holder's, or the last sharer's (the one
                    // whose lease ending let the waiter in), once counted.
                    let mut counted_token = None;
                    for sharer in &expired_sharers {
                        let grants = (&mut self.sets, &mut self.extensions);
                        let counted = note_expiry(&mut self.metrics, grants, sharer, handed_over);
                        if counted && last_sharer == Some(sharer.token) {
                            counted_token = Some(sharer.token);
                        }
                    }
                    if let Some(expired) = expired {
                        let token = expired.token;
                        let counted = count_expiry(
                            &mut self.metrics,
                            (&mut self.sets, &mut self.extensions),
                            expired,
                            handed_over,
                        );
                        counted_token = counted.then_some(token);
                    }
                    // The front waiter now holds the key: its token is the
                    // hand-over's.
                    let handed_to = counted_token
                        .filter(|_| handed_over)
                        .and_then(|_| self.keys.find(lease.hash, &lease.key))
                        .map(|entry| entry.token)
                        .filter(|&token| token != 0);
                    if let (Some(token), Some(handed_to)) = (counted_token, handed_to) {
                        note_expiry_handover(
                            &mut self.expiry_handovers,
                            &lease.key,
                            token,
                            handed_to,
                        );
                    }
                }
            }
        }
    }

    /// Removes expired keys that nobody waits for, as of `at`.
    fn sweep(&mut self, at: Instant) {
        let metrics = &mut self.metrics;
        let sets = &mut self.sets;
        let extensions = &mut self.extensions;
        let holder_keys = &mut self.holder_keys;
        let sharers = &mut self.sharers;
        self.keys.retain(|key, entry| {
            let keep = entry.is_queued() || entry.is_held_at(at);
            if !keep && entry.token != 0 {
                let grants = (&mut *sets, &mut *extensions);
                expire_holder(metrics, grants, sharers, (key, entry), false);
                *holder_keys -= 1;
            }
            keep
        });
    }

    /// Pops heap entries that no longer stand for a live deadline, so that
    /// `poll_timeout` is exact and dead entries leave the heaps early.
    fn drop_stale_heap_tops(&mut self) {
        while let Some(Reverse((_, seq))) = self.wait_deadlines.peek() {
            if self.waiters.contains_key(seq) {
                break;
            }
            self.wait_deadlines.pop();
        }
        while let Some(Reverse(lease)) = self.lease_deadlines.peek() {
            if self.is_live_lease_deadline(lease) {
                break;
            }
            self.lease_deadlines.pop();
        }
    }

    fn is_live_lease_deadline(&self, lease: &LeaseDeadline) -> bool {
        // Tokens are never reused, so a matching token means the same
        // grant; an extension moves its deadline, leaving the entry pushed
        // for the old one stale.
        self.keys.find(lease.hash, &lease.key).is_some_and(|entry| {
            entry.token == lease.token
                && entry.is_queued()
                && entry.lease_deadline == lease.deadline
        })
    }

    /// End-of-call upkeep: live heap tops, heaps bounded by live state.
    pub(super) fn tidy(&mut self) {
        if self.wait_deadlines.len() > 2 * self.waiters.len() + HEAP_SLACK {
            self.wait_deadlines = self
                .waiters
                .iter()
                .map(|(&seq, waiter)| Reverse((waiter.wait_deadline, seq)))
                .collect();
        }
        if self.lease_deadlines.len() > 2 * self.queued_pairs + HEAP_SLACK {
            self.rebuild_lease_deadlines();
        }
        self.drop_stale_heap_tops();
    }

    /// One entry per held key with waiters, found through the waiter at the
    /// front of each queue: O(queued pairs), no scan of the whole table.
    fn rebuild_lease_deadlines(&mut self) {
        let mut lease_deadlines = Vec::new();
        for (&seq, waiter) in &self.waiters {
            for key in waiter.keys.iter() {
                if let Some(entry) = self.keys.find(key.hash, &key.bytes)
                    && entry.token != 0
                    && self.queue_front(key.hash, &key.bytes) == Some(seq)
                {
                    lease_deadlines.push(Reverse(LeaseDeadline {
                        deadline: entry.lease_deadline,
                        token: entry.token,
                        key: key.bytes.clone(),
                        hash: key.hash,
                    }));
                }
            }
        }
        self.lease_deadlines = BinaryHeap::from(lease_deadlines);
    }
}

/// Counts the end of the lease on `entry` (noticed now; `handed_over`: its
/// key went straight to a waiter). True if this counted the grant's
/// expiry (the first of its keys noticed).
pub(super) fn note_expiry(
    metrics: &mut LockMetrics,
    grants: (&mut SetGrants, &mut Extensions),
    entry: &KeyEntry,
    handed_over: bool,
) -> bool {
    count_expiry(metrics, grants, ExpiredGrant::of(entry), handed_over)
}

/// What the expiry count needs of a grant whose lease ended, read from
/// one of its keys' entries.
struct ExpiredGrant {
    token: u64,
    group_len: u8,
    lease_s: u8,
    lease_deadline: Instant,
    has_extension: bool,
}

impl ExpiredGrant {
    fn of(entry: &KeyEntry) -> Self {
        ExpiredGrant {
            token: entry.token,
            group_len: entry.group_len(),
            lease_s: entry.lease_s(),
            lease_deadline: entry.lease_deadline,
            has_extension: entry.has_extension(),
        }
    }
}

/// Counts the expiry of a grant as noticed on one of its keys: once per
/// grant, on the first key noticed (which also drops its extension
/// record: the other keys' entries need it no more). True if it counted.
fn count_expiry(
    metrics: &mut LockMetrics,
    (sets, extensions): (&mut SetGrants, &mut Extensions),
    grant: ExpiredGrant,
    handed_over: bool,
) -> bool {
    let ExpiredGrant {
        token, group_len, ..
    } = grant;
    if group_len > 1 {
        if let Some(left) = sets.expiring.get_mut(&token) {
            *left -= 1;
            if *left == 0 {
                sets.expiring.remove(&token);
            }
            return false;
        }
        sets.expiring.insert(token, group_len - 1);
        sets.ended(token);
    }
    if handed_over {
        metrics.expiries_handed_over += 1;
    } else {
        metrics.expiries_not_handed_over += 1;
    }
    let extension = if grant.has_extension {
        extensions.remove(&token)
    } else {
        None
    };
    match extension {
        Some(extension) => {
            if extension.extensions > 0 {
                metrics.expiries_extended += 1;
            }
            // Capped or extended: the lease ran from the recorded grant
            // to its last deadline.
            let held = grant
                .lease_deadline
                .saturating_duration_since(extension.granted_at);
            metrics.hold.observe(held);
        }
        // A lease runs from its grant to its deadline: exactly `lease_s`.
        None => metrics.hold.observe(lease_duration(grant.lease_s)),
    }
    true
}
