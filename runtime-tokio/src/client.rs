//! The async Rust client on tokio: [`TicketBroker`].
//!
//! Every rule of the official client (request ids, reply matching,
//! Indeterminate, which attempts may be retried, conservative validity, the
//! 5 s release window, reconnect backoff) lives in
//! [`ticketing_core::client`], and so do the acquire and release loops
//! ([`run_acquire`], [`run_release`](ticketing_core::client::run_release))
//! and the tickets; this module only moves bytes between sockets and the
//! core's [`Session`]s, reads the clock and parks futures (it implements
//! the core's [`Broker`]).
//!
//! Shape: one broker-wide [`BrokerState`] (sessions, router, pending-reply
//! map, release queue) and, per endpoint, what a caller needs to write to
//! its connection, behind a `std::sync::Mutex` that is never held across
//! an `.await`. Each endpoint has one task that connects, then drives the
//! connection alone: it reads, feeds the session and wakes the callers
//! whose outcomes arrived (without a hop to another task), writes what the
//! session hands out and serves its deadlines. A request alone on an idle
//! plain-TCP connection is written by its caller, under the lock, so the
//! uncontended path wakes no task until its reply comes; otherwise a
//! [`Notify`] per endpoint wakes the task, which yields once before taking
//! the session's bytes, so the requests of every task ready in that round
//! leave in one write. A caller's outcome is delivered in a one-shot slot
//! whose wake-up waits for the lock's release (`outcome`), so the caller
//! does not run only to block on the lock. A release worker drains the
//! release queue (dropped tickets, compensations). Files: `endpoint` (the
//! tasks), `outcome` (the slot), `problem` (why an address does not
//! connect), `tls` (the connector).
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
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use ticketing_core::client::{
    AcquireParams, Broker, BrokerConfig, BrokerNotice, BrokerState, Grant, KeySet, Outcome,
    PushNews, RELEASE_RETRY_WINDOW, Session, WRITE_PROGRESS_TIMEOUT, run_acquire, run_campaign,
    run_observe,
};
use ticketing_core::lock::KeyModes;
use ticketing_core::time::Instant;

use crate::serve::Clock;

pub use ticketing_core::client::{
    BrokerMode, ClientError as TicketError, ClusterIdentity, ClusterIdentityError,
    DEFAULT_MAX_PENDING, DEFAULT_SILENCE_TIMEOUT, ExtendResult, Leader, LossCause, Lost,
    ReleaseOutcome, RenewEnd, RenewPolicy, Ticket, TicketSet, TlsMode,
};
pub use ticketing_core::wire::ExtendStatus;

mod endpoint;
mod outcome;
mod problem;
mod tls;

pub use problem::ConnectProblem;

use endpoint::{Link, Wire, run_endpoint, run_release_worker};
use outcome::{OutcomeRx, OutcomeTx};
use tls::{server_name, tls_connector};

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
    /// A label naming this client to operators (e.g. `host/pid/job`), sent
    /// after each handshake and shown with its connections in inspection
    /// (`ticketing locks`): at most 64 bytes, no control characters
    /// (checked by `connect`). Default: none.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.config.label = label.into();
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
            addrs: endpoints
                .iter()
                .map(|endpoint| endpoint.addr.clone())
                .collect(),
            state: Mutex::new(State::new(endpoints.len(), self.config.pending_max)),
            wakes: endpoints.iter().map(|_| Notify::new()).collect(),
            ready_changed: Notify::new(),
            release_wake: Notify::new(),
            closing: AtomicBool::new(false),
            shutdown_tx: watch::channel(false).0,
            handles: AtomicUsize::new(1),
            socket_writes: AtomicU64::new(0),
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

/// The broker's lock held: unlocking wakes the callers whose outcomes
/// were sent under it ([`outcome::wake_deferred`]), so that none of them
/// runs while the lock is still held and blocks on it at once.
struct Locked<'a>(Option<MutexGuard<'a, State>>);

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        drop(self.0.take());
        outcome::wake_deferred();
    }
}

/// What the broker's lock guards: the core's state, and per endpoint what
/// a caller needs to write to its connection directly.
struct State {
    broker: BrokerState<OutcomeTx>,
    wires: Vec<Wire>,
    /// Per endpoint: what its last connection attempt that failed showed
    /// (see [`TicketBroker::connect_problems`]); `None` once one was ready.
    problems: Vec<Option<ConnectProblem>>,
}

impl State {
    fn new(endpoints: usize, pending_max: usize) -> Self {
        State {
            broker: BrokerState::new(endpoints, pending_max),
            wires: (0..endpoints).map(|_| Wire::default()).collect(),
            problems: vec![None; endpoints],
        }
    }
}

impl Deref for State {
    type Target = BrokerState<OutcomeTx>;
    fn deref(&self) -> &Self::Target {
        &self.broker
    }
}

impl DerefMut for State {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.broker
    }
}

struct Inner {
    clock: Clock,
    /// Each endpoint's address as configured, by index.
    addrs: Vec<String>,
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
    /// Writes made to the connections' sockets (see
    /// [`TicketBroker::socket_writes`]).
    socket_writes: AtomicU64,
    closed_tx: watch::Sender<bool>,
    closed_rx: watch::Receiver<bool>,
}

impl Inner {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock leaves sessions in an unknown state;
        // continuing could hand out a lock twice, so poisoning propagates.
        Locked(Some(self.state.lock().expect("client state poisoned")))
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

    /// Submits one attempt on the connection the router picks, registers
    /// its waiter and, when nobody can share its write, writes it, all
    /// under one lock.
    fn attempt(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Attempt<'_>, TicketError> {
        if self.is_shut_down() || (acquire && self.is_closing()) {
            return Err(TicketError::Closed);
        }
        let now = self.now();
        let (tx, rx) = outcome::channel();
        let mut state = self.lock();
        let (index, rid) = state.submit(now, acquire, submit, tx)?;
        let wake = self.write_direct(&mut state, index, now);
        drop(state);
        if wake {
            self.wakes[index].notify_one();
        }
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
    rx: Option<OutcomeRx>,
}

impl Attempt<'_> {
    async fn outcome(mut self) -> Outcome {
        let rx = self.rx.as_mut().expect("outcome awaited once");
        let outcome = rx.await;
        self.rx = None;
        outcome
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let Some(rx) = self.rx.take() else {
            return;
        };
        let now = self.inner.now();
        let mut state = self.inner.lock();
        if state.cancel(now, self.index, self.rid) {
            self.inner.dispatch(&mut state, self.index, now);
            drop(state);
            self.inner.wakes[self.index].notify_one();
        } else if let Some(Outcome::Acquired(grant)) = rx.try_take() {
            // Delivered but never seen by the caller.
            self.inner
                .enqueue_release(&mut state, now, grant.keys, grant.token);
        }
    }
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
                label: String::new(),
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

    /// Why each address that has no ready connection has none, as far as
    /// its connection attempts tell, in the order the addresses were
    /// given: (address, problem), one per connection (an address may have
    /// several). An address still connecting, or whose attempts tell
    /// nothing, is left out. For telling a user what to fix
    /// after [`TicketBroker::wait_ready`] gave up.
    pub fn connect_problems(&self) -> Vec<(String, ConnectProblem)> {
        let state = self.inner.lock();
        (0..self.inner.addrs.len())
            .filter(|&index| !state.router.is_ready(index))
            .filter_map(|index| {
                // Connected and still in the handshake: what it has (not)
                // heard so far says more than an older attempt.
                let live = state.sessions[index]
                    .as_ref()
                    .filter(|_| state.wires[index].connected)
                    .and_then(Session::handshake_clue)
                    .map(ConnectProblem::from_clue);
                let problem = live.or_else(|| state.problems[index].clone())?;
                Some((self.inner.addrs[index].clone(), problem))
            })
            .collect()
    }

    /// True once some connection failed authentication (wrong token, or not
    /// the configured server); that connection is not retried.
    pub fn auth_failed(&self) -> bool {
        self.inner.lock().router.auth_failed()
    }

    /// Writes this broker has made to its connections' sockets so far
    /// (successful or not; a TLS flush counts as one). Requests of tasks
    /// that become ready together share one write, and a request alone on
    /// its connection is written by its caller: for tests and diagnostics.
    pub fn socket_writes(&self) -> u64 {
        self.inner.socket_writes.load(Ordering::Relaxed)
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

    /// [`TicketBroker::acquire`] with a cap on total hold: however often it
    /// is renewed, the lock ends by `max_hold` after it was granted (the
    /// server may cut the cap to its own limit; docs/protocol.md §8.4).
    /// Fails with [`TicketError::Unsupported`], sending nothing, on a
    /// server that does not renew leases.
    pub async fn acquire_capped(
        &self,
        key: &str,
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
        max_hold: Duration,
    ) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(key)?;
        let params = AcquireParams::new(wait, lease, work_budget_min)?.with_max_hold(max_hold)?;
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

    /// Campaigns for the election `name` (docs/protocol.md §8.6): queues
    /// for the key in FIFO order with `lease` (3..=250 s, whole seconds),
    /// queueing again whenever a round's wait ends without it, until this
    /// broker leads. The ticket is the leadership: its token is the term
    /// (larger for every later leader), and it renews, hears of its loss
    /// and is released (a resign: the next candidate leads at once) like
    /// any ticket. Observers see this broker's label as the leader's.
    /// Drop the future to stop campaigning.
    pub async fn campaign(&self, name: &str, lease: Duration) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(name)?;
        let grant = run_campaign(&*self.inner, keys, lease).await?;
        Ok(Ticket::new(Arc::clone(&self.inner), grant))
    }

    /// Who leads the election `name` (docs/protocol.md §8.6): the leader's
    /// label and term, or `None` when nobody holds it. Read-only. Fails
    /// with [`TicketError::Unsupported`], sending nothing, on a server
    /// that does not serve it (a published server, or an older one).
    pub async fn observe(&self, name: &str) -> Result<Option<Leader>, TicketError> {
        let keys = KeySet::single(name)?;
        run_observe(&*self.inner, keys).await
    }

    /// Acquires `key` in **shared** mode (docs/protocol.md §8.7): held
    /// beside other shared holders, while an exclusive holder waits for all
    /// of them (and a shared request behind a queued exclusive one waits
    /// behind it). Same times and rules as [`TicketBroker::acquire`]; the
    /// ticket has its own token, is renewed and released like any ticket.
    /// Fence reads and writes by the two-mark rule of §8.7. Fails with
    /// [`TicketError::Unsupported`], sending nothing, on a server without
    /// shared locks (a published server, or an older one).
    pub async fn acquire_shared(
        &self,
        key: &str,
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(key)?;
        let params =
            AcquireParams::new(wait, lease, work_budget_min)?.with_modes(KeyModes::all_shared(1));
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(Ticket::new(Arc::clone(&self.inner), grant))
    }

    /// [`TicketBroker::acquire_shared`] with a cap on total hold, as
    /// [`TicketBroker::acquire_capped`] has: however often it is renewed,
    /// the shared grant ends by `max_hold` after it was granted.
    pub async fn acquire_shared_capped(
        &self,
        key: &str,
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
        max_hold: Duration,
    ) -> Result<Ticket, TicketError> {
        let keys = KeySet::single(key)?;
        let params = AcquireParams::new(wait, lease, work_budget_min)?
            .with_modes(KeyModes::all_shared(1))
            .with_max_hold(max_hold)?;
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(Ticket::new(Arc::clone(&self.inner), grant))
    }

    /// Acquires `exclusive` and `shared` keys atomically under one token,
    /// each in its mode (docs/protocol.md §8.7): e.g. `orders/42`
    /// exclusive with `catalog` shared. 1..=16 keys in all, none named
    /// twice. Same rules as [`TicketBroker::acquire_shared`].
    pub async fn acquire_set_modes<S: AsRef<str>>(
        &self,
        exclusive: &[S],
        shared: &[S],
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<TicketSet, TicketError> {
        let (keys, modes) = KeySet::with_modes(exclusive, shared)?;
        let params = AcquireParams::new(wait, lease, work_budget_min)?.with_modes(modes);
        let grant = run_acquire(&*self.inner, keys, params).await?;
        Ok(TicketSet::new(Arc::clone(&self.inner), grant))
    }

    /// Takes `permits` (1..=16) of the FIFO semaphore `name`, which has
    /// `capacity` (1..=1024) numbered slots (docs/protocol.md §8.5): the
    /// lowest free slots, under one token, once every earlier request for
    /// `name` was served (a request for many blocks the smaller ones
    /// behind it). Same times and rules as [`TicketBroker::acquire`]; the
    /// ticket's [`TicketSet::slots`] are the slots, and it is renewed and
    /// released like any ticket. Every user of `name` must declare the same
    /// capacity while it is in use ([`TicketError::CapacityMismatch`]).
    /// Fails with [`TicketError::Unsupported`], sending nothing, on a
    /// server without semaphores (a published server, or an older one).
    pub async fn acquire_permits(
        &self,
        name: &str,
        permits: u8,
        capacity: u16,
        wait: Duration,
        lease: Duration,
        work_budget_min: Duration,
    ) -> Result<TicketSet, TicketError> {
        let keys = KeySet::single(name)?;
        let params =
            AcquireParams::new(wait, lease, work_budget_min)?.with_permits(permits, capacity)?;
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
    fn news(&self, token: u64, waker: Option<&std::task::Waker>) -> PushNews {
        self.lock().news(token, waker)
    }
    fn leader_epoch(&self, waker: Option<&std::task::Waker>) -> u64 {
        self.lock().leader_epoch(waker)
    }
}
