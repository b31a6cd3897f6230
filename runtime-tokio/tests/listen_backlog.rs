//! The listen backlog: a burst of connections that arrive while the
//! accept loop is stalled waits in the kernel's queue instead of being
//! dropped, up to `listen_backlog`.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ticketing_tokio::{TicketBroker, spawn_server};

/// Bound on one connect: far above a loopback handshake, and below the
/// kernel's first SYN retry (1 s), so a connect the full queue dropped
/// fails instead of getting in on the retry.
const CONNECT_BOUND: Duration = Duration::from_millis(900);

/// Opens `count` connections that never send anything, from this thread,
/// and stops at the first connect that fails; the ones opened. Called
/// from the server's own single-threaded runtime, it blocks that runtime
/// on purpose: the server cannot accept meanwhile, so every connection
/// stays in the kernel's queue, as in a stall of the accept loop.
fn stalled_connects(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut opened = Vec::new();
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, CONNECT_BOUND) {
            Ok(stream) => opened.push(stream),
            Err(_) => break,
        }
    }
    opened
}

#[tokio::test]
async fn with_a_backlog_of_1024_300_idle_connects_and_then_16_clients_get_in() {
    let mut settings = common::loopback_settings();
    settings.listen_backlog = 1024;
    let server = spawn_server(settings).await.unwrap();
    let addr = server.local_addr();
    let idle = stalled_connects(addr, 300);
    assert_eq!(idle.len(), 300, "the queue dropped a connect");
    let mut brokers = Vec::new();
    for _ in 0..16 {
        brokers.push(TicketBroker::connect_loopback([addr.to_string()]));
    }
    for (index, broker) in brokers.iter().enumerate() {
        let key = format!("key-{index}");
        let ticket = tokio::time::timeout(
            common::READY,
            broker.acquire(&key, Duration::ZERO, common::LEASE, common::BUDGET),
        )
        .await
        .unwrap_or_else(|_| panic!("client {index} did not get in"))
        .unwrap();
        ticket.release().await.unwrap();
    }
    for broker in brokers {
        broker.close().await;
    }
    drop(idle);
    server.shutdown().await;
}

#[tokio::test]
async fn a_small_backlog_drops_the_connects_over_it() {
    // The control: the same stall against a backlog of 8 loses connects
    // (Linux queues backlog + 1), which shows the setting reaches the
    // socket and the test above can fail.
    let mut settings = common::loopback_settings();
    settings.listen_backlog = 8;
    let server = spawn_server(settings).await.unwrap();
    let idle = stalled_connects(server.local_addr(), 32);
    assert!(idle.len() < 32, "no connect was dropped");
    assert!(idle.len() >= 8, "only {} queued", idle.len());
    drop(idle);
    server.shutdown().await;
}
