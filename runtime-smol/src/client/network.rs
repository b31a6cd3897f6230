//! Network endpoint tasks: each connects (TCP, or TLS), runs its session
//! over the stream until either ends, and reconnects with the core's
//! backoff.

use std::io;
use std::sync::Arc;

use async_io::Timer;
use futures_rustls::TlsConnector;
use rustls::pki_types::ServerName;
use smol::future;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use ticketing_core::client::{Backoff, SessionConfig};
use ticketing_core::time::Instant;

use super::inner::Inner;
use crate::sync::sleep_until_opt;

/// Size of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// What one network endpoint task connects to.
pub(super) struct Link {
    pub(super) addr: String,
    pub(super) session: SessionConfig,
    pub(super) tls: Option<(TlsConnector, ServerName<'static>)>,
}

async fn connect(link: &Link) -> io::Result<Box<dyn Stream>> {
    let tcp = smol::net::TcpStream::connect(link.addr.as_str()).await?;
    tcp.set_nodelay(true)?;
    match &link.tls {
        None => Ok(Box::new(tcp)),
        Some((connector, name)) => Ok(Box::new(connector.connect(name.clone(), tcp).await?)),
    }
}

pub(super) async fn run_network_endpoint(inner: Arc<Inner>, index: usize, link: Link) {
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let started = inner.now();
        inner
            .lock()
            .broker
            .open_session(index, started, &link.session);
        let handshake_deadline = started.saturating_add(link.session.handshake_timeout);
        let connected = future::or(async { Some(connect(&link).await) }, async {
            inner.clock.sleep_until(handshake_deadline).await;
            None
        });
        // A close must not wait for a connect to an unreachable server.
        let connected = future::or(async { Some(connected.await) }, async {
            inner.wait_shutdown().await;
            None
        })
        .await;
        let Some(connected) = connected else {
            break;
        };
        let delay = match connected {
            Some(Ok(stream)) => {
                drive_network(&inner, index, stream).await;
                let session = inner.lock().broker.sessions[index].take();
                let Some(delay) = backoff.after_ended(session.as_ref()) else {
                    // Authentication failed: reconnecting cannot fix it.
                    return;
                };
                delay
            }
            _ => {
                let now = inner.now();
                let mut state = inner.lock();
                inner.transport_closed(&mut state, index, now);
                state.broker.sessions[index] = None;
                backoff.after_connect_failure()
            }
        };
        future::or(
            async {
                Timer::after(delay).await;
            },
            inner.wait_shutdown(),
        )
        .await;
    }
}

/// Runs one connected session until it or its transport ends: a reader
/// and a writer race, and whichever ends first ends both.
async fn drive_network(inner: &Inner, index: usize, stream: Box<dyn Stream>) {
    let (reader, writer) = smol::io::split(stream);
    future::or(
        read_into_session(inner, index, reader),
        write_from_session(inner, index, writer),
    )
    .await;
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
        let Some(session) = state.broker.sessions[index].as_mut() else {
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
/// send, reporting each write's progress to it, until the session ends
/// (its write-progress deadline among the others) or the transport fails.
async fn write_from_session(inner: &Inner, index: usize, mut writer: impl AsyncWrite + Unpin) {
    let mut out = Vec::new();
    // Bytes were taken since the last flush (TLS records may still wait).
    let mut needs_flush = false;
    let mut written = None;
    loop {
        let now = inner.now();
        let Some(deadline) = advance_session(inner, index, now, written.take(), &mut out) else {
            return;
        };
        if out.is_empty() && !needs_flush {
            future::or(sleep_until_opt(inner.clock, deadline), async {
                inner.wakes[index].notified().await;
                // Let the other tasks that are ready now submit first, so
                // that their requests leave in this write.
                future::yield_now().await;
            })
            .await;
            continue;
        }
        // Each write and flush races the session's next deadline: a write
        // that takes nothing is cancelled (nothing taken) and the session
        // decides whether that is a stall.
        let mut took = false;
        if !out.is_empty() {
            match before(inner, deadline, writer.write(&out)).await {
                None => continue,
                Some(Ok(taken)) if taken > 0 => {
                    out.drain(..taken);
                    needs_flush = true;
                    took = true;
                }
                Some(_) => return,
            }
        }
        if out.is_empty() {
            match before(inner, deadline, writer.flush()).await {
                // What this write took is progress; a flush cut short is not.
                None => {
                    written = took.then_some(false);
                    continue;
                }
                Some(Ok(())) => needs_flush = false,
                Some(Err(_)) => return,
            }
        }
        written = Some(out.is_empty() && !needs_flush);
    }
}

/// `io`'s result, or `None` if `deadline` comes first (then `io` is
/// dropped: smol's writes and flushes take nothing they did not finish).
async fn before<T>(
    inner: &Inner,
    deadline: Option<Instant>,
    io: impl std::future::Future<Output = io::Result<T>>,
) -> Option<io::Result<T>> {
    future::or(async { Some(io.await) }, async {
        sleep_until_opt(inner.clock, deadline).await;
        None
    })
    .await
}

/// One step of endpoint `index`'s session at `now`: the last write's
/// progress (`written`: whether all was written), a close if the broker
/// is shutting down, its timeouts, its bytes to send (appended to `out`),
/// its events. The session's next deadline, or `None` once it is gone or
/// closed.
fn advance_session(
    inner: &Inner,
    index: usize,
    now: Instant,
    written: Option<bool>,
    out: &mut Vec<u8>,
) -> Option<Option<Instant>> {
    let mut state = inner.lock();
    let shutdown = inner.is_shut_down();
    let session = state.broker.sessions[index].as_mut()?;
    if let Some(all_written) = written {
        session.handle_written(now, all_written);
    }
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
