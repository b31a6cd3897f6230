//! Connections: one task per connection (accepted or dialed) that moves
//! bytes between its stream and the core, and the guard that tells the
//! core when it ends.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tracing::{debug, error};

use ticketing_core::auth::NONCE_LEN;
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::time::Instant;

use super::shared::Shared;
use super::supervise::OpenFn;

/// First size of a connection's read buffer; most connections never need
/// more, so 10 000 idle connections cost 40 MiB rather than 640.
const READ_BUF_START_BYTES: usize = 4 * 1024;
/// The read buffer doubles when a read fills it, up to this.
const READ_BUF_MAX_BYTES: usize = 64 * 1024;
/// A write buffer that grew past this (a burst of replies) is given back
/// rather than kept for the connection's lifetime.
const WRITE_BUF_KEEP_BYTES: usize = 1 << 20;
/// How long an outbound peer dial may take before it counts as failed.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Closes the core's side of a connection however its task ends (return,
/// error, panic or abort at shutdown).
struct ConnGuard<M: Machine> {
    shared: Arc<Shared<M>>,
    conn: ConnId,
    peer: SocketAddr,
}

impl<M: Machine> Drop for ConnGuard<M> {
    fn drop(&mut self) {
        if let Some(mut inner) = self.shared.try_lock() {
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

pub(super) async fn run_inbound<M: Machine>(
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
pub(super) async fn run_dial<M: Machine>(
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
        core.handle_dialed(now, slot, nonce)
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
                let state = guard.shared.lock().core.poll_transmit(guard.conn, &mut out);
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
                let mine = feed_input(shared, conn, &read_buf[..n], &mut reading);
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

        let state = take_batch(shared, conn, &mut out, &mut reading);
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
        report_written(shared, waker, conn, written, &mut reading);
        result?;
        if state == ConnState::CloseAfterFlush {
            // The guard reports the close once the stream is shut down.
            let _ = stream.shutdown().await;
            return Ok(());
        }
    }
}

/// Hands bytes read from `conn` to the core; true if `conn` itself was
/// woken. `reading` becomes whether the core wants more input.
fn feed_input<M: Machine>(
    shared: &Shared<M>,
    conn: ConnId,
    bytes: &[u8],
    reading: &mut bool,
) -> bool {
    let mut inner = shared.lock();
    let now = shared.clock.now();
    inner.core.handle_input(now, conn, bytes);
    let mine = inner.dispatch(shared, Some(conn));
    *reading = inner.core.wants_input(conn);
    mine
}

/// Takes everything pending for `conn` in one batch.
fn take_batch<M: Machine>(
    shared: &Shared<M>,
    conn: ConnId,
    out: &mut Vec<u8>,
    reading: &mut bool,
) -> ConnState {
    let mut inner = shared.lock();
    let state = inner.core.poll_transmit(conn, out);
    *reading = inner.core.wants_input(conn);
    state
}

/// Reports what went out, even when the write failed part way: a grant
/// whose frame left whole may be in the client's hands.
fn report_written<M: Machine>(
    shared: &Shared<M>,
    waker: &Notify,
    conn: ConnId,
    written: usize,
    reading: &mut bool,
) {
    let mut inner = shared.lock();
    let now = shared.clock.now();
    inner.core.handle_written(now, conn, written);
    if inner.dispatch(shared, Some(conn)) {
        waker.notify_one();
    }
    *reading = inner.core.wants_input(conn);
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
