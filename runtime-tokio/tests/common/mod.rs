//! Setup shared by runtime-tokio's test binaries: the in-process server on
//! loopback and clients for it, a raw wire client ([`raw`]), throwaway
//! certificates ([`certs`]), `ticketing serve` clusters ([`cluster`]),
//! loopback ports for child processes ([`ports`]) and the admin listener
//! over plain HTTP ([`admin`]), and awaiting a child's startup line
//! ([`startup`]).
//! Each test file says `mod common;` and uses only a part of it.
#![allow(dead_code)]

pub mod admin;
pub mod certs;
pub mod cluster;
pub mod faketime;
pub mod ports;
pub mod raw;
pub mod scratch;
pub mod startup;

use std::time::Duration;

use ticketing_core::server::ServerStats;
use ticketing_tokio::{RunningServer, ServeSettings, spawn_server};

pub const READY: Duration = Duration::from_secs(5);
pub const LEASE: Duration = Duration::from_secs(30);
pub const BUDGET: Duration = Duration::from_secs(1);
pub const TOKEN: &str = "test-client-token-0123456789";
/// Bound on waiting for a condition the server reports only through its
/// stats: turns a missing change into a failure rather than a hang.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Default settings, listening on a free loopback port.
pub fn loopback_settings() -> ServeSettings {
    ServeSettings::new("127.0.0.1:0".parse().unwrap())
}

/// The in-process server with [`loopback_settings`].
pub async fn loopback_server() -> RunningServer {
    spawn_server(loopback_settings()).await.unwrap()
}

/// Our client, no auth over loopback, once ready.
pub async fn ours_loopback(server: &RunningServer) -> ticketing_tokio::TicketBroker {
    let broker = ticketing_tokio::TicketBroker::connect_loopback([server.local_addr().to_string()]);
    assert!(broker.wait_ready(READY).await, "client did not get ready");
    broker
}

/// A builder for our client to `server` presenting `token`; the caller adds
/// the rest (TLS) and connects.
pub fn ours_with_token(
    server: &RunningServer,
    token: &str,
) -> ticketing_tokio::client::TicketBrokerBuilder {
    ticketing_tokio::TicketBroker::builder()
        .addrs([server.local_addr().to_string()])
        .token(token)
}

/// The published `ticketing` client, no auth over loopback, once ready.
pub async fn published_loopback(server: &RunningServer) -> ticketing::TicketBroker {
    let broker = ticketing::TicketBroker::connect_loopback([server.local_addr().to_string()]);
    assert!(broker.wait_ready(READY).await, "client did not get ready");
    broker
}

/// Returns once `read(stats)` is `count`. The server offers no event for
/// that, so this polls its stats (yielding, never sleeping).
async fn wait_for_stat(
    server: &RunningServer,
    what: &str,
    read: fn(&ServerStats) -> usize,
    count: usize,
) {
    tokio::time::timeout(SETTLE, async {
        while read(&server.stats()) != count {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{what} stayed at {}, expected {count}",
            read(&server.stats())
        )
    });
}

/// Returns once the server counts exactly `count` queued waiters.
pub async fn wait_for_waiters(server: &RunningServer, count: usize) {
    wait_for_stat(server, "waiters", |stats| stats.lock.waiters, count).await;
}

/// Returns once the server counts exactly `count` open connections (it has
/// processed the close of every other one).
pub async fn wait_for_connections(server: &RunningServer, count: usize) {
    wait_for_stat(server, "connections", |stats| stats.connections, count).await;
}
