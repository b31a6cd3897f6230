//! The async Rust client on tokio: [`TicketBroker`].
//!
//! Every rule of the official client (request ids, reply matching,
//! Indeterminate, which attempts may be retried, conservative validity, the
//! 5 s release window, reconnect backoff) lives in
//! [`ticketing_core::client`], and so do the acquire and release loops
//! ([`run_acquire`], [`run_release`]) and the tickets; this module only moves
//! bytes between sockets and the core's [`Session`]s, reads the clock and
//! parks futures (it implements the core's [`Broker`]).
//!
//! Shape: one broker-wide [`BrokerState`] (sessions, router, pending-reply
//! map, release queue) behind a `std::sync::Mutex` that is never held
//! across an `.await`. Each endpoint has one task that connects, then runs a
//! reader and a driver (timeouts + writes) over the socket; a [`Notify`] per
//! endpoint wakes the driver after a submit, and the driver yields once
//! before taking the session's bytes, so the requests of every task ready
//! in that round leave in one write. A release worker drains the release
//! queue (dropped tickets, compensations).
//!
//! # Quick start
//!
//! ```no_run
//! use std::time::Duration;
//! use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};
//!
//! # async fn run() -> Result<(), ticketing_tokio::client::TicketError> {
//! let broker = TicketBroker::builder()
//!     .addrs(["127.0.0.1:5225"])
//!     .allow_loopback_no_auth()
//!     .connect()?;
//! broker.wait_ready(Duration::from_secs(5)).await;
//! let ticket = broker
//!     .acquire(
//!         "orders/42",
//!         Duration::from_secs(5),  // wait
//!         Duration::from_secs(30), // lease
//!         Duration::from_secs(2),  // minimum work budget
//!     )
//!     .await?;
//! // In one DB transaction: reject `ticket.token() <= high_water`, store the
//! // token as the new high water, do the business write, commit.
//! let _fencing_token = ticket.token();
//! assert_eq!(ticket.release().await?, ReleaseOutcome::Released);
//! broker.close().await;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tracing::{debug, warn};

use ticketing_core::client::{
    AcquireParams, Backoff, Broker, BrokerConfig, BrokerNotice, BrokerState, Grant, KeySet,
    Outcome, OutcomeSender, RELEASE_RETRY_WINDOW, Session, SessionConfig, WRITE_PROGRESS_TIMEOUT,
    run_acquire, run_release,
};
use ticketing_core::time::Instant;

use crate::serve::Clock;

pub use ticketing_core::client::{
    BrokerMode, ClientError as TicketError, DEFAULT_MAX_PENDING, DEFAULT_SILENCE_TIMEOUT,
    ReleaseOutcome, Ticket, TicketSet, TlsMode,
};

/// Size of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Releases the background worker runs at once.
const RELEASE_WORKERS_MAX: usize = 64;

// ---------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------

fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(message: impl fmt::Display) -> TicketError {
    TicketError::Io {
        kind: io::ErrorKind::InvalidInput,
        message: format!("TLS setup: {message}"),
    }
}

/// Builds the connector once, at [`TicketBrokerBuilder::connect`], so that a
/// bad CA file fails there rather than on every reconnect.
fn tls_connector(mode: &TlsMode) -> Result<Option<TlsConnector>, TicketError> {
    let builder = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?;
    let mut roots = rustls::RootCertStore::empty();
    match mode {
        TlsMode::Off => return Ok(None),
        TlsMode::InsecureSkipVerify => {
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SkipVerify(ring_provider())))
                .with_no_client_auth();
            return Ok(Some(TlsConnector::from(Arc::new(config))));
        }
        TlsMode::SystemRoots => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                // One unusable system certificate must not disable the rest.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(tls_error(
                    "no usable certificates in the system trust store",
                ));
            }
        }
        TlsMode::Ca(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            let certs = rustls_pemfile::certs(&mut &pem[..])
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(tls_error(format_args!(
                    "{}: no PEM certificates",
                    path.display()
                )));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            }
        }
    }
    let config = builder.with_root_certificates(roots).with_no_client_auth();
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// The verifier of [`TlsMode::InsecureSkipVerify`]: accepts any certificate
/// but still checks handshake signatures.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS server name of `host:port` or `[v6]:port` (validated by core).
fn server_name(addr: &str) -> Result<ServerName<'static>, TicketError> {
    let host = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => addr.rsplit_once(':').map_or(addr, |(host, _)| host),
    };
    ServerName::try_from(host.to_owned()).map_err(|_| tls_error("invalid server name"))
}

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

/// Configures a [`TicketBroker`]; see [`TicketBroker::builder`].
#[derive(Clone)]
pub struct TicketBrokerBuilder {
    config: BrokerConfig,
    tls: TlsMode,
}

impl fmt::Debug for TicketBrokerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketBrokerBuilder")
            .field("config", &self.config)
            .field("tls", &self.tls)
            .finish()
    }
}

impl TicketBrokerBuilder {
    /// Server addresses, `host:port` or `[v6]:port`. Single mode: exactly
    /// one (the broker keeps two connections to it). Cluster: 3 or 5, in
    /// slot order.
    pub fn addrs<I, S>(mut self, addrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.addrs = addrs.into_iter().map(Into::into).collect();
        self
    }
    /// The client token (at least 16 bytes), one of the server's
    /// `client_tokens`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.config.token = token.into();
        self
    }
    /// TLS mode (default [`TlsMode::Off`]).
    pub fn tls(mut self, tls: TlsMode) -> Self {
        self.tls = tls;
        self
    }
    /// Single server (default) or cluster.
    pub fn mode(mut self, mode: BrokerMode) -> Self {
        self.config.mode = mode;
        self
    }
    /// Bound on acquires in flight across the broker, 1..=16384 (default
    /// [`DEFAULT_MAX_PENDING`]).
    pub fn max_pending(mut self, pending_max: usize) -> Self {
        self.config.pending_max = pending_max;
        self
    }
    /// Allows the empty token against a server without authentication;
    /// only for IP loopback addresses.
    pub fn allow_loopback_no_auth(mut self) -> Self {
        self.config.allow_loopback_no_auth = true;
        self
    }
    /// The silence rule's bound, 100 ms..=300 s (default
    /// [`DEFAULT_SILENCE_TIMEOUT`], 3 s): a connection on which a request
    /// is overdue (an acquire past its wait plus this, a release past
    /// this) and no byte arrived for this long is closed, its requests end
    /// as on any lost connection (possibly sent → Indeterminate), and it
    /// reconnects.
    pub fn silence_timeout(mut self, silence_timeout: Duration) -> Self {
        self.config.silence_timeout = silence_timeout;
        self
    }
    /// Validates the configuration and starts connecting in the background
    /// (on the current tokio runtime). Errors: [`TicketError::InvalidInput`]
    /// for a bad address, token, mode or bound, or when called outside a
    /// tokio runtime; [`TicketError::Io`] for unusable TLS settings.
    pub fn connect(self) -> Result<TicketBroker, TicketError> {
        let endpoints = self.config.endpoints()?;
        let tls = tls_connector(&self.tls)?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            TicketError::InvalidInput("connect() must be called within a tokio runtime")
        })?;
        let server_names = match tls {
            Some(_) => endpoints
                .iter()
                .map(|endpoint| server_name(&endpoint.addr).map(Some))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![None; endpoints.len()],
        };
        let (closed_tx, closed_rx) = watch::channel(false);
        let inner = Arc::new(Inner {
            clock: Clock::start(),
            state: Mutex::new(State::new(endpoints.len(), self.config.pending_max)),
            wakes: endpoints.iter().map(|_| Notify::new()).collect(),
            ready_changed: Notify::new(),
            release_wake: Notify::new(),
            closing: AtomicBool::new(false),
            shutdown_tx: watch::channel(false).0,
            handles: AtomicUsize::new(1),
            closed_tx,
            closed_rx,
        });
        let mut tasks = Vec::with_capacity(endpoints.len() + 1);
        for ((index, endpoint), server_name) in endpoints.into_iter().enumerate().zip(server_names)
        {
            let link = Link {
                index,
                addr: endpoint.addr,
                session: endpoint.session,
                tls: tls.clone().zip(server_name),
            };
            tasks.push(handle.spawn(run_endpoint(Arc::clone(&inner), link)));
        }
        handle.spawn(run_release_worker(Arc::clone(&inner), tasks));
        Ok(TicketBroker { inner })
    }
}

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

/// Where one request's outcome goes.
struct OutcomeTx(oneshot::Sender<Outcome>);

impl OutcomeSender for OutcomeTx {
    fn send(self, outcome: Outcome) -> Result<(), Outcome> {
        self.0.send(outcome)
    }
}

type State = BrokerState<OutcomeTx>;

struct Inner {
    clock: Clock,
    state: Mutex<State>,
    /// Per endpoint: wakes its driver (bytes to send, deadline moved, close).
    wakes: Vec<Notify>,
    /// Some endpoint became ready or the broker is closing.
    ready_changed: Notify,
    /// The release queue has work, or the broker is closing.
    release_wake: Notify,
    closing: AtomicBool,
    /// Set once background releases are drained after a close: sessions
    /// close and endpoint tasks end.
    shutdown_tx: watch::Sender<bool>,
    /// Live [`TicketBroker`] handles; the last one dropped starts a close.
    handles: AtomicUsize,
    closed_tx: watch::Sender<bool>,
    closed_rx: watch::Receiver<bool>,
}

impl Inner {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves sessions in an unknown state;
        // continuing could hand out a lock twice, so poisoning propagates.
        self.state.lock().expect("client state poisoned")
    }

    /// No new acquires; background releases still run.
    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Connections are closing or closed.
    fn is_shut_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    fn start_close(&self) {
        if !self.closing.swap(true, Ordering::AcqRel) {
            self.release_wake.notify_one();
            self.ready_changed.notify_waiters();
        }
    }

    /// Queues a background release (dropped ticket or compensation).
    fn enqueue_release(&self, state: &mut State, now: Instant, keys: KeySet, token: u64) {
        state.enqueue_release(now, keys, token, &mut |notice| self.notice(notice));
    }

    /// Drains `index`'s session events into the router, the waiters and the
    /// release queue.
    fn dispatch(&self, state: &mut State, index: usize, now: Instant) {
        state.dispatch(index, now, &mut |notice| self.notice(notice));
    }

    /// Endpoint `index`'s transport is gone: its session and waiters hear
    /// it.
    fn transport_closed(&self, state: &mut State, index: usize, now: Instant) {
        state.transport_closed(index, now, &mut |notice| self.notice(notice));
    }

    /// Wakes and logs what the broker state reports.
    fn notice(&self, notice: BrokerNotice<'_>) {
        match notice {
            BrokerNotice::ReadyChanged => self.ready_changed.notify_waiters(),
            BrokerNotice::SessionClosed { index, reason } => {
                debug!(endpoint = index, %reason, "session closed");
            }
            BrokerNotice::Release { token, queued } => {
                if !queued {
                    warn!(
                        token,
                        "release queue full: the lock is left to its lease expiry"
                    );
                }
                self.release_wake.notify_one();
            }
        }
    }

    /// Submits one attempt on the connection the router picks and registers
    /// its waiter, all under one lock.
    fn attempt(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Attempt<'_>, TicketError> {
        if self.is_shut_down() || (acquire && self.is_closing()) {
            return Err(TicketError::Closed);
        }
        let now = self.now();
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        let (index, rid) = state.submit(now, acquire, submit, OutcomeTx(tx))?;
        drop(state);
        self.wakes[index].notify_one();
        Ok(Attempt {
            inner: self,
            index,
            rid,
            rx: Some(rx),
        })
    }

    async fn sleep_until(&self, at: Instant) {
        tokio::time::sleep_until(tokio::time::Instant::from_std(self.to_std(at))).await;
    }
}

/// One submitted request. Dropping it before its outcome arrives cancels
/// the request in the core: unsent → gone; possibly sent → the session is
/// closed (Indeterminate); a grant that already arrived → released.
struct Attempt<'a> {
    inner: &'a Inner,
    index: usize,
    rid: u64,
    rx: Option<oneshot::Receiver<Outcome>>,
}

impl Attempt<'_> {
    async fn outcome(mut self) -> Outcome {
        let rx = self.rx.as_mut().expect("outcome awaited once");
        // The sender is only dropped without a value if the broker state is
        // torn down; nothing definite is known then.
        let outcome = rx.await.unwrap_or(Outcome::Indeterminate);
        self.rx = None;
        outcome
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let now = self.inner.now();
        let mut state = self.inner.lock();
        if state.cancel(now, self.index, self.rid) {
            self.inner.dispatch(&mut state, self.index, now);
            drop(state);
            self.inner.wakes[self.index].notify_one();
        } else if let Ok(Outcome::Acquired(grant)) = rx.try_recv() {
            // Delivered but never seen by the caller.
            self.inner
                .enqueue_release(&mut state, now, grant.keys, grant.token);
        }
    }
}

// ---------------------------------------------------------------------------
// Endpoint tasks
// ---------------------------------------------------------------------------

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// What one endpoint task connects to.
struct Link {
    index: usize,
    addr: String,
    session: SessionConfig,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

async fn connect(link: &Link) -> io::Result<Box<dyn Stream>> {
    let tcp = TcpStream::connect(&link.addr).await?;
    tcp.set_nodelay(true)?;
    match &link.tls {
        None => Ok(Box::new(tcp)),
        Some((connector, name)) => Ok(Box::new(connector.connect(name.clone(), tcp).await?)),
    }
}

async fn run_endpoint(inner: Arc<Inner>, link: Link) {
    let index = link.index;
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let started = inner.now();
        inner.lock().sessions[index] = Some(Session::new(started, link.session.clone()));
        let handshake_deadline = tokio::time::Instant::from_std(
            inner.to_std(started.saturating_add(link.session.handshake_timeout)),
        );
        let connected = tokio::select! {
            connected = tokio::time::timeout_at(handshake_deadline, connect(&link)) => connected,
            // A close must not wait for a connect to an unreachable server.
            () = wait_shutdown(&inner) => break,
        };
        let delay = match connected {
            Ok(Ok(stream)) => {
                drive(&inner, index, stream).await;
                let session = inner.lock().sessions[index].take();
                let Some(delay) = backoff.after_ended(session.as_ref()) else {
                    warn!(addr = %link.addr, "authentication failed; not reconnecting");
                    return;
                };
                delay
            }
            result => {
                let why = match result {
                    Ok(Err(e)) => e.to_string(),
                    _ => "connect timed out".to_owned(),
                };
                debug!(addr = %link.addr, %why, "connect failed");
                let now = inner.now();
                let mut state = inner.lock();
                inner.transport_closed(&mut state, index, now);
                state.sessions[index] = None;
                backoff.after_connect_failure()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = wait_shutdown(&inner) => {}
        }
    }
}

/// Returns once connections are to close.
async fn wait_shutdown(inner: &Inner) {
    let mut rx = inner.shutdown_tx.subscribe();
    // An error means the sender is gone, which cannot happen while `inner`
    // lives; either way there is nothing left to wait for.
    let _ = rx.wait_for(|shutdown| *shutdown).await;
}

/// Runs one connected session until it or its transport ends: a reader
/// and a writer race, and whichever ends first ends both.
async fn drive(inner: &Inner, index: usize, stream: Box<dyn Stream>) {
    let (reader, writer) = tokio::io::split(stream);
    tokio::select! {
        _ = read_into_session(inner, index, reader) => {}
        _ = write_from_session(inner, index, writer) => {}
    }
    let now = inner.now();
    let mut state = inner.lock();
    inner.transport_closed(&mut state, index, now);
}

/// Feeds what arrives on `reader` to endpoint `index`'s session until the
/// stream or the session ends.
async fn read_into_session(inner: &Inner, index: usize, mut reader: impl AsyncRead + Unpin) {
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let now = inner.now();
        let mut state = inner.lock();
        let Some(session) = state.sessions[index].as_mut() else {
            return;
        };
        session.handle_input(now, &buf[..n]);
        let closed = session.is_closed();
        inner.dispatch(&mut state, index, now);
        drop(state);
        if closed {
            return;
        }
        // The input may have produced bytes to send (the proof) or moved
        // the deadline.
        inner.wakes[index].notify_one();
    }
}

/// Serves endpoint `index`'s deadlines and writes what its session has to
/// send, until the session ends or a write stalls.
async fn write_from_session(inner: &Inner, index: usize, mut writer: impl AsyncWrite + Unpin) {
    let mut out = Vec::new();
    // One timer for the session's deadlines, moved only when a deadline
    // comes earlier than the one it is set for: firing early is harmless
    // (the session then has nothing to do and names its next deadline),
    // and re-arming on every change of the earliest request deadline
    // would cost a timer-wheel update per batch.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    loop {
        let now = inner.now();
        let Some(deadline) = advance_session(inner, index, now, &mut out) else {
            return;
        };
        if !out.is_empty() {
            match tokio::time::timeout(WRITE_PROGRESS_TIMEOUT, writer.write_all(&out)).await {
                Ok(Ok(())) => out.clear(),
                _ => return,
            }
            continue;
        }
        if let Some(at) = deadline
            && armed.is_none_or(|armed| at < armed)
        {
            timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(inner.to_std(at)));
            armed = Some(at);
        }
        tokio::select! {
            () = &mut timer, if armed.is_some() => armed = None,
            () = inner.wakes[index].notified() => {
                // Let the other tasks that are ready now submit first,
                // so that their requests leave in this write.
                tokio::task::yield_now().await;
            }
        }
    }
}

/// One step of endpoint `index`'s session at `now`: a close if the broker
/// is shutting down, its timeouts, its bytes to send (into `out`), its
/// events. The session's next deadline, or `None` once it is gone or
/// closed.
fn advance_session(
    inner: &Inner,
    index: usize,
    now: Instant,
    out: &mut Vec<u8>,
) -> Option<Option<Instant>> {
    let mut state = inner.lock();
    let shutdown = inner.is_shut_down();
    let session = state.sessions[index].as_mut()?;
    if shutdown {
        session.close_local(now);
    }
    session.handle_timeout(now);
    session.poll_transmit(now, out);
    let closed = session.is_closed();
    let deadline = session.poll_timeout();
    inner.dispatch(&mut state, index, now);
    if closed {
        return None;
    }
    Some(deadline)
}

/// Runs queued background releases; on close, drains the queue (each
/// release keeps its own 5 s bound), then closes every session.
async fn run_release_worker(inner: Arc<Inner>, endpoints: Vec<tokio::task::JoinHandle<()>>) {
    let mut running = JoinSet::new();
    loop {
        let now = inner.now();
        let job = {
            let mut state = inner.lock();
            if running.len() < RELEASE_WORKERS_MAX {
                state.releases.pop(now)
            } else {
                None
            }
        };
        if let Some(job) = job {
            let inner = Arc::clone(&inner);
            running.spawn(async move {
                if let Err(e) = run_release(&*inner, job).await {
                    warn!(error = %e, "background release failed; the lease will expire");
                }
            });
            continue;
        }
        let idle = inner.lock().releases.is_empty() && running.is_empty();
        if inner.is_closing() && idle {
            break;
        }
        tokio::select! {
            _ = inner.release_wake.notified() => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    // Sessions see the shutdown in their driver and close locally: pending
    // requests end (unsent → Retry, possibly sent → Indeterminate).
    inner.shutdown_tx.send_replace(true);
    for wake in &inner.wakes {
        wake.notify_one();
    }
    for endpoint in endpoints {
        let _ = endpoint.await;
    }
    let _ = inner.closed_tx.send(true);
}

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// A distributed lock client: one shared handle per application (cheap to
/// clone). Keeps connections in the background and heals them by itself.
///
/// The last handle dropped starts the same close as [`TicketBroker::close`]
/// without waiting for it.
pub struct TicketBroker {
    inner: Arc<Inner>,
}

impl fmt::Debug for TicketBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketBroker")
            .field("closing", &self.inner.is_closing())
            .finish_non_exhaustive()
    }
}

impl Clone for TicketBroker {
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        TicketBroker {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Drop for TicketBroker {
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.start_close();
        }
    }
}

impl TicketBroker {
    /// A builder with no addresses, no token, TLS off, single mode.
    pub fn builder() -> TicketBrokerBuilder {
        TicketBrokerBuilder {
            config: BrokerConfig {
                addrs: Vec::new(),
                token: String::new(),
                mode: BrokerMode::Single,
                pending_max: DEFAULT_MAX_PENDING,
                allow_loopback_no_auth: false,
                silence_timeout: DEFAULT_SILENCE_TIMEOUT,
            },
            tls: TlsMode::Off,
        }
    }

    /// A broker for a server without authentication on IP loopback
    /// addresses.
    ///
    /// # Panics
    ///
    /// If the addresses are not valid loopback addresses or there is no
    /// tokio runtime; use [`TicketBroker::builder`] to get the error instead.
    pub fn connect_loopback<I, S>(addrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder()
            .addrs(addrs)
            .allow_loopback_no_auth()
            .connect()
            .expect("invalid loopback broker configuration")
    }

    /// Waits until some connection is ready; false if `timeout` passed, the
    /// broker is closing, or authentication failed.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.ready_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.inner.lock();
                if self.inner.is_closing() {
                    return false;
                }
                if (0..state.router.len()).any(|i| state.router.is_ready(i)) {
                    return true;
                }
                if state.router.auth_failed() {
                    return false;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// True once some connection failed authentication (wrong token, or not
    /// the configured server); that connection is not retried.
    pub fn auth_failed(&self) -> bool {
        self.inner.lock().router.auth_failed()
    }

    /// Acquires `key`, waiting at most `wait` in the server's FIFO queue
    /// (0 = one immediate try), for a lease of `lease` (1..=250 s).
    /// Sub-second values round up; out-of-range values are rejected, never
    /// clamped. The ticket is returned only if its conservative remaining
    /// lease covers `work_budget_min`.
    ///
    /// Enforce [`Ticket::token`] at the protected write. On
    /// [`TicketError::Indeterminate`] do not enter the critical section.
    /// Dropping the future after the request may have been sent closes that
    /// connection (it reconnects) and releases a grant that arrives.
    pub async fn acquire(
        &self,
        key: &str,
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(key)?;
        let params = AcquireParams::new(wait, lease, work_budget_min)?;
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(Ticket::new(Arc::clone(&self.inner), grant))
    }

    /// Acquires 1..=16 keys atomically under one token (duplicates are
    /// removed). Same times and rules as [`TicketBroker::acquire`].
    pub async fn acquire_set<S: AsRef<str>>(
        &self,
        keys: &[S],
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<TicketSet, TicketError> {
        let keys = KeySet::new(keys)?;
        let params = AcquireParams::new(wait, lease, work_budget_min)?;
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(TicketSet::new(Arc::clone(&self.inner), grant))
    }

    /// Stops taking requests, finishes queued background releases (each
    /// bounded by the 5 s release window), then closes every connection.
    /// Requests still in flight end as Indeterminate (possibly sent) or
    /// Closed. Idempotent.
    pub async fn close(&self) {
        self.inner.start_close();
        let mut rx = self.inner.closed_rx.clone();
        let drained = rx.wait_for(|closed| *closed);
        // The worker's own bounds end it within the window; this only
        // guards against a bug turning close into a hang.
        let bound = RELEASE_RETRY_WINDOW + WRITE_PROGRESS_TIMEOUT;
        if tokio::time::timeout(bound, drained).await.is_err() {
            warn!("broker close did not finish in time");
        }
    }
}

impl Broker for Inner {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn to_std(&self, at: Instant) -> std::time::Instant {
        self.clock.to_std(at)
    }
    fn submit(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<impl Future<Output = Outcome> + Send + '_, TicketError> {
        Ok(self.attempt(acquire, submit)?.outcome())
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_ {
        Inner::sleep_until(self, at)
    }
    fn release_in_background(&self, grant: Grant) {
        let now = self.now();
        let mut state = self.lock();
        self.enqueue_release(&mut state, now, grant.keys, grant.token);
    }
}
