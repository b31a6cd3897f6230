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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use super::broker::{
    Broker, ReleaseAttempted, attempt_release, release_step, run_extend, run_release,
};
use super::error::ClientError;
use super::ops::{
    EXTEND_RETRY_WINDOW, ExtendOperation, Extension, ReleaseOperation, ReleaseOutcome, ReleaseStep,
};
use super::request::Grant;
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
}

type ExtendFuture<'a> = Pin<Box<dyn Future<Output = Result<Extension, ClientError>> + Send + 'a>>;

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
        let step = match attempt_release(self, now, &mut op) {
            ReleaseAttempted::Now(step) => step,
            ReleaseAttempted::Waiting(outcome) => {
                return Release::Running(Box::pin(async move {
                    let outcome = outcome.await;
                    let step = release_step(&mut op, || Broker::now(self), Ok(outcome));
                    finish_release(self, op, step).await
                }));
            }
        };
        match step {
            ReleaseStep::Done(result) => Release::Done(Some(result)),
            step @ ReleaseStep::RetryAt(_) => {
                Release::Running(Box::pin(finish_release(self, op, step)))
            }
        }
    }
    fn release_in_background(&self, grant: Grant) {
        Broker::release_in_background(self, grant);
    }
    fn extend(&self, op: ExtendOperation) -> ExtendFuture<'_> {
        Box::pin(run_extend(self, op))
    }
}

/// The rest of a release after the attempt that ended with `step`.
async fn finish_release<B: Broker>(
    broker: &B,
    op: ReleaseOperation,
    step: ReleaseStep,
) -> Result<ReleaseOutcome, ClientError> {
    match step {
        ReleaseStep::Done(result) => result,
        ReleaseStep::RetryAt(at) => {
            broker.sleep_until(at).await;
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
    /// The conservative end of the lease in microseconds of the broker's
    /// clock: the grant's, then each renewal's. Atomic so that a ticket
    /// shared by reference can be renewed (by a heartbeat task, say) while
    /// the work reads it.
    valid_before_us: AtomicU64,
    /// A renewal was answered `N`: the grant is gone for good.
    lost: AtomicBool,
}

impl Held {
    fn new(releaser: Arc<dyn Releaser>, grant: Grant) -> Self {
        Held {
            valid_before_us: AtomicU64::new(grant.valid_before.as_micros()),
            releaser,
            grant: Some(grant),
            lost: AtomicBool::new(false),
        }
    }
    fn valid_before_core(&self) -> Instant {
        Instant::from_micros(self.valid_before_us.load(Ordering::Acquire))
    }
    /// Moves the conservative end no later than `at`.
    fn clip_valid_before(&self, at: Instant) {
        self.valid_before_us
            .fetch_min(at.as_micros(), Ordering::AcqRel);
    }
    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
    async fn extend(&self, lease: Duration) -> Result<ExtendResult, ClientError> {
        if self.is_lost() {
            // `N` is final: a renewal never brings a grant back.
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
                self.valid_before_us
                    .store(extension.valid_before.as_micros(), Ordering::Release);
                Ok(ExtendResult {
                    status: extension.status,
                    deadline: self.releaser.to_std(extension.valid_before),
                })
            }
            Err(ClientError::Lost) => {
                self.lost.store(true, Ordering::Release);
                self.clip_valid_before(now);
                Err(ClientError::Lost)
            }
            Err(ClientError::Indeterminate) => {
                // The `W` may have renewed the lease to `lease` from its
                // receipt, which may be shorter than what was left: only
                // the earlier of the two ends is certain.
                self.clip_valid_before(now.saturating_add(lease));
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
        self.releaser.to_std(self.valid_before_core())
    }
    fn remaining(&self) -> Duration {
        self.valid_before_core()
            .saturating_duration_since(self.releaser.now())
    }
    async fn release(mut self) -> Result<ReleaseOutcome, ClientError> {
        let grant = self.grant.take().expect("grant present until released");
        // One clock reading for the call and its first attempt.
        let now = self.releaser.now();
        let op = ReleaseOperation::new(now, grant.keys, grant.token);
        self.releaser.release(now, op).await
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
        let releaser: Arc<dyn Releaser> = broker;
        Ticket {
            held: Held::new(releaser, grant),
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
    /// True once a renewal found the grant gone.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
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
        let releaser: Arc<dyn Releaser> = broker;
        TicketSet {
            held: Held::new(releaser, grant),
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
    /// True once a renewal found the grant gone.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
    /// Releases the whole set with the exact token; see [`Ticket::release`].
    pub async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        self.held.release().await
    }
}
