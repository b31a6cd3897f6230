//! `ticketing bench`: the built binary against the in-process server, which
//! listens in this test's own process (so that is the server pid the bench
//! finds in /proc).

mod common;

use std::process::Output;
use std::time::Duration;

use common::loopback_server;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

async fn bench(args: &[&str]) -> Output {
    let run = tokio::process::Command::new(BIN)
        .arg("bench")
        .args(args)
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("ticketing bench hung")
        .expect("cannot run ticketing")
}

/// The number in `line` just before `unit`, e.g. `µs per acquire+release`.
fn figure_before(line: &str, unit: &str) -> f64 {
    let (head, _) = line
        .split_once(unit)
        .unwrap_or_else(|| panic!("{unit:?} not in {line:?}"));
    let number = head.split_whitespace().last().expect("a figure");
    number
        .parse()
        .unwrap_or_else(|_| panic!("{number:?} in {line:?}"))
}

fn line_with<'a>(stdout: &'a str, start: &str) -> &'a str {
    stdout
        .lines()
        .find(|line| line.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prints_rate_latency_client_and_server_cpu_and_the_ceiling() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let output = bench(&[
        "--addr",
        &addr,
        "--clients",
        "4",
        "--keys",
        "2",
        "--ops",
        "300",
        "--connections",
        "1",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{:?}", output.stderr);
    let rate = line_with(&stdout, "300 acquire+release pairs in ");
    assert!(figure_before(rate, "ops/s") > 0.0, "{rate}");
    assert!(
        rate.ends_with("(4 clients, 2 keys, 1 connection)"),
        "{rate}"
    );
    assert!(line_with(&stdout, "latency (acquire+release): p50 ").contains(" p99 "));
    let client = line_with(&stdout, "client CPU: ");
    assert!(client.ends_with("(current-thread runtime)"), "{client}");
    assert!(figure_before(client, "µs per acquire+release") >= 0.0);
    // The total splits into user and system time, and the sleeps are counted.
    let total = figure_before(client, "µs per acquire+release");
    let user = figure_before(client.split("user ").nth(1).expect("user"), ",");
    let system = figure_before(client.split("system ").nth(1).expect("system"), ";");
    assert!((user + system - total).abs() < 0.02, "{client}");
    assert!(client.contains(" sleeps per acquire+release "), "{client}");
    // The listener of a loopback address is found in /proc: this process.
    let server_cpu = line_with(&stdout, "server CPU: ");
    assert!(
        server_cpu.ends_with(&format!("(pid {})", std::process::id())),
        "{server_cpu}"
    );
    let ceiling = line_with(&stdout, "client+server CPU ceiling on ");
    assert!(ceiling.contains("ops/s; measured "), "{ceiling}");
    let in_turn = line_with(&stdout, "client and server taking turns: ");
    assert!(in_turn.contains("ops/s; measured "), "{in_turn}");
    server.shutdown().await;
}

/// Grants the bench makes: its pairs, and one warm-up pair per connection.
async fn grants_of(server: &ticketing_tokio::RunningServer, args: &[&str]) -> (u64, String) {
    let before = server.stats().lock.next_token;
    let output = bench(args).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{:?}", output.stderr);
    (server.stats().lock.next_token - before, stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_spreads_its_tasks_over_the_connections_asked_for() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let args = [
        "--addr",
        &addr,
        "--clients",
        "5",
        "--keys",
        "2",
        "--ops",
        "200",
    ];
    let (grants, stdout) = grants_of(&server, &[&args[..], &["--connections", "3"]].concat()).await;
    // Each connection's broker made its own warm-up pair.
    assert_eq!(grants, 200 + 3, "{stdout}");
    let rate = line_with(&stdout, "200 acquire+release pairs in ");
    assert!(
        rate.ends_with("(5 clients, 2 keys, 3 connections)"),
        "{rate}"
    );
    // With several connections client and server need not take turns, so
    // that bound is not printed; the CPU ceiling still is.
    assert!(!stdout.contains("taking turns"), "{stdout}");
    line_with(&stdout, "client+server CPU ceiling on ");
    // Never more connections than tasks.
    let (grants, stdout) = grants_of(&server, &[&args[..], &["--connections", "9"]].concat()).await;
    assert_eq!(grants, 200 + 5, "{stdout}");
    // The default against a single server: one per core.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let (grants, stdout) = grants_of(&server, &args).await;
    assert_eq!(grants, 200 + cores.min(5) as u64, "{stdout}");
    // Zero connections is a command-line error.
    let output = bench(&["--addr", &addr, "--connections", "0"]).await;
    assert_eq!(output.status.code(), Some(2));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_on_a_multi_thread_runtime_and_takes_the_server_pid_given() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let pid = std::process::id().to_string();
    let output = bench(&[
        "--addr",
        &addr,
        "--clients",
        "3",
        "--ops",
        "100",
        "--threads",
        "2",
        "--server-pid",
        &pid,
    ])
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        line_with(&stdout, "client CPU: ").ends_with("(multi-thread runtime, 2 workers)"),
        "{stdout}"
    );
    assert!(line_with(&stdout, "server CPU: ").ends_with(&format!("(pid {pid})")));
    // A bad thread count is a command-line error.
    let output = bench(&["--addr", &addr, "--threads", "0"]).await;
    assert_eq!(output.status.code(), Some(2));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_takes_permits_of_semaphores_with_semaphore() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let args = [
        "--addr",
        &addr,
        "--clients",
        "4",
        "--keys",
        "2",
        "--ops",
        "300",
        "--connections",
        "1",
        "--semaphore",
        "2",
    ];
    let (grants, stdout) = grants_of(&server, &args).await;
    // Every pair was a permit grant (one token each) beside the warm-up.
    assert_eq!(grants, 301, "{stdout}");
    let permits = server
        .metrics()
        .replies
        .of(ticketing_core::metrics::ReplyKind::Permits);
    assert_eq!(permits, 300, "{stdout}");
    let rate = line_with(&stdout, "300 permit acquire+release pairs in ");
    assert!(figure_before(rate, "permits/s") > 0.0, "{rate}");
    assert!(rate.contains("2 semaphores of 2 slots"), "{rate}");
    assert!(!stdout.contains("error"), "{stdout}");
    // Permit grants are of slot keys; none is left held.
    assert_eq!(server.stats().lock.held_keys, 0);
    assert_eq!(server.stats().permit_waiters, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_takes_every_key_shared_with_shared_so_nobody_waits() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let args = [
        "--addr",
        &addr,
        "--clients",
        "8",
        "--keys",
        "1",
        "--ops",
        "400",
        "--connections",
        "1",
        "--shared",
    ];
    let (grants, stdout) = grants_of(&server, &args).await;
    // Every pair was a grant of its own token, beside the warm-up.
    assert_eq!(grants, 401, "{stdout}");
    // Eight tasks on one key: taken exclusive, most would queue; taken
    // shared, every one is granted on arrival beside the others.
    let lock = server.metrics().lock;
    assert_eq!(lock.grants_after_wait, 0, "{stdout}");
    assert_eq!(lock.grants_immediate, 401, "{stdout}");
    let rate = line_with(&stdout, "400 shared acquire+release pairs in ");
    assert!(figure_before(rate, "shared grants/s") > 0.0, "{rate}");
    assert!(!stdout.contains("error"), "{stdout}");
    assert_eq!(server.stats().lock.held_keys, 0);
    server.shutdown().await;
}
