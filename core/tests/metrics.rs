//! What the core counts for operators (`ticketing_core::metrics`): each
//! counter, gauge and histogram moves exactly as the event it counts, with
//! injected time (a grant, a hand-over, an expiry with and without a waiter,
//! a `B` by limit, a `T`, an `N`, an `E` by code, a failed handshake; in
//! cluster mode applied commands and Raft's leader changes and snapshots).

mod raft_harness;

use ticketing_core::budget::AbuseKind;
use ticketing_core::cluster::{Command, GrantOptions, ReplicatedLocks};
use ticketing_core::lock::{Limits, LockConfig};
use ticketing_core::machine::Machine;
use ticketing_core::metrics::{ReplyKind, ServerMetrics};
use ticketing_core::raft::{ConfChange, ProposeError, RaftConfig};
use ticketing_core::server::ServerConfig;
use ticketing_core::testing::net::{LOOPBACK, Nonces, SingleNet, acquire, release};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{ErrorCode, Key, KeyGroup, Reply};

const SECOND_US: u64 = 1_000_000;

fn keys(names: &[&str]) -> KeyGroup {
    KeyGroup::new(
        names
            .iter()
            .map(|name| Key::new(name.as_bytes()).unwrap())
            .collect(),
    )
    .unwrap()
}

/// The net of these tests with `config`: every connection gets the nonce
/// `[7; 16]`.
fn net(config: ServerConfig) -> SingleNet {
    SingleNet::new(config).with_nonces(Nonces::Fixed([7; 16]))
}

/// [`net`] with the default configuration.
fn harness() -> SingleNet {
    net(ServerConfig::default())
}

#[test]
fn an_immediate_grant_counts_one_grant_waited_zero() {
    let mut h = harness();
    let c = h.connect();
    assert_eq!(
        h.metrics(),
        ServerMetrics {
            sessions: 1,
            ..ServerMetrics::default()
        }
    );
    h.send(c, &acquire(1, &["k"], 5, 10));
    h.granted_token(c);
    let m = h.metrics();
    assert_eq!(m.lock.grants_immediate, 1);
    assert_eq!(m.lock.grants_after_wait, 0);
    assert_eq!(m.lock.wait.count(), 1);
    assert_eq!(m.lock.wait.sum_us(), 0);
    assert_eq!(m.lock.wait.count_at_most_us(1_000), 1);
    assert_eq!(m.lock.hold.count(), 0, "nothing ended yet");
    assert_eq!(m.replies.of(ReplyKind::Acquired), 1);
    assert_eq!((m.held_keys, m.keys, m.waiters), (1, 1, 0));
}

#[test]
fn a_release_with_a_waiter_counts_a_handover_and_both_durations() {
    let mut h = harness();
    let (a, b) = (h.connect(), h.connect());
    h.send(a, &acquire(1, &["k"], 5, 10));
    let token = h.granted_token(a);
    h.send(b, &acquire(1, &["k"], 5, 10));
    assert_eq!(h.replies(b), vec![]);
    assert_eq!((h.metrics().waiters, h.metrics().held_keys), (1, 1));

    h.advance(Duration::from_micros(2 * SECOND_US));
    h.send(a, &release(2, &["k"], token));
    assert_eq!(h.replies(a), vec![Reply::Released { rid: 2 }]);
    h.granted_token(b);
    let m = h.metrics();
    assert_eq!(m.lock.releases, 1);
    assert_eq!(m.lock.handovers_on_release, 1);
    assert_eq!(m.lock.grants_immediate, 1);
    assert_eq!(m.lock.grants_after_wait, 1);
    assert_eq!(m.lock.expiries(), 0);
    // b waited exactly 2 s; a held exactly 2 s.
    assert_eq!(m.lock.wait.count(), 2);
    assert_eq!(m.lock.wait.sum_us(), 2 * SECOND_US);
    assert_eq!(m.lock.wait.count_at_most_us(1_000_000), 1);
    assert_eq!(m.lock.wait.count_at_most_us(2_500_000), 2);
    assert_eq!(m.lock.hold.count(), 1);
    assert_eq!(m.lock.hold.sum_us(), 2 * SECOND_US);
    assert_eq!(m.replies.of(ReplyKind::Released), 1);
    assert_eq!(m.replies.of(ReplyKind::Acquired), 2);
    assert_eq!((m.held_keys, m.waiters), (1, 0));
}

#[test]
fn an_expiry_with_a_waiter_counts_as_handed_over_at_the_lease_end() {
    let mut h = harness();
    let (a, b) = (h.connect(), h.connect());
    h.send(a, &acquire(1, &["k"], 5, 2));
    h.granted_token(a);
    h.advance(Duration::from_micros(SECOND_US / 2));
    h.send(b, &acquire(1, &["k"], 10, 5));
    h.advance(Duration::from_micros(SECOND_US + SECOND_US / 2 - 1));
    assert_eq!(h.metrics().lock.expiries(), 0, "the lease still runs");
    h.advance(Duration::from_micros(1));
    h.granted_token(b);
    let m = h.metrics();
    assert_eq!(m.lock.expiries_handed_over, 1);
    assert_eq!(m.lock.expiries_not_handed_over, 0);
    assert_eq!(m.lock.releases, 0);
    assert_eq!(m.lock.handovers_on_release, 0);
    assert_eq!(m.lock.grants_after_wait, 1);
    assert_eq!(m.lock.hold.count(), 1);
    assert_eq!(m.lock.hold.sum_us(), 2 * SECOND_US, "held for its lease");
    assert_eq!(m.lock.wait.sum_us(), 3 * SECOND_US / 2);
}

#[test]
fn an_expiry_without_a_waiter_is_counted_once_when_the_table_notices() {
    let mut h = harness();
    let a = h.connect();
    h.send(a, &acquire(1, &["k"], 5, 1));
    h.granted_token(a);
    h.advance(Duration::from_micros(3 * SECOND_US / 2));
    let m = h.metrics();
    assert_eq!(m.held_keys, 1, "not noticed yet: the gauge is lazy too");
    assert_eq!(m.keys, 1, "not swept yet");
    assert_eq!(m.lock.expiries(), 0, "expiry is lazy");
    assert_eq!(
        h.server.stats().lock.held_keys,
        0,
        "the exact scan sees it ended"
    );
    // The sweep runs 5 s after start.
    h.advance(Duration::from_micros(5 * SECOND_US));
    let m = h.metrics();
    assert_eq!(m.lock.expiries_not_handed_over, 1);
    assert_eq!(m.lock.expiries_handed_over, 0);
    assert_eq!(m.lock.hold.sum_us(), SECOND_US);
    assert_eq!((m.keys, m.held_keys), (0, 0));
    h.advance(Duration::from_micros(10 * SECOND_US));
    assert_eq!(h.metrics().lock.expiries(), 1, "counted once");
}

#[test]
fn an_expired_key_taken_by_a_new_acquire_counts_its_expiry_then() {
    let mut h = harness();
    let (a, b) = (h.connect(), h.connect());
    h.send(a, &acquire(1, &["k"], 5, 1));
    h.granted_token(a);
    h.advance(Duration::from_micros(2 * SECOND_US));
    h.send(b, &acquire(1, &["k"], 0, 1));
    h.granted_token(b);
    let m = h.metrics();
    assert_eq!(m.lock.expiries_not_handed_over, 1);
    assert_eq!(m.lock.grants_immediate, 2);
    assert_eq!(m.lock.hold.count(), 1);
}

#[test]
fn a_key_set_counts_one_grant_one_release_and_one_expiry() {
    let mut h = harness();
    let a = h.connect();
    h.send(a, &acquire(1, &["x", "y", "z"], 5, 1));
    let token = h.granted_token(a);
    h.send(a, &release(2, &["x", "y", "z"], token));
    assert_eq!(h.replies(a), vec![Reply::ReleasedSet { rid: 2 }]);
    h.send(a, &acquire(3, &["x", "y", "z"], 5, 1));
    h.granted_token(a);
    h.advance(Duration::from_micros(6 * SECOND_US));
    let m = h.metrics();
    assert_eq!(m.lock.grants(), 2);
    assert_eq!(m.lock.releases, 1);
    assert_eq!(m.lock.expiries(), 1, "three keys, one grant");
    assert_eq!(m.lock.hold.count(), 2);
    assert_eq!(m.replies.of(ReplyKind::AcquiredSet), 2);
    assert_eq!(m.replies.of(ReplyKind::ReleasedSet), 1);
}

#[test]
fn timeouts_count_wait_zero_and_wait_ended_and_their_t_replies() {
    let mut h = harness();
    let (a, b) = (h.connect(), h.connect());
    h.send(a, &acquire(1, &["k"], 5, 30));
    h.granted_token(a);
    h.send(b, &acquire(1, &["k"], 0, 5));
    assert_eq!(h.replies(b), vec![Reply::TimedOut { rid: 1 }]);
    assert_eq!(h.metrics().lock.timeouts_wait_zero, 1);
    h.send(b, &acquire(2, &["k"], 1, 5));
    assert_eq!(h.metrics().waiters, 1);
    // `T` comes the wait margin (100 ms) before the wait's end.
    h.advance(Duration::from_micros(900_000));
    assert_eq!(h.replies(b), vec![Reply::TimedOut { rid: 2 }]);
    let m = h.metrics();
    assert_eq!(m.lock.timeouts_wait_zero, 1);
    assert_eq!(m.lock.timeouts_wait_ended, 1);
    assert_eq!(m.replies.of(ReplyKind::TimedOut), 2);
    assert_eq!(m.lock.grants(), 1, "a timeout is no grant");
    assert_eq!(m.lock.wait.count(), 1);
    assert_eq!(m.waiters, 0);
}

#[test]
fn busy_replies_count_by_the_limit_that_was_reached() {
    let config = ServerConfig {
        lock: LockConfig {
            limits: Limits {
                keys_max: 2,
                waiters_per_key_max: 1,
                waiters_total_max: 10,
            },
            ..LockConfig::default()
        },
        in_flight_per_connection_max: 1,
        ..ServerConfig::default()
    };
    let mut h = net(config);
    let (a, b, c) = (h.connect(), h.connect(), h.connect());
    h.send(a, &acquire(1, &["k"], 5, 30));
    h.granted_token(a);
    h.send(b, &acquire(1, &["k"], 5, 30));
    // The queue of k is full: B by waiters_per_key_max.
    h.send(c, &acquire(1, &["k"], 5, 30));
    assert_eq!(h.replies(c), vec![Reply::Busy { rid: 1 }]);
    // b already has one queued acquire: B by its in-flight limit.
    h.send(b, &acquire(2, &["j"], 5, 30));
    assert_eq!(h.replies(b), vec![Reply::Busy { rid: 2 }]);
    h.send(c, &acquire(2, &["j"], 5, 30));
    h.granted_token(c);
    // Two keys in the table: a third is B by keys_max.
    h.send(c, &acquire(3, &["l"], 5, 30));
    assert_eq!(h.replies(c), vec![Reply::Busy { rid: 3 }]);
    let m = h.metrics();
    assert_eq!(m.lock.busy.waiters_per_key_max, 1);
    assert_eq!(m.lock.busy.keys_max, 1);
    assert_eq!(m.lock.busy.waiters_total_max, 0);
    assert_eq!(m.lock.busy.token_reserve, 0);
    assert_eq!(m.busy_per_connection, 1);
    assert_eq!(m.replies.of(ReplyKind::Busy), 3);
    assert_eq!(m.lock.grants(), 2);
}

#[test]
fn a_miss_counts_n_and_a_wrong_group_counts_e_by_code() {
    let mut h = harness();
    let a = h.connect();
    h.send(a, &acquire(1, &["x", "y"], 5, 30));
    let token = h.granted_token(a);
    h.send(a, &release(2, &["k"], token + 1));
    assert_eq!(h.replies(a), vec![Reply::NotFound { rid: 2 }]);
    h.send(a, &release(3, &["x"], token));
    assert_eq!(
        h.replies(a),
        vec![Reply::Error {
            rid: 3,
            code: ErrorCode::GroupMismatch
        }]
    );
    let m = h.metrics();
    assert_eq!(m.replies.of(ReplyKind::NotFound), 1);
    assert_eq!(m.replies.of(ReplyKind::Error), 1);
    assert_eq!(m.replies.errors(ErrorCode::GroupMismatch), 1);
    assert_eq!(m.replies.errors(ErrorCode::BadKey), 0);
    assert_eq!(m.lock.releases, 0, "nothing was released");
    assert_eq!(m.held_keys, 2);
}

#[test]
fn replies_of_a_closed_connection_stay_counted_and_failed_proofs_count() {
    let mut h = net(ServerConfig {
        client_tokens: ticketing_core::auth::ClientTokens::new(["0123456789abcdef0123"]).unwrap(),
        ..ServerConfig::default()
    });
    let (bad, accepted) = h.try_connect_with(b"not-the-token-at-all");
    assert!(!accepted);
    let (a, accepted) = h.try_connect_with(b"0123456789abcdef0123");
    assert!(accepted);
    h.send(a, &release(1, &["k"], 5));
    assert_eq!(h.replies(a), vec![Reply::NotFound { rid: 1 }]);
    h.server.handle_closed(h.now, a);
    h.server.handle_closed(h.now, bad);
    let m = h.metrics();
    assert_eq!(m.replies.of(ReplyKind::NotFound), 1);
    assert_eq!(m.abuse.of(AbuseKind::FailedProof), 1);
    assert_eq!(m.abuse.failed_handshakes(), 1);
    assert_eq!(m.sessions, 0);
}

#[test]
fn an_unfinished_handshake_that_times_out_counts_as_failed() {
    let mut h = harness();
    h.server
        .handle_connect(h.now, [1; 16], LOOPBACK)
        .expect("accepted");
    assert_eq!(h.metrics().handshakes, 1);
    h.advance(Duration::from_micros(3 * SECOND_US));
    let m = h.metrics();
    assert_eq!(m.abuse.of(AbuseKind::HandshakeTimedOut), 1);
    assert_eq!(m.abuse.failed_handshakes(), 1);
}

#[test]
fn applied_commands_count_grants_releases_expiries_and_hold_time() {
    let mut state = ReplicatedLocks::new();
    let t0 = Instant::from_micros(10 * SECOND_US);
    state.apply(&Command::Init { first_token: 100 }, t0);
    let k = keys(&["k"]);
    let j = keys(&["j"]);
    let grant = |keys: &KeyGroup| Command::Grant {
        keys: keys.clone(),
        lease_ms: 5_000,
        max_hold_ms: None,
        options: GrantOptions::default(),
    };
    state.apply(&grant(&k), t0);
    state.apply(&grant(&j), t0);
    let t1 = t0.saturating_add(Duration::from_millis(1_500));
    state.apply(
        &Command::Release {
            keys: k,
            token: 100,
        },
        t1,
    );
    // A release of a token that is not current counts nothing.
    state.apply(
        &Command::Release {
            keys: keys(&["k"]),
            token: 100,
        },
        t1,
    );
    let t2 = t0.saturating_add(Duration::from_secs(5));
    state.apply(
        &Command::Expire {
            keys: j,
            token: 101,
        },
        t2,
    );
    let m = state.metrics();
    assert_eq!((m.grants, m.releases, m.expiries), (2, 1, 1));
    assert_eq!(m.hold.count(), 2);
    assert_eq!(m.hold.sum_us(), 6_500_000);

    // Installing a snapshot keeps the counts and counts the install.
    let mut other = ReplicatedLocks::new();
    other.apply(&Command::Init { first_token: 100 }, t0);
    other.apply(&grant(&keys(&["q"])), t0);
    other.apply(&grant(&keys(&["r"])), t0);
    other.apply(&grant(&keys(&["s"])), t0);
    state
        .install_snapshot(&other.snapshot(t2), t2)
        .expect("counter ahead");
    let m = state.metrics();
    assert_eq!((m.grants, m.releases, m.expiries), (2, 1, 1));
    assert_eq!(m.snapshots_installed, 1);
}

#[test]
fn raft_counts_leader_changes_and_snapshots_sent_and_received() {
    let cfg = RaftConfig {
        snapshot_threshold_entries: 50,
        snapshot_chunk_bytes: 100,
        auto_membership: false,
        ..RaftConfig::fast()
    };
    let mut net = raft_harness::Net::new(3, cfg.clone(), 21);
    let leader = net.run_until_leader(5_000);
    net.run_ms(500);
    for nid in net.ids() {
        let counters = net.raft(nid).counters();
        assert_eq!(counters.leader_changes, 1, "{nid:?} learned one leader");
        assert_eq!(counters.snapshots_sent + counters.snapshots_received, 0);
    }
    for k in 0..300u16 {
        net.propose(leader, &k.to_be_bytes());
        if k % 20 == 0 {
            net.run_ms(5);
        }
    }
    net.run_ms(1_000);
    let learner = net.join(3, 1, cfg, 99);
    loop {
        let leader = net.run_until_leader(10_000);
        match net.with(leader, |r, now| {
            r.propose_conf_change(now, ConfChange::AddLearner(learner))
        }) {
            Ok(_) => break,
            Err(ProposeError::ConfChangePending | ProposeError::NotCommittedInTerm) => {
                net.run_ms(20)
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    net.run_ms(2_000);
    let leader = net.leader().unwrap();
    assert_eq!(net.raft(leader).counters().snapshots_sent, 1);
    assert_eq!(net.raft(learner).counters().snapshots_received, 1);
    assert_eq!(net.raft(learner).counters().leader_changes, 1);

    net.kill(leader);
    let next = net.run_until_leader_other_than(Some(leader), 10_000);
    net.run_ms(500);
    assert_eq!(net.raft(next).counters().leader_changes, 2);
}
