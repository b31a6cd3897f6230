//! The admin listener's own thread and its accept loop: every limit that
//! keeps a hostile client of the admin port from reaching the lock
//! service.
//!
//! - **Its own thread.** The listener runs on a thread with a runtime of
//!   its own, so neither a flood of requests nor a slow one ever takes a
//!   turn of the lock service's runtime. It reaches the core only through
//!   [`super::AdminNode`], whose every call is bounded work (a listing is
//!   one page of a bounded scan).
//! - **Connections.** At most [`AdminLimits::connections_max`] at once (the
//!   loop stops accepting at the cap: what waits stays in the kernel's
//!   backlog and costs no descriptor), at most
//!   [`AdminLimits::connections_per_source_max`] from one address (one
//!   more is closed at once). So the admin port can never take the lock
//!   port's descriptors.
//! - **Time.** A request's head must arrive within
//!   [`AdminLimits::header_read_timeout`], which also bounds how long a
//!   kept-alive connection may sit idle, and no connection lives longer
//!   than [`AdminLimits::connection_lifetime_max`].
//! - **Memory.** A request head is at most [`REQUEST_HEAD_BYTES_MAX`].
//! - **Accept errors** (`EMFILE` …) back off, doubling up to a second,
//!   and are logged at most once a second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use ticketing_core::admin::AdminRefusal;

use super::api::{AppState, ConnAddrs};

/// Largest request head (request line and headers) the listener reads;
/// a longer one is answered `431` and the connection closed.
pub const REQUEST_HEAD_BYTES_MAX: usize = 16 * 1024;

/// The first pause after an accept error; it doubles while errors last.
const ACCEPT_ERROR_PAUSE_FIRST: Duration = Duration::from_millis(10);
/// The longest pause after an accept error.
const ACCEPT_ERROR_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The admin listener's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections open at once.
    pub connections_max: usize,
    /// Connections open at once from one source address.
    pub connections_per_source_max: usize,
    /// Time for a request's head to arrive, from the connection's start
    /// or the end of its previous answer.
    pub header_read_timeout: Duration,
    /// Longest life of one connection, however busy.
    pub connection_lifetime_max: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            connections_max: 64,
            connections_per_source_max: 16,
            header_read_timeout: Duration::from_secs(5),
            connection_lifetime_max: Duration::from_secs(60),
        }
    }
}

/// Starts the admin listener on a thread of its own serving `router`
/// (whose state is `app`) on `listener`. The returned task, on the
/// caller's runtime, stands for it: aborting or dropping it stops the
/// listener, which closes its connections.
pub(crate) fn spawn(
    listener: std::net::TcpListener,
    router: Router,
    app: AppState,
    limits: AdminLimits,
) -> std::io::Result<JoinHandle<()>> {
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("ticketing-admin".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => accept_loop(listener, router, app, limits, stop_rx).await,
                    Err(e) => warn!("admin listener cannot start: {e}"),
                }
            });
        })?;
    Ok(tokio::spawn(async move {
        // Held until this task is aborted or dropped: then the listener's
        // thread sees its stop.
        let _stop = stop_tx;
        std::future::pending::<()>().await;
    }))
}

/// Connections open per source address, bounded by the connection cap.
#[derive(Debug, Default)]
struct PerSource(Mutex<HashMap<IpAddr, usize>>);

/// One source's hold on a connection slot, given back when dropped.
struct SourceSlot {
    per_source: Arc<PerSource>,
    source: IpAddr,
}

impl PerSource {
    fn take(self: &Arc<Self>, source: IpAddr, max: usize) -> Option<SourceSlot> {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = counts.entry(source).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            per_source: Arc::clone(self),
            source,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut counts = self
            .per_source
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    app: AppState,
    limits: AdminLimits,
    mut stop: oneshot::Receiver<()>,
) {
    // Shown as the address, never as Rust's `Some(…)`.
    let local = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_owned(), |addr| addr.to_string());
    info!(admin = %local, "admin listener serving the status page (/), /metrics, /livez, /readyz, /v1/locks, /v1/node, /v1/events");
    let slots = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let per_source = Arc::new(PerSource::default());
    let mut pause = ACCEPT_ERROR_PAUSE_FIRST;
    let mut errors_unlogged = 0u64;
    let mut error_logged_at: Option<tokio::time::Instant> = None;
    loop {
        // At the cap the loop waits for a slot before accepting: what
        // waits meanwhile stays in the kernel's backlog.
        let permit = tokio::select! {
            biased;
            _ = &mut stop => return,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                pause = ACCEPT_ERROR_PAUSE_FIRST;
                let Some(source) = per_source.take(peer.ip(), limits.connections_per_source_max)
                else {
                    app.refused(AdminRefusal::SourceFull, Some(peer));
                    continue;
                };
                let Ok(local) = tcp.local_addr() else {
                    continue;
                };
                let conn = Connection {
                    tcp,
                    addrs: ConnAddrs { local, peer },
                    _slot: permit,
                    _source: source,
                };
                tokio::spawn(conn.serve(router.clone(), Arc::clone(&app), limits));
            }
            Err(e) => {
                drop(permit);
                errors_unlogged += 1;
                let now = tokio::time::Instant::now();
                if error_logged_at.is_none_or(|at| now >= at + Duration::from_secs(1)) {
                    warn!(
                        errors = errors_unlogged,
                        pause_ms = pause.as_millis() as u64,
                        "admin listener: accept failed: {e}"
                    );
                    errors_unlogged = 0;
                    error_logged_at = Some(now);
                }
                tokio::select! {
                    biased;
                    _ = &mut stop => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ACCEPT_ERROR_PAUSE_MAX);
            }
        }
    }
}

/// An accepted admin connection with the slots it holds.
struct Connection {
    tcp: TcpStream,
    addrs: ConnAddrs,
    _slot: OwnedSemaphorePermit,
    _source: SourceSlot,
}

impl Connection {
    async fn serve(self, router: Router, app: AppState, limits: AdminLimits) {
        let service = TowerToHyperService::new(router.layer(Extension(self.addrs)));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(REQUEST_HEAD_BYTES_MAX)
            .keep_alive(true);
        let connection = http.serve_connection(TokioIo::new(self.tcp), service);
        match tokio::time::timeout(limits.connection_lifetime_max, connection).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_timeout() => {
                app.refused(AdminRefusal::TimedOut, Some(self.addrs.peer));
            }
            // A reset, a malformed request (hyper answered it 400), or a
            // head over the size limit (431): nothing more to do.
            Ok(Err(_)) => {}
            Err(_) => app.refused(AdminRefusal::TimedOut, Some(self.addrs.peer)),
        }
    }
}
