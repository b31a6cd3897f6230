//! Request frames ([`Request`]) and their encoding.

use super::{FRAME_HEADER_LEN, KeyGroup, REQUEST_FRAME_LEN_MAX, RequestKind};

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
    /// The length of the request's frame, header included: what
    /// [`Request::encode`] appends.
    pub fn frame_len(&self) -> usize {
        let (fixed, keys, set) = match self {
            Request::Acquire(req) => (10, &req.keys, req.set),
            Request::Release(req) => (16, &req.keys, req.set),
        };
        let keys_len = if set {
            1 + keys
                .keys()
                .iter()
                .map(|key| 1 + key.as_bytes().len())
                .sum::<usize>()
        } else {
            keys.keys().first().map_or(0, |key| key.as_bytes().len())
        };
        FRAME_HEADER_LEN + fixed + keys_len
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
        debug_assert!(body_len <= kind.body_len_max());
        let body_len = u16::try_from(body_len).expect("a validated request fits its frame");
        out[header_at + 1..header_at + FRAME_HEADER_LEN].copy_from_slice(&body_len.to_be_bytes());
    }
    /// The request's frame as a new buffer.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(REQUEST_FRAME_LEN_MAX);
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
