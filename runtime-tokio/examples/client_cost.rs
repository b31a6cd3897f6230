//! What our tokio client costs per acquire+release against a running
//! `ticketing serve`, for profiling the client alone (`perf stat` on this
//! process counts only the client: the server is another process).
//!
//! ```sh
//! ticketing serve --listen 127.0.0.1:5300 --state-dir /tmp/cost-state &
//! cargo run --release -p ticketing-tokio --example client_cost -- \
//!     ADDR solo|load THREADS OPS
//! ```
//!
//! - `solo`: one task, acquire+release on a key nobody else uses, one
//!   request in flight (the uncontended latency goal in
//!   docs/performance.md), after the round trip of a tiny TCP echo in this
//!   process (the same echo as the throughput bench's) as the yardstick.
//! - `load`: 64 tasks on 32 keys, as `ticketing bench` and the throughput
//!   bench run it (a yield inside each critical section).
//!
//! `THREADS` = 1 runs a current-thread runtime, more a multi-thread one
//! with that many workers. Prints the p50 (solo) or ops/s (load) and the
//! CPU time this process spent per acquire+release (from `/proc`), and,
//! with `perf stat` around it, the counts divide by OPS (set
//! `CLIENT_COST_NO_ECHO=1` to leave the echo out of them).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};

#[path = "../benches/support/echo.rs"]
mod echo;

const WAIT: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);
const WORK_BUDGET: Duration = Duration::from_secs(1);
/// Tasks and keys of the `load` workload.
const LOAD_TASKS: usize = 64;
const LOAD_KEYS: usize = 32;
/// Pairs done before measuring (connections and caches warm).
const WARM_UP_OPS: usize = 500;
/// Most operations the last argument may ask for.
const OPS_MAX: usize = 10_000_000;

/// CPU time (user + system) this process has used, from `/proc/self/stat`.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// One acquire+release; `yield_inside` yields once in the critical section
/// (the load workloads do, the uncontended loop does not).
async fn pair(broker: &TicketBroker, key: &str, yield_inside: bool) {
    let ticket = broker
        .acquire(key, WAIT, LEASE, WORK_BUDGET)
        .await
        .expect("acquire");
    if yield_inside {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        ticket.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

async fn solo(broker: &TicketBroker, ops: usize) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    for i in 0..WARM_UP_OPS + ops {
        let started = Instant::now();
        pair(broker, "cost-solo", false).await;
        if i >= WARM_UP_OPS {
            let _ = hist.record(started.elapsed().as_nanos() as u64);
        }
    }
    hist
}

async fn load(broker: &TicketBroker, ops: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let keys: Arc<[String]> = (0..LOAD_KEYS).map(|i| format!("cost-{i}")).collect();
    let mut tasks = Vec::with_capacity(LOAD_TASKS);
    for _ in 0..LOAD_TASKS {
        let (broker, next, keys) = (broker.clone(), Arc::clone(&next), Arc::clone(&keys));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                pair(&broker, &keys[i % LOAD_KEYS], true).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
}

fn usage() -> ! {
    eprintln!("usage: client_cost ADDR solo|load THREADS OPS");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, mode, threads, ops] = args.as_slice() else {
        usage()
    };
    let threads: usize = threads.parse().unwrap_or_else(|_| usage());
    let ops: usize = ops
        .parse()
        .ok()
        .filter(|ops| (1..=OPS_MAX).contains(ops))
        .unwrap_or_else(|| usage());
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("runtime");
    // `CLIENT_COST_NO_ECHO=1` leaves the echo out, so that counts under
    // `perf stat` are the client's alone.
    let with_echo = mode == "solo" && std::env::var_os("CLIENT_COST_NO_ECHO").is_none();
    let echo_addr = with_echo.then(echo::start_echo);
    runtime.block_on(async {
        let broker = TicketBroker::connect_loopback([addr.clone()]);
        assert!(broker.wait_ready(Duration::from_secs(5)).await, "not ready");
        match mode.as_str() {
            "solo" => {
                let echo_us = match echo_addr {
                    Some(echo_addr) => {
                        let echo = echo::round_trips_ns(echo_addr, 200, 2_000).await;
                        echo.value_at_quantile(0.5) as f64 / 1e3
                    }
                    None => f64::NAN,
                };
                let before = cpu_time();
                let hist = solo(&broker, ops).await;
                let cpu = cpu_time().zip(before).map(|(a, b)| a - b);
                let p50_us = hist.value_at_quantile(0.5) as f64 / 1e3;
                println!(
                    "solo: p50 {p50_us:.1} µs p99 {:.1} µs; echo round trip {echo_us:.1} µs; \
                     p50 = {:.2} x two round trips; CPU {} µs per pair",
                    hist.value_at_quantile(0.99) as f64 / 1e3,
                    p50_us / (2.0 * echo_us),
                    cpu.map_or("?".into(), |c| format!(
                        "{:.2}",
                        c.as_secs_f64() * 1e6 / ops as f64
                    )),
                );
            }
            "load" => {
                load(&broker, WARM_UP_OPS).await;
                let before = cpu_time();
                let started = Instant::now();
                load(&broker, ops).await;
                let elapsed = started.elapsed();
                let cpu = cpu_time().zip(before).map(|(a, b)| a - b);
                println!(
                    "load: {ops} pairs in {:.2} s = {:.0} ops/s; CPU {} µs per pair",
                    elapsed.as_secs_f64(),
                    ops as f64 / elapsed.as_secs_f64(),
                    cpu.map_or("?".into(), |c| format!(
                        "{:.2}",
                        c.as_secs_f64() * 1e6 / ops as f64
                    )),
                );
            }
            _ => usage(),
        }
        broker.close().await;
    });
}
