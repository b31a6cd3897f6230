//! The single-mode server: connections (handshake + framing + session)
//! composed with the lock table.
//!
//! The driver owns sockets and the clock; this type owns every decision.
//! Its verbs are the driver contract, [`Machine`] (`impl Machine for
//! Server` below): inputs `handle_*`, outputs `poll_*` drained after every
//! input, the deadline from `poll_timeout`. With a token reserve
//! ([`Server::with_token_reserve`]) the driver also stores what
//! `poll_reserve` asks for. It has no peers, so the cluster-only verbs keep
//! their defaults.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::auth::{ClientTokens, Hello, NONCE_LEN, SINGLE_FINGERPRINT, WireMode};
use crate::budget::{AbuseKind, BudgetConfig, CloseReason, Reports};
use crate::conn::admission::{Accept, ClientAdmission, Handshake};
use crate::conn::client::{
    Answer, ClientFront, ClientRequest, Delivery, FrontTimeout, HoldAsk, ReplyTo,
};
use crate::conn::{HandshakeDeadlines, Outbound, WakeQueue};
use crate::events::EventView;
use crate::hash::IdMap;
use crate::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, ListingCursor, LockListing, LockView,
};
use crate::lock::semaphore::{
    PermitAsk, PermitEvent, PermitGrant, PermitOutcome, SemaphoreLimits, Semaphores,
};
use crate::lock::{
    AcquireOptions, AcquireOutcome, HOLDER_MAX, HoldCaps, KeyModes, LockConfig, LockEvent,
    LockStats, LockTable, ReleaseOutcome, WaiterId,
};
use crate::machine::{Machine, Output};
use crate::metrics::{ClosedReplies, PushCounts, ReplyCounts, ServerMetrics};
use crate::reserve::{ReserveStats, TokenReserve};
use crate::time::{Duration, Instant};
use crate::wire::{
    Capabilities, Key, KeyGroup, LeaderLabel, LeaderState, NO_LEADER_SLOT, Observed,
    PermitsRequest, PushKind, Reply, Request,
};

mod departed;
mod held;
mod inspect;
mod machine;
mod metrics;
mod permits;
mod pushes;
mod shared;
#[cfg(test)]
mod value_path_tests;

use crate::conn::pushes::{Watch, Watches};
use held::HeldCounts;
pub use inspect::QUEUED_ADMIN_REPLIES_MAX;

/// The first fencing token of a server started `since_epoch` after the
/// Unix epoch by the wall clock, given the token reserve its previous run
/// stored (`None`: no state file, or a first start): the wall-clock
/// microseconds or `stored + 1`, whichever is larger (see
/// [`crate::reserve::start_token`]). With a state file a restarted server
/// issues tokens above those it issued before even if the clock went back.
pub fn first_token(since_epoch: Duration, stored: Option<u64>) -> u64 {
    crate::reserve::start_token(since_epoch, stored)
}

/// Server configuration (already validated by the caller's config layer).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Lock table settings (limits, `T` margin, sweep interval).
    pub lock: LockConfig,
    /// Connections past their handshake (sessions) at most; a new
    /// connection while they are all taken is refused at once. Unfinished
    /// handshakes have their own budget ([`BudgetConfig::handshakes_max`]).
    pub connections_max: usize,
    /// Queued acquires (waiting for a key) on one connection at most; an
    /// acquire over it is answered `B`.
    pub in_flight_per_connection_max: usize,
    /// Reply bytes buffered for one connection before the server stops
    /// reading from it (see [`Server::wants_input`]).
    pub outbound_bytes_per_connection_max: usize,
    /// An unfinished handshake is closed after this long.
    pub handshake_timeout: Duration,
    /// Accepted client tokens.
    pub client_tokens: ClientTokens,
    /// Handshake budget, held-key cap, release-miss limit, report interval.
    /// The default suits 10,000 sessions; derive it with
    /// [`BudgetConfig::for_connections_max`] when changing `connections_max`.
    pub budget: BudgetConfig,
    /// The caps on total hold of our clients' grants (connections that
    /// negotiated renewal; other clients' grants have none).
    pub hold_caps: HoldCaps,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            lock: LockConfig::default(),
            connections_max: 10_000,
            in_flight_per_connection_max: 32_768,
            outbound_bytes_per_connection_max: 1 << 20,
            handshake_timeout: Duration::from_secs(3),
            client_tokens: ClientTokens::no_auth(),
            budget: BudgetConfig::for_connections_max(10_000),
            hold_caps: HoldCaps::default(),
        }
    }
}

pub use crate::conn::{ConnId, ConnState, Dialect};

/// Server-wide counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Open connections (sessions and unfinished handshakes).
    pub connections: usize,
    /// Connections past their handshake.
    pub sessions: usize,
    /// Unfinished handshakes counted against the handshake budget.
    pub handshakes: usize,
    /// Lock table counts.
    pub lock: LockStats,
    /// Token reserve counts.
    pub reserve: ReserveStats,
    /// Requests queued for a semaphore's permits (not in `lock.waiters`,
    /// which counts the table's own queues).
    pub permit_waiters: usize,
}

/// The single-mode server state machine.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    table: LockTable,
    conns: IdMap<ConnId, Conn>,
    next_conn_id: u64,
    /// Queued acquires, by the waiter id the table knows them by.
    waiters: IdMap<WaiterId, QueuedAcquire>,
    next_waiter_id: u64,
    wakes: WakeQueue,
    /// Handshake deadlines; entries of connections that finished or closed
    /// are skipped when they come due.
    handshake_deadlines: HandshakeDeadlines,
    /// Admission of client connections: sessions, unfinished handshakes.
    clients: ClientAdmission,
    /// Keys held by each connection's delivered grants (the table records
    /// which connection holds a grant: its holder tag is the connection id).
    held: HeldCounts,
    /// What the driver should log.
    reports: Reports,
    shutting_down: bool,
    /// The durable bound on tokens; unlimited unless
    /// [`Server::with_token_reserve`] set one.
    reserve: TokenReserve,
    /// Replies sent on connections already closed.
    closed_replies: ClosedReplies,
    /// Answers to force-releases, for the driver.
    admin_replies: inspect::AdminReplies,
    /// Grants delivered to connections that asked for pushes.
    watches: Watches,
    /// Pushes sent, by kind.
    pushes: PushCounts,
    /// FIFO semaphores over slot keys of the table.
    semaphores: Semaphores,
    /// Queued permit requests, by the waiter id the semaphores know them
    /// by.
    permit_waiters: IdMap<WaiterId, QueuedPermits>,
    /// Labels of closed connections whose grants still held keys, for
    /// observers (`O`).
    departed: departed::DepartedLabels,
}

#[derive(Debug)]
struct QueuedPermits {
    conn: ConnId,
    reply_to: ReplyTo,
}

#[derive(Debug)]
struct QueuedAcquire {
    conn: ConnId,
    reply_to: ReplyTo,
    keys: KeyGroup,
}

#[derive(Debug)]
struct Conn {
    /// Handshake, dialect and session decoding.
    front: ClientFront,
    /// Reply bytes for the driver, and which grants they carry.
    out: Outbound,
    /// Queued waiters, in arrival order (waiter ids only grow), so closing a
    /// connection cancels them in an order that does not depend on hashing.
    queued: BTreeSet<WaiterId>,
    /// Where the connection comes from, for budgets and logs.
    source: IpAddr,
    /// Why the server closes it, once it decided to.
    close_reason: Option<CloseReason>,
    /// Releases answered `N` since the last one that released.
    release_misses_in_row: u32,
    /// Replies sent on it, by kind.
    replies: ReplyCounts,
    /// Its requests come as values and its replies go as values
    /// ([`Machine::handle_requests`]): set by the first request value, for
    /// the rest of the connection.
    values: bool,
}

/// Most semaphores the server keeps at once (each in use, or forgotten
/// lazily); a request for a new one beyond it is answered `B`.
const SEMAPHORES_MAX: usize = 65_536;

/// Queues a grant's reply on `conn`, remembering where its frame ends.
fn send_grant(
    conn_id: ConnId,
    conn: &mut Conn,
    wakes: &mut WakeQueue,
    reply_to: &ReplyTo,
    token: u64,
    keys: KeyGroup,
) {
    send(conn_id, conn, wakes, reply_to, Answer::Granted { token });
    conn.out.record_grant(token, keys);
}

/// Watches the grant just sent to `conn` when it negotiated pushes: its
/// holder hears when the lease is ending, and when it is lost.
fn watch_grant(
    table: &LockTable,
    watches: &mut Watches,
    (conn_id, conn): (ConnId, &Conn),
    token: u64,
    keys: &KeyGroup,
    (lease, deadline): (Duration, Instant),
) {
    if !conn.front.capabilities().contains(Capabilities::PUSH) {
        return;
    }
    let Some(key) = keys.keys().first() else {
        return;
    };
    let cap_at = table.cap_of(token);
    watches.watch(
        token,
        Watch {
            conn: conn_id,
            key: key.clone(),
            lease,
            deadline,
            warned: false,
            cap_at,
        },
    );
}

/// When grant `token`, just made on `keys`, ends (the table's lease
/// deadline of it on its first key; `now` if the table no longer records
/// it).
fn lease_end(table: &LockTable, keys: &KeyGroup, token: u64, now: Instant) -> Instant {
    keys.keys()
        .first()
        .and_then(|key| table.grant_of_token(key.as_bytes(), token))
        .map_or(now, |grant| grant.lease_deadline)
}

/// Queues the reply that tells `answer` on `conn` and schedules a wake.
/// Single mode never has an outcome it cannot tell, so every answer has a
/// reply in both dialects.
/// On a connection whose requests come as values the reply is queued as a
/// value, in the place its frame would take (see [`Machine::handle_requests`]).
fn send(conn_id: ConnId, conn: &mut Conn, wakes: &mut WakeQueue, to: &ReplyTo, answer: Answer) {
    let counted = to.counted_as(answer);
    conn.replies.count(&counted);
    if conn.values && matches!(to, ReplyTo::V3 { .. }) {
        // A v3 answer is counted as the very reply it is.
        conn.out.queue_reply(counted);
    } else {
        let delivery = to.encode(answer, &[], conn.out.buffer_mut());
        debug_assert_eq!(delivery, Delivery::Queued, "{answer:?} has a reply");
    }
    wakes.wake(conn_id, &mut conn.out);
}

impl Server {
    /// A server whose first grant gets `first_token` (by our rule the
    /// bootstrap wall-clock time in microseconds since the Unix epoch).
    pub fn new(config: ServerConfig, first_token: u64, now: Instant) -> Self {
        let table = LockTable::new(config.lock, first_token, now);
        let config_lock = config.lock;
        Server {
            table,
            conns: IdMap::default(),
            next_conn_id: 1,
            waiters: IdMap::default(),
            next_waiter_id: 1,
            wakes: WakeQueue::default(),
            handshake_deadlines: HandshakeDeadlines::default(),
            clients: ClientAdmission::new(
                config.connections_max,
                config.budget.handshakes_max,
                config.budget.handshakes_per_source_max,
                config.handshake_timeout,
            ),
            held: HeldCounts::default(),
            reports: Reports::new(config.budget.report_interval),
            config,
            shutting_down: false,
            reserve: TokenReserve::unlimited(),
            closed_replies: ClosedReplies::default(),
            admin_replies: inspect::AdminReplies::default(),
            watches: Watches::default(),
            pushes: PushCounts::default(),
            semaphores: Semaphores::new(
                SemaphoreLimits {
                    semaphores_max: config_lock.limits.keys_max.min(SEMAPHORES_MAX),
                    waiters_per_semaphore_max: config_lock.limits.waiters_per_key_max,
                    waiters_total_max: config_lock.limits.waiters_total_max,
                },
                config_lock.wait_margin,
            ),
            permit_waiters: IdMap::default(),
            departed: departed::DepartedLabels::default(),
        }
    }

    /// Issues no token above what `reserve` has confirmed durable (see
    /// [`crate::reserve`]). Without it the server is unlimited (no state
    /// file). When the reserve is used up (its write is late or failing) an
    /// acquire that would be granted at once is answered `B` (a definite
    /// "no", nothing queued, safe to retry) and queued waiters keep their
    /// place until the write succeeds or their wait ends with `T`.
    pub fn with_token_reserve(mut self, now: Instant, reserve: TokenReserve) -> Self {
        self.table.set_token_limit(now, reserve.limit());
        self.reserve = reserve;
        self
    }

    /// Serves one request of `conn`, however it arrived: decoded from its
    /// bytes ([`Machine::handle_input`]) or handed over as a value
    /// ([`Machine::handle_requests`]). Lock events it causes are drained by
    /// the caller.
    fn handle_request(&mut self, now: Instant, conn_id: ConnId, request: ClientRequest) {
        match request {
            ClientRequest::Acquire {
                wait_s,
                lease_s,
                keys,
                hold,
                reply_to,
            } => {
                let max_hold = self.hold_cap(hold);
                let ask = (wait_s, lease_s, max_hold, KeyModes::EXCLUSIVE);
                self.handle_acquire(now, conn_id, ask, keys, reply_to)
            }
            ClientRequest::AcquireShared {
                wait_s,
                lease_s,
                modes,
                keys,
                hold,
                reply_to,
            } => {
                let modes = KeyModes::from_bits(modes);
                let ask = (wait_s, lease_s, self.hold_cap(hold), modes);
                self.handle_acquire(now, conn_id, ask, keys, reply_to)
            }
            ClientRequest::Downgrade {
                token,
                keys,
                reply_to,
            } => self.handle_downgrade(now, conn_id, token, &keys, &reply_to),
            ClientRequest::Release {
                token,
                keys,
                reply_to,
            } => self.handle_release(now, conn_id, token, keys, reply_to),
            // The front end decodes `W` only on a connection granted the
            // extension, which this owner does not serve yet: had it come,
            // it had no effect, which is what `E 3` says.
            ClientRequest::Extend {
                token,
                lease_s,
                keys,
                reply_to,
            } => self.handle_extend(now, conn_id, (token, lease_s), keys, reply_to),
            ClientRequest::AcquirePermits {
                request,
                hold,
                reply_to,
            } => {
                let max_hold = self.hold_cap(hold);
                self.handle_permits(now, conn_id, request, max_hold, reply_to);
            }
            ClientRequest::Observe { name, reply_to } => {
                let observed = self.observe(now, &name);
                if let Some(conn) = self.conns.get_mut(&conn_id) {
                    let answer = Answer::Observed(observed);
                    send(conn_id, conn, &mut self.wakes, &reply_to, answer);
                }
            }
        }
    }

    /// Who holds `key` at `now`, read from the lock table and the holder's
    /// connection (`O`, docs/protocol.md §8.6): nobody, or the grant's
    /// token (an election's term), its lease left, and the label the
    /// holding connection negotiated. A holder whose connection closed (or
    /// is closing) still holds until its lease ends; it is reported as
    /// departed, with the label it had. Changes nothing.
    pub fn observe(&mut self, now: Instant, key: &Key) -> Observed {
        self.prune_departed();
        // The table expires leases lazily: a grant whose lease ended is
        // nobody's, whatever it still records.
        let Some(grant) = self
            .table
            .grant_of(key.as_bytes())
            .filter(|grant| grant.lease_deadline > now)
        else {
            return Observed::NO_LEADER;
        };
        let holder = ConnId(grant.holder);
        let (state, label) = match self.conns.get(&holder) {
            Some(conn) if !conn.out.is_closing() => (LeaderState::Connected, conn.front.label()),
            Some(conn) => (LeaderState::Departed, conn.front.label()),
            None => (LeaderState::Departed, self.departed.label(holder)),
        };
        #[cfg(feature = "planted-bugs")]
        if state == LeaderState::Departed
            && crate::testing::planted::active(
                crate::testing::planted::PlantedBug::ObserveDepartedAsNone,
            )
        {
            return Observed::NO_LEADER;
        }
        let lease_ms = grant
            .lease_deadline
            .saturating_duration_since(now)
            .as_millis();
        Observed {
            state,
            term: grant.token,
            lease_ms: u32::try_from(lease_ms).unwrap_or(u32::MAX),
            // A label passed the `X` checks, which are the label's own.
            label: label
                .and_then(LeaderLabel::new)
                .unwrap_or(LeaderLabel::EMPTY),
        }
    }

    /// Forgets the labels of departed connections that hold nothing any
    /// more (oldest first), and their held-key counts with them.
    fn prune_departed(&mut self) {
        let held = &mut self.held;
        let idle: Vec<ConnId> = {
            let mut idle = Vec::new();
            self.departed
                .prune(|conn| held.held(conn) == 0, |conn| idle.push(conn));
            idle
        };
        for conn in idle {
            held.forget_conn(conn);
        }
    }

    /// Whether an acquire of `keys` keys (or permits) on `conn` is over a
    /// per-connection limit: requests in flight, or keys held. Such an
    /// acquire is answered `B`.
    fn over_connection_limits(&mut self, now: Instant, conn_id: ConnId, keys: usize) -> bool {
        let over_in_flight = self
            .conns
            .get(&conn_id)
            .is_none_or(|conn| conn.queued.len() >= self.config.in_flight_per_connection_max);
        self.held.expire(now);
        let over_held = self.held.held(conn_id).saturating_add(keys)
            > self.config.budget.held_per_connection_max;
        over_in_flight || over_held
    }

    /// Requests received on `conn` as values rather than bytes: the
    /// in-process link of an embedded server, whose client session hands
    /// over the requests it would encode
    /// ([`crate::client::Session::poll_transmit_requests`]). Each is
    /// checked as its frame would be decoded ([`crate::wire::check_request`])
    /// and then served by the very code that serves a decoded frame; what
    /// the server answers is queued as reply values, taken with
    /// [`Machine::poll_transmit_replies`], each counted in the stream as the
    /// bytes of its frame, so that delivery (a grant counts as delivered
    /// once [`Machine::handle_written`] or [`Machine::handle_flushed`] covers
    /// it) and the ghost-grant release work exactly as over bytes.
    ///
    /// Only a v3 session past its handshake (which goes as bytes) with no
    /// partial frame buffered takes values; from the first, the connection
    /// takes no more bytes. Anything else closes it, as a bad frame would.
    /// `requests` is left empty.
    fn serve_request_values(&mut self, now: Instant, conn_id: ConnId, requests: &mut Vec<Request>) {
        self.handle_timeout(now);
        // The connection is looked up once per request; the first also
        // checks that it may take values.
        let mut first = true;
        // Taken from the back of the reversed batch: cheaper than a drain
        // for the usual batch of one, and in arrival order all the same.
        requests.reverse();
        while let Some(request) = requests.pop() {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                break;
            };
            if conn.out.is_closing() {
                break;
            }
            if first {
                first = false;
                if !conn.front.takes_request_values() {
                    self.close_conn(now, conn_id, CloseReason::BadFrame);
                    break;
                }
                conn.values = true;
            }
            let out = &mut conn.out;
            let next = conn
                .front
                .next_request_value(request, &mut conn.replies, |reply| out.queue_reply(reply));
            if conn.out.pending_len() > 0 {
                self.wakes.wake(conn_id, &mut conn.out);
            }
            match next {
                Ok(None) => {}
                Ok(Some(request)) => self.handle_request(now, conn_id, request),
                Err(reason) => {
                    self.close_conn(now, conn_id, reason);
                    break;
                }
            }
        }
        requests.clear();
        self.drain_lock_events(now);
    }

    fn handle_acquire(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        (wait_s, lease_s, max_hold, modes): (u8, u8, Option<Duration>, KeyModes),
        keys: KeyGroup,
        reply_to: ReplyTo,
    ) {
        let outcome = if self.over_connection_limits(now, conn_id, keys.len()) {
            AcquireOutcome::Busy
        } else {
            let waiter = WaiterId(self.next_waiter_id);
            self.next_waiter_id += 1;
            let options = AcquireOptions {
                wait_s,
                lease_s,
                holder: conn_id.0,
                max_hold,
            };
            let outcome = self
                .table
                .acquire_in_modes(now, waiter, &keys, &options, modes);
            if outcome == AcquireOutcome::Queued {
                let Some(conn) = self.conns.get_mut(&conn_id) else {
                    return;
                };
                conn.queued.insert(waiter);
                self.waiters.insert(
                    waiter,
                    QueuedAcquire {
                        conn: conn_id,
                        reply_to,
                        keys,
                    },
                );
                return;
            }
            outcome
        };
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let answer = match outcome {
            AcquireOutcome::Granted { token } => {
                let expires = lease_end(&self.table, &keys, token, now);
                self.held.add(conn_id, keys.len(), expires);
                let lease = Duration::from_secs(u64::from(lease_s));
                watch_grant(
                    &self.table,
                    &mut self.watches,
                    (conn_id, conn),
                    token,
                    &keys,
                    (lease, expires),
                );
                send_grant(conn_id, conn, &mut self.wakes, &reply_to, token, keys);
                return;
            }
            AcquireOutcome::TimedOut => Answer::TimedOut,
            AcquireOutcome::Busy => Answer::Busy,
            AcquireOutcome::Queued => unreachable!("queued acquires returned above"),
        };
        send(conn_id, conn, &mut self.wakes, &reply_to, answer);
    }

    fn handle_release(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        token: u64,
        keys: KeyGroup,
        reply_to: ReplyTo,
    ) {
        if reply_to.is_unissued_line_release(token, self.table.next_token()) {
            let source = self.conns.get(&conn_id).map(|conn| conn.source);
            self.reports
                .abuse(now, source, AbuseKind::TokenFromTheFuture);
        }
        let (outcome, grant) = self.table.release_grant(now, &keys, token);
        if outcome == ReleaseOutcome::Released {
            self.watches.forget(token);
            self.semaphores.keys_freed(keys.keys());
        }
        if let Some(grant) = grant {
            self.held
                .released(ConnId(grant.holder), grant.keys, grant.lease_deadline);
        }
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let misses_max = self.config.budget.release_misses_in_row_max;
        let mut sweeping = false;
        match outcome {
            ReleaseOutcome::Released => conn.release_misses_in_row = 0,
            ReleaseOutcome::NotFound => {
                conn.release_misses_in_row = conn.release_misses_in_row.saturating_add(1);
                sweeping = misses_max > 0 && conn.release_misses_in_row >= misses_max;
            }
            ReleaseOutcome::GroupMismatch => {}
        }
        let answer = match outcome {
            ReleaseOutcome::Released => Answer::Released,
            ReleaseOutcome::NotFound => Answer::NotFound,
            ReleaseOutcome::GroupMismatch => Answer::GroupMismatch,
        };
        send(conn_id, conn, &mut self.wakes, &reply_to, answer);
        if sweeping {
            // A run of misses is what trying tokens blindly looks like;
            // fencing at the storage is the real protection, this makes a
            // sweep slow and visible.
            let source = conn.source;
            self.reports
                .abuse(now, Some(source), AbuseKind::ReleaseSweep);
            self.close_conn(now, conn_id, CloseReason::ReleaseMisses);
        }
    }

    /// The cap on total hold of an acquire that asked for `hold`.
    fn hold_cap(&self, hold: HoldAsk) -> Option<Duration> {
        match hold {
            HoldAsk::Uncapped => None,
            HoldAsk::Default => Some(self.config.hold_caps.cap_for(None)),
            HoldAsk::Asked(s) => {
                let asked = Duration::from_secs(u64::from(s));
                Some(self.config.hold_caps.cap_for(Some(asked)))
            }
        }
    }

    /// Renews the grant `token` of `keys` to `lease_s` from now, if it is
    /// current (the lock table decides, by the rule both modes share).
    fn handle_extend(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        (token, lease_s): (u64, u8),
        keys: KeyGroup,
        reply_to: ReplyTo,
    ) {
        let before = keys
            .keys()
            .first()
            .and_then(|key| self.table.grant_of_token(key.as_bytes(), token));
        let outcome = self.table.extend(now, &keys, token, lease_s);
        // The holder's count of held keys ends with the lease: its entry
        // moves with the lease (a connection already gone counts nothing).
        if let (Some(grant), Some(expires_at)) = (before, outcome.expires_at())
            && self.conns.contains_key(&ConnId(grant.holder))
        {
            let holder = ConnId(grant.holder);
            self.held.released(holder, grant.keys, grant.lease_deadline);
            self.held.add(holder, grant.keys, expires_at);
        }
        if let Some(expires_at) = outcome.expires_at() {
            let lease = expires_at.saturating_duration_since(now);
            self.watches.renewed(token, lease, expires_at);
        }
        let lease_end = lease_end(&self.table, &keys, token, now);
        let answer = Answer::of_extension(outcome, now, lease_end);
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            send(conn_id, conn, &mut self.wakes, &reply_to, answer);
        }
    }

    /// Keys held by the grants delivered to `conn` (for tests and metrics).
    pub fn held_keys(&self, conn_id: ConnId) -> usize {
        self.held.held(conn_id)
    }

    /// Log events dropped because the driver did not drain
    /// [`Output::Log`] (a bounded queue).
    pub fn dropped_log_events(&self) -> u64 {
        self.reports.dropped_events()
    }

    /// Turns the lock table's and the semaphores' events into replies to
    /// queued requests, until neither has more (a grant passed on by a
    /// closing connection may free slots, and the other way round).
    fn drain_lock_events(&mut self, now: Instant) {
        loop {
            self.drain_table_events(now);
            if !self.drain_permit_events(now) {
                break;
            }
        }
    }

    /// Turns the lock table's events into replies to queued acquires, and
    /// its expiries with a waiter into events operators see.
    fn drain_table_events(&mut self, now: Instant) {
        while let Some(handover) = self.table.poll_expiry_handover() {
            self.reports.expired_with_waiters(
                now,
                vec![handover.key],
                handover.expired,
                Some(handover.handed_to),
            );
        }
        while let Some((event, lease_deadline)) = self.table.poll_event_lease() {
            let (waiter, token) = match event {
                LockEvent::Granted { waiter, token } => (waiter, Some(token)),
                LockEvent::TimedOut { waiter } => (waiter, None),
            };
            #[cfg(feature = "planted-bugs")]
            if token.is_none()
                && crate::testing::planted::active(crate::testing::planted::PlantedBug::LoseWaiter)
            {
                // Forget the waiter without a reply.
                if let Some(queued) = self.waiters.remove(&waiter)
                    && let Some(conn) = self.conns.get_mut(&queued.conn)
                {
                    conn.queued.remove(&waiter);
                }
                continue;
            }
            let Some(queued) = self.waiters.remove(&waiter) else {
                debug_assert!(false, "lock event for unknown waiter {waiter:?}");
                continue;
            };
            let Some(conn) = self.conns.get_mut(&queued.conn) else {
                debug_assert!(false, "waiter {waiter:?} outlived its connection");
                continue;
            };
            conn.queued.remove(&waiter);
            if conn.out.is_closing() {
                // Nobody will read this grant: give the keys to whoever is
                // next instead of leaving them blocked until the lease ends.
                if let Some(token) = token {
                    self.table.release(now, &queued.keys, token);
                    self.semaphores.keys_freed(queued.keys.keys());
                }
                continue;
            }
            let to = &queued.reply_to;
            match token {
                Some(token) => {
                    let expires = lease_deadline.unwrap_or(now);
                    self.held.add(queued.conn, queued.keys.len(), expires);
                    let lease = expires.saturating_duration_since(now);
                    let holder = (queued.conn, &*conn);
                    watch_grant(
                        &self.table,
                        &mut self.watches,
                        holder,
                        token,
                        &queued.keys,
                        (lease, expires),
                    );
                    send_grant(queued.conn, conn, &mut self.wakes, to, token, queued.keys);
                }
                None => send(queued.conn, conn, &mut self.wakes, to, Answer::TimedOut),
            }
        }
    }

    /// The server gives up on `conn`: it reads nothing more, its queued
    /// waiters leave their queues now, and what is already queued for it is
    /// flushed before the driver closes it.
    fn close_conn(&mut self, now: Instant, conn_id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.close_reason.get_or_insert(reason);
        self.clients.closing(conn_id);
        self.wakes.close_after_flush(conn_id, &mut conn.out);
        // Latest arrival first: cancelling a front waiter first could hand the
        // key to this connection's own next waiter, only to pass it on again.
        let queued: Vec<WaiterId> = conn.queued.iter().rev().copied().collect();
        for waiter in queued {
            // Any call into the table may first serve deadlines that are due,
            // and cancelling one waiter may grant the next, possibly another
            // waiter of this connection: drain after each so that every event
            // still finds its waiter, and grants to this closing connection
            // are passed on (see `drain_lock_events`).
            if self.table.cancel(now, waiter) {
                self.waiters.remove(&waiter);
                if let Some(conn) = self.conns.get_mut(&conn_id) {
                    conn.queued.remove(&waiter);
                }
            } else if self.semaphores.cancel(waiter) {
                self.permit_waiters.remove(&waiter);
                if let Some(conn) = self.conns.get_mut(&conn_id) {
                    conn.queued.remove(&waiter);
                }
            }
            self.drain_lock_events(now);
        }
    }

    /// The dialect `conn` speaks, once its handshake succeeded.
    pub fn dialect(&self, conn_id: ConnId) -> Option<Dialect> {
        self.conns
            .get(&conn_id)
            .and_then(|conn| conn.front.dialect())
    }

    /// The lock table, read-only, for invariant checkers (the simulator).
    #[doc(hidden)]
    pub fn lock_table(&self) -> &LockTable {
        &self.table
    }

    /// The bytes queued for `conn` and not yet taken, read-only, for
    /// invariant checkers (the simulator reads replies as they are made).
    #[doc(hidden)]
    pub fn pending_transmit(&self, conn_id: ConnId) -> &[u8] {
        self.conns
            .get(&conn_id)
            .map_or(&[], |conn| conn.out.pending())
    }

    /// A snapshot of what the server counted (see [`crate::metrics`]).
    /// O(connections) (their reply counts), independent of the keys.
    pub fn metrics(&self) -> ServerMetrics {
        let mut metrics = ServerMetrics::assemble(
            (&self.table, self.semaphores.busy()),
            (
                self.closed_replies
                    .total(self.conns.values().map(|c| &c.replies)),
                self.pushes,
            ),
            self.reports.totals(),
            self.clients.sessions(),
            self.clients.handshakes(),
            self.shutting_down,
        );
        // A request queued for permits is a queued acquire too.
        metrics.waiters += self.semaphores.waiter_count() as u64;
        metrics
    }

    /// Current counts.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            connections: self.conns.len(),
            sessions: self.clients.sessions().0,
            handshakes: self.clients.handshakes(),
            lock: self.table.stats(),
            reserve: self.reserve.stats(),
            permit_waiters: self.semaphores.waiter_count(),
        }
    }
}
