//! The waiter queues: handing a key to the waiter at its front, taking a
//! waiter out (cancel, wait deadline, shutdown). Queues are ascending by
//! arrival seq, the global order that keeps key-set waits deadlock-free.

use std::cmp::Reverse;
use std::collections::VecDeque;

use super::entry::{KeyEntry, StoredKey};
use super::extend::capped_deadline;
use super::shared::{compatible_at, expire_holder, new_sharer};
use super::{
    LeaseDeadline, LockEvent, LockTable, WaitedKey, Waiter, group_len, lease_duration,
    note_expiry_handover,
};
use crate::keyed::KeyHash;
use crate::queue_rule;
#[cfg(feature = "planted-bugs")]
use crate::testing::planted;
use crate::time::Instant;

/// Emptied waiter queues kept for reuse at most, and the largest capacity
/// kept: a few short queues, so the spares stay a few kilobytes.
const SPARE_QUEUES_MAX: usize = 64;
const SPARE_QUEUE_CAPACITY_MAX: usize = 8;

impl LockTable {
    /// Waiters queued on `key` (hash `hash`), whose entry is `entry`.
    pub(super) fn entry_queue_len(&self, hash: KeyHash, key: &[u8], entry: &KeyEntry) -> usize {
        if entry.is_queued() {
            self.queues.find(hash, key).map_or(0, VecDeque::len)
        } else {
            0
        }
    }

    /// The waiter at the front of `key`'s queue (hash `hash`).
    pub(super) fn queue_front(&self, hash: KeyHash, key: &[u8]) -> Option<u64> {
        self.queues
            .find(hash, key)
            .and_then(|queue| queue.front().copied())
    }

    /// Removes `key`'s (empty) queue, keeping it for reuse if small and
    /// few are kept.
    fn drop_queue(&mut self, hash: KeyHash, key: &[u8]) {
        if let Some(queue) = self.queues.remove(hash, key)
            && queue.capacity() <= SPARE_QUEUE_CAPACITY_MAX
            && self.spare_queues.len() < SPARE_QUEUES_MAX
        {
            debug_assert!(queue.is_empty(), "a queue dropped with waiters");
            self.spare_queues.push(queue);
        }
    }

    /// Takes waiter `seq` out of all its queues at `at`, with a `T` event
    /// if `timed_out`, then lets whoever is now at the front of those queues
    /// in. Grants made here get their lease from `now`.
    pub(super) fn remove_waiter(&mut self, seq: u64, at: Instant, now: Instant, timed_out: bool) {
        let Some(waiter) = self.waiters.remove(&seq) else {
            return;
        };
        self.waiter_seqs.remove(&waiter.id);
        if timed_out {
            self.events
                .push_back((LockEvent::TimedOut { waiter: waiter.id }, None));
            self.metrics.timeouts_wait_ended += 1;
        }
        // Bit i: the waiter was at the front of keys[i] (at most 16 keys).
        let mut was_front: u32 = 0;
        for (
            i,
            WaitedKey {
                hash, bytes: key, ..
            },
        ) in waiter.keys.iter().enumerate()
        {
            let Some(entry) = self.keys.find_mut(*hash, key) else {
                debug_assert!(false, "waiter's key missing from the table");
                continue;
            };
            let Some(queue) = self.queues.find_mut(*hash, key) else {
                debug_assert!(false, "waiter missing from its key's queue");
                continue;
            };
            // Queues are ascending by seq: the global arrival order.
            #[cfg(not(feature = "planted-bugs"))]
            let found = queue.binary_search(&seq).ok();
            // Except where the planted `SkipWaiter` swapped two: found by
            // a walk, the same answer on an ordered queue.
            #[cfg(feature = "planted-bugs")]
            let found = queue.iter().position(|&queued| queued == seq);
            if let Some(position) = found {
                queue.remove(position);
                self.queued_pairs -= 1;
                if position == 0 {
                    was_front |= 1 << i;
                }
            }
            if queue.is_empty() {
                entry.set_queued(false);
                if entry.token == 0 {
                    self.keys.remove(*hash, key);
                }
                self.drop_queue(*hash, key);
            }
        }
        for (i, key) in waiter.keys.iter().enumerate() {
            if was_front & (1 << i) != 0 {
                self.grant_front(key.hash, &key.bytes, at, now);
            }
        }
    }

    /// Ends every queued wait with a `T` event and empties the queues: what
    /// [`LockTable::time_out_all_waiters`] does once the clock is moved.
    pub(super) fn time_out_every_waiter(&mut self) {
        let mut seqs: Vec<u64> = self.waiters.keys().copied().collect();
        seqs.sort_unstable();
        for seq in seqs {
            let Some(waiter) = self.waiters.remove(&seq) else {
                continue;
            };
            self.events
                .push_back((LockEvent::TimedOut { waiter: waiter.id }, None));
            self.metrics.timeouts_shutdown += 1;
            for WaitedKey {
                hash, bytes: key, ..
            } in waiter.keys.iter()
            {
                if let Some(entry) = self.keys.find_mut(*hash, key) {
                    entry.set_queued(false);
                    if entry.token == 0 {
                        self.keys.remove(*hash, key);
                    }
                }
            }
        }
        self.queues.clear();
        self.spare_queues.clear();
        self.waiter_seqs.clear();
        self.queued_pairs = 0;
        // With no waiters every wait and lease deadline entry is stale.
        self.wait_deadlines.clear();
        self.lease_deadlines.clear();
    }

    /// Grants `key` to the waiter at the front of its queue if, at `at`,
    /// that waiter is at the front of every one of its keys and none of them
    /// has a running lease. Only the front is looked at ("wake only the next
    /// waiter"); a set blocked elsewhere is retried when that key frees.
    /// Returns whether it granted. `hash` is `key`'s.
    pub(super) fn grant_front(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        at: Instant,
        now: Instant,
    ) -> bool {
        #[cfg(feature = "planted-bugs")]
        if planted::active(planted::PlantedBug::SkipWaiter) {
            self.plant_skip_waiter(hash, key);
        }
        // Keys where a granted waiter joined a sharer batch: the shared
        // requests queued behind it there may join too.
        let mut joined = Vec::new();
        let granted = self.grant_front_batch(hash, key, at, now, &mut joined);
        while let Some((hash, key)) = joined.pop() {
            self.grant_front_batch(hash, &key, at, now, &mut joined);
        }
        granted
    }

    /// Grants `key`'s front waiter while it is grantable: once for an
    /// exclusive request, and on through consecutive shared ones (a sharer
    /// batch). The other keys a granted waiter took shared go to `joined`.
    fn grant_front_batch(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        at: Instant,
        now: Instant,
        joined: &mut Vec<(KeyHash, StoredKey)>,
    ) -> bool {
        let mut granted = false;
        while let Some(seq) = self.grantable_front(hash, key, at) {
            if self.next_token > self.token_limit {
                // Not durable yet: the waiter keeps its place until the limit
                // is raised or its wait ends.
                self.stalled.insert(key.into());
                break;
            }
            let Some(waiter) = self.waiters.remove(&seq) else {
                break;
            };
            self.waiter_seqs.remove(&waiter.id);
            let mut shared_here = false;
            let shared = waiter.keys.iter().enumerate();
            for (_, waited) in shared.filter(|&(i, _)| waiter.modes.is_shared(i)) {
                if *waited.bytes == *key {
                    shared_here = true;
                } else {
                    joined.push((waited.hash, waited.bytes.clone()));
                }
            }
            self.grant_waiter(waiter, now);
            granted = true;
            if !shared_here {
                break;
            }
        }
        granted
    }

    /// The seq of the waiter at the front of `key`'s queue if, at `at`,
    /// it is at the front of every one of its keys and none of them has a
    /// running lease.
    fn grantable_front(&self, hash: KeyHash, key: &[u8], at: Instant) -> Option<u64> {
        let entry = self.keys.find(hash, key)?;
        if entry.is_held_at(at) && !entry.is_shared() {
            return None;
        }
        let seq = self.queue_front(hash, key)?;
        let Some(waiter) = self.waiters.get(&seq) else {
            debug_assert!(false, "queued seq without a waiter");
            return None;
        };
        if let [only] = &*waiter.keys {
            debug_assert_eq!(only.bytes.as_bytes(), key);
            return compatible_at(entry, waiter.modes.is_shared(0), at).then_some(seq);
        }
        let grantable = queue_rule::key_set_grantable(
            seq,
            waiter.keys.iter().enumerate(),
            |(_, key)| self.queue_front(key.hash, &key.bytes),
            |&(i, key)| {
                self.keys
                    .find(key.hash, &key.bytes)
                    .is_some_and(|entry| compatible_at(entry, waiter.modes.is_shared(i), at))
            },
        );
        grantable.then_some(seq)
    }

    /// Gives `waiter`, already out of the waiter maps, all its keys under a
    /// new token: each key leaves its queue, and a key still queued on gets
    /// a lease deadline entry so its lease end hands it on.
    fn grant_waiter(&mut self, waiter: Waiter, now: Instant) {
        #[cfg(feature = "planted-bugs")]
        let token = if planted::active(planted::PlantedBug::HandoffReusesTerm) {
            // The last token issued, again.
            self.next_token - 1
        } else {
            self.issue_token()
        };
        #[cfg(not(feature = "planted-bugs"))]
        let token = self.issue_token();
        // The cap, like the lease, counts from the grant, not the arrival.
        let cap_at = self.record_cap(token, now, waiter.max_hold);
        // A fresh lease from the real handoff time (etcd #11456), even when
        // catching up on a deadline that passed earlier.
        let lease_deadline = capped_deadline(now, lease_duration(waiter.lease_s), cap_at);
        let group_len = group_len(waiter.keys.len());
        let grant = (waiter.holder, group_len, waiter.lease_s);
        for (i, waited) in waiter.keys.iter().enumerate() {
            let (hash, key) = (waited.hash, &waited.bytes);
            if waiter.modes.is_shared(i) {
                self.leave_front(hash, key);
                let sharer = new_sharer(token, lease_deadline, grant, cap_at.is_some());
                self.add_sharer(hash, key, sharer, now, true);
                continue;
            }
            let Some(entry) = self.keys.find_mut(hash, key) else {
                continue;
            };
            if entry.token != 0 {
                // A lease that ended at this very instant, not yet handled
                // on this key: it ends here, handed to this waiter.
                let expired = entry.token;
                let counted = expire_holder(
                    &mut self.metrics,
                    (&mut self.sets, &mut self.extensions),
                    &mut self.sharers,
                    (key, entry),
                    true,
                );
                if counted {
                    note_expiry_handover(&mut self.expiry_handovers, key, expired, token);
                }
            } else {
                self.holder_keys += 1;
            }
            entry.token = token;
            entry.lease_deadline = lease_deadline;
            entry.set_grant(waiter.holder, group_len, waiter.lease_s);
            entry.set_extension(cap_at.is_some());
            if entry.is_queued()
                && let Some(queue) = self.queues.find_mut(hash, key)
            {
                queue.pop_front();
                self.queued_pairs -= 1;
                if queue.is_empty() {
                    entry.set_queued(false);
                    self.drop_queue(hash, key);
                } else {
                    self.lease_deadlines.push(Reverse(LeaseDeadline {
                        deadline: lease_deadline,
                        token,
                        key: key.clone(),
                        hash,
                    }));
                }
            }
        }
        self.sets
            .granted(token, waiter.keys.iter().map(|key| &*key.bytes));
        self.events.push_back((
            LockEvent::Granted {
                waiter: waiter.id,
                token,
            },
            Some(lease_deadline),
        ));
        self.metrics.grants_after_wait += 1;
        self.metrics
            .wait
            .observe(now.saturating_duration_since(waiter.queued_at));
    }

    /// Takes the front waiter (being granted shared) off `key`'s queue.
    /// Returns whether others still wait there.
    fn leave_front(&mut self, hash: KeyHash, key: &[u8]) -> bool {
        let Some(entry) = self.keys.find_mut(hash, key) else {
            return false;
        };
        if !entry.is_queued() {
            return false;
        }
        let Some(queue) = self.queues.find_mut(hash, key) else {
            return false;
        };
        queue.pop_front();
        self.queued_pairs -= 1;
        if queue.is_empty() {
            entry.set_queued(false);
            self.drop_queue(hash, key);
            false
        } else {
            true
        }
    }

    /// Planted bug: the second waiter of `key`, if it waits for this key
    /// alone, jumps the front one.
    #[cfg(feature = "planted-bugs")]
    fn plant_skip_waiter(&mut self, hash: KeyHash, key: &[u8]) {
        let Some(queue) = self.queues.find_mut(hash, key) else {
            return;
        };
        if queue.len() >= 2
            && self
                .waiters
                .get(&queue[1])
                .is_some_and(|w| w.keys.len() == 1)
        {
            queue.swap(0, 1);
        }
    }
}
