//! The embedded server: a single-mode [`Server`] living inside the
//! application, driven on smol, reachable in-process (no sockets) and,
//! optionally, over TCP or TLS by any v3 client.
//!
//! Shape: one [`Server`] in the hub (the private `hub` module), behind a
//! `std::sync::Mutex` never held across an `.await`. Every connection is a
//! *peer* of the hub:
//!
//! - a socket peer has one task and one wake-up; after every input the
//!   task that fed the core drains [`Machine::poll_output`] and notifies the
//!   woken peers (the serve loop of `ticketing-tokio`, ported to async-io);
//!   that is this module;
//! - a memory peer is one connection of an in-process [`TicketBroker`]: the
//!   core client [`Session`](ticketing_core::client::Session) of that broker
//!   and this server's connection exchange the very same protocol bytes,
//!   shuttled in memory by the hub instead of a socket (the broker's side
//!   is in [`crate::client`]).
//!
//! One timer task sleeps until [`Machine::poll_timeout`]; an input that moves
//! the deadline earlier notifies it.
//!
//! Module arrows run one way: `embedded` → `client` → `hub`, `embedded` →
//! `hub`; `tls` and `sync` are leaves.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_io::{Async, Timer};
use futures_rustls::TlsAcceptor;
use smol::Task;
use smol::future;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use ticketing_core::auth::ClientTokens;
use ticketing_core::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, ListingCursor, LockListing, LockView,
};
use ticketing_core::machine::Machine;
use ticketing_core::reserve::{DEFAULT_RESERVE_STEP, TokenAlert, TokenReserve};
use ticketing_core::server::{self, ConnId, ConnState, Server, ServerConfig, ServerStats};
use ticketing_core::time::Instant;
use ticketing_core::wire::Key;

use crate::client::{self, TicketBroker, TicketError};
use crate::hub::{Hub, Peer, fresh_nonce};
use crate::state::FloorFile;
use crate::sync::{Clock, Notify, sleep_until_opt};

/// First size of a socket peer's read buffer; most never need more.
const READ_BUF_START_BYTES: usize = 4 * 1024;
/// The read buffer doubles when a read fills it, up to this.
const READ_BUF_MAX_BYTES: usize = 64 * 1024;
/// A write buffer that grew past this (a burst of replies) is given back.
const WRITE_BUF_KEEP_BYTES: usize = 1 << 20;
/// Pause after an accept error such as EMFILE, so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// Default for [`EmbeddedServerBuilder::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

/// Configures an [`EmbeddedServer`]; see [`EmbeddedServer::builder`].
#[derive(Clone)]
pub struct EmbeddedServerBuilder {
    config: ServerConfig,
    tokens: Vec<String>,
    listen: Option<SocketAddr>,
    tls: Option<Arc<rustls::ServerConfig>>,
    insecure_no_auth: bool,
    shutdown_grace: Duration,
    state_dir: Option<PathBuf>,
}

impl fmt::Debug for EmbeddedServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedServerBuilder")
            .field("config", &self.config)
            .field("tokens", &self.tokens.len())
            .field("listen", &self.listen)
            .field("tls", &self.tls.is_some())
            .field("insecure_no_auth", &self.insecure_no_auth)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

impl EmbeddedServerBuilder {
    /// The core's settings: lock limits, wait margin, connection limits.
    /// Its `client_tokens` are replaced by [`Self::client_tokens`].
    pub fn server_config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }
    /// Accepted client tokens (each at least 16 bytes; several = rotation).
    /// In-process handles authenticate with the first. None (the default):
    /// only the empty token, which a TCP listener allows on loopback only.
    pub fn client_tokens<I, S>(mut self, tokens: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tokens = tokens.into_iter().map(Into::into).collect();
        self
    }
    /// Also accept TCP connections on `addr` (port 0 picks a free port; see
    /// [`EmbeddedServer::local_addr`]). Off by default: in-process only.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }
    /// TLS on the listener (rustls, ring provider); see
    /// [`crate::tls::server_config`].
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }
    /// Allows listening beyond loopback without client tokens: anyone who
    /// can reach the port can take and release locks.
    pub fn insecure_no_auth(mut self) -> Self {
        self.insecure_no_auth = true;
        self
    }
    /// How long [`EmbeddedServer::shutdown`] waits for connections to take
    /// their last replies before it drops them (default 2 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Keeps fencing tokens rising across restarts of the application
    /// whatever the wall clock does: the server stores a token reserve in
    /// a small file in `dir` (created if missing; one file per listen
    /// address, `embedded.floor` without a listener, locked against a
    /// second server) and never issues a token above what it stored (see
    /// `docs/operations.md`, "State directory and the token floor"). Off by
    /// default: tokens then start from the wall clock alone.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Starts the server: binds the listener if one was asked for and spawns
    /// the driver tasks on smol's global executor. Does not need to run
    /// inside an executor.
    ///
    /// Errors: [`io::ErrorKind::InvalidInput`] for a token shorter than 16
    /// bytes or a non-loopback listener without tokens (unless
    /// [`Self::insecure_no_auth`]); the bind error otherwise; with
    /// [`Self::state_dir`], an error naming `state_dir` and the path when
    /// the folder or its file cannot be used.
    pub fn start(self) -> io::Result<EmbeddedServer> {
        let mut config = self.config;
        config.client_tokens = ClientTokens::new(&self.tokens).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("client token: {e}"))
        })?;
        if let Some(addr) = self.listen
            && self.tokens.is_empty()
            && !addr.ip().is_loopback()
            && !self.insecure_no_auth
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "listening beyond loopback needs client tokens (or insecure_no_auth)",
            ));
        }
        let listener = match self.listen {
            Some(addr) => Some(Async::<TcpListener>::bind(addr)?),
            None => None,
        };
        let local_addr = listener
            .as_ref()
            .map(|listener| listener.get_ref().local_addr())
            .transpose()?;

        let clock = Clock::start();
        let now = clock.now();
        let (server, floor_file) = match &self.state_dir {
            Some(dir) => {
                let name = match local_addr {
                    Some(addr) => format!("embedded-{}.floor", addr.to_string().replace(':', "_")),
                    None => "embedded.floor".to_owned(),
                };
                let (file, stored) = FloorFile::open(dir, &name)?;
                let first = server::first_token(wall_clock(), stored);
                let mut reserve = TokenReserve::new(DEFAULT_RESERVE_STEP, stored);
                // The first reserve is durable before anything is served.
                if let Some(value) = reserve.poll_persist(now, first) {
                    file.write(value)?;
                    reserve.handle_persisted(value);
                }
                let server = Server::new(config, first, now).with_token_reserve(now, reserve);
                (server, Some(file))
            }
            None => (Server::new(config, first_token(), now), None),
        };
        let persist = floor_file.as_ref().map(|_| Arc::new(Notify::new()));
        let hub = Arc::new(Hub::new(
            server,
            clock,
            persist.clone(),
            self.tls.map(TlsAcceptor::from),
            self.tokens.into_iter().next().unwrap_or_default(),
        ));
        let timer = smol::spawn(run_timer(Arc::clone(&hub)));
        let persister = floor_file
            .zip(persist)
            .map(|(file, persist)| smol::spawn(run_persister(Arc::clone(&hub), file, persist)));
        let acceptor =
            listener.map(|listener| smol::spawn(accept_loop(Arc::clone(&hub), listener)));
        Ok(EmbeddedServer {
            hub,
            brokers: Arc::new(Mutex::new(Vec::new())),
            local_addr,
            tasks: Some(Tasks {
                timer,
                acceptor,
                persister,
            }),
            shutdown_grace: self.shutdown_grace,
        })
    }
}

// ---------------------------------------------------------------------------
// Public handle
// ---------------------------------------------------------------------------

/// The in-process brokers of a server, held weakly.
type Brokers = Arc<Mutex<Vec<client::Weak>>>;

struct Tasks {
    timer: Task<()>,
    acceptor: Option<Task<Vec<Task<()>>>>,
    persister: Option<Task<()>>,
}

/// A Ticketing server inside this process: FIFO handoff, leases, bounded
/// waits, fencing tokens and key sets, with no daemon to deploy.
///
/// [`EmbeddedServer::broker`] gives in-process [`TicketBroker`]s (no
/// sockets); with [`EmbeddedServerBuilder::listen`] other processes reach
/// the same locks with any v3 client.
///
/// Dropping it starts the same shutdown as [`EmbeddedServer::shutdown`]
/// without waiting for it.
///
/// ```
/// use std::time::Duration;
/// use ticketing_smol::{EmbeddedServer, ReleaseOutcome};
///
/// smol::block_on(async {
///     let server = EmbeddedServer::builder().start().unwrap();
///     let broker = server.broker();
///     let ticket = broker
///         .acquire("orders/42", Duration::from_secs(5), Duration::from_secs(30), Duration::from_secs(1))
///         .await
///         .unwrap();
///     assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
///     server.shutdown().await;
/// });
/// ```
pub struct EmbeddedServer {
    hub: Arc<Hub>,
    /// In-process brokers, told when the server is gone.
    brokers: Brokers,
    local_addr: Option<SocketAddr>,
    tasks: Option<Tasks>,
    shutdown_grace: Duration,
}

impl fmt::Debug for EmbeddedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedServer")
            .field("local_addr", &self.local_addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl EmbeddedServer {
    /// A builder: default limits, no tokens, in-process only.
    pub fn builder() -> EmbeddedServerBuilder {
        EmbeddedServerBuilder {
            config: ServerConfig::default(),
            tokens: Vec::new(),
            listen: None,
            tls: None,
            insecure_no_auth: false,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            state_dir: None,
        }
    }

    /// An in-process broker: the same [`TicketBroker`] type and behaviour
    /// as the network client, its connections being in-memory links to
    /// this server. Cheap; it is ready at once.
    pub fn broker(&self) -> TicketBroker {
        let owner = self.hub.next_owner.fetch_add(1, Ordering::Relaxed);
        let broker = client::in_process(Arc::clone(&self.hub), owner);
        let mut brokers = self.brokers.lock().expect("broker list poisoned");
        // Dropped brokers are forgotten here, so the list stays as long as
        // the number of live ones.
        brokers.retain(|weak| weak.strong_count() > 0);
        brokers.push(broker.downgrade());
        drop(brokers);
        if self.hub.stopping.load(Ordering::Acquire) {
            broker.server_gone();
        }
        broker
    }

    /// The TCP address actually bound, if listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The core's current counts (connections include in-process links).
    pub fn stats(&self) -> ServerStats {
        self.hub.lock().server.stats()
    }

    /// The next token alert (a failed state-file write, a used-up token
    /// reserve) for the application to log; see [`Self::stats`] for the
    /// counts. Only a server with [`EmbeddedServerBuilder::state_dir`] has
    /// any.
    pub fn poll_token_alert(&self) -> Option<TokenAlert> {
        self.hub.lock().kept.alerts.pop_front()
    }

    /// One page of the keys starting with `prefix` that are held or
    /// waited on now, going on from `cursor` ([`ListingCursor::START`] for
    /// the first page; each page's [`LockListing::next`] for the next):
    /// at most `limit` (capped at
    /// [`ticketing_core::inspect::LISTING_LIMIT_MAX`]) holders with their
    /// whole group, ages and connections, waiters in queue order,
    /// ascending within the page. Each call examines a bounded part of
    /// the table, so it never holds up the lock path for long.
    pub fn locks(&self, prefix: &str, limit: usize, cursor: ListingCursor) -> LockListing {
        let inner = self.hub.lock();
        inner
            .server
            .inspect_locks(self.hub.clock.now(), prefix.as_bytes(), limit, cursor)
    }

    /// The server's recent events, the most recent first (at most
    /// [`ticketing_core::events::EVENTS_MAX`]): force-releases, leases
    /// that ran out while somebody waited, and refused connections counted
    /// per reason per interval; what the daemon serves as `/v1/events`.
    pub fn recent_events(&self) -> Vec<ticketing_core::events::EventView> {
        let inner = self.hub.lock();
        inner.server.recent_events(self.hub.clock.now())
    }

    /// `key` as an operator sees it now; `None` when it is neither held nor
    /// waited on. [`TicketError::InvalidInput`] for a key that is not one.
    pub fn lock(&self, key: &str) -> Result<Option<LockView>, TicketError> {
        let key = parse_key(key)?;
        let inner = self.hub.lock();
        Ok(inner.server.inspect_lock(self.hub.clock.now(), &key))
    }

    /// Force-releases `key` (only while `token` holds it, when given):
    /// exactly a release by its holder, so the key goes to its front
    /// waiter under a new, larger token and the old holder's release gets
    /// [`ReleaseOutcome::AlreadyGoneOrNotCurrent`](crate::ReleaseOutcome::AlreadyGoneOrNotCurrent); a
    /// set is released whole. [`TicketError::InvalidInput`] for a key that
    /// is not one.
    pub fn force_release(
        &self,
        key: &str,
        token: Option<u64>,
    ) -> Result<ForceReleaseOutcome, TicketError> {
        let key = parse_key(key)?;
        let mut inner = self.hub.lock();
        let now = self.hub.clock.now();
        let id = AdminRequestId(self.hub.next_admin_id.fetch_add(1, Ordering::Relaxed));
        inner
            .server
            .handle_force_release(now, id, ForceRelease { key, token });
        // Hands the grant of a hand-over to its waiter's link, and keeps
        // the answer: single mode answers at once, under this same lock.
        inner.dispatch(&self.hub.timer, None, None);
        let mut outcome = ForceReleaseOutcome::Indeterminate;
        inner.kept.admin_answers.retain(|(answered, answer)| {
            if *answered == id {
                outcome = answer.clone();
            }
            *answered != id
        });
        Ok(outcome)
    }

    /// Stops accepting; every queued acquire is answered `T` (Timeout),
    /// every connection, in-process or not, gets its replies and is closed
    /// (those that do not take them within the shutdown grace are dropped);
    /// in-process brokers then fail new calls with `Closed`. Returns when
    /// the driver tasks are done.
    pub async fn shutdown(mut self) {
        if let Some(tasks) = self.tasks.take() {
            shutdown(
                Arc::clone(&self.hub),
                Arc::clone(&self.brokers),
                tasks,
                self.shutdown_grace,
            )
            .await;
        }
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        if let Some(tasks) = self.tasks.take() {
            smol::spawn(shutdown(
                Arc::clone(&self.hub),
                Arc::clone(&self.brokers),
                tasks,
                self.shutdown_grace,
            ))
            .detach();
        }
    }
}

async fn shutdown(hub: Arc<Hub>, brokers: Brokers, tasks: Tasks, grace: Duration) {
    hub.stopping.store(true, Ordering::Release);
    hub.stop.notify_one();
    let conn_tasks = match tasks.acceptor {
        Some(acceptor) => acceptor.await,
        None => Vec::new(),
    };
    {
        let mut inner = hub.lock();
        let now = hub.clock.now();
        inner.server.begin_shutdown(now);
        inner.dispatch(&hub.timer, None, None);
    }
    // Every peer now holds its last replies; wait until they took them.
    let drained = future::or(
        async {
            loop {
                let listener = hub.peers_changed.listen();
                if hub.lock().peers.is_empty() {
                    return true;
                }
                listener.await;
            }
        },
        async {
            Timer::after(grace).await;
            false
        },
    )
    .await;
    // Dropping a task cancels it; its guard tells the core.
    drop(conn_tasks);
    if !drained {
        let mut inner = hub.lock();
        let now = hub.clock.now();
        let stuck: Vec<ConnId> = inner.peers.keys().copied().collect();
        for conn in stuck {
            inner.peers.remove(&conn);
            inner.server.handle_closed(now, conn);
        }
    }
    let brokers = std::mem::take(&mut *brokers.lock().expect("broker list poisoned"));
    for broker in brokers.iter().filter_map(client::Weak::upgrade) {
        broker.server_gone();
    }
    drop(tasks.timer);
    // The persister finishes a write in flight and returns, closing the
    // state file (and its lock) before shutdown returns: a server started
    // right after on the same state dir must find it free.
    let persist = hub.lock().persist.clone();
    if let (Some(persister), Some(persist)) = (tasks.persister, persist) {
        persist.notify_one();
        persister.await;
    }
}

/// Writes the reserve values the core asks for, one at a time, off the
/// executor's threads, and tells the core how each write went.
async fn run_persister(hub: Arc<Hub>, file: FloorFile, persist: Arc<Notify>) {
    let file = Arc::new(file);
    loop {
        persist.notified().await;
        if hub.stopping.load(Ordering::Acquire) {
            return;
        }
        let Some(value) = hub.lock().kept.reserve_request.take() else {
            continue;
        };
        let writer = Arc::clone(&file);
        let result = smol::unblock(move || writer.write(value)).await;
        let mut inner = hub.lock();
        let now = hub.clock.now();
        match result {
            Ok(()) => inner.server.handle_reserve_persisted(now, value),
            Err(_) => inner.server.handle_reserve_failed(now),
        }
        inner.dispatch(&hub.timer, None, None);
    }
}

/// The core's [`server::first_token`] at the wall-clock time now, with no
/// state file.
fn first_token() -> u64 {
    server::first_token(wall_clock(), None)
}

fn parse_key(key: &str) -> Result<Key, TicketError> {
    Key::new(key.as_bytes())
        .map_err(|_| TicketError::InvalidInput("a key is 1..=128 bytes without space, CR or LF"))
}

fn wall_clock() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

// ---------------------------------------------------------------------------
// Timer
// ---------------------------------------------------------------------------

/// Sleeps until the core's next deadline, then hands it the time.
async fn run_timer(hub: Arc<Hub>) {
    loop {
        let deadline = {
            let mut inner = hub.lock();
            let deadline = inner.server.poll_timeout();
            inner.timer_target_micros = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        let fired = future::or(
            async {
                sleep_until_opt(hub.clock, deadline).await;
                true
            },
            async {
                hub.timer.notified().await;
                false
            },
        )
        .await;
        if fired {
            let mut inner = hub.lock();
            let now = hub.clock.now();
            inner.server.handle_timeout(now);
            inner.dispatch(&hub.timer, None, None);
        }
    }
}

// ---------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------

/// Accepts connections until asked to stop; returns the connection tasks.
async fn accept_loop(hub: Arc<Hub>, listener: Async<TcpListener>) -> Vec<Task<()>> {
    let mut conns: Vec<Task<()>> = Vec::new();
    loop {
        let accepted = future::or(
            async {
                hub.stop.notified().await;
                None
            },
            async { Some(listener.accept().await) },
        )
        .await;
        match accepted {
            None => return conns,
            Some(Ok((tcp, peer))) => {
                // Reaped here, so a stream of short connections cannot pile
                // up finished tasks; at most `connections_max` live.
                conns.retain(|task| !task.is_finished());
                conns.push(smol::spawn(run_connection(Arc::clone(&hub), tcp, peer)));
                // One accept per turn: `accept` returns at once while
                // connections are queued, so without this the loop would
                // start a task for the whole queue before any of them
                // registered and sent its hello, and the handshake budget
                // would then drop a client registered early in the batch
                // for the ones behind it before its hello left.
                future::yield_now().await;
            }
            Some(Err(_)) => {
                Timer::after(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// Closes the core's side of a socket peer however its task ends (return,
/// error, or cancellation at shutdown).
struct ConnGuard {
    hub: Arc<Hub>,
    conn: ConnId,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        // Not `Hub::lock`: panicking again inside a drop would abort.
        if let Ok(mut inner) = self.hub.inner.lock() {
            let now = self.hub.clock.now();
            inner.remove_peer(now, self.conn, &self.hub.peers_changed);
            inner.dispatch(&self.hub.timer, None, None);
        }
    }
}

async fn run_connection(hub: Arc<Hub>, tcp: Async<TcpStream>, peer: SocketAddr) {
    // Replies are small and latency-bound; batching is done by us, not Nagle.
    let _ = tcp.get_ref().set_nodelay(true);
    let Some(nonce) = fresh_nonce() else {
        return;
    };
    let waker = Arc::new(Notify::new());
    let conn = {
        let mut inner = hub.lock();
        let now = hub.clock.now();
        let Some(conn) = inner.server.handle_connect(now, nonce, peer.ip()) else {
            return;
        };
        inner.peers.insert(conn, Peer::Socket(Arc::clone(&waker)));
        if inner.dispatch(&hub.timer, Some(conn), None) {
            waker.notify_one();
        }
        conn
    };
    let guard = ConnGuard {
        hub: Arc::clone(&hub),
        conn,
    };
    let _ = match &hub.tls {
        None => drive(&guard, &waker, tcp, Vec::new()).await,
        Some(acceptor) => accept_tls(&guard, &waker, acceptor.clone(), tcp).await,
    };
}

/// Runs the TLS handshake, then the connection. The core's handshake
/// deadline also closes a client that stalls in TLS; what the core queues
/// meanwhile is kept and written once TLS is up.
async fn accept_tls(
    guard: &ConnGuard,
    waker: &Notify,
    acceptor: TlsAcceptor,
    tcp: Async<TcpStream>,
) -> io::Result<()> {
    let mut out = Vec::new();
    let mut accept = std::pin::pin!(acceptor.accept(tcp));
    loop {
        let accepted = future::or(async { Some((&mut accept).await) }, async {
            waker.notified().await;
            None
        })
        .await;
        match accepted {
            Some(stream) => return drive(guard, waker, stream?, out).await,
            None => {
                let state = guard.hub.lock().server.poll_transmit(guard.conn, &mut out);
                if state != ConnState::Open {
                    return Ok(());
                }
            }
        }
    }
}

/// What woke a socket peer's loop.
enum Woken {
    Notified,
    Read(io::Result<usize>),
}

/// The connection loop: read → core, core → write.
async fn drive<S>(
    guard: &ConnGuard,
    waker: &Notify,
    mut stream: S,
    mut out: Vec<u8>,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let hub = &*guard.hub;
    let conn = guard.conn;
    let mut read_buf = vec![0u8; READ_BUF_START_BYTES];
    let mut reading = true;
    // Bytes taken before the transport was up (TLS) go out first.
    if !out.is_empty() {
        waker.notify_one();
    }
    loop {
        let woken = match next_event(waker, &mut stream, &mut read_buf, reading).await {
            Woken::Notified => true,
            Woken::Read(read) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                let mine = feed_input(hub, conn, &read_buf[..n], &mut reading);
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
        // wake-up run first, so a grant their input hands to this
        // connection leaves in this write (as the tokio driver does).
        future::yield_now().await;
        let state = take_batch(hub, conn, &mut out, &mut reading);
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
        report_written(hub, waker, conn, written, &mut reading);
        result?;
        if state == ConnState::CloseAfterFlush {
            // The guard reports the close once the stream is shut down.
            let _ = stream.close().await;
            return Ok(());
        }
    }
}

/// Waits for our wake or for input (only while the core wants input).
async fn next_event<S>(waker: &Notify, stream: &mut S, read_buf: &mut [u8], reading: bool) -> Woken
where
    S: AsyncRead + Unpin,
{
    if !reading {
        waker.notified().await;
        return Woken::Notified;
    }
    future::or(
        async {
            waker.notified().await;
            Woken::Notified
        },
        async { Woken::Read(stream.read(read_buf).await) },
    )
    .await
}

/// Hands bytes read from `conn` to the core; true if `conn` itself was
/// woken. `reading` becomes whether the core wants more input.
fn feed_input(hub: &Hub, conn: ConnId, bytes: &[u8], reading: &mut bool) -> bool {
    let mut inner = hub.lock();
    let now = hub.clock.now();
    inner.server.handle_input(now, conn, bytes);
    let mine = inner.dispatch(&hub.timer, Some(conn), None);
    *reading = inner.server.wants_input(conn);
    mine
}

/// Takes everything pending for `conn` in one batch.
fn take_batch(hub: &Hub, conn: ConnId, out: &mut Vec<u8>, reading: &mut bool) -> ConnState {
    let mut inner = hub.lock();
    let state = inner.server.poll_transmit(conn, out);
    *reading = inner.server.wants_input(conn);
    state
}

/// Reports what went out, even when the write failed part way: a grant
/// whose frame left whole may be in the client's hands.
fn report_written(hub: &Hub, waker: &Notify, conn: ConnId, written: usize, reading: &mut bool) {
    let mut inner = hub.lock();
    let now = hub.clock.now();
    inner.server.handle_written(now, conn, written);
    if inner.dispatch(&hub.timer, Some(conn), None) {
        waker.notify_one();
    }
    *reading = inner.server.wants_input(conn);
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
