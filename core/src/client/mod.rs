//! The client as sans-IO state machines, shared by every runtime.
//!
//! The runtimes (tokio, smol) only move bytes, read clocks and park futures;
//! every rule of the official client lives here:
//!
//! - [`Session`]: one connection. Runs the client handshake, assigns request
//!   ids, hands request bytes out at the *send boundary*
//!   ([`Session::poll_transmit`]), matches replies with every session-fatal
//!   check, and turns lost replies into [`Outcome::Indeterminate`] or
//!   [`Outcome::Retry`] depending on whether the bytes may have left.
//! - [`Router`]: picks a ready connection, leader first, then round-robin
//!   ([`Router::pick`]) or in runs that share writes
//!   ([`Router::pick_coalescing`], what the broker uses).
//! - [`AcquireOperation`] / [`ReleaseOperation`] / [`ExtendOperation`]: one
//!   logical acquire, release or renewal across attempts (retry only what
//!   certainly had no effect, conservative validity, the absolute 5 s
//!   release window).
//! - [`Backoff`]: reconnect delays.
//! - [`BrokerState`], [`run_acquire`], [`run_release`]: the broker-wide
//!   state behind a runtime's lock (pending outcomes, capacity, release
//!   queue) and the operation loops, over a runtime's [`Broker`].
//! - [`Ticket`] / [`TicketSet`]: what the caller holds after an acquire,
//!   released once (explicitly or on drop) through its [`Broker`].
//! - [`BrokerConfig`]: validation of what a user configures, and the
//!   connections it implies (one address means two connections).
//! - [`HolderWatch`] and [`NewsBoard`]: the conservative end of a held
//!   grant and why it was lost, moved by renewals and (only earlier) by
//!   the server's pushes, which the broker keeps by token.
//! - [`holder::StopPlan`]: when guarded work is asked to stop, and made to,
//!   before its lease could lapse (`ticketing lock`).
//!
//! Files: [`session`] (one connection), [`ops`] (parameters, key sets,
//! grants, the logical operations and the release queue), [`routing`]
//! (router and reconnect backoff), [`config`] (what a user configures),
//! [`error`] (what calls and sessions fail with), `broker`, `retried` (the
//! loop of a renewal, downgrade or observe across attempts) and `ticket`.
//!
//! Driving a [`Session`] (str0m / quinn-proto shape): after every input
//! ([`Session::handle_input`], [`Session::handle_timeout`],
//! [`Session::submit_acquire`], …) drain [`Session::poll_transmit`] while the
//! socket can take bytes, drain [`Session::poll_event`], and sleep until
//! [`Session::poll_timeout`]. Nothing here reads a clock or does IO.

mod broker;
pub mod config;
pub mod downgrade;
pub mod error;
pub mod holder;
pub mod ops;
pub mod request;
mod retried;
pub mod routing;
pub mod session;
mod ticket;
pub mod watch;

pub use broker::{
    Broker, BrokerNotice, BrokerState, CAMPAIGN_BUSY_DELAY, LEADER_WAKERS_MAX, OutcomeSender,
    Submitted, X_CLOSES_MAX, campaign_params, run_acquire, run_campaign, run_extend, run_observe,
    run_release, wait_for_retry,
};
pub use config::{
    BrokerConfig, BrokerMode, ClusterIdentity, ClusterIdentityError, Endpoint, TlsMode,
};
pub use downgrade::{DOWNGRADE_RETRY_WINDOW, DowngradeOperation, DowngradeStep, run_downgrade};
pub use error::{ClientError, CloseReason, ProtocolError};
pub use ops::{
    AcquireOperation, AcquireStep, ExtendOperation, ExtendStep, Extension, OBSERVE_RETRY_WINDOW,
    ObserveOperation, ObserveStep, ReleaseOperation, ReleaseOutcome, ReleaseQueue, ReleaseStep,
};
pub use request::{
    AcquireParams, Compensation, Grant, GrantedPermits, KeySet, Leader, Outcome, lease_covers,
};
pub use routing::{Backoff, Router};
pub use session::{CancelOutcome, HandshakeClue, Session, SessionConfig, SessionEvent};
pub use ticket::{ExtendResult, Lost, RenewEnd, RenewPolicy, Ticket, TicketSet};
pub use watch::{DRIFT_PARTS, HolderWatch, LossCause, NewsBoard, PushNews};

// The fixed numbers of the client, each defined beside the code it bounds.
pub use config::{
    DEFAULT_MAX_PENDING, PENDING_LIMIT_MAX, SILENCE_TIMEOUT_MAX, SILENCE_TIMEOUT_MIN,
};
pub use ops::{
    ACQUIRE_RETRY_MAX, EXTEND_RETRY_WINDOW, RELEASE_ATTEMPT_TIMEOUT, RELEASE_QUEUE_CAPACITY,
    RELEASE_RETRY_MAX, RELEASE_RETRY_WINDOW, RETRY_MIN,
};
pub use request::{IMMEDIATE_TRANSPORT_TIMEOUT, WAIT_S_MAX, WORK_BUDGET_MAX};
pub use routing::{
    BACKOFF_MAX, BACKOFF_MIN, COALESCE_MAX_UNSENT, ROUTE_RUN_REQUESTS, SHORT_SESSION,
};
pub use session::{
    DEFAULT_MAX_PENDING_ACQUIRES, DEFAULT_MAX_PENDING_RELEASES, DEFAULT_SILENCE_TIMEOUT,
    HANDSHAKE_TIMEOUT, READ_PROGRESS_TIMEOUT, TRANSMIT_BATCH_BYTES, WRITE_PROGRESS_TIMEOUT,
};
