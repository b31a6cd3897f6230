//! The replicated lock state: who holds what under which token, and the
//! fencing-token counter. Every node applies the same committed commands in
//! the same order and so holds the same state; only lease deadlines are
//! local (each node counts a lease on its own clock from when it applied the
//! grant), and those never change the state by themselves — removal happens
//! only through a committed [`Command::Expire`].
//!
//! Queues of waiters are not replicated: they live on the leader only
//! (`node/leadership.rs`), because a waiter is tied to a client connection on that
//! node and has had no effect until its Grant commits.

use crate::cluster::bytes::{Reader, put_key_group};
use crate::cluster::command::{ApplyResult, Command};
use crate::hash::IdMap;
use crate::lock::keyed::{KeyHash, Keyed};
use crate::metrics::ReplicatedLockMetrics;
use crate::time::{Duration, Instant, duration_micros};
use crate::wire::{Key, KeyGroup, SET_KEYS_MAX};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A snapshot's token counter must not exceed this (2^63): counters start
/// below [`crate::cluster::command::FIRST_TOKEN_MAX`] (2^62) and grow by one
/// per grant, so a larger one is corruption. The bound leaves 2^63 grants
/// before `checked_add` would refuse.
pub const SNAPSHOT_NEXT_TOKEN_MAX: u64 = 1 << 63;

/// Version byte that starts every snapshot.
const SNAPSHOT_VERSION: u8 = 1;

/// The deadline heap is rebuilt from live grants once it holds more than
/// twice their number plus this many entries, so stale entries stay bounded
/// while the rebuild cost stays amortised O(1) per grant.
const HEAP_SLACK: usize = 1_024;

/// One grant: a key group held under one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The keys, ascending.
    pub keys: KeyGroup,
    /// The lease the grant was made with.
    pub lease_ms: u32,
    /// When the lease ends on this node's clock: apply time (or snapshot
    /// install time) plus the (remaining) lease — never earlier than the
    /// node learned of the grant, so a new leader never shortens a lease.
    pub deadline: Instant,
    /// When this node applied the grant (or installed the snapshot that
    /// carried it), on its clock: the start of the hold-time observation.
    pub granted_at: Instant,
}

/// A snapshot that cannot be restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// Unknown version byte.
    Version(u8),
    /// Truncated, trailing bytes, or a field out of range.
    Malformed,
    /// Tokens not ascending, a token at or above the counter, or a key held
    /// by two grants.
    Inconsistent,
    /// The snapshot's token counter is below this node's: installing it
    /// would let tokens go down, so it is refused and the state kept.
    CounterBehind {
        /// This node's counter.
        current: u64,
        /// The snapshot's counter.
        snapshot: u64,
    },
}

impl core::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SnapshotError::Version(v) => write!(f, "unknown lock snapshot version {v}"),
            SnapshotError::Malformed => f.write_str("malformed lock snapshot"),
            SnapshotError::Inconsistent => f.write_str("inconsistent lock snapshot"),
            SnapshotError::CounterBehind { current, snapshot } => write!(
                f,
                "lock snapshot token counter {snapshot} is below this node's {current}"
            ),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// The replicated state machine of cluster mode.
#[derive(Clone, Debug, Default)]
pub struct ReplicatedLocks {
    /// The next token a Grant gets; 0 until [`Command::Init`] is applied.
    next_token: u64,
    /// Grants by token. Unordered: what lists them (snapshots, views)
    /// sorts them by token, which is grant order, so snapshots stay
    /// deterministic.
    grants: IdMap<u64, Holding>,
    /// The token holding each held key (the lock table's map by key
    /// bytes, under std's keyed SipHash: each key hashed once per command).
    /// Unordered: whatever lists keys sorts them.
    keys: Keyed<Key, u64>,
    /// Lease deadlines by token; entries of released or re-armed grants are
    /// skipped when they come up.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// What this node counted applying commands; local, like deadlines
    /// (kept across a snapshot install).
    metrics: ReplicatedLockMetrics,
}

impl ReplicatedLocks {
    /// An empty state with an uninitialised token counter.
    pub fn new() -> Self {
        ReplicatedLocks::default()
    }

    /// Applies one command at `applied_at` (this node's clock).
    pub fn apply(&mut self, command: &Command, applied_at: Instant) -> ApplyResult {
        match command {
            Command::Init { first_token } => {
                if self.next_token == 0 {
                    // Token 0 is never valid on the wire.
                    self.next_token = (*first_token).max(1);
                }
                ApplyResult::Noop
            }
            Command::Grant { keys, lease_ms } => self.apply_grant(keys, *lease_ms, applied_at),
            Command::Release { keys, token } => self.apply_release(keys, *token, applied_at),
            Command::Expire { keys, token } => {
                let existed = self
                    .grants
                    .get(token)
                    .is_some_and(|holding| &holding.keys == keys);
                if existed {
                    self.remove_grant(*token, applied_at);
                    self.metrics.expiries += 1;
                }
                ApplyResult::Expired { existed }
            }
            Command::ForceRelease { key, token } => {
                self.apply_force_release(key, *token, applied_at)
            }
        }
    }

    fn apply_force_release(
        &mut self,
        key: &Key,
        token: Option<u64>,
        applied_at: Instant,
    ) -> ApplyResult {
        let Some(held) = self.keys.get(key.as_bytes()).copied() else {
            return ApplyResult::ForceNotHeld;
        };
        if token.is_some_and(|t| t != held) {
            return ApplyResult::ForceTokenMismatch { held };
        }
        // The whole grant goes, as its holder's release would take it.
        self.remove_grant(held, applied_at);
        // A release like the holder's own (as in single mode), and counted
        // apart as well.
        self.metrics.releases += 1;
        self.metrics.force_releases += 1;
        ApplyResult::ForceReleased { revoked: held }
    }

    /// Decodes and applies an entry's payload; bytes that do not decode are
    /// a no-op on every node alike.
    pub fn apply_bytes(&mut self, bytes: &[u8], applied_at: Instant) -> ApplyResult {
        match Command::decode(bytes) {
            Some(command) => self.apply(&command, applied_at),
            None => ApplyResult::Noop,
        }
    }

    fn apply_grant(&mut self, keys: &KeyGroup, lease_ms: u32, applied_at: Instant) -> ApplyResult {
        if self.next_token == 0 {
            return ApplyResult::GrantRejected;
        }
        // Each key hashed once: for the check that it is free and again
        // to record its holder.
        let mut hashes = [KeyHash::default(); SET_KEYS_MAX];
        for (hash, key) in hashes.iter_mut().zip(keys.keys()) {
            *hash = self.keys.hash(key.as_bytes());
            if self.keys.find(*hash, key.as_bytes()).is_some() {
                return ApplyResult::GrantRejected;
            }
        }
        let token = self.next_token;
        let Some(next) = token.checked_add(1) else {
            // The counter is exhausted: refusing is the only way to keep
            // tokens unique.
            return ApplyResult::GrantRejected;
        };
        self.next_token = next;
        let deadline = applied_at.saturating_add(Duration::from_millis(u64::from(lease_ms)));
        for (hash, key) in hashes.iter().zip(keys.keys()) {
            self.keys.insert_absent(*hash, key.clone(), token);
        }
        self.grants.insert(
            token,
            Holding {
                keys: keys.clone(),
                lease_ms,
                deadline,
                granted_at: applied_at,
            },
        );
        self.push_deadline(deadline, token);
        self.metrics.grants += 1;
        ApplyResult::Granted { token }
    }

    fn apply_release(&mut self, keys: &KeyGroup, token: u64, applied_at: Instant) -> ApplyResult {
        match self.grants.get(&token) {
            Some(holding) if &holding.keys == keys => {
                self.remove_grant(token, applied_at);
                self.metrics.releases += 1;
                ApplyResult::Released
            }
            Some(holding) => {
                let named = keys
                    .keys()
                    .iter()
                    .any(|k| holding.keys.keys().binary_search(k).is_ok());
                if named {
                    ApplyResult::GroupMismatch
                } else {
                    ApplyResult::NotFound
                }
            }
            None => ApplyResult::NotFound,
        }
    }

    /// Removes grant `token` (released or expired at `at`).
    fn remove_grant(&mut self, token: u64, at: Instant) {
        if let Some(holding) = self.grants.remove(&token) {
            let held = at.saturating_duration_since(holding.granted_at);
            self.metrics.hold.observe(held);
            for key in holding.keys.keys() {
                self.keys
                    .remove(self.keys.hash(key.as_bytes()), key.as_bytes());
            }
        }
    }

    fn push_deadline(&mut self, deadline: Instant, token: u64) {
        self.deadlines.push(Reverse((deadline, token)));
        if self.deadlines.len() > 2 * self.grants.len() + HEAP_SLACK {
            self.rebuild_deadlines();
        }
    }

    /// Rebuilds the deadline heap from the live grants. A new leader calls
    /// this so that every held key is watched again, including those whose
    /// expiry an earlier term of this node popped but never committed.
    pub fn rebuild_deadlines(&mut self) {
        self.deadlines = self
            .grants
            .iter()
            .map(|(token, holding)| Reverse((holding.deadline, *token)))
            .collect();
    }

    /// The earliest lease deadline of a live grant (stale heap entries are
    /// dropped on the way).
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, token))) = self.deadlines.peek().copied() {
            if self
                .grants
                .get(&token)
                .is_some_and(|h| h.deadline == deadline)
            {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The earliest deadline in the heap, possibly of a grant that is gone
    /// (early is harmless for a timer; [`Self::pop_expired`] skips it).
    pub fn peek_deadline(&self) -> Option<Instant> {
        self.deadlines
            .peek()
            .map(|Reverse((deadline, _))| *deadline)
    }

    /// Pops the next live grant whose lease ended at or before `now`: the
    /// leader proposes `Expire` for it. Popped once; [`Self::rearm`] or
    /// [`Self::rebuild_deadlines`] watch it again.
    pub fn pop_expired(&mut self, now: Instant) -> Option<(u64, KeyGroup)> {
        let deadline = self.next_deadline()?;
        if deadline > now {
            return None;
        }
        let Reverse((_, token)) = self.deadlines.pop()?;
        let holding = self.grants.get(&token)?;
        Some((token, holding.keys.clone()))
    }

    /// Watches grant `token` again at `at` (its Expire could not be proposed
    /// now). The stored lease deadline is unchanged.
    pub fn rearm(&mut self, token: u64, at: Instant) {
        if let Some(holding) = self.grants.get_mut(&token) {
            // The heap entry must carry the grant's deadline to count as
            // live, so a retry moves the deadline; it only ever moves later,
            // which never shortens a lease.
            holding.deadline = holding.deadline.max(at);
            let deadline = holding.deadline;
            self.push_deadline(deadline, token);
        }
    }

    /// What this node counted applying commands.
    pub fn metrics(&self) -> &ReplicatedLockMetrics {
        &self.metrics
    }

    /// Whether [`Command::Init`] has been applied.
    pub fn is_initialised(&self) -> bool {
        self.next_token != 0
    }

    /// The token the next Grant gets (0 before initialisation).
    pub fn next_token(&self) -> u64 {
        self.next_token
    }

    /// The token and grant holding `key`.
    pub fn holder(&self, key: &Key) -> Option<(u64, &Holding)> {
        let token = self.keys.get(key.as_bytes()).copied()?;
        Some((token, self.grants.get(&token)?))
    }

    /// The grant with `token`, if current.
    pub fn grant(&self, token: u64) -> Option<&Holding> {
        self.grants.get(&token)
    }

    /// Whether `key` is held.
    pub fn is_held(&self, key: &Key) -> bool {
        self.keys.get(key.as_bytes()).copied().is_some()
    }

    /// Current grants, ascending by token.
    pub fn grants(&self) -> impl Iterator<Item = (u64, &Holding)> {
        self.sorted_grants().into_iter()
    }

    /// Current grants, ascending by token.
    fn sorted_grants(&self) -> Vec<(u64, &Holding)> {
        let mut grants: Vec<(u64, &Holding)> = self.grants.iter().map(|(t, h)| (*t, h)).collect();
        grants.sort_unstable_by_key(|(token, _)| *token);
        grants
    }

    /// The held-key map, for an operator's paged scan
    /// ([`crate::inspect::LISTING_SLOTS_PER_CALL_MAX`] slots a call).
    pub(crate) fn held_key_map(&self) -> &Keyed<Key, u64> {
        &self.keys
    }

    /// Number of held keys.
    pub fn held_keys(&self) -> usize {
        self.keys.len()
    }

    /// Number of grants (key groups held under a token): what
    /// [`Self::snapshot`] writes one record for.
    pub fn grant_count(&self) -> usize {
        self.grants.len()
    }

    /// The state every replica must agree on (counter and grants without the
    /// local deadlines), for determinism checks.
    pub fn replicated_view(&self) -> (u64, Vec<(u64, KeyGroup, u32)>) {
        let grants = self
            .sorted_grants()
            .into_iter()
            .map(|(t, h)| (t, h.keys.clone(), h.lease_ms))
            .collect();
        (self.next_token, grants)
    }

    /// Serializes the state at `now`: the counter and every grant with its
    /// remaining lease rounded up to whole milliseconds. Deterministic
    /// (grants in token order).
    ///
    /// Layout: version u8 (1) · next_token u64 · count u32 ·
    /// count × (token u64 · lease_ms u32 · remaining_ms u32 · keys).
    pub fn snapshot(&self, now: Instant) -> Vec<u8> {
        let mut out = Vec::with_capacity(13 + self.grants.len() * 32);
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&self.next_token.to_be_bytes());
        out.extend_from_slice(
            &u32::try_from(self.grants.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        for (token, holding) in self.sorted_grants() {
            let remaining_us = duration_micros(holding.deadline.saturating_duration_since(now));
            // Rounding up keeps the lease from getting shorter on restore.
            let remaining_ms = remaining_us.div_ceil(1_000);
            out.extend_from_slice(&token.to_be_bytes());
            out.extend_from_slice(&holding.lease_ms.to_be_bytes());
            out.extend_from_slice(
                &u32::try_from(remaining_ms)
                    .unwrap_or(u32::MAX)
                    .to_be_bytes(),
            );
            put_key_group(&mut out, &holding.keys);
        }
        out
    }

    /// Replaces this state with the one in [`Self::snapshot`] bytes,
    /// installed at `now` (see [`Self::restore`]), unless they do not decode
    /// or their token counter is below this state's: a counter never goes
    /// down, so such a snapshot is refused and this state kept as it is.
    pub fn install_snapshot(&mut self, bytes: &[u8], now: Instant) -> Result<(), SnapshotError> {
        let restored = ReplicatedLocks::restore(bytes, now)?;
        if restored.next_token < self.next_token {
            return Err(SnapshotError::CounterBehind {
                current: self.next_token,
                snapshot: restored.next_token,
            });
        }
        let mut metrics = std::mem::take(&mut self.metrics);
        metrics.snapshots_installed += 1;
        *self = restored;
        self.metrics = metrics;
        Ok(())
    }

    /// Rebuilds a state from [`Self::snapshot`] bytes installed at `now`:
    /// each lease deadline becomes `now + remaining`, never earlier than
    /// this node learned of the grant.
    pub fn restore(bytes: &[u8], now: Instant) -> Result<ReplicatedLocks, SnapshotError> {
        let mut r = Reader::new(bytes);
        let version = r.u8().ok_or(SnapshotError::Malformed)?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(version));
        }
        let next_token = r
            .u64()
            .filter(|&next| next <= SNAPSHOT_NEXT_TOKEN_MAX)
            .ok_or(SnapshotError::Malformed)?;
        let count = r.u32().ok_or(SnapshotError::Malformed)?;
        let mut state = ReplicatedLocks {
            next_token,
            ..ReplicatedLocks::default()
        };
        let mut last_token = 0;
        for _ in 0..count {
            // Each record is at least 18 bytes, so a hostile count cannot
            // loop long past the end of the data.
            let token = r.u64().ok_or(SnapshotError::Malformed)?;
            let lease_ms = r.u32().ok_or(SnapshotError::Malformed)?;
            let remaining_ms = r.u32().ok_or(SnapshotError::Malformed)?;
            let keys = r.key_group().ok_or(SnapshotError::Malformed)?;
            if token <= last_token || token >= next_token {
                return Err(SnapshotError::Inconsistent);
            }
            last_token = token;
            for key in keys.keys() {
                let hash = state.keys.hash(key.as_bytes());
                if state.keys.find(hash, key.as_bytes()).is_some() {
                    return Err(SnapshotError::Inconsistent);
                }
                state.keys.insert_absent(hash, key.clone(), token);
            }
            let deadline = now.saturating_add(Duration::from_millis(u64::from(remaining_ms)));
            state.grants.insert(
                token,
                Holding {
                    keys,
                    lease_ms,
                    deadline,
                    granted_at: now,
                },
            );
        }
        if !r.is_empty() {
            return Err(SnapshotError::Malformed);
        }
        state.rebuild_deadlines();
        Ok(state)
    }
}
