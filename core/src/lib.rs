//! The sans-IO core of Ticketing: everything that decides, in both modes,
//! and the client.
//!
//! Nothing in this crate reads a clock, opens a socket or draws from a
//! global RNG: time enters as a [`time::Instant`] argument and randomness as
//! bytes handed in by the driver, so a run is a pure function of its inputs.
//! Both server state machines follow one driver contract,
//! [`machine::Machine`]: inputs `handle_*(now, …)`, outputs drained with
//! `poll_*`, and the next deadline from `poll_timeout` (the client's
//! session has the same shape).
//!
//! # Shared by both modes
//!
//! - [`wire`]: the v3 frame codec (requests, replies, key groups).
//! - [`line`](mod@line): the line dialect's codec (clients 0.3.0) and its handshake
//!   answer.
//! - [`auth`]: the client handshake's hello, proof and tokens.
//! - the connection layer (private, `conn/`): a served connection's outbound
//!   bytes and delivery accounting, the wake queue, handshake deadlines, and
//!   the client front that tells v3 from the line dialect and turns bytes
//!   into dialect-neutral requests; its [`server::ConnId`] /
//!   [`server::ConnState`] are re-exported by both owners.
//! - [`budget`]: handshake budgets per source, abuse reports, keys held per
//!   connection.
//! - [`metrics`]: what the core counts for operators; [`events`]: the
//!   bounded ring of recent events they see (leader changes,
//!   force-releases, expiries with waiters, refusals counted).
//! - [`inspect`]: the vocabulary of lock inspection and force-release;
//!   [`admin`]: the admin API's access rule.
//! - [`reserve`]: the token reserve that keeps fencing tokens growing across
//!   restarts.
//! - [`machine`]: [`machine::Machine`], the driver contract both server
//!   state machines implement and every runtime drives.
//! - [`time`], [`hash`]: injected time; the hasher for numeric-id maps.
//!
//! # Single mode
//!
//! - [`server`]: [`server::Server`], connections composed with one lock
//!   table; the only place that routes between connections.
//! - [`lock`]: [`lock::LockTable`], keys, FIFO queues, leases, tokens,
//!   limits and key sets.
//!
//! # Cluster mode
//!
//! - [`cluster`]: [`cluster::ClusterNode`] (client and peer connections, the
//!   leader's waiter table, proposals and their replies), the replicated
//!   commands and lock state, and the peer protocol ([`cluster::peer`]).
//! - [`raft`]: the hand-written Raft that orders the commands.
//!
//! # Client
//!
//! - [`client`]: the official client's rules as state machines, shared by
//!   every client runtime: session, request parameters, logical operations,
//!   routing and backoff, configuration, tickets (renewal, `keep_alive`,
//!   what the server pushed about a grant), and the broker loops over a
//!   runtime's [`client::Broker`].
//!
//! # Test support
//!
//! - `testing` (feature `testing`, hidden, not a stable API): fuzz entry
//!   points replayed by stable tests, the lock-table reference model, and
//!   the simulator's planted bugs (feature `planted-bugs`, which implies
//!   `testing`).
//!
//! `docs/architecture.md` walks one acquire through these modules.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
pub mod budget;
pub mod client;
pub mod cluster;
mod conn;
pub mod events;
pub mod hash;
pub mod inspect;
mod keyed;
pub mod line;
pub mod lock;
pub mod machine;
pub mod metrics;
mod queue_rule;
pub mod raft;
pub mod reserve;
pub mod rng;
pub mod server;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod time;
pub mod wire;
