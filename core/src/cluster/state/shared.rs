//! Shared holds in the replicated state: a key held by several shared
//! grants at once (docs/protocol.md §8.7), and the downgrade of a whole
//! grant from exclusive to shared.
//!
//! The key map keeps one token per held key, so everything that asks "is
//! this key held, and by whom" works unchanged: for a key held shared it is
//! the **oldest** sharer's (lowest token), which is also the one an
//! operator's force-release without a token revokes, as in single mode.
//! The sharers of each key held shared are in a map of their own, lowest
//! token first; a key held exclusive has no entry there. Tokens only grow,
//! so a sharer joins at the end and the list stays sorted without a sort.

use super::ReplicatedLocks;
use crate::cluster::command::ApplyResult;
use crate::keyed::KeyHash;
use crate::lock::KeyModes;
use crate::queue_rule::{HeldMode, mode_admits};
use crate::wire::{Key, KeyGroup};

impl ReplicatedLocks {
    /// How `key` (hash `hash`) is held.
    fn held_mode_hashed(&self, hash: KeyHash, key: &Key) -> HeldMode {
        if self.keys.find(hash, key.as_bytes()).is_none() {
            HeldMode::Free
        } else if self.sharers.len() > 0 && self.sharers.get(key.as_bytes()).is_some() {
            HeldMode::Shared
        } else {
            HeldMode::Exclusive
        }
    }

    /// How `key` is held in the applied state.
    pub(crate) fn held_mode(&self, key: &Key) -> HeldMode {
        self.held_mode_hashed(self.keys.hash(key.as_bytes()), key)
    }

    /// Whether `key` (hash `hash`) may be taken by a new grant in the given
    /// mode (the rule single mode and the leader follow): it is free, or it
    /// is wanted shared and held only shared.
    pub(super) fn key_takes(&self, hash: KeyHash, key: &Key, shared: bool) -> bool {
        mode_admits(self.held_mode_hashed(hash, key), shared)
    }

    /// Records grant `token`'s hold on `key` (which [`Self::key_takes`]
    /// allowed in this mode).
    pub(super) fn hold_key(&mut self, hash: KeyHash, key: &Key, token: u64, shared: bool) {
        if !shared {
            self.keys.insert_absent(hash, key.clone(), token);
            return;
        }
        // The sharer map has a hasher of its own: a key held shared is
        // hashed again, a key held exclusive is not.
        let sharers_hash = self.sharers.hash(key.as_bytes());
        match self.sharers.find_mut(sharers_hash, key.as_bytes()) {
            Some(sharers) => {
                debug_assert!(sharers.last().is_some_and(|&last| last < token));
                sharers.push(token);
                self.extra_sharer_holds += 1;
            }
            None => {
                self.keys.insert_absent(hash, key.clone(), token);
                self.sharers
                    .insert_absent(sharers_hash, key.clone(), vec![token]);
            }
        }
    }

    /// Takes grant `token`'s hold off `key`: a sharer leaves the others
    /// holding (the oldest left becomes the key's token); the last one, or
    /// an exclusive holder, frees the key.
    pub(super) fn unhold_key(&mut self, key: &Key, token: u64) {
        let bytes = key.as_bytes();
        let hash = self.keys.hash(bytes);
        // Without any key held shared (no `Y` ever used), no second hash.
        let sharers_hash = (self.sharers.len() > 0).then(|| self.sharers.hash(bytes));
        let found = sharers_hash.and_then(|h| Some((h, self.sharers.find_mut(h, bytes)?)));
        let Some((sharers_hash, sharers)) = found else {
            self.keys.remove_if(hash, bytes, |&held| held == token);
            return;
        };
        let Some(at) = sharers.iter().position(|&sharer| sharer == token) else {
            return;
        };
        sharers.remove(at);
        match sharers.first().copied() {
            Some(oldest) => {
                self.extra_sharer_holds -= 1;
                if let Some(held) = self.keys.find_mut(hash, bytes) {
                    *held = oldest;
                }
            }
            None => {
                self.sharers.remove(sharers_hash, bytes);
                self.keys.remove(hash, bytes);
            }
        }
    }

    /// The grant an operator's force-release of `key` revokes: the
    /// holder, or for a key held shared the named sharer or, without a
    /// token, the oldest one (one per call, as in single mode). `Err` with
    /// the refusal when the key is free or `token` does not hold it.
    pub(crate) fn force_target(&self, key: &Key, token: Option<u64>) -> Result<u64, ApplyResult> {
        let Some(held) = self.keys.get(key.as_bytes()).copied() else {
            return Err(ApplyResult::ForceNotHeld);
        };
        let holds = |wanted: u64| match self.sharers.get(key.as_bytes()) {
            Some(sharers) => sharers.contains(&wanted),
            None => wanted == held,
        };
        match token {
            None => Ok(held),
            Some(token) if holds(token) => Ok(token),
            // The oldest sharer, as single mode names it.
            Some(_) => Err(ApplyResult::ForceTokenMismatch { held }),
        }
    }

    /// Turns grant `token` of exactly `keys` shared on every key, in place:
    /// same token, lease and cap (keys already shared stay so, so a second
    /// downgrade is answered as the first). Refused as a release would be
    /// otherwise (single mode's refusal), and for a semaphore's permits,
    /// which have no modes.
    pub(super) fn apply_downgrade(&mut self, keys: &KeyGroup, token: u64) -> ApplyResult {
        let Some(holding) = self.grants.get_mut(&token) else {
            return ApplyResult::NotFound;
        };
        if &holding.keys != keys {
            return group_refusal(&holding.keys, keys);
        }
        if holding.options.capacity.is_some() {
            return ApplyResult::NotFound;
        }
        let before = KeyModes::from_bits(holding.options.shared_modes);
        let all_shared = KeyModes::all_shared(keys.len());
        if before == all_shared {
            return ApplyResult::Downgraded;
        }
        holding.options.shared_modes = all_shared.bits();
        for (index, key) in keys.keys().iter().enumerate() {
            if before.is_shared(index) {
                continue;
            }
            // Held exclusive by this grant alone: it becomes the only
            // sharer, and the key map already names it.
            let hash = self.sharers.hash(key.as_bytes());
            self.sharers.insert_absent(hash, key.clone(), vec![token]);
        }
        self.metrics.downgrades += 1;
        ApplyResult::Downgraded
    }

    /// The running shared grants of `key`, oldest (lowest token) first:
    /// empty if the key is free or held exclusive.
    pub fn sharers_of(&self, key: &Key) -> &[u64] {
        self.sharers.get(key.as_bytes()).map_or(&[], Vec::as_slice)
    }

    /// Whether `key` is held shared (by one sharer or more).
    pub fn is_held_shared(&self, key: &Key) -> bool {
        self.sharers.get(key.as_bytes()).is_some()
    }

    /// Number of holds on keys: each held key once, plus one for every
    /// sharer beyond a key's first (what the key limit counts, so that a
    /// crowd of readers on one key is bounded like as many keys).
    pub fn key_holds(&self) -> usize {
        self.keys.len() + self.extra_sharer_holds
    }
}

/// The refusal of a release or downgrade naming `named` of a grant whose
/// keys are `held`: `GroupMismatch` when a named key is one of the grant's,
/// else `NotFound` (single mode's rule).
pub(super) fn group_refusal(held: &KeyGroup, named: &KeyGroup) -> ApplyResult {
    let overlaps = named
        .keys()
        .iter()
        .any(|key| held.keys().binary_search(key).is_ok());
    if overlaps {
        ApplyResult::GroupMismatch
    } else {
        ApplyResult::NotFound
    }
}
