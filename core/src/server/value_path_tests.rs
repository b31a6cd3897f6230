//! The value path of an in-process link ([`Machine::handle_requests`],
//! [`Machine::poll_transmit_replies`]) against the byte path: the same
//! requests get the same replies, counts and hand-overs, and a grant whose
//! reply value was never flushed is released like one whose frame was never
//! written.

use std::net::{IpAddr, Ipv4Addr};

use crate::auth::{ClientHandshake, ClientHandshakeStatus, SINGLE_FINGERPRINT, WireMode};
use crate::machine::Machine;
use crate::server::{ConnId, ConnState, Server, ServerConfig};
use crate::time::{Duration, Instant};
use crate::wire::{
    AcquireRequest, ErrorCode, Key, KeyGroup, NO_LEADER_SLOT, ReleaseRequest, Reply, Request,
};

const FIRST_TOKEN: u64 = 1_700_000_000_000_000;

fn keys(names: &[&str]) -> KeyGroup {
    KeyGroup::new(
        names
            .iter()
            .map(|name| Key::new(name.as_bytes()).unwrap())
            .collect(),
    )
    .unwrap()
}

fn acquire(rid: u64, names: &[&str], wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: keys(names),
        set: names.len() > 1,
    })
}

fn release(rid: u64, names: &[&str], token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: keys(names),
        set: names.len() > 1,
    })
}

/// A server driven one way: requests as frames, or as values.
struct Side {
    server: Server,
    now: Instant,
    values: bool,
}

impl Side {
    fn new(values: bool) -> Self {
        let now = Instant::from_millis(1_000);
        Side {
            server: Server::new(ServerConfig::default(), FIRST_TOKEN, now),
            now,
            values,
        }
    }

    /// What the server has for `conn`: bytes, reply values, state.
    fn take(&mut self, conn: ConnId) -> (Vec<u8>, Vec<Reply>, ConnState) {
        let (mut bytes, mut replies) = (Vec::new(), Vec::new());
        let state = self
            .server
            .poll_transmit_replies(conn, &mut bytes, &mut replies);
        (bytes, replies, state)
    }

    /// A connection past its handshake (which goes as bytes either way).
    fn connect(&mut self) -> ConnId {
        let source = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let conn = self
            .server
            .handle_connect(self.now, [0x5a; 16], source)
            .unwrap();
        let (hello, _, _) = self.take(conn);
        let mut client =
            ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
        assert_eq!(
            client.handle_input(&hello).1,
            ClientHandshakeStatus::SendProof
        );
        self.server
            .handle_input(self.now, conn, &client.proof().unwrap());
        let (result, _, _) = self.take(conn);
        self.server.handle_flushed(self.now, conn);
        assert_eq!(
            client.handle_input(&result).1,
            ClientHandshakeStatus::Accepted
        );
        conn
    }

    fn send(&mut self, conn: ConnId, request: Request) {
        if self.values {
            let mut requests = vec![request];
            self.server.handle_requests(self.now, conn, &mut requests);
            assert!(requests.is_empty());
        } else {
            self.server
                .handle_input(self.now, conn, &request.to_frame());
        }
    }

    /// The replies waiting for `conn`, taken and flushed.
    fn replies(&mut self, conn: ConnId) -> Vec<Reply> {
        let (bytes, mut values, state) = self.take(conn);
        assert_eq!(state, ConnState::Open);
        self.server.handle_flushed(self.now, conn);
        if self.values {
            assert!(bytes.is_empty(), "a value connection gets no bytes");
        } else {
            assert!(values.is_empty(), "a byte connection gets no values");
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (reply, used) = Reply::decode(rest).unwrap().unwrap();
                values.push(reply);
                rest = &rest[used..];
            }
        }
        values
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        self.server.handle_timeout(self.now);
    }
}

#[test]
fn values_get_the_replies_frames_get() {
    let token = FIRST_TOKEN;
    // (connection index, request) → replies on both connections.
    let script: Vec<(usize, Request)> = vec![
        (0, acquire(1, &["a"], 0, 10)),
        (1, acquire(1, &["a"], 5, 10)),
        (0, acquire(2, &["x"], 0, 0)),
        (0, acquire(3, &["x"], 0, 251)),
        (0, release(4, &["a"], 0)),
        (0, release(5, &["a"], token + 99)),
        (0, acquire(6, &["b", "c"], 0, 10)),
        (0, release(7, &["b", "d"], token + 1)),
        (0, release(8, &["a"], token)),
        (1, acquire(2, &["b"], 0, 10)),
        (1, release(3, &["a"], token + 2)),
        (0, release(9, &["b", "c"], token + 1)),
        (1, release(4, &["a"], token + 2)),
    ];
    let mut sides = [Side::new(false), Side::new(true)];
    let conns: Vec<[ConnId; 2]> = sides
        .iter_mut()
        .map(|side| [side.connect(), side.connect()])
        .collect();
    let mut seen = Vec::new();
    for (step, (who, request)) in script.into_iter().enumerate() {
        let got: Vec<Vec<Vec<Reply>>> = sides
            .iter_mut()
            .zip(&conns)
            .map(|(side, conns)| {
                side.send(conns[who], request.clone());
                conns.iter().map(|&conn| side.replies(conn)).collect()
            })
            .collect();
        assert_eq!(got[0], got[1], "step {step}: {request:?}");
        seen.extend(got[0].concat());
    }
    // The script covers grants, hand-overs, rejections and refusals.
    assert!(seen.contains(&Reply::Acquired { rid: 1, token }));
    assert!(seen.contains(&Reply::Acquired {
        rid: 1,
        token: token + 2
    }));
    assert!(seen.contains(&Reply::Error {
        rid: 2,
        code: ErrorCode::BadLease
    }));
    assert!(seen.contains(&Reply::Error {
        rid: 4,
        code: ErrorCode::BadToken
    }));
    assert!(seen.contains(&Reply::NotFound { rid: 5 }));
    assert!(seen.contains(&Reply::Error {
        rid: 7,
        code: ErrorCode::GroupMismatch
    }));
    // Wait 0 on a held key: `T` at once.
    assert!(seen.contains(&Reply::TimedOut { rid: 2 }));
    let [bytes, values] = &sides;
    assert_eq!(bytes.server.metrics(), values.server.metrics());
    for (byte_conn, value_conn) in conns[0].iter().zip(&conns[1]) {
        assert_eq!(
            bytes.server.held_keys(*byte_conn),
            values.server.held_keys(*value_conn)
        );
    }
}

#[test]
fn a_grant_whose_reply_value_was_never_flushed_goes_to_the_next_waiter() {
    for flushed in [false, true] {
        let mut side = Side::new(true);
        let (holder, waiter) = (side.connect(), side.connect());
        side.send(holder, acquire(1, &["g"], 0, 5));
        side.send(waiter, acquire(1, &["g"], 10, 30));
        if flushed {
            assert_eq!(
                side.replies(holder),
                [Reply::Acquired {
                    rid: 1,
                    token: FIRST_TOKEN
                }]
            );
        } else {
            // Taken by the driver but never fed to the session.
            let (_, replies, _) = side.take(holder);
            assert_eq!(replies.len(), 1);
        }
        side.server.handle_closed(side.now, holder);
        let expected = if flushed {
            // Delivered: the key stays with its holder until the lease ends.
            Vec::new()
        } else {
            vec![Reply::Acquired {
                rid: 1,
                token: FIRST_TOKEN + 1,
            }]
        };
        assert_eq!(side.replies(waiter), expected, "flushed: {flushed}");
        if flushed {
            side.advance(Duration::from_secs(5));
            assert_eq!(
                side.replies(waiter),
                [Reply::Acquired {
                    rid: 1,
                    token: FIRST_TOKEN + 1
                }]
            );
        }
    }
}

#[test]
fn values_are_refused_before_the_session_and_for_rid_zero() {
    let mut side = Side::new(true);
    let source = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let early = side
        .server
        .handle_connect(side.now, [0x5a; 16], source)
        .unwrap();
    let _hello = side.take(early);
    side.send(early, acquire(1, &["a"], 0, 10));
    assert_eq!(side.take(early).2, ConnState::CloseAfterFlush);

    let conn = side.connect();
    side.send(conn, acquire(0, &["a"], 0, 10));
    let (bytes, replies, state) = side.take(conn);
    assert!(bytes.is_empty() && replies.is_empty());
    assert_eq!(state, ConnState::CloseAfterFlush);
    assert_eq!(side.server.lock_table().stats().keys, 0);

    // Once values, never bytes again.
    let conn = side.connect();
    side.send(conn, acquire(1, &["a"], 0, 10));
    assert_eq!(side.replies(conn).len(), 1);
    side.server
        .handle_input(side.now, conn, &acquire(2, &["b"], 0, 10).to_frame());
    let (bytes, replies, state) = side.take(conn);
    assert!(bytes.is_empty() && replies.is_empty());
    assert_eq!(state, ConnState::CloseAfterFlush);
}
