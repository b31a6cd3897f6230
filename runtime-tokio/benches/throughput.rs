//! The published client's steady-state workload against a real
//! `ticketing serve` process: 64 tasks share 32 keys × 1,250 acquire+release
//! = 40,000 operations (wait and lease 30 s, work budget 1 s), each critical
//! section checked for overlap and counted. Prints ops/s and acquire+release
//! latency per round, then the median round.
//!
//! `cargo bench -p ticketing-tokio --bench throughput`. Settings (env):
//! `TICKETING_BENCH_ROUNDS` (default 3), `TICKETING_BENCH_CLIENT_THREADS`
//! worker threads of the client runtime (default: tokio's, one per core).
//! The server runs as its own process, as in production.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing::{ReleaseOutcome, TicketBroker, TicketError};

const TASKS: usize = 64;
const KEYS: usize = 32;
const OPS_PER_KEY: usize = 1_250;
const WAIT: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);
const WORK_BUDGET: Duration = Duration::from_secs(1);

struct KeyState {
    in_section: AtomicBool,
    count: AtomicU64,
}

/// Kills the server process however the bench ends.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().expect(name))
        .unwrap_or(default)
}

fn start_server() -> (ServerProcess, SocketAddr) {
    // Ask the OS for a free port, then hand it to the server.
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port");
    let child = Command::new(env!("CARGO_BIN_EXE_ticketing"))
        .args([
            "serve",
            "--listen",
            &addr.to_string(),
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("start ticketing serve");
    let server = ServerProcess(child);
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "server did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, addr)
}

/// The 40,000 operations in a fixed shuffled order (xorshift, fixed seed), so
/// rounds and runs compare like with like.
fn shuffled_keys(seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..KEYS)
        .flat_map(|key| std::iter::repeat_n(key, OPS_PER_KEY))
        .collect();
    let mut state = seed;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

async fn round(broker: &TicketBroker, seed: u64) -> (Duration, Histogram<u64>) {
    let order = Arc::new(shuffled_keys(seed));
    let next = Arc::new(AtomicUsize::new(0));
    let keys: Arc<Vec<KeyState>> = Arc::new(
        (0..KEYS)
            .map(|_| KeyState {
                in_section: AtomicBool::new(false),
                count: AtomicU64::new(0),
            })
            .collect(),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (broker, order, next, keys) = (
            broker.clone(),
            Arc::clone(&order),
            Arc::clone(&next),
            Arc::clone(&keys),
        );
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            while let Some(&key) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                let op_started = Instant::now();
                let name = format!("bench-{key}");
                let ticket = loop {
                    match broker.acquire(&name, WAIT, LEASE, WORK_BUDGET).await {
                        Ok(ticket) => break ticket,
                        // The workload's own rule: back off on capacity answers.
                        Err(TicketError::Busy | TicketError::ClientCapacity) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(error) => panic!("acquire {name}: {error}"),
                    }
                };
                let state = &keys[key];
                assert!(
                    !state.in_section.swap(true, Ordering::AcqRel),
                    "two holders of {name} at once"
                );
                let before = state.count.load(Ordering::Acquire);
                tokio::task::yield_now().await;
                state.count.store(before + 1, Ordering::Release);
                state.in_section.store(false, Ordering::Release);
                let released = ticket.release().await.expect("release");
                assert_eq!(released, ReleaseOutcome::Released);
                let _ = hist.record(op_started.elapsed().as_nanos() as u64);
            }
            hist
        }));
    }
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for task in tasks {
        all.add(task.await.expect("task")).expect("histogram add");
    }
    let elapsed = started.elapsed();
    for (key, state) in keys.iter().enumerate() {
        assert_eq!(
            state.count.load(Ordering::Acquire),
            OPS_PER_KEY as u64,
            "key {key}: lost or doubled critical sections"
        );
    }
    (elapsed, all)
}

fn main() {
    let rounds = env_or("TICKETING_BENCH_ROUNDS", 3).max(1);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Ok(threads) = std::env::var("TICKETING_BENCH_CLIENT_THREADS") {
        builder.worker_threads(threads.parse().expect("TICKETING_BENCH_CLIENT_THREADS"));
    }
    let runtime = builder.build().expect("tokio runtime");
    let (_server, addr) = start_server();
    let total = (KEYS * OPS_PER_KEY) as f64;
    let mut rates: Vec<f64> = runtime.block_on(async {
        let broker = TicketBroker::connect_loopback([addr.to_string()]);
        assert!(broker.wait_ready(Duration::from_secs(5)).await);
        let mut rates = Vec::new();
        for r in 0..rounds {
            let (elapsed, hist) = round(&broker, 0x9e37_79b9_7f4a_7c15 ^ r as u64).await;
            let rate = total / elapsed.as_secs_f64();
            let us = |q: f64| hist.value_at_quantile(q) as f64 / 1_000.0;
            println!(
                "round {r}: {TASKS} tasks, {KEYS} keys x {OPS_PER_KEY} = {total} ops in {:.1} ms = {rate:.0} ops/s; \
                 acquire+release µs p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
                elapsed.as_secs_f64() * 1e3,
                us(0.5),
                us(0.99),
                us(0.999),
                hist.max() as f64 / 1_000.0,
            );
            rates.push(rate);
        }
        broker.close().await;
        rates
    });
    rates.sort_by(f64::total_cmp);
    println!(
        "median of {rounds} rounds: {:.0} ops/s (published figure for this workload: 143,062 ops/s on a 10-core Apple M4)",
        rates[rates.len() / 2]
    );
}
