//! An acquire: granted at once when every key is free, refused (`T` for a
//! zero wait, `B` over a capacity limit), or queued on every key. The steps
//! run in this order; the order is part of the behaviour (which refusal a
//! client sees, which metric counts it).

use std::cmp::Reverse;

use super::entry::{KeyEntry, StoredKey};
use super::extend::{GrantExtension, capped_deadline};
use super::shared::{KeyModes, compatible_at, expire_holder, new_sharer};
use super::{
    AcquireOptions, AcquireOutcome, GroupHashes, LeaseDeadline, LockTable, WaitedKey, WaitedKeys,
    Waiter, WaiterId, group_len, lease_duration,
};
use crate::keyed::KeyHash;
use crate::queue_rule;
#[cfg(feature = "planted-bugs")]
use crate::testing::planted;
use crate::time::{Duration, Instant};
use crate::wire::KeyGroup;

/// What an acquire's keys look like before anything changes.
struct KeySurvey {
    /// No key is held or has waiters: grantable at once.
    all_free: bool,
    /// Some key's queue is at the per-key waiter limit.
    some_queue_full: bool,
    /// Adding the keys not yet in the table would exceed the key limit.
    over_key_limit: bool,
}

impl LockTable {
    /// An acquire at `now` (the clock already moved); `hashes` are the
    /// keys' hashes, in order.
    pub(super) fn acquire_at(
        &mut self,
        now: Instant,
        waiter: WaiterId,
        (keys, hashes): (&KeyGroup, &GroupHashes),
        options: &AcquireOptions,
        modes: KeyModes,
    ) -> AcquireOutcome {
        let survey = self.survey_keys(now, keys, hashes, modes);
        if survey.all_free {
            let keys = (keys, hashes);
            return self.grant_free_keys(now, keys, options, modes, survey.over_key_limit);
        }
        if let Some(refusal) = self.refuse_to_queue(options.wait_s, &survey) {
            return refusal;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let waited = |(key, &hash): (&crate::wire::Key, &KeyHash)| WaitedKey {
            hash,
            bytes: StoredKey::from_bytes(key.as_bytes()),
        };
        let keys = match keys.keys() {
            [key] => WaitedKeys::One([waited((key, &hashes[0]))]),
            keys => WaitedKeys::Many(keys.iter().zip(hashes).map(waited).collect()),
        };
        self.enqueue_on_keys(now, seq, &keys);
        self.add_waiter(now, seq, waiter, (keys, modes), options);
        AcquireOutcome::Queued
    }

    /// Looks at every key without changing anything.
    fn survey_keys(
        &self,
        now: Instant,
        keys: &KeyGroup,
        hashes: &GroupHashes,
        modes: KeyModes,
    ) -> KeySurvey {
        let limits = self.config.limits;
        let mut new_keys = 0;
        let mut all_free = true;
        let mut some_queue_full = false;
        for (i, (key, &hash)) in keys.keys().iter().zip(hashes).enumerate() {
            match self.keys.find(hash, key.as_bytes()) {
                None => new_keys += 1,
                Some(entry) => {
                    // FIFO: a key with waiters is never free for a newcomer,
                    // even if its holder is gone; a sharer batch without
                    // waiters takes one more sharer.
                    let held = !compatible_at(entry, modes.is_shared(i), now);
                    // The planted bug treats a held key without waiters as free.
                    #[cfg(feature = "planted-bugs")]
                    let held = held
                        && (entry.is_queued() || !planted::active(planted::PlantedBug::GrantTwice));
                    // The planted bug lets a sharer join a batch past the
                    // waiters.
                    #[cfg(feature = "planted-bugs")]
                    let queued = entry.is_queued()
                        && !super::shared::planted_jumps_queue(entry, modes.is_shared(i), now);
                    #[cfg(not(feature = "planted-bugs"))]
                    let queued = entry.is_queued();
                    if queued || held {
                        all_free = false;
                    }
                    some_queue_full |= self.entry_queue_len(hash, key.as_bytes(), entry)
                        >= limits.waiters_per_key_max;
                }
            }
        }
        let over_key_limit = self.keys.len() + new_keys > limits.keys_max;
        KeySurvey {
            all_free,
            some_queue_full,
            over_key_limit,
        }
    }

    /// Every key is free: grants them all under one new token, unless the
    /// key limit or the token limit says `B`.
    fn grant_free_keys(
        &mut self,
        now: Instant,
        (keys, hashes): (&KeyGroup, &GroupHashes),
        options: &AcquireOptions,
        modes: KeyModes,
        over_key_limit: bool,
    ) -> AcquireOutcome {
        if over_key_limit {
            self.metrics.busy.keys_max += 1;
            return AcquireOutcome::Busy;
        }
        if self.next_token > self.token_limit {
            self.metrics.busy.token_reserve += 1;
            return AcquireOutcome::Busy;
        }
        let token = self.issue_token();
        let lease_s = options.lease_s;
        let cap_at = self.record_cap(token, now, options.max_hold);
        let lease_deadline = capped_deadline(now, lease_duration(lease_s), cap_at);
        let group_len = group_len(keys.len());
        for (i, (key, &hash)) in keys.keys().iter().zip(hashes).enumerate() {
            // An expired holder is simply overwritten (lazy expiry).
            let entry = self.keys.get_or_insert_with(
                hash,
                key.as_bytes(),
                StoredKey::from_bytes,
                KeyEntry::unheld,
            );
            if modes.is_shared(i) {
                let grant = (options.holder, group_len, lease_s);
                let sharer = new_sharer(token, lease_deadline, grant, cap_at.is_some());
                self.add_sharer(hash, key.as_bytes(), sharer, now, false);
                continue;
            }
            if entry.token != 0 {
                expire_holder(
                    &mut self.metrics,
                    (&mut self.sets, &mut self.extensions),
                    &mut self.sharers,
                    (key.as_bytes(), entry),
                    false,
                );
            } else {
                self.holder_keys += 1;
            }
            entry.token = token;
            entry.lease_deadline = lease_deadline;
            entry.set_grant(options.holder, group_len, lease_s);
            entry.set_extension(cap_at.is_some());
        }
        self.sets
            .granted(token, keys.keys().iter().map(|key| key.as_bytes()));
        self.metrics.grants_immediate += 1;
        self.metrics.wait.observe(Duration::ZERO);
        AcquireOutcome::Granted { token }
    }

    /// Some key is taken: the answer if the request may not wait (a zero
    /// wait, or a capacity limit), `None` if it may be queued.
    fn refuse_to_queue(&mut self, wait_s: u8, survey: &KeySurvey) -> Option<AcquireOutcome> {
        let limits = self.config.limits;
        if wait_s == 0 {
            self.metrics.timeouts_wait_zero += 1;
            return Some(AcquireOutcome::TimedOut);
        }
        if survey.over_key_limit {
            self.metrics.busy.keys_max += 1;
            return Some(AcquireOutcome::Busy);
        }
        if survey.some_queue_full {
            self.metrics.busy.waiters_per_key_max += 1;
            return Some(AcquireOutcome::Busy);
        }
        if self.waiters.len() >= limits.waiters_total_max {
            self.metrics.busy.waiters_total_max += 1;
            return Some(AcquireOutcome::Busy);
        }
        None
    }

    /// Appends waiter `seq` to the queue of each of `keys`, creating keys
    /// and queues as needed.
    fn enqueue_on_keys(&mut self, now: Instant, seq: u64, keys: &[WaitedKey]) {
        for WaitedKey {
            hash, bytes: key, ..
        } in keys
        {
            let hash = *hash;
            let entry =
                self.keys
                    .get_or_insert_with(hash, key, StoredKey::from_bytes, KeyEntry::unheld);
            if entry.token != 0 && !entry.is_held_at(now) {
                // Expire lazily now: a key with waiters must not keep a dead
                // holder that no lease deadline will ever clear.
                expire_holder(
                    &mut self.metrics,
                    (&mut self.sets, &mut self.extensions),
                    &mut self.sharers,
                    (key, entry),
                    false,
                );
                entry.token = 0;
                self.holder_keys -= 1;
            }
            if !entry.is_queued() {
                entry.set_queued(true);
                let queue = self.spare_queues.pop().unwrap_or_default();
                self.queues.insert_absent(hash, key.clone(), queue);
            }
            let Some(queue) = self.queues.find_mut(hash, key) else {
                unreachable!("inserted above");
            };
            if queue.is_empty() && entry.token != 0 {
                // From now on this key's lease end must hand it over.
                self.lease_deadlines.push(Reverse(LeaseDeadline {
                    deadline: entry.lease_deadline,
                    token: entry.token,
                    key: key.clone(),
                    hash,
                }));
            }
            queue.push_back(seq);
            self.queued_pairs += 1;
        }
    }

    /// Records waiter `seq` (already in its keys' queues) and its wait
    /// deadline.
    fn add_waiter(
        &mut self,
        now: Instant,
        seq: u64,
        waiter: WaiterId,
        (keys, modes): (WaitedKeys, KeyModes),
        options: &AcquireOptions,
    ) {
        let wait_deadline = queue_rule::wait_deadline(
            now,
            Duration::from_secs(u64::from(options.wait_s)),
            self.config.wait_margin,
        );
        self.wait_deadlines.push(Reverse((wait_deadline, seq)));
        let previous = self.waiter_seqs.insert(waiter, seq);
        debug_assert!(
            previous.is_none(),
            "waiter id {waiter:?} reused while queued"
        );
        self.waiters.insert(
            seq,
            Waiter {
                id: waiter,
                keys,
                wait_deadline,
                lease_s: options.lease_s,
                modes,
                holder: options.holder,
                max_hold: options.max_hold,
                queued_at: now,
            },
        );
    }

    /// Records the cap of new grant `token`, made at `now`, if it has one
    /// (`max_hold` after the grant), and returns it.
    pub(super) fn record_cap(
        &mut self,
        token: u64,
        now: Instant,
        max_hold: Option<Duration>,
    ) -> Option<Instant> {
        let cap_at = now.saturating_add(max_hold?);
        self.extensions.insert(
            token,
            GrantExtension {
                granted_at: now,
                cap_at: Some(cap_at),
                extensions: 0,
            },
        );
        Some(cap_at)
    }
}
