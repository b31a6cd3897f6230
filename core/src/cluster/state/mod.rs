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

use crate::cluster::command::{ApplyResult, Command, GrantOptions};
use crate::hash::IdMap;
use crate::keyed::{KeyHash, Keyed};
use crate::lock::{ExtendOutcome, KeyModes, capped_deadline, decide_extension};
use crate::metrics::ReplicatedLockMetrics;
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup, SET_KEYS_MAX};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

mod shared;
mod snapshot;

/// A snapshot's token counter must not exceed this (2^63): counters start
/// below [`crate::cluster::command::FIRST_TOKEN_MAX`] (2^62) and grow by one
/// per grant, so a larger one is corruption. The bound leaves 2^63 grants
/// before `checked_add` would refuse.
pub const SNAPSHOT_NEXT_TOKEN_MAX: u64 = 1 << 63;

/// Version byte that starts a snapshot in which no grant has a cap or an
/// extension: the layout from before those existed, so such a snapshot is
/// byte for byte what it was, and a node that predates them installs it.
const SNAPSHOT_VERSION: u8 = 1;

/// Version byte of a snapshot with a capped or extended grant: each grant
/// also carries its cap and extension count.
const SNAPSHOT_VERSION_EXTENDED: u8 = 2;

/// Version byte of a snapshot with a grant whose [`GrantOptions`] are not
/// the default (shared keys, semaphore slots, a label): each record has
/// version 2's fields and the grant's options.
const SNAPSHOT_VERSION_OPTIONS: u8 = 3;

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
    /// The cap on total hold the grant was made with (replicated).
    pub max_hold_ms: Option<u32>,
    /// When the cap is reached on this node's clock: apply time (or
    /// snapshot install time) plus the (remaining) cap. No lease or
    /// extension runs past it (only a re-armed expiry retry, see
    /// [`ReplicatedLocks::rearm`], may watch past it); inspection can show
    /// it as the latest end.
    pub cap_at: Option<Instant>,
    /// How many extensions moved the lease on this node (clipped ones
    /// included). Local, like the deadline: whether an extension reached
    /// the cap depends on this node's apply times.
    pub extensions: u32,
    /// Modes, semaphore and holder label (replicated).
    pub options: GrantOptions,
}

impl Holding {
    /// Whether a snapshot must carry more than the first layout for it.
    fn is_extended(&self) -> bool {
        self.max_hold_ms.is_some() || self.extensions > 0
    }
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
    /// The sharers of each key held shared, oldest (lowest token) first;
    /// `keys` names the oldest (see `shared`). Bounded like the grants.
    sharers: Keyed<Key, Vec<u64>>,
    /// Sharers beyond the first of each key held shared: with `keys`, the
    /// holds the key limit counts.
    extra_sharer_holds: usize,
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
            Command::Grant {
                keys,
                lease_ms,
                max_hold_ms,
                options,
            } => self.apply_grant(keys, (*lease_ms, *max_hold_ms), *options, applied_at),
            Command::Release { keys, token } => self.apply_release(keys, *token, applied_at),
            Command::Expire { keys, token } => {
                let existed = self
                    .grants
                    .get(token)
                    .is_some_and(|holding| &holding.keys == keys);
                if existed {
                    if self.grants.get(token).is_some_and(|h| h.extensions > 0) {
                        self.metrics.expiries_extended += 1;
                    }
                    self.remove_grant(*token, applied_at);
                    self.metrics.expiries += 1;
                }
                ApplyResult::Expired { existed }
            }
            Command::ForceRelease { key, token } => {
                self.apply_force_release(key, *token, applied_at)
            }
            Command::Extend { token, lease_ms } => {
                let outcome = self.apply_extend(*token, *lease_ms, applied_at);
                ApplyResult::Extension { outcome }
            }
            Command::Downgrade { keys, token } => self.apply_downgrade(keys, *token),
        }
    }

    /// Renews grant `token`'s lease to `lease_ms` after `applied_at`,
    /// clipped to its cap. Current means in the replicated state, so every
    /// node agrees on [`ExtendOutcome::NotCurrent`]; a lease whose local
    /// deadline passed but whose Expire has not applied is still current
    /// here (the leader decides which to propose first).
    fn apply_extend(&mut self, token: u64, lease_ms: u32, applied_at: Instant) -> ExtendOutcome {
        let counts = &mut self.metrics.extensions;
        let Some(holding) = self.grants.get_mut(&token) else {
            counts.not_current += 1;
            return ExtendOutcome::NotCurrent;
        };
        let outcome = decide_extension(
            applied_at,
            Duration::from_millis(u64::from(lease_ms)),
            holding.deadline,
            holding.cap_at,
        );
        match outcome {
            ExtendOutcome::Extended { .. } => counts.extended += 1,
            ExtendOutcome::Clipped { .. } => counts.clipped += 1,
            ExtendOutcome::AtCap => counts.at_cap += 1,
            ExtendOutcome::NotCurrent => counts.not_current += 1,
        }
        if let Some(deadline) = outcome.expires_at() {
            holding.deadline = deadline;
            holding.extensions = holding.extensions.saturating_add(1);
            // The entry for the old deadline goes stale (its deadline no
            // longer matches), so the leader's expiry follows the new one.
            self.push_deadline(deadline, token);
        }
        outcome
    }

    fn apply_force_release(
        &mut self,
        key: &Key,
        token: Option<u64>,
        applied_at: Instant,
    ) -> ApplyResult {
        let held = match self.force_target(key, token) {
            Ok(held) => held,
            Err(refusal) => return refusal,
        };
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

    fn apply_grant(
        &mut self,
        keys: &KeyGroup,
        (lease_ms, max_hold_ms): (u32, Option<u32>),
        options: GrantOptions,
        applied_at: Instant,
    ) -> ApplyResult {
        if self.next_token == 0 {
            return ApplyResult::GrantRejected;
        }
        let modes = KeyModes::from_bits(options.shared_modes);
        // Each key hashed once: for the check that it takes the grant in
        // its mode and again to record the hold.
        let mut hashes = [KeyHash::default(); SET_KEYS_MAX];
        for (index, (hash, key)) in hashes.iter_mut().zip(keys.keys()).enumerate() {
            *hash = self.keys.hash(key.as_bytes());
            if !self.key_takes(*hash, key, modes.is_shared(index)) {
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
        let cap_at = max_hold_ms.map(|max_hold_ms| {
            applied_at.saturating_add(Duration::from_millis(max_hold_ms.into()))
        });
        let lease = Duration::from_millis(u64::from(lease_ms));
        let deadline = capped_deadline(applied_at, lease, cap_at);
        for (index, (hash, key)) in hashes.iter().zip(keys.keys()).enumerate() {
            self.hold_key(*hash, key, token, modes.is_shared(index));
        }
        self.grants.insert(
            token,
            Holding {
                keys: keys.clone(),
                lease_ms,
                deadline,
                granted_at: applied_at,
                max_hold_ms,
                cap_at,
                extensions: 0,
                options,
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
            Some(holding) => shared::group_refusal(&holding.keys, keys),
            None => ApplyResult::NotFound,
        }
    }

    /// Removes grant `token` (released or expired at `at`).
    fn remove_grant(&mut self, token: u64, at: Instant) {
        if let Some(holding) = self.grants.remove(&token) {
            let held = at.saturating_duration_since(holding.granted_at);
            self.metrics.hold.observe(held);
            for key in holding.keys.keys() {
                self.unhold_key(key, token);
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
}
