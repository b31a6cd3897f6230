//! Frames: sealing outgoing messages ([`PeerSealer`]), verifying and
//! decoding incoming ones ([`PeerDecoder`]), and the byte encoding of every
//! Raft message they carry.

use std::sync::Arc;

use hmac::{KeyInit, Mac};

use super::{
    CONFIG_MEMBERS_MAX, ENTRY_COMMAND, ENTRY_CONFIG, ENTRY_LEN_MIN, ENTRY_NOOP, FRAME_LEN_BYTES,
    FRAME_LEN_MAX, FRAME_LEN_MIN, FRAME_TAG_LEN, FRAME_VERSION, HmacSha256, MESSAGE_HEADER_LEN,
    PeerError, kind,
};
use crate::cluster::bytes::Reader;
use crate::raft::{Configuration, Entry, EntryKind, Message, MessageBody, NodeId, SnapshotMeta};

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
        if set.len() > CONFIG_MEMBERS_MAX {
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
    /// theirs from the handshake ([`PeerHandshake::take_session`](super::PeerHandshake::take_session)).
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
            Ok(()) if len <= FRAME_LEN_MAX => {
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
    out.push(body_kind(&msg.body));
    put_id(out, msg.from);
    put_id(out, msg.to);
    put_u64(out, msg.term);
    put_body(out, &msg.body, start)
}

/// The frame kind that carries `body`.
fn body_kind(body: &MessageBody) -> u8 {
    match body {
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
    }
}

/// Appends the fields of `body`; `start` is where the frame began in `out`
/// (an `Append` stops early once it cannot fit a frame).
fn put_body(out: &mut Vec<u8>, body: &MessageBody, start: usize) -> Result<(), PeerError> {
    match body {
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
                if out.len() - start > FRAME_LEN_MAX + FRAME_LEN_BYTES {
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
            if data.len() > FRAME_LEN_MAX {
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

pub(super) fn get_id(r: &mut Reader<'_>) -> Option<NodeId> {
    Some(NodeId::new(r.u8()?, r.u64()?))
}

fn get_bytes(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let len = usize::try_from(r.u32()?).ok()?;
    // `bytes` checks the length against what is there before copying, so a
    // hostile length never allocates.
    Some(r.bytes(len)?.to_vec())
}

fn get_shared_bytes(r: &mut Reader<'_>) -> Option<Arc<[u8]>> {
    let len = usize::try_from(r.u32()?).ok()?;
    // As `get_bytes`: the length is checked against what is there first.
    Some(Arc::from(r.bytes(len)?))
}

fn get_config(r: &mut Reader<'_>) -> Option<Configuration> {
    let mut config = Configuration::default();
    for learners in [false, true] {
        let count = usize::from(r.u8()?);
        if count > CONFIG_MEMBERS_MAX {
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
        ENTRY_COMMAND => EntryKind::Command(get_shared_bytes(r)?),
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
            if count > r.remaining() / ENTRY_LEN_MIN {
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
    /// theirs from the handshake ([`PeerHandshake::take_session`](super::PeerHandshake::take_session)).
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
        if !(FRAME_LEN_MIN..=FRAME_LEN_MAX).contains(&len) {
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
