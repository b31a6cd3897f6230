//! The token-floor state file with real processes: a server killed with
//! SIGKILL and restarted with its wall clock an hour behind (libfaketime)
//! keeps issuing tokens above those it issued before; an unusable state
//! directory, one other users could write in, or a damaged file stops the
//! start with exit code 2; links planted in the folder are never followed.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::faketime::shift_clock;
use common::ports::free_port;
use common::scratch::scratch_dir;
use common::startup::await_listening;
use ticketing_tokio::{TicketBroker, TicketError};

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
/// One hour in microseconds: how far the faked clock is behind.
const HOUR_US: u64 = 3_600_000_000;

/// A `ticketing serve` process, killed with SIGKILL when dropped.
struct Server(Child);

impl Server {
    /// Starts a single-mode server on `addr` with `state_dir`, its clock
    /// shifted by `faketime` (a libfaketime offset such as `-1h`) if given;
    /// returns once it accepts connections.
    fn start(addr: SocketAddr, state_dir: &Path, faketime: Option<&str>) -> Server {
        let mut command = Command::new(BIN);
        command
            .args([
                "serve",
                "--listen",
                &addr.to_string(),
                // `info`, for the startup line it is awaited by.
                "--log-level",
                "info",
            ])
            .arg("--state-dir")
            .arg(state_dir)
            .env_remove("TICKETING_CLIENT_TOKENS")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(offset) = faketime {
            shift_clock(&mut command, offset);
        }
        let mut server = Server(command.spawn().expect("start ticketing serve"));
        let started = await_listening(&mut server.0);
        assert!(
            started.line.contains(&format!("listen={addr}")),
            "{}",
            started.line
        );
        // The state file is durable before the listener accepts, so its
        // folder exists by now; if not, whoever answered on `addr` is some
        // other process that took the port first (another test run).
        assert!(
            state_dir.is_dir(),
            "something else listens on {addr}: {:?}",
            server.0.try_wait()
        );
        server
    }

    /// SIGKILL: no shutdown code runs.
    fn kill9(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `count` acquire+release pairs on distinct keys; their tokens. A `B`
/// (the reserve write is still on its way) is retried at once, until a
/// deadline.
async fn take_tokens(addr: SocketAddr, count: usize) -> Vec<u64> {
    let broker = TicketBroker::connect_loopback([addr.to_string()]);
    assert!(broker.wait_ready(Duration::from_secs(5)).await);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tokens = Vec::new();
    for i in 0..count {
        let ticket = loop {
            let acquired = broker
                .acquire(
                    &format!("key-{i}"),
                    Duration::from_secs(5),
                    Duration::from_secs(30),
                    Duration::from_secs(1),
                )
                .await;
            match acquired {
                Ok(ticket) => break ticket,
                Err(TicketError::Busy) if Instant::now() < deadline => {}
                Err(e) => panic!("acquire failed: {e}"),
            }
        };
        tokens.push(ticket.token());
        ticket.release().await.unwrap();
    }
    broker.close().await;
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_an_hour_behind_issues_tokens_above_the_earlier_ones() {
    let state = scratch_dir("state-restart");
    let addr = free_port();

    let server = Server::start(addr, &state.0, None);
    let before = take_tokens(addr, 5).await;
    server.kill9();
    let highest_before = *before.iter().max().unwrap();

    // Same state directory, wall clock stepped back an hour.
    let server = Server::start(addr, &state.0, Some("-1h"));
    let after = take_tokens(addr, 5).await;
    server.kill9();
    assert!(
        after.iter().all(|&token| token > highest_before),
        "tokens went down after the restart: {before:?} then {after:?}"
    );
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");

    // The control: the same restart with a fresh state directory starts
    // from the faked clock, about an hour below. This proves the clock was
    // faked, so the state file is what kept the tokens above.
    let fresh = scratch_dir("state-fresh");
    let server = Server::start(addr, &fresh.0, Some("-1h"));
    let control = take_tokens(addr, 1).await;
    server.kill9();
    assert!(
        control[0] < before[0] - HOUR_US / 2,
        "faketime had no effect: {control:?} vs {before:?}"
    );
}

/// Runs `ticketing serve` on `addr` with `extra` flags expecting it to
/// refuse to start; the last line of its stderr.
fn serve_refused(addr: SocketAddr, state_dir: &Path, extra: &[&str]) -> String {
    let output = Command::new(BIN)
        .args(["serve", "--listen", &addr.to_string()])
        .arg("--state-dir")
        .arg(state_dir)
        .args(extra)
        .env_remove("TICKETING_CLIENT_TOKENS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(
        last.starts_with("ticketing: config error: state_dir: "),
        "{stderr}"
    );
    last
}

#[test]
fn an_unusable_state_dir_exits_2_naming_the_path() {
    // CI runs as root, which no permission bit stops: a path whose parent
    // is a regular file cannot be created by anyone.
    let scratch = scratch_dir("state-unusable");
    std::fs::create_dir_all(&scratch.0).unwrap();
    let file = scratch.0.join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let state_dir = file.join("state");
    let line = serve_refused(free_port(), &state_dir, &[]);
    assert!(line.contains(&state_dir.display().to_string()), "{line}");
    assert!(line.contains("cannot create"), "{line}");
}

#[test]
fn a_damaged_state_file_exits_2_naming_it() {
    let state = scratch_dir("state-damaged");
    let addr = free_port();
    drop(Server::start(addr, &state.0, None));
    let file = std::fs::read_dir(&state.0)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "floor"))
        .expect("the state file was written");
    let text = std::fs::read_to_string(&file).unwrap();
    // The value raised by one under the old checksum: it no longer matches.
    let fields: Vec<&str> = text.split_whitespace().collect();
    let value: u64 = fields[2].parse().unwrap();
    let damaged = format!("{} {} {} {}\n", fields[0], fields[1], value + 1, fields[3]);
    std::fs::write(&file, damaged).unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--listen", &addr.to_string()])
        .arg("--state-dir")
        .arg(&state.0)
        .env_remove("TICKETING_CLIENT_TOKENS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("checksum"), "{stderr}");
}

#[test]
fn a_world_writable_state_dir_exits_2_naming_it_unless_opted_out() {
    let scratch = scratch_dir("state-0777");
    std::fs::create_dir_all(&scratch.0).unwrap();
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let addr = free_port();
    let line = serve_refused(addr, &scratch.0, &[]);
    assert!(line.contains(&scratch.arg()), "{line}");
    assert!(line.contains("0777"), "{line}");
    // The opt-out gets past the check to the next step, which a damaged
    // state file makes fail on purpose (so no server needs stopping).
    let file = scratch
        .0
        .join(ticketing_tokio::state::single_file_name(addr));
    std::fs::write(&file, b"ticketing-token-floor v1 12 0000\n").unwrap();
    let line = serve_refused(addr, &scratch.0, &["--state-dir-insecure-ok"]);
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(line.contains("checksum"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_planted_in_the_state_dir_are_never_followed() {
    let scratch = scratch_dir("state-links");
    let state = scratch.0.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let victim = scratch.0.join("victim");
    std::fs::write(&victim, b"keep me\n").unwrap();
    let missing = scratch.0.join("missing");
    let mut settings = common::loopback_settings();
    // A fixed port: the file names come from it.
    settings.listen = free_port();
    settings.state = Some(ticketing_tokio::StateSettings::new(&state));
    let name = ticketing_tokio::state::single_file_name(settings.listen);
    let temp = state.join(format!("{name}.tmp"));
    let lock = state.join(format!("{name}.lock"));
    symlink(&victim, &temp).unwrap();
    symlink(&missing, &lock).unwrap();

    // The link at the lock name stops the start, naming it.
    let err = ticketing_tokio::spawn_server(settings.clone())
        .await
        .unwrap_err();
    let state_err = ticketing_tokio::StateError::find(&err).expect("a state error");
    assert_eq!(state_err.path, lock, "{state_err}");
    assert!(
        std::fs::symlink_metadata(&missing).is_err(),
        "created through the link"
    );

    // Without it the start writes a real file, not through the temp link.
    std::fs::remove_file(&lock).unwrap();
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let file = state.join(&name);
    assert!(std::fs::symlink_metadata(&file).unwrap().is_file());
    ticketing_core::reserve::decode_floor_file(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me\n");
    server.shutdown().await;
}

/// In process, with a reserve of 10 tokens: the driver writes a new
/// reserve every 5 grants without the clients noticing, and the file
/// always covers every token issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_keeps_the_file_ahead_of_the_tokens() {
    let state = scratch_dir("state-inprocess");
    let mut settings = common::loopback_settings();
    settings.state = Some(ticketing_tokio::StateSettings {
        reserve_step: 10,
        ..ticketing_tokio::StateSettings::new(&state.0)
    });
    let server = ticketing_tokio::spawn_server(settings).await.unwrap();
    let addr = server.local_addr();
    let file = state.0.join(ticketing_tokio::state::single_file_name(addr));
    let tokens = take_tokens(addr, 60).await;
    assert!(tokens.windows(2).all(|w| w[1] == w[0] + 1), "{tokens:?}");
    let stored =
        ticketing_core::reserve::decode_floor_file(&std::fs::read(&file).unwrap()).unwrap();
    assert!(stored >= *tokens.last().unwrap(), "{stored} < {tokens:?}");
    let reserve = server.stats().reserve;
    // Each write covers at most 10 more tokens.
    assert!(reserve.persists_requested >= 60 / 10, "{reserve:?}");
    assert_eq!(reserve.persist_failures, 0);
    server.shutdown().await;
}
