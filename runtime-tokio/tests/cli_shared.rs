//! `ticketing lock KEY --shared -- CMD` with real processes against the
//! in-process server: two shared holders run at once, an exclusive one
//! queued behind them runs only once both have let go, and never beside
//! either. Observed through marker directories and named pipes; nothing
//! sleeps to wait for a condition.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{loopback_server, wait_for_waiters};

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
const BOUND: Duration = Duration::from_secs(60);

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ticketing-shared-{}-{name}", std::process::id()));
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

/// The lines the commands write to the `started` pipe, as they come.
fn read_started(started: PathBuf) -> tokio::sync::mpsc::Receiver<String> {
    let (tx, lines) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        // Read and write, so the reader never sees the end of the file
        // between two commands' lines.
        let pipe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(started)
            .unwrap();
        for line in BufReader::new(pipe).lines() {
            if tx.blocking_send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    lines
}

async fn next_started(lines: &mut tokio::sync::mpsc::Receiver<String>) -> String {
    tokio::time::timeout(BOUND, lines.recv())
        .await
        .expect("a command started in time")
        .expect("the pipe reader is alive")
}

/// Lets the command named `name` finish.
async fn let_go(dir: &Path, name: &str) {
    let go = dir.join(format!("go-{name}"));
    tokio::task::spawn_blocking(move || {
        // Opening for writing waits for the command's read.
        let mut pipe = std::fs::OpenOptions::new().write(true).open(go).unwrap();
        pipe.write_all(b"go\n").unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shared_runs_overlap_while_an_exclusive_one_waits_for_both() {
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let dir = scratch_dir("overlap");
    let started = dir.join("started");
    mkfifo(&started);
    for name in ["r1", "r2", "w"] {
        mkfifo(&dir.join(format!("go-{name}")));
    }
    let mut lines = read_started(started);
    // Each command marks itself as holding, counts the holders it sees,
    // says so with its mode and token, holds until let go, and unmarks
    // itself before it exits (so before its lock is released).
    let script = r#"
        mkdir "$DIR/held-$NAME" || exit 9
        count=$(ls -d "$DIR"/held-* | wc -l)
        echo "$NAME $TICKETING_MODE $count $TICKETING_TOKEN" > "$DIR/started"
        read go < "$DIR/go-$NAME"
        rmdir "$DIR/held-$NAME"
    "#;
    let spawn = |name: &str, shared: bool| {
        let mut command = tokio::process::Command::new(BIN);
        command.args(["lock", "orders", "--wait", "50s", "--addr", &addr]);
        if shared {
            command.arg("--shared");
        }
        command
            .args(["--", "sh", "-c", script])
            .env("DIR", &dir)
            .env("NAME", name)
            .env_remove("TICKETING_CLIENT_TOKEN")
            .kill_on_drop(true)
            .spawn()
            .expect("ticketing lock runs")
    };
    let mut r1 = spawn("r1", true);
    let first = next_started(&mut lines).await;
    assert!(first.starts_with("r1 shared 1 "), "{first}");
    let mut r2 = spawn("r2", true);
    let second = next_started(&mut lines).await;
    // Both hold at once: the second saw the first's mark.
    assert!(second.starts_with("r2 shared 2 "), "{second}");
    let mut w = spawn("w", false);
    // The writer is queued behind both readers.
    wait_for_waiters(&server, 1).await;
    let_go(&dir, "r1").await;
    assert!(r1.wait().await.unwrap().success());
    let_go(&dir, "r2").await;
    assert!(r2.wait().await.unwrap().success());
    // Only now the writer runs, and alone.
    let third = next_started(&mut lines).await;
    assert!(third.starts_with("w exclusive 1 "), "{third}");
    let token = |line: &str| -> u64 { line.split(' ').nth(3).unwrap().parse().unwrap() };
    assert!(token(&third) > token(&first).max(token(&second)));
    let_go(&dir, "w").await;
    assert!(w.wait().await.unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}
