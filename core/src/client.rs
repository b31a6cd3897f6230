//! The client as sans-IO state machines, shared by every runtime.
//!
//! The runtimes (tokio, smol) only move bytes, read clocks and park futures;
//! every rule of the official client lives here:
//!
//! - [`Session`]: one connection. Runs the client handshake, assigns request
//!   ids, hands request bytes out at the *send boundary*
//!   ([`Session::poll_transmit`]), matches replies with every session-fatal
//!   check, and turns lost replies into [`Outcome::Indeterminate`] or
//!   [`Outcome::Retry`] depending on whether the bytes may have left.
//! - [`Router`]: picks a ready connection, leader first, then round-robin
//!   ([`Router::pick`]) or in runs that share writes
//!   ([`Router::pick_coalescing`], what the broker uses).
//! - [`AcquireOperation`] / [`ReleaseOperation`]: one logical acquire or
//!   release across attempts (retry only what certainly had no effect,
//!   conservative validity, the absolute 5 s release window).
//! - [`Backoff`]: reconnect delays.
//! - [`BrokerState`], [`run_acquire`], [`run_release`]: the broker-wide
//!   state behind a runtime's lock (pending outcomes, capacity, release
//!   queue) and the operation loops, over a runtime's [`Broker`].
//! - [`Ticket`] / [`TicketSet`]: what the caller holds after an acquire,
//!   released once (explicitly or on drop) through its [`Broker`].
//! - [`BrokerConfig`]: validation of what a user configures, and the
//!   connections it implies (one address means two connections).
//!
//! Driving a [`Session`] (str0m / quinn-proto shape): after every input
//! ([`Session::handle_input`], [`Session::handle_timeout`],
//! [`Session::submit_acquire`], …) drain [`Session::poll_transmit`] while the
//! socket can take bytes, drain [`Session::poll_event`], and sleep until
//! [`Session::poll_timeout`]. Nothing here reads a clock or does IO.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;

use crate::auth::{
    ClientHandshake, ClientHandshakeStatus, HelloError, SINGLE_FINGERPRINT, WireMode,
};
use crate::time::{Duration, Instant};
use crate::wire::{
    AcquireRequest, ErrorCode, FRAME_HEADER_LEN, Key, KeyGroup, MAX_KEY_LEN, MAX_LEASE_S,
    MAX_SET_KEYS, NO_LEADER_SLOT, ReleaseRequest, Reply, ReplyError, Request,
};

mod broker;
mod ticket;

pub use broker::{Broker, BrokerNotice, BrokerState, OutcomeSender, run_acquire, run_release};
pub use ticket::{Ticket, TicketSet};

/// Longest wait a request may ask for, in seconds (the wire field is a u8).
pub const MAX_WAIT_S: u8 = 255;
/// Longest minimum-work budget a caller may ask to be covered.
pub const MAX_WORK_BUDGET: Duration = Duration::from_secs(250);
/// Local deadline of a `wait = 0` acquire: the server answers at once, so
/// this bounds only the transport.
pub const IMMEDIATE_TRANSPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// A release (explicit or compensating) is retried until this long after
/// the call or enqueue, never longer, whatever the lease.
pub const RELEASE_RETRY_WINDOW: Duration = Duration::from_secs(5);
/// One release attempt waits at most this long for its reply.
pub const RELEASE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection that has not finished TCP, TLS and the handshake this long
/// after [`Session::new`] is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A reply frame that was started but not finished this long is a stalled
/// peer: the session is closed.
pub const READ_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3);
/// For runtimes: a write that makes no progress for this long should end the
/// transport (then call [`Session::handle_transport_closed`]).
pub const WRITE_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3);
/// Default [`SessionConfig::silence_timeout`]: above the default Raft
/// profile's longest election timeout (2.5 s), within which a leader that
/// lost its majority steps down and answers what it was proposing, so a
/// leader change does not reach it.
pub const DEFAULT_SILENCE_TIMEOUT: Duration = Duration::from_secs(3);
/// Shortest [`BrokerConfig::silence_timeout`] a configuration may ask for.
pub const MIN_SILENCE_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest [`BrokerConfig::silence_timeout`] a configuration may ask for.
pub const MAX_SILENCE_TIMEOUT: Duration = Duration::from_secs(300);
/// First reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(3200);
/// A session that lived at least this long (from ready to closed) resets the
/// backoff and reconnects at once.
pub const SHORT_SESSION: Duration = Duration::from_secs(1);
/// First delay before an acquire is tried again on another connection.
pub const RETRY_MIN: Duration = Duration::from_millis(10);
/// Longest delay between acquire attempts.
pub const ACQUIRE_RETRY_MAX: Duration = Duration::from_millis(100);
/// Longest delay between release attempts.
pub const RELEASE_RETRY_MAX: Duration = Duration::from_millis(200);
/// Default bound on acquires awaiting a reply on one session.
pub const DEFAULT_MAX_PENDING_ACQUIRES: usize = 1024;
/// Default bound on releases awaiting a reply on one session. Separate from
/// acquires so that a session full of waiting acquires can still release.
pub const DEFAULT_MAX_PENDING_RELEASES: usize = 128;
/// Default broker-wide bound on acquires in flight.
pub const DEFAULT_MAX_PENDING: usize = 1024;
/// Largest broker-wide bound a configuration may ask for.
pub const MAX_PENDING_LIMIT: usize = 16_384;
/// Default capacity of the compensating/auto release queue.
pub const RELEASE_QUEUE_CAPACITY: usize = 512;
/// [`Session::poll_transmit`] stops adding frames once it has handed out
/// this many bytes in one call, so requests not yet handed out stay
/// cancellable and retryable while the socket is slow.
pub const TRANSMIT_BATCH_BYTES: usize = 64 * 1024;
/// [`Router::pick_coalescing`] keeps sending to one connection for at most
/// this many requests in a row, then moves to the next ready one.
pub const ROUTE_RUN_REQUESTS: usize = 1024;
/// [`Router::pick_coalescing`] moves on from a connection on which this
/// many requests wait for a write, so one whose writes stall cannot draw
/// every request to itself.
pub const COALESCE_MAX_UNSENT: usize = 256;

/// The longest reply frame (`A`/`S`: rid and token).
const MAX_REPLY_FRAME_LEN: usize = FRAME_HEADER_LEN + 16;
/// Shortest client token a published client accepts.
const MIN_CLIENT_TOKEN_LEN: usize = 16;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Everything a client call can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// The wait ended without the lock (server `T`, or the local deadline
    /// passed before the request was sent).
    Timeout,
    /// The server refused the acquire at once: queue or capacity at its limit.
    /// Nothing was queued; no internal retry.
    Busy,
    /// The client's own bound on requests in flight is reached.
    ClientCapacity,
    /// No ready connection.
    NotConnected,
    /// The server rejected our proof, or is not the server we expect.
    Auth,
    /// The request may or may not have taken effect. For an acquire: do not
    /// enter the critical section.
    Indeterminate,
    /// The conservative remaining lease does not cover the work budget.
    InsufficientLease,
    /// A duration outside what the protocol supports; rejected, never clamped.
    UnsupportedDuration {
        /// Which argument.
        field: &'static str,
        /// The largest supported value, in seconds.
        max_s: u64,
    },
    /// An argument is invalid.
    InvalidInput(&'static str),
    /// The server broke the protocol, or answered with an error code.
    Protocol(String),
    /// The broker is closed.
    Closed,
    /// An IO error reported by the runtime.
    Io {
        /// Its kind.
        kind: std::io::ErrorKind,
        /// Its text.
        message: String,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Timeout => f.write_str("timed out waiting for the lock"),
            ClientError::Busy => {
                f.write_str("server is busy: the acquire was refused, nothing was queued")
            }
            ClientError::ClientCapacity => {
                f.write_str("client limit on requests in flight reached")
            }
            ClientError::NotConnected => f.write_str("no connected server"),
            ClientError::Auth => f.write_str("authentication rejected, or not the expected server"),
            ClientError::Indeterminate => f.write_str(
                "the request may or may not have taken effect: no definite reply was received",
            ),
            ClientError::InsufficientLease => f.write_str(
                "the conservative remaining lease does not cover the minimum work budget",
            ),
            ClientError::UnsupportedDuration { field, max_s } => {
                write!(
                    f,
                    "{field} exceeds the supported maximum of {max_s} seconds"
                )
            }
            ClientError::InvalidInput(what) => write!(f, "invalid input: {what}"),
            ClientError::Protocol(what) => write!(f, "protocol error: {what}"),
            ClientError::Closed => f.write_str("broker is closed"),
            ClientError::Io { message, .. } => write!(f, "io error: {message}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> Self {
        ClientError::Io {
            kind: error.kind(),
            message: error.to_string(),
        }
    }
}

// ---------------------------------------------------------------------------
// Parameters and keys
// ---------------------------------------------------------------------------

/// Whole seconds, rounding any fraction up (saturating).
fn ceil_secs(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0))
}

/// The validated times of an acquire: whole seconds as sent on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireParams {
    wait_s: u8,
    lease_s: u8,
    min_work_budget: Duration,
}

impl AcquireParams {
    /// Normalizes and checks an acquire's times. Sub-second values round
    /// up; `wait` must be at most 255 s, `lease` 1..=250 s, and the budget at
    /// most 250 s and at most the normalized lease. Out-of-range values are
    /// rejected, never clamped.
    pub fn new(
        wait: Duration,
        lease: Duration,
        min_work_budget: Duration,
    ) -> Result<Self, ClientError> {
        let wait_s =
            u8::try_from(ceil_secs(wait)).map_err(|_| ClientError::UnsupportedDuration {
                field: "wait",
                max_s: u64::from(MAX_WAIT_S),
            })?;
        if lease.is_zero() {
            return Err(ClientError::InvalidInput("lease must be greater than zero"));
        }
        let lease_s = u8::try_from(ceil_secs(lease))
            .ok()
            .filter(|lease_s| *lease_s <= MAX_LEASE_S)
            .ok_or(ClientError::UnsupportedDuration {
                field: "lease",
                max_s: u64::from(MAX_LEASE_S),
            })?;
        if min_work_budget > MAX_WORK_BUDGET {
            return Err(ClientError::UnsupportedDuration {
                field: "min_work_budget",
                max_s: MAX_WORK_BUDGET.as_secs(),
            });
        }
        // The budget is compared unrounded: the caller asked for exactly it.
        if min_work_budget > Duration::from_secs(u64::from(lease_s)) {
            return Err(ClientError::InsufficientLease);
        }
        Ok(AcquireParams {
            wait_s,
            lease_s,
            min_work_budget,
        })
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
    pub fn min_work_budget(&self) -> Duration {
        self.min_work_budget
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
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ClientError::InvalidInput("key must be 1..=128 bytes"));
    }
    if key.bytes().any(|byte| matches!(byte, b' ' | b'\r' | b'\n')) {
        return Err(ClientError::InvalidInput(
            "key must not contain spaces or newlines",
        ));
    }
    // Same rules as above, so this cannot fail; keep one source of truth.
    Key::new(key.as_bytes()).map_err(|_| ClientError::InvalidInput("invalid key"))
}

/// The keys of one acquire or release: one key (sent as `A`/`R`) or a
/// canonical set of 2..=16 keys (sent as `S`/`G`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeySet(KeyGroup);

impl KeySet {
    /// One key: 1..=128 bytes, no space, CR or LF.
    pub fn single(key: &str) -> Result<Self, ClientError> {
        Ok(KeySet(KeyGroup::single(validate_key(key)?)))
    }
    /// 1..=16 keys (counted before removing duplicates, like the official
    /// client), sorted by raw bytes and deduplicated. A set that dedups to
    /// one key is sent as a single-key request.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Result<Self, ClientError> {
        if keys.is_empty() || keys.len() > MAX_SET_KEYS {
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

// ---------------------------------------------------------------------------
// Grants and outcomes
// ---------------------------------------------------------------------------

/// True when a grant valid before `valid_before` still covers
/// `min_work_budget` at `now`.
pub fn lease_covers(valid_before: Instant, now: Instant, min_work_budget: Duration) -> bool {
    valid_before > now && valid_before.saturating_duration_since(now) >= min_work_budget
}

/// A lock granted by the server. Whoever owns a `Grant` owns the lock: if it
/// is not handed to the caller, release it (see [`ReleaseOperation`]).
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
}

impl Grant {
    /// True when the conservative remaining lease covers `min_work_budget`.
    pub fn covers(&self, now: Instant, min_work_budget: Duration) -> bool {
        lease_covers(self.valid_before, now, min_work_budget)
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
    /// `N`: key absent or token not current.
    NotFound,
    /// `I`, or the bytes may have left and no definite reply came.
    Indeterminate,
    /// Certainly no effect (`M`, `E 3`, `E 4`, or never sent before the
    /// session died): the same logical request may run again elsewhere.
    Retry,
    /// `E` with any other code (the session is closed).
    Error(ErrorCode),
}

/// A lock the caller will never see, to be released with its exact token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compensation {
    /// The keys.
    pub keys: KeySet,
    /// The token.
    pub token: u64,
}

/// A reply that breaks the protocol; every one is session-fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// Unknown op, wrong length, rid or token 0, unknown `E` code.
    Frame(ReplyError),
    /// A reply for no request in flight (also a second reply to one request,
    /// or a reply to a request whose bytes were never handed out).
    UnknownRid(u64),
    /// A reply kind that cannot answer the request.
    WrongKind {
        /// The request id.
        rid: u64,
        /// The reply op.
        op: u8,
    },
    /// A leader slot that is not valid for the mode and cluster size.
    BadSlot(u8),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProtocolError::Frame(error) => write!(f, "{error}"),
            ProtocolError::UnknownRid(rid) => write!(f, "reply for unknown request id {rid}"),
            ProtocolError::WrongKind { rid, op } => {
                write!(f, "reply op 0x{op:02x} cannot answer request id {rid}")
            }
            ProtocolError::BadSlot(slot) => write!(f, "invalid leader slot {slot}"),
        }
    }
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The server answered the proof with `0x00`.
    AuthRejected,
    /// The hello was malformed.
    BadHello(HelloError),
    /// The hello names another mode or slot than configured.
    UnexpectedServer,
    /// A result byte other than 0 or 1.
    BadResult(u8),
    /// The handshake did not finish within [`HANDSHAKE_TIMEOUT`].
    HandshakeTimeout,
    /// The server broke the protocol.
    Protocol(ProtocolError),
    /// `M`: this node is not the leader (session-fatal by the official rule).
    Moved {
        /// The leader it named, if any.
        leader_slot: Option<u8>,
    },
    /// `E`: every error reply is session-fatal.
    ServerError(ErrorCode),
    /// A request whose bytes may have left passed its local deadline; a late
    /// reply could no longer be attributed, so the session is dropped.
    DeadlineAfterSend,
    /// The caller cancelled a request whose bytes may have left.
    CancelledAfterSend,
    /// A reply frame stalled mid-way for [`READ_PROGRESS_TIMEOUT`].
    StalledReply,
    /// A request was overdue (see [`SessionConfig::silence_timeout`]) and
    /// no byte arrived for the silence timeout: the server or the path to
    /// it is dead, frozen or cut off.
    Silent,
    /// The runtime reported EOF or an IO error.
    TransportClosed,
    /// The runtime closed the session.
    Local,
    /// Request ids ran out (after 2^64 - 1 requests).
    RidsExhausted,
}

impl CloseReason {
    /// True when reconnecting cannot help: wrong token or wrong server. The
    /// official client stops reconnecting that address.
    pub fn is_auth_failure(&self) -> bool {
        matches!(
            self,
            CloseReason::AuthRejected
                | CloseReason::BadHello(_)
                | CloseReason::UnexpectedServer
                | CloseReason::BadResult(_)
        )
    }
    /// True for a routing answer (`M`, `E 3`, `E 4`): the node answered, it
    /// just is not the one to serve requests now. The connection is healthy.
    pub fn is_routing(&self) -> bool {
        matches!(
            self,
            CloseReason::Moved { .. }
                | CloseReason::ServerError(ErrorCode::NotActive | ErrorCode::NoLeader)
        )
    }
    /// The error a caller sees for a request that could not use this session.
    pub fn to_error(&self) -> ClientError {
        if self.is_auth_failure() {
            ClientError::Auth
        } else if let CloseReason::Protocol(error) = self {
            ClientError::Protocol(error.to_string())
        } else {
            ClientError::NotConnected
        }
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::AuthRejected => f.write_str("authentication rejected"),
            CloseReason::BadHello(error) => write!(f, "bad server hello: {error:?}"),
            CloseReason::UnexpectedServer => {
                f.write_str("server mode or slot is not the configured one")
            }
            CloseReason::BadResult(byte) => write!(f, "invalid handshake result byte 0x{byte:02x}"),
            CloseReason::HandshakeTimeout => f.write_str("handshake timed out"),
            CloseReason::Protocol(error) => write!(f, "protocol violation: {error}"),
            CloseReason::Moved {
                leader_slot: Some(slot),
            } => {
                write!(f, "not the leader (leader is slot {slot})")
            }
            CloseReason::Moved { leader_slot: None } => {
                f.write_str("not the leader (no leader known)")
            }
            CloseReason::ServerError(code) => write!(f, "server answered error {code:?}"),
            CloseReason::DeadlineAfterSend => {
                f.write_str("a sent request passed its deadline without a reply")
            }
            CloseReason::CancelledAfterSend => f.write_str("a sent request was cancelled"),
            CloseReason::StalledReply => f.write_str("a reply frame stalled"),
            CloseReason::Silent => {
                f.write_str("an overdue request and no bytes for the silence timeout")
            }
            CloseReason::TransportClosed => f.write_str("connection closed"),
            CloseReason::Local => f.write_str("closed locally"),
            CloseReason::RidsExhausted => f.write_str("request ids exhausted"),
        }
    }
}

/// What a [`Session`] reports to its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// The handshake succeeded; requests may be submitted.
    Ready,
    /// A request ended.
    Outcome {
        /// Its id.
        rid: u64,
        /// How it ended.
        outcome: Outcome,
    },
    /// The server named the leader (`L` or `M`); `None` = no leader known.
    /// Only the latest hint is kept in the event queue.
    LeaderHint(Option<u8>),
    /// This node is not an active leader (`E 3`/`E 4`): if it is the
    /// remembered leader, forget it.
    NotLeader,
    /// A grant nobody will receive (it arrived after its deadline, or its
    /// request was cancelled): release it with [`ReleaseOperation`].
    Compensate(Compensation),
    /// The session ended; nothing follows.
    Closed(CloseReason),
}

/// What [`Session::cancel`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Never handed out: certainly no effect; the request is gone.
    Unsent,
    /// Possibly sent: the session was closed (a late reply could not be
    /// attributed); treat the request as Indeterminate.
    PossiblySent,
    /// Already resolved and not yet polled: the outcome was withdrawn; a
    /// grant among them was turned into a [`SessionEvent::Compensate`].
    Withdrawn,
    /// Not known: already polled (the driver owns the outcome) or never
    /// submitted.
    Unknown,
}

// ---------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------

/// What a [`Session`] expects of its server.
#[derive(Clone)]
pub struct SessionConfig {
    token: Vec<u8>,
    /// Identity fingerprint ([`SINGLE_FINGERPRINT`] in single mode).
    pub fingerprint: [u8; 32],
    /// Expected server mode.
    pub mode: WireMode,
    /// Expected self slot in the hello (single: [`NO_LEADER_SLOT`]).
    pub expected_slot: u8,
    /// Number of cluster slots (3 or 5; 1 in single mode): leader slots at
    /// or above it are protocol violations.
    pub cluster_size: usize,
    /// Acquires awaiting a reply at most.
    pub max_pending_acquires: usize,
    /// Releases awaiting a reply at most.
    pub max_pending_releases: usize,
    /// How long TCP, TLS and the handshake may take together.
    pub handshake_timeout: Duration,
    /// The silence rule. A sent request is *overdue* once it has waited
    /// longer than a live server may take to answer it: an acquire its
    /// wait (the wait byte sent) plus this, a release this. A session with
    /// an overdue request on which no byte at all arrived for this long is
    /// closed ([`CloseReason::Silent`]): its requests end as after any lost
    /// connection (possibly sent → Indeterminate) and the runtime
    /// reconnects.
    pub silence_timeout: Duration,
}

impl fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        f.debug_struct("SessionConfig")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("mode", &self.mode)
            .field("expected_slot", &self.expected_slot)
            .field("cluster_size", &self.cluster_size)
            .field("max_pending_acquires", &self.max_pending_acquires)
            .field("max_pending_releases", &self.max_pending_releases)
            .field("silence_timeout", &self.silence_timeout)
            .finish_non_exhaustive()
    }
}

impl SessionConfig {
    /// A single-mode server; `token` is empty in loopback no-auth mode.
    pub fn single(token: &[u8]) -> Self {
        SessionConfig {
            token: token.to_vec(),
            fingerprint: SINGLE_FINGERPRINT,
            mode: WireMode::Single,
            expected_slot: NO_LEADER_SLOT,
            cluster_size: 1,
            max_pending_acquires: DEFAULT_MAX_PENDING_ACQUIRES,
            max_pending_releases: DEFAULT_MAX_PENDING_RELEASES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            silence_timeout: DEFAULT_SILENCE_TIMEOUT,
        }
    }
    /// The node at `slot` of a cluster of `cluster_size` with identity
    /// `fingerprint`.
    pub fn cluster(token: &[u8], fingerprint: [u8; 32], slot: u8, cluster_size: usize) -> Self {
        SessionConfig {
            fingerprint,
            mode: WireMode::Cluster,
            expected_slot: slot,
            cluster_size,
            ..SessionConfig::single(token)
        }
    }
    /// Whether `slot` may appear in an `L` or `M` from this server.
    pub fn slot_valid(&self, slot: u8) -> bool {
        slot == NO_LEADER_SLOT
            || (self.mode == WireMode::Cluster
                && matches!(self.cluster_size, 3 | 5)
                && usize::from(slot) < self.cluster_size)
    }
}

#[derive(Debug)]
enum Phase {
    Handshake(Box<ClientHandshake>),
    Ready,
    Closed,
}

/// One request awaiting its reply.
#[derive(Debug)]
struct Pending {
    /// The request with its rid; an acquire's wait byte is filled in when
    /// it is handed out.
    request: Request,
    /// Local deadline: the operation deadline of an acquire, the attempt
    /// deadline of a release.
    deadline: Instant,
    /// The caller's wait (0 = immediate); the wait byte never exceeds it.
    max_wait_s: u8,
    /// When the bytes were handed out (the send boundary); `None` = unsent.
    sent_at: Option<Instant>,
}

impl Pending {
    /// When a live server has certainly answered this request (see
    /// [`SessionConfig::silence_timeout`]); `None` while unsent.
    fn overdue_at(&self, silence_timeout: Duration) -> Option<Instant> {
        let wait = match &self.request {
            Request::Acquire(req) => Duration::from_secs(u64::from(req.wait_s)),
            Request::Release(_) => Duration::ZERO,
        };
        Some(
            self.sent_at?
                .saturating_add(wait)
                .saturating_add(silence_timeout),
        )
    }
}

impl Pending {
    fn is_acquire(&self) -> bool {
        matches!(self.request, Request::Acquire(_))
    }
}

/// One client connection as a state machine.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    phase: Phase,
    handshake_deadline: Instant,
    ready_at: Option<Instant>,
    closed_at: Option<Instant>,
    close_reason: Option<CloseReason>,
    /// The proof, until handed out.
    proof: Vec<u8>,
    /// A partial reply frame (at most one frame long) and when it began.
    partial: Vec<u8>,
    partial_since: Option<Instant>,
    /// Requests in flight by rid. Rids are handed out in order, so every
    /// rid below `send_cursor` has been handed out and none above it has.
    pending: BTreeMap<u64, Pending>,
    pending_acquires: usize,
    pending_releases: usize,
    /// Requests in `pending` not yet handed out.
    unsent: usize,
    send_cursor: u64,
    next_rid: Option<u64>,
    /// Local deadlines by rid; entries of resolved requests are dropped
    /// lazily (and the heap is rebuilt when they pile up).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// When each sent request is overdue, by rid; pruned like `deadlines`.
    overdue: BinaryHeap<Reverse<(Instant, u64)>>,
    /// When the last byte arrived (the connection attempt's start before
    /// any): the silence rule's clock.
    last_input_at: Instant,
    events: VecDeque<SessionEvent>,
}

impl Session {
    /// A session whose connection attempt starts at `now` (call before TCP
    /// connect: the handshake deadline covers TCP, TLS and the handshake).
    pub fn new(now: Instant, config: SessionConfig) -> Self {
        let handshake = ClientHandshake::new(
            &config.token,
            config.fingerprint,
            config.mode,
            config.expected_slot,
        );
        Session {
            handshake_deadline: now.saturating_add(config.handshake_timeout),
            config,
            phase: Phase::Handshake(Box::new(handshake)),
            ready_at: None,
            closed_at: None,
            close_reason: None,
            proof: Vec::new(),
            partial: Vec::with_capacity(MAX_REPLY_FRAME_LEN),
            partial_since: None,
            pending: BTreeMap::new(),
            pending_acquires: 0,
            pending_releases: 0,
            unsent: 0,
            send_cursor: 1,
            next_rid: Some(1),
            deadlines: BinaryHeap::new(),
            overdue: BinaryHeap::new(),
            last_input_at: now,
            events: VecDeque::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }
    /// True once the handshake succeeded and until the session closes.
    pub fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }
    /// True once closed (the driver should drop the transport).
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }
    /// Why the session closed.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.close_reason.as_ref()
    }
    /// How long the session was ready before it closed (`None` if it never
    /// became ready or is still open); feeds [`Backoff::after_session`].
    pub fn lived(&self) -> Option<Duration> {
        Some(self.closed_at?.saturating_duration_since(self.ready_at?))
    }
    /// Requests awaiting a reply (sent or not).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
    /// Requests submitted and not yet handed out by
    /// [`Session::poll_transmit`]: they leave in the next write.
    pub fn unsent_len(&self) -> usize {
        self.unsent
    }

    /// Queues an acquire of `keys` with `params`, giving up at `deadline`
    /// (normally [`AcquireParams::operation_deadline`] of the logical
    /// acquire, so a retry keeps only the wait that remains). Returns its rid.
    pub fn submit_acquire(
        &mut self,
        now: Instant,
        keys: KeySet,
        params: &AcquireParams,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let request = Request::Acquire(AcquireRequest {
            rid: 0,
            wait_s: params.wait_s,
            lease_s: params.lease_s,
            set: keys.is_set(),
            keys: keys.0,
        });
        self.submit(now, request, deadline, params.wait_s)
    }

    /// Queues an exact-token release of `keys`, giving up at `deadline`
    /// (normally [`ReleaseOperation::attempt_deadline`]). Returns its rid.
    pub fn submit_release(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        let request = Request::Release(ReleaseRequest {
            rid: 0,
            token,
            set: keys.is_set(),
            keys: keys.0,
        });
        self.submit(now, request, deadline, 0)
    }

    fn submit(
        &mut self,
        now: Instant,
        mut request: Request,
        deadline: Instant,
        max_wait_s: u8,
    ) -> Result<u64, ClientError> {
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        let acquire = matches!(request, Request::Acquire(_));
        let full = if acquire {
            self.pending_acquires >= self.config.max_pending_acquires
        } else {
            self.pending_releases >= self.config.max_pending_releases
        };
        if full {
            return Err(ClientError::ClientCapacity);
        }
        if now >= deadline {
            return Err(ClientError::Timeout);
        }
        let Some(rid) = self.next_rid else {
            self.close(now, CloseReason::RidsExhausted);
            return Err(ClientError::NotConnected);
        };
        self.next_rid = rid.checked_add(1);
        match &mut request {
            Request::Acquire(req) => req.rid = rid,
            Request::Release(req) => req.rid = rid,
        }
        if acquire {
            self.pending_acquires += 1;
        } else {
            self.pending_releases += 1;
        }
        self.unsent += 1;
        self.pending.insert(
            rid,
            Pending {
                request,
                deadline,
                max_wait_s,
                sent_at: None,
            },
        );
        self.deadlines.push(Reverse((deadline, rid)));
        if self.deadlines.len() > 2 * self.pending.len() + 64 {
            self.deadlines = self
                .pending
                .iter()
                .map(|(&rid, entry)| Reverse((entry.deadline, rid)))
                .collect();
        }
        Ok(rid)
    }

    /// Appends bytes to send to `out` and returns how many. Call when the
    /// transport can take more; every request whose bytes are handed out
    /// here counts as *possibly sent* from `now` on (the send boundary): it
    /// is never resent, and a missing reply makes it Indeterminate.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.append(&mut self.proof);
        if !self.is_ready() {
            return out.len() - start;
        }
        while out.len() - start < TRANSMIT_BATCH_BYTES {
            let Some((&rid, entry)) = self.pending.range_mut(self.send_cursor..).next() else {
                break;
            };
            self.send_cursor = rid.saturating_add(1);
            if entry.sent_at.is_some() {
                // Only reachable at rid u64::MAX, where the cursor saturates.
                break;
            }
            if now >= entry.deadline {
                self.take(rid);
                self.push_outcome(rid, Outcome::Timeout);
                continue;
            }
            if let Request::Acquire(req) = &mut entry.request {
                // The server may wait only what remains of the caller's
                // wait, so that its `T` comes before our own deadline.
                req.wait_s = if entry.max_wait_s == 0 {
                    0
                } else {
                    let remaining_s = ceil_secs(entry.deadline.saturating_duration_since(now));
                    u8::try_from(remaining_s)
                        .unwrap_or(u8::MAX)
                        .min(entry.max_wait_s)
                };
            }
            entry.request.encode(out);
            entry.sent_at = Some(now);
            self.unsent -= 1;
            if let Some(at) = entry.overdue_at(self.config.silence_timeout) {
                self.overdue.push(Reverse((at, rid)));
            }
        }
        if self.overdue.len() > 2 * self.pending.len() + 64 {
            let silence_timeout = self.config.silence_timeout;
            self.overdue = self
                .pending
                .iter()
                .filter_map(|(&rid, entry)| {
                    Some(Reverse((entry.overdue_at(silence_timeout)?, rid)))
                })
                .collect();
        }
        out.len() - start
    }

    /// Bytes received from the server.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.last_input_at = self.last_input_at.max(now);
        }
        let mut rest = bytes;
        if let Phase::Handshake(handshake) = &mut self.phase {
            // A hello, the proof's answer and the first frames may arrive in
            // any split; the bound only guards against a handshake that
            // reports progress without using bytes.
            let mut status = ClientHandshakeStatus::NeedMore;
            for _ in 0..4 {
                let (used, next) = handshake.handle_input(rest);
                rest = &rest[used.min(rest.len())..];
                status = next;
                if next == ClientHandshakeStatus::SendProof {
                    // The hello completes (using bytes) exactly once.
                    if used > 0
                        && let Some(proof) = handshake.proof()
                    {
                        self.proof.extend_from_slice(&proof);
                    }
                    if rest.is_empty() {
                        return;
                    }
                    continue;
                }
                break;
            }
            match status {
                ClientHandshakeStatus::NeedMore | ClientHandshakeStatus::SendProof => return,
                ClientHandshakeStatus::Accepted => {
                    self.phase = Phase::Ready;
                    self.ready_at = Some(now);
                    self.events.push_back(SessionEvent::Ready);
                }
                ClientHandshakeStatus::Rejected => {
                    return self.close(now, CloseReason::AuthRejected);
                }
                ClientHandshakeStatus::BadHello(error) => {
                    return self.close(now, CloseReason::BadHello(error));
                }
                ClientHandshakeStatus::UnexpectedServer => {
                    return self.close(now, CloseReason::UnexpectedServer);
                }
                ClientHandshakeStatus::BadResult(byte) => {
                    return self.close(now, CloseReason::BadResult(byte));
                }
            }
        }
        if !self.is_ready() {
            return;
        }
        self.handle_frames(now, rest);
        self.prune_deadlines();
    }

    /// Decodes frames without copying whole inputs: only a frame split
    /// across inputs is buffered, and it is at most one frame long.
    fn handle_frames(&mut self, now: Instant, mut input: &[u8]) {
        while !input.is_empty() && self.is_ready() {
            if self.partial.is_empty() {
                match Reply::decode(input) {
                    Ok(Some((reply, used))) => {
                        input = &input[used..];
                        self.handle_reply(now, reply);
                    }
                    Ok(None) => {
                        // Reply::decode checked the op and exact length, so
                        // the rest is shorter than one frame.
                        self.partial.extend_from_slice(input);
                        self.partial_since = Some(now);
                        return;
                    }
                    Err(error) => {
                        return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
                    }
                }
            } else {
                let had = self.partial.len();
                let take = input.len().min(MAX_REPLY_FRAME_LEN - had);
                self.partial.extend_from_slice(&input[..take]);
                match Reply::decode(&self.partial) {
                    Ok(Some((reply, used))) => {
                        input = &input[used - had..];
                        self.partial.clear();
                        self.partial_since = None;
                        self.handle_reply(now, reply);
                    }
                    Ok(None) => {
                        // Everything taken and still short: wait for more.
                        input = &input[take..];
                    }
                    Err(error) => {
                        return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
                    }
                }
            }
        }
    }

    fn handle_reply(&mut self, now: Instant, reply: Reply) {
        let rid = match reply {
            Reply::Leader { leader_slot } => {
                if !self.config.slot_valid(leader_slot) {
                    return self.close(
                        now,
                        CloseReason::Protocol(ProtocolError::BadSlot(leader_slot)),
                    );
                }
                return self.push_leader_hint(leader_slot);
            }
            other => other.rid().unwrap_or(0),
        };
        // Only a request whose bytes were handed out can be answered; a
        // second reply finds nothing (the first removed it).
        let Some(entry) = self
            .pending
            .get(&rid)
            .filter(|entry| entry.sent_at.is_some())
        else {
            return self.close(now, CloseReason::Protocol(ProtocolError::UnknownRid(rid)));
        };
        if !reply.answers(entry.request.kind()) {
            let op = reply.op();
            return self.close(
                now,
                CloseReason::Protocol(ProtocolError::WrongKind { rid, op }),
            );
        }
        if let Reply::Moved { leader_slot, .. } = reply
            && !self.config.slot_valid(leader_slot)
        {
            return self.close(
                now,
                CloseReason::Protocol(ProtocolError::BadSlot(leader_slot)),
            );
        }
        let Some(entry) = self.take(rid) else {
            return;
        };
        match reply {
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => {
                let Request::Acquire(req) = entry.request else {
                    // `answers` admits grants only for acquires.
                    return;
                };
                let keys = KeySet(req.keys);
                if now >= entry.deadline {
                    // The caller has given up at its deadline: it is told
                    // Indeterminate and the lock is handed back.
                    self.push_outcome(rid, Outcome::Indeterminate);
                    self.events
                        .push_back(SessionEvent::Compensate(Compensation { keys, token }));
                } else {
                    let sent_at = entry.sent_at.unwrap_or(now);
                    let lease = Duration::from_secs(u64::from(req.lease_s));
                    let grant = Grant {
                        keys,
                        token,
                        valid_before: sent_at.saturating_add(lease),
                    };
                    self.push_outcome(rid, Outcome::Acquired(grant));
                }
            }
            Reply::Released { .. } | Reply::ReleasedSet { .. } => {
                self.push_outcome(rid, Outcome::Released)
            }
            Reply::NotFound { .. } => self.push_outcome(rid, Outcome::NotFound),
            Reply::TimedOut { .. } => self.push_outcome(rid, Outcome::Timeout),
            Reply::Busy { .. } => self.push_outcome(rid, Outcome::Busy),
            Reply::Indeterminate { .. } => self.push_outcome(rid, Outcome::Indeterminate),
            Reply::Moved { leader_slot, .. } => {
                self.push_outcome(rid, Outcome::Retry);
                self.push_leader_hint(leader_slot);
                let leader_slot = (leader_slot != NO_LEADER_SLOT).then_some(leader_slot);
                self.close(now, CloseReason::Moved { leader_slot });
            }
            Reply::Error { code, .. } => {
                if matches!(code, ErrorCode::NotActive | ErrorCode::NoLeader) {
                    self.push_outcome(rid, Outcome::Retry);
                    self.events.push_back(SessionEvent::NotLeader);
                } else {
                    self.push_outcome(rid, Outcome::Error(code));
                }
                self.close(now, CloseReason::ServerError(code));
            }
            Reply::Leader { .. } => {}
        }
    }

    /// Local deadlines: handshake, stalled reply frames, per-request
    /// deadlines. Calling it early does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Closed => return,
            Phase::Handshake(_) => {
                if now >= self.handshake_deadline {
                    self.close(now, CloseReason::HandshakeTimeout);
                }
                return;
            }
            Phase::Ready => {}
        }
        if self
            .partial_since
            .is_some_and(|since| now >= since.saturating_add(READ_PROGRESS_TIMEOUT))
        {
            return self.close(now, CloseReason::StalledReply);
        }
        self.prune_overdue();
        if self.silent_at().is_some_and(|at| now >= at) {
            return self.close(now, CloseReason::Silent);
        }
        while let Some(&Reverse((deadline, rid))) = self.deadlines.peek() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            let Some(entry) = self.take(rid) else {
                continue;
            };
            if entry.sent_at.is_some() {
                self.push_outcome(rid, Outcome::Indeterminate);
                return self.close(now, CloseReason::DeadlineAfterSend);
            }
            self.push_outcome(rid, Outcome::Timeout);
        }
        self.prune_deadlines();
    }

    /// The earliest instant at which [`Session::handle_timeout`] has work
    /// (possibly a little early); `None` once closed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            Phase::Handshake(_) => Some(self.handshake_deadline),
            Phase::Ready => {
                let stall = self
                    .partial_since
                    .map(|since| since.saturating_add(READ_PROGRESS_TIMEOUT));
                let request = self
                    .deadlines
                    .peek()
                    .map(|Reverse((deadline, _))| *deadline);
                [stall, request, self.silent_at()]
                    .into_iter()
                    .flatten()
                    .min()
            }
        }
    }

    /// The next event, if any. Drain after every input.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// The caller gave up on `rid` (see [`CancelOutcome`]).
    pub fn cancel(&mut self, now: Instant, rid: u64) -> CancelOutcome {
        if let Some(entry) = self.take(rid) {
            if entry.sent_at.is_none() {
                self.prune_deadlines();
                return CancelOutcome::Unsent;
            }
            self.close(now, CloseReason::CancelledAfterSend);
            return CancelOutcome::PossiblySent;
        }
        let position = self.events.iter().position(
            |event| matches!(event, SessionEvent::Outcome { rid: resolved, .. } if *resolved == rid),
        );
        let Some(event) = position.and_then(|at| self.events.remove(at)) else {
            return CancelOutcome::Unknown;
        };
        if let SessionEvent::Outcome {
            outcome: Outcome::Acquired(grant),
            ..
        } = event
        {
            self.events
                .push_back(SessionEvent::Compensate(Compensation {
                    keys: grant.keys,
                    token: grant.token,
                }));
        }
        CancelOutcome::Withdrawn
    }

    /// The transport ended (EOF, IO error, write stalled).
    pub fn handle_transport_closed(&mut self, now: Instant) {
        self.close(now, CloseReason::TransportClosed);
    }

    /// Closes the session from our side (shutdown). Pending requests end as
    /// after any other close.
    pub fn close_local(&mut self, now: Instant) {
        self.close(now, CloseReason::Local);
    }

    /// Ends the session: possibly-sent requests become Indeterminate, unsent
    /// ones Retry, then `Closed`. Idempotent.
    fn close(&mut self, now: Instant, reason: CloseReason) {
        if self.is_closed() {
            return;
        }
        self.phase = Phase::Closed;
        self.closed_at = Some(now);
        for (rid, entry) in std::mem::take(&mut self.pending) {
            let outcome = if entry.sent_at.is_some() {
                Outcome::Indeterminate
            } else {
                Outcome::Retry
            };
            self.push_outcome(rid, outcome);
        }
        self.pending_acquires = 0;
        self.pending_releases = 0;
        self.unsent = 0;
        self.deadlines = BinaryHeap::new();
        self.overdue = BinaryHeap::new();
        self.partial = Vec::new();
        self.partial_since = None;
        self.proof = Vec::new();
        self.events.push_back(SessionEvent::Closed(reason.clone()));
        self.close_reason = Some(reason);
    }

    fn take(&mut self, rid: u64) -> Option<Pending> {
        let entry = self.pending.remove(&rid)?;
        if entry.is_acquire() {
            self.pending_acquires -= 1;
        } else {
            self.pending_releases -= 1;
        }
        if entry.sent_at.is_none() {
            self.unsent -= 1;
        }
        Some(entry)
    }

    fn push_outcome(&mut self, rid: u64, outcome: Outcome) {
        self.events
            .push_back(SessionEvent::Outcome { rid, outcome });
    }

    fn push_leader_hint(&mut self, slot: u8) {
        // Only the newest hint matters; keeping one bounds what a server
        // spamming `L` can make us hold.
        self.events
            .retain(|event| !matches!(event, SessionEvent::LeaderHint(_)));
        let hint = (slot != NO_LEADER_SLOT).then_some(slot);
        self.events.push_back(SessionEvent::LeaderHint(hint));
    }

    /// Drops deadline entries of resolved requests from the top of the heap
    /// so that [`Session::poll_timeout`] is not early for them.
    fn prune_deadlines(&mut self) {
        while let Some(&Reverse((_, rid))) = self.deadlines.peek() {
            if self.pending.contains_key(&rid) {
                break;
            }
            self.deadlines.pop();
        }
        self.prune_overdue();
    }

    /// The same for the overdue instants.
    fn prune_overdue(&mut self) {
        while let Some(&Reverse((_, rid))) = self.overdue.peek() {
            if self.pending.contains_key(&rid) {
                break;
            }
            self.overdue.pop();
        }
    }

    /// When the silence rule closes the session if nothing arrives before:
    /// the earliest overdue instant of a pending request, and no earlier
    /// than the silence timeout after the last byte. May be early when the
    /// top of the heap was resolved since the last prune.
    fn silent_at(&self) -> Option<Instant> {
        let Reverse((overdue_at, _)) = self.overdue.peek()?;
        let quiet_until = self
            .last_input_at
            .saturating_add(self.config.silence_timeout);
        Some((*overdue_at).max(quiet_until))
    }
}

// ---------------------------------------------------------------------------
// Reconnect backoff
// ---------------------------------------------------------------------------

/// Reconnect delays of one connection: 100 ms doubling to 3.2 s after every
/// failed connect or short session; a session that was ready for at least
/// [`SHORT_SESSION`] resets it and reconnects at once. No jitter, so runs
/// are reproducible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
}

impl Backoff {
    /// A fresh backoff.
    pub fn new() -> Self {
        Self::default()
    }
    /// The delay before the next connect after a failed connect or handshake.
    pub fn after_connect_failure(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
    /// The delay before reconnecting after `session` (the endpoint's last
    /// session, if any) ended, or `None` when reconnecting cannot help: it
    /// failed authentication (a wrong token, or not the configured server).
    pub fn after_ended(&mut self, session: Option<&Session>) -> Option<Duration> {
        let reason = session.and_then(Session::close_reason);
        if reason.is_some_and(CloseReason::is_auth_failure) {
            return None;
        }
        Some(self.after_session(session.and_then(Session::lived), reason))
    }
    /// The delay before the next connect after a session ended;
    /// `lived` = [`Session::lived`] (`None`: it never became ready),
    /// `reason` = [`Session::close_reason`].
    pub fn after_session(
        &mut self,
        lived: Option<Duration>,
        reason: Option<&CloseReason>,
    ) -> Duration {
        if reason.is_some_and(CloseReason::is_routing) {
            // A node that answered `M`/`E 3`/`E 4` is reachable: during an
            // election every node answers so for a while, and growing the
            // backoff then would keep the client away from the new leader
            // for up to 3.2 s after it is elected. Come back soon, without
            // spinning.
            self.next = BACKOFF_MIN;
            return BACKOFF_MIN;
        }
        match lived {
            Some(lived) if lived >= SHORT_SESSION => {
                self.next = BACKOFF_MIN;
                Duration::ZERO
            }
            _ => self.after_connect_failure(),
        }
    }
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

/// Picks the connection for each request: the remembered leader if it is
/// ready, else round-robin over ready connections ([`Router::pick`]) or in
/// runs ([`Router::pick_coalescing`]). Connection `i` of a cluster is slot
/// `i`.
#[derive(Clone, Debug)]
pub struct Router {
    ready: Vec<bool>,
    leader: Option<usize>,
    next_rr: usize,
    /// The connection of the current run of [`Router::pick_coalescing`]
    /// and how many requests it has taken.
    run: Option<usize>,
    run_len: usize,
    auth_failed: bool,
}

impl Router {
    /// A router over `connections` connections (all down).
    pub fn new(connections: usize) -> Self {
        Router {
            ready: vec![false; connections],
            leader: None,
            next_rr: 0,
            run: None,
            run_len: 0,
            auth_failed: false,
        }
    }
    /// Number of connections.
    pub fn len(&self) -> usize {
        self.ready.len()
    }
    /// True when there are no connections.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }
    /// The remembered leader's connection.
    pub fn leader(&self) -> Option<usize> {
        self.leader
    }
    /// Whether connection `index` is ready.
    pub fn is_ready(&self, index: usize) -> bool {
        self.ready.get(index).copied().unwrap_or(false)
    }
    /// True once any connection failed authentication.
    pub fn auth_failed(&self) -> bool {
        self.auth_failed
    }
    /// The error for "no connection to use right now".
    pub fn no_connection_error(&self) -> ClientError {
        if self.auth_failed {
            ClientError::Auth
        } else {
            ClientError::NotConnected
        }
    }
    /// Updates from an event of connection `index`'s session.
    pub fn handle_event(&mut self, index: usize, event: &SessionEvent) {
        match event {
            SessionEvent::Ready => self.set_ready(index, true),
            SessionEvent::LeaderHint(slot) => {
                self.set_leader_hint(*slot);
            }
            SessionEvent::NotLeader => self.forget_leader_if(index),
            SessionEvent::Closed(reason) => {
                self.set_ready(index, false);
                if reason.is_auth_failure() {
                    self.auth_failed = true;
                }
            }
            SessionEvent::Outcome { .. } | SessionEvent::Compensate(_) => {}
        }
    }
    /// Marks connection `index` ready or down; a down leader is forgotten.
    pub fn set_ready(&mut self, index: usize, ready: bool) {
        if let Some(flag) = self.ready.get_mut(index) {
            *flag = ready;
        }
        if !ready {
            self.forget_leader_if(index);
        }
    }
    /// Remembers the leader named by `L` or `M` (`None` = no leader known).
    /// Returns false (and changes nothing) for a slot with no connection.
    pub fn set_leader_hint(&mut self, slot: Option<u8>) -> bool {
        match slot.map(usize::from) {
            None => self.leader = None,
            Some(index) if index < self.ready.len() => self.leader = Some(index),
            Some(_) => return false,
        }
        true
    }
    fn forget_leader_if(&mut self, index: usize) {
        if self.leader == Some(index) {
            self.leader = None;
        }
    }
    /// The connection for the next request when requests share writes:
    /// the remembered leader if it is ready; else the connection the last
    /// requests went to, for up to [`ROUTE_RUN_REQUESTS`] requests in a
    /// row and while fewer than [`COALESCE_MAX_UNSENT`] of them wait for
    /// its next write (`unsent(index)` = [`Session::unsent_len`]); else the
    /// next ready one after it. The requests of one wake-up then leave in
    /// one write and their replies come back in one read, instead of one by
    /// one over every connection, and every ready connection still carries
    /// requests in turn (none idles until it is needed and found dead).
    pub fn pick_coalescing(&mut self, unsent: impl Fn(usize) -> usize) -> Option<usize> {
        if let Some(leader) = self.leader.filter(|&leader| self.is_ready(leader)) {
            return Some(leader);
        }
        if let Some(current) = self.run.filter(|&current| {
            self.is_ready(current)
                && self.run_len < ROUTE_RUN_REQUESTS
                && unsent(current) < COALESCE_MAX_UNSENT
        }) {
            self.run_len += 1;
            return Some(current);
        }
        // The next ready connection after the run's, the run's own only if
        // it is the only one ready.
        let count = self.ready.len();
        let after = match self.run {
            Some(current) => current + 1,
            None => {
                self.next_rr = self.next_rr.wrapping_add(1);
                self.next_rr
            }
        };
        self.run = (0..count)
            .map(|offset| (after + offset) % count)
            .find(|&index| self.ready[index]);
        self.run_len = 1;
        self.run
    }
    /// The connection for the next request, `None` if none is ready.
    pub fn pick(&mut self) -> Option<usize> {
        if let Some(leader) = self.leader.filter(|&leader| self.is_ready(leader)) {
            return Some(leader);
        }
        let count = self.ready.len();
        if count == 0 {
            return None;
        }
        let start = self.next_rr % count;
        self.next_rr = self.next_rr.wrapping_add(1);
        (0..count)
            .map(|offset| (start + offset) % count)
            .find(|&index| self.ready[index])
    }
}

// ---------------------------------------------------------------------------
// Logical operations
// ---------------------------------------------------------------------------

/// What to do next in an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireStep {
    /// Hand the grant to the caller.
    Granted(Grant),
    /// Fail with this error.
    Failed(ClientError),
    /// Fail with `error`, and release `grant` (a [`ReleaseOperation`]): the
    /// lock was granted but cannot be handed to the caller.
    Compensate {
        /// What the caller sees.
        error: ClientError,
        /// The lock to release.
        grant: Grant,
    },
    /// Try again (pick a connection, submit) at this instant.
    RetryAt(Instant),
}

/// One logical acquire across attempts. Only an attempt that certainly had
/// no effect is retried, and only within the original deadline: the wait
/// sent with a retry is what remains of the caller's wait.
#[derive(Clone, Debug)]
pub struct AcquireOperation {
    keys: KeySet,
    params: AcquireParams,
    deadline: Instant,
    retry_delay: Duration,
}

impl AcquireOperation {
    /// An acquire called at `now`.
    pub fn new(now: Instant, keys: KeySet, params: AcquireParams) -> Self {
        AcquireOperation {
            deadline: params.operation_deadline(now),
            keys,
            params,
            retry_delay: RETRY_MIN,
        }
    }
    /// The keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    /// The times.
    pub fn params(&self) -> &AcquireParams {
        &self.params
    }
    /// When the whole acquire gives up.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_acquire(now, self.keys.clone(), &self.params, self.deadline)
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> AcquireStep {
        match outcome {
            Outcome::Acquired(grant) => {
                if now >= self.deadline {
                    AcquireStep::Compensate {
                        error: ClientError::Indeterminate,
                        grant,
                    }
                } else if !grant.covers(now, self.params.min_work_budget) {
                    AcquireStep::Compensate {
                        error: ClientError::InsufficientLease,
                        grant,
                    }
                } else {
                    AcquireStep::Granted(grant)
                }
            }
            Outcome::Timeout => AcquireStep::Failed(ClientError::Timeout),
            Outcome::Busy => AcquireStep::Failed(ClientError::Busy),
            Outcome::Indeterminate => AcquireStep::Failed(ClientError::Indeterminate),
            Outcome::Retry => self.retry(now, ClientError::Timeout),
            Outcome::Error(code) => AcquireStep::Failed(ClientError::Protocol(format!(
                "server rejected acquire with {code:?}"
            ))),
            Outcome::Released | Outcome::NotFound => {
                AcquireStep::Failed(ClientError::Protocol("release reply to an acquire".into()))
            }
        }
    }
    /// An attempt could not be made: no ready connection
    /// ([`Router::no_connection_error`]) or [`Session::submit_acquire`]
    /// failed.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> AcquireStep {
        match error {
            ClientError::NotConnected => self.retry(now, ClientError::Timeout),
            ClientError::ClientCapacity => self.retry(now, ClientError::ClientCapacity),
            other => AcquireStep::Failed(other),
        }
    }
    fn retry(&mut self, now: Instant, at_deadline: ClientError) -> AcquireStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return AcquireStep::Failed(at_deadline);
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(ACQUIRE_RETRY_MAX);
        AcquireStep::RetryAt(now.saturating_add(delay))
    }
}

/// How a release ended when it got a final reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// `R`/`G`: released.
    Released,
    /// `N`: the key is gone or the token is no longer current.
    AlreadyGoneOrNotCurrent,
}

/// What to do next in a release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseStep {
    /// Finished. An error means no final reply came: never assume success;
    /// the lease is the last safety net.
    Done(Result<ReleaseOutcome, ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// One exact-token release (explicit or compensating) across attempts:
/// retried on anything that is not a final reply, each attempt bounded by
/// [`RELEASE_ATTEMPT_TIMEOUT`], all of it by an absolute deadline
/// ([`RELEASE_RETRY_WINDOW`] after the call), never by the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseOperation {
    keys: KeySet,
    token: u64,
    deadline: Instant,
    retry_delay: Duration,
    /// Reported if the deadline passes; Indeterminate once any attempt may
    /// have taken effect.
    last_error: ClientError,
}

impl ReleaseOperation {
    /// A release called (or enqueued) at `now`.
    pub fn new(now: Instant, keys: KeySet, token: u64) -> Self {
        Self::with_deadline(keys, token, now.saturating_add(RELEASE_RETRY_WINDOW))
    }
    /// A release with an explicit absolute deadline (a release that keeps
    /// the deadline of an earlier attempt, or a shutdown cut-off).
    pub fn with_deadline(keys: KeySet, token: u64, deadline: Instant) -> Self {
        ReleaseOperation {
            keys,
            token,
            deadline,
            retry_delay: RETRY_MIN,
            last_error: ClientError::NotConnected,
        }
    }
    /// The keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    /// The token.
    pub fn token(&self) -> u64 {
        self.token
    }
    /// The absolute deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// The deadline of an attempt started at `now`.
    pub fn attempt_deadline(&self, now: Instant) -> Instant {
        self.deadline
            .min(now.saturating_add(RELEASE_ATTEMPT_TIMEOUT))
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_release(
            now,
            self.keys.clone(),
            self.token,
            self.attempt_deadline(now),
        )
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> ReleaseStep {
        match outcome {
            Outcome::Released => ReleaseStep::Done(Ok(ReleaseOutcome::Released)),
            Outcome::NotFound => ReleaseStep::Done(Ok(ReleaseOutcome::AlreadyGoneOrNotCurrent)),
            Outcome::Indeterminate => {
                self.last_error = ClientError::Indeterminate;
                self.retry(now)
            }
            Outcome::Retry | Outcome::Timeout => self.retry(now),
            Outcome::Error(code) => ReleaseStep::Done(Err(ClientError::Protocol(format!(
                "server rejected release with {code:?}"
            )))),
            Outcome::Acquired(_) | Outcome::Busy => ReleaseStep::Done(Err(ClientError::Protocol(
                "acquire reply to a release".into(),
            ))),
        }
    }
    /// An attempt could not be made.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> ReleaseStep {
        match error {
            ClientError::NotConnected | ClientError::Timeout => self.retry(now),
            ClientError::ClientCapacity => {
                if self.last_error != ClientError::Indeterminate {
                    self.last_error = ClientError::ClientCapacity;
                }
                self.retry(now)
            }
            other => ReleaseStep::Done(Err(other)),
        }
    }
    fn retry(&mut self, now: Instant) -> ReleaseStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return ReleaseStep::Done(Err(self.last_error.clone()));
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(RELEASE_RETRY_MAX);
        ReleaseStep::RetryAt(now.saturating_add(delay))
    }
}

/// A bounded queue of background releases (compensations and dropped
/// tickets). Full or expired means dropped: the lease is the safety net.
#[derive(Clone, Debug)]
pub struct ReleaseQueue {
    jobs: VecDeque<ReleaseOperation>,
    capacity: usize,
}

impl Default for ReleaseQueue {
    fn default() -> Self {
        Self::new(RELEASE_QUEUE_CAPACITY)
    }
}

impl ReleaseQueue {
    /// A queue holding at most `capacity` releases.
    pub fn new(capacity: usize) -> Self {
        ReleaseQueue {
            jobs: VecDeque::new(),
            capacity,
        }
    }
    /// Enqueues `job`; false (dropped) if the queue is full or the job's
    /// deadline has passed.
    pub fn push(&mut self, now: Instant, job: ReleaseOperation) -> bool {
        if self.jobs.len() >= self.capacity || now >= job.deadline {
            return false;
        }
        self.jobs.push_back(job);
        true
    }
    /// The oldest job whose deadline has not passed.
    pub fn pop(&mut self, now: Instant) -> Option<ReleaseOperation> {
        while let Some(job) = self.jobs.pop_front() {
            if now < job.deadline {
                return Some(job);
            }
        }
        None
    }
    /// Jobs queued.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

// ---------------------------------------------------------------------------
// Broker configuration
// ---------------------------------------------------------------------------

/// Single server or cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerMode {
    /// One server.
    Single,
    /// 3 or 5 nodes, addresses in slot order.
    Cluster {
        /// The cluster's identity (decoded from 64 hex digits).
        identity_fingerprint: [u8; 32],
    },
}

/// How a broker secures its connections; every runtime builds its TLS
/// connector from it. The client never presents a certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Off,
    /// TLS, server verified against the operating system's trust store.
    SystemRoots,
    /// TLS, server verified against the CA certificates in this PEM file.
    Ca(std::path::PathBuf),
    /// TLS without verifying the server: anyone on the path can impersonate
    /// it. For tests only.
    InsecureSkipVerify,
}

/// What a user configures for a broker.
#[derive(Clone)]
pub struct BrokerConfig {
    /// Server addresses, `host:port` or `[v6]:port`; cluster: slot order.
    pub addrs: Vec<String>,
    /// Client token (≥ 16 bytes), or empty with `allow_loopback_no_auth`.
    pub token: String,
    /// Mode.
    pub mode: BrokerMode,
    /// Acquires in flight across the broker (1..=16384).
    pub max_pending: usize,
    /// Allows the empty token, for IP loopback addresses only.
    pub allow_loopback_no_auth: bool,
    /// [`SessionConfig::silence_timeout`] of every connection
    /// ([`MIN_SILENCE_TIMEOUT`]..=[`MAX_SILENCE_TIMEOUT`], default
    /// [`DEFAULT_SILENCE_TIMEOUT`]).
    pub silence_timeout: Duration,
}

impl fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("addrs", &self.addrs)
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("mode", &self.mode)
            .field("max_pending", &self.max_pending)
            .field("allow_loopback_no_auth", &self.allow_loopback_no_auth)
            .field("silence_timeout", &self.silence_timeout)
            .finish()
    }
}

/// One connection a broker keeps.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Where to connect.
    pub addr: String,
    /// What to expect there.
    pub session: SessionConfig,
}

impl BrokerConfig {
    /// A single-mode configuration with defaults.
    pub fn single(addr: impl Into<String>, token: impl Into<String>) -> Self {
        BrokerConfig {
            addrs: vec![addr.into()],
            token: token.into(),
            mode: BrokerMode::Single,
            max_pending: DEFAULT_MAX_PENDING,
            allow_loopback_no_auth: false,
            silence_timeout: DEFAULT_SILENCE_TIMEOUT,
        }
    }

    /// Validates the configuration and lists the connections to keep, in
    /// router order: a single address gets two connections (so one dropped
    /// socket does not interrupt service); cluster connection `i` is slot `i`.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, ClientError> {
        if self.addrs.is_empty() {
            return Err(ClientError::InvalidInput(
                "at least one server address is required",
            ));
        }
        if !(1..=MAX_PENDING_LIMIT).contains(&self.max_pending) {
            return Err(ClientError::InvalidInput("max_pending must be 1..=16384"));
        }
        if !(MIN_SILENCE_TIMEOUT..=MAX_SILENCE_TIMEOUT).contains(&self.silence_timeout) {
            return Err(ClientError::InvalidInput(
                "silence_timeout must be 100 ms..=300 s",
            ));
        }
        for addr in &self.addrs {
            validate_addr(addr)?;
        }
        if self.token.is_empty() {
            if !self.allow_loopback_no_auth {
                return Err(ClientError::InvalidInput(
                    "client token is required unless loopback no-auth mode is explicit",
                ));
            }
            if !self.addrs.iter().all(|addr| is_loopback_addr(addr)) {
                return Err(ClientError::InvalidInput(
                    "loopback no-auth mode requires IP loopback server addresses",
                ));
            }
        } else if self.token.len() < MIN_CLIENT_TOKEN_LEN {
            return Err(ClientError::InvalidInput(
                "client token must be at least 16 bytes",
            ));
        }
        let token = self.token.as_bytes();
        match self.mode {
            BrokerMode::Single => {
                if self.addrs.len() != 1 {
                    return Err(ClientError::InvalidInput(
                        "single mode requires exactly one server address",
                    ));
                }
                let endpoint = Endpoint {
                    addr: self.addrs[0].clone(),
                    session: SessionConfig {
                        silence_timeout: self.silence_timeout,
                        ..SessionConfig::single(token)
                    },
                };
                Ok(vec![endpoint.clone(), endpoint])
            }
            BrokerMode::Cluster {
                identity_fingerprint,
            } => {
                let size = self.addrs.len();
                if !matches!(size, 3 | 5) {
                    return Err(ClientError::InvalidInput(
                        "cluster mode requires exactly 3 or 5 slot-ordered server addresses",
                    ));
                }
                Ok(self
                    .addrs
                    .iter()
                    .zip(0u8..)
                    .map(|(addr, slot)| Endpoint {
                        addr: addr.clone(),
                        session: SessionConfig {
                            silence_timeout: self.silence_timeout,
                            ..SessionConfig::cluster(token, identity_fingerprint, slot, size)
                        },
                    })
                    .collect())
            }
        }
    }
}

/// `(host, port)` of `host:port` or `[v6]:port`.
fn split_addr(addr: &str) -> Result<(&str, &str), ClientError> {
    const INVALID: ClientError = ClientError::InvalidInput("invalid server address");
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, suffix) = rest.split_once(']').ok_or(INVALID)?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(INVALID);
        }
        Ok((host, suffix.strip_prefix(':').ok_or(INVALID)?))
    } else {
        let (host, port) = addr.rsplit_once(':').ok_or(INVALID)?;
        if host.contains([':', '[', ']']) {
            return Err(ClientError::InvalidInput(
                "IPv6 server addresses must use brackets",
            ));
        }
        Ok((host, port))
    }
}

fn validate_addr(addr: &str) -> Result<(), ClientError> {
    const INVALID: ClientError = ClientError::InvalidInput("invalid server address");
    if addr.is_empty()
        || addr.len() > 1024
        || addr.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(INVALID);
    }
    let (host, port) = split_addr(addr)?;
    let port = port
        .parse::<u16>()
        .map_err(|_| ClientError::InvalidInput("invalid server address port"))?;
    if host.is_empty() || port == 0 {
        return Err(INVALID);
    }
    Ok(())
}

fn is_loopback_addr(addr: &str) -> bool {
    split_addr(addr)
        .ok()
        .and_then(|(host, _)| host.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback())
}
