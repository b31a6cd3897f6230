//! One logical acquire or release across attempts ([`AcquireOperation`],
//! [`ReleaseOperation`]) and the bounded queue of background releases
//! ([`ReleaseQueue`]).

use std::collections::VecDeque;

use super::error::ClientError;
use super::request::{AcquireParams, Grant, KeySet, Leader, Outcome, lease_s};
use super::session::Session;
use crate::time::{Duration, Instant};
use crate::wire::ExtendStatus;

/// A release (explicit or compensating) is retried until this long after
/// the call or enqueue, never longer, whatever the lease.
pub const RELEASE_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// One release attempt waits at most this long for its reply.
pub const RELEASE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// First delay before an acquire is tried again on another connection.
pub const RETRY_MIN: Duration = Duration::from_millis(10);

/// Longest delay between acquire attempts.
pub const ACQUIRE_RETRY_MAX: Duration = Duration::from_millis(100);

/// Longest delay between release attempts.
pub const RELEASE_RETRY_MAX: Duration = Duration::from_millis(200);

/// Default capacity of the compensating/auto release queue.
pub const RELEASE_QUEUE_CAPACITY: usize = 512;

/// A renewal is retried until this long after the call, never longer.
pub const EXTEND_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// How a renewal ended when the token was current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extension {
    /// Renewed, clipped at the hold cap, or refused at the cap (nothing
    /// changed; `valid_before` is then what is left of the lease).
    pub status: ExtendStatus,
    /// The new conservative end of the lease (see [`Outcome::Extended`]).
    pub valid_before: Instant,
}

/// What to do next in a renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendStep {
    /// Finished: the token was current ([`Extension`]), or an error:
    /// [`ClientError::Lost`] (`N`: the grant is gone),
    /// [`ClientError::Indeterminate`] (the `W` may have taken effect: call
    /// again with the same token to learn where the grant stands), or
    /// another final error.
    Done(Result<Extension, ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// One logical renewal (`W`) of a grant across attempts. Like an acquire,
/// only an attempt that certainly had no effect (`M`, `E 3`/`E 4`, never
/// sent, no ready connection) is retried, within the caller's deadline.
#[derive(Clone, Debug)]
pub struct ExtendOperation {
    keys: KeySet,
    token: u64,
    lease: Duration,
    deadline: Instant,
    retry_delay: Duration,
}

impl ExtendOperation {
    /// A renewal of the grant `token` of `keys` to `lease` (1..=250 s,
    /// rounded up to whole seconds), given up at `deadline` (a ticket gives
    /// it [`EXTEND_RETRY_WINDOW`] from the call).
    pub fn new(
        keys: KeySet,
        token: u64,
        lease: Duration,
        deadline: Instant,
    ) -> Result<Self, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        lease_s(lease)?;
        Ok(ExtendOperation {
            keys,
            token,
            lease,
            deadline,
            retry_delay: RETRY_MIN,
        })
    }
    /// The keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    /// The token.
    pub fn token(&self) -> u64 {
        self.token
    }
    /// The lease asked for.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// When the whole renewal gives up.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_extend(
            now,
            self.keys.clone(),
            self.token,
            self.lease,
            self.deadline,
        )
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> ExtendStep {
        match outcome {
            Outcome::Extended {
                status,
                valid_before,
            } => ExtendStep::Done(Ok(Extension {
                status,
                valid_before,
            })),
            Outcome::NotFound => ExtendStep::Done(Err(ClientError::Lost)),
            Outcome::Indeterminate => ExtendStep::Done(Err(ClientError::Indeterminate)),
            Outcome::Timeout => ExtendStep::Done(Err(ClientError::Timeout)),
            Outcome::Retry => self.retry(now, ClientError::Timeout),
            Outcome::Error(code) => ExtendStep::Done(Err(ClientError::Protocol(format!(
                "server rejected renewal with {code:?}"
            )))),
            Outcome::Acquired(_)
            | Outcome::Busy
            | Outcome::Released
            | Outcome::CapacityMismatch { .. }
            | Outcome::Observed(_)
            | Outcome::Downgraded => ExtendStep::Done(Err(ClientError::Protocol(
                "acquire or release reply to a renewal".into(),
            ))),
        }
    }
    /// An attempt could not be made.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> ExtendStep {
        match error {
            ClientError::NotConnected => self.retry(now, ClientError::Timeout),
            ClientError::ClientCapacity => self.retry(now, ClientError::ClientCapacity),
            other => ExtendStep::Done(Err(other)),
        }
    }
    fn retry(&mut self, now: Instant, at_deadline: ClientError) -> ExtendStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return ExtendStep::Done(Err(at_deadline));
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(ACQUIRE_RETRY_MAX);
        ExtendStep::RetryAt(now.saturating_add(delay))
    }
}

/// An observe is retried until this long after the call, never longer.
pub const OBSERVE_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// What to do next in an observe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObserveStep {
    /// Finished: who holds the key (`None`: nobody), or a final error.
    Done(Result<Option<Leader>, ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// One logical observe (`O`) of who holds a key, across attempts. It
/// changes nothing, so every attempt that did not bring an answer (no
/// effect, indeterminate, lost connection) may be tried again, within the
/// operation's deadline.
#[derive(Clone, Debug)]
pub struct ObserveOperation {
    name: KeySet,
    deadline: Instant,
    retry_delay: Duration,
}

impl ObserveOperation {
    /// An observe of `name` (one key), given up at `deadline` (a broker
    /// gives it [`OBSERVE_RETRY_WINDOW`] from the call).
    pub fn new(name: KeySet, deadline: Instant) -> Result<Self, ClientError> {
        if name.is_set() {
            return Err(ClientError::InvalidInput("an election is named by one key"));
        }
        Ok(ObserveOperation {
            name,
            deadline,
            retry_delay: RETRY_MIN,
        })
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_observe(now, self.name.clone(), self.deadline)
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> ObserveStep {
        match outcome {
            Outcome::Observed(leader) => ObserveStep::Done(Ok(leader)),
            // Read-only: an answer that may have been lost is asked again.
            Outcome::Retry | Outcome::Indeterminate => self.retry(now),
            Outcome::Timeout => ObserveStep::Done(Err(ClientError::Timeout)),
            Outcome::Error(code) => ObserveStep::Done(Err(ClientError::Protocol(format!(
                "server rejected observe with {code:?}"
            )))),
            Outcome::Acquired(_)
            | Outcome::Busy
            | Outcome::Released
            | Outcome::NotFound
            | Outcome::Extended { .. }
            | Outcome::CapacityMismatch { .. }
            | Outcome::Downgraded => ObserveStep::Done(Err(ClientError::Protocol(
                "acquire or release reply to an observe".into(),
            ))),
        }
    }
    /// An attempt could not be made.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> ObserveStep {
        match error {
            ClientError::NotConnected | ClientError::ClientCapacity => self.retry(now),
            other => ObserveStep::Done(Err(other)),
        }
    }
    fn retry(&mut self, now: Instant) -> ObserveStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return ObserveStep::Done(Err(ClientError::Timeout));
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(ACQUIRE_RETRY_MAX);
        ObserveStep::RetryAt(now.saturating_add(delay))
    }
}

/// What to do next in an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireStep {
    /// Hand the grant to the caller.
    Granted(Grant),
    /// Fail with this error.
    Failed(ClientError),
    /// Fail with `error`, and release `grant` (a [`ReleaseOperation`]): the
    /// lock was granted but cannot be handed to the caller.
    Compensate {
        /// What the caller sees.
        error: ClientError,
        /// The lock to release.
        grant: Grant,
    },
    /// Try again (pick a connection, submit) at this instant.
    RetryAt(Instant),
}

/// One logical acquire across attempts. Only an attempt that certainly had
/// no effect is retried, and only within the original deadline: the wait
/// sent with a retry is what remains of the caller's wait.
#[derive(Clone, Debug)]
pub struct AcquireOperation {
    keys: KeySet,
    params: AcquireParams,
    deadline: Instant,
    retry_delay: Duration,
}

impl AcquireOperation {
    /// An acquire called at `now`.
    pub fn new(now: Instant, keys: KeySet, params: AcquireParams) -> Self {
        AcquireOperation {
            deadline: params.operation_deadline(now),
            keys,
            params,
            retry_delay: RETRY_MIN,
        }
    }
    /// The keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    /// The times.
    pub fn params(&self) -> &AcquireParams {
        &self.params
    }
    /// When the whole acquire gives up.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        session.submit_acquire(now, self.keys.clone(), &self.params, self.deadline)
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> AcquireStep {
        match outcome {
            Outcome::Acquired(grant) => {
                if now >= self.deadline {
                    AcquireStep::Compensate {
                        error: ClientError::Indeterminate,
                        grant,
                    }
                } else if !grant.covers(now, self.params.work_budget_min()) {
                    AcquireStep::Compensate {
                        error: ClientError::InsufficientLease,
                        grant,
                    }
                } else {
                    AcquireStep::Granted(grant)
                }
            }
            Outcome::Timeout => AcquireStep::Failed(ClientError::Timeout),
            Outcome::Busy => AcquireStep::Failed(ClientError::Busy),
            Outcome::Indeterminate => AcquireStep::Failed(ClientError::Indeterminate),
            Outcome::Retry => self.retry(now, ClientError::Timeout),
            Outcome::Error(code) => AcquireStep::Failed(ClientError::Protocol(format!(
                "server rejected acquire with {code:?}"
            ))),
            Outcome::CapacityMismatch { asked, capacity } => {
                AcquireStep::Failed(ClientError::CapacityMismatch { asked, capacity })
            }
            Outcome::Released
            | Outcome::NotFound
            | Outcome::Extended { .. }
            | Outcome::Observed(_)
            | Outcome::Downgraded => {
                AcquireStep::Failed(ClientError::Protocol("release reply to an acquire".into()))
            }
        }
    }
    /// An attempt could not be made: no ready connection
    /// ([`Router::no_connection_error`](super::Router::no_connection_error)) or [`Session::submit_acquire`]
    /// failed.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> AcquireStep {
        match error {
            ClientError::NotConnected => self.retry(now, ClientError::Timeout),
            ClientError::ClientCapacity => self.retry(now, ClientError::ClientCapacity),
            other => AcquireStep::Failed(other),
        }
    }
    fn retry(&mut self, now: Instant, at_deadline: ClientError) -> AcquireStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return AcquireStep::Failed(at_deadline);
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(ACQUIRE_RETRY_MAX);
        AcquireStep::RetryAt(now.saturating_add(delay))
    }
}

/// How a release ended when it got a final reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// `R`/`G`: released.
    Released,
    /// `N`: the key is gone or the token is no longer current.
    AlreadyGoneOrNotCurrent,
}

/// What to do next in a release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseStep {
    /// Finished. An error means no final reply came: never assume success;
    /// the lease is the last safety net.
    Done(Result<ReleaseOutcome, ClientError>),
    /// Try again at this instant.
    RetryAt(Instant),
}

/// One exact-token release (explicit or compensating) across attempts:
/// retried on anything that is not a final reply, each attempt bounded by
/// [`RELEASE_ATTEMPT_TIMEOUT`], all of it by an absolute deadline
/// ([`RELEASE_RETRY_WINDOW`] after the call), never by the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseOperation {
    keys: KeySet,
    token: u64,
    deadline: Instant,
    retry_delay: Duration,
    /// Reported if the deadline passes; Indeterminate once any attempt may
    /// have taken effect.
    last_error: ClientError,
}

impl ReleaseOperation {
    /// A release called (or enqueued) at `now`.
    pub fn new(now: Instant, keys: KeySet, token: u64) -> Self {
        Self::with_deadline(keys, token, now.saturating_add(RELEASE_RETRY_WINDOW))
    }
    /// A release with an explicit absolute deadline (a release that keeps
    /// the deadline of an earlier attempt, or a shutdown cut-off).
    pub fn with_deadline(keys: KeySet, token: u64, deadline: Instant) -> Self {
        ReleaseOperation {
            keys,
            token,
            deadline,
            retry_delay: RETRY_MIN,
            last_error: ClientError::NotConnected,
        }
    }
    /// The keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    /// The token.
    pub fn token(&self) -> u64 {
        self.token
    }
    /// The absolute deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// The deadline of an attempt started at `now`.
    pub fn attempt_deadline(&self, now: Instant) -> Instant {
        release_attempt_deadline(self.deadline, now)
    }
    /// Submits one attempt on `session`.
    pub fn submit(&self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        self.attempt().submit(now, session)
    }
    /// What one attempt submits, owned: a future awaiting the attempt's
    /// outcome need not borrow the operation.
    pub(super) fn attempt(&self) -> ReleaseAttempt {
        ReleaseAttempt {
            keys: self.keys.clone(),
            token: self.token,
            deadline: self.deadline,
        }
    }
    /// An attempt ended with `outcome`.
    pub fn on_outcome(&mut self, now: Instant, outcome: Outcome) -> ReleaseStep {
        self.on_outcome_with(|| now, outcome)
    }
    /// [`Self::on_outcome`] reading the clock (`now`) only for an outcome
    /// that may lead to a retry: a final reply needs no reading.
    pub(super) fn on_outcome_with(
        &mut self,
        now: impl FnOnce() -> Instant,
        outcome: Outcome,
    ) -> ReleaseStep {
        match outcome {
            Outcome::Released => ReleaseStep::Done(Ok(ReleaseOutcome::Released)),
            Outcome::NotFound => ReleaseStep::Done(Ok(ReleaseOutcome::AlreadyGoneOrNotCurrent)),
            Outcome::Indeterminate => {
                self.last_error = ClientError::Indeterminate;
                self.retry(now())
            }
            Outcome::Retry | Outcome::Timeout => self.retry(now()),
            Outcome::Error(code) => ReleaseStep::Done(Err(ClientError::Protocol(format!(
                "server rejected release with {code:?}"
            )))),
            Outcome::Acquired(_)
            | Outcome::Busy
            | Outcome::Extended { .. }
            | Outcome::CapacityMismatch { .. }
            | Outcome::Observed(_)
            | Outcome::Downgraded => ReleaseStep::Done(Err(ClientError::Protocol(
                "acquire reply to a release".into(),
            ))),
        }
    }
    /// An attempt could not be made.
    pub fn on_error(&mut self, now: Instant, error: ClientError) -> ReleaseStep {
        match error {
            ClientError::NotConnected | ClientError::Timeout => self.retry(now),
            ClientError::ClientCapacity => {
                if self.last_error != ClientError::Indeterminate {
                    self.last_error = ClientError::ClientCapacity;
                }
                self.retry(now)
            }
            other => ReleaseStep::Done(Err(other)),
        }
    }
    fn retry(&mut self, now: Instant) -> ReleaseStep {
        let remaining = self.deadline.saturating_duration_since(now);
        if remaining.is_zero() {
            return ReleaseStep::Done(Err(self.last_error.clone()));
        }
        let delay = self.retry_delay.min(remaining);
        self.retry_delay = (self.retry_delay * 2).min(RELEASE_RETRY_MAX);
        ReleaseStep::RetryAt(now.saturating_add(delay))
    }
}

/// One attempt of a [`ReleaseOperation`] (see [`ReleaseOperation::attempt`]).
pub(super) struct ReleaseAttempt {
    keys: KeySet,
    token: u64,
    deadline: Instant,
}

impl ReleaseAttempt {
    /// Submits it on `session`, bounded by [`RELEASE_ATTEMPT_TIMEOUT`]
    /// from `now` and by the operation's deadline.
    pub(super) fn submit(self, now: Instant, session: &mut Session) -> Result<u64, ClientError> {
        let deadline = release_attempt_deadline(self.deadline, now);
        session.submit_release(now, self.keys, self.token, deadline)
    }
}

/// The deadline of a release attempt started at `now` whose operation
/// gives up at `deadline`.
fn release_attempt_deadline(deadline: Instant, now: Instant) -> Instant {
    deadline.min(now.saturating_add(RELEASE_ATTEMPT_TIMEOUT))
}

/// A bounded queue of background releases (compensations and dropped
/// tickets). Full or expired means dropped: the lease is the safety net.
#[derive(Clone, Debug)]
pub struct ReleaseQueue {
    jobs: VecDeque<ReleaseOperation>,
    capacity: usize,
}

impl Default for ReleaseQueue {
    fn default() -> Self {
        Self::new(RELEASE_QUEUE_CAPACITY)
    }
}

impl ReleaseQueue {
    /// A queue holding at most `capacity` releases.
    pub fn new(capacity: usize) -> Self {
        ReleaseQueue {
            jobs: VecDeque::new(),
            capacity,
        }
    }
    /// Enqueues `job`; false (dropped) if the queue is full or the job's
    /// deadline has passed.
    pub fn push(&mut self, now: Instant, job: ReleaseOperation) -> bool {
        if self.jobs.len() >= self.capacity || now >= job.deadline {
            return false;
        }
        self.jobs.push_back(job);
        true
    }
    /// The oldest job whose deadline has not passed.
    pub fn pop(&mut self, now: Instant) -> Option<ReleaseOperation> {
        while let Some(job) = self.jobs.pop_front() {
            if now < job.deadline {
                return Some(job);
            }
        }
        None
    }
    /// Jobs queued.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
