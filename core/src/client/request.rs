//! The vocabulary of one request: its validated times ([`AcquireParams`])
//! and keys ([`KeySet`]), what a grant is ([`Grant`]) and how a request
//! ended ([`Outcome`]).

use super::error::ClientError;
use crate::lock::KeyModes;
use crate::time::{Duration, Instant};
use crate::wire::{
    ErrorCode, ExtendStatus, KEY_LEN_MAX, Key, KeyGroup, LEASE_S_MAX, PERMITS_MAX,
    SEMAPHORE_CAPACITY_MAX, SET_KEYS_MAX,
};

/// Longest wait a request may ask for, in seconds (the wire field is a u8).
pub const WAIT_S_MAX: u8 = 255;

/// Longest minimum-work budget a caller may ask to be covered.
pub const WORK_BUDGET_MAX: Duration = Duration::from_secs(250);

/// Local deadline of a `wait = 0` acquire: the server answers at once, so
/// this bounds only the transport.
pub const IMMEDIATE_TRANSPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whole seconds, rounding any fraction up (saturating).
pub(super) fn ceil_secs(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0))
}

/// A lease as sent on the wire: whole seconds, 1..=250, sub-second values
/// rounded up; out-of-range values are rejected, never clamped.
pub(super) fn lease_s(lease: Duration) -> Result<u8, ClientError> {
    if lease.is_zero() {
        return Err(ClientError::InvalidInput("lease must be greater than zero"));
    }
    u8::try_from(ceil_secs(lease))
        .ok()
        .filter(|lease_s| *lease_s <= LEASE_S_MAX)
        .ok_or(ClientError::UnsupportedDuration {
            field: "lease",
            s_max: u64::from(LEASE_S_MAX),
        })
}

/// The validated times of an acquire: whole seconds as sent on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireParams {
    wait_s: u8,
    lease_s: u8,
    work_budget_min: Duration,
    max_hold_s: Option<u32>,
    permits: Option<(u8, u16)>,
    modes: KeyModes,
}

impl AcquireParams {
    /// Normalizes and checks an acquire's times. Sub-second values round
    /// up; `wait` must be at most 255 s, `lease` 1..=250 s, and the budget at
    /// most 250 s and at most the normalized lease. Out-of-range values are
    /// rejected, never clamped.
    pub fn new(
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<Self, ClientError> {
        let wait_s =
            u8::try_from(ceil_secs(wait)).map_err(|_| ClientError::UnsupportedDuration {
                field: "wait",
                s_max: u64::from(WAIT_S_MAX),
            })?;
        let lease_s = lease_s(lease)?;
        if work_budget_min > WORK_BUDGET_MAX {
            return Err(ClientError::UnsupportedDuration {
                field: "min_work_budget",
                s_max: WORK_BUDGET_MAX.as_secs(),
            });
        }
        // The budget is compared unrounded: the caller asked for exactly it.
        if work_budget_min > Duration::from_secs(u64::from(lease_s)) {
            return Err(ClientError::InsufficientLease);
        }
        Ok(AcquireParams {
            wait_s,
            lease_s,
            work_budget_min,
            max_hold_s: None,
            permits: None,
            modes: KeyModes::EXCLUSIVE,
        })
    }
    /// These times for `permits` permits of a FIFO semaphore of `capacity`
    /// slots (docs/protocol.md §8.5): the acquire's one key names the
    /// semaphore (at most 122 bytes), and the grant holds the `permits`
    /// lowest free slots under one token ([`Grant::permits`]). Sent as `Q`,
    /// which only a server that granted PERMITS takes: elsewhere the
    /// acquire fails with [`ClientError::Unsupported`], sending nothing.
    pub fn with_permits(mut self, permits: u8, capacity: u16) -> Result<Self, ClientError> {
        if !(1..=PERMITS_MAX).contains(&permits) {
            return Err(ClientError::InvalidInput("permits must be 1..=16"));
        }
        if !(1..=SEMAPHORE_CAPACITY_MAX).contains(&capacity) {
            return Err(ClientError::InvalidInput("capacity must be 1..=1024"));
        }
        if u16::from(permits) > capacity {
            return Err(ClientError::InvalidInput(
                "permits must not exceed the capacity",
            ));
        }
        self.permits = Some((permits, capacity));
        Ok(self)
    }
    /// These times with a mode per key (docs/protocol.md §8.7): the keys
    /// `modes` marks (bit `i`: key `i` of the ascending set) are taken
    /// shared, the others exclusive, under one token. Sent as `Y`, which
    /// only a server that granted SHARED takes: elsewhere the acquire
    /// fails with [`ClientError::Unsupported`], sending nothing. There is
    /// no upgrade: to write, release and acquire again exclusive.
    pub fn with_modes(mut self, modes: KeyModes) -> Self {
        self.modes = modes;
        self
    }
    /// The mode per key (every key exclusive unless set).
    pub fn modes(&self) -> KeyModes {
        self.modes
    }
    /// The permits and capacity asked for, if this is a semaphore acquire.
    pub fn permits(&self) -> Option<(u8, u16)> {
        self.permits
    }
    /// These times with a cap on total hold (docs/protocol.md §8.4):
    /// however often it is renewed, the grant ends by `max_hold` after it
    /// was made (whole seconds, rounded up; the server may cut it to its
    /// own limit). Sent as `H`, which only a server that granted EXTEND
    /// takes: elsewhere the acquire fails with
    /// [`ClientError::Unsupported`], sending nothing.
    pub fn with_max_hold(mut self, max_hold: Duration) -> Result<Self, ClientError> {
        if max_hold.is_zero() {
            return Err(ClientError::InvalidInput(
                "max_hold must be greater than zero",
            ));
        }
        let max_hold_s =
            u32::try_from(ceil_secs(max_hold)).map_err(|_| ClientError::UnsupportedDuration {
                field: "max_hold",
                s_max: u64::from(u32::MAX),
            })?;
        self.max_hold_s = Some(max_hold_s);
        Ok(self)
    }
    /// The cap on total hold in whole seconds, if one is asked for.
    pub fn max_hold_s(&self) -> Option<u32> {
        self.max_hold_s
    }
    /// Wait in whole seconds; 0 = one immediate try.
    pub fn wait_s(&self) -> u8 {
        self.wait_s
    }
    /// Lease in whole seconds (1..=250).
    pub fn lease_s(&self) -> u8 {
        self.lease_s
    }
    /// The normalized lease.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(u64::from(self.lease_s))
    }
    /// The work the grant must still cover when it is handed to the caller.
    pub fn work_budget_min(&self) -> Duration {
        self.work_budget_min
    }
    /// When an acquire started at `started` gives up: `wait` later, or
    /// [`IMMEDIATE_TRANSPORT_TIMEOUT`] later for `wait = 0`.
    pub fn operation_deadline(&self, started: Instant) -> Instant {
        let allowance = if self.wait_s == 0 {
            IMMEDIATE_TRANSPORT_TIMEOUT
        } else {
            Duration::from_secs(u64::from(self.wait_s))
        };
        started.saturating_add(allowance)
    }
}

fn validate_key(key: &str) -> Result<Key, ClientError> {
    // The wire's rules, checked once; a failure is then told apart for
    // the caller (a `str` is UTF-8, so only length or a character is left).
    Key::from_text(key).map_err(|_| {
        ClientError::InvalidInput(if key.is_empty() || key.len() > KEY_LEN_MAX {
            "key must be 1..=128 bytes"
        } else {
            "key must not contain spaces or newlines"
        })
    })
}

/// The keys of one acquire or release: one key (sent as `A`/`R`) or a
/// canonical set of 2..=16 keys (sent as `S`/`G`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeySet(pub(super) KeyGroup);

impl KeySet {
    /// One key: 1..=128 bytes, no space, CR or LF.
    pub fn single(key: &str) -> Result<Self, ClientError> {
        Ok(KeySet(KeyGroup::single(validate_key(key)?)))
    }
    /// 1..=16 keys (counted before removing duplicates, like the official
    /// client), sorted by raw bytes and deduplicated. A set that dedups to
    /// one key is sent as a single-key request.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Result<Self, ClientError> {
        if keys.is_empty() || keys.len() > SET_KEYS_MAX {
            return Err(ClientError::InvalidInput(
                "key set must contain 1..=16 keys",
            ));
        }
        let mut canonical = keys
            .iter()
            .map(|key| validate_key(key.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        canonical.sort_unstable();
        canonical.dedup();
        KeyGroup::new(canonical)
            .map(KeySet)
            .map_err(|_| ClientError::InvalidInput("invalid key set"))
    }
    /// The set of `exclusive` and `shared` keys (1..=16 in all, as for
    /// [`KeySet::new`]) with the mode of each (docs/protocol.md §8.7), for
    /// [`AcquireParams::with_modes`]. A key named in both is an error.
    pub fn with_modes<S: AsRef<str>>(
        exclusive: &[S],
        shared: &[S],
    ) -> Result<(Self, KeyModes), ClientError> {
        let all: Vec<&str> = exclusive.iter().chain(shared).map(AsRef::as_ref).collect();
        let set = KeySet::new(&all)?;
        if set.len() != all.len() {
            return Err(ClientError::InvalidInput(
                "a key is named twice (in one mode or in both)",
            ));
        }
        let bits = set
            .keys()
            .iter()
            .enumerate()
            .filter(|(_, key)| shared.iter().any(|s| s.as_ref() == key.as_str()))
            .fold(0u16, |bits, (i, _)| bits | (1 << i));
        Ok((set, KeyModes::from_bits(bits)))
    }
    /// The keys, ascending.
    pub fn keys(&self) -> &[Key] {
        self.0.keys()
    }
    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Always false: a set has at least one key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// True when sent as `S`/`G` (more than one key).
    pub fn is_set(&self) -> bool {
        self.0.len() > 1
    }
    /// The wire key group.
    pub fn group(&self) -> &KeyGroup {
        &self.0
    }
}

/// True when a grant valid before `valid_before` still covers
/// `work_budget_min` at `now`.
pub fn lease_covers(valid_before: Instant, now: Instant, work_budget_min: Duration) -> bool {
    valid_before > now && valid_before.saturating_duration_since(now) >= work_budget_min
}

/// A lock granted by the server. Whoever owns a `Grant` owns the lock: if it
/// is not handed to the caller, release it (see [`ReleaseOperation`](super::ReleaseOperation)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The keys held.
    pub keys: KeySet,
    /// The fencing token; enforce it at the protected write.
    pub token: u64,
    /// Conservative end of the lease: the lease counted from just before the
    /// request bytes were handed to the transport. The server starts the
    /// lease no earlier than receipt, so the real lease ends later.
    pub valid_before: Instant,
    /// For a semaphore's permits: the slots held (their keys are
    /// [`Grant::keys`]) and the slots left free.
    pub permits: Option<GrantedPermits>,
}

/// The permits of a semaphore grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantedPermits {
    /// The slots held, ascending; they double as worker ids.
    pub slots: Vec<u16>,
    /// Slots of the semaphore free as the server granted these.
    pub free: u16,
}

impl Grant {
    /// True when the conservative remaining lease covers `work_budget_min`.
    pub fn covers(&self, now: Instant, work_budget_min: Duration) -> bool {
        lease_covers(self.valid_before, now, work_budget_min)
    }
}

/// How one request ended, as far as this session can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `A`/`S`: the lock is held.
    Acquired(Grant),
    /// `T`, or the local deadline passed before the request was sent:
    /// certainly not acquired / not released.
    Timeout,
    /// `B`: refused at once, nothing queued.
    Busy,
    /// `R`/`G`: released.
    Released,
    /// `W`: the token was current and the server answered `status`.
    Extended {
        /// Renewed, clipped at the hold cap, or refused at the cap.
        status: ExtendStatus,
        /// Conservative end of the lease: the `lease_ms` the server
        /// answered counted from when the `W` was handed to the transport,
        /// so never after the server's own expiry.
        valid_before: Instant,
    },
    /// `N`: key absent or token not current (for a renewal: the grant is
    /// lost).
    NotFound,
    /// `I`, or the bytes may have left and no definite reply came.
    Indeterminate,
    /// Certainly no effect (`M`, `E 3`, `E 4`, or never sent before the
    /// session died): the same logical request may run again elsewhere.
    Retry,
    /// `E` with any other code (the session is closed).
    Error(ErrorCode),
    /// `C`: the semaphore is in use with another capacity.
    CapacityMismatch {
        /// The capacity the request declared.
        asked: u16,
        /// The semaphore's.
        capacity: u16,
    },
    /// `O`: who held the key observed as the server answered; `None`:
    /// nobody.
    Observed(Option<Leader>),
    /// `D`: the grant now holds its keys shared (same token, same lease).
    Downgraded,
}

/// The holder of a key as observed (`O`, docs/protocol.md §8.6): an
/// election's leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The label the holder's connection negotiated (empty if it gave
    /// none, or if its connection closed and the server no longer knows
    /// it).
    pub label: String,
    /// The holder's fencing token: the election's term. A later leader
    /// always has a larger one.
    pub term: u64,
    /// False when the holder's connection has closed (a process that died
    /// while leader): it stays leader until its lease runs out, unless its
    /// grant is released or renewed by its token.
    pub connected: bool,
    /// The holder's lease left as the server answered.
    pub lease_remaining: Duration,
}

/// A lock the caller will never see, to be released with its exact token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compensation {
    /// The keys.
    pub keys: KeySet,
    /// The token.
    pub token: u64,
}
