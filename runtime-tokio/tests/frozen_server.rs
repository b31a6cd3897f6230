//! Our tokio client against a `ticketing serve` process frozen with
//! SIGSTOP: its kernel still accepts connections and acknowledges bytes,
//! but nothing answers, as with a hung server or a path that swallows
//! replies. The client's silence rule (`SessionConfig::silence_timeout`)
//! must end the requests on such a connection (possibly sent →
//! Indeterminate) instead of letting them wait out their own deadlines, and
//! the broker must heal by itself once the server runs again.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::ports::free_port;
use common::startup::await_listening;
use ticketing_tokio::TicketBroker;
use ticketing_tokio::client::{ReleaseOutcome, TicketError};

const TOKEN: &str = "frozen-test-client-token-0123";
const LEASE: Duration = Duration::from_secs(30);
const BUDGET: Duration = Duration::from_secs(1);
/// The client's silence timeout in this test.
const SILENCE: Duration = Duration::from_secs(1);
/// Scheduling slack on a shared machine.
const SLACK: Duration = Duration::from_millis(1_500);

/// `ticketing serve`, resumed (SIGCONT) and killed when dropped, also when
/// the test panics while it is stopped.
struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    fn start() -> Serve {
        let addr = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ticketing"))
            .arg("serve")
            .args(["--listen", &addr.to_string(), "--client-token", TOKEN])
            // `info`, for the startup line it is awaited by.
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ticketing serve");
        let started = await_listening(&mut child);
        assert!(
            started.line.contains(&format!("listen={addr}")),
            "{}",
            started.line
        );
        Serve { child, addr }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([name, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {name} failed");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_on_a_frozen_server_end_by_the_silence_rule_and_the_broker_heals() {
    let serve = Serve::start();
    let broker = TicketBroker::builder()
        .addrs([serve.addr.to_string()])
        .token(TOKEN)
        .silence_timeout(SILENCE)
        .connect()
        .unwrap();
    assert!(broker.wait_ready(Duration::from_secs(5)).await);
    let held = broker
        .acquire("held", Duration::from_secs(5), LEASE, BUDGET)
        .await
        .unwrap();
    let first_token = held.token();

    serve.signal("-STOP");

    // An immediate acquire: the server owes its answer at once, so after
    // the silence timeout it is overdue and the connection is declared
    // dead. Without the rule it would wait out the 5 s transport deadline.
    let started = Instant::now();
    let result = broker.acquire("other", Duration::ZERO, LEASE, BUDGET).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(TicketError::Indeterminate)),
        "{result:?}"
    );
    assert!(took >= SILENCE, "ended before the bound: {took:?}");
    assert!(took < SILENCE + SLACK, "took {took:?}");

    // The release never hangs. Whether an attempt went out depends on the
    // race between the silence close and the reconnect (the frozen kernel
    // accepts the new connection, but its handshake never completes): an
    // attempt on the old connection is possibly sent (`Indeterminate`),
    // one that found no session was never sent (`NotConnected`). Either
    // way it ends within its 5 s window.
    let started = Instant::now();
    let result = held.release().await;
    let took = started.elapsed();
    assert!(
        matches!(
            result,
            Err(TicketError::Indeterminate | TicketError::NotConnected)
        ),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(5) + SLACK, "took {took:?}");

    // Running again, the broker reconnects by itself and grants again, with
    // a larger token (a key nobody held: "held" may still be leased if the
    // release never went out).
    serve.signal("-CONT");
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match broker
            .acquire("after", Duration::from_secs(2), LEASE, BUDGET)
            .await
        {
            Ok(ticket) => break ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant after resume: {e:?}"),
        }
    };
    assert!(again.token() > first_token, "tokens only grow");
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    broker.close().await;
}
