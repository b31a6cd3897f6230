//! Interop over real TCP: the published `ticketing` 0.4.0 client against the
//! in-process server, for what e2e.rs does not already cover — contention
//! and FIFO, the default `T` margin, `B`, key sets, token rotation, and
//! clients that die while holding or waiting (played by a raw socket).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::raw::{Raw, acquire};
use common::{
    BUDGET, LEASE, READY, loopback_server, loopback_settings, published_loopback,
    wait_for_connections, wait_for_waiters,
};
use ticketing::{ReleaseOutcome, TicketBroker, TicketError};
use ticketing_core::auth::ClientTokens;
use ticketing_core::wire::Reply;
use ticketing_tokio::spawn_server;
use tokio::sync::Mutex;

const WAIT: Duration = Duration::from_secs(10);
/// Turns a missing event into a failure rather than a hang.
const BOUND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_cycles_release_on_either_connection() {
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    // The published client keeps two connections to one address and picks
    // them in turn, so about half of these releases travel on the
    // connection that did not acquire. wait_ready needs only one of them.
    wait_for_connections(&server, 2).await;
    let mut last = 0;
    for _ in 0..200 {
        let ticket = broker.acquire("cycle", WAIT, LEASE, BUDGET).await.unwrap();
        assert!(ticket.token() > last, "{} after {last}", ticket.token());
        last = ticket.token();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(server.stats().lock.keys, 0);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_on_one_key_is_mutually_exclusive_with_rising_tokens() {
    const TASKS: u64 = 32;
    const OPS: u64 = 40;
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    let in_section = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    // Pushed inside the critical section, so the order is the grant order.
    let tokens = Arc::new(Mutex::new(Vec::new()));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (broker, in_section, counter, tokens) = (
            broker.clone(),
            Arc::clone(&in_section),
            Arc::clone(&counter),
            Arc::clone(&tokens),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..OPS {
                let ticket = broker.acquire("hot", WAIT, LEASE, BUDGET).await.unwrap();
                assert!(!in_section.swap(true, Ordering::AcqRel), "sections overlap");
                tokens.lock().await.push(ticket.token());
                // A non-atomic read-modify-write with a yield in between:
                // lost updates would show if two tasks were inside at once.
                let seen = counter.load(Ordering::Acquire);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::Release);
                in_section.store(false, Ordering::Release);
                assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::Acquire), TASKS * OPS);
    let tokens = tokens.lock().await;
    assert_eq!(tokens.len() as u64, TASKS * OPS);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens not strictly increasing in grant order"
    );
    assert_eq!(server.stats().lock.keys, 0);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_served_in_arrival_order() {
    const WAITERS: usize = 6;
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    let holder = broker.acquire("fifo", WAIT, LEASE, BUDGET).await.unwrap();
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    for index in 0..WAITERS {
        let (broker, granted_tx) = (broker.clone(), granted_tx.clone());
        tokio::spawn(async move {
            let ticket = broker.acquire("fifo", WAIT, LEASE, BUDGET).await.unwrap();
            granted_tx.send((index, ticket)).unwrap();
        });
        // Arrival order is fixed by letting each one queue before the next.
        wait_for_waiters(&server, index + 1).await;
    }
    let mut previous = holder.token();
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    for expected in 0..WAITERS {
        let (index, ticket) = tokio::time::timeout(BOUND, granted_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(index, expected, "served out of arrival order");
        assert!(ticket.token() > previous);
        previous = ticket.token();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(server.stats().lock.waiters, 0);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_wait_is_timeout_with_the_default_margin() {
    // e2e.rs checks a 500 ms margin; the default 100 ms must also beat the
    // client's own deadline, or the client would report Indeterminate.
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    let holder = broker.acquire("busy", WAIT, LEASE, BUDGET).await.unwrap();
    for _ in 0..2 {
        let result = broker
            .acquire("busy", Duration::from_secs(1), LEASE, BUDGET)
            .await;
        assert!(matches!(result, Err(TicketError::Timeout)), "{result:?}");
    }
    // Wait 0: one immediate try, answered T, never queued.
    let result = broker.acquire("busy", Duration::ZERO, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Timeout)), "{result:?}");
    assert_eq!(server.stats().lock.waiters, 0);
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_or_table_is_busy() {
    let mut settings = loopback_settings();
    settings.server.lock.limits.waiters_per_key_max = 1;
    settings.server.lock.limits.keys_max = 2;
    let server = spawn_server(settings).await.unwrap();
    let broker = published_loopback(&server).await;

    let holder = broker.acquire("q", WAIT, LEASE, BUDGET).await.unwrap();
    let waiter = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.acquire("q", WAIT, LEASE, BUDGET).await })
    };
    wait_for_waiters(&server, 1).await;
    let result = broker.acquire("q", WAIT, LEASE, BUDGET).await;
    assert!(
        matches!(result, Err(TicketError::Busy)),
        "queue: {result:?}"
    );
    assert_eq!(server.stats().lock.waiters, 1, "a busy acquire was queued");

    let other = broker.acquire("r", WAIT, LEASE, BUDGET).await.unwrap();
    let result = broker.acquire("s", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Busy)), "keys: {result:?}");

    // The queued waiter was unaffected and gets the key.
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(other.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_set_waits_for_a_holder_and_takes_all_keys_at_once() {
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    let holder = broker.acquire("set-b", WAIT, LEASE, BUDGET).await.unwrap();
    let set = {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .acquire_set(&["set-a", "set-b", "set-c"], WAIT, LEASE, BUDGET)
                .await
        })
    };
    wait_for_waiters(&server, 1).await;
    // Nothing of the set is taken while it waits.
    assert_eq!(server.stats().lock.held_keys, 1);

    let holder_token = holder.token();
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    let set = set.await.unwrap().unwrap();
    assert!(set.token() > holder_token);
    assert_eq!(set.keys().collect::<Vec<_>>(), ["set-a", "set-b", "set-c"]);
    assert_eq!(server.stats().lock.held_keys, 3);
    for key in ["set-a", "set-b", "set-c"] {
        let result = broker.acquire(key, Duration::ZERO, LEASE, BUDGET).await;
        assert!(
            matches!(result, Err(TicketError::Timeout)),
            "{key}: {result:?}"
        );
    }
    assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(server.stats().lock.keys, 0);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configured_token_is_accepted_during_rotation() {
    const OLD: &str = "old-client-token-0123456789";
    const NEW: &str = "new-client-token-0123456789";
    let mut settings = loopback_settings();
    settings.server.client_tokens = ClientTokens::new([OLD, NEW]).unwrap();
    let server = spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let with_token = |token: &str| {
        TicketBroker::builder()
            .addrs([addr.clone()])
            .token(token)
            .connect()
            .unwrap()
    };

    for token in [OLD, NEW] {
        let broker = with_token(token);
        assert!(broker.wait_ready(READY).await, "{token} not accepted");
        let ticket = broker.acquire("rot", WAIT, LEASE, BUDGET).await.unwrap();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
        broker.close().await;
    }
    let retired = with_token("retired-client-token-01234567");
    let result = retired.acquire("rot", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Auth)), "{result:?}");
    retired.close().await;
    // The empty token is no longer enough once tokens are configured.
    let anonymous = TicketBroker::connect_loopback([addr.clone()]);
    let result = anonymous.acquire("rot", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Auth)), "{result:?}");
    anonymous.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_delivered_grant_stays_until_its_lease_ends() {
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    wait_for_connections(&server, 2).await;
    let mut raw = Raw::connect(&server, b"").await;
    raw.send(&acquire(1, "ghost", 0, 2)).await;
    assert!(matches!(raw.reply().await, Reply::Acquired { rid: 1, .. }));
    drop(raw);
    // The server has seen the close before anyone asks for the key.
    wait_for_connections(&server, 2).await;

    // The dead client was told it holds the key; only its lease frees it.
    let result = broker.acquire("ghost", Duration::ZERO, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Timeout)), "{result:?}");
    assert_eq!(server.stats().lock.held_keys, 1);
    // Queued behind the 2 s lease; granted by the expiry timer.
    let ticket = broker
        .acquire("ghost", Duration::from_secs(5), LEASE, BUDGET)
        .await
        .unwrap();
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_dropped_and_the_next_live_one_served() {
    let server = loopback_server().await;
    let broker = published_loopback(&server).await;
    let holder = broker.acquire("line", WAIT, LEASE, BUDGET).await.unwrap();

    let mut raw = Raw::connect(&server, b"").await;
    raw.send(&acquire(1, "line", 30, 30)).await;
    wait_for_waiters(&server, 1).await;
    let live = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.acquire("line", WAIT, LEASE, BUDGET).await })
    };
    wait_for_waiters(&server, 2).await;

    // The first in line dies; its place in the queue goes with it.
    drop(raw);
    wait_for_waiters(&server, 1).await;
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    let ticket = live.await.unwrap().unwrap();
    assert_eq!(server.stats().lock.waiters, 0);
    assert_eq!(server.stats().lock.held_keys, 1);
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(server.stats().lock.keys, 0);
    broker.close().await;
    server.shutdown().await;
}
