//! `--log-format json`: a real `ticketing serve` writes one JSON object per
//! stderr line (startup, the admin listener, shutdown), each with a level,
//! a target and its fields; text stays the default.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

/// Starts `ticketing serve` with `extra` arguments, waits for the line that
/// carries `needle`, stops it with SIGTERM and returns every stderr line.
fn run_until(extra: &[&str], needle: &str) -> Vec<String> {
    let state = common::scratch::scratch_dir("logs-state");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &common::ports::free_port().to_string()])
        .args(["--admin-listen", &common::ports::free_port().to_string()])
        .args(["--state-dir", &state.arg(), "--log-level", "info"])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("TICKETING_CLIENT_TOKENS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no line with {needle:?}: {lines:#?}"));
        let found = line.contains(needle);
        lines.push(line);
        if found {
            break;
        }
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    lines.extend(lines_rx.iter());
    lines
}

#[test]
fn json_format_prints_one_parseable_object_per_line() {
    let lines = run_until(&["--log-format", "json"], "admin listener");
    assert!(lines.len() >= 3, "{lines:#?}");
    let mut messages = Vec::new();
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        let level = object["level"].as_str().expect("a level");
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
            "{line}"
        );
        assert!(object["target"].is_string(), "{line}");
        assert!(object["timestamp"].is_string(), "{line}");
        messages.push(
            object["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        );
    }
    let listening = lines
        .iter()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|o| o["fields"]["message"] == "ticketing server listening")
        .expect("the startup line");
    assert_eq!(listening["fields"]["mode"], "single");
    assert!(listening["fields"]["listen"].is_string());
    assert!(
        messages.iter().any(|m| m == "shutdown complete"),
        "{messages:#?}"
    );
    // Optional addresses are written as addresses, not as Rust's `Some(…)`.
    for line in &lines {
        assert!(!line.contains("Some("), "{line}");
    }
    let admin = lines
        .iter()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|o| {
            o["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("admin listener"))
        })
        .expect("the admin listener line");
    let admin_addr = admin["fields"]["admin"]
        .as_str()
        .expect("an address string");
    assert!(
        admin_addr.parse::<std::net::SocketAddr>().is_ok(),
        "{admin}"
    );
}

/// Runs `ticketing serve` on a port another socket holds, with `extra`
/// arguments; returns its stderr lines once it exited 1.
fn serve_on_a_taken_port(extra: &[&str]) -> Vec<String> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let state = common::scratch::scratch_dir("logs-taken");
    let output = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &taken.local_addr().unwrap().to_string(),
        ])
        .args(["--state-dir", &state.arg()])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("TICKETING_CLIENT_TOKENS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    String::from_utf8(output.stderr)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn cannot_listen_is_said_once_in_every_format_and_with_logs_off() {
    for extra in [
        &["--log-level", "info"][..],
        &["--log-level", "info", "--log-format", "json"],
        &["--log-level", "off"],
    ] {
        let lines = serve_on_a_taken_port(extra);
        let said: Vec<&String> = lines
            .iter()
            .filter(|line| line.contains("cannot listen"))
            .collect();
        assert_eq!(said.len(), 1, "{extra:?}: {lines:#?}");
    }
}

#[test]
fn text_stays_the_default_format() {
    let lines = run_until(&[], "admin listener");
    let startup = lines
        .iter()
        .find(|line| line.contains("ticketing server listening"))
        .expect("the startup line");
    assert!(serde_json::from_str::<serde_json::Value>(startup).is_err());
    assert!(startup.contains(" INFO "), "{startup}");
    assert!(startup.contains("mode=\"single\""), "{startup}");
    let admin = lines
        .iter()
        .find(|line| line.contains("admin listener"))
        .expect("the admin listener line");
    assert!(admin.contains("admin=127.0.0.1:"), "{admin}");
}
