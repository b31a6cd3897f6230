//! The negotiated extension channel on the single-mode server: `X` grants
//! capabilities and records a label; `W` renews a grant by its exact token
//! and can never bring back one that is gone; a connection that negotiated
//! nothing (every published client) sees exactly the v3 bytes. Time is
//! injected; the clock jumps.

use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::testing::net::{
    SingleNet, acquire, decode_replies as decode_all, key_group as group, release,
};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, ErrorCode, ExtendRequest, ExtendStatus, Key, NegotiateRequest,
    PushKind, Reply, Request,
};

fn extend(rid: u64, names: &[&str], token: u64, lease_s: u8) -> Request {
    Request::Extend(ExtendRequest {
        rid,
        token,
        lease_s,
        keys: group(names),
    })
}

fn negotiate(rid: u64, wanted: Capabilities, label: &str) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version: EXTENSION_VERSION,
        wanted,
        label: label.to_owned(),
    })
}

fn granted(replies: &[Reply]) -> u64 {
    match replies {
        [Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. }] => *token,
        other => panic!("expected one grant, got {other:?}"),
    }
}

/// What these tests add to the test network: connections that negotiated,
/// and calls that must leave the connection open.
trait Extended {
    /// A connection that negotiated the extension, labelled `label`.
    fn connect_extended(&mut self, label: &str) -> ConnId;
    /// A connection that negotiated renewal and pushes.
    fn connect_pushed(&mut self) -> ConnId;
    /// Sends `bytes` on `conn`; what came back, and the state.
    fn send_frame(&mut self, conn: ConnId, bytes: &[u8]) -> (Vec<u8>, ConnState);
    /// Sends `request`, which must leave `conn` open; the replies.
    fn call_open(&mut self, conn: ConnId, request: &Request) -> Vec<Reply>;
    /// What `conn` was sent since it was last read.
    fn unsolicited(&mut self, conn: ConnId) -> Vec<Reply>;
}

impl Extended for SingleNet {
    fn connect_extended(&mut self, label: &str) -> ConnId {
        let conn = self.connect();
        assert_eq!(
            self.call_open(conn, &negotiate(1, Capabilities::EXTEND, label)),
            [Reply::Negotiated {
                rid: 1,
                granted: Capabilities::EXTEND
            }]
        );
        conn
    }

    fn connect_pushed(&mut self) -> ConnId {
        let conn = self.connect();
        let both = Capabilities::EXTEND.union(Capabilities::PUSH);
        assert_eq!(
            self.call_open(conn, &negotiate(1, both, "pushed")),
            [Reply::Negotiated {
                rid: 1,
                granted: both
            }]
        );
        conn
    }

    fn send_frame(&mut self, conn: ConnId, bytes: &[u8]) -> (Vec<u8>, ConnState) {
        self.send_bytes(conn, bytes);
        self.take(conn)
    }

    fn call_open(&mut self, conn: ConnId, request: &Request) -> Vec<Reply> {
        let (bytes, state) = self.send_frame(conn, &request.to_frame());
        assert_eq!(state, ConnState::Open, "closed after {request:?}");
        decode_all(&bytes)
    }

    fn unsolicited(&mut self, conn: ConnId) -> Vec<Reply> {
        decode_all(&self.take(conn).0)
    }
}

#[test]
fn an_x_grants_the_extension_and_the_label_names_the_holder_in_inspection() {
    let mut h = SingleNet::default();
    let conn = h.connect_extended("builder-7/4242/nightly");
    let token = granted(&h.call_open(conn, &acquire(2, &["k"], 0, 10)));
    let view = h
        .server
        .inspect_lock(h.now, &Key::new(b"k").unwrap())
        .expect("held");
    let holder = view.holder.expect("a holder");
    assert_eq!(holder.token, token);
    let seen = holder.conn.expect("its connection");
    assert_eq!(seen.label.as_deref(), Some("builder-7/4242/nightly"));
    // A connection that gave no label shows none.
    let plain = h.connect();
    granted(&h.call_open(plain, &acquire(3, &["j"], 0, 10)));
    let view = h
        .server
        .inspect_lock(h.now, &Key::new(b"j").unwrap())
        .unwrap();
    assert_eq!(view.holder.unwrap().conn.unwrap().label, None);
}

#[test]
fn capabilities_the_server_does_not_have_are_not_granted() {
    let mut h = SingleNet::default();
    let conn = h.connect();
    assert_eq!(
        h.call_open(conn, &negotiate(1, Capabilities(0xFFFF_FFFF), "")),
        [Reply::Negotiated {
            rid: 1,
            granted: Capabilities::KNOWN
        }]
    );
    let other = h.connect();
    assert_eq!(
        h.call_open(other, &negotiate(1, Capabilities::NONE, "")),
        [Reply::Negotiated {
            rid: 1,
            granted: Capabilities::NONE
        }]
    );
    // Nothing granted: `W` is still an unknown op there.
    let (bytes, state) = h.send_frame(other, &extend(2, &["k"], 5, 10).to_frame());
    assert!(bytes.is_empty());
    assert_eq!(state, ConnState::CloseAfterFlush);
}

#[test]
fn a_connection_that_negotiated_nothing_is_closed_by_w_like_any_unknown_op() {
    let mut h = SingleNet::default();
    let conn = h.connect();
    let token = granted(&h.call_open(conn, &acquire(1, &["k"], 0, 10)));
    let (bytes, state) = h.send_frame(conn, &extend(2, &["k"], token, 30).to_frame());
    assert!(bytes.is_empty(), "no reply byte to a published client");
    assert_eq!(state, ConnState::CloseAfterFlush);
    // The grant it had delivered stays until its lease ends, as today.
    h.server.handle_closed(h.now, conn);
    let rival = h.connect();
    assert_eq!(
        h.call_open(rival, &acquire(1, &["k"], 0, 10)),
        [Reply::TimedOut { rid: 1 }]
    );
}

#[test]
fn a_second_x_is_refused_with_e8_and_keeps_what_the_first_granted() {
    let mut h = SingleNet::default();
    let conn = h.connect_extended("first");
    assert_eq!(
        h.call_open(conn, &negotiate(2, Capabilities::NONE, "second")),
        [Reply::Error {
            rid: 2,
            code: ErrorCode::BadExtension
        }]
    );
    let token = granted(&h.call_open(conn, &acquire(3, &["k"], 0, 10)));
    assert!(matches!(
        h.call_open(conn, &extend(4, &["k"], token, 20))[..],
        [Reply::Extended {
            rid: 4,
            status: ExtendStatus::Extended,
            ..
        }]
    ));
    let view = h
        .server
        .inspect_lock(h.now, &Key::new(b"k").unwrap())
        .unwrap();
    assert_eq!(
        view.holder.unwrap().conn.unwrap().label.as_deref(),
        Some("first")
    );
}

#[test]
fn w_renews_a_current_grant_so_the_key_outlives_its_first_lease() {
    let mut h = SingleNet::default();
    let holder = h.connect_extended("holder");
    let rival = h.connect();
    let token = granted(&h.call_open(holder, &acquire(2, &["k"], 0, 2)));
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.call_open(holder, &extend(3, &["k"], token, 10)),
        [Reply::Extended {
            rid: 3,
            status: ExtendStatus::Extended,
            lease_ms: 10_000
        }]
    );
    // Past the first lease (2 s), inside the renewed one (1 s + 10 s).
    h.advance(Duration::from_secs(9));
    assert_eq!(
        h.call_open(rival, &acquire(1, &["k"], 0, 5)),
        [Reply::TimedOut { rid: 1 }]
    );
    // The token did not change: it still releases the key.
    assert_eq!(
        h.call_open(holder, &release(4, &["k"], token)),
        [Reply::Released { rid: 4 }]
    );
    let next = granted(&h.call_open(rival, &acquire(2, &["k"], 0, 5)));
    assert!(next > token);
}

#[test]
fn the_renewed_lease_ends_on_time_and_hands_the_key_to_its_waiter() {
    let mut h = SingleNet::default();
    let holder = h.connect_extended("holder");
    let waiter = h.connect();
    let token = granted(&h.call_open(holder, &acquire(2, &["k"], 0, 2)));
    assert_eq!(h.call_open(waiter, &acquire(1, &["k"], 60, 5)), []);
    h.call_open(holder, &extend(3, &["k"], token, 5));
    h.advance(Duration::from_millis(4_999));
    assert_eq!(
        h.take(waiter).0,
        Vec::<u8>::new(),
        "not before the renewed end"
    );
    h.advance(Duration::from_millis(1));
    let handed = granted(&decode_all(&h.take(waiter).0));
    assert!(handed > token);
}

#[test]
fn w_by_a_token_that_is_gone_gets_n_and_changes_nothing() {
    let mut h = SingleNet::default();
    let holder = h.connect_extended("holder");
    let waiter = h.connect();
    // Released.
    let released = granted(&h.call_open(holder, &acquire(2, &["a"], 0, 10)));
    h.call_open(holder, &release(3, &["a"], released));
    assert_eq!(
        h.call_open(holder, &extend(4, &["a"], released, 10)),
        [Reply::NotFound { rid: 4 }]
    );
    // Expired, before any sweep noticed.
    let expired = granted(&h.call_open(holder, &acquire(5, &["b"], 0, 1)));
    h.now = h.now.saturating_add(Duration::from_secs(2));
    assert_eq!(
        h.call_open(holder, &extend(6, &["b"], expired, 10)),
        [Reply::NotFound { rid: 6 }]
    );
    // Force-released by an operator.
    let revoked = granted(&h.call_open(holder, &acquire(7, &["c"], 0, 10)));
    h.force_release("c", None);
    assert_eq!(
        h.call_open(holder, &extend(8, &["c"], revoked, 10)),
        [Reply::NotFound { rid: 8 }]
    );
    // Handed over to a waiter: the waiter's token is current, the old one
    // is not, and the waiter's lease is untouched by the old one's `W`.
    let old = granted(&h.call_open(holder, &acquire(9, &["d"], 0, 10)));
    assert_eq!(h.call_open(waiter, &acquire(1, &["d"], 60, 3)), []);
    h.call_open(holder, &release(10, &["d"], old));
    let new = granted(&decode_all(&h.take(waiter).0));
    assert_eq!(
        h.call_open(holder, &extend(11, &["d"], old, 200)),
        [Reply::NotFound { rid: 11 }]
    );
    h.advance(Duration::from_secs(3));
    let view = h.server.inspect_lock(h.now, &Key::new(b"d").unwrap());
    assert!(
        view.is_none_or(|v| v.holder.is_none_or(|holder| holder.token != new)),
        "the waiter's grant ended at its own lease"
    );
    // A token never issued.
    assert_eq!(
        h.call_open(holder, &extend(12, &["d"], u64::MAX, 10)),
        [Reply::NotFound { rid: 12 }]
    );
}

#[test]
fn a_key_set_is_renewed_by_its_one_token_naming_all_its_keys() {
    let mut h = SingleNet::default();
    let holder = h.connect_extended("holder");
    let rival = h.connect();
    let token = granted(&h.call_open(holder, &acquire(2, &["a", "b"], 0, 2)));
    // Part of the set is not its grant.
    assert_eq!(
        h.call_open(holder, &extend(3, &["a"], token, 10)),
        [Reply::NotFound { rid: 3 }]
    );
    assert!(matches!(
        h.call_open(holder, &extend(4, &["a", "b"], token, 10))[..],
        [Reply::Extended {
            status: ExtendStatus::Extended,
            ..
        }]
    ));
    h.advance(Duration::from_secs(5));
    for (rid, key) in [(1, "a"), (2, "b")] {
        assert_eq!(
            h.call_open(rival, &acquire(rid, &[key], 0, 5)),
            [Reply::TimedOut { rid }],
            "{key} still held"
        );
    }
}

#[test]
fn w_with_token_0_or_a_bad_lease_gets_its_code_and_the_session_goes_on() {
    let mut h = SingleNet::default();
    let conn = h.connect_extended("holder");
    assert_eq!(
        h.call_open(conn, &extend(2, &["k"], 0, 10)),
        [Reply::Error {
            rid: 2,
            code: ErrorCode::BadToken
        }]
    );
    assert_eq!(
        h.call_open(conn, &extend(3, &["k"], 7, 251)),
        [Reply::Error {
            rid: 3,
            code: ErrorCode::BadLease
        }]
    );
    granted(&h.call_open(conn, &acquire(4, &["k"], 0, 10)));
}

// ---------------------------------------------------------------- pushes

fn push(token: u64, kind: PushKind, lease_ms: u32) -> Reply {
    Reply::Push {
        token,
        kind,
        lease_ms,
    }
}

#[test]
fn a_holder_that_asked_hears_its_lease_is_ending_and_then_that_it_ran_out() {
    let mut h = SingleNet::default();
    let conn = h.connect_pushed();
    let token = granted(&h.call_open(conn, &acquire(2, &["k"], 0, 8)));
    // A quarter of an 8 s lease: told 2 s before the end, not earlier.
    h.advance(Duration::from_millis(5_999));
    assert_eq!(h.unsolicited(conn), []);
    h.advance(Duration::from_millis(1));
    assert_eq!(
        h.unsolicited(conn),
        [push(token, PushKind::LeaseEnding, 2_000)]
    );
    h.advance(Duration::from_millis(1_999));
    assert_eq!(h.unsolicited(conn), []);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.unsolicited(conn), [push(token, PushKind::Expired, 0)]);
    h.advance(Duration::from_secs(30));
    assert_eq!(h.unsolicited(conn), [], "told once");
}

#[test]
fn a_renewal_moves_the_warning_to_the_renewed_lease() {
    let mut h = SingleNet::default();
    let conn = h.connect_pushed();
    let token = granted(&h.call_open(conn, &acquire(2, &["k"], 0, 4)));
    h.advance(Duration::from_secs(2));
    h.call_open(conn, &extend(3, &["k"], token, 8));
    // The first lease's warning time (3 s) passes in silence; the renewed
    // lease ends at 10 s and is told 2 s before.
    h.advance(Duration::from_millis(5_999));
    assert_eq!(h.unsolicited(conn), []);
    h.advance(Duration::from_millis(1));
    assert_eq!(
        h.unsolicited(conn),
        [push(token, PushKind::LeaseEnding, 2_000)]
    );
}

#[test]
fn a_force_release_is_pushed_at_once_and_a_release_by_the_holder_is_not() {
    let mut h = SingleNet::default();
    let conn = h.connect_pushed();
    let revoked = granted(&h.call_open(conn, &acquire(2, &["a"], 0, 60)));
    let released = granted(&h.call_open(conn, &acquire(3, &["b"], 0, 60)));
    h.force_release("a", None);
    assert_eq!(
        h.unsolicited(conn),
        [push(revoked, PushKind::ForceReleased, 0)]
    );
    assert_eq!(
        h.call_open(conn, &release(4, &["b"], released)),
        [Reply::Released { rid: 4 }]
    );
    h.advance(Duration::from_secs(120));
    assert_eq!(h.unsolicited(conn), [], "nothing about either any more");
}

#[test]
fn a_lease_that_runs_out_into_a_waiters_hands_is_pushed_as_expired() {
    let mut h = SingleNet::default();
    let holder = h.connect_pushed();
    let waiter = h.connect();
    let token = granted(&h.call_open(holder, &acquire(2, &["k"], 0, 2)));
    assert_eq!(h.call_open(waiter, &acquire(1, &["k"], 30, 5)), []);
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.unsolicited(holder),
        [push(token, PushKind::LeaseEnding, 1_000)]
    );
    h.advance(Duration::from_secs(1));
    assert!(granted(&h.unsolicited(waiter)) > token);
    assert_eq!(h.unsolicited(holder), [push(token, PushKind::Expired, 0)]);
}

#[test]
fn no_connection_that_did_not_ask_for_pushes_ever_gets_one() {
    let mut h = SingleNet::default();
    let plain = h.connect();
    let renewing = h.connect_extended("renews, no pushes");
    granted(&h.call_open(plain, &acquire(1, &["a"], 0, 2)));
    granted(&h.call_open(renewing, &acquire(2, &["b"], 0, 2)));
    h.force_release("b", None);
    for _ in 0..10 {
        h.advance(Duration::from_secs(1));
        assert_eq!(h.take(plain).0, Vec::<u8>::new());
        assert_eq!(h.take(renewing).0, Vec::<u8>::new());
    }
}

#[test]
fn an_h_acquire_caps_the_hold_and_renewals_are_clipped_then_refused_at_the_cap() {
    use ticketing_core::wire::AcquireCappedRequest;
    let mut h = SingleNet::default();
    let conn = h.connect_extended("capped");
    let capped = Request::AcquireCapped(AcquireCappedRequest {
        rid: 2,
        wait_s: 0,
        lease_s: 10,
        max_hold_s: 15,
        keys: group(&["k"]),
    });
    let token = granted(&h.call_open(conn, &capped));
    h.advance(Duration::from_secs(8));
    assert_eq!(
        h.call_open(conn, &extend(3, &["k"], token, 10)),
        [Reply::Extended {
            rid: 3,
            status: ExtendStatus::Clipped,
            lease_ms: 7_000
        }]
    );
    assert_eq!(
        h.call_open(conn, &extend(4, &["k"], token, 10)),
        [Reply::Extended {
            rid: 4,
            status: ExtendStatus::AtCap,
            lease_ms: 7_000
        }]
    );
    // Inspection says how often it was renewed and when the cap ends it.
    let view = h.server.inspect_lock(h.now, &Key::new(b"k").unwrap());
    let holder = view.unwrap().holder.unwrap();
    // The clipped renewal moved the lease; the refused one did not.
    assert_eq!(holder.extensions, 1);
    assert_eq!(holder.hold_remaining_ms, Some(7_000));
    assert_eq!(holder.lease_remaining_ms, 7_000);
    // `H` is an unknown op on a connection that negotiated nothing.
    let plain = h.connect();
    let (bytes, state) = h.send_frame(plain, &capped.to_frame());
    assert!(bytes.is_empty());
    assert_eq!(state, ConnState::CloseAfterFlush);
}
