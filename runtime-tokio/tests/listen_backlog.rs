//! The listen backlog: a burst of connections that arrive while the
//! accept loop is stalled waits in the kernel's queue instead of being
//! dropped, up to `listen_backlog`, and is then served one connection at
//! a time.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ticketing_core::auth::{
    ClientHandshake, ClientHandshakeStatus, SINGLE_FINGERPRINT, SINGLE_SELF_SLOT, WireMode,
};
use ticketing_core::budget::BudgetConfig;
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

/// Runs the client side of a no-auth handshake on `stream` (non-blocking),
/// answering the hello as soon as it is readable; between reads it yields
/// to the server's tasks, which share this runtime. True if the server
/// accepted the proof, false if it closed the connection first.
async fn answer_at_once(mut stream: TcpStream) -> bool {
    let mut client =
        ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, SINGLE_SELF_SLOT);
    let deadline = Instant::now() + common::READY;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        let (used, status) = client.handle_input(&buf);
        buf.drain(..used);
        match status {
            ClientHandshakeStatus::NeedMore => match stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(
                        Instant::now() < deadline,
                        "the server neither answered nor closed"
                    );
                    tokio::task::yield_now().await;
                }
                Err(_) => return false,
            },
            // A few bytes into an empty loopback socket: never blocks.
            ClientHandshakeStatus::SendProof => stream.write_all(&client.proof().unwrap()).unwrap(),
            ClientHandshakeStatus::Accepted => return true,
            other => panic!("handshake failed: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_queued_before_24_idle_connections_from_its_address_gets_in() {
    // 16 unfinished handshakes per source: the 16th admission after the
    // client's drops it if it has not answered by then. All 25 connects
    // queue (made from the server's own single-threaded runtime, see
    // `stalled_connects`). The accept loop takes one connection per turn,
    // so the client is sent its hello, and its proof is read, a few
    // admissions after its own. Accepted as one batch, the whole queue
    // was admitted before any hello left, and the client was dropped for
    // the idle connections behind it.
    let mut settings = common::loopback_settings();
    settings.server.budget = BudgetConfig::for_connections_max(200);
    assert_eq!(settings.server.budget.handshakes_per_source_max, 16);
    let server = spawn_server(settings).await.unwrap();
    let addr = server.local_addr();
    let client = TcpStream::connect_timeout(&addr, CONNECT_BOUND).unwrap();
    let idle = stalled_connects(addr, 24);
    assert_eq!(idle.len(), 24, "the queue dropped a connect");
    client.set_nonblocking(true).unwrap();
    assert!(
        answer_at_once(client).await,
        "the client was dropped before its proof was read"
    );
    drop(idle);
    server.shutdown().await;
}
