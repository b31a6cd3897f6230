//! `ticketing bench`: acquire+release pairs from many tasks, or, with
//! `--extend`, renewals (`W`) of one key held by each task.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing_tokio::config::{BenchArgs, lock_exit};
use ticketing_tokio::{ReleaseOutcome, TicketBroker, TicketError};

use crate::cli_client::{
    CONNECT_TIMEOUT, ClientOptions, client_broker, connect_failure, exit_code,
};

/// Progress line refresh interval.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Highest latency the histogram records (longer ones are clamped).
const LATENCY_MAX_MICROS: u64 = 300_000_000;

pub fn run(args: &BenchArgs) -> ExitCode {
    if args.clients == 0 || args.keys == 0 || args.ops == 0 {
        eprintln!("ticketing bench: --clients, --keys and --ops must be positive");
        return ExitCode::from(lock_exit::USAGE);
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
            return ExitCode::from(lock_exit::SOFTWARE);
        }
    };
    runtime.block_on(bench(args))
}

/// What one measured operation is called in the report.
fn unit(args: &BenchArgs) -> &'static str {
    if args.extend {
        "renewal"
    } else if args.semaphore.is_some() {
        "permit acquire+release"
    } else if args.shared {
        "shared acquire+release"
    } else {
        "acquire+release"
    }
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
    let connections = connection_count(args);
    let mut brokers = Vec::with_capacity(connections);
    for _ in 0..connections {
        match connect_and_warm_up(args).await {
            Ok(broker) => brokers.push(broker),
            Err(code) => return code,
        }
    }
    let server_pids = if args.server_pids.is_empty() {
        cpu::listening_pids(&args.addrs)
    } else {
        args.server_pids.clone()
    };
    let measured = run_workers(&brokers, args, &server_pids).await;
    for broker in brokers {
        broker.close().await;
    }
    report(args, connections, &server_pids, measured)
}

/// How many connections the tasks share: `--connections`, else one per
/// core against a single server and one against a cluster; never more than
/// there are tasks.
fn connection_count(args: &BenchArgs) -> usize {
    let chosen = match args.connections {
        Some(count) => usize::from(count),
        None if args.cluster_identity.is_some() => 1,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    chosen.clamp(1, args.clients.max(1))
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
        label: None,
    };
    let broker = match client_broker(&options) {
        Ok(broker) => broker,
        Err(e) => {
            eprintln!("ticketing bench: {e}");
            let code = match e {
                TicketError::Io { .. } => lock_exit::USAGE,
                ref other => exit_code(other),
            };
            return Err(ExitCode::from(code));
        }
    };
    if !broker.wait_ready(CONNECT_TIMEOUT).await {
        let (code, why) = connect_failure(&broker, &options, CONNECT_TIMEOUT);
        eprintln!("ticketing bench: {why}");
        return Err(ExitCode::from(code));
    }
    if let Err(e) = warm_up(&broker, args).await {
        eprintln!("ticketing bench: the warm-up pair failed: {e}");
        return Err(ExitCode::from(exit_code(&e)));
    }
    Ok(broker)
}

/// What one measured run gave.
struct Measured {
    elapsed: Duration,
    /// CPU this process spent during the run, if `/proc` tells.
    client_cpu: Option<cpu::CpuTimes>,
    /// CPU the server processes spent during the run, if `/proc` tells.
    server_cpu: Option<cpu::CpuTimes>,
    totals: Totals,
}

/// Runs `args.clients` worker tasks until `args.ops` pairs are done,
/// showing progress on a terminal, and measures the time and CPU spent.
async fn run_workers(brokers: &[TicketBroker], args: &BenchArgs, server_pids: &[u32]) -> Measured {
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
        if args.extend {
            tasks.push(tokio::spawn(renewer(
                brokers[client % brokers.len()].clone(),
                args.clone(),
                client,
                Arc::clone(&totals),
                Arc::clone(&claimed),
                Arc::clone(&done),
            )));
            continue;
        }
        tasks.push(tokio::spawn(worker(
            brokers[client % brokers.len()].clone(),
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
        .map(|(after, before)| after.since(before));
    let server_cpu = cpu::total_cpu(server_pids)
        .zip(server_cpu_before)
        .map(|(after, before)| after.since(before));
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
fn report(
    args: &BenchArgs,
    connections: usize,
    server_pids: &[u32],
    measured: Measured,
) -> ExitCode {
    let Measured {
        elapsed,
        client_cpu,
        server_cpu,
        totals: Totals { histogram, errors },
    } = measured;
    let histogram = histogram.unwrap_or_else(new_histogram);
    let ok = histogram.len();
    let rate = ok as f64 / elapsed.as_secs_f64();
    let unit = unit(args);
    if args.extend {
        println!(
            "{ok} renewals in {:.2} s: {rate:.0} ops/s ({} clients, each renewing a key of its own, {connections} connection{})",
            elapsed.as_secs_f64(),
            args.clients,
            if connections == 1 { "" } else { "s" }
        );
    } else if let Some(capacity) = args.semaphore {
        println!(
            "{ok} permit acquire+release pairs in {:.2} s: {rate:.0} permits/s ({} clients, {} semaphores of {capacity} slots, {connections} connection{})",
            elapsed.as_secs_f64(),
            args.clients,
            args.keys,
            if connections == 1 { "" } else { "s" }
        );
    } else if args.shared {
        println!(
            "{ok} shared acquire+release pairs in {:.2} s: {rate:.0} shared grants/s ({} clients, {} keys, {connections} connection{})",
            elapsed.as_secs_f64(),
            args.clients,
            args.keys,
            if connections == 1 { "" } else { "s" }
        );
    } else {
        println!(
            "{ok} acquire+release pairs in {:.2} s: {rate:.0} ops/s ({} clients, {} keys, {connections} connection{})",
            elapsed.as_secs_f64(),
            args.clients,
            args.keys,
            if connections == 1 { "" } else { "s" }
        );
    }
    println!(
        "latency ({unit}): p50 {} p99 {} p99.9 {} max {}",
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
    let split = |cpu: cpu::CpuTimes| {
        format!(
            "{:.2} µs per {unit}: user {:.2}, system {:.2}; {:.3} sleeps per {unit}",
            per_op(cpu.total()),
            per_op(cpu.user),
            per_op(cpu.system),
            cpu.sleeps as f64 / ok.max(1) as f64
        )
    };
    match client_cpu {
        Some(cpu) => println!("client CPU: {} ({runtime})", split(cpu)),
        None => println!("client CPU: unknown (no /proc) ({runtime})"),
    }
    match server_cpu {
        Some(cpu) => println!(
            "server CPU: {} (pid {})",
            split(cpu),
            server_pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => println!("server CPU: unknown (give --server-pid)"),
    }
    if let (Some(client), Some(server)) = (client_cpu, server_cpu) {
        let both_us = (per_op(client.total()) + per_op(server.total())).max(1e-9);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        // Client and server share these cores: each pair costs both.
        let ceiling = cores as f64 * 1e6 / both_us;
        println!(
            "client+server CPU ceiling on {cores} cores: {ceiling:.0} ops/s; measured {:.2} of it",
            rate / ceiling
        );
        // On one connection every pair's next request waits for its
        // previous reply (a key's hand-over chain), so client and server
        // take turns: one busy while the other waits. Then this is the bound.
        if connections == 1 {
            let in_turn = 1e6 / both_us;
            println!(
                "client and server taking turns: {in_turn:.0} ops/s; measured {:.2} of it",
                rate / in_turn
            );
        }
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
        let released = match args.semaphore {
            None if args.shared => match broker
                .acquire_shared(key, args.wait, args.lease, args.budget)
                .await
            {
                Ok(ticket) => ticket.release().await,
                Err(e) => Err(e),
            },
            None => match broker
                .acquire(key, args.wait, args.lease, args.budget)
                .await
            {
                Ok(ticket) => ticket.release().await,
                Err(e) => Err(e),
            },
            Some(capacity) => match broker
                .acquire_permits(key, 1, capacity, args.wait, args.lease, args.budget)
                .await
            {
                Ok(permit) => permit.release().await,
                Err(e) => Err(e),
            },
        };
        let result = match released {
            Ok(outcome) => match outcome {
                ReleaseOutcome::Released => Ok(()),
                ReleaseOutcome::AlreadyGoneOrNotCurrent => Err(
                    ticketing_tokio::TicketError::Protocol("lease lapsed".into()),
                ),
            },
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

/// One task of `--extend`: holds the key `bench-renew-<client>` (its own,
/// so renewals never wait behind another task) and renews it with
/// `--lease` until `--ops` renewals are claimed in all; the acquire and the
/// release at the ends are not counted.
async fn renewer(
    broker: TicketBroker,
    args: BenchArgs,
    client: usize,
    totals: SharedTotals,
    claimed: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) {
    let key = format!("bench-renew-{client}");
    let ticket = match broker
        .acquire(&key, args.wait, args.lease, args.budget)
        .await
    {
        Ok(ticket) => ticket,
        Err(e) => return lock(&totals).error(e.to_string()),
    };
    let mut latencies_us = Vec::with_capacity(LATENCY_BATCH);
    while claimed.fetch_add(1, Ordering::Relaxed) < args.ops {
        let started = Instant::now();
        match ticket.extend(args.lease).await {
            Ok(_) => {
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
    if let Err(e) = ticket.release().await {
        lock(&totals).error(e.to_string());
    }
}

async fn show_progress(done: Arc<AtomicU64>, ops: u64, started: Instant) {
    let mut interval = tokio::time::interval(PROGRESS_INTERVAL);
    loop {
        interval.tick().await;
        let count = done.load(Ordering::Relaxed);
        let rate = count as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[K{count}/{ops} done, {rate:.0} ops/s");
        let _ = stderr.flush();
    }
}

mod cpu;

#[cfg(test)]
mod tests {
    use clap::Parser;
    use ticketing_tokio::config::{Cli, Command};

    use super::*;

    fn bench_args(args: &[&str]) -> BenchArgs {
        let cli = Cli::try_parse_from([&["ticketing", "bench"], args].concat()).expect("parses");
        match cli.command {
            Command::Bench(args) => args,
            other => panic!("not bench: {other:?}"),
        }
    }

    const IDENTITY: &str =
        "--cluster-identity=0101010101010101010101010101010101010101010101010101010101010101";

    #[test]
    fn a_cluster_gets_one_connection_and_a_single_server_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(connection_count(&bench_args(&[])), cores.min(64));
        assert_eq!(connection_count(&bench_args(&["--clients", "1"])), 1);
        assert_eq!(connection_count(&bench_args(&[IDENTITY])), 1);
        // Asked for, it is what was asked, in either mode, up to the tasks.
        assert_eq!(
            connection_count(&bench_args(&[IDENTITY, "--connections", "3"])),
            3
        );
        assert_eq!(
            connection_count(&bench_args(&["--connections", "5", "--clients", "4"])),
            4
        );
    }
}
