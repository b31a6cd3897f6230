//! Both dialects on one port at once: published `ticketing` 0.4.0 brokers
//! (wire v3) and published `ticketing` 0.3.0 brokers (line dialect) hammer
//! the same keys of one real server (and of a 3-node cluster). Each critical
//! section checks that no other holder of its key is inside, and records
//! the grant's token while it holds the key, so the record per key is in
//! grant order: the tokens must rise strictly across both dialects, and
//! both must have been served.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ticketing::BrokerMode;
use ticketing_interop::{Cluster, Server};

const KEYS: usize = 4;
const BROKERS_PER_DIALECT: usize = 2;
const TASKS_PER_BROKER: usize = 16;
const WAIT: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);
const WORK_BUDGET: Duration = Duration::from_secs(1);
const READY: Duration = Duration::from_secs(10);
const RUN_BOUND: Duration = Duration::from_secs(120);
const CLIENT_TOKEN: &str = "interop-client-token-0123456789";

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

/// How to reach the server(s) under test.
struct Target {
    addrs: Vec<String>,
    token: Option<&'static str>,
    /// The cluster identity, for the v3 client in cluster mode.
    cluster: Option<[u8; 32]>,
}

impl Target {
    async fn v3_broker(&self) -> ticketing::TicketBroker {
        let broker = match (self.token, self.cluster) {
            (None, None) => ticketing::TicketBroker::connect_loopback(self.addrs.clone()),
            (token, cluster) => {
                let mut builder = ticketing::TicketBroker::builder()
                    .addrs(self.addrs.clone())
                    .token(token.unwrap_or(""));
                if let Some(identity_fingerprint) = cluster {
                    builder = builder.mode(BrokerMode::Cluster {
                        identity_fingerprint,
                    });
                }
                builder.connect().expect("v3 broker")
            }
        };
        assert!(broker.wait_ready(READY).await, "v3 broker not ready");
        broker
    }

    async fn line_broker(&self) -> ticketing03::TicketBroker {
        let broker = ticketing03::TicketBroker::builder()
            .addrs(self.addrs.clone())
            .token(self.token.unwrap_or(""))
            .connect()
            .expect("line broker");
        assert!(broker.wait_ready(READY).await, "line broker not ready");
        broker
    }
}

/// `ops_per_task` acquire+release per task on the shared keys, from both
/// dialects at once; checks the record and returns the largest token.
async fn hammer(target: &Target, ops_per_task: usize, label: &str) -> u64 {
    let records: Arc<Vec<KeyRecord>> = Arc::new((0..KEYS).map(|_| KeyRecord::default()).collect());
    let mut v3_brokers = Vec::new();
    let mut line_brokers = Vec::new();
    for _ in 0..BROKERS_PER_DIALECT {
        v3_brokers.push(target.v3_broker().await);
        line_brokers.push(target.line_broker().await);
    }

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut task_id = 0;
    for broker in &v3_brokers {
        for _ in 0..TASKS_PER_BROKER {
            let (broker, records, task) = (broker.clone(), Arc::clone(&records), task_id);
            task_id += 1;
            tasks.spawn(async move {
                for op in 0..ops_per_task {
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
                for op in 0..ops_per_task {
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
    let ops = BROKERS_PER_DIALECT * TASKS_PER_BROKER * ops_per_task;
    assert_eq!(per_dialect, [ops, ops], "grants per dialect (v3, line)");
    // One token counter for both dialects and all keys.
    all_tokens.sort_unstable();
    all_tokens.dedup();
    assert_eq!(all_tokens.len(), 2 * ops, "a token was granted twice");
    println!(
        "mixed dialects{label}: {} v3 + {} line acquire+release on {KEYS} keys in {:.0} ms = {:.0} ops/s",
        per_dialect[0],
        per_dialect[1],
        elapsed.as_secs_f64() * 1e3,
        (2 * ops) as f64 / elapsed.as_secs_f64()
    );

    for broker in &v3_brokers {
        broker.close().await;
    }
    all_tokens.last().copied().unwrap_or(0)
}

/// A request the server never answers hangs both clients for ever: fail
/// instead.
async fn bounded<T>(run: impl Future<Output = T>) -> T {
    tokio::time::timeout(RUN_BOUND, run)
        .await
        .expect("the mixed run did not finish in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_and_line_clients_share_keys_and_one_token_counter() {
    let server = Server::start(&[]);
    let target = Target {
        addrs: vec![server.addr.to_string()],
        token: None,
        cluster: None,
    };
    bounded(hammer(&target, 250, "")).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_and_line_clients_share_keys_with_a_client_token() {
    let server = Server::start(&["--client-token", CLIENT_TOKEN]);
    let target = Target {
        addrs: vec![server.addr.to_string()],
        token: Some(CLIENT_TOKEN),
        cluster: None,
    };
    bounded(hammer(&target, 250, " (client token)")).await;
    server.stop();
}

/// On a 3-node cluster: the same mixed run, then the leader is killed and
/// both dialects go on, in turn on one key, with tokens still rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_and_line_clients_share_a_cluster_across_a_failover() {
    let mut cluster = Cluster::start(CLIENT_TOKEN);
    let target = Target {
        addrs: cluster.addrs(),
        token: Some(CLIENT_TOKEN),
        cluster: Some(cluster.identity),
    };
    let mut last = bounded(hammer(&target, 100, " (3-node cluster)")).await;

    let v3 = target.v3_broker().await;
    let line = target.line_broker().await;
    let old = cluster.wait_for_leader(None);
    cluster.kill(old);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    for round in 0..10 {
        let token = if round % 2 == 0 {
            // The v3 client reports an acquire cut by the failover as
            // an error (Indeterminate, NotConnected…): try again.
            loop {
                match v3.acquire("mixed-failover", WAIT, LEASE, WORK_BUDGET).await {
                    Ok(ticket) => {
                        let token = ticket.token();
                        let outcome = ticket.release().await.expect("v3 release");
                        assert_eq!(outcome, ticketing::ReleaseOutcome::Released);
                        break token;
                    }
                    Err(error) => {
                        assert!(Instant::now() < deadline, "v3 acquire: {error}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        } else {
            // The line client retries a cut acquire itself.
            let ticket = bounded(line.acquire("mixed-failover", WAIT, LEASE))
                .await
                .expect("line acquire across the failover");
            let token = ticket.token();
            assert!(ticket.release().await.expect("line release"));
            token
        };
        assert!(
            token > last,
            "round {round}: token {token} after {last} across the failover"
        );
        last = token;
    }
    let new = cluster.wait_for_leader(Some(old));
    println!(
        "mixed dialects (3-node cluster): leader {old} killed, leader {new} served 10 alternating grants in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    v3.close().await;
    cluster.stop();
}

/// What the Rust line client makes of a lease over 250 s: the server answers
/// `Ebad_lease` then `T`, so the call fails at once with `Timeout` (well
/// inside its wait) and nothing is held: v3 takes the key straight away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_lease_over_250_s_fails_at_once_and_holds_nothing() {
    let server = Server::start(&[]);
    let target = Target {
        addrs: vec![server.addr.to_string()],
        token: None,
        cluster: None,
    };
    let line = target.line_broker().await;
    let started = Instant::now();
    let refused = bounded(line.acquire("long-lease", WAIT, Duration::from_secs(300))).await;
    assert!(
        matches!(refused, Err(ticketing03::TicketError::Timeout)),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let longest = bounded(line.acquire("long-lease", WAIT, Duration::from_secs(250)))
        .await
        .expect("a 250 s lease is granted");
    let longest_token = longest.token();
    assert!(longest.release().await.expect("line release"));
    let v3 = target.v3_broker().await;
    let ticket = v3
        .acquire("long-lease", Duration::ZERO, LEASE, WORK_BUDGET)
        .await
        .expect("the key is free");
    assert!(ticket.token() > longest_token);
    assert_eq!(
        ticket.release().await.expect("v3 release"),
        ticketing::ReleaseOutcome::Released
    );
    v3.close().await;
    server.stop();
}
