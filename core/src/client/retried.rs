//! The loop of one logical operation across attempts, for the operations
//! that end with a result or try again at an instant: a renewal
//! ([`ExtendOperation`]), a downgrade ([`DowngradeOperation`]) and an
//! observe ([`ObserveOperation`]). An acquire (which may have to release a
//! grant it cannot hand over) and a release keep loops of their own.

use super::broker::{Broker, Submitted, wait_for_retry};
use super::downgrade::{DowngradeOperation, DowngradeStep};
use super::error::ClientError;
use super::ops::{ExtendOperation, ExtendStep, Extension, ObserveOperation, ObserveStep};
use super::request::{Leader, Outcome};
use super::session::Session;
use crate::time::Instant;

/// What to do after an attempt of a [`Retried`] operation.
pub(crate) enum Next<T> {
    /// Finished, with this result.
    Done(Result<T, ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// An operation [`run_retried`] drives: its attempts' submission and
/// rules, as the operation's own methods of the same names.
pub(crate) trait Retried {
    /// What the operation ends with.
    type Output;
    /// Submits one attempt on `session`.
    fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError>;
    /// An attempt ended with `outcome`.
    fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> Next<Self::Output>;
    /// An attempt could not be made.
    fn on_error(&mut self, now: Instant, error: ClientError) -> Next<Self::Output>;
}

/// Implements [`Retried`] for an operation whose methods `submit`,
/// `on_outcome` and `on_error` answer with its step enum.
macro_rules! retried {
    ($operation:ty, $step:ident, $output:ty) => {
        impl Retried for $operation {
            type Output = $output;
            fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
                <$operation>::submit(self, now, session)
            }
            fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> Next<$output> {
                match <$operation>::on_outcome(self, now, outcome) {
                    $step::Done(result) => Next::Done(result),
                    $step::RetryAt(at) => Next::RetryAt(at),
                }
            }
            fn on_error(&mut self, now: Instant, error: ClientError) -> Next<$output> {
                match <$operation>::on_error(self, now, error) {
                    $step::Done(result) => Next::Done(result),
                    $step::RetryAt(at) => Next::RetryAt(at),
                }
            }
        }
    };
}

retried!(ExtendOperation, ExtendStep, Extension);
retried!(DowngradeOperation, DowngradeStep, ());
retried!(ObserveOperation, ObserveStep, Option<Leader>);

/// Runs `op` on `broker` until a final result, its first attempt at `now`
/// (the caller's own clock reading). Such attempts do not count against
/// the broker's bound on acquires.
pub(crate) async fn run_retried<B: Broker + ?Sized, O: Retried>(
    broker: &B,
    mut now: Instant,
    mut op: O,
) -> Result<O::Output, ClientError> {
    loop {
        let epoch = broker.leader_epoch(None);
        let step = match attempt(broker, now, false, |now, session| op.submit(now, session)).await {
            Ok((outcome, at)) => op.on_outcome(at, outcome),
            Err(ClientError::Closed) => return Err(ClientError::Closed),
            Err(error) => op.on_error(broker.now(), error),
        };
        match step {
            Next::Done(result) => return result,
            Next::RetryAt(at) => {
                wait_for_retry(broker, at, epoch).await;
                now = broker.now();
            }
        }
    }
}

/// One attempt submitted with `submit` at `now` (`acquire`: counted against
/// the broker's bound on acquires): its outcome and the instant it is
/// judged at, or why it could not be made. An outcome the submit hands
/// back was decided at `now` (the session, and in-process the server, ran
/// on that reading; a grant's validity counts from it), so it is judged at
/// `now`; an outcome awaited later, at a fresh reading.
pub(crate) async fn attempt<B: Broker + ?Sized>(
    broker: &B,
    now: Instant,
    acquire: bool,
    submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
) -> Result<(Outcome, Instant), ClientError> {
    match broker.submit_at(now, acquire, submit)? {
        Submitted::Ready(outcome) => Ok((outcome, now)),
        Submitted::Waiting(outcome) => {
            let outcome = outcome.await;
            Ok((outcome, broker.now()))
        }
    }
}
