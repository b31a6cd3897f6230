//! The cluster world's outsider: it has no peer token, but it reaches every
//! node's peer port and every peer link. It opens connections to nodes and
//! relays hellos between them (claiming to be each to the other: the relay
//! attack on the peer handshake, which must yield no proof to relay), taps honest links to learn identities and capture frames,
//! and writes forged frames into honest streams at frame boundaries (an
//! InstallSnapshot that would set the token counter low, heartbeats with
//! huge terms, frames replayed from other connections). The frame MAC must
//! turn every one of those into a closed connection; with the planted
//! `SkipPeerFrameMac` bug they reach Raft and the checkers fire.

use std::collections::{BTreeMap, VecDeque};

use ticketing_core::cluster::peer::{
    FRAME_LEN_BYTES, FRAME_LEN_MAX, PEER_HELLO_LEN, PeerHello, PeerRole, PeerSealer,
};
use ticketing_core::cluster::{Command, ReplicatedLocks};
use ticketing_core::raft::{Configuration, Message, MessageBody, NodeId, SnapshotMeta};
use ticketing_core::time::Instant;

use crate::rng::Rng;

/// Bytes of the handshake in each direction before the first frame: a
/// hello and a proof.
const HANDSHAKE_BYTES: usize = PEER_HELLO_LEN + 32;
/// Frames kept for replay, and the largest one kept.
const CAPTURED_MAX: usize = 32;
const CAPTURED_FRAME_MAX: usize = 4_096;
/// The token counter a forged snapshot sets (far below any real token).
pub(crate) const FORGED_NEXT_TOKEN: u64 = 1_000;
/// Term of forged messages: far above any real one.
const FORGED_TERM: u64 = 1 << 40;

/// How often the outsider acts, parts per million.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdversaryRates {
    /// Per fault tick: open a pair of connections and relay.
    pub relay_ppm: u32,
    /// Per honest write on a peer link at a frame boundary: inject a
    /// forged or replayed frame before it.
    pub inject_ppm: u32,
}

impl AdversaryRates {
    /// Whether the outsider acts at all.
    pub fn active(&self) -> bool {
        self.relay_ppm > 0 || self.inject_ppm > 0
    }
}

/// Follows one direction of an honest peer link: where frames start, the
/// sender's hello, and complete frames for replay.
#[derive(Debug, Default)]
pub(crate) struct FrameTap {
    /// Bytes seen so far (the handshake part only matters).
    seen: usize,
    hello: Vec<u8>,
    /// Bytes of the current frame's length field seen.
    header: Vec<u8>,
    /// Bytes left in the current frame.
    remaining: usize,
    /// The current frame, while small enough to keep.
    frame: Vec<u8>,
    /// The stream stopped making sense (never for honest nodes).
    lost: bool,
}

impl FrameTap {
    /// Whether the next byte starts a frame.
    pub(crate) fn at_boundary(&self) -> bool {
        !self.lost && self.seen >= HANDSHAKE_BYTES && self.header.is_empty() && self.remaining == 0
    }

    /// The sender's hello, once seen.
    pub(crate) fn hello(&self) -> Option<PeerHello> {
        PeerHello::parse(self.hello.as_slice().try_into().ok()?)
    }

    /// Follows `bytes`; returns the frames they complete (small ones).
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut done = Vec::new();
        while !bytes.is_empty() && !self.lost {
            if self.seen < HANDSHAKE_BYTES {
                let take = (HANDSHAKE_BYTES - self.seen).min(bytes.len());
                let hello_part = PEER_HELLO_LEN.saturating_sub(self.seen).min(take);
                self.hello.extend_from_slice(&bytes[..hello_part]);
                self.seen += take;
                bytes = &bytes[take..];
            } else if self.remaining == 0 {
                let take = (FRAME_LEN_BYTES - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if let Ok(len) = <[u8; FRAME_LEN_BYTES]>::try_from(self.header.as_slice()) {
                    let len = u32::from_be_bytes(len) as usize;
                    if len == 0 || len > FRAME_LEN_MAX {
                        self.lost = true;
                        break;
                    }
                    self.remaining = len;
                    self.frame = std::mem::take(&mut self.header);
                }
            } else {
                let take = self.remaining.min(bytes.len());
                if self.frame.len() + take <= CAPTURED_FRAME_MAX {
                    self.frame.extend_from_slice(&bytes[..take]);
                } else {
                    self.frame = Vec::new();
                }
                self.remaining -= take;
                bytes = &bytes[take..];
                if self.remaining == 0 && !self.frame.is_empty() {
                    done.push(std::mem::take(&mut self.frame));
                }
            }
        }
        done
    }
}

/// One of the outsider's own connections to a node.
#[derive(Debug, Default)]
pub(crate) struct AdversaryConn {
    /// The connection to the other node of the relay.
    pub(crate) partner: Option<u64>,
    /// What the node sent (its hello, and anything after it).
    pub(crate) received: Vec<u8>,
    /// Its forged dialer hello was sent.
    pub(crate) hello_sent: bool,
}

impl AdversaryConn {
    /// The node's hello, once received.
    pub(crate) fn hello(&self) -> Option<PeerHello> {
        PeerHello::parse(self.received.get(..PEER_HELLO_LEN)?.try_into().ok()?)
    }
}

/// The outsider's state.
#[derive(Debug)]
pub(crate) struct Adversary {
    pub(crate) rates: AdversaryRates,
    pub(crate) rng: Rng,
    /// Its own connections by pipe.
    pub(crate) conns: BTreeMap<u64, AdversaryConn>,
    /// Taps on honest peer links by (pipe, direction).
    pub(crate) taps: BTreeMap<(u64, u8), FrameTap>,
    captured: VecDeque<Vec<u8>>,
    /// Forged or replayed frames written, relays attempted.
    pub(crate) injected: u64,
    pub(crate) relays: u64,
}

impl Adversary {
    pub(crate) fn new(rates: AdversaryRates, rng: Rng) -> Self {
        Adversary {
            rates,
            rng,
            conns: BTreeMap::new(),
            taps: BTreeMap::new(),
            captured: VecDeque::new(),
            injected: 0,
            relays: 0,
        }
    }

    /// Keeps a copy of honest frames for replay (bounded).
    pub(crate) fn capture(&mut self, frames: Vec<Vec<u8>>) {
        for frame in frames {
            if self.captured.len() == CAPTURED_MAX {
                self.captured.pop_front();
            }
            self.captured.push_back(frame);
        }
    }

    /// A frame to write from `from` to `to` (identities learnt from
    /// hellos), or `None` if there is nothing to forge with.
    pub(crate) fn forge(
        &mut self,
        from: NodeId,
        to: NodeId,
        voters: Vec<NodeId>,
    ) -> Option<(Vec<u8>, &'static str)> {
        let choice = self.rng.below(4);
        if choice == 3 {
            if self.captured.is_empty() {
                return None;
            }
            let index = self.rng.index(self.captured.len());
            return Some((
                self.captured[index].clone(),
                "a frame replayed from another connection",
            ));
        }
        let (body, what) = match choice {
            0 => (
                forged_snapshot(voters),
                "an InstallSnapshot with a low next_token",
            ),
            1 => (
                MessageBody::Heartbeat { commit: 1 << 32 },
                "a heartbeat with a huge term",
            ),
            _ => (
                MessageBody::Vote {
                    last_index: 1 << 32,
                    last_term: FORGED_TERM,
                    transfer: true,
                },
                "a vote request with a huge term",
            ),
        };
        let msg = Message {
            from,
            to,
            term: FORGED_TERM + self.rng.below(1_000),
            body,
        };
        // Sealed under a key of its own: the outsider has no token to
        // derive the connection's.
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            chunk.copy_from_slice(&self.rng.next_u64().to_le_bytes());
        }
        let mut out = Vec::new();
        PeerSealer::from_key(&key).seal(&msg, &mut out).ok()?;
        Some((out, what))
    }

    /// A forged dialer hello: `as_node`'s identity and nonce, to the other
    /// node of the relay.
    pub(crate) fn relay_hello(as_node: &PeerHello) -> Vec<u8> {
        PeerHello {
            role: PeerRole::Dialer,
            ..*as_node
        }
        .encode()
        .to_vec()
    }

    /// 32 bytes where a dialer's proof belongs.
    pub(crate) fn guessed_proof(&mut self) -> Vec<u8> {
        (0..4)
            .flat_map(|_| self.rng.next_u64().to_le_bytes())
            .collect()
    }
}

/// An InstallSnapshot of an empty lock table whose token counter restarts
/// at [`FORGED_NEXT_TOKEN`], far ahead in index and term.
fn forged_snapshot(voters: Vec<NodeId>) -> MessageBody {
    let mut state = ReplicatedLocks::new();
    let _ = state.apply(
        &Command::Init {
            first_token: FORGED_NEXT_TOKEN,
        },
        Instant::ZERO,
    );
    MessageBody::InstallSnapshot {
        meta: SnapshotMeta {
            index: 1 << 32,
            term: FORGED_TERM,
            config: Configuration {
                voters: voters.into_iter().collect(),
                learners: Default::default(),
            },
        },
        offset: 0,
        data: state.snapshot(Instant::ZERO),
        done: true,
    }
}
