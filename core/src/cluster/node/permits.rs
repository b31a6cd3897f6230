//! Semaphores on the cluster leader: permit requests (`Q`) queued FIFO per
//! semaphore name and served by proposing a `Grant` of slot keys.
//!
//! A semaphore `name` of capacity N is N slot keys ([`slot_key`]), as in
//! single mode (`lock/semaphore.rs`, whose rules this follows): a request
//! for k permits gets the k lowest free slots as one key set under one
//! token; the queue is strict FIFO, also for multi-permit requests (a head
//! asking for k blocks every request behind it); a request declaring
//! another capacity while the semaphore is in use (held or reserved slots,
//! or waiters) is refused with the capacity it has; a semaphore nobody
//! uses is forgotten.
//!
//! A permit grant is a committed `Grant` whose options carry the capacity,
//! answered only once it applies (like any grant, see `apply.rs`), then
//! renewed, released, expired and force-released like any grant. The
//! queues live on the leader only, like the per-key ones; the capacities
//! need no command of their own: a new leader derives them from the
//! applied grants (each permit grant carries its semaphore's capacity) the
//! first time it is asked for permits, so a capacity its predecessor
//! refused is still refused and no held slot is handed out twice.
//!
//! A slot is free for a permit when it is not held in the applied state
//! (or its holder's Release is in flight, ahead of the Grant in the log),
//! no Grant in flight reserves it, and no plain acquire queues on its key:
//! as in single mode, a plain acquire of a slot key is a lock like any
//! other, and the semaphore sees the slot as taken.
//!
//! Slots free up when a Release, Expire or force-release applies, or a
//! Grant in flight is refused: each dirties the keys it freed, and
//! [`LeaderSemaphores::key_freed`] turns a slot key into its semaphore's
//! name, whose head is served by [`ClusterNode::serve_permits`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::cluster::command::GrantOptions;
use crate::conn::ConnId;
use crate::conn::client::{Answer, ReplyTo};
use crate::hash::IdMap;
use crate::lock::semaphore::semaphore_of;
use crate::queue_rule;
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup, PermitsRequest, SLOT_SUFFIX_LEN, Slots, slot_key};

use super::ClusterNode;
use super::connections::{Conn, ConnKind};
use super::leadership::{Waiter, leader_reply};

/// Most semaphores the leader knows at once, as in single mode: each one
/// known is in use (held or reserved slots, or waiters) but for a moment.
const SEMAPHORES_MAX: usize = 65_536;

/// A queued request for permits.
#[derive(Debug)]
struct PermitWaiter {
    conn: ConnId,
    reply_to: ReplyTo,
    name: Key,
    permits: u8,
    lease_ms: u32,
    max_hold_ms: Option<u32>,
    /// When it arrived (the wait-time observation starts here).
    received: Instant,
}

/// One semaphore the leader knows: its capacity and its waiters.
#[derive(Debug)]
struct Semaphore {
    capacity: u16,
    /// Waiters' sequence numbers (shared with the per-key waiters), FIFO.
    queue: VecDeque<u64>,
}

/// The leader's semaphores (see the module docs); dropped with the
/// leadership.
#[derive(Debug, Default)]
pub(super) struct LeaderSemaphores {
    /// The capacities of the applied permit grants were read (once per
    /// leadership, at its first permit request).
    derived: bool,
    /// Ordered, so that serving goes the same way on every run.
    by_name: BTreeMap<Key, Semaphore>,
    /// Queued waiters by sequence number.
    waiters: IdMap<u64, PermitWaiter>,
    /// Semaphores whose head may have become grantable, or which may be
    /// unused now.
    dirty: BTreeSet<Key>,
}

impl LeaderSemaphores {
    /// Permit requests queued.
    pub(super) fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    /// `key` was freed (or its queue changed): if it is a slot key of a
    /// known semaphore, that semaphore looks at its queue again.
    pub(super) fn key_freed(&mut self, key: &Key) {
        if self.by_name.is_empty() {
            return;
        }
        if let Some(name) = semaphore_of(key.as_bytes())
            && let Ok(name) = Key::new(name)
            && self.by_name.contains_key(&name)
        {
            self.dirty.insert(name);
        }
    }

    /// Takes every queued waiter in arrival order (stepping down, shutdown):
    /// their connection and where their answer goes.
    pub(super) fn take_waiters(&mut self) -> Vec<(u64, ConnId, ReplyTo)> {
        let mut waiters: Vec<(u64, ConnId, ReplyTo)> = std::mem::take(&mut self.waiters)
            .into_iter()
            .map(|(seq, w)| (seq, w.conn, w.reply_to))
            .collect();
        waiters.sort_unstable_by_key(|(seq, _, _)| *seq);
        for semaphore in self.by_name.values_mut() {
            semaphore.queue.clear();
        }
        waiters
    }

    /// Removes waiter `seq` from its queue; its semaphore is looked at
    /// again (the head may have changed, or nobody uses it any more).
    fn remove(&mut self, seq: u64) -> Option<PermitWaiter> {
        let waiter = self.waiters.remove(&seq)?;
        if let Some(semaphore) = self.by_name.get_mut(&waiter.name) {
            if semaphore.queue.front() == Some(&seq) {
                semaphore.queue.pop_front();
            } else {
                semaphore.queue.retain(|s| *s != seq);
            }
        }
        self.dirty.insert(waiter.name.clone());
        Some(waiter)
    }
}

/// The slot number of slot key `key` (`name[0012]` is 12).
fn slot_of(key: &[u8]) -> Option<u16> {
    let digits = key.get(key.len().checked_sub(SLOT_SUFFIX_LEN - 1)?..key.len() - 1)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

impl ClusterNode {
    /// A request for permits on the caught-up leader, received at
    /// `received`: `B` over a per-connection limit, `C` naming both
    /// capacities when the semaphore is in use with another one, a Grant
    /// of the lowest free slots proposed at once when nobody waits and
    /// enough are free, `T` when it may not wait, else queued FIFO (`B`
    /// over the waiter limits).
    pub(super) fn handle_permits(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        (request, max_hold_ms, reply_to): (PermitsRequest, Option<u32>, ReplyTo),
        received: Instant,
    ) {
        let Some(over_connection_limit) =
            self.over_connection_limit(now, conn_id, usize::from(request.permits))
        else {
            return;
        };
        if over_connection_limit {
            self.counts.busy_per_connection += 1;
            self.answer(conn_id, &reply_to, Answer::Busy);
            return;
        }
        if self.leadership.is_none() {
            self.answer(conn_id, &reply_to, leader_reply(self.raft.leader()));
            return;
        }
        self.derive_capacities();
        let name = request.name.clone();
        if let Some(capacity) = self.capacity_in_use(&name)
            && capacity != request.capacity
        {
            let asked = request.capacity;
            self.answer(
                conn_id,
                &reply_to,
                Answer::CapacityMismatch { asked, capacity },
            );
            return;
        }
        if !self.register_semaphore(&name, request.capacity) {
            self.counts.busy.keys_max += 1;
            self.answer(conn_id, &reply_to, Answer::Busy);
            return;
        }
        let waiter = PermitWaiter {
            conn: conn_id,
            reply_to,
            name,
            permits: request.permits,
            lease_ms: u32::from(request.lease_s) * 1_000,
            max_hold_ms,
            received,
        };
        let deadline = queue_rule::wait_deadline(
            received,
            Duration::from_secs(u64::from(request.wait_s)),
            self.config.wait_margin,
        );
        if !self.has_permit_waiters(&waiter.name)
            && let Some(slots) = self.free_slots(&waiter.name, request.capacity, waiter.permits)
        {
            let name = waiter.name.clone();
            let grant = permit_grant_waiter(waiter, request.capacity, slots);
            self.grant_at_once(now, grant);
            // Refused (`B`), it leaves nothing behind; proposed, its slots
            // are reserved and the semaphore stays known.
            self.forget_if_unused(&name);
            return;
        }
        if request.wait_s == 0 || deadline <= now {
            self.refuse_permits(waiter, Answer::TimedOut);
            return;
        }
        self.enqueue_permit_waiter(waiter, deadline);
    }

    /// Answers `waiter` with a refusal that leaves nothing behind: a
    /// semaphore this request made known and nobody uses is forgotten.
    fn refuse_permits(&mut self, waiter: PermitWaiter, answer: Answer) {
        self.answer(waiter.conn, &waiter.reply_to, answer);
        self.forget_if_unused(&waiter.name);
    }

    /// Queues `waiter` FIFO on its semaphore with its wait deadline (in
    /// the per-key waiters' deadline heap: [`ClusterNode::time_out_waiters`]
    /// answers it `T`): `B` instead over the per-semaphore or total waiter
    /// limit, which count plain and permit waiters alike.
    fn enqueue_permit_waiter(&mut self, waiter: PermitWaiter, deadline: Instant) {
        let limits = self.config.limits;
        let Some(leadership) = self.leadership.as_ref() else {
            return;
        };
        let semaphores = &leadership.semaphores;
        let queued = semaphores
            .by_name
            .get(&waiter.name)
            .map_or(0, |s| s.queue.len());
        if queued >= limits.waiters_per_key_max {
            self.counts.busy.waiters_per_key_max += 1;
            return self.refuse_permits(waiter, Answer::Busy);
        }
        if leadership.waiters.len() + semaphores.waiters.len() >= limits.waiters_total_max {
            self.counts.busy.waiters_total_max += 1;
            return self.refuse_permits(waiter, Answer::Busy);
        }
        let seq = self.next_waiter_seq;
        self.next_waiter_seq += 1;
        let conn_id = waiter.conn;
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        let semaphores = &mut leadership.semaphores;
        if let Some(semaphore) = semaphores.by_name.get_mut(&waiter.name) {
            semaphore.queue.push_back(seq);
        }
        semaphores.waiters.insert(seq, waiter);
        leadership.wait_deadlines.push(Reverse((deadline, seq)));
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        {
            client.queued.insert(seq);
        }
    }

    /// Removes queued permit waiter `seq` (its wait ran out or its
    /// connection closed): its connection and where its answer goes.
    pub(super) fn remove_permit_waiter(&mut self, seq: u64) -> Option<(ConnId, ReplyTo)> {
        let waiter = self.leadership.as_mut()?.semaphores.remove(seq)?;
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.by_id.get_mut(&waiter.conn)
        {
            client.queued.remove(&seq);
        }
        Some((waiter.conn, waiter.reply_to))
    }

    /// Answers permit waiters taken off their queues (stepping down,
    /// shutdown), each leaving its connection's queued set.
    pub(super) fn answer_permit_waiters(
        &mut self,
        waiters: Vec<(u64, ConnId, ReplyTo)>,
        answer: Answer,
    ) {
        for (seq, conn_id, reply_to) in waiters {
            if let Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) = self.conns.by_id.get_mut(&conn_id)
            {
                client.queued.remove(&seq);
            }
            self.answer(conn_id, &reply_to, answer);
        }
    }

    /// Proposes a Grant for every semaphore head that has become
    /// grantable, in FIFO order per semaphore, and forgets the semaphores
    /// nobody uses any more. True when a waiter was served.
    pub(super) fn serve_permits(&mut self, now: Instant) -> bool {
        let Some(leadership) = self.leadership.as_mut() else {
            return false;
        };
        if leadership.semaphores.dirty.is_empty() {
            return false;
        }
        let dirty = std::mem::take(&mut leadership.semaphores.dirty);
        let mut progressed = false;
        for name in dirty {
            progressed |= self.serve_permit_heads(now, &name);
        }
        progressed
    }

    /// Grants the heads of `name` while they fit; a head that does not
    /// blocks everyone behind it. True when a head was served.
    fn serve_permit_heads(&mut self, now: Instant, name: &Key) -> bool {
        let mut progressed = false;
        loop {
            let Some(semaphores) = self.leadership.as_ref().map(|l| &l.semaphores) else {
                return progressed;
            };
            let Some(semaphore) = semaphores.by_name.get(name) else {
                return progressed;
            };
            let Some(&seq) = semaphore.queue.front() else {
                self.forget_if_unused(name);
                return progressed;
            };
            let capacity = semaphore.capacity;
            let Some(permits) = semaphores.waiters.get(&seq).map(|w| w.permits) else {
                return progressed;
            };
            let Some(slots) = self.free_slots(name, capacity, permits) else {
                return progressed;
            };
            let bound = self.next_grant_token_bound();
            if !self.reserve.covers(bound) {
                self.reserve.note_exhausted(bound);
                // Dirty again once the reserve grows; its slot key leads
                // back here through `key_freed`.
                if let (Some(leadership), Some(key)) = (self.leadership.as_mut(), slot_key(name, 0))
                {
                    leadership.reserve_stalled.insert(key);
                }
                return progressed;
            }
            let Some(waiter) = self.remove_permit_head(seq) else {
                return progressed;
            };
            progressed = true;
            let grant = permit_grant_waiter(waiter, capacity, slots);
            if self.propose_grant(now, grant).is_none()
                && let Some(leadership) = self.leadership.as_mut()
            {
                // Not proposed (answered `B` or redirected): the slots
                // stayed free for the next head, served on the next turn.
                leadership.semaphores.dirty.insert(name.clone());
                return progressed;
            }
        }
    }

    /// Takes head `seq` off its queue to be granted (nothing dirtied: its
    /// slots are reserved by the Grant proposed next).
    fn remove_permit_head(&mut self, seq: u64) -> Option<PermitWaiter> {
        let semaphores = &mut self.leadership.as_mut()?.semaphores;
        let waiter = semaphores.waiters.remove(&seq)?;
        if let Some(semaphore) = semaphores.by_name.get_mut(&waiter.name) {
            semaphore.queue.pop_front();
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

    /// The answer to an applied grant of `token`: the permit reply (its
    /// slots, and the slots of its semaphore free in the applied state)
    /// for a grant that carries a capacity, else a plain grant.
    pub(super) fn granted_answer(&self, token: u64) -> Answer {
        let plain = Answer::Granted { token };
        let Some(holding) = self.state.grant(token) else {
            return plain;
        };
        let Some(capacity) = holding.options.capacity else {
            return plain;
        };
        let keys = holding.keys.keys();
        let slots: Option<Vec<u16>> = keys.iter().map(|k| slot_of(k.as_bytes())).collect();
        let name = keys
            .first()
            .and_then(|k| semaphore_of(k.as_bytes()))
            .and_then(|name| Key::new(name).ok());
        let (Some(slots), Some(name)) = (slots.as_deref().and_then(Slots::new), name) else {
            debug_assert!(false, "a permit grant holds slot keys");
            return plain;
        };
        let free = (0..capacity)
            .filter_map(|slot| slot_key(&name, slot))
            .filter(|key| !self.state.is_held(key))
            .count();
        Answer::PermitsGranted {
            token,
            free: u16::try_from(free).unwrap_or(u16::MAX),
            slots,
        }
    }

    /// Reads the capacity of every semaphore with a held slot from the
    /// applied grants, once per leadership: a predecessor's permit
    /// grants are all applied before this leader serves anything.
    fn derive_capacities(&mut self) {
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        let semaphores = &mut leadership.semaphores;
        if semaphores.derived {
            return;
        }
        semaphores.derived = true;
        for (_, holding) in self.state.grants() {
            let Some(capacity) = holding.options.capacity else {
                continue;
            };
            if let Some(name) = holding
                .keys
                .keys()
                .first()
                .and_then(|k| semaphore_of(k.as_bytes()))
                .and_then(|name| Key::new(name).ok())
            {
                semaphores.by_name.entry(name).or_insert(Semaphore {
                    capacity,
                    queue: VecDeque::new(),
                });
            }
        }
    }

    /// Makes `name` known with `capacity` (it is unused or has this
    /// capacity already): false when the leader knows too many.
    fn register_semaphore(&mut self, name: &Key, capacity: u16) -> bool {
        let limit = self.config.limits.keys_max.min(SEMAPHORES_MAX);
        let Some(leadership) = self.leadership.as_mut() else {
            return false;
        };
        let by_name = &mut leadership.semaphores.by_name;
        if let Some(semaphore) = by_name.get_mut(name) {
            semaphore.capacity = capacity;
            return true;
        }
        if by_name.len() >= limit {
            return false;
        }
        by_name.insert(
            name.clone(),
            Semaphore {
                capacity,
                queue: VecDeque::new(),
            },
        );
        true
    }

    /// The capacity of `name` if it is in use.
    fn capacity_in_use(&self, name: &Key) -> Option<u16> {
        let semaphore = self.leadership.as_ref()?.semaphores.by_name.get(name)?;
        self.semaphore_in_use(name, semaphore)
            .then_some(semaphore.capacity)
    }

    /// Whether anybody uses `semaphore`: a waiter, or a slot held in the
    /// applied state, reserved by a Grant in flight, or queued on by a
    /// plain acquire.
    fn semaphore_in_use(&self, name: &Key, semaphore: &Semaphore) -> bool {
        let Some(leadership) = self.leadership.as_ref() else {
            return false;
        };
        !semaphore.queue.is_empty()
            || (0..semaphore.capacity)
                .filter_map(|slot| slot_key(name, slot))
                .any(|key| self.state.is_held(&key) || leadership.keys.get(&key).is_some())
    }

    /// Forgets `name` if nobody uses it.
    fn forget_if_unused(&mut self, name: &Key) {
        let unused = self
            .leadership
            .as_ref()
            .and_then(|l| l.semaphores.by_name.get(name))
            .is_some_and(|semaphore| !self.semaphore_in_use(name, semaphore));
        if unused && let Some(leadership) = self.leadership.as_mut() {
            leadership.semaphores.by_name.remove(name);
        }
    }

    /// Whether permit requests queue on `name`.
    fn has_permit_waiters(&self, name: &Key) -> bool {
        self.leadership
            .as_ref()
            .and_then(|l| l.semaphores.by_name.get(name))
            .is_some_and(|semaphore| !semaphore.queue.is_empty())
    }

    /// The keys of the `permits` lowest slots of `name` (of `capacity`)
    /// free for a permit now, if there are that many (see the module
    /// docs).
    fn free_slots(&self, name: &Key, capacity: u16, permits: u8) -> Option<KeyGroup> {
        let leadership = self.leadership.as_ref()?;
        let wanted = usize::from(permits);
        let mut slots = Vec::with_capacity(wanted);
        for slot in 0..capacity {
            let key = slot_key(name, slot)?;
            let free = match leadership.keys.get(&key) {
                Some(queue) => {
                    !queue.is_reserved()
                        && queue.waiters.is_empty()
                        && (queue.releasing || !self.state.is_held(&key))
                }
                None => !self.state.is_held(&key),
            };
            if free {
                slots.push(key);
                if slots.len() == wanted {
                    return KeyGroup::new(slots).ok();
                }
            }
        }
        None
    }
}

/// The grant proposal for permit waiter `waiter`: slot keys `keys`,
/// carrying the semaphore's `capacity`.
fn permit_grant_waiter(waiter: PermitWaiter, capacity: u16, keys: KeyGroup) -> Waiter {
    Waiter {
        conn: waiter.conn,
        reply_to: waiter.reply_to,
        keys,
        lease_ms: waiter.lease_ms,
        max_hold_ms: waiter.max_hold_ms,
        // A slot is held exclusively: no shared modes.
        options: GrantOptions {
            capacity: Some(capacity),
            ..GrantOptions::default()
        },
        // Proposed now: it waits no longer.
        deadline: waiter.received,
        received: waiter.received,
    }
}

#[cfg(test)]
mod tests {
    use super::slot_of;

    #[test]
    fn a_slot_key_names_its_slot() {
        assert_eq!(slot_of(b"jobs[0012]"), Some(12));
        assert_eq!(slot_of(b"jobs[0000]"), Some(0));
        assert_eq!(slot_of(b"jobs[00a2]"), None);
        assert_eq!(slot_of(b"j]"), None);
    }
}
