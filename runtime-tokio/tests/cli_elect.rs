//! `ticketing elect NAME -- CMD` and `ticketing elect NAME --observe` with
//! real processes against the in-process server: the second candidate
//! leads, under a larger term, once the first leader's process is killed
//! (its grant outlives its connection until the lease ends), and the
//! observer names each leader by its label, the dead one included, in
//! that order.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{loopback_server, ours_loopback};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
const BOUND: Duration = Duration::from_secs(60);

/// Spawns `ticketing ARGS` with its stdout read line by line into a channel.
fn spawn_lines(args: &[&str]) -> (tokio::process::Child, mpsc::Receiver<String>) {
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("TICKETING_CLIENT_TOKEN")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ticketing runs");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).await.is_err() {
                break;
            }
        }
    });
    (child, rx)
}

async fn next_line(lines: &mut mpsc::Receiver<String>, what: &str) -> String {
    tokio::time::timeout(BOUND, lines.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} in time"))
        .unwrap_or_else(|| panic!("{what}: the output ended"))
}

/// The term a candidate's command printed (`term T token T`).
fn term_of(line: &str) -> u64 {
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words.len(), 4, "{line}");
    assert_eq!((words[0], words[2]), ("term", "token"), "{line}");
    assert_eq!(words[1], words[3], "TICKETING_TERM is the token: {line}");
    words[1].parse().expect("a number")
}

/// Reads observer lines into `seen` until one starts with `prefix`.
async fn observe_until(lines: &mut mpsc::Receiver<String>, seen: &mut Vec<String>, prefix: &str) {
    loop {
        let line = next_line(lines, &format!("the observer printing {prefix:?}")).await;
        seen.push(line.clone());
        if line.starts_with(prefix) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_candidate_leads_with_a_larger_term_when_the_first_is_killed() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let (mut observer, mut observed) = spawn_lines(&[
        "elect",
        "election",
        "--observe",
        "--interval",
        "100ms",
        "--addr",
        &addr,
    ]);
    let mut seen = Vec::new();
    observe_until(&mut observed, &mut seen, "no leader").await;

    // The command is the process itself (exec), so it ends with its
    // candidate's death signal.
    let script = "echo term $TICKETING_TERM token $TICKETING_TOKEN; exec sleep 600";
    let candidate = |label: &'static str| {
        spawn_lines(&[
            "elect", "election", "--label", label, "--lease", "3s", "--addr", &addr, "--", "sh",
            "-c", script,
        ])
    };
    let (mut first, mut first_out) = candidate("cand-a");
    let term_a = term_of(&next_line(&mut first_out, "the first leader's command").await);
    observe_until(&mut observed, &mut seen, "leader cand-a").await;
    let (mut second, mut second_out) = candidate("cand-b");
    common::wait_for_waiters(&server, 1).await;

    // SIGKILL: no resign. Its grant stays until its lease ends, then the
    // waiting candidate is granted it.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let term_b = term_of(&next_line(&mut second_out, "the second leader's command").await);
    assert!(term_b > term_a, "{term_b} after {term_a}");
    observe_until(
        &mut observed,
        &mut seen,
        &format!("leader cand-b term {term_b}"),
    )
    .await;

    // Every line names a leader by its label and term, or says there is
    // none: the first leader (also once its connection is gone) before
    // the second, each under its one term.
    let a_line = format!("leader cand-a term {term_a}");
    let b_line = format!("leader cand-b term {term_b}");
    let mut b_seen = false;
    for line in &seen {
        if line == "no leader" {
            continue;
        }
        if line.starts_with(&a_line) {
            assert!(!b_seen, "the first leader after the second: {seen:?}");
            let rest = &line[a_line.len()..];
            assert!(
                rest.is_empty() || rest.starts_with(" (its connection is gone;"),
                "{line}"
            );
        } else if line == &b_line {
            b_seen = true;
        } else {
            panic!("a line naming no known leader: {line:?} in {seen:?}");
        }
    }
    assert!(seen.iter().any(|line| line == &a_line), "{seen:?}");

    // Read-only and in step with the client API.
    let broker = ours_loopback(&server).await;
    let leader = broker.observe("election").await.unwrap().expect("a leader");
    assert_eq!((leader.label.as_str(), leader.term), ("cand-b", term_b));
    assert!(leader.connected);
    broker.close().await;

    second.start_kill().unwrap();
    second.wait().await.unwrap();
    observer.start_kill().unwrap();
    observer.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_leader_hands_over_at_once_and_observers_follow() {
    let server = loopback_server().await;
    let a = ours_loopback(&server).await;
    let b = ours_loopback(&server).await;
    let lease = Duration::from_secs(30);
    let first = a.campaign("e", lease).await.unwrap();
    let campaigning = tokio::spawn(async move {
        let ticket = b.campaign("e", lease).await;
        (b, ticket)
    });
    common::wait_for_waiters(&server, 1).await;
    let term_a = first.token();
    assert_eq!(
        a.observe("e").await.unwrap().map(|leader| leader.term),
        Some(term_a)
    );
    // A resign is a release: the next candidate leads at once (well within
    // the lease the first still had).
    first.release().await.unwrap();
    let (b, second) = tokio::time::timeout(BOUND, campaigning)
        .await
        .expect("the second leads in time")
        .unwrap();
    let second = second.unwrap();
    assert!(second.token() > term_a);
    let leader = a.observe("e").await.unwrap().expect("a leader");
    assert_eq!(leader.term, second.token());
    second.release().await.unwrap();
    assert_eq!(a.observe("e").await.unwrap(), None);
    a.close().await;
    b.close().await;
}
