//! Client protocol v3: frames, validation and encoding.
//!
//! Every message after the handshake is `[op u8][body_len u16 BE][body]`.
//! The decoders here are the only place that turns client bytes into
//! requests; they enforce the hard size limits before buffering a body and map
//! every out-of-range field to its `E` code (see `docs/protocol.md`).
//!
//! SKELETON: bodies marked `todo!` are being written; signatures are fixed.

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Most keys in one key set.
pub const MAX_SET_KEYS: usize = 16;
/// Longest lease a request may ask for, in seconds.
pub const MAX_LEASE_S: u8 = 250;
/// `[op][body_len u16]`.
pub const FRAME_HEADER_LEN: usize = 3;
/// Largest acquire frame (`A`), header included.
pub const MAX_ACQUIRE_FRAME_LEN: usize = 141;
/// Largest release frame (`R`), header included.
pub const MAX_RELEASE_FRAME_LEN: usize = 147;
/// Largest key-set acquire frame (`S`), header included.
pub const MAX_ACQUIRE_SET_FRAME_LEN: usize = 2078;
/// Largest key-set release frame (`G`), header included.
pub const MAX_RELEASE_SET_FRAME_LEN: usize = 2084;
/// Leader slot meaning "no leader known" (and the only slot of single mode).
pub const NO_LEADER_SLOT: u8 = 0xFF;

/// The four request kinds, by op byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// `A`: acquire one key.
    Acquire,
    /// `R`: release one key.
    Release,
    /// `S`: acquire a key set under one token.
    AcquireSet,
    /// `G`: release a key set.
    ReleaseSet,
}

impl RequestKind {
    /// The op byte on the wire.
    pub fn op(self) -> u8 {
        todo!()
    }
    /// The kind for an op byte, if it is a request op.
    pub fn from_op(op: u8) -> Option<Self> {
        let _ = op;
        todo!()
    }
    /// `A` or `S`.
    pub fn is_acquire(self) -> bool {
        matches!(self, RequestKind::Acquire | RequestKind::AcquireSet)
    }
    /// `S` or `G`.
    pub fn is_set(self) -> bool {
        matches!(self, RequestKind::AcquireSet | RequestKind::ReleaseSet)
    }
}

/// `E` reply codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorCode {
    /// A key is empty, longer than 128 bytes, not UTF-8, or holds a space, CR or LF.
    BadKey = 1,
    /// Lease outside 1..=250 s.
    BadLease = 2,
    /// This node is not an active voter; the request had no effect.
    NotActive = 3,
    /// No leader is known; the request had no effect.
    NoLeader = 4,
    /// A key set's structure is wrong: count outside 1..=16, records that do
    /// not fill the body exactly, keys not strictly ascending.
    BadKeySet = 5,
    /// The token is current but holds a different key group than named.
    GroupMismatch = 6,
    /// Token 0 in a release.
    BadToken = 7,
}

impl ErrorCode {
    /// The code for a byte, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        let _ = value;
        todo!()
    }
    /// Whether this code may answer a request of `kind` (PROTOCOL.md §2).
    pub fn allowed_for(self, kind: RequestKind) -> bool {
        let _ = kind;
        todo!()
    }
}

/// One validated key: 1..=128 bytes of UTF-8 with no space, CR or LF.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<[u8]>);

impl Key {
    /// Validates `bytes` as a key.
    pub fn new(bytes: &[u8]) -> Result<Key, ErrorCode> {
        let _ = bytes;
        todo!()
    }
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The key's owned bytes (for a table that stores them without copying).
    pub fn into_boxed_bytes(self) -> Box<[u8]> {
        self.0
    }
}

/// A validated key group: 1..=16 keys, strictly ascending by raw bytes.
/// A single-key request (`A`/`R`) is a group of one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyGroup(Vec<Key>);

impl KeyGroup {
    /// A group of one key.
    pub fn single(key: Key) -> KeyGroup {
        KeyGroup(vec![key])
    }
    /// Validates count (1..=16) and strict ascending order.
    pub fn new(keys: Vec<Key>) -> Result<KeyGroup, ErrorCode> {
        let _ = keys;
        todo!()
    }
    /// The keys, ascending.
    pub fn keys(&self) -> &[Key] {
        &self.0
    }
    /// Number of keys (1..=16).
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Always false: a group has at least one key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The keys, owned.
    pub fn into_keys(self) -> Vec<Key> {
        self.0
    }
}

/// An acquire request (`A` or `S`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// Wait bound in seconds; 0 = one immediate try.
    pub wait_s: u8,
    /// Lease in seconds, 1..=250.
    pub lease_s: u8,
    /// The key (group of one for `A`) or key set.
    pub keys: KeyGroup,
    /// `S` rather than `A` on the wire.
    pub set: bool,
}

/// A release request (`R` or `G`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// The fencing token of the grant being released, non-zero.
    pub token: u64,
    /// The key (group of one for `R`) or key set.
    pub keys: KeyGroup,
    /// `G` rather than `R` on the wire.
    pub set: bool,
}

/// A fully validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `A` / `S`.
    Acquire(AcquireRequest),
    /// `R` / `G`.
    Release(ReleaseRequest),
}

impl Request {
    /// The request id.
    pub fn rid(&self) -> u64 {
        todo!()
    }
    /// The request kind.
    pub fn kind(&self) -> RequestKind {
        todo!()
    }
    /// Appends the request's frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let _ = out;
        todo!()
    }
}

/// What one complete request frame decoded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid request.
    Request(Request),
    /// The rid could be read but a field is out of range: answer `E code`,
    /// the session goes on.
    Rejected {
        /// Request id.
        rid: u64,
        /// Kind of the rejected request.
        kind: RequestKind,
        /// The code to answer with.
        code: ErrorCode,
    },
}

/// A frame that cannot be parsed at all: the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Not `A`, `R`, `S` or `G`.
    UnknownOp(u8),
    /// `body_len` 0.
    EmptyBody,
    /// `body_len` over the op's maximum (checked from the header alone).
    TooLong {
        /// The op.
        kind: RequestKind,
        /// The declared body length.
        body_len: usize,
    },
    /// Body shorter than the op's fixed part, so the fields cannot be read.
    TooShort {
        /// The op.
        kind: RequestKind,
        /// The declared body length.
        body_len: usize,
    },
    /// rid 0.
    ZeroRid,
}

impl core::fmt::Display for FrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let _ = f;
        todo!()
    }
}

/// Incremental request decoder: push bytes as they arrive, pull requests.
/// Holds at most the bytes pushed and not yet consumed; the server drains it
/// after every push, so it keeps at most one partial frame between pushes.
#[derive(Debug, Default)]
pub struct RequestDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl RequestDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        let _ = (bytes, &self.buf, self.start);
        todo!()
    }
    /// The next complete frame, `Ok(None)` when more bytes are needed, or a
    /// fatal error (checked as early as the header allows). After an error the
    /// decoder must not be used again.
    pub fn next(&mut self) -> Result<Option<Decoded>, FrameError> {
        todo!()
    }
    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        todo!()
    }
}

/// A reply frame (server → client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `A`: acquired.
    Acquired {
        /// Request id.
        rid: u64,
        /// Fencing token.
        token: u64,
    },
    /// `S`: key set acquired.
    AcquiredSet {
        /// Request id.
        rid: u64,
        /// Fencing token of the whole set.
        token: u64,
    },
    /// `R`: released.
    Released {
        /// Request id.
        rid: u64,
    },
    /// `G`: key set released.
    ReleasedSet {
        /// Request id.
        rid: u64,
    },
    /// `N`: not found / token not current.
    NotFound {
        /// Request id.
        rid: u64,
    },
    /// `T`: the wait ended without the lock.
    TimedOut {
        /// Request id.
        rid: u64,
    },
    /// `B`: capacity at its limit, nothing queued.
    Busy {
        /// Request id.
        rid: u64,
    },
    /// `I`: may or may not have taken effect.
    Indeterminate {
        /// Request id.
        rid: u64,
    },
    /// `M`: not the leader; no effect.
    Moved {
        /// Request id.
        rid: u64,
        /// Leader slot, or [`NO_LEADER_SLOT`].
        leader_slot: u8,
    },
    /// `E`: error.
    Error {
        /// Request id.
        rid: u64,
        /// The code.
        code: ErrorCode,
    },
    /// `L`: unsolicited leader notice.
    Leader {
        /// Leader slot, or [`NO_LEADER_SLOT`].
        leader_slot: u8,
    },
}

/// A reply frame that a client must treat as session-fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyError {
    /// Unknown op.
    UnknownOp(u8),
    /// Body length not the op's exact length.
    BadLength {
        /// The op.
        op: u8,
        /// The declared body length.
        body_len: usize,
    },
    /// rid 0 or token 0.
    Zero,
    /// Unknown `E` code.
    UnknownCode(u8),
}

impl Reply {
    /// The request id, `None` for `L`.
    pub fn rid(&self) -> Option<u64> {
        todo!()
    }
    /// Appends the reply's frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let _ = out;
        todo!()
    }
    /// Decodes one reply from the start of `buf`: `Ok(None)` if incomplete,
    /// else the reply and the bytes it used. Checks the exact body length
    /// from the header before waiting for the body.
    pub fn decode(buf: &[u8]) -> Result<Option<(Reply, usize)>, ReplyError> {
        let _ = buf;
        todo!()
    }
    /// Whether this reply may answer a request of `kind` (`L` answers none).
    pub fn answers(&self, kind: RequestKind) -> bool {
        let _ = kind;
        todo!()
    }
}
