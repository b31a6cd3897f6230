//! `ticketing bench`: acquire+release pairs from many tasks.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing_tokio::config::BenchArgs;
use ticketing_tokio::{ReleaseOutcome, TicketBroker};

use super::{CONNECT_TIMEOUT, ClientOptions, client_broker};

/// Progress line refresh interval.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Highest latency the histogram records (longer ones are clamped).
const LATENCY_MAX_MICROS: u64 = 300_000_000;

pub fn run(args: &BenchArgs) -> ExitCode {
    if args.clients == 0 || args.keys == 0 || args.ops == 0 {
        eprintln!("ticketing bench: --clients, --keys and --ops must be positive");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ticketing bench: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(bench(args))
}

struct Totals {
    histogram: Histogram<u64>,
    errors: Vec<String>,
}

async fn bench(args: &BenchArgs) -> ExitCode {
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
            return ExitCode::from(2);
        }
    };
    if !broker.wait_ready(CONNECT_TIMEOUT).await {
        eprintln!(
            "ticketing bench: cannot connect to {}",
            args.addrs.join(", ")
        );
        return ExitCode::from(1);
    }
    let claimed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.clients);
    for client in 0..args.clients {
        tasks.push(tokio::spawn(worker(
            broker.clone(),
            args.clone(),
            client,
            Arc::clone(&claimed),
            Arc::clone(&done),
        )));
    }
    let progress = std::io::stderr()
        .is_terminal()
        .then(|| tokio::spawn(show_progress(Arc::clone(&done), args.ops, started)));
    let mut histogram = new_histogram();
    let mut errors: Vec<String> = Vec::new();
    for task in tasks {
        match task.await {
            Ok(totals) => {
                histogram
                    .add(&totals.histogram)
                    .expect("histograms share bounds");
                errors.extend(totals.errors);
            }
            Err(e) => errors.push(format!("task failed: {e}")),
        }
    }
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.abort();
        eprint!("\r\x1b[K");
    }
    broker.close().await;

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
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        let mut counts = std::collections::BTreeMap::new();
        for error in &errors {
            *counts.entry(error.as_str()).or_insert(0u64) += 1;
        }
        for (error, count) in counts {
            println!("errors: {count} × {error}");
        }
        ExitCode::from(1)
    }
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
    client: usize,
    claimed: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) -> Totals {
    let mut totals = Totals {
        histogram: new_histogram(),
        errors: Vec::new(),
    };
    // xorshift64 seeded per client: a spread of keys with no shared RNG.
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (client as u64 + 1).wrapping_mul(0x2545_f491);
    while claimed.fetch_add(1, Ordering::Relaxed) < args.ops {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = format!("bench-{}", state % args.keys as u64);
        let started = Instant::now();
        let result = match broker
            .acquire(&key, args.wait, args.lease, args.budget)
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
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                totals
                    .histogram
                    .saturating_record(micros.clamp(1, LATENCY_MAX_MICROS));
            }
            Err(e) => totals.errors.push(e.to_string()),
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    totals
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
