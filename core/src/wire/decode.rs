//! Request decoding: one frame ([`decode_request`]) and the incremental
//! decoder over a connection's bytes ([`RequestDecoder`]).

use super::{
    AcquireCappedRequest, AcquireRequest, AcquireSharedRequest, Capabilities,
    DECODER_RETAIN_CAPACITY, DowngradeRequest, EXTENSION_VERSION, ErrorCode, ExtendRequest,
    FRAME_HEADER_LEN, Key, KeyGroup, LABEL_LEN_MAX, LEASE_S_MAX, NegotiateRequest, ObserveRequest,
    PERMITS_MAX, PermitsRequest, ReleaseRequest, Request, RequestKind, SEMAPHORE_CAPACITY_MAX,
    SEMAPHORE_NAME_LEN_MAX, SET_KEYS_MAX, read_u64,
};

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
                kind.body_len_max()
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
    decode_request_with(buf, Capabilities::NONE)
}

/// [`decode_request`] on a connection that negotiated `caps`: the ops of
/// the capabilities granted decode too; on any other connection they are
/// unknown ops, exactly as for a published client.
pub fn decode_request_with(
    buf: &[u8],
    caps: Capabilities,
) -> Result<Option<(Decoded, usize)>, FrameError> {
    let Some(&op) = buf.first() else {
        return Ok(None);
    };
    let kind = RequestKind::from_op(op, caps).ok_or(FrameError::UnknownOp(op))?;
    let Some(header) = buf.get(..FRAME_HEADER_LEN) else {
        return Ok(None);
    };
    let body_len = usize::from(u16::from_be_bytes([header[1], header[2]]));
    if body_len == 0 {
        return Err(FrameError::EmptyBody);
    }
    if body_len > kind.body_len_max() {
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

/// What [`decode_request`] would make of `request`'s frame
/// ([`Request::encode`]), decided from the value itself: for a driver that
/// hands the server request values instead of bytes (an in-process link),
/// so that both paths accept, reject and refuse exactly the same requests.
///
/// Keys and key groups are valid by construction ([`Key`], [`KeyGroup`]),
/// so what is left are the checks on the other fields, in the protocol's
/// order: rid 0 is a [`FrameError::ZeroRid`]; then lease (acquires) or
/// token (releases). An `A` or `R` value naming more than one key, which
/// has no frame ([`Request::encode`] panics), is `E BadKeySet`.
pub fn check_request(request: Request) -> Result<Decoded, FrameError> {
    let rid = request.rid();
    if rid == 0 {
        return Err(FrameError::ZeroRid);
    }
    let kind = request.kind();
    let checked = match &request {
        Request::Acquire(req) if !req.set && req.keys.len() != 1 => Err(ErrorCode::BadKeySet),
        Request::Release(req) if !req.set && req.keys.len() != 1 => Err(ErrorCode::BadKeySet),
        Request::Acquire(req) => check_lease(req.lease_s),
        Request::Release(req) => check_token(req.token),
        Request::Negotiate(req) => check_negotiate(req.version, req.label.as_bytes()),
        Request::Extend(req) => check_token(req.token).and_then(|()| check_lease(req.lease_s)),
        Request::AcquireCapped(req) => {
            check_lease(req.lease_s).and_then(|()| check_max_hold(req.max_hold_s))
        }
        Request::AcquirePermits(req) => check_semaphore_name(req.name.as_bytes())
            .and_then(|()| check_lease(req.lease_s))
            .and_then(|()| check_permits(req.permits, req.capacity)),
        // Its one field is a key, valid by construction.
        Request::Observe(_) => Ok(()),
        Request::AcquireShared(req) => {
            check_lease(req.lease_s).and_then(|()| check_modes(req.modes, req.keys.len()))
        }
        Request::Downgrade(req) => check_token(req.token),
    };
    Ok(match checked {
        Ok(()) => Decoded::Request(request),
        Err(code) => Decoded::Rejected { rid, kind, code },
    })
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
        RequestKind::Negotiate => {
            let version = body[8];
            let wanted = Capabilities(u32::from_be_bytes([body[9], body[10], body[11], body[12]]));
            let label = &body[14..];
            if usize::from(body[13]) != label.len() {
                return Err(ErrorCode::BadExtension);
            }
            check_negotiate(version, label)?;
            let label = String::from_utf8(label.to_vec()).map_err(|_| ErrorCode::BadExtension)?;
            Ok(Request::Negotiate(NegotiateRequest {
                rid,
                version,
                wanted,
                label,
            }))
        }
        RequestKind::AcquireCapped => {
            let (wait_s, lease_s) = (body[8], body[9]);
            let max_hold_s = u32::from_be_bytes([body[10], body[11], body[12], body[13]]);
            let keys = decode_key_set(body[14], &body[15..])?;
            check_lease(lease_s)?;
            check_max_hold(max_hold_s)?;
            Ok(Request::AcquireCapped(AcquireCappedRequest {
                rid,
                wait_s,
                lease_s,
                max_hold_s,
                keys,
            }))
        }
        RequestKind::AcquirePermits => {
            let (wait_s, lease_s) = (body[8], body[9]);
            let max_hold_s = u32::from_be_bytes([body[10], body[11], body[12], body[13]]);
            let permits = body[14];
            let capacity = u16::from_be_bytes([body[15], body[16]]);
            let name = &body[18..];
            // The length byte is redundant with the body length; a
            // mismatch is a malformed request, refused as such.
            if usize::from(body[17]) != name.len() {
                return Err(ErrorCode::BadPermits);
            }
            let name = Key::new(name)?;
            check_semaphore_name(name.as_bytes())?;
            check_lease(lease_s)?;
            check_permits(permits, capacity)?;
            Ok(Request::AcquirePermits(PermitsRequest {
                rid,
                wait_s,
                lease_s,
                max_hold_s,
                permits,
                capacity,
                name,
            }))
        }
        RequestKind::Observe => Ok(Request::Observe(ObserveRequest {
            rid,
            name: Key::new(&body[8..])?,
        })),
        RequestKind::AcquireShared => {
            let (wait_s, lease_s) = (body[8], body[9]);
            let max_hold_s = u32::from_be_bytes([body[10], body[11], body[12], body[13]]);
            let modes = u16::from_be_bytes([body[14], body[15]]);
            let keys = decode_key_set(body[16], &body[17..])?;
            check_lease(lease_s)?;
            check_modes(modes, keys.len())?;
            Ok(Request::AcquireShared(AcquireSharedRequest {
                rid,
                wait_s,
                lease_s,
                max_hold_s,
                modes,
                keys,
            }))
        }
        RequestKind::Downgrade => {
            let token = read_u64(body, 8);
            let keys = decode_key_set(body[16], &body[17..])?;
            check_token(token)?;
            Ok(Request::Downgrade(DowngradeRequest { rid, token, keys }))
        }
        RequestKind::Extend => {
            let token = read_u64(body, 8);
            let lease_s = body[16];
            let keys = decode_key_set(body[17], &body[18..])?;
            check_token(token)?;
            check_lease(lease_s)?;
            Ok(Request::Extend(ExtendRequest {
                rid,
                token,
                lease_s,
                keys,
            }))
        }
    }
}

/// A semaphore name leaves room for its slot keys' suffix.
fn check_semaphore_name(name: &[u8]) -> Result<(), ErrorCode> {
    if name.len() > SEMAPHORE_NAME_LEN_MAX {
        Err(ErrorCode::BadKey)
    } else {
        Ok(())
    }
}

/// 1..=16 permits, no more than a capacity of 1..=1024.
fn check_permits(permits: u8, capacity: u16) -> Result<(), ErrorCode> {
    let capacity_ok = (1..=SEMAPHORE_CAPACITY_MAX).contains(&capacity);
    let permits_ok = (1..=PERMITS_MAX).contains(&permits) && u16::from(permits) <= capacity;
    if capacity_ok && permits_ok {
        Ok(())
    } else {
        Err(ErrorCode::BadPermits)
    }
}

/// A mode mask marks no key past the `count` named.
fn check_modes(modes: u16, count: usize) -> Result<(), ErrorCode> {
    if count < 16 && modes >> count != 0 {
        Err(ErrorCode::BadModes)
    } else {
        Ok(())
    }
}

/// A hold cap of at least a second.
fn check_max_hold(max_hold_s: u32) -> Result<(), ErrorCode> {
    if max_hold_s == 0 {
        Err(ErrorCode::BadLease)
    } else {
        Ok(())
    }
}

/// An `X` this build takes: its extension version, and a label of at most
/// [`LABEL_LEN_MAX`] bytes of UTF-8 without control characters (a label is
/// printed in logs and on operators' terminals).
fn check_negotiate(version: u8, label: &[u8]) -> Result<(), ErrorCode> {
    let printable =
        std::str::from_utf8(label).is_ok_and(|text| !text.chars().any(char::is_control));
    if version != EXTENSION_VERSION || label.len() > LABEL_LEN_MAX || !printable {
        return Err(ErrorCode::BadExtension);
    }
    Ok(())
}

/// `count` records of `len u8 · key` that must fill `records` exactly.
fn decode_key_set(count: u8, records: &[u8]) -> Result<KeyGroup, ErrorCode> {
    let count = usize::from(count);
    // (1) structure first: until the records are known to tile the body we
    // cannot even say which bytes are keys.
    if count == 0 || count > SET_KEYS_MAX {
        return Err(ErrorCode::BadKeySet);
    }
    let mut raw: [&[u8]; SET_KEYS_MAX] = [&[]; SET_KEYS_MAX];
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
    if (1..=LEASE_S_MAX).contains(&lease_s) {
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
    /// What the connection negotiated: the ops it may send.
    caps: Capabilities,
}

impl RequestDecoder {
    /// From now on the ops of `caps` decode (after an `X` was granted).
    pub fn grant(&mut self, caps: Capabilities) {
        self.caps = caps;
    }
    /// What the connection negotiated.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }
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
        match decode_request_with(&self.buf[self.start..], self.caps) {
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
        if self.start == self.buf.len() {
            // The usual case: every frame pushed was whole.
            self.buf.clear();
        } else if self.start > 0 {
            self.buf.drain(..self.start);
        }
        self.start = 0;
        if self.buf.capacity() > DECODER_RETAIN_CAPACITY
            && self.buf.len() <= DECODER_RETAIN_CAPACITY / 2
        {
            self.buf.shrink_to(DECODER_RETAIN_CAPACITY);
        }
    }
}

#[cfg(test)]
mod tests {
    //! White-box checks of the decoder's memory; the behaviour is tested
    //! through the public API in `core/tests/wire.rs`.
    use super::*;
    use crate::wire::REQUEST_FRAME_LEN_MAX;

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
    fn a_checked_request_is_what_its_frame_decodes_to() {
        let one = || KeyGroup::single(Key::new(b"some/key").unwrap());
        let set = || {
            KeyGroup::new(vec![
                Key::new(b"a").unwrap(),
                Key::new(&[b'k'; 128]).unwrap(),
            ])
            .unwrap()
        };
        let mut requests = Vec::new();
        for rid in [0, 1, u64::MAX] {
            for lease_s in [0, 1, 250, 251, 255] {
                for (keys, is_set) in [(one(), false), (one(), true), (set(), true)] {
                    requests.push(Request::Acquire(AcquireRequest {
                        rid,
                        wait_s: 3,
                        lease_s,
                        keys,
                        set: is_set,
                    }));
                }
            }
            for token in [0, 1, u64::MAX] {
                for (keys, is_set) in [(one(), false), (one(), true), (set(), true)] {
                    requests.push(Request::Release(ReleaseRequest {
                        rid,
                        token,
                        keys,
                        set: is_set,
                    }));
                }
            }
        }
        for request in requests {
            let frame = request.to_frame();
            assert_eq!(frame.len(), request.frame_len(), "{request:?}");
            let decoded = decode_request(&frame).map(|decoded| {
                let (decoded, used) = decoded.expect("a whole frame");
                assert_eq!(used, frame.len());
                decoded
            });
            assert_eq!(check_request(request.clone()), decoded, "{request:?}");
        }
        // An `A` value naming two keys has no frame; it is refused as a
        // malformed set would be.
        let two = Request::Acquire(AcquireRequest {
            rid: 9,
            wait_s: 0,
            lease_s: 10,
            keys: set(),
            set: false,
        });
        assert_eq!(
            check_request(two),
            Ok(Decoded::Rejected {
                rid: 9,
                kind: RequestKind::Acquire,
                code: ErrorCode::BadKeySet
            })
        );
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
                decoder.buf.len() <= REQUEST_FRAME_LEN_MAX,
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
