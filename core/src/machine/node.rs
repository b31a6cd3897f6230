//! Who a cluster node is and what it tells its driver about itself: the
//! identity every Raft message and node event names, and the events a
//! driver logs. They live with the driver contract because the contract's
//! outputs carry them; `raft` and `cluster` re-export them.

/// The Raft identity of a node: a stable slot (its place in the client's
/// address list) and a generation that is new every time a process starts
/// with empty state for that slot.
///
/// State is volatile, so a restarted process has forgotten its votes and its
/// log. Were it to come back under its old identity it could vote twice in a
/// term or acknowledge entries it no longer holds, and two leaders or a lost
/// commit would follow. A fresh generation makes it a different node, which
/// joins as a learner and replaces its old self by a membership change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    /// Position in the cluster's address list (0..n-1).
    pub slot: u8,
    /// Incarnation of the process behind the slot; larger is newer.
    pub generation: u64,
}

impl NodeId {
    /// Shorthand constructor.
    pub const fn new(slot: u8, generation: u64) -> Self {
        NodeId { slot, generation }
    }
}

/// A change in the node the driver should log or act on
/// ([`Output::Node`](crate::machine::Output::Node)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// The leader this node knows changed (`None`: no leader known). When
    /// `leader` is this node's own id, this node leads.
    LeaderChanged {
        /// The new leader.
        leader: Option<NodeId>,
        /// The Raft term when it changed.
        term: u64,
    },
    /// This node became a voter (`true`) or stopped being one (learner or
    /// removed).
    VoterChanged {
        /// Whether this node votes now.
        is_voter: bool,
    },
    /// A bootstrap member found the cluster already running and rejoined as
    /// this new generation of its slot.
    GenerationChanged {
        /// The generation it runs under now.
        generation: u64,
    },
    /// Peer frames were refused by the decoder (each closed its
    /// connection). Coalesced until drained: `refused` counts all so far.
    PeerFramesRefused {
        /// The slot of the latest refused frame.
        slot: u8,
        /// Why the latest one was refused.
        error: PeerError,
        /// Peer frames refused since the node started.
        refused: u64,
    },
    /// Raft dropped peer messages carrying an out-of-bounds term or index.
    /// Coalesced until drained: `refused` counts all so far.
    RaftMessagesRefused {
        /// Messages Raft refused since the node started.
        refused: u64,
    },
    /// A recovering leader has not started the token counter: it knows the
    /// token floors of `heard` slots (itself included) and needs `needed`
    /// (see [`crate::cluster::recovery`]). Queued when `heard` changes
    /// while it waits.
    RecoveryEvidence {
        /// Slots whose floors it knows.
        heard: u8,
        /// Slots whose floors it needs.
        needed: u8,
    },
}

/// Why a frame was refused. Every case closes the peer connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// The length field is below [`crate::cluster::peer::FRAME_LEN_MIN`] or above
    /// [`crate::cluster::peer::FRAME_LEN_MAX`].
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
