//! In-process cost of Ticketing's semantics, side by side with
//! `async_lock::Mutex` in the same run:
//!
//! - uncontended acquire + release latency (p50, p99) on the in-process
//!   path, against the goal of a p50 of at most 1 µs (docs/performance.md),
//!   and the bench thread's CPU time per operation
//!   (`/proc/thread-self/schedstat`), which a busy machine disturbs less;
//! - contended handoff throughput: 64 tasks taking turns on one key, each
//!   holding it across a yield so that the others are queued and every turn
//!   is a handoff.
//!
//! Background tasks run on smol's global executor (`SMOL_THREADS`, default
//! 1); the uncontended loop runs on the bench's own thread.
//!
//! `cargo bench -p ticketing-smol --bench inprocess`; `BENCH_QUICK=1` runs a
//! short version (what `cargo test --benches` would want).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ticketing_smol::{EmbeddedServer, ReleaseOutcome, TicketBroker};

const WAIT: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(30);
const CONTENDERS: usize = 64;
/// The embedded goal (docs/performance.md): the uncontended in-process
/// acquire + release, p50.
const GOAL_P50_MICROS: f64 = 1.0;

struct Sizes {
    warmup: usize,
    samples: usize,
    turns_per_task: usize,
}

fn sizes() -> Sizes {
    if std::env::var_os("BENCH_QUICK").is_some() {
        Sizes {
            warmup: 200,
            samples: 2_000,
            turns_per_task: 20,
        }
    } else {
        Sizes {
            warmup: 20_000,
            samples: 200_000,
            turns_per_task: 2_000,
        }
    }
}

/// p50 and p99 of `samples`, in microseconds.
fn percentiles_micros(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[index].as_nanos() as f64 / 1_000.0
    };
    (at(0.50), at(0.99))
}

/// CPU time this thread has run, from the scheduler's own count; `None`
/// where `/proc` does not have it.
fn thread_cpu() -> Option<Duration> {
    // The count is brought up to date at scheduler events; a yield is one.
    std::thread::yield_now();
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Runs `body` and returns its samples with the CPU time per sample in
/// microseconds (warm-up included in neither count: it is subtracted out
/// by counting all rounds).
async fn with_cpu_per_op(
    rounds: usize,
    body: impl AsyncFnOnce() -> Vec<Duration>,
) -> (Vec<Duration>, Option<f64>) {
    let before = thread_cpu();
    let samples = body().await;
    let cpu = thread_cpu()
        .zip(before)
        .map(|(after, before)| (after - before).as_nanos() as f64 / 1_000.0 / rounds as f64);
    (samples, cpu)
}

async fn ticketing_uncontended(broker: &TicketBroker, sizes: &Sizes) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(sizes.samples);
    for round in 0..sizes.warmup + sizes.samples {
        let started = Instant::now();
        let ticket = broker
            .acquire("solo", WAIT, LEASE, Duration::ZERO)
            .await
            .unwrap();
        let released = ticket.release().await.unwrap();
        let elapsed = started.elapsed();
        debug_assert_eq!(released, ReleaseOutcome::Released);
        if round >= sizes.warmup {
            samples.push(elapsed);
        }
    }
    samples
}

async fn mutex_uncontended(mutex: &async_lock::Mutex<u64>, sizes: &Sizes) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(sizes.samples);
    for round in 0..sizes.warmup + sizes.samples {
        let started = Instant::now();
        let mut guard = mutex.lock().await;
        *guard += 1;
        drop(guard);
        let elapsed = started.elapsed();
        if round >= sizes.warmup {
            samples.push(elapsed);
        }
    }
    samples
}

/// Handoffs per second with `CONTENDERS` tasks taking `turns` turns each.
async fn ticketing_contended(broker: &TicketBroker, turns: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let broker = broker.clone();
            smol::spawn(async move {
                let mut last_token = 0;
                for _ in 0..turns {
                    let ticket = broker
                        .acquire("hot", WAIT, LEASE, Duration::ZERO)
                        .await
                        .unwrap();
                    assert!(ticket.token() > last_token);
                    last_token = ticket.token();
                    // Hold across a yield so the others queue: every turn
                    // is a handoff, not a re-acquire of a free lock.
                    smol::future::yield_now().await;
                    ticket.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
    (CONTENDERS * turns) as f64 / started.elapsed().as_secs_f64()
}

async fn mutex_contended(mutex: &Arc<async_lock::Mutex<u64>>, turns: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let mutex = Arc::clone(mutex);
            smol::spawn(async move {
                for _ in 0..turns {
                    let mut guard = mutex.lock().await;
                    *guard += 1;
                    smol::future::yield_now().await;
                    drop(guard);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
    (CONTENDERS * turns) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let sizes = sizes();
    let server = EmbeddedServer::builder().start().expect("embedded server");
    let broker = server.broker();
    let mutex = Arc::new(async_lock::Mutex::new(0u64));

    if std::env::var_os("BENCH_PROFILE").is_some() {
        // Only the uncontended in-process loop, for `perf` or callgrind.
        smol::block_on(async {
            ticketing_uncontended(&broker, &sizes).await;
            broker.close().await;
        });
        smol::block_on(server.shutdown());
        return;
    }
    smol::block_on(async {
        let rounds = sizes.warmup + sizes.samples;
        let (mut ticketing, t_cpu) = with_cpu_per_op(rounds, async || {
            ticketing_uncontended(&broker, &sizes).await
        })
        .await;
        let (mut mutex_samples, m_cpu) =
            with_cpu_per_op(rounds, async || mutex_uncontended(&mutex, &sizes).await).await;
        let (t50, t99) = percentiles_micros(&mut ticketing);
        let (m50, m99) = percentiles_micros(&mut mutex_samples);
        let cpu = |cpu: Option<f64>| cpu.map_or("n/a".to_owned(), |cpu| format!("{cpu:6.2} µs"));
        println!("uncontended acquire+release, {} samples:", sizes.samples);
        println!(
            "  ticketing in-process  p50 {t50:8.2} µs   p99 {t99:8.2} µs   cpu/op {}",
            cpu(t_cpu)
        );
        println!(
            "  async_lock::Mutex     p50 {m50:8.2} µs   p99 {m99:8.2} µs   cpu/op {}",
            cpu(m_cpu)
        );
        println!(
            "  ratio                 p50 {:8.1}x    p99 {:8.1}x",
            t50 / m50,
            t99 / m99
        );
        println!(
            "  goal p50 <= {GOAL_P50_MICROS:.2} µs      p50 {t50:8.2} µs = {:.2}x the goal ({}); \
             the goal is {:.0}x the mutex floor",
            t50 / GOAL_P50_MICROS,
            if t50 <= GOAL_P50_MICROS {
                "met"
            } else {
                "not met"
            },
            GOAL_P50_MICROS / m50,
        );

        let turns = sizes.turns_per_task;
        let ticketing = ticketing_contended(&broker, turns).await;
        let mutex_rate = mutex_contended(&mutex, turns).await;
        println!("contended handoff, {CONTENDERS} tasks x {turns} turns on one key:");
        println!("  ticketing in-process  {ticketing:12.0} handoffs/s");
        println!("  async_lock::Mutex     {mutex_rate:12.0} handoffs/s");
        println!("  ratio                 {:12.1}x", mutex_rate / ticketing);

        broker.close().await;
    });
    smol::block_on(server.shutdown());
}
