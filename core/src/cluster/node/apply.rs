//! Proposals in flight ([`Pending`]) and their outcome: the pump that drains
//! Raft's committed entries and events after every input, applying each
//! entry to the replicated state, answering the proposal it carries (only
//! when its `(index, term)` is the one proposed), and the leader's
//! bookkeeping of what an entry freed.

use std::collections::VecDeque;

use crate::cluster::command::{ApplyResult, Command};
use crate::cluster::state::SnapshotError;
use crate::conn::ConnId;
use crate::conn::client::{Answer, ReplyTo};
use crate::conn::pushes::Watch;
use crate::inspect::{AdminRequestId, ForceReleaseOutcome};
use crate::raft::{Committed, Entry, EntryKind, Event, NodeId};
use crate::reserve::TokenAlert;
use crate::time::{Duration, Instant};
use crate::wire::{Capabilities, Key, KeyGroup, PushKind, Reply, SET_KEYS_MAX};

use super::ClusterNode;
use super::connections::{Conn, ConnKind};
use super::leadership::{Handover, Leadership, Waiter, leader_reply};

/// What a proposal is waiting for.
#[derive(Debug)]
pub(super) enum PendingKind {
    /// The domain's counter start; no reply.
    Init,
    /// A grant for a client waiter.
    Grant(Waiter),
    /// A client's release.
    Release { conn: ConnId, reply_to: ReplyTo },
    /// A client's renewal of `token`.
    Extend {
        conn: ConnId,
        reply_to: ReplyTo,
        token: u64,
    },
    /// A client's downgrade of its grant to shared.
    Downgrade { conn: ConnId, reply_to: ReplyTo },
    /// A lease expiry or the release of an undelivered grant; no reply.
    Internal,
    /// An operator's force-release, answered through
    /// [`ClusterNode::poll_admin_reply`] once applied.
    ForceRelease {
        /// The driver's name for the request.
        id: AdminRequestId,
        /// Every key of the grant holding the named key when proposed;
        /// replaced at apply by the keys of the grant actually revoked.
        keys: Vec<Key>,
    },
}

#[derive(Debug)]
pub(super) struct Pending {
    pub(super) term: u64,
    pub(super) kind: PendingKind,
    /// When it was proposed (commit latency is observed at apply).
    pub(super) proposed_at: Instant,
}

/// The proposals in flight by log index. A leader proposes at rising
/// indexes and applies in log order, so this is a queue: insert at the
/// back, remove at the front (a `BTreeMap` allocated and rebalanced nodes
/// for every proposal). Any other order is still kept sorted, by a search.
#[derive(Debug, Default)]
pub(super) struct PendingProposals(VecDeque<(u64, Pending)>);

impl PendingProposals {
    /// Records the proposal at `index`, replacing one already there.
    pub(super) fn insert(&mut self, index: u64, pending: Pending) {
        match self.0.back() {
            Some((last, _)) if *last >= index => {
                match self.0.binary_search_by_key(&index, |(i, _)| *i) {
                    Ok(at) => self.0[at] = (index, pending),
                    Err(at) => self.0.insert(at, (index, pending)),
                }
            }
            _ => self.0.push_back((index, pending)),
        }
    }

    /// Takes the proposal at `index`, if any.
    pub(super) fn remove(&mut self, index: u64) -> Option<Pending> {
        match self.0.front() {
            Some((first, _)) if *first == index => self.0.pop_front().map(|(_, p)| p),
            Some((first, _)) if *first < index => {
                let at = self.0.binary_search_by_key(&index, |(i, _)| *i).ok()?;
                self.0.remove(at).map(|(_, p)| p)
            }
            _ => None,
        }
    }

    /// Proposals in flight.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

impl IntoIterator for PendingProposals {
    type Item = (u64, Pending);
    type IntoIter = std::collections::vec_deque::IntoIter<(u64, Pending)>;

    /// In index order.
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl ClusterNode {
    /// Processes every deadline at or before `now` (every input starts
    /// with it).
    pub(super) fn catch_up(&mut self, now: Instant) {
        self.raft.handle_timeout(now);
        self.scan_peers(now);
        self.time_out_handshakes(now);
        self.reports.handle_timeout(now);
        if let Some(leadership) = self.leadership.as_mut() {
            leadership.held_keys.expire(now);
        }
        self.time_out_waiters(now);
        self.add_established_learners(now);
        self.pump(now);
        self.serve_watches(now);
    }

    /// A client's input: Raft's messages wait for the first take of a
    /// peer connection, which the driver makes after the other inputs of
    /// its wake-up, so that their proposals leave in the same appends
    /// rather than one append per input. With no established peer link
    /// there is no take to wait for, and nothing waits.
    pub(super) fn defer_routing(&mut self, now: Instant) {
        if self.route_deferred_at.is_none() && self.conns.has_established_peer() {
            self.route_deferred_at = Some(now);
        }
    }

    /// Raft's messages are no longer held: the next drain routes them.
    pub(super) fn stop_holding(&mut self) {
        self.route_deferred_at = None;
        self.route_handed.clear();
    }

    /// Routes Raft's waiting messages if `conn_id` is a peer connection.
    pub(super) fn route_if_deferred(&mut self, conn_id: ConnId) {
        let Some(at) = self.route_deferred_at else {
            return;
        };
        if self
            .conns
            .by_id
            .get(&conn_id)
            .is_some_and(super::connections::carries_raft)
        {
            // The links the driver was handed for this take each take
            // their bytes anyway; a second wake would only make their
            // tasks run once more for nothing.
            let handed = std::mem::take(&mut self.route_handed);
            self.route_messages_waking(at, &handed);
            self.route_handed = handed; // its allocation, for the next hold
            self.stop_holding();
        }
    }

    /// Drains Raft and runs the leader's duties until nothing changes, then
    /// routes outgoing messages (or, while they are held, wakes the peer
    /// links whose take will route them).
    pub(super) fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(committed) = self.raft.poll_committed() {
                progressed = true;
                self.apply(now, committed);
            }
            while let Some(event) = self.raft.poll_event() {
                progressed = true;
                self.handle_event(now, event);
            }
            progressed |= self.leader_duties(now);
            if !progressed {
                break;
            }
        }
        // Force-releases whose keys nobody took now: answered without a
        // hand-over.
        for handover in std::mem::take(&mut self.handover_wanted) {
            self.answer_handover(handover, None);
        }
        // Raft's own event queue is bounded too: the state reached is
        // reported even if an event in between was dropped.
        self.note_role(now);
        self.events.note_raft_refused(self.raft.refused_messages());
        if self.route_deferred_at.is_some() {
            // Woken only for something to route: a woken link's task
            // costs the driver a turn even when it takes nothing.
            if self.raft.has_messages() {
                self.conns.wake_established_peers();
            }
        } else {
            self.route_messages(now);
        }
    }

    /// Queues a node event for each of leader and voter status that
    /// differs from what was last reported.
    pub(super) fn note_role(&mut self, now: Instant) {
        self.note_leader(now, self.raft.leader(), self.raft.term());
        self.events.note_voter(self.raft.is_voter());
    }

    /// Queues a node event if `leader` is not the leader last reported,
    /// and records the change among the recent events.
    fn note_leader(&mut self, now: Instant, leader: Option<NodeId>, term: u64) {
        if self.events.note_leader(leader, term) {
            self.reports
                .leader_changed(now, leader.map(|leader| leader.slot), term);
        }
    }

    /// Applies one committed snapshot or entry, then tells Raft the
    /// state's size in grants: what a snapshot of it costs, so what the
    /// snapshot threshold grows with (docs/cluster.md, "Snapshots").
    fn apply(&mut self, now: Instant, committed: Committed) {
        match committed {
            Committed::Snapshot { meta, data } => self.apply_snapshot(now, meta.index, &data),
            Committed::Entry(entry) => self.apply_entry(now, entry),
        }
        let grants = u64::try_from(self.state.grant_count()).unwrap_or(u64::MAX);
        self.raft.set_state_items(grants);
    }

    /// Replaces the applied state by the leader's snapshot covering the
    /// log up to `index`.
    fn apply_snapshot(&mut self, now: Instant, index: u64, data: &[u8]) {
        match self.state.install_snapshot(data, now) {
            Ok(()) => {}
            Err(SnapshotError::CounterBehind { current, snapshot }) => {
                self.reserve
                    .refused_lowering(TokenAlert::SnapshotCounterBehind { current, snapshot });
            }
            Err(_) => self.bad_snapshots += 1,
        }
        self.applied_index = index;
    }

    /// Applies one entry: to the replicated state, then to the leader's
    /// view of what it freed, then to the proposal it answers.
    fn apply_entry(&mut self, now: Instant, entry: Entry) {
        self.applied_index = entry.index;
        let command = match &entry.kind {
            EntryKind::Command(bytes) => Command::decode(bytes),
            _ => None,
        };
        // The keys of a force-released grant, read before it goes (of a
        // key held shared, the sharer it revokes).
        let forced_keys = match &command {
            Some(Command::ForceRelease { key, token }) => self
                .state
                .force_target(key, *token)
                .ok()
                .and_then(|revoked| self.state.grant(revoked))
                .map(|holding| holding.keys.clone()),
            _ => None,
        };
        let result = match &command {
            Some(command) => self.state.apply(command, now),
            None => ApplyResult::Noop,
        };
        let expired_with_waiters =
            self.leader_note_applied(command.as_ref(), result, forced_keys.as_ref());
        if let (ApplyResult::ForceReleased { revoked }, Some(keys)) = (result, &forced_keys) {
            // Every node that applies it says so: the revoked
            // holder's later writes are fenced.
            self.reports
                .force_released(now, keys.keys().to_vec(), revoked, None);
        }
        if let (true, Some(Command::Expire { keys, token, .. })) =
            (expired_with_waiters, command.as_ref())
        {
            self.reports
                .expired_with_waiters(now, keys.keys().to_vec(), *token, None);
        }
        let pending = self.take_applied_pending(now, &entry, forced_keys.as_ref());
        self.after_apply(now, entry.index, pending, result);
        if let Some(leadership) = self.leadership.as_mut()
            && !leadership.caught_up
            && self.applied_index >= leadership.first_index
            // Nothing is served before the counter is set: a recovering
            // leader waiting for evidence has applied its no-op but not
            // `Init`, and a Grant before it would only be refused.
            && self.state.is_initialised()
        {
            leadership.caught_up = true;
        }
    }

    /// On the leader: what an applied `command` (with its `result`) freed
    /// goes to the queue heads (counted as a hand-over when somebody
    /// waited), and the grant it ended leaves the per-connection held
    /// keys. `forced_keys`: the keys of the grant a force-release revoked.
    /// True for an expiry whose keys somebody waited for.
    fn leader_note_applied(
        &mut self,
        command: Option<&Command>,
        result: ApplyResult,
        forced_keys: Option<&KeyGroup>,
    ) -> bool {
        let Some(leadership) = self.leadership.as_mut() else {
            return false;
        };
        let mut expired_with_waiters = false;
        // A Release's keys are no longer releasing, whatever it did; what
        // each still has queued or reserved is read in the same look-up.
        let mut flags = [(false, false); SET_KEYS_MAX];
        if let Some(Command::Release { keys, .. }) = command {
            for (flag, key) in flags.iter_mut().zip(keys.keys()) {
                *flag = leadership
                    .keys
                    .update_existing(key, |q| {
                        q.releasing = false;
                        (!q.waiters.is_empty(), q.is_reserved())
                    })
                    .unwrap_or_default();
            }
        }
        let freed = match (command, result) {
            (Some(Command::Release { keys, .. }), ApplyResult::Released) => Some(keys),
            (Some(Command::Expire { keys, .. }), ApplyResult::Expired { existed: true }) => {
                Some(keys)
            }
            (Some(Command::ForceRelease { .. }), ApplyResult::ForceReleased { .. }) => forced_keys,
            _ => None,
        };
        if let (Some(keys), false) = (freed, matches!(command, Some(Command::Release { .. }))) {
            // Looked up here (a Release's were above).
            for (flag, key) in flags.iter_mut().zip(keys.keys()) {
                *flag = leadership
                    .keys
                    .get(key)
                    .map_or((false, false), |q| (!q.waiters.is_empty(), q.is_reserved()));
            }
        }
        if let Some(keys) = freed {
            let flags = &flags[..keys.len().min(SET_KEYS_MAX)];
            // A queue head waits, or already took the keys in a Grant
            // proposed right after this Release; of a key the grant held
            // shared, only once its last sharer left.
            let waited_for = flags
                .iter()
                .zip(keys.keys())
                .any(|((waiting, reserved), key)| {
                    (*waiting || *reserved) && !self.state.is_held(key)
                });
            match (command, waited_for) {
                (Some(Command::Expire { .. }), true) => {
                    self.counts.expiries_handed_over += 1;
                    expired_with_waiters = true;
                }
                (Some(Command::Expire { .. }), false) => {
                    self.counts.expiries_not_handed_over += 1;
                }
                (Some(Command::Release { .. } | Command::ForceRelease { .. }), true) => {
                    self.counts.release_handovers += 1;
                }
                _ => {}
            }
            // Freed keys go to their queue heads, but for those a Grant
            // proposed behind this entry already took: its apply dirties
            // them if they stay free.
            leadership.dirty.extend(
                keys.keys()
                    .iter()
                    .zip(flags)
                    .filter(|(_, (_, reserved))| !reserved)
                    .map(|(key, _)| key.clone()),
            );
        }
        if let Some(Command::Expire { token, .. }) = command {
            leadership.expiring.remove(token);
        }
        if let (Some(Command::Downgrade { keys, .. }), ApplyResult::Downgraded) = (command, result)
        {
            // Its keys are held shared now: the shared requests at their
            // queues' heads may join (a writer still waits).
            leadership.dirty.extend(keys.keys().iter().cloned());
        }
        // What the holders that asked for pushes hear: a release by the
        // holder, nothing; an expiry or a revocation, that it is lost.
        let lost = match (command, result) {
            (Some(Command::Release { token, .. }), ApplyResult::Released) => {
                leadership.watches.forget(*token);
                None
            }
            (Some(Command::Expire { token, .. }), ApplyResult::Expired { existed: true }) => {
                Some((*token, PushKind::Expired))
            }
            (_, ApplyResult::ForceReleased { revoked }) => Some((revoked, PushKind::ForceReleased)),
            _ => None,
        };
        if let Some((token, kind)) = lost
            && let Some(watch) = leadership.watches.forget(token)
        {
            self.pushes_due.push((watch.conn, token, kind));
        }
        match (command, result) {
            (Some(Command::Release { token, .. }), ApplyResult::Released)
            | (Some(Command::Expire { token, .. }), _) => {
                leadership.held_keys.remove(*token);
            }
            (_, ApplyResult::ForceReleased { revoked }) => {
                leadership.held_keys.remove(revoked);
            }
            _ => {}
        }
        expired_with_waiters
    }

    /// The proposal `entry` answers, if this node proposed exactly it
    /// (same index and term; its commit latency is observed). One whose
    /// entry another leader's replaced is answered as without effect. A
    /// force-release's keys become those of the grant revoked at apply
    /// (`forced_keys`), whatever held when it was proposed.
    fn take_applied_pending(
        &mut self,
        now: Instant,
        entry: &Entry,
        forced_keys: Option<&KeyGroup>,
    ) -> Option<Pending> {
        let mut pending = match self.pending.remove(entry.index) {
            Some(p) if p.term == entry.term => {
                let latency = now.saturating_duration_since(p.proposed_at);
                self.counts.commit_latency.observe(latency);
                Some(p)
            }
            Some(p) => {
                // Overwritten: that proposal never takes effect.
                self.answer_unapplied(entry.index, p);
                None
            }
            None => None,
        };
        if let (
            Some(Pending {
                kind: PendingKind::ForceRelease { keys, .. },
                ..
            }),
            Some(forced),
        ) = (pending.as_mut(), forced_keys)
        {
            *keys = forced.keys().to_vec();
        }
        pending
    }

    /// A proposal whose entry was replaced by another leader's: no effect.
    fn answer_unapplied(&mut self, index: u64, pending: Pending) {
        if let Some(handover) = self.handovers.remove(&index) {
            // The force-release itself was applied; its hand-over was not.
            self.answer_handover(handover, None);
        }
        let leader = self.raft.leader();
        match pending.kind {
            PendingKind::Grant(w) => self.answer(w.conn, &w.reply_to, leader_reply(leader)),
            PendingKind::Release { conn, reply_to } | PendingKind::Downgrade { conn, reply_to } => {
                self.answer(conn, &reply_to, leader_reply(leader));
            }
            PendingKind::Extend {
                conn,
                reply_to,
                token,
            } => {
                self.extension_done(token);
                self.answer(conn, &reply_to, leader_reply(leader));
            }
            PendingKind::ForceRelease { id, .. } => {
                // Another leader's entry took its place: no effect.
                let leader_slot = leader.map(|l| l.slot);
                self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            }
            PendingKind::Init | PendingKind::Internal => {}
        }
    }

    fn after_apply(
        &mut self,
        now: Instant,
        index: u64,
        pending: Option<Pending>,
        result: ApplyResult,
    ) {
        // Whatever was applied, held keys may have been freed.
        let Some(pending) = pending else {
            return;
        };
        match pending.kind {
            PendingKind::Grant(waiter) => {
                let granted = matches!(result, ApplyResult::Granted { .. });
                self.note_grant_applied(&waiter, granted);
                self.deliver_grant(now, waiter, result);
                if let Some(handover) = self.handovers.remove(&index) {
                    let token = match result {
                        ApplyResult::Granted { token } => Some(token),
                        _ => None,
                    };
                    self.answer_handover(handover, token);
                }
            }
            PendingKind::Release { conn, reply_to } => {
                self.count_release_miss(now, conn, &result);
                let answer = match result {
                    ApplyResult::Released => Answer::Released,
                    ApplyResult::GroupMismatch => Answer::GroupMismatch,
                    _ => Answer::NotFound,
                };
                self.answer(conn, &reply_to, answer);
                self.close_if_sweeping(now, conn);
            }
            PendingKind::Extend {
                conn,
                reply_to,
                token,
            } => {
                self.extension_done(token);
                let answer = self.extension_answer(now, conn, token, result);
                self.answer(conn, &reply_to, answer);
            }
            PendingKind::Downgrade { conn, reply_to } => {
                let answer = match result {
                    ApplyResult::Downgraded => Answer::Downgraded,
                    ApplyResult::GroupMismatch => Answer::GroupMismatch,
                    _ => Answer::NotFound,
                };
                self.answer(conn, &reply_to, answer);
            }
            PendingKind::ForceRelease { id, keys } => {
                let outcome = match result {
                    ApplyResult::ForceReleased { revoked } => {
                        // The hand-over is a Grant proposed after this
                        // apply: the answer waits to name its token (or
                        // goes out when the pump ends without one).
                        let handover = Handover { id, revoked, keys };
                        if self.leadership.is_some() {
                            self.handover_wanted.push(handover);
                        } else {
                            self.answer_handover(handover, None);
                        }
                        return;
                    }
                    ApplyResult::ForceTokenMismatch { held } => {
                        ForceReleaseOutcome::TokenMismatch { held }
                    }
                    _ => ForceReleaseOutcome::NotHeld,
                };
                self.admin_reply(id, outcome);
            }
            PendingKind::Init | PendingKind::Internal => {}
        }
    }

    fn deliver_grant(&mut self, now: Instant, waiter: Waiter, result: ApplyResult) {
        let ApplyResult::Granted { token } = result else {
            // Defensive (a grant never reaches a held key once caught up):
            // a definite "not acquired".
            self.answer(waiter.conn, &waiter.reply_to, Answer::TimedOut);
            return;
        };
        let open = matches!(
            self.conns.by_id.get(&waiter.conn),
            Some(Conn {
                kind: ConnKind::Client(_),
                out,
                ..
            }) if !out.is_closing()
        );
        if !open {
            // Nobody will learn this token: release it at once rather than
            // leave the keys blocked until the lease ends (docs/cluster.md,
            // "How a grant flows", step 7).
            self.propose_internal(
                now,
                Command::Release {
                    keys: waiter.keys,
                    token,
                },
            );
            return;
        }
        // A permit grant is answered with its slots (`permits`).
        let answer = self.granted_answer(token);
        self.answer(waiter.conn, &waiter.reply_to, answer);
        let waited = now.saturating_duration_since(waiter.received);
        self.counts.wait.observe(waited);
        let pushed = matches!(
            self.conns.by_id.get(&waiter.conn),
            Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) if client.front.capabilities().contains(Capabilities::PUSH)
        );
        if let Some(leadership) = self.leadership.as_mut() {
            let lease = Duration::from_millis(u64::from(waiter.lease_ms));
            if pushed && let Some(key) = waiter.keys.keys().first() {
                leadership.watches.watch(
                    token,
                    Watch {
                        conn: waiter.conn,
                        key: key.clone(),
                        lease,
                        deadline: now.saturating_add(lease),
                        warned: false,
                        cap_at: None,
                    },
                );
            }
            leadership.held_keys.add(
                waiter.conn,
                token,
                waiter.keys.len(),
                now.saturating_add(lease),
            );
        }
        if let Some(Conn {
            kind: ConnKind::Client(_),
            out,
            ..
        }) = self.conns.by_id.get_mut(&waiter.conn)
        {
            // The reply was just queued: its frame ends at the stream's end.
            out.record_grant(token, waiter.keys);
        }
    }

    /// Tells the holders whose watches are due at `now` that their lease
    /// is ending (or watches the renewed lease); a watch whose lease ended
    /// is kept until its `Expire` applies, which tells the loss.
    pub(super) fn serve_watches(&mut self, now: Instant) {
        for (conn, token, kind) in std::mem::take(&mut self.pushes_due) {
            self.push(conn, token, kind, 0);
        }
        loop {
            let Some(leadership) = self.leadership.as_mut() else {
                return;
            };
            let Some((token, mut watch)) = leadership.watches.next_due(now) else {
                return;
            };
            let Some(holding) = self.state.grant(token) else {
                // Gone without a release, expiry or revocation applied
                // here (a snapshot installed): nothing to say.
                continue;
            };
            if holding.deadline != watch.deadline {
                watch.lease = holding.deadline.saturating_duration_since(now);
                watch.deadline = holding.deadline;
                watch.warned = false;
                leadership.watches.watch(token, watch);
            } else if watch.warned || holding.deadline <= now {
                leadership.watches.keep(token, watch);
            } else {
                let left = holding.deadline.saturating_duration_since(now);
                watch.warned = true;
                let conn = watch.conn;
                leadership.watches.watch(token, watch);
                let ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
                self.push(conn, token, PushKind::LeaseEnding, ms);
            }
        }
    }

    /// Queues a push about `token` for client `conn`.
    fn push(&mut self, conn_id: ConnId, token: u64, kind: PushKind, lease_ms: u32) {
        let Some(Conn {
            kind: ConnKind::Client(_),
            out,
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        else {
            return;
        };
        if out.is_closing() {
            return;
        }
        Reply::Push {
            token,
            kind,
            lease_ms,
        }
        .encode(out.buffer_mut());
        self.pushes.count(kind);
        self.conns.wakes.wake(conn_id, out);
    }

    /// An `Extend` of `token` applied or was dropped: its expiry need not
    /// wait for it any more.
    fn extension_done(&mut self, token: u64) {
        if let Some(leadership) = self.leadership.as_mut()
            && let Some(count) = leadership.extending.get_mut(&token)
        {
            *count -= 1;
            if *count == 0 {
                leadership.extending.remove(&token);
            }
        }
    }

    /// What an applied `Extend` of `token` from `conn` tells its client,
    /// the lease left counted on this node's clock; a renewed lease also
    /// moves the holder connection's count of held keys.
    ///
    /// The holder's connection is the one this leader delivered the grant
    /// to while that one is open; otherwise (an earlier leader delivered
    /// it, or its connection closed and the client came back on another)
    /// the renewing connection becomes it: it knows the token and keeps
    /// the grant alive, so `O` names the holder connected and inspection
    /// shows its connection, its keys count against its budget, and, if it
    /// negotiated pushes, it hears of the renewed lease ending and of the
    /// grant's loss from this leader.
    fn extension_answer(
        &mut self,
        now: Instant,
        conn: ConnId,
        token: u64,
        result: ApplyResult,
    ) -> Answer {
        let ApplyResult::Extension { outcome } = result else {
            return Answer::NotFound;
        };
        let delivered_to = self
            .leadership
            .as_ref()
            .and_then(|leadership| leadership.held_keys.conn_of(token))
            .filter(|&delivered| self.is_open_client(delivered));
        let holder = delivered_to.unwrap_or(conn);
        let holder_hears_pushes = matches!(
            self.conns.by_id.get(&holder),
            Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) if client.front.capabilities().contains(Capabilities::PUSH)
        );
        if let (Some(expires_at), Some(leadership), Some(holding)) = (
            outcome.expires_at(),
            self.leadership.as_mut(),
            self.state.grant(token),
        ) {
            leadership
                .held_keys
                .add(holder, token, holding.keys.len(), expires_at);
            let lease = expires_at.saturating_duration_since(now);
            // The renewed lease is watched for the holder's connection; a
            // grant this leader did not watch yet (an earlier leader's, or
            // one whose connection closed) is watched from its renewal on
            // when the renewing connection takes pushes, so it hears of
            // its lease ending and of its loss from this leader too.
            // Pushes only ever go to a connection that negotiated them.
            let watch = match leadership.watches.forget(token) {
                Some(watch) if watch.conn == holder => Some(Watch {
                    lease,
                    deadline: expires_at,
                    warned: false,
                    ..watch
                }),
                previous if holder_hears_pushes => holding.keys.keys().first().map(|key| Watch {
                    conn: holder,
                    key: key.clone(),
                    lease,
                    deadline: expires_at,
                    warned: false,
                    cap_at: previous.and_then(|watch| watch.cap_at),
                }),
                _ => None,
            };
            if let Some(watch) = watch {
                leadership.watches.watch(token, watch);
            }
        }
        let lease_end = self
            .state
            .grant(token)
            .map_or(now, |holding| holding.deadline);
        Answer::of_extension(outcome, now, lease_end)
    }

    fn handle_event(&mut self, now: Instant, event: Event) {
        match event {
            Event::BecameLeader { term } => {
                self.note_leader(now, Some(self.config.id), term);
                self.state.rebuild_deadlines();
                self.leadership = Some(Leadership {
                    // The no-op of this term is the last entry now.
                    first_index: self.raft.last_index(),
                    ..Leadership::default()
                });
                self.announce_leader();
            }
            Event::SteppedDown { .. } => self.step_down(),
            Event::LeaderChanged { leader, term } => {
                self.note_leader(now, leader, term);
                self.announce_leader();
            }
            Event::ConfigChanged { .. } => self.events.note_voter(self.raft.is_voter()),
            Event::SnapshotWanted { .. } => {
                let _ = self.raft.compact(self.state.snapshot(now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pending, PendingKind, PendingProposals};
    use crate::time::Instant;

    fn internal(term: u64) -> Pending {
        Pending {
            term,
            kind: PendingKind::Internal,
            proposed_at: Instant::ZERO,
        }
    }

    fn indexes(pending: PendingProposals) -> Vec<(u64, u64)> {
        pending.into_iter().map(|(i, p)| (i, p.term)).collect()
    }

    #[test]
    fn proposals_in_flight_stay_sorted_by_index_whatever_the_order() {
        let mut pending = PendingProposals::default();
        for index in [5, 7, 6, 2] {
            pending.insert(index, internal(1));
        }
        // A second proposal at an index replaces the first.
        pending.insert(6, internal(2));
        assert_eq!(pending.len(), 4);
        assert_eq!(indexes(pending), vec![(2, 1), (5, 1), (6, 2), (7, 1)]);
    }

    #[test]
    fn proposals_in_flight_are_taken_by_index_only() {
        let mut pending = PendingProposals::default();
        for index in [3, 4, 6] {
            pending.insert(index, internal(index));
        }
        assert!(pending.remove(2).is_none(), "below the first");
        assert!(pending.remove(5).is_none(), "a gap");
        assert_eq!(pending.remove(4).map(|p| p.term), Some(4), "not the front");
        assert_eq!(pending.remove(3).map(|p| p.term), Some(3), "the front");
        assert!(pending.remove(3).is_none(), "taken once");
        assert_eq!(indexes(pending), vec![(6, 6)]);
    }
}
