//! The published client's steady-state workload against a real
//! `ticketing serve` process: 64 tasks share 32 keys × 1,250 acquire+release
//! = 40,000 operations (wait and lease 30 s, work budget 1 s), each critical
//! section checked for overlap and counted. The same rounds run with the
//! published 0.4.0 client and with ours (both wire v3), and with a minimal
//! client of the line dialect the published 0.3.0 clients speak
//! (`support/line_client.rs`, two connections like theirs), in turn against
//! one server, so the dialects compare within one run. Prints per round ops/s, acquire+release
//! latency and the CPU time the client and the server spent per operation
//! (from /proc), then the medians and the ceiling those CPU costs put on
//! this machine (cores / (client + server CPU per op)).
//!
//! Metrics on vs off, in the same run: a second server with the admin
//! listener on (`--admin-listen`) is scraped (`GET /metrics`) every 100 ms,
//! ten times a usual scrape rate, while our client's rounds also run
//! against it; its server CPU per operation includes serving the scrapes.
//! The core counts in both servers (counting cannot be switched off); the
//! difference is what exposing the counts costs.
//!
//! `cargo bench -p ticketing-tokio --bench throughput`. Settings (env):
//! `TICKETING_BENCH_ROUNDS` (default 3), `TICKETING_BENCH_CLIENT_THREADS`
//! worker threads of the client runtime (default: tokio's, one per core),
//! `TICKETING_BENCH_SERVER_THREADS` (the server's `--worker-threads`,
//! default: its own default).
//! The server runs as its own process, as in production.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

#[path = "support/line_client.rs"]
mod line_client;

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

/// Kills the server process however the bench ends, and removes its state
/// directory.
struct ServerProcess(Child, std::path::PathBuf);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().expect(name))
        .unwrap_or(default)
}

fn start_server(admin: Option<SocketAddr>) -> (ServerProcess, SocketAddr) {
    // Ask the OS for a free port, then hand it to the server.
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port");
    // Its own state directory, as in production (the token floor's file),
    // on the machine's disk rather than the service's default folder.
    let state_dir = std::env::temp_dir().join(format!(
        "ticketing-bench-state-{}-{}",
        std::process::id(),
        admin.is_some()
    ));
    let mut command = Command::new(env!("CARGO_BIN_EXE_ticketing"));
    command.args([
        "serve",
        "--listen",
        &addr.to_string(),
        "--log-level",
        "warn",
    ]);
    command.arg("--state-dir").arg(&state_dir);
    if let Some(admin) = admin {
        command.args(["--admin-listen", &admin.to_string()]);
    }
    if let Ok(threads) = std::env::var("TICKETING_BENCH_SERVER_THREADS") {
        command.args(["--worker-threads", &threads]);
    }
    let child = command
        .stdin(Stdio::null())
        .spawn()
        .expect("start ticketing serve");
    let server = ServerProcess(child, state_dir);
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

/// CPU time (user + system) a process has used so far, from
/// `/proc/PID/stat`; `None` where there is no procfs.
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: utime and stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // procfs counts in USER_HZ, 100 on every Linux platform we run on.
    Some(Duration::from_millis((utime + stime) * 10))
}

/// One acquire (retrying on capacity answers, the workload's own rule), a
/// check-and-count critical section, one release: the same for both
/// clients.
trait Client: Clone + Send + Sync + 'static {
    fn name() -> &'static str;
    /// Acquires `key`, runs `section` under it, releases it.
    fn op(
        &self,
        key: String,
        section: impl Future<Output = ()> + Send,
    ) -> impl Future<Output = ()> + Send;
}

/// Both crates spell the API alike, so one body serves both.
macro_rules! impl_client {
    ($krate:ident, $name:literal) => {
        impl Client for $krate::TicketBroker {
            fn name() -> &'static str {
                $name
            }
            async fn op(&self, key: String, section: impl Future<Output = ()> + Send) {
                use $krate::TicketError;
                let ticket = loop {
                    match self.acquire(&key, WAIT, LEASE, WORK_BUDGET).await {
                        Ok(ticket) => break ticket,
                        Err(TicketError::Busy | TicketError::ClientCapacity) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(error) => panic!("acquire {key}: {error}"),
                    }
                };
                section.await;
                let released = ticket.release().await.expect("release");
                assert_eq!(released, $krate::ReleaseOutcome::Released);
            }
        }
    };
}

impl_client!(ticketing, "published 0.4.0 client");
impl_client!(ticketing_tokio, "our client");

/// Whole seconds, as the line dialect carries them.
const LINE_WAIT_S: u16 = WAIT.as_secs() as u16;
const LINE_LEASE_S: u16 = LEASE.as_secs() as u16;

impl Client for line_client::LineBroker {
    fn name() -> &'static str {
        "line-dialect client"
    }
    async fn op(&self, key: String, section: impl Future<Output = ()> + Send) {
        use line_client::Acquired;
        let token = loop {
            match self.acquire(&key, LINE_WAIT_S, LINE_LEASE_S).await {
                Acquired::Token(token) => break token,
                Acquired::Busy => tokio::time::sleep(Duration::from_millis(1)).await,
                Acquired::TimedOut => panic!("acquire {key}: timed out"),
            }
        };
        section.await;
        assert!(
            self.release(&key, token).await,
            "release {key}: not current"
        );
    }
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

async fn round<C: Client>(broker: &C, seed: u64) -> (Duration, Histogram<u64>) {
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
                let state = &keys[key];
                let section = async {
                    assert!(
                        !state.in_section.swap(true, Ordering::AcqRel),
                        "two holders of bench-{key} at once"
                    );
                    let before = state.count.load(Ordering::Acquire);
                    tokio::task::yield_now().await;
                    state.count.store(before + 1, Ordering::Release);
                    state.in_section.store(false, Ordering::Release);
                };
                broker.op(format!("bench-{key}"), section).await;
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

/// What one round measured.
struct Figures {
    ops_per_s: f64,
    client_cpu_us_per_op: Option<f64>,
    server_cpu_us_per_op: Option<f64>,
}

/// Runs one round with `broker`, measuring the CPU both processes used.
async fn measured_round<C: Client>(broker: &C, server_pid: &str, r: usize) -> Figures {
    let total = (KEYS * OPS_PER_KEY) as f64;
    let cpu_before = (cpu_time("self"), cpu_time(server_pid));
    let (elapsed, hist) = round(broker, 0x9e37_79b9_7f4a_7c15 ^ r as u64).await;
    let per_op = |before: Option<Duration>, after: Option<Duration>| {
        Some((after? - before?).as_secs_f64() * 1e6 / total)
    };
    let figures = Figures {
        ops_per_s: total / elapsed.as_secs_f64(),
        client_cpu_us_per_op: per_op(cpu_before.0, cpu_time("self")),
        server_cpu_us_per_op: per_op(cpu_before.1, cpu_time(server_pid)),
    };
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1_000.0;
    let cpu = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.1}"));
    println!(
        "round {r}, {}: {TASKS} tasks, {KEYS} keys x {OPS_PER_KEY} = {total} ops in {:.1} ms = {:.0} ops/s; \
         acquire+release µs p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}; CPU µs/op client {} server {}",
        C::name(),
        elapsed.as_secs_f64() * 1e3,
        figures.ops_per_s,
        us(0.5),
        us(0.99),
        us(0.999),
        hist.max() as f64 / 1_000.0,
        cpu(figures.client_cpu_us_per_op),
        cpu(figures.server_cpu_us_per_op),
    );
    figures
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// Prints the medians of one client's rounds and the throughput its CPU
/// costs allow on `cores` cores.
fn summarize(name: &str, rounds: &[Figures], cores: usize) {
    let ops = median(rounds.iter().map(|f| f.ops_per_s).collect()).unwrap_or(0.0);
    let client = median(
        rounds
            .iter()
            .filter_map(|f| f.client_cpu_us_per_op)
            .collect(),
    );
    let server = median(
        rounds
            .iter()
            .filter_map(|f| f.server_cpu_us_per_op)
            .collect(),
    );
    print!("{name}: median {ops:.0} ops/s");
    if let (Some(client), Some(server)) = (client, server) {
        print!(
            "; CPU µs/op client {client:.1} + server {server:.1}: at most {:.0} ops/s on {cores} cores",
            cores as f64 * 1e6 / (client + server)
        );
    }
    println!();
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
}

/// Scrapes `GET /metrics` every 100 ms until `stop`; returns the scrapes
/// that answered 200 and the slowest one.
fn scrape_loop(admin: SocketAddr, stop: Arc<AtomicBool>) -> (u64, Duration) {
    use std::io::{Read, Write};
    let (mut scrapes, mut slowest) = (0, Duration::ZERO);
    while !stop.load(Ordering::Acquire) {
        let started = Instant::now();
        if let Ok(mut tcp) = TcpStream::connect(admin) {
            let _ = write!(
                tcp,
                "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
            );
            let mut response = String::new();
            if tcp.read_to_string(&mut response).is_ok() && response.starts_with("HTTP/1.1 200") {
                scrapes += 1;
                slowest = slowest.max(started.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (scrapes, slowest)
}

fn main() {
    // The bench's line client must answer the challenge as PROTOCOL-LINE.md
    // §2 says (its two vectors), or its round measures nothing.
    assert_eq!(
        line_client::line_answer("secret", b"aB3dEf_g"),
        "WvDLEd0VIA9cVatiwxXYXRGMDSXw0ibHllLgAMBffdg"
    );
    assert_eq!(
        line_client::line_answer("", b"aB3dEf_g"),
        "V2o6RKSLU7HNO8I1-W-CsbAXKL3GKvBgFahf6AueTo4"
    );
    let rounds = env_or("TICKETING_BENCH_ROUNDS", 3).max(1);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Ok(threads) = std::env::var("TICKETING_BENCH_CLIENT_THREADS") {
        builder.worker_threads(threads.parse().expect("TICKETING_BENCH_CLIENT_THREADS"));
    }
    let runtime = builder.build().expect("tokio runtime");
    let (server, addr) = start_server(None);
    let server_pid = server.0.id().to_string();
    let admin = free_port();
    let (metrics_server, metrics_addr) = start_server(Some(admin));
    let metrics_pid = metrics_server.0.id().to_string();
    let stop_scraping = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = Arc::clone(&stop_scraping);
        std::thread::spawn(move || scrape_loop(admin, stop))
    };
    let (published, ours, line, ours_metrics) = runtime.block_on(async {
        let published_broker = ticketing::TicketBroker::connect_loopback([addr.to_string()]);
        assert!(published_broker.wait_ready(Duration::from_secs(5)).await);
        let our_broker = ticketing_tokio::TicketBroker::connect_loopback([addr.to_string()]);
        assert!(our_broker.wait_ready(Duration::from_secs(5)).await);
        let line_broker = line_client::LineBroker::connect(&addr.to_string(), "", 2).await;
        let metrics_broker =
            ticketing_tokio::TicketBroker::connect_loopback([metrics_addr.to_string()]);
        assert!(metrics_broker.wait_ready(Duration::from_secs(5)).await);
        let (mut published, mut ours, mut line, mut ours_metrics) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Take turns, so a noisy neighbour hits every variant alike.
        for r in 0..rounds {
            published.push(measured_round(&published_broker, &server_pid, r).await);
            ours.push(measured_round(&our_broker, &server_pid, r).await);
            line.push(measured_round(&line_broker, &server_pid, r).await);
            print!("(metrics on, scraped every 100 ms) ");
            ours_metrics.push(measured_round(&metrics_broker, &metrics_pid, r).await);
        }
        published_broker.close().await;
        our_broker.close().await;
        metrics_broker.close().await;
        (published, ours, line, ours_metrics)
    });
    stop_scraping.store(true, Ordering::Release);
    let (scrapes, slowest) = scraper.join().expect("scraper");
    drop(metrics_server);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    summarize(ticketing::TicketBroker::name(), &published, cores);
    summarize(
        &format!("{}, metrics off", ticketing_tokio::TicketBroker::name()),
        &ours,
        cores,
    );
    summarize(line_client::LineBroker::name(), &line, cores);
    summarize(
        &format!(
            "{}, metrics on ({scrapes} scrapes, slowest {:.1} ms)",
            ticketing_tokio::TicketBroker::name(),
            slowest.as_secs_f64() * 1e3
        ),
        &ours_metrics,
        cores,
    );
    println!("published figure for this workload: 143,062 ops/s on a 10-core Apple M4");
}
