//! `ticketing lock` against the wrong kind of server: a plain client at a
//! TLS port, a TLS client with a certificate it does not trust, or at a
//! plain port. Each is told apart and named with what to do, and the
//! connection attempts end with `--wait`, not a fixed time.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::certs::make_certs;
use common::{loopback_server, loopback_settings};
use ticketing_tokio::config::lock_exit;
use ticketing_tokio::spawn_server;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
/// `--wait 1s` must fail well before the old fixed 5 s.
const FAILS_WITHIN: Duration = Duration::from_secs(4);

/// `ticketing lock k --addr ADDR --wait 1s EXTRA -- true`: its output and
/// how long it took.
async fn lock_for_1s(addr: &str, extra: &[&str]) -> (Output, Duration) {
    let mut args = vec!["lock", "k", "--addr", addr, "--wait", "1s"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "true"]);
    let started = Instant::now();
    let output = tokio::process::Command::new(BIN)
        .args(&args)
        .env_remove("TICKETING_CLIENT_TOKEN")
        .output()
        .await
        .unwrap();
    (output, started.elapsed())
}

fn assert_unavailable(output: &Output, took: Duration, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(i32::from(lock_exit::UNAVAILABLE)),
        "{stderr}"
    );
    for words in says {
        assert!(stderr.contains(words), "{words:?} not in {stderr}");
    }
    assert!(took < FAILS_WITHIN, "took {took:?}: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_at_a_tls_port_is_told_it_speaks_tls() {
    let (dir, _ca, cert, key) = make_certs("cli-tls-plain");
    let mut settings = loopback_settings();
    settings.tls = Some(ticketing_tokio::tls::load_server_config(&cert, &key).unwrap());
    let server = spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let (output, took) = lock_for_1s(&addr, &[]).await;
    assert_unavailable(
        &output,
        took,
        &[
            &format!(
                "the server at {addr} accepted the connection but sent no hello: it speaks TLS"
            ),
            "--tls-ca FILE",
            "--tls-system-roots",
        ],
    );
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_does_not_trust_the_certificate_is_told_why() {
    let (dir, _ca, cert, key) = make_certs("cli-tls-untrusted");
    let (other_dir, other_ca, _, _) = make_certs("cli-tls-other-ca");
    let mut settings = loopback_settings();
    settings.tls = Some(ticketing_tokio::tls::load_server_config(&cert, &key).unwrap());
    let server = spawn_server(settings).await.unwrap();
    let addr = server.local_addr().to_string();
    let other_ca = other_ca.to_str().unwrap();
    let (output, took) = lock_for_1s(&addr, &["--tls-ca", other_ca]).await;
    assert_unavailable(
        &output,
        took,
        &[
            // rustls's reason follows in parentheses.
            &format!("the certificate of the server at {addr} is not trusted ("),
            "pass --tls-ca with the CA that signed it",
        ],
    );
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(other_dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_at_a_plain_port_is_told_it_does_not_speak_tls() {
    let (dir, ca, _, _) = make_certs("cli-tls-at-plain");
    let server = loopback_server().await;
    let addr = server.local_addr().to_string();
    let (output, took) = lock_for_1s(&addr, &["--tls-ca", ca.to_str().unwrap()]).await;
    assert_unavailable(
        &output,
        took,
        &[&format!("the server at {addr} does not speak TLS")],
    );
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_fails_with_the_wait_and_says_so() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let (output, took) = lock_for_1s(&closed, &[]).await;
    assert_unavailable(
        &output,
        took,
        &[&format!("nothing listens at {closed}"), "within 1s"],
    );
}
