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
use std::task::{Context, Poll};

use super::broker::{Broker, ReleaseAttempted, attempt_release, release_step, run_release};
use super::error::ClientError;
use super::ops::{ReleaseOperation, ReleaseOutcome, ReleaseStep};
use super::request::Grant;
use crate::time::{Duration, Instant};

/// What a ticket needs of the broker that acquired it: a [`Broker`] as a
/// trait object.
trait Releaser: Send + Sync {
    fn now(&self) -> Instant;
    fn to_std(&self, at: Instant) -> std::time::Instant;
    /// Runs `op`, its first attempt submitted at `now`.
    fn release(&self, now: Instant, op: ReleaseOperation) -> Release<'_>;
    fn release_in_background(&self, grant: Grant);
}

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

/// A granted lock and the broker it goes back to, released once.
struct Held {
    releaser: Arc<dyn Releaser>,
    grant: Option<Grant>,
}

impl Held {
    fn grant(&self) -> &Grant {
        self.grant.as_ref().expect("grant present until released")
    }
    fn token(&self) -> u64 {
        self.grant().token
    }
    fn valid_before(&self) -> std::time::Instant {
        self.releaser.to_std(self.grant().valid_before)
    }
    fn remaining(&self) -> Duration {
        self.grant()
            .valid_before
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
            held: Held {
                releaser,
                grant: Some(grant),
            },
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
            held: Held {
                releaser,
                grant: Some(grant),
            },
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
    /// Releases the whole set with the exact token; see [`Ticket::release`].
    pub async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        self.held.release().await
    }
}
