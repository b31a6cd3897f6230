//! Deterministic simulator for Ticketing (TigerBeetle VOPR / FoundationDB
//! style).
//!
//! The real core state machines — the single-mode [`Server`] and the client
//! [`Session`] with its [`AcquireOperation`] / [`ReleaseOperation`] — run
//! inside one seeded world ([`single::World`]): simulated TCP connections
//! with per-path delays that split byte streams at any boundary, per-process
//! clocks with drift and forward jumps, process pauses, connection resets,
//! client crashes and server restarts from nothing. After every event the
//! checkers look at the server's lock table and at everything both sides
//! said; at the end of a run the clients' history is checked for
//! linearizability per key. A run is a pure function of its seed: a failing
//! seed replays exactly (`--seed N --trace`).
//!
//! [`cluster::ClusterWorld`] does the same for 3 or 5 real
//! [`ClusterNode`]s with partitions, node crashes and replacement by new
//! generations, and Raft checkers (`--cluster 3|5`).
//!
//! [`ClusterNode`]: ticketing_core::cluster::ClusterNode
//!
//! [`Server`]: ticketing_core::server::Server
//! [`Session`]: ticketing_core::client::Session
//! [`AcquireOperation`]: ticketing_core::client::AcquireOperation
//! [`ReleaseOperation`]: ticketing_core::client::ReleaseOperation
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adversary;
mod checks;
mod clients;
mod clock;
pub mod cluster;
pub mod config;
mod driver;
pub mod fuzzing;
pub mod linear;
mod lock_model;
mod net;
pub mod rng;
mod run;
pub mod single;
pub mod spec;

pub use adversary::AdversaryRates;
pub use cluster::{ClusterPlant, ClusterSimConfig, ClusterWorld, run_cluster_seed};
pub use config::{FaultConfig, SimConfig};
pub use run::{Checker, RunReport, Violation};
pub use single::World;
pub use spec::Knobs;

/// Runs the swarm world of `seed` (see [`SimConfig::swarm`]).
pub fn run_seed(seed: u64) -> RunReport {
    World::new(seed, SimConfig::swarm(seed)).run()
}

/// Runs `seed` with an explicit configuration.
pub fn run_with(seed: u64, config: SimConfig) -> RunReport {
    World::new(seed, config).run()
}
