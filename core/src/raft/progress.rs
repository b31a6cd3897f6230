//! The leader's view of one follower's log (etcd's `tracker.Progress`).

use std::collections::VecDeque;

use crate::time::Instant;

/// How the leader currently sends to a follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProgressState {
    /// Where the follower's log matches is unknown: one append at a time,
    /// then wait for the answer (or the next heartbeat answer).
    Probe,
    /// The follower's log matches up to `match_index`: appends are pipelined
    /// optimistically, `next_index` runs ahead of acknowledgements, bounded
    /// by the in-flight window.
    Replicate,
    /// The follower needs a snapshot; chunks go one at a time.
    Snapshot {
        /// Index of the snapshot being sent.
        index: u64,
        /// Offset of the next chunk to send.
        offset: u64,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct Progress {
    pub(crate) match_index: u64,
    pub(crate) next_index: u64,
    pub(crate) state: ProgressState,
    /// Probe: an append is outstanding.
    pub(crate) probe_sent: bool,
    /// Replicate: the last index of every append in flight, ascending.
    pub(crate) inflight: VecDeque<u64>,
    /// Last time any answer arrived from this follower (check-quorum).
    pub(crate) last_heard: Instant,
    /// The commit index the last append to this follower carried: a
    /// commit beyond it is still to be told.
    pub(crate) commit_sent: u64,
}

impl Progress {
    pub(crate) fn new(next_index: u64, now: Instant) -> Self {
        Progress {
            match_index: 0,
            next_index,
            state: ProgressState::Probe,
            probe_sent: false,
            inflight: VecDeque::new(),
            last_heard: now,
            commit_sent: 0,
        }
    }

    pub(crate) fn is_paused(&self, inflight_max: usize) -> bool {
        match self.state {
            ProgressState::Probe => self.probe_sent,
            ProgressState::Replicate => self.inflight.len() >= inflight_max,
            ProgressState::Snapshot { .. } => true,
        }
    }

    pub(crate) fn become_probe(&mut self) {
        // After a snapshot the follower holds at least the snapshot index.
        // Indexes here are below RAFT_NUMBER_MAX (Raft refuses larger
        // ones), so saturation never actually happens; it keeps a bug from
        // becoming an overflow panic.
        if let ProgressState::Snapshot { index, .. } = self.state {
            self.next_index = self
                .match_index
                .saturating_add(1)
                .max(index.saturating_add(1));
        } else {
            self.next_index = self.match_index.saturating_add(1);
        }
        self.state = ProgressState::Probe;
        self.probe_sent = false;
        self.inflight.clear();
    }

    pub(crate) fn become_replicate(&mut self) {
        self.state = ProgressState::Replicate;
        self.next_index = self.match_index.saturating_add(1);
        self.probe_sent = false;
        self.inflight.clear();
    }

    /// An acknowledgement up to `index`. Returns whether `match_index` grew.
    pub(crate) fn maybe_update(&mut self, index: u64) -> bool {
        let updated = index > self.match_index;
        if updated {
            self.match_index = index;
            self.probe_sent = false;
        }
        self.next_index = self.next_index.max(index.saturating_add(1));
        while self.inflight.front().is_some_and(|&last| last <= index) {
            self.inflight.pop_front();
        }
        updated
    }

    /// An accepted append up to `index`: updates the match, and moves to
    /// pipelining once the logs are known to match. Returns whether
    /// `match_index` grew.
    pub(crate) fn acknowledge(&mut self, index: u64) -> bool {
        let updated = self.maybe_update(index);
        match self.state {
            ProgressState::Probe => {
                // The answer to our probe (or anything newer) tells us
                // where the logs match: start pipelining from there.
                self.probe_sent = false;
                if updated || index.saturating_add(1) == self.next_index {
                    self.become_replicate();
                }
            }
            ProgressState::Snapshot { index: snap, .. } if self.match_index >= snap => {
                self.become_probe();
                self.become_replicate();
            }
            _ => {}
        }
        updated
    }

    /// A rejection of `rejected` (a `prev_index` we sent). `next_probe` is
    /// where the follower's hint says the logs may match. Returns false for
    /// a stale rejection (an answer to an append already superseded).
    pub(crate) fn maybe_decrease(&mut self, rejected: u64, next_probe: u64) -> bool {
        match self.state {
            ProgressState::Replicate => {
                // In Replicate every append after the one that matched is
                // built on `match_index`; a rejection at or below it answers
                // an old append that was overtaken by a later success.
                if rejected <= self.match_index {
                    return false;
                }
                self.become_probe();
                self.next_index = self
                    .match_index
                    .saturating_add(1)
                    .max(rejected.min(next_probe.saturating_add(1)));
                true
            }
            ProgressState::Probe => {
                // Only the answer to the outstanding probe counts; anything
                // else is a duplicate or reordered old answer.
                if self.next_index.saturating_sub(1) != rejected {
                    return false;
                }
                self.next_index = self
                    .match_index
                    .saturating_add(1)
                    .max(rejected.min(next_probe.saturating_add(1)));
                self.probe_sent = false;
                true
            }
            ProgressState::Snapshot { .. } => false,
        }
    }
}
