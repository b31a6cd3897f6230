//! One behavioural suite, run against every flavour of client and server:
//! a difference between runtimes is a failing test here.
//!
//! Each flavour module takes `run` (block on a future in its runtime),
//! `spawn` and `yield_now` from `on_tokio` or `on_smol`, and declares with
//! `fixture!` the server it starts and how its client connects, giving
//! `Fixture::start(config)`, `Fixture::broker()`, `Fixture::stats()` and
//! `Fixture::shutdown()`; `suite!()` expands the same cases inside each
//! module.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ticketing_core::server::{ServerConfig, ServerStats};

const READY: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(30);
const BUDGET: Duration = Duration::from_secs(1);
/// Bound on waiting for a condition the server reports only through stats.
const SETTLE: Duration = Duration::from_secs(5);

fn tiny_limits() -> ServerConfig {
    let mut config = ServerConfig::default();
    config.lock.limits.keys_max = 1;
    config.lock.limits.waiters_per_key_max = 1;
    config
}

#[path = "../../runtime-tokio/tests/common/certs.rs"]
mod certs;

/// Rcgen CA + server certificate for 127.0.0.1: (CA PEM path, server config).
fn tls_material(name: &str) -> (std::path::PathBuf, Arc<rustls::ServerConfig>) {
    let (_dir, ca_path, cert_path, key_path) = certs::make_certs(&format!("smol-{name}"));
    let config = ticketing_smol::tls::server_config(&cert_path, &key_path).unwrap();
    (ca_path, config)
}

/// Polls `done` (yielding, never sleeping) until it holds; panics after
/// [`SETTLE`]. The servers offer no event for "n waiters queued".
async fn settle(what: &str, yield_now: impl AsyncFn(), done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < SETTLE, "never saw {what}");
        yield_now().await;
    }
}

macro_rules! suite {
    () => {
        use ticketing_core::client::{ClientError as TicketError, ReleaseOutcome};

        async fn waiters(fixture: &Fixture, count: usize) {
            settle(
                &format!("{count} waiters"),
                async || yield_now().await,
                || fixture.stats().lock.waiters == count,
            )
            .await;
        }

        #[test]
        fn acquire_and_release() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                assert_eq!(ticket.key(), "k");
                assert_eq!(fixture.stats().lock.held_keys, 1);
                assert!(ticket.remaining() <= LEASE);
                assert!(ticket.remaining() > LEASE - Duration::from_secs(5));
                let first = ticket.token();
                assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
                assert_eq!(fixture.stats().lock.held_keys, 0);
                let again = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                assert!(again.token() > first);
                assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn wait_zero_on_a_held_key_times_out_at_once() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let asked = Instant::now();
                let immediate = broker.acquire("k", Duration::ZERO, LEASE, BUDGET).await;
                assert!(
                    matches!(immediate, Err(TicketError::Timeout)),
                    "{immediate:?}"
                );
                assert!(asked.elapsed() < Duration::from_secs(1));
                assert_eq!(fixture.stats().lock.waiters, 0);
                assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn a_bounded_wait_on_a_held_key_times_out_near_its_end() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let asked = Instant::now();
                let waited = broker
                    .acquire("k", Duration::from_secs(1), LEASE, BUDGET)
                    .await;
                assert!(matches!(waited, Err(TicketError::Timeout)), "{waited:?}");
                let elapsed = asked.elapsed();
                assert!(
                    elapsed >= Duration::from_millis(500) && elapsed < Duration::from_secs(2),
                    "{elapsed:?}"
                );
                assert_eq!(fixture.stats().lock.waiters, 0);
                assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn a_queued_waiter_gets_the_key_on_release_with_a_larger_token() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let waiter = {
                    let broker = broker.clone();
                    spawn(async move { broker.acquire("k", WAIT, LEASE, BUDGET).await })
                };
                waiters(&fixture, 1).await;
                let first = held.token();
                let asked = Instant::now();
                assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
                let next = waiter.await.unwrap();
                assert!(next.token() > first);
                assert!(
                    asked.elapsed() < Duration::from_secs(1),
                    "handoff is immediate"
                );
                assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn waiters_are_served_in_fifo_order() {
            const WAITERS: usize = 4;
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let served = Arc::new(Mutex::new(Vec::new()));
                let mut tasks = Vec::new();
                for index in 0..WAITERS {
                    let broker = broker.clone();
                    let served = Arc::clone(&served);
                    tasks.push(spawn(async move {
                        let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                        served.lock().unwrap().push((index, ticket.token()));
                        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
                    }));
                    // Queue them one by one so that their order is known.
                    waiters(&fixture, index + 1).await;
                }
                let holder_token = held.token();
                assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
                for task in tasks {
                    task.await;
                }
                let served = served.lock().unwrap().clone();
                let order: Vec<usize> = served.iter().map(|(index, _)| *index).collect();
                assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
                let tokens: Vec<u64> = served.iter().map(|(_, token)| *token).collect();
                assert!(holder_token < tokens[0]);
                assert!(
                    tokens.windows(2).all(|pair| pair[0] < pair[1]),
                    "{tokens:?}"
                );
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn tiny_limits_answer_busy_at_once() {
            run(async {
                let fixture = Fixture::start(tiny_limits()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("a", WAIT, LEASE, BUDGET).await.unwrap();
                // keys_max = 1: a second key does not fit.
                let asked = Instant::now();
                let other_key = broker.acquire("b", WAIT, LEASE, BUDGET).await;
                assert!(matches!(other_key, Err(TicketError::Busy)), "{other_key:?}");
                assert!(
                    asked.elapsed() < Duration::from_secs(1),
                    "Busy is not retried"
                );
                // waiters_per_key_max = 1: a second waiter does not fit.
                let waiter = {
                    let broker = broker.clone();
                    spawn(async move { broker.acquire("a", WAIT, LEASE, BUDGET).await })
                };
                waiters(&fixture, 1).await;
                let second = broker.acquire("a", WAIT, LEASE, BUDGET).await;
                assert!(matches!(second, Err(TicketError::Busy)), "{second:?}");
                assert_eq!(fixture.stats().lock.waiters, 1);
                assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
                let next = waiter.await.unwrap();
                assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn key_sets_are_taken_and_released_whole() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let set = broker
                    .acquire_set(&["b", "a", "b"], WAIT, LEASE, BUDGET)
                    .await
                    .unwrap();
                assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b"]);
                for key in ["a", "b"] {
                    let blocked = broker.acquire(key, Duration::ZERO, LEASE, BUDGET).await;
                    assert!(
                        matches!(blocked, Err(TicketError::Timeout)),
                        "{key}: {blocked:?}"
                    );
                }
                let overlapping = broker
                    .acquire_set(&["b", "c"], Duration::ZERO, LEASE, BUDGET)
                    .await;
                assert!(
                    matches!(overlapping, Err(TicketError::Timeout)),
                    "{overlapping:?}"
                );
                let set_token = set.token();
                assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);
                let after = broker
                    .acquire("b", Duration::ZERO, LEASE, BUDGET)
                    .await
                    .unwrap();
                assert!(after.token() > set_token);
                assert_eq!(after.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn a_dropped_ticket_is_released_in_the_background() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let dropped = ticket.token();
                drop(ticket);
                let asked = Instant::now();
                let next = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                // Well before the 30 s lease: the drop released it.
                assert!(
                    asked.elapsed() < Duration::from_secs(2),
                    "{:?}",
                    asked.elapsed()
                );
                assert!(next.token() > dropped);
                assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn releasing_an_expired_lease_reports_not_current() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let other = fixture.broker().await;
                let stale = broker
                    .acquire("k", WAIT, Duration::from_secs(1), Duration::ZERO)
                    .await
                    .unwrap();
                // The lease lapses and another client takes the key over.
                let current = other.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                assert!(current.token() > stale.token());
                assert_eq!(
                    stale.release().await.unwrap(),
                    ReleaseOutcome::AlreadyGoneOrNotCurrent
                );
                assert_eq!(current.release().await.unwrap(), ReleaseOutcome::Released);
                broker.close().await;
                other.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn durations_out_of_range_are_rejected_not_clamped() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let lease = broker
                    .acquire("k", WAIT, Duration::from_secs(251), BUDGET)
                    .await;
                assert!(
                    matches!(
                        lease,
                        Err(TicketError::UnsupportedDuration {
                            field: "lease",
                            s_max: 250
                        })
                    ),
                    "{lease:?}"
                );
                let wait = broker
                    .acquire("k", Duration::from_secs(256), LEASE, BUDGET)
                    .await;
                assert!(
                    matches!(
                        wait,
                        Err(TicketError::UnsupportedDuration {
                            field: "wait",
                            s_max: 255
                        })
                    ),
                    "{wait:?}"
                );
                let budget = broker
                    .acquire("k", WAIT, Duration::from_secs(2), Duration::from_secs(3))
                    .await;
                assert!(
                    matches!(budget, Err(TicketError::InsufficientLease)),
                    "{budget:?}"
                );
                let key = broker.acquire("has space", WAIT, LEASE, BUDGET).await;
                assert!(matches!(key, Err(TicketError::InvalidInput(_))), "{key:?}");
                assert_eq!(fixture.stats().lock.keys, 0, "nothing reached the server");
                broker.close().await;
                fixture.shutdown().await;
            });
        }

        #[test]
        fn a_closed_broker_refuses_new_acquires() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                drop(ticket);
                // Close drains the background release of the dropped ticket.
                broker.close().await;
                let after = broker.acquire("k", WAIT, LEASE, BUDGET).await;
                assert!(matches!(after, Err(TicketError::Closed)), "{after:?}");
                assert_eq!(fixture.stats().lock.held_keys, 0);
                broker.close().await; // idempotent
                fixture.shutdown().await;
            });
        }

        #[test]
        fn server_shutdown_answers_queued_waiters() {
            run(async {
                let fixture = Fixture::start(ServerConfig::default()).await;
                let broker = fixture.broker().await;
                let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
                let waiter = {
                    let broker = broker.clone();
                    spawn(async move { broker.acquire("k", WAIT, LEASE, BUDGET).await })
                };
                waiters(&fixture, 1).await;
                let asked = Instant::now();
                fixture.shutdown().await;
                let answered = waiter.await;
                assert!(
                    matches!(answered, Err(TicketError::Timeout)),
                    "{answered:?}"
                );
                assert!(
                    asked.elapsed() < Duration::from_secs(2),
                    "answered, not left to time out"
                );
                drop(held);
                broker.close().await;
            });
        }
    };
}

/// The runtime of the tokio flavours: `run` blocks on a future, `spawn`
/// starts a task whose output is awaited, `yield_now` lets the others run.
mod on_tokio {
    use std::future::Future;

    pub fn run<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    }

    pub fn spawn<T: Send + 'static>(
        future: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> {
        let handle = tokio::spawn(future);
        async move { handle.await.expect("task panicked") }
    }

    pub async fn yield_now() {
        tokio::task::yield_now().await;
    }
}

/// The same three on smol.
mod on_smol {
    use std::future::Future;

    pub fn run<F: Future>(future: F) -> F::Output {
        smol::block_on(future)
    }

    pub fn spawn<T: Send + 'static>(
        future: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> {
        smol::spawn(future)
    }

    pub async fn yield_now() {
        smol::future::yield_now().await;
    }
}

/// The tokio daemon's driver listening on loopback.
async fn tokio_daemon(config: ServerConfig) -> ticketing_tokio::RunningServer {
    let mut settings = ticketing_tokio::ServeSettings::new("127.0.0.1:0".parse().unwrap());
    settings.server = config;
    ticketing_tokio::spawn_server(settings).await.unwrap()
}

/// An embedded server listening on loopback (optionally TLS).
fn embedded_listening(
    config: ServerConfig,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> ticketing_smol::EmbeddedServer {
    let mut builder = ticketing_smol::EmbeddedServer::builder()
        .server_config(config)
        .listen("127.0.0.1:0".parse().unwrap());
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder.start().unwrap()
}

/// An embedded server listening on loopback over TLS, with the CA its
/// clients are to trust.
struct EmbeddedTls {
    embedded: ticketing_smol::EmbeddedServer,
    ca: std::path::PathBuf,
}

impl EmbeddedTls {
    fn start(config: ServerConfig) -> Self {
        let (ca, tls) = tls_material("suite");
        EmbeddedTls {
            embedded: embedded_listening(config, Some(tls)),
            ca,
        }
    }
    fn stats(&self) -> ServerStats {
        self.embedded.stats()
    }
    async fn shutdown(self) {
        self.embedded.shutdown().await;
    }
}

/// Declares a flavour's `Fixture`: the server `start` brings up from a
/// config, and the client `broker` connects to it, asserted ready within the
/// bound given.
macro_rules! fixture {
    (
        server: $server:ty = |$config:ident| $start:expr,
        broker: $broker:ty = |$server_ref:ident| $connect:expr,
        ready within: $ready:expr $(,)?
    ) => {
        struct Fixture($server);

        impl Fixture {
            async fn start($config: ServerConfig) -> Self {
                Fixture($start)
            }
            async fn broker(&self) -> $broker {
                let $server_ref = &self.0;
                let broker: $broker = $connect;
                assert!(broker.wait_ready($ready).await);
                broker
            }
            fn stats(&self) -> ServerStats {
                self.0.stats()
            }
            async fn shutdown(self) {
                self.0.shutdown().await;
            }
        }
    };
}

/// Our tokio client → the tokio daemon's driver over TCP.
mod tokio_client_tokio_server {
    use ticketing_tokio::{RunningServer, TicketBroker};

    use super::on_tokio::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: RunningServer = |config| tokio_daemon(config).await,
        broker: TicketBroker = |server| {
            TicketBroker::connect_loopback([server.local_addr().to_string()])
        },
        ready within: READY,
    }

    suite!();
}

/// Our tokio client → the embedded server's smol driver over TCP.
mod tokio_client_embedded_tcp {
    use ticketing_smol::EmbeddedServer;
    use ticketing_tokio::TicketBroker;

    use super::on_tokio::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: EmbeddedServer = |config| embedded_listening(config, None),
        broker: TicketBroker = |server| {
            TicketBroker::connect_loopback([server.local_addr().unwrap().to_string()])
        },
        ready within: READY,
    }

    suite!();
}

/// The smol client → the embedded server's smol driver over TCP.
mod smol_client_embedded_tcp {
    use ticketing_smol::{EmbeddedServer, TicketBroker};

    use super::on_smol::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: EmbeddedServer = |config| embedded_listening(config, None),
        broker: TicketBroker = |server| {
            TicketBroker::connect_loopback([server.local_addr().unwrap().to_string()])
        },
        ready within: READY,
    }

    suite!();
}

/// The smol client → the tokio daemon's driver over TCP (on tokio, which
/// the daemon needs).
mod smol_client_tokio_server {
    use ticketing_smol::TicketBroker;
    use ticketing_tokio::RunningServer;

    use super::on_tokio::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: RunningServer = |config| tokio_daemon(config).await,
        broker: TicketBroker = |server| {
            TicketBroker::connect_loopback([server.local_addr().to_string()])
        },
        ready within: READY,
    }

    suite!();
}

/// The smol client → the embedded server over TLS (futures-rustls both ends).
mod smol_client_embedded_tls {
    use ticketing_smol::{TicketBroker, TlsMode};

    use super::on_smol::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: EmbeddedTls = |config| EmbeddedTls::start(config),
        broker: TicketBroker = |server| {
            TicketBroker::builder()
                .addrs([server.embedded.local_addr().unwrap().to_string()])
                .allow_loopback_no_auth()
                .tls(TlsMode::Ca(server.ca.clone()))
                .connect()
                .unwrap()
        },
        ready within: READY,
    }

    suite!();
}

/// The in-process handle → the embedded server, no sockets.
mod in_process {
    use ticketing_smol::{EmbeddedServer, TicketBroker};

    use super::on_smol::{run, spawn, yield_now};
    use super::*;

    fixture! {
        server: EmbeddedServer = |config| {
            EmbeddedServer::builder()
                .server_config(config)
                .start()
                .unwrap()
        },
        broker: TicketBroker = |server| server.broker(),
        // Ready at once: the in-memory handshake ran inside `broker()`.
        ready within: Duration::ZERO,
    }

    suite!();
}
