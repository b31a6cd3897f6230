//! The cluster protocol between nodes: handshake, framing and the encoding
//! of every Raft message. Sans-IO like the rest of the core: bytes in, bytes
//! and decisions out.
//!
//! # Handshake (after TCP and optional TLS)
//!
//! Symmetric: each side sends a 67-byte hello as soon as the transport is
//! up, and once it has the other's hello, a 32-byte proof. A side that
//! verified the other's proof starts sending frames; a side that could not
//! closes the connection without a word.
//!
//! | offset | len | field |
//! |---|---|---|
//! | 0 | 8 | magic `TCKPEER1` |
//! | 8 | 2 | peer protocol version (1) |
//! | 10 | 32 | cluster identity fingerprint |
//! | 42 | 1 | sender slot |
//! | 43 | 8 | sender generation |
//! | 51 | 16 | nonce (fresh CSPRNG bytes per connection) |
//!
//! Proof = HMAC-SHA256(key = peer token, `"TCK/PEER/AUTH1"` ‖ version u16 ‖
//! fingerprint ‖ prover slot u8 ‖ prover generation u64 ‖ verifier slot u8 ‖
//! verifier generation u64 ‖ verifier nonce ‖ prover nonce). Binding both
//! identities and ordering the nonces by role means a proof cannot be
//! reflected back to its sender or replayed on another connection.
//!
//! # Frames
//!
//! `[len u32][version u8 = 1][kind u8][payload]`, `len` counting version,
//! kind and payload (so at least 2), at most [`MAX_FRAME_LEN`]. Every frame
//! carries one [`Message`]: `kind` is the body's tag, the payload starts
//! with `from slot u8 · from generation u64 · to slot u8 · to generation u64
//! · term u64`, then the body fields (see `docs/cluster.md`). Anything that
//! does not decode is an error that closes the connection; Raft tolerates
//! the lost messages.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::auth::{MIN_TOKEN_LEN, NONCE_LEN, PROOF_LEN};
use crate::cluster::bytes::Reader;
use crate::raft::{Configuration, Entry, EntryKind, Message, MessageBody, NodeId, SnapshotMeta};
use crate::time::Instant;

type HmacSha256 = Hmac<Sha256>;

/// Hello magic.
pub const PEER_MAGIC: [u8; 8] = *b"TCKPEER1";
/// Domain string that starts the proof transcript.
pub const PEER_AUTH_DOMAIN: [u8; 14] = *b"TCK/PEER/AUTH1";
/// Peer protocol version carried in the hello.
pub const PEER_VERSION: u16 = 1;
/// Peer hello length.
pub const PEER_HELLO_LEN: usize = 67;
/// Version byte of every frame.
pub const FRAME_VERSION: u8 = 1;
/// Length prefix size.
pub const FRAME_LEN_BYTES: usize = 4;
/// Largest value of a frame's length field: 4 MiB, well above the largest
/// append (`max_append_bytes` plus one `max_entry_bytes` entry) and snapshot
/// chunk a node is configured to send (checked by the node at start).
pub const MAX_FRAME_LEN: usize = 4 << 20;
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
    /// The length field is below 2 or above [`MAX_FRAME_LEN`].
    BadLength(u32),
    /// Unknown frame version.
    Version(u8),
    /// Unknown message kind.
    Kind(u8),
    /// The payload does not decode exactly (truncated, trailing bytes, a
    /// field out of range, entries not consecutive).
    Malformed,
    /// A message too large to frame (not sent).
    TooLarge,
}

impl core::fmt::Display for PeerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PeerError::BadLength(len) => write!(f, "peer frame length {len} out of range"),
            PeerError::Version(v) => write!(f, "unknown peer frame version {v}"),
            PeerError::Kind(k) => write!(f, "unknown peer message kind {k}"),
            PeerError::Malformed => f.write_str("malformed peer frame"),
            PeerError::TooLarge => f.write_str("peer message too large to frame"),
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

/// Appends one frame carrying `msg` to `out`. On error nothing is appended.
pub fn encode_message(msg: &Message, out: &mut Vec<u8>) -> Result<(), PeerError> {
    let start = out.len();
    let result = encode_inner(msg, out);
    let len = out.len() - start - FRAME_LEN_BYTES;
    match result {
        Ok(()) if len <= MAX_FRAME_LEN => {
            let len = (len as u32).to_be_bytes();
            out[start..start + FRAME_LEN_BYTES].copy_from_slice(&len);
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

/// One frame carrying `msg`.
pub fn message_to_frame(msg: &Message) -> Result<Vec<u8>, PeerError> {
    let mut out = Vec::new();
    encode_message(msg, &mut out)?;
    Ok(out)
}

fn encode_inner(msg: &Message, out: &mut Vec<u8>) -> Result<(), PeerError> {
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
                if out.len() > MAX_FRAME_LEN + FRAME_LEN_BYTES {
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

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes
/// are needed, else the message and the frame's length in bytes.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Message, usize)>, PeerError> {
    let Some(len_bytes) = buf.first_chunk::<FRAME_LEN_BYTES>() else {
        return Ok(None);
    };
    let len_field = u32::from_be_bytes(*len_bytes);
    let len = len_field as usize;
    if !(2..=MAX_FRAME_LEN).contains(&len) {
        return Err(PeerError::BadLength(len_field));
    }
    // Version and kind are checked as soon as they arrive, so garbage is
    // refused without waiting for a (possibly huge) claimed length.
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
    let Some(frame) = buf.get(FRAME_LEN_BYTES + 2..frame_len) else {
        return Ok(None);
    };
    let tag = buf[FRAME_LEN_BYTES + 1];
    let mut r = Reader::new(frame);
    let decode = |r: &mut Reader<'_>| -> Option<Message> {
        if r.remaining() < MESSAGE_HEADER_LEN {
            return None;
        }
        let from = get_id(r)?;
        let to = get_id(r)?;
        let term = r.u64()?;
        let body = decode_body(tag, r)?;
        let msg = Message {
            from,
            to,
            term,
            body,
        };
        // No honest peer sends a term, index or offset this large, and
        // accepting one would bring `+ 1` within reach of overflow.
        msg.numbers_in_bounds().then_some(msg)
    };
    let msg = decode(&mut r).ok_or(PeerError::Malformed)?;
    if !r.is_empty() {
        return Err(PeerError::Malformed);
    }
    Ok(Some((msg, frame_len)))
}

/// Incremental frame decoder over a byte stream. It holds at most one
/// incomplete frame plus what was pushed since the last drain; a length
/// field over the maximum is refused as soon as it arrives.
#[derive(Debug, Default)]
pub struct PeerDecoder {
    buf: Vec<u8>,
    start: usize,
    failed: bool,
}

impl PeerDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        PeerDecoder::default()
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

    /// The next complete message, `Ok(None)` if more bytes are needed. After
    /// an error the decoder stays failed (the connection must be closed).
    // Not an `Iterator`: "need more bytes" is not the end of the stream, and
    // a fatal error must stay distinguishable from both.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Message>, PeerError> {
        if self.failed {
            return Err(PeerError::Malformed);
        }
        match decode_frame(&self.buf[self.start..]) {
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

    /// Bytes held and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

/// The peer tokens a node accepts. The first one is the node's own (it
/// proves with it); the others are accepted too, so that a token can be
/// rotated one node at a time.
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

/// A peer hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHello {
    /// The cluster identity fingerprint.
    pub fingerprint: [u8; 32],
    /// The sender's Raft identity.
    pub from: NodeId,
    /// The sender's fresh nonce.
    pub nonce: [u8; NONCE_LEN],
}

impl PeerHello {
    /// The 67 hello bytes.
    pub fn encode(&self) -> [u8; PEER_HELLO_LEN] {
        let mut out = [0; PEER_HELLO_LEN];
        out[0..8].copy_from_slice(&PEER_MAGIC);
        out[8..10].copy_from_slice(&PEER_VERSION.to_be_bytes());
        out[10..42].copy_from_slice(&self.fingerprint);
        out[42] = self.from.slot;
        out[43..51].copy_from_slice(&self.from.generation.to_be_bytes());
        out[51..67].copy_from_slice(&self.nonce);
        out
    }

    /// Parses hello bytes: `None` on a wrong magic or version.
    pub fn parse(bytes: &[u8; PEER_HELLO_LEN]) -> Option<PeerHello> {
        let mut r = Reader::new(bytes);
        if r.array::<8>()? != PEER_MAGIC || r.u16()? != PEER_VERSION {
            return None;
        }
        Some(PeerHello {
            fingerprint: r.array()?,
            from: get_id(&mut r)?,
            nonce: r.array()?,
        })
    }
}

fn proof_mac(
    token: &[u8],
    fingerprint: &[u8; 32],
    prover: &PeerHello,
    verifier: &PeerHello,
) -> HmacSha256 {
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(token).expect("HMAC accepts keys of any length");
    mac.update(&PEER_AUTH_DOMAIN);
    mac.update(&PEER_VERSION.to_be_bytes());
    mac.update(fingerprint);
    mac.update(&[prover.from.slot]);
    mac.update(&prover.from.generation.to_be_bytes());
    mac.update(&[verifier.from.slot]);
    mac.update(&verifier.from.generation.to_be_bytes());
    mac.update(&verifier.nonce);
    mac.update(&prover.nonce);
    mac
}

/// The proof `prover` sends to `verifier` with `token`.
pub fn peer_proof(
    token: &[u8],
    fingerprint: &[u8; 32],
    prover: &PeerHello,
    verifier: &PeerHello,
) -> [u8; PROOF_LEN] {
    proof_mac(token, fingerprint, prover, verifier)
        .finalize()
        .into_bytes()
        .into()
}

/// Why a peer handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerReject {
    /// Not a peer hello (magic or version).
    BadHello,
    /// Another cluster (fingerprint differs).
    Fingerprint,
    /// The other side claims this node's own slot (a loop, or a second
    /// process configured for the same slot).
    SameSlot,
    /// A dialed peer answered with another slot than the one dialed.
    UnexpectedSlot(u8),
    /// The proof did not verify with any accepted token.
    Proof,
    /// The handshake did not finish in time.
    Timeout,
}

/// Outcome of feeding bytes to a [`PeerHandshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerHandshakeStatus {
    /// More bytes are needed (check [`PeerHandshake::take_outbound`]).
    NeedMore,
    /// The other side proved itself: bytes after its proof are frames.
    Established(NodeId),
    /// Close the connection.
    Rejected(PeerReject),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PeerPhase {
    AwaitHello,
    AwaitProof(PeerHello),
    Done(NodeId),
    Failed(PeerReject),
}

/// One side of the symmetric peer handshake.
#[derive(Clone, Debug)]
pub struct PeerHandshake {
    local: PeerHello,
    expected_slot: Option<u8>,
    deadline: Instant,
    phase: PeerPhase,
    /// Bytes of the hello or proof being received; never more than a hello.
    buf: Vec<u8>,
    outbound: Vec<u8>,
}

impl PeerHandshake {
    /// Starts a handshake as `local` in the cluster `fingerprint`, with a
    /// fresh `nonce`. `expected_slot`: the slot dialed (outbound), `None`
    /// for an accepted connection. The hello is queued at once.
    pub fn new(
        fingerprint: [u8; 32],
        local: NodeId,
        nonce: [u8; NONCE_LEN],
        expected_slot: Option<u8>,
        deadline: Instant,
    ) -> Self {
        let local = PeerHello {
            fingerprint,
            from: local,
            nonce,
        };
        PeerHandshake {
            local,
            expected_slot,
            deadline,
            phase: PeerPhase::AwaitHello,
            buf: Vec::with_capacity(PEER_HELLO_LEN),
            outbound: local.encode().to_vec(),
        }
    }

    /// Bytes to send now (the hello, then the proof).
    pub fn take_outbound(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbound)
    }

    /// When an unfinished handshake fails.
    pub fn deadline(&self) -> Option<Instant> {
        matches!(self.phase, PeerPhase::AwaitHello | PeerPhase::AwaitProof(_))
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
            PeerPhase::Done(id) => Some(id),
            _ => None,
        }
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
                PeerPhase::Done(id) => return (used, PeerHandshakeStatus::Established(id)),
                PeerPhase::Failed(reason) => return (used, PeerHandshakeStatus::Rejected(reason)),
                PeerPhase::AwaitHello => {
                    used += self.fill(&bytes[used..], PEER_HELLO_LEN);
                    let Some(hello) = self.buf.first_chunk::<PEER_HELLO_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    let hello = PeerHello::parse(hello);
                    self.buf.clear();
                    self.phase = match hello {
                        None => PeerPhase::Failed(PeerReject::BadHello),
                        Some(remote) => self.check_hello(tokens, remote),
                    };
                }
                PeerPhase::AwaitProof(remote) => {
                    used += self.fill(&bytes[used..], PROOF_LEN);
                    let Some(proof) = self.buf.first_chunk::<PROOF_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    let mut matched = false;
                    for token in &tokens.tokens {
                        // Constant-time per token, and every token is tried.
                        matched |= proof_mac(token, &self.local.fingerprint, &remote, &self.local)
                            .verify_slice(proof)
                            .is_ok();
                    }
                    self.buf = Vec::new();
                    self.phase = if matched {
                        PeerPhase::Done(remote.from)
                    } else {
                        PeerPhase::Failed(PeerReject::Proof)
                    };
                }
            }
        }
    }

    fn check_hello(&mut self, tokens: &PeerTokens, remote: PeerHello) -> PeerPhase {
        // Compared in the clear only to give a precise reason; the proof
        // binds the fingerprint too.
        if remote.fingerprint != self.local.fingerprint {
            return PeerPhase::Failed(PeerReject::Fingerprint);
        }
        if remote.from.slot == self.local.from.slot {
            return PeerPhase::Failed(PeerReject::SameSlot);
        }
        if let Some(slot) = self.expected_slot
            && slot != remote.from.slot
        {
            return PeerPhase::Failed(PeerReject::UnexpectedSlot(remote.from.slot));
        }
        let proof = peer_proof(tokens.own(), &self.local.fingerprint, &self.local, &remote);
        self.outbound.extend_from_slice(&proof);
        PeerPhase::AwaitProof(remote)
    }

    /// Moves bytes into `buf` until it holds `want`; returns how many.
    fn fill(&mut self, bytes: &[u8], want: usize) -> usize {
        let take = want.saturating_sub(self.buf.len()).min(bytes.len());
        self.buf.extend_from_slice(&bytes[..take]);
        take
    }
}
