//! [`TicketBroker`] on smol/async-io: the network client, and the
//! in-process handle of an [`EmbeddedServer`](crate::EmbeddedServer).
//!
//! Every rule of the official client (request ids, reply matching,
//! Indeterminate, which attempts may be retried, conservative validity, the
//! 5 s release window, reconnect backoff) lives in
//! [`ticketing_core::client`], and so do the acquire and release loops
//! ([`run_acquire`](ticketing_core::client::run_acquire),
//! [`run_release`](ticketing_core::client::run_release)) and the tickets;
//! this module only moves bytes between a transport and the core's
//! [`Session`](ticketing_core::client::Session)s, reads the clock and parks
//! futures (it implements the core's
//! [`Broker`](ticketing_core::client::Broker)). It mirrors
//! `ticketing_tokio::client` call for call.
//!
//! Two transports under one broker:
//!
//! - network: each endpoint has one task that connects (TCP, or TLS via
//!   futures-rustls), then runs a reader and a driver (timeouts + writes);
//! - in-process: each endpoint is an in-memory link to the embedded server
//!   (see [`crate::embedded`]). The caller's own task moves the bytes right
//!   after it submits (so an uncontended acquire completes without a task
//!   switch); the endpoint task only serves deadlines and bytes that arrive
//!   for the link while nobody else is moving them (a grant on another
//!   broker's release).
//!
//! Shape otherwise as on tokio: one broker-wide
//! [`BrokerState`](ticketing_core::client::BrokerState) (sessions, router,
//! pending-reply map, release queue) behind a `std::sync::Mutex` never held
//! across an `.await`; a release worker drains the release queue (dropped
//! tickets, compensations). Background tasks run on smol's global executor;
//! the futures returned to callers run on any executor.
//!
//! Files, each using only those listed before it:
//!
//! - `slot.rs`: the reply slot an attempt's outcome arrives in;
//! - `inner.rs`: the broker-wide state and the lock around it;
//! - `memory.rs`: in-process links (the exchange with the embedded server,
//!   their endpoint tasks);
//! - `attempt.rs`: one submitted request, and the core's `Broker` trait;
//! - `network.rs`: network endpoint tasks (connect, read, write);
//! - `release.rs`: the background release worker;
//! - `broker.rs`: the public [`TicketBroker`] and its builder.

mod attempt;
mod broker;
mod inner;
mod memory;
mod network;
mod release;
mod slot;

pub use broker::{TicketBroker, TicketBrokerBuilder};
pub use ticketing_core::client::{
    BrokerMode, ClientError as TicketError, ClusterIdentity, ClusterIdentityError,
    DEFAULT_MAX_PENDING, DEFAULT_SILENCE_TIMEOUT, ExtendResult, Leader, LossCause, Lost,
    ReleaseOutcome, RenewEnd, RenewPolicy, Ticket, TicketSet,
};
pub use ticketing_core::wire::ExtendStatus;

pub(crate) use broker::in_process;
pub(crate) use inner::Weak;
