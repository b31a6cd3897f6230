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
            Request::Release(_)
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

/// True for the requests that may be granted (`A`/`S`, `H` and `Q`).
fn is_acquire(request: &Request) -> bool {
    matches!(
        request,
        Request::Acquire(_) | Request::AcquireCapped(_) | Request::AcquirePermits(_)
    )
}

/// The wait byte of an acquire, to be cut to what is left of the caller's
/// wait.
fn wait_s_mut(request: &mut Request) -> Option<&mut u8> {
    match request {
        Request::Acquire(req) => Some(&mut req.wait_s),
        Request::AcquireCapped(req) => Some(&mut req.wait_s),
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
        if let Some((permits, capacity)) = params.permits() {
            return self.submit_permits(now, keys, params, (permits, capacity), deadline);
        }
        let request = match params.max_hold_s() {
            None => Request::Acquire(AcquireRequest {
                rid: 0,
                wait_s: params.wait_s(),
                lease_s: params.lease_s(),
                set: keys.is_set(),
                keys: keys.0,
            }),
            Some(max_hold_s) => {
                if self.is_ready() && !self.capabilities.contains(Capabilities::EXTEND) {
                    return Err(ClientError::Unsupported(
                        "a hold cap (the server did not grant EXTEND)",
                    ));
                }
                Request::AcquireCapped(AcquireCappedRequest {
                    rid: 0,
                    wait_s: params.wait_s(),
                    lease_s: params.lease_s(),
                    max_hold_s,
                    keys: keys.0,
                })
            }
        };
        self.submit(now, request, deadline, params.wait_s())
    }

    /// A semaphore acquire: `keys` is the semaphore's name.
    fn submit_permits(
        &mut self,
        now: Instant,
        keys: KeySet,
        params: &AcquireParams,
        (permits, capacity): (u8, u16),
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let [name] = keys.0.keys() else {
            return Err(ClientError::InvalidInput("a semaphore is named by one key"));
        };
        if name.as_bytes().len() > SEMAPHORE_NAME_LEN_MAX {
            return Err(ClientError::InvalidInput(
                "a semaphore name must be at most 122 bytes",
            ));
        }
        if self.is_ready() && !self.capabilities.contains(Capabilities::PERMITS) {
            return Err(ClientError::Unsupported(
                "semaphores (the server did not grant PERMITS)",
            ));
        }
        let request = Request::AcquirePermits(PermitsRequest {
            rid: 0,
            wait_s: params.wait_s(),
            lease_s: params.lease_s(),
            max_hold_s: params.max_hold_s().unwrap_or(0),
            permits,
            capacity,
            name: name.clone(),
        });
        self.submit(now, request, deadline, params.wait_s())
    }

    /// Queues an exact-token release of `keys`, giving up at `deadline`
    /// (normally [`ReleaseOperation::attempt_deadline`](super::ReleaseOperation::attempt_deadline)). Returns its rid.
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

    /// Queues a renewal (`W`) of the grant `token` of `keys` (every key of
    /// the grant) to `lease` from the server's receipt (1..=250 s, rounded
    /// up), giving up at `deadline`; it counts against
    /// [`SessionConfig::pending_releases_max`]. Returns its rid. Fails with
    /// [`ClientError::Unsupported`], sending nothing, unless the server
    /// granted [`Capabilities::EXTEND`] on this session.
    pub fn submit_extend(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        lease: Duration,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        let lease_s = lease_s(lease)?;
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        if !self.capabilities.contains(Capabilities::EXTEND) {
            return Err(ClientError::Unsupported(
                "lease renewal (the server did not grant EXTEND)",
            ));
        }
        let request = Request::Extend(ExtendRequest {
            rid: 0,
            token,
            lease_s,
            keys: keys.0,
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues an observe (`O`) of who holds `name`, giving up at
    /// `deadline`; like a release it counts against
    /// [`SessionConfig::pending_releases_max`]. Returns its rid. Fails with
    /// [`ClientError::Unsupported`], sending nothing, unless the server
    /// granted [`Capabilities::OBSERVE`] on this session.
    pub fn submit_observe(
        &mut self,
        now: Instant,
        name: KeySet,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let [name] = name.0.keys() else {
            return Err(ClientError::InvalidInput("an election is named by one key"));
        };
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        if !self.capabilities.contains(Capabilities::OBSERVE) {
            return Err(ClientError::Unsupported(
                "observing an election (the server did not grant OBSERVE)",
            ));
        }
        let request = Request::Observe(ObserveRequest {
            rid: 0,
            name: name.clone(),
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues our `X` as the first request after the handshake. Nothing
    /// else is taken until it is answered: a request pipelined behind it
    /// to a server that closes on `X` (published protocol only) would end
    /// Indeterminate, where waiting leaves it unsent and retryable. The
    /// negotiation gets a handshake's allowance.
    fn start_negotiation(&mut self, now: Instant) {
        let Some(rid) = self.next_rid else {
            return self.close(now, CloseReason::RidsExhausted);
        };
        self.next_rid = rid.checked_add(1);
        let request = Request::Negotiate(NegotiateRequest {
            rid,
            version: EXTENSION_VERSION,
            wanted: self.config.extensions,
            label: self.config.label.clone(),
        });
        let deadline = now.saturating_add(self.config.handshake_timeout);
        self.pending_releases += 1;
        self.unsent += 1;
        self.pending.insert(
            rid,
            Pending {
                request,
                deadline,
                wait_s_max: 0,
                sent_at: None,
            },
        );
        self.deadlines.push(Reverse((deadline, rid)));
        self.negotiating = Some(rid);
    }

    fn submit(
        &mut self,
        now: Instant,
        mut request: Request,
        deadline: Instant,
        wait_s_max: u8,
    ) -> Result<u64, ClientError> {
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        let acquire = is_acquire(&request);
        let full = if acquire {
            self.pending_acquires >= self.config.pending_acquires_max
        } else {
            self.pending_releases >= self.config.pending_releases_max
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
            Request::Negotiate(req) => req.rid = rid,
            Request::Extend(req) => req.rid = rid,
            Request::AcquireCapped(req) => req.rid = rid,
            Request::AcquirePermits(req) => req.rid = rid,
            Request::Observe(req) => req.rid = rid,
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
                wait_s_max,
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
        if !self.is_open() {
            return out.len() - start;
        }
        let proof_len = out.len() - start;
        self.transmit(now, proof_len, |request| {
            request.encode(out);
            request.frame_len()
        })
    }

    /// [`Session::poll_transmit`] handing out request values instead of
    /// their frames, for a driver that passes them to the server as they
    /// are (an in-process link: the server's
    /// [`crate::machine::Machine::handle_requests`]). The very same requests,
    /// in the same order and under the same send boundary and batch bound
    /// (each counted as the bytes of its frame), leave as they would as
    /// bytes; returns the bytes their frames would take. Only once the
    /// session is ready: the handshake goes as bytes
    /// ([`Session::poll_transmit`]), and nothing is handed out before.
    pub fn poll_transmit_requests(&mut self, now: Instant, out: &mut Vec<Request>) -> usize {
        if !self.is_open() {
            return 0;
        }
        self.transmit(now, 0, |request| {
            out.push(request.clone());
            request.frame_len()
        })
    }

    /// Hands out the unsent requests in rid order through `hand_out`
    /// (which returns the bytes of the request's frame) while fewer than
    /// [`TRANSMIT_BATCH_BYTES`] are handed out, `handed` counting what this
    /// call gave before (the proof); returns the total.
    fn transmit(
        &mut self,
        now: Instant,
        mut handed: usize,
        mut hand_out: impl FnMut(&Request) -> usize,
    ) -> usize {
        // The unsent requests are the rids from the cursor on, less those
        // cancelled or timed out before they left: `unsent` says when the
        // last one has been seen.
        while self.unsent > 0 && handed < TRANSMIT_BATCH_BYTES {
            let rid = self.send_cursor;
            self.send_cursor = rid.saturating_add(1);
            let Some(entry) = self.pending.get_mut(&rid) else {
                if rid == u64::MAX {
                    break;
                }
                continue;
            };
            if entry.sent_at.is_some() {
                // Only reachable at rid u64::MAX, where the cursor saturates.
                break;
            }
            if now >= entry.deadline {
                self.take(rid);
                if self.negotiating == Some(rid) {
                    self.close(now, CloseReason::HandshakeTimeout);
                    return handed;
                }
                self.push_outcome(rid, Outcome::Timeout);
                continue;
            }
            if let Some(wait_s) = wait_s_mut(&mut entry.request) {
                // The server may wait only what remains of the caller's
                // wait, so that its `T` comes before our own deadline.
                *wait_s = if entry.wait_s_max == 0 {
                    0
                } else {
                    let remaining_s = ceil_secs(entry.deadline.saturating_duration_since(now));
                    u8::try_from(remaining_s)
                        .unwrap_or(u8::MAX)
                        .min(entry.wait_s_max)
                };
            }
            handed += hand_out(&entry.request);
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
        handed
    }

    /// Bytes received from the server.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.last_input_at = self.last_input_at.max(now);
            self.heard = true;
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
                    if self.config.extensions == Capabilities::NONE {
                        self.events.push_back(SessionEvent::Ready);
                    } else {
                        self.start_negotiation(now);
                    }
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
        if !self.is_open() {
            return;
        }
        self.handle_frames(now, rest);
        self.prune_deadlines();
    }

    /// Replies received from the server as values rather than bytes (an
    /// in-process link, after [`Session::poll_transmit_requests`]): each is
    /// checked as its frame would be decoded ([`Reply::check`]) and then
    /// handled by the very code that handles a decoded frame, so matching,
    /// outcomes and every rule of [`Session::handle_input`] are the same.
    /// Values before the session is ready (the handshake goes as bytes)
    /// close it as a protocol error.
    pub fn handle_replies(&mut self, now: Instant, replies: &[Reply]) {
        let Some(first) = replies.first() else {
            return;
        };
        self.last_input_at = self.last_input_at.max(now);
        if matches!(self.phase, Phase::Handshake(_)) {
            let rid = first.rid().unwrap_or(0);
            return self.close(now, CloseReason::Protocol(ProtocolError::UnknownRid(rid)));
        }
        for reply in replies {
            if !self.is_open() {
                break;
            }
            if let Err(error) = reply.check() {
                return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
            }
            self.handle_reply(now, *reply);
        }
        self.prune_deadlines();
    }

    /// Decodes frames without copying whole inputs: only a frame split
    /// across inputs is buffered, and it is at most one frame long.
    fn handle_frames(&mut self, now: Instant, mut input: &[u8]) {
        while !input.is_empty() && self.is_open() {
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
                let take = input.len().min(REPLY_FRAME_LEN_MAX - had);
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
            // Advisory: a push changes no request's outcome. Only a
            // session granted PUSH passes it on; on any other it is noise
            // from a server that ignores what was negotiated, and dropped.
            Reply::Push {
                token,
                kind,
                lease_ms,
            } => {
                if self.capabilities.contains(Capabilities::PUSH) {
                    self.events.push_back(SessionEvent::Push {
                        token,
                        kind,
                        lease_ms,
                    });
                }
                return;
            }
            other => other.rid().unwrap_or(0),
        };
        let Some(entry) = self.take_answered(now, rid, &reply) else {
            return;
        };
        self.resolve(now, rid, entry, reply);
    }

    /// Takes the request `reply` answers, or closes the session when it
    /// may not answer it (no such request handed out, a kind that cannot
    /// answer it, an invalid leader slot) and returns `None`.
    fn take_answered(&mut self, now: Instant, rid: u64, reply: &Reply) -> Option<Pending> {
        // One lookup: the entry is taken first and put back for the close
        // (which ends it with the others) when the reply may not answer it.
        let entry = self.pending.remove(&rid);
        let refused = match &entry {
            // Only a request whose bytes were handed out can be answered; a
            // second reply finds nothing (the first removed it).
            None => Some(ProtocolError::UnknownRid(rid)),
            Some(entry) if entry.sent_at.is_none() => Some(ProtocolError::UnknownRid(rid)),
            Some(entry) if !reply.answers(entry.request.kind()) => Some(ProtocolError::WrongKind {
                rid,
                op: reply.op(),
            }),
            Some(_) => match *reply {
                Reply::Moved { leader_slot, .. } if !self.config.slot_valid(leader_slot) => {
                    Some(ProtocolError::BadSlot(leader_slot))
                }
                _ => None,
            },
        };
        if let Some(error) = refused {
            if let Some(entry) = entry {
                self.pending.insert(rid, entry);
            }
            self.close(now, CloseReason::Protocol(error));
            return None;
        }
        let entry = entry?;
        self.count_taken(&entry);
        Some(entry)
    }

    /// Ends request `rid` (already taken) as `reply` says.
    fn resolve(&mut self, now: Instant, rid: u64, entry: Pending, reply: Reply) {
        if self.negotiating == Some(rid) {
            return self.resolve_negotiation(now, rid, reply);
        }
        match reply {
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => {
                self.resolve_grant(now, rid, entry, token, None)
            }
            Reply::Permits {
                token, free, slots, ..
            } => {
                let permits = GrantedPermits {
                    slots: slots.as_slice().to_vec(),
                    free,
                };
                self.resolve_grant(now, rid, entry, token, Some(permits))
            }
            Reply::CapacityMismatch {
                asked, capacity, ..
            } => self.push_outcome(rid, Outcome::CapacityMismatch { asked, capacity }),
            Reply::Released { .. } | Reply::ReleasedSet { .. } => {
                self.push_outcome(rid, Outcome::Released)
            }
            Reply::NotFound { .. } => self.push_outcome(rid, Outcome::NotFound),
            Reply::TimedOut { .. } => self.push_outcome(rid, Outcome::Timeout),
            Reply::Busy { .. } => self.push_outcome(rid, Outcome::Busy),
            Reply::Indeterminate { .. } => self.push_outcome(rid, Outcome::Indeterminate),
            Reply::Moved { leader_slot, .. } => {
                // `M` answers this one request: it had no effect and may
                // run elsewhere. The server goes on serving the connection
                // (docs/protocol.md §5: `M` is a reply like any other, not a close),
                // so the other requests on it get their own replies, a
                // grant or an `M` of their own, rather than Indeterminate.
                self.push_outcome(rid, Outcome::Retry);
                self.push_leader_hint(leader_slot);
            }
            Reply::Error {
                code: ErrorCode::NoLeader,
                ..
            } => {
                // `E 4` answers this one request, like `M`: no effect, and
                // the server goes on serving the connection. During an
                // election every node answers so; the node that wins sends
                // `L` on this very connection, so the session stays up to
                // hear it and to carry the retry at once (docs/protocol.md
                // §5), instead of closing, reconnecting and handshaking.
                self.push_outcome(rid, Outcome::Retry);
                self.events.push_back(SessionEvent::NotLeader);
            }
            Reply::Error { code, .. } => {
                if code == ErrorCode::NotActive {
                    self.push_outcome(rid, Outcome::Retry);
                    self.events.push_back(SessionEvent::NotLeader);
                } else {
                    self.push_outcome(rid, Outcome::Error(code));
                }
                self.close(now, CloseReason::ServerError(code));
            }
            Reply::Extended {
                status, lease_ms, ..
            } => {
                // Counted from the send boundary: the server counts from its
                // receipt (later) and answers the lease left as it answers
                // (rounded down), so this end is never after its own.
                let sent_at = if renewal_from_reply_planted() {
                    now
                } else {
                    entry.sent_at.unwrap_or(now)
                };
                // Never more than the lease asked for: a server's number is
                // not trusted to lengthen what the client counts.
                let asked = match &entry.request {
                    Request::Extend(req) => Duration::from_secs(u64::from(req.lease_s)),
                    _ => Duration::ZERO,
                };
                let left = Duration::from_millis(u64::from(lease_ms)).min(asked);
                let valid_before = sent_at.saturating_add(left);
                self.push_outcome(
                    rid,
                    Outcome::Extended {
                        status,
                        valid_before,
                    },
                );
            }
            Reply::Observed { observed, .. } => {
                let leader = (observed.state != LeaderState::None).then(|| Leader {
                    label: observed.label.as_str().to_owned(),
                    term: observed.term,
                    connected: observed.state == LeaderState::Connected,
                    lease_remaining: Duration::from_millis(u64::from(observed.lease_ms)),
                });
                self.push_outcome(rid, Outcome::Observed(leader));
            }
            // `answers` admits `X` only to our negotiation (handled above),
            // and `L` and `P` (handled before matching) to nothing.
            Reply::Leader { .. } | Reply::Push { .. } | Reply::Negotiated { .. } => {}
        }
    }

    /// The answer to our `X` (`rid`): the granted bits, then the session is
    /// ready; an `E` closes it (and the driver stops negotiating with this
    /// server, see [`CloseReason::refuses_extensions`]); anything else
    /// breaks the protocol.
    fn resolve_negotiation(&mut self, now: Instant, rid: u64, reply: Reply) {
        self.negotiating = None;
        match reply {
            Reply::Negotiated { granted, .. } => {
                // A bit we did not ask for is not ours to use.
                self.capabilities = granted.intersection(self.config.extensions);
                self.events.push_back(SessionEvent::Ready);
            }
            Reply::Error { code, .. } => self.close(now, CloseReason::ServerError(code)),
            other => self.close(
                now,
                CloseReason::Protocol(ProtocolError::WrongKind {
                    rid,
                    op: other.op(),
                }),
            ),
        }
    }

    /// Acquire `rid` was granted `token`: the grant goes to the caller, or
    /// back to the server if the caller's deadline has passed.
    fn resolve_grant(
        &mut self,
        now: Instant,
        rid: u64,
        entry: Pending,
        token: u64,
        permits: Option<GrantedPermits>,
    ) {
        let (keys, lease_s) = match (entry.request, &permits) {
            (Request::Acquire(req), None) => (KeySet(req.keys), req.lease_s),
            (Request::AcquireCapped(req), None) => (KeySet(req.keys), req.lease_s),
            (Request::AcquirePermits(req), Some(permits)) => {
                // The grant is of the slots' keys: what a release and a
                // renewal name.
                let keys = permits
                    .slots
                    .iter()
                    .filter_map(|&slot| slot_key(&req.name, slot))
                    .collect();
                match KeyGroup::new(keys) {
                    Ok(keys) if keys.len() == usize::from(req.permits) => {
                        (KeySet(keys), req.lease_s)
                    }
                    _ => {
                        let error = ProtocolError::WrongKind { rid, op: b'Q' };
                        return self.close(now, CloseReason::Protocol(error));
                    }
                }
            }
            // `answers` admits grants only for acquires, permits only for
            // `Q`.
            _ => return,
        };
        if now >= entry.deadline {
            // The caller has given up at its deadline: it is told
            // Indeterminate and the lock is handed back.
            self.push_outcome(rid, Outcome::Indeterminate);
            self.events
                .push_back(SessionEvent::Compensate(Compensation { keys, token }));
        } else {
            let sent_at = entry.sent_at.unwrap_or(now);
            let lease = Duration::from_secs(u64::from(lease_s));
            let grant = Grant {
                keys,
                token,
                valid_before: sent_at.saturating_add(lease),
                permits,
            };
            self.push_outcome(rid, Outcome::Acquired(grant));
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
