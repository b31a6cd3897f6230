//! The lock table: keys, FIFO waiter queues, leases, fencing tokens, capacity
//! limits and key sets.
//!
//! Deterministic: time enters only as `now` arguments; the table never reads a
//! clock. The single-mode server ([`crate::server::Server`]) drives it
//! directly. Cluster mode does not use the table: its applied state is
//! [`crate::cluster::ReplicatedLocks`] and the leader's queues are in
//! `cluster/node/keys.rs`, but both share this module's pieces that must
//! agree with single mode: the maps by key bytes (`keyed.rs`), the
//! extension rule ([`decide_extension`], [`capped_deadline`]) and the
//! limits ([`Limits`], [`HoldCaps`]).
//!
//! Layout: a hash table from key bytes (inline up to 22 bytes) to a 24-byte
//! entry (token, lease deadline, and one word packing the holder's tag, the
//! grant's size and lease, a has-waiters bit and a has-extension-record
//! bit): 48 bytes a bucket, no allocation for a short key (see
//! `entry.rs`). The FIFO queues of waiter sequence numbers are in a second
//! table, only for keys that have waiters; both hash a key once per request
//! (`keyed.rs`); waiters in a map by arrival sequence number; two min-heaps
//! for wait deadlines and for the lease deadlines of keys that have
//! waiters. Keys without waiters expire lazily and are swept periodically.
//!
//! Files: this one holds the types and the public API of [`LockTable`];
//! `acquire.rs` decides an acquire (grant now, refuse, or queue),
//! `release.rs` a release, `extend.rs` a lease's renewal (the rule both
//! modes share, and the record of capped or extended grants), `queue.rs`
//! the waiter queues (handing a key to the front waiter, removing a
//! waiter), `expiry.rs` the clock: deadlines due, the sweep, and keeping
//! the deadline heaps bounded; `entry.rs` is
//! the packed per-key entry, `keyed.rs` the maps by key bytes,
//! `inspect.rs` the operator's read-only view, and `semaphore.rs` the FIFO
//! semaphores built on the table's slot keys.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::hash::RandomState;

use crate::hash::IdMap;
use crate::metrics::LockMetrics;
use crate::time::{Duration, Instant, duration_micros};
use crate::wire::{KeyGroup, SET_KEYS_MAX};

mod acquire;
mod entry;
mod expiry;
mod extend;
mod fence;
mod inspect;
mod queue;
mod release;
#[cfg(feature = "planted-bugs")]
mod reversed_pass;
pub(crate) mod semaphore;
mod shared;
use crate::keyed::{KeyHash, Keyed};
pub use entry::HOLDER_MAX;
use entry::{KeyEntry, StoredKey};
use extend::Extensions;
pub use extend::{ExtendOutcome, GrantExtension, HoldCaps, capped_deadline, decide_extension};
pub use fence::TwoMarks;
pub use inspect::{HolderInspection, KeyInspection, WaiterInspection};
pub use shared::{DowngradeOutcome, KeyModes};

#[cfg(feature = "planted-bugs")]
use crate::testing::planted;

/// Capacity limits. Over any of them an acquire is answered `B` at once and
/// nothing is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Keys in the table (held or with waiters).
    pub keys_max: usize,
    /// Waiters queued on one key.
    pub waiters_per_key_max: usize,
    /// Waiters queued in the whole table (a key-set waiter counts once).
    pub waiters_total_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            keys_max: 2_000_000,
            waiters_per_key_max: 16_384,
            waiters_total_max: 200_000,
        }
    }
}

/// Table configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockConfig {
    /// Capacity limits.
    pub limits: Limits,
    /// A queued request gets `T` this long before `wait` seconds after receipt,
    /// so that the reply reaches a client before its own deadline. Below 1 s.
    pub wait_margin: Duration,
    /// How often expired keys without waiters are removed.
    pub sweep_interval: Duration,
}

impl Default for LockConfig {
    fn default() -> Self {
        LockConfig {
            limits: Limits::default(),
            wait_margin: Duration::from_millis(100),
            sweep_interval: Duration::from_secs(5),
        }
    }
}

/// Opaque identity of a queued request, chosen by the caller (unique among
/// live waiters). The table hands it back in [`LockEvent`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

/// Immediate answer to an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Granted now with this fencing token.
    Granted {
        /// The new token.
        token: u64,
    },
    /// Queued; a [`LockEvent`] for this waiter will follow.
    Queued,
    /// Held and `wait_s` was 0: not queued.
    TimedOut,
    /// A capacity limit was reached: not queued.
    Busy,
}

/// What an acquire asks for besides its keys, as
/// [`LockTable::acquire_with`] takes it. The default (all zero, no cap) is
/// not a useful request; name at least the lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// How long the request may wait, in seconds as on the wire (0: not
    /// at all).
    pub wait_s: u8,
    /// The lease, in seconds as on the wire (1..=250).
    pub lease_s: u8,
    /// The holder tag the grant records (see [`LockTable::acquire_as`]).
    pub holder: u64,
    /// A cap on the grant's total hold, counted from the grant: no lease
    /// or extension runs past it (a longer first lease is clipped to it).
    /// `None`: no cap, exactly the behaviour without it.
    pub max_hold: Option<Duration>,
}

/// Answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The token was current for exactly this group: released (and handed to
    /// the next waiter, if any).
    Released,
    /// The token is not current on any named key: nothing changed.
    NotFound,
    /// The token is current on some named key, but its grant covers a
    /// different key group: nothing changed.
    GroupMismatch,
}

/// A key's current grant, as [`LockTable::grant_of`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantRecord {
    /// Its token.
    pub token: u64,
    /// The holder tag it was acquired under ([`LockTable::acquire_as`]; 0
    /// through [`LockTable::acquire`]).
    pub holder: u64,
    /// When its lease ends.
    pub lease_deadline: Instant,
    /// Keys in the grant.
    pub keys: usize,
}

/// Something that happened to a queued waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockEvent {
    /// The waiter now holds its keys under `token`.
    Granted {
        /// The waiter.
        waiter: WaiterId,
        /// The new token.
        token: u64,
    },
    /// The waiter's wait ended without the lock.
    TimedOut {
        /// The waiter.
        waiter: WaiterId,
    },
}

/// Counts for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Keys in the table.
    pub keys: usize,
    /// Keys whose holder's lease has not expired.
    pub held_keys: usize,
    /// Queued waiters.
    pub waiters: usize,
    /// The next token the table will issue.
    pub next_token: u64,
}

impl GrantRecord {
    fn of(entry: &KeyEntry) -> Self {
        GrantRecord {
            token: entry.token,
            holder: entry.holder(),
            lease_deadline: entry.lease_deadline,
            keys: usize::from(entry.group_len()),
        }
    }
}

impl KeyEntry {
    /// When the holder's grant was made, for a grant without an extension
    /// record (see [`LockTable::grant_start`] for any grant).
    fn granted_at(&self) -> Instant {
        self.lease_deadline
            .saturating_sub(lease_duration(self.lease_s()))
    }

    /// Whether a holder's lease is still running at `at`.
    fn is_held_at(&self, at: Instant) -> bool {
        self.token != 0 && self.lease_deadline > at
    }
}

/// A key a waiter waits for, with its hash (computed when the acquire
/// arrived).
#[derive(Debug)]
struct WaitedKey {
    hash: KeyHash,
    bytes: StoredKey,
}

/// A waiter's keys: a single key (the usual `A`) without an allocation.
#[derive(Debug)]
enum WaitedKeys {
    One([WaitedKey; 1]),
    Many(Box<[WaitedKey]>),
}

impl std::ops::Deref for WaitedKeys {
    type Target = [WaitedKey];

    fn deref(&self) -> &[WaitedKey] {
        match self {
            WaitedKeys::One(key) => key,
            WaitedKeys::Many(keys) => keys,
        }
    }
}

/// A queued acquire.
#[derive(Debug)]
struct Waiter {
    id: WaiterId,
    /// The requested keys, ascending (a group of one for `A`).
    keys: WaitedKeys,
    /// When the waiter gets `T`: `wait_s` after receipt minus the margin.
    wait_deadline: Instant,
    lease_s: u8,
    /// Which of its keys it wants shared (see `shared.rs`); kept here, not
    /// per key, so a waiter's keys stay as small as before.
    modes: KeyModes,
    /// The holder tag its grant will carry.
    holder: u64,
    /// The cap on its grant's total hold, counted from the grant.
    max_hold: Option<Duration>,
    /// When the acquire arrived, for the wait histogram.
    queued_at: Instant,
}

/// A lease deadline of a key that has waiters. Stale once the key's token
/// differs or nobody waits on it any more; stale entries are skipped.
/// Ordered by deadline, token, key (the hash, last, is the key's: it
/// never decides an order).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct LeaseDeadline {
    deadline: Instant,
    token: u64,
    key: StoredKey,
    hash: KeyHash,
}

/// Most [`ExpiryHandover`]s kept for an owner that does not take them;
/// past it the oldest goes (the count in [`LockMetrics`] stays exact).
pub const EXPIRY_HANDOVERS_MAX: usize = 64;

/// A lease that ran out while a waiter was queued for its key, who got
/// the key next (one per grant: the key its expiry was counted on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiryHandover {
    /// The key.
    pub key: crate::wire::Key,
    /// The token whose lease ran out.
    pub expired: u64,
    /// The token the waiter was granted.
    pub handed_to: u64,
}

/// Queues `handover`, dropping the oldest past [`EXPIRY_HANDOVERS_MAX`].
fn note_expiry_handover(
    handovers: &mut VecDeque<ExpiryHandover>,
    key: &[u8],
    expired: u64,
    handed_to: u64,
) {
    // Every key in the table was a valid key when it came in.
    let Ok(key) = crate::wire::Key::new(key) else {
        return;
    };
    if handovers.len() >= EXPIRY_HANDOVERS_MAX {
        handovers.pop_front();
    }
    handovers.push_back(ExpiryHandover {
        key,
        expired,
        handed_to,
    });
}

/// The lock table.
///
/// Processing order: every method taking `now` first handles everything due
/// at or before `now` in time order, as if the driver had called
/// [`LockTable::handle_timeout`] punctually: wait deadlines, lease deadlines
/// of keys with waiters and sweeps, each at its own instant (ties: wait
/// deadlines before lease deadlines before the sweep). A grant made while
/// catching up gets its lease from the real `now`, never from the past
/// instant, so nobody is handed a lease that has already run out.
#[derive(Debug)]
pub struct LockTable {
    config: LockConfig,
    next_token: u64,
    /// The keys, by their bytes (keyed SipHash: clients pick them).
    keys: Keyed<StoredKey, KeyEntry>,
    /// Waiter sequence numbers in arrival order, for the keys that have
    /// waiters (those whose entry says so), so an uncontended key costs no
    /// queue pointer. Hashed as `keys` (the same hasher): one hash serves
    /// both.
    queues: Keyed<StoredKey, VecDeque<u64>>,
    /// Emptied queues kept for reuse (small ones, a few), so a key that
    /// keeps getting a waiter does not allocate a queue each time.
    spare_queues: Vec<VecDeque<u64>>,
    /// Queued waiters by arrival sequence number.
    waiters: IdMap<u64, Waiter>,
    /// Caller ids of queued waiters, for `cancel`. The caller hands these
    /// out (the server: from a counter), not clients, so the id hasher.
    waiter_seqs: IdMap<WaiterId, u64>,
    /// The global arrival order that keeps key-set waits deadlock-free.
    next_seq: u64,
    /// Sum of all queue lengths (a set waiter counts once per key).
    queued_pairs: usize,
    /// Min-heap of (wait deadline, waiter seq).
    wait_deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Min-heap of lease deadlines of keys with waiters.
    lease_deadlines: BinaryHeap<Reverse<LeaseDeadline>>,
    sweep_next: Instant,
    /// The configured interval in whole microseconds, at least one (the
    /// clock's grain), so the sweep schedule always moves on.
    sweep_interval: Duration,
    /// The latest `now` seen; time never runs backwards inside the table.
    now_last: Instant,
    /// Events for queued waiters, a grant's with its lease deadline.
    events: VecDeque<(LockEvent, Option<Instant>)>,
    /// The highest token that may be issued (the durable token reserve,
    /// see [`crate::reserve`]); `u64::MAX` when unlimited.
    token_limit: u64,
    /// Keys whose front waiter could have been granted but for the token
    /// limit; retried when it is raised. Ordered, so a run stays a pure
    /// function of its inputs.
    stalled: BTreeSet<Box<[u8]>>,
    /// What the table counted.
    metrics: LockMetrics,
    /// Leases that ran out with a waiter queued, for the owner's events;
    /// at most [`EXPIRY_HANDOVERS_MAX`].
    expiry_handovers: VecDeque<ExpiryHandover>,
    /// Keys with a holder (`token != 0`), including leases that ended but
    /// were not noticed yet: an O(1) gauge for metrics.
    holder_keys: usize,
    /// The key sets granted: their keys while they run, and how many keys
    /// are left to be noticed expired once their lease ran out.
    sets: SetGrants,
    /// The grants that have a cap or were extended (their keys' entries
    /// say so), by token: when each began, its cap, its extensions.
    extensions: Extensions,
    /// The holders of the keys held in shared mode (their entries say
    /// so); see `shared.rs`.
    sharers: shared::Sharers,
}

/// What the table keeps per key-set grant (a grant of more than one key),
/// by token; nothing for a single-key grant.
#[derive(Debug, Default)]
pub(crate) struct SetGrants {
    /// Every key of each running set, ascending, from its grant until it is
    /// released or its expiry is first noticed: an operator's inspection of
    /// any one key names the whole set without walking the table. At most
    /// one entry per two held keys.
    members: IdMap<u64, Box<[Box<[u8]>]>>,
    /// Sets whose lease ran out and of which some keys were noticed
    /// expired: how many keys are still to be noticed. A set's expiry is
    /// counted once, on the first key noticed; each key leaves the table or
    /// gets a new token eventually (the sweep), so entries do not outlive
    /// their keys.
    expiring: IdMap<u64, u8>,
}

impl SetGrants {
    /// Set `token` was granted on `keys` (ascending); a single key is not
    /// recorded.
    fn granted<'a>(&mut self, token: u64, keys: impl ExactSizeIterator<Item = &'a [u8]>) {
        if keys.len() > 1 {
            self.members.insert(token, keys.map(Box::from).collect());
        }
    }

    /// Set `token` ended (released, or its expiry noticed).
    fn ended(&mut self, token: u64) {
        self.members.remove(&token);
    }

    /// The keys of running set `token`.
    pub(crate) fn members(&self, token: u64) -> Option<&[Box<[u8]>]> {
        self.members.get(&token).map(|keys| &**keys)
    }
}

impl LockTable {
    /// An empty table whose first grant gets `first_token` (non-zero).
    pub fn new(config: LockConfig, first_token: u64, now: Instant) -> Self {
        // A zero interval would make the sweep schedule stand still.
        let sweep_interval = Duration::from_micros(duration_micros(config.sweep_interval).max(1));
        let hasher = RandomState::new();
        LockTable {
            config,
            next_token: first_token.max(1),
            keys: Keyed::new(hasher.clone()),
            queues: Keyed::new(hasher),
            spare_queues: Vec::new(),
            waiters: IdMap::default(),
            waiter_seqs: IdMap::default(),
            next_seq: 0,
            queued_pairs: 0,
            wait_deadlines: BinaryHeap::new(),
            lease_deadlines: BinaryHeap::new(),
            sweep_next: now.saturating_add(sweep_interval),
            sweep_interval,
            now_last: now,
            events: VecDeque::new(),
            token_limit: u64::MAX,
            stalled: BTreeSet::new(),
            metrics: LockMetrics::default(),
            expiry_handovers: VecDeque::new(),
            holder_keys: 0,
            sets: SetGrants::default(),
            extensions: Extensions::default(),
            sharers: shared::Sharers::default(),
        }
    }

    /// Issues no token above `limit` from now on: an acquire that would be
    /// granted at once is answered [`AcquireOutcome::Busy`] instead, and a
    /// queued waiter whose turn has come keeps its place (its wait deadline
    /// still applies) until the limit is raised far enough.
    pub fn set_token_limit(&mut self, now: Instant, limit: u64) {
        let now = self.advance(now);
        self.token_limit = limit;
        if self.next_token <= self.token_limit {
            for key in std::mem::take(&mut self.stalled) {
                self.grant_front(self.keys.hash(&key), &key, now, now);
            }
        }
        self.tidy();
    }

    /// The highest token that may be issued now.
    pub fn token_limit(&self) -> u64 {
        self.token_limit
    }

    /// An acquire received at `now`. `waiter` is used only if the request is
    /// queued. Lease and wait are in seconds as on the wire (lease 1..=250).
    pub fn acquire(
        &mut self,
        now: Instant,
        waiter: WaiterId,
        keys: KeyGroup,
        wait_s: u8,
        lease_s: u8,
    ) -> AcquireOutcome {
        self.acquire_as(now, waiter, &keys, wait_s, lease_s, 0)
    }

    /// [`LockTable::acquire`] on behalf of `holder`, a tag the caller names
    /// the requester by (the server: its connection id). The grant, now or
    /// after a wait, records it, and [`LockTable::grant_of`] tells it back,
    /// so the caller needs no map of its own from grants to requesters.
    /// At most [`HOLDER_MAX`] (48 bits, stored in the key's entry); a larger
    /// tag is recorded as [`HOLDER_MAX`]. The keys are borrowed: the table
    /// copies what it keeps (a short key into its bucket, no allocation).
    pub fn acquire_as(
        &mut self,
        now: Instant,
        waiter: WaiterId,
        keys: &KeyGroup,
        wait_s: u8,
        lease_s: u8,
        holder: u64,
    ) -> AcquireOutcome {
        let options = AcquireOptions {
            wait_s,
            lease_s,
            holder,
            max_hold: None,
        };
        self.acquire_with(now, waiter, keys, &options)
    }

    /// [`LockTable::acquire_as`] with every option, including a cap on the
    /// grant's total hold ([`AcquireOptions::max_hold`]; without one this
    /// is exactly `acquire_as`).
    pub fn acquire_with(
        &mut self,
        now: Instant,
        waiter: WaiterId,
        keys: &KeyGroup,
        options: &AcquireOptions,
    ) -> AcquireOutcome {
        self.acquire_in_modes(now, waiter, keys, options, KeyModes::EXCLUSIVE)
    }

    /// [`LockTable::acquire_with`] with a mode per key: the keys `modes`
    /// marks are wanted shared, the others exclusive (the queue rules are
    /// in `shared.rs`). One token for the whole grant, as for any set.
    pub fn acquire_in_modes(
        &mut self,
        now: Instant,
        waiter: WaiterId,
        keys: &KeyGroup,
        options: &AcquireOptions,
        modes: KeyModes,
    ) -> AcquireOutcome {
        let holder = options.holder;
        debug_assert!(holder <= HOLDER_MAX, "holder tag {holder} over 48 bits");
        let options = AcquireOptions {
            holder: holder.min(HOLDER_MAX),
            ..*options
        };
        let now = self.advance(now);
        let hashes = self.hash_group(keys);
        let outcome = self.acquire_at(now, waiter, (keys, &hashes), &options, modes);
        self.tidy();
        outcome
    }

    /// Renews, at `now`, the lease of grant `token` on exactly `keys` (all
    /// of a key set's keys: they share the token) to `now + lease_s`
    /// seconds (1..=250, as on the wire), clipped to the grant's cap. The
    /// token is unchanged. If the token is not current on exactly these
    /// keys with a running lease, the answer is
    /// [`ExtendOutcome::NotCurrent`] and nothing changes: an extension
    /// never brings back a grant that was released, expired,
    /// force-released or handed on.
    ///
    /// The keys are named, as in a release, because the table finds grants
    /// by key: an index by token for every grant would cost each held key
    /// a second map entry.
    pub fn extend(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        token: u64,
        lease_s: u8,
    ) -> ExtendOutcome {
        let now = self.advance(now);
        let hashes = self.hash_group(keys);
        let outcome = self.extend_at(now, keys, &hashes, token, lease_s);
        self.tidy();
        outcome
    }

    /// The extension state of the grant holding `key` (recorded, as for
    /// [`LockTable::grant_of`]: its lease may already have ended): when it
    /// began, its cap on total hold (the latest it can end), how many
    /// extensions moved its lease. `None` if the key has no holder.
    pub fn extension_of(&self, key: &[u8]) -> Option<GrantExtension> {
        let entry = self.keys.get(key).filter(|entry| entry.token != 0)?;
        let recorded = entry
            .has_extension()
            .then(|| self.extensions.get(&entry.token).copied())
            .flatten();
        Some(recorded.unwrap_or(GrantExtension {
            granted_at: entry.granted_at(),
            cap_at: None,
            extensions: 0,
        }))
    }

    /// When the grant on `entry` was made. Its first lease tells it unless
    /// the grant was capped (its first lease may be clipped) or extended
    /// (its deadline moved); those have it recorded.
    fn grant_start(&self, entry: &KeyEntry) -> Instant {
        grant_start(&self.extensions, entry)
    }

    /// A release received at `now`.
    pub fn release(&mut self, now: Instant, keys: &KeyGroup, token: u64) -> ReleaseOutcome {
        self.release_grant(now, keys, token).0
    }

    /// [`LockTable::release`], also telling the grant it released (as
    /// [`LockTable::grant_of`] would have told it just before), so the
    /// caller needs no look-up of its own.
    pub fn release_grant(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        token: u64,
    ) -> (ReleaseOutcome, Option<GrantRecord>) {
        let now = self.advance(now);
        let hashes = self.hash_group(keys);
        let released = self.release_at(now, keys, &hashes, token);
        self.tidy();
        released
    }

    /// The hashes of `keys`, in order, computed once per request.
    fn hash_group(&self, keys: &KeyGroup) -> GroupHashes {
        let mut hashes = [KeyHash::default(); SET_KEYS_MAX];
        for (hash, key) in hashes.iter_mut().zip(keys.keys()) {
            *hash = self.keys.hash(key.as_bytes());
        }
        hashes
    }

    /// Drops a queued waiter (its connection closed). Returns false if it was
    /// not queued. May grant keys to the waiters behind it.
    pub fn cancel(&mut self, now: Instant, waiter: WaiterId) -> bool {
        let now = self.advance(now);
        let cancelled = match self.waiter_seqs.get(&waiter) {
            Some(&seq) => {
                self.remove_waiter(seq, now, now, false);
                true
            }
            None => false,
        };
        self.tidy();
        cancelled
    }

    /// Ends every queued wait with [`LockEvent::TimedOut`] (server shutdown).
    pub fn time_out_all_waiters(&mut self, now: Instant) {
        self.advance(now);
        self.time_out_every_waiter();
    }

    /// Processes every deadline at or before `now`: lease expiry of keys with
    /// waiters (handing them on), wait deadlines, and the periodic sweep.
    /// Calling it early or twice is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = now.max(self.now_last);
        if self.poll_timeout().is_some_and(|due| now < due) {
            // Nothing is due (the heap tops are live, `tidy` ran at the end
            // of the last call and nothing changed since): only the clock
            // moves. The server calls this before every input.
            self.now_last = now;
            return;
        }
        self.advance(now);
        self.tidy();
    }

    /// The earliest instant at which [`LockTable::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Heap tops are kept live by `tidy`, so this is exact, not early.
        let wait = self.wait_deadlines.peek().map(|Reverse((at, _))| *at);
        let lease = self.lease_deadlines.peek().map(|Reverse(l)| l.deadline);
        let earliest = [wait, lease]
            .into_iter()
            .flatten()
            .fold(self.sweep_next, Instant::min);
        Some(earliest)
    }

    /// The next event for a queued waiter, if any.
    pub fn poll_event(&mut self) -> Option<LockEvent> {
        self.poll_event_lease().map(|(event, _)| event)
    }

    /// [`LockTable::poll_event`], with the lease deadline a
    /// [`LockEvent::Granted`] was given (`None` for a time-out), so the
    /// caller need not look the grant up.
    pub fn poll_event_lease(&mut self) -> Option<(LockEvent, Option<Instant>)> {
        self.events.pop_front()
    }

    /// The oldest lease that ran out with a waiter queued on its key
    /// (who got it) not yet taken: what the owner records as an event.
    pub fn poll_expiry_handover(&mut self) -> Option<ExpiryHandover> {
        self.expiry_handovers.pop_front()
    }

    /// What the table counted so far (see [`LockMetrics`]).
    pub fn metrics(&self) -> &LockMetrics {
        &self.metrics
    }

    /// Keys in the table (held, expired but not yet swept, or with waiters).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Queued waiters.
    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    /// Keys with a holder, counting leases that ended but were not noticed
    /// yet (lazy expiry: at most a sweep interval late). O(1), unlike
    /// [`LockTable::stats`]'s exact `held_keys`.
    pub fn holder_keys(&self) -> usize {
        debug_assert_eq!(
            self.holder_keys,
            self.keys.values().filter(|entry| entry.token != 0).count(),
            "holder-key gauge out of step with the table"
        );
        self.holder_keys
    }

    /// Current counts. `held_keys` is counted against the latest `now` the
    /// table has seen, by a scan: O(keys), meant for metrics and tests.
    pub fn stats(&self) -> LockStats {
        debug_assert_eq!(
            self.holder_keys,
            self.keys.values().filter(|entry| entry.token != 0).count(),
            "holder-key gauge out of step with the table"
        );
        LockStats {
            keys: self.keys.len(),
            held_keys: self
                .keys
                .values()
                .filter(|entry| entry.is_held_at(self.now_last))
                .count(),
            waiters: self.waiters.len(),
            next_token: self.next_token,
        }
    }

    /// The next token to be issued.
    pub fn next_token(&self) -> u64 {
        self.next_token
    }

    /// The recorded holder of `key`: its token and lease deadline. The lease
    /// may already have ended if nothing has touched or swept the key since
    /// (lazy expiry); `None` if the key has no holder.
    pub fn holder(&self, key: &[u8]) -> Option<(u64, Instant)> {
        self.keys
            .get(key)
            .filter(|entry| entry.token != 0)
            .map(|entry| (entry.token, entry.lease_deadline))
    }

    /// Number of waiters queued on `key` (a set waiter counts on each of its
    /// keys).
    pub fn queue_len(&self, key: &[u8]) -> usize {
        let hash = self.keys.hash(key);
        self.keys
            .find(hash, key)
            .map_or(0, |entry| self.entry_queue_len(hash, key, entry))
    }

    /// The current grant on `key` as recorded (its lease may already have
    /// ended: lazy expiry, as for [`LockTable::holder`]); `None` if the key
    /// has no holder. For a key held shared: its oldest running sharer
    /// (the one a force-release without a token revokes).
    pub fn grant_of(&self, key: &[u8]) -> Option<GrantRecord> {
        let entry = self.keys.get(key).filter(|entry| entry.token != 0)?;
        if entry.is_shared() {
            let (oldest, _) = *self.sharers_of(key, self.now_last).first()?;
            return self.grant_of_token(key, oldest);
        }
        Some(GrantRecord::of(entry))
    }

    fn issue_token(&mut self) -> u64 {
        let token = self.next_token;
        #[cfg(feature = "planted-bugs")]
        if planted::active(planted::PlantedBug::ReuseToken) && token.is_multiple_of(4) {
            // Hand out the previous token a second time.
            self.next_token = token + 1;
            return token - 1;
        }
        // Never wrap: a reused token would defeat fencing. Starting from
        // wall-clock microseconds this is ~580,000 years away.
        self.next_token = token.checked_add(1).expect("fencing tokens exhausted");
        token
    }
}

/// The hashes of a request's keys, in the group's order (a group has at
/// most [`SET_KEYS_MAX`] keys).
type GroupHashes = [KeyHash; SET_KEYS_MAX];

/// When the grant on `entry` was made (see [`LockTable::grant_start`]).
fn grant_start(extensions: &Extensions, entry: &KeyEntry) -> Instant {
    entry
        .has_extension()
        .then(|| extensions.get(&entry.token))
        .flatten()
        .map_or_else(|| entry.granted_at(), |extension| extension.granted_at)
}

/// A lease of `lease_s` seconds (leases arrive in whole seconds).
fn lease_duration(lease_s: u8) -> Duration {
    Duration::from_secs(u64::from(lease_s))
}

fn group_len(len: usize) -> u8 {
    // KeyGroup guarantees 1..=16 keys.
    u8::try_from(len).expect("key group of at most 16 keys")
}

#[cfg(test)]
mod tests {
    use super::expiry::HEAP_SLACK;
    use super::*;

    fn group(names: &[&str]) -> KeyGroup {
        let keys = names
            .iter()
            .map(|name| crate::wire::Key::new(name.as_bytes()).unwrap())
            .collect();
        KeyGroup::new(keys).unwrap()
    }

    #[test]
    fn stale_heap_entries_stay_bounded_behind_a_live_head() {
        let now = Instant::from_micros(1_000);
        let mut table = LockTable::new(LockConfig::default(), 1, now);
        // Live heads: "x" is held with a waiter whose wait ends first, so
        // stale entries for "y" pile up below them in both heaps.
        let x = table.acquire(now, WaiterId(0), group(&["x"]), 0, 100);
        assert_eq!(x, AcquireOutcome::Granted { token: 1 });
        table.acquire(now, WaiterId(1), group(&["x"]), 10, 100);
        table.acquire(now, WaiterId(2), group(&["y"]), 0, 200);
        for id in 3..20_000 {
            let outcome = table.acquire(now, WaiterId(id), group(&["y"]), 60, 10);
            assert_eq!(outcome, AcquireOutcome::Queued);
            assert!(table.cancel(now, WaiterId(id)));
            assert!(table.wait_deadlines.len() <= 2 * table.waiters.len() + HEAP_SLACK + 1);
            assert!(table.lease_deadlines.len() <= 2 * table.queued_pairs + HEAP_SLACK + 1);
        }
        // The rebuilt heaps still drive the live deadlines.
        // The first sweep is due before the live wait deadline.
        let first_sweep = now.saturating_add(Duration::from_secs(5));
        assert_eq!(table.poll_timeout(), Some(first_sweep));
        let wait_deadline = now.saturating_add(Duration::from_millis(9_900));
        table.acquire(now, WaiterId(20_000), group(&["y"]), 250, 10);
        table.handle_timeout(wait_deadline);
        assert_eq!(
            table.poll_event(),
            Some(LockEvent::TimedOut {
                waiter: WaiterId(1)
            })
        );
        let y_lease_end = now.saturating_add(Duration::from_secs(200));
        table.handle_timeout(y_lease_end);
        assert!(matches!(
            table.poll_event(),
            Some(LockEvent::Granted {
                waiter: WaiterId(20_000),
                ..
            })
        ));
        assert_eq!(table.stats().waiters, 0);
    }
}
