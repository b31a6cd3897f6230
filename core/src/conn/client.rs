//! The client front end the single-mode server and the cluster node share:
//! handshake → dialect → session.
//!
//! Every client connection is greeted with the shared hello (a v3 hello
//! whose nonce is also a valid line challenge, [`shape_shared_nonce`]) and
//! is told apart by its answer: 32 raw bytes that verify as a v3 proof, or
//! 43 base64url characters and LF that verify as a line answer. From then
//! on the connection is one [`Dialect`] for its whole life. The front end
//! decodes that dialect's requests into dialect-neutral [`ClientRequest`]s,
//! answers on its own what needs no lock table (bad keys, bad leases, the
//! line release of token 0), and encodes the owner's [`Answer`]s back into
//! the dialect's replies. The owners know nothing of dialects beyond the
//! [`ReplyTo`] they keep with each request.

use crate::auth::{ClientTokens, HELLO_LEN, Hello, PROOF_LEN, RESULT_ACCEPTED, RESULT_REJECTED};
use crate::budget::CloseReason;
use crate::line::{
    LINE_ANSWER_LEN, LINE_MAX_WAIT_S, LINE_TEXT_LEN_MAX, LineDecoded, LineDecoder, LineError,
    LineFrameError, LineReply, LineRequest, is_base64url, line_nonce, shape_shared_nonce,
};
use crate::lock::ExtendOutcome;
use crate::metrics::ReplyCounts;
use crate::time::{Duration, Instant};
use crate::wire::{
    Capabilities, Decoded, ErrorCode, ExtendStatus, Key, KeyGroup, LEASE_S_MAX, NO_LEADER_SLOT,
    NegotiateRequest, Observed, PermitsRequest, Reply, Request, RequestDecoder, RequestKind, Slots,
    check_request,
};

use super::Dialect;

mod line;
mod v3;

use line::{line_answer, line_error, next_line};
use v3::v3_request;

/// How long a failed line handshake waits before its `Eauth_failed`: a
/// line client reconnects at once on that reason, so without the delay a
/// misconfigured one would try over a thousand times a second.
pub(crate) const LINE_AUTH_FAILED_DELAY: Duration = Duration::from_secs(1);

/// Where an answer goes: what the dialect needs to build its reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReplyTo {
    /// A v3 request: its id, and whether it named a key set.
    V3 {
        /// The request id.
        rid: u64,
        /// `S`/`G` rather than `A`/`R`.
        set: bool,
    },
    /// A line request: the owner (acquire) or token (release) and key to
    /// echo.
    Line {
        /// The owner or token, echoed.
        echo: u64,
        /// The key, echoed.
        key: EchoKey,
    },
}

/// Keys up to this many bytes are echoed from a copy inside the
/// [`ReplyTo`] itself.
const ECHO_INLINE_LEN: usize = 22;

/// A line request's key, kept to be echoed in its reply: a short key (most
/// are) is copied inline, so the request's key group holds the only
/// allocation of it (one allocation a request instead of two).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EchoKey {
    /// `bytes[..len]`.
    Inline {
        len: u8,
        bytes: [u8; ECHO_INLINE_LEN],
    },
    /// A key longer than [`ECHO_INLINE_LEN`].
    Shared(Key),
}

impl EchoKey {
    fn of(key: &Key) -> EchoKey {
        let key_bytes = key.as_bytes();
        match u8::try_from(key_bytes.len()) {
            Ok(len) if key_bytes.len() <= ECHO_INLINE_LEN => {
                let mut bytes = [0; ECHO_INLINE_LEN];
                bytes[..key_bytes.len()].copy_from_slice(key_bytes);
                EchoKey::Inline { len, bytes }
            }
            _ => EchoKey::Shared(key.clone()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            EchoKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            EchoKey::Shared(key) => key.as_bytes(),
        }
    }
}

/// The cap on total hold an acquire asks for; the owner turns it into a
/// cap by its [`crate::lock::HoldCaps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldAsk {
    /// None: a client that cannot renew (every published client), whose
    /// lease bounds its hold.
    Uncapped,
    /// Our client named none: the server's default cap.
    Default,
    /// Our client asked for this many seconds (`H`).
    Asked(u32),
}

/// A request, in terms both owners understand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClientRequest {
    /// Acquire `keys` for `lease_s`, waiting up to `wait_s` (0: one
    /// immediate try).
    Acquire {
        /// The wait bound in seconds.
        wait_s: u8,
        /// The lease in seconds, 1..=250.
        lease_s: u8,
        /// The key or key set.
        keys: KeyGroup,
        /// The cap on total hold asked for.
        hold: HoldAsk,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Release the grant `token` of `keys`.
    Release {
        /// The fencing token, non-zero.
        token: u64,
        /// The key or key set.
        keys: KeyGroup,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Renew the grant `token` to `lease_s` from now (a connection that
    /// negotiated [`Capabilities::EXTEND`]).
    Extend {
        /// The fencing token, non-zero.
        token: u64,
        /// The new lease in seconds, 1..=250.
        lease_s: u8,
        /// The grant's keys, as named by the client.
        keys: KeyGroup,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Take permits of a semaphore (a connection that negotiated
    /// [`Capabilities::PERMITS`]).
    AcquirePermits {
        /// The request as decoded.
        request: PermitsRequest,
        /// The cap on total hold asked for.
        hold: HoldAsk,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Who holds `name` (a connection that negotiated
    /// [`Capabilities::OBSERVE`]): read-only.
    Observe {
        /// The key observed.
        name: Key,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Acquire with a mode per key (a connection that negotiated
    /// [`Capabilities::SHARED`]).
    AcquireShared {
        /// The wait bound in seconds.
        wait_s: u8,
        /// The lease in seconds, 1..=250.
        lease_s: u8,
        /// Bit `i`: key `i` is wanted shared.
        modes: u16,
        /// The key or key set.
        keys: KeyGroup,
        /// The cap on total hold asked for.
        hold: HoldAsk,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
    /// Downgrade the grant `token` of `keys` to shared (a connection that
    /// negotiated [`Capabilities::SHARED`]).
    Downgrade {
        /// The fencing token, non-zero.
        token: u64,
        /// The grant's keys, as named by the client.
        keys: KeyGroup,
        /// Where the answer goes.
        reply_to: ReplyTo,
    },
}

impl ClientRequest {
    /// Where the answer goes.
    pub(crate) fn reply_to(&self) -> &ReplyTo {
        match self {
            ClientRequest::Acquire { reply_to, .. }
            | ClientRequest::Release { reply_to, .. }
            | ClientRequest::Extend { reply_to, .. }
            | ClientRequest::AcquirePermits { reply_to, .. }
            | ClientRequest::Observe { reply_to, .. }
            | ClientRequest::AcquireShared { reply_to, .. }
            | ClientRequest::Downgrade { reply_to, .. } => reply_to,
        }
    }

    /// Whether it is an acquire.
    pub(crate) fn is_acquire(&self) -> bool {
        matches!(
            self,
            ClientRequest::Acquire { .. }
                | ClientRequest::AcquirePermits { .. }
                | ClientRequest::AcquireShared { .. }
        )
    }
}

/// The owner's verdict on a request, in no dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Acquired under `token`.
    Granted {
        /// The fencing token.
        token: u64,
    },
    /// The wait ended; not acquired.
    TimedOut,
    /// A limit; nothing queued.
    Busy,
    /// Released.
    Released,
    /// Not found, or the token is not current.
    NotFound,
    /// The outcome is unknown (leadership lost after proposing).
    Indeterminate,
    /// Not the leader (`Some(slot)`: the known leader); no effect.
    NotLeader(Option<u8>),
    /// Not an active voter, or shutting down; no effect.
    NotActive,
    /// The token is current but holds another key group.
    GroupMismatch,
    /// The token was current: renewed (or clipped, or refused at the hold
    /// cap), with the lease now left.
    Extended {
        /// How the extension ended.
        status: ExtendStatus,
        /// The lease left, in milliseconds.
        lease_ms: u32,
    },
    /// Permits granted under `token`.
    PermitsGranted {
        /// The fencing token.
        token: u64,
        /// Slots still free.
        free: u16,
        /// The slots granted.
        slots: Slots,
    },
    /// The semaphore is in use with another capacity.
    CapacityMismatch {
        /// The capacity the request declared.
        asked: u16,
        /// The semaphore's.
        capacity: u16,
    },
    /// Who holds the key observed.
    Observed(Observed),
    /// The grant now holds its keys shared.
    Downgraded,
}

impl Answer {
    /// What an extension that came to `outcome` at `now` tells its client:
    /// the lease left (until the new end, or until `lease_end`, the lease
    /// as it stands, when refused at the cap), or not current. Both owners
    /// answer by this one rule.
    pub(crate) fn of_extension(outcome: ExtendOutcome, now: Instant, lease_end: Instant) -> Answer {
        let lease_left = |until: Instant| {
            let ms = until.saturating_duration_since(now).as_millis();
            u32::try_from(ms).unwrap_or(u32::MAX)
        };
        let (status, until) = match outcome {
            ExtendOutcome::Extended { expires_at } => (ExtendStatus::Extended, expires_at),
            ExtendOutcome::Clipped { expires_at } => (ExtendStatus::Clipped, expires_at),
            ExtendOutcome::AtCap => (ExtendStatus::AtCap, lease_end),
            ExtendOutcome::NotCurrent => return Answer::NotFound,
        };
        Answer::Extended {
            status,
            lease_ms: lease_left(until),
        }
    }
}

/// What the owner must do after an answer was encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Delivery {
    /// The reply is queued.
    Queued,
    /// The dialect cannot say this: close the connection (the client
    /// resends on a new one).
    Close,
}

impl ReplyTo {
    /// Appends the reply that tells `answer` to `out`. `addresses` are the
    /// slots' client addresses, for the line dialect's `M`.
    pub(crate) fn encode(
        &self,
        answer: Answer,
        addresses: &[Box<str>],
        out: &mut Vec<u8>,
    ) -> Delivery {
        match self {
            ReplyTo::V3 { rid, set } => {
                v3_reply(*rid, *set, answer).encode(out);
                Delivery::Queued
            }
            ReplyTo::Line { echo, key } => {
                line_answer(*echo, key.as_bytes(), answer, addresses, out)
            }
        }
    }
}

impl ReplyTo {
    /// Whether a release of `token` answered here names a token never
    /// issued (`next_token` is the next one the owner would issue) on a
    /// line connection: the shape of a 0.1.0-or-older client, whose release
    /// has no token and whose key bytes are read as one. Such clients are
    /// not served; the owner reports it.
    pub(crate) fn is_unissued_line_release(&self, token: u64, next_token: u64) -> bool {
        matches!(self, ReplyTo::Line { .. }) && token >= next_token
    }

    /// What `answer` is counted as in the metrics: its v3 reply, whatever
    /// the dialect, so both dialects count in one set of series.
    pub(crate) fn counted_as(&self, answer: Answer) -> Reply {
        match self {
            ReplyTo::V3 { rid, set } => v3_reply(*rid, *set, answer),
            ReplyTo::Line { .. } => v3_reply(1, false, answer),
        }
    }
}

fn v3_reply(rid: u64, set: bool, answer: Answer) -> Reply {
    match answer {
        Answer::Granted { token } if set => Reply::AcquiredSet { rid, token },
        Answer::Granted { token } => Reply::Acquired { rid, token },
        Answer::TimedOut => Reply::TimedOut { rid },
        Answer::Busy => Reply::Busy { rid },
        Answer::Released if set => Reply::ReleasedSet { rid },
        Answer::Released => Reply::Released { rid },
        Answer::Downgraded => Reply::Downgraded { rid },
        Answer::NotFound => Reply::NotFound { rid },
        Answer::Indeterminate => Reply::Indeterminate { rid },
        Answer::NotLeader(Some(leader_slot)) => Reply::Moved { rid, leader_slot },
        Answer::NotLeader(None) => Reply::Error {
            rid,
            code: ErrorCode::NoLeader,
        },
        Answer::NotActive => Reply::Error {
            rid,
            code: ErrorCode::NotActive,
        },
        Answer::GroupMismatch => Reply::Error {
            rid,
            code: ErrorCode::GroupMismatch,
        },
        Answer::Extended { status, lease_ms } => Reply::Extended {
            rid,
            status,
            lease_ms,
        },
        Answer::PermitsGranted { token, free, slots } => Reply::Permits {
            rid,
            token,
            free,
            slots,
        },
        Answer::CapacityMismatch { asked, capacity } => Reply::CapacityMismatch {
            rid,
            asked,
            capacity,
        },
        Answer::Observed(observed) => Reply::Observed { rid, observed },
    }
}

/// The client address of `slot`, if it has one that fits a line reply.
fn address_of(addresses: &[Box<str>], slot: u8) -> Option<&[u8]> {
    let address = addresses.get(usize::from(slot))?;
    (!address.is_empty() && address.len() <= LINE_TEXT_LEN_MAX).then_some(address.as_bytes())
}

/// What a handshake step came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrontInput {
    /// Still in the handshake, or nothing to do.
    Pending,
    /// The handshake just succeeded in this dialect; bytes after the answer
    /// are buffered for the session. The owner admits the session (then
    /// [`ClientFront::begin_session`]) or closes the connection.
    Accepted(Dialect),
    /// The answer matched no token. V3: the rejection byte is queued, close
    /// now. Line: close when [`ClientFront::handle_timeout`] says so (the
    /// owner schedules [`ClientFront::auth_failed_at`]).
    Rejected(Dialect),
    /// A session: the bytes were buffered; pull requests with
    /// [`ClientFront::next_request`].
    Session,
}

/// What a deadline did to a connection's front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrontTimeout {
    /// Nothing due.
    Nothing,
    /// The handshake did not finish in time: close.
    HandshakeTimedOut,
    /// The delayed `Eauth_failed` of a failed line handshake was queued:
    /// close.
    AuthFailedSent,
}

/// Handshake answer bytes: a v3 proof, or the start of a line answer.
#[derive(Debug)]
struct AnswerBytes {
    bytes: [u8; LINE_ANSWER_LEN],
    len: usize,
}

#[derive(Debug)]
enum Phase {
    /// Hello sent; collecting the answer.
    Handshake(AnswerBytes),
    /// A line answer failed; `Eauth_failed` goes out at `until`.
    LineRejected { until: Instant },
    /// Failed or timed out; closing.
    Failed,
    /// A v3 session.
    V3(RequestDecoder),
    /// A line session.
    Line(LineDecoder),
}

/// One client connection's handshake and session decoding.
#[derive(Debug)]
pub(crate) struct ClientFront {
    hello: Hello,
    fingerprint: [u8; 32],
    deadline: Instant,
    phase: Phase,
    /// The dialect's session started ([`ClientFront::begin_session`]).
    in_session: bool,
    /// What the owner serves of the extensions, and what was negotiated.
    extensions: Extensions,
}

/// A v3 session's extensions (docs/protocol.md §8): what the owner serves,
/// and what its one `X` negotiated.
#[derive(Debug)]
struct Extensions {
    /// The capabilities the owner serves.
    served: Capabilities,
    /// Set by the connection's `X`: a second one is refused.
    negotiated: bool,
    /// The client's label, from its `X`.
    label: Option<Box<str>>,
}

impl Extensions {
    /// Answers `X`: grants what is both wanted and served, from now on
    /// (the decoder takes the granted ops), and keeps the label.
    fn negotiate(&mut self, request: NegotiateRequest, decoder: &mut RequestDecoder) -> Reply {
        if self.negotiated {
            return Reply::Error {
                rid: request.rid,
                code: ErrorCode::BadExtension,
            };
        }
        self.negotiated = true;
        let granted = request.wanted.intersection(self.served);
        decoder.grant(granted);
        if !request.label.is_empty() {
            self.label = Some(request.label.into_boxed_str());
        }
        Reply::Negotiated {
            rid: request.rid,
            granted,
        }
    }
}

impl ClientFront {
    /// A front end that greets with `hello` (its nonce is shaped into the
    /// shared hello's here) and fails an unfinished handshake at
    /// `deadline`.
    pub(crate) fn new(mut hello: Hello, fingerprint: [u8; 32], deadline: Instant) -> Self {
        shape_shared_nonce(&mut hello.nonce);
        ClientFront {
            hello,
            fingerprint,
            deadline,
            phase: Phase::Handshake(AnswerBytes {
                bytes: [0; LINE_ANSWER_LEN],
                len: 0,
            }),
            in_session: false,
            extensions: Extensions {
                served: Capabilities::NONE,
                negotiated: false,
                label: None,
            },
        }
    }

    /// Serves the extensions of `served` to a v3 client that asks for them
    /// with `X`; without it an `X` is answered with nothing granted.
    pub(crate) fn serving(mut self, served: Capabilities) -> Self {
        self.extensions.served = served.intersection(Capabilities::KNOWN);
        self
    }

    /// What the connection negotiated ([`Capabilities::NONE`] for every
    /// published client).
    pub(crate) fn capabilities(&self) -> Capabilities {
        match &self.phase {
            Phase::V3(decoder) => decoder.capabilities(),
            _ => Capabilities::NONE,
        }
    }

    /// The label the client gave in its `X`, if any.
    pub(crate) fn label(&self) -> Option<&str> {
        self.extensions.label.as_deref()
    }

    /// The shared hello to send first.
    pub(crate) fn hello_bytes(&self) -> [u8; HELLO_LEN] {
        self.hello.encode()
    }

    /// The session's dialect, once the handshake succeeded.
    pub(crate) fn dialect(&self) -> Option<Dialect> {
        match self.phase {
            Phase::V3(_) => Some(Dialect::V3),
            Phase::Line(_) => Some(Dialect::Line),
            _ => None,
        }
    }

    /// True once the owner admitted the session.
    pub(crate) fn in_session(&self) -> bool {
        self.in_session
    }

    /// False while the connection must not be read (a failed handshake
    /// waiting for its close).
    pub(crate) fn wants_input(&self) -> bool {
        !matches!(self.phase, Phase::LineRejected { .. } | Phase::Failed)
    }

    /// When a failed line handshake's `Eauth_failed` is due.
    pub(crate) fn auth_failed_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::LineRejected { until } => Some(until),
            _ => None,
        }
    }

    /// Feeds received bytes. During the handshake the answer is collected
    /// and verified; later bytes go to the session decoder.
    pub(crate) fn handle_input(
        &mut self,
        now: Instant,
        tokens: &ClientTokens,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> FrontInput {
        let answer = match &mut self.phase {
            Phase::Handshake(answer) => answer,
            Phase::V3(decoder) => {
                decoder.push(bytes);
                return FrontInput::Session;
            }
            Phase::Line(decoder) => {
                decoder.push(bytes);
                return FrontInput::Session;
            }
            Phase::LineRejected { .. } | Phase::Failed => return FrontInput::Pending,
        };
        let mut rest = bytes;
        // The first 32 bytes decide between a v3 proof and a line answer.
        if answer.len < PROOF_LEN {
            let take = (PROOF_LEN - answer.len).min(rest.len());
            answer.bytes[answer.len..answer.len + take].copy_from_slice(&rest[..take]);
            answer.len += take;
            rest = &rest[take..];
            if answer.len < PROOF_LEN {
                return FrontInput::Pending;
            }
            let mut proof = [0u8; PROOF_LEN];
            proof.copy_from_slice(&answer.bytes[..PROOF_LEN]);
            if tokens.verify(&self.fingerprint, &self.hello, &proof) {
                let mut decoder = RequestDecoder::new();
                decoder.push(rest);
                self.phase = Phase::V3(decoder);
                return FrontInput::Accepted(Dialect::V3);
            }
            if !proof.iter().all(|&b| is_base64url(b)) {
                out.push(RESULT_REJECTED);
                self.phase = Phase::Failed;
                return FrontInput::Rejected(Dialect::V3);
            }
        }
        // A line answer: 11 more base64url characters, then LF.
        let take = (LINE_ANSWER_LEN - answer.len).min(rest.len());
        answer.bytes[answer.len..answer.len + take].copy_from_slice(&rest[..take]);
        answer.len += take;
        rest = &rest[take..];
        let shape_ok = answer.bytes[PROOF_LEN..answer.len]
            .iter()
            .enumerate()
            .all(|(i, &b)| {
                if PROOF_LEN + i == LINE_ANSWER_LEN - 1 {
                    b == b'\n'
                } else {
                    is_base64url(b)
                }
            });
        if shape_ok && answer.len < LINE_ANSWER_LEN {
            return FrontInput::Pending;
        }
        let verified = shape_ok
            && tokens.verify_line(
                line_nonce(&self.hello.nonce),
                &answer.bytes[..LINE_ANSWER_LEN - 1],
            );
        if verified {
            let mut decoder = LineDecoder::new();
            decoder.push(rest);
            self.phase = Phase::Line(decoder);
            FrontInput::Accepted(Dialect::Line)
        } else {
            self.phase = Phase::LineRejected {
                until: now.saturating_add(LINE_AUTH_FAILED_DELAY),
            };
            FrontInput::Rejected(Dialect::Line)
        }
    }

    /// The owner admitted the session: queues what the dialect sends on
    /// success (v3: the result byte; line: nothing).
    pub(crate) fn begin_session(&mut self, out: &mut Vec<u8>) {
        self.in_session = true;
        if matches!(self.phase, Phase::V3(_)) {
            out.push(RESULT_ACCEPTED);
        }
    }

    /// Queues a leader notice for `slot` ([`NO_LEADER_SLOT`]: none known) in
    /// a session: v3 always (`L` slot), line only with a known leader that
    /// has an address (`L` address).
    pub(crate) fn leader_notice(&self, slot: u8, addresses: &[Box<str>], out: &mut Vec<u8>) {
        if !self.in_session {
            return;
        }
        match self.phase {
            Phase::V3(_) => Reply::Leader { leader_slot: slot }.encode(out),
            Phase::Line(_) => {
                if slot == NO_LEADER_SLOT {
                    return;
                }
                if let Some(address) = address_of(addresses, slot) {
                    LineReply::Leader { address }.encode(out);
                }
            }
            _ => {}
        }
    }

    /// Queues the last words of a session closed by a graceful shutdown
    /// (line: `Enot_active`, so the client reconnects at once).
    pub(crate) fn farewell(&self, out: &mut Vec<u8>) {
        if self.in_session && matches!(self.phase, Phase::Line(_)) {
            line_error(LineError::NotActive).encode(out);
        }
    }

    /// The next request of the session, answering on its own what needs no
    /// lock table into `out`: `Ok(None)` when more bytes are needed,
    /// `Err` when the connection must close (its last reply, if the
    /// dialect has one, is queued).
    /// Replies it sends itself are counted in `counts`.
    pub(crate) fn next_request(
        &mut self,
        out: &mut Vec<u8>,
        counts: &mut ReplyCounts,
    ) -> Result<Option<ClientRequest>, CloseReason> {
        match &mut self.phase {
            Phase::V3(decoder) => next_v3(decoder, &mut self.extensions, out, counts),
            Phase::Line(decoder) => next_line(decoder, out, counts),
            _ => Ok(None),
        }
    }

    /// True when the session may be handed request values
    /// ([`ClientFront::next_request_value`]) instead of bytes: a v3 session
    /// the owner admitted, with no bytes of a frame buffered (values are
    /// never mixed into the middle of a byte stream).
    pub(crate) fn takes_request_values(&self) -> bool {
        self.in_session && matches!(&self.phase, Phase::V3(decoder) if decoder.buffered() == 0)
    }

    /// [`ClientFront::next_request`] for a request handed over as a value
    /// rather than as its frame (an in-process link, once
    /// [`ClientFront::takes_request_values`]): checked as its frame would
    /// be decoded ([`check_request`]), then the same as a decoded frame. A
    /// field out of range is answered here, its `E` counted in `counts` and
    /// handed to `queue`; `Err` when the connection must close (rid 0).
    pub(crate) fn next_request_value(
        &mut self,
        request: Request,
        counts: &mut ReplyCounts,
        queue: impl FnOnce(Reply),
    ) -> Result<Option<ClientRequest>, CloseReason> {
        let Phase::V3(decoder) = &mut self.phase else {
            return Err(CloseReason::BadFrame);
        };
        // An op the connection did not negotiate is an unknown op, as in
        // bytes.
        if RequestKind::from_op(request.kind().op(), decoder.capabilities()).is_none() {
            return Err(CloseReason::BadFrame);
        }
        match check_request(request) {
            Ok(Decoded::Request(Request::Negotiate(negotiate))) => {
                let reply = self.extensions.negotiate(negotiate, decoder);
                counts.count(&reply);
                queue(reply);
                Ok(None)
            }
            Ok(decoded) => Ok(v3_request(decoded, decoder.capabilities(), counts, queue)),
            Err(_) => Err(CloseReason::BadFrame),
        }
    }

    /// Processes a deadline at or before `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant, out: &mut Vec<u8>) -> FrontTimeout {
        match self.phase {
            Phase::Handshake(_) if now >= self.deadline => {
                self.phase = Phase::Failed;
                FrontTimeout::HandshakeTimedOut
            }
            Phase::LineRejected { until } if now >= until => {
                line_error(LineError::AuthFailed).encode(out);
                self.phase = Phase::Failed;
                FrontTimeout::AuthFailedSent
            }
            _ => FrontTimeout::Nothing,
        }
    }
}

fn next_v3(
    decoder: &mut RequestDecoder,
    extensions: &mut Extensions,
    out: &mut Vec<u8>,
    counts: &mut ReplyCounts,
) -> Result<Option<ClientRequest>, CloseReason> {
    loop {
        match decoder.next() {
            Ok(None) => return Ok(None),
            Ok(Some(Decoded::Request(Request::Negotiate(negotiate)))) => {
                let reply = extensions.negotiate(negotiate, decoder);
                counts.count(&reply);
                reply.encode(out);
            }
            Ok(Some(decoded)) => {
                let caps = decoder.capabilities();
                if let Some(request) = v3_request(decoded, caps, counts, |reply| reply.encode(out))
                {
                    return Ok(Some(request));
                }
            }
            // No rid to answer: the published clients expect the session
            // to end.
            Err(_) => return Err(CloseReason::BadFrame),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_replies_echo_short_keys_from_an_inline_copy_and_long_ones_shared() {
        let short = Key::new(b"sixteen-byte-key").unwrap();
        let edge = Key::new(&[b'e'; ECHO_INLINE_LEN]).unwrap();
        let long = Key::new(&[b'k'; 128]).unwrap();
        assert!(matches!(EchoKey::of(&short), EchoKey::Inline { .. }));
        assert!(matches!(EchoKey::of(&edge), EchoKey::Inline { .. }));
        assert!(matches!(EchoKey::of(&long), EchoKey::Shared(_)));
        for key in [short, edge, long] {
            let to = ReplyTo::Line {
                echo: 7,
                key: EchoKey::of(&key),
            };
            let mut out = Vec::new();
            assert_eq!(to.encode(Answer::Released, &[], &mut out), Delivery::Queued);
            let mut expected = Vec::new();
            LineReply::Released {
                token: 7,
                key: key.as_bytes(),
            }
            .encode(&mut expected);
            assert_eq!(out, expected);
        }
    }
}
