//! Reply frames ([`Reply`]): encoding, and decoding with every check a
//! client makes before it trusts one.

use super::{
    Capabilities, ErrorCode, FRAME_HEADER_LEN, LABEL_LEN_MAX, PERMITS_MAX, RequestKind, read_u64,
};

/// The slots of a permit grant, ascending: 1..=[`PERMITS_MAX`] slot
/// numbers, in a fixed-size value so that a [`Reply`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slots {
    len: u8,
    slots: [u16; PERMITS_MAX as usize],
}

impl Slots {
    /// The slots `slots`, if there are 1..=16 of them, strictly ascending.
    pub fn new(slots: &[u16]) -> Option<Slots> {
        if slots.is_empty() || slots.len() > usize::from(PERMITS_MAX) {
            return None;
        }
        if !slots.windows(2).all(|pair| pair[0] < pair[1]) {
            return None;
        }
        let mut all = [0; PERMITS_MAX as usize];
        all[..slots.len()].copy_from_slice(slots);
        Some(Slots {
            len: slots.len() as u8,
            slots: all,
        })
    }
    /// The slot numbers, ascending.
    pub fn as_slice(&self) -> &[u16] {
        &self.slots[..usize::from(self.len)]
    }
}

impl core::fmt::Debug for Slots {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The label of a key's holder in an `O` reply: the label its connection
/// negotiated with `X` (0..=[`LABEL_LEN_MAX`] bytes of UTF-8 without
/// control characters), in a fixed-size value so that a [`Reply`] stays
/// `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaderLabel {
    len: u8,
    bytes: [u8; LABEL_LEN_MAX],
}

impl LeaderLabel {
    /// No label: the holder's connection negotiated none.
    pub const EMPTY: LeaderLabel = LeaderLabel {
        len: 0,
        bytes: [0; LABEL_LEN_MAX],
    };

    /// `label`, if it is a label an `X` may carry: at most 64 bytes,
    /// without control characters.
    pub fn new(label: &str) -> Option<LeaderLabel> {
        if label.len() > LABEL_LEN_MAX || label.chars().any(char::is_control) {
            return None;
        }
        let mut bytes = [0; LABEL_LEN_MAX];
        bytes[..label.len()].copy_from_slice(label.as_bytes());
        Some(LeaderLabel {
            len: label.len() as u8,
            bytes,
        })
    }
    /// The label's text (empty when there is none).
    pub fn as_str(&self) -> &str {
        // Built only from a `&str` or from bytes checked to be UTF-8.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
    /// Whether there is no label.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl core::fmt::Debug for LeaderLabel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Who holds an observed key (`O`, docs/protocol.md §8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LeaderState {
    /// Nobody: the key is free (never taken, released, or its lease ran
    /// out).
    None = 0,
    /// Held, by a connection that is open: the label is that
    /// connection's.
    Connected = 1,
    /// Held, by a connection that has closed since: the grant stays until
    /// its lease runs out (or it is released or renewed by its token). The
    /// label is the one that connection had, if the server still knows it.
    Departed = 2,
}

impl LeaderState {
    /// The state for a byte, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(LeaderState::None),
            1 => Some(LeaderState::Connected),
            2 => Some(LeaderState::Departed),
            _ => None,
        }
    }
}

/// What an `O` reply tells about a key: nobody holds it, or its holder's
/// token (an election's term), lease left and label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Observed {
    /// Whether the key is held, and by a connection still open.
    pub state: LeaderState,
    /// The holder's fencing token; 0 when nobody holds it.
    pub term: u64,
    /// The holder's lease left as the server answers, in milliseconds; 0
    /// when nobody holds it.
    pub lease_ms: u32,
    /// The holder's label; empty when nobody holds it.
    pub label: LeaderLabel,
}

impl Observed {
    /// Nobody holds the key.
    pub const NO_LEADER: Observed = Observed {
        state: LeaderState::None,
        term: 0,
        lease_ms: 0,
        label: LeaderLabel::EMPTY,
    };

    /// Whether the fields fit the state: a holder has a non-zero term;
    /// nobody has term, lease and label all empty.
    fn is_consistent(&self) -> bool {
        match self.state {
            LeaderState::None => *self == Observed::NO_LEADER,
            LeaderState::Connected | LeaderState::Departed => self.term != 0,
        }
    }
}

/// How an extension (`W`) ended, when the token was current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ExtendStatus {
    /// The lease now ends the lease asked for after the server's receipt.
    Extended = 0,
    /// The grant's hold cap came first: the lease now ends at the cap.
    Clipped = 1,
    /// The lease already reaches the cap: nothing changed.
    AtCap = 2,
}

/// What a push (`P`) tells the holder of a grant. Advisory: a client may
/// only ever move its own deadline earlier because of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PushKind {
    /// The lease ends soon (the push carries the milliseconds left).
    LeaseEnding = 1,
    /// Lost: the lease ran out.
    Expired = 2,
    /// Lost: an operator force-released it.
    ForceReleased = 3,
    /// Lost: the lease ran out at the grant's hold cap.
    CapReached = 4,
}

impl PushKind {
    /// The kind for a byte, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(PushKind::LeaseEnding),
            2 => Some(PushKind::Expired),
            3 => Some(PushKind::ForceReleased),
            4 => Some(PushKind::CapReached),
            _ => None,
        }
    }

    /// Whether the grant is gone.
    pub fn is_lost(self) -> bool {
        self != PushKind::LeaseEnding
    }
}

impl ExtendStatus {
    /// The status for a byte, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(ExtendStatus::Extended),
            1 => Some(ExtendStatus::Clipped),
            2 => Some(ExtendStatus::AtCap),
            _ => None,
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
        /// Leader slot, or [`NO_LEADER_SLOT`](super::NO_LEADER_SLOT).
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
        /// Leader slot, or [`NO_LEADER_SLOT`](super::NO_LEADER_SLOT).
        leader_slot: u8,
    },
    /// `X`: the capabilities granted to an `X` (our clients only).
    Negotiated {
        /// Request id.
        rid: u64,
        /// The capabilities granted: those asked for that the server has.
        granted: Capabilities,
    },
    /// `P`: unsolicited news for the holder of `token` (a connection that
    /// negotiated [`Capabilities::PUSH`]); no rid.
    Push {
        /// The grant's fencing token.
        token: u64,
        /// Ending soon, or lost and why.
        kind: PushKind,
        /// The lease left in milliseconds (0 when lost).
        lease_ms: u32,
    },
    /// `Q`: permits granted: the slots, under one token.
    Permits {
        /// Request id.
        rid: u64,
        /// Fencing token of the grant (every slot's).
        token: u64,
        /// Slots of the semaphore still free after this grant.
        free: u16,
        /// The slots granted, ascending (they double as worker ids).
        slots: Slots,
    },
    /// `C`: the semaphore is in use with another capacity than the
    /// request declared; nothing changed.
    CapacityMismatch {
        /// Request id.
        rid: u64,
        /// The capacity the request declared.
        asked: u16,
        /// The capacity the semaphore has.
        capacity: u16,
    },
    /// `O`: who holds the key observed, read as the server answered.
    Observed {
        /// Request id.
        rid: u64,
        /// Nobody, or the holder's term, lease left and label.
        observed: Observed,
    },
    /// `D`: the grant now holds its keys shared (same token, same lease).
    Downgraded {
        /// Request id.
        rid: u64,
    },
    /// `W`: the token was current; how the extension ended.
    Extended {
        /// Request id.
        rid: u64,
        /// Extended, clipped at the hold cap, or refused at the cap.
        status: ExtendStatus,
        /// The lease left from the server's answer, in milliseconds (the
        /// client counts it from when it sent the `W`).
        lease_ms: u32,
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
    /// Unknown `W` status.
    UnknownStatus(u8),
    /// Unknown `P` kind.
    UnknownPush(u8),
    /// A `Q` whose slots are not 1..=16 strictly ascending numbers.
    BadSlots,
    /// An `O` with an unknown state, fields that do not fit its state, or
    /// a label that is not one an `X` may carry (its padding included).
    BadObserved,
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
            ReplyError::UnknownStatus(status) => {
                write!(f, "extension reply carries unknown status {status}")
            }
            ReplyError::UnknownPush(kind) => write!(f, "push carries unknown kind {kind}"),
            ReplyError::BadSlots => {
                f.write_str("permits reply carries no slots, too many, or slots out of order")
            }
            ReplyError::BadObserved => f.write_str(
                "observe reply carries an unknown state, fields that do not fit it, or a bad label",
            ),
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
        b'X' => Some(12),
        b'W' => Some(13),
        b'P' => Some(13),
        // rid · token · free · count · 16 slots
        b'Q' => Some(51),
        b'C' => Some(12),
        // rid · state · term · lease_ms · label_len · 64 label bytes
        b'O' => Some(86),
        b'D' => Some(8),
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
            | Reply::Error { rid, .. }
            | Reply::Negotiated { rid, .. }
            | Reply::Permits { rid, .. }
            | Reply::CapacityMismatch { rid, .. }
            | Reply::Observed { rid, .. }
            | Reply::Downgraded { rid }
            | Reply::Extended { rid, .. } => Some(rid),
            Reply::Leader { .. } | Reply::Push { .. } => None,
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
            Reply::Negotiated { .. } => b'X',
            Reply::Extended { .. } => b'W',
            Reply::Push { .. } => b'P',
            Reply::Permits { .. } => b'Q',
            Reply::CapacityMismatch { .. } => b'C',
            Reply::Observed { .. } => b'O',
            Reply::Downgraded { .. } => b'D',
        }
    }
    /// The length of the reply's frame, header included: what
    /// [`Reply::encode`] appends.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + reply_body_len(self.op()).expect("every reply op has a length")
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
            Reply::Negotiated { granted, .. } => out.extend_from_slice(&granted.0.to_be_bytes()),
            Reply::Extended {
                status, lease_ms, ..
            } => {
                out.push(status as u8);
                out.extend_from_slice(&lease_ms.to_be_bytes());
            }
            Reply::Push {
                token,
                kind,
                lease_ms,
            } => {
                out.extend_from_slice(&token.to_be_bytes());
                out.push(kind as u8);
                out.extend_from_slice(&lease_ms.to_be_bytes());
            }
            Reply::Permits {
                token, free, slots, ..
            } => {
                out.extend_from_slice(&token.to_be_bytes());
                out.extend_from_slice(&free.to_be_bytes());
                out.push(slots.len);
                for slot in slots.slots {
                    out.extend_from_slice(&slot.to_be_bytes());
                }
            }
            Reply::CapacityMismatch {
                asked, capacity, ..
            } => {
                out.extend_from_slice(&asked.to_be_bytes());
                out.extend_from_slice(&capacity.to_be_bytes());
            }
            Reply::Observed { observed, .. } => {
                out.push(observed.state as u8);
                out.extend_from_slice(&observed.term.to_be_bytes());
                out.extend_from_slice(&observed.lease_ms.to_be_bytes());
                out.push(observed.label.len);
                out.extend_from_slice(&observed.label.bytes);
            }
            Reply::Released { .. }
            | Reply::Downgraded { .. }
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
        if op == b'P' {
            return Ok(Some((
                Reply::Push {
                    token: nonzero(read_u64(body, 0))?,
                    kind: PushKind::from_u8(body[8]).ok_or(ReplyError::UnknownPush(body[8]))?,
                    lease_ms: u32::from_be_bytes([body[9], body[10], body[11], body[12]]),
                },
                frame_len,
            )));
        }
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
            b'X' => Reply::Negotiated {
                rid,
                granted: Capabilities(u32::from_be_bytes([body[8], body[9], body[10], body[11]])),
            },
            b'W' => Reply::Extended {
                rid,
                status: ExtendStatus::from_u8(body[8]).ok_or(ReplyError::UnknownStatus(body[8]))?,
                lease_ms: u32::from_be_bytes([body[9], body[10], body[11], body[12]]),
            },
            b'Q' => {
                let count = usize::from(body[18]);
                let mut all = [0u16; PERMITS_MAX as usize];
                for (at, slot) in all.iter_mut().enumerate() {
                    *slot = u16::from_be_bytes([body[19 + 2 * at], body[20 + 2 * at]]);
                }
                let slots = all.get(..count).and_then(Slots::new);
                Reply::Permits {
                    rid,
                    token: nonzero(read_u64(body, 8))?,
                    free: u16::from_be_bytes([body[16], body[17]]),
                    slots: slots.ok_or(ReplyError::BadSlots)?,
                }
            }
            b'C' => Reply::CapacityMismatch {
                rid,
                asked: u16::from_be_bytes([body[8], body[9]]),
                capacity: u16::from_be_bytes([body[10], body[11]]),
            },
            b'O' => Reply::Observed {
                rid,
                observed: decode_observed(&body[8..])?,
            },
            b'D' => Reply::Downgraded { rid },
            _ => unreachable!("reply_body_len accepted only the ops above"),
        };
        Ok(Some((reply, frame_len)))
    }
    /// What [`Reply::decode`] would make of this reply's frame, decided
    /// from the value (for a driver that hands a session reply values
    /// instead of bytes): a rid or token of 0 is [`ReplyError::Zero`]; every
    /// other value decodes to itself (an error code is valid by its type).
    pub fn check(&self) -> Result<(), ReplyError> {
        let zero_token = matches!(
            *self,
            Reply::Acquired { token: 0, .. }
                | Reply::AcquiredSet { token: 0, .. }
                | Reply::Push { token: 0, .. }
                | Reply::Permits { token: 0, .. }
        );
        if self.rid() == Some(0) || zero_token {
            return Err(ReplyError::Zero);
        }
        if let Reply::Observed { observed, .. } = self
            && !observed.is_consistent()
        {
            return Err(ReplyError::BadObserved);
        }
        Ok(())
    }
    /// Whether this reply may answer a request of `kind` (`L` answers none).
    pub fn answers(&self, kind: RequestKind) -> bool {
        match *self {
            Reply::Acquired { .. } => kind == RequestKind::Acquire,
            Reply::AcquiredSet { .. } => matches!(
                kind,
                RequestKind::AcquireSet | RequestKind::AcquireCapped | RequestKind::AcquireShared
            ),
            Reply::Released { .. } => kind == RequestKind::Release,
            Reply::ReleasedSet { .. } => kind == RequestKind::ReleaseSet,
            Reply::TimedOut { .. } | Reply::Busy { .. } => kind.is_acquire(),
            Reply::Permits { .. } | Reply::CapacityMismatch { .. } => {
                kind == RequestKind::AcquirePermits
            }
            Reply::NotFound { .. } => matches!(
                kind,
                RequestKind::Release
                    | RequestKind::ReleaseSet
                    | RequestKind::Extend
                    | RequestKind::Downgrade
            ),
            Reply::Negotiated { .. } => kind == RequestKind::Negotiate,
            Reply::Extended { .. } => kind == RequestKind::Extend,
            Reply::Observed { .. } => kind == RequestKind::Observe,
            Reply::Downgraded { .. } => kind == RequestKind::Downgrade,
            Reply::Moved { .. } | Reply::Indeterminate { .. } => true,
            Reply::Error { code, .. } => code.allowed_for(kind),
            Reply::Leader { .. } | Reply::Push { .. } => false,
        }
    }
}

/// The fields of an `O` body after its rid (78 bytes), checked as a
/// client must before it trusts them.
fn decode_observed(fields: &[u8]) -> Result<Observed, ReplyError> {
    let state = LeaderState::from_u8(fields[0]).ok_or(ReplyError::BadObserved)?;
    let term = read_u64(fields, 1);
    let lease_ms = u32::from_be_bytes([fields[9], fields[10], fields[11], fields[12]]);
    let label_len = usize::from(fields[13]);
    let padded = &fields[14..14 + LABEL_LEN_MAX];
    let (text, padding) = padded
        .split_at_checked(label_len)
        .ok_or(ReplyError::BadObserved)?;
    if padding.iter().any(|&byte| byte != 0) {
        return Err(ReplyError::BadObserved);
    }
    let label = std::str::from_utf8(text)
        .ok()
        .and_then(LeaderLabel::new)
        .ok_or(ReplyError::BadObserved)?;
    let observed = Observed {
        state,
        term,
        lease_ms,
        label,
    };
    if state != LeaderState::None && term == 0 {
        return Err(ReplyError::Zero);
    }
    if !observed.is_consistent() {
        return Err(ReplyError::BadObserved);
    }
    Ok(observed)
}

fn nonzero(value: u64) -> Result<u64, ReplyError> {
    if value == 0 {
        Err(ReplyError::Zero)
    } else {
        Ok(value)
    }
}
