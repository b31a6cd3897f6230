//! The leader-only state ([`Leadership`]) and the work done with it:
//! serving acquires (granted at once when free, else queued FIFO per key)
//! and releases, handing freed keys to queue heads, wait timeouts, lease
//! expiry on the leader's clock, and what happens to all of it on stepping
//! down. Waiters are not replicated: none of this survives a change of
//! leader, which is why it lives apart from the node's replicated state.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};

use crate::budget::{AbuseKind, HeldKeys};
use crate::cluster::command::{Command, GrantOptions};
use crate::cluster::recovery;
use crate::conn::ConnId;
use crate::conn::client::{Answer, ClientRequest, HoldAsk, ReplyTo};
use crate::conn::pushes::Watches;
use crate::hash::IdMap;
use crate::inspect::{AdminRequestId, ForceReleaseOutcome};
use crate::queue_rule;
use crate::raft::{NodeId, ProposeError};
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup};

use super::ClusterNode;
use super::apply::{Pending, PendingKind};
use super::connections::{Conn, ConnKind};
use super::keys::LeaderKeys;
use super::permits::LeaderSemaphores;
use super::shared::{head_grantable, newcomer_takes};

/// How soon an `Expire` that could not be proposed is retried; also the
/// longest the leader lets an expired lease go unnoticed (docs/cluster.md,
/// "Expiry": checked at least every 100 ms).
const EXPIRE_RETRY: Duration = Duration::from_millis(100);

/// A queued or proposed acquire.
#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) conn: ConnId,
    pub(super) reply_to: ReplyTo,
    pub(super) keys: KeyGroup,
    pub(super) lease_ms: u32,
    /// The cap on its total hold, carried in the Grant (`None`: a client
    /// that cannot renew).
    pub(super) max_hold_ms: Option<u32>,
    /// What the grant is beyond its keys: which keys are wanted shared
    /// (bit `i` of `shared_modes` for key `i`; none for every acquire but
    /// `Y`) and, for a permit grant, its semaphore's capacity. The label
    /// is the connection's, read when the Grant is proposed.
    pub(super) options: GrantOptions,
    /// When it gets `T` if still queued.
    pub(super) deadline: Instant,
    /// When the acquire arrived (the wait-time observation starts here).
    pub(super) received: Instant,
}

/// Leader-only state, dropped on stepping down.
#[derive(Debug, Default)]
pub(super) struct Leadership {
    /// Index of this term's no-op: nothing is served until it is applied.
    pub(super) first_index: u64,
    /// Its own no-op is applied and the token counter is set: it serves.
    pub(super) caught_up: bool,
    /// This leader proposed the domain's `Init`.
    pub(super) init_proposed: bool,
    /// Queued waiters by arrival sequence number (unordered: what answers
    /// them all sorts them, see [`Leadership::waiters_in_order`]).
    pub(super) waiters: IdMap<u64, Waiter>,
    /// Each key's waiters (sequence numbers, FIFO), whether a Grant in
    /// flight reserves it and whether its holder's Release is in flight.
    pub(super) keys: LeaderKeys,
    /// Queued waiters' deadlines, earliest first (those already gone are
    /// skipped when due).
    pub(super) wait_deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Tokens with an `Expire` in flight.
    pub(super) expiring: HashSet<u64>,
    /// Tokens with an `Extend` in flight, with how many: their expiry waits
    /// until the last applies, so that an `Expire` committed just behind an
    /// `Extend` never ends a lease its holder was told was renewed.
    pub(super) extending: HashMap<u64, u32>,
    /// Keys whose queue head may have become grantable.
    pub(super) dirty: Vec<Key>,
    /// Keys whose queue head was grantable but for the token reserve;
    /// dirty again once the reserve grows.
    pub(super) reserve_stalled: BTreeSet<Key>,
    /// Requests received before catching up, served in order after.
    pub(super) held: VecDeque<(ConnId, ClientRequest, Instant)>,
    /// Keys held by the grants this leader delivered, per connection.
    pub(super) held_keys: HeldKeys,
    /// The grants this leader delivered to connections that asked for
    /// pushes: when each holder hears its lease is ending (its loss is
    /// pushed when the `Expire` or force-release applies).
    pub(super) watches: Watches,
    /// Semaphores: permit waiters FIFO per name, and capacities in use.
    pub(super) semaphores: LeaderSemaphores,
}

impl Leadership {
    /// Takes every queued waiter, in arrival order.
    pub(super) fn waiters_in_order(&mut self) -> Vec<Waiter> {
        let mut waiters: Vec<(u64, Waiter)> =
            std::mem::take(&mut self.waiters).into_iter().collect();
        waiters.sort_unstable_by_key(|(seq, _)| *seq);
        waiters.into_iter().map(|(_, waiter)| waiter).collect()
    }
}

/// A force-release that revoked `revoked` on `keys`, waiting to name the
/// token its hand-over got.
#[derive(Debug)]
pub(super) struct Handover {
    pub(super) id: AdminRequestId,
    pub(super) revoked: u64,
    pub(super) keys: Vec<Key>,
}

/// "Not the leader, no effect": `M` with the known leader, else no leader.
pub(super) fn leader_reply(leader: Option<NodeId>) -> Answer {
    Answer::NotLeader(leader.map(|leader| leader.slot))
}

impl ClusterNode {
    /// Proposes `command`, encoded in the node's buffer: the entry's bytes
    /// are its one allocation.
    pub(super) fn propose_command(
        &mut self,
        now: Instant,
        command: &Command,
    ) -> Result<(u64, u64), ProposeError> {
        self.encode_buf.clear();
        command.encode(&mut self.encode_buf);
        self.raft.propose(now, self.encode_buf.as_slice())
    }

    fn not_serving_reply(&self) -> Option<Answer> {
        if self.shutting_down || !self.raft.is_voter() {
            return Some(Answer::NotActive);
        }
        if !self.raft.is_leader() {
            return Some(leader_reply(self.raft.leader()));
        }
        None
    }

    pub(super) fn handle_request(&mut self, now: Instant, conn_id: ConnId, request: ClientRequest) {
        if let Some(answer) = self.not_serving_reply() {
            self.answer(conn_id, request.reply_to(), answer);
            return;
        }
        let Some(leadership) = self.leadership.as_mut() else {
            self.answer(conn_id, request.reply_to(), leader_reply(None));
            return;
        };
        if !leadership.caught_up {
            if leadership.held.len() >= self.config.limits.waiters_total_max {
                let answer = if request.is_acquire() {
                    self.counts.busy.waiters_total_max += 1;
                    Answer::Busy
                } else {
                    // `B` may not answer a release.
                    leader_reply(None)
                };
                self.answer(conn_id, request.reply_to(), answer);
            } else {
                leadership.held.push_back((conn_id, request, now));
            }
            return;
        }
        self.serve_request(now, conn_id, request, now);
    }

    fn serve_request(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        request: ClientRequest,
        received: Instant,
    ) {
        match request {
            ClientRequest::Acquire {
                wait_s,
                lease_s,
                keys,
                hold,
                reply_to,
            } => {
                let acquire = (wait_s, lease_s, keys, reply_to);
                self.handle_acquire(now, conn_id, acquire, (hold, 0), received);
            }
            ClientRequest::AcquireShared {
                wait_s,
                lease_s,
                modes,
                keys,
                hold,
                reply_to,
            } => {
                let acquire = (wait_s, lease_s, keys, reply_to);
                self.handle_acquire(now, conn_id, acquire, (hold, modes), received);
            }
            ClientRequest::Downgrade {
                token,
                keys,
                reply_to,
            } => self.handle_downgrade(now, conn_id, (token, keys), reply_to),
            ClientRequest::Release {
                token,
                keys,
                reply_to,
            } => self.handle_release(now, conn_id, token, keys, reply_to),
            ClientRequest::Extend {
                token,
                lease_s,
                keys,
                reply_to,
            } => self.handle_extend(now, conn_id, (token, lease_s), &keys, reply_to),
            ClientRequest::AcquirePermits {
                request,
                hold,
                reply_to,
            } => {
                let max_hold_ms = self.hold_cap_ms(hold);
                let permits = (request, max_hold_ms, reply_to);
                self.handle_permits(now, conn_id, permits, received);
            }
            ClientRequest::Observe { name, reply_to } => {
                let observed = self.observe(now, &name);
                self.answer(conn_id, &reply_to, Answer::Observed(observed));
            }
        }
    }

    fn handle_release(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        token: u64,
        keys: KeyGroup,
        reply_to: ReplyTo,
    ) {
        if reply_to.is_unissued_line_release(token, self.state.next_token()) {
            let source = self.conns.by_id.get(&conn_id).and_then(|conn| conn.source);
            self.reports
                .abuse(now, source, AbuseKind::TokenFromTheFuture);
        }
        // The holder gives up exactly what it holds: the Release will apply.
        let hands_over = self.state.grant(token).is_some_and(|h| h.keys == keys);
        let command = Command::Release { keys, token };
        match self.propose_command(now, &command) {
            Ok((index, term)) => {
                if let (true, Command::Release { keys, .. }) = (hands_over, &command) {
                    self.mark_releasing(token, keys);
                }
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Release {
                            conn: conn_id,
                            reply_to,
                        },
                    },
                );
            }
            // `B` may not answer a release; every refusal had no effect.
            Err(ProposeError::NotLeader { leader_hint }) => {
                self.answer(conn_id, &reply_to, leader_reply(leader_hint));
            }
            Err(_) => self.answer(conn_id, &reply_to, leader_reply(None)),
        }
    }

    /// The cap on total hold, in ms, of an acquire that asked for `hold`.
    fn hold_cap_ms(&self, hold: HoldAsk) -> Option<u32> {
        let cap = match hold {
            HoldAsk::Uncapped => return None,
            HoldAsk::Default => self.config.hold_caps.cap_for(None),
            HoldAsk::Asked(s) => {
                let asked = Duration::from_secs(u64::from(s));
                self.config.hold_caps.cap_for(Some(asked))
            }
        };
        Some(u32::try_from(cap.as_millis()).unwrap_or(u32::MAX))
    }

    /// A renewal by token: `N` at once when the token is not the current
    /// grant of exactly `keys` in the applied state (a token never becomes
    /// current again) or its lease already ended on this leader's clock
    /// (its `Expire` is proposed); else an `Extend` is proposed and answered
    /// once applied, each node re-timing the lease from its own apply.
    fn handle_extend(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        (token, lease_s): (u64, u8),
        keys: &KeyGroup,
        reply_to: ReplyTo,
    ) {
        let current = self.state.grant(token).is_some_and(|h| &h.keys == keys);
        let Some(leadership) = self.leadership.as_ref() else {
            self.answer(conn_id, &reply_to, leader_reply(self.raft.leader()));
            return;
        };
        if !current || leadership.expiring.contains(&token) {
            self.answer(conn_id, &reply_to, Answer::NotFound);
            return;
        }
        let command = Command::Extend {
            token,
            lease_ms: u32::from(lease_s) * 1_000,
        };
        let proposed =
            self.propose_answered(now, &command, (conn_id, reply_to), |conn, reply_to| {
                PendingKind::Extend {
                    conn,
                    reply_to,
                    token,
                }
            });
        if proposed && let Some(leadership) = self.leadership.as_mut() {
            *leadership.extending.entry(token).or_default() += 1;
        }
    }

    /// Proposes `command` for a client's request that is answered once it
    /// applies (`kind` names the proposal); a refusal had no effect and is
    /// answered here, `M` or `E 4` (never `B`). True when proposed.
    pub(super) fn propose_answered(
        &mut self,
        now: Instant,
        command: &Command,
        (conn_id, reply_to): (ConnId, ReplyTo),
        kind: impl FnOnce(ConnId, ReplyTo) -> PendingKind,
    ) -> bool {
        match self.propose_command(now, command) {
            Ok((index, term)) => {
                let kind = kind(conn_id, reply_to);
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind,
                    },
                );
                true
            }
            Err(ProposeError::NotLeader { leader_hint }) => {
                self.answer(conn_id, &reply_to, leader_reply(leader_hint));
                false
            }
            Err(_) => {
                self.answer(conn_id, &reply_to, leader_reply(None));
                false
            }
        }
    }

    /// An acquire on the caught-up leader, received at `received`, with
    /// its cap and modes: `B` over a per-connection limit, a Grant proposed
    /// at once when its keys take it, `T` when it may not wait, else queued
    /// FIFO behind its keys.
    fn handle_acquire(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        acquire: (u8, u8, KeyGroup, ReplyTo),
        (hold, modes): (HoldAsk, u16),
        received: Instant,
    ) {
        let max_hold_ms = self.hold_cap_ms(hold);
        let (wait_s, lease_s, keys, reply_to) = acquire;
        let Some(over_connection_limit) = self.over_connection_limit(now, conn_id, keys.len())
        else {
            return;
        };
        let Some(leadership) = self.leadership.as_ref() else {
            self.answer(conn_id, &reply_to, leader_reply(self.raft.leader()));
            return;
        };
        let free = newcomer_takes(&self.state, &leadership.keys, &keys, modes);
        let waiter = Waiter {
            conn: conn_id,
            reply_to,
            keys,
            lease_ms: u32::from(lease_s) * 1_000,
            max_hold_ms,
            options: GrantOptions {
                shared_modes: modes,
                ..GrantOptions::default()
            },
            deadline: queue_rule::wait_deadline(
                received,
                Duration::from_secs(u64::from(wait_s)),
                self.config.wait_margin,
            ),
            received,
        };
        if over_connection_limit {
            self.counts.busy_per_connection += 1;
            self.answer(conn_id, &waiter.reply_to, Answer::Busy);
            return;
        }
        if free {
            self.grant_at_once(now, waiter);
            return;
        }
        if wait_s == 0 || waiter.deadline <= now {
            self.answer(conn_id, &waiter.reply_to, Answer::TimedOut);
            return;
        }
        self.enqueue_waiter(waiter);
    }

    /// Whether client connection `conn_id` would be over its in-flight
    /// limit, or with `new_keys` more over its held-key limit (the held
    /// keys whose lease ended are forgotten first); `None` when it is not a
    /// client connection.
    pub(super) fn over_connection_limit(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        new_keys: usize,
    ) -> Option<bool> {
        let over_in_flight = match self.conns.by_id.get(&conn_id) {
            Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) => client.in_flight > self.config.in_flight_per_connection_max,
            _ => return None,
        };
        let over_held = match self.leadership.as_mut() {
            Some(leadership) => {
                leadership.held_keys.expire(now);
                leadership.held_keys.held(conn_id).saturating_add(new_keys)
                    > self.config.budget.held_per_connection_max
            }
            None => false,
        };
        Some(over_in_flight || over_held)
    }

    /// Proposes a Grant for `waiter`, whose keys are free: `B` instead when
    /// the token reserve does not cover it or the key limit is reached.
    pub(super) fn grant_at_once(&mut self, now: Instant, waiter: Waiter) {
        let new_keys = waiter.keys.len();
        let bound = self.next_grant_token_bound();
        if !self.reserve.covers(bound) {
            self.reserve.note_exhausted(bound);
            self.counts.busy.token_reserve += 1;
            self.answer(waiter.conn, &waiter.reply_to, Answer::Busy);
            return;
        }
        if self.state.key_holds() + new_keys > self.config.limits.keys_max {
            self.counts.busy.keys_max += 1;
            self.answer(waiter.conn, &waiter.reply_to, Answer::Busy);
            return;
        }
        self.propose_grant(now, waiter);
    }

    /// Queues `waiter` FIFO behind each of its keys, with its wait
    /// deadline: `B` instead over the total or per-key waiter limit.
    fn enqueue_waiter(&mut self, waiter: Waiter) {
        let limits = self.config.limits;
        let Some(leadership) = self.leadership.as_ref() else {
            return;
        };
        let over_total = leadership.waiters.len() >= limits.waiters_total_max;
        let over_per_key = waiter.keys.keys().iter().any(|k| {
            leadership.keys.get(k).map_or(0, |q| q.waiters.len()) >= limits.waiters_per_key_max
        });
        if over_total || over_per_key {
            if over_total {
                self.counts.busy.waiters_total_max += 1;
            } else {
                self.counts.busy.waiters_per_key_max += 1;
            }
            self.answer(waiter.conn, &waiter.reply_to, Answer::Busy);
            return;
        }
        let seq = self.next_waiter_seq;
        self.next_waiter_seq += 1;
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        for key in waiter.keys.keys() {
            leadership.keys.update(key, |q| q.waiters.push_back(seq));
        }
        leadership
            .wait_deadlines
            .push(Reverse((waiter.deadline, seq)));
        let conn_id = waiter.conn;
        leadership.waiters.insert(seq, waiter);
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        {
            client.queued.insert(seq);
        }
    }

    /// Proposes a Grant for `waiter` (keys free and unreserved); the
    /// entry's index if it was proposed.
    pub(super) fn propose_grant(&mut self, now: Instant, waiter: Waiter) -> Option<u64> {
        let command = Command::Grant {
            keys: waiter.keys.clone(),
            lease_ms: waiter.lease_ms,
            max_hold_ms: waiter.max_hold_ms,
            // The holder's label, beside what the waiter asked for (its
            // modes, a permit grant's capacity).
            options: GrantOptions {
                label: self.holder_label(waiter.conn),
                ..waiter.options
            },
        };
        match self.propose_command(now, &command) {
            Ok((index, term)) => {
                self.note_grant_proposed(&waiter);
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Grant(waiter),
                    },
                );
                return Some(index);
            }
            Err(ProposeError::Backpressure) => {
                self.counts.busy_backpressure += 1;
                self.answer(waiter.conn, &waiter.reply_to, Answer::Busy);
            }
            Err(ProposeError::NotLeader { leader_hint }) => {
                self.answer(waiter.conn, &waiter.reply_to, leader_reply(leader_hint));
            }
            Err(_) => self.answer(waiter.conn, &waiter.reply_to, leader_reply(None)),
        }
        None
    }

    /// Proposes a command nobody waits for (expiry, ghost release).
    pub(super) fn propose_internal(&mut self, now: Instant, command: Command) -> bool {
        if !self.raft.is_leader() {
            return false;
        }
        match self.propose_command(now, &command) {
            Ok((index, term)) => {
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Internal,
                    },
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Removes a queued waiter from the leader's table (no reply); the
    /// next waiter on each of its keys is looked at again.
    pub(super) fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        self.dequeue_waiter(seq, true)
    }

    /// Removes a queued waiter; with `dirty_next` the keys it leaves to a
    /// next waiter become dirty. Not when its Grant is proposed next: those
    /// keys are reserved until it applies, which dirties them if they
    /// stayed free (see `after_apply`).
    fn dequeue_waiter(&mut self, seq: u64, dirty_next: bool) -> Option<Waiter> {
        let leadership = self.leadership.as_mut()?;
        let waiter = leadership.waiters.remove(&seq)?;
        for key in waiter.keys.keys() {
            let left = leadership.keys.update_existing(key, |q| {
                let queue = &mut q.waiters;
                // The head, when served (a timeout or a close may take any).
                if queue.front() == Some(&seq) {
                    queue.pop_front();
                } else {
                    queue.retain(|s| *s != seq);
                }
                !queue.is_empty()
            });
            if left == Some(true) && dirty_next {
                leadership.dirty.push(key.clone());
            }
        }
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.by_id.get_mut(&waiter.conn)
        {
            client.queued.remove(&seq);
        }
        Some(waiter)
    }

    /// A force-release's answer without a hand-over token: nobody took
    /// its keys in this pump, or the hand-over's outcome will not be seen.
    pub(super) fn answer_handover(&mut self, handover: Handover, handed_to: Option<u64>) {
        let Handover { id, revoked, keys } = handover;
        self.admin_reply(
            id,
            ForceReleaseOutcome::Released {
                revoked,
                keys,
                handed_to,
            },
        );
    }

    /// Leadership lost: proposed requests get `I` (they may still commit),
    /// queued and held ones `M`/`E 4` (they had no effect).
    pub(super) fn step_down(&mut self) {
        // Applied force-releases whose hand-over will not be seen.
        let handovers = std::mem::take(&mut self.handovers);
        for handover in handovers.into_values() {
            self.answer_handover(handover, None);
        }
        for handover in std::mem::take(&mut self.handover_wanted) {
            self.answer_handover(handover, None);
        }
        let leader = self.raft.leader();
        let pending = std::mem::take(&mut self.pending);
        for (_, p) in pending {
            match p.kind {
                PendingKind::Grant(w) => self.answer(w.conn, &w.reply_to, Answer::Indeterminate),
                // It may still commit under the next leader: the client's
                // next renewal by the same token tells it where it stands.
                PendingKind::Release { conn, reply_to }
                | PendingKind::Downgrade { conn, reply_to }
                | PendingKind::Extend { conn, reply_to, .. } => {
                    self.answer(conn, &reply_to, Answer::Indeterminate);
                }
                // It may still commit under the next leader.
                PendingKind::ForceRelease { id, .. } => {
                    self.admin_reply(id, ForceReleaseOutcome::Indeterminate);
                }
                PendingKind::Init | PendingKind::Internal => {}
            }
        }
        if let Some(mut leadership) = self.leadership.take() {
            for waiter in leadership.waiters_in_order() {
                if let Some(Conn {
                    kind: ConnKind::Client(client),
                    ..
                }) = self.conns.by_id.get_mut(&waiter.conn)
                {
                    client.queued.clear();
                }
                self.answer(waiter.conn, &waiter.reply_to, leader_reply(leader));
            }
            let permit_waiters = leadership.semaphores.take_waiters();
            self.answer_permit_waiters(permit_waiters, leader_reply(leader));
            for (conn, request, _) in leadership.held {
                self.answer(conn, request.reply_to(), leader_reply(leader));
            }
        }
    }

    /// The leader's work: initialise the domain, serve held requests once
    /// caught up, hand freed keys to queue heads, expire leases. True when
    /// something was proposed or answered.
    pub(super) fn leader_duties(&mut self, now: Instant) -> bool {
        let Some(leadership) = self.leadership.as_mut() else {
            return false;
        };
        let mut progressed = false;
        // A recovering leader first hears the floors of enough slots
        // (their hellos): together they bound every earlier token.
        let evidence_complete = !self.config.recovering
            || recovery::init_evidence_complete(
                self.config.slot_count,
                self.floor_slots_heard.len(),
            );
        if !leadership.init_proposed && !self.state.is_initialised() && !evidence_complete {
            let heard = u8::try_from(self.floor_slots_heard.len() + 1).unwrap_or(u8::MAX);
            let needed = recovery::evidence_slots_needed(self.config.slot_count);
            self.events.note_recovery_evidence(heard, needed);
        }
        if !leadership.init_proposed && !self.state.is_initialised() && evidence_complete {
            // Above every token an authenticated peer knew of, so that a
            // cluster bootstrapped again with one clock behind still starts
            // above what it issued before.
            let command = Command::Init {
                first_token: self
                    .config
                    .bootstrap_wall_clock_us
                    .max(self.peer_token_floor_max),
            };
            if let Ok((index, term)) = self.raft.propose(now, command.to_bytes()) {
                leadership.init_proposed = true;
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Init,
                    },
                );
                progressed = true;
            }
        }
        let Some(leadership) = self.leadership.as_mut() else {
            return progressed;
        };
        if !leadership.caught_up {
            return progressed;
        }
        let held = std::mem::take(&mut leadership.held);
        for (conn, request, received) in held {
            progressed = true;
            self.serve_request(now, conn, request, received);
        }
        progressed |= self.serve_dirty(now);
        progressed |= self.serve_permits(now);
        progressed |= self.expire_due(now);
        progressed
    }

    /// Proposes a Grant for every queue head that has become grantable.
    fn serve_dirty(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        loop {
            let Some(leadership) = self.leadership.as_mut() else {
                return progressed;
            };
            let Some(key) = leadership.dirty.pop() else {
                return progressed;
            };
            leadership.semaphores.key_freed(&key);
            let Some(queue) = leadership.keys.get(&key) else {
                continue;
            };
            let Some(seq) = queue.head() else {
                continue;
            };
            let Some(waiter) = leadership.waiters.get(&seq) else {
                continue;
            };
            // Free here for its modes: not held against them (or its
            // holder's Release is in flight, ahead of this Grant in the
            // log) nor reserved against them by a Grant in flight.
            if !head_grantable(&self.state, &leadership.keys, (seq, waiter), &key) {
                continue;
            }
            let bound = self.next_grant_token_bound();
            if !self.reserve.covers(bound) {
                self.reserve.note_exhausted(bound);
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership.reserve_stalled.insert(key);
                }
                continue;
            }
            if let Some(waiter) = self.dequeue_waiter(seq, false) {
                progressed = true;
                let keys = (!self.handover_wanted.is_empty()).then(|| waiter.keys.clone());
                let retry = waiter.keys.clone();
                let index = self.propose_grant(now, waiter);
                if index.is_none()
                    && let Some(leadership) = self.leadership.as_mut()
                {
                    // Not proposed (answered `B` or redirected): the keys
                    // stayed free for the next waiters.
                    leadership.dirty.extend(retry.keys().iter().cloned());
                }
                if let (Some(index), Some(keys)) = (index, keys) {
                    // A hand-over of a force-released grant's keys: its
                    // answer names this Grant's token once applied.
                    let freed = |h: &Handover| keys.keys().iter().any(|k| h.keys.contains(k));
                    if let Some(pos) = self.handover_wanted.iter().position(freed) {
                        let handover = self.handover_wanted.swap_remove(pos);
                        self.handovers.insert(index, handover);
                    }
                }
            }
        }
    }

    /// Proposes `Expire` for every lease that ended on this node's clock.
    fn expire_due(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        while let Some((token, keys)) = self.state.pop_expired(now) {
            let Some(leadership) = self.leadership.as_mut() else {
                break;
            };
            if leadership.extending.contains_key(&token) {
                // Its renewal applies first and re-times the lease (or
                // leaves it, and this comes back).
                self.state.rearm(token, now.saturating_add(EXPIRE_RETRY));
                continue;
            }
            if !leadership.expiring.insert(token) {
                continue;
            }
            if self.propose_internal(now, Command::Expire { keys, token }) {
                progressed = true;
            } else {
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership.expiring.remove(&token);
                }
                self.state.rearm(token, now.saturating_add(EXPIRE_RETRY));
                break;
            }
        }
        progressed
    }

    pub(super) fn time_out_waiters(&mut self, now: Instant) {
        loop {
            let Some(leadership) = self.leadership.as_mut() else {
                return;
            };
            let Some(Reverse((deadline, seq))) = leadership.wait_deadlines.peek().copied() else {
                return;
            };
            if deadline > now {
                return;
            }
            leadership.wait_deadlines.pop();
            if let Some(waiter) = self.remove_waiter(seq) {
                self.answer(waiter.conn, &waiter.reply_to, Answer::TimedOut);
            } else if let Some((conn, reply_to)) = self.remove_permit_waiter(seq) {
                self.answer(conn, &reply_to, Answer::TimedOut);
            }
        }
    }
}
