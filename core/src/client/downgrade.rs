//! A downgrade (`D`, docs/protocol.md §8.7) of an exclusive grant to
//! shared, across attempts: the operation's rule, and the loop a broker
//! runs it in.

use super::broker::Broker;
use super::error::ClientError;
use super::ops::{ACQUIRE_RETRY_MAX, RETRY_MIN};
use super::request::{KeySet, Outcome};
use super::retried::run_retried;
use super::session::Session;
use crate::time::{Duration, Instant};

/// How long a downgrade keeps trying while its attempts certainly had no
/// effect or may have been lost.
pub const DOWNGRADE_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// What to do next in a downgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DowngradeStep {
    /// Finished: downgraded, or a final error ([`ClientError::Lost`]: the
    /// grant is not current any more).
    Done(Result<(), ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// One logical downgrade of the grant `token` on `keys`. Downgrading a
/// grant that is already shared changes nothing and is answered the same,
/// so an attempt whose answer may have been lost is simply made again.
#[derive(Clone, Debug)]
pub struct DowngradeOperation {
    keys: KeySet,
    token: u64,
    deadline: Instant,
    retry_delay: Duration,
}

impl DowngradeOperation {
    /// A downgrade of grant `token` on `keys` (every key of the grant),
    /// given up at `deadline`.
    pub fn new(keys: KeySet, token: u64, deadline: Instant) -> Self {
        DowngradeOperation {
            keys,
            token,
            deadline,
            retry_delay: RETRY_MIN,
        }
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_downgrade(now, self.keys.clone(), self.token, self.deadline)
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> DowngradeStep {
        match outcome {
            Outcome::Downgraded => DowngradeStep::Done(Ok(())),
            Outcome::NotFound => DowngradeStep::Done(Err(ClientError::Lost)),
            // Idempotent: an answer that may have been lost is asked again.
            Outcome::Retry | Outcome::Indeterminate => self.retry(now),
            Outcome::Timeout => DowngradeStep::Done(Err(ClientError::Timeout)),
            Outcome::Error(code) => DowngradeStep::Done(Err(ClientError::Protocol(format!(
                "server rejected downgrade with {code:?}"
            )))),
            Outcome::Acquired(_)
            | Outcome::Busy
            | Outcome::Released
            | Outcome::Extended { .. }
            | Outcome::CapacityMismatch { .. }
            | Outcome::Observed(_) => DowngradeStep::Done(Err(ClientError::Protocol(
                "another request's reply to a downgrade".into(),
            ))),
        }
    }
    /// An attempt could not be made.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> DowngradeStep {
        match error {
            ClientError::NotConnected | ClientError::ClientCapacity => self.retry(now),
            other => DowngradeStep::Done(Err(other)),
        }
    }
    fn retry(&mut self, now: Instant) -> DowngradeStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return DowngradeStep::Done(Err(ClientError::Timeout));
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(ACQUIRE_RETRY_MAX);
        DowngradeStep::RetryAt(now.saturating_add(delay))
    }
}

/// Runs a downgrade of grant `token` on `keys` on `broker`, retrying for
/// up to [`DOWNGRADE_RETRY_WINDOW`] while it certainly had no effect or
/// its answer may have been lost.
pub async fn run_downgrade<B: Broker + ?Sized>(
    broker: &B,
    keys: KeySet,
    token: u64,
) -> Result<(), ClientError> {
    let now = broker.now();
    let deadline = now.saturating_add(DOWNGRADE_RETRY_WINDOW);
    run_retried(broker, now, DowngradeOperation::new(keys, token, deadline)).await
}
