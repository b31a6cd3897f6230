//! `ticketing bench`: acquire+release pairs from many tasks.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing_tokio::config::BenchArgs;
use ticketing_tokio::{ReleaseOutcome, TicketBroker, TicketError};

use crate::cli_client::{CONNECT_TIMEOUT, ClientOptions, client_broker};

/// Progress line refresh interval.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Highest latency the histogram records (longer ones are clamped).
const LATENCY_MAX_MICROS: u64 = 300_000_000;

pub fn run(args: &BenchArgs) -> ExitCode {
    if args.clients == 0 || args.keys == 0 || args.ops == 0 {
        eprintln!("ticketing bench: --clients, --keys and --ops must be positive");
        return ExitCode::from(2);
    }
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.threads))
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ticketing bench: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(bench(args))
}

/// Latencies a task collects before adding them to the shared histogram.
const LATENCY_BATCH: usize = 256;

/// What the tasks share: one latency histogram (one per task would be
/// hundreds of KiB each, and recording into 64 of them misses the cache on
/// every pair, a cost the client's CPU figure would carry), and the errors
/// counted by text.
#[derive(Default)]
struct Totals {
    histogram: Option<Histogram<u64>>,
    errors: std::collections::BTreeMap<String, u64>,
}

impl Totals {
    fn record(&mut self, latencies_us: &[u64]) {
        let histogram = self.histogram.get_or_insert_with(new_histogram);
        for &us in latencies_us {
            histogram.saturating_record(us.clamp(1, LATENCY_MAX_MICROS));
        }
    }
    fn error(&mut self, error: String) {
        *self.errors.entry(error).or_insert(0) += 1;
    }
}

type SharedTotals = Arc<std::sync::Mutex<Totals>>;

fn lock(totals: &SharedTotals) -> std::sync::MutexGuard<'_, Totals> {
    totals
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn bench(args: &BenchArgs) -> ExitCode {
    let broker = match connect_and_warm_up(args).await {
        Ok(broker) => broker,
        Err(code) => return code,
    };
    let server_pids = if args.server_pids.is_empty() {
        cpu::listening_pids(&args.addrs)
    } else {
        args.server_pids.clone()
    };
    let measured = run_workers(&broker, args, &server_pids).await;
    broker.close().await;
    report(args, &server_pids, measured)
}

/// A broker connected to `args.addrs` that has done one pair; the exit
/// code if that failed.
async fn connect_and_warm_up(args: &BenchArgs) -> Result<TicketBroker, ExitCode> {
    let options = ClientOptions {
        addrs: &args.addrs,
        token: args.token.as_deref(),
        tls_ca: args.tls_ca.as_deref(),
        tls_system_roots: false,
        cluster_identity: args.cluster_identity,
    };
    let broker = match client_broker(&options) {
        Ok(broker) => broker,
        Err(e) => {
            eprintln!("ticketing bench: {e}");
            return Err(ExitCode::from(2));
        }
    };
    if !broker.wait_ready(CONNECT_TIMEOUT).await {
        eprintln!(
            "ticketing bench: cannot connect to {}",
            args.addrs.join(", ")
        );
        return Err(ExitCode::from(1));
    }
    if let Err(e) = warm_up(&broker, args).await {
        eprintln!("ticketing bench: the warm-up pair failed: {e}");
        return Err(ExitCode::from(1));
    }
    Ok(broker)
}

/// What one measured run gave.
struct Measured {
    elapsed: Duration,
    /// CPU this process spent during the run, if `/proc` tells.
    client_cpu: Option<Duration>,
    /// CPU the server processes spent during the run, if `/proc` tells.
    server_cpu: Option<Duration>,
    totals: Totals,
}

/// Runs `args.clients` worker tasks until `args.ops` pairs are done,
/// showing progress on a terminal, and measures the time and CPU spent.
async fn run_workers(broker: &TicketBroker, args: &BenchArgs, server_pids: &[u32]) -> Measured {
    // Built once: the load generator's own allocations are not the client's.
    let keys: Arc<[String]> = (0..args.keys).map(|i| format!("bench-{i}")).collect();
    let totals = SharedTotals::default();
    let claimed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let client_cpu_before = cpu::process_cpu(std::process::id());
    let server_cpu_before = cpu::total_cpu(server_pids);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.clients);
    for client in 0..args.clients {
        tasks.push(tokio::spawn(worker(
            broker.clone(),
            args.clone(),
            Arc::clone(&keys),
            client,
            Arc::clone(&totals),
            Arc::clone(&claimed),
            Arc::clone(&done),
        )));
    }
    let progress = std::io::stderr()
        .is_terminal()
        .then(|| tokio::spawn(show_progress(Arc::clone(&done), args.ops, started)));
    for task in tasks {
        if let Err(e) = task.await {
            lock(&totals).error(format!("task failed: {e}"));
        }
    }
    let elapsed = started.elapsed();
    let client_cpu = cpu::process_cpu(std::process::id())
        .zip(client_cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    let server_cpu = cpu::total_cpu(server_pids)
        .zip(server_cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    if let Some(progress) = progress {
        progress.abort();
        eprint!("\r\x1b[K");
    }
    let totals = std::mem::take(&mut *lock(&totals));
    Measured {
        elapsed,
        client_cpu,
        server_cpu,
        totals,
    }
}

/// Prints throughput, latency and CPU per pair, then the errors; failure
/// if there were any.
fn report(args: &BenchArgs, server_pids: &[u32], measured: Measured) -> ExitCode {
    let Measured {
        elapsed,
        client_cpu,
        server_cpu,
        totals: Totals { histogram, errors },
    } = measured;
    let histogram = histogram.unwrap_or_else(new_histogram);
    let ok = histogram.len();
    let rate = ok as f64 / elapsed.as_secs_f64();
    println!(
        "{ok} acquire+release pairs in {:.2} s: {rate:.0} ops/s ({} clients, {} keys)",
        elapsed.as_secs_f64(),
        args.clients,
        args.keys
    );
    println!(
        "latency (acquire+release): p50 {} p99 {} p99.9 {} max {}",
        micros(histogram.value_at_quantile(0.5)),
        micros(histogram.value_at_quantile(0.99)),
        micros(histogram.value_at_quantile(0.999)),
        micros(histogram.max()),
    );
    let runtime = if args.threads == 1 {
        "current-thread runtime".to_owned()
    } else {
        format!("multi-thread runtime, {} workers", args.threads)
    };
    let per_op = |cpu: Duration| cpu.as_secs_f64() * 1e6 / ok.max(1) as f64;
    let client_us = client_cpu.map(per_op);
    match client_us {
        Some(us) => println!("client CPU: {us:.2} µs per acquire+release ({runtime})"),
        None => println!("client CPU: unknown (no /proc) ({runtime})"),
    }
    let server_us = server_cpu.map(per_op);
    match server_us {
        Some(us) => println!(
            "server CPU: {us:.2} µs per acquire+release (pid {})",
            server_pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => println!("server CPU: unknown (give --server-pid)"),
    }
    if let (Some(client_us), Some(server_us)) = (client_us, server_us) {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        // Client and server share these cores: each pair costs both.
        let ceiling = cores as f64 * 1e6 / (client_us + server_us).max(1e-9);
        println!(
            "client+server CPU ceiling on {cores} cores: {ceiling:.0} ops/s; measured {:.2} of it",
            rate / ceiling
        );
    }
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        for (error, count) in errors {
            println!("errors: {count} × {error}");
        }
        ExitCode::from(1)
    }
}

/// Attempts of the warm-up pair before the benchmark gives up.
const WARM_UP_ATTEMPTS: usize = 5;

/// One acquire+release outside the measurement, retried a few times: in
/// cluster mode the broker may first reach a follower, whose `M` ends the
/// session and makes every other request already sent on it
/// indeterminate; after one pair the broker routes to the leader, and the
/// figures measure the steady state.
async fn warm_up(broker: &TicketBroker, args: &BenchArgs) -> Result<(), TicketError> {
    let mut last = None;
    for _ in 0..WARM_UP_ATTEMPTS {
        let pair = match broker
            .acquire("bench-warm-up", args.wait, args.lease, args.budget)
            .await
        {
            Ok(ticket) => ticket.release().await.map(|_| ()),
            Err(e) => Err(e),
        };
        match pair {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(TicketError::NotConnected))
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_MICROS, 3).expect("valid histogram bounds")
}

fn micros(value: u64) -> String {
    if value >= 10_000 {
        format!("{:.1} ms", value as f64 / 1000.0)
    } else {
        format!("{value} µs")
    }
}

async fn worker(
    broker: TicketBroker,
    args: BenchArgs,
    keys: Arc<[String]>,
    client: usize,
    totals: SharedTotals,
    claimed: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) {
    let mut latencies_us = Vec::with_capacity(LATENCY_BATCH);
    // xorshift64 seeded per client: a spread of keys with no shared RNG.
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (client as u64 + 1).wrapping_mul(0x2545_f491);
    while claimed.fetch_add(1, Ordering::Relaxed) < args.ops {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = &keys[(state % keys.len() as u64) as usize];
        let started = Instant::now();
        let result = match broker
            .acquire(key, args.wait, args.lease, args.budget)
            .await
        {
            Ok(ticket) => ticket.release().await.and_then(|outcome| match outcome {
                ReleaseOutcome::Released => Ok(()),
                ReleaseOutcome::AlreadyGoneOrNotCurrent => Err(
                    ticketing_tokio::TicketError::Protocol("lease lapsed".into()),
                ),
            }),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                latencies_us.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
                if latencies_us.len() == LATENCY_BATCH {
                    lock(&totals).record(&latencies_us);
                    latencies_us.clear();
                }
            }
            Err(e) => lock(&totals).error(e.to_string()),
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    lock(&totals).record(&latencies_us);
}

async fn show_progress(done: Arc<AtomicU64>, ops: u64, started: Instant) {
    let mut interval = tokio::time::interval(PROGRESS_INTERVAL);
    loop {
        interval.tick().await;
        let count = done.load(Ordering::Relaxed);
        let rate = count as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[K{count}/{ops} pairs, {rate:.0} ops/s");
        let _ = stderr.flush();
    }
}

mod cpu {
    //! CPU time of processes from `/proc` (Linux; `None` elsewhere).

    use std::time::Duration;

    /// `/proc` reports CPU times in clock ticks of `USER_HZ`, 100 on Linux.
    const TICKS_PER_SECOND: u64 = 100;

    /// User plus system time of process `pid`, all its threads (also ended
    /// ones).
    pub fn process_cpu(pid: u32) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses; the fields
        // after its last ')' start at field 3 (state); utime and stime are
        // fields 14 and 15.
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_ascii_whitespace().skip(11);
        let user: u64 = fields.next()?.parse().ok()?;
        let system: u64 = fields.next()?.parse().ok()?;
        let ticks = user.checked_add(system)?;
        Some(Duration::from_millis(
            ticks.checked_mul(1000 / TICKS_PER_SECOND)?,
        ))
    }

    /// The summed CPU time of `pids`; `None` if there are none or one is
    /// unreadable.
    pub fn total_cpu(pids: &[u32]) -> Option<Duration> {
        if pids.is_empty() {
            return None;
        }
        pids.iter()
            .map(|&pid| process_cpu(pid))
            .sum::<Option<Duration>>()
    }

    /// The processes listening on the ports of the loopback addresses among
    /// `addrs` (a server on this machine), as far as `/proc` shows them.
    pub fn listening_pids(addrs: &[String]) -> Vec<u32> {
        let ports: Vec<u16> = addrs
            .iter()
            .filter_map(|addr| loopback_port(addr))
            .collect();
        if ports.is_empty() {
            return Vec::new();
        }
        let mut inodes = Vec::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_ascii_whitespace().collect();
                // local_address is field 1 ("ADDR:PORT" in hex), st field 3
                // (0A = LISTEN), inode field 9.
                let (Some(local), Some(&"0A"), Some(inode)) =
                    (fields.get(1), fields.get(3), fields.get(9))
                else {
                    continue;
                };
                let port = local
                    .rsplit_once(':')
                    .and_then(|(_, port)| u16::from_str_radix(port, 16).ok());
                if port.is_some_and(|port| ports.contains(&port)) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
        let mut pids = Vec::new();
        if inodes.is_empty() {
            return pids;
        }
        let Ok(processes) = std::fs::read_dir("/proc") else {
            return pids;
        };
        for process in processes.flatten() {
            let Some(pid) = process
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
                continue;
            };
            let listens = fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|target| {
                    inodes
                        .iter()
                        .any(|inode| target.as_os_str() == inode.as_str())
                })
            });
            if listens && pid != std::process::id() {
                pids.push(pid);
            }
        }
        pids
    }

    /// The port of `host:port` when the host is an IP loopback address or
    /// `localhost`.
    fn loopback_port(addr: &str) -> Option<u16> {
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        loopback.then(|| port.parse().ok()).flatten()
    }
}
