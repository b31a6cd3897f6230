//! The sans-IO core of Ticketing.
//!
//! Everything that decides lives here: the wire codec ([`wire`]), the
//! connection handshake ([`auth`]), the lock table ([`lock`]) and the
//! composition of connections with the lock table ([`server`]). Nothing in
//! this crate reads a clock, opens a socket or draws from a global RNG: time
//! enters as an [`time::Instant`] argument and randomness as bytes handed in
//! by the driver, so a run is a pure function of its inputs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
pub mod budget;
pub mod client;
pub mod cluster;
mod conn;
pub mod hash;
pub mod inspect;
pub mod line;
pub mod lock;
pub mod metrics;
pub mod raft;
pub mod reserve;
pub mod server;
#[doc(hidden)]
pub mod testing;
pub mod time;
pub mod wire;
