//! Read-only inspection of the lock table and the operator's
//! force-release (see [`crate::inspect`]).
//!
//! Nothing here adds memory to a key: a holder's whole group is found by
//! walking the table only when the grant is a set (its entry records the
//! group's size, not its keys), and a listing walks the map once, keeping
//! the `limit` smallest matching keys in a bounded heap. Costs: one key
//! O(queue length), plus O(keys) when its holder is a set; a listing
//! O(keys × log limit) plus one more O(keys) walk when a listed holder is
//! a set (about 45–95 ms of CPU per million keys, docs/admin-api.md). Both
//! are operator actions, never on the lock path.

use std::collections::{BinaryHeap, HashMap};

use super::{KeyEntry, LockTable, WaiterId};
use crate::inspect::{
    ForceReleaseOutcome, LISTED_WAITERS_MAX, LISTING_LIMIT_MAX, WAITERS_PER_LISTED_LOCK_MAX,
};
use crate::time::{Instant, duration_millis};
use crate::wire::{Key, KeyGroup};

/// A key's state as the table knows it, at the `now` it was asked for.
/// Connections are the caller's to add (the table knows waiter ids only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInspection {
    /// The key.
    pub key: Key,
    /// The running grant on it, if any.
    pub holder: Option<HolderInspection>,
    /// Its waiters in queue order, the front ones only (see
    /// [`LockTable::inspect_key`] and [`LockTable::inspect_prefix`]).
    pub waiters: Vec<WaiterInspection>,
    /// Waiters queued on it in all.
    pub waiters_total: usize,
}

/// A running grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInspection {
    /// Its token.
    pub token: u64,
    /// Every key of the grant, ascending.
    pub keys: Vec<Key>,
    /// Milliseconds since the grant.
    pub held_ms: u64,
    /// Milliseconds until the lease ends.
    pub lease_remaining_ms: u64,
}

/// A queued waiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterInspection {
    /// The id its caller queued it under.
    pub waiter: WaiterId,
    /// Every key it asked for, ascending.
    pub keys: Vec<Key>,
    /// Milliseconds since it was queued.
    pub waited_ms: u64,
    /// Milliseconds until its wait ends with `T`.
    pub wait_remaining_ms: u64,
}

fn to_keys<'a>(bytes: impl IntoIterator<Item = &'a [u8]>) -> Vec<Key> {
    // Every key in the table came in as a validated `Key`.
    bytes
        .into_iter()
        .filter_map(|key| Key::new(key).ok())
        .collect()
}

impl KeyEntry {
    /// Whether an operator sees anything on this key at `now`.
    fn is_visible_at(&self, now: Instant) -> bool {
        self.is_queued() || self.is_held_at(now)
    }
}

impl LockTable {
    /// The table's notion of `now` (never behind what it has seen).
    fn inspection_now(&self, now: Instant) -> Instant {
        now.max(self.now_last)
    }

    /// `key` as an operator sees it at `now`; `None` when it is neither
    /// held nor waited on. A lease that ended but was not yet noticed
    /// (lazy expiry) shows as no holder.
    pub fn inspect_key(&self, now: Instant, key: &[u8]) -> Option<KeyInspection> {
        let now = self.inspection_now(now);
        let entry = self.keys.get(key).filter(|e| e.is_visible_at(now))?;
        let group = if entry.is_held_at(now) && entry.group_len() > 1 {
            self.grant_keys(entry.token, usize::from(entry.group_len()))
        } else {
            vec![key.into()]
        };
        self.inspection(now, key, entry, group, LISTED_WAITERS_MAX)
    }

    /// The keys starting with `prefix` that are held or waited on at
    /// `now`, ascending, at most `limit` (clamped to
    /// [`LISTING_LIMIT_MAX`]), each with at most
    /// [`WAITERS_PER_LISTED_LOCK_MAX`] waiters listed; true when more keys
    /// matched.
    pub fn inspect_prefix(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
    ) -> (Vec<KeyInspection>, bool) {
        let now = self.inspection_now(now);
        let limit = limit.min(LISTING_LIMIT_MAX);
        // A max-heap of the smallest `limit` keys seen so far.
        let mut smallest: BinaryHeap<&[u8]> = BinaryHeap::with_capacity(limit + 1);
        let mut matched = 0usize;
        for (key, entry) in self.keys.iter() {
            let key = key.as_bytes();
            if !key.starts_with(prefix) || !entry.is_visible_at(now) {
                continue;
            }
            matched += 1;
            // Once full, only a key below the largest kept gets in: in hash
            // order that is rare, so most keys cost one comparison.
            if smallest.len() >= limit && smallest.peek().is_none_or(|&largest| key >= largest) {
                continue;
            }
            smallest.push(key);
            if smallest.len() > limit {
                smallest.pop();
            }
        }
        let keys = smallest.into_sorted_vec();
        // One more walk finds the other keys of every listed set grant.
        let mut set_tokens: HashMap<u64, Vec<Box<[u8]>>> = HashMap::new();
        for key in &keys {
            if let Some(entry) = self.keys.get(key)
                && entry.is_held_at(now)
                && entry.group_len() > 1
            {
                set_tokens.insert(entry.token, Vec::new());
            }
        }
        if !set_tokens.is_empty() {
            for (key, entry) in self.keys.iter() {
                if let Some(members) = set_tokens.get_mut(&entry.token) {
                    members.push(key.as_bytes().into());
                }
            }
            for members in set_tokens.values_mut() {
                members.sort_unstable();
            }
        }
        let listed = keys
            .iter()
            .filter_map(|key| {
                let entry = self.keys.get(key)?;
                let group = match set_tokens.get(&entry.token) {
                    Some(members) if entry.is_held_at(now) => members.clone(),
                    _ => vec![(*key).into()],
                };
                self.inspection(now, key, entry, group, WAITERS_PER_LISTED_LOCK_MAX)
            })
            .collect();
        (listed, matched > keys.len())
    }

    /// Every key carrying `token`, ascending (a walk: only for sets).
    fn grant_keys(&self, token: u64, group_len: usize) -> Vec<Box<[u8]>> {
        let mut keys: Vec<Box<[u8]>> = Vec::with_capacity(group_len);
        for (key, entry) in self.keys.iter() {
            if entry.token == token {
                keys.push(key.as_bytes().into());
                if keys.len() == group_len {
                    break;
                }
            }
        }
        keys.sort_unstable();
        keys
    }

    fn inspection(
        &self,
        now: Instant,
        key: &[u8],
        entry: &KeyEntry,
        group: Vec<Box<[u8]>>,
        waiters_max: usize,
    ) -> Option<KeyInspection> {
        let holder = entry.is_held_at(now).then(|| HolderInspection {
            token: entry.token,
            keys: to_keys(group.iter().map(|key| &**key)),
            held_ms: duration_millis(now.saturating_duration_since(entry.granted_at())),
            lease_remaining_ms: duration_millis(
                entry.lease_deadline.saturating_duration_since(now),
            ),
        });
        let hash = self.keys.hash(key);
        let queue = self.queues.find(hash, key).filter(|_| entry.is_queued());
        let waiters = queue
            .into_iter()
            .flatten()
            .take(waiters_max)
            .filter_map(|seq| self.waiters.get(seq))
            .map(|waiter| WaiterInspection {
                waiter: waiter.id,
                keys: to_keys(waiter.keys.iter().map(|key| &*key.bytes)),
                waited_ms: duration_millis(now.saturating_duration_since(waiter.queued_at)),
                wait_remaining_ms: duration_millis(
                    waiter.wait_deadline.saturating_duration_since(now),
                ),
            })
            .collect();
        Some(KeyInspection {
            key: Key::new(key).ok()?,
            holder,
            waiters,
            waiters_total: self.entry_queue_len(hash, key, entry),
        })
    }

    /// An operator's force-release of the grant holding `key` at `now`
    /// (only if it is `token`, when given): exactly a release by its holder
    /// (the whole set, handed to the front waiters under new tokens), and
    /// counted as one plus in [`crate::metrics::LockMetrics::force_releases`].
    pub fn force_release(
        &mut self,
        now: Instant,
        key: &[u8],
        token: Option<u64>,
    ) -> ForceReleaseOutcome {
        let now = self.advance(now);
        let outcome = self.force_release_at(now, key, token);
        self.tidy();
        outcome
    }

    fn force_release_at(
        &mut self,
        now: Instant,
        key: &[u8],
        token: Option<u64>,
    ) -> ForceReleaseOutcome {
        let Some(entry) = self.keys.get(key).filter(|e| e.is_held_at(now)) else {
            return ForceReleaseOutcome::NotHeld;
        };
        let held = entry.token;
        if token.is_some_and(|token| token != held) {
            return ForceReleaseOutcome::TokenMismatch { held };
        }
        let keys = if entry.group_len() > 1 {
            to_keys(
                self.grant_keys(held, usize::from(entry.group_len()))
                    .iter()
                    .map(|key| &**key),
            )
        } else {
            to_keys([key])
        };
        let Ok(group) = KeyGroup::new(keys.clone()) else {
            debug_assert!(false, "a grant's keys form a valid group");
            return ForceReleaseOutcome::NotHeld;
        };
        #[cfg(feature = "planted-bugs")]
        if crate::testing::planted::active(
            crate::testing::planted::PlantedBug::ForceReleaseKeepsGrant,
        ) {
            return ForceReleaseOutcome::Released {
                revoked: held,
                keys,
                handed_to: None,
            };
        }
        let hashes = self.hash_group(&group);
        if self.release_at(now, &group, &hashes, held).0 != super::ReleaseOutcome::Released {
            // Every key carrying a running grant's token is found above, so
            // this cannot happen; if it did, nothing changed.
            debug_assert!(false, "a running grant's own group did not release");
            return ForceReleaseOutcome::NotHeld;
        }
        self.metrics.force_releases += 1;
        let handed_to = self
            .keys
            .get(key)
            .map(|entry| entry.token)
            .filter(|&token| token != 0);
        ForceReleaseOutcome::Released {
            revoked: held,
            keys,
            handed_to,
        }
    }
}
