//! The follower: its message handler, appends and heartbeats from the
//! leader, and snapshots received in chunks.

use super::{Entry, EntryKind, Message, MessageBody, NodeId, Raft, Shared, Snapshot, SnapshotMeta};
use crate::time::Instant;

impl Raft {
    /// The follower's handler (after the term checks and the vote requests
    /// every role answers).
    pub(super) fn step_follower(&mut self, now: Instant, msg: Message) {
        let from = msg.from;
        match msg.body {
            MessageBody::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => {
                self.follow(now, from);
                self.shared
                    .handle_append(from, prev_index, prev_term, entries, commit);
            }
            MessageBody::Heartbeat { commit } => {
                self.follow(now, from);
                // The leader sends min(its commit, our match), so everything
                // up to `commit` is known to be in our log as in its.
                let s = &mut self.shared;
                s.log.commit_to(commit.min(s.log.last_index()));
                s.send(from, MessageBody::HeartbeatResponse);
            }
            MessageBody::InstallSnapshot {
                meta,
                offset,
                data,
                done,
            } => {
                self.follow(now, from);
                self.shared
                    .handle_snapshot_chunk(from, meta, offset, data, done);
            }
            MessageBody::TimeoutNow => self.campaign_on_transfer(now),
            MessageBody::PreVote { .. }
            | MessageBody::Vote { .. }
            | MessageBody::PreVoteResponse { .. }
            | MessageBody::VoteResponse { .. }
            | MessageBody::AppendResponse { .. }
            | MessageBody::HeartbeatResponse
            | MessageBody::SnapshotResponse { .. } => {}
        }
    }

    /// A message from the leader of our term: follow it (if it is news) and
    /// restart the election timer.
    fn follow(&mut self, now: Instant, from: NodeId) {
        if self.shared.leader != Some(from) {
            self.become_follower(now, self.shared.term, Some(from));
        }
        self.shared.leader_contact = Some(now);
        self.shared.reset_election_deadline(now);
    }
}

impl Shared {
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
            self.acknowledge(from, index);
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
            self.counters.append_responses_sent += 1;
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
        self.log.commit_to(commit.min(last_new));
        self.acknowledge(from, last_new);
    }

    /// Acknowledges the leader's log up to `index`. An acknowledgement
    /// still waiting in the outbox for the same leader and term is raised
    /// instead of queueing a second one: appends that arrive together get
    /// one answer. That loses nothing: acceptances in one term only ever
    /// claim a longer matching prefix (this leader's entries are never
    /// truncated in its term), so the leader acts on the largest alone as
    /// it would on all of them in order.
    fn acknowledge(&mut self, to: NodeId, index: u64) {
        let term = self.term;
        if let Some(Message {
            to: queued_to,
            term: queued_term,
            body:
                MessageBody::AppendResponse {
                    reject: false,
                    index: queued,
                    ..
                },
            ..
        }) = self.outbox.back_mut()
            && *queued_to == to
            && *queued_term == term
        {
            *queued = (*queued).max(index);
            return;
        }
        self.counters.append_responses_sent += 1;
        self.send(to, append_ok(index));
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
            self.send(from, snapshot_done(index));
            return;
        }
        let expected = self.receive_chunk(&meta, offset, &data);
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
        self.send(from, snapshot_done(index));
    }

    /// Adds a chunk to the snapshot being received. Returns the offset the
    /// next chunk should have.
    fn receive_chunk(&mut self, meta: &SnapshotMeta, offset: u64, data: &[u8]) -> u64 {
        let resumed = self
            .incoming_snapshot
            .as_ref()
            .is_some_and(|s| s.meta == *meta && !s.data.is_empty());
        if offset == 0 && !resumed {
            // A new snapshot starts. (A late duplicate of the first chunk of
            // the snapshot we are already receiving must not throw away what
            // we have.)
            self.incoming_snapshot = Some(Snapshot {
                meta: meta.clone(),
                data: Vec::new(),
            });
        }
        match &mut self.incoming_snapshot {
            Some(incoming) if incoming.meta == *meta && incoming.data.len() as u64 == offset => {
                if incoming.data.len().saturating_add(data.len()) > self.cfg.snapshot_bytes_max {
                    // Over the bound: give up on it; the leader restarts
                    // from offset 0 at its next try and fails again, which
                    // an operator will see. Never grow without bound.
                    self.incoming_snapshot = None;
                    0
                } else {
                    incoming.data.extend_from_slice(data);
                    incoming.data.len() as u64
                }
            }
            Some(incoming) if incoming.meta == *meta => incoming.data.len() as u64,
            _ => 0,
        }
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
}

fn append_ok(index: u64) -> MessageBody {
    MessageBody::AppendResponse {
        reject: false,
        index,
        hint_index: 0,
        hint_term: 0,
    }
}

fn snapshot_done(index: u64) -> MessageBody {
    MessageBody::SnapshotResponse {
        index,
        next_offset: 0,
        done: true,
    }
}
