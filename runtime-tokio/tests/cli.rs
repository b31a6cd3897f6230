//! The `ticketing` binary: exit codes, one-line config errors, startup log
//! and clean shutdown on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

fn serve_expecting_config_error(args: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env_remove("TICKETING_CLIENT_TOKENS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    stderr
}

#[test]
fn config_errors_exit_2_with_one_line_naming_the_field() {
    let stderr = serve_expecting_config_error(&["--max-keys", "0"]);
    assert!(stderr.contains("limits.max_keys"), "{stderr}");
    assert!(stderr.contains("1..="), "{stderr}");

    let stderr = serve_expecting_config_error(&["--listen", "0.0.0.0:0"]);
    assert!(stderr.contains("listen"), "{stderr}");
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");

    let stderr = serve_expecting_config_error(&["--client-token", "short"]);
    assert!(stderr.contains("client_tokens[0]"), "{stderr}");

    let stderr = serve_expecting_config_error(&["--config", "/nonexistent/ticketing.toml"]);
    assert!(stderr.contains("--config"), "{stderr}");
}

#[test]
fn a_value_of_the_wrong_kind_is_one_line_naming_the_field_never_the_value() {
    const PASTED: &str = "tok3n-5ecret-0123456789abcdef";
    let dir = std::env::temp_dir().join(format!("ticketing-cli-kind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("ticketing.toml");
    std::fs::write(
        &config,
        format!("[limits]\nmax_hold_limit_s = \"{PASTED}\"\n"),
    )
    .unwrap();
    let stderr = serve_expecting_config_error(&["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains("limits.max_hold_limit_s: expected a whole number of seconds"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASTED), "the value was shown: {stderr}");

    let stderr = serve_expecting_config_error(&["--max-keys", PASTED]);
    assert!(
        stderr.starts_with("ticketing: flag `--max-keys`: expected a whole number"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASTED), "the value was shown: {stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_and_exits_0_on_sigterm() {
    // No --state-dir: the default, here systemd's $STATE_DIRECTORY.
    let state = common::scratch::scratch_dir("cli-state");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--log-level", "info"])
        .env_remove("TICKETING_CLIENT_TOKENS")
        .env_remove("RUST_LOG")
        .env("STATE_DIRECTORY", &state.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();

    // Forward stderr lines; the startup line carries the bound address.
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let addr = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("no startup log line");
        log.push(line.clone());
        if let Some(rest) = line.split("listen=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let startup = log.last().unwrap();
    assert!(startup.contains("tls=\"off\""), "{startup}");
    let floor = log
        .iter()
        .find(|line| line.contains("token floor loaded"))
        .expect("the token floor is loaded before listening");
    assert!(floor.contains(&state.arg()), "{floor}");

    let broker = ticketing::TicketBroker::connect_loopback([addr]);
    assert!(broker.wait_ready(Duration::from_secs(5)).await);
    let ticket = broker
        .acquire(
            "cli",
            Duration::from_secs(5),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(
        ticket.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );

    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let status = exit_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server did not exit after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    log.extend(lines_rx.iter());
    assert!(
        log.iter().any(|line| line.contains("shutdown complete")),
        "{log:#?}"
    );
    broker.close().await;
}

#[test]
fn a_non_loopback_admin_listener_without_an_admin_token_is_refused_unless_insecure() {
    let admin = common::ports::free_port();
    let open = format!("0.0.0.0:{}", admin.port());
    let stderr = serve_expecting_config_error(&["--admin-listen", &open]);
    assert!(stderr.contains("admin_listen"), "{stderr}");
    assert!(stderr.contains("--insecure-admin-no-auth"), "{stderr}");

    let stderr = serve_expecting_config_error(&["--admin-token-file", "/nonexistent/tokens"]);
    assert!(stderr.contains("--admin-token-file"), "{stderr}");

    // With the explicit flag it serves: health, but the lock API only with
    // a token (of which there is none).
    let state = common::scratch::scratch_dir("cli-admin-insecure");
    let client = common::ports::free_port();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &client.to_string()])
        .args(["--admin-listen", &open, "--insecure-admin-no-auth"])
        // `info`, for the startup line it is awaited by: the admin listener
        // is bound (and listening) before it.
        .args(["--state-dir", &state.arg(), "--log-level", "info"])
        .env_remove("TICKETING_CLIENT_TOKENS")
        .env_remove("TICKETING_ADMIN_TOKENS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = common::startup::await_listening(&mut child);
    assert!(
        started.line.contains(&format!("listen={client}")),
        "{}",
        started.line
    );
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], admin.port()));
    let livez = http_status(loopback, "/livez").expect("the insecure admin listener answers");
    assert_eq!(livez, 200);
    assert_eq!(http_status(loopback, "/v1/locks"), Some(401));
    let _ = child.kill();
    let _ = child.wait();
}

/// The status code of `GET path` on `addr`, if it answers.
fn http_status(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    tcp.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// One run of `ticketing token`: its stdout, checked to be one line.
fn fresh_token() -> String {
    let output = Command::new(BIN)
        .arg("token")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let token = stdout.strip_suffix('\n').expect("one line ending in LF");
    assert!(!token.contains('\n'), "{stdout:?}");
    token.to_owned()
}

const CLUSTER_IDENTITY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// `serve` arguments of a three-node cluster on loopback with `peer_token`.
fn cluster_serve_args(peer_token: &str) -> Vec<String> {
    let mut argv = vec!["ticketing", "serve", "--cluster-identity", CLUSTER_IDENTITY];
    argv.extend(["--self-slot", "0", "--peer-token", peer_token]);
    argv.extend(["--slot", "127.0.0.1:5225,127.0.0.1:6225"]);
    argv.extend(["--slot", "127.0.0.1:5226,127.0.0.1:6226"]);
    argv.extend(["--slot", "127.0.0.1:5227,127.0.0.1:6227"]);
    argv.into_iter().map(str::to_owned).collect()
}

#[test]
fn token_prints_a_fresh_64_hex_digit_token_the_config_accepts_as_a_peer_token() {
    use clap::Parser;
    use ticketing_tokio::config::{Cli, Command as Subcommand, Env, load};

    let (first, second) = (fresh_token(), fresh_token());
    for token in [&first, &second] {
        assert_eq!(token.len(), 64, "{token:?}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "not lowercase hex: {token:?}"
        );
    }
    assert_ne!(first, second, "two runs printed the same token");

    let serve_args = |argv: Vec<String>| match Cli::try_parse_from(argv).unwrap().command {
        Subcommand::Serve(args) => args,
        other => panic!("not serve: {other:?}"),
    };
    // As a flag, and both in the comma-separated environment list.
    let from_flag = serve_args(cluster_serve_args(&first));
    load(&from_flag, &Env::default()).expect("accepted from --peer-token");
    let mut without_flag = cluster_serve_args("unused");
    let at = without_flag
        .iter()
        .position(|a| a == "--peer-token")
        .unwrap();
    without_flag.drain(at..at + 2);
    let env = Env {
        peer_tokens: Some(format!("{first},{second}")),
        ..Env::default()
    };
    load(&serve_args(without_flag), &env).expect("accepted from TICKETING_PEER_TOKENS");
}

#[test]
fn a_peer_token_under_32_bytes_is_a_config_error_that_says_how_to_make_one() {
    let short = "a-31-byte-passphrase-0123456789";
    assert_eq!(short.len(), 31);
    let argv = cluster_serve_args(short);
    let args: Vec<&str> = argv[2..].iter().map(String::as_str).collect();
    let stderr = serve_expecting_config_error(&args);
    assert!(stderr.contains("cluster.peer_tokens[0]"), "{stderr}");
    assert!(stderr.contains("at least 32"), "{stderr}");
    assert!(stderr.contains("ticketing token"), "{stderr}");
    assert!(!stderr.contains(short), "the token was printed: {stderr}");
}
