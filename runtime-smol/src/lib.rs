//! Ticketing on smol / async-io.
//!
//! - [`EmbeddedServer`]: a single-mode Ticketing server inside your process —
//!   FIFO handoff, leases, bounded waits, fencing tokens, key sets — with no
//!   daemon to deploy; optionally also on a TCP (or TLS) port for other
//!   processes and any v3 client.
//! - [`TicketBroker`]: the client, with the API of `ticketing_tokio`'s
//!   broker. [`EmbeddedServer::broker`] gives one whose connections are
//!   in-memory links; [`TicketBroker::builder`] gives one over TCP/TLS. The
//!   locking code is the same for both, so an application can move from the
//!   embedded lock to a server or cluster by changing how it builds the
//!   broker, not how it uses it.
//!
//! Both are thin drivers of [`ticketing_core`]: the in-process path runs the
//! very same client [`Session`](ticketing_core::client::Session) and
//! [`Server`](ticketing_core::server::Server) state machines as the network
//! path: the handshake in protocol bytes, then the request and reply values
//! those bytes would carry, checked as their frames would be. See
//! `docs/embedding.md` for when to embed and what it does not give you.
//!
//! Background tasks run on smol's global executor (threads:
//! `SMOL_THREADS`, default 1); the futures you await run on any executor.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod embedded;
mod hub;
mod state;
mod sync;
pub mod tls;

pub use client::{
    BrokerMode, ClusterIdentity, ClusterIdentityError, Leader, ReleaseOutcome, Ticket,
    TicketBroker, TicketBrokerBuilder, TicketError, TicketSet,
};
pub use embedded::{EmbeddedServer, EmbeddedServerBuilder};
pub use tls::TlsMode;

/// The Rust code blocks of README.md and docs/*.md, compiled (and, unless
/// marked `no_run`, run) by `cargo test`, so that a snippet cannot drift
/// from the API it shows. They live in this crate because its dependencies
/// cover every snippet: the published `ticketing` client, `ticketing_tokio`
/// and tokio (dev-dependencies), and `ticketing_smol` and smol. Blocks in
/// another language carry its tag (`sh`, `toml`, `text`, …), which rustdoc
/// skips. runtime-tokio/tests/doc_links.rs checks every docs/*.md is listed.
#[cfg(doctest)]
mod doc_snippets {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/admin-api.md")]
    struct AdminApi;
    #[doc = include_str!("../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../docs/cluster.md")]
    struct Cluster;
    #[doc = include_str!("../../docs/embedding.md")]
    struct Embedding;
    #[doc = include_str!("../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../../docs/protocol.md")]
    struct Protocol;
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
}
