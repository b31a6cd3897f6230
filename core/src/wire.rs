//! Client protocol v3: frames, validation and encoding.
//!
//! Every message after the handshake is `[op u8][body_len u16 BE][body]`.
//! The decoders here are the only place that turns client bytes into
//! requests; they enforce the hard size limits before buffering a body and map
//! every out-of-range field to its `E` code (see `docs/protocol.md`).
//!
//! Two kinds of bad input are told apart:
//! - a frame that cannot be parsed (unknown op, bad `body_len`, body shorter
//!   than the op's fixed fields, rid 0) is a [`FrameError`]: the connection
//!   is closed, because the byte stream can no longer be trusted;
//! - a frame whose rid can be read but whose fields are out of range decodes
//!   to [`Decoded::Rejected`] with the `E` code to answer; the session goes on.

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

/// Largest request frame of any kind, header included.
const MAX_REQUEST_FRAME_LEN: usize = MAX_RELEASE_SET_FRAME_LEN;

/// Decoder buffer capacity kept across pushes. A larger allocation left by
/// one big push is given back once the bytes in it have been consumed, so a
/// burst does not pin memory for the life of the connection.
const DECODER_RETAIN_CAPACITY: usize = 8 * MAX_REQUEST_FRAME_LEN;

// The limits are derived from the field layout; keep them in step.
const _: () = {
    assert!(MAX_ACQUIRE_FRAME_LEN == FRAME_HEADER_LEN + 10 + MAX_KEY_LEN);
    assert!(MAX_RELEASE_FRAME_LEN == FRAME_HEADER_LEN + 16 + MAX_KEY_LEN);
    assert!(MAX_ACQUIRE_SET_FRAME_LEN == FRAME_HEADER_LEN + 11 + MAX_SET_KEYS * (1 + MAX_KEY_LEN));
    assert!(MAX_RELEASE_SET_FRAME_LEN == FRAME_HEADER_LEN + 17 + MAX_SET_KEYS * (1 + MAX_KEY_LEN));
    assert!(MAX_REQUEST_FRAME_LEN - FRAME_HEADER_LEN <= u16::MAX as usize);
};

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
        match self {
            RequestKind::Acquire => b'A',
            RequestKind::Release => b'R',
            RequestKind::AcquireSet => b'S',
            RequestKind::ReleaseSet => b'G',
        }
    }
    /// The kind for an op byte, if it is a request op.
    pub fn from_op(op: u8) -> Option<Self> {
        match op {
            b'A' => Some(RequestKind::Acquire),
            b'R' => Some(RequestKind::Release),
            b'S' => Some(RequestKind::AcquireSet),
            b'G' => Some(RequestKind::ReleaseSet),
            _ => None,
        }
    }
    /// `A` or `S`.
    pub fn is_acquire(self) -> bool {
        matches!(self, RequestKind::Acquire | RequestKind::AcquireSet)
    }
    /// `S` or `G`.
    pub fn is_set(self) -> bool {
        matches!(self, RequestKind::AcquireSet | RequestKind::ReleaseSet)
    }
    /// Length of the fields before the key (or key records): a body shorter
    /// than this cannot be read at all.
    pub fn fixed_body_len(self) -> usize {
        match self {
            // rid · wait · lease
            RequestKind::Acquire => 10,
            // rid · token
            RequestKind::Release => 16,
            // rid · wait · lease · count
            RequestKind::AcquireSet => 11,
            // rid · token · count
            RequestKind::ReleaseSet => 17,
        }
    }
    /// Largest body this kind may declare.
    pub fn max_body_len(self) -> usize {
        let frame_len = match self {
            RequestKind::Acquire => MAX_ACQUIRE_FRAME_LEN,
            RequestKind::Release => MAX_RELEASE_FRAME_LEN,
            RequestKind::AcquireSet => MAX_ACQUIRE_SET_FRAME_LEN,
            RequestKind::ReleaseSet => MAX_RELEASE_SET_FRAME_LEN,
        };
        frame_len - FRAME_HEADER_LEN
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
        match value {
            1 => Some(ErrorCode::BadKey),
            2 => Some(ErrorCode::BadLease),
            3 => Some(ErrorCode::NotActive),
            4 => Some(ErrorCode::NoLeader),
            5 => Some(ErrorCode::BadKeySet),
            6 => Some(ErrorCode::GroupMismatch),
            7 => Some(ErrorCode::BadToken),
            _ => None,
        }
    }
    /// Whether this code may answer a request of `kind` (PROTOCOL.md §2).
    pub fn allowed_for(self, kind: RequestKind) -> bool {
        match self {
            ErrorCode::BadKey | ErrorCode::NotActive | ErrorCode::NoLeader => true,
            ErrorCode::BadLease => kind.is_acquire(),
            ErrorCode::BadKeySet => kind.is_set(),
            ErrorCode::GroupMismatch | ErrorCode::BadToken => !kind.is_acquire(),
        }
    }
}

/// One validated key: 1..=128 bytes of UTF-8 with no space, CR or LF.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<[u8]>);

impl Key {
    /// Validates `bytes` as a key.
    pub fn new(bytes: &[u8]) -> Result<Key, ErrorCode> {
        if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
            return Err(ErrorCode::BadKey);
        }
        // Space, CR and LF would break the line-based tools and logs that
        // print keys; they are ASCII, so a byte scan is exact even in UTF-8.
        if bytes.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n')) {
            return Err(ErrorCode::BadKey);
        }
        if core::str::from_utf8(bytes).is_err() {
            return Err(ErrorCode::BadKey);
        }
        Ok(Key(bytes.into()))
    }
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The key as text (always valid UTF-8).
    pub fn as_str(&self) -> &str {
        // Validated in `Key::new`, the only constructor.
        core::str::from_utf8(&self.0).unwrap_or_default()
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
        if keys.is_empty() || keys.len() > MAX_SET_KEYS {
            return Err(ErrorCode::BadKeySet);
        }
        // Strictly ascending also rules out duplicates, and gives every set
        // one canonical order (the order the lock table takes keys in).
        if !keys
            .windows(2)
            .all(|pair| pair[0].as_bytes() < pair[1].as_bytes())
        {
            return Err(ErrorCode::BadKeySet);
        }
        Ok(KeyGroup(keys))
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
        match self {
            Request::Acquire(req) => req.rid,
            Request::Release(req) => req.rid,
        }
    }
    /// The request kind.
    pub fn kind(&self) -> RequestKind {
        match self {
            Request::Acquire(AcquireRequest { set: false, .. }) => RequestKind::Acquire,
            Request::Acquire(AcquireRequest { set: true, .. }) => RequestKind::AcquireSet,
            Request::Release(ReleaseRequest { set: false, .. }) => RequestKind::Release,
            Request::Release(ReleaseRequest { set: true, .. }) => RequestKind::ReleaseSet,
        }
    }
    /// Appends the request's frame to `out`.
    ///
    /// Fields are written as they are (a rid, lease or token out of range is
    /// sent as given), so tests can also build frames the server rejects.
    ///
    /// # Panics
    ///
    /// If an `A` or `R` request (`set: false`) holds more than one key: the
    /// single-key frames have room for exactly one, and dropping keys from a
    /// release would be a silent bug.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let kind = self.kind();
        let header_at = out.len();
        out.extend_from_slice(&[kind.op(), 0, 0]);
        match self {
            Request::Acquire(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.push(req.wait_s);
                out.push(req.lease_s);
                encode_keys(&req.keys, req.set, out);
            }
            Request::Release(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.extend_from_slice(&req.token.to_be_bytes());
                encode_keys(&req.keys, req.set, out);
            }
        }
        let body_len = out.len() - header_at - FRAME_HEADER_LEN;
        // A KeyGroup holds at most 16 keys of at most 128 bytes, so every
        // body fits the op's limit and therefore a u16.
        debug_assert!(body_len <= kind.max_body_len());
        let body_len = u16::try_from(body_len).expect("a validated request fits its frame");
        out[header_at + 1..header_at + FRAME_HEADER_LEN].copy_from_slice(&body_len.to_be_bytes());
    }
    /// The request's frame as a new buffer.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_REQUEST_FRAME_LEN);
        self.encode(&mut out);
        out
    }
}

/// Writes the key part of a body: the bare key for `A`/`R`, or
/// `count · count × (len · key)` for `S`/`G`.
fn encode_keys(keys: &KeyGroup, set: bool, out: &mut Vec<u8>) {
    if set {
        out.push(keys.len() as u8);
        for key in keys.keys() {
            out.push(key.as_bytes().len() as u8);
            out.extend_from_slice(key.as_bytes());
        }
    } else {
        assert_eq!(keys.len(), 1, "an A or R request carries exactly one key");
        out.extend_from_slice(keys.keys()[0].as_bytes());
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
        match *self {
            FrameError::UnknownOp(op) if op.is_ascii_graphic() => {
                write!(f, "unknown request op 0x{op:02x} ('{}')", char::from(op))
            }
            FrameError::UnknownOp(op) => write!(f, "unknown request op 0x{op:02x}"),
            FrameError::EmptyBody => f.write_str("request frame declares an empty body"),
            FrameError::TooLong { kind, body_len } => write!(
                f,
                "'{}' request declares a {body_len}-byte body, over the {}-byte maximum",
                char::from(kind.op()),
                kind.max_body_len()
            ),
            FrameError::TooShort { kind, body_len } => write!(
                f,
                "'{}' request declares a {body_len}-byte body, shorter than its {}-byte fixed fields",
                char::from(kind.op()),
                kind.fixed_body_len()
            ),
            FrameError::ZeroRid => f.write_str("request id 0 is not allowed"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Decodes one request frame from the start of `buf`: `Ok(None)` if more
/// bytes are needed, else what the frame decoded to and the bytes it used.
///
/// Fatal errors are reported as early as the bytes allow: an unknown op from
/// the first byte, a bad `body_len` from the 3-byte header, before any of the
/// body is needed. [`RequestDecoder`] is this function over a growing buffer.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Decoded, usize)>, FrameError> {
    let Some(&op) = buf.first() else {
        return Ok(None);
    };
    let kind = RequestKind::from_op(op).ok_or(FrameError::UnknownOp(op))?;
    let Some(header) = buf.get(..FRAME_HEADER_LEN) else {
        return Ok(None);
    };
    let body_len = usize::from(u16::from_be_bytes([header[1], header[2]]));
    if body_len == 0 {
        return Err(FrameError::EmptyBody);
    }
    if body_len > kind.max_body_len() {
        return Err(FrameError::TooLong { kind, body_len });
    }
    // Also known from the header alone: no point waiting for a body whose
    // fixed fields cannot be there.
    if body_len < kind.fixed_body_len() {
        return Err(FrameError::TooShort { kind, body_len });
    }
    let frame_len = FRAME_HEADER_LEN + body_len;
    let Some(body) = buf.get(FRAME_HEADER_LEN..frame_len) else {
        return Ok(None);
    };
    let rid = read_u64(body, 0);
    if rid == 0 {
        return Err(FrameError::ZeroRid);
    }
    let decoded = match decode_fields(kind, rid, body) {
        Ok(request) => Decoded::Request(request),
        Err(code) => Decoded::Rejected { rid, kind, code },
    };
    Ok(Some((decoded, frame_len)))
}

/// Validates the fields of a body whose length is within the op's bounds
/// and whose rid is non-zero. The check order is part of the protocol
/// (docs/protocol.md): set structure, each key, key order, lease, token.
fn decode_fields(kind: RequestKind, rid: u64, body: &[u8]) -> Result<Request, ErrorCode> {
    match kind {
        RequestKind::Acquire => {
            let (wait_s, lease_s) = (body[8], body[9]);
            let keys = KeyGroup::single(Key::new(&body[10..])?);
            check_lease(lease_s)?;
            Ok(Request::Acquire(AcquireRequest {
                rid,
                wait_s,
                lease_s,
                keys,
                set: false,
            }))
        }
        RequestKind::AcquireSet => {
            let (wait_s, lease_s) = (body[8], body[9]);
            let keys = decode_key_set(body[10], &body[11..])?;
            check_lease(lease_s)?;
            Ok(Request::Acquire(AcquireRequest {
                rid,
                wait_s,
                lease_s,
                keys,
                set: true,
            }))
        }
        RequestKind::Release => {
            let token = read_u64(body, 8);
            let keys = KeyGroup::single(Key::new(&body[16..])?);
            check_token(token)?;
            Ok(Request::Release(ReleaseRequest {
                rid,
                token,
                keys,
                set: false,
            }))
        }
        RequestKind::ReleaseSet => {
            let token = read_u64(body, 8);
            let keys = decode_key_set(body[16], &body[17..])?;
            check_token(token)?;
            Ok(Request::Release(ReleaseRequest {
                rid,
                token,
                keys,
                set: true,
            }))
        }
    }
}

/// `count` records of `len u8 · key` that must fill `records` exactly.
fn decode_key_set(count: u8, records: &[u8]) -> Result<KeyGroup, ErrorCode> {
    let count = usize::from(count);
    // (1) structure first: until the records are known to tile the body we
    // cannot even say which bytes are keys.
    if count == 0 || count > MAX_SET_KEYS {
        return Err(ErrorCode::BadKeySet);
    }
    let mut raw: [&[u8]; MAX_SET_KEYS] = [&[]; MAX_SET_KEYS];
    let mut rest = records;
    for slot in raw.iter_mut().take(count) {
        let (&len, tail) = rest.split_first().ok_or(ErrorCode::BadKeySet)?;
        let len = usize::from(len);
        if tail.len() < len {
            return Err(ErrorCode::BadKeySet);
        }
        let (key, tail) = tail.split_at(len);
        *slot = key;
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(ErrorCode::BadKeySet);
    }
    // (2) each key, in record order.
    let keys = raw[..count]
        .iter()
        .map(|key| Key::new(key))
        .collect::<Result<Vec<_>, _>>()?;
    // (3) strictly ascending.
    KeyGroup::new(keys)
}

fn check_lease(lease_s: u8) -> Result<(), ErrorCode> {
    if (1..=MAX_LEASE_S).contains(&lease_s) {
        Ok(())
    } else {
        Err(ErrorCode::BadLease)
    }
}

fn check_token(token: u64) -> Result<(), ErrorCode> {
    if token == 0 {
        Err(ErrorCode::BadToken)
    } else {
        Ok(())
    }
}

/// The big-endian u64 at `at`; the caller has checked the length.
fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

/// Incremental request decoder: push bytes as they arrive, pull requests.
/// Holds at most the bytes pushed and not yet consumed; the server drains it
/// after every push, so it keeps at most one partial frame between pushes.
#[derive(Debug, Default)]
pub struct RequestDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` before this index are consumed; they are dropped at
    /// the next push (or at once when everything is consumed).
    start: usize,
    /// The fatal error, once one was found: the stream cannot be resynced,
    /// so every later call reports it again.
    failed: Option<FrameError>,
}

impl RequestDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends received bytes. After a fatal error the bytes are dropped:
    /// the connection is closing and nothing more will be decoded.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        self.discard_consumed();
        let needed = self.buf.len() + bytes.len();
        if self.buf.capacity() > DECODER_RETAIN_CAPACITY.max(2 * needed) {
            self.buf.shrink_to(DECODER_RETAIN_CAPACITY.max(needed));
        }
        self.buf.extend_from_slice(bytes);
    }
    /// The next complete frame, `Ok(None)` when more bytes are needed, or a
    /// fatal error (checked as early as the header allows). After an error the
    /// decoder must not be used again.
    // Not an `Iterator`: "need more bytes" is not the end of the stream, and
    // a fatal error must stay distinguishable from both.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Decoded>, FrameError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        match decode_request(&self.buf[self.start..]) {
            Ok(Some((decoded, used))) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.discard_consumed();
                }
                Ok(Some(decoded))
            }
            Ok(None) => Ok(None),
            Err(err) => {
                self.failed = Some(err);
                self.buf = Vec::new();
                self.start = 0;
                Err(err)
            }
        }
    }
    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Drops consumed bytes and gives back a large allocation once it is
    /// mostly empty.
    fn discard_consumed(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() > DECODER_RETAIN_CAPACITY
            && self.buf.len() <= DECODER_RETAIN_CAPACITY / 2
        {
            self.buf.shrink_to(DECODER_RETAIN_CAPACITY);
        }
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

impl core::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ReplyError::UnknownOp(op) => write!(f, "unknown reply op 0x{op:02x}"),
            ReplyError::BadLength { op, body_len } => write!(
                f,
                "reply op 0x{op:02x} declares a {body_len}-byte body, not its exact {}-byte length",
                reply_body_len(op).unwrap_or(0)
            ),
            ReplyError::Zero => f.write_str("reply carries request id 0 or token 0"),
            ReplyError::UnknownCode(code) => write!(f, "reply carries unknown error code {code}"),
        }
    }
}

impl std::error::Error for ReplyError {}

/// The exact body length of a reply op, `None` if the op is unknown.
fn reply_body_len(op: u8) -> Option<usize> {
    match op {
        b'A' | b'S' => Some(16),
        b'R' | b'G' | b'N' | b'T' | b'B' | b'I' => Some(8),
        b'M' | b'E' => Some(9),
        b'L' => Some(1),
        _ => None,
    }
}

impl Reply {
    /// The request id, `None` for `L`.
    pub fn rid(&self) -> Option<u64> {
        match *self {
            Reply::Acquired { rid, .. }
            | Reply::AcquiredSet { rid, .. }
            | Reply::Released { rid }
            | Reply::ReleasedSet { rid }
            | Reply::NotFound { rid }
            | Reply::TimedOut { rid }
            | Reply::Busy { rid }
            | Reply::Indeterminate { rid }
            | Reply::Moved { rid, .. }
            | Reply::Error { rid, .. } => Some(rid),
            Reply::Leader { .. } => None,
        }
    }
    /// The op byte on the wire.
    pub fn op(&self) -> u8 {
        match self {
            Reply::Acquired { .. } => b'A',
            Reply::AcquiredSet { .. } => b'S',
            Reply::Released { .. } => b'R',
            Reply::ReleasedSet { .. } => b'G',
            Reply::NotFound { .. } => b'N',
            Reply::TimedOut { .. } => b'T',
            Reply::Busy { .. } => b'B',
            Reply::Indeterminate { .. } => b'I',
            Reply::Moved { .. } => b'M',
            Reply::Error { .. } => b'E',
            Reply::Leader { .. } => b'L',
        }
    }
    /// Appends the reply's frame to `out`. Fields are written as given.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let op = self.op();
        let body_len = reply_body_len(op).expect("every reply op has a length") as u16;
        out.push(op);
        out.extend_from_slice(&body_len.to_be_bytes());
        if let Some(rid) = self.rid() {
            out.extend_from_slice(&rid.to_be_bytes());
        }
        match *self {
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => {
                out.extend_from_slice(&token.to_be_bytes());
            }
            Reply::Moved { leader_slot, .. } | Reply::Leader { leader_slot } => {
                out.push(leader_slot)
            }
            Reply::Error { code, .. } => out.push(code as u8),
            Reply::Released { .. }
            | Reply::ReleasedSet { .. }
            | Reply::NotFound { .. }
            | Reply::TimedOut { .. }
            | Reply::Busy { .. }
            | Reply::Indeterminate { .. } => {}
        }
    }
    /// Decodes one reply from the start of `buf`: `Ok(None)` if incomplete,
    /// else the reply and the bytes it used. Checks the exact body length
    /// from the header before waiting for the body.
    ///
    /// Slots are not checked here: whether a slot is valid depends on the
    /// mode and cluster size, which only the client knows.
    pub fn decode(buf: &[u8]) -> Result<Option<(Reply, usize)>, ReplyError> {
        let Some(&op) = buf.first() else {
            return Ok(None);
        };
        let expected_len = reply_body_len(op).ok_or(ReplyError::UnknownOp(op))?;
        let Some(header) = buf.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let body_len = usize::from(u16::from_be_bytes([header[1], header[2]]));
        if body_len != expected_len {
            return Err(ReplyError::BadLength { op, body_len });
        }
        let frame_len = FRAME_HEADER_LEN + body_len;
        let Some(body) = buf.get(FRAME_HEADER_LEN..frame_len) else {
            return Ok(None);
        };
        if op == b'L' {
            return Ok(Some((
                Reply::Leader {
                    leader_slot: body[0],
                },
                frame_len,
            )));
        }
        let rid = nonzero(read_u64(body, 0))?;
        let reply = match op {
            b'A' => Reply::Acquired {
                rid,
                token: nonzero(read_u64(body, 8))?,
            },
            b'S' => Reply::AcquiredSet {
                rid,
                token: nonzero(read_u64(body, 8))?,
            },
            b'R' => Reply::Released { rid },
            b'G' => Reply::ReleasedSet { rid },
            b'N' => Reply::NotFound { rid },
            b'T' => Reply::TimedOut { rid },
            b'B' => Reply::Busy { rid },
            b'I' => Reply::Indeterminate { rid },
            b'M' => Reply::Moved {
                rid,
                leader_slot: body[8],
            },
            b'E' => Reply::Error {
                rid,
                code: ErrorCode::from_u8(body[8]).ok_or(ReplyError::UnknownCode(body[8]))?,
            },
            _ => unreachable!("reply_body_len accepted only the ops above"),
        };
        Ok(Some((reply, frame_len)))
    }
    /// Whether this reply may answer a request of `kind` (`L` answers none).
    pub fn answers(&self, kind: RequestKind) -> bool {
        match *self {
            Reply::Acquired { .. } => kind == RequestKind::Acquire,
            Reply::AcquiredSet { .. } => kind == RequestKind::AcquireSet,
            Reply::Released { .. } => kind == RequestKind::Release,
            Reply::ReleasedSet { .. } => kind == RequestKind::ReleaseSet,
            Reply::TimedOut { .. } | Reply::Busy { .. } => kind.is_acquire(),
            Reply::NotFound { .. } => !kind.is_acquire(),
            Reply::Moved { .. } | Reply::Indeterminate { .. } => true,
            Reply::Error { code, .. } => code.allowed_for(kind),
            Reply::Leader { .. } => false,
        }
    }
}

fn nonzero(value: u64) -> Result<u64, ReplyError> {
    if value == 0 {
        Err(ReplyError::Zero)
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    //! White-box checks of the decoder's memory; the behaviour is tested
    //! through the public API in `core/tests/wire.rs`.
    use super::*;

    fn acquire_frame(rid: u64) -> Vec<u8> {
        let key = Key::new(b"some/key").unwrap();
        Request::Acquire(AcquireRequest {
            rid,
            wait_s: 1,
            lease_s: 10,
            keys: KeyGroup::single(key),
            set: false,
        })
        .to_frame()
    }

    #[test]
    fn consumed_bytes_are_dropped_across_many_small_pushes() {
        let mut decoder = RequestDecoder::new();
        let mut decoded = 0;
        for rid in 1..=5_000u64 {
            // Split every frame in two so that a partial frame is buffered
            // between pushes.
            let frame = acquire_frame(rid);
            let (head, tail) = frame.split_at(7);
            decoder.push(head);
            assert_eq!(decoder.next(), Ok(None));
            decoder.push(tail);
            while decoder.next().unwrap().is_some() {
                decoded += 1;
            }
            assert!(
                decoder.buf.len() <= MAX_REQUEST_FRAME_LEN,
                "len {}",
                decoder.buf.len()
            );
            assert!(
                decoder.buf.capacity() <= DECODER_RETAIN_CAPACITY,
                "capacity {}",
                decoder.buf.capacity()
            );
        }
        assert_eq!(decoded, 5_000);
    }

    #[test]
    fn a_large_push_does_not_pin_its_allocation() {
        let mut decoder = RequestDecoder::new();
        let mut burst = Vec::new();
        for rid in 1..=10_000u64 {
            burst.extend_from_slice(&acquire_frame(rid));
        }
        // Leave half a frame behind so the buffer is not simply emptied.
        let partial = acquire_frame(10_001);
        burst.extend_from_slice(&partial[..5]);
        decoder.push(&burst);
        assert!(decoder.buf.capacity() >= burst.len());
        while decoder.next().unwrap().is_some() {}
        assert_eq!(decoder.buffered(), 5);
        decoder.push(&partial[5..]);
        assert!(
            decoder.buf.capacity() <= DECODER_RETAIN_CAPACITY,
            "capacity {}",
            decoder.buf.capacity()
        );
        assert!(matches!(decoder.next(), Ok(Some(Decoded::Request(req))) if req.rid() == 10_001));
    }
}
