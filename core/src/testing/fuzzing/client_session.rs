//! The client session state machine against a hostile server: see
//! [`client_session`].

use std::collections::BTreeMap;

use crate::auth::{Hello, NONCE_LEN, PROOF_LEN, SINGLE_SELF_SLOT, WireMode};
use crate::client::{
    AcquireParams, CancelOutcome, CloseReason, KeySet, Outcome, Session, SessionConfig,
    SessionEvent,
};
use crate::lock::KeyModes;
use crate::time::{Duration, Instant};
use crate::wire::{
    Capabilities, Decoded, ErrorCode, ExtendStatus, NO_LEADER_SLOT, PushKind, Reply, Request,
    RequestDecoder,
};

use super::script::{Cursor, FUZZ_KEYS};

/// What the harness knows about one submitted request.
#[derive(Debug)]
struct Tracked {
    keys: KeySet,
    acquire: bool,
    /// A renewal (`W`): only it may end `Extended`.
    extend: bool,
    /// A downgrade (`D`): only it may end `Downgraded`.
    downgrade: bool,
    /// The lease asked for (an acquire's or a renewal's).
    lease: Duration,
    /// When its bytes were handed out, as decoded from the session's output.
    sent_at: Option<Instant>,
    /// The server was made to answer it `M` or `E 4`, "no effect, try
    /// again" (the session may still have refused that reply, or another
    /// one first).
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
/// `Retry` only when it was answered `M` or `E 4` (which leave the session
/// up) or the session closed on `E 3`; a grant
/// names the requested keys, a non-zero token, and a validity no later
/// than the lease counted from when its bytes were handed out.
///
/// An input that starts with `X` configures the session to negotiate the
/// extension (docs/protocol.md §8) with the capabilities in its next byte;
/// op bytes `0xF0` and above then queue `X` answers, `W` answers and `P`
/// pushes, or submit renewals. Checks besides: the `X` is the first
/// request sent and nothing follows it before its answer; the session uses
/// only capabilities it asked for and was granted, and refuses a renewal
/// locally without EXTEND; only a renewal ends `Extended`, valid no later
/// than the lease asked for counted from its send; a push changes no
/// request's outcome (every id still resolves exactly once).
pub fn client_session(data: &[u8]) {
    let (wanted, data) = match data {
        [b'X', bits, rest @ ..] => (Capabilities(u32::from(*bits) & 3), rest),
        _ => (Capabilities::NONE, data),
    };
    let mut cursor = Cursor { data };
    let mut harness = Harness::new(wanted);
    for _ in 0..256 {
        let Some(op) = cursor.byte() else { break };
        harness.step(&mut cursor, op);
        harness.drain();
    }
    harness.finish();
}

/// The session under test and the scripted server's view of it.
struct Harness {
    now: Instant,
    session: Session,
    tracked: BTreeMap<u64, Tracked>,
    /// Server → session bytes not yet delivered.
    to_session: Vec<u8>,
    /// Session → server bytes, decoded to learn what was handed out.
    from_session: Vec<u8>,
    proof_skipped: bool,
    requests: RequestDecoder,
    closed: Option<CloseReason>,
    /// What the session was configured to ask for with `X`.
    wanted: Capabilities,
    /// The rid of the session's `X`, once sent.
    negotiation: Option<u64>,
}

impl Harness {
    fn new(wanted: Capabilities) -> Harness {
        let now = Instant::from_millis(1);
        let mut config = SessionConfig::single(b"");
        config.pending_acquires_max = 4;
        config.pending_releases_max = 2;
        config.extensions = wanted;
        Harness {
            now,
            session: Session::new(now, config),
            tracked: BTreeMap::new(),
            to_session: Vec::new(),
            from_session: Vec::new(),
            proof_skipped: false,
            requests: RequestDecoder::new(),
            closed: None,
            wanted,
            negotiation: None,
        }
    }

    /// One script step, picked by `op`.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8) {
        if self.wanted != Capabilities::NONE && op >= 0xF0 {
            return self.extension_step(cursor, op);
        }
        match op % 12 {
            0 => self.queue_hello(cursor),
            1 => self.queue_result(cursor),
            2 | 3 => self.queue_reply(cursor),
            4 => self.queue_raw(cursor),
            5 | 6 => self.deliver(cursor),
            7 => self.submit(cursor),
            8 => self.transmit(),
            9 => self.advance_clock(cursor),
            10 => self.cancel(cursor),
            _ => self.close(cursor),
        }
    }

    /// One step of the extension, picked by the low bits of `op`.
    fn extension_step(&mut self, cursor: &mut Cursor<'_>, op: u8) {
        match op % 4 {
            0 => self.queue_negotiated(cursor),
            1 if op & 0x08 != 0 => self.queue_downgraded(cursor),
            1 => self.queue_extended(cursor),
            2 => self.queue_push(cursor),
            _ if op & 0x08 != 0 => self.submit_shared(cursor),
            _ => self.submit_extend(cursor),
        }
    }

    /// Queues an `X` answer, usually to the session's `X`, granting any
    /// bits (unknown ones and ones not asked for too).
    fn queue_negotiated(&mut self, cursor: &mut Cursor<'_>) {
        let bits = cursor.byte().unwrap_or(3);
        let rid = match self.negotiation {
            Some(rid) if bits & 0x80 == 0 => rid,
            _ => u64::from(cursor.byte().unwrap_or(1)),
        };
        Reply::Negotiated {
            rid,
            granted: Capabilities(u32::from(bits & 0x0F)),
        }
        .encode(&mut self.to_session);
    }

    /// Queues a `W` answer to a tracked request (a renewal or not) or a
    /// made-up one, of any status and lease.
    fn queue_extended(&mut self, cursor: &mut Cursor<'_>) {
        let pick = usize::from(cursor.byte().unwrap_or(0));
        let rid = match self.tracked.keys().nth(pick % self.tracked.len().max(1)) {
            Some(&rid) if pick != 255 => rid,
            _ => u64::from(cursor.byte().unwrap_or(0)),
        };
        let arg = cursor.byte().unwrap_or(0);
        let status = match arg % 3 {
            0 => ExtendStatus::Extended,
            1 => ExtendStatus::Clipped,
            _ => ExtendStatus::AtCap,
        };
        // Up to past the longest lease (250 s), so a server that answers
        // more than was asked is among them.
        let lease_ms = u32::from(arg) * 1_100;
        Reply::Extended {
            rid,
            status,
            lease_ms,
        }
        .encode(&mut self.to_session);
    }

    /// Queues a `D` answer to a tracked request (a downgrade or not) or a
    /// made-up one.
    fn queue_downgraded(&mut self, cursor: &mut Cursor<'_>) {
        let pick = usize::from(cursor.byte().unwrap_or(0));
        let rid = match self.tracked.keys().nth(pick % self.tracked.len().max(1)) {
            Some(&rid) if pick != 255 => rid,
            _ => u64::from(cursor.byte().unwrap_or(0)),
        };
        Reply::Downgraded { rid }.encode(&mut self.to_session);
    }

    /// Submits a shared acquire (`Y`) or a downgrade (`D`); either is
    /// accepted only on a session granted SHARED (an acquire also before
    /// the negotiation is answered: it waits for it).
    fn submit_shared(&mut self, cursor: &mut Cursor<'_>) {
        let bits = cursor.byte().unwrap_or(1);
        let arg = cursor.byte().unwrap_or(0);
        let keys = keyset(bits);
        let granted = self.session.capabilities();
        let (result, acquire, lease) = if arg & 0x80 == 0 {
            let params = AcquireParams::new(
                Duration::from_secs(u64::from(arg % 4)),
                Duration::from_secs(1 + u64::from(arg % 5)),
                Duration::ZERO,
            )
            .expect("valid params")
            .with_modes(KeyModes::from_bits(u16::from(bits)));
            let deadline = params.operation_deadline(self.now);
            let result = self
                .session
                .submit_acquire(self.now, keys.clone(), &params, deadline);
            (result, true, params.lease())
        } else {
            let deadline = self.now.saturating_add(Duration::from_secs(2));
            let token = u64::from(arg & 0x7f) + 1;
            let result = self
                .session
                .submit_downgrade(self.now, keys.clone(), token, deadline);
            (result, false, Duration::ZERO)
        };
        let Ok(rid) = result else {
            return;
        };
        assert!(self.closed.is_none(), "accepted a request after closing");
        let modes_named = u16::from(bits) & ((1 << keys.len()) - 1) != 0;
        if !acquire || (self.session.is_ready() && modes_named) {
            assert!(
                granted.contains(Capabilities::SHARED),
                "shared request sent unasked"
            );
        }
        let fresh = self.tracked.insert(
            rid,
            Tracked {
                keys,
                acquire,
                extend: false,
                downgrade: !acquire,
                lease,
                sent_at: None,
                moved: false,
                resolved: None,
            },
        );
        assert!(fresh.is_none(), "rid {rid} handed out twice");
    }

    /// Queues a push about a token the bytes choose (granted or not).
    fn queue_push(&mut self, cursor: &mut Cursor<'_>) {
        let arg = cursor.byte().unwrap_or(0);
        let kind = PushKind::from_u8(1 + arg % 4).expect("kinds 1..=4");
        Reply::Push {
            token: u64::from(arg >> 2) + 1,
            kind,
            lease_ms: u32::from(cursor.byte().unwrap_or(0)) * 100,
        }
        .encode(&mut self.to_session);
    }

    /// Submits a renewal; accepted only on a ready session granted EXTEND.
    fn submit_extend(&mut self, cursor: &mut Cursor<'_>) {
        let bits = cursor.byte().unwrap_or(1);
        let arg = cursor.byte().unwrap_or(0);
        let keys = keyset(bits);
        let lease = Duration::from_secs(1 + u64::from(arg % 5));
        let deadline = self.now.saturating_add(Duration::from_secs(2));
        let granted = self.session.capabilities();
        assert!(self.wanted.contains(granted), "uses {granted:?} unasked");
        let result =
            self.session
                .submit_extend(self.now, keys.clone(), u64::from(arg) + 1, lease, deadline);
        if let Ok(rid) = result {
            assert!(self.closed.is_none(), "accepted a renewal after closing");
            assert!(
                granted.contains(Capabilities::EXTEND),
                "renewal sent unasked"
            );
            let fresh = self.tracked.insert(
                rid,
                Tracked {
                    keys,
                    acquire: false,
                    extend: true,
                    downgrade: false,
                    lease,
                    sent_at: None,
                    moved: false,
                    resolved: None,
                },
            );
            assert!(fresh.is_none(), "rid {rid} handed out twice");
        }
    }

    /// Queues a server hello with a nonce the bytes choose.
    fn queue_hello(&mut self, cursor: &mut Cursor<'_>) {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[0] = cursor.byte().unwrap_or(0);
        let hello = Hello {
            mode: WireMode::Single,
            self_slot: SINGLE_SELF_SLOT,
            nonce,
        };
        self.to_session.extend_from_slice(&hello.encode());
    }

    /// Queues the result byte.
    fn queue_result(&mut self, cursor: &mut Cursor<'_>) {
        // The result byte: usually "accepted".
        let byte = cursor.byte().unwrap_or(1);
        self.to_session.push(if byte < 200 { 1 } else { byte % 3 });
    }

    /// Queues a reply to a tracked request id or a made-up one.
    fn queue_reply(&mut self, cursor: &mut Cursor<'_>) {
        let pick = usize::from(cursor.byte().unwrap_or(0));
        let rid = if self.tracked.is_empty() || pick == 255 {
            u64::from(cursor.byte().unwrap_or(0))
        } else {
            *self
                .tracked
                .keys()
                .nth(pick % self.tracked.len())
                .expect("non-empty")
        };
        let reply = reply(cursor, rid);
        let no_effect = matches!(
            reply,
            Reply::Moved { .. }
                | Reply::Error {
                    code: ErrorCode::NoLeader,
                    ..
                }
        );
        if let (true, Some(entry)) = (no_effect, self.tracked.get_mut(&rid)) {
            entry.moved = true;
        }
        reply.encode(&mut self.to_session);
    }

    /// Queues up to 31 raw bytes.
    fn queue_raw(&mut self, cursor: &mut Cursor<'_>) {
        let len = usize::from(cursor.byte().unwrap_or(0) % 32);
        self.to_session.extend_from_slice(cursor.bytes(len));
    }

    /// Delivers some of the queued server bytes.
    fn deliver(&mut self, cursor: &mut Cursor<'_>) {
        let take = usize::from(cursor.byte().unwrap_or(255)).min(self.to_session.len());
        let bytes: Vec<u8> = self.to_session.drain(..take).collect();
        self.session.handle_input(self.now, &bytes);
    }

    /// Submits an acquire or a release, and tracks it if accepted.
    fn submit(&mut self, cursor: &mut Cursor<'_>) {
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
            let deadline = params.operation_deadline(self.now);
            self.session
                .submit_acquire(self.now, keys.clone(), &params, deadline)
                .map(|rid| (rid, true, params.lease()))
        } else {
            let deadline = self.now.saturating_add(Duration::from_secs(2));
            self.session
                .submit_release(self.now, keys.clone(), u64::from(arg) + 1, deadline)
                .map(|rid| (rid, false, Duration::ZERO))
        };
        if let Ok((rid, acquire, lease)) = result {
            assert!(self.closed.is_none(), "accepted a request after closing");
            let fresh = self.tracked.insert(
                rid,
                Tracked {
                    keys,
                    acquire,
                    extend: false,
                    downgrade: false,
                    lease,
                    sent_at: None,
                    moved: false,
                    resolved: None,
                },
            );
            assert!(fresh.is_none(), "rid {rid} handed out twice");
        }
    }

    /// Takes what the session sends and notes which requests left.
    fn transmit(&mut self) {
        let mut out = Vec::new();
        let len = self.session.poll_transmit(self.now, &mut out);
        assert_eq!(len, out.len());
        if len > 0 {
            // The scripted server's side takes every byte at once.
            self.session.handle_written(self.now, true);
        }
        self.from_session.extend_from_slice(&out);
        if !self.proof_skipped && self.from_session.len() >= PROOF_LEN {
            self.proof_skipped = true;
            self.from_session.drain(..PROOF_LEN);
        }
        if self.proof_skipped {
            self.requests.push(&self.from_session);
            self.from_session.clear();
            loop {
                let decoded = match self.requests.next() {
                    Ok(Some(decoded)) => decoded,
                    Ok(None) => break,
                    Err(error) => panic!("the session sent bytes no server reads: {error:?}"),
                };
                let Decoded::Request(request) = decoded else {
                    panic!("the session sent a frame its server refuses: {decoded:?}");
                };
                let rid = request.rid();
                if let Request::Negotiate(negotiate) = &request {
                    assert_eq!(negotiate.wanted, self.wanted);
                    assert!(self.negotiation.is_none(), "a second X");
                    assert!(
                        self.tracked.values().all(|t| t.sent_at.is_none()),
                        "X after another request"
                    );
                    self.negotiation = Some(rid);
                    // The server reads what the session may send once it
                    // is granted anything: its renewals are `W` frames.
                    self.requests.grant(Capabilities::KNOWN);
                    continue;
                }
                // Ready: the handshake is done and the `X`, if any, was
                // answered (the session took its answer).
                assert!(self.session.is_ready(), "rid {rid} sent before ready");
                assert!(
                    self.wanted == Capabilities::NONE || self.negotiation.is_some(),
                    "rid {rid} sent without the X first"
                );
                let entry = self.tracked.get_mut(&rid).expect("sent an unknown rid");
                assert!(entry.sent_at.is_none(), "rid {rid} sent twice");
                assert!(entry.resolved.is_none(), "rid {rid} sent after it ended");
                entry.sent_at = Some(self.now);
            }
        }
    }

    /// Moves the clock on by up to about 10 s and serves the timers.
    fn advance_clock(&mut self, cursor: &mut Cursor<'_>) {
        self.now = self.now.saturating_add(Duration::from_millis(
            u64::from(cursor.byte().unwrap_or(0)) * 40,
        ));
        self.session.handle_timeout(self.now);
    }

    /// Cancels a tracked request: the cancel agrees with how it stands.
    fn cancel(&mut self, cursor: &mut Cursor<'_>) {
        if let Some(&rid) = self
            .tracked
            .keys()
            .nth(usize::from(cursor.byte().unwrap_or(0)) % self.tracked.len().max(1))
        {
            let outcome = self.session.cancel(self.now, rid);
            let entry = self.tracked.get_mut(&rid).expect("tracked");
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

    /// Closes the transport or the session.
    fn close(&mut self, cursor: &mut Cursor<'_>) {
        if cursor.byte().unwrap_or(0) & 1 == 0 {
            self.session.handle_transport_closed(self.now);
        } else {
            self.session.close_local(self.now);
        }
    }

    fn drain(&mut self) {
        drain(&mut self.session, &mut self.tracked, &mut self.closed);
    }

    /// Closes the session and checks how every request ended.
    fn finish(mut self) {
        self.session.close_local(self.now);
        self.drain();
        assert!(self.closed.is_some(), "close_local reports Closed");
        assert_eq!(self.session.pending_len(), 0);
        let reason = self.closed.expect("closed");
        for (rid, entry) in &self.tracked {
            let resolution = entry
                .resolved
                .as_ref()
                .unwrap_or_else(|| panic!("rid {rid} never resolved"));
            if let Resolution::Outcome(Outcome::Retry) = resolution
                && entry.sent_at.is_some()
            {
                assert!(
                    entry.moved || matches!(reason, CloseReason::ServerError(ErrorCode::NotActive)),
                    "sent rid {rid} told Retry without an `M` or `E 4`, session closed by {reason:?}"
                );
            }
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
                if let Outcome::Extended { valid_before, .. } = &outcome {
                    assert!(entry.extend, "rid {rid} ended Extended, not a renewal");
                    let sent_at = entry.sent_at.expect("answered, so sent");
                    assert!(*valid_before <= sent_at.saturating_add(entry.lease));
                }
                if outcome == Outcome::Downgraded {
                    assert!(
                        entry.downgrade,
                        "rid {rid} ended Downgraded, not a downgrade"
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
            SessionEvent::Push { .. } => {
                // Only a session granted PUSH passes pushes on.
                assert!(
                    session.capabilities().contains(Capabilities::PUSH),
                    "a push on a session not granted PUSH"
                );
            }
            SessionEvent::Ready | SessionEvent::LeaderHint(_) | SessionEvent::NotLeader => {}
        }
    }
}
