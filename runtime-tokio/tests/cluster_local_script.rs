//! `scripts/cluster-local.sh start` returns once a leader is elected and
//! names it, or says it gave up and fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster-local.sh")
}

/// A first client port whose whole layout (clients, peers, status and admin
/// listeners: BASE + 0, 1000, 2000 and 4000, three each) is free now, below
/// the ephemeral range (nodes dial each other from ephemeral ports).
fn free_base() -> u16 {
    let start = std::process::id().wrapping_mul(61) % 6_000;
    (0..600)
        .map(|k| 21_000 + ((start + k * 37) % 6_000) as u16)
        .find(|base| {
            [0, 1000, 2000, 4000].iter().all(|offset| {
                (0..3).all(|slot| TcpListener::bind(("127.0.0.1", base + offset + slot)).is_ok())
            })
        })
        .expect("a free port layout")
}

fn cluster_local(dir: &Path, base: u16, envs: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new("bash")
        .arg(script())
        .args(args)
        .env("CLUSTER_DIR", dir)
        .env("BASE", base.to_string())
        .env("TICKETING_BIN", BIN)
        .env("PROFILE", "fast")
        .env("LOG_LEVEL", "warn")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn start_returns_once_a_leader_is_elected_and_names_it() {
    let dir = std::env::temp_dir().join(format!("ticketing-cluster-local-{}", std::process::id()));
    let base = free_base();
    let started = cluster_local(&dir, base, &[], &["start"]);
    // Asked right after start returned: a leader, without waiting.
    let status = cluster_local(&dir, base, &[], &["status"]);
    let stopped = cluster_local(&dir, base, &[], &["stop"]);
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert!(started.status.success(), "{started:?}");
    assert!(stderr.contains("==> leader: slot "), "{stderr}");
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("role=leader"), "{status}");
    assert!(stopped.status.success(), "{stopped:?}");

    // No time to elect one: said, and a failure.
    let gave_up = cluster_local(&dir, base, &[("LEADER_WAIT_S", "0")], &["start"]);
    let stopped = cluster_local(&dir, base, &[], &["stop"]);
    let stderr = String::from_utf8_lossy(&gave_up.stderr);
    assert!(!gave_up.status.success(), "{gave_up:?}");
    assert!(stderr.contains("no leader elected within 0 s"), "{stderr}");
    assert!(stopped.status.success(), "{stopped:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
