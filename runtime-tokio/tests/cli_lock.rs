//! `ticketing lock KEY -- CMD`: the built binary against the in-process
//! server.

mod common;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::loopback_server;
use ticketing_tokio::RunningServer;
use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};
use ticketing_tokio::config::lock_exit;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
const LEASE: Duration = Duration::from_secs(30);

/// Runs the built binary with `args`, with no client token taken from the
/// environment.
async fn run_ticketing(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .await
        .expect("cannot run ticketing")
}

/// Runs `ticketing lock KEY --addr ADDR [extra...] -- sh -c SCRIPT`.
async fn lock(server: &RunningServer, key: &str, extra: &[&str], script: &str) -> Output {
    lock_at(server.local_addr().to_string(), key, extra, script).await
}

async fn lock_at(addr: String, key: &str, extra: &[&str], script: &str) -> Output {
    let mut args = vec!["lock", key, "--addr", &addr];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    tokio::time::timeout(Duration::from_secs(30), run_ticketing(&args))
        .await
        .expect("ticketing lock hung")
}

fn scratch_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ticketing-cli-lock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_with_key_and_token_and_its_status_passes_through() {
    let server = loopback_server().await;
    let before_micros = server.stats().lock.next_token;

    let output = lock(
        &server,
        "orders/1",
        &[],
        r#"echo "$TICKETING_KEY $TICKETING_TOKEN"; exit 7"#,
    )
    .await;
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (key, token) = stdout.trim().split_once(' ').expect("two words");
    assert_eq!(key, "orders/1");
    let token: u64 = token.parse().expect("a numeric token");
    assert!(token >= before_micros, "{token} < {before_micros}");

    // Released after the command exited: a wait-0 acquire succeeds.
    assert_eq!(server.stats().lock.held_keys, 0);
    let broker = TicketBroker::connect_loopback([server.local_addr().to_string()]);
    let ticket = broker
        .acquire("orders/1", Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert!(ticket.token() > token);
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;

    let ok = lock(&server, "orders/1", &[], "true").await;
    assert_eq!(ok.status.code(), Some(0));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_exits_with_the_timeout_code_without_running_the_command() {
    let server = loopback_server().await;
    let broker = TicketBroker::connect_loopback([server.local_addr().to_string()]);
    let held = broker
        .acquire("k", Duration::from_secs(5), LEASE, Duration::ZERO)
        .await
        .unwrap();

    let marker = scratch_file("must-not-exist");
    let script = format!("touch '{}'", marker.display());
    let output = lock(&server, "k", &["--wait", "0"], &script).await;
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::TIMEOUT)),
        "{output:?}"
    );
    assert!(!marker.exists(), "the command ran without the lock");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_and_bad_usage_have_their_own_codes() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    // A port that was just free: nothing listens there once dropped.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let output = run_ticketing(&["lock", "k", "--addr", &closed, "--", "true"]).await;
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::UNAVAILABLE)),
        "{output:?}"
    );

    for bad in [
        vec![
            "lock", "k", "--addr", &addr, "--lease", "251s", "--", "true",
        ],
        vec!["lock", "k", "--addr", &addr, "--wait", "5h", "--", "true"],
        vec!["lock", "k", "--addr", &addr],
    ] {
        let output = run_ticketing(&bad).await;
        assert_eq!(
            output.status.code(),
            Some(i32::from(lock_exit::USAGE)),
            "{bad:?}: {output:?}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_one_key_never_overlap() {
    const RUNS: usize = 4;
    let server = loopback_server().await;
    let log = scratch_file("overlap.log");
    // The sleep is the critical section's work, so that an overlap would
    // have time to show.
    let script = format!(
        "echo start >> '{0}'; sleep 0.2; echo end >> '{0}'",
        log.display()
    );
    let addr = server.local_addr().to_string();
    let runs = (0..RUNS).map(|_| {
        let (addr, script) = (addr.clone(), script.clone());
        async move { lock_at(addr, "shared", &["--wait", "30s"], &script).await }
    });
    for output in futures_join_all(runs).await {
        assert_eq!(output.status.code(), Some(0), "{output:?}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let expected: Vec<&str> = ["start", "end"].repeat(RUNS);
    assert_eq!(lines, expected);
    server.shutdown().await;
}

/// Runs the futures concurrently, results in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

/// Whether process `pid` still exists (a zombie counts as gone: it runs
/// nothing).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// Reads the pids the script wrote to `file`, one a line.
fn pids(file: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_renewal_the_command_and_its_children_are_stopped_before_the_lease_lapses() {
    let server = loopback_server().await;
    let pid_file = scratch_file("stopped.pids");
    // The command starts a child of its own and outlives the lease.
    let script = format!(
        "sleep 30 & echo $! >> '{0}'; echo $$ >> '{0}'; wait",
        pid_file.display()
    );
    let started = std::time::Instant::now();
    let output = lock(
        &server,
        "job",
        &["--lease", "3s", "--kill-after", "1s"],
        &script,
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "stopped after {elapsed:?}"
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    let pids = pids(&pid_file);
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        assert!(
            !alive(pid),
            "process {pid} of the command's group still runs"
        );
    }
    // Released on the way out: the key is free at once.
    let broker = TicketBroker::connect_loopback([server.local_addr().to_string()]);
    let ticket = broker
        .acquire("job", Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();
    ticket.release().await.unwrap();
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_before_the_lease_ends() {
    let server = loopback_server().await;
    let started = std::time::Instant::now();
    let output = lock(
        &server,
        "stubborn",
        &["--lease", "3s", "--kill-after", "1s"],
        "trap '' TERM; while :; do sleep 0.05; done",
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    assert!(elapsed < Duration::from_secs(3), "killed after {elapsed:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_is_told_its_deadline_and_a_short_one_runs_to_its_end() {
    let server = loopback_server().await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let output = lock(
        &server,
        "quick",
        &["--lease", "10s"],
        r#"echo "$TICKETING_DEADLINE_UNIX_MS"; exit 3"#,
    )
    .await;
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let deadline: u128 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .expect("a number of ms");
    // The lease from the acquire's send, which came between the two
    // readings (the client's deadline may be a little earlier, never later).
    assert!(deadline <= after + 10_000, "{deadline} vs {after}");
    assert!(
        deadline + 2_000 >= before + 10_000,
        "{deadline} vs {before}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_kill_the_command_runs_past_its_lease_with_a_warning() {
    let server = loopback_server().await;
    let output = lock(
        &server,
        "slow",
        &["--lease", "1s", "--budget", "0s", "--no-kill"],
        "sleep 1.5",
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("lease has lapsed"), "{stderr}");
    server.shutdown().await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_ends_when_the_cli_is_killed() {
    let server = loopback_server().await;
    let pid_file = scratch_file("orphan.pid");
    let addr = server.local_addr().to_string();
    let script = format!("echo $$ > '{}'; exec sleep 30", pid_file.display());
    let mut cli = tokio::process::Command::new(BIN)
        .args(["lock", "orphan", "--addr", &addr, "--", "sh", "-c", &script])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let command = loop {
        if let Some(&pid) = pids(&pid_file).first() {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cli.start_kill().unwrap();
    cli.wait().await.unwrap();
    let killed = std::time::Instant::now();
    while alive(command) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the command outlived the CLI"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
}

/// Polls until `file` holds a line, or fails after 10 s.
async fn first_line(file: &std::path::Path) -> String {
    let started = std::time::Instant::now();
    loop {
        if let Some(line) = std::fs::read_to_string(file)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned))
        {
            return line;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing was written to {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_renew_the_command_holds_past_several_leases_while_a_rival_is_refused() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    // The command outlives two leases of 2 s, then a rival asks for the key
    // without waiting, and the deadline file has moved with the renewals.
    let script = format!(
        r#"first=$(cat "$TICKETING_DEADLINE_FILE"); sleep 4.5
'{BIN}' lock renewed --addr {addr} --wait 0 -- true; echo "rival=$?"
echo "moved=$(( $(cat "$TICKETING_DEADLINE_FILE") - first ))""#
    );
    let started = std::time::Instant::now();
    let output = lock(&server, "renewed", &["--lease", "2s", "--renew"], &script).await;
    assert!(started.elapsed() > Duration::from_secs(4));
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains(&format!("rival={}", lock_exit::TIMEOUT)),
        "{stdout}"
    );
    let moved: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("moved="))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(moved >= 3_000, "the deadline moved only {moved} ms");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_a_renewed_command_before_the_cap() {
    let server = loopback_server().await;
    let started = std::time::Instant::now();
    let output = lock(
        &server,
        "capped",
        &[
            "--lease",
            "2s",
            "--renew",
            "--max-hold",
            "3s",
            "--kill-after",
            "1s",
        ],
        "exec sleep 30",
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    // Renewed past the first lease's stop point (0.75 s in), stopped
    // before the cap.
    assert!(elapsed > Duration::from_millis(1_500), "after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "after {elapsed:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_caps_a_shared_hold_as_it_caps_an_exclusive_one() {
    let server = loopback_server().await;
    let started = std::time::Instant::now();
    let output = lock(
        &server,
        "capped-shared",
        &[
            "--shared",
            "--lease",
            "2s",
            "--renew",
            "--max-hold",
            "3s",
            "--kill-after",
            "1s",
        ],
        // Exits 9 unless it holds the key shared.
        r#"[ "$TICKETING_MODE" = shared ] || exit 9; exec sleep 30"#,
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    // Renewed past the first lease's stop point, stopped before the cap.
    assert!(elapsed > Duration::from_millis(1_500), "after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "after {elapsed:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_shows_no_life_loses_its_renewal_and_is_stopped() {
    let server = loopback_server().await;
    let started = std::time::Instant::now();
    let output = lock(
        &server,
        "hung",
        &[
            "--lease",
            "2s",
            "--renew",
            "--progress-timeout",
            "1s",
            "--kill-after",
            "1s",
        ],
        "exec sleep 30",
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("showed no life"), "{stderr}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_shows_life_keeps_its_renewal() {
    let server = loopback_server().await;
    // Life by the progress file for one half, by the notify socket for
    // the other.
    let script = r#"i=0; while [ $i -lt 8 ]; do touch "$TICKETING_PROGRESS_FILE"; sleep 0.25; i=$((i+1)); done
i=0; while [ $i -lt 8 ]; do python3 -c 'import os,socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"1", os.environ["TICKETING_NOTIFY"])'; sleep 0.25; i=$((i+1)); done"#;
    let output = lock(
        &server,
        "alive",
        &["--lease", "2s", "--renew", "--progress-timeout", "1s"],
        script,
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_through_the_admin_api_stops_the_command_within_a_second() {
    let dir = scratch_file("admin");
    std::fs::create_dir_all(&dir).unwrap();
    let admin_token = "admin-token-for-the-force-release-test";
    let token_file = dir.join("admin-token");
    std::fs::write(&token_file, admin_token).unwrap();
    let mut settings = common::loopback_settings();
    settings.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.admin_tokens = ticketing_core::admin::AdminTokens::new([admin_token]).unwrap();
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let admin = server.admin_addr().unwrap().to_string();
    let started_file = dir.join("started");
    let script = format!(
        "echo $TICKETING_TOKEN > '{}'; exec sleep 60",
        started_file.display()
    );
    let cli = tokio::process::Command::new(BIN)
        .args(["lock", "revoked", "--addr", &addr, "--lease", "60s"])
        .args(["--", "sh", "-c", &script])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let token = first_line(&started_file).await;

    let released = run_ticketing(&[
        "locks",
        "release",
        "revoked",
        "--token",
        &token,
        "--admin",
        &admin,
        "--admin-token-file",
        token_file.to_str().unwrap(),
    ])
    .await;
    assert!(released.status.success(), "{released:?}");
    let revoked_at = std::time::Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(10), cli.wait_with_output())
        .await
        .expect("the command was not stopped")
        .unwrap();
    let stopped_after = revoked_at.elapsed();
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::LOST)),
        "{output:?}"
    );
    assert!(
        stopped_after < Duration::from_millis(1_500),
        "stopped {stopped_after:?} after the force-release"
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("force-released"), "{stderr}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_shown_on_a_terminal_only_and_erased_when_it_ends() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let broker = TicketBroker::connect_loopback([addr.clone()]);
    let held = broker
        .acquire("busy", Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();

    // Not a terminal: only the outcome.
    let output = lock(&server, "busy", &["--wait", "2s"], "true").await;
    assert_eq!(output.status.code(), Some(i32::from(lock_exit::TIMEOUT)));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(!stderr.contains("waiting for busy:"), "{stderr}");

    // A terminal (script(1) gives the command a pty): the elapsed wait,
    // then the line erased before the outcome.
    let command = format!("'{BIN}' lock busy --addr {addr} --wait 3s -- true");
    let output = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("waiting for busy: 1s"), "{shown:?}");
    assert!(shown.contains("\r\x1b[2K"), "{shown:?}");
    held.release().await.unwrap();
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_that_can_never_be_served_are_usage_errors_found_before_connecting() {
    // Nothing listens there: a usage error is found without it.
    let nowhere = "127.0.0.1:9".to_owned();
    for (extra, said) in [
        (&["--lease", "2s", "--budget", "3s"][..], "--budget"),
        (&["--lease", "300s"][..], "250"),
        (&["--wait", "300s"][..], "255"),
    ] {
        let output = lock_at(nowhere.clone(), "k", extra, "true").await;
        assert_eq!(
            output.status.code(),
            Some(i32::from(lock_exit::USAGE)),
            "{output:?}"
        );
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(said), "{stderr}");
    }
    // The command without its separator gets a hint.
    let output = run_ticketing(&["lock", "k", "sh", "-c", "true"]).await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("goes after `--`"), "{stderr}");
    // Fractions are durations.
    let output = lock_at(
        nowhere,
        "k",
        &["--lease", "1.5s", "--budget", "2.5s"],
        "true",
    )
    .await;
    assert_eq!(output.status.code(), Some(i32::from(lock_exit::USAGE)));
}
