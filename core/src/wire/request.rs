//! Request frames ([`Request`]) and their encoding.

use super::{Capabilities, FRAME_HEADER_LEN, Key, KeyGroup, REQUEST_FRAME_LEN_MAX, RequestKind};

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

/// A negotiation (`X`, our clients only): the capabilities the client
/// wants and a label naming it to operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiateRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// The extension version the client speaks.
    pub version: u8,
    /// The capabilities the client wants; the server grants the ones it
    /// has.
    pub wanted: Capabilities,
    /// Who the client is (host, pid, job), for inspection and logs: at most
    /// [`super::LABEL_LEN_MAX`] bytes of UTF-8 without control characters;
    /// may be empty.
    pub label: String,
}

/// A renewal by exact token (`W`, capability [`Capabilities::EXTEND`]):
/// like a release, it names the grant's keys and its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// The fencing token of the grant to renew, non-zero.
    pub token: u64,
    /// The new lease from the server's receipt, in seconds, 1..=250.
    pub lease_s: u8,
    /// Every key of the grant (one, or the whole set).
    pub keys: KeyGroup,
}

/// An acquire with a cap on total hold (`H`, capability
/// [`Capabilities::EXTEND`]): however often it is renewed, the grant ends
/// by `max_hold_s` after it was made (the server may cut the cap to its
/// limit). Carries set records, one key or many, and is answered like `S`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireCappedRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// Wait bound in seconds; 0 = one immediate try.
    pub wait_s: u8,
    /// Lease in seconds, 1..=250.
    pub lease_s: u8,
    /// The cap on total hold in seconds, at least 1.
    pub max_hold_s: u32,
    /// The key or key set.
    pub keys: KeyGroup,
}

/// Permits of a FIFO semaphore (`Q`, capability
/// [`Capabilities::PERMITS`]): the `permits` lowest free slots of `name`,
/// under one token, once every earlier request for `name` was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermitsRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// Wait bound in seconds; 0 = one immediate try.
    pub wait_s: u8,
    /// Lease in seconds, 1..=250.
    pub lease_s: u8,
    /// The cap on total hold in seconds; 0 = the server's default (a
    /// connection that negotiated [`Capabilities::EXTEND`]) or none.
    pub max_hold_s: u32,
    /// Permits wanted, 1..=[`super::PERMITS_MAX`], at most `capacity`.
    pub permits: u8,
    /// The semaphore's slot count as the client declares it,
    /// 1..=[`super::SEMAPHORE_CAPACITY_MAX`]: refused when it differs from
    /// the capacity of a semaphore in use.
    pub capacity: u16,
    /// The semaphore's name: a key of at most
    /// [`super::SEMAPHORE_NAME_LEN_MAX`] bytes.
    pub name: Key,
}

/// Who holds a key (`O`, capability [`Capabilities::OBSERVE`]): read-only;
/// an election's leader and term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// The key (an election's name).
    pub name: Key,
}

/// An acquire with a mode per key (`Y`, capability
/// [`Capabilities::SHARED`]): the keys `modes` marks are taken shared, the
/// others exclusive, all under one token. Carries set records, one key or
/// many, and is answered like `S`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireSharedRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// Wait bound in seconds; 0 = one immediate try.
    pub wait_s: u8,
    /// Lease in seconds, 1..=250.
    pub lease_s: u8,
    /// The cap on total hold in seconds; 0 = the server's default (a
    /// connection that negotiated [`Capabilities::EXTEND`]) or none.
    pub max_hold_s: u32,
    /// Bit `i` set: key `i` (ascending) is wanted shared. No bit at or
    /// past the number of keys.
    pub modes: u16,
    /// The key or key set.
    pub keys: KeyGroup,
}

/// A downgrade of an exclusive grant to shared (`D`, capability
/// [`Capabilities::SHARED`]): like a release, it names every key of the
/// grant and its token; the token and the lease stay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DowngradeRequest {
    /// Request id, non-zero.
    pub rid: u64,
    /// The fencing token of the grant, non-zero.
    pub token: u64,
    /// Every key of the grant (one, or the whole set).
    pub keys: KeyGroup,
}

/// A fully validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `A` / `S`.
    Acquire(AcquireRequest),
    /// `R` / `G`.
    Release(ReleaseRequest),
    /// `X`.
    Negotiate(NegotiateRequest),
    /// `W`.
    Extend(ExtendRequest),
    /// `H`.
    AcquireCapped(AcquireCappedRequest),
    /// `Q`.
    AcquirePermits(PermitsRequest),
    /// `O`.
    Observe(ObserveRequest),
    /// `Y`.
    AcquireShared(AcquireSharedRequest),
    /// `D`.
    Downgrade(DowngradeRequest),
}

impl Request {
    /// The request id.
    pub fn rid(&self) -> u64 {
        match self {
            Request::Acquire(req) => req.rid,
            Request::Release(req) => req.rid,
            Request::Negotiate(req) => req.rid,
            Request::Extend(req) => req.rid,
            Request::AcquireCapped(req) => req.rid,
            Request::AcquirePermits(req) => req.rid,
            Request::Observe(req) => req.rid,
            Request::AcquireShared(req) => req.rid,
            Request::Downgrade(req) => req.rid,
        }
    }
    /// The request kind.
    pub fn kind(&self) -> RequestKind {
        match self {
            Request::Acquire(AcquireRequest { set: false, .. }) => RequestKind::Acquire,
            Request::Acquire(AcquireRequest { set: true, .. }) => RequestKind::AcquireSet,
            Request::Release(ReleaseRequest { set: false, .. }) => RequestKind::Release,
            Request::Release(ReleaseRequest { set: true, .. }) => RequestKind::ReleaseSet,
            Request::Negotiate(_) => RequestKind::Negotiate,
            Request::Extend(_) => RequestKind::Extend,
            Request::AcquireCapped(_) => RequestKind::AcquireCapped,
            Request::AcquirePermits(_) => RequestKind::AcquirePermits,
            Request::Observe(_) => RequestKind::Observe,
            Request::AcquireShared(_) => RequestKind::AcquireShared,
            Request::Downgrade(_) => RequestKind::Downgrade,
        }
    }
    /// The length of the request's frame, header included: what
    /// [`Request::encode`] appends.
    pub fn frame_len(&self) -> usize {
        let (fixed, keys, set) = match self {
            Request::Acquire(req) => (10, &req.keys, req.set),
            Request::Release(req) => (16, &req.keys, req.set),
            Request::Negotiate(req) => return FRAME_HEADER_LEN + 14 + req.label.len().min(255),
            Request::Extend(req) => (17, &req.keys, true),
            Request::AcquireCapped(req) => (14, &req.keys, true),
            Request::AcquirePermits(req) => {
                return FRAME_HEADER_LEN + 18 + req.name.as_bytes().len();
            }
            Request::Observe(req) => return FRAME_HEADER_LEN + 8 + req.name.as_bytes().len(),
            Request::AcquireShared(req) => (16, &req.keys, true),
            Request::Downgrade(req) => (16, &req.keys, true),
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
            Request::Negotiate(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.push(req.version);
                out.extend_from_slice(&req.wanted.0.to_be_bytes());
                // A label longer than a length byte says is cut at 255: the
                // server refuses anything over 64 anyway.
                let label = &req.label.as_bytes()[..req.label.len().min(255)];
                out.push(label.len() as u8);
                out.extend_from_slice(label);
            }
            Request::Extend(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.extend_from_slice(&req.token.to_be_bytes());
                out.push(req.lease_s);
                encode_keys(&req.keys, true, out);
            }
            Request::AcquireCapped(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.push(req.wait_s);
                out.push(req.lease_s);
                out.extend_from_slice(&req.max_hold_s.to_be_bytes());
                encode_keys(&req.keys, true, out);
            }
            Request::AcquirePermits(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.push(req.wait_s);
                out.push(req.lease_s);
                out.extend_from_slice(&req.max_hold_s.to_be_bytes());
                out.push(req.permits);
                out.extend_from_slice(&req.capacity.to_be_bytes());
                // A key is at most 128 bytes: its length fits the byte.
                out.push(req.name.as_bytes().len() as u8);
                out.extend_from_slice(req.name.as_bytes());
            }
            Request::Observe(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.extend_from_slice(req.name.as_bytes());
            }
            Request::AcquireShared(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.push(req.wait_s);
                out.push(req.lease_s);
                out.extend_from_slice(&req.max_hold_s.to_be_bytes());
                out.extend_from_slice(&req.modes.to_be_bytes());
                encode_keys(&req.keys, true, out);
            }
            Request::Downgrade(req) => {
                out.extend_from_slice(&req.rid.to_be_bytes());
                out.extend_from_slice(&req.token.to_be_bytes());
                encode_keys(&req.keys, true, out);
            }
        }
        let body_len = out.len() - header_at - FRAME_HEADER_LEN;
        // A KeyGroup holds at most 16 keys of at most 128 bytes, and a
        // label's length is one byte, so every body fits a u16 (a label over
        // 64 bytes is written as given, for tests of the refusal).
        // A name longer than a semaphore's is written as given too, for
        // tests of the refusal.
        debug_assert!(
            body_len <= kind.body_len_max()
                || matches!(kind, RequestKind::Negotiate | RequestKind::AcquirePermits)
        );
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
