//! What client calls fail with ([`ClientError`]) and why a session ends
//! ([`CloseReason`], [`ProtocolError`]).
use std::fmt;

use crate::auth::HelloError;
use crate::wire::{ErrorCode, ReplyError};

/// Everything a client call can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// The wait ended without the lock (server `T`, or the local deadline
    /// passed before the request was sent).
    Timeout,
    /// The server refused the acquire at once: queue or capacity at its limit.
    /// Nothing was queued; no internal retry.
    Busy,
    /// The client's own bound on requests in flight is reached.
    ClientCapacity,
    /// No ready connection.
    NotConnected,
    /// The server rejected our proof, or is not the server we expect.
    Auth,
    /// The request may or may not have taken effect. For an acquire: do not
    /// enter the critical section.
    Indeterminate,
    /// The conservative remaining lease does not cover the work budget.
    InsufficientLease,
    /// A duration outside what the protocol supports; rejected, never clamped.
    UnsupportedDuration {
        /// Which argument.
        field: &'static str,
        /// The largest supported value, in seconds.
        s_max: u64,
    },
    /// An argument is invalid.
    InvalidInput(&'static str),
    /// The server broke the protocol, or answered with an error code.
    Protocol(String),
    /// The broker is closed.
    Closed,
    /// The connection was not granted what the call needs: a renewal on a
    /// server that did not grant EXTEND (docs/protocol.md §8), e.g. one that
    /// speaks only the published protocol. Nothing was sent.
    Unsupported(&'static str),
    /// The grant is gone: the server answered a renewal with `N` (released,
    /// expired, force-released or handed over). It never comes back; stop
    /// the protected work.
    Lost,
    /// The semaphore is in use with another capacity than the one the
    /// acquire declared; nothing was taken. Every user of a semaphore
    /// must declare the same capacity.
    CapacityMismatch {
        /// The capacity the acquire declared.
        asked: u16,
        /// The capacity the semaphore has.
        capacity: u16,
    },
    /// An IO error reported by the runtime.
    Io {
        /// Its kind.
        kind: std::io::ErrorKind,
        /// Its text.
        message: String,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Timeout => f.write_str("timed out waiting for the lock"),
            ClientError::Busy => {
                f.write_str("server is busy: the acquire was refused, nothing was queued")
            }
            ClientError::ClientCapacity => {
                f.write_str("client limit on requests in flight reached")
            }
            ClientError::NotConnected => f.write_str("no connected server"),
            ClientError::Auth => f.write_str("authentication rejected, or not the expected server"),
            ClientError::Indeterminate => f.write_str(
                "the request may or may not have taken effect: no definite reply was received",
            ),
            ClientError::InsufficientLease => f.write_str(
                "the conservative remaining lease does not cover the minimum work budget",
            ),
            ClientError::UnsupportedDuration { field, s_max } => {
                write!(
                    f,
                    "{field} exceeds the supported maximum of {s_max} seconds"
                )
            }
            ClientError::InvalidInput(what) => write!(f, "invalid input: {what}"),
            ClientError::Protocol(what) => write!(f, "protocol error: {what}"),
            ClientError::Closed => f.write_str("broker is closed"),
            ClientError::Unsupported(what) => write!(f, "not supported by the server: {what}"),
            ClientError::CapacityMismatch { asked, capacity } => write!(
                f,
                "the semaphore is in use with capacity {capacity}, not the {asked} declared; \
                 declare {capacity}, or wait until nobody holds or waits for it"
            ),
            ClientError::Lost => f.write_str(
                "the lock is lost: its token is no longer the current grant of its keys",
            ),
            ClientError::Io { message, .. } => write!(f, "io error: {message}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> Self {
        ClientError::Io {
            kind: error.kind(),
            message: error.to_string(),
        }
    }
}

/// A reply that breaks the protocol; every one is session-fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// Unknown op, wrong length, rid or token 0, unknown `E` code.
    Frame(ReplyError),
    /// A reply for no request in flight (also a second reply to one request,
    /// or a reply to a request whose bytes were never handed out).
    UnknownRid(u64),
    /// A reply kind that cannot answer the request.
    WrongKind {
        /// The request id.
        rid: u64,
        /// The reply op.
        op: u8,
    },
    /// A leader slot that is not valid for the mode and cluster size.
    BadSlot(u8),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProtocolError::Frame(error) => write!(f, "{error}"),
            ProtocolError::UnknownRid(rid) => write!(f, "reply for unknown request id {rid}"),
            ProtocolError::WrongKind { rid, op } => {
                write!(f, "reply op 0x{op:02x} cannot answer request id {rid}")
            }
            ProtocolError::BadSlot(slot) => write!(f, "invalid leader slot {slot}"),
        }
    }
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The server answered the proof with `0x00`.
    AuthRejected,
    /// The hello was malformed.
    BadHello(HelloError),
    /// The hello names another mode or slot than configured.
    UnexpectedServer,
    /// A result byte other than 0 or 1.
    BadResult(u8),
    /// The handshake did not finish within [`HANDSHAKE_TIMEOUT`](super::HANDSHAKE_TIMEOUT).
    HandshakeTimeout,
    /// The server broke the protocol.
    Protocol(ProtocolError),
    /// `E`: every error reply is session-fatal.
    ServerError(ErrorCode),
    /// A request whose bytes may have left passed its local deadline; a late
    /// reply could no longer be attributed, so the session is dropped.
    DeadlineAfterSend,
    /// The caller cancelled a request whose bytes may have left.
    CancelledAfterSend,
    /// A reply frame stalled mid-way for [`READ_PROGRESS_TIMEOUT`](super::READ_PROGRESS_TIMEOUT).
    StalledReply,
    /// Bytes handed to the runtime were not reported written within
    /// [`WRITE_PROGRESS_TIMEOUT`](super::WRITE_PROGRESS_TIMEOUT): the server
    /// stopped reading.
    WriteStalled,
    /// A request was overdue (see [`SessionConfig::silence_timeout`](super::SessionConfig::silence_timeout)) and
    /// no byte arrived for the silence timeout: the server or the path to
    /// it is dead, frozen or cut off.
    Silent,
    /// The runtime reported EOF or an IO error.
    TransportClosed,
    /// The runtime closed the session.
    Local,
    /// Request ids ran out (after 2^64 - 1 requests).
    RidsExhausted,
    /// The server closed the connection after our `X` (docs/protocol.md
    /// §8) without answering it: it speaks only the published protocol,
    /// where `X` is an unknown op. Reconnect without negotiating.
    ExtensionsUnsupported,
}

impl CloseReason {
    /// True when reconnecting cannot help: wrong token or wrong server. The
    /// official client stops reconnecting that address.
    pub fn is_auth_failure(&self) -> bool {
        matches!(
            self,
            CloseReason::AuthRejected
                | CloseReason::BadHello(_)
                | CloseReason::UnexpectedServer
                | CloseReason::BadResult(_)
        )
    }
    /// True for a routing answer (`E 3`, `E 4`): the node answered, it
    /// just is not the one to serve requests now. The connection is healthy.
    /// (`M` names the leader and does not end the session.)
    pub fn is_routing(&self) -> bool {
        matches!(
            self,
            CloseReason::ServerError(ErrorCode::NotActive | ErrorCode::NoLeader)
        )
    }
    /// True when the server does not take our `X`: it closed the
    /// connection on it ([`CloseReason::ExtensionsUnsupported`]) or refused
    /// it (`E 8`). Connections to it should not negotiate again.
    pub fn refuses_extensions(&self) -> bool {
        matches!(
            self,
            CloseReason::ExtensionsUnsupported | CloseReason::ServerError(ErrorCode::BadExtension)
        )
    }
    /// The error a caller sees for a request that could not use this session.
    pub fn to_error(&self) -> ClientError {
        if self.is_auth_failure() {
            ClientError::Auth
        } else if let CloseReason::Protocol(error) = self {
            ClientError::Protocol(error.to_string())
        } else {
            ClientError::NotConnected
        }
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::AuthRejected => f.write_str("authentication rejected"),
            CloseReason::BadHello(error) => write!(f, "bad server hello: {error:?}"),
            CloseReason::UnexpectedServer => {
                f.write_str("server mode or slot is not the configured one")
            }
            CloseReason::BadResult(byte) => write!(f, "invalid handshake result byte 0x{byte:02x}"),
            CloseReason::HandshakeTimeout => f.write_str("handshake timed out"),
            CloseReason::Protocol(error) => write!(f, "protocol violation: {error}"),
            CloseReason::ServerError(code) => write!(f, "server answered error {code:?}"),
            CloseReason::DeadlineAfterSend => {
                f.write_str("a sent request passed its deadline without a reply")
            }
            CloseReason::CancelledAfterSend => f.write_str("a sent request was cancelled"),
            CloseReason::StalledReply => f.write_str("a reply frame stalled"),
            CloseReason::WriteStalled => f.write_str("a write made no progress"),
            CloseReason::Silent => {
                f.write_str("an overdue request and no bytes for the silence timeout")
            }
            CloseReason::TransportClosed => f.write_str("connection closed"),
            CloseReason::Local => f.write_str("closed locally"),
            CloseReason::RidsExhausted => f.write_str("request ids exhausted"),
            CloseReason::ExtensionsUnsupported => {
                f.write_str("the server closed the connection on extension negotiation")
            }
        }
    }
}
