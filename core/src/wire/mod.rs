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

//!
//! Extensions (docs/protocol.md §8): our own clients may send `X` after the
//! handshake to negotiate capabilities ([`Capabilities`]) and a label; only
//! a connection that was granted a capability may send its ops (`W`) or
//! receive its frames. A published client never sends `X`, so it sees
//! exactly the v3 bytes.
//!
//! Files: this one (limits, request kinds, error codes, capabilities),
//! `key` (validated keys and key groups), `request` (request frames and
//! their encoding), `decode` (request decoding and the incremental
//! decoder), `reply` (reply frames, both ways).

mod decode;
mod key;
mod reply;
mod request;

pub use decode::{
    Decoded, FrameError, RequestDecoder, check_request, decode_request, decode_request_with,
};
pub use key::slot_key;
pub use key::{Key, KeyGroup};
pub use reply::{
    ExtendStatus, LeaderLabel, LeaderState, Observed, PushKind, Reply, ReplyError, Slots,
};
pub use request::{
    AcquireCappedRequest, AcquireRequest, AcquireSharedRequest, DowngradeRequest, ExtendRequest,
    NegotiateRequest, ObserveRequest, PermitsRequest, ReleaseRequest, Request,
};

/// Longest key, in bytes.
pub const KEY_LEN_MAX: usize = 128;
/// Most keys in one key set.
pub const SET_KEYS_MAX: usize = 16;
/// Longest lease a request may ask for, in seconds.
pub const LEASE_S_MAX: u8 = 250;
/// `[op][body_len u16]`.
pub const FRAME_HEADER_LEN: usize = 3;
/// Largest acquire frame (`A`), header included.
pub const ACQUIRE_FRAME_LEN_MAX: usize = 141;
/// Largest release frame (`R`), header included.
pub const RELEASE_FRAME_LEN_MAX: usize = 147;
/// Largest key-set acquire frame (`S`), header included.
pub const ACQUIRE_SET_FRAME_LEN_MAX: usize = 2078;
/// Largest key-set release frame (`G`), header included.
pub const RELEASE_SET_FRAME_LEN_MAX: usize = 2084;
/// Leader slot meaning "no leader known" (and the only slot of single mode).
pub const NO_LEADER_SLOT: u8 = 0xFF;
/// Longest client label an `X` request may carry, in bytes.
pub const LABEL_LEN_MAX: usize = 64;
/// The extension version this build speaks in `X`.
pub const EXTENSION_VERSION: u8 = 1;
/// Largest negotiation frame (`X`), header included.
pub const NEGOTIATE_FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + 14 + LABEL_LEN_MAX;
/// Largest capped acquire frame (`H`), header included: an acquire-set
/// frame with a 4-byte hold cap.
pub const ACQUIRE_CAPPED_FRAME_LEN_MAX: usize =
    FRAME_HEADER_LEN + 15 + SET_KEYS_MAX * (1 + KEY_LEN_MAX);
/// Largest extension frame (`W`), header included: a release-set frame
/// with a lease byte.
pub const EXTEND_FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + 18 + SET_KEYS_MAX * (1 + KEY_LEN_MAX);

/// Most permits one `Q` may ask for: a permit grant is a key set of its
/// slot keys ([`slot_key`]), so it has at most [`SET_KEYS_MAX`].
pub const PERMITS_MAX: u8 = SET_KEYS_MAX as u8;
/// Most slots a semaphore may declare.
pub const SEMAPHORE_CAPACITY_MAX: u16 = 1024;
/// Longest semaphore name, in bytes: its slot keys add
/// [`SLOT_SUFFIX_LEN`] bytes and must fit [`KEY_LEN_MAX`].
pub const SEMAPHORE_NAME_LEN_MAX: usize = KEY_LEN_MAX - SLOT_SUFFIX_LEN;
/// The bytes a slot key adds to its semaphore's name: `[` four digits `]`.
pub const SLOT_SUFFIX_LEN: usize = 6;
/// Largest permits frame (`Q`), header included: room for any key as the
/// name, so that a name too long for its slot keys is answered `E 1`
/// rather than closing the connection.
pub const PERMITS_FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + 18 + KEY_LEN_MAX;
/// Largest observe frame (`O`), header included: rid and one key.
pub const OBSERVE_FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + 8 + KEY_LEN_MAX;
/// Largest shared acquire frame (`Y`), header included: a capped acquire
/// frame with a 2-byte mode mask.
pub const ACQUIRE_SHARED_FRAME_LEN_MAX: usize =
    FRAME_HEADER_LEN + 17 + SET_KEYS_MAX * (1 + KEY_LEN_MAX);
/// Largest downgrade frame (`D`), header included: as a release-set frame.
pub const DOWNGRADE_FRAME_LEN_MAX: usize = RELEASE_SET_FRAME_LEN_MAX;

/// Capabilities a connection negotiated with `X` (docs/protocol.md §8): a
/// bit set on the wire (u32). Bits this build does not know are never
/// granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities(pub u32);

impl Capabilities {
    /// Nothing negotiated: plain v3, as every published client speaks it.
    pub const NONE: Capabilities = Capabilities(0);
    /// `W`: renew a grant by its exact token.
    pub const EXTEND: Capabilities = Capabilities(1);
    /// `P` frames: the server tells the holder that its lease is ending or
    /// that its grant is lost.
    pub const PUSH: Capabilities = Capabilities(2);
    /// `Q`: take numbered permits of a FIFO semaphore.
    pub const PERMITS: Capabilities = Capabilities(4);
    /// `O`: observe who holds a key (an election's leader and term).
    pub const OBSERVE: Capabilities = Capabilities(8);
    /// `Y` and `D`: shared (read) and exclusive modes per key, and the
    /// downgrade of an exclusive grant to shared.
    pub const SHARED: Capabilities = Capabilities(0x10);
    /// Every bit this build knows.
    pub const KNOWN: Capabilities = Capabilities(0x1f);

    /// The bits set in either.
    pub fn union(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 | other.0)
    }

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits set in both.
    pub fn intersection(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 & other.0)
    }
}

/// Largest request frame of any kind, header included.
const REQUEST_FRAME_LEN_MAX: usize = EXTEND_FRAME_LEN_MAX;

/// Decoder buffer capacity kept across pushes. A larger allocation left by
/// one big push is given back once the bytes in it have been consumed, so a
/// burst does not pin memory for the life of the connection.
const DECODER_RETAIN_CAPACITY: usize = 8 * REQUEST_FRAME_LEN_MAX;

// The limits are derived from the field layout; keep them in step.
const _: () = {
    assert!(ACQUIRE_FRAME_LEN_MAX == FRAME_HEADER_LEN + 10 + KEY_LEN_MAX);
    assert!(RELEASE_FRAME_LEN_MAX == FRAME_HEADER_LEN + 16 + KEY_LEN_MAX);
    assert!(ACQUIRE_SET_FRAME_LEN_MAX == FRAME_HEADER_LEN + 11 + SET_KEYS_MAX * (1 + KEY_LEN_MAX));
    assert!(RELEASE_SET_FRAME_LEN_MAX == FRAME_HEADER_LEN + 17 + SET_KEYS_MAX * (1 + KEY_LEN_MAX));
    assert!(REQUEST_FRAME_LEN_MAX - FRAME_HEADER_LEN <= u16::MAX as usize);
    assert!(PERMITS_FRAME_LEN_MAX <= REQUEST_FRAME_LEN_MAX);
    assert!(OBSERVE_FRAME_LEN_MAX <= REQUEST_FRAME_LEN_MAX);
    assert!(ACQUIRE_SHARED_FRAME_LEN_MAX <= REQUEST_FRAME_LEN_MAX);
    assert!(
        SEMAPHORE_CAPACITY_MAX <= 9999,
        "slot numbers are written in four digits"
    );
};

/// The request kinds, by op byte: the four of v3, and the extension ops.
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
    /// `X`: negotiate capabilities and a label (our clients only).
    Negotiate,
    /// `W`: renew a grant by its exact token (capability
    /// [`Capabilities::EXTEND`]).
    Extend,
    /// `H`: acquire a key or key set with a cap on total hold (capability
    /// [`Capabilities::EXTEND`]).
    AcquireCapped,
    /// `Q`: take permits of a semaphore (capability
    /// [`Capabilities::PERMITS`]).
    AcquirePermits,
    /// `O`: observe a key's holder, read-only (capability
    /// [`Capabilities::OBSERVE`]).
    Observe,
    /// `Y`: acquire a key or key set with a mode per key, shared or
    /// exclusive (capability [`Capabilities::SHARED`]).
    AcquireShared,
    /// `D`: downgrade an exclusive grant to shared in place (capability
    /// [`Capabilities::SHARED`]).
    Downgrade,
}

impl RequestKind {
    /// The op byte on the wire.
    pub fn op(self) -> u8 {
        match self {
            RequestKind::Acquire => b'A',
            RequestKind::Release => b'R',
            RequestKind::AcquireSet => b'S',
            RequestKind::ReleaseSet => b'G',
            RequestKind::Negotiate => b'X',
            RequestKind::Extend => b'W',
            RequestKind::AcquireCapped => b'H',
            RequestKind::AcquirePermits => b'Q',
            RequestKind::Observe => b'O',
            RequestKind::AcquireShared => b'Y',
            RequestKind::Downgrade => b'D',
        }
    }
    /// The kind for an op byte, if it is a request op on a connection that
    /// negotiated `caps`: `X` always, an extension op only when granted.
    pub fn from_op(op: u8, caps: Capabilities) -> Option<Self> {
        match op {
            b'A' => Some(RequestKind::Acquire),
            b'R' => Some(RequestKind::Release),
            b'S' => Some(RequestKind::AcquireSet),
            b'G' => Some(RequestKind::ReleaseSet),
            b'X' => Some(RequestKind::Negotiate),
            b'W' if caps.contains(Capabilities::EXTEND) => Some(RequestKind::Extend),
            b'H' if caps.contains(Capabilities::EXTEND) => Some(RequestKind::AcquireCapped),
            b'Q' if caps.contains(Capabilities::PERMITS) => Some(RequestKind::AcquirePermits),
            b'O' if caps.contains(Capabilities::OBSERVE) => Some(RequestKind::Observe),
            b'Y' if caps.contains(Capabilities::SHARED) => Some(RequestKind::AcquireShared),
            b'D' if caps.contains(Capabilities::SHARED) => Some(RequestKind::Downgrade),
            _ => None,
        }
    }
    /// `A`, `S`, `H`, `Q` or `Y`.
    pub fn is_acquire(self) -> bool {
        matches!(
            self,
            RequestKind::Acquire
                | RequestKind::AcquireSet
                | RequestKind::AcquireCapped
                | RequestKind::AcquirePermits
                | RequestKind::AcquireShared
        )
    }
    /// `S` or `G`, or `W` (which always carries set records).
    pub fn is_set(self) -> bool {
        matches!(
            self,
            RequestKind::AcquireSet
                | RequestKind::ReleaseSet
                | RequestKind::Extend
                | RequestKind::AcquireCapped
                | RequestKind::AcquireShared
                | RequestKind::Downgrade
        )
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
            // rid · version · capabilities · label length
            RequestKind::Negotiate => 14,
            // rid · token · lease · count
            RequestKind::Extend => 18,
            // rid · wait · lease · hold cap · count
            RequestKind::AcquireCapped => 15,
            // rid · wait · lease · hold cap · permits · capacity · name length
            RequestKind::AcquirePermits => 18,
            // rid
            RequestKind::Observe => 8,
            // rid · wait · lease · hold cap · modes · count
            RequestKind::AcquireShared => 17,
            // rid · token · count
            RequestKind::Downgrade => 17,
        }
    }
    /// Largest body this kind may declare.
    pub fn body_len_max(self) -> usize {
        let frame_len = match self {
            RequestKind::Acquire => ACQUIRE_FRAME_LEN_MAX,
            RequestKind::Release => RELEASE_FRAME_LEN_MAX,
            RequestKind::AcquireSet => ACQUIRE_SET_FRAME_LEN_MAX,
            RequestKind::ReleaseSet => RELEASE_SET_FRAME_LEN_MAX,
            RequestKind::Negotiate => NEGOTIATE_FRAME_LEN_MAX,
            RequestKind::Extend => EXTEND_FRAME_LEN_MAX,
            RequestKind::AcquireCapped => ACQUIRE_CAPPED_FRAME_LEN_MAX,
            RequestKind::AcquirePermits => PERMITS_FRAME_LEN_MAX,
            RequestKind::Observe => OBSERVE_FRAME_LEN_MAX,
            RequestKind::AcquireShared => ACQUIRE_SHARED_FRAME_LEN_MAX,
            RequestKind::Downgrade => DOWNGRADE_FRAME_LEN_MAX,
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
    /// Token 0 in a release or an extension.
    BadToken = 7,
    /// An `X` the server cannot take: an unknown extension version, a label
    /// that is too long or not printable UTF-8, or a second `X` on the
    /// connection. Nothing was negotiated by it.
    BadExtension = 8,
    /// A `Q` whose permits or capacity are out of range: permits outside
    /// 1..=16 or above the capacity, capacity outside 1..=1024, or a name
    /// length byte that does not match the body.
    BadPermits = 9,
    /// A `Y` whose mode mask marks a key past the last one named.
    BadModes = 10,
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
            8 => Some(ErrorCode::BadExtension),
            9 => Some(ErrorCode::BadPermits),
            10 => Some(ErrorCode::BadModes),
            _ => None,
        }
    }
    /// Whether this code may answer a request of `kind` (docs/protocol.md §5, the "may answer" column).
    pub fn allowed_for(self, kind: RequestKind) -> bool {
        use RequestKind::{
            AcquirePermits, AcquireShared, Downgrade, Extend, Negotiate, Release, ReleaseSet,
        };
        match self {
            ErrorCode::NotActive | ErrorCode::NoLeader => true,
            // An observe names one key and nothing else: of the codes
            // about fields, only this one can answer it.
            ErrorCode::BadKey => kind != Negotiate,
            ErrorCode::BadLease => kind.is_acquire() || kind == Extend,
            ErrorCode::BadKeySet => kind.is_set(),
            ErrorCode::GroupMismatch => matches!(kind, Release | ReleaseSet | Downgrade),
            ErrorCode::BadToken => matches!(kind, Release | ReleaseSet | Extend | Downgrade),
            ErrorCode::BadExtension => kind == Negotiate,
            ErrorCode::BadPermits => kind == AcquirePermits,
            ErrorCode::BadModes => kind == AcquireShared,
        }
    }
}

/// The big-endian u64 at `at`; the caller has checked the length.
fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}
