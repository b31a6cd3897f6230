//! The client session state machine against a hostile server: see
//! [`client_session`].

use std::collections::BTreeMap;

use crate::auth::{Hello, NONCE_LEN, PROOF_LEN, SINGLE_SELF_SLOT, WireMode};
use crate::client::{
    AcquireParams, CancelOutcome, CloseReason, KeySet, Outcome, Session, SessionConfig,
    SessionEvent,
};
use crate::time::{Duration, Instant};
use crate::wire::{Decoded, ErrorCode, NO_LEADER_SLOT, Reply, Request, RequestDecoder};

use super::{Cursor, FUZZ_KEYS};

/// What the harness knows about one submitted request.
#[derive(Debug)]
struct Tracked {
    keys: KeySet,
    acquire: bool,
    lease: Duration,
    /// When its bytes were handed out, as decoded from the session's output.
    sent_at: Option<Instant>,
    /// The server was made to answer it `M` (the session may still have
    /// refused that reply, or another one first).
    moved: bool,
    /// How it ended: an outcome event, or a cancel that took it.
    resolved: Option<Resolution>,
}

#[derive(Debug, PartialEq)]
enum Resolution {
    Outcome(Outcome),
    Cancelled(CancelOutcome),
}

fn keyset(bits: u8) -> KeySet {
    let names: Vec<&str> = FUZZ_KEYS
        .iter()
        .enumerate()
        .filter(|(index, _)| bits & (1 << index) != 0)
        .map(|(_, name)| *name)
        .collect();
    match names.as_slice() {
        [] => KeySet::single("a").expect("valid key"),
        [one] => KeySet::single(one).expect("valid key"),
        many => KeySet::new(many).expect("valid keys"),
    }
}

/// A well-formed reply to `rid` (or an `L`), of a kind the bytes choose;
/// it may well not fit the request, which the session must catch.
fn reply(cursor: &mut Cursor<'_>, rid: u64) -> Reply {
    let kind = cursor.byte().unwrap_or(0);
    let arg = cursor.byte().unwrap_or(0);
    let token = u64::from(arg) + 1;
    match kind % 11 {
        0 => Reply::Acquired { rid, token },
        1 => Reply::AcquiredSet { rid, token },
        2 => Reply::Released { rid },
        3 => Reply::ReleasedSet { rid },
        4 => Reply::NotFound { rid },
        5 => Reply::TimedOut { rid },
        6 => Reply::Busy { rid },
        7 => Reply::Indeterminate { rid },
        8 => Reply::Moved {
            rid,
            leader_slot: if arg & 1 == 0 { NO_LEADER_SLOT } else { arg },
        },
        9 => Reply::Error {
            rid,
            code: ErrorCode::from_u8(1 + arg % 7).expect("codes 1..=7"),
        },
        _ => Reply::Leader {
            leader_slot: if arg & 1 == 0 { NO_LEADER_SLOT } else { arg },
        },
    }
}

/// Runs one single-mode [`Session`] against a scripted hostile server: the
/// server's bytes (a hello, a result byte, replies to real or made-up
/// request ids of any kind, raw bytes) reach the session in arbitrary
/// splits, interleaved with submits, transmits, cancels, clock jumps and
/// closes.
///
/// Checks: every request id resolves exactly once (an outcome event, or a
/// cancel that took it); nothing at all is reported after `Closed`, and
/// nothing is pending then; a request whose bytes were never handed out
/// ends only as `Timeout` or `Retry`; one whose bytes were handed out ends
/// `Retry` only when it was answered `M` or the session closed on
/// `E 3`/`E 4`; a grant
/// names the requested keys, a non-zero token, and a validity no later
/// than the lease counted from when its bytes were handed out.
pub fn client_session(data: &[u8]) {
    let mut cursor = Cursor { data };
    let mut now = Instant::from_millis(1);
    let mut config = SessionConfig::single(b"");
    config.max_pending_acquires = 4;
    config.max_pending_releases = 2;
    let mut session = Session::new(now, config);
    let mut tracked: BTreeMap<u64, Tracked> = BTreeMap::new();
    // Server → session bytes not yet delivered.
    let mut to_session: Vec<u8> = Vec::new();
    // Session → server bytes, decoded to learn what was handed out.
    let mut from_session: Vec<u8> = Vec::new();
    let mut proof_skipped = false;
    let mut requests = RequestDecoder::new();
    let mut closed: Option<CloseReason> = None;

    for _ in 0..256 {
        let Some(op) = cursor.byte() else { break };
        match op % 12 {
            0 => {
                let mut nonce = [0u8; NONCE_LEN];
                nonce[0] = cursor.byte().unwrap_or(0);
                let hello = Hello {
                    mode: WireMode::Single,
                    self_slot: SINGLE_SELF_SLOT,
                    nonce,
                };
                to_session.extend_from_slice(&hello.encode());
            }
            1 => {
                // The result byte: usually "accepted".
                let byte = cursor.byte().unwrap_or(1);
                to_session.push(if byte < 200 { 1 } else { byte % 3 });
            }
            2 | 3 => {
                let pick = usize::from(cursor.byte().unwrap_or(0));
                let rid = if tracked.is_empty() || pick == 255 {
                    u64::from(cursor.byte().unwrap_or(0))
                } else {
                    *tracked.keys().nth(pick % tracked.len()).expect("non-empty")
                };
                let reply = reply(&mut cursor, rid);
                if let (Reply::Moved { .. }, Some(entry)) = (reply, tracked.get_mut(&rid)) {
                    entry.moved = true;
                }
                reply.encode(&mut to_session);
            }
            4 => {
                let len = usize::from(cursor.byte().unwrap_or(0) % 32);
                to_session.extend_from_slice(cursor.bytes(len));
            }
            5 | 6 => {
                let take = usize::from(cursor.byte().unwrap_or(255)).min(to_session.len());
                let bytes: Vec<u8> = to_session.drain(..take).collect();
                session.handle_input(now, &bytes);
            }
            7 => {
                let bits = cursor.byte().unwrap_or(1);
                let arg = cursor.byte().unwrap_or(0);
                let keys = keyset(bits);
                let result = if bits & 0x80 == 0 {
                    let params = AcquireParams::new(
                        Duration::from_secs(u64::from(arg % 4)),
                        Duration::from_secs(1 + u64::from(arg % 5)),
                        Duration::ZERO,
                    )
                    .expect("valid params");
                    let deadline = params.operation_deadline(now);
                    session
                        .submit_acquire(now, keys.clone(), &params, deadline)
                        .map(|rid| (rid, true, params.lease()))
                } else {
                    let deadline = now.saturating_add(Duration::from_secs(2));
                    session
                        .submit_release(now, keys.clone(), u64::from(arg) + 1, deadline)
                        .map(|rid| (rid, false, Duration::ZERO))
                };
                if let Ok((rid, acquire, lease)) = result {
                    assert!(closed.is_none(), "accepted a request after closing");
                    let fresh = tracked.insert(
                        rid,
                        Tracked {
                            keys,
                            acquire,
                            lease,
                            sent_at: None,
                            moved: false,
                            resolved: None,
                        },
                    );
                    assert!(fresh.is_none(), "rid {rid} handed out twice");
                }
            }
            8 => {
                let mut out = Vec::new();
                let len = session.poll_transmit(now, &mut out);
                assert_eq!(len, out.len());
                from_session.extend_from_slice(&out);
                if !proof_skipped && from_session.len() >= PROOF_LEN {
                    proof_skipped = true;
                    from_session.drain(..PROOF_LEN);
                }
                if proof_skipped {
                    requests.push(&from_session);
                    from_session.clear();
                    while let Ok(Some(decoded)) = requests.next() {
                        let Decoded::Request(request) = decoded else {
                            panic!("the session sent a frame its server refuses: {decoded:?}");
                        };
                        let rid = match &request {
                            Request::Acquire(req) => req.rid,
                            Request::Release(req) => req.rid,
                        };
                        let entry = tracked.get_mut(&rid).expect("sent an unknown rid");
                        assert!(entry.sent_at.is_none(), "rid {rid} sent twice");
                        assert!(entry.resolved.is_none(), "rid {rid} sent after it ended");
                        entry.sent_at = Some(now);
                    }
                }
            }
            9 => {
                now = now.saturating_add(Duration::from_millis(
                    u64::from(cursor.byte().unwrap_or(0)) * 40,
                ));
                session.handle_timeout(now);
            }
            10 => {
                if let Some(&rid) = tracked
                    .keys()
                    .nth(usize::from(cursor.byte().unwrap_or(0)) % tracked.len().max(1))
                {
                    let outcome = session.cancel(now, rid);
                    let entry = tracked.get_mut(&rid).expect("tracked");
                    match outcome {
                        CancelOutcome::Unknown => {
                            assert!(entry.resolved.is_some(), "unknown but unresolved");
                        }
                        taken => {
                            assert!(entry.resolved.is_none(), "cancelled after it ended");
                            if taken == CancelOutcome::Unsent {
                                assert!(entry.sent_at.is_none());
                            }
                            entry.resolved = Some(Resolution::Cancelled(taken));
                        }
                    }
                }
            }
            _ => {
                if cursor.byte().unwrap_or(0) & 1 == 0 {
                    session.handle_transport_closed(now);
                } else {
                    session.close_local(now);
                }
            }
        }
        drain(&mut session, &mut tracked, &mut closed);
    }
    session.close_local(now);
    drain(&mut session, &mut tracked, &mut closed);
    assert!(closed.is_some(), "close_local reports Closed");
    assert_eq!(session.pending_len(), 0);
    let reason = closed.expect("closed");
    for (rid, entry) in &tracked {
        let resolution = entry
            .resolved
            .as_ref()
            .unwrap_or_else(|| panic!("rid {rid} never resolved"));
        if let Resolution::Outcome(Outcome::Retry) = resolution
            && entry.sent_at.is_some()
        {
            assert!(
                entry.moved
                    || matches!(
                        reason,
                        CloseReason::ServerError(ErrorCode::NotActive | ErrorCode::NoLeader)
                    ),
                "sent rid {rid} told Retry without an `M`, session closed by {reason:?}"
            );
        }
    }
}

fn drain(
    session: &mut Session,
    tracked: &mut BTreeMap<u64, Tracked>,
    closed: &mut Option<CloseReason>,
) {
    while let Some(event) = session.poll_event() {
        assert!(closed.is_none(), "{event:?} after Closed");
        match event {
            SessionEvent::Outcome { rid, outcome } => {
                let entry = tracked
                    .get_mut(&rid)
                    .unwrap_or_else(|| panic!("outcome for unknown rid {rid}"));
                assert!(entry.resolved.is_none(), "rid {rid} resolved twice");
                if entry.sent_at.is_none() {
                    assert!(
                        matches!(outcome, Outcome::Timeout | Outcome::Retry),
                        "unsent rid {rid} ended {outcome:?}"
                    );
                }
                if let Outcome::Acquired(grant) = &outcome {
                    assert!(entry.acquire, "a release was granted");
                    assert_eq!(grant.keys, entry.keys);
                    assert_ne!(grant.token, 0);
                    let sent_at = entry.sent_at.expect("granted, so sent");
                    assert!(grant.valid_before <= sent_at.saturating_add(entry.lease));
                }
                entry.resolved = Some(Resolution::Outcome(outcome));
            }
            SessionEvent::Closed(reason) => {
                assert_eq!(session.pending_len(), 0, "pending after Closed");
                *closed = Some(reason);
            }
            SessionEvent::Compensate(compensation) => {
                assert_ne!(compensation.token, 0);
            }
            SessionEvent::Ready | SessionEvent::LeaderHint(_) | SessionEvent::NotLeader => {}
        }
    }
}
