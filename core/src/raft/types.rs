//! Plain data types of the Raft module: identities, configurations, log
//! entries and messages. No behaviour lives here; the `peer` codec encodes
//! these for the wire.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

pub use crate::machine::NodeId;

/// Every term, log index, commit index, hint and snapshot offset a peer
/// sends must be below this bound (2^62); a message carrying one at or above
/// it is refused, by the peer decoder and again by [`super::Raft::step`].
///
/// Honest nodes never get near it: one election per millisecond would take
/// 146 million years to reach it, and an index as large would need as many
/// log entries. Refusing such values leaves a margin of 3 · 2^62 below
/// `u64::MAX`, so `term + 1`, `index + 1` and `offset + len` can never
/// overflow on anything accepted, and a node never campaigns in a term its
/// peers would refuse (see [`super::Raft`]'s handling of an exhausted term).
pub const RAFT_NUMBER_MAX: u64 = 1 << 62;

/// A cluster configuration: who votes and who only receives the log.
///
/// A node is never both a voter and a learner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Configuration {
    /// Members whose acknowledgements count towards commit and who vote.
    pub voters: BTreeSet<NodeId>,
    /// Members that receive the log but neither vote nor count.
    pub learners: BTreeSet<NodeId>,
}

impl Configuration {
    /// A configuration of the given voters and no learners.
    pub fn with_voters(voters: impl IntoIterator<Item = NodeId>) -> Self {
        Configuration {
            voters: voters.into_iter().collect(),
            learners: BTreeSet::new(),
        }
    }

    /// Whether `id` is a voter.
    pub fn is_voter(&self, id: NodeId) -> bool {
        self.voters.contains(&id)
    }

    /// Whether `id` is a learner.
    pub fn is_learner(&self, id: NodeId) -> bool {
        self.learners.contains(&id)
    }

    /// Whether `id` is a voter or a learner.
    pub fn contains(&self, id: NodeId) -> bool {
        self.is_voter(id) || self.is_learner(id)
    }

    /// Voters and learners, voters first.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.voters.iter().chain(self.learners.iter()).copied()
    }

    /// The number of voters that forms a majority (0 for no voters).
    pub fn quorum(&self) -> usize {
        if self.voters.is_empty() {
            0
        } else {
            self.voters.len() / 2 + 1
        }
    }

    /// The voter currently holding `slot`, if any.
    pub fn voter_in_slot(&self, slot: u8) -> Option<NodeId> {
        self.voters.iter().copied().find(|v| v.slot == slot)
    }
}

/// A membership change proposed to the leader. Changes are single-server
/// steps, one at a time; see the module documentation for why replacement
/// is two of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfChange {
    /// Add a node that receives the log but does not vote.
    AddLearner(NodeId),
    /// Turn a learner into a voter.
    PromoteLearner(NodeId),
    /// Remove a voter or a learner.
    RemoveNode(NodeId),
    /// Start replacing voter `old` by learner `new`: proposes the removal of
    /// `old` now; `new` is promoted by the leader once the removal is
    /// committed and `new` is caught up (with
    /// [`RaftConfig::auto_membership`](super::RaftConfig::auto_membership)),
    /// or by a later [`ConfChange::PromoteLearner`].
    ReplaceVoter {
        /// The voter to remove.
        old: NodeId,
        /// The caught-up learner that takes its place.
        new: NodeId,
    },
}

/// What a log entry carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// The entry a leader appends at the start of its term. It lets the
    /// leader commit older entries (which it may only do through an entry of
    /// its own term) without waiting for a client command. Apply: nothing.
    Noop,
    /// An application command, opaque to Raft (the server encodes
    /// Grant/Release/Expire into these bytes).
    /// Shared, so that the append to each follower takes the entry
    /// without copying its bytes.
    Command(Arc<[u8]>),
    /// The complete new configuration. It takes effect on every node as soon
    /// as it is appended to that node's log (not when committed), and is
    /// undone if the entry is truncated away.
    Config(Configuration),
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Position in the log, from 1.
    pub index: u64,
    /// Term of the leader that created it.
    pub term: u64,
    /// Payload.
    pub kind: EntryKind,
}

impl Entry {
    /// Approximate size in bytes, used for batching limits.
    pub fn size_bytes(&self) -> usize {
        let payload = match &self.kind {
            EntryKind::Noop => 0,
            EntryKind::Command(bytes) => bytes.len(),
            EntryKind::Config(config) => 9 * (config.voters.len() + config.learners.len()),
        };
        17 + payload
    }
}

/// Describes a snapshot: the state after applying every entry up to `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnapshotMeta {
    /// The last entry the snapshot covers.
    pub index: u64,
    /// Term of that entry.
    pub term: u64,
    /// The configuration in effect at `index`.
    pub config: Configuration,
}

/// A message between two Raft nodes.
///
/// `to` carries the full identity: a transport routes by slot, and the
/// receiver drops a message meant for another generation of its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Sender.
    pub from: NodeId,
    /// Recipient.
    pub to: NodeId,
    /// The sender's term — except in [`MessageBody::PreVote`] (the term the
    /// sender would campaign in) and a granted
    /// [`MessageBody::PreVoteResponse`] (echoes that term).
    pub term: u64,
    /// What the message says.
    pub body: MessageBody,
}

impl Message {
    /// Whether every number the message carries (term, indexes, commits,
    /// hints, snapshot offsets, entry indexes and terms) is below
    /// [`RAFT_NUMBER_MAX`]. Node generations are identities, not counters,
    /// and are not bounded.
    pub fn numbers_in_bounds(&self) -> bool {
        let ok = |n: u64| n < RAFT_NUMBER_MAX;
        ok(self.term)
            && match &self.body {
                MessageBody::PreVote {
                    last_index,
                    last_term,
                }
                | MessageBody::Vote {
                    last_index,
                    last_term,
                    ..
                } => ok(*last_index) && ok(*last_term),
                MessageBody::PreVoteResponse { .. }
                | MessageBody::VoteResponse { .. }
                | MessageBody::HeartbeatResponse
                | MessageBody::TimeoutNow => true,
                MessageBody::Append {
                    prev_index,
                    prev_term,
                    entries,
                    commit,
                } => {
                    ok(*prev_index)
                        && ok(*prev_term)
                        && ok(*commit)
                        && entries.iter().all(|e| ok(e.index) && ok(e.term))
                }
                MessageBody::AppendResponse {
                    index,
                    hint_index,
                    hint_term,
                    ..
                } => ok(*index) && ok(*hint_index) && ok(*hint_term),
                MessageBody::Heartbeat { commit } => ok(*commit),
                MessageBody::InstallSnapshot {
                    meta, offset, data, ..
                } => {
                    ok(meta.index)
                        && ok(meta.term)
                        && ok(*offset)
                        && ok(offset.saturating_add(data.len() as u64))
                }
                MessageBody::SnapshotResponse {
                    index, next_offset, ..
                } => ok(*index) && ok(*next_offset),
            }
    }
}

/// The kinds of Raft message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageBody {
    /// "Would you vote for me in `term`?" — asked before campaigning, without
    /// changing anyone's term.
    PreVote {
        /// Index of the sender's last entry.
        last_index: u64,
        /// Term of the sender's last entry.
        last_term: u64,
    },
    /// Answer to [`MessageBody::PreVote`].
    PreVoteResponse {
        /// True when not granted.
        reject: bool,
    },
    /// A vote request of a candidate.
    Vote {
        /// Index of the candidate's last entry.
        last_index: u64,
        /// Term of the candidate's last entry.
        last_term: u64,
        /// Sent because the leader handed over leadership
        /// ([`MessageBody::TimeoutNow`]); overrides the leader-lease rule.
        transfer: bool,
    },
    /// Answer to [`MessageBody::Vote`].
    VoteResponse {
        /// True when not granted.
        reject: bool,
    },
    /// Log replication (possibly with no entries, to carry the commit index).
    Append {
        /// Index of the entry just before `entries`.
        prev_index: u64,
        /// Term of that entry.
        prev_term: u64,
        /// Consecutive entries from `prev_index + 1`.
        entries: Vec<Entry>,
        /// The leader's commit index.
        commit: u64,
    },
    /// Answer to [`MessageBody::Append`].
    AppendResponse {
        /// True when `prev_index`/`prev_term` did not match.
        reject: bool,
        /// Accepted: the last index now known to match the leader.
        /// Rejected: the `prev_index` that was rejected.
        index: u64,
        /// Rejected: the largest index that may match (the leader resumes
        /// there instead of walking back one entry per round trip).
        hint_index: u64,
        /// Rejected: the follower's term at `hint_index`.
        hint_term: u64,
    },
    /// Leader liveness and commit propagation.
    Heartbeat {
        /// `min(leader commit, what the leader knows the follower holds)`.
        commit: u64,
    },
    /// Answer to [`MessageBody::Heartbeat`]; also sent to a stale leader so
    /// that it learns about the newer term.
    HeartbeatResponse,
    /// One chunk of a snapshot for a follower too far behind.
    InstallSnapshot {
        /// What the snapshot covers.
        meta: SnapshotMeta,
        /// Byte offset of `data` within the snapshot.
        offset: u64,
        /// The chunk.
        data: Vec<u8>,
        /// Whether this is the last chunk.
        done: bool,
    },
    /// Answer to [`MessageBody::InstallSnapshot`].
    SnapshotResponse {
        /// The snapshot's index.
        index: u64,
        /// The offset the follower expects next.
        next_offset: u64,
        /// The follower now holds everything up to `index`.
        done: bool,
    },
    /// Leadership transfer: "campaign now, skipping pre-vote and lease".
    TimeoutNow,
}

// --------------------------------------------------------------------------
// Compact text forms (for logs and test transcripts), after etcd-io/raft's
// `DescribeMessage`.
// --------------------------------------------------------------------------

/// `slot.generation`, e.g. `3.2`.
impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.slot, self.generation)
    }
}

/// `v[1.1 2.1] l[3.2]`: voters, then learners.
impl fmt::Display for Configuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, ids: &BTreeSet<NodeId>| {
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    f.write_str(" ")?;
                }
                write!(f, "{id}")?;
            }
            Ok(())
        };
        f.write_str("v[")?;
        list(f, &self.voters)?;
        f.write_str("] l[")?;
        list(f, &self.learners)?;
        f.write_str("]")
    }
}

/// `index/term`, then the kind unless it is a command: `6/3`,
/// `6/3 noop`, `6/3 conf v[1.1 2.1] l[3.2]`. Command payloads are the
/// application's business and are left out.
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.term)?;
        match &self.kind {
            EntryKind::Command(_) => Ok(()),
            EntryKind::Noop => f.write_str(" noop"),
            EntryKind::Config(config) => write!(f, " conf {config}"),
        }
    }
}

/// `from->to Kind tTERM details`, one line. `a/b` is always an index and
/// its term, `cN` a commit index, `@N` a snapshot byte offset:
///
/// | body | form |
/// |---|---|
/// | `PreVote`, `Vote` | `1.1->2.1 Vote t3 5/2` (the sender's last entry; `transfer` when sent on the leader's behalf) |
/// | `PreVoteResponse`, `VoteResponse` | `2.1->1.1 VoteResp t3 ok` (or `reject`) |
/// | `Append` | `1.1->2.1 Append t3 5/2 c5 [6/3, 7/3 noop]` (the entry before, the commit index, the entries) |
/// | `AppendResponse` | `2.1->1.1 AppendResp t3 ok 7`, `2.1->1.1 AppendResp t3 reject 7 hint 5/2` |
/// | `Heartbeat` | `1.1->2.1 Heartbeat t3 c5` |
/// | `HeartbeatResponse` | `2.1->1.1 HeartbeatResp t3` |
/// | `InstallSnapshot` | `1.1->2.1 Snapshot t3 10/2 @0 1024B done` (`done` on the last chunk) |
/// | `SnapshotResponse` | `2.1->1.1 SnapshotResp t3 10 @1024`, `2.1->1.1 SnapshotResp t3 10 done` |
/// | `TimeoutNow` | `1.1->2.1 TimeoutNow t3` |
impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{} ", self.from, self.to)?;
        let t = self.term;
        let ok = |reject: bool| if reject { "reject" } else { "ok" };
        match &self.body {
            MessageBody::PreVote {
                last_index,
                last_term,
            } => write!(f, "PreVote t{t} {last_index}/{last_term}"),
            MessageBody::PreVoteResponse { reject } => {
                write!(f, "PreVoteResp t{t} {}", ok(*reject))
            }
            MessageBody::Vote {
                last_index,
                last_term,
                transfer,
            } => {
                write!(f, "Vote t{t} {last_index}/{last_term}")?;
                if *transfer {
                    f.write_str(" transfer")?;
                }
                Ok(())
            }
            MessageBody::VoteResponse { reject } => write!(f, "VoteResp t{t} {}", ok(*reject)),
            MessageBody::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => {
                write!(f, "Append t{t} {prev_index}/{prev_term} c{commit} [")?;
                for (i, entry) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{entry}")?;
                }
                f.write_str("]")
            }
            MessageBody::AppendResponse {
                reject: false,
                index,
                ..
            } => write!(f, "AppendResp t{t} ok {index}"),
            MessageBody::AppendResponse {
                reject: true,
                index,
                hint_index,
                hint_term,
            } => write!(
                f,
                "AppendResp t{t} reject {index} hint {hint_index}/{hint_term}"
            ),
            MessageBody::Heartbeat { commit } => write!(f, "Heartbeat t{t} c{commit}"),
            MessageBody::HeartbeatResponse => write!(f, "HeartbeatResp t{t}"),
            MessageBody::InstallSnapshot {
                meta,
                offset,
                data,
                done,
            } => {
                let (index, term, len) = (meta.index, meta.term, data.len());
                write!(f, "Snapshot t{t} {index}/{term} @{offset} {len}B")?;
                if *done {
                    f.write_str(" done")?;
                }
                Ok(())
            }
            MessageBody::SnapshotResponse {
                index,
                next_offset,
                done,
            } => {
                if *done {
                    write!(f, "SnapshotResp t{t} {index} done")
                } else {
                    write!(f, "SnapshotResp t{t} {index} @{next_offset}")
                }
            }
            MessageBody::TimeoutNow => write!(f, "TimeoutNow t{t}"),
        }
    }
}
