//! How our tokio client's requests leave, counted by the broker's
//! [`TicketBroker::socket_writes`]: a lone request is written by its
//! caller, in one write; requests of tasks that become ready together share
//! one write. And under contention, where both kinds mix, every critical
//! section is still exclusive.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{BUDGET, LEASE, READY, SETTLE, loopback_server, wait_for_waiters};
use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};

const WAIT: Duration = Duration::from_secs(30);

/// Current-thread runtime: the order in which tasks run is fixed, so the
/// writes are too.
#[tokio::test]
async fn a_lone_request_leaves_at_once_and_ready_tasks_share_one_write() {
    const WAITERS: usize = 8;
    let server = loopback_server().await;
    let broker = TicketBroker::connect_loopback([server.local_addr().to_string()]);
    assert!(broker.wait_ready(READY).await, "client did not get ready");
    // Both connections past their handshake, so no proof is still to be
    // written.
    tokio::time::timeout(SETTLE, async {
        while server.stats().sessions != 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both connections of the broker get ready");

    // Nothing else in flight: the acquire is written by the caller, one
    // write, before its task even yields.
    let before = broker.socket_writes();
    let holder = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert_eq!(broker.socket_writes() - before, 1, "one acquire, one write");

    // Eight tasks ready at once, all queueing behind the holder: the first
    // finds nothing else in flight and writes its own request; the seven
    // that follow wake the connection's task, which writes them together.
    let before = broker.socket_writes();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let broker = broker.clone();
            tokio::spawn(async move {
                let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
            })
        })
        .collect();
    wait_for_waiters(&server, WAITERS).await;
    let writes = broker.socket_writes() - before;
    assert_eq!(
        writes, 2,
        "{WAITERS} requests of tasks ready together: the first alone, the rest in one write"
    );

    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    for task in tasks {
        task.await.unwrap();
    }
    broker.close().await;
    server.shutdown().await;
}

/// Many tasks on few keys, on a multi-thread runtime: lone requests
/// written by their callers and batched ones mix, and every critical
/// section is still exclusive and every pair completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_contending_on_few_keys_hold_them_one_at_a_time() {
    const TASKS: usize = 16;
    const KEYS: usize = 4;
    const PAIRS_PER_TASK: usize = 50;
    let server = loopback_server().await;
    let broker = TicketBroker::connect_loopback([server.local_addr().to_string()]);
    assert!(broker.wait_ready(READY).await, "client did not get ready");
    let in_section: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (broker, in_section, done) =
                (broker.clone(), Arc::clone(&in_section), Arc::clone(&done));
            tokio::spawn(async move {
                for pair in 0..PAIRS_PER_TASK {
                    let key = (task + pair) % KEYS;
                    let ticket = broker
                        .acquire(&format!("key-{key}"), WAIT, LEASE, BUDGET)
                        .await
                        .unwrap();
                    assert!(
                        !in_section[key].swap(true, Ordering::AcqRel),
                        "two holders of key-{key} at once"
                    );
                    tokio::task::yield_now().await;
                    in_section[key].store(false, Ordering::Release);
                    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), TASKS * PAIRS_PER_TASK);
    assert_eq!(server.stats().lock.held_keys, 0);
    broker.close().await;
    server.shutdown().await;
}
