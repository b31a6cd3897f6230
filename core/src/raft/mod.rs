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
//! - After applying, tell [`Raft::set_state_items`] how many grants the
//!   lock table holds: the snapshot threshold grows with them.
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
//! Commands are opaque bytes ([`EntryKind::Command`]): the server encodes
//! Grant/Release/Expire itself, and Raft stays non-generic, so the peer codec
//! encodes one concrete message type.
//!
//! # Timing and the failover arithmetic
//!
//! A follower starts an election when it has heard nothing from a leader for
//! its randomized election timeout `r`, drawn afresh each time from
//! `[election_timeout_min, election_timeout_min + election_timeout_jitter)`.
//! When the leader dies at `t0`, the followers last heard its heartbeat at
//! `t0 - φ` with `φ` in `[0, heartbeat_interval)`; the first follower to
//! time out does so at `t0 - φ + r`, then needs one pre-vote and one vote
//! round trip (`2·RTT`). So
//!
//! ```text
//! failover = r - φ + 2·RTT
//! ```
//!
//! Defaults: heartbeat 100 ms, `r` in [2400, 2500) ms, so failover lies in
//! (2300, 2500) ms + 2·RTT — the 2.3–2.5 s the original service documents.
//! The jitter window (100 ms) is far above a LAN round trip, but timers fire
//! on whole milliseconds and processes wake late on a busy machine, so two
//! followers still time out within a one-way delay of each other now and
//! then (2 of 50 kills measured, docs/performance.md). Without a tie-break
//! both would win their pre-votes, split the vote and wait one more
//! randomized timeout (5 s in all); the tie of two fresh pre-vote rounds
//! goes to the smaller id instead (see "Elections" below), so only one
//! campaigns. [`RaftConfig::fast`]: heartbeat 50 ms,
//! `r` in [300, 450) ms, failover under 500 ms.
//!
//! Deviation from "`[T, 2T)`": a window that wide (2400 ms of spread) cannot
//! give a 200 ms failover band, so the defaults use a narrow jitter instead;
//! the fast profile uses `[T, 1.5T)` for a failover under half a second
//! (the tail is the window's top), still far wider than a round trip.
//!
//! # Elections: pre-vote, check-quorum, leader lease
//!
//! - A timed-out voter first asks for pre-votes in `term + 1` without
//!   changing its term; only with a majority of grants does it campaign. A
//!   node cut off from the majority therefore never inflates its term and
//!   cannot depose a healthy leader when it returns.
//! - Two pre-vote rounds of the same term from logs exactly as up to date
//!   that meet within a heartbeat interval of their start are a tie: the
//!   pre-candidate with the smaller id refuses the other's request, the
//!   one with the larger id grants the smaller's and stands down. So two
//!   followers that time out together do not both campaign and split the
//!   vote (`Raft::pre_vote_tie`). A pre-vote binds nobody, so this never
//!   touches safety; an older round is not fresh and grants as usual, so
//!   a pre-candidate that cannot win never stalls one that can.
//! - A voter that heard from a leader less than `election_timeout_min`
//!   ago ignores (pre-)vote requests entirely (lease), except votes sent on
//!   the leader's behalf by a leadership transfer.
//! - A leader that has not heard from a majority of voters within
//!   `election_timeout_min` steps down (check-quorum), so the other side
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
//! that voter's removal, unless only two voters are left (no change ever
//! leaves fewer than two: every committed entry is then held by at least
//! two slots, which lets a recovery after losing a majority bound every
//! fencing token by the token floors of every slot but one, see
//! `crate::cluster::recovery`; the empty slot is filled first); a
//! caught-up learner in a slot without a voter is
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
//! Outgoing messages (`outbox_messages_max`, beyond which new messages are
//! dropped — Raft tolerates loss), uncommitted entries on the leader
//! (`uncommitted_entries_max` × `entry_bytes_max`), appends per message
//! (`append_entries_max`, `append_bytes_max`), appends in flight per follower
//! (`inflight_appends_max`), snapshot chunk and total size, events. The log
//! stays bounded (`snapshot_threshold_entries_max` applied entries beyond
//! the snapshot, plus the uncommitted ones) as long as the application
//! answers [`Event::SnapshotWanted`] with [`Raft::compact`].
//!
//! # Snapshot threshold
//!
//! A snapshot costs time in proportion to the application's state, so a
//! fixed count of entries between snapshots makes the snapshot work per
//! entry grow with the state (a leader holding 315,000 grants snapshotted
//! about every 0.1 s under load). The application tells Raft the size of
//! its state in items ([`Raft::set_state_items`]); a snapshot is wanted
//! once the entries applied since the last one reach
//! `max(snapshot_threshold_entries, snapshot_entries_per_state_item ×
//! items)`, capped at `snapshot_threshold_entries_max`. Below the cap the
//! snapshot work per applied entry is then constant, as in log-structured
//! stores that compact when the log has grown by a multiple of the live
//! data. An application that never tells a size gets the fixed threshold.
//!
//! Numbers from peers are bounded too: a message carrying a term, index,
//! commit, hint or offset at or above [`RAFT_NUMBER_MAX`] is dropped and
//! counted ([`Raft::refused_messages`]), and so is an acknowledgement of an
//! index the leader does not have. Every `+ 1` on a term or index therefore
//! has a margin of 3 · 2^62; a node whose term has reached the bound stops
//! campaigning rather than send what its peers refuse.
//!
//! # Files
//!
//! - `mod.rs`: the public types, [`Raft`] with its queries, outputs and
//!   inputs, and [`Raft::step`]: the term checks, then dispatch to the
//!   role's own handler.
//! - `election.rs`: role changes (follow, campaign, lead), pre-vote and vote
//!   requests, the candidate's handler and vote counting.
//! - `leader.rs`: the leader's state (replication progress, deadlines,
//!   leadership transfer), its handler, replication, snapshots sent, commit.
//! - `follower.rs`: the follower's handler: appends, heartbeats, snapshots
//!   received.
//! - `membership.rs`: configuration changes and the automatic replacement
//!   driver.
//! - `config.rs`: [`RaftConfig`], timing and limits.
//! - `log.rs`, `progress.rs`, `types.rs`: the log, the leader's view of one
//!   follower, and the plain data types (with a compact `Display` for
//!   messages).

mod config;
mod election;
mod follower;
mod leader;
mod log;
mod membership;
mod outputs;
mod progress;
mod types;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

pub use self::config::RaftConfig;
use self::leader::{LeaderState, LeaderTimeout, Tenure};
use self::log::RaftLog;
pub use self::outputs::{Committed, CompactError, Event, ProposeError, Role, TransferError};
pub use self::types::{
    ConfChange, Configuration, Entry, EntryKind, Message, MessageBody, NodeId, RAFT_NUMBER_MAX,
    SnapshotMeta,
};
use crate::metrics::RaftCounters;
use crate::rng::SplitMix64;
use crate::time::Instant;

#[derive(Clone, Debug)]
struct Snapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// Most events held; the oldest are dropped beyond (callers drain after
/// every input, so this only guards against a caller that never does).
const EVENTS_MAX: usize = 1_024;

/// One Raft node: the state every role shares, and the role, which owns the
/// state only that role has.
#[derive(Debug)]
pub struct Raft {
    shared: Shared,
    role: RoleState,
}

/// The role with its own state. Leader-only state (replication progress,
/// deadlines, transfer) exists only in [`RoleState::Leader`], and votes only
/// in the two candidate roles, so code that needs them gets them from a
/// `match` rather than checking the role first.
#[derive(Debug)]
enum RoleState {
    Follower,
    /// Asking for pre-votes; the term is unchanged.
    PreCandidate {
        /// Answers received (this node's own included).
        votes: BTreeMap<NodeId, bool>,
        /// When this pre-vote round started (for the tie of two pre-vote
        /// rounds started together, see [`Raft::pre_vote_tie`]).
        since: Instant,
    },
    /// Campaigning in its own term.
    Candidate {
        /// Answers received (this node's own included).
        votes: BTreeMap<NodeId, bool>,
    },
    Leader(LeaderState),
}

/// What a node holds whatever its role.
#[derive(Debug)]
struct Shared {
    id: NodeId,
    cfg: RaftConfig,
    /// Election jitter (see [`crate::rng`]).
    rng: SplitMix64,

    term: u64,
    vote: Option<NodeId>,
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
    /// The size of the application's state, as last told by
    /// [`Raft::set_state_items`].
    state_items: u64,

    election_deadline: Instant,
    /// When we last heard from the leader of our term (lease rule).
    leader_contact: Option<Instant>,

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
        let s = &mut raft.shared;
        s.term = 1;
        s.log.push(Entry {
            index: 1,
            term: 1,
            kind: EntryKind::Config(config.clone()),
        });
        s.log.commit_to(1);
        s.config = config;
        s.config_index = 1;
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
        let mut shared = Shared {
            id,
            cfg,
            rng: SplitMix64::new(seed ^ (u64::from(id.slot) << 56) ^ id.generation),
            term: 0,
            vote: None,
            leader: None,
            log: RaftLog::default(),
            config: Configuration::default(),
            config_index: 0,
            base_config: Configuration::default(),
            snapshot: None,
            snapshot_to_apply: None,
            incoming_snapshot: None,
            snapshot_wanted_sent: false,
            state_items: 0,
            election_deadline: now,
            leader_contact: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            dropped_messages: 0,
            refused_messages: 0,
            now,
            counters: RaftCounters::default(),
            last_known_leader: None,
        };
        shared.reset_election_deadline(now);
        Raft {
            shared,
            role: RoleState::Follower,
        }
    }

    // ----------------------------------------------------------------------
    // Queries
    // ----------------------------------------------------------------------

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.shared.term
    }

    /// The current role.
    pub fn role(&self) -> Role {
        match self.role {
            RoleState::Follower => Role::Follower,
            RoleState::PreCandidate { .. } => Role::PreCandidate,
            RoleState::Candidate { .. } => Role::Candidate,
            RoleState::Leader(_) => Role::Leader,
        }
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        matches!(self.role, RoleState::Leader(_))
    }

    /// The leader this node knows of in its term.
    pub fn leader(&self) -> Option<NodeId> {
        self.shared.leader
    }

    /// Who this node voted for in its term.
    pub fn vote(&self) -> Option<NodeId> {
        self.shared.vote
    }

    /// The configuration in effect.
    pub fn config(&self) -> &Configuration {
        &self.shared.config
    }

    /// Whether this node is a voter in the configuration in effect.
    pub fn is_voter(&self) -> bool {
        self.shared.is_voter()
    }

    /// The commit index.
    pub fn commit_index(&self) -> u64 {
        self.shared.log.committed
    }

    /// The index up to which entries have been handed out by
    /// [`Raft::poll_committed`].
    pub fn applied_index(&self) -> u64 {
        self.shared.log.applied
    }

    /// The first index still in the log (entries before are in the snapshot).
    pub fn first_index(&self) -> u64 {
        self.shared.log.first_index()
    }

    /// The index of the last entry.
    pub fn last_index(&self) -> u64 {
        self.shared.log.last_index()
    }

    /// The term of the entry at `index`, if known.
    pub fn term_at(&self, index: u64) -> Option<u64> {
        self.shared.log.term(index)
    }

    /// The entry at `index`, if still in the log.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        self.shared.log.entry(index)
    }

    /// Applied entries beyond the last snapshot at which
    /// [`Event::SnapshotWanted`] is emitted now: `snapshot_threshold_entries`
    /// or `snapshot_entries_per_state_item` × the state's items, whichever is
    /// larger, at most `snapshot_threshold_entries_max` (0 = never; see the
    /// module documentation, "Snapshot threshold").
    pub fn snapshot_threshold_entries(&self) -> u64 {
        self.shared.snapshot_threshold_entries()
    }

    /// Metadata of the latest snapshot held, if any.
    pub fn snapshot_meta(&self) -> Option<&SnapshotMeta> {
        self.shared.snapshot.as_ref().map(|s| &s.meta)
    }

    /// Whether the configuration in effect is not yet committed (a
    /// membership change is under way).
    pub fn conf_change_pending(&self) -> bool {
        self.shared.config_index > self.shared.log.committed
    }

    /// The follower the leader is handing leadership to, if any.
    pub fn transfer_target(&self) -> Option<NodeId> {
        match &self.role {
            RoleState::Leader(leader) => leader.transfer.map(|(target, _)| target),
            _ => None,
        }
    }

    /// Messages dropped because the outbox was full.
    pub fn dropped_messages(&self) -> u64 {
        self.shared.dropped_messages
    }

    /// Peer messages dropped because they carried a number no honest peer
    /// sends: a term, index, commit, hint or offset at or above
    /// [`RAFT_NUMBER_MAX`], or an acknowledgement beyond the leader's log.
    pub fn refused_messages(&self) -> u64 {
        self.shared.refused_messages
    }

    /// Counts for operators: leader changes, snapshots sent and received,
    /// appends and the entries they carried, append answers.
    pub fn counters(&self) -> RaftCounters {
        self.shared.counters
    }

    /// Leader: the highest index `peer` is known to hold.
    pub fn match_index(&self, peer: NodeId) -> Option<u64> {
        if peer == self.shared.id {
            return Some(self.shared.log.last_index());
        }
        match &self.role {
            RoleState::Leader(leader) => leader.progress.get(&peer).map(|p| p.match_index),
            _ => None,
        }
    }

    /// Leader: when `peer` last answered it (`None` on another node, or
    /// for a peer it has no progress of).
    pub fn last_heard(&self, peer: NodeId) -> Option<Instant> {
        match &self.role {
            RoleState::Leader(leader) => leader.progress.get(&peer).map(|p| p.last_heard),
            _ => None,
        }
    }

    // ----------------------------------------------------------------------
    // Outputs
    // ----------------------------------------------------------------------

    /// Whether [`Raft::poll_message`] may give a message: one is queued,
    /// or the leader has appends to build.
    pub fn has_messages(&self) -> bool {
        !self.shared.outbox.is_empty()
            || matches!(&self.role, RoleState::Leader(leader) if leader.flush_pending)
    }

    /// The next message to send, with its recipient.
    pub fn poll_message(&mut self) -> Option<(NodeId, Message)> {
        if let RoleState::Leader(leader) = &mut self.role {
            leader.flush(&mut self.shared);
        }
        self.shared.outbox.pop_front().map(|m| (m.to, m))
    }

    /// The next thing to apply, in log order.
    pub fn poll_committed(&mut self) -> Option<Committed> {
        let s = &mut self.shared;
        if let Some(snapshot) = s.snapshot_to_apply.take() {
            return Some(Committed::Snapshot {
                meta: snapshot.meta,
                data: snapshot.data,
            });
        }
        if s.log.applied >= s.log.committed {
            return None;
        }
        let index = s.log.applied + 1;
        let entry = s.log.entry(index).expect("committed entry in log").clone();
        s.log.applied = index;
        let since_snapshot = index - s.log.snapshot_index();
        let threshold = s.snapshot_threshold_entries();
        if threshold > 0 && since_snapshot >= threshold && !s.snapshot_wanted_sent {
            s.snapshot_wanted_sent = true;
            s.push_event(Event::SnapshotWanted {
                applied_index: index,
            });
        }
        Some(Committed::Entry(entry))
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.shared.events.pop_front()
    }

    /// The earliest instant at which [`Raft::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.role {
            RoleState::Leader(leader) => Some(leader.next_deadline()),
            _ if self.is_voter() => Some(self.shared.election_deadline),
            _ => None,
        }
    }

    // ----------------------------------------------------------------------
    // Inputs
    // ----------------------------------------------------------------------

    /// Handles the deadlines that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.shared.now = self.shared.now.max(now);
        if let RoleState::Leader(leader) = &mut self.role {
            match leader.handle_timeout(&mut self.shared, now) {
                // Check-quorum: we cannot reach a majority, so we may be on
                // the minority side of a partition while the majority
                // elects someone else. Stepping down stops us from telling
                // clients we lead; no term change, so we rejoin quietly as a
                // follower.
                LeaderTimeout::LostQuorum => self.become_follower(now, self.shared.term, None),
                LeaderTimeout::Propose(change) => {
                    let _ = self.propose_conf_change(now, change);
                }
                LeaderTimeout::Idle => {}
            }
            return;
        }
        if now >= self.shared.election_deadline {
            if self.is_voter() && self.shared.term.saturating_add(1) < RAFT_NUMBER_MAX {
                self.campaign(now, true, false);
            } else {
                self.shared.reset_election_deadline(now);
            }
        }
    }

    /// Proposes an application command. On success returns `(index, term)`:
    /// the command took effect if and only if [`Raft::poll_committed`] later
    /// yields an entry with exactly this index and term. A different term at
    /// that index means it was overwritten and never takes effect.
    ///
    /// `payload` becomes the entry's shared bytes: from a borrowed slice
    /// that is the one allocation the entry makes (from a `Vec`, a copy
    /// too).
    pub fn propose(
        &mut self,
        now: Instant,
        payload: impl Into<Arc<[u8]>>,
    ) -> Result<(u64, u64), ProposeError> {
        self.shared.now = self.shared.now.max(now);
        let RoleState::Leader(leader) = &mut self.role else {
            return Err(self.shared.not_leader());
        };
        leader.check_can_propose(&self.shared)?;
        let payload: Arc<[u8]> = payload.into();
        if payload.len() > self.shared.cfg.entry_bytes_max {
            return Err(ProposeError::TooLarge);
        }
        let (appended, tenure) = leader.append(&mut self.shared, EntryKind::Command(payload));
        self.end_tenure_if(tenure);
        Ok(appended)
    }

    /// Tells Raft the size of the application's state, in items whose
    /// snapshot costs about the same each (the cluster node: grants), to
    /// set the snapshot threshold ([`Raft::snapshot_threshold_entries`]).
    /// Call it after applying what [`Raft::poll_committed`] gave; it is
    /// read when the next entry is handed out.
    pub fn set_state_items(&mut self, items: u64) {
        self.shared.state_items = items;
    }

    /// Takes a snapshot: `data` must be the state machine after applying
    /// everything [`Raft::poll_committed`] has returned. Compacts the log up
    /// to [`Raft::applied_index`]. Returns that index.
    pub fn compact(&mut self, data: Vec<u8>) -> Result<u64, CompactError> {
        let s = &mut self.shared;
        let index = s.log.applied;
        if index <= s.log.snapshot_index() {
            return Err(CompactError::NothingToCompact);
        }
        let term = s.log.term(index).expect("applied entry in log");
        let config = s.config_at(index);
        s.log.compact_to(index);
        s.base_config = config.clone();
        s.snapshot = Some(Snapshot {
            meta: SnapshotMeta {
                index,
                term,
                config,
            },
            data,
        });
        s.snapshot_wanted_sent = false;
        Ok(index)
    }

    /// Handles a message from a peer: the checks every role makes (address,
    /// bounds, term), the (pre-)vote requests every role answers, then the
    /// role's own handler.
    pub fn step(&mut self, now: Instant, msg: Message) {
        self.shared.now = self.shared.now.max(now);
        if msg.to != self.shared.id || msg.from == self.shared.id {
            // Meant for another generation of our slot (or looped back).
            return;
        }
        if !msg.numbers_in_bounds() {
            // The peer decoder refuses these already; this guards callers
            // that step messages directly. Accepting a term near u64::MAX
            // would make the next `term + 1` overflow (or wrap to 0 and
            // leave the cluster campaigning at a stale term forever).
            self.shared.refused_messages += 1;
            return;
        }
        if !self.check_term(now, &msg) {
            return;
        }
        match msg.body {
            MessageBody::PreVote {
                last_index,
                last_term,
            } => self.step_pre_vote(now, msg.from, msg.term, last_index, last_term),
            MessageBody::Vote {
                last_index,
                last_term,
                ..
            } => self
                .shared
                .handle_vote(now, msg.from, last_index, last_term),
            _ => match &mut self.role {
                RoleState::Leader(leader) => {
                    let tenure = leader.step_leader(&mut self.shared, now, msg);
                    self.end_tenure_if(tenure);
                }
                RoleState::PreCandidate { .. } | RoleState::Candidate { .. } => {
                    self.step_candidate(now, msg);
                }
                RoleState::Follower => self.step_follower(now, msg),
            },
        }
    }

    /// The term rules (Raft §5.1, with the lease of pre-vote and
    /// check-quorum): a newer term makes us follow it, except for the
    /// requests the lease ignores; an older one is answered so that its
    /// sender catches up, and goes no further. Returns whether `msg` is for
    /// the roles to handle.
    fn check_term(&mut self, now: Instant, msg: &Message) -> bool {
        let from = msg.from;
        if msg.term > self.shared.term {
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
                return false;
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
        } else if msg.term < self.shared.term {
            match msg.body {
                MessageBody::Append { .. }
                | MessageBody::Heartbeat { .. }
                | MessageBody::InstallSnapshot { .. } => {
                    // A stale leader (it was partitioned). Tell it our term
                    // so that it steps down; with check-quorum and pre-vote
                    // it could otherwise keep sending forever, since nobody
                    // else would ever contact it with a higher term.
                    self.shared.send(from, MessageBody::HeartbeatResponse);
                }
                MessageBody::PreVote { .. } => {
                    // Tell a pre-candidate that is behind about our term, so
                    // that it catches up instead of retrying forever.
                    self.shared
                        .send(from, MessageBody::PreVoteResponse { reject: true });
                }
                _ => {}
            }
            return false;
        }
        true
    }

    /// A leader whose own removal was just committed hands over by stepping
    /// down; the remaining voters elect a leader among themselves.
    fn end_tenure_if(&mut self, tenure: Tenure) {
        if tenure == Tenure::Ends {
            let now = self.shared.now;
            self.become_follower(now, self.shared.term, None);
        }
    }
}

impl Shared {
    fn is_voter(&self) -> bool {
        self.config.is_voter(self.id)
    }

    fn not_leader(&self) -> ProposeError {
        ProposeError::NotLeader {
            leader_hint: self.leader,
        }
    }

    fn send(&mut self, to: NodeId, body: MessageBody) {
        let term = self.term;
        self.send_with_term(to, term, body);
    }

    fn send_with_term(&mut self, to: NodeId, term: u64, body: MessageBody) {
        if self.outbox.len() >= self.cfg.outbox_messages_max {
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

    /// See [`Raft::snapshot_threshold_entries`].
    fn snapshot_threshold_entries(&self) -> u64 {
        let cfg = &self.cfg;
        if cfg.snapshot_threshold_entries == 0 {
            return 0;
        }
        cfg.snapshot_entries_per_state_item
            .saturating_mul(self.state_items)
            .max(cfg.snapshot_threshold_entries)
            .min(cfg.snapshot_threshold_entries_max)
    }

    fn push_event(&mut self, event: Event) {
        if self.events.len() >= EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}
