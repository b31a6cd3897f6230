//! The broker around the sessions, shared by every runtime: the state kept
//! behind the broker's one lock ([`BrokerState`]) and the loops of one
//! logical acquire or release across attempts ([`run_acquire`],
//! [`run_release`]).
//!
//! A runtime keeps a [`BrokerState`] behind a mutex, moves bytes between
//! its sessions and transports, and implements [`Broker`]: reading its
//! clock, sleeping, and submitting one attempt whose outcome arrives on its
//! own one-shot channel ([`OutcomeSender`]). Everything decided between an
//! attempt's submission and the caller's result is here.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::pin;
use std::task::{Poll, Waker};

use super::error::{ClientError, CloseReason};
use super::ops::{
    AcquireOperation, AcquireStep, ExtendOperation, Extension, OBSERVE_RETRY_WINDOW,
    ObserveOperation, ReleaseOperation, ReleaseOutcome, ReleaseQueue, ReleaseStep,
};
use super::request::{AcquireParams, Grant, KeySet, Leader, Outcome};
use super::retried::{attempt, run_retried};
use super::routing::Router;
use super::session::{Session, SessionConfig, SessionEvent};
use super::watch::{NewsBoard, PushNews};
use crate::time::{Duration, Instant};
use crate::wire::Capabilities;

/// The sending half of a runtime's one-shot channel for one outcome.
pub trait OutcomeSender {
    /// Delivers `outcome`, or gives it back if the receiver is gone.
    fn send(self, outcome: Outcome) -> Result<(), Outcome>;
}

/// What [`BrokerState::dispatch`] and [`BrokerState::enqueue_release`] ask
/// the runtime to wake or log.
#[derive(Debug)]
pub enum BrokerNotice<'a> {
    /// A session became ready or failed authentication: wake the callers
    /// waiting for readiness.
    ReadyChanged,
    /// Endpoint `index`'s session closed (for logs).
    SessionClosed {
        /// The endpoint.
        index: usize,
        /// Why.
        reason: &'a CloseReason,
    },
    /// A background release of `token` was queued (`queued`), or dropped
    /// because the queue was full or its deadline had passed (the lease is
    /// then the safety net): wake the release worker.
    Release {
        /// The token to release.
        token: u64,
        /// False if the release was dropped.
        queued: bool,
    },
}

/// Hashes the `(endpoint, rid)` keys of the pending map with one multiply
/// per word (the Fx hash). The keys are our own: rids count up from 1 on
/// each session and a peer cannot choose them (a reply naming another rid
/// only misses), so there is nothing to flood and SipHash's cost, paid
/// twice per request, buys nothing.
#[derive(Clone, Copy, Default)]
struct RidHasher(u64);

impl Hasher for RidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

/// A request awaiting its outcome: who receives it, and whether it counts
/// against `pending_max`.
struct Waiter<W> {
    tx: W,
    acquire: bool,
}

/// The broker-wide state a runtime keeps behind one lock: the session of
/// each endpoint, the router, the requests awaiting outcomes and the
/// background release queue.
pub struct BrokerState<W> {
    /// The current session of each endpoint (`None` between attempts).
    pub sessions: Vec<Option<Session>>,
    /// Picks the endpoint of each attempt.
    pub router: Router,
    /// Background releases (dropped tickets, compensations).
    pub releases: ReleaseQueue,
    /// Outcome senders by (endpoint, rid).
    pending: HashMap<(usize, u64), Waiter<W>, BuildHasherDefault<RidHasher>>,
    acquires_in_flight: usize,
    pending_max: usize,
    /// The attempt of [`BrokerState::submit_direct`] until
    /// [`BrokerState::finish_direct`].
    direct: Option<Direct>,
    /// Per endpoint: sessions in a row whose connection closed on our
    /// unanswered `X`; at [`X_CLOSES_MAX`] (or at once, refused with
    /// `E 8`) its sessions no longer negotiate, for the broker's life. A
    /// negotiation answered starts the count again.
    x_closes: Vec<u8>,
    /// What the servers pushed about grants, until their tickets read it.
    news: NewsBoard,
    /// The retries waiting for a leader notice ([`BrokerState::leader_epoch`]),
    /// at most [`LEADER_WAKERS_MAX`]; those of retries that ran at their
    /// fallback instant instead stay until the next notice wakes them for
    /// nothing.
    leader_wakers: Vec<Waker>,
}

/// Retries waiting for a leader notice that the broker wakes at most; past
/// it the oldest is dropped, and that retry runs at its fallback instant
/// instead (later, never wrong).
pub const LEADER_WAKERS_MAX: usize = 1024;

/// Sessions in a row whose connection closed while our `X` was unanswered
/// after which an endpoint is taken to speak only the published protocol.
/// A published-protocol server closes on every `X`; one close can also be
/// a reset that happened to hit the negotiation, and renewal should not be
/// lost for the broker's life to one.
pub const X_CLOSES_MAX: u8 = 2;

/// An attempt whose caller collects its outcome itself, still under the
/// runtime's lock ([`BrokerState::submit_direct`]).
struct Direct {
    index: usize,
    rid: u64,
    acquire: bool,
    outcome: Option<Outcome>,
}

impl<W: OutcomeSender> BrokerState<W> {
    /// A broker of `endpoints` endpoints, none connected, allowing at most
    /// `pending_max` acquires in flight.
    pub fn new(endpoints: usize, pending_max: usize) -> Self {
        BrokerState {
            sessions: (0..endpoints).map(|_| None).collect(),
            router: Router::new(endpoints),
            releases: ReleaseQueue::default(),
            pending: HashMap::default(),
            acquires_in_flight: 0,
            pending_max,
            direct: None,
            x_closes: vec![0; endpoints],
            news: NewsBoard::default(),
            leader_wakers: Vec::new(),
        }
    }

    /// The router's count of leaders that became reachable
    /// ([`Router::leader_epoch`]); with `waker`, it is also woken when the
    /// count next moves.
    pub fn leader_epoch(&mut self, waker: Option<&Waker>) -> u64 {
        if let Some(waker) = waker
            && !self
                .leader_wakers
                .iter()
                .any(|known| known.will_wake(waker))
        {
            if self.leader_wakers.len() >= LEADER_WAKERS_MAX {
                self.leader_wakers.remove(0);
            }
            self.leader_wakers.push(waker.clone());
        }
        self.router.leader_epoch()
    }

    /// Retries waiting for a leader notice (bounded by [`LEADER_WAKERS_MAX`]).
    pub fn leader_wakers_len(&self) -> usize {
        self.leader_wakers.len()
    }

    /// What the servers pushed about grant `token` (docs/protocol.md
    /// §8.3); with `waker`, it is woken by the next push about it.
    pub fn news(&mut self, token: u64, waker: Option<&Waker>) -> PushNews {
        self.news.read(token, waker)
    }

    /// Grants the broker keeps pushed news of (bounded).
    pub fn news_len(&self) -> usize {
        self.news.len()
    }

    /// Starts endpoint `index`'s next session at `now` with `config`,
    /// without negotiating if its server has shown that it does not take
    /// our `X`.
    pub fn open_session(&mut self, index: usize, now: Instant, config: &SessionConfig) {
        let mut config = config.clone();
        if self.extensions_refused(index) {
            config.extensions = Capabilities::NONE;
        }
        self.sessions[index] = Some(Session::new(now, config));
    }

    /// True once endpoint `index`'s server has shown that it speaks only
    /// the published protocol (see [`BrokerState::open_session`]).
    pub fn extensions_refused(&self, index: usize) -> bool {
        self.x_closes[index] >= X_CLOSES_MAX
    }

    /// Submits one attempt (`submit`) on the session the router picks and
    /// registers `tx` for its outcome; returns the endpoint and request id.
    /// Acquires count against `pending_max` until their outcome is
    /// delivered or cancelled.
    pub fn submit(
        &mut self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
        tx: W,
    ) -> Result<(usize, u64), ClientError> {
        let (index, rid) = self.submit_unregistered(now, acquire, submit)?;
        self.pending.insert((index, rid), Waiter { tx, acquire });
        Ok((index, rid))
    }

    /// [`BrokerState::submit`] for a runtime that moves the request's
    /// bytes, and the reply's, before it lets go of its lock (in-process):
    /// an outcome dispatched until [`BrokerState::finish_direct`], which
    /// must follow under the same lock, is kept for it instead of being
    /// sent. One such attempt at a time.
    pub fn submit_direct(
        &mut self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<(usize, u64), ClientError> {
        debug_assert!(self.direct.is_none(), "finish_direct was not called");
        let (index, rid) = self.submit_unregistered(now, acquire, submit)?;
        self.direct = Some(Direct {
            index,
            rid,
            acquire,
            outcome: None,
        });
        Ok((index, rid))
    }

    /// Ends [`BrokerState::submit_direct`]: the outcome if it was
    /// dispatched meanwhile; otherwise the attempt waits like any other,
    /// for `tx()`, and `None`.
    pub fn finish_direct(&mut self, tx: impl FnOnce() -> W) -> Option<Outcome> {
        let direct = self.direct.take()?;
        if direct.outcome.is_some() {
            return direct.outcome;
        }
        self.pending.insert(
            (direct.index, direct.rid),
            Waiter {
                tx: tx(),
                acquire: direct.acquire,
            },
        );
        None
    }

    /// Submits on the session the router picks and counts the acquire; the
    /// caller registers who hears the outcome.
    fn submit_unregistered(
        &mut self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<(usize, u64), ClientError> {
        if acquire && self.acquires_in_flight >= self.pending_max {
            return Err(ClientError::ClientCapacity);
        }
        let sessions = &self.sessions;
        let index = self
            .router
            .pick_coalescing(|index| sessions[index].as_ref().map_or(0, Session::unsent_len))
            .ok_or_else(|| self.router.no_connection_error())?;
        let session = self.sessions[index]
            .as_mut()
            .ok_or(ClientError::NotConnected)?;
        let rid = submit(now, session)?;
        if acquire {
            self.acquires_in_flight += 1;
        }
        Ok((index, rid))
    }

    /// The caller stopped waiting for request `rid` on endpoint `index`.
    /// True if it was still pending: the session cancels it (unsent → gone,
    /// possibly sent → the session closes), and the runtime should
    /// [`dispatch`](Self::dispatch) and wake that endpoint. False if its
    /// outcome was already delivered: a grant in the runtime's receiver is
    /// then the runtime's to [`enqueue_release`](Self::enqueue_release).
    pub fn cancel(&mut self, now: Instant, index: usize, rid: u64) -> bool {
        let Some(waiter) = self.pending.remove(&(index, rid)) else {
            return false;
        };
        if waiter.acquire {
            self.acquires_in_flight -= 1;
        }
        if let Some(session) = self.sessions[index].as_mut() {
            session.cancel(now, rid);
        }
        true
    }

    /// Endpoint `index`'s transport is gone (or never came up): its session
    /// hears it, and what that ends (pending requests) is dispatched.
    pub fn transport_closed(
        &mut self,
        index: usize,
        now: Instant,
        notice: &mut impl FnMut(BrokerNotice<'_>),
    ) {
        if let Some(session) = self.sessions[index].as_mut() {
            session.handle_transport_closed(now);
        }
        self.dispatch(index, now, notice);
    }

    /// Queues a background release of `keys` under `token` and reports it.
    pub fn enqueue_release(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        notice: &mut impl FnMut(BrokerNotice<'_>),
    ) {
        let queued = self
            .releases
            .push(now, ReleaseOperation::new(now, keys, token));
        notice(BrokerNotice::Release { token, queued });
    }

    /// Drains endpoint `index`'s session events into the router, the
    /// waiting callers and the release queue. A grant nobody waits for any
    /// more (its caller gave up) is released in the background.
    pub fn dispatch(
        &mut self,
        index: usize,
        now: Instant,
        notice: &mut impl FnMut(BrokerNotice<'_>),
    ) {
        loop {
            let Some(session) = self.sessions[index].as_mut() else {
                return;
            };
            let Some(event) = session.poll_event() else {
                return;
            };
            let negotiated = session.capabilities() != Capabilities::NONE;
            let epoch = self.router.leader_epoch();
            self.router.handle_event(index, &event);
            if self.router.leader_epoch() != epoch {
                // A leader became reachable: the retries waiting for one
                // go now.
                self.leader_wakers.drain(..).for_each(Waker::wake);
            }
            match event {
                SessionEvent::Ready => {
                    if negotiated {
                        self.x_closes[index] = 0;
                    }
                    notice(BrokerNotice::ReadyChanged)
                }
                SessionEvent::Outcome { rid, outcome } => {
                    if let Some(direct) = self.direct.as_mut().filter(|direct| {
                        direct.index == index && direct.rid == rid && direct.outcome.is_none()
                    }) {
                        if direct.acquire {
                            self.acquires_in_flight -= 1;
                        }
                        direct.outcome = Some(outcome);
                        continue;
                    }
                    let Some(waiter) = self.pending.remove(&(index, rid)) else {
                        // Its caller gave up and cancelled it.
                        if let Outcome::Acquired(grant) = outcome {
                            self.enqueue_release(now, grant.keys, grant.token, notice);
                        }
                        continue;
                    };
                    if waiter.acquire {
                        self.acquires_in_flight -= 1;
                    }
                    if let Err(Outcome::Acquired(grant)) = waiter.tx.send(outcome) {
                        self.enqueue_release(now, grant.keys, grant.token, notice);
                    }
                }
                SessionEvent::Compensate(compensation) => {
                    self.enqueue_release(now, compensation.keys, compensation.token, notice);
                }
                SessionEvent::Closed(reason) => {
                    match reason {
                        CloseReason::ServerError(_) if reason.refuses_extensions() => {
                            self.x_closes[index] = X_CLOSES_MAX;
                        }
                        CloseReason::ExtensionsUnsupported => {
                            self.x_closes[index] = self.x_closes[index].saturating_add(1);
                        }
                        _ => {}
                    }
                    notice(BrokerNotice::SessionClosed {
                        index,
                        reason: &reason,
                    });
                    if reason.is_auth_failure() {
                        // Waiting for readiness gives up on an
                        // authentication failure.
                        notice(BrokerNotice::ReadyChanged);
                    }
                }
                SessionEvent::Push {
                    token,
                    kind,
                    lease_ms,
                } => {
                    self.news.pushed(now, token, kind, lease_ms);
                }
                SessionEvent::LeaderHint(_) | SessionEvent::NotLeader => {}
            }
        }
    }
}

/// An attempt's outcome as [`Broker::submit_at`] hands it back.
#[derive(Debug)]
pub enum Submitted<F> {
    /// Delivered while the attempt was submitted (an in-process broker whose
    /// server answered at once): there is nothing to wait for.
    Ready(Outcome),
    /// Still to come: await it. Dropping it before the outcome cancels the
    /// request ([`BrokerState::cancel`]).
    Waiting(F),
}

/// A runtime's broker as [`run_acquire`], [`run_release`] and the tickets
/// it hands out see it.
pub trait Broker: Send + Sync {
    /// The broker's clock now.
    fn now(&self) -> Instant;
    /// The std instant of `at` on the broker's clock.
    fn to_std(&self, at: Instant) -> std::time::Instant;
    /// Submits one attempt ([`BrokerState::submit`] under the broker's
    /// lock, then the transport is woken) and returns the future of its
    /// outcome. Dropping that future before the outcome cancels the request
    /// ([`BrokerState::cancel`]). An error means nothing was submitted.
    fn submit(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<impl Future<Output = Outcome> + Send + '_, ClientError>;
    /// [`Broker::submit`] at `now`, a reading of this broker's clock the
    /// caller has just taken (the attempt needs no reading of its own), for
    /// a broker that may have the outcome by the time it returns
    /// ([`Submitted::Ready`]: no future, no wake). The default ignores
    /// `now` and always waits.
    fn submit_at(
        &self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<Submitted<impl Future<Output = Outcome> + Send + '_>, ClientError> {
        let _ = now;
        Ok(Submitted::Waiting(self.submit(acquire, submit)?))
    }
    /// Sleeps until `at` on the broker's clock.
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_;
    /// Releases `grant` in the background: bounded and best effort, the
    /// lease being the safety net.
    fn release_in_background(&self, grant: Grant);
    /// What the servers pushed about grant `token`
    /// ([`BrokerState::news`] under the broker's lock); with `waker`, it is
    /// woken by the next push. The default knows of none: the holder's own
    /// clock bounds it anyway.
    fn news(&self, token: u64, waker: Option<&Waker>) -> PushNews {
        let _ = (token, waker);
        PushNews::default()
    }
    /// [`BrokerState::leader_epoch`] under the broker's lock: how many
    /// times a leader became reachable; with `waker`, it is woken when that
    /// next happens. The default never moves: retries then run at their
    /// fallback instants.
    fn leader_epoch(&self, waker: Option<&Waker>) -> u64 {
        let _ = waker;
        0
    }
}

/// Waits before the retry of an attempt that had no effect, submitted when
/// the broker's [`Broker::leader_epoch`] was `submitted_epoch`: until `at`
/// (the operation's fallback, within its deadline), or no longer than
/// until a leader becomes reachable, whichever comes first. If one became
/// reachable since the submission (an `M` naming a ready leader, an `L`
/// that came while the attempt was answered) it does not wait at all.
///
/// *Why:* during an election every node answers `E 4`; the winner
/// announces itself with `L` on every connection, and the request should
/// reach it with that notice, not at the next step of a fixed retry
/// schedule (docs/protocol.md §5).
pub async fn wait_for_retry<B: Broker + ?Sized>(broker: &B, at: Instant, submitted_epoch: u64) {
    let mut sleep = pin!(broker.sleep_until(at));
    poll_fn(|cx| {
        // Registered only while still waiting (checked again after, so a
        // notice between the two readings is not missed): a retry that
        // goes leaves no waker behind.
        if broker.leader_epoch(None) != submitted_epoch
            || broker.leader_epoch(Some(cx.waker())) != submitted_epoch
        {
            return Poll::Ready(());
        }
        sleep.as_mut().poll(cx)
    })
    .await;
}

/// One logical acquire of `keys` across attempts, until a grant the caller
/// may use or a final error. A grant that cannot be handed to the caller
/// is released in the background.
pub async fn run_acquire<B: Broker + ?Sized>(
    broker: &B,
    keys: KeySet,
    params: AcquireParams,
) -> Result<Grant, ClientError> {
    // The call's own clock reading also serves its first attempt.
    let mut now = broker.now();
    let mut op = AcquireOperation::new(now, keys, params);
    loop {
        let epoch = broker.leader_epoch(None);
        let step = match attempt(broker, now, true, |now, session| op.submit(now, session)).await {
            Ok((outcome, at)) => op.on_outcome(at, outcome),
            Err(ClientError::Closed) => return Err(ClientError::Closed),
            Err(error) => op.on_error(broker.now(), error),
        };
        match step {
            AcquireStep::Granted(grant) => return Ok(grant),
            AcquireStep::Failed(error) => return Err(error),
            AcquireStep::Compensate { error, grant } => {
                broker.release_in_background(grant);
                return Err(error);
            }
            AcquireStep::RetryAt(at) => {
                wait_for_retry(broker, at, epoch).await;
                now = broker.now();
            }
        }
    }
}

/// One logical renewal across attempts, until a final reply, an error or
/// the operation's deadline. Renewals do not count against the broker's
/// bound on acquires (a session bounds them with its releases).
pub async fn run_extend<B: Broker + ?Sized>(
    broker: &B,
    op: ExtendOperation,
) -> Result<Extension, ClientError> {
    run_retried(broker, broker.now(), op).await
}

/// Who holds the key `name` (docs/protocol.md §8.6): an election's leader
/// and term, or `None` when nobody does. Read-only, so retried across
/// attempts until an answer or [`OBSERVE_RETRY_WINDOW`] after the call;
/// [`ClientError::Unsupported`], sending nothing, on a server that does
/// not serve it (a cluster, or a published server).
pub async fn run_observe<B: Broker + ?Sized>(
    broker: &B,
    name: KeySet,
) -> Result<Option<Leader>, ClientError> {
    let now = broker.now();
    let op = ObserveOperation::new(name, now.saturating_add(OBSERVE_RETRY_WINDOW))?;
    run_retried(broker, now, op).await
}

/// Campaigns for the election `name` (docs/protocol.md §8.6): acquires the
/// key in FIFO order with `lease`, waiting in rounds so that a grant always
/// arrives with most of its lease left, and queueing again when a round's
/// wait ends without it (or when a grant came with too little lease to be
/// worth holding; it is released). Returns the grant: its token is the
/// term. Ends only with the grant or a final error; drop the future to
/// stop campaigning. `lease` must be 3..=250 s.
pub async fn run_campaign<B: Broker + ?Sized>(
    broker: &B,
    name: KeySet,
    lease: Duration,
) -> Result<Grant, ClientError> {
    let params = campaign_params(lease)?;
    loop {
        match run_acquire(broker, name.clone(), params).await {
            Ok(grant) => return Ok(grant),
            // The wait of the round ended, or a grant came late in it: a
            // candidate stays in the race.
            Err(ClientError::Timeout | ClientError::InsufficientLease) => {}
            // A limit: nothing queued; wait a moment before asking again.
            Err(ClientError::Busy | ClientError::ClientCapacity) => {
                let at = broker.now().saturating_add(CAMPAIGN_BUSY_DELAY);
                broker.sleep_until(at).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// How long a campaign waits after a busy answer before queueing again.
pub const CAMPAIGN_BUSY_DELAY: Duration = Duration::from_millis(200);

/// A campaign round's times for `lease`: the wait is a third of the lease
/// and the grant must come with at least a third left, so a grant that
/// arrives within the wait always counts (the lease counts from the
/// request) and the leader has a third of its lease to renew.
pub fn campaign_params(lease: Duration) -> Result<AcquireParams, ClientError> {
    let lease_s = lease.as_secs();
    if lease.subsec_nanos() != 0 || !(3..=250).contains(&lease_s) {
        return Err(ClientError::InvalidInput(
            "a campaign's lease must be whole seconds, 3..=250",
        ));
    }
    let third = Duration::from_secs(lease_s / 3);
    AcquireParams::new(third, lease, third)
}

/// How one release attempt went as far as its submission tells.
pub(super) enum ReleaseAttempted<F> {
    /// Decided already: the outcome arrived while submitting, or nothing
    /// could be submitted.
    Now(ReleaseStep),
    /// The outcome is still to come; [`release_step`] turns it into the
    /// next step.
    Waiting(F),
}

/// Submits one attempt of `op` at `now` (a fresh reading of `broker`'s
/// clock). The attempt owns what it submits, so the future of its outcome
/// does not borrow `op`.
pub(super) fn attempt_release<'b, B: Broker + ?Sized>(
    broker: &'b B,
    now: Instant,
    op: &mut ReleaseOperation,
) -> ReleaseAttempted<impl Future<Output = Outcome> + Send + use<'b, B>> {
    let attempt = op.attempt();
    let result =
        match broker.submit_at(now, false, move |now, session| attempt.submit(now, session)) {
            Ok(Submitted::Ready(outcome)) => Ok(outcome),
            Ok(Submitted::Waiting(outcome)) => return ReleaseAttempted::Waiting(outcome),
            Err(error) => Err(error),
        };
    ReleaseAttempted::Now(release_step(op, || broker.now(), result))
}

/// The step after a release attempt ended with `result`; the clock
/// (`now`) is read only when the step may be a retry, which a final reply
/// (the usual case) is not.
pub(super) fn release_step(
    op: &mut ReleaseOperation,
    now: impl FnOnce() -> Instant,
    result: Result<Outcome, ClientError>,
) -> ReleaseStep {
    match result {
        Ok(outcome) => op.on_outcome_with(now, outcome),
        Err(ClientError::Closed) => ReleaseStep::Done(Err(ClientError::Closed)),
        Err(error) => op.on_error(now(), error),
    }
}

/// One exact-token release across attempts, until a final reply or its
/// absolute deadline.
pub async fn run_release<B: Broker + ?Sized>(
    broker: &B,
    mut op: ReleaseOperation,
) -> Result<ReleaseOutcome, ClientError> {
    loop {
        let epoch = broker.leader_epoch(None);
        let step = match attempt_release(broker, broker.now(), &mut op) {
            ReleaseAttempted::Now(step) => step,
            ReleaseAttempted::Waiting(outcome) => {
                let outcome = outcome.await;
                release_step(&mut op, || broker.now(), Ok(outcome))
            }
        };
        match step {
            ReleaseStep::Done(result) => return result,
            ReleaseStep::RetryAt(at) => wait_for_retry(broker, at, epoch).await,
        }
    }
}
