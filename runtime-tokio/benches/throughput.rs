//! Acquire+release throughput of the in-process server driven by the
//! published `ticketing` client over loopback TCP.
//!
//! `cargo bench -p ticketing-tokio --bench throughput`. Settings (env):
//! `TICKETING_BENCH_TASKS` concurrent client tasks (default 512),
//! `TICKETING_BENCH_SECS` measured seconds (default 5),
//! `TICKETING_BENCH_SERVER_THREADS` / `TICKETING_BENCH_CLIENT_THREADS`
//! worker threads of the two runtimes (default 1 each). Each task loops over
//! acquire + release of its own key, so the server is measured, not queueing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ticketing::{ReleaseOutcome, TicketBroker};
use ticketing_tokio::{ServeSettings, spawn_server};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().expect(name))
        .unwrap_or(default)
}

fn runtime(name: &str, threads: u64) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads as usize)
        .thread_name(name)
        .enable_all()
        .build()
        .unwrap()
}

fn main() {
    let tasks = env_or("TICKETING_BENCH_TASKS", 512);
    let secs = env_or("TICKETING_BENCH_SECS", 5);
    let server_rt = runtime("bench-server", env_or("TICKETING_BENCH_SERVER_THREADS", 1));
    let client_rt = runtime("bench-client", env_or("TICKETING_BENCH_CLIENT_THREADS", 1));

    let server = server_rt
        .block_on(spawn_server(ServeSettings::new(
            "127.0.0.1:0".parse().unwrap(),
        )))
        .unwrap();
    let addr = server.local_addr().to_string();

    let (ops, hist, elapsed) = client_rt.block_on(async move {
        let broker = TicketBroker::connect_loopback([addr]);
        assert!(broker.wait_ready(Duration::from_secs(5)).await);
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for task in 0..tasks {
            let broker = broker.clone();
            let stop = Arc::clone(&stop);
            let done = Arc::clone(&done);
            workers.push(tokio::spawn(async move {
                let key = format!("bench-{task}");
                let mut hist = Histogram::<u64>::new(3).unwrap();
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ticket = broker
                        .acquire(
                            &key,
                            Duration::from_secs(5),
                            Duration::from_secs(30),
                            Duration::from_secs(1),
                        )
                        .await
                        .expect("acquire");
                    let released = ticket.release().await.expect("release");
                    assert_eq!(released, ReleaseOutcome::Released);
                    let _ = hist.record(started.elapsed().as_micros() as u64);
                    ops += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                (ops, hist)
            }));
        }
        // Warm up, then count only the measured window.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        let before = done.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let measured = done.load(Ordering::Relaxed) - before;
        let elapsed = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let mut all = Histogram::<u64>::new(3).unwrap();
        for w in workers {
            let (_, hist) = w.await.unwrap();
            all.add(hist).unwrap();
        }
        broker.close().await;
        (measured, all, elapsed)
    });
    let rate = ops as f64 / elapsed.as_secs_f64();
    println!(
        "tasks {tasks}: {ops} acquire+release in {:.2}s = {rate:.0} ops/s; latency µs p50 {} p99 {} max {}",
        elapsed.as_secs_f64(),
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.max()
    );
    server_rt.block_on(server.shutdown());
}
