//! The tokio driver of the single-mode [`Server`]: sockets, TLS, the clock
//! and the timer. Every decision is the core's; this module only moves bytes
//! and instants between the two.
//!
//! Shape: one [`Server`] behind a `std::sync::Mutex`, never held across an
//! `.await`. Each connection has one task and one [`Notify`] registered under
//! its [`ConnId`]; after every input the task that fed it drains
//! [`Server::poll_wake`] and notifies the woken connections (its own wake is
//! served inline, without a round trip through its `Notify`). One timer task
//! sleeps until [`Server::poll_timeout`]; an input that makes the deadline
//! earlier notifies it.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, error, info, warn};

use ticketing_core::server::{ConnId, ConnState, Server, ServerConfig, ServerStats};
use ticketing_core::time::Instant;

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
}

impl ServeSettings {
    /// Default core configuration (no auth), no TLS, on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        ServeSettings {
            listen,
            server: ServerConfig::default(),
            tls: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// A server running on the current tokio runtime. Dropping it starts the same
/// shutdown as [`RunningServer::shutdown`] without waiting for it.
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The core's current counts.
    pub fn stats(&self) -> ServerStats {
        self.shared.lock().server.stats()
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
pub async fn spawn_server(settings: ServeSettings) -> io::Result<RunningServer> {
    let listener = TcpListener::bind(settings.listen).await?;
    let local_addr = listener.local_addr()?;
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

    let clock = Clock::start();
    let server = Server::new(settings.server, first_token(), clock.now());
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            server,
            wakers: HashMap::new(),
            timer_target_micros: u64::MAX,
        }),
        clock,
        timer: Notify::new(),
        stop: Notify::new(),
        tls,
    });
    let timer = tokio::spawn(run_timer(Arc::clone(&shared)));
    let supervisor = tokio::spawn(supervise(
        Arc::clone(&shared),
        listener,
        timer,
        settings.shutdown_grace,
    ));
    Ok(RunningServer {
        local_addr,
        shared,
        supervisor: Some(supervisor),
    })
}

/// By our rule the token counter starts at the bootstrap wall-clock time in
/// microseconds since the Unix epoch, so a restarted server issues tokens
/// above those it issued before.
fn first_token() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(since_epoch.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The driver's monotonic clock: core instants are microseconds since
/// `origin`.
#[derive(Debug)]
struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    fn start() -> Self {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// The tokio instant of a core instant; `None` if it is beyond what the
    /// platform clock can represent (never, in practice).
    fn to_tokio(&self, at: Instant) -> Option<tokio::time::Instant> {
        self.origin
            .checked_add(Duration::from_micros(at.as_micros()))
            .map(tokio::time::Instant::from_std)
    }
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    clock: Clock,
    /// Wakes the timer task when its deadline may have moved earlier.
    timer: Notify,
    /// Asks the supervisor to shut down.
    stop: Notify,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic inside the core leaves its state unknown; serving on from
        // it could break mutual exclusion, so every task stops instead.
        self.inner
            .lock()
            .expect("server state poisoned by an earlier panic")
    }
}

struct Inner {
    server: Server,
    /// The task to notify for each open connection.
    wakers: HashMap<ConnId, Arc<Notify>>,
    /// The deadline the timer task sleeps until, `u64::MAX` for none.
    timer_target_micros: u64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("connections", &self.wakers.len())
            .field("timer_target_micros", &self.timer_target_micros)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Drains the core's wakes after an input: notifies every woken
    /// connection but `me` and says whether `me` was woken. Then tells the
    /// timer if the input made the next deadline earlier.
    fn dispatch(&mut self, timer: &Notify, me: Option<ConnId>) -> bool {
        let mut mine = false;
        while let Some(conn) = self.server.poll_wake() {
            if Some(conn) == me {
                mine = true;
            } else if let Some(waker) = self.wakers.get(&conn) {
                waker.notify_one();
            }
            // A wake for a connection without a waker is for one that is
            // being closed right now; its task is already finishing.
        }
        let deadline = self
            .server
            .poll_timeout()
            .map_or(u64::MAX, Instant::as_micros);
        if deadline < self.timer_target_micros {
            self.timer_target_micros = deadline;
            timer.notify_one();
        }
        mine
    }
}

/// Sleeps until the core's next deadline, then hands it the time.
async fn run_timer(shared: Arc<Shared>) {
    loop {
        let deadline = {
            let mut inner = shared.lock();
            let deadline = inner.server.poll_timeout();
            inner.timer_target_micros = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        match deadline.and_then(|at| shared.clock.to_tokio(at)) {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        let mut inner = shared.lock();
                        let now = shared.clock.now();
                        inner.server.handle_timeout(now);
                        inner.dispatch(&shared.timer, None);
                    }
                    () = shared.timer.notified() => {}
                }
            }
            None => shared.timer.notified().await,
        }
    }
}

/// Accepts connections until asked to stop, then shuts down.
async fn supervise(
    shared: Arc<Shared>,
    listener: TcpListener,
    timer: JoinHandle<()>,
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
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    conns.spawn(run_connection(Arc::clone(&shared), tcp, peer));
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
        }
    }
    drop(listener);
    info!(
        connections = conns.len(),
        "shutting down: flushing and closing connections"
    );
    {
        let mut inner = shared.lock();
        let now = shared.clock.now();
        inner.server.begin_shutdown(now);
        inner.dispatch(&shared.timer, None);
    }
    let drained = tokio::time::timeout(grace, async {
        while let Some(done) = conns.join_next().await {
            log_task_end(done);
        }
    })
    .await;
    if drained.is_err() {
        warn!(
            connections = conns.len(),
            "connections did not close within {grace:?}; dropping them"
        );
        conns.shutdown().await;
    }
    timer.abort();
    info!("shutdown complete");
}

fn log_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        error!("connection task panicked: {e}");
    }
}

/// Closes the core's side of a connection however its task ends (return,
/// error, panic or abort at shutdown).
struct ConnGuard {
    shared: Arc<Shared>,
    conn: ConnId,
    peer: SocketAddr,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        // Not `Shared::lock`: panicking again inside a drop would abort.
        if let Ok(mut inner) = self.shared.inner.lock() {
            inner.wakers.remove(&self.conn);
            let now = self.shared.clock.now();
            inner.server.handle_closed(now, self.conn);
            inner.dispatch(&self.shared.timer, None);
        }
        debug!(peer = %self.peer, conn = self.conn.0, "connection closed");
    }
}

async fn run_connection(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr) {
    // Replies are small and latency-bound; batching is done by us, not Nagle.
    if let Err(e) = tcp.set_nodelay(true) {
        debug!(%peer, "set_nodelay failed: {e}");
    }
    let mut nonce = [0u8; 16];
    if let Err(e) = getrandom::fill(&mut nonce) {
        error!(%peer, "no nonce from the OS random source, closing: {e}");
        return;
    }
    let waker = Arc::new(Notify::new());
    let conn = {
        let mut inner = shared.lock();
        let now = shared.clock.now();
        let Some(conn) = inner.server.handle_connect(now, nonce) else {
            debug!(%peer, "connection refused by the server (limit or shutdown)");
            return;
        };
        inner.wakers.insert(conn, Arc::clone(&waker));
        if inner.dispatch(&shared.timer, Some(conn)) {
            waker.notify_one();
        }
        conn
    };
    debug!(%peer, conn = conn.0, "connection opened");
    let guard = ConnGuard {
        shared: Arc::clone(&shared),
        conn,
        peer,
    };
    let result = match &shared.tls {
        None => drive(&guard, &waker, tcp, Vec::new()).await,
        Some(tls) => accept_tls(&guard, &waker, TlsAcceptor::from(Arc::clone(tls)), tcp).await,
    };
    if let Err(e) = result {
        debug!(%peer, conn = conn.0, "connection error: {e}");
    }
}

/// Runs the TLS handshake, then the connection. The core already counts the
/// connection (limit) and runs its handshake deadline, which closes a client
/// that stalls in TLS as well; what the core queues meanwhile is kept and
/// written once TLS is up.
async fn accept_tls(
    guard: &ConnGuard,
    waker: &Notify,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
) -> io::Result<()> {
    let mut out = Vec::new();
    let accept = acceptor.accept(tcp);
    tokio::pin!(accept);
    loop {
        tokio::select! {
            accepted = &mut accept => {
                let stream = accepted?;
                return drive(guard, waker, stream, out).await;
            }
            () = waker.notified() => {
                let state = guard.shared.lock().server.take_transmit(guard.conn, &mut out);
                if state != ConnState::Open {
                    return Ok(());
                }
            }
        }
    }
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
                inner.server.handle_input(now, conn, &read_buf[..n]);
                let mine = inner.dispatch(&shared.timer, Some(conn));
                reading = inner.server.wants_input(conn);
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

        // Take everything pending in one batch.
        let state = {
            let mut inner = shared.lock();
            let state = inner.server.take_transmit(conn, &mut out);
            reading = inner.server.wants_input(conn);
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
            inner.server.handle_written(now, conn, written);
            if inner.dispatch(&shared.timer, Some(conn)) {
                waker.notify_one();
            }
            reading = inner.server.wants_input(conn);
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
