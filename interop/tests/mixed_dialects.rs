//! Both dialects on one port at once: published `ticketing` 0.4.0 brokers
//! (wire v3) and published `ticketing` 0.3.0 brokers (line dialect) hammer
//! the same keys of one real server. Each critical section checks that no
//! other holder of its key is inside, and records the grant's token while
//! it holds the key, so the record per key is in grant order: the tokens
//! must rise strictly across both dialects, and both must have been served.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ticketing_interop::Server;

const KEYS: usize = 4;
const BROKERS_PER_DIALECT: usize = 2;
const TASKS_PER_BROKER: usize = 16;
const OPS_PER_TASK: usize = 250;
const WAIT: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);
const WORK_BUDGET: Duration = Duration::from_secs(1);
const READY: Duration = Duration::from_secs(10);
const RUN_BOUND: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    V3,
    Line,
}

/// One key's holder flag and its grants in the order they held the key.
#[derive(Default)]
struct KeyRecord {
    inside: AtomicBool,
    grants: Mutex<Vec<(u64, Dialect)>>,
}

impl KeyRecord {
    /// Runs while holding the key: no one else may be inside.
    async fn section(&self, key: &str, token: u64, dialect: Dialect) {
        assert!(
            !self.inside.swap(true, Ordering::AcqRel),
            "{dialect:?} token {token} granted {key} while another holder is inside"
        );
        self.grants.lock().unwrap().push((token, dialect));
        // Let other tasks run (and try to break in) while we hold it.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        self.inside.store(false, Ordering::Release);
    }
}

fn key_name(key: usize) -> String {
    format!("mixed-{key}")
}

/// Which key the `op`th operation of a task uses: tasks start on different
/// keys and walk all of them.
fn key_of(task: usize, op: usize) -> usize {
    (task * 7 + op) % KEYS
}

async fn hammer(token: Option<&str>) {
    let server = match token {
        Some(token) => Server::start(&["--client-token", token]),
        None => Server::start(&[]),
    };
    let addr = server.addr.to_string();
    let records: Arc<Vec<KeyRecord>> = Arc::new((0..KEYS).map(|_| KeyRecord::default()).collect());

    let mut v3_brokers = Vec::new();
    let mut line_brokers = Vec::new();
    for _ in 0..BROKERS_PER_DIALECT {
        let v3 = match token {
            Some(token) => ticketing::TicketBroker::builder()
                .addrs([addr.clone()])
                .token(token)
                .connect()
                .expect("v3 broker"),
            None => ticketing::TicketBroker::connect_loopback([addr.clone()]),
        };
        assert!(v3.wait_ready(READY).await, "v3 broker not ready");
        v3_brokers.push(v3);
        let line = ticketing03::TicketBroker::builder()
            .addrs([addr.clone()])
            .token(token.unwrap_or(""))
            .connect()
            .expect("line broker");
        assert!(line.wait_ready(READY).await, "line broker not ready");
        line_brokers.push(line);
    }

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut task_id = 0;
    for broker in &v3_brokers {
        for _ in 0..TASKS_PER_BROKER {
            let (broker, records, task) = (broker.clone(), Arc::clone(&records), task_id);
            task_id += 1;
            tasks.spawn(async move {
                for op in 0..OPS_PER_TASK {
                    let key = key_of(task, op);
                    let name = key_name(key);
                    let ticket = broker
                        .acquire(&name, WAIT, LEASE, WORK_BUDGET)
                        .await
                        .unwrap_or_else(|e| panic!("v3 acquire {name}: {e}"));
                    records[key]
                        .section(&name, ticket.token(), Dialect::V3)
                        .await;
                    let outcome = ticket.release().await.expect("v3 release");
                    assert_eq!(outcome, ticketing::ReleaseOutcome::Released);
                }
            });
        }
    }
    for broker in &line_brokers {
        for _ in 0..TASKS_PER_BROKER {
            let (broker, records, task) = (broker.clone(), Arc::clone(&records), task_id);
            task_id += 1;
            tasks.spawn(async move {
                for op in 0..OPS_PER_TASK {
                    let key = key_of(task, op);
                    let name = key_name(key);
                    let ticket = broker
                        .acquire(&name, WAIT, LEASE)
                        .await
                        .unwrap_or_else(|e| panic!("line acquire {name}: {e}"));
                    records[key]
                        .section(&name, ticket.token(), Dialect::Line)
                        .await;
                    assert!(
                        ticket.release().await.expect("line release"),
                        "line release of a current token answered not-found"
                    );
                }
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("task");
    }
    let elapsed = started.elapsed();

    let mut all_tokens = Vec::new();
    let mut per_dialect = [0usize; 2];
    for (key, record) in records.iter().enumerate() {
        let grants = record.grants.lock().unwrap();
        for pair in grants.windows(2) {
            assert!(
                pair[1].0 > pair[0].0,
                "{}: {:?} token {} granted after {:?} token {}",
                key_name(key),
                pair[1].1,
                pair[1].0,
                pair[0].1,
                pair[0].0
            );
        }
        let line = grants.iter().filter(|g| g.1 == Dialect::Line).count();
        let v3 = grants.len() - line;
        assert!(
            line > 0 && v3 > 0,
            "{}: {v3} v3 and {line} line grants",
            key_name(key)
        );
        per_dialect[0] += v3;
        per_dialect[1] += line;
        all_tokens.extend(grants.iter().map(|g| g.0));
    }
    let ops = BROKERS_PER_DIALECT * TASKS_PER_BROKER * OPS_PER_TASK;
    assert_eq!(per_dialect, [ops, ops], "grants per dialect (v3, line)");
    // One token counter for both dialects and all keys.
    all_tokens.sort_unstable();
    all_tokens.dedup();
    assert_eq!(all_tokens.len(), 2 * ops, "a token was granted twice");
    println!(
        "mixed dialects{}: {} v3 + {} line acquire+release on {KEYS} keys in {:.0} ms = {:.0} ops/s",
        if token.is_some() {
            " (client token)"
        } else {
            ""
        },
        per_dialect[0],
        per_dialect[1],
        elapsed.as_secs_f64() * 1e3,
        (2 * ops) as f64 / elapsed.as_secs_f64()
    );

    for broker in &v3_brokers {
        broker.close().await;
    }
    drop(line_brokers);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_and_line_clients_share_keys_and_one_token_counter() {
    bounded(hammer(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_and_line_clients_share_keys_with_a_client_token() {
    bounded(hammer(Some("interop-client-token-0123456789"))).await;
}

/// A request the server never answers hangs both clients for ever: fail
/// instead.
async fn bounded(run: impl Future<Output = ()>) {
    tokio::time::timeout(RUN_BOUND, run)
        .await
        .expect("the mixed run did not finish in time");
}
