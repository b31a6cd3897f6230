//! The tokio driver of the single-mode [`Server`]: sockets, TLS, the clock
//! and the timer. Every decision is the core's; this module only moves bytes
//! and instants between the two.
//!
//! Shape: one state machine behind a `std::sync::Mutex`, never held across
//! an `.await`. Each connection has one task and one [`Notify`] registered
//! under its [`ConnId`]; after every input the task that fed it drains the
//! core's wakes and notifies the woken connections (its own wake is served
//! inline, without a round trip through its `Notify`). One timer task sleeps
//! until the core's next deadline; an input that makes the deadline earlier
//! notifies it.
//!
//! The same code drives the cluster node ([`crate::cluster`]): the
//! connection tasks, the timer and the supervisor are generic over
//! `Machine`, a small trait implemented by the single-mode [`Server`] and
//! by the cluster driver's wrapper of `ClusterNode`. The cluster adds a
//! second listener (peers) and outbound peer dials.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tracing::{debug, error, info, warn};

use ticketing_core::admin::AdminTokens;
use ticketing_core::auth::NONCE_LEN;
use ticketing_core::budget::LogEvent;
use ticketing_core::hash::IdMap;
use ticketing_core::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, LockListing, LockView, NotLeader,
};
use ticketing_core::reserve::TokenAlert;
use ticketing_core::server::{self, ConnId, ConnState, Server, ServerConfig, ServerStats};
use ticketing_core::time::{Instant, StdOrigin};
use ticketing_core::wire::Key;

use crate::admin;
use crate::state::{self, FloorFile, StateSettings};

/// First size of a connection's read buffer; most connections never need
/// more, so 10 000 idle connections cost 40 MiB rather than 640.
const READ_BUF_START_BYTES: usize = 4 * 1024;
/// The read buffer doubles when a read fills it, up to this.
const READ_BUF_MAX_BYTES: usize = 64 * 1024;
/// A write buffer that grew past this (a burst of replies) is given back
/// rather than kept for the connection's lifetime.
const WRITE_BUF_KEEP_BYTES: usize = 1 << 20;
/// Pause after an accept error such as EMFILE, so that the loop does not spin
/// while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How long an outbound peer dial may take before it counts as failed.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Pending connections the client listener queues: what
/// `tokio::net::TcpListener::bind` uses (mio, like std: 128).
const LISTEN_BACKLOG: u32 = 128;

/// Default for [`ServeSettings::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Everything [`spawn_server`] needs.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    /// Address to bind; port 0 picks a free port (see
    /// [`RunningServer::local_addr`]).
    pub listen: SocketAddr,
    /// The core's configuration.
    pub server: ServerConfig,
    /// TLS, if enabled.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// How long shutdown waits for connections to flush and close before it
    /// drops them.
    pub shutdown_grace: Duration,
    /// The state directory that keeps fencing tokens rising across
    /// restarts whatever the wall clock does ([`crate::state`]). `None`:
    /// no file, tokens start from the clock alone (tests); the `ticketing`
    /// binary always sets one.
    pub state: Option<StateSettings>,
    /// Where to serve the admin HTTP endpoints ([`crate::admin`]), if
    /// anywhere; port 0 picks a free port ([`RunningServer::admin_addr`]).
    pub admin_listen: Option<SocketAddr>,
    /// Tokens accepted by the admin lock API (see
    /// [`ticketing_core::admin`]); empty: inspection on a loopback admin
    /// listener only, and no force-release.
    pub admin_tokens: AdminTokens,
}

impl ServeSettings {
    /// Default core configuration (no auth), no TLS, on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        ServeSettings {
            listen,
            server: ServerConfig::default(),
            tls: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            state: None,
            admin_listen: None,
            admin_tokens: AdminTokens::default(),
        }
    }
}

/// A server running on the current tokio runtime. Dropping it starts the same
/// shutdown as [`RunningServer::shutdown`] without waiting for it.
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared<Server>>,
    supervisor: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin address actually bound, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The core's current counts.
    pub fn stats(&self) -> ServerStats {
        self.shared.lock().core.stats()
    }

    /// Stops accepting, lets the core answer what is queued, flushes and
    /// closes every connection (giving up after the shutdown grace), and
    /// returns when all tasks are done.
    pub async fn shutdown(mut self) {
        self.shared.stop.notify_one();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(e) = supervisor.await
        {
            error!("server supervisor task failed: {e}");
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        // notify_one keeps a permit, so the supervisor sees it even if it is
        // not waiting right now.
        self.shared.stop.notify_one();
    }
}

/// Binds `settings.listen` and starts serving on the current tokio runtime.
/// With a state directory the first token reserve is made durable before
/// the port listens (connections are refused until then); a state directory or file that cannot
/// be used is an error carrying a [`crate::StateError`]
/// ([`crate::StateError::find`]).
pub async fn spawn_server(settings: ServeSettings) -> io::Result<RunningServer> {
    // Bound now (a port-0 address names the state file), listening only
    // once the token floor is durable: until then a connection is refused
    // rather than left waiting in the backlog of a server not yet serving.
    let socket = if settings.listen.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(settings.listen)?;
    let local_addr = socket.local_addr()?;
    let admin = admin::bind(settings.admin_listen).await?;
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
    let clock = Clock::start();
    // Named after the configured address, or the bound one for port 0
    // (which no two live servers share).
    let name_addr = if settings.listen.port() == 0 {
        local_addr
    } else {
        settings.listen
    };
    let floor = match &settings.state {
        Some(state) => Some(open_floor(state, &state::single_file_name(name_addr), &clock).await?),
        None => None,
    };
    let listener = socket.listen(LISTEN_BACKLOG)?;
    let tls = settings.tls.clone();
    let auth = if settings.server.client_tokens.is_no_auth() {
        "none (empty token only)"
    } else {
        "client tokens"
    };
    info!(
        listen = %local_addr,
        mode = "single",
        auth,
        tls = if tls.is_some() { "on" } else { "off" },
        "ticketing server listening"
    );

    let now = clock.now();
    let (server, persister) = match floor {
        Some(floor) => (
            Server::new(settings.server, floor.first_token, now)
                .with_token_reserve(now, floor.reserve),
            Some(floor.file),
        ),
        None => (
            Server::new(settings.server, first_token_from_clock(), now),
            None,
        ),
    };
    let shared = Shared::new(server, clock);
    let mut extra = persister
        .map(|file| vec![tokio::spawn(run_persister(Arc::clone(&shared), file))])
        .unwrap_or_default();
    if let Some(admin) = admin {
        let node = Arc::new(admin::DrivenNode {
            shared: Arc::clone(&shared),
            metrics: |server: &Server| admin::NodeMetrics::Single(server.metrics()),
        });
        let tokens = settings.admin_tokens.clone();
        extra.push(tokio::spawn(admin::serve_admin_api(admin, node, tokens)));
    }
    let supervisor = start(
        &shared,
        vec![Listener {
            tcp: listener,
            tls,
            open: Server::handle_connect,
            what: "client",
            link_timeout: None,
        }],
        extra,
        None,
        settings.shutdown_grace,
    );
    Ok(RunningServer {
        local_addr,
        admin_addr,
        shared,
        supervisor: Some(supervisor),
    })
}

/// The core's [`server::first_token`] at the wall-clock time now, with no
/// state file.
pub(crate) fn first_token_from_clock() -> u64 {
    server::first_token(state::wall_clock(), None)
}

/// Opens the state file (blocking IO, off the runtime's thread) and makes
/// the first reserve durable.
pub(crate) async fn open_floor(
    settings: &StateSettings,
    name: &str,
    clock: &Clock,
) -> io::Result<state::Floor> {
    let (settings, name, now) = (settings.clone(), name.to_owned(), clock.now());
    let floor = tokio::task::spawn_blocking(move || state::open_floor(&settings, &name, now))
        .await
        .map_err(io::Error::other)?
        .map_err(state::StateError::into_io)?;
    info!(
        path = %floor.file.path().display(),
        first_token = floor.first_token,
        reserve = floor.reserve.limit(),
        "token floor loaded"
    );
    Ok(floor)
}

/// Writes the reserve values the core asks for, one at a time, and tells
/// the core how each write went.
pub(crate) async fn run_persister<M: Machine>(shared: Arc<Shared<M>>, file: Arc<FloorFile>) {
    loop {
        shared.persist.notified().await;
        let Some(value) = shared.lock().reserve_request.take() else {
            continue;
        };
        let writer = Arc::clone(&file);
        let result = tokio::task::spawn_blocking(move || writer.write(value))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
        let mut inner = shared.lock();
        let now = shared.clock.now();
        match result {
            Ok(()) => inner.core.handle_reserve_persisted(now, value),
            Err(e) => {
                error!(path = %file.path().display(), value, "cannot write the token reserve: {e}");
                inner.core.handle_reserve_failed(now);
            }
        }
        inner.dispatch(&shared, None);
    }
}

/// Logs what the core reports about the token counter.
pub(crate) fn log_token_alert(alert: TokenAlert) {
    error!("{alert}");
}

// ---------------------------------------------------------------------------
// The state machine seen by the driver
// ---------------------------------------------------------------------------

/// What the generic driver needs from a sans-IO core: the single-mode
/// [`Server`] or a cluster node. Each method is the core's method of the
/// same name unless documented otherwise.
pub(crate) trait Machine: Send + 'static {
    /// Bytes received on `conn`.
    fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]);
    /// A connection with bytes to send or to be closed.
    fn poll_wake(&mut self) -> Option<ConnId>;
    /// Moves `conn`'s pending bytes to `out`.
    fn take_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState;
    /// False while the core wants no more input from `conn`.
    fn wants_input(&self, conn: ConnId) -> bool;
    /// `written` bytes of the last `take_transmit` were accepted by the
    /// stream (all of them unless the write failed).
    fn handle_written(&mut self, now: Instant, conn: ConnId, written: usize);
    /// The transport of `conn` is gone.
    fn handle_closed(&mut self, now: Instant, conn: ConnId);
    /// The next deadline.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Deadlines up to `now` are due.
    fn handle_timeout(&mut self, now: Instant);
    /// Stop serving.
    fn begin_shutdown(&mut self, now: Instant);
    /// True once [`Machine::begin_shutdown`] was called.
    fn is_shutting_down(&self) -> bool;
    /// The next peer slot to dial (cluster only).
    fn poll_dial(&mut self, _now: Instant) -> Option<u8> {
        None
    }
    /// The outcome of a dial asked for by [`Machine::poll_dial`].
    fn handle_dial_failed(&mut self, _now: Instant, _slot: u8) {}
    /// The dialed transport to `slot` is up: a new connection.
    fn handle_dialed(&mut self, _now: Instant, _slot: u8, _nonce: [u8; NONCE_LEN]) -> ConnId {
        unreachable!("this core never asks to dial")
    }
    /// During shutdown: true when what is left (peer connections) may be
    /// dropped without waiting for it. The single server waits for all of
    /// its connections instead.
    fn quiesced(&self) -> bool {
        false
    }
    /// Called after every drain of the wakes; for logging state changes.
    fn observe(&mut self) {}
    /// A token reserve value to store durably (see
    /// [`ticketing_core::reserve`]).
    fn poll_reserve(&mut self, _now: Instant) -> Option<u64> {
        None
    }
    /// The value asked for by [`Machine::poll_reserve`] is durable.
    fn handle_reserve_persisted(&mut self, _now: Instant, _value: u64) {}
    /// The write asked for by [`Machine::poll_reserve`] failed.
    fn handle_reserve_failed(&mut self, _now: Instant) {}
    /// Inspection of one key (see [`ticketing_core::inspect`]); a core
    /// without inspection sees nothing.
    fn inspect_lock(&self, _now: Instant, _key: &Key) -> Option<LockView> {
        None
    }
    /// Inspection by prefix.
    fn inspect_locks(&self, _now: Instant, _prefix: &[u8], _limit: usize) -> LockListing {
        LockListing {
            locks: Vec::new(),
            truncated: false,
        }
    }
    /// An operator's force-release; its answer comes from
    /// [`Machine::poll_admin_reply`] under `id`.
    fn handle_force_release(&mut self, _now: Instant, _id: AdminRequestId, _req: ForceRelease) {}
    /// The next answer to a force-release.
    fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        None
    }
    /// Where to send an operator instead (a cluster node that is not the
    /// leader); `None`: this core serves inspection and force-release.
    fn not_leader(&self) -> Option<NotLeader> {
        None
    }
}

impl Machine for Server {
    fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]) {
        Server::handle_input(self, now, conn, bytes);
    }
    fn poll_wake(&mut self) -> Option<ConnId> {
        Server::poll_wake(self)
    }
    fn take_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState {
        Server::take_transmit(self, conn, out)
    }
    fn wants_input(&self, conn: ConnId) -> bool {
        Server::wants_input(self, conn)
    }
    fn handle_written(&mut self, now: Instant, conn: ConnId, written: usize) {
        Server::handle_written(self, now, conn, written);
    }
    fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        Server::handle_closed(self, now, conn);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Server::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Server::handle_timeout(self, now);
    }
    fn begin_shutdown(&mut self, now: Instant) {
        Server::begin_shutdown(self, now);
    }
    fn is_shutting_down(&self) -> bool {
        Server::is_shutting_down(self)
    }
    fn observe(&mut self) {
        while let Some(event) = self.poll_log() {
            log_event(event);
        }
        while let Some(alert) = Server::poll_alert(self) {
            log_token_alert(alert);
        }
    }
    fn poll_reserve(&mut self, now: Instant) -> Option<u64> {
        Server::poll_reserve(self, now)
    }
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        Server::handle_reserve_persisted(self, now, value);
    }
    fn handle_reserve_failed(&mut self, now: Instant) {
        Server::handle_reserve_failed(self, now);
    }
    fn inspect_lock(&self, now: Instant, key: &Key) -> Option<LockView> {
        Server::lock(self, now, key)
    }
    fn inspect_locks(&self, now: Instant, prefix: &[u8], limit: usize) -> LockListing {
        Server::locks(self, now, prefix, limit)
    }
    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        Server::handle_force_release(self, now, id, req);
    }
    fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        Server::poll_admin_reply(self)
    }
}

/// Logs what the core reported: abuse at `warn`, close reasons at `debug`.
pub(crate) fn log_event(event: LogEvent) {
    match event {
        LogEvent::Abuse {
            source,
            kind,
            count,
        } => match source {
            Some(source) => warn!(%source, count, "{}", kind.describe()),
            None => warn!(source = "other sources", count, "{}", kind.describe()),
        },
        LogEvent::ForceReleased {
            keys,
            revoked,
            handed_to,
        } => {
            let keys: Vec<&str> = keys.iter().map(Key::as_str).collect();
            match handed_to {
                Some(token) => warn!(
                    ?keys,
                    revoked,
                    handed_to = token,
                    "force-released by an operator: the revoked token is fenced"
                ),
                None => warn!(
                    ?keys,
                    revoked, "force-released by an operator: the revoked token is fenced"
                ),
            }
        }
        LogEvent::Closed {
            conn,
            source,
            reason,
        } => match source {
            Some(source) => {
                debug!(conn = conn.0, %source, reason = reason.describe(), "connection closed")
            }
            None => debug!(
                conn = conn.0,
                reason = reason.describe(),
                "connection closed"
            ),
        },
    }
}

// ---------------------------------------------------------------------------
// Clock and shared state
// ---------------------------------------------------------------------------

/// The driver's monotonic clock: reads the std clock; the core's
/// [`StdOrigin`] converts.
#[derive(Debug)]
pub(crate) struct Clock(StdOrigin);

impl Clock {
    pub(crate) fn start() -> Self {
        Clock(StdOrigin::new(std::time::Instant::now()))
    }

    pub(crate) fn now(&self) -> Instant {
        self.0.instant(std::time::Instant::now())
    }

    /// The std instant of a core instant (the origin if it cannot be
    /// represented, which only happens centuries out).
    pub(crate) fn to_std(&self, at: Instant) -> std::time::Instant {
        self.0.to_std(at).unwrap_or(self.0.as_std())
    }

    /// The tokio instant of a core instant; `None` if it is beyond what the
    /// platform clock can represent (never, in practice).
    fn to_tokio(&self, at: Instant) -> Option<tokio::time::Instant> {
        self.0.to_std(at).map(tokio::time::Instant::from_std)
    }
}

pub(crate) struct Shared<M> {
    inner: Mutex<Inner<M>>,
    pub(crate) clock: Clock,
    /// Wakes the timer task when its deadline may have moved earlier.
    timer: Notify,
    /// Asks the supervisor to shut down.
    pub(crate) stop: Notify,
    /// Tells the supervisor that the core asked for dials.
    dial: Notify,
    /// During shutdown: something changed, the supervisor re-checks
    /// [`Machine::quiesced`].
    progress: Notify,
    /// Tells the persister that the core asked for a reserve write.
    persist: Notify,
}

impl<M> std::fmt::Debug for Shared<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<M: Machine> Shared<M> {
    pub(crate) fn new(core: M, clock: Clock) -> Arc<Self> {
        Arc::new(Shared {
            inner: Mutex::new(Inner {
                core,
                wakers: IdMap::default(),
                timer_target_micros: u64::MAX,
                dials: Vec::new(),
                reserve_request: None,
                admin: admin::PendingAdmin::default(),
            }),
            clock,
            timer: Notify::new(),
            stop: Notify::new(),
            dial: Notify::new(),
            progress: Notify::new(),
            persist: Notify::new(),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<M>> {
        // A panic inside the core leaves its state unknown; serving on from
        // it could break mutual exclusion, so every task stops instead.
        self.inner
            .lock()
            .expect("server state poisoned by an earlier panic")
    }
}

pub(crate) struct Inner<M> {
    pub(crate) core: M,
    /// The task to notify for each open connection.
    wakers: IdMap<ConnId, Arc<Notify>>,
    /// The deadline the timer task sleeps until, `u64::MAX` for none.
    timer_target_micros: u64,
    /// Slots the core asked to dial, not yet picked up by the supervisor.
    dials: Vec<u8>,
    /// A reserve write the core asked for, not yet picked up by the
    /// persister (the core asks for one at a time).
    reserve_request: Option<u64>,
    /// Force-releases waiting for the core's answer.
    pub(crate) admin: admin::PendingAdmin,
}

impl<M: Machine> Inner<M> {
    /// Drains the core's wakes after an input: notifies every woken
    /// connection but `me` and says whether `me` was woken. Then collects
    /// dials, tells the timer if the input made the next deadline earlier,
    /// and (during shutdown) the supervisor.
    pub(crate) fn dispatch(&mut self, shared: &Shared<M>, me: Option<ConnId>) -> bool {
        let mut mine = false;
        while let Some(conn) = self.core.poll_wake() {
            if Some(conn) == me {
                mine = true;
            } else if let Some(waker) = self.wakers.get(&conn) {
                waker.notify_one();
            }
            // A wake for a connection without a waker is for one that is
            // being closed right now; its task is already finishing.
        }
        let now = shared.clock.now();
        let dials_before = self.dials.len();
        while let Some(slot) = self.core.poll_dial(now) {
            self.dials.push(slot);
        }
        if self.dials.len() > dials_before {
            shared.dial.notify_one();
        }
        if let Some(value) = self.core.poll_reserve(now) {
            self.reserve_request = Some(value);
            shared.persist.notify_one();
        }
        while let Some((id, outcome)) = self.core.poll_admin_reply() {
            self.admin.answer(id, outcome);
        }
        self.core.observe();
        let deadline = self
            .core
            .poll_timeout()
            .map_or(u64::MAX, Instant::as_micros);
        if deadline < self.timer_target_micros {
            self.timer_target_micros = deadline;
            shared.timer.notify_one();
        }
        if self.core.is_shutting_down() {
            shared.progress.notify_one();
        }
        mine
    }
}

/// Sleeps until the core's next deadline, then hands it the time.
async fn run_timer<M: Machine>(shared: Arc<Shared<M>>) {
    loop {
        let deadline = {
            let mut inner = shared.lock();
            let deadline = inner.core.poll_timeout();
            inner.timer_target_micros = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        match deadline.and_then(|at| shared.clock.to_tokio(at)) {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        let mut inner = shared.lock();
                        let now = shared.clock.now();
                        inner.core.handle_timeout(now);
                        inner.dispatch(&shared, None);
                    }
                    () = shared.timer.notified() => {}
                }
            }
            None => shared.timer.notified().await,
        }
    }
}

// ---------------------------------------------------------------------------
// Listeners, dials and the supervisor
// ---------------------------------------------------------------------------

/// How a new inbound connection (from the given source address) is
/// announced to the core.
pub(crate) type OpenFn<M> = fn(&mut M, Instant, [u8; NONCE_LEN], IpAddr) -> Option<ConnId>;

/// One listening socket and what its connections are.
pub(crate) struct Listener<M> {
    pub(crate) tcp: TcpListener,
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    pub(crate) open: OpenFn<M>,
    /// `client` or `peer`, for logs.
    pub(crate) what: &'static str,
    /// TCP keepalive and `TCP_USER_TIMEOUT` for accepted sockets (peer
    /// links; `None`: system defaults).
    pub(crate) link_timeout: Option<Duration>,
}

/// Where to dial each peer slot, and how.
pub(crate) struct Dialer {
    /// The peer address of every slot (index = slot).
    pub(crate) addrs: Vec<SocketAddr>,
    /// TLS towards peers, with the name to verify.
    pub(crate) tls: Option<(TlsConnector, ServerName<'static>)>,
    /// TCP keepalive and `TCP_USER_TIMEOUT` for dialed sockets.
    pub(crate) link_timeout: Duration,
}

/// Starts the timer and the supervisor of `shared` on the current runtime.
pub(crate) fn start<M: Machine>(
    shared: &Arc<Shared<M>>,
    listeners: Vec<Listener<M>>,
    extra: Vec<JoinHandle<()>>,
    dialer: Option<Dialer>,
    grace: Duration,
) -> JoinHandle<()> {
    let timer = tokio::spawn(run_timer(Arc::clone(shared)));
    let mut background = extra;
    background.push(timer);
    tokio::spawn(supervise(
        Arc::clone(shared),
        listeners,
        background,
        dialer,
        grace,
    ))
}

/// Accepts from whichever listener has a connection.
async fn accept_any<M>(listeners: &[Listener<M>]) -> (usize, io::Result<(TcpStream, SocketAddr)>) {
    std::future::poll_fn(|cx| {
        for (index, listener) in listeners.iter().enumerate() {
            if let std::task::Poll::Ready(result) = listener.tcp.poll_accept(cx) {
                return std::task::Poll::Ready((index, result));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Accepts connections and starts dials until asked to stop, then shuts
/// down.
async fn supervise<M: Machine>(
    shared: Arc<Shared<M>>,
    listeners: Vec<Listener<M>>,
    background: Vec<JoinHandle<()>>,
    dialer: Option<Dialer>,
    grace: Duration,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = shared.stop.notified() => break,
            // Reaped before accepting, so a steady stream of new connections
            // cannot make finished tasks pile up.
            Some(done) = conns.join_next(), if !conns.is_empty() => log_task_end(done),
            () = shared.dial.notified(), if dialer.is_some() => {
                let slots = std::mem::take(&mut shared.lock().dials);
                if let Some(dialer) = &dialer {
                    for slot in slots {
                        let addr = dialer.addrs[usize::from(slot)];
                        conns.spawn(run_dial(
                            Arc::clone(&shared),
                            slot,
                            addr,
                            dialer.tls.clone(),
                            dialer.link_timeout,
                        ));
                    }
                }
            }
            (index, accepted) = accept_any(&listeners) => match accepted {
                Ok((tcp, peer)) => {
                    let listener = &listeners[index];
                    conns.spawn(run_inbound(
                        Arc::clone(&shared),
                        tcp,
                        peer,
                        listener.tls.clone(),
                        listener.open,
                        listener.what,
                        listener.link_timeout,
                    ));
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
        }
    }
    drop(listeners);
    info!(
        connections = conns.len(),
        "shutting down: flushing and closing connections"
    );
    {
        let mut inner = shared.lock();
        let now = shared.clock.now();
        inner.core.begin_shutdown(now);
        inner.dispatch(&shared, None);
    }
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        if conns.is_empty() || shared.lock().core.quiesced() {
            break;
        }
        tokio::select! {
            biased;
            Some(done) = conns.join_next() => log_task_end(done),
            () = shared.progress.notified() => {}
            () = tokio::time::sleep_until(deadline) => {
                warn!(
                    connections = conns.len(),
                    "connections did not close within {grace:?}; dropping them"
                );
                break;
            }
        }
    }
    conns.shutdown().await;
    for task in background {
        task.abort();
    }
    info!("shutdown complete");
}

fn log_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        error!("connection task panicked: {e}");
    }
}

// ---------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------

/// Closes the core's side of a connection however its task ends (return,
/// error, panic or abort at shutdown).
struct ConnGuard<M: Machine> {
    shared: Arc<Shared<M>>,
    conn: ConnId,
    peer: SocketAddr,
}

impl<M: Machine> Drop for ConnGuard<M> {
    fn drop(&mut self) {
        // Not `Shared::lock`: panicking again inside a drop would abort.
        if let Ok(mut inner) = self.shared.inner.lock() {
            inner.wakers.remove(&self.conn);
            let now = self.shared.clock.now();
            inner.core.handle_closed(now, self.conn);
            inner.dispatch(&self.shared, None);
        }
        // The core reports the close with its reason (see `log_event`);
        // this names the port too.
        debug!(peer = %self.peer, conn = self.conn.0, "connection task ended");
    }
}

fn fresh_nonce(peer: SocketAddr) -> Option<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    match getrandom::fill(&mut nonce) {
        Ok(()) => Some(nonce),
        Err(e) => {
            error!(%peer, "no nonce from the OS random source, closing: {e}");
            None
        }
    }
}

/// Registers a new connection with the core (through `open`) and its waker.
fn register<M: Machine>(
    shared: &Arc<Shared<M>>,
    peer: SocketAddr,
    open: impl FnOnce(&mut M, Instant) -> Option<ConnId>,
) -> Option<(ConnGuard<M>, Arc<Notify>)> {
    let waker = Arc::new(Notify::new());
    let mut inner = shared.lock();
    let now = shared.clock.now();
    let Some(conn) = open(&mut inner.core, now) else {
        // The core may have reported the refusal: log it now.
        inner.dispatch(shared, None);
        return None;
    };
    inner.wakers.insert(conn, Arc::clone(&waker));
    if inner.dispatch(shared, Some(conn)) {
        waker.notify_one();
    }
    drop(inner);
    let guard = ConnGuard {
        shared: Arc::clone(shared),
        conn,
        peer,
    };
    Some((guard, waker))
}

async fn run_inbound<M: Machine>(
    shared: Arc<Shared<M>>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    open: OpenFn<M>,
    what: &'static str,
    link_timeout: Option<Duration>,
) {
    // Replies are small and latency-bound; batching is done by us, not Nagle.
    if let Err(e) = tcp.set_nodelay(true) {
        debug!(%peer, "set_nodelay failed: {e}");
    }
    if let Some(timeout) = link_timeout {
        set_link_timeout(&tcp, peer, timeout);
    }
    let Some(nonce) = fresh_nonce(peer) else {
        return;
    };
    let Some((guard, waker)) =
        register(&shared, peer, |core, now| open(core, now, nonce, peer.ip()))
    else {
        debug!(%peer, what, "connection refused by the core (limit or shutdown)");
        return;
    };
    debug!(%peer, what, conn = guard.conn.0, "connection opened");
    let result = match tls {
        None => drive(&guard, &waker, tcp, Vec::new()).await,
        Some(tls) => handshake_then_drive(&guard, &waker, TlsAcceptor::from(tls).accept(tcp)).await,
    };
    if let Err(e) = result {
        debug!(%peer, what, conn = guard.conn.0, "connection error: {e}");
    }
}

/// Dials peer `slot` at `addr` and runs the connection.
async fn run_dial<M: Machine>(
    shared: Arc<Shared<M>>,
    slot: u8,
    addr: SocketAddr,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    link_timeout: Duration,
) {
    let connected = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await;
    let tcp = match connected {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            debug!(slot, %addr, "peer dial failed: {e}");
            dial_failed(&shared, slot);
            return;
        }
        Err(_) => {
            debug!(slot, %addr, "peer dial timed out");
            dial_failed(&shared, slot);
            return;
        }
    };
    if let Err(e) = tcp.set_nodelay(true) {
        debug!(%addr, "set_nodelay failed: {e}");
    }
    set_link_timeout(&tcp, addr, link_timeout);
    let Some(nonce) = fresh_nonce(addr) else {
        dial_failed(&shared, slot);
        return;
    };
    let Some((guard, waker)) = register(&shared, addr, |core, now| {
        Some(core.handle_dialed(now, slot, nonce))
    }) else {
        return;
    };
    debug!(slot, %addr, conn = guard.conn.0, "peer connection dialed");
    let result = match tls {
        None => drive(&guard, &waker, tcp, Vec::new()).await,
        Some((connector, name)) => {
            handshake_then_drive(&guard, &waker, connector.connect(name, tcp)).await
        }
    };
    if let Err(e) = result {
        debug!(slot, %addr, conn = guard.conn.0, "peer connection error: {e}");
    }
}

/// The second line of defence behind the core's silence rule: the kernel
/// gives up on a peer socket whose sent data stays unacknowledged for
/// `timeout` (`TCP_USER_TIMEOUT`, Linux), so a write stuck behind a
/// backed-off retransmission fails instead of hanging, and probes an idle
/// one (keepalive). Failures are logged and otherwise ignored: the core's
/// rule still holds.
fn set_link_timeout(tcp: &TcpStream, addr: SocketAddr, timeout: Duration) {
    let socket = socket2::SockRef::from(tcp);
    let probe = (timeout / 4).max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(probe)
        .with_interval(probe);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        debug!(%addr, "set_tcp_keepalive failed: {e}");
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = socket.set_tcp_user_timeout(Some(timeout)) {
        debug!(%addr, "set_tcp_user_timeout failed: {e}");
    }
}

fn dial_failed<M: Machine>(shared: &Shared<M>, slot: u8) {
    let mut inner = shared.lock();
    let now = shared.clock.now();
    inner.core.handle_dial_failed(now, slot);
    inner.dispatch(shared, None);
}

/// Runs a TLS handshake, then the connection. The core already counts the
/// connection (limit) and runs its handshake deadline, which closes a
/// connection that stalls in TLS as well; what the core queues meanwhile is
/// kept and written once TLS is up.
async fn handshake_then_drive<M, F, S>(
    guard: &ConnGuard<M>,
    waker: &Notify,
    handshake: F,
) -> io::Result<()>
where
    M: Machine,
    F: Future<Output = io::Result<S>>,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    tokio::pin!(handshake);
    loop {
        tokio::select! {
            done = &mut handshake => {
                let stream = done?;
                return drive(guard, waker, stream, out).await;
            }
            () = waker.notified() => {
                let state = guard.shared.lock().core.take_transmit(guard.conn, &mut out);
                if state != ConnState::Open {
                    return Ok(());
                }
            }
        }
    }
}

/// The connection loop: read → core, core → write.
async fn drive<M, S>(
    guard: &ConnGuard<M>,
    waker: &Notify,
    mut stream: S,
    mut out: Vec<u8>,
) -> io::Result<()>
where
    M: Machine,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let shared = &*guard.shared;
    let conn = guard.conn;
    let mut read_buf = vec![0u8; READ_BUF_START_BYTES];
    let mut reading = true;
    // Bytes taken before the transport was up (TLS) go out first.
    if !out.is_empty() {
        waker.notify_one();
    }
    loop {
        // Wait for our wake or for input (only while the core wants input).
        let woken = tokio::select! {
            biased;
            () = waker.notified() => true,
            read = stream.read(&mut read_buf), if reading => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                let mut inner = shared.lock();
                let now = shared.clock.now();
                inner.core.handle_input(now, conn, &read_buf[..n]);
                let mine = inner.dispatch(shared, Some(conn));
                reading = inner.core.wants_input(conn);
                drop(inner);
                if n == read_buf.len() && read_buf.len() < READ_BUF_MAX_BYTES {
                    read_buf.resize(read_buf.len() * 2, 0);
                }
                mine
            }
        };
        if !woken {
            continue;
        }
        // Let the other connections that became readable in the same
        // wake-up run first: what their input grants to this connection
        // (a release there hands a key to a waiter here) then leaves in this
        // write instead of a second one.
        tokio::task::yield_now().await;

        // Take everything pending in one batch.
        let state = {
            let mut inner = shared.lock();
            let state = inner.core.take_transmit(conn, &mut out);
            reading = inner.core.wants_input(conn);
            state
        };
        if state == ConnState::Gone {
            return Ok(());
        }
        if out.is_empty() && state == ConnState::Open {
            continue;
        }
        let mut written = 0;
        let result = write_counted(&mut stream, &out, &mut written).await;
        out.clear();
        if out.capacity() > WRITE_BUF_KEEP_BYTES {
            out = Vec::new();
        }
        {
            // Report what went out even when the write failed part way: a
            // grant whose frame left whole may be in the client's hands.
            let mut inner = shared.lock();
            let now = shared.clock.now();
            inner.core.handle_written(now, conn, written);
            if inner.dispatch(shared, Some(conn)) {
                waker.notify_one();
            }
            reading = inner.core.wants_input(conn);
        }
        result?;
        if state == ConnState::CloseAfterFlush {
            // The guard reports the close once the stream is shut down.
            let _ = stream.shutdown().await;
            return Ok(());
        }
    }
}

/// Writes `bytes` and flushes, counting in `written` how many bytes the
/// stream accepted, also when a later write fails.
async fn write_counted<S>(stream: &mut S, bytes: &[u8], written: &mut usize) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    while *written < bytes.len() {
        let n = stream.write(&bytes[*written..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        *written += n;
    }
    stream.flush().await
}
