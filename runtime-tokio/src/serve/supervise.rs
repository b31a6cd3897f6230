//! Listeners, dials and the supervisor: the task that accepts connections
//! and starts the dials the core asks for until asked to stop, then runs
//! the shutdown.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsConnector;
use tracing::{error, info, warn};

use ticketing_core::auth::NONCE_LEN;
use ticketing_core::machine::Machine;
use ticketing_core::server::ConnId;
use ticketing_core::time::Instant;

use super::conn::{run_dial, run_inbound};
use super::shared::{Shared, run_timer};

/// First pause after an accept error such as EMFILE, so that the loop does
/// not spin while the condition lasts; it doubles while errors go on, up
/// to [`ACCEPT_ERROR_PAUSE_MAX`], and is back to this after an accept.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause after accept errors: short, so that the lock port takes
/// clients again soon after descriptors are free.
const ACCEPT_ERROR_PAUSE_MAX: Duration = Duration::from_millis(500);
/// Least time between two log lines about accept errors.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// How a new inbound connection (from the given source address) is
/// announced to the core: [`Machine::handle_connect`] or
/// [`Machine::handle_peer_accept`].
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
    serve_until_stopped(&shared, &listeners, dialer.as_ref(), &mut conns).await;
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
    wait_for_quiet(&shared, &mut conns, grace).await;
    conns.shutdown().await;
    for task in background {
        task.abort();
    }
    info!("shutdown complete");
}

/// Accepts connections and starts the dials the core asks for, reaping
/// finished connection tasks, until [`Shared::stop`] is notified.
async fn serve_until_stopped<M: Machine>(
    shared: &Arc<Shared<M>>,
    listeners: &[Listener<M>],
    dialer: Option<&Dialer>,
    conns: &mut JoinSet<()>,
) {
    let mut pause = ACCEPT_ERROR_PAUSE;
    let mut errors_unlogged = 0u64;
    let mut logged_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            biased;
            () = shared.stop.notified() => return,
            // Reaped before accepting, so a steady stream of new connections
            // cannot make finished tasks pile up.
            Some(done) = conns.join_next(), if !conns.is_empty() => log_task_end(done),
            () = shared.dial.notified(), if dialer.is_some() => {
                if let Some(dialer) = dialer {
                    spawn_dials(shared, dialer, conns);
                }
            }
            (index, accepted) = accept_any(listeners) => match accepted {
                Ok((tcp, peer)) => {
                    pause = ACCEPT_ERROR_PAUSE;
                    let listener = &listeners[index];
                    conns.spawn(run_inbound(
                        Arc::clone(shared),
                        tcp,
                        peer,
                        listener.tls.clone(),
                        listener.open,
                        listener.what,
                        listener.link_timeout,
                    ));
                    // One accept per turn: the new connection registers
                    // and sends its hello, and connections with input
                    // read it, before the next one registers.
                    // Accepting a queue in one go (tokio lets a task run
                    // about 128 ready accepts before it must yield)
                    // registers the whole batch before any of it is
                    // served, and the handshake budget then drops a
                    // client admitted early in the batch for the ones
                    // behind it before its hello has even left.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    // Logged at most once a second, with the count since.
                    errors_unlogged += 1;
                    let now = tokio::time::Instant::now();
                    if logged_at.is_none_or(|at| now >= at + ACCEPT_ERROR_LOG_INTERVAL) {
                        warn!(errors = errors_unlogged, "accept failed: {e}");
                        errors_unlogged = 0;
                        logged_at = Some(now);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(ACCEPT_ERROR_PAUSE_MAX);
                }
            },
        }
    }
}

/// Starts a connection task for every dial the core asked for.
fn spawn_dials<M: Machine>(shared: &Arc<Shared<M>>, dialer: &Dialer, conns: &mut JoinSet<()>) {
    let slots = std::mem::take(&mut shared.lock().dials);
    for slot in slots {
        let addr = dialer.addrs[usize::from(slot)];
        conns.spawn(run_dial(
            Arc::clone(shared),
            slot,
            addr,
            dialer.tls.clone(),
            dialer.link_timeout,
        ));
    }
}

/// During shutdown: waits until every connection task ended or the core
/// says the rest may be dropped ([`Machine::quiesced`]), at most `grace`.
async fn wait_for_quiet<M: Machine>(shared: &Shared<M>, conns: &mut JoinSet<()>, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        if conns.is_empty() || shared.lock().core.quiesced() {
            return;
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
                return;
            }
        }
    }
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

fn log_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        error!("connection task panicked: {e}");
    }
}
