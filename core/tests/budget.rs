//! Connection budgets of the single-mode server, with injected time: the
//! handshake budget (oldest unfinished handshake dropped first, per-source
//! cap, finished handshakes no longer count, the deadline), the aggregated
//! reports (one per source per interval, with counts), the held-key cap and
//! the release-miss limit.

use std::net::{IpAddr, Ipv4Addr};
use ticketing_core::testing::net::{Nonces, ReplyDecoding, SingleNet};

use ticketing_core::auth::ClientTokens;
use ticketing_core::budget::{AbuseKind, BudgetConfig, CloseReason, LogEvent};
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState, ServerConfig};
use ticketing_core::time::Duration;
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, ReleaseRequest, Reply, Request};

const FIRST_TOKEN: u64 = 1_000;
const TOKEN_A: &str = "0123456789abcdef0123456789abcdef";
const REPORT_INTERVAL: Duration = Duration::from_secs(10);

fn source(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))
}

fn budget(handshakes_max: usize, per_source: usize) -> BudgetConfig {
    BudgetConfig {
        handshakes_max,
        handshakes_per_source_max: per_source,
        report_interval: REPORT_INTERVAL,
        ..BudgetConfig::default()
    }
}

fn group(names: &[&str]) -> KeyGroup {
    let keys = names
        .iter()
        .map(|name| Key::new(name.as_bytes()).unwrap())
        .collect();
    KeyGroup::new(keys).unwrap()
}

fn acquire(rid: u64, names: &[&str], wait_s: u8, lease_s: u8) -> Vec<u8> {
    let mut out = Vec::new();
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: group(names),
        set: names.len() > 1,
    })
    .encode(&mut out);
    out
}

fn release(rid: u64, names: &[&str], token: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: group(names),
        set: names.len() > 1,
    })
    .encode(&mut out);
    out
}

fn token_of(reply: &Reply) -> u64 {
    match reply {
        Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => *token,
        other => panic!("not a grant: {other:?}"),
    }
}

/// The net of these tests: the first token is [`FIRST_TOKEN`], each
/// connection gets nonce bytes of its own, and replies are decoded up to
/// the first frame that does not decode.
fn net(config: ServerConfig) -> SingleNet {
    SingleNet::with_first_token(config, FIRST_TOKEN)
        .with_nonces(Nonces::Counting)
        .with_reply_decoding(ReplyDecoding::Lenient)
}

#[test]
fn a_full_handshake_budget_drops_the_oldest_unfinished_handshake() {
    let mut h = net(ServerConfig {
        budget: budget(3, 3),
        ..ServerConfig::default()
    });
    let (a, _) = h.open_from(source(1));
    let (b, _) = h.open_from(source(2));
    let (c, _) = h.open_from(source(3));
    h.logs();
    let (d, _) = h.open_from(source(4));
    assert_eq!(h.state(a), ConnState::CloseAfterFlush, "the oldest goes");
    for conn in [b, c, d] {
        assert_eq!(h.state(conn), ConnState::Open);
    }
    assert_eq!(
        h.abuse(),
        vec![(Some(source(1)), AbuseKind::HandshakeEvicted, 1)]
    );
    let (e, _) = h.open_from(source(5));
    assert_eq!(
        h.state(b),
        ConnState::CloseAfterFlush,
        "then the next oldest"
    );
    assert_eq!(h.state(e), ConnState::Open);
    assert_eq!(h.server.stats().handshakes, 3);
}

#[test]
fn a_source_over_its_cap_loses_its_own_oldest_handshake() {
    let mut h = net(ServerConfig {
        budget: budget(10, 2),
        ..ServerConfig::default()
    });
    let (other, _) = h.open_from(source(9));
    let (a1, _) = h.open_from(source(1));
    let (a2, _) = h.open_from(source(1));
    let (a3, _) = h.open_from(source(1));
    assert_eq!(h.state(a1), ConnState::CloseAfterFlush);
    assert_eq!(h.state(a2), ConnState::Open);
    assert_eq!(h.state(a3), ConnState::Open);
    assert_eq!(h.state(other), ConnState::Open, "older, but another source");
}

#[test]
fn a_finished_handshake_no_longer_counts_against_the_budget() {
    let mut h = net(ServerConfig {
        budget: budget(2, 2),
        ..ServerConfig::default()
    });
    let sessions: Vec<ConnId> = (0..5).map(|_| h.connect_from(source(1))).collect();
    let (x, _) = h.open_from(source(1));
    let (y, _) = h.open_from(source(1));
    for conn in sessions.iter().copied().chain([x, y]) {
        assert_eq!(h.state(conn), ConnState::Open);
    }
    let stats = h.server.stats();
    assert_eq!((stats.sessions, stats.handshakes), (5, 2));
}

#[test]
fn a_client_gets_in_while_idle_sockets_from_its_own_address_keep_arriving() {
    let mut h = net(ServerConfig {
        connections_max: 200,
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        budget: BudgetConfig::for_connections_max(200),
        ..ServerConfig::default()
    });
    for _ in 0..300 {
        h.open_from(source(1));
    }
    let (conn, hello) = h.open_from(source(1));
    // A few more idle ones arrive during the client's round trip.
    for _ in 0..5 {
        h.open_from(source(1));
    }
    let (result, state) = h.prove(conn, &hello, TOKEN_A.as_bytes());
    assert_eq!((result, state), (vec![1], ConnState::Open));
    let stats = h.server.stats();
    assert_eq!(stats.sessions, 1);
    assert!(stats.handshakes <= BudgetConfig::for_connections_max(200).handshakes_per_source_max);
}

#[test]
fn the_session_limit_refuses_new_connections_and_reports_them() {
    let mut h = net(ServerConfig {
        connections_max: 1,
        budget: budget(8, 8),
        ..ServerConfig::default()
    });
    h.connect_from(source(1));
    h.logs();
    for _ in 0..5 {
        assert_eq!(h.server.handle_connect(h.now, [0; 16], source(7)), None);
    }
    assert_eq!(h.abuse(), vec![(Some(source(7)), AbuseKind::Refused, 1)]);
    h.advance(REPORT_INTERVAL);
    assert_eq!(h.abuse(), vec![(Some(source(7)), AbuseKind::Refused, 4)]);
}

#[test]
fn an_unfinished_handshake_times_out_after_three_seconds_by_default() {
    let mut h = net(ServerConfig::default());
    let (conn, _) = h.open_from(source(1));
    h.advance(Duration::from_millis(2_999));
    assert_eq!(h.state(conn), ConnState::Open);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.state(conn), ConnState::CloseAfterFlush);
    assert_eq!(
        h.abuse(),
        vec![(Some(source(1)), AbuseKind::HandshakeTimedOut, 1)]
    );
    assert_eq!(h.server.stats().handshakes, 0);
}

#[test]
fn failed_proofs_are_reported_once_per_source_per_interval_with_counts() {
    let mut h = net(ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        budget: budget(64, 64),
        ..ServerConfig::default()
    });
    let try_wrong = |h: &mut SingleNet, from: IpAddr| {
        let (conn, hello) = h.open_from(from);
        let (result, state) = h.prove(conn, &hello, b"wrong-token-wrong-token");
        assert_eq!((result, state), (vec![0], ConnState::CloseAfterFlush));
        h.server.handle_closed(h.now, conn);
    };
    for _ in 0..50 {
        try_wrong(&mut h, source(1));
    }
    for _ in 0..3 {
        try_wrong(&mut h, source(2));
    }
    let events = h.logs();
    let closes = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                LogEvent::Closed {
                    reason: CloseReason::ProofRejected,
                    ..
                }
            )
        })
        .count();
    assert_eq!(closes, 53, "every close has its reason");
    let abuse: Vec<_> = events
        .into_iter()
        .filter(|e| matches!(e, LogEvent::Abuse { .. }))
        .collect();
    assert_eq!(
        abuse,
        vec![
            LogEvent::Abuse {
                source: Some(source(1)),
                kind: AbuseKind::FailedProof,
                count: 1
            },
            LogEvent::Abuse {
                source: Some(source(2)),
                kind: AbuseKind::FailedProof,
                count: 1
            },
        ]
    );
    h.advance(REPORT_INTERVAL - Duration::from_millis(1));
    assert_eq!(h.abuse(), vec![]);
    h.advance(Duration::from_millis(1));
    assert_eq!(
        h.abuse(),
        vec![
            (Some(source(1)), AbuseKind::FailedProof, 49),
            (Some(source(2)), AbuseKind::FailedProof, 2),
        ]
    );
    // Another interval of failures from source 1 only: one report.
    for _ in 0..7 {
        try_wrong(&mut h, source(1));
    }
    h.advance(REPORT_INTERVAL);
    assert_eq!(
        h.abuse(),
        vec![(Some(source(1)), AbuseKind::FailedProof, 7)]
    );
}

#[test]
fn shutdown_reports_the_counts_not_yet_reported() {
    let mut h = net(ServerConfig {
        connections_max: 1,
        budget: budget(8, 8),
        ..ServerConfig::default()
    });
    h.connect_from(source(1));
    for _ in 0..3 {
        assert_eq!(h.server.handle_connect(h.now, [0; 16], source(7)), None);
    }
    assert_eq!(h.abuse(), vec![(Some(source(7)), AbuseKind::Refused, 1)]);
    h.server.begin_shutdown(h.now);
    assert_eq!(h.abuse(), vec![(Some(source(7)), AbuseKind::Refused, 2)]);
}

#[test]
fn every_close_reports_its_reason() {
    let mut h = net(ServerConfig::default());
    let conn = h.connect_from(source(3));
    // A frame that cannot be parsed.
    let (_, state) = h.call_bytes(conn, &[0xff; 8]);
    assert_eq!(state, ConnState::CloseAfterFlush);
    h.server.handle_closed(h.now, conn);
    let quiet = h.connect_from(source(3));
    h.server.handle_closed(h.now, quiet);
    let closes: Vec<_> = h
        .logs()
        .into_iter()
        .filter_map(|e| match e {
            LogEvent::Closed {
                conn,
                source,
                reason,
            } => Some((conn, source, reason)),
            LogEvent::Abuse { .. } | LogEvent::ForceReleased { .. } => None,
        })
        .collect();
    assert_eq!(
        closes,
        vec![
            (conn, Some(source(3)), CloseReason::BadFrame),
            (quiet, Some(source(3)), CloseReason::TransportClosed),
        ]
    );
}

fn held_cap(held_max: usize) -> ServerConfig {
    ServerConfig {
        budget: BudgetConfig {
            held_per_connection_max: held_max,
            ..BudgetConfig::default()
        },
        ..ServerConfig::default()
    }
}

#[test]
fn an_acquire_over_the_held_cap_is_busy_until_a_release_frees_keys() {
    let mut h = net(held_cap(3));
    let conn = h.connect_from(source(1));
    let set = h.one_reply(conn, &acquire(1, &["a", "b"], 0, 60));
    let single = h.one_reply(conn, &acquire(2, &["c"], 0, 60));
    assert_eq!(h.server.held_keys(conn), 3);
    assert_eq!(
        h.one_reply(conn, &acquire(3, &["d"], 0, 60)),
        Reply::Busy { rid: 3 }
    );
    assert_eq!(
        h.one_reply(conn, &release(4, &["a", "b"], token_of(&set))),
        Reply::ReleasedSet { rid: 4 }
    );
    assert_eq!(h.server.held_keys(conn), 1);
    assert!(matches!(
        h.one_reply(conn, &acquire(5, &["d"], 0, 60)),
        Reply::Acquired { .. }
    ));
    // Another connection may release with the token: the holder's count
    // drops too.
    let other = h.connect_from(source(2));
    assert_eq!(
        h.one_reply(other, &release(6, &["c"], token_of(&single))),
        Reply::Released { rid: 6 }
    );
    assert_eq!(h.server.held_keys(conn), 1);
}

#[test]
fn expiry_frees_held_keys_from_the_cap() {
    let mut h = net(held_cap(1));
    let conn = h.connect_from(source(1));
    assert!(matches!(
        h.one_reply(conn, &acquire(1, &["a"], 0, 2)),
        Reply::Acquired { .. }
    ));
    assert_eq!(
        h.one_reply(conn, &acquire(2, &["b"], 0, 2)),
        Reply::Busy { rid: 2 }
    );
    h.advance(Duration::from_millis(1_999));
    assert_eq!(
        h.one_reply(conn, &acquire(3, &["b"], 0, 2)),
        Reply::Busy { rid: 3 }
    );
    h.advance(Duration::from_millis(1));
    assert_eq!(h.server.held_keys(conn), 0);
    assert!(matches!(
        h.one_reply(conn, &acquire(4, &["b"], 0, 2)),
        Reply::Acquired { .. }
    ));
}

#[test]
fn a_grant_handed_over_counts_for_the_receiving_connection() {
    let mut h = net(held_cap(1));
    let holder = h.connect_from(source(1));
    let waiter = h.connect_from(source(2));
    let token = token_of(&h.one_reply(holder, &acquire(1, &["k"], 0, 60)));
    let (replies, _) = h.call_bytes(waiter, &acquire(2, &["k"], 30, 60));
    assert_eq!(replies, vec![], "queued");
    assert_eq!(h.server.held_keys(waiter), 0);
    assert_eq!(
        h.one_reply(holder, &release(3, &["k"], token)),
        Reply::Released { rid: 3 }
    );
    let (replies, _) = h.call_bytes(waiter, &[]);
    assert!(matches!(replies[..], [Reply::Acquired { rid: 2, .. }]));
    assert_eq!(h.server.held_keys(waiter), 1);
    assert_eq!(h.server.held_keys(holder), 0);
    assert_eq!(
        h.one_reply(waiter, &acquire(4, &["j"], 0, 60)),
        Reply::Busy { rid: 4 }
    );
    assert!(matches!(
        h.one_reply(holder, &acquire(5, &["j"], 0, 60)),
        Reply::Acquired { .. }
    ));
}

fn misses(max: u32) -> ServerConfig {
    ServerConfig {
        budget: BudgetConfig {
            release_misses_in_row_max: max,
            ..BudgetConfig::default()
        },
        ..ServerConfig::default()
    }
}

#[test]
fn a_run_of_release_misses_closes_the_connection_after_exactly_k() {
    let mut h = net(misses(4));
    let other = h.connect_from(source(1));
    let victim = token_of(&h.one_reply(other, &acquire(1, &["v"], 0, 60)));
    let sweeper = h.connect_from(source(2));
    let own = token_of(&h.one_reply(sweeper, &acquire(2, &["own"], 0, 60)));
    for rid in 10..13 {
        assert_eq!(
            h.one_reply(sweeper, &release(rid, &["v"], victim - 1 - rid)),
            Reply::NotFound { rid }
        );
    }
    // A hit resets the run.
    assert_eq!(
        h.one_reply(sweeper, &release(13, &["own"], own)),
        Reply::Released { rid: 13 }
    );
    for rid in 20..23 {
        assert_eq!(
            h.one_reply(sweeper, &release(rid, &["v"], victim + rid)),
            Reply::NotFound { rid }
        );
    }
    h.logs();
    let (replies, state) = h.call_bytes(sweeper, &release(23, &["v"], victim + 99));
    assert_eq!(replies, vec![Reply::NotFound { rid: 23 }]);
    assert_eq!(state, ConnState::CloseAfterFlush);
    assert_eq!(
        h.abuse(),
        vec![(Some(source(2)), AbuseKind::ReleaseSweep, 1)]
    );
    h.server.handle_closed(h.now, sweeper);
    assert!(h.logs().contains(&LogEvent::Closed {
        conn: sweeper,
        source: Some(source(2)),
        reason: CloseReason::ReleaseMisses
    }));
    // The victim's lock is untouched.
    assert_eq!(
        h.one_reply(other, &release(30, &["v"], victim)),
        Reply::Released { rid: 30 }
    );
}

#[test]
fn zero_turns_the_release_miss_limit_off() {
    let mut h = net(misses(0));
    let conn = h.connect_from(source(1));
    for rid in 1..=200 {
        assert_eq!(
            h.one_reply(conn, &release(rid, &["k"], rid + 1)),
            Reply::NotFound { rid }
        );
    }
}
