//! The background tasks of a broker: one per endpoint (connect, then drive
//! the connection: read, write, time out), and the release worker.
//!
//! One task drives a connection: it reads, writes what its session hands
//! out, and serves the session's deadlines, so a reply is fed to the
//! session and the waiting caller woken without a hop between tasks. A
//! caller whose request is the only one on an idle plain-TCP connection
//! writes it itself ([`Inner::write_direct`]): the uncontended path wakes
//! no task until the reply arrives. Otherwise the submitter wakes the
//! task, which yields once before taking the session's bytes, so the
//! requests of every task ready in that round leave in one write.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tracing::{debug, warn};

use ticketing_core::client::{Backoff, Broker, SessionConfig, run_release};
use ticketing_core::time::Instant;

use super::{ConnectProblem, Inner, State};

/// Size of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Releases the background worker runs at once.
const RELEASE_WORKERS_MAX: usize = 64;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// What one endpoint task connects to.
pub(super) struct Link {
    pub(super) index: usize,
    pub(super) addr: String,
    pub(super) session: SessionConfig,
    pub(super) tls: Option<(TlsConnector, ServerName<'static>)>,
}

/// Per endpoint, beside the core's state under the broker's lock: what a
/// caller needs to write to the connection itself, and when the endpoint
/// task must be woken.
#[derive(Default)]
pub(super) struct Wire {
    /// The write half of the live plain-TCP connection, once the session
    /// is driven; `None` with TLS (a TLS write needs the stream's state)
    /// or while not connected.
    direct: Option<Arc<OwnedWriteHalf>>,
    /// The endpoint task holds bytes of this connection not yet written:
    /// a caller must not write in front of them.
    busy: bool,
    /// Bytes handed out to a caller's direct write that the socket did not
    /// take: the endpoint task writes them before anything else.
    spill: Vec<u8>,
    /// When the endpoint task's timer fires (`None`: not armed). A submit
    /// that brings an earlier deadline wakes the task to move it.
    armed: Option<Instant>,
    /// The transport (TCP, and TLS if used) is up: a session still in its
    /// handshake has really heard what it heard.
    pub(super) connected: bool,
}

impl Inner {
    /// After a submit on endpoint `index`: writes the session's bytes from
    /// the caller's task when the connection is plain TCP, its task holds
    /// nothing unwritten and this request is the only one on it (nobody to
    /// share a write with). True if the endpoint task must be woken: it
    /// was not written here, the socket did not take all of it, or its
    /// deadline is earlier than the task's timer.
    pub(super) fn write_direct(&self, state: &mut State, index: usize, now: Instant) -> bool {
        let (sessions, wires) = (&mut state.broker.sessions, &mut state.wires);
        let wire = &mut wires[index];
        let Some(session) = sessions[index].as_mut() else {
            return true;
        };
        let Some(writer) = wire
            .direct
            .as_ref()
            .filter(|_| !wire.busy && session.pending_len() == 1)
        else {
            return true;
        };
        // The wire's spill is empty while the task is not busy.
        session.poll_transmit(now, &mut wire.spill);
        // WouldBlock or an error: the task writes the bytes (or meets the
        // error and ends the connection).
        self.count_socket_write();
        if let Ok(written) = writer.try_write(&wire.spill)
            && written > 0
        {
            wire.spill.drain(..written);
            session.handle_written(now, wire.spill.is_empty());
        }
        let spilled = !wire.spill.is_empty();
        wire.busy = spilled;
        let deadline_earlier = session
            .poll_timeout()
            .is_some_and(|at| wire.armed.is_none_or(|armed| at < armed));
        // poll_transmit may have timed out a request that was due.
        self.dispatch(state, index, now);
        spilled || deadline_earlier
    }

    fn count_socket_write(&self) {
        self.socket_writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// A connected transport.
enum Connection {
    Tcp(TcpStream),
    Tls(Box<dyn Stream>),
}

async fn connect(link: &Link) -> io::Result<Connection> {
    let tcp = TcpStream::connect(&link.addr).await?;
    tcp.set_nodelay(true)?;
    match &link.tls {
        None => Ok(Connection::Tcp(tcp)),
        Some((connector, name)) => Ok(Connection::Tls(Box::new(
            connector.connect(name.clone(), tcp).await?,
        ))),
    }
}

pub(super) async fn run_endpoint(inner: Arc<Inner>, link: Link) {
    let index = link.index;
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let started = inner.now();
        inner.lock().open_session(index, started, &link.session);
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
                let session = {
                    let mut state = inner.lock();
                    let session = state.sessions[index].take();
                    // This attempt connected: an older attempt's problem
                    // no longer holds.
                    state.problems[index] = session
                        .as_ref()
                        .and_then(|session| session.handshake_clue())
                        .map(ConnectProblem::from_clue);
                    session
                };
                let Some(delay) = backoff.after_ended(session.as_ref()) else {
                    warn!(addr = %link.addr, "authentication failed; not reconnecting");
                    return;
                };
                delay
            }
            result => {
                let problem = match result {
                    Ok(Err(e)) => ConnectProblem::from_connect_error(&e),
                    _ => ConnectProblem::Other("connect timed out".to_owned()),
                };
                debug!(addr = %link.addr, why = %problem, "connect failed");
                let now = inner.now();
                let mut state = inner.lock();
                state.problems[index] = Some(problem);
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

/// The writing side of a connection.
enum Writer {
    /// Shared with callers' direct writes (see [`Wire`]).
    Tcp(Arc<OwnedWriteHalf>),
    Tls {
        half: WriteHalf<Box<dyn Stream>>,
        /// Everything handed to rustls; its records may still wait.
        needs_flush: bool,
    },
}

/// What a write did, for the session's write-progress rule
/// ([`ticketing_core::client::Session::handle_written`]), reported at the
/// next step under the lock that step takes anyway.
#[derive(Clone, Copy)]
enum Written {
    /// Bytes were taken (or a flush completed): whether anything is left.
    Progress { all_written: bool },
    /// Nothing to report since the last step.
    Nothing,
}

impl Writer {
    /// Writes some of `out` (or, for TLS with nothing left, flushes);
    /// returns how much of `out` was taken. Cancel-safe: nothing is taken
    /// unless the future completes.
    async fn write_some(&mut self, inner: &Inner, out: &[u8]) -> io::Result<usize> {
        match self {
            Writer::Tcp(half) => loop {
                half.writable().await?;
                inner.count_socket_write();
                match half.try_write(out) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    result => return result,
                }
            },
            Writer::Tls { half, needs_flush } => {
                inner.count_socket_write();
                if out.is_empty() {
                    half.flush().await?;
                    *needs_flush = false;
                    return Ok(0);
                }
                let written = half.write(out).await?;
                *needs_flush = true;
                Ok(written)
            }
        }
    }

    fn has_work(&self, out: &[u8]) -> bool {
        !out.is_empty()
            || matches!(
                self,
                Writer::Tls {
                    needs_flush: true,
                    ..
                }
            )
    }
}

/// Runs one connected session until it or its transport ends, in one task:
/// reads feed the session, the session's bytes are written, its deadlines
/// served; a submitter's wake-up yields once first so that the requests of
/// every task ready in that round leave in one write.
async fn drive(inner: &Inner, index: usize, connection: Connection) {
    inner.lock().wires[index].connected = true;
    let (mut reader, mut writer): (Box<dyn AsyncRead + Unpin + Send>, Writer) = match connection {
        Connection::Tcp(tcp) => {
            let (read_half, write_half) = tcp.into_split();
            let write_half = Arc::new(write_half);
            inner.lock().wires[index].direct = Some(Arc::clone(&write_half));
            (Box::new(read_half), Writer::Tcp(write_half))
        }
        Connection::Tls(stream) => {
            let (read_half, write_half) = tokio::io::split(stream);
            let writer = Writer::Tls {
                half: write_half,
                needs_flush: false,
            };
            (Box::new(read_half), writer)
        }
    };
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    let mut input = 0;
    let mut out = Vec::new();
    // One timer for the session's deadlines, moved only when a deadline
    // comes earlier than the one it is set for: firing early is harmless
    // (the session then has nothing to do and names its next deadline),
    // and re-arming on every change of the earliest request deadline
    // would cost a timer-wheel update per batch.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    // A write that stalls is the session's to notice (its write-progress
    // deadline is among those the timer serves).
    let mut written = Written::Nothing;
    loop {
        let now = inner.now();
        let io = StepIo {
            input: &buf[..input],
            written,
        };
        let Some(rearm) = step(inner, index, now, io, &mut out, &mut armed) else {
            break;
        };
        input = 0;
        written = Written::Nothing;
        if let Some(at) = rearm {
            timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(inner.to_std(at)));
        }
        let writing = writer.has_work(&out);
        tokio::select! {
            // Writes first: a batch leaves as soon as it can.
            biased;
            result = writer.write_some(inner, &out), if writing => match result {
                Ok(taken) if taken > 0 || out.is_empty() => {
                    out.drain(..taken);
                    written = Written::Progress {
                        all_written: !writer.has_work(&out),
                    };
                }
                _ => break,
            },
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => input = n,
            },
            () = inner.wakes[index].notified() => {
                // Let the other tasks that are ready now submit first,
                // so that their requests leave in this write.
                tokio::task::yield_now().await;
            }
            () = &mut timer, if armed.is_some() => armed = None,
        }
    }
    let now = inner.now();
    let mut state = inner.lock();
    let wire = &mut state.wires[index];
    wire.connected = false;
    wire.direct = None;
    wire.busy = false;
    wire.spill.clear();
    wire.armed = None;
    inner.transport_closed(&mut state, index, now);
}

/// What the connection did since the last step.
struct StepIo<'a> {
    /// Bytes just read.
    input: &'a [u8],
    /// What the last write did.
    written: Written,
}

/// One step of endpoint `index`'s session at `now`, under one lock: the
/// input just read and the last write's progress, a close if the broker
/// is shutting down, its timeouts, its bytes to send (appended to `out`,
/// after what a direct write left), its events. `None` once the session
/// is gone or closed; else the instant to move the timer to, if its next
/// deadline comes before `armed` (which is updated, here and in the
/// endpoint's [`Wire`]).
fn step(
    inner: &Inner,
    index: usize,
    now: Instant,
    io: StepIo<'_>,
    out: &mut Vec<u8>,
    armed: &mut Option<Instant>,
) -> Option<Option<Instant>> {
    let mut guard = inner.lock();
    let state = &mut *guard;
    let shutdown = inner.is_shut_down();
    let session = state.broker.sessions[index].as_mut()?;
    if !io.input.is_empty() {
        session.handle_input(now, io.input);
    }
    if let Written::Progress { all_written } = io.written {
        session.handle_written(now, all_written);
    }
    if shutdown {
        session.close_local(now);
    }
    session.handle_timeout(now);
    let wire = &mut state.wires[index];
    out.append(&mut wire.spill);
    session.poll_transmit(now, out);
    wire.busy = !out.is_empty();
    let closed = session.is_closed();
    let mut rearm = None;
    if let Some(at) = session.poll_timeout()
        && armed.is_none_or(|armed| at < armed)
    {
        *armed = Some(at);
        rearm = Some(at);
    }
    wire.armed = *armed;
    inner.dispatch(state, index, now);
    if closed {
        return None;
    }
    Some(rearm)
}

/// Runs queued background releases; on close, drains the queue (each
/// release keeps its own 5 s bound), then closes every session.
pub(super) async fn run_release_worker(
    inner: Arc<Inner>,
    endpoints: Vec<tokio::task::JoinHandle<()>>,
) {
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
