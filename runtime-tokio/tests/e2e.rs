//! End-to-end: the in-process server driven by the published `ticketing`
//! 0.4.0 client, over TCP and TLS, plus the driver's transport duties
//! (connection limit, handshake deadline, shutdown) seen from a raw socket.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::certs::make_certs;
use common::{
    BUDGET, LEASE, READY, TOKEN, loopback_server, loopback_settings, published_loopback,
    wait_for_waiters,
};
use ticketing::{ReleaseOutcome, TicketBroker, TicketError, TlsMode};
use ticketing_core::auth::{CLIENT_MAGIC, ClientTokens, HELLO_LEN};
use ticketing_tokio::spawn_server;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(5);

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Reads until EOF and returns what came; fails if the server keeps the
/// connection open (the 5 s bound only turns a hang into a failure).
async fn read_to_eof(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut all))
        .await
        .expect("server did not close the connection")
        .expect("read failed");
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_over_tcp() {
    let started_micros = unix_micros();
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;

    let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    // Our rule: tokens start at the bootstrap wall-clock time in µs.
    assert!(ticket.token() >= started_micros, "token {}", ticket.token());
    assert_eq!(server.stats().lock.held_keys, 1);
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(server.stats().lock.held_keys, 0);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_the_key_to_the_waiter() {
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;

    let first = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    let waiter = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.acquire("k", WAIT, LEASE, BUDGET).await })
    };
    // Release only once the second request is queued, so that the hand-over
    // (not a fresh grant) is what is tested.
    wait_for_waiters(&server, 1).await;
    let first_token = first.token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let second = waiter.await.unwrap().unwrap();
    assert!(second.token() > first_token);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_is_answered_by_the_server_timer() {
    let mut settings = loopback_settings();
    // T at wait − 500 ms: well before the client's own deadline at `wait`,
    // so an answer in under a second can only have come from the server.
    settings.server.lock.wait_margin = Duration::from_millis(500);
    let server = spawn_server(settings).await.unwrap();
    let broker = published_loopback(&server).await;

    let holder = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    let asked = Instant::now();
    let result = broker
        .acquire("k", Duration::from_secs(1), LEASE, BUDGET)
        .await;
    assert!(matches!(result, Err(TicketError::Timeout)), "{result:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(server.stats().lock.waiters, 0);
    // The session survived: the holder can still release.
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_waiters_and_closes_connections() {
    let server = loopback_server().await;
    let addr = server.local_addr();
    let broker = published_loopback(&server).await;
    let _holder = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    let waiter = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.acquire("k", WAIT, LEASE, BUDGET).await })
    };
    wait_for_waiters(&server, 1).await;

    let asked = Instant::now();
    server.shutdown().await;
    // Well inside the grace period: connections closed, not timed out.
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert!(waiter.await.unwrap().is_err());
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_session_limit_is_closed_without_a_hello() {
    let mut settings = loopback_settings();
    settings.server.connections_max = 1;
    let server = spawn_server(settings).await.unwrap();

    // An unfinished handshake does not take the session slot...
    let mut unfinished = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut hello = [0u8; HELLO_LEN];
    unfinished.read_exact(&mut hello).await.unwrap();
    assert_eq!(hello[..8], CLIENT_MAGIC);
    // ...a finished one does.
    let first = common::raw::Raw::connect(&server, b"").await;
    assert_eq!(server.stats().sessions, 1);

    let mut second = TcpStream::connect(server.local_addr()).await.unwrap();
    assert_eq!(read_to_eof(&mut second).await, b"");
    assert_eq!(server.stats().sessions, 1);

    drop((first, unfinished));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_handshake_is_closed_at_the_core_deadline() {
    let mut settings = loopback_settings();
    settings.server.handshake_timeout = Duration::from_millis(200);
    let server = spawn_server(settings).await.unwrap();

    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    let received = read_to_eof(&mut silent).await;
    assert_eq!(received.len(), HELLO_LEN);
    assert_eq!(received[..8], CLIENT_MAGIC);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_over_tls_with_a_token() {
    let (dir, ca, cert, key) = make_certs("e2e-tls");
    let mut settings = loopback_settings();
    settings.tls = Some(ticketing_tokio::tls::load_server_config(&cert, &key).unwrap());
    settings.server.client_tokens = ClientTokens::new([TOKEN]).unwrap();
    let server = spawn_server(settings).await.unwrap();

    // The published client verifies the certificate against the host part
    // of the address, here the IP 127.0.0.1.
    let broker = TicketBroker::builder()
        .addrs([server.local_addr().to_string()])
        .token(TOKEN)
        .tls(TlsMode::Ca(ca.clone()))
        .connect()
        .unwrap();
    assert!(
        broker.wait_ready(READY).await,
        "TLS client did not get ready"
    );
    let ticket = broker
        .acquire("tls-key", WAIT, LEASE, BUDGET)
        .await
        .unwrap();
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;

    // A wrong token is refused after TLS.
    let wrong = TicketBroker::builder()
        .addrs([server.local_addr().to_string()])
        .token("wrong-client-token-0123456789")
        .tls(TlsMode::Ca(ca))
        .connect()
        .unwrap();
    let result = wrong.acquire("tls-key", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Auth)), "{result:?}");
    wrong.close().await;

    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalled_in_tls_is_closed_at_the_core_deadline() {
    let (dir, _ca, cert, key) = make_certs("e2e-stall");
    let mut settings = loopback_settings();
    settings.tls = Some(ticketing_tokio::tls::load_server_config(&cert, &key).unwrap());
    settings.server.handshake_timeout = Duration::from_millis(200);
    let server = spawn_server(settings).await.unwrap();

    // Never sends a ClientHello; nothing is written back before TLS is up.
    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    assert_eq!(read_to_eof(&mut silent).await, b"");
    assert_eq!(server.stats().connections, 0);
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tls_key_that_does_not_match_the_certificate_is_refused() {
    let (dir, _ca, cert, _key) = make_certs("e2e-mismatch");
    let other_key = dir.join("other.key");
    std::fs::write(
        &other_key,
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let err = ticketing_tokio::tls::load_server_config(&cert, &other_key).unwrap_err();
    assert_eq!(err.part, ticketing_tokio::tls::TlsPart::Pair);

    let args = ticketing_tokio::config::ServeArgs {
        tls_cert: Some(cert.clone()),
        tls_key: Some(other_key),
        ..Default::default()
    };
    let err = ticketing_tokio::config::load(&args, &Default::default()).unwrap_err();
    assert_eq!(err.field, "tls");
    std::fs::remove_dir_all(dir).unwrap();
}
