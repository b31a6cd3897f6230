//! The public [`TicketBroker`] and its builder: how a broker is made
//! (network or in-process) and what callers do with it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_io::Timer;
use smol::future;

use ticketing_core::client::{
    AcquireParams, BrokerConfig, BrokerMode, DEFAULT_MAX_PENDING, DEFAULT_SILENCE_TIMEOUT, KeySet,
    Leader, RELEASE_RETRY_WINDOW, SessionConfig, Ticket, TicketSet, WRITE_PROGRESS_TIMEOUT,
    run_acquire, run_campaign, run_observe,
};

use super::inner::{Inner, Memory, Weak, wait_for};
use super::memory::{IN_PROCESS_LINKS, run_memory_endpoint};
use super::network::{Link, run_network_endpoint};
use super::release::run_release_worker;
use crate::hub::Hub;
use crate::tls::{self, TlsMode};
use ticketing_core::client::ClientError as TicketError;
use ticketing_core::lock::KeyModes;
use ticketing_core::wire::Capabilities;

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
        let inner = Arc::new(Inner::new(links.len(), self.config.pending_max, None));
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
    let mut session = SessionConfig::single(hub.in_process_token().as_bytes());
    // Tickets of an embedded server renew, and hear of their loss, like any other.
    session.extensions = Capabilities::KNOWN;
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
