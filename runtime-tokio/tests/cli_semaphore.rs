//! `ticketing lock NAME --semaphore N -- CMD` and the clients' permits, with
//! real processes against the in-process server and against a three-node
//! cluster of `ticketing serve` processes: never more than N
//! commands hold a permit at once, each sees its own slot, and a waiter
//! runs when a holder's command exits.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cluster::{CLIENT_TOKEN, Cluster, IDENTITY, ours as cluster_ours};
use common::{loopback_server, ours_loopback};
use ticketing_tokio::TicketError;
use ticketing_tokio::client::ReleaseOutcome;
use ticketing_tokio::config::lock_exit;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
const LEASE: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(60);

fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ticketing-semaphore-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
}

/// Reads the next line the commands wrote to the `started` pipe.
async fn next_started(lines: &mut tokio::sync::mpsc::Receiver<String>) -> String {
    tokio::time::timeout(BOUND, lines.recv())
        .await
        .expect("a command started in time")
        .expect("the pipe reader is alive")
}

/// Lets the command holding `slot` finish.
async fn let_go(dir: &Path, slot: &str) {
    let go = dir.join(format!("go-{slot}"));
    tokio::task::spawn_blocking(move || {
        // Opening for writing waits for the command's read.
        let mut pipe = std::fs::OpenOptions::new().write(true).open(go).unwrap();
        pipe.write_all(b"go\n").unwrap();
    })
    .await
    .unwrap();
}

/// Runs three `ticketing lock jobs --semaphore 2` commands against the
/// server(s) `target` names (addresses and credentials): two run at once,
/// each on its own slot, the third only once the holder of slot 0 exits,
/// on that slot under a higher token, and none sees more than two marks
/// held. Every command ends with status 0.
async fn three_commands_on_two_permits(target: &[String], scratch: &str) {
    let dir = scratch_dir(scratch);
    let started = dir.join("started");
    mkfifo(&started);
    for slot in ["0", "1"] {
        mkfifo(&dir.join(format!("go-{slot}")));
    }
    // The test's end of `started` is opened for reading and writing, so it
    // never sees the end of the file between two commands' lines.
    let (tx, mut lines) = tokio::sync::mpsc::channel(8);
    let reader_path = started.clone();
    std::thread::spawn(move || {
        let pipe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(reader_path)
            .unwrap();
        for line in BufReader::new(pipe).lines() {
            if tx.blocking_send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    // Each command marks its slot as held (the mark must be new: one
    // holder per slot), counts the marks, says so, and holds until let go.
    let script = r#"
        mkdir "$DIR/held-$TICKETING_SLOTS" || exit 9
        count=$(ls -d "$DIR"/held-* | wc -l)
        echo "$TICKETING_SLOTS $count $TICKETING_TOKEN" > "$DIR/started"
        read go < "$DIR/go-$TICKETING_SLOTS"
        rmdir "$DIR/held-$TICKETING_SLOTS"
    "#;
    let spawn = || {
        tokio::process::Command::new(BIN)
            .args(["lock", "jobs", "--semaphore", "2", "--wait", "50s"])
            .args(target)
            .args(["--", "sh", "-c", script])
            .env("DIR", &dir)
            .env_remove("TICKETING_CLIENT_TOKEN")
            .kill_on_drop(true)
            .spawn()
            .expect("ticketing lock runs")
    };
    let mut commands = vec![spawn(), spawn(), spawn()];
    let first = next_started(&mut lines).await;
    let second = next_started(&mut lines).await;
    let mut slots: Vec<&str> = [&first, &second]
        .iter()
        .map(|line| line.split(' ').next().unwrap())
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, ["0", "1"], "{first} / {second}");
    // The third waits in the semaphore's queue: its command has not run.
    // Letting the holder of slot 0 go hands that slot to it.
    let_go(&dir, "0").await;
    let third = next_started(&mut lines).await;
    let fields: Vec<&str> = third.split(' ').collect();
    assert_eq!(fields[0], "0", "the freed slot: {third}");
    let tokens: Vec<u64> = [&first, &second]
        .iter()
        .map(|line| line.split(' ').nth(2).unwrap().parse().unwrap())
        .collect();
    let third_token: u64 = fields[2].parse().unwrap();
    assert!(tokens.iter().all(|&token| third_token > token));
    let_go(&dir, "0").await;
    let_go(&dir, "1").await;
    for line in [&first, &second, &third] {
        let count: usize = line.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(count <= 2, "{count} commands held a permit at once: {line}");
    }
    for command in &mut commands {
        let status = tokio::time::timeout(BOUND, command.wait())
            .await
            .expect("ticketing lock ended")
            .unwrap();
        assert_eq!(status.code(), Some(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_commands_on_two_permits_never_run_three_at_once() {
    let server = loopback_server().await;
    let target = ["--addr".to_owned(), server.local_addr().to_string()];
    three_commands_on_two_permits(&target, "three").await;
    // Every permit was released when its command ended.
    assert_eq!(server.stats().lock.held_keys, 0);
    server.shutdown().await;
}

/// The same against a three-node cluster: the leader queues the third
/// command's `Q` and hands it the slot freed by a committed release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_commands_on_two_permits_of_a_cluster_never_run_three_at_once() {
    let cluster = Cluster::start(3);
    cluster.leader().await;
    let mut target: Vec<String> = ["--token", CLIENT_TOKEN, "--cluster-identity", IDENTITY]
        .map(str::to_owned)
        .to_vec();
    for addr in cluster.addrs() {
        target.extend(["--addr".to_owned(), addr]);
    }
    three_commands_on_two_permits(&target, "cluster").await;
    // Every permit was released when its command ended: both slots are
    // granted again at once.
    let broker = cluster_ours(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let both = broker
        .acquire_permits("jobs", 2, 2, Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(both.slots(), [0, 1]);
    assert_eq!(both.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_takes_the_lowest_slots_and_a_mismatched_capacity_is_named() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;
    let two = broker
        .acquire_permits("pool", 2, 3, Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(two.slots(), [0, 1]);
    assert_eq!(two.free_at_grant(), Some(1));
    assert_eq!(two.keys().collect::<Vec<_>>(), ["pool[0000]", "pool[0001]"]);
    let mismatch = broker
        .acquire_permits("pool", 1, 5, Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(
        mismatch,
        TicketError::CapacityMismatch {
            asked: 5,
            capacity: 3
        }
    );
    // Too many for what is left: a wait of 0 is answered at once.
    let busy = broker
        .acquire_permits("pool", 2, 3, Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(busy, TicketError::Timeout);
    // Renewed and released like any ticket.
    two.extend(LEASE).await.unwrap();
    assert_eq!(two.release().await.unwrap(), ReleaseOutcome::Released);
    let three = broker
        .acquire_permits("pool", 3, 3, Duration::ZERO, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(three.slots(), [0, 1, 2]);
    assert_eq!(three.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_semaphore_usage_is_a_usage_error_and_runs_nothing() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    for extra in [
        &["--semaphore", "2", "--permits", "3"][..],
        &["--semaphore", "0"][..],
        &["--permits", "1"][..],
    ] {
        let output = tokio::process::Command::new(BIN)
            .args(["lock", "jobs", "--addr", &addr])
            .args(extra)
            .args(["--", "sh", "-c", "exit 0"])
            .env_remove("TICKETING_CLIENT_TOKEN")
            .output()
            .await
            .unwrap();
        let code = output.status.code();
        assert!(
            code == Some(i32::from(lock_exit::USAGE)) || code == Some(2),
            "{extra:?}: {output:?}"
        );
        assert!(!output.stderr.is_empty());
    }
    server.shutdown().await;
}
