//! Raft consensus, hand-written and sans-IO.
//!
//! One [`Raft`] per node. It never reads a clock, never touches a socket and
//! never draws from a global RNG: time enters as `now`, randomness (election
//! jitter) from a seed given at construction.
//!
//! # Driving it
//!
//! - inputs: [`Raft::step`] (a message from a peer), [`Raft::handle_timeout`]
//!   (a deadline from [`Raft::poll_timeout`] was reached — calling it early
//!   or twice is harmless), [`Raft::propose`], [`Raft::propose_conf_change`],
//!   [`Raft::transfer_leadership`], [`Raft::compact`].
//! - outputs, drained after every input until `None`:
//!   [`Raft::poll_message`] (to send), [`Raft::poll_committed`] (entries to
//!   apply, in order; a [`Committed::Snapshot`] replaces the state machine),
//!   [`Raft::poll_event`] (leadership and configuration changes, snapshot
//!   requests), then [`Raft::poll_timeout`].
//!
//! Appends are built lazily in `poll_message`, so every proposal made
//! between two drains travels in one batch.
//!
//! # Wiring into the server (cluster mode)
//!
//! - Accept a client request only on the leader: `propose(now, bytes)`
//!   returns `(index, term)`; remember the request under that pair.
//!   `NotLeader { leader_hint }` → `M` with the hint's slot (or `E 4`
//!   without one); `TransferInProgress` → `M`/`E 4` too; `Backpressure` → `B`.
//! - Apply everything [`Raft::poll_committed`] yields, on every node, in
//!   order. An entry whose `(index, term)` matches a remembered request
//!   answers it with the apply result; a different term at a remembered
//!   index means that request never takes effect (answer `M`/`E 4`).
//! - [`Event::SteppedDown`]: every remembered request not yet answered is
//!   indeterminate (`I`). [`Event::LeaderChanged`]: send `L` frames.
//! - [`Event::SnapshotWanted`]: serialize the lock table (including the
//!   token counter) and call [`Raft::compact`]. A [`Committed::Snapshot`]
//!   replaces the lock table on a follower.
//! - A peer handshake showing a newer generation of a slot → on the leader,
//!   `propose_conf_change(now, ConfChange::AddLearner(id))`; Raft does the
//!   rest. [`Raft::is_voter`] false → answer `E 3`.
//! - Graceful shutdown of the leader: [`Raft::transfer_leadership`]`(now,
//!   None)`, keep running until [`Event::SteppedDown`] (or a timeout).
//!
//! # Payload
//!
//! Commands are opaque `Vec<u8>` ([`EntryKind::Command`]): the server encodes
//! Grant/Release/Expire itself, and Raft stays non-generic, so the peer codec
//! encodes one concrete message type.
//!
//! # Timing and the failover arithmetic
//!
//! A follower starts an election when it has heard nothing from a leader for
//! its randomized election timeout `r`, drawn afresh each time from
//! `[election_timeout_min_ms, election_timeout_min_ms + election_timeout_jitter_ms)`.
//! When the leader dies at `t0`, the followers last heard its heartbeat at
//! `t0 - φ` with `φ` in `[0, heartbeat_interval_ms)`; the first follower to
//! time out does so at `t0 - φ + r`, then needs one pre-vote and one vote
//! round trip (`2·RTT`). So
//!
//! ```text
//! failover = r - φ + 2·RTT
//! ```
//!
//! Defaults: heartbeat 100 ms, `r` in [2400, 2500) ms, so failover lies in
//! (2300, 2500) ms + 2·RTT — the 2.3–2.5 s the original service documents.
//! The jitter window (100 ms) is far above a LAN round trip, so two
//! followers rarely campaign within one RTT of each other, and a split vote
//! costs one more randomized timeout. [`RaftConfig::fast`]: heartbeat 50 ms,
//! `r` in [300, 600) ms (the classic `[T, 2T)`), failover under 650 ms.
//!
//! Deviation from "`[T, 2T)`": a window that wide (2400 ms of spread) cannot
//! give a 200 ms failover band, so the defaults use a narrow jitter instead;
//! the fast profile keeps `[T, 2T)`.
//!
//! # Elections: pre-vote, check-quorum, leader lease
//!
//! - A timed-out voter first asks for pre-votes in `term + 1` without
//!   changing its term; only with a majority of grants does it campaign. A
//!   node cut off from the majority therefore never inflates its term and
//!   cannot depose a healthy leader when it returns.
//! - A voter that heard from a leader less than `election_timeout_min_ms`
//!   ago ignores (pre-)vote requests entirely (lease), except votes sent on
//!   the leader's behalf by a leadership transfer.
//! - A leader that has not heard from a majority of voters within
//!   `election_timeout_min_ms` steps down (check-quorum), so the other side
//!   of a partition can elect a new leader once its lease has run out.
//!
//! # Commit
//!
//! A new leader appends a [`EntryKind::Noop`] in its term. An entry is
//! committed when a majority of voters hold it *and* it is of the leader's
//! current term; older entries commit only as a consequence (Raft §5.4.2,
//! Figure 8).
//!
//! # Membership
//!
//! Single-server changes, one at a time, effective on append. A leader
//! proposes a change only when (a) the previous configuration entry is
//! committed and (b) it has committed an entry of its own term — the fix
//! for the single-server-change bug found after the Raft dissertation: a new
//! leader may otherwise hold an uncommitted configuration entry of an older
//! term whose majorities do not intersect with its own next change.
//!
//! Replacing voter (slot, old generation) by learner (slot, new generation)
//! is two single-server steps: **remove the old voter, then promote the
//! learner**. Each step changes the voter set by one member, so any majority
//! of the old set intersects any majority of the new one, which is what makes
//! single-server changes safe. Removing first is never less available than
//! adding first: with 3 voters {A, B, C} and C dead, the intermediate {A, B}
//! needs A and B, while the add-first intermediate {A, B, C, C'} needs A, B
//! and C'; with 5 voters, remove-first needs 3 of the 4 survivors, add-first
//! 4 of 5. The learner is caught up before the removal (so the promotion
//! follows immediately) and the voter count is back to odd after two commits.
//! With [`RaftConfig::auto_membership`] the leader drives this itself: a
//! caught-up learner whose slot is held by an older-generation voter causes
//! that voter's removal; a caught-up learner in a slot without a voter is
//! promoted while the voter count is even, or while a second caught-up
//! learner waits for another empty slot (two replacements at once: 3 → 4 →
//! 5), so automatic changes never leave an even voter set behind; a learner
//! superseded by a newer generation of its slot
//! is removed. Because these rules read only the configuration and progress,
//! a new leader finishes a replacement that its predecessor started.
//! Adding the new generation as a learner is the server's call
//! ([`ConfChange::AddLearner`]) when the peer handshake shows it.
//!
//! # Bounds
//!
//! Outgoing messages (`max_outbox_messages`, beyond which new messages are
//! dropped — Raft tolerates loss), uncommitted entries on the leader
//! (`max_uncommitted_entries` × `max_entry_bytes`), appends per message
//! (`max_append_entries`, `max_append_bytes`), appends in flight per follower
//! (`max_inflight_appends`), snapshot chunk and total size, events. The log
//! stays bounded as long as the application answers
//! [`Event::SnapshotWanted`] with [`Raft::compact`].
//!
//! Numbers from peers are bounded too: a message carrying a term, index,
//! commit, hint or offset at or above [`MAX_RAFT_NUMBER`] is dropped and
//! counted ([`Raft::refused_messages`]), and so is an acknowledgement of an
//! index the leader does not have. Every `+ 1` on a term or index therefore
//! has a margin of 3 · 2^62; a node whose term has reached the bound stops
//! campaigning rather than send what its peers refuse.

mod log;
mod progress;
mod types;

use std::collections::{BTreeMap, VecDeque};

use self::log::RaftLog;
use self::progress::{Progress, ProgressState};
pub use self::types::{
    ConfChange, Configuration, Entry, EntryKind, MAX_RAFT_NUMBER, Message, MessageBody, NodeId,
    SnapshotMeta,
};
use crate::metrics::RaftCounters;
use crate::time::{Duration, Instant};

/// Timing and limits of one Raft node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftConfig {
    /// How often a leader sends heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Lower bound of the randomized election timeout; also the leader-lease
    /// and check-quorum window.
    pub election_timeout_min_ms: u64,
    /// Width of the randomization window above the minimum.
    pub election_timeout_jitter_ms: u64,
    /// Most entries in one append.
    pub max_append_entries: usize,
    /// Most entry bytes in one append (at least one entry is always sent).
    pub max_append_bytes: usize,
    /// Most appends in flight to one follower while pipelining.
    pub max_inflight_appends: usize,
    /// Most entries a leader holds beyond its commit index; `propose` fails
    /// with [`ProposeError::Backpressure`] past it.
    pub max_uncommitted_entries: u64,
    /// Largest command payload accepted by `propose`.
    pub max_entry_bytes: usize,
    /// Most messages waiting in the outbox; newer ones are dropped beyond.
    pub max_outbox_messages: usize,
    /// Snapshot chunk size.
    pub snapshot_chunk_bytes: usize,
    /// Largest snapshot a follower accepts.
    pub max_snapshot_bytes: usize,
    /// Applied entries beyond the last snapshot after which
    /// [`Event::SnapshotWanted`] is emitted (0 = never).
    pub snapshot_threshold_entries: u64,
    /// A learner within this many entries of the leader's last index counts
    /// as caught up for promotion.
    pub catch_up_lag_entries: u64,
    /// Let the leader drive node replacement by itself (see the module
    /// documentation).
    pub auto_membership: bool,
}

impl Default for RaftConfig {
    /// Production defaults: leader failover in about 2.3–2.5 s.
    fn default() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 2_400,
            election_timeout_jitter_ms: 100,
            max_append_entries: 256,
            max_append_bytes: 256 * 1024,
            max_inflight_appends: 64,
            max_uncommitted_entries: 16_384,
            max_entry_bytes: 8 * 1024,
            max_outbox_messages: 4_096,
            snapshot_chunk_bytes: 256 * 1024,
            max_snapshot_bytes: 1 << 30,
            snapshot_threshold_entries: 10_000,
            catch_up_lag_entries: 64,
            auto_membership: true,
        }
    }
}

impl RaftConfig {
    /// The fast profile: heartbeat 50 ms, election timeout in [300, 600) ms,
    /// failover well under a second. For LANs and tests.
    pub fn fast() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_jitter_ms: 300,
            ..RaftConfig::default()
        }
    }

    /// Checks the relations the algorithm relies on.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.heartbeat_interval_ms == 0 {
            return Err("heartbeat_interval_ms must be positive");
        }
        if self.election_timeout_min_ms < 3 * self.heartbeat_interval_ms {
            return Err("election_timeout_min_ms must be at least 3 heartbeats");
        }
        if self.election_timeout_jitter_ms == 0 {
            return Err("election_timeout_jitter_ms must be positive");
        }
        if self.max_append_entries == 0
            || self.max_inflight_appends == 0
            || self.max_uncommitted_entries == 0
            || self.max_outbox_messages == 0
            || self.snapshot_chunk_bytes == 0
        {
            return Err("limits must be positive");
        }
        Ok(())
    }

    fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    fn election_timeout_min(&self) -> Duration {
        Duration::from_millis(self.election_timeout_min_ms)
    }
}

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
    /// [`Raft::poll_committed`] has an unknown outcome (answer `I`).
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
    /// The log has grown `snapshot_threshold_entries` past the last snapshot:
    /// call [`Raft::compact`] with the state machine's snapshot.
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
    /// The payload exceeds `max_entry_bytes`.
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

/// Why [`Raft::compact`] did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactError {
    /// Nothing applied since the last snapshot.
    NothingToCompact,
}

/// A small deterministic PRNG (SplitMix64) for election jitter.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }
}

#[derive(Clone, Debug)]
struct Snapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// Most events held; the oldest are dropped beyond (callers drain after
/// every input, so this only guards against a caller that never does).
const MAX_EVENTS: usize = 1_024;

/// One Raft node.
#[derive(Debug)]
pub struct Raft {
    id: NodeId,
    cfg: RaftConfig,
    rng: SplitMix64,

    term: u64,
    vote: Option<NodeId>,
    role: Role,
    leader: Option<NodeId>,

    log: RaftLog,
    /// The configuration in effect: that of the last configuration entry in
    /// the log, else that of the snapshot base.
    config: Configuration,
    /// Index of the entry that set `config` (the snapshot index if none).
    config_index: u64,
    /// Configuration at the snapshot base of the log.
    base_config: Configuration,
    /// The latest snapshot (taken here or installed from a leader), served
    /// to followers behind the log's start.
    snapshot: Option<Snapshot>,
    /// Installed snapshot not yet handed to the application.
    snapshot_to_apply: Option<Snapshot>,
    /// Chunks of a snapshot being received.
    incoming_snapshot: Option<Snapshot>,
    snapshot_wanted_sent: bool,

    /// Leader: per member other than self.
    progress: BTreeMap<NodeId, Progress>,
    /// (Pre-)candidate: answers received.
    votes: BTreeMap<NodeId, bool>,

    election_deadline: Instant,
    heartbeat_deadline: Instant,
    quorum_check_deadline: Instant,
    /// When we last heard from the leader of our term (lease rule).
    leader_contact: Option<Instant>,
    /// Leader: transfer target and the instant the attempt is abandoned.
    transfer: Option<(NodeId, Instant)>,
    /// Appends to (re)build in `poll_message`.
    flush_pending: bool,

    outbox: VecDeque<Message>,
    events: VecDeque<Event>,
    dropped_messages: u64,
    /// Peer messages dropped because a number was out of bounds.
    refused_messages: u64,
    /// The latest `now` seen on any input.
    now: Instant,
    /// Counts for operators.
    counters: RaftCounters,
    /// The last leader this node knew (for counting leader changes).
    last_known_leader: Option<NodeId>,
}

impl Raft {
    /// A member of a freshly bootstrapped cluster. Every bootstrap member
    /// must be given the same `voters` (including itself): the log starts
    /// with the identical committed entry `{index 1, term 1, Config(voters)}`
    /// on all of them, which is what later joiners replicate.
    pub fn bootstrap(
        id: NodeId,
        voters: impl IntoIterator<Item = NodeId>,
        cfg: RaftConfig,
        seed: u64,
        now: Instant,
    ) -> Self {
        let config = Configuration::with_voters(voters);
        assert!(config.is_voter(id), "bootstrap member must be a voter");
        let mut raft = Raft::join(id, cfg, seed, now);
        raft.term = 1;
        raft.log.push(Entry {
            index: 1,
            term: 1,
            kind: EntryKind::Config(config.clone()),
        });
        raft.log.commit_to(1);
        raft.config = config;
        raft.config_index = 1;
        raft
    }

    /// A node with an empty log and no configuration: a new generation that
    /// waits to be added as a learner by the leader. It never campaigns
    /// until a configuration makes it a voter.
    pub fn join(id: NodeId, cfg: RaftConfig, seed: u64, now: Instant) -> Self {
        assert!(
            cfg.validate().is_ok(),
            "invalid RaftConfig: {:?}",
            cfg.validate()
        );
        let mut raft = Raft {
            id,
            cfg,
            rng: SplitMix64(seed ^ (u64::from(id.slot) << 56) ^ id.generation),
            term: 0,
            vote: None,
            role: Role::Follower,
            leader: None,
            log: RaftLog::default(),
            config: Configuration::default(),
            config_index: 0,
            base_config: Configuration::default(),
            snapshot: None,
            snapshot_to_apply: None,
            incoming_snapshot: None,
            snapshot_wanted_sent: false,
            progress: BTreeMap::new(),
            votes: BTreeMap::new(),
            election_deadline: now,
            heartbeat_deadline: now,
            quorum_check_deadline: now,
            leader_contact: None,
            transfer: None,
            flush_pending: false,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            dropped_messages: 0,
            refused_messages: 0,
            now,
            counters: RaftCounters::default(),
            last_known_leader: None,
        };
        raft.reset_election_deadline(now);
        raft
    }

    // ----------------------------------------------------------------------
    // Queries
    // ----------------------------------------------------------------------

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    /// The leader this node knows of in its term.
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }

    /// Who this node voted for in its term.
    pub fn vote(&self) -> Option<NodeId> {
        self.vote
    }

    /// The configuration in effect.
    pub fn config(&self) -> &Configuration {
        &self.config
    }

    /// Whether this node is a voter in the configuration in effect.
    pub fn is_voter(&self) -> bool {
        self.config.is_voter(self.id)
    }

    /// The commit index.
    pub fn commit_index(&self) -> u64 {
        self.log.committed
    }

    /// The index up to which entries have been handed out by
    /// [`Raft::poll_committed`].
    pub fn applied_index(&self) -> u64 {
        self.log.applied
    }

    /// The first index still in the log (entries before are in the snapshot).
    pub fn first_index(&self) -> u64 {
        self.log.first_index()
    }

    /// The index of the last entry.
    pub fn last_index(&self) -> u64 {
        self.log.last_index()
    }

    /// The term of the entry at `index`, if known.
    pub fn term_at(&self, index: u64) -> Option<u64> {
        self.log.term(index)
    }

    /// The entry at `index`, if still in the log.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        self.log.entry(index)
    }

    /// Metadata of the latest snapshot held, if any.
    pub fn snapshot_meta(&self) -> Option<&SnapshotMeta> {
        self.snapshot.as_ref().map(|s| &s.meta)
    }

    /// Whether the configuration in effect is not yet committed (a
    /// membership change is under way).
    pub fn conf_change_pending(&self) -> bool {
        self.config_index > self.log.committed
    }

    /// The follower the leader is handing leadership to, if any.
    pub fn transfer_target(&self) -> Option<NodeId> {
        self.transfer.map(|(target, _)| target)
    }

    /// Messages dropped because the outbox was full.
    pub fn dropped_messages(&self) -> u64 {
        self.dropped_messages
    }

    /// Peer messages dropped because they carried a number no honest peer
    /// sends: a term, index, commit, hint or offset at or above
    /// [`MAX_RAFT_NUMBER`], or an acknowledgement beyond the leader's log.
    pub fn refused_messages(&self) -> u64 {
        self.refused_messages
    }

    /// Counts for operators: leader changes, snapshots sent and received.
    pub fn counters(&self) -> RaftCounters {
        self.counters
    }

    /// Leader: the highest index `peer` is known to hold.
    pub fn match_index(&self, peer: NodeId) -> Option<u64> {
        if peer == self.id {
            return Some(self.log.last_index());
        }
        self.progress.get(&peer).map(|p| p.match_index)
    }

    // ----------------------------------------------------------------------
    // Outputs
    // ----------------------------------------------------------------------

    /// The next message to send, with its recipient.
    pub fn poll_message(&mut self) -> Option<(NodeId, Message)> {
        if self.flush_pending {
            self.flush_pending = false;
            if self.role == Role::Leader {
                let peers: Vec<NodeId> = self.progress.keys().copied().collect();
                for peer in peers {
                    while self.send_append(peer, false) {}
                }
            }
        }
        self.outbox.pop_front().map(|m| (m.to, m))
    }

    /// The next thing to apply, in log order.
    pub fn poll_committed(&mut self) -> Option<Committed> {
        if let Some(snapshot) = self.snapshot_to_apply.take() {
            return Some(Committed::Snapshot {
                meta: snapshot.meta,
                data: snapshot.data,
            });
        }
        if self.log.applied >= self.log.committed {
            return None;
        }
        let index = self.log.applied + 1;
        let entry = self
            .log
            .entry(index)
            .expect("committed entry in log")
            .clone();
        self.log.applied = index;
        let since_snapshot = index - self.log.snapshot_index();
        if self.cfg.snapshot_threshold_entries > 0
            && since_snapshot >= self.cfg.snapshot_threshold_entries
            && !self.snapshot_wanted_sent
        {
            self.snapshot_wanted_sent = true;
            self.push_event(Event::SnapshotWanted {
                applied_index: index,
            });
        }
        Some(Committed::Entry(entry))
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest instant at which [`Raft::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.role {
            Role::Leader => {
                let mut t = self.heartbeat_deadline.min(self.quorum_check_deadline);
                if let Some((_, deadline)) = self.transfer {
                    t = t.min(deadline);
                }
                Some(t)
            }
            _ if self.is_voter() => Some(self.election_deadline),
            _ => None,
        }
    }

    // ----------------------------------------------------------------------
    // Inputs
    // ----------------------------------------------------------------------

    /// Handles the deadlines that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        if self.role == Role::Leader {
            if now >= self.quorum_check_deadline {
                self.quorum_check_deadline = now.saturating_add(self.cfg.election_timeout_min());
                if !self.quorum_active(now) {
                    // Check-quorum: we cannot reach a majority, so we may
                    // be on the minority side of a partition while the
                    // majority elects someone else. Stepping down stops us
                    // from telling clients we lead; no term change, so we
                    // rejoin quietly as a follower.
                    self.become_follower(now, self.term, None);
                    return;
                }
            }
            if let Some((_, deadline)) = self.transfer
                && now >= deadline
            {
                // The target did not take over within an election timeout:
                // give up and accept proposals again.
                self.transfer = None;
            }
            if now >= self.heartbeat_deadline {
                self.heartbeat_deadline = now.saturating_add(self.cfg.heartbeat_interval());
                self.broadcast_heartbeat();
                self.maybe_auto_membership(now);
            }
            return;
        }
        if now >= self.election_deadline {
            if self.is_voter() && self.term.saturating_add(1) < MAX_RAFT_NUMBER {
                self.campaign(now, true, false);
            } else {
                self.reset_election_deadline(now);
            }
        }
    }

    /// Proposes an application command. On success returns `(index, term)`:
    /// the command took effect if and only if [`Raft::poll_committed`] later
    /// yields an entry with exactly this index and term. A different term at
    /// that index means it was overwritten and never takes effect.
    pub fn propose(&mut self, now: Instant, payload: Vec<u8>) -> Result<(u64, u64), ProposeError> {
        self.now = self.now.max(now);
        self.check_can_propose()?;
        if payload.len() > self.cfg.max_entry_bytes {
            return Err(ProposeError::TooLarge);
        }
        Ok(self.append_as_leader(EntryKind::Command(payload)))
    }

    /// Proposes a membership change (one at a time; see the module
    /// documentation). Returns the `(index, term)` of the configuration entry.
    pub fn propose_conf_change(
        &mut self,
        now: Instant,
        change: ConfChange,
    ) -> Result<(u64, u64), ProposeError> {
        self.now = self.now.max(now);
        self.check_can_propose()?;
        if self.config_index > self.log.committed {
            return Err(ProposeError::ConfChangePending);
        }
        if self.log.term(self.log.committed) != Some(self.term) {
            return Err(ProposeError::NotCommittedInTerm);
        }
        let mut next = self.config.clone();
        match change {
            ConfChange::AddLearner(id) => {
                if next.contains(id) {
                    return Err(ProposeError::InvalidConfChange("already a member"));
                }
                next.learners.insert(id);
            }
            ConfChange::PromoteLearner(id) => {
                if !next.learners.remove(&id) {
                    return Err(ProposeError::InvalidConfChange("not a learner"));
                }
                next.voters.insert(id);
            }
            ConfChange::RemoveNode(id) => {
                if !next.voters.remove(&id) && !next.learners.remove(&id) {
                    return Err(ProposeError::InvalidConfChange("not a member"));
                }
                if next.voters.is_empty() {
                    return Err(ProposeError::InvalidConfChange(
                        "would remove the last voter",
                    ));
                }
            }
            ConfChange::ReplaceVoter { old, new } => {
                if !next.is_voter(old) {
                    return Err(ProposeError::InvalidConfChange("old is not a voter"));
                }
                if !next.is_learner(new) {
                    return Err(ProposeError::InvalidConfChange("new is not a learner"));
                }
                if !self.caught_up(new) {
                    return Err(ProposeError::InvalidConfChange("new is not caught up"));
                }
                if next.voters.len() < 2 {
                    return Err(ProposeError::InvalidConfChange(
                        "would remove the last voter",
                    ));
                }
                next.voters.remove(&old);
            }
        }
        Ok(self.append_as_leader(EntryKind::Config(next)))
    }

    /// Hands leadership to `target` (or to the most up-to-date other voter),
    /// for graceful shutdown: the target is brought up to date, then told to
    /// campaign at once. Proposals are refused meanwhile; the attempt is
    /// abandoned after an election timeout.
    pub fn transfer_leadership(
        &mut self,
        now: Instant,
        target: Option<NodeId>,
    ) -> Result<NodeId, TransferError> {
        self.now = self.now.max(now);
        if self.role != Role::Leader {
            return Err(TransferError::NotLeader);
        }
        let target = match target {
            Some(t) => {
                if t == self.id || !self.config.is_voter(t) {
                    return Err(TransferError::BadTarget);
                }
                t
            }
            None => self
                .config
                .voters
                .iter()
                .filter(|&&v| v != self.id)
                .max_by_key(|v| self.progress.get(v).map_or(0, |p| p.match_index))
                .copied()
                .ok_or(TransferError::NoCandidate)?,
        };
        self.transfer = Some((target, now.saturating_add(self.cfg.election_timeout_min())));
        if self.progress.get(&target).map(|p| p.match_index) == Some(self.log.last_index()) {
            self.send(target, MessageBody::TimeoutNow);
        } else {
            self.send_append(target, true);
        }
        Ok(target)
    }

    /// Takes a snapshot: `data` must be the state machine after applying
    /// everything [`Raft::poll_committed`] has returned. Compacts the log up
    /// to [`Raft::applied_index`]. Returns that index.
    pub fn compact(&mut self, data: Vec<u8>) -> Result<u64, CompactError> {
        let index = self.log.applied;
        if index <= self.log.snapshot_index() {
            return Err(CompactError::NothingToCompact);
        }
        let term = self.log.term(index).expect("applied entry in log");
        let config = self.config_at(index);
        self.log.compact_to(index);
        self.base_config = config.clone();
        self.snapshot = Some(Snapshot {
            meta: SnapshotMeta {
                index,
                term,
                config,
            },
            data,
        });
        self.snapshot_wanted_sent = false;
        Ok(index)
    }

    /// Handles a message from a peer.
    pub fn step(&mut self, now: Instant, msg: Message) {
        self.now = self.now.max(now);
        if msg.to != self.id || msg.from == self.id {
            // Meant for another generation of our slot (or looped back).
            return;
        }
        if !msg.numbers_in_bounds() {
            // The peer decoder refuses these already; this guards callers
            // that step messages directly. Accepting a term near u64::MAX
            // would make the next `term + 1` overflow (or wrap to 0 and
            // leave the cluster campaigning at a stale term forever).
            self.refused_messages += 1;
            return;
        }
        let from = msg.from;
        if msg.term > self.term {
            let lease_applies = matches!(
                msg.body,
                MessageBody::PreVote { .. }
                    | MessageBody::Vote {
                        transfer: false,
                        ..
                    }
            );
            if lease_applies && self.in_lease(now) {
                // Leader lease: we heard from a live leader less than the
                // minimum election timeout ago, so whoever asks is most
                // likely a node that was cut off and came back (or a removed
                // node). Ignoring it — not even bumping our term — keeps it
                // from deposing a healthy leader. A real failure still
                // elects someone: once the leader is silent for the minimum
                // timeout, the lease is over.
                return;
            }
            match msg.body {
                // Pre-vote never changes anyone's term.
                MessageBody::PreVote { .. } => {}
                // A granted pre-vote echoes the term we would campaign in.
                MessageBody::PreVoteResponse { reject: false } => {}
                MessageBody::Append { .. }
                | MessageBody::Heartbeat { .. }
                | MessageBody::InstallSnapshot { .. } => {
                    self.become_follower(now, msg.term, Some(from));
                }
                _ => self.become_follower(now, msg.term, None),
            }
        } else if msg.term < self.term {
            match msg.body {
                MessageBody::Append { .. }
                | MessageBody::Heartbeat { .. }
                | MessageBody::InstallSnapshot { .. } => {
                    // A stale leader (it was partitioned). Tell it our term
                    // so that it steps down; with check-quorum and pre-vote
                    // it could otherwise keep sending forever, since nobody
                    // else would ever contact it with a higher term.
                    self.send(from, MessageBody::HeartbeatResponse);
                }
                MessageBody::PreVote { .. } => {
                    // Tell a pre-candidate that is behind about our term, so
                    // that it catches up instead of retrying forever.
                    self.send(from, MessageBody::PreVoteResponse { reject: true });
                }
                _ => {}
            }
            return;
        }

        match msg.body {
            MessageBody::PreVote {
                last_index,
                last_term,
            } => {
                // The candidate asks about term msg.term (our term + 1 if it
                // is level with us). Grant only for a later term, and only
                // to a log at least as up to date as ours (§5.4.1).
                let grant = msg.term > self.term && self.log.is_up_to_date(last_index, last_term);
                let term = if grant { msg.term } else { self.term };
                self.send_with_term(from, term, MessageBody::PreVoteResponse { reject: !grant });
            }
            MessageBody::Vote {
                last_index,
                last_term,
                ..
            } => {
                // One vote per term: we may repeat a vote, or cast one when
                // we have neither voted nor learned of a leader this term.
                let can_vote =
                    self.vote == Some(from) || (self.vote.is_none() && self.leader.is_none());
                let grant = can_vote && self.log.is_up_to_date(last_index, last_term);
                if grant {
                    self.vote = Some(from);
                    // Granting resets our timer, so we do not immediately
                    // compete with the candidate we just voted for.
                    self.reset_election_deadline(now);
                }
                self.send(from, MessageBody::VoteResponse { reject: !grant });
            }
            MessageBody::PreVoteResponse { reject } => {
                let current = (!reject && msg.term == self.term.saturating_add(1))
                    || (reject && msg.term == self.term);
                if self.role == Role::PreCandidate && current {
                    self.votes.insert(from, !reject);
                    self.tally(now, true);
                }
            }
            MessageBody::VoteResponse { reject } => {
                if self.role == Role::Candidate {
                    self.votes.insert(from, !reject);
                    self.tally(now, false);
                }
            }
            MessageBody::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => {
                if !self.accept_leader(now, from) {
                    return;
                }
                self.handle_append(from, prev_index, prev_term, entries, commit);
            }
            MessageBody::Heartbeat { commit } => {
                if !self.accept_leader(now, from) {
                    return;
                }
                // The leader sends min(its commit, our match), so everything
                // up to `commit` is known to be in our log as in its.
                self.advance_commit_follower(commit.min(self.log.last_index()));
                self.send(from, MessageBody::HeartbeatResponse);
            }
            MessageBody::InstallSnapshot {
                meta,
                offset,
                data,
                done,
            } => {
                if !self.accept_leader(now, from) {
                    return;
                }
                self.handle_snapshot_chunk(from, meta, offset, data, done);
            }
            MessageBody::AppendResponse {
                reject,
                index,
                hint_index,
                hint_term,
            } => self.handle_append_response(now, from, reject, index, hint_index, hint_term),
            MessageBody::HeartbeatResponse => self.handle_heartbeat_response(now, from),
            MessageBody::SnapshotResponse {
                index,
                next_offset,
                done,
            } => self.handle_snapshot_response(now, from, index, next_offset, done),
            MessageBody::TimeoutNow => {
                if self.is_voter()
                    && self.role != Role::Leader
                    && self.term.saturating_add(1) < MAX_RAFT_NUMBER
                {
                    // The leader hands over: campaign at once, skipping
                    // pre-vote, and flag the votes so that voters set the
                    // lease rule aside (they did hear from a live leader —
                    // the very one that asked for this).
                    self.campaign(now, false, true);
                }
            }
        }
    }

    // ----------------------------------------------------------------------
    // Roles
    // ----------------------------------------------------------------------

    fn become_follower(&mut self, now: Instant, term: u64, leader: Option<NodeId>) {
        if self.role == Role::Leader {
            self.push_event(Event::SteppedDown { term: self.term });
        }
        if term != self.term {
            debug_assert!(term > self.term);
            self.term = term;
            self.vote = None;
        }
        self.role = Role::Follower;
        self.set_leader(leader);
        self.leader_contact = leader.map(|_| now);
        self.votes.clear();
        self.progress.clear();
        self.transfer = None;
        self.flush_pending = false;
        self.reset_election_deadline(now);
    }

    /// A message from the leader of our term. Returns false if it must be
    /// ignored.
    fn accept_leader(&mut self, now: Instant, from: NodeId) -> bool {
        if self.role == Role::Leader {
            // Two leaders in one term would violate election safety; a
            // correct peer never sends this. Ignore rather than panic on
            // what the network hands us.
            debug_assert!(
                false,
                "{:?}: second leader {from:?} in term {}",
                self.id, self.term
            );
            return false;
        }
        if self.role != Role::Follower || self.leader != Some(from) {
            // A (pre-)candidate learns that the term already has a leader.
            self.become_follower(now, self.term, Some(from));
        }
        self.leader_contact = Some(now);
        self.reset_election_deadline(now);
        true
    }

    fn campaign(&mut self, now: Instant, pre_vote: bool, transfer: bool) {
        self.votes.clear();
        self.votes.insert(self.id, true);
        self.set_leader(None);
        self.leader_contact = None;
        self.reset_election_deadline(now);
        // Callers check that `term + 1` stays below MAX_RAFT_NUMBER.
        let (term, body) = if pre_vote {
            self.role = Role::PreCandidate;
            (
                self.term.saturating_add(1),
                MessageBody::PreVote {
                    last_index: self.log.last_index(),
                    last_term: self.log.last_term(),
                },
            )
        } else {
            self.role = Role::Candidate;
            self.term = self.term.saturating_add(1);
            self.vote = Some(self.id);
            (
                self.term,
                MessageBody::Vote {
                    last_index: self.log.last_index(),
                    last_term: self.log.last_term(),
                    transfer,
                },
            )
        };
        let voters: Vec<NodeId> = self
            .config
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.id)
            .collect();
        for voter in voters {
            self.send_with_term(voter, term, body.clone());
        }
        self.tally(now, pre_vote);
    }

    fn tally(&mut self, now: Instant, pre_vote: bool) {
        let quorum = self.config.quorum();
        let granted = self
            .votes
            .iter()
            .filter(|(id, granted)| **granted && self.config.is_voter(**id))
            .count();
        let rejected = self
            .votes
            .iter()
            .filter(|(id, granted)| !**granted && self.config.is_voter(**id))
            .count();
        if granted >= quorum {
            if pre_vote {
                self.campaign(now, false, false);
            } else {
                self.become_leader(now);
            }
        } else if rejected > 0 && rejected + quorum > self.config.voters.len() {
            // A majority said no: this election cannot be won. Go back to
            // following (same term) and wait for a leader or a new timeout.
            self.become_follower(now, self.term, None);
        }
    }

    fn become_leader(&mut self, now: Instant) {
        self.role = Role::Leader;
        self.votes.clear();
        self.set_leader(Some(self.id));
        self.push_event(Event::BecameLeader { term: self.term });
        self.leader_contact = Some(now);
        self.transfer = None;
        self.sync_progress(true);
        self.heartbeat_deadline = now.saturating_add(self.cfg.heartbeat_interval());
        self.quorum_check_deadline = now.saturating_add(self.cfg.election_timeout_min());
        // The no-op of this term: committing it commits everything before
        // it, and until then the leader commits nothing from older terms by
        // counting (Figure 8).
        self.append_as_leader(EntryKind::Noop);
        // Probe everyone now (with the no-op) rather than at the next flush.
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for peer in peers {
            self.send_append(peer, true);
        }
    }

    /// Makes `progress` hold exactly the members other than us. Members that
    /// stay keep their progress; new ones (all of them when a term starts)
    /// probe from our end and count as heard from now, so that a quorum
    /// check only judges them after they had a chance to answer.
    fn sync_progress(&mut self, fresh_term: bool) {
        if fresh_term {
            self.progress.clear();
        }
        let now = self.now;
        let next = self.log.last_index() + 1;
        let members: Vec<NodeId> = self.config.members().filter(|&m| m != self.id).collect();
        self.progress.retain(|id, _| members.contains(id));
        for member in members {
            self.progress
                .entry(member)
                .or_insert_with(|| Progress::new(next, now));
        }
        if let Some((target, _)) = self.transfer
            && !self.config.is_voter(target)
        {
            // The transfer target was removed.
            self.transfer = None;
        }
    }

    fn set_leader(&mut self, leader: Option<NodeId>) {
        if self.leader != leader {
            self.leader = leader;
            if leader.is_some() && leader != self.last_known_leader {
                self.last_known_leader = leader;
                self.counters.leader_changes += 1;
            }
            self.push_event(Event::LeaderChanged {
                leader,
                term: self.term,
            });
        }
    }

    fn in_lease(&self, now: Instant) -> bool {
        if self.role == Role::Leader {
            return true;
        }
        match (self.leader, self.leader_contact) {
            (Some(_), Some(contact)) => {
                now < contact.saturating_add(self.cfg.election_timeout_min())
            }
            _ => false,
        }
    }

    fn quorum_active(&self, now: Instant) -> bool {
        let window = self.cfg.election_timeout_min();
        let active = self
            .config
            .voters
            .iter()
            .filter(|&&v| {
                v == self.id
                    || self
                        .progress
                        .get(&v)
                        .is_some_and(|p| p.last_heard.saturating_add(window) > now)
            })
            .count();
        active >= self.config.quorum()
    }

    fn reset_election_deadline(&mut self, now: Instant) {
        let jitter_ms = self.rng.below(self.cfg.election_timeout_jitter_ms);
        let timeout = Duration::from_millis(self.cfg.election_timeout_min_ms + jitter_ms);
        self.election_deadline = now.saturating_add(timeout);
    }

    // ----------------------------------------------------------------------
    // Leader: appending and replication
    // ----------------------------------------------------------------------

    fn check_can_propose(&self) -> Result<(), ProposeError> {
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader {
                leader_hint: self.leader,
            });
        }
        if self.transfer.is_some() {
            return Err(ProposeError::TransferInProgress);
        }
        if self.log.last_index() - self.log.committed >= self.cfg.max_uncommitted_entries {
            return Err(ProposeError::Backpressure);
        }
        Ok(())
    }

    fn append_as_leader(&mut self, kind: EntryKind) -> (u64, u64) {
        let index = self.log.last_index() + 1;
        let is_config = matches!(kind, EntryKind::Config(_));
        if let EntryKind::Config(config) = &kind {
            self.set_config(config.clone(), index);
        }
        self.log.push(Entry {
            index,
            term: self.term,
            kind,
        });
        if is_config {
            self.sync_progress(false);
        }
        self.flush_pending = true;
        self.maybe_commit();
        (index, self.term)
    }

    /// Sends one append (or snapshot chunk) to `to` if its flow allows.
    /// Returns whether an append carrying entries was sent (callers loop to
    /// fill the pipeline). `allow_empty` sends even with no new entries (to
    /// probe or to carry the commit index).
    fn send_append(&mut self, to: NodeId, allow_empty: bool) -> bool {
        let max_inflight = self.cfg.max_inflight_appends;
        let Some(pr) = self.progress.get(&to) else {
            return false;
        };
        if pr.is_paused(max_inflight) {
            return false;
        }
        let next = pr.next_index;
        let prev_index = next - 1;
        let Some(prev_term) = self.log.term(prev_index) else {
            // The entries the follower needs were compacted away.
            self.start_snapshot(to);
            return false;
        };
        let entries = self
            .log
            .slice(next, self.cfg.max_append_entries, self.cfg.max_append_bytes);
        if entries.is_empty() && !allow_empty {
            return false;
        }
        let pr = self.progress.get_mut(&to).expect("progress");
        let sent_entries = !entries.is_empty();
        match pr.state {
            ProgressState::Replicate => {
                if let Some(last) = entries.last() {
                    // Pipelining: assume success and move on; a rejection
                    // sends us back to probing from `match_index`.
                    pr.next_index = last.index + 1;
                    pr.inflight.push_back(last.index);
                }
            }
            ProgressState::Probe => pr.probe_sent = true,
            ProgressState::Snapshot { .. } => unreachable!("paused"),
        }
        let commit = self.log.committed;
        self.send(
            to,
            MessageBody::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            },
        );
        sent_entries && matches!(self.progress[&to].state, ProgressState::Replicate)
    }

    fn start_snapshot(&mut self, to: NodeId) {
        let Some(snapshot) = &self.snapshot else {
            // Cannot happen: entries are only compacted by taking a snapshot.
            debug_assert!(false, "compacted log without snapshot");
            return;
        };
        let index = snapshot.meta.index;
        let pr = self.progress.get_mut(&to).expect("progress");
        pr.state = ProgressState::Snapshot { index, offset: 0 };
        pr.inflight.clear();
        self.counters.snapshots_sent += 1;
        self.send_snapshot_chunk(to);
    }

    fn send_snapshot_chunk(&mut self, to: NodeId) {
        let (Some(snapshot), Some(pr)) = (&self.snapshot, self.progress.get(&to)) else {
            return;
        };
        let ProgressState::Snapshot { index, offset } = pr.state else {
            return;
        };
        if index != snapshot.meta.index {
            // We compacted further meanwhile: send the newer snapshot.
            let new_index = snapshot.meta.index;
            self.progress.get_mut(&to).expect("progress").state = ProgressState::Snapshot {
                index: new_index,
                offset: 0,
            };
            return self.send_snapshot_chunk(to);
        }
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(snapshot.data.len());
        let end = start
            .saturating_add(self.cfg.snapshot_chunk_bytes)
            .min(snapshot.data.len());
        let body = MessageBody::InstallSnapshot {
            meta: snapshot.meta.clone(),
            offset: start as u64,
            data: snapshot.data[start..end].to_vec(),
            done: end == snapshot.data.len(),
        };
        self.send(to, body);
    }

    fn broadcast_heartbeat(&mut self) {
        let commit = self.log.committed;
        let targets: Vec<(NodeId, u64)> = self
            .progress
            .iter()
            .map(|(&id, p)| (id, p.match_index.min(commit)))
            .collect();
        for (to, commit) in targets {
            self.send(to, MessageBody::Heartbeat { commit });
        }
    }

    fn handle_append_response(
        &mut self,
        now: Instant,
        from: NodeId,
        reject: bool,
        index: u64,
        hint_index: u64,
        hint_term: u64,
    ) {
        if self.role != Role::Leader {
            return;
        }
        let next_probe = if reject && hint_term > 0 {
            // Skip every entry of ours whose term is above the follower's
            // term at hint_index: none of them can match.
            self.log.find_conflict_by_term(hint_index, hint_term)
        } else {
            hint_index
        };
        let last_index = self.log.last_index();
        if index > last_index {
            // An acknowledgement of entries this leader never had, or a
            // rejection of an append it never sent (each names the append's
            // index, within this leader's log, which never shrinks in its
            // term): no honest follower of this term sends one. A rejection
            // accepted here would move the probe past the log, where no
            // append can be built and the follower would starve.
            self.refused_messages += 1;
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        if reject {
            if pr.maybe_decrease(index, next_probe) {
                self.send_append(from, true);
            }
            return;
        }
        let updated = pr.maybe_update(index);
        match pr.state {
            ProgressState::Probe => {
                // The answer to our probe (or anything newer) tells us
                // where the logs match: start pipelining from there.
                pr.probe_sent = false;
                if updated || index.saturating_add(1) == pr.next_index {
                    pr.become_replicate();
                }
            }
            ProgressState::Snapshot { index: snap, .. } if pr.match_index >= snap => {
                pr.become_probe();
                pr.become_replicate();
            }
            _ => {}
        }
        let caught_up = pr.match_index == last_index;
        if updated && self.maybe_commit() {
            // The commit index moved: tell everyone (followers learn
            // commits only from us).
            let peers: Vec<NodeId> = self.progress.keys().copied().collect();
            for peer in peers {
                self.send_append(peer, true);
            }
        }
        while self.send_append(from, false) {}
        if caught_up && self.transfer.map(|(t, _)| t) == Some(from) {
            self.send(from, MessageBody::TimeoutNow);
        }
    }

    fn handle_heartbeat_response(&mut self, now: Instant, from: NodeId) {
        if self.role != Role::Leader {
            return;
        }
        let last_index = self.log.last_index();
        let max_inflight = self.cfg.max_inflight_appends;
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        match pr.state {
            // The probe may have been lost; try again.
            ProgressState::Probe => pr.probe_sent = false,
            ProgressState::Replicate => {
                // A full window may be full of lost appends: free one slot
                // per heartbeat so that replication (and, if there was a
                // loss, the rejection that resets us to probing) resumes.
                if pr.inflight.len() >= max_inflight {
                    pr.inflight.pop_front();
                }
            }
            ProgressState::Snapshot { .. } => {
                // A chunk or its answer may have been lost: resend the
                // chunk we are waiting on (the follower answers duplicates
                // with the offset it expects).
                self.send_snapshot_chunk(from);
                return;
            }
        }
        if pr.match_index < last_index {
            self.send_append(from, true);
        }
    }

    fn handle_snapshot_response(
        &mut self,
        now: Instant,
        from: NodeId,
        index: u64,
        next_offset: u64,
        done: bool,
    ) {
        if self.role != Role::Leader {
            return;
        }
        if done && index > self.log.last_index() {
            // A snapshot this leader never had: no honest follower says so.
            self.refused_messages += 1;
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        let ProgressState::Snapshot { index: sending, .. } = pr.state else {
            return;
        };
        if done {
            pr.match_index = pr.match_index.max(index);
            pr.become_probe();
            pr.next_index = pr.match_index.saturating_add(1);
            self.send_append(from, true);
            return;
        }
        let ProgressState::Snapshot { offset, .. } = pr.state else {
            return;
        };
        if index != sending || next_offset == offset {
            // Another snapshot's answer, or a duplicate of the answer we
            // already acted on.
            return;
        }
        pr.state = ProgressState::Snapshot {
            index,
            offset: next_offset,
        };
        if next_offset > offset {
            // The chunk we sent arrived: send the next one. Sending only on
            // an answer that moves the offset forward keeps one chunk in
            // flight; reacting to every answer would fork a new chunk stream
            // for each duplicated answer, and the streams multiply.
            self.send_snapshot_chunk(from);
        }
        // Behind our offset: the follower lost (or never had) part of the
        // snapshot, or this is a reordered old answer. Resume from where it
        // says it is, but only at the next heartbeat answer, so that stale
        // answers cannot start extra streams either.
    }

    /// Advances the commit index to the highest index held by a majority of
    /// voters, if that entry is of the current term. Returns whether it
    /// moved.
    fn maybe_commit(&mut self) -> bool {
        let quorum = self.config.quorum();
        if quorum == 0 {
            return false;
        }
        let mut matched: Vec<u64> = self
            .config
            .voters
            .iter()
            .map(|&v| {
                if v == self.id {
                    self.log.last_index()
                } else {
                    self.progress.get(&v).map_or(0, |p| p.match_index)
                }
            })
            .collect();
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let candidate = matched[quorum - 1];
        // Raft §5.4.2: only an entry of the current term is committed by
        // counting replicas. An older-term entry on a majority can still be
        // overwritten by a leader elected without it (Figure 8); once an
        // entry of our term is on a majority, no such leader can be elected,
        // and everything before it is committed with it.
        if candidate <= self.log.committed || self.log.term(candidate) != Some(self.term) {
            return false;
        }
        self.log.commit_to(candidate);
        if !self.config.is_voter(self.id) && self.config_index <= self.log.committed {
            // Our own removal is committed: hand over by stepping down. The
            // remaining voters elect a leader among themselves.
            let now = self.now;
            self.broadcast_heartbeat();
            self.become_follower(now, self.term, None);
        }
        true
    }

    // ----------------------------------------------------------------------
    // Follower
    // ----------------------------------------------------------------------

    fn handle_append(
        &mut self,
        from: NodeId,
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
    ) {
        if prev_index < self.log.committed {
            // Everything up to our commit index is settled; tell the leader
            // where we are and it continues from there.
            let index = self.log.committed;
            self.send(from, append_ok(index));
            return;
        }
        if !self.log.matches(prev_index, prev_term) {
            // Reject with a hint: the largest index at or below prev_index
            // whose term is at most prev_term. Entries above it carry terms
            // the leader cannot have at those positions, so the leader can
            // skip them all in one round trip.
            let hint_index = self
                .log
                .find_conflict_by_term(prev_index.min(self.log.last_index()), prev_term);
            let hint_term = self.log.term(hint_index).unwrap_or(0);
            self.send(
                from,
                MessageBody::AppendResponse {
                    reject: true,
                    index: prev_index,
                    hint_index,
                    hint_term,
                },
            );
            return;
        }
        let last_new = prev_index + entries.len() as u64;
        let had_config = entries
            .iter()
            .any(|e| matches!(e.kind, EntryKind::Config(_)));
        let truncated = self.log.append_after(prev_index, entries);
        if truncated || had_config {
            self.recompute_config();
        }
        // Only entries known to match the leader may be committed: up to
        // the end of what this append covered, not our whole log (a stale
        // suffix beyond `last_new` may still conflict).
        self.advance_commit_follower(commit.min(last_new));
        self.send(from, append_ok(last_new));
    }

    fn advance_commit_follower(&mut self, commit: u64) {
        self.log.commit_to(commit);
    }

    fn handle_snapshot_chunk(
        &mut self,
        from: NodeId,
        meta: SnapshotMeta,
        offset: u64,
        data: Vec<u8>,
        done: bool,
    ) {
        let index = meta.index;
        if index <= self.log.committed {
            // We already hold everything it covers.
            self.incoming_snapshot = None;
            self.send(
                from,
                MessageBody::SnapshotResponse {
                    index,
                    next_offset: 0,
                    done: true,
                },
            );
            return;
        }
        let resumed = self
            .incoming_snapshot
            .as_ref()
            .is_some_and(|s| s.meta == meta && !s.data.is_empty());
        if offset == 0 && !resumed {
            // A new snapshot starts. (A late duplicate of the first chunk of
            // the snapshot we are already receiving must not throw away what
            // we have.)
            self.incoming_snapshot = Some(Snapshot {
                meta: meta.clone(),
                data: Vec::new(),
            });
        }
        let expected = match &mut self.incoming_snapshot {
            Some(incoming) if incoming.meta == meta && incoming.data.len() as u64 == offset => {
                if incoming.data.len().saturating_add(data.len()) > self.cfg.max_snapshot_bytes {
                    // Over the bound: give up on it; the leader restarts
                    // from offset 0 at its next try and fails again, which
                    // an operator will see. Never grow without bound.
                    self.incoming_snapshot = None;
                    0
                } else {
                    incoming.data.extend_from_slice(&data);
                    incoming.data.len() as u64
                }
            }
            Some(incoming) if incoming.meta == meta => incoming.data.len() as u64,
            _ => 0,
        };
        let complete = done
            && self.incoming_snapshot.as_ref().is_some_and(|s| {
                s.meta == meta && s.data.len() as u64 == offset + data.len() as u64
            });
        if !complete {
            self.send(
                from,
                MessageBody::SnapshotResponse {
                    index,
                    next_offset: expected,
                    done: false,
                },
            );
            return;
        }
        let snapshot = self.incoming_snapshot.take().expect("complete snapshot");
        self.install_snapshot(snapshot);
        self.send(
            from,
            MessageBody::SnapshotResponse {
                index,
                next_offset: 0,
                done: true,
            },
        );
    }

    fn install_snapshot(&mut self, snapshot: Snapshot) {
        let meta = &snapshot.meta;
        if self.log.matches(meta.index, meta.term) {
            // Our log already has the entry the snapshot ends with, hence
            // (log matching) everything before it: just commit up to it and
            // keep the entries after.
            self.log.commit_to(meta.index);
            return;
        }
        self.log.restore(meta.index, meta.term);
        self.counters.snapshots_received += 1;
        self.base_config = meta.config.clone();
        self.snapshot = Some(snapshot.clone());
        self.snapshot_to_apply = Some(snapshot);
        self.snapshot_wanted_sent = false;
        self.recompute_config();
    }

    // ----------------------------------------------------------------------
    // Configuration
    // ----------------------------------------------------------------------

    fn set_config(&mut self, config: Configuration, index: u64) {
        self.config_index = index;
        if self.config != config {
            self.config = config.clone();
            self.push_event(Event::ConfigChanged { config });
        }
    }

    /// The configuration is that of the last configuration entry in the log
    /// (appended counts, committed or not), else the snapshot base's.
    fn recompute_config(&mut self) {
        let found = self.log.entries().rev().find_map(|e| match &e.kind {
            EntryKind::Config(c) => Some((c.clone(), e.index)),
            _ => None,
        });
        let (config, index) =
            found.unwrap_or_else(|| (self.base_config.clone(), self.log.snapshot_index()));
        self.set_config(config, index);
    }

    fn config_at(&self, index: u64) -> Configuration {
        self.log
            .entries()
            .rev()
            .filter(|e| e.index <= index)
            .find_map(|e| match &e.kind {
                EntryKind::Config(c) => Some(c.clone()),
                _ => None,
            })
            .unwrap_or_else(|| self.base_config.clone())
    }

    fn caught_up(&self, id: NodeId) -> bool {
        self.progress.get(&id).is_some_and(|p| {
            p.state == ProgressState::Replicate
                && p.match_index.saturating_add(self.cfg.catch_up_lag_entries)
                    >= self.log.last_index()
        })
    }

    /// The leader's replacement driver (see the module documentation). At
    /// most one change is proposed; `propose_conf_change` enforces the
    /// one-at-a-time and committed-in-term rules.
    fn maybe_auto_membership(&mut self, now: Instant) {
        if !self.cfg.auto_membership || self.transfer.is_some() {
            return;
        }
        let learners: Vec<NodeId> = self.config.learners.iter().copied().collect();
        // Caught-up learners in slots with no voter: two of them can be
        // promoted one after the other into an odd voter set (3 → 4 → 5)
        // and leave it odd again.
        let ready_for_empty_slots = learners
            .iter()
            .filter(|l| self.config.voter_in_slot(l.slot).is_none() && self.caught_up(**l))
            .count();
        for learner in learners {
            // A learner superseded by a newer generation of its slot.
            if self
                .config
                .members()
                .any(|m| m.slot == learner.slot && m.generation > learner.generation)
            {
                let _ = self.propose_conf_change(now, ConfChange::RemoveNode(learner));
                return;
            }
            if !self.caught_up(learner) {
                continue;
            }
            match self.config.voter_in_slot(learner.slot) {
                Some(old) if old.generation < learner.generation => {
                    let _ = self
                        .propose_conf_change(now, ConfChange::ReplaceVoter { old, new: learner });
                    return;
                }
                Some(_) => {}
                // Promote into an even voter set (the middle of a
                // replacement: 2 → 3 or 4 → 5), or into an odd one when a
                // second caught-up learner will follow (two slots replaced
                // at once: 3 → 4 → 5). Otherwise an odd set is complete: a
                // promotion would make it even, which adds a member to every
                // majority without tolerating one more failure.
                None if self.config.voters.len().is_multiple_of(2)
                    || ready_for_empty_slots >= 2 =>
                {
                    let _ = self.propose_conf_change(now, ConfChange::PromoteLearner(learner));
                    return;
                }
                None => {}
            }
        }
    }

    // ----------------------------------------------------------------------
    // Plumbing
    // ----------------------------------------------------------------------

    fn send(&mut self, to: NodeId, body: MessageBody) {
        let term = self.term;
        self.send_with_term(to, term, body);
    }

    fn send_with_term(&mut self, to: NodeId, term: u64, body: MessageBody) {
        if self.outbox.len() >= self.cfg.max_outbox_messages {
            self.dropped_messages += 1;
            return;
        }
        self.outbox.push_back(Message {
            from: self.id,
            to,
            term,
            body,
        });
    }

    fn push_event(&mut self, event: Event) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}

fn append_ok(index: u64) -> MessageBody {
    MessageBody::AppendResponse {
        reject: false,
        index,
        hint_index: 0,
        hint_term: 0,
    }
}
