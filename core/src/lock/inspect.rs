//! Read-only inspection of the lock table and the operator's
//! force-release (see [`crate::inspect`]).
//!
//! Every call does bounded work, whatever the table's size, because it runs
//! on the state machine's thread between lock requests: one key costs its
//! listed waiters; a set holder's keys come from the set's record
//! ([`super::SetGrants`]), not a walk; a listing is a page of a scan that
//! examines at most [`LISTING_SLOTS_PER_CALL_MAX`] slots and goes on from
//! a [`ListingCursor`] in the next call.

use super::{KeyEntry, LockTable, WaiterId};
use crate::inspect::{
    ForceReleaseOutcome, LISTED_WAITERS_MAX, LISTING_LIMIT_MAX, LISTING_SLOTS_PER_CALL_MAX,
    ListingCursor, WAITERS_PER_LISTED_LOCK_MAX,
};
use crate::time::{Instant, duration_millis};
use crate::wire::{Key, KeyGroup};

/// A key's state as the table knows it, at the `now` it was asked for.
/// Connections are the caller's to add (the table knows waiter ids only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInspection {
    /// The key.
    pub key: Key,
    /// The running grant on it, if any; for a key held shared, the oldest
    /// sharer.
    pub holder: Option<HolderInspection>,
    /// Every running shared grant on it, oldest first (the sharer batch);
    /// empty unless the key is held shared.
    pub sharers: Vec<HolderInspection>,
    /// Its waiters in queue order, the front ones only (see
    /// [`LockTable::inspect_key`] and [`LockTable::inspect_page`]).
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
    /// How many extensions moved the lease.
    pub extensions: u32,
    /// Milliseconds until the grant's cap on total hold (`None`: no cap):
    /// the latest it can end, however often renewed.
    pub hold_remaining_ms: Option<u64>,
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
    /// It wants this key shared (docs/protocol.md §8.7).
    pub shared: bool,
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
        let group = self.holder_group(now, key, entry);
        self.inspection(now, key, entry, group, LISTED_WAITERS_MAX)
    }

    /// One page of the keys starting with `prefix` that are held or waited
    /// on at `now`: the scan goes on from `cursor`, examines at most
    /// [`LISTING_SLOTS_PER_CALL_MAX`] slots of the table and stops after
    /// `limit` (clamped to [`LISTING_LIMIT_MAX`]) keys; the page is
    /// ascending, each key with at most [`WAITERS_PER_LISTED_LOCK_MAX`]
    /// waiters listed. With the cursor of the next page, `None` at the
    /// end of the table.
    pub fn inspect_page(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
        cursor: ListingCursor,
    ) -> (Vec<KeyInspection>, Option<ListingCursor>) {
        let now = self.inspection_now(now);
        let limit = limit.clamp(1, LISTING_LIMIT_MAX);
        let slots = self.keys.slots();
        let (mut keys, next) = self.keys.scan(
            cursor.slot_in(slots),
            LISTING_SLOTS_PER_CALL_MAX,
            limit,
            |key, entry| key.as_bytes().starts_with(prefix) && entry.is_visible_at(now),
        );
        keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let listed = keys
            .into_iter()
            .filter_map(|key| {
                let key = key.as_bytes();
                let entry = self.keys.get(key)?;
                let group = self.holder_group(now, key, entry);
                self.inspection(now, key, entry, group, WAITERS_PER_LISTED_LOCK_MAX)
            })
            .collect();
        (listed, next.map(|slot| ListingCursor::at(0, slot, slots)))
    }

    /// Every key of the grant on `key` (whose entry is `entry`), ascending:
    /// the key alone unless its holder is a running set.
    fn holder_group(&self, now: Instant, key: &[u8], entry: &KeyEntry) -> Vec<Box<[u8]>> {
        if entry.is_held_at(now) && entry.group_len() > 1 {
            self.grant_keys(entry.token)
        } else {
            vec![key.into()]
        }
    }

    /// Every key of set grant `token`, ascending (recorded when the set was
    /// granted, so no walk of the table).
    fn grant_keys(&self, token: u64) -> Vec<Box<[u8]>> {
        let members = self.sets.members(token);
        debug_assert!(
            members.is_some(),
            "a running set grant has its keys recorded"
        );
        members.map(<[Box<[u8]>]>::to_vec).unwrap_or_default()
    }

    /// The inspection of the grant recorded on `entry` (a key's own entry,
    /// or a sharer's), whose keys are `group`.
    fn holder_inspection(
        &self,
        now: Instant,
        entry: &KeyEntry,
        group: Vec<Box<[u8]>>,
    ) -> HolderInspection {
        let extension = entry
            .has_extension()
            .then(|| self.extensions.get(&entry.token))
            .flatten();
        HolderInspection {
            token: entry.token,
            keys: to_keys(group.iter().map(|key| &**key)),
            held_ms: duration_millis(now.saturating_duration_since(self.grant_start(entry))),
            lease_remaining_ms: duration_millis(
                entry.lease_deadline.saturating_duration_since(now),
            ),
            extensions: extension.map_or(0, |e| e.extensions),
            hold_remaining_ms: extension
                .and_then(|e| e.cap_at)
                .map(|cap_at| duration_millis(cap_at.saturating_duration_since(now))),
        }
    }

    fn inspection(
        &self,
        now: Instant,
        key: &[u8],
        entry: &KeyEntry,
        group: Vec<Box<[u8]>>,
        waiters_max: usize,
    ) -> Option<KeyInspection> {
        let sharers: Vec<HolderInspection> = self
            .sharers_of(key, now)
            .into_iter()
            .filter_map(|(token, _)| {
                let sharer = self.grant_entry(self.keys.hash(key), key, token)?;
                let group = self.holder_group(now, key, sharer);
                Some(self.holder_inspection(now, sharer, group))
            })
            .collect();
        let holder = match sharers.first() {
            Some(oldest) => Some(oldest.clone()),
            None => entry
                .is_held_at(now)
                .then(|| self.holder_inspection(now, entry, group)),
        };
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
                shared: waiter
                    .keys
                    .iter()
                    .position(|waited| *waited.bytes == *key)
                    .is_some_and(|i| waiter.modes.is_shared(i)),
                waited_ms: duration_millis(now.saturating_duration_since(waiter.queued_at)),
                wait_remaining_ms: duration_millis(
                    waiter.wait_deadline.saturating_duration_since(now),
                ),
            })
            .collect();
        Some(KeyInspection {
            key: Key::new(key).ok()?,
            holder,
            sharers,
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
        let Some(mut entry) = self.keys.get(key).filter(|e| e.is_held_at(now)) else {
            return ForceReleaseOutcome::NotHeld;
        };
        let shared = entry.is_shared();
        if shared {
            // A sharer batch: the named sharer, or without a token the
            // oldest one (one per call, so each revocation is reported).
            let sharers = self.sharers_of(key, now);
            let Some(&(oldest, _)) = sharers.first() else {
                return ForceReleaseOutcome::NotHeld;
            };
            let chosen = token.unwrap_or(oldest);
            let hash = self.keys.hash(key);
            match self
                .grant_entry(hash, key, chosen)
                .filter(|e| e.is_held_at(now))
            {
                Some(sharer) => entry = sharer,
                None => return ForceReleaseOutcome::TokenMismatch { held: oldest },
            }
        }
        let held = entry.token;
        if token.is_some_and(|token| token != held) {
            return ForceReleaseOutcome::TokenMismatch { held };
        }
        let first_new_token = self.next_token;
        let keys = to_keys(self.holder_group(now, key, entry).iter().map(|key| &**key));
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
            // Sharers left beside a revoked one were not handed anything.
            .filter(|&token| token != 0 && (!shared || token >= first_new_token));
        ForceReleaseOutcome::Released {
            revoked: held,
            keys,
            handed_to,
        }
    }
}
