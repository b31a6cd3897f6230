//! The cluster protocol between nodes: handshake, authenticated framing and
//! the encoding of every Raft message. Sans-IO like the rest of the core:
//! bytes in, bytes and decisions out.
//!
//! # Handshake (after TCP and optional TLS), peer protocol version 2
//!
//! Asymmetric, one round trip: both sides send a 76-byte hello as soon as
//! the transport is up; the **dialer proves first**, and the acceptor sends
//! its proof only after the dialer's verified, so nobody learns a proof
//! without having given one. A side that could not verify closes the
//! connection without a word.
//!
//! | offset | len | field |
//! |---|---|---|
//! | 0 | 8 | magic `TCKPEER2` |
//! | 8 | 2 | peer protocol version (2) |
//! | 10 | 32 | cluster identity fingerprint |
//! | 42 | 1 | role: 0 dialer, 1 acceptor |
//! | 43 | 1 | sender slot |
//! | 44 | 8 | sender generation |
//! | 52 | 8 | sender token floor (below 2^63) |
//! | 60 | 16 | nonce (fresh CSPRNG bytes per connection) |
//!
//! ```text
//! dialer                                  acceptor
//!   hello_D  ------------------------------>
//!            <------------------------------  hello_A
//!   proof_D  ------------------------------>  verified against every
//!                                             accepted token
//!            <------------------------------  proof_A (with the matched token)
//!   frames   <=============================>  frames
//! ```
//!
//! proof_R = HMAC-SHA256(token, `"TCK/PEER/AUTH2"` ‖ label_R ‖ hello_D ‖
//! hello_A) with label `"dialer\0\0"` or `"acceptor"`: bound to the role,
//! the fingerprint, both identities, both nonces and the version (all in
//! the hello bytes). The dialer proves with its own (first) token; the
//! acceptor tries every accepted token in constant time and answers, and
//! derives keys, with the one that matched.
//!
//! Session keys: `K = HMAC(token, "TCK/PEER/KEYS2" ‖ hello_D ‖ hello_A ‖
//! proof_D ‖ proof_A)`, `k_d2a = HMAC(K, "d2a")`, `k_a2d = HMAC(K, "a2d")`,
//! so every connection and direction has its own key.
//!
//! # Frames
//!
//! `[len u32][version u8 = 2][kind u8][payload][tag 16]`, `len` counting
//! version, kind, payload and tag (so at least 18), at most
//! [`MAX_FRAME_LEN`]. `tag` is the first 16 bytes of HMAC-SHA256(key of the
//! direction, `seq u64 ‖ len ‖ version ‖ kind ‖ payload`) where `seq`
//! counts the frames sent in that direction from 0: a frame replayed,
//! reordered, reflected or taken from another connection does not verify.
//! The receiver checks the tag before decoding the payload. Every frame
//! carries one [`Message`]: `kind` is the body's tag, the payload starts
//! with `from slot u8 · from generation u64 · to slot u8 · to generation u64
//! · term u64`, then the body fields (see `docs/cluster.md`). A bad tag or
//! anything that does not decode is an error that closes the connection;
//! Raft tolerates the lost messages.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::bytes::Reader;
use crate::auth::{MIN_TOKEN_LEN, NONCE_LEN, PROOF_LEN};
use crate::raft::{Configuration, Entry, EntryKind, Message, MessageBody, NodeId, SnapshotMeta};
use crate::time::Instant;

type HmacSha256 = Hmac<Sha256>;

/// Hello magic.
pub const PEER_MAGIC: [u8; 8] = *b"TCKPEER2";
/// Domain string that starts the proof transcript.
pub const PEER_AUTH_DOMAIN: [u8; 14] = *b"TCK/PEER/AUTH2";
/// Domain string that starts the session key derivation.
pub const PEER_KEYS_DOMAIN: [u8; 14] = *b"TCK/PEER/KEYS2";
/// Role label of the dialer's proof.
pub const DIALER_LABEL: [u8; 8] = *b"dialer\0\0";
/// Role label of the acceptor's proof.
pub const ACCEPTOR_LABEL: [u8; 8] = *b"acceptor";
/// Peer protocol version carried in the hello.
pub const PEER_VERSION: u16 = 2;
/// Peer hello length.
pub const PEER_HELLO_LEN: usize = 76;
/// Version byte of every frame.
pub const FRAME_VERSION: u8 = 2;
/// Length prefix size.
pub const FRAME_LEN_BYTES: usize = 4;
/// Bytes of the truncated HMAC tag that ends every frame.
pub const FRAME_TAG_LEN: usize = 16;
/// Smallest value of a frame's length field: version, kind and tag.
pub const MIN_FRAME_LEN: usize = 2 + FRAME_TAG_LEN;
/// Largest value of a frame's length field: 4 MiB, well above the largest
/// append (`max_append_bytes` plus one `max_entry_bytes` entry) and snapshot
/// chunk a node is configured to send (checked by the node at start).
pub const MAX_FRAME_LEN: usize = 4 << 20;
/// Token floors at or above this are impossible (a token is a microsecond
/// wall-clock count or a counter grown from one) and refused.
pub const TOKEN_FLOOR_LIMIT: u64 = 1 << 63;
/// Most voters or learners a configuration on the wire may list.
pub const MAX_CONFIG_MEMBERS: usize = 16;
/// Bytes of the message header in every payload.
const MESSAGE_HEADER_LEN: usize = 9 + 9 + 8;
/// Smallest encoded entry (a no-op): index, term, kind.
const MIN_ENTRY_LEN: usize = 17;

/// Tags of the message kinds.
mod kind {
    pub const PRE_VOTE: u8 = 1;
    pub const PRE_VOTE_RESPONSE: u8 = 2;
    pub const VOTE: u8 = 3;
    pub const VOTE_RESPONSE: u8 = 4;
    pub const APPEND: u8 = 5;
    pub const APPEND_RESPONSE: u8 = 6;
    pub const HEARTBEAT: u8 = 7;
    pub const HEARTBEAT_RESPONSE: u8 = 8;
    pub const INSTALL_SNAPSHOT: u8 = 9;
    pub const SNAPSHOT_RESPONSE: u8 = 10;
    pub const TIMEOUT_NOW: u8 = 11;
}

/// Tags of the entry kinds.
const ENTRY_NOOP: u8 = 0;
const ENTRY_COMMAND: u8 = 1;
const ENTRY_CONFIG: u8 = 2;

/// Why a frame was refused. Every case closes the peer connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// The length field is below [`MIN_FRAME_LEN`] or above [`MAX_FRAME_LEN`].
    BadLength(u32),
    /// Unknown frame version.
    Version(u8),
    /// Unknown message kind.
    Kind(u8),
    /// The tag does not verify: forged, corrupted, replayed, reordered or
    /// from another connection.
    BadTag,
    /// The payload does not decode exactly (truncated, trailing bytes, a
    /// field out of range, entries not consecutive).
    Malformed,
    /// A message too large to frame (not sent).
    TooLarge,
    /// 2^64 frames were sent on the connection (not sent).
    SequenceExhausted,
}

impl core::fmt::Display for PeerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PeerError::BadLength(len) => write!(f, "peer frame length {len} out of range"),
            PeerError::Version(v) => write!(f, "unknown peer frame version {v}"),
            PeerError::Kind(k) => write!(f, "unknown peer message kind {k}"),
            PeerError::BadTag => f.write_str("peer frame tag does not verify"),
            PeerError::Malformed => f.write_str("malformed peer frame"),
            PeerError::TooLarge => f.write_str("peer message too large to frame"),
            PeerError::SequenceExhausted => f.write_str("peer frame sequence exhausted"),
        }
    }
}

impl std::error::Error for PeerError {}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

fn put_id(out: &mut Vec<u8>, id: NodeId) {
    out.push(id.slot);
    out.extend_from_slice(&id.generation.to_be_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), PeerError> {
    let len = u32::try_from(bytes.len()).map_err(|_| PeerError::TooLarge)?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn put_config(out: &mut Vec<u8>, config: &Configuration) -> Result<(), PeerError> {
    for set in [&config.voters, &config.learners] {
        if set.len() > MAX_CONFIG_MEMBERS {
            return Err(PeerError::TooLarge);
        }
        out.push(set.len() as u8);
        // BTreeSet iterates ascending: the decoder insists on it, so each
        // configuration has exactly one encoding.
        for id in set {
            put_id(out, *id);
        }
    }
    Ok(())
}

fn put_entry(out: &mut Vec<u8>, entry: &Entry) -> Result<(), PeerError> {
    put_u64(out, entry.index);
    put_u64(out, entry.term);
    match &entry.kind {
        EntryKind::Noop => out.push(ENTRY_NOOP),
        EntryKind::Command(bytes) => {
            out.push(ENTRY_COMMAND);
            put_bytes(out, bytes)?;
        }
        EntryKind::Config(config) => {
            out.push(ENTRY_CONFIG);
            put_config(out, config)?;
        }
    }
    Ok(())
}

/// The keyed MAC state of one direction; cloned per frame so the key
/// schedule runs once per connection.
#[derive(Clone)]
struct FrameMac {
    keyed: HmacSha256,
    seq: u64,
}

impl FrameMac {
    fn new(key: &[u8; 32]) -> Self {
        FrameMac {
            keyed: <HmacSha256 as KeyInit>::new_from_slice(key)
                .expect("HMAC accepts keys of any length"),
            seq: 0,
        }
    }

    /// The full tag of `frame` (length prefix to end of payload) at the
    /// current sequence number.
    fn tag(&self, frame: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(&self.seq.to_be_bytes());
        mac.update(frame);
        mac
    }
}

impl core::fmt::Debug for FrameMac {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print keys.
        write!(f, "FrameMac(seq {})", self.seq)
    }
}

/// Seals outgoing frames of one connection: encodes each message and
/// appends its tag under this direction's key and sequence number.
#[derive(Clone, Debug)]
pub struct PeerSealer {
    mac: FrameMac,
}

impl PeerSealer {
    /// A sealer with this direction's 32-byte key, sequence 0. Nodes get
    /// theirs from the handshake ([`PeerHandshake::take_session`]).
    pub fn from_key(key: &[u8; 32]) -> Self {
        PeerSealer {
            mac: FrameMac::new(key),
        }
    }

    /// Sequence number of the next frame.
    pub fn seq(&self) -> u64 {
        self.mac.seq
    }

    /// Appends one sealed frame carrying `msg` to `out`. On error nothing
    /// is appended and the sequence number does not move.
    pub fn seal(&mut self, msg: &Message, out: &mut Vec<u8>) -> Result<(), PeerError> {
        let next_seq = self
            .mac
            .seq
            .checked_add(1)
            .ok_or(PeerError::SequenceExhausted)?;
        let start = out.len();
        let result = encode_inner(msg, out, start);
        let len = out.len() - start - FRAME_LEN_BYTES + FRAME_TAG_LEN;
        match result {
            Ok(()) if len <= MAX_FRAME_LEN => {
                let len = (len as u32).to_be_bytes();
                out[start..start + FRAME_LEN_BYTES].copy_from_slice(&len);
                let tag = self.mac.tag(&out[start..]).finalize().into_bytes();
                out.extend_from_slice(&tag[..FRAME_TAG_LEN]);
                self.mac.seq = next_seq;
                Ok(())
            }
            Ok(()) => {
                out.truncate(start);
                Err(PeerError::TooLarge)
            }
            Err(error) => {
                out.truncate(start);
                Err(error)
            }
        }
    }
}

fn encode_inner(msg: &Message, out: &mut Vec<u8>, start: usize) -> Result<(), PeerError> {
    out.extend_from_slice(&[0; FRAME_LEN_BYTES]);
    out.push(FRAME_VERSION);
    let tag = match &msg.body {
        MessageBody::PreVote { .. } => kind::PRE_VOTE,
        MessageBody::PreVoteResponse { .. } => kind::PRE_VOTE_RESPONSE,
        MessageBody::Vote { .. } => kind::VOTE,
        MessageBody::VoteResponse { .. } => kind::VOTE_RESPONSE,
        MessageBody::Append { .. } => kind::APPEND,
        MessageBody::AppendResponse { .. } => kind::APPEND_RESPONSE,
        MessageBody::Heartbeat { .. } => kind::HEARTBEAT,
        MessageBody::HeartbeatResponse => kind::HEARTBEAT_RESPONSE,
        MessageBody::InstallSnapshot { .. } => kind::INSTALL_SNAPSHOT,
        MessageBody::SnapshotResponse { .. } => kind::SNAPSHOT_RESPONSE,
        MessageBody::TimeoutNow => kind::TIMEOUT_NOW,
    };
    out.push(tag);
    put_id(out, msg.from);
    put_id(out, msg.to);
    put_u64(out, msg.term);
    match &msg.body {
        MessageBody::PreVote {
            last_index,
            last_term,
        } => {
            put_u64(out, *last_index);
            put_u64(out, *last_term);
        }
        MessageBody::PreVoteResponse { reject } | MessageBody::VoteResponse { reject } => {
            out.push(u8::from(*reject));
        }
        MessageBody::Vote {
            last_index,
            last_term,
            transfer,
        } => {
            put_u64(out, *last_index);
            put_u64(out, *last_term);
            out.push(u8::from(*transfer));
        }
        MessageBody::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => {
            put_u64(out, *prev_index);
            put_u64(out, *prev_term);
            put_u64(out, *commit);
            let count = u32::try_from(entries.len()).map_err(|_| PeerError::TooLarge)?;
            out.extend_from_slice(&count.to_be_bytes());
            for entry in entries {
                put_entry(out, entry)?;
                if out.len() - start > MAX_FRAME_LEN + FRAME_LEN_BYTES {
                    // Stop early rather than build a huge buffer to discard.
                    return Err(PeerError::TooLarge);
                }
            }
        }
        MessageBody::AppendResponse {
            reject,
            index,
            hint_index,
            hint_term,
        } => {
            out.push(u8::from(*reject));
            put_u64(out, *index);
            put_u64(out, *hint_index);
            put_u64(out, *hint_term);
        }
        MessageBody::Heartbeat { commit } => put_u64(out, *commit),
        MessageBody::HeartbeatResponse | MessageBody::TimeoutNow => {}
        MessageBody::InstallSnapshot {
            meta,
            offset,
            data,
            done,
        } => {
            put_u64(out, meta.index);
            put_u64(out, meta.term);
            put_config(out, &meta.config)?;
            put_u64(out, *offset);
            out.push(u8::from(*done));
            if data.len() > MAX_FRAME_LEN {
                return Err(PeerError::TooLarge);
            }
            put_bytes(out, data)?;
        }
        MessageBody::SnapshotResponse {
            index,
            next_offset,
            done,
        } => {
            put_u64(out, *index);
            put_u64(out, *next_offset);
            out.push(u8::from(*done));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

fn get_id(r: &mut Reader<'_>) -> Option<NodeId> {
    Some(NodeId::new(r.u8()?, r.u64()?))
}

fn get_bytes(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let len = usize::try_from(r.u32()?).ok()?;
    // `bytes` checks the length against what is there before copying, so a
    // hostile length never allocates.
    Some(r.bytes(len)?.to_vec())
}

fn get_config(r: &mut Reader<'_>) -> Option<Configuration> {
    let mut config = Configuration::default();
    for learners in [false, true] {
        let count = usize::from(r.u8()?);
        if count > MAX_CONFIG_MEMBERS {
            return None;
        }
        let mut last: Option<NodeId> = None;
        for _ in 0..count {
            let id = get_id(r)?;
            if last.is_some_and(|last| last >= id) {
                return None;
            }
            last = Some(id);
            if learners {
                // A node is never both a voter and a learner.
                if config.voters.contains(&id) {
                    return None;
                }
                config.learners.insert(id);
            } else {
                config.voters.insert(id);
            }
        }
    }
    Some(config)
}

fn get_entry(r: &mut Reader<'_>) -> Option<Entry> {
    let index = r.u64()?;
    let term = r.u64()?;
    let kind = match r.u8()? {
        ENTRY_NOOP => EntryKind::Noop,
        ENTRY_COMMAND => EntryKind::Command(get_bytes(r)?),
        ENTRY_CONFIG => EntryKind::Config(get_config(r)?),
        _ => return None,
    };
    Some(Entry { index, term, kind })
}

fn decode_body(tag: u8, r: &mut Reader<'_>) -> Option<MessageBody> {
    Some(match tag {
        kind::PRE_VOTE => MessageBody::PreVote {
            last_index: r.u64()?,
            last_term: r.u64()?,
        },
        kind::PRE_VOTE_RESPONSE => MessageBody::PreVoteResponse { reject: r.bool()? },
        kind::VOTE => MessageBody::Vote {
            last_index: r.u64()?,
            last_term: r.u64()?,
            transfer: r.bool()?,
        },
        kind::VOTE_RESPONSE => MessageBody::VoteResponse { reject: r.bool()? },
        kind::APPEND => {
            let prev_index = r.u64()?;
            let prev_term = r.u64()?;
            let commit = r.u64()?;
            let count = usize::try_from(r.u32()?).ok()?;
            // Bound the allocation by what the frame can actually hold.
            if count > r.remaining() / MIN_ENTRY_LEN {
                return None;
            }
            let mut entries = Vec::with_capacity(count);
            for offset in 1..=count as u64 {
                let entry = get_entry(r)?;
                // Raft relies on an append being consecutive from
                // prev_index + 1; refuse anything else at the border.
                if Some(entry.index) != prev_index.checked_add(offset) {
                    return None;
                }
                entries.push(entry);
            }
            MessageBody::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            }
        }
        kind::APPEND_RESPONSE => MessageBody::AppendResponse {
            reject: r.bool()?,
            index: r.u64()?,
            hint_index: r.u64()?,
            hint_term: r.u64()?,
        },
        kind::HEARTBEAT => MessageBody::Heartbeat { commit: r.u64()? },
        kind::HEARTBEAT_RESPONSE => MessageBody::HeartbeatResponse,
        kind::INSTALL_SNAPSHOT => {
            let index = r.u64()?;
            let term = r.u64()?;
            let config = get_config(r)?;
            let offset = r.u64()?;
            let done = r.bool()?;
            let data = get_bytes(r)?;
            MessageBody::InstallSnapshot {
                meta: SnapshotMeta {
                    index,
                    term,
                    config,
                },
                offset,
                data,
                done,
            }
        }
        kind::SNAPSHOT_RESPONSE => MessageBody::SnapshotResponse {
            index: r.u64()?,
            next_offset: r.u64()?,
            done: r.bool()?,
        },
        kind::TIMEOUT_NOW => MessageBody::TimeoutNow,
        _ => return None,
    })
}

fn decode_message(tag: u8, payload: &[u8]) -> Option<Message> {
    let mut r = Reader::new(payload);
    if r.remaining() < MESSAGE_HEADER_LEN {
        return None;
    }
    let from = get_id(&mut r)?;
    let to = get_id(&mut r)?;
    let term = r.u64()?;
    let body = decode_body(tag, &mut r)?;
    let msg = Message {
        from,
        to,
        term,
        body,
    };
    // No honest peer sends a term, index or offset this large, and
    // accepting one would bring `+ 1` within reach of overflow.
    (r.is_empty() && msg.numbers_in_bounds()).then_some(msg)
}

/// Incremental decoder of one connection's incoming frames: it verifies
/// each frame's tag under this direction's key and sequence number before
/// decoding the payload. It holds at most one incomplete frame plus what
/// was pushed since the last drain; a length field out of range is refused
/// as soon as it arrives.
#[derive(Debug)]
pub struct PeerDecoder {
    buf: Vec<u8>,
    start: usize,
    failed: bool,
    mac: FrameMac,
}

impl PeerDecoder {
    /// A decoder with this direction's 32-byte key, sequence 0. Nodes get
    /// theirs from the handshake ([`PeerHandshake::take_session`]).
    pub fn from_key(key: &[u8; 32]) -> Self {
        PeerDecoder {
            buf: Vec::new(),
            start: 0,
            failed: false,
            mac: FrameMac::new(key),
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete, authenticated message, `Ok(None)` if more bytes
    /// are needed. After an error the decoder stays failed (the connection
    /// must be closed).
    // Not an `Iterator`: "need more bytes" is not the end of the stream, and
    // a fatal error must stay distinguishable from both.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Message>, PeerError> {
        if self.failed {
            return Err(PeerError::Malformed);
        }
        match self.decode_front() {
            Ok(Some((msg, used))) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(msg))
            }
            Ok(None) => Ok(None),
            Err(error) => {
                self.failed = true;
                self.buf = Vec::new();
                self.start = 0;
                Err(error)
            }
        }
    }

    fn decode_front(&mut self) -> Result<Option<(Message, usize)>, PeerError> {
        let buf = &self.buf[self.start..];
        let Some(len_bytes) = buf.first_chunk::<FRAME_LEN_BYTES>() else {
            return Ok(None);
        };
        let len_field = u32::from_be_bytes(*len_bytes);
        let len = len_field as usize;
        if !(MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&len) {
            return Err(PeerError::BadLength(len_field));
        }
        // Version and kind are checked as soon as they arrive, so garbage
        // is refused without waiting for a (possibly huge) claimed length.
        if let Some(&version) = buf.get(FRAME_LEN_BYTES)
            && version != FRAME_VERSION
        {
            return Err(PeerError::Version(version));
        }
        if let Some(&tag) = buf.get(FRAME_LEN_BYTES + 1)
            && !(kind::PRE_VOTE..=kind::TIMEOUT_NOW).contains(&tag)
        {
            return Err(PeerError::Kind(tag));
        }
        let frame_len = FRAME_LEN_BYTES + len;
        let Some(frame) = buf.get(..frame_len) else {
            return Ok(None);
        };
        let (sealed, tag) = frame.split_at(frame_len - FRAME_TAG_LEN);
        // Nothing of the payload is looked at before the tag verified.
        let verified = self.mac.tag(sealed).verify_truncated_left(tag).is_ok();
        #[cfg(feature = "planted-bugs")]
        let verified = verified
            || crate::testing::planted::active(
                crate::testing::planted::PlantedBug::SkipPeerFrameMac,
            );
        if !verified {
            return Err(PeerError::BadTag);
        }
        self.mac.seq = self
            .mac
            .seq
            .checked_add(1)
            .ok_or(PeerError::SequenceExhausted)?;
        let kind = frame[FRAME_LEN_BYTES + 1];
        let payload = &sealed[FRAME_LEN_BYTES + 2..];
        let msg = decode_message(kind, payload).ok_or(PeerError::Malformed)?;
        Ok(Some((msg, frame_len)))
    }

    /// Bytes held and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Sequence number of the next frame expected.
    pub fn seq(&self) -> u64 {
        self.mac.seq
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

/// The peer tokens a node accepts. The first one is the node's own (it
/// proves with it when it dials); any of them is accepted from a dialer,
/// and the acceptor answers with the one that matched, so that a token can
/// be rotated one node at a time (see `docs/cluster.md`).
#[derive(Clone)]
pub struct PeerTokens {
    tokens: Vec<Box<[u8]>>,
}

impl core::fmt::Debug for PeerTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print secrets.
        write!(f, "PeerTokens({} configured)", self.tokens.len())
    }
}

/// A peer token configuration that is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerTokenError {
    /// No token given: peers must always authenticate.
    Empty,
    /// A token shorter than [`MIN_TOKEN_LEN`] bytes, at this position.
    TooShort(usize),
}

impl core::fmt::Display for PeerTokenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PeerTokenError::Empty => f.write_str("no peer token configured"),
            PeerTokenError::TooShort(index) => write!(
                f,
                "peer token #{index} is shorter than {MIN_TOKEN_LEN} bytes"
            ),
        }
    }
}

impl std::error::Error for PeerTokenError {}

impl PeerTokens {
    /// The node proves with the first token and accepts any of them.
    pub fn new<I, T>(tokens: I) -> Result<Self, PeerTokenError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let mut accepted = Vec::new();
        for (index, token) in tokens.into_iter().enumerate() {
            let token = token.as_ref();
            if token.len() < MIN_TOKEN_LEN {
                return Err(PeerTokenError::TooShort(index));
            }
            accepted.push(Box::from(token));
        }
        if accepted.is_empty() {
            return Err(PeerTokenError::Empty);
        }
        Ok(PeerTokens { tokens: accepted })
    }

    fn own(&self) -> &[u8] {
        &self.tokens[0]
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRole {
    /// Opened the connection; proves first.
    Dialer,
    /// Accepted the connection; proves only after the dialer's proof
    /// verified.
    Acceptor,
}

impl PeerRole {
    fn byte(self) -> u8 {
        match self {
            PeerRole::Dialer => 0,
            PeerRole::Acceptor => 1,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(PeerRole::Dialer),
            1 => Some(PeerRole::Acceptor),
            _ => None,
        }
    }

    fn label(self) -> &'static [u8; 8] {
        match self {
            PeerRole::Dialer => &DIALER_LABEL,
            PeerRole::Acceptor => &ACCEPTOR_LABEL,
        }
    }
}

/// A peer hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHello {
    /// The cluster identity fingerprint.
    pub fingerprint: [u8; 32],
    /// The sender's end of the connection.
    pub role: PeerRole,
    /// The sender's Raft identity.
    pub from: NodeId,
    /// The sender's token floor: every fencing token it knows of is below
    /// this (below [`TOKEN_FLOOR_LIMIT`]).
    pub token_floor: u64,
    /// The sender's fresh nonce.
    pub nonce: [u8; NONCE_LEN],
}

impl PeerHello {
    /// The 76 hello bytes.
    pub fn encode(&self) -> [u8; PEER_HELLO_LEN] {
        let mut out = [0; PEER_HELLO_LEN];
        out[0..8].copy_from_slice(&PEER_MAGIC);
        out[8..10].copy_from_slice(&PEER_VERSION.to_be_bytes());
        out[10..42].copy_from_slice(&self.fingerprint);
        out[42] = self.role.byte();
        out[43] = self.from.slot;
        out[44..52].copy_from_slice(&self.from.generation.to_be_bytes());
        out[52..60].copy_from_slice(&self.token_floor.to_be_bytes());
        out[60..76].copy_from_slice(&self.nonce);
        out
    }

    /// Parses hello bytes: `None` on a wrong magic, version or role byte.
    pub fn parse(bytes: &[u8; PEER_HELLO_LEN]) -> Option<PeerHello> {
        let mut r = Reader::new(bytes);
        if r.array::<8>()? != PEER_MAGIC || r.u16()? != PEER_VERSION {
            return None;
        }
        Some(PeerHello {
            fingerprint: r.array()?,
            role: PeerRole::from_byte(r.u8()?)?,
            from: get_id(&mut r)?,
            token_floor: r.u64()?,
            nonce: r.array()?,
        })
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn proof_mac(
    token: &[u8],
    prover: PeerRole,
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
) -> HmacSha256 {
    let mut mac = keyed(token);
    mac.update(&PEER_AUTH_DOMAIN);
    mac.update(prover.label());
    mac.update(dialer_hello);
    mac.update(acceptor_hello);
    mac
}

/// The proof the `prover` end sends with `token` over the two hellos as
/// sent (dialer's first).
pub fn peer_proof(
    token: &[u8],
    prover: PeerRole,
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
) -> [u8; PROOF_LEN] {
    proof_mac(token, prover, dialer_hello, acceptor_hello)
        .finalize()
        .into_bytes()
        .into()
}

/// The two session keys of a connection, `(dialer→acceptor,
/// acceptor→dialer)`, from the token both proved with and the whole
/// handshake transcript.
pub fn peer_session_keys(
    token: &[u8],
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
    dialer_proof: &[u8; PROOF_LEN],
    acceptor_proof: &[u8; PROOF_LEN],
) -> ([u8; 32], [u8; 32]) {
    let mut mac = keyed(token);
    mac.update(&PEER_KEYS_DOMAIN);
    mac.update(dialer_hello);
    mac.update(acceptor_hello);
    mac.update(dialer_proof);
    mac.update(acceptor_proof);
    let master: [u8; 32] = mac.finalize().into_bytes().into();
    let derive = |label: &[u8]| -> [u8; 32] {
        let mut mac = keyed(&master);
        mac.update(label);
        mac.finalize().into_bytes().into()
    };
    (derive(b"d2a"), derive(b"a2d"))
}

/// An authenticated connection's frame keys: seal what is sent, open what
/// is received.
#[derive(Debug)]
pub struct PeerSession {
    /// Seals outgoing frames.
    pub sealer: PeerSealer,
    /// Verifies and decodes incoming frames.
    pub decoder: PeerDecoder,
}

/// Why a peer handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerReject {
    /// Not a peer hello (magic, version or role byte).
    BadHello,
    /// The other side claims the same role (two dialers or two acceptors:
    /// a relayed or reflected hello).
    Role,
    /// Another cluster (fingerprint differs).
    Fingerprint,
    /// The other side claims this node's own slot (a loop, or a second
    /// process configured for the same slot).
    SameSlot,
    /// The other side claims a slot outside the cluster.
    SlotOutOfRange(u8),
    /// A dialed peer answered with another slot than the one dialed.
    UnexpectedSlot(u8),
    /// The other side's token floor is at or above [`TOKEN_FLOOR_LIMIT`].
    TokenFloor,
    /// The proof did not verify (with any accepted token, for an acceptor).
    Proof,
    /// The handshake did not finish in time.
    Timeout,
}

/// Outcome of feeding bytes to a [`PeerHandshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerHandshakeStatus {
    /// More bytes are needed (check [`PeerHandshake::take_outbound`]).
    NeedMore,
    /// The other side proved itself: bytes after its proof are frames
    /// (take the keys with [`PeerHandshake::take_session`]).
    Established(NodeId),
    /// Close the connection.
    Rejected(PeerReject),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PeerPhase {
    AwaitHello,
    /// Waiting for the other side's proof; a dialer has sent its own.
    AwaitProof {
        remote: PeerHello,
        remote_bytes: [u8; PEER_HELLO_LEN],
        own_proof: Option<[u8; PROOF_LEN]>,
    },
    Done(PeerHello),
    Failed(PeerReject),
}

/// What a node says about itself in its peer hellos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The cluster identity fingerprint.
    pub fingerprint: [u8; 32],
    /// This node's Raft identity.
    pub id: NodeId,
    /// Slots in the cluster: a remote slot must be below it.
    pub slot_count: u8,
    /// Every token this node knows of is below this (below
    /// [`TOKEN_FLOOR_LIMIT`]).
    pub token_floor: u64,
}

/// One side of the asymmetric peer handshake.
#[derive(Debug)]
pub struct PeerHandshake {
    local: PeerHello,
    local_bytes: [u8; PEER_HELLO_LEN],
    slot_count: u8,
    expected_slot: Option<u8>,
    deadline: Instant,
    phase: PeerPhase,
    /// Bytes of the hello or proof being received; never more than a hello.
    buf: Vec<u8>,
    outbound: Vec<u8>,
    session: Option<PeerSession>,
}

impl PeerHandshake {
    /// Starts a handshake as `local` with a fresh `nonce`. `dialed`: the
    /// slot dialed (this side is the dialer), `None` for an accepted
    /// connection (the acceptor). The hello is queued at once.
    pub fn new(
        local: PeerIdentity,
        nonce: [u8; NONCE_LEN],
        dialed: Option<u8>,
        deadline: Instant,
    ) -> Self {
        let hello = PeerHello {
            fingerprint: local.fingerprint,
            role: if dialed.is_some() {
                PeerRole::Dialer
            } else {
                PeerRole::Acceptor
            },
            from: local.id,
            // An impossible floor is never sent (the other side would
            // refuse it).
            token_floor: local.token_floor.min(TOKEN_FLOOR_LIMIT - 1),
            nonce,
        };
        let local_bytes = hello.encode();
        PeerHandshake {
            local: hello,
            local_bytes,
            slot_count: local.slot_count,
            expected_slot: dialed,
            deadline,
            phase: PeerPhase::AwaitHello,
            buf: Vec::with_capacity(PEER_HELLO_LEN),
            outbound: local_bytes.to_vec(),
            session: None,
        }
    }

    /// This side's role.
    pub fn role(&self) -> PeerRole {
        self.local.role
    }

    /// Bytes to send now (the hello, then this side's proof).
    pub fn take_outbound(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbound)
    }

    /// When an unfinished handshake fails.
    pub fn deadline(&self) -> Option<Instant> {
        matches!(
            self.phase,
            PeerPhase::AwaitHello | PeerPhase::AwaitProof { .. }
        )
        .then_some(self.deadline)
    }

    /// Fails the handshake at or past its deadline; true when it just did.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        if self.deadline().is_some_and(|d| now >= d) {
            self.phase = PeerPhase::Failed(PeerReject::Timeout);
            return true;
        }
        false
    }

    /// The other side, once established.
    pub fn peer(&self) -> Option<NodeId> {
        match self.phase {
            PeerPhase::Done(hello) => Some(hello.from),
            _ => None,
        }
    }

    /// The other side's (authenticated) hello, once established.
    pub fn peer_hello(&self) -> Option<PeerHello> {
        match self.phase {
            PeerPhase::Done(hello) => Some(hello),
            _ => None,
        }
    }

    /// The connection's frame keys, once established (given out once).
    pub fn take_session(&mut self) -> Option<PeerSession> {
        self.session.take()
    }

    /// Feeds received bytes; returns how many were used (the rest are
    /// frames once established).
    pub fn handle_input(
        &mut self,
        tokens: &PeerTokens,
        bytes: &[u8],
    ) -> (usize, PeerHandshakeStatus) {
        let mut used = 0;
        loop {
            match self.phase.clone() {
                PeerPhase::Done(hello) => {
                    return (used, PeerHandshakeStatus::Established(hello.from));
                }
                PeerPhase::Failed(reason) => return (used, PeerHandshakeStatus::Rejected(reason)),
                PeerPhase::AwaitHello => {
                    used += self.fill(&bytes[used..], PEER_HELLO_LEN);
                    let Some(&remote_bytes) = self.buf.first_chunk::<PEER_HELLO_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    self.buf.clear();
                    self.phase = match PeerHello::parse(&remote_bytes) {
                        None => PeerPhase::Failed(PeerReject::BadHello),
                        Some(remote) => self.check_hello(tokens, remote, remote_bytes),
                    };
                }
                PeerPhase::AwaitProof {
                    remote,
                    remote_bytes,
                    own_proof,
                } => {
                    used += self.fill(&bytes[used..], PROOF_LEN);
                    let Some(&proof) = self.buf.first_chunk::<PROOF_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    self.buf = Vec::new();
                    self.phase = match own_proof {
                        Some(own_proof) => {
                            self.dialer_verifies(tokens, remote, &remote_bytes, own_proof, proof)
                        }
                        None => self.acceptor_verifies(tokens, remote, &remote_bytes, proof),
                    };
                }
            }
        }
    }

    fn check_hello(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        remote_bytes: [u8; PEER_HELLO_LEN],
    ) -> PeerPhase {
        let reject = PeerPhase::Failed;
        if remote.role == self.local.role {
            return reject(PeerReject::Role);
        }
        // Compared in the clear only to give a precise reason; the proofs
        // bind the whole hello too.
        if remote.fingerprint != self.local.fingerprint {
            return reject(PeerReject::Fingerprint);
        }
        if remote.from.slot >= self.slot_count {
            return reject(PeerReject::SlotOutOfRange(remote.from.slot));
        }
        if remote.from.slot == self.local.from.slot {
            return reject(PeerReject::SameSlot);
        }
        if let Some(slot) = self.expected_slot
            && slot != remote.from.slot
        {
            return reject(PeerReject::UnexpectedSlot(remote.from.slot));
        }
        if remote.token_floor >= TOKEN_FLOOR_LIMIT {
            return reject(PeerReject::TokenFloor);
        }
        let own_proof = match self.local.role {
            PeerRole::Dialer => {
                let proof = peer_proof(
                    tokens.own(),
                    PeerRole::Dialer,
                    &self.local_bytes,
                    &remote_bytes,
                );
                self.outbound.extend_from_slice(&proof);
                Some(proof)
            }
            // The acceptor says nothing that depends on a token before
            // the dialer proved itself.
            PeerRole::Acceptor => None,
        };
        PeerPhase::AwaitProof {
            remote,
            remote_bytes,
            own_proof,
        }
    }

    /// The dialer checks the acceptor's proof under the token it proved
    /// with (the acceptor answers with the token that matched).
    fn dialer_verifies(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        acceptor_hello: &[u8; PEER_HELLO_LEN],
        own_proof: [u8; PROOF_LEN],
        proof: [u8; PROOF_LEN],
    ) -> PeerPhase {
        let token = tokens.own();
        if proof_mac(token, PeerRole::Acceptor, &self.local_bytes, acceptor_hello)
            .verify_slice(&proof)
            .is_err()
        {
            return PeerPhase::Failed(PeerReject::Proof);
        }
        let (d2a, a2d) =
            peer_session_keys(token, &self.local_bytes, acceptor_hello, &own_proof, &proof);
        self.session = Some(PeerSession {
            sealer: PeerSealer::from_key(&d2a),
            decoder: PeerDecoder::from_key(&a2d),
        });
        PeerPhase::Done(remote)
    }

    /// The acceptor checks the dialer's proof against every accepted
    /// token, then proves with the one that matched.
    fn acceptor_verifies(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        dialer_hello: &[u8; PEER_HELLO_LEN],
        proof: [u8; PROOF_LEN],
    ) -> PeerPhase {
        let mut matched: Option<&[u8]> = None;
        for token in &tokens.tokens {
            // Constant time per token, and every token is tried.
            let ok = proof_mac(token, PeerRole::Dialer, dialer_hello, &self.local_bytes)
                .verify_slice(&proof)
                .is_ok();
            if ok && matched.is_none() {
                matched = Some(token);
            }
        }
        let Some(token) = matched else {
            return PeerPhase::Failed(PeerReject::Proof);
        };
        let own_proof = peer_proof(token, PeerRole::Acceptor, dialer_hello, &self.local_bytes);
        self.outbound.extend_from_slice(&own_proof);
        let (d2a, a2d) =
            peer_session_keys(token, dialer_hello, &self.local_bytes, &proof, &own_proof);
        self.session = Some(PeerSession {
            sealer: PeerSealer::from_key(&a2d),
            decoder: PeerDecoder::from_key(&d2a),
        });
        PeerPhase::Done(remote)
    }

    /// Moves bytes into `buf` until it holds `want`; returns how many.
    fn fill(&mut self, bytes: &[u8], want: usize) -> usize {
        let take = want.saturating_sub(self.buf.len()).min(bytes.len());
        self.buf.extend_from_slice(&bytes[..take]);
        take
    }
}
