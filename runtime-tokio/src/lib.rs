//! The tokio runtime of Ticketing: the `ticketing` daemon's config loading
//! ([`config`]), the driver that connects the sans-IO core's
//! [`Server`](ticketing_core::server::Server) to sockets, clocks and timers
//! ([`serve`]), the state file that keeps fencing tokens rising across
//! restarts ([`state`]), TLS setup ([`tls`]) and the admin HTTP listener
//! ([`admin`]: metrics, health and the lock API) and its CLI client
//! ([`admin_client`], which prints server text through [`terminal`]).
//!
//! The driver stays thin: every decision about locks, leases, tokens and
//! protocol bytes is the core's. [`serve::spawn_server`] is also the
//! in-process harness for tests and benches; the binary uses the same path.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod admin_client;
pub mod client;
pub mod cluster;
pub mod config;
pub mod serve;
pub mod state;
pub mod terminal;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod tls;

pub use client::{ReleaseOutcome, Ticket, TicketBroker, TicketError, TicketSet, TlsMode};
pub use cluster::{ClusterSettings, ClusterStatus, RunningCluster, spawn_cluster};
pub use serve::{RunningServer, ServeSettings, spawn_server};
pub use state::{StateError, StateSettings};
