//! What a Raft node reports: its role, its events, committed entries, and
//! why a proposal, a transfer or a compaction was refused.

use super::types::{Configuration, Entry, NodeId, SnapshotMeta};

/// The role a node plays in its current term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Follows a leader (or waits for one).
    Follower,
    /// Asking for pre-votes; the term is unchanged.
    PreCandidate,
    /// Campaigning in its own term.
    Candidate,
    /// Leads the current term.
    Leader,
}

/// Something the embedding server should react to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// This node became leader. Proposals are accepted from now on.
    BecameLeader {
        /// The term it leads.
        term: u64,
    },
    /// This node stopped being leader. Every proposal not yet seen in
    /// [`Raft::poll_committed`](super::Raft::poll_committed) has an unknown outcome (answer `I`).
    SteppedDown {
        /// The term it led.
        term: u64,
    },
    /// The known leader changed (`None`: no leader known). Send `L` frames.
    LeaderChanged {
        /// The new leader.
        leader: Option<NodeId>,
        /// The current term.
        term: u64,
    },
    /// The configuration in effect changed (a configuration entry was
    /// appended or truncated, or a snapshot installed).
    ConfigChanged {
        /// The new configuration.
        config: Configuration,
    },
    /// The log has grown [`Raft::snapshot_threshold_entries`](super::Raft::snapshot_threshold_entries) past the last
    /// snapshot: call [`Raft::compact`](super::Raft::compact) with the state machine's snapshot.
    SnapshotWanted {
        /// The index everything polled so far reaches.
        applied_index: u64,
    },
}

/// Something to apply, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Committed {
    /// A committed entry. Apply commands; skip no-ops; configuration entries
    /// are informational (Raft already acted on them).
    Entry(Entry),
    /// Replace the state machine by this snapshot (a follower caught up by
    /// the leader's snapshot). Entries after `meta.index` follow.
    Snapshot {
        /// What it covers.
        meta: SnapshotMeta,
        /// The application's snapshot bytes.
        data: Vec<u8>,
    },
}

/// Why a proposal was refused. Nothing was appended in every case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This node is not the leader (answer `M` with the hint, or `E 4`).
    NotLeader {
        /// The leader this node knows of, if any.
        leader_hint: Option<NodeId>,
    },
    /// Leadership is being handed over; retry at the new leader.
    TransferInProgress,
    /// Too many uncommitted entries (answer `B`).
    Backpressure,
    /// The payload exceeds `entry_bytes_max`.
    TooLarge,
    /// A configuration change is still uncommitted.
    ConfChangePending,
    /// The leader has not yet committed an entry of its own term.
    NotCommittedInTerm,
    /// The change does not fit the current configuration.
    InvalidConfChange(&'static str),
}

/// Why a leadership transfer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferError {
    /// Only a leader can transfer.
    NotLeader,
    /// The target is not a voter, or is this node.
    BadTarget,
    /// No other voter exists.
    NoCandidate,
}

/// Why [`Raft::compact`](super::Raft::compact) did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactError {
    /// Nothing applied since the last snapshot.
    NothingToCompact,
}
