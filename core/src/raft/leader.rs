//! The leader: its state (replication progress, heartbeat and check-quorum
//! deadlines, leadership transfer), which exists only while it leads, its
//! message handler, replication and snapshot sending, and commit.

use std::collections::BTreeMap;

use super::progress::{Progress, ProgressState};
use super::{
    Entry, EntryKind, Message, MessageBody, NodeId, ProposeError, Raft, RoleState, Shared,
    TransferError,
};
use crate::time::Instant;

/// State only a leader has.
#[derive(Debug)]
pub(super) struct LeaderState {
    /// Per member other than self.
    pub(super) progress: BTreeMap<NodeId, Progress>,
    /// Transfer target and the instant the attempt is abandoned.
    pub(super) transfer: Option<(NodeId, Instant)>,
    heartbeat_deadline: Instant,
    quorum_check_deadline: Instant,
    /// Appends to (re)build in `poll_message`.
    pub(super) flush_pending: bool,
    /// When a commit index no append has carried yet goes by itself to the
    /// idle followers that lack it (`commit_notice_delay`).
    commit_notice_deadline: Option<Instant>,
}

/// Whether a leader keeps leading after an operation. It ends when its own
/// removal from the voters is committed: [`Raft::end_tenure_if`] then steps
/// down, and the remaining voters elect a leader among themselves.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tenure {
    Continues,
    Ends,
}

/// What a leader's deadline asks of the node.
pub(super) enum LeaderTimeout {
    /// Check-quorum failed: step down.
    LostQuorum,
    /// A heartbeat went out, and the replacement driver wants this change.
    Propose(super::ConfChange),
    /// Nothing more to do.
    Idle,
}

/// Voters whose match indexes [`LeaderState::maybe_commit`] sorts without
/// allocating (more go to the heap).
const VOTERS_ON_STACK: usize = 16;

/// What [`LeaderState::maybe_commit`] did.
#[derive(PartialEq, Eq)]
enum Commit {
    Unchanged,
    Advanced,
    /// Advanced, and thereby committed our own removal from the voters.
    OwnRemoval,
}

impl LeaderState {
    /// The state of a leader whose term starts at `now`.
    pub(super) fn new(s: &Shared, now: Instant) -> Self {
        let mut leader = LeaderState {
            progress: BTreeMap::new(),
            transfer: None,
            heartbeat_deadline: now.saturating_add(s.cfg.heartbeat_interval),
            quorum_check_deadline: now.saturating_add(s.cfg.election_timeout_min),
            flush_pending: false,
            commit_notice_deadline: None,
        };
        leader.sync_progress(s, true);
        leader
    }

    pub(super) fn next_deadline(&self) -> Instant {
        let mut t = self.heartbeat_deadline.min(self.quorum_check_deadline);
        if let Some((_, deadline)) = self.transfer {
            t = t.min(deadline);
        }
        if let Some(deadline) = self.commit_notice_deadline {
            t = t.min(deadline);
        }
        t
    }

    pub(super) fn handle_timeout(&mut self, s: &mut Shared, now: Instant) -> LeaderTimeout {
        if now >= self.quorum_check_deadline {
            self.quorum_check_deadline = now.saturating_add(s.cfg.election_timeout_min);
            if !self.quorum_active(s, now) {
                return LeaderTimeout::LostQuorum;
            }
        }
        if let Some((_, deadline)) = self.transfer
            && now >= deadline
        {
            // The target did not take over within an election timeout:
            // give up and accept proposals again.
            self.transfer = None;
        }
        if self.commit_notice_deadline.is_some_and(|d| now >= d) {
            self.commit_notice_deadline = None;
            let peers: Vec<NodeId> = self.progress.keys().copied().collect();
            for peer in peers {
                if self.lacks_commit_idle(s, peer) {
                    self.send_append(s, peer, true);
                }
            }
        }
        if now >= self.heartbeat_deadline {
            self.heartbeat_deadline = now.saturating_add(s.cfg.heartbeat_interval);
            self.broadcast_heartbeat(s);
            if let Some(change) = self.auto_membership_change(s) {
                return LeaderTimeout::Propose(change);
            }
        }
        LeaderTimeout::Idle
    }

    /// The leader's handler (after the term checks and the vote requests
    /// every role answers).
    pub(super) fn step_leader(&mut self, s: &mut Shared, now: Instant, msg: Message) -> Tenure {
        let from = msg.from;
        match msg.body {
            MessageBody::Append { .. }
            | MessageBody::Heartbeat { .. }
            | MessageBody::InstallSnapshot { .. } => {
                // Two leaders in one term would violate election safety; a
                // correct peer never sends this. Ignore rather than panic on
                // what the network hands us.
                debug_assert!(
                    false,
                    "{:?}: second leader {from:?} in term {}",
                    s.id, s.term
                );
            }
            MessageBody::AppendResponse {
                reject,
                index,
                hint_index,
                hint_term,
            } => {
                let answer = AppendAnswer {
                    reject,
                    index,
                    hint_index,
                    hint_term,
                };
                return self.handle_append_response(s, now, from, answer);
            }
            MessageBody::HeartbeatResponse => self.handle_heartbeat_response(s, now, from),
            MessageBody::SnapshotResponse {
                index,
                next_offset,
                done,
            } => self.handle_snapshot_response(s, now, from, index, next_offset, done),
            MessageBody::PreVote { .. }
            | MessageBody::Vote { .. }
            | MessageBody::PreVoteResponse { .. }
            | MessageBody::VoteResponse { .. }
            | MessageBody::TimeoutNow => {}
        }
        Tenure::Continues
    }

    // ----------------------------------------------------------------------
    // Proposals and commit
    // ----------------------------------------------------------------------

    /// The checks of a proposal beyond leadership itself.
    pub(super) fn check_can_propose(&self, s: &Shared) -> Result<(), ProposeError> {
        if self.transfer.is_some() {
            return Err(ProposeError::TransferInProgress);
        }
        if s.log.last_index() - s.log.committed >= s.cfg.uncommitted_entries_max {
            return Err(ProposeError::Backpressure);
        }
        Ok(())
    }

    /// Appends an entry of our term; returns its `(index, term)`.
    pub(super) fn append(&mut self, s: &mut Shared, kind: EntryKind) -> ((u64, u64), Tenure) {
        let index = s.log.last_index() + 1;
        let is_config = matches!(kind, EntryKind::Config(_));
        if let EntryKind::Config(config) = &kind {
            s.set_config(config.clone(), index);
        }
        s.log.push(Entry {
            index,
            term: s.term,
            kind,
        });
        if is_config {
            self.sync_progress(s, false);
        }
        self.flush_pending = true;
        // With a quorum of two or more, an entry of ours cannot move the
        // commit index by itself: our own match is the highest, so the
        // majority's index is another voter's, which appending leaves as it
        // was. Only a quorum of one (ourselves) or a configuration (new
        // voters) can, so only then is it looked at; this runs on every
        // proposal.
        if !is_config && s.config.quorum() > 1 {
            return ((index, s.term), Tenure::Continues);
        }
        let tenure = match self.maybe_commit(s) {
            Commit::OwnRemoval => Tenure::Ends,
            Commit::Unchanged | Commit::Advanced => Tenure::Continues,
        };
        ((index, s.term), tenure)
    }

    /// Advances the commit index to the highest index held by a majority of
    /// voters, if that entry is of the current term.
    fn maybe_commit(&mut self, s: &mut Shared) -> Commit {
        let quorum = s.config.quorum();
        if quorum == 0 {
            return Commit::Unchanged;
        }
        let matched = s.config.voters.iter().map(|&v| {
            if v == s.id {
                s.log.last_index()
            } else {
                self.progress.get(&v).map_or(0, |p| p.match_index)
            }
        });
        // Runs on every proposal and acknowledgement: the usual handful of
        // voters is sorted on the stack.
        let mut on_stack = [0u64; VOTERS_ON_STACK];
        let mut on_heap = Vec::new();
        let matched: &mut [u64] = if s.config.voters.len() <= VOTERS_ON_STACK {
            let mut count = 0;
            for (slot, index) in on_stack.iter_mut().zip(matched) {
                *slot = index;
                count += 1;
            }
            &mut on_stack[..count]
        } else {
            on_heap.extend(matched);
            &mut on_heap
        };
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let candidate = matched[quorum - 1];
        // Raft §5.4.2: only an entry of the current term is committed by
        // counting replicas. An older-term entry on a majority can still be
        // overwritten by a leader elected without it (Figure 8); once an
        // entry of our term is on a majority, no such leader can be elected,
        // and everything before it is committed with it.
        if candidate <= s.log.committed
            || (s.log.term(candidate) != Some(s.term) && !commit_older_term_planted())
        {
            return Commit::Unchanged;
        }
        s.log.commit_to(candidate);
        if !s.config.is_voter(s.id) && s.config_index <= s.log.committed {
            // Our own removal is committed: tell everyone the commit index,
            // then (the caller) step down.
            self.broadcast_heartbeat(s);
            return Commit::OwnRemoval;
        }
        Commit::Advanced
    }

    /// Makes `progress` hold exactly the members other than us. Members that
    /// stay keep their progress; new ones (all of them when a term starts)
    /// probe from our end and count as heard from now, so that a quorum
    /// check only judges them after they had a chance to answer.
    fn sync_progress(&mut self, s: &Shared, fresh_term: bool) {
        if fresh_term {
            self.progress.clear();
        }
        let now = s.now;
        let next = s.log.last_index() + 1;
        let members: Vec<NodeId> = s.config.members().filter(|&m| m != s.id).collect();
        self.progress.retain(|id, _| members.contains(id));
        for member in members {
            self.progress
                .entry(member)
                .or_insert_with(|| Progress::new(next, now));
        }
        if let Some((target, _)) = self.transfer
            && !s.config.is_voter(target)
        {
            // The transfer target was removed.
            self.transfer = None;
        }
    }

    fn quorum_active(&self, s: &Shared, now: Instant) -> bool {
        let window = s.cfg.election_timeout_min;
        let active = s
            .config
            .voters
            .iter()
            .filter(|&&v| {
                v == s.id
                    || self
                        .progress
                        .get(&v)
                        .is_some_and(|p| p.last_heard.saturating_add(window) > now)
            })
            .count();
        active >= s.config.quorum()
    }

    // ----------------------------------------------------------------------
    // Leadership transfer
    // ----------------------------------------------------------------------

    fn transfer_to(
        &mut self,
        s: &mut Shared,
        now: Instant,
        target: Option<NodeId>,
    ) -> Result<NodeId, TransferError> {
        let target = match target {
            Some(t) => {
                if t == s.id || !s.config.is_voter(t) {
                    return Err(TransferError::BadTarget);
                }
                t
            }
            None => s
                .config
                .voters
                .iter()
                .filter(|&&v| v != s.id)
                .max_by_key(|v| self.progress.get(v).map_or(0, |p| p.match_index))
                .copied()
                .ok_or(TransferError::NoCandidate)?,
        };
        self.transfer = Some((target, now.saturating_add(s.cfg.election_timeout_min)));
        if self.progress.get(&target).map(|p| p.match_index) == Some(s.log.last_index()) {
            s.send(target, MessageBody::TimeoutNow);
        } else {
            self.send_append(s, target, true);
        }
        Ok(target)
    }

    // ----------------------------------------------------------------------
    // Replication
    // ----------------------------------------------------------------------

    /// Builds the appends that proposals, acknowledgements and commits
    /// since the last drain asked for: per follower, every entry it lacks
    /// that its flow allows, in as few appends as the batch limits permit
    /// (full batches pipelined up to the in-flight window). However many
    /// proposals and answers one input brought, each follower gets at most
    /// one partial append (one that reaches the end of the log below the
    /// batch limits) per drain, and the commit index rides on it. A
    /// follower that gets no entries and has nothing in flight, but has
    /// not yet been told the commit index, gets one empty append carrying
    /// it: at once if one entry is new to it, else after
    /// `commit_notice_delay` unless entries carry it first. One with
    /// appends in flight learns it from the append its next answer opens.
    pub(super) fn flush(&mut self, s: &mut Shared) {
        if !self.flush_pending {
            return;
        }
        self.flush_pending = false;
        let delay = s.cfg.commit_notice_delay;
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for peer in peers {
            while self.send_append(s, peer, false) {}
            if !self.lacks_commit_idle(s, peer) {
                continue;
            }
            let untold = s.log.committed - self.progress[&peer].commit_sent;
            if delay.is_zero() || untold == 1 {
                self.send_append(s, peer, true);
            } else if self.commit_notice_deadline.is_none() {
                self.commit_notice_deadline = Some(s.now.saturating_add(delay));
            }
        }
    }

    /// Whether `peer` has nothing in flight and has not been told the
    /// commit index.
    fn lacks_commit_idle(&self, s: &Shared, peer: NodeId) -> bool {
        let committed = s.log.committed;
        self.progress
            .get(&peer)
            .is_some_and(|pr| pr.commit_sent < committed && pr.inflight.is_empty())
    }

    /// Sends every member an append, even an empty one (a probe, or the new
    /// commit index).
    pub(super) fn probe_all(&mut self, s: &mut Shared) {
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for peer in peers {
            self.send_append(s, peer, true);
        }
    }

    /// Sends one append (or snapshot chunk) to `to` if its flow allows.
    /// Returns whether an append carrying entries was sent (callers loop to
    /// fill the pipeline). `allow_empty` sends even with no new entries (to
    /// probe or to carry the commit index).
    fn send_append(&mut self, s: &mut Shared, to: NodeId, allow_empty: bool) -> bool {
        let inflight_max = s.cfg.inflight_appends_max;
        let Some(pr) = self.progress.get(&to) else {
            return false;
        };
        if pr.is_paused(inflight_max) {
            return false;
        }
        let next = pr.next_index;
        let prev_index = next - 1;
        let Some(prev_term) = s.log.term(prev_index) else {
            // The entries the follower needs were compacted away.
            self.start_snapshot(s, to);
            return false;
        };
        let entries = s
            .log
            .slice(next, s.cfg.append_entries_max, s.cfg.append_bytes_max);
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
        let commit = s.log.committed;
        pr.commit_sent = commit;
        s.counters.appends_sent += 1;
        s.counters.append_entries_sent += entries.len() as u64;
        s.send(
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

    pub(super) fn broadcast_heartbeat(&self, s: &mut Shared) {
        let commit = s.log.committed;
        let targets: Vec<(NodeId, u64)> = self
            .progress
            .iter()
            .map(|(&id, p)| (id, p.match_index.min(commit)))
            .collect();
        for (to, commit) in targets {
            s.send(to, MessageBody::Heartbeat { commit });
        }
    }

    fn handle_append_response(
        &mut self,
        s: &mut Shared,
        now: Instant,
        from: NodeId,
        answer: AppendAnswer,
    ) -> Tenure {
        let AppendAnswer {
            reject,
            index,
            hint_index,
            hint_term,
        } = answer;
        let next_probe = if reject && hint_term > 0 {
            // Skip every entry of ours whose term is above the follower's
            // term at hint_index: none of them can match.
            s.log.find_conflict_by_term(hint_index, hint_term)
        } else {
            hint_index
        };
        let last_index = s.log.last_index();
        if index > last_index {
            // An acknowledgement of entries this leader never had, or a
            // rejection of an append it never sent (each names the append's
            // index, within this leader's log, which never shrinks in its
            // term): no honest follower of this term sends one. A rejection
            // accepted here would move the probe past the log, where no
            // append can be built and the follower would starve.
            s.refused_messages += 1;
            return Tenure::Continues;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            return Tenure::Continues;
        };
        pr.last_heard = now;
        if reject {
            if pr.maybe_decrease(index, next_probe) {
                self.send_append(s, from, true);
            }
            return Tenure::Continues;
        }
        let updated = pr.acknowledge(index);
        let caught_up = pr.match_index == last_index;
        if updated && self.maybe_commit(s) == Commit::OwnRemoval {
            return Tenure::Ends;
        }
        // The next appends (to this follower, whose window opened, and the
        // commit index to everyone, who learn commits only from us) are
        // built at the next drain, after the caller has applied what
        // committed and proposed what that freed: one append per follower
        // carries it all.
        self.flush_pending = true;
        if caught_up && self.transfer.map(|(t, _)| t) == Some(from) {
            s.send(from, MessageBody::TimeoutNow);
        }
        Tenure::Continues
    }

    fn handle_heartbeat_response(&mut self, s: &mut Shared, now: Instant, from: NodeId) {
        let last_index = s.log.last_index();
        let inflight_max = s.cfg.inflight_appends_max;
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
                if pr.inflight.len() >= inflight_max {
                    pr.inflight.pop_front();
                }
            }
            ProgressState::Snapshot { .. } => {
                // A chunk or its answer may have been lost: resend the
                // chunk we are waiting on (the follower answers duplicates
                // with the offset it expects).
                self.send_snapshot_chunk(s, from);
                return;
            }
        }
        if pr.match_index < last_index {
            self.send_append(s, from, true);
        }
    }
}

/// The fields of an [`MessageBody::AppendResponse`].
struct AppendAnswer {
    reject: bool,
    index: u64,
    hint_index: u64,
    hint_term: u64,
}

// --------------------------------------------------------------------------
// Snapshots sent
// --------------------------------------------------------------------------

impl LeaderState {
    fn start_snapshot(&mut self, s: &mut Shared, to: NodeId) {
        let Some(snapshot) = &s.snapshot else {
            // Cannot happen: entries are only compacted by taking a snapshot.
            debug_assert!(false, "compacted log without snapshot");
            return;
        };
        let index = snapshot.meta.index;
        let pr = self.progress.get_mut(&to).expect("progress");
        pr.state = ProgressState::Snapshot { index, offset: 0 };
        pr.inflight.clear();
        s.counters.snapshots_sent += 1;
        self.send_snapshot_chunk(s, to);
    }

    fn send_snapshot_chunk(&mut self, s: &mut Shared, to: NodeId) {
        let (Some(snapshot), Some(pr)) = (&s.snapshot, self.progress.get(&to)) else {
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
            return self.send_snapshot_chunk(s, to);
        }
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(snapshot.data.len());
        let end = start
            .saturating_add(s.cfg.snapshot_chunk_bytes)
            .min(snapshot.data.len());
        let body = MessageBody::InstallSnapshot {
            meta: snapshot.meta.clone(),
            offset: start as u64,
            data: snapshot.data[start..end].to_vec(),
            done: end == snapshot.data.len(),
        };
        s.send(to, body);
    }

    fn handle_snapshot_response(
        &mut self,
        s: &mut Shared,
        now: Instant,
        from: NodeId,
        index: u64,
        next_offset: u64,
        done: bool,
    ) {
        if done && index > s.log.last_index() {
            // A snapshot this leader never had: no honest follower says so.
            s.refused_messages += 1;
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        let ProgressState::Snapshot {
            index: sending,
            offset,
        } = pr.state
        else {
            return;
        };
        if done {
            pr.match_index = pr.match_index.max(index);
            pr.become_probe();
            pr.next_index = pr.match_index.saturating_add(1);
            self.send_append(s, from, true);
            return;
        }
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
            self.send_snapshot_chunk(s, from);
        }
        // Behind our offset: the follower lost (or never had) part of the
        // snapshot, or this is a reordered old answer. Resume from where it
        // says it is, but only at the next heartbeat answer, so that stale
        // answers cannot start extra streams either.
    }
}

impl Raft {
    /// Hands leadership to `target` (or to the most up-to-date other voter),
    /// for graceful shutdown: the target is brought up to date, then told to
    /// campaign at once. Proposals are refused meanwhile; the attempt is
    /// abandoned after an election timeout.
    pub fn transfer_leadership(
        &mut self,
        now: Instant,
        target: Option<NodeId>,
    ) -> Result<NodeId, TransferError> {
        self.shared.now = self.shared.now.max(now);
        let RoleState::Leader(leader) = &mut self.role else {
            return Err(TransferError::NotLeader);
        };
        leader.transfer_to(&mut self.shared, now, target)
    }
}

/// Whether the planted Figure-8 bug (commit an older term's entry by
/// counting replicas) is switched on: tests of the randomized Raft
/// schedules only.
#[cfg(feature = "planted-bugs")]
fn commit_older_term_planted() -> bool {
    crate::testing::planted::active(crate::testing::planted::PlantedBug::CommitOlderTerm)
}

/// Without `planted-bugs` nothing is planted.
#[cfg(not(feature = "planted-bugs"))]
fn commit_older_term_planted() -> bool {
    false
}
