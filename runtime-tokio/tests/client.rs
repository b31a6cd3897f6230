//! Our tokio client (`ticketing_tokio::client`) against our in-process
//! server, and side by side with the published `ticketing` 0.4.0 client.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::certs::make_certs;
use common::{
    BUDGET, LEASE, READY, TOKEN, loopback_server, loopback_settings, ours_loopback,
    ours_with_token, published_loopback, wait_for_waiters,
};
use ticketing_core::auth::ClientTokens;
use ticketing_core::client::X_CLOSES_MAX;
use ticketing_core::wire::ExtendStatus;
use ticketing_tokio::client::{ReleaseOutcome, TicketBroker, TicketError, TlsMode};
use ticketing_tokio::spawn_server;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert_eq!(ticket.key(), "k");
    assert_eq!(server.stats().lock.held_keys, 1);
    // Conservative validity: never more than the lease from now.
    assert!(ticket.remaining() <= LEASE);
    assert!(ticket.remaining() > LEASE - Duration::from_secs(5));
    assert!(ticket.conservative_valid_before() <= Instant::now() + LEASE);
    let first_token = ticket.token();
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(server.stats().lock.held_keys, 0);

    let again = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert!(again.token() > first_token);
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_lapsed_ticket_reports_not_current() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;
    let other = ours_loopback(&server).await;

    let stale = broker
        .acquire("k", WAIT, Duration::from_secs(1), Duration::ZERO)
        .await
        .unwrap();
    // The lease lapses and another client takes the key over.
    let current = other
        .acquire("k", WAIT, LEASE, BUDGET)
        .await
        .expect("the key is handed over at lease expiry");
    assert!(current.token() > stale.token());
    assert_eq!(
        stale.release().await.unwrap(),
        ReleaseOutcome::AlreadyGoneOrNotCurrent
    );
    assert_eq!(current.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    other.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_answers_busy_at_once() {
    let mut settings = loopback_settings();
    settings.server.lock.limits.keys_max = 1;
    let server = spawn_server(settings).await.unwrap();
    let broker = ours_loopback(&server).await;

    let held = broker.acquire("a", WAIT, LEASE, BUDGET).await.unwrap();
    let asked = Instant::now();
    let result = broker.acquire("b", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Busy)), "{result:?}");
    // Busy is definite and not retried internally.
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert_eq!(server.stats().lock.waiters, 0);
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_times_out() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let held = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    let immediate = broker.acquire("k", Duration::ZERO, LEASE, BUDGET).await;
    assert!(
        matches!(immediate, Err(TicketError::Timeout)),
        "{immediate:?}"
    );

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
    assert_eq!(server.stats().lock.waiters, 0);
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_out_of_range_are_rejected_before_sending() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let lease = broker
        .acquire("k", WAIT, Duration::from_secs(251), BUDGET)
        .await;
    assert!(
        matches!(
            lease,
            Err(TicketError::UnsupportedDuration { field: "lease", .. })
        ),
        "{lease:?}"
    );
    let wait = broker
        .acquire("k", Duration::from_secs(256), LEASE, BUDGET)
        .await;
    assert!(
        matches!(
            wait,
            Err(TicketError::UnsupportedDuration { field: "wait", .. })
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
    // Nothing reached the server.
    assert_eq!(server.stats().lock.keys, 0);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_cannot_cover_the_budget_is_released() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    // Budget = lease: any time between send and reply leaves less than the
    // budget, so the grant is refused and must be released (not left to its
    // 30 s lease).
    let refused = broker.acquire("k", WAIT, LEASE, LEASE).await;
    assert!(
        matches!(refused, Err(TicketError::InsufficientLease)),
        "{refused:?}"
    );
    let asked = Instant::now();
    let next = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert!(asked.elapsed() < WAIT);
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_sets_are_held_and_released_together() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let set = broker
        .acquire_set(&["b", "a", "b"], WAIT, LEASE, BUDGET)
        .await
        .unwrap();
    assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(server.stats().lock.held_keys, 2);
    for key in ["a", "b"] {
        let result = broker.acquire(key, Duration::ZERO, LEASE, BUDGET).await;
        assert!(matches!(result, Err(TicketError::Timeout)), "{result:?}");
    }
    assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(server.stats().lock.held_keys, 0);
    let a = broker
        .acquire("a", Duration::ZERO, LEASE, BUDGET)
        .await
        .unwrap();
    assert_eq!(a.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_ticket_releases_it() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;
    let other = ours_loopback(&server).await;

    let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    drop(ticket);
    let asked = Instant::now();
    let next = other.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    // Far below the 30 s lease: the drop released it.
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    other.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_finishes_background_releases_then_refuses_work() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let tickets = [
        broker.acquire("a", WAIT, LEASE, BUDGET).await.unwrap(),
        broker.acquire("b", WAIT, LEASE, BUDGET).await.unwrap(),
    ];
    drop(tickets);
    broker.close().await;
    assert_eq!(server.stats().lock.held_keys, 0);
    let after = broker.acquire("a", WAIT, LEASE, BUDGET).await;
    assert!(matches!(after, Err(TicketError::Closed)), "{after:?}");
    assert!(!broker.wait_ready(Duration::from_millis(10)).await);

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_no_waiter_and_the_broker_heals() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;
    let holder = ours_loopback(&server).await;

    let held = holder.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    {
        let acquire = broker.acquire("k", WAIT, LEASE, BUDGET);
        tokio::pin!(acquire);
        tokio::select! {
            result = &mut acquire => panic!("acquire of a held key ended: {result:?}"),
            () = wait_for_waiters(&server, 1) => {}
        }
        // Dropping the future now, after its bytes left, closes that
        // connection; the server drops the connection's waiter.
    }
    wait_for_waiters(&server, 0).await;
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(broker.wait_ready(READY).await);
    let next = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    holder.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_served_in_arrival_order() {
    const WAITERS: usize = 16;
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let holder = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for index in 0..WAITERS {
        let broker = broker.clone();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let ticket = broker
                .acquire("k", Duration::from_secs(30), LEASE, BUDGET)
                .await
                .unwrap();
            order.lock().unwrap().push(index);
            assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
        }));
        // Arrival order is what the test fixes: the next waiter is started
        // only once this one is queued.
        wait_for_waiters(&server, index + 1).await;
    }
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());

    broker.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn our_client_and_the_published_client_exclude_each_other() {
    const ROUNDS: usize = 40;
    const TASKS_PER_CLIENT: usize = 4;
    let server = loopback_server().await;
    let ours = ours_loopback(&server).await;
    let theirs = published_loopback(&server).await;

    let inside = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS_PER_CLIENT {
        let (broker, flag, seen) = (ours.clone(), Arc::clone(&inside), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let ticket = broker.acquire("shared", WAIT, LEASE, BUDGET).await.unwrap();
                assert!(!flag.swap(true, Ordering::SeqCst), "overlap");
                seen.lock().unwrap().push(ticket.token());
                tokio::task::yield_now().await;
                flag.store(false, Ordering::SeqCst);
                assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
            }
        }));
        let (broker, flag, seen) = (theirs.clone(), Arc::clone(&inside), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let ticket = broker.acquire("shared", WAIT, LEASE, BUDGET).await.unwrap();
                assert!(!flag.swap(true, Ordering::SeqCst), "overlap");
                seen.lock().unwrap().push(ticket.token());
                tokio::task::yield_now().await;
                flag.store(false, Ordering::SeqCst);
                assert_eq!(
                    ticket.release().await.unwrap(),
                    ticketing::ReleaseOutcome::Released
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Tokens were recorded inside the critical section, so in grant order.
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 2 * TASKS_PER_CLIENT * ROUNDS);
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]));

    ours.close().await;
    theirs.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_fails_authentication() {
    let mut settings = loopback_settings();
    settings.server.client_tokens = ClientTokens::new([TOKEN]).unwrap();
    let server = spawn_server(settings).await.unwrap();

    let good = ours_with_token(&server, TOKEN).connect().unwrap();
    assert!(good.wait_ready(READY).await);
    let ticket = good.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);

    let bad = ours_with_token(&server, "another-token-0123456789")
        .connect()
        .unwrap();
    assert!(!bad.wait_ready(READY).await);
    assert!(bad.auth_failed());
    let result = bad.acquire("k", WAIT, LEASE, BUDGET).await;
    assert!(matches!(result, Err(TicketError::Auth)), "{result:?}");

    good.close().await;
    bad.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_builder_rejects_bad_configurations() {
    let cases = [
        (TicketBroker::builder(), "no address"),
        (
            TicketBroker::builder().addrs(["127.0.0.1:5225"]),
            "no token without loopback no-auth",
        ),
        (
            TicketBroker::builder()
                .addrs(["127.0.0.1:5225"])
                .token("short"),
            "short token",
        ),
        (
            TicketBroker::builder()
                .addrs(["10.0.0.1:5225"])
                .allow_loopback_no_auth(),
            "no-auth to a non-loopback address",
        ),
        (
            TicketBroker::builder()
                .addrs(["127.0.0.1:5225"])
                .token(TOKEN)
                .max_pending(0),
            "max_pending 0",
        ),
        (
            TicketBroker::builder()
                .addrs(["127.0.0.1:5225", "127.0.0.1:5226"])
                .token(TOKEN),
            "two addresses in single mode",
        ),
    ];
    for (builder, case) in cases {
        let result = builder.connect();
        assert!(
            matches!(result, Err(TicketError::InvalidInput(_))),
            "{case}: {result:?}"
        );
    }
    let missing_ca = TicketBroker::builder()
        .addrs(["127.0.0.1:5225"])
        .token(TOKEN)
        .tls(TlsMode::Ca("/nonexistent/ca.pem".into()))
        .connect();
    assert!(
        matches!(missing_ca, Err(TicketError::Io { .. })),
        "{missing_ca:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file_or_without_verification() {
    let (dir, ca, cert, key) = make_certs("client-tls");
    let mut settings = loopback_settings();
    settings.tls = Some(ticketing_tokio::tls::load_server_config(&cert, &key).unwrap());
    settings.server.client_tokens = ClientTokens::new([TOKEN]).unwrap();
    let server = spawn_server(settings).await.unwrap();

    for mode in [TlsMode::Ca(ca.clone()), TlsMode::InsecureSkipVerify] {
        let broker = ours_with_token(&server, TOKEN)
            .tls(mode.clone())
            .connect()
            .unwrap();
        assert!(broker.wait_ready(READY).await, "{mode:?}");
        let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
        broker.close().await;
    }

    // A CA that did not sign the server's certificate never gets ready.
    let (other_dir, other_ca, _, _) = make_certs("client-tls-other");
    let untrusted = ours_with_token(&server, TOKEN)
        .tls(TlsMode::Ca(other_ca))
        .connect()
        .unwrap();
    assert!(!untrusted.wait_ready(Duration::from_millis(500)).await);
    untrusted.close().await;

    // Plain TCP against a TLS server never gets ready either.
    let plain = ours_with_token(&server, TOKEN).connect().unwrap();
    assert!(!plain.wait_ready(Duration::from_millis(500)).await);
    plain.close().await;

    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(other_dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_token_and_outlives_the_first_lease() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;
    let rival = ours_loopback(&server).await;

    let ticket = broker
        .acquire("renewed", WAIT, Duration::from_secs(2), Duration::ZERO)
        .await
        .unwrap();
    let token = ticket.token();
    let before = Instant::now();
    let extended = ticket.extend(Duration::from_secs(10)).await.unwrap();
    assert_eq!(extended.status(), ExtendStatus::Extended);
    // Conservative: no later than 10 s from just before the call, and the
    // ticket moved to it.
    assert!(extended.deadline() <= Instant::now() + Duration::from_secs(10));
    assert!(extended.deadline() >= before + Duration::from_secs(9));
    assert_eq!(ticket.conservative_valid_before(), extended.deadline());
    assert!(ticket.remaining() > Duration::from_secs(8));

    // Past the first lease (2 s), the renewed grant still holds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = rival
        .acquire("renewed", Duration::ZERO, LEASE, Duration::ZERO)
        .await;
    assert_eq!(refused.unwrap_err(), TicketError::Timeout);
    assert_eq!(ticket.token(), token);
    assert!(!ticket.is_lost());
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);

    broker.close().await;
    rival.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_released_grant_reports_it_lost() {
    let server = loopback_server().await;
    let broker = ours_loopback(&server).await;

    let set = broker
        .acquire_set(&["a", "b"], WAIT, LEASE, BUDGET)
        .await
        .unwrap();
    let extended = set.extend(Duration::from_secs(20)).await.unwrap();
    assert_eq!(extended.status(), ExtendStatus::Extended);
    assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);

    // A grant that is gone (here its 1 s lease ended) is not renewed: N.
    let short = broker
        .acquire("d", WAIT, Duration::from_secs(1), Duration::ZERO)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        short.extend(Duration::from_secs(10)).await.unwrap_err(),
        TicketError::Lost
    );
    assert!(short.is_lost());
    assert_eq!(short.remaining(), Duration::ZERO);
    // Never resurrected; the release stays harmless.
    assert_eq!(
        short.extend(Duration::from_secs(10)).await.unwrap_err(),
        TicketError::Lost
    );
    // (The server answers a release of a lapsed grant nobody took over
    // with R, as before renewals existed.)
    assert!(short.release().await.is_ok());

    broker.close().await;
    server.shutdown().await;
}

/// Plays a server that speaks only the published protocol in front of
/// `server`: bytes pass both ways, except that a connection whose first
/// frame after the proof is our `X` is closed, as an unknown op closes it
/// there. Returns its address and the count of connections it closed so.
async fn published_only_proxy(
    server: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed_on_x = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&closed_on_x);
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let upstream = tokio::net::TcpStream::connect(server).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut up_read, mut up_write) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut up_read, &mut client_write).await;
                });
                // The proof passes (the server answers it), then the first
                // frame's op is looked at.
                let mut proof = [0u8; ticketing_core::auth::PROOF_LEN];
                let mut op = [0u8; 1];
                if client_read.read_exact(&mut proof).await.is_err()
                    || up_write.write_all(&proof).await.is_err()
                    || client_read.read_exact(&mut op).await.is_err()
                {
                    return;
                }
                if op[0] == b'X' {
                    counter.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                let _ = up_write.write_all(&op).await;
                let _ = tokio::io::copy(&mut client_read, &mut up_write).await;
            });
        }
    });
    (addr, closed_on_x)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_published_protocol_server_the_broker_falls_back_and_refuses_renewal() {
    let server = loopback_server().await;
    let (proxy, closed_on_x) = published_only_proxy(server.local_addr()).await;
    let broker = TicketBroker::connect_loopback([proxy.to_string()]);
    assert!(broker.wait_ready(READY).await, "ready without extensions");

    let ticket = broker.acquire("k", WAIT, LEASE, BUDGET).await.unwrap();
    assert!(matches!(
        ticket.extend(Duration::from_secs(60)).await,
        Err(TicketError::Unsupported(_))
    ));
    assert!(!ticket.is_lost());
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    // The connection that became ready tried X X_CLOSES_MAX times (one
    // close alone could be a reset), then remembered; the other one at
    // most as often.
    let tried = closed_on_x.load(Ordering::SeqCst);
    let most = usize::from(X_CLOSES_MAX);
    assert!((most..=2 * most).contains(&tried), "{tried}");

    broker.close().await;
    server.shutdown().await;
}
