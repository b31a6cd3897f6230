//! One client connection as a state machine ([`Session`]): the handshake,
//! request ids, the send boundary, reply matching and the silence rule.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

use super::error::{ClientError, CloseReason, ProtocolError};
use super::request::{
    AcquireParams, Compensation, Grant, GrantedPermits, KeySet, Leader, Outcome, ceil_secs, lease_s,
};
use crate::auth::{ClientHandshake, ClientHandshakeStatus, SINGLE_FINGERPRINT, WireMode};
use crate::hash::IdMap;
use crate::time::{Duration, Instant};
use crate::wire::{
    AcquireCappedRequest, AcquireRequest, Capabilities, EXTENSION_VERSION, ErrorCode,
    ExtendRequest, FRAME_HEADER_LEN, KeyGroup, LABEL_LEN_MAX, LeaderState, NO_LEADER_SLOT,
    NegotiateRequest, ObserveRequest, PermitsRequest, PushKind, ReleaseRequest, Reply, Request,
    SEMAPHORE_NAME_LEN_MAX, slot_key,
};

mod replies;
mod submit;

/// A connection that has not finished TCP, TLS and the handshake this long
/// after [`Session::new`] is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A reply frame that was started but not finished this long is a stalled
/// peer: the session is closed.
pub const READ_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3);

/// Bytes handed out by [`Session::poll_transmit`] that the runtime has not
/// reported written ([`Session::handle_written`]) for this long, while the
/// session is ready: the peer stopped reading, and the session is closed
/// ([`CloseReason::WriteStalled`]).
pub const WRITE_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3);

/// Default [`SessionConfig::silence_timeout`]: above the default Raft
/// profile's longest election timeout (2.5 s), within which a leader that
/// lost its majority steps down and answers what it was proposing, so a
/// leader change does not reach it.
pub const DEFAULT_SILENCE_TIMEOUT: Duration = Duration::from_secs(3);

/// Default bound on acquires awaiting a reply on one session.
pub const DEFAULT_MAX_PENDING_ACQUIRES: usize = 1024;

/// Default bound on releases awaiting a reply on one session. Separate from
/// acquires so that a session full of waiting acquires can still release.
pub const DEFAULT_MAX_PENDING_RELEASES: usize = 128;

/// [`Session::poll_transmit`] stops adding frames once it has handed out
/// this many bytes in one call, so requests not yet handed out stay
/// cancellable and retryable while the socket is slow.
pub const TRANSMIT_BATCH_BYTES: usize = 64 * 1024;

/// The longest reply frame (`A`/`S`: rid and token).
const REPLY_FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + 16;

/// What a [`Session`] reports to its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// The handshake (and the negotiation, when the config asks for one)
    /// succeeded; requests may be submitted.
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
    /// remembered leader, forget it. `E 3` also closes the session; over
    /// `E 4` it stays up.
    NotLeader,
    /// A grant nobody will receive (it arrived after its deadline, or its
    /// request was cancelled): release it with [`ReleaseOperation`](super::ReleaseOperation).
    Compensate(Compensation),
    /// The server pushed news of grant `token` (docs/protocol.md §8.3):
    /// only on a session granted [`Capabilities::PUSH`]. Advisory: it may
    /// move the holder's deadline earlier, never later.
    Push {
        /// The grant's fencing token.
        token: u64,
        /// Ending soon, or lost and why.
        kind: PushKind,
        /// The lease left in milliseconds by the server's count (0 when
        /// lost).
        lease_ms: u32,
    },
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

/// What a [`Session`] expects of its server.
#[derive(Clone)]
pub struct SessionConfig {
    /// The client token; never printed.
    pub(super) token: Vec<u8>,
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
    pub pending_acquires_max: usize,
    /// Releases (and renewals, which are sent like them) awaiting a reply
    /// at most.
    pub pending_releases_max: usize,
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
    /// The capabilities to ask for with `X` right after the handshake
    /// (docs/protocol.md §8); [`Capabilities::NONE`] sends no `X`, as the
    /// published clients do. The brokers ask for [`Capabilities::EXTEND`] and [`Capabilities::PUSH`].
    pub extensions: Capabilities,
    /// The label sent with `X` (see [`SessionConfig::with_label`]).
    pub(super) label: String,
}

impl fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        f.debug_struct("SessionConfig")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("mode", &self.mode)
            .field("expected_slot", &self.expected_slot)
            .field("cluster_size", &self.cluster_size)
            .field("pending_acquires_max", &self.pending_acquires_max)
            .field("pending_releases_max", &self.pending_releases_max)
            .field("silence_timeout", &self.silence_timeout)
            .field("extensions", &self.extensions)
            .field("label", &self.label)
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
            pending_acquires_max: DEFAULT_MAX_PENDING_ACQUIRES,
            pending_releases_max: DEFAULT_MAX_PENDING_RELEASES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            silence_timeout: DEFAULT_SILENCE_TIMEOUT,
            extensions: Capabilities::NONE,
            label: String::new(),
        }
    }
    /// This config with `label` sent in the `X` (naming the client to
    /// operators, e.g. `host/pid/job`): at most 64 bytes, no control
    /// characters.
    pub fn with_label(mut self, label: &str) -> Result<Self, ClientError> {
        if label.len() > LABEL_LEN_MAX || label.chars().any(char::is_control) {
            return Err(ClientError::InvalidInput(
                "label must be at most 64 bytes without control characters",
            ));
        }
        self.label = label.to_owned();
        Ok(self)
    }
    /// The label sent with `X` (empty: none).
    pub fn label(&self) -> &str {
        &self.label
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
    wait_s_max: u8,
    /// When the bytes were handed out (the send boundary); `None` = unsent.
    sent_at: Option<Instant>,
}

impl Pending {
    /// When a live server has certainly answered this request (see
    /// [`SessionConfig::silence_timeout`]); `None` while unsent.
    fn overdue_at(&self, silence_timeout: Duration) -> Option<Instant> {
        let wait = match &self.request {
            Request::Acquire(req) => Duration::from_secs(u64::from(req.wait_s)),
            Request::AcquireCapped(req) => Duration::from_secs(u64::from(req.wait_s)),
            Request::AcquirePermits(req) => Duration::from_secs(u64::from(req.wait_s)),
            Request::AcquireShared(req) => Duration::from_secs(u64::from(req.wait_s)),
            Request::Downgrade(_)
            | Request::Release(_)
            | Request::Negotiate(_)
            | Request::Extend(_)
            | Request::Observe(_) => Duration::ZERO,
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
        is_acquire(&self.request)
    }
}

/// True for the requests that may be granted (`A`/`S`, `H`, `Q` and `Y`).
fn is_acquire(request: &Request) -> bool {
    matches!(
        request,
        Request::Acquire(_)
            | Request::AcquireCapped(_)
            | Request::AcquirePermits(_)
            | Request::AcquireShared(_)
    )
}

/// The wait byte of an acquire, to be cut to what is left of the caller's
/// wait.
fn wait_s_mut(request: &mut Request) -> Option<&mut u8> {
    match request {
        Request::Acquire(req) => Some(&mut req.wait_s),
        Request::AcquireCapped(req) => Some(&mut req.wait_s),
        Request::AcquireShared(req) => Some(&mut req.wait_s),
        _ => None,
    }
}

/// The requests in flight by rid: the newest in a slot of its own, the
/// others in a map (our own numbers: a cheap hash, nothing to flood). A
/// session that has one request in flight at a time, the usual case of an
/// uncontended caller, never touches the map.
#[derive(Debug, Default)]
struct PendingMap {
    /// The entry with the largest rid, unless it is in `older` (a slot
    /// found empty takes whatever comes next).
    newest: Option<(u64, Pending)>,
    older: IdMap<u64, Pending>,
}

impl PendingMap {
    /// Adds `rid`, which is not in the map.
    fn insert(&mut self, rid: u64, entry: Pending) {
        match &mut self.newest {
            None => self.newest = Some((rid, entry)),
            Some((newest, _)) if *newest < rid => {
                if let Some((older, older_entry)) = self.newest.replace((rid, entry)) {
                    self.older.insert(older, older_entry);
                }
            }
            Some(_) => {
                self.older.insert(rid, entry);
            }
        }
    }

    fn get_mut(&mut self, rid: &u64) -> Option<&mut Pending> {
        if let Some((newest, entry)) = &mut self.newest
            && newest == rid
        {
            return Some(entry);
        }
        self.older.get_mut(rid)
    }

    fn remove(&mut self, rid: &u64) -> Option<Pending> {
        if self
            .newest
            .as_ref()
            .is_some_and(|(newest, _)| newest == rid)
        {
            return self.newest.take().map(|(_, entry)| entry);
        }
        self.older.remove(rid)
    }

    fn contains_key(&self, rid: &u64) -> bool {
        self.newest
            .as_ref()
            .is_some_and(|(newest, _)| newest == rid)
            || self.older.contains_key(rid)
    }

    fn len(&self) -> usize {
        usize::from(self.newest.is_some()) + self.older.len()
    }

    fn is_empty(&self) -> bool {
        self.newest.is_none() && self.older.is_empty()
    }

    /// Every entry, in no particular order.
    fn iter(&self) -> impl Iterator<Item = (&u64, &Pending)> {
        self.newest
            .iter()
            .map(|(rid, entry)| (rid, entry))
            .chain(&self.older)
    }

    /// Every entry, taken, in no particular order.
    fn into_entries(self) -> impl Iterator<Item = (u64, Pending)> {
        self.newest.into_iter().chain(self.older)
    }
}

/// What a handshake that did not finish says about the server at the other
/// end ([`Session::handshake_clue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeClue {
    /// Connected, and not a byte came: a server of ours sends its hello at
    /// once, while a TLS server waits for a TLS hello that a plain client
    /// never sends (then closes at its own handshake timeout).
    Silent,
    /// The first bytes were not a hello of ours: another service.
    NotAHello,
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
    /// Since when bytes handed out by [`Session::poll_transmit`] wait in
    /// the runtime with no write progress; `None` when it reported all of
    /// them written. The write-progress rule's clock.
    unwritten_since: Option<Instant>,
    /// Requests in flight by rid. Rids are handed out in order, so every
    /// rid below `send_cursor` has been handed out and none at or above it
    /// has.
    pending: PendingMap,
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
    /// Some byte arrived: a connected server that sent none is a clue
    /// ([`HandshakeClue::Silent`]).
    heard: bool,
    events: VecDeque<SessionEvent>,
    /// The rid of our `X` until it is answered: the session is not ready
    /// (no other request is taken) meanwhile.
    negotiating: Option<u64>,
    /// What the server granted with `X`.
    capabilities: Capabilities,
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
            partial: Vec::with_capacity(REPLY_FRAME_LEN_MAX),
            partial_since: None,
            unwritten_since: None,
            pending: PendingMap::default(),
            pending_acquires: 0,
            pending_releases: 0,
            unsent: 0,
            send_cursor: 1,
            next_rid: Some(1),
            deadlines: BinaryHeap::new(),
            overdue: BinaryHeap::new(),
            last_input_at: now,
            heard: false,
            events: VecDeque::new(),
            negotiating: None,
            capabilities: Capabilities::NONE,
        }
    }

    /// What the bytes of a session that never became ready say about the
    /// server, for telling a user why no connection works; `None` once it
    /// was ready, or when they say nothing (the caller knows whether the
    /// transport ever connected: before it did, silence means nothing).
    pub fn handshake_clue(&self) -> Option<HandshakeClue> {
        if self.ready_at.is_some() {
            return None;
        }
        if !self.heard {
            return Some(HandshakeClue::Silent);
        }
        match self.close_reason {
            Some(CloseReason::BadHello(_)) => Some(HandshakeClue::NotAHello),
            _ => None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }
    /// True once the handshake (and the negotiation, if any) succeeded and
    /// until the session closes.
    pub fn is_ready(&self) -> bool {
        self.is_open() && self.negotiating.is_none()
    }
    /// True from the handshake's success until the session closes: replies
    /// are read and requests handed out.
    fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }
    /// The capabilities the server granted with `X` ([`Capabilities::NONE`]
    /// before the answer, or when the session did not negotiate).
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
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
    /// became ready or is still open); feeds [`Backoff::after_session`](super::Backoff::after_session).
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
        if self.write_stalled_at().is_some_and(|at| now >= at) {
            return self.close(now, CloseReason::WriteStalled);
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
            if self.negotiating == Some(rid) && entry.sent_at.is_none() {
                // Our own `X`, never handed out within a handshake's
                // allowance: no caller waits on its rid, and without its
                // answer the session can never become ready.
                return self.close(now, CloseReason::HandshakeTimeout);
            }
            if entry.sent_at.is_some() {
                if self.negotiating != Some(rid) {
                    self.push_outcome(rid, Outcome::Indeterminate);
                }
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
                [stall, self.write_stalled_at(), request, self.silent_at()]
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

    /// The runtime's transport took bytes that [`Session::poll_transmit`]
    /// handed out: `all_written` when none of them is left to write or
    /// flush. Every runtime reports each write that takes bytes (and each
    /// flush that completes): bytes handed out and not reported written
    /// within [`WRITE_PROGRESS_TIMEOUT`] close the session
    /// ([`CloseReason::WriteStalled`]), since a peer that stopped reading
    /// would otherwise hold requests, and their callers, until their own
    /// deadlines.
    pub fn handle_written(&mut self, now: Instant, all_written: bool) {
        self.unwritten_since = (!all_written).then_some(now);
    }

    /// When the write-progress rule closes the session, if bytes wait.
    fn write_stalled_at(&self) -> Option<Instant> {
        self.unwritten_since
            .map(|since| since.saturating_add(WRITE_PROGRESS_TIMEOUT))
    }

    /// The transport ended (EOF, IO error).
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
        // Our `X` was handed out and the connection ended before any answer:
        // a server that speaks only the published protocol closes on it.
        let negotiation_sent = self
            .negotiating
            .take()
            .and_then(|rid| self.pending.remove(&rid))
            .is_some_and(|entry| entry.sent_at.is_some());
        let reason = if negotiation_sent && reason == CloseReason::TransportClosed {
            CloseReason::ExtensionsUnsupported
        } else {
            reason
        };
        self.phase = Phase::Closed;
        self.closed_at = Some(now);
        // In rid order, as they were submitted.
        let mut ended: Vec<(u64, Pending)> =
            std::mem::take(&mut self.pending).into_entries().collect();
        ended.sort_unstable_by_key(|&(rid, _)| rid);
        for (rid, entry) in ended {
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
        self.count_taken(&entry);
        Some(entry)
    }

    /// Counts `entry`, just removed from `pending`, out of the bounds.
    fn count_taken(&mut self, entry: &Pending) {
        if entry.is_acquire() {
            self.pending_acquires -= 1;
        } else {
            self.pending_releases -= 1;
        }
        if entry.sent_at.is_none() {
            self.unsent -= 1;
        }
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
        if self.pending.is_empty() {
            // Every entry is of a resolved request (the usual case between
            // requests): no lookups needed.
            self.deadlines.clear();
            self.overdue.clear();
            return;
        }
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
        if self.pending.is_empty() {
            self.overdue.clear();
            return;
        }
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

/// Whether the simulator's planted bug "a renewal counts from its answer"
/// is switched on (never outside tests with the `planted-bugs` feature).
#[cfg(feature = "planted-bugs")]
fn renewal_from_reply_planted() -> bool {
    crate::testing::planted::active(crate::testing::planted::PlantedBug::RenewalFromReply)
}

#[cfg(not(feature = "planted-bugs"))]
fn renewal_from_reply_planted() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Key, KeyGroup};

    fn entry(rid: u64) -> Pending {
        Pending {
            request: Request::Release(ReleaseRequest {
                rid,
                token: rid,
                keys: KeyGroup::single(Key::new(b"k").unwrap()),
                set: false,
            }),
            deadline: Instant::from_micros(rid),
            wait_s_max: 0,
            sent_at: None,
        }
    }

    #[test]
    fn the_pending_map_is_a_map() {
        // Against a plain map, under inserts in rid order (submits),
        // re-inserts of removed entries (a refused reply puts its entry
        // back) and removes in any order.
        let mut map = PendingMap::default();
        let mut model = std::collections::BTreeMap::new();
        let mut next_rid = 1u64;
        let mut rng = crate::rng::SplitMix64::new(0x2545_f491_4f6c_dd1d);
        for _ in 0..20_000 {
            let seed = rng.next_u64();
            match seed % 5 {
                0 | 1 => {
                    map.insert(next_rid, entry(next_rid));
                    model.insert(next_rid, ());
                    next_rid += 1;
                }
                2 | 3 => {
                    let rid = 1 + (seed >> 8) % next_rid;
                    let removed = map.remove(&rid);
                    assert_eq!(removed.is_some(), model.remove(&rid).is_some());
                    if let Some(removed) = removed {
                        assert_eq!(removed.request.rid(), rid);
                        if seed & 0x100 != 0 {
                            map.insert(rid, removed);
                            model.insert(rid, ());
                        }
                    }
                }
                _ => {
                    let rid = 1 + (seed >> 8) % next_rid;
                    assert_eq!(map.contains_key(&rid), model.contains_key(&rid));
                    assert_eq!(
                        map.get_mut(&rid).map(|entry| entry.request.rid()),
                        model.contains_key(&rid).then_some(rid)
                    );
                }
            }
            assert_eq!(map.len(), model.len());
            assert_eq!(map.is_empty(), model.is_empty());
        }
        let mut listed: Vec<u64> = map.iter().map(|(&rid, _)| rid).collect();
        listed.sort_unstable();
        assert_eq!(listed, model.keys().copied().collect::<Vec<_>>());
        let mut taken: Vec<u64> = map.into_entries().map(|(rid, _)| rid).collect();
        taken.sort_unstable();
        assert_eq!(taken, model.keys().copied().collect::<Vec<_>>());
    }
}
