//! What a caller holds after an acquire: [`Ticket`] (one key) and
//! [`TicketSet`] (a key set under one token), shared by every runtime's
//! broker.
//!
//! A ticket owns its [`Grant`] and gives it back exactly once: explicitly
//! with `release` (the caller waits for the final reply), or on drop (a
//! bounded background release). The broker that acquired it is reached
//! through its [`Broker`] implementation, so the ticket itself does no IO
//! and knows no runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::broker::{
    Broker, ReleaseAttempted, attempt_release, release_step, run_extend, run_release,
    wait_for_retry,
};
use super::error::ClientError;
use super::ops::{
    EXTEND_RETRY_WINDOW, ExtendOperation, Extension, ReleaseOperation, ReleaseOutcome, ReleaseStep,
};
use super::request::{Grant, KeySet};
use super::watch::{HolderWatch, LossCause, PushNews};
use crate::time::{Duration, Instant};
use crate::wire::ExtendStatus;

/// What a ticket needs of the broker that acquired it: a [`Broker`] as a
/// trait object.
trait Releaser: Send + Sync {
    fn now(&self) -> Instant;
    fn to_std(&self, at: Instant) -> std::time::Instant;
    /// Runs `op`, its first attempt submitted at `now`.
    fn release(&self, now: Instant, op: ReleaseOperation) -> Release<'_>;
    fn release_in_background(&self, grant: Grant);
    /// Runs a renewal.
    fn extend(&self, op: ExtendOperation) -> ExtendFuture<'_>;
    /// Runs a downgrade of grant `token` on `keys`.
    fn downgrade(&self, keys: KeySet, token: u64) -> DowngradeFuture<'_>;
    /// Sleeps until `at` on the broker's clock.
    fn sleep(&self, at: Instant) -> SleepFuture<'_>;
    /// What was pushed about grant `token`.
    fn news(&self, token: u64, waker: Option<&Waker>) -> PushNews;
}

type ExtendFuture<'a> = Pin<Box<dyn Future<Output = Result<Extension, ClientError>> + Send + 'a>>;
type DowngradeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send + 'a>>;
type SleepFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

impl<B: Broker> Releaser for B {
    fn now(&self) -> Instant {
        Broker::now(self)
    }
    fn to_std(&self, at: Instant) -> std::time::Instant {
        Broker::to_std(self, at)
    }
    fn release(&self, now: Instant, mut op: ReleaseOperation) -> Release<'_> {
        // The first attempt is submitted here: when the broker has its
        // outcome at once (in-process), the release is over without a
        // boxed future. Otherwise the rest of the loop is boxed, as the
        // ticket does not know the broker's type.
        let epoch = Broker::leader_epoch(self, None);
        let step = match attempt_release(self, now, &mut op) {
            ReleaseAttempted::Now(step) => step,
            ReleaseAttempted::Waiting(outcome) => {
                return Release::Running(Box::pin(async move {
                    let outcome = outcome.await;
                    let step = release_step(&mut op, || Broker::now(self), Ok(outcome));
                    finish_release(self, op, step, epoch).await
                }));
            }
        };
        match step {
            ReleaseStep::Done(result) => Release::Done(Some(result)),
            step @ ReleaseStep::RetryAt(_) => {
                Release::Running(Box::pin(finish_release(self, op, step, epoch)))
            }
        }
    }
    fn release_in_background(&self, grant: Grant) {
        Broker::release_in_background(self, grant);
    }
    fn extend(&self, op: ExtendOperation) -> ExtendFuture<'_> {
        Box::pin(run_extend(self, op))
    }
    fn downgrade(&self, keys: KeySet, token: u64) -> DowngradeFuture<'_> {
        Box::pin(super::downgrade::run_downgrade(self, keys, token))
    }
    fn sleep(&self, at: Instant) -> SleepFuture<'_> {
        Box::pin(self.sleep_until(at))
    }
    fn news(&self, token: u64, waker: Option<&Waker>) -> PushNews {
        Broker::news(self, token, waker)
    }
}

/// The rest of a release after the attempt that ended with `step`,
/// submitted at the broker's leader epoch `epoch`.
async fn finish_release<B: Broker>(
    broker: &B,
    op: ReleaseOperation,
    step: ReleaseStep,
    epoch: u64,
) -> Result<ReleaseOutcome, ClientError> {
    match step {
        ReleaseStep::Done(result) => result,
        ReleaseStep::RetryAt(at) => {
            wait_for_retry(broker, at, epoch).await;
            run_release(broker, op).await
        }
    }
}

type ReleaseResult = Result<ReleaseOutcome, ClientError>;

/// The future of an explicit release through a [`Releaser`].
enum Release<'a> {
    /// Ended with its first attempt (taken once).
    Done(Option<ReleaseResult>),
    /// Still running.
    Running(Pin<Box<dyn Future<Output = ReleaseResult> + Send + 'a>>),
}

impl Future for Release<'_> {
    type Output = ReleaseResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReleaseResult> {
        match self.get_mut() {
            Release::Done(result) => {
                Poll::Ready(result.take().expect("release polled after it ended"))
            }
            Release::Running(running) => running.as_mut().poll(cx),
        }
    }
}

/// What a renewal through a ticket gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtendResult {
    status: ExtendStatus,
    deadline: std::time::Instant,
}

impl ExtendResult {
    /// Renewed, clipped at the server's hold cap, or refused at the cap
    /// (then the lease did not change and the deadline is what is left).
    pub fn status(&self) -> ExtendStatus {
        self.status
    }
    /// The ticket's new conservative end of the lease: the lease the server
    /// answered, counted from when the renewal was sent.
    pub fn deadline(&self) -> std::time::Instant {
        self.deadline
    }
}

/// A granted lock and the broker it goes back to, released once.
struct Held {
    releaser: Arc<dyn Releaser>,
    grant: Option<Grant>,
    /// The conservative end of the lease and whether the grant is lost;
    /// what the server pushed is read from the broker into it.
    watch: HolderWatch,
}

impl Held {
    fn new<B: Broker + 'static>(broker: Arc<B>, grant: Grant) -> Self {
        // The drift margin is counted over the lease left now, which is
        // within a round trip of the lease asked for.
        let lease = grant
            .valid_before
            .saturating_duration_since(Broker::now(&*broker));
        let watch = HolderWatch::new(grant.valid_before, lease);
        let releaser: Arc<dyn Releaser> = broker;
        Held {
            releaser,
            grant: Some(grant),
            watch,
        }
    }
    /// Reads what the server pushed about the grant into the watch; with
    /// `waker`, it is woken by the next push.
    fn read_news(&self, waker: Option<&Waker>) {
        if let Some(grant) = &self.grant {
            self.watch.apply(self.releaser.news(grant.token, waker));
        }
    }
    fn is_lost(&self) -> bool {
        self.read_news(None);
        self.watch.lost().is_some()
    }
    async fn downgrade(&self) -> Result<(), ClientError> {
        if self.is_lost() {
            return Err(ClientError::Lost);
        }
        let grant = self.grant();
        let now = self.releaser.now();
        let result = self
            .releaser
            .downgrade(grant.keys.clone(), grant.token)
            .await;
        if matches!(result, Err(ClientError::Lost)) {
            self.watch.lose(now, LossCause::NotCurrent);
        }
        result
    }
    async fn extend(&self, lease: Duration) -> Result<ExtendResult, ClientError> {
        if self.is_lost() {
            // A loss is final: a renewal never brings a grant back.
            return Err(ClientError::Lost);
        }
        let grant = self.grant();
        let now = self.releaser.now();
        let op = ExtendOperation::new(
            grant.keys.clone(),
            grant.token,
            lease,
            now.saturating_add(EXTEND_RETRY_WINDOW),
        )?;
        match self.releaser.extend(op).await {
            Ok(extension) => {
                // Replaced, not maxed: a renewal may shorten the lease.
                self.watch.renewed(extension.valid_before, lease);
                Ok(ExtendResult {
                    status: extension.status,
                    deadline: self.releaser.to_std(extension.valid_before),
                })
            }
            Err(ClientError::Lost) => {
                self.watch.lose(now, LossCause::NotCurrent);
                Err(ClientError::Lost)
            }
            Err(ClientError::Indeterminate) => {
                // The `W` may have renewed the lease to `lease` from its
                // receipt, which may be shorter than what was left: only
                // the earlier of the two ends is certain.
                self.watch.clip(now.saturating_add(lease));
                Err(ClientError::Indeterminate)
            }
            Err(error) => Err(error),
        }
    }
    fn grant(&self) -> &Grant {
        self.grant.as_ref().expect("grant present until released")
    }
    fn token(&self) -> u64 {
        self.grant().token
    }
    fn valid_before(&self) -> std::time::Instant {
        self.read_news(None);
        self.releaser.to_std(self.watch.valid_before())
    }
    fn deadline(&self) -> std::time::Instant {
        self.read_news(None);
        self.releaser.to_std(self.watch.deadline())
    }
    fn remaining(&self) -> Duration {
        self.read_news(None);
        self.watch
            .valid_before()
            .saturating_duration_since(self.releaser.now())
    }
    fn lost_within(&self, lead: Duration) -> Lost<'_> {
        Lost {
            held: self,
            lead,
            sleep: None,
        }
    }
    async fn keep_alive(
        &self,
        policy: RenewPolicy,
        mut progress: impl FnMut() -> bool,
    ) -> RenewEnd {
        // The next renewal is due once the lease left is down to what a
        // renewal `every` ago would have left, and at least `every` after
        // the last attempt (a failed one moved nothing).
        let left_when_due = policy.lease.saturating_sub(policy.every);
        let mut attempted_at: Option<Instant> = None;
        loop {
            let due = Instant::from_micros(
                self.watch
                    .valid_before()
                    .as_micros()
                    .saturating_sub(u64::try_from(left_when_due.as_micros()).unwrap_or(u64::MAX)),
            );
            let due = attempted_at.map_or(due, |at| due.max(at.saturating_add(policy.every)));
            self.releaser.sleep(due).await;
            self.read_news(None);
            if let Some(cause) = self.watch.lost() {
                return RenewEnd::Lost(cause);
            }
            if !progress() {
                return RenewEnd::NoProgress;
            }
            attempted_at = Some(self.releaser.now());
            match self.extend(policy.lease).await {
                Ok(result) if result.status() == ExtendStatus::AtCap => return RenewEnd::AtCap,
                Ok(_) => {}
                Err(ClientError::Lost) => {
                    return RenewEnd::Lost(self.watch.lost().unwrap_or(LossCause::NotCurrent));
                }
                Err(ClientError::Unsupported(what)) => return RenewEnd::Unsupported(what),
                Err(ClientError::Closed) => return RenewEnd::Closed,
                // No connection, a timeout, an indeterminate answer: the
                // next period tries again, while the conservative end
                // (moved earlier by an indeterminate answer) bounds the
                // holder meanwhile.
                Err(_) => {}
            }
        }
    }
    async fn release(mut self) -> Result<ReleaseOutcome, ClientError> {
        let grant = self.grant.take().expect("grant present until released");
        // One clock reading for the call and its first attempt.
        let now = self.releaser.now();
        let op = ReleaseOperation::new(now, grant.keys, grant.token);
        self.releaser.release(now, op).await
    }
}

/// How a ticket renews itself ([`Ticket::keep_alive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewPolicy {
    /// The lease each renewal asks for (1..=250 s).
    pub lease: Duration,
    /// Time between renewals, from the send of the last one.
    pub every: Duration,
}

impl RenewPolicy {
    /// Renewals of `lease` every third of it: two renewals may fail before
    /// the lease runs out.
    pub fn thirds(lease: Duration) -> Self {
        RenewPolicy {
            lease,
            every: lease / 3,
        }
    }
}

/// Why [`Ticket::keep_alive`] stopped renewing. The ticket stays valid
/// until its conservative end; [`Ticket::lost`] says when that comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewEnd {
    /// The grant is gone.
    Lost(LossCause),
    /// The progress check failed: the work showed no life, so its lease is
    /// left to run out.
    NoProgress,
    /// The lease already reaches the grant's hold cap.
    AtCap,
    /// The server does not renew leases (it did not grant EXTEND).
    Unsupported(&'static str),
    /// The broker is closed.
    Closed,
}

/// The future of [`Ticket::lost`] and [`Ticket::lost_within`]: resolves
/// with the cause once the grant is lost (a push, a renewal answered "not
/// current") or once the ticket's own deadline, less the lead asked for,
/// has come. It follows the deadline as renewals move it.
pub struct Lost<'a> {
    held: &'a Held,
    lead: Duration,
    /// The sleep until the instant it was armed for.
    sleep: Option<(Instant, SleepFuture<'a>)>,
}

impl fmt::Debug for Lost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost")
            .field("lead", &self.lead)
            .finish_non_exhaustive()
    }
}

impl Future for Lost<'_> {
    type Output = LossCause;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LossCause> {
        let this = self.get_mut();
        let watch = &this.held.watch;
        loop {
            // Registered before reading, so a change after the reading
            // wakes this future: a renewal with the watch, a push with
            // the broker.
            watch.register(cx.waker());
            this.held.read_news(Some(cx.waker()));
            if let Some(cause) = watch.lost() {
                return Poll::Ready(cause);
            }
            let now = this.held.releaser.now();
            let at = Instant::from_micros(
                watch
                    .deadline()
                    .as_micros()
                    .saturating_sub(u64::try_from(this.lead.as_micros()).unwrap_or(u64::MAX)),
            );
            if now >= at {
                return Poll::Ready(LossCause::Deadline);
            }
            let sleep = match &mut this.sleep {
                Some((armed, sleep)) if *armed == at => sleep,
                slot => &mut slot.insert((at, this.held.releaser.sleep(at))).1,
            };
            match sleep.as_mut().poll(cx) {
                // Checked again: the clock now says.
                Poll::Ready(()) => this.sleep = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            self.releaser.release_in_background(grant);
        }
    }
}

/// A lock on one key. Dropping it releases it in the background (bounded,
/// best effort); use [`Ticket::release`] to learn the result.
#[must_use = "dropping a Ticket releases the lock; keep it while the protected work runs"]
pub struct Ticket {
    held: Held,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.key())
            .field("token", &self.token())
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The ticket for `grant`, a single-key grant acquired by `broker`
    /// (for runtimes: a broker's `acquire` hands this out).
    pub fn new<B: Broker + 'static>(broker: Arc<B>, grant: Grant) -> Self {
        Ticket {
            held: Held::new(broker, grant),
        }
    }
    /// The key held.
    pub fn key(&self) -> &str {
        self.held.grant().keys.keys()[0].as_str()
    }
    /// The fencing token: strictly greater than every token granted before.
    /// Reject `token <= high_water` at the protected write, in the same
    /// transaction.
    pub fn token(&self) -> u64 {
        self.held.token()
    }
    /// Conservative end of the lease (counted from before the request was
    /// sent); the server's lease ends later.
    pub fn conservative_valid_before(&self) -> std::time::Instant {
        self.held.valid_before()
    }
    /// Conservative lease remaining now (zero once past).
    pub fn remaining(&self) -> Duration {
        self.held.remaining()
    }
    /// Renews the lease to `lease` (1..=250 s, rounded up) from the server's
    /// receipt, keeping the token (docs/protocol.md §8, `W`); retried for up
    /// to 5 s while it certainly had no effect. On success
    /// [`conservative_valid_before`](Self::conservative_valid_before) and
    /// [`remaining`](Self::remaining) move to the new conservative end,
    /// counted from when the renewal was sent (a renewal may also shorten
    /// the lease). Errors: [`ClientError::Lost`] when the grant is gone
    /// (released, expired, force-released: stop the work; the ticket then
    /// reports [`is_lost`](Self::is_lost) and its release is harmless);
    /// [`ClientError::Unsupported`] when the server does not grant renewals;
    /// [`ClientError::Indeterminate`] when the renewal may have taken effect
    /// (the conservative end then becomes the earlier of the old one and
    /// `lease` from the call; call again to learn where the grant stands).
    pub async fn extend(&self, lease: Duration) -> Result<ExtendResult, ClientError> {
        self.held.extend(lease).await
    }
    /// When the work must be done, by this machine's clock: the
    /// conservative end of the lease less a margin for clock drift (1 part
    /// in 200 of the lease). Moves with each renewal, and earlier on a push
    /// from the server; never after any node's expiry of the grant.
    pub fn deadline(&self) -> std::time::Instant {
        self.held.deadline()
    }
    /// Resolves once the lock is lost or may be: on a push saying it is
    /// gone (expired, force-released, cap reached), a renewal answered "not
    /// current", or the [`deadline`](Self::deadline) passing, with the
    /// cause. Run the work beside it and stop the work when it resolves.
    pub fn lost(&self) -> Lost<'_> {
        self.held.lost_within(Duration::ZERO)
    }
    /// [`lost`](Self::lost), but resolving `lead` before the deadline: the
    /// time the work needs to stop.
    pub fn lost_within(&self, lead: Duration) -> Lost<'_> {
        self.held.lost_within(lead)
    }
    /// Renews the lease by `policy` for as long as the returned future is
    /// polled, each renewal only if `progress()` says the work still shows
    /// life; resolves when renewal stops, with why. It borrows the ticket,
    /// so no renewal outlives the ticket: drop the future (or the ticket)
    /// and renewal stops, and the lease runs out on its own. Run it beside
    /// the work and [`lost`](Self::lost).
    pub async fn keep_alive(
        &self,
        policy: RenewPolicy,
        progress: impl FnMut() -> bool,
    ) -> RenewEnd {
        self.held.keep_alive(policy, progress).await
    }
    /// True once the grant is known to be gone (a renewal answered "not
    /// current", or the server pushed its loss).
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
    /// Downgrades the grant from exclusive to shared in one server step
    /// (docs/protocol.md §8.7): the token, the lease and the place stay,
    /// and shared requests queued directly behind join at once. There is
    /// no upgrade: to write again, release and acquire exclusive. Retried
    /// for up to 5 s while it certainly had no effect or its answer was
    /// lost (a second downgrade is harmless). Errors:
    /// [`ClientError::Lost`] when the grant is gone;
    /// [`ClientError::Unsupported`] when the server has no shared locks.
    pub async fn downgrade(&self) -> Result<(), ClientError> {
        self.held.downgrade().await
    }
    /// Releases with the exact token, retrying for up to 5 s. `Ok` only on a
    /// final reply; an error means the result is unknown and the lease is the
    /// safety net.
    pub async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        self.held.release().await
    }
}

/// A lock on a set of keys under one token. Dropping it releases it in the
/// background; use [`TicketSet::release`] to learn the result.
#[must_use = "dropping a TicketSet releases the whole set; keep it while the protected work runs"]
pub struct TicketSet {
    held: Held,
}

impl fmt::Debug for TicketSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketSet")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .field("token", &self.token())
            .finish_non_exhaustive()
    }
}

impl TicketSet {
    /// The ticket for `grant`, acquired by `broker` (for runtimes: a
    /// broker's `acquire_set` hands this out).
    pub fn new<B: Broker + 'static>(broker: Arc<B>, grant: Grant) -> Self {
        TicketSet {
            held: Held::new(broker, grant),
        }
    }
    /// The keys held, ascending by bytes, without duplicates.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.held.grant().keys.keys().iter().map(|key| key.as_str())
    }
    /// The fencing token shared by the whole set.
    pub fn token(&self) -> u64 {
        self.held.token()
    }
    /// For a semaphore's permits: the slots held, ascending (their keys
    /// are [`keys`](Self::keys)); they double as worker ids. Empty for a
    /// key set.
    pub fn slots(&self) -> &[u16] {
        self.held
            .grant()
            .permits
            .as_ref()
            .map_or(&[], |permits| &permits.slots)
    }
    /// For a semaphore's permits: the slots left free when these were
    /// granted. `None` for a key set.
    pub fn free_at_grant(&self) -> Option<u16> {
        self.held
            .grant()
            .permits
            .as_ref()
            .map(|permits| permits.free)
    }
    /// Conservative end of the lease.
    pub fn conservative_valid_before(&self) -> std::time::Instant {
        self.held.valid_before()
    }
    /// Conservative lease remaining now (zero once past).
    pub fn remaining(&self) -> Duration {
        self.held.remaining()
    }
    /// Renews the whole set's lease; see [`Ticket::extend`].
    pub async fn extend(&self, lease: Duration) -> Result<ExtendResult, ClientError> {
        self.held.extend(lease).await
    }
    /// When the work must be done, by this machine's clock: the
    /// conservative end of the lease less a margin for clock drift (1 part
    /// in 200 of the lease). Moves with each renewal, and earlier on a push
    /// from the server; never after any node's expiry of the grant.
    pub fn deadline(&self) -> std::time::Instant {
        self.held.deadline()
    }
    /// Resolves once the lock is lost or may be: on a push saying it is
    /// gone (expired, force-released, cap reached), a renewal answered "not
    /// current", or the [`deadline`](Self::deadline) passing, with the
    /// cause. Run the work beside it and stop the work when it resolves.
    pub fn lost(&self) -> Lost<'_> {
        self.held.lost_within(Duration::ZERO)
    }
    /// [`lost`](Self::lost), but resolving `lead` before the deadline: the
    /// time the work needs to stop.
    pub fn lost_within(&self, lead: Duration) -> Lost<'_> {
        self.held.lost_within(lead)
    }
    /// Renews the lease by `policy` for as long as the returned future is
    /// polled, each renewal only if `progress()` says the work still shows
    /// life; resolves when renewal stops, with why. It borrows the ticket,
    /// so no renewal outlives the ticket: drop the future (or the ticket)
    /// and renewal stops, and the lease runs out on its own. Run it beside
    /// the work and [`lost`](Self::lost).
    pub async fn keep_alive(
        &self,
        policy: RenewPolicy,
        progress: impl FnMut() -> bool,
    ) -> RenewEnd {
        self.held.keep_alive(policy, progress).await
    }
    /// True once the grant is known to be gone (a renewal answered "not
    /// current", or the server pushed its loss).
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
    /// Downgrades the whole grant to shared in place (the keys it holds
    /// exclusive become shared; same token and lease); see
    /// [`Ticket::downgrade`].
    pub async fn downgrade(&self) -> Result<(), ClientError> {
        self.held.downgrade().await
    }
    /// Releases the whole set with the exact token; see [`Ticket::release`].
    pub async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        self.held.release().await
    }
}
