//! What the printing subcommands do with their output: a reader that has
//! gone away (`ticketing locks ls | head -1`) ends them quietly, and the
//! completion scripts and the manual page are generated from the command
//! line's own definition.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

/// Runs `ticketing ARGS` with its stdout a pipe whose reader is already
/// closed: (exit code, the signal that ended it, stderr).
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("TICKETING_CLIENT_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    (status.code(), status.signal(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printing_subcommand_ends_quietly_when_its_reader_is_gone() {
    let mut settings = common::loopback_settings();
    settings.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let admin = server.admin_addr().unwrap().to_string();
    // Something to list.
    let broker = common::ours_loopback(&server).await;
    let ticket = broker
        .acquire(
            "listed",
            std::time::Duration::ZERO,
            common::LEASE,
            std::time::Duration::ZERO,
        )
        .await
        .unwrap();
    let runs: Vec<Vec<&str>> = vec![
        vec!["identity"],
        vec!["token"],
        vec!["completions", "bash"],
        vec!["man"],
        vec!["locks", "ls", "--admin", &admin],
        vec!["status", "--admin", &admin],
        vec!["bench", "--addr", &addr, "--ops", "200", "--clients", "2"],
    ];
    for args in runs {
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let (code, signal, stderr) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            with_closed_stdout(&args)
        })
        .await
        .unwrap();
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            code == Some(0) || signal == Some(libc::SIGPIPE),
            "exit {code:?}, signal {signal:?}: {stderr}"
        );
    }
    ticket.release().await.unwrap();
    broker.close().await;
    server.shutdown().await;
}

#[test]
fn completions_for_every_shell_and_the_manual_page_name_every_subcommand() {
    let subcommands = ["serve", "lock", "bench", "locks", "status", "completions"];
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let script = String::from_utf8(output.stdout).unwrap();
        for subcommand in subcommands {
            assert!(script.contains(subcommand), "{shell}: no {subcommand}");
        }
    }
    let output = Command::new(BIN).arg("man").output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let page = String::from_utf8(output.stdout).unwrap();
    assert!(page.starts_with(".ie"), "{page}");
    assert!(page.contains(".TH ticketing 1"), "{page}");
    for subcommand in subcommands {
        assert!(page.contains(subcommand), "no {subcommand}");
    }
}

#[test]
fn the_version_names_the_package_version() {
    let output = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8(output.stdout).unwrap();
    assert!(
        version.starts_with(&format!("ticketing {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
}

#[test]
fn lock_and_bench_share_the_exit_code_of_a_missing_server() {
    // Nothing listens on the discard port.
    let lock = Command::new(BIN)
        .args(["lock", "k", "--addr", "127.0.0.1:9", "--", "true"])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .unwrap();
    let bench = Command::new(BIN)
        .args(["bench", "--addr", "127.0.0.1:9", "--ops", "10"])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .unwrap();
    assert_eq!(lock.status.code(), Some(69), "{lock:?}");
    assert_eq!(bench.status.code(), Some(69), "{bench:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_names_what_is_missing_and_takes_either_token_spelling() {
    // No admin listener there: the hint names the flag that turns it on.
    let output = tokio::process::Command::new(BIN)
        .args(["locks", "ls", "--admin", "127.0.0.1:9"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(69), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("--admin-listen"), "{stderr}");

    // A server without admin tokens: a force-release says none could work.
    let mut settings = common::loopback_settings();
    settings.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let admin = server.admin_addr().unwrap().to_string();
    let output = tokio::process::Command::new(BIN)
        .args(["locks", "release", "k", "--admin", &admin])
        .env("TICKETING_ADMIN_TOKEN", "some-admin-token-0123456789")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(77), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("no admin token configured"), "{stderr}");
    server.shutdown().await;

    // The server's plural variable works for the CLI too.
    let token = "the-admin-token-0123456789";
    let mut settings = common::loopback_settings();
    settings.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.admin_tokens = ticketing_core::admin::AdminTokens::new([token]).unwrap();
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let admin = server.admin_addr().unwrap().to_string();
    let output = tokio::process::Command::new(BIN)
        .args(["locks", "release", "nobody-holds-this", "--admin", &admin])
        .env_remove("TICKETING_ADMIN_TOKEN")
        .env(
            "TICKETING_ADMIN_TOKENS",
            format!("{token},another-admin-token-0123"),
        )
        .output()
        .await
        .unwrap();
    // Authenticated: the answer is about the key (404), not the token.
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_address_is_resolved() {
    let server = common::loopback_server().await;
    let addr = format!("localhost:{}", server.local_addr().port());
    let output = tokio::process::Command::new(BIN)
        .args(["lock", "named", "--addr", &addr, "--", "true"])
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_proof_names_the_token_and_what_else_it_could_be() {
    let mut settings = common::loopback_settings();
    settings.server.client_tokens =
        ticketing_core::auth::ClientTokens::new([common::TOKEN]).unwrap();
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let output = tokio::process::Command::new(BIN)
        .args(["lock", "k", "--addr", &addr])
        .args(["--token", "not-the-client-token-0123456789", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(77), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("client token"), "{stderr}");
    assert!(stderr.contains("--cluster-identity"), "{stderr}");
    server.shutdown().await;
}
