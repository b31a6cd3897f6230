//! Attacks on the admin port of a real `ticketing serve` process, by a
//! local user without any token: none may reach the lock service.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::admin::{Single, http_request_as};
use common::cluster::poll;
use common::raw::{Raw, acquire, release};
use ticketing_core::auth::ClientHandshakeStatus;
use ticketing_core::wire::Reply;

/// `GET path` with `Host: host`: the status code and the body.
fn get(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
    http_request_as(host, addr, "GET", path, None).map(|(status, _, body)| (status, body))
}

/// The value of the sample line `series` in a metrics text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.trim().parse().ok()
    })
}

/// A lock client's whole first exchange: connect, handshake, acquire and
/// release; `true` when all of it is done within one second.
async fn lock_client_gets_in(addr: SocketAddr, n: u64) -> bool {
    tokio::time::timeout(Duration::from_secs(1), async {
        let (mut raw, status) = Raw::try_connect_to(addr, b"").await;
        assert_eq!(status, ClientHandshakeStatus::Accepted);
        let key = format!("k{n}");
        raw.send(&acquire(1, &key, 0, 10)).await;
        let Reply::Acquired { token, .. } = raw.reply().await else {
            panic!("the acquire of a free key is granted");
        };
        raw.send(&release(2, &key, token)).await;
        assert_eq!(raw.reply().await, Reply::Released { rid: 2 });
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn half_sent_admin_requests_under_a_low_descriptor_limit_never_keep_lock_clients_out() {
    // 256 descriptors for the server; the attacker opens 400 admin
    // connections, each stopping in the middle of its request head.
    let server = Single::start_limited(256);
    let host = server.admin.to_string();
    poll("the admin port", || get(server.admin, &host, "/livez")).await;
    poll("the lock port", || TcpStream::connect(server.client).ok()).await;
    let baseline_kib = server.rss_kib();

    let mut attacker = Vec::new();
    for _ in 0..400 {
        let Ok(mut tcp) = TcpStream::connect_timeout(&server.admin, Duration::from_secs(1)) else {
            // The admin backlog is full: the kernel holds the rest.
            continue;
        };
        let _ = write!(tcp, "GET /metrics HTTP/1.1\r\nHost: {host}\r\nX-Slow: ");
        attacker.push(tcp);
    }
    assert!(attacker.len() >= 300, "{} connections", attacker.len());

    let mut got_in = 0;
    for n in 0..20 {
        got_in += u32::from(lock_client_gets_in(server.client, n).await);
    }
    assert!(
        got_in >= 19,
        "{got_in} of 20 lock clients got in within 1 s"
    );

    // The held connections are closed for not finishing their request
    // head in time (5 s), which frees slots for the ones queued behind
    // them: the admin port answers again while the attacker stays.
    let metrics = poll("half-sent requests closed for taking too long", || {
        let (status, metrics) = get(server.admin, &host, "/metrics")?;
        assert_eq!(status, 200);
        let series = "ticketing_admin_refusals_total{reason=\"timed_out\"}";
        (sample(&metrics, series)? >= 1.0).then_some(metrics)
    })
    .await;
    assert!(metrics.contains("ticketing_held_keys"), "{metrics}");

    // The attacker leaves; what the attack cost in memory is bounded by
    // the connection cap.
    drop(attacker);
    let grown_kib = server.rss_kib().saturating_sub(baseline_kib);
    assert!(grown_kib < 32 * 1024, "RSS grew by {grown_kib} KiB");
}

#[tokio::test]
async fn the_admin_port_refuses_a_foreign_host_unknown_parameters_and_counts_each_refusal() {
    let server = Single::start_limited(1024);
    let host = server.admin.to_string();
    poll("the admin port", || get(server.admin, &host, "/livez")).await;

    // A page whose name was rebound to 127.0.0.1 names its own host.
    let (status, body) = get(server.admin, "evil.example:80", "/v1/locks").unwrap();
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("bad_host"), "{body}");
    let (status, _) = get(server.admin, "evil.example:80", "/metrics").unwrap();
    assert_eq!(status, 421);
    let localhost = format!("localhost:{}", server.admin.port());
    assert_eq!(get(server.admin, &localhost, "/livez").unwrap().0, 200);

    // An unknown parameter is refused, not ignored: a release must never
    // run without the token guard its caller thought it had.
    let (status, body) = get(server.admin, &host, "/v1/locks?limit=5&TOKEN=1").unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(server.admin, &host, "/v1/locks?limit=5&limit=6").unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(server.admin, &host, "/v1/locks?cursor=c1.0.5").unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bad_cursor"), "{body}");
    let (status, _, body) = http_request_as(
        &host,
        server.admin,
        "POST",
        "/v1/locks/k/release?TOKEN=1",
        None,
    )
    .unwrap();
    assert_eq!(status, 400, "{body}");

    // 200 wrong admin tokens: each refused and counted.
    for _ in 0..200 {
        let wrong = Some("Bearer wrong-token-0123456789");
        let (status, _, body) =
            http_request_as(&host, server.admin, "GET", "/v1/locks", wrong).unwrap();
        assert_eq!(status, 403, "{body}");
    }
    let (_, metrics) = get(server.admin, &host, "/metrics").unwrap();
    let count = |reason: &str| {
        sample(
            &metrics,
            &format!("ticketing_admin_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(count("forbidden"), Some(200.0), "{metrics}");
    assert_eq!(count("bad_host"), Some(2.0));
    assert_eq!(count("bad_request"), Some(4.0));
}
