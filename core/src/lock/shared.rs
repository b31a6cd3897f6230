//! Shared and exclusive modes on a key: the queue rules.
//!
//! A key is held either by one exclusive grant (its entry's token) or by a
//! **sharer batch**: any number of shared grants, each with its own token
//! (from the one counter), lease, holder tag and extension record, kept in
//! the table's sharer map as entries of their own. The key's entry then has
//! its shared bit set and carries the token and deadline of the sharer whose
//! lease ends last, so everything that asks "is this key held, and until
//! when" (the lease-deadline heap, the sweep, lazy expiry) works unchanged.
//!
//! The rules, all FIFO across modes on one queue per key:
//!
//! - A shared request is granted at once when the key is free or held
//!   shared **and nobody waits**; an exclusive one only when it is free.
//! - At the front of a queue, consecutive shared requests join the batch
//!   together; an exclusive request waits for every sharer; a shared
//!   request behind a queued exclusive one waits behind it. Nobody starves:
//!   a newcomer never passes a waiter.
//! - A key set mixes modes per key and is granted when it heads every
//!   key's queue and every key would take it in its mode.
//! - A downgrade turns an exclusive grant into a shared one in place (same
//!   token, same lease), then lets the shared requests queued directly
//!   behind it join. There is no upgrade: release and queue again.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::entry::{KeyEntry, StoredKey};
use super::expiry::note_expiry;
use super::extend::{Extensions, GrantExtension};
use super::{GrantRecord, GroupHashes, LeaseDeadline, LockTable, SetGrants};
use crate::keyed::KeyHash;
use crate::metrics::LockMetrics;
use crate::queue_rule::{HeldMode, mode_admits};
use crate::time::Instant;
use crate::wire::{KeyGroup, SET_KEYS_MAX};

/// Which keys of a request are wanted in shared mode: bit `i` for key `i`
/// of the group (ascending, as on the wire). The default is every key
/// exclusive, the only mode before shared locks existed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyModes(u16);

impl KeyModes {
    /// Every key exclusive.
    pub const EXCLUSIVE: KeyModes = KeyModes(0);

    /// Every one of `len` keys shared (at most 16).
    pub fn all_shared(len: usize) -> Self {
        debug_assert!(len <= SET_KEYS_MAX);
        KeyModes(((1u32 << len.min(SET_KEYS_MAX)) - 1) as u16)
    }

    /// From a bit mask: bit `i` set wants key `i` shared.
    pub fn from_bits(bits: u16) -> Self {
        KeyModes(bits)
    }

    /// The bit mask.
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Whether key `index` of the group is wanted shared.
    pub fn is_shared(self, index: usize) -> bool {
        index < SET_KEYS_MAX && self.0 & (1 << index) != 0
    }
}

/// Answer to a downgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DowngradeOutcome {
    /// The grant now holds its keys shared, under the same token and lease.
    Downgraded,
    /// The token is not a running grant on any named key: nothing changed.
    NotFound,
    /// The token is current on some named key, but its grant covers a
    /// different key group: nothing changed.
    GroupMismatch,
}

/// The shared holders of each key held shared, as entries of their own
/// (token, lease deadline, holder tag, group size, lease, extension bit).
pub(super) type Sharers = HashMap<Box<[u8]>, Vec<KeyEntry>>;

/// Whether a key whose entry is `entry` can be taken at `at` in the given
/// mode, waiters aside.
pub(super) fn compatible_at(entry: &KeyEntry, shared: bool, at: Instant) -> bool {
    let held = match (entry.is_held_at(at), entry.is_shared()) {
        (false, _) => HeldMode::Free,
        (true, true) => HeldMode::Shared,
        (true, false) => HeldMode::Exclusive,
    };
    let compatible = mode_admits(held, shared);
    // The planted bug lets a sharer in beside an exclusive holder.
    #[cfg(feature = "planted-bugs")]
    let compatible = compatible
        || (shared
            && crate::testing::planted::active(
                crate::testing::planted::PlantedBug::ShareBesideWriter,
            ));
    compatible
}

/// The planted `SharedJumpsWriter`: whether a newcomer wanting the key
/// shared may join its running batch past the key's waiters.
#[cfg(feature = "planted-bugs")]
pub(super) fn planted_jumps_queue(entry: &KeyEntry, shared: bool, at: Instant) -> bool {
    shared
        && entry.is_shared()
        && entry.is_held_at(at)
        && crate::testing::planted::active(crate::testing::planted::PlantedBug::SharedJumpsWriter)
}

/// Ends every sharer of `key` (the batch's last lease ran out, or a new
/// grant overwrites sharers whose leases all ended), counting each expiry.
/// The caller clears the key's token and shared bit. True if the expiry of
/// sharer `last_token` (the one whose lease ended last) was counted here.
fn end_sharers(
    metrics: &mut LockMetrics,
    grants: (&mut SetGrants, &mut Extensions),
    sharers: &mut Sharers,
    (key, last_token): (&[u8], u64),
    handed_over: bool,
) -> bool {
    let (sets, extensions) = grants;
    let mut last_counted = false;
    for sharer in sharers.remove(key).unwrap_or_default() {
        let counted = note_expiry(
            metrics,
            (&mut *sets, &mut *extensions),
            &sharer,
            handed_over,
        );
        last_counted |= counted && sharer.token == last_token;
    }
    last_counted
}

/// Counts the end of the holder recorded on `entry` (an exclusive grant,
/// or every sharer of a key held shared), whose lease ended, and clears the
/// shared bit; the caller then overwrites or clears the token. True if the
/// expiry of the grant whose token `entry` records (the exclusive holder,
/// or the sharer whose lease ended last) was counted here (see
/// `note_expiry`), so that a hand-over is reported once per grant.
pub(super) fn expire_holder(
    metrics: &mut LockMetrics,
    grants: (&mut SetGrants, &mut Extensions),
    sharers: &mut Sharers,
    (key, entry): (&[u8], &mut KeyEntry),
    handed_over: bool,
) -> bool {
    if entry.is_shared() {
        let counted = end_sharers(metrics, grants, sharers, (key, entry.token), handed_over);
        entry.set_shared(false);
        counted
    } else {
        note_expiry(metrics, grants, entry, handed_over)
    }
}

/// A shared grant's own entry: `token` until `lease_deadline`, with the
/// holder tag, group size and lease as in [`KeyEntry::set_grant`].
pub(super) fn new_sharer(
    token: u64,
    lease_deadline: Instant,
    (holder, group_len, lease_s): (u64, u8, u8),
    has_extension: bool,
) -> KeyEntry {
    let mut sharer = KeyEntry::unheld();
    sharer.token = token;
    sharer.lease_deadline = lease_deadline;
    sharer.set_grant(holder, group_len, lease_s);
    sharer.set_extension(has_extension);
    sharer
}

/// Sets `entry`'s token and deadline to those of the sharer whose lease
/// ends last (ties: the larger token); leaves it alone if there is none.
fn refresh_main(entry: &mut KeyEntry, sharers: &[KeyEntry]) {
    if let Some(last) = sharers
        .iter()
        .max_by_key(|sharer| (sharer.lease_deadline, sharer.token))
    {
        entry.token = last.token;
        entry.lease_deadline = last.lease_deadline;
    }
}

impl LockTable {
    /// The entry of the grant `token` on `key` (hash `hash`): the key's own
    /// entry for an exclusive holder, the sharer's for a shared one.
    pub(super) fn grant_entry(&self, hash: KeyHash, key: &[u8], token: u64) -> Option<&KeyEntry> {
        let entry = self.keys.find(hash, key)?;
        if entry.is_shared() {
            self.sharers
                .get(key)?
                .iter()
                .find(|sharer| sharer.token == token)
        } else {
            (entry.token == token).then_some(entry)
        }
    }

    /// Grant `token` on `key` as recorded, exclusive or shared (its lease
    /// may already have ended, as for [`LockTable::grant_of`]); `None` if
    /// `token` holds no part of `key`.
    pub fn grant_of_token(&self, key: &[u8], token: u64) -> Option<GrantRecord> {
        let hash = self.keys.hash(key);
        self.grant_entry(hash, key, token)
            .filter(|entry| entry.token != 0)
            .map(GrantRecord::of)
    }

    /// The cap on total hold of grant `token`, if it has one.
    pub fn cap_of(&self, token: u64) -> Option<Instant> {
        self.extensions
            .get(&token)
            .and_then(|extension| extension.cap_at)
    }

    /// The running shared grants of `key` at `at`, oldest (lowest token)
    /// first: empty if the key is not held shared.
    pub fn sharers_of(&self, key: &[u8], at: Instant) -> Vec<(u64, Instant)> {
        let mut tokens: Vec<(u64, Instant)> = self
            .sharers
            .get(key)
            .into_iter()
            .flatten()
            .filter(|sharer| sharer.is_held_at(at))
            .map(|sharer| (sharer.token, sharer.lease_deadline))
            .collect();
        tokens.sort_unstable();
        tokens
    }

    /// Adds shared grant `sharer` to `key` (hash `hash`, already in the
    /// table and compatible at `now`): an exclusive holder whose lease
    /// ended and sharers whose leases ended go first (counted as handed
    /// over if `handed_over`).
    pub(super) fn add_sharer(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        sharer: KeyEntry,
        now: Instant,
        handed_over: bool,
    ) {
        let Some(entry) = self.keys.find_mut(hash, key) else {
            debug_assert!(false, "a sharer added to a key not in the table");
            return;
        };
        if entry.token != 0 && !entry.is_shared() {
            note_expiry(
                &mut self.metrics,
                (&mut self.sets, &mut self.extensions),
                entry,
                handed_over,
            );
            entry.token = 0;
        }
        if entry.token == 0 {
            self.holder_keys += 1;
            entry.set_grant(0, 0, 0);
            entry.set_extension(false);
            entry.set_shared(true);
        }
        let list = self.sharers.entry(key.into()).or_default();
        let (metrics, sets, extensions) = (&mut self.metrics, &mut self.sets, &mut self.extensions);
        list.retain(|old| {
            let live = old.is_held_at(now);
            if !live {
                note_expiry(metrics, (&mut *sets, &mut *extensions), old, handed_over);
            }
            live
        });
        list.push(sharer);
        refresh_main(entry, list);
        self.push_queued_deadline(hash, key);
    }

    /// Takes sharer `token` off `key` (released or force-released): the
    /// key's deadline becomes the remaining sharers', or the key is free.
    /// Returns whether the key still has waiters.
    pub(super) fn remove_sharer(&mut self, hash: KeyHash, key: &[u8], token: u64) -> bool {
        let Some(entry) = self.keys.find_mut(hash, key) else {
            return false;
        };
        let list = self.sharers.get_mut(key);
        let left = list.map_or(0, |list| {
            list.retain(|sharer| sharer.token != token);
            refresh_main(entry, list);
            list.len()
        });
        let queued = entry.is_queued();
        if left == 0 {
            self.sharers.remove(key);
            self.holder_keys -= 1;
            entry.token = 0;
            entry.set_shared(false);
            if !queued {
                self.keys.remove(hash, key);
            }
        } else {
            self.push_queued_deadline(hash, key);
        }
        queued
    }

    /// Moves sharer `token`'s lease on `key` to `expires_at` (an
    /// extension already decided), recording its start on its first one.
    pub(super) fn extend_sharer(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        token: u64,
        expires_at: Instant,
    ) {
        let Some(entry) = self.keys.find_mut(hash, key) else {
            return;
        };
        let Some(list) = self.sharers.get_mut(key) else {
            return;
        };
        if let Some(sharer) = list.iter_mut().find(|sharer| sharer.token == token) {
            if !sharer.has_extension() {
                let granted_at = sharer.granted_at();
                sharer.set_extension(true);
                self.extensions.entry(token).or_insert(GrantExtension {
                    granted_at,
                    cap_at: None,
                    extensions: 0,
                });
            }
            sharer.lease_deadline = expires_at;
        }
        refresh_main(entry, list);
        self.push_queued_deadline(hash, key);
    }

    /// A key with waiters whose holder's deadline moved gets a heap entry
    /// for the new one (the old goes stale), so its end hands it on.
    fn push_queued_deadline(&mut self, hash: KeyHash, key: &[u8]) {
        if let Some(entry) = self.keys.find(hash, key)
            && entry.is_queued()
            && entry.token != 0
        {
            self.lease_deadlines.push(Reverse(LeaseDeadline {
                deadline: entry.lease_deadline,
                token: entry.token,
                key: StoredKey::from_bytes(key),
                hash,
            }));
        }
    }

    /// Turns grant `token` on exactly `keys` from exclusive to shared, in
    /// place: same token, same lease and cap. Keys it already holds shared
    /// stay so. Shared requests queued directly behind then join it.
    pub fn downgrade(&mut self, now: Instant, keys: &KeyGroup, token: u64) -> DowngradeOutcome {
        let now = self.advance(now);
        let hashes = self.hash_group(keys);
        let outcome = self.downgrade_at(now, keys, &hashes, token);
        self.tidy();
        outcome
    }

    fn downgrade_at(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        hashes: &GroupHashes,
        token: u64,
    ) -> DowngradeOutcome {
        if token == 0 {
            return DowngradeOutcome::NotFound;
        }
        let pairs = || keys.keys().iter().zip(hashes);
        let found: Vec<&KeyEntry> = pairs()
            .filter_map(|(key, &hash)| self.grant_entry(hash, key.as_bytes(), token))
            .filter(|grant| grant.is_held_at(now))
            .collect();
        let Some(first) = found.first() else {
            return DowngradeOutcome::NotFound;
        };
        if found.len() != keys.len() || usize::from(first.group_len()) != keys.len() {
            return DowngradeOutcome::GroupMismatch;
        }
        for (key, &hash) in pairs() {
            let Some(entry) = self.keys.find_mut(hash, key.as_bytes()) else {
                continue;
            };
            if entry.is_shared() {
                continue;
            }
            let grant = (entry.holder(), entry.group_len(), entry.lease_s());
            let sharer = new_sharer(
                entry.token,
                entry.lease_deadline,
                grant,
                entry.has_extension(),
            );
            entry.set_shared(true);
            self.sharers.insert(key.as_bytes().into(), vec![sharer]);
        }
        for (key, &hash) in pairs() {
            self.grant_front(hash, key.as_bytes(), now, now);
        }
        DowngradeOutcome::Downgraded
    }
}
