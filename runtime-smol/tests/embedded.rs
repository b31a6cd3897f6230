//! What only the embedded server has: in-process links (cancellation, many
//! brokers), sharing locks with TCP clients (ours and the published one),
//! authentication, and the end of in-process brokers at shutdown.

use std::time::{Duration, Instant};

use smol::future;
use ticketing_core::wire::ExtendStatus;
use ticketing_smol::{EmbeddedServer, ReleaseOutcome, TicketBroker, TicketError};

const WAIT: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(30);
const BUDGET: Duration = Duration::from_secs(1);
const TOKEN: &str = "embedded-test-token-0123456789";

/// Yields until `done` holds; panics after 5 s. The server offers no event
/// for its counts.
async fn settle(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never saw {what}"
        );
        future::yield_now().await;
    }
}

#[test]
fn a_cancelled_queued_acquire_leaves_the_queue_and_service_goes_on() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let broker = server.broker();
        let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        // Give up on a queued acquire by dropping its future.
        let gave_up = future::or(
            async { Some(broker.acquire("k", WAIT, LEASE, BUDGET).await) },
            async {
                settle("the waiter queued", || server.stats().lock.waiters == 1).await;
                None
            },
        )
        .await;
        assert!(gave_up.is_none());
        // Its bytes had left: the link closed (as a TCP connection would),
        // which took the waiter out of the queue.
        settle("the waiter gone", || server.stats().lock.waiters == 0).await;
        // The other link serves meanwhile, and the link comes back.
        let other = broker
            .acquire("other", Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert_eq!(other.release().await.unwrap(), ReleaseOutcome::Released);
        settle("both links back", || server.stats().connections == 2).await;
        // The key was not handed to the departed waiter.
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let next = broker
            .acquire("k", Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
        broker.close().await;
        server.shutdown().await;
    });
}

#[test]
fn separate_in_process_brokers_hand_over_to_each_other() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let first = server.broker();
        let second = server.broker();
        let held = first.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        let blocked = second.acquire("k", Duration::ZERO, LEASE, BUDGET).await;
        assert!(matches!(blocked, Err(TicketError::Timeout)), "{blocked:?}");
        let waiter = {
            let second = second.clone();
            smol::spawn(async move { second.acquire("k", WAIT, LEASE, BUDGET).await })
        };
        settle("the waiter queued", || server.stats().lock.waiters == 1).await;
        let released_at = Instant::now();
        let first_token = held.token();
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let next = waiter.await.unwrap();
        assert!(released_at.elapsed() < Duration::from_secs(1));
        assert!(next.token() > first_token);
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
        first.close().await;
        second.close().await;
        server.shutdown().await;
    });
}

#[test]
fn in_process_and_published_tcp_clients_share_the_locks() {
    let server = EmbeddedServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let local = server.broker();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let remote = ticketing::TicketBroker::connect_loopback([addr]);
        assert!(remote.wait_ready(Duration::from_secs(5)).await);

        let held = local.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        let blocked = remote.acquire("k", Duration::ZERO, LEASE, BUDGET).await;
        assert!(
            matches!(blocked, Err(ticketing::TicketError::Timeout)),
            "{blocked:?}"
        );
        let remote_waiter = {
            let remote = remote.clone();
            tokio::spawn(async move { remote.acquire("k", WAIT, LEASE, BUDGET).await })
        };
        settle("the remote waiter queued", || {
            server.stats().lock.waiters == 1
        })
        .await;
        let local_token = held.token();
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let remote_ticket = remote_waiter.await.unwrap().unwrap();
        assert!(remote_ticket.token() > local_token);
        let blocked = local.acquire("k", Duration::ZERO, LEASE, BUDGET).await;
        assert!(matches!(blocked, Err(TicketError::Timeout)), "{blocked:?}");
        remote_ticket.release().await.unwrap();
        let again = local
            .acquire("k", Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert!(again.token() > local_token);
        assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
        remote.close().await;
    });
    smol::block_on(async {
        local.close().await;
        server.shutdown().await;
    });
}

#[test]
fn tokens_guard_the_listener_and_in_process_brokers_use_the_first() {
    smol::block_on(async {
        let server = EmbeddedServer::builder()
            .client_tokens([TOKEN])
            .listen("127.0.0.1:0".parse().unwrap())
            .start()
            .unwrap();
        let addr = server.local_addr().unwrap().to_string();

        let local = server.broker();
        let ticket = local.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);

        let wrong = TicketBroker::builder()
            .addrs([addr.clone()])
            .token("not-the-right-token-at-all")
            .connect()
            .unwrap();
        assert!(!wrong.wait_ready(Duration::from_secs(5)).await);
        assert!(wrong.auth_failed());

        let right = TicketBroker::builder()
            .addrs([addr])
            .token(TOKEN)
            .connect()
            .unwrap();
        assert!(right.wait_ready(Duration::from_secs(5)).await);
        let ticket = right.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);

        wrong.close().await;
        right.close().await;
        local.close().await;
        server.shutdown().await;
    });
}

#[test]
fn a_listener_beyond_loopback_needs_tokens() {
    let refused = EmbeddedServer::builder()
        .listen("0.0.0.0:0".parse().unwrap())
        .start();
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::InvalidInput)
    );
    let short = EmbeddedServer::builder().client_tokens(["short"]).start();
    assert_eq!(
        short.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::InvalidInput)
    );
}

#[test]
fn in_process_brokers_fail_fast_once_the_server_is_gone() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let broker = server.broker();
        let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        server.shutdown().await;
        let asked = Instant::now();
        let after = broker.acquire("k", WAIT, LEASE, BUDGET).await;
        assert!(matches!(after, Err(TicketError::Closed)), "{after:?}");
        let release = held.release().await;
        assert!(matches!(release, Err(TicketError::Closed)), "{release:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "not retried until a deadline"
        );
        broker.close().await;
    });
}

#[test]
fn a_ticket_held_by_a_closed_broker_is_released_by_close() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let broker = server.broker();
        let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        drop(ticket);
        drop(broker); // the last handle: closes in the background
        settle("the links closed", || server.stats().connections == 0).await;
        assert_eq!(server.stats().lock.held_keys, 0);
        server.shutdown().await;
    });
}

/// A fresh folder for a state directory, removed on drop.
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("ticketing-smol-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        StateDir(path)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn with_a_state_dir_tokens_start_above_the_stored_reserve() {
    use ticketing_core::reserve::{decode_floor_file, encode_floor_file};
    smol::block_on(async {
        let dir = StateDir::new("floor");
        std::fs::create_dir_all(&dir.0).unwrap();
        // What a run whose clock was an hour ahead stored.
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let stored = wall_us + 3_600_000_000;
        let file = dir.0.join("embedded.floor");
        std::fs::write(&file, encode_floor_file(stored)).unwrap();

        let server = EmbeddedServer::builder().state_dir(&dir.0).start().unwrap();
        // One server per file: a second one is refused, naming the field.
        let second = EmbeddedServer::builder().state_dir(&dir.0).start();
        let err = second.expect_err("the file is locked");
        assert!(err.to_string().starts_with("state_dir: "), "{err}");
        let broker = server.broker();
        let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        assert_eq!(ticket.token(), stored + 1);
        // The next reserve is durable before the token was handed out.
        let durable = decode_floor_file(&std::fs::read(&file).unwrap()).unwrap();
        assert!(durable >= ticket.token(), "{durable} < {}", ticket.token());
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
        broker.close().await;
        server.shutdown().await;

        // A damaged file stops the start instead of resetting the floor.
        std::fs::write(&file, b"garbage\n").unwrap();
        let err = EmbeddedServer::builder()
            .state_dir(&dir.0)
            .start()
            .expect_err("a damaged file is refused");
        let message = err.to_string();
        assert!(message.contains("embedded.floor: not a"), "{message}");
    });
}

/// A line-dialect (0.3.0) client on a blocking socket: handshake, then
/// whole reply lines.
struct LineClient {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl LineClient {
    fn connect(addr: &str) -> LineClient {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = Vec::new();
        while !buf.contains(&b'\n') {
            let mut chunk = [0u8; 64];
            let n = stream.read(&mut chunk).unwrap();
            assert!(n > 0, "closed before the challenge");
            buf.extend_from_slice(&chunk[..n]);
        }
        let lf = buf.iter().position(|&b| b == b'\n').unwrap();
        let space = buf.iter().position(|&b| b == b' ').unwrap();
        let mut answer = ticketing_core::line::line_answer(b"", &buf[space + 1..lf]).to_vec();
        answer.push(b'\n');
        stream.write_all(&answer).unwrap();
        buf.drain(..=lf);
        LineClient { stream, buf }
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.write_all(bytes).unwrap();
    }

    /// The next reply as (op, first number, tail).
    fn reply(&mut self) -> (u8, u64, Vec<u8>) {
        use std::io::Read;
        use ticketing_core::line::LineReply;
        loop {
            if let Some((reply, used)) = LineReply::decode(&self.buf).unwrap() {
                let entry = match reply {
                    LineReply::Acquired { token, key, .. } => (b'A', token, key.to_vec()),
                    LineReply::TimedOut { owner, key } | LineReply::Busy { owner, key } => {
                        (reply.op(), owner, key.to_vec())
                    }
                    LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                        (reply.op(), token, key.to_vec())
                    }
                    LineReply::Moved { address }
                    | LineReply::Leader { address }
                    | LineReply::Error { reason: address } => (reply.op(), 0, address.to_vec()),
                };
                self.buf.drain(..used);
                return entry;
            }
            let mut chunk = [0u8; 256];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "closed while a reply was awaited");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[test]
fn a_line_client_on_the_tcp_port_contends_with_in_process_brokers() {
    use ticketing_core::line::{encode_line_acquire, encode_line_release};
    let server = EmbeddedServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let local = server.broker();
    smol::block_on(async {
        let held = local.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        let local_token = held.token();
        let waiter = std::thread::spawn(move || {
            let mut line = LineClient::connect(&addr);
            let mut frame = Vec::new();
            encode_line_acquire(&mut frame, 5, 30, 0x0A0A, b"k");
            line.send(&frame);
            let (op, token, key) = line.reply();
            assert_eq!((op, key.as_slice()), (b'A', &b"k"[..]), "a grant");
            let mut frame = Vec::new();
            encode_line_release(&mut frame, token, b"k");
            line.send(&frame);
            assert_eq!(line.reply(), (b'R', token, b"k".to_vec()));
            token
        });
        settle("the line waiter queued", || {
            server.stats().lock.waiters == 1
        })
        .await;
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let line_token = waiter.join().unwrap();
        assert!(line_token > local_token, "one token counter for both");
        let again = local
            .acquire("k", Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert!(again.token() > line_token);
        assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
        local.close().await;
        server.shutdown().await;
    });
}

#[test]
fn inspection_and_force_release_through_the_embedded_api() {
    use ticketing_core::inspect::{ForceReleaseOutcome, ListingCursor};
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let holder = server.broker();
        let waiter = server.broker();
        let held = holder.acquire("jobs/1", WAIT, LEASE, BUDGET).await.unwrap();
        // The broker comes back with its ticket: dropping it would close
        // the ticket's link.
        let queued = smol::spawn(async move {
            let ticket = waiter
                .acquire("jobs/1", Duration::from_secs(30), LEASE, BUDGET)
                .await;
            (waiter, ticket)
        });
        settle("the waiter queued", || server.stats().lock.waiters == 1).await;

        let view = server.lock("jobs/1").unwrap().expect("held");
        let holder_view = view.holder.as_ref().unwrap();
        assert_eq!(holder_view.token, held.token());
        assert!(holder_view.lease_remaining_ms <= 30_000);
        assert!(holder_view.conn.is_some(), "the in-process link");
        assert_eq!(view.waiters_total, 1);
        assert_eq!(server.lock("jobs/2").unwrap(), None);
        assert!(server.lock("bad key").is_err(), "a space is not allowed");
        let listing = server.locks("jobs/", 10, ListingCursor::START);
        assert_eq!(listing.locks.len(), 1);
        assert_eq!(listing.next, None, "a small table is one page");
        assert_eq!(listing.locks[0].key.as_str(), "jobs/1");

        assert_eq!(
            server
                .force_release("jobs/1", Some(held.token() + 1))
                .unwrap(),
            ForceReleaseOutcome::TokenMismatch { held: held.token() }
        );
        let outcome = server.force_release("jobs/1", None).unwrap();
        let (_waiter, next) = queued.await;
        let next = next.unwrap();
        assert!(next.token() > held.token());
        assert_eq!(
            outcome,
            ForceReleaseOutcome::Released {
                revoked: held.token(),
                keys: vec![ticketing_core::wire::Key::new(b"jobs/1").unwrap()],
                handed_to: Some(next.token()),
            }
        );
        // The release is the server's latest event, as the core recorded it.
        let events = server.recent_events();
        assert_eq!(
            events.first().map(|view| &view.event),
            Some(&ticketing_core::events::Event::ForceReleased {
                revoked: held.token(),
                keys: vec![ticketing_core::wire::Key::new(b"jobs/1").unwrap()],
                handed_to: Some(next.token()),
            }),
            "{events:?}"
        );
        // The old holder is fenced: its release finds its token gone.
        assert_eq!(
            held.release().await.unwrap(),
            ReleaseOutcome::AlreadyGoneOrNotCurrent
        );
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(
            server.force_release("jobs/1", None).unwrap(),
            ForceReleaseOutcome::NotHeld
        );
        server.shutdown().await;
    });
}

#[test]
fn concurrent_requests_on_one_in_process_broker_each_get_their_own_outcome() {
    // Outcomes answered within the submit and outcomes that wait in a queue
    // share the broker's reply slots: a grant handed to the wrong request
    // shows as a ticket whose token is not its key's holder.
    const TASKS: usize = 12;
    const KEYS: usize = 3;
    const TURNS: usize = 30;
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let broker = server.broker();
        let executor = smol::LocalExecutor::new();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (server, broker) = (&server, &broker);
                executor.spawn(async move {
                    let key = format!("slots/{}", task % KEYS);
                    let mut queued_turns = 0;
                    for _ in 0..TURNS {
                        let queued = server.lock(&key).unwrap().is_some();
                        let ticket = broker.acquire(&key, WAIT, LEASE, BUDGET).await.unwrap();
                        let view = server.lock(&key).unwrap().expect("held");
                        assert_eq!(view.holder.unwrap().token, ticket.token());
                        queued_turns += usize::from(queued);
                        // Held across a yield, so the key's other tasks queue.
                        future::yield_now().await;
                        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
                    }
                    queued_turns
                })
            })
            .collect();
        let queued_turns: usize = executor
            .run(async {
                let mut queued = 0;
                for task in tasks {
                    queued += task.await;
                }
                queued
            })
            .await;
        assert!(queued_turns > 0, "some turns waited in a queue");
        assert_eq!(server.stats().lock.waiters, 0);
        drop(executor);
        broker.close().await;
        server.shutdown().await;
    });
}

#[test]
fn tickets_renew_in_process_and_over_tcp() {
    smol::block_on(async {
        let server = EmbeddedServer::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .start()
            .unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let local = server.broker();
        let rival = server.broker();
        let remote = TicketBroker::connect_loopback([addr]);
        assert!(remote.wait_ready(Duration::from_secs(5)).await);

        // In process: lease 2 s, renewed to 10 s, outlives the first lease.
        let ticket = local
            .acquire("renewed", WAIT, Duration::from_secs(2), Duration::ZERO)
            .await
            .unwrap();
        let token = ticket.token();
        let extended = ticket.extend(Duration::from_secs(10)).await.unwrap();
        assert_eq!(extended.status(), ExtendStatus::Extended);
        assert!(extended.deadline() <= Instant::now() + Duration::from_secs(10));
        assert_eq!(ticket.conservative_valid_before(), extended.deadline());
        smol::Timer::after(Duration::from_secs(5)).await;
        let refused = rival
            .acquire("renewed", Duration::ZERO, LEASE, Duration::ZERO)
            .await;
        assert!(matches!(refused, Err(TicketError::Timeout)), "{refused:?}");
        assert_eq!(ticket.token(), token);

        // Over TCP: renew a set; then an operator force-releases it and
        // the next renewal finds it lost, for good.
        let set = remote
            .acquire_set(&["a", "b"], WAIT, LEASE, BUDGET)
            .await
            .unwrap();
        let extended = set.extend(Duration::from_secs(60)).await.unwrap();
        assert_eq!(extended.status(), ExtendStatus::Extended);
        assert!(set.remaining() > LEASE);
        server.force_release("a", None).unwrap();
        assert_eq!(
            set.extend(Duration::from_secs(60)).await.unwrap_err(),
            TicketError::Lost
        );
        assert!(set.is_lost());
        assert_eq!(set.remaining(), Duration::ZERO);
        assert_eq!(
            set.release().await.unwrap(),
            ReleaseOutcome::AlreadyGoneOrNotCurrent
        );
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);

        local.close().await;
        rival.close().await;
        remote.close().await;
        server.shutdown().await;
    });
}

#[test]
fn a_broker_label_shows_with_its_connection_in_inspection() {
    smol::block_on(async {
        let server = EmbeddedServer::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .start()
            .unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let invalid = TicketBroker::builder()
            .addrs([addr.clone()])
            .allow_loopback_no_auth()
            .label("a".repeat(65))
            .connect();
        assert!(matches!(invalid, Err(TicketError::InvalidInput(_))));
        let remote = TicketBroker::builder()
            .addrs([addr])
            .allow_loopback_no_auth()
            .label("host-1/4242/reprice")
            .connect()
            .unwrap();
        assert!(remote.wait_ready(Duration::from_secs(5)).await);
        let ticket = remote
            .acquire("labelled", WAIT, LEASE, BUDGET)
            .await
            .unwrap();
        let view = server.lock("labelled").unwrap().expect("held");
        let conn = view.holder.unwrap().conn.expect("a TCP connection");
        assert_eq!(conn.label.as_deref(), Some("host-1/4242/reprice"));
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
        remote.close().await;
        server.shutdown().await;
    });
}

#[test]
fn in_process_brokers_share_a_semaphore_in_fifo_order() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let first = server.broker();
        let second = server.broker();
        let both = first
            .acquire_permits("workers", 2, 2, Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert_eq!(both.slots(), [0, 1]);
        assert_eq!(both.free_at_grant(), Some(0));
        let full = second
            .acquire_permits("workers", 1, 2, Duration::ZERO, LEASE, BUDGET)
            .await;
        assert!(matches!(full, Err(TicketError::Timeout)), "{full:?}");
        let waiter = {
            let second = second.clone();
            smol::spawn(async move {
                second
                    .acquire_permits("workers", 1, 2, WAIT, LEASE, BUDGET)
                    .await
            })
        };
        settle("the request queued", || server.stats().permit_waiters == 1).await;
        let first_token = both.token();
        assert_eq!(both.release().await.unwrap(), ReleaseOutcome::Released);
        let next = waiter.await.unwrap();
        assert_eq!(next.slots(), [0]);
        assert!(next.token() > first_token);
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
        first.close().await;
        second.close().await;
        server.shutdown().await;
    });
}

#[test]
fn in_process_brokers_share_a_key_and_a_downgrade_lets_the_queued_reader_in() {
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let [writer, reader, other] = [(); 3].map(|()| server.broker());
        let exclusive = writer
            .acquire("doc", Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        let queued = {
            let reader = reader.clone();
            smol::spawn(async move { reader.acquire_shared("doc", WAIT, LEASE, BUDGET).await })
        };
        settle("the reader queued", || server.stats().lock.waiters == 1).await;
        // Same token, same place: the reader queued behind joins at once.
        exclusive.downgrade().await.unwrap();
        let shared = queued.await.unwrap();
        assert!(shared.token() > exclusive.token());
        let view = server.lock("doc").unwrap().expect("held");
        let tokens: Vec<u64> = view.sharers.iter().map(|s| s.token).collect();
        assert_eq!(tokens, [exclusive.token(), shared.token()]);
        // A writer cannot get in beside them.
        let busy = other.acquire("doc", Duration::ZERO, LEASE, BUDGET).await;
        assert!(matches!(busy, Err(TicketError::Timeout)), "{busy:?}");
        // A set mixing modes: `doc` shared beside them, `log` exclusive.
        let mixed = other
            .acquire_set_modes(&["log"], &["doc"], Duration::ZERO, LEASE, BUDGET)
            .await
            .unwrap();
        assert_eq!(mixed.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(shared.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(exclusive.release().await.unwrap(), ReleaseOutcome::Released);
        for broker in [writer, reader, other] {
            broker.close().await;
        }
        server.shutdown().await;
    });
}

#[test]
fn a_campaign_over_tcp_leads_under_its_label_and_a_resign_hands_over_to_an_in_process_candidate() {
    smol::block_on(async {
        let server = EmbeddedServer::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .start()
            .unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let remote = TicketBroker::builder()
            .addrs([addr])
            .allow_loopback_no_auth()
            .label("scheduler-a")
            .connect()
            .unwrap();
        assert!(remote.wait_ready(Duration::from_secs(5)).await);
        let local = server.broker();
        assert_eq!(local.observe("leader").await.unwrap(), None);
        let first = remote.campaign("leader", LEASE).await.unwrap();
        let leader = local.observe("leader").await.unwrap().expect("a leader");
        assert_eq!(
            (leader.label.as_str(), leader.term, leader.connected),
            ("scheduler-a", first.token(), true)
        );
        let candidate = {
            let local = local.clone();
            smol::spawn(async move { local.campaign("leader", LEASE).await })
        };
        settle("the candidate queued", || server.stats().lock.waiters == 1).await;
        let first_term = first.token();
        assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
        let second = candidate.await.unwrap();
        assert!(second.token() > first_term);
        // An in-process broker negotiates no label: none is reported.
        let leader = remote.observe("leader").await.unwrap().expect("a leader");
        assert_eq!((leader.label.as_str(), leader.term), ("", second.token()));
        // A lease a third of which cannot be a whole round is refused.
        let short = local.campaign("other", Duration::from_secs(2)).await;
        assert!(
            matches!(short, Err(TicketError::InvalidInput(_))),
            "{short:?}"
        );
        assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
        remote.close().await;
        local.close().await;
        server.shutdown().await;
    });
}
