//! The lock table: keys, FIFO waiter queues, leases, fencing tokens, capacity
//! limits and key sets.
//!
//! Deterministic: time enters only as `now` arguments; the table never reads a
//! clock. The single-mode server drives it directly; cluster mode will drive
//! the same rules through replicated commands.
//!
//! SKELETON: bodies marked `todo!` are being written; signatures are fixed.

use crate::time::{Duration, Instant};
use crate::wire::KeyGroup;

/// Capacity limits. Over any of them an acquire is answered `B` at once and
/// nothing is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Keys in the table (held or with waiters).
    pub max_keys: usize,
    /// Waiters queued on one key.
    pub max_waiters_per_key: usize,
    /// Waiters queued in the whole table (a key-set waiter counts once).
    pub max_waiters_total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 2_000_000,
            max_waiters_per_key: 4_096,
            max_waiters_total: 200_000,
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

/// The lock table.
#[derive(Debug)]
pub struct LockTable {
    config: LockConfig,
    next_token: u64,
}

impl LockTable {
    /// An empty table whose first grant gets `first_token` (non-zero).
    pub fn new(config: LockConfig, first_token: u64, now: Instant) -> Self {
        let _ = now;
        LockTable { config, next_token: first_token.max(1) }
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
        let _ = (now, waiter, keys, wait_s, lease_s, &self.config);
        todo!()
    }

    /// A release received at `now`.
    pub fn release(&mut self, now: Instant, keys: &KeyGroup, token: u64) -> ReleaseOutcome {
        let _ = (now, keys, token);
        todo!()
    }

    /// Drops a queued waiter (its connection closed). Returns false if it was
    /// not queued. May grant keys to the waiters behind it.
    pub fn cancel(&mut self, now: Instant, waiter: WaiterId) -> bool {
        let _ = (now, waiter);
        todo!()
    }

    /// Ends every queued wait with [`LockEvent::TimedOut`] (server shutdown).
    pub fn time_out_all_waiters(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// Processes every deadline at or before `now`: lease expiry of keys with
    /// waiters (handing them on), wait deadlines, and the periodic sweep.
    /// Calling it early or twice is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// The earliest instant at which [`LockTable::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }

    /// The next event for a queued waiter, if any.
    pub fn poll_event(&mut self) -> Option<LockEvent> {
        todo!()
    }

    /// Current counts.
    pub fn stats(&self) -> LockStats {
        todo!()
    }

    /// The next token to be issued.
    pub fn next_token(&self) -> u64 {
        self.next_token
    }
}
