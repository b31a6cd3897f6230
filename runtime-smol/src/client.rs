//! [`TicketBroker`] on smol/async-io: the network client, and the
//! in-process handle of an [`EmbeddedServer`](crate::EmbeddedServer).
//!
//! Every rule of the official client (request ids, reply matching,
//! Indeterminate, which attempts may be retried, conservative validity, the
//! 5 s release window, reconnect backoff) lives in
//! [`ticketing_core::client`], and so do the acquire and release loops
//! ([`run_acquire`], [`run_release`]) and the tickets; this module only moves
//! bytes between a transport and the core's [`Session`]s, reads the clock
//! and parks futures (it implements the core's [`Broker`]). It mirrors
//! `ticketing_tokio::client` call for call.
//!
//! Two transports under one broker:
//!
//! - network: each endpoint has one task that connects (TCP, or TLS via
//!   futures-rustls), then runs a reader and a driver (timeouts + writes);
//! - in-process: each endpoint is an in-memory link to the embedded server
//!   (see [`crate::embedded`]). The caller's own task moves the bytes right
//!   after it submits (so an uncontended acquire completes without a task
//!   switch); the endpoint task only serves deadlines and bytes that arrive
//!   for the link while nobody else is moving them (a grant on another
//!   broker's release).
//!
//! Shape otherwise as on tokio: one broker-wide [`BrokerState`] (sessions,
//! router, pending-reply map, release queue) behind a `std::sync::Mutex`
//! never held across an `.await`; a release worker drains the release queue
//! (dropped tickets, compensations). Background tasks run on smol's global
//! executor; the futures returned to callers run on any executor.

use std::fmt;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_io::Timer;
use event_listener::Event;
use futures_rustls::TlsConnector;
use rustls::pki_types::ServerName;
use smol::Task;
use smol::future;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use ticketing_core::client::{
    AcquireParams, Backoff, Broker, BrokerConfig, BrokerNotice, BrokerState, Grant, KeySet,
    Outcome, OutcomeSender, RELEASE_RETRY_WINDOW, Session, SessionConfig, WRITE_PROGRESS_TIMEOUT,
    run_acquire, run_release,
};
use ticketing_core::server::ConnId;
use ticketing_core::time::Instant;

pub use ticketing_core::client::{
    BrokerMode, ClientError as TicketError, DEFAULT_MAX_PENDING, DEFAULT_SILENCE_TIMEOUT,
    ReleaseOutcome, Ticket, TicketSet,
};

use crate::hub::{Hub, MemoryLink};
use crate::sync::{Clock, Notify, sleep_until_opt};
use crate::tls::{self, TlsMode};

/// Size of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Releases the background worker runs at once.
const RELEASE_WORKERS_MAX: usize = 64;
/// In-memory links per in-process broker: two, like a network broker's two
/// connections to one address, so that a link closed by a cancelled request
/// does not interrupt the other requests' service while it reconnects.
const IN_PROCESS_LINKS: usize = 2;

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
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.config.max_pending = max_pending;
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
    /// (on smol's global executor; no executor needed to call it). Errors:
    /// [`TicketError::InvalidInput`] for a bad address, token, mode or
    /// bound; [`TicketError::Io`] for unusable TLS settings.
    pub fn connect(self) -> Result<TicketBroker, TicketError> {
        let endpoints = self.config.endpoints()?;
        let connector = tls::connector(&self.tls)?;
        let links = endpoints
            .into_iter()
            .map(|endpoint| {
                let tls = match &connector {
                    Some(connector) => Some((connector.clone(), tls::server_name(&endpoint.addr)?)),
                    None => None,
                };
                Ok(Link {
                    addr: endpoint.addr,
                    session: endpoint.session,
                    tls,
                })
            })
            .collect::<Result<Vec<_>, TicketError>>()?;
        let inner = Arc::new(Inner::new(links.len(), self.config.max_pending, None));
        let tasks = links
            .into_iter()
            .enumerate()
            .map(|(index, link)| smol::spawn(run_network_endpoint(Arc::clone(&inner), index, link)))
            .collect();
        smol::spawn(run_release_worker(Arc::clone(&inner), tasks)).detach();
        Ok(TicketBroker { inner })
    }
}

/// An in-process broker of `hub`, its links connected before it returns.
pub(crate) fn in_process(hub: Arc<Hub>, owner: u64) -> TicketBroker {
    let session = SessionConfig::single(hub.in_process_token().as_bytes());
    let inner = Arc::new(Inner::new(
        IN_PROCESS_LINKS,
        DEFAULT_MAX_PENDING,
        Some(Memory { hub, owner }),
    ));
    for index in 0..IN_PROCESS_LINKS {
        inner.open_memory_link(index, &session);
    }
    let tasks = (0..IN_PROCESS_LINKS)
        .map(|index| {
            smol::spawn(run_memory_endpoint(
                Arc::clone(&inner),
                index,
                session.clone(),
            ))
        })
        .collect();
    smol::spawn(run_release_worker(Arc::clone(&inner), tasks)).detach();
    TicketBroker { inner }
}

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

/// Spare [`ReplySlot`]s kept per broker for reuse; more in flight at once
/// are allocated and freed.
const SPARE_REPLY_SLOTS_MAX: usize = 64;

/// One attempt's outcome on its way to the caller: filled by
/// [`BrokerState::dispatch`] under the broker lock, taken by the attempt.
/// Reused across attempts (see [`State::spare_slots`]) instead of a fresh
/// channel each time.
#[derive(Default)]
struct ReplySlot(Mutex<SlotState>);

#[derive(Default)]
enum SlotState {
    #[default]
    Empty,
    /// The attempt's future is parked on it.
    Waiting(Waker),
    Filled(Outcome),
    /// The sender went away without an outcome (the broker state was torn
    /// down): nothing definite is known.
    Abandoned,
}

impl ReplySlot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // The slot holds no invariant a panic could break half way.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores `state` and wakes a parked attempt.
    fn put(&self, state: SlotState) {
        let previous = std::mem::replace(&mut *self.lock(), state);
        if let SlotState::Waiting(waker) = previous {
            waker.wake();
        }
    }

    /// The outcome, if it arrived (`Abandoned` reads as Indeterminate).
    fn try_take(&self) -> Option<Outcome> {
        let mut state = self.lock();
        match std::mem::take(&mut *state) {
            SlotState::Filled(outcome) => Some(outcome),
            SlotState::Abandoned => Some(Outcome::Indeterminate),
            other => {
                *state = other;
                None
            }
        }
    }

    fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut state = self.lock();
        match std::mem::take(&mut *state) {
            SlotState::Filled(outcome) => Poll::Ready(outcome),
            SlotState::Abandoned => Poll::Ready(Outcome::Indeterminate),
            SlotState::Waiting(waker) if waker.will_wake(cx.waker()) => {
                *state = SlotState::Waiting(waker);
                Poll::Pending
            }
            SlotState::Waiting(_) | SlotState::Empty => {
                *state = SlotState::Waiting(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Where one request's outcome goes: its attempt's [`ReplySlot`].
struct OutcomeTx(Option<Arc<ReplySlot>>);

impl OutcomeSender for OutcomeTx {
    fn send(mut self, outcome: Outcome) -> Result<(), Outcome> {
        // The attempt keeps its slot until it took the outcome or cancelled
        // under the broker lock (after which nothing is sent): never refused.
        if let Some(slot) = self.0.take() {
            slot.put(SlotState::Filled(outcome));
        }
        Ok(())
    }
}

impl Drop for OutcomeTx {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.put(SlotState::Abandoned);
        }
    }
}

struct State {
    /// Sessions, router, waiters and the release queue.
    broker: BrokerState<OutcomeTx>,
    /// In-process: the server connection of each endpoint's link.
    links: Vec<Option<ConnId>>,
    /// In-process: the deadline each endpoint task sleeps until
    /// (`u64::MAX` for none), so a submit wakes it only when it must.
    driver_targets_micros: Vec<u64>,
    /// Reply slots no attempt holds, at most [`SPARE_REPLY_SLOTS_MAX`].
    spare_slots: Vec<Arc<ReplySlot>>,
}

impl State {
    /// A slot for a new attempt, empty.
    fn take_slot(&mut self) -> Arc<ReplySlot> {
        self.spare_slots.pop().unwrap_or_default()
    }

    /// Keeps `slot`, whose outcome was just taken (so it is empty), for a
    /// later attempt if nothing else refers to it.
    fn give_back_slot(&mut self, slot: Arc<ReplySlot>) {
        if Arc::strong_count(&slot) == 1 && self.spare_slots.len() < SPARE_REPLY_SLOTS_MAX {
            self.spare_slots.push(slot);
        }
    }
}

/// The embedded server an in-process broker is linked to.
struct Memory {
    hub: Arc<Hub>,
    /// This broker's name at the hub.
    owner: u64,
}

pub(crate) struct Inner {
    clock: Clock,
    state: Mutex<State>,
    memory: Option<Memory>,
    /// Per endpoint: wakes its task (bytes to send, deadline moved, close).
    wakes: Vec<Arc<Notify>>,
    /// Some endpoint became ready, authentication failed, or closing.
    ready_changed: Event,
    /// The release queue has work, a release finished, or closing.
    release_wake: Notify,
    closing: AtomicBool,
    /// Set once background releases are drained after a close: sessions
    /// close and endpoint tasks end.
    shut_down: AtomicBool,
    shut_down_changed: Event,
    /// Live [`TicketBroker`] handles; the last one dropped starts a close.
    handles: AtomicUsize,
    closed: AtomicBool,
    closed_changed: Event,
}

/// A broker known to the embedded server without keeping it alive.
pub(crate) struct Weak(std::sync::Weak<Inner>);

impl Weak {
    pub(crate) fn upgrade(&self) -> Option<Arc<Inner>> {
        self.0.upgrade()
    }
    pub(crate) fn strong_count(&self) -> usize {
        self.0.strong_count()
    }
}

/// Waits until `done` holds, re-checking after each notification of `event`.
async fn wait_for(event: &Event, done: impl Fn() -> bool) {
    loop {
        if done() {
            return;
        }
        let listener = event.listen();
        if done() {
            return;
        }
        listener.await;
    }
}

impl Inner {
    fn new(endpoints: usize, max_pending: usize, memory: Option<Memory>) -> Self {
        // In-process, the broker reads the embedded server's clock: one read
        // serves the session and the server alike.
        let clock = memory
            .as_ref()
            .map_or_else(Clock::start, |memory| memory.hub.clock());
        Inner {
            clock,
            state: Mutex::new(State {
                broker: BrokerState::new(endpoints, max_pending),
                links: vec![None; endpoints],
                driver_targets_micros: vec![u64::MAX; endpoints],
                spare_slots: Vec::new(),
            }),
            memory,
            wakes: (0..endpoints).map(|_| Arc::new(Notify::new())).collect(),
            ready_changed: Event::new(),
            release_wake: Notify::new(),
            closing: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            shut_down_changed: Event::new(),
            handles: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
            closed_changed: Event::new(),
        }
    }

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
        self.shut_down.load(Ordering::Acquire)
    }

    fn start_close(&self) {
        if !self.closing.swap(true, Ordering::AcqRel) {
            self.release_wake.notify_one();
            self.ready_changed.notify(usize::MAX);
        }
    }

    fn shut_down_now(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.shut_down_changed.notify(usize::MAX);
        for wake in &self.wakes {
            wake.notify_one();
        }
    }

    /// The embedded server shut down: nothing can be acquired or released
    /// any more, so the broker closes at once (calls fail with `Closed`)
    /// instead of retrying until each call's deadline.
    pub(crate) fn server_gone(&self) {
        self.start_close();
        self.shut_down_now();
    }

    async fn wait_shutdown(&self) {
        wait_for(&self.shut_down_changed, || self.is_shut_down()).await;
    }

    /// Queues a background release (dropped ticket or compensation). Full
    /// or expired means dropped: the lease is the safety net.
    fn enqueue_release(&self, state: &mut State, now: Instant, keys: KeySet, token: u64) {
        state
            .broker
            .enqueue_release(now, keys, token, &mut |notice| self.notice(notice));
    }

    /// Drains `index`'s session events into the router, the waiters and the
    /// release queue.
    fn dispatch(&self, state: &mut State, index: usize, now: Instant) {
        state
            .broker
            .dispatch(index, now, &mut |notice| self.notice(notice));
    }

    /// Endpoint `index`'s transport is gone: its session and waiters hear
    /// it.
    fn transport_closed(&self, state: &mut State, index: usize, now: Instant) {
        state
            .broker
            .transport_closed(index, now, &mut |notice| self.notice(notice));
    }

    /// Wakes what the broker state reports.
    fn notice(&self, notice: BrokerNotice<'_>) {
        match notice {
            BrokerNotice::ReadyChanged => {
                self.ready_changed.notify(usize::MAX);
            }
            BrokerNotice::SessionClosed { .. } => {}
            BrokerNotice::Release { .. } => self.release_wake.notify_one(),
        }
    }

    /// In-process: moves bytes between every link of this broker and the
    /// server until both sides are idle, then handles what the sessions
    /// report. Links that ended are dropped (their tasks reconnect), and a
    /// task whose session now has an earlier deadline is woken.
    fn exchange(&self, state: &mut State, now: Instant) {
        self.exchange_links(state, now, None);
    }

    /// [`Self::exchange`] right after a submit on endpoint `submitted`:
    /// only that session and those the exchange touched can have events or
    /// a new deadline, so the others are not looked at.
    fn exchange_after_submit(&self, state: &mut State, now: Instant, submitted: usize) {
        self.exchange_links(state, now, Some(submitted));
    }

    fn exchange_links(&self, state: &mut State, now: Instant, submitted: Option<usize>) {
        let Some(memory) = &self.memory else {
            return;
        };
        // On the stack: an in-process broker has exactly IN_PROCESS_LINKS
        // endpoints, and this runs on every submit.
        let mut batch: [Option<MemoryLink<'_>>; IN_PROCESS_LINKS] = std::array::from_fn(|_| None);
        for ((link, session), conn) in batch
            .iter_mut()
            .zip(state.broker.sessions.iter_mut())
            .zip(&state.links)
        {
            if let (Some(session), Some(conn)) = (session.as_mut(), *conn) {
                *link = Some(MemoryLink {
                    conn,
                    session,
                    closed: false,
                    touched: false,
                });
            }
        }
        memory.hub.exchange(memory.owner, now, &mut batch);
        let linked: [Option<(bool, bool)>; IN_PROCESS_LINKS] = std::array::from_fn(|index| {
            batch[index]
                .as_ref()
                .map(|link| (link.closed, link.touched))
        });
        for (index, link) in linked.into_iter().enumerate() {
            let Some((closed, touched)) = link else {
                continue;
            };
            if submitted.is_some_and(|submitted| submitted != index) && !touched {
                continue;
            }
            if closed {
                state.links[index] = None;
                self.wakes[index].notify_one();
            }
            self.dispatch(state, index, now);
            let deadline = state.broker.sessions[index]
                .as_ref()
                .and_then(Session::poll_timeout)
                .map_or(u64::MAX, Instant::as_micros);
            if deadline < state.driver_targets_micros[index] {
                state.driver_targets_micros[index] = deadline;
                self.wakes[index].notify_one();
            }
        }
    }

    /// In-process: opens endpoint `index`'s link and runs its handshake
    /// (in memory, so it is ready when this returns). False if the server
    /// refused the link.
    fn open_memory_link(&self, index: usize, config: &SessionConfig) -> bool {
        let Some(memory) = &self.memory else {
            return false;
        };
        let now = self.now();
        let mut state = self.lock();
        let Some(conn) = memory
            .hub
            .connect_memory(memory.owner, Arc::clone(&self.wakes[index]))
        else {
            return false;
        };
        state.broker.sessions[index] = Some(Session::new(now, config.clone()));
        state.links[index] = Some(conn);
        self.exchange(&mut state, now);
        true
    }

    /// Submits one attempt on the connection the router picks and registers
    /// its waiter, all under one lock. In-process, the bytes are moved now.
    fn attempt(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Attempt<'_>, TicketError> {
        if self.is_shut_down() || (acquire && self.is_closing()) {
            return Err(TicketError::Closed);
        }
        let now = self.now();
        let mut state = self.lock();
        let slot = state.take_slot();
        let tx = OutcomeTx(Some(Arc::clone(&slot)));
        // On an error the dropped sender marks the slot abandoned, and the
        // slot is not reused.
        let (index, rid) = state.broker.submit(now, acquire, submit, tx)?;
        let reply = if self.memory.is_some() {
            self.exchange_after_submit(&mut state, now, index);
            // The embedded server usually answers within the exchange: the
            // outcome is then handed over here, with no wake and no wait.
            match slot.try_take() {
                Some(outcome) => {
                    state.give_back_slot(slot);
                    Reply::Ready(outcome)
                }
                None => Reply::Waiting(slot),
            }
        } else {
            drop(state);
            self.wakes[index].notify_one();
            Reply::Waiting(slot)
        };
        Ok(Attempt {
            inner: self,
            index,
            rid,
            reply,
        })
    }
}

/// Where an attempt's outcome is.
enum Reply {
    /// Delivered while it was submitted.
    Ready(Outcome),
    /// Still to come, in this slot.
    Waiting(Arc<ReplySlot>),
    /// Handed to the caller.
    Taken,
}

/// One submitted request. Dropping it before its outcome arrives cancels
/// the request in the core: unsent → gone; possibly sent → the session is
/// closed (Indeterminate); a grant that already arrived → released.
struct Attempt<'a> {
    inner: &'a Inner,
    index: usize,
    rid: u64,
    reply: Reply,
}

impl Attempt<'_> {
    async fn outcome(mut self) -> Outcome {
        let outcome = match &self.reply {
            Reply::Ready(_) => None,
            Reply::Waiting(slot) => Some(future::poll_fn(|cx| slot.poll_take(cx)).await),
            Reply::Taken => panic!("outcome awaited once"),
        };
        match std::mem::replace(&mut self.reply, Reply::Taken) {
            Reply::Ready(ready) => ready,
            // Slot reuse only happens under the broker lock; a slot that
            // has waited is simply freed.
            _ => outcome.expect("a waiting reply was awaited"),
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let delivered = match std::mem::replace(&mut self.reply, Reply::Taken) {
            Reply::Taken => return,
            Reply::Ready(outcome) => Some(outcome),
            Reply::Waiting(slot) => {
                let now = self.inner.now();
                let mut state = self.inner.lock();
                if state.broker.cancel(now, self.index, self.rid) {
                    self.inner.dispatch(&mut state, self.index, now);
                    // A cancel may close the session: the link must hear it.
                    self.inner.exchange(&mut state, now);
                    drop(state);
                    self.inner.wakes[self.index].notify_one();
                    return;
                }
                slot.try_take()
            }
        };
        if let Some(Outcome::Acquired(grant)) = delivered {
            // Delivered but never seen by the caller.
            let now = self.inner.now();
            let mut state = self.inner.lock();
            self.inner
                .enqueue_release(&mut state, now, grant.keys, grant.token);
        }
    }
}

// ---------------------------------------------------------------------------
// Endpoint tasks: in-process
// ---------------------------------------------------------------------------

/// Keeps endpoint `index`'s in-memory link up: serves its deadlines and the
/// bytes that arrive while no caller is moving them; reconnects (with the
/// core's backoff) when the session ends.
async fn run_memory_endpoint(inner: Arc<Inner>, index: usize, config: SessionConfig) {
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let linked = inner.lock().links[index].is_some() || inner.open_memory_link(index, &config);
        let delay = if linked {
            drive_memory(&inner, index).await;
            let session = inner.lock().broker.sessions[index].take();
            let Some(delay) = backoff.after_ended(session.as_ref()) else {
                // Authentication failed: reconnecting cannot fix it.
                return;
            };
            delay
        } else {
            backoff.after_connect_failure()
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

/// Runs one in-memory link until it ends.
async fn drive_memory(inner: &Inner, index: usize) {
    loop {
        let deadline = {
            let now = inner.now();
            let mut state = inner.lock();
            let shutdown = inner.is_shut_down();
            let Some(session) = state.broker.sessions[index].as_mut() else {
                return;
            };
            if shutdown {
                session.close_local(now);
            }
            session.handle_timeout(now);
            inner.exchange(&mut state, now);
            if state.links[index].is_none() {
                return;
            }
            let deadline = state.broker.sessions[index]
                .as_ref()
                .and_then(Session::poll_timeout);
            state.driver_targets_micros[index] = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        future::or(
            sleep_until_opt(inner.clock, deadline),
            inner.wakes[index].notified(),
        )
        .await;
    }
}

// ---------------------------------------------------------------------------
// Endpoint tasks: network
// ---------------------------------------------------------------------------

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// What one network endpoint task connects to.
struct Link {
    addr: String,
    session: SessionConfig,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

async fn connect(link: &Link) -> io::Result<Box<dyn Stream>> {
    let tcp = smol::net::TcpStream::connect(link.addr.as_str()).await?;
    tcp.set_nodelay(true)?;
    match &link.tls {
        None => Ok(Box::new(tcp)),
        Some((connector, name)) => Ok(Box::new(connector.connect(name.clone(), tcp).await?)),
    }
}

async fn run_network_endpoint(inner: Arc<Inner>, index: usize, link: Link) {
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let started = inner.now();
        inner.lock().broker.sessions[index] = Some(Session::new(started, link.session.clone()));
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

/// Runs one connected session until it or its transport ends.
async fn drive_network(inner: &Inner, index: usize, stream: Box<dyn Stream>) {
    let (mut reader, mut writer) = smol::io::split(stream);
    let read = async {
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
    };
    let write = async {
        let mut out = Vec::new();
        loop {
            let now = inner.now();
            let deadline = {
                let mut state = inner.lock();
                let shutdown = inner.is_shut_down();
                let Some(session) = state.broker.sessions[index].as_mut() else {
                    return;
                };
                if shutdown {
                    session.close_local(now);
                }
                session.handle_timeout(now);
                session.poll_transmit(now, &mut out);
                let closed = session.is_closed();
                let deadline = session.poll_timeout();
                inner.dispatch(&mut state, index, now);
                if closed {
                    return;
                }
                deadline
            };
            if !out.is_empty() {
                let written = future::or(
                    async {
                        let result = writer.write_all(&out).await;
                        result.and(writer.flush().await).is_ok()
                    },
                    async {
                        Timer::after(WRITE_PROGRESS_TIMEOUT).await;
                        false
                    },
                )
                .await;
                if !written {
                    return;
                }
                out.clear();
                continue;
            }
            future::or(sleep_until_opt(inner.clock, deadline), async {
                inner.wakes[index].notified().await;
                // Let the other tasks that are ready now submit first, so
                // that their requests leave in this write.
                future::yield_now().await;
            })
            .await;
        }
    };
    future::or(read, write).await;
    let now = inner.now();
    let mut state = inner.lock();
    inner.transport_closed(&mut state, index, now);
}

// ---------------------------------------------------------------------------
// Release worker
// ---------------------------------------------------------------------------

/// Runs queued background releases; on close, drains the queue (each
/// release keeps its own 5 s bound), then closes every session.
async fn run_release_worker(inner: Arc<Inner>, endpoints: Vec<Task<()>>) {
    let mut running: Vec<Task<()>> = Vec::new();
    loop {
        running.retain(|task| !task.is_finished());
        let now = inner.now();
        let job = if running.len() < RELEASE_WORKERS_MAX {
            inner.lock().broker.releases.pop(now)
        } else {
            None
        };
        if let Some(job) = job {
            let worker = Arc::clone(&inner);
            running.push(smol::spawn(async move {
                // An error leaves the lock to its lease: nothing to do here.
                let _ = run_release(&*worker, job).await;
                worker.release_wake.notify_one();
            }));
            continue;
        }
        let idle = inner.lock().broker.releases.is_empty() && running.is_empty();
        if inner.is_closing() && idle {
            break;
        }
        inner.release_wake.notified().await;
    }
    // Sessions see the shutdown in their task and close locally: pending
    // requests end (unsent → Retry, possibly sent → Indeterminate).
    inner.shut_down_now();
    for endpoint in endpoints {
        endpoint.await;
    }
    inner.closed.store(true, Ordering::Release);
    inner.closed_changed.notify(usize::MAX);
}

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// A distributed lock client: one shared handle per application (cheap to
/// clone). Over the network it keeps connections in the background and
/// heals them by itself; from [`EmbeddedServer::broker`] it talks to the
/// embedded server in memory. Same API and behaviour either way.
///
/// The last handle dropped starts the same close as [`TicketBroker::close`]
/// without waiting for it.
///
/// [`EmbeddedServer::broker`]: crate::EmbeddedServer::broker
pub struct TicketBroker {
    inner: Arc<Inner>,
}

impl fmt::Debug for TicketBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketBroker")
            .field("in_process", &self.inner.memory.is_some())
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
                max_pending: DEFAULT_MAX_PENDING,
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
    /// If the addresses are not valid loopback addresses; use
    /// [`TicketBroker::builder`] to get the error instead.
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

    pub(crate) fn downgrade(&self) -> Weak {
        Weak(Arc::downgrade(&self.inner))
    }

    pub(crate) fn server_gone(&self) {
        self.inner.server_gone();
    }

    /// Waits until some connection is ready; false if `timeout` passed, the
    /// broker is closing, or authentication failed.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let inner = &*self.inner;
        let check = || {
            let state = inner.lock();
            if inner.is_closing() {
                Some(false)
            } else if (0..state.broker.router.len()).any(|i| state.broker.router.is_ready(i)) {
                Some(true)
            } else if state.broker.router.auth_failed() {
                Some(false)
            } else {
                None
            }
        };
        let settled = async {
            loop {
                if let Some(ready) = check() {
                    return ready;
                }
                let listener = inner.ready_changed.listen();
                if let Some(ready) = check() {
                    return ready;
                }
                listener.await;
            }
        };
        future::or(settled, async {
            Timer::after(timeout).await;
            false
        })
        .await
    }

    /// True once some connection failed authentication (wrong token, or not
    /// the configured server); that connection is not retried.
    pub fn auth_failed(&self) -> bool {
        self.inner.lock().broker.router.auth_failed()
    }

    /// Acquires `key`, waiting at most `wait` in the server's FIFO queue
    /// (0 = one immediate try), for a lease of `lease` (1..=250 s).
    /// Sub-second values round up; out-of-range values are rejected, never
    /// clamped. The ticket is returned only if its conservative remaining
    /// lease covers `min_work_budget`.
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
        min_work_budget: Duration,
    ) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(key)?;
        let params = AcquireParams::new(wait, lease, min_work_budget)?;
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
        min_work_budget: Duration,
    ) -> Result<TicketSet, TicketError> {
        let keys = KeySet::new(keys)?;
        let params = AcquireParams::new(wait, lease, min_work_budget)?;
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(TicketSet::new(Arc::clone(&self.inner), grant))
    }

    /// Stops taking requests, finishes queued background releases (each
    /// bounded by the 5 s release window), then closes every connection.
    /// Requests still in flight end as Indeterminate (possibly sent) or
    /// Closed. Idempotent.
    pub async fn close(&self) {
        self.inner.start_close();
        let inner = &*self.inner;
        // The worker's own bounds end it within the window; this only
        // guards against a bug turning close into a hang.
        let bound = RELEASE_RETRY_WINDOW + WRITE_PROGRESS_TIMEOUT;
        future::or(
            wait_for(&inner.closed_changed, || {
                inner.closed.load(Ordering::Acquire)
            }),
            async {
                Timer::after(bound).await;
            },
        )
        .await;
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
        self.clock.sleep_until(at)
    }
    fn release_in_background(&self, grant: Grant) {
        let now = self.now();
        let mut state = self.lock();
        self.enqueue_release(&mut state, now, grant.keys, grant.token);
    }
}
