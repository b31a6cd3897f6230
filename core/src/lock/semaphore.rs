//! FIFO semaphores with numbered slots, on top of the lock table.
//!
//! A semaphore `name` of capacity N is N slot keys, `name[0000]` to
//! `name[N-1]` ([`slot_key`]). A request for k permits is granted the k
//! lowest free slots as one key set under one token, by the table's own
//! acquire: so a permit is a grant in every way (lease, renewal by token,
//! release of an undelivered grant, inspection, force-release, pushes), and
//! the table's key limit bounds the slots held.
//!
//! What this module adds is the queue the table cannot have, because which
//! slots a waiter gets is not known until it is served:
//! - **strict FIFO, also for multi-permit requests:** a head asking for k
//!   blocks every request behind it, even one that would fit now; a
//!   newcomer queues behind any waiter;
//! - **capacity is checked:** a request that declares another capacity
//!   while the semaphore is in use (held slots or waiters) is refused, with
//!   the capacity it has. A semaphore nobody uses is forgotten, so the next
//!   request may declare a new one; nothing held is ever revoked.
//!
//! Slots free up by a release, a force-release, the release of an
//! undelivered grant (the owner tells [`Semaphores::keys_freed`]) or a
//! lease running out (the head's blocked check schedules a recheck at the
//! earliest lease end of the slots it waits for). Time enters only as
//! `now` arguments.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::ops::Bound;

use super::{AcquireOptions, AcquireOutcome, LockTable, WaiterId};
use crate::metrics::SemaphoreBusy;
use crate::queue_rule;
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup, SLOT_SUFFIX_LEN, Slots, slot_key};

/// A request for permits, as the owner hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PermitAsk {
    /// The semaphore.
    pub(crate) name: Key,
    /// Permits wanted (1..=16, at most `capacity`; checked by the decoder).
    pub(crate) permits: u8,
    /// The capacity the request declares.
    pub(crate) capacity: u16,
    /// Wait bound in seconds; 0 = one immediate try.
    pub(crate) wait_s: u8,
    /// Lease in seconds.
    pub(crate) lease_s: u8,
    /// The holder tag the grant is recorded under.
    pub(crate) holder: u64,
    /// The cap on total hold, if any.
    pub(crate) max_hold: Option<Duration>,
}

/// A permit grant: its token, its slots and their keys, and the slots
/// still free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PermitGrant {
    /// The fencing token (every slot's).
    pub(crate) token: u64,
    /// The slots, ascending.
    pub(crate) slots: Slots,
    /// Their keys, ascending: what the holder releases and renews.
    pub(crate) keys: KeyGroup,
    /// Slots of the semaphore free after this grant.
    pub(crate) free: u16,
}

/// The immediate answer to a request for permits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PermitOutcome {
    /// Granted now.
    Granted(PermitGrant),
    /// Queued: a [`PermitEvent`] for this waiter follows.
    Queued,
    /// Not granted now and `wait_s` was 0.
    TimedOut,
    /// A limit (waiters, semaphores, keys or the token reserve); nothing
    /// queued.
    Busy,
    /// The semaphore is in use with this other capacity; nothing changed.
    CapacityMismatch {
        /// The semaphore's capacity.
        capacity: u16,
    },
}

/// What became of a queued request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PermitEvent {
    /// Granted.
    Granted {
        /// The waiter.
        waiter: WaiterId,
        /// The grant.
        grant: PermitGrant,
        /// When its lease ends.
        lease_deadline: Instant,
    },
    /// Its wait ran out.
    TimedOut {
        /// The waiter.
        waiter: WaiterId,
    },
}

/// Limits on what the semaphores may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SemaphoreLimits {
    /// Semaphores known at once (in use, or forgotten lazily).
    pub(crate) semaphores_max: usize,
    /// Waiters on one semaphore.
    pub(crate) waiters_per_semaphore_max: usize,
    /// Waiters on every semaphore together.
    pub(crate) waiters_total_max: usize,
}

#[derive(Debug)]
struct Semaphore {
    capacity: u16,
    queue: VecDeque<PermitWaiter>,
    /// The head's check found too few slots and scheduled a recheck here.
    recheck_at: Option<Instant>,
}

#[derive(Debug)]
struct PermitWaiter {
    waiter: WaiterId,
    ask: PermitAsk,
}

/// Slot look-ups one sweep for unused semaphores may spend (a request for
/// a new name while the registry is full): eight of the widest
/// semaphores, or thousands of narrow ones.
const SWEEP_LOOKUPS_MAX: usize = 8_192;

/// Every semaphore with its queue; see the module documentation.
#[derive(Debug)]
pub(crate) struct Semaphores {
    limits: SemaphoreLimits,
    wait_margin: Duration,
    /// Ordered, so that every walk over them (rechecks, the sweep for
    /// unused ones) goes the same way in every process.
    by_name: BTreeMap<Key, Semaphore>,
    /// Where the last sweep for unused semaphores stopped.
    sweep_after: Option<Key>,
    /// Which semaphore each waiter is queued on.
    waiter_names: HashMap<WaiterId, Key>,
    /// Wait deadlines; an entry whose waiter is gone is skipped.
    wait_deadlines: BinaryHeap<Reverse<(Instant, WaiterId)>>,
    /// Rechecks of blocked heads; an entry that no longer matches its
    /// semaphore's `recheck_at` is skipped.
    rechecks: BinaryHeap<Reverse<(Instant, Key)>>,
    /// Semaphores whose head should be looked at again.
    dirty: Vec<Key>,
    events: VecDeque<PermitEvent>,
    /// Permit requests answered `B` by the semaphores' own limits.
    busy: SemaphoreBusy,
    /// The pass under way with the planted bug `PermitTokensReversed` on.
    #[cfg(feature = "planted-bugs")]
    reversed_pass: Option<super::reversed_pass::ReversedPass>,
}

impl Semaphores {
    /// No semaphores yet.
    pub(crate) fn new(limits: SemaphoreLimits, wait_margin: Duration) -> Self {
        Semaphores {
            limits,
            wait_margin,
            by_name: BTreeMap::new(),
            sweep_after: None,
            waiter_names: HashMap::new(),
            wait_deadlines: BinaryHeap::new(),
            rechecks: BinaryHeap::new(),
            dirty: Vec::new(),
            events: VecDeque::new(),
            busy: SemaphoreBusy::default(),
            #[cfg(feature = "planted-bugs")]
            reversed_pass: None,
        }
    }

    /// Permit requests answered `B` by the semaphores' own limits so far.
    pub(crate) fn busy(&self) -> SemaphoreBusy {
        self.busy
    }

    /// Waiters queued on every semaphore.
    pub(crate) fn waiter_count(&self) -> usize {
        self.waiter_names.len()
    }

    /// A request for permits at `now`: granted at once when nobody waits
    /// and enough slots are free, else queued (or refused).
    pub(crate) fn acquire(
        &mut self,
        now: Instant,
        table: &mut LockTable,
        waiter: WaiterId,
        ask: PermitAsk,
    ) -> PermitOutcome {
        if let Some(semaphore) = self.by_name.get(&ask.name)
            && semaphore.capacity != ask.capacity
            && in_use(now, table, &ask.name, semaphore)
        {
            return PermitOutcome::CapacityMismatch {
                capacity: semaphore.capacity,
            };
        }
        if !self.by_name.contains_key(&ask.name) && self.by_name.len() >= self.limits.semaphores_max
        {
            self.forget_unused(now, table);
            if self.by_name.len() >= self.limits.semaphores_max {
                self.busy.semaphores_max += 1;
                return PermitOutcome::Busy;
            }
        }
        let semaphore = self
            .by_name
            .entry(ask.name.clone())
            .or_insert_with(|| Semaphore {
                capacity: ask.capacity,
                queue: VecDeque::new(),
                recheck_at: None,
            });
        // Unused (checked above): the request's capacity is the one now.
        semaphore.capacity = ask.capacity;
        if semaphore.queue.is_empty() {
            match try_grant(now, table, waiter, &ask, semaphore.capacity) {
                Grant::Made(grant, _) => return PermitOutcome::Granted(grant),
                Grant::Busy => return self.refuse(now, table, &ask.name, PermitOutcome::Busy),
                Grant::TooFew(_) if ask.wait_s == 0 => {
                    return self.refuse(now, table, &ask.name, PermitOutcome::TimedOut);
                }
                Grant::TooFew(_) => {}
            }
        } else if ask.wait_s == 0 {
            return PermitOutcome::TimedOut;
        }
        let semaphore = self.by_name.get_mut(&ask.name).expect("inserted above");
        if semaphore.queue.len() >= self.limits.waiters_per_semaphore_max {
            self.busy.waiters_per_semaphore_max += 1;
            return self.refuse(now, table, &ask.name, PermitOutcome::Busy);
        }
        if self.waiter_names.len() >= self.limits.waiters_total_max {
            self.busy.waiters_total_max += 1;
            return self.refuse(now, table, &ask.name, PermitOutcome::Busy);
        }
        let deadline = queue_rule::wait_deadline(
            now,
            Duration::from_secs(u64::from(ask.wait_s)),
            self.wait_margin,
        );
        let name = ask.name.clone();
        semaphore.queue.push_back(PermitWaiter { waiter, ask });
        self.waiter_names.insert(waiter, name.clone());
        self.wait_deadlines.push(Reverse((deadline, waiter)));
        // A first waiter is the head: schedule its recheck.
        self.dirty.push(name);
        PermitOutcome::Queued
    }

    /// A refusal that leaves nothing behind: a semaphore this request
    /// created and nobody uses is forgotten again.
    fn refuse(
        &mut self,
        now: Instant,
        table: &LockTable,
        name: &Key,
        outcome: PermitOutcome,
    ) -> PermitOutcome {
        self.forget_if_unused(now, table, name);
        outcome
    }

    /// Removes a queued waiter (its connection closed). `false` if it was
    /// not queued.
    pub(crate) fn cancel(&mut self, waiter: WaiterId) -> bool {
        let Some(name) = self.waiter_names.remove(&waiter) else {
            return false;
        };
        if let Some(semaphore) = self.by_name.get_mut(&name) {
            semaphore.queue.retain(|queued| queued.waiter != waiter);
        }
        // The head may have changed to a smaller request.
        self.dirty.push(name);
        true
    }

    /// `keys` were released (by their holder, an operator, or because the
    /// grant was never delivered): the semaphores they are slots of look at
    /// their queue again.
    pub(crate) fn keys_freed(&mut self, keys: &[Key]) {
        if self.waiter_names.is_empty() {
            return;
        }
        for key in keys {
            if let Some(name) = semaphore_of(key.as_bytes())
                && let Ok(name) = Key::new(name)
                && self
                    .by_name
                    .get(&name)
                    .is_some_and(|semaphore| !semaphore.queue.is_empty())
            {
                self.dirty.push(name);
            }
        }
    }

    /// Every semaphore with waiters looks at its queue again (the token
    /// reserve grew).
    pub(crate) fn recheck_all(&mut self) {
        for (name, semaphore) in &self.by_name {
            if !semaphore.queue.is_empty() {
                self.dirty.push(name.clone());
            }
        }
    }

    /// Whether [`Semaphores::serve`] has work at `now`.
    pub(crate) fn has_work(&self, now: Instant) -> bool {
        !self.dirty.is_empty() || self.poll_timeout().is_some_and(|at| at <= now)
    }

    /// Serves what is due at `now`: waits that ran out (`T`), and the heads
    /// of semaphores whose slots may have freed, in FIFO order.
    pub(crate) fn serve(&mut self, now: Instant, table: &mut LockTable) {
        while let Some(&Reverse((at, waiter))) = self.wait_deadlines.peek() {
            if at > now {
                break;
            }
            self.wait_deadlines.pop();
            let Some(name) = self.waiter_names.remove(&waiter) else {
                continue;
            };
            if let Some(semaphore) = self.by_name.get_mut(&name) {
                semaphore.queue.retain(|queued| queued.waiter != waiter);
            }
            self.events.push_back(PermitEvent::TimedOut { waiter });
            self.dirty.push(name);
        }
        while let Some(Reverse((at, _))) = self.rechecks.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, name))) = self.rechecks.pop() else {
                break;
            };
            if let Some(semaphore) = self.by_name.get_mut(&name)
                && semaphore.recheck_at == Some(at)
            {
                semaphore.recheck_at = None;
                self.dirty.push(name);
            }
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for name in dirty {
            #[cfg(feature = "planted-bugs")]
            {
                self.reversed_pass = super::reversed_pass::ReversedPass::begin(table);
            }
            self.serve_head(now, table, &name);
            #[cfg(feature = "planted-bugs")]
            if let Some(pass) = self.reversed_pass.take() {
                pass.end(table);
            }
        }
        self.compact_rechecks();
    }

    /// Grants the heads of `name` while they fit, then schedules a recheck
    /// for a head that does not, or forgets a semaphore nobody uses.
    fn serve_head(&mut self, now: Instant, table: &mut LockTable, name: &Key) {
        let Some(semaphore) = self.by_name.get_mut(name) else {
            return;
        };
        while let Some(head) = semaphore.queue.front() {
            match try_grant(now, table, head.waiter, &head.ask, semaphore.capacity) {
                Grant::Made(grant, lease_deadline) => {
                    #[cfg(feature = "planted-bugs")]
                    if let Some(pass) = self.reversed_pass {
                        pass.granted(table, grant.token);
                    }
                    let waiter = head.waiter;
                    semaphore.queue.pop_front();
                    self.waiter_names.remove(&waiter);
                    self.events.push_back(PermitEvent::Granted {
                        waiter,
                        grant,
                        lease_deadline,
                    });
                }
                Grant::TooFew(next_free) => {
                    #[cfg(feature = "planted-bugs")]
                    if crate::testing::planted::active(
                        crate::testing::planted::PlantedBug::BargePermits,
                    ) {
                        let mut barged = None;
                        for at in 1..semaphore.queue.len() {
                            let queued = &semaphore.queue[at];
                            let capacity = semaphore.capacity;
                            if let Grant::Made(grant, deadline) =
                                try_grant(now, table, queued.waiter, &queued.ask, capacity)
                            {
                                barged = Some((at, grant, deadline));
                                break;
                            }
                        }
                        if let Some((at, grant, lease_deadline)) = barged {
                            let queued = semaphore.queue.remove(at).expect("in the queue");
                            self.waiter_names.remove(&queued.waiter);
                            self.events.push_back(PermitEvent::Granted {
                                waiter: queued.waiter,
                                grant,
                                lease_deadline,
                            });
                            continue;
                        }
                    }
                    if let Some(at) = next_free
                        && semaphore.recheck_at.is_none_or(|old| at < old)
                    {
                        semaphore.recheck_at = Some(at);
                        self.rechecks.push(Reverse((at, name.clone())));
                    }
                    return;
                }
                // The token reserve or the key limit: tried again when the
                // reserve grows or a slot frees.
                Grant::Busy => return,
            }
        }
        self.forget_if_unused(now, table, name);
    }

    /// Forgets `name` if nobody waits and no slot is held.
    fn forget_if_unused(&mut self, now: Instant, table: &LockTable, name: &Key) {
        if let Some(semaphore) = self.by_name.get(name)
            && !in_use(now, table, name, semaphore)
        {
            self.by_name.remove(name);
        }
    }

    /// Forgets semaphores nobody uses (the registry is full), looking at
    /// slots for at most [`SWEEP_LOOKUPS_MAX`] look-ups: a full registry of
    /// wide semaphores would otherwise cost one request up to 65,536 ×
    /// 1,024 look-ups on the lock state machine's turn. Each sweep goes on
    /// where the last one stopped (wrapping around), so every semaphore is
    /// looked at within a bounded number of requests; until then a new
    /// name is answered `B`, as when the registry is full of used ones.
    fn forget_unused(&mut self, now: Instant, table: &LockTable) {
        let after = self.sweep_after.take();
        let (tail, head) = match &after {
            Some(name) => (
                self.by_name
                    .range::<Key, _>((Bound::Excluded(name), Bound::Unbounded)),
                Some(
                    self.by_name
                        .range::<Key, _>((Bound::Unbounded, Bound::Included(name))),
                ),
            ),
            None => (self.by_name.range::<Key, _>(..), None),
        };
        let (mut unused, mut budget, mut last) = (Vec::new(), SWEEP_LOOKUPS_MAX, None);
        for (name, semaphore) in tail.chain(head.into_iter().flatten()) {
            // A semaphore with waiters is in use without a look-up; one
            // without costs up to one look-up per slot.
            let cost = if semaphore.queue.is_empty() {
                usize::from(semaphore.capacity)
            } else {
                1
            };
            if cost > budget && last.is_some() {
                break;
            }
            budget = budget.saturating_sub(cost);
            if !in_use(now, table, name, semaphore) {
                unused.push(name.clone());
            }
            last = Some(name.clone());
        }
        for name in unused {
            self.by_name.remove(&name);
        }
        self.sweep_after = last;
    }

    /// Drops stale rechecks once they outnumber the semaphores, so the heap
    /// stays bounded by the registry.
    fn compact_rechecks(&mut self) {
        if self.rechecks.len() <= 2 * self.by_name.len() + 16 {
            return;
        }
        let by_name = &self.by_name;
        self.rechecks.retain(|Reverse((at, name))| {
            by_name
                .get(name)
                .is_some_and(|semaphore| semaphore.recheck_at == Some(*at))
        });
    }

    /// The next outcome of a queued request.
    pub(crate) fn poll_event(&mut self) -> Option<PermitEvent> {
        self.events.pop_front()
    }

    /// The earliest wait deadline or recheck.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let wait = self.wait_deadlines.peek().map(|Reverse((at, _))| *at);
        let recheck = self.rechecks.peek().map(|Reverse((at, _))| *at);
        wait.into_iter().chain(recheck).min()
    }

    /// Every queued waiter times out (shutdown).
    pub(crate) fn time_out_all(&mut self) {
        let mut waiters: Vec<WaiterId> = self.waiter_names.drain().map(|(id, _)| id).collect();
        waiters.sort_unstable();
        for semaphore in self.by_name.values_mut() {
            semaphore.queue.clear();
        }
        self.wait_deadlines.clear();
        self.events.extend(
            waiters
                .into_iter()
                .map(|waiter| PermitEvent::TimedOut { waiter }),
        );
    }
}

/// The name of the semaphore `key` is a slot key of, if it has the shape.
pub(crate) fn semaphore_of(key: &[u8]) -> Option<&[u8]> {
    let split = key.len().checked_sub(SLOT_SUFFIX_LEN)?;
    let (name, suffix) = key.split_at(split);
    let shaped = suffix[0] == b'['
        && suffix[SLOT_SUFFIX_LEN - 1] == b']'
        && suffix[1..SLOT_SUFFIX_LEN - 1]
            .iter()
            .all(u8::is_ascii_digit);
    (shaped && !name.is_empty()).then_some(name)
}

/// Whether anyone uses the semaphore: a waiter, or a slot held at `now`.
fn in_use(now: Instant, table: &LockTable, name: &Key, semaphore: &Semaphore) -> bool {
    !semaphore.queue.is_empty()
        || (0..semaphore.capacity).any(|slot| slot_held(now, table, name, slot).is_some())
}

/// The lease end of `slot` of `name` if it is held at `now`.
fn slot_held(now: Instant, table: &LockTable, name: &Key, slot: u16) -> Option<Instant> {
    let key = slot_key(name, slot)?;
    match table.holder(key.as_bytes()) {
        Some((_, deadline)) if deadline > now => Some(deadline),
        // Expired but with waiters (only a plain acquire of a slot key can
        // queue on one): not free for the semaphore either.
        _ if table.queue_len(key.as_bytes()) > 0 => Some(now),
        _ => None,
    }
}

enum Grant {
    /// Granted, with the lease deadline.
    Made(PermitGrant, Instant),
    /// Too few slots free; the earliest lease end among the held ones, when
    /// a recheck may find more.
    TooFew(Option<Instant>),
    /// The table refused (the key limit or the token reserve).
    Busy,
}

/// Grants `ask` the lowest free slots of a semaphore of `capacity`, if
/// there are enough.
fn try_grant(
    now: Instant,
    table: &mut LockTable,
    waiter: WaiterId,
    ask: &PermitAsk,
    capacity: u16,
) -> Grant {
    let wanted = usize::from(ask.permits);
    let mut slots = Vec::with_capacity(wanted);
    let mut free = 0u16;
    let mut next_free: Option<Instant> = None;
    #[cfg(feature = "planted-bugs")]
    let capacity =
        if crate::testing::planted::active(crate::testing::planted::PlantedBug::SlotPastCapacity) {
            capacity.saturating_add(1)
        } else {
            capacity
        };
    for slot in 0..capacity {
        match slot_held(now, table, &ask.name, slot) {
            None => {
                free += 1;
                if slots.len() < wanted {
                    slots.push(slot);
                }
            }
            Some(until) => {
                if until > now {
                    next_free = Some(next_free.map_or(until, |at| at.min(until)));
                }
            }
        }
    }
    if slots.len() < wanted {
        return Grant::TooFew(next_free);
    }
    let keys: Vec<Key> = slots
        .iter()
        .filter_map(|&slot| slot_key(&ask.name, slot))
        .collect();
    let (Ok(keys), Some(slots)) = (KeyGroup::new(keys), Slots::new(&slots)) else {
        debug_assert!(false, "slot keys of a checked name form a key set");
        return Grant::Busy;
    };
    let options = AcquireOptions {
        wait_s: 0,
        lease_s: ask.lease_s,
        holder: ask.holder,
        max_hold: ask.max_hold,
    };
    #[cfg(feature = "planted-bugs")]
    let slots = if crate::testing::planted::active(
        crate::testing::planted::PlantedBug::ReportLowestSlots,
    ) {
        let lowest: Vec<u16> = (0..u16::from(ask.permits)).collect();
        Slots::new(&lowest).unwrap_or(slots)
    } else {
        slots
    };
    match table.acquire_with(now, waiter, &keys, &options) {
        AcquireOutcome::Granted { token } => {
            let lease_deadline = keys
                .keys()
                .first()
                .and_then(|key| table.holder(key.as_bytes()))
                .map_or(now, |(_, deadline)| deadline);
            let grant = PermitGrant {
                token,
                slots,
                keys,
                free: free - u16::from(ask.permits),
            };
            Grant::Made(grant, lease_deadline)
        }
        // Every slot looked free: only a limit says no.
        AcquireOutcome::Busy | AcquireOutcome::TimedOut | AcquireOutcome::Queued => Grant::Busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{LockConfig, ReleaseOutcome};

    const LIMITS: SemaphoreLimits = SemaphoreLimits {
        semaphores_max: 4,
        waiters_per_semaphore_max: 8,
        waiters_total_max: 16,
    };

    fn at(ms: u64) -> Instant {
        Instant::from_micros(1_000_000_000 + ms * 1_000)
    }

    struct World {
        table: LockTable,
        sems: Semaphores,
        next_waiter: u64,
    }

    impl World {
        fn new() -> Self {
            World::with_limits(LIMITS)
        }
        fn with_limits(limits: SemaphoreLimits) -> Self {
            World {
                table: LockTable::new(LockConfig::default(), 1_000, at(0)),
                sems: Semaphores::new(limits, Duration::from_millis(100)),
                next_waiter: 1,
            }
        }
        fn ask(
            &mut self,
            now: Instant,
            name: &str,
            permits: u8,
            capacity: u16,
            wait_s: u8,
        ) -> (WaiterId, PermitOutcome) {
            let waiter = WaiterId(self.next_waiter);
            self.next_waiter += 1;
            let ask = PermitAsk {
                name: Key::from_text(name).unwrap(),
                permits,
                capacity,
                wait_s,
                lease_s: 10,
                holder: waiter.0,
                max_hold: None,
            };
            (waiter, self.sems.acquire(now, &mut self.table, waiter, ask))
        }
        fn release(&mut self, now: Instant, grant: &PermitGrant) {
            let outcome = self.table.release(now, &grant.keys, grant.token);
            assert_eq!(outcome, ReleaseOutcome::Released);
            self.sems.keys_freed(grant.keys.keys());
            self.sems.serve(now, &mut self.table);
        }
        fn events(&mut self) -> Vec<PermitEvent> {
            std::iter::from_fn(|| self.sems.poll_event()).collect()
        }
    }

    fn granted(outcome: PermitOutcome) -> PermitGrant {
        match outcome {
            PermitOutcome::Granted(grant) => grant,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn permits_take_the_lowest_free_slots_under_one_token() {
        let mut w = World::new();
        let a = granted(w.ask(at(0), "jobs", 2, 5, 0).1);
        assert_eq!(a.slots.as_slice(), &[0, 1]);
        assert_eq!(a.free, 3);
        assert_eq!(a.keys.keys()[0].as_bytes(), b"jobs[0000]");
        let b = granted(w.ask(at(0), "jobs", 1, 5, 0).1);
        assert_eq!(b.slots.as_slice(), &[2]);
        assert!(b.token > a.token);
        w.release(at(1), &a);
        let c = granted(w.ask(at(1), "jobs", 3, 5, 0).1);
        assert_eq!(c.slots.as_slice(), &[0, 1, 3]);
        assert_eq!(c.free, 1);
        // Never more than the capacity: one slot left, two wanted.
        assert_eq!(w.ask(at(1), "jobs", 2, 5, 0).1, PermitOutcome::TimedOut);
    }

    #[test]
    fn a_multi_permit_head_blocks_smaller_requests_behind_it() {
        let mut w = World::new();
        let first = granted(w.ask(at(0), "s", 2, 3, 0).1);
        // One slot free; the head wants two and waits.
        let (big, outcome) = w.ask(at(0), "s", 2, 3, 30);
        assert_eq!(outcome, PermitOutcome::Queued);
        // One permit would fit now, but FIFO puts it behind the head.
        let (small, outcome) = w.ask(at(0), "s", 1, 3, 30);
        assert_eq!(outcome, PermitOutcome::Queued);
        assert_eq!(w.ask(at(0), "s", 1, 3, 0).1, PermitOutcome::TimedOut);
        w.sems.serve(at(0), &mut w.table);
        assert!(w.events().is_empty(), "nothing granted past the head");
        w.release(at(5), &first);
        let events = w.events();
        assert_eq!(events.len(), 2, "{events:?}");
        let PermitEvent::Granted { waiter, grant, .. } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!((*waiter, grant.slots.as_slice()), (big, &[0, 1][..]));
        let PermitEvent::Granted { waiter, grant, .. } = &events[1] else {
            panic!("{events:?}")
        };
        assert_eq!((*waiter, grant.slots.as_slice()), (small, &[2][..]));
    }

    #[test]
    fn another_capacity_is_refused_while_in_use_and_taken_once_unused() {
        let mut w = World::new();
        let grant = granted(w.ask(at(0), "s", 1, 3, 0).1);
        assert_eq!(
            w.ask(at(0), "s", 1, 5, 0).1,
            PermitOutcome::CapacityMismatch { capacity: 3 }
        );
        w.release(at(1), &grant);
        // Nobody uses it: the new capacity is the one now.
        let grant = granted(w.ask(at(1), "s", 4, 5, 0).1);
        assert_eq!(grant.slots.as_slice(), &[0, 1, 2, 3]);
        assert_eq!(
            w.ask(at(1), "s", 1, 3, 0).1,
            PermitOutcome::CapacityMismatch { capacity: 5 }
        );
    }

    #[test]
    fn a_lease_running_out_frees_its_slots_for_the_head() {
        let mut w = World::new();
        granted(w.ask(at(0), "s", 1, 1, 0).1);
        let (waiter, outcome) = w.ask(at(0), "s", 1, 1, 60);
        assert_eq!(outcome, PermitOutcome::Queued);
        w.sems.serve(at(0), &mut w.table);
        // The recheck comes due at the lease's end (10 s), not before.
        assert_eq!(w.sems.poll_timeout(), Some(at(10_000)));
        w.sems.serve(at(9_999), &mut w.table);
        assert!(w.events().is_empty());
        w.sems.serve(at(10_000), &mut w.table);
        let events = w.events();
        assert!(
            matches!(&events[..], [PermitEvent::Granted { waiter: got, grant, .. }] if *got == waiter && grant.slots.as_slice() == [0]),
            "{events:?}"
        );
    }

    #[test]
    fn a_wait_runs_out_with_t_and_unblocks_the_queue_behind_it() {
        let mut w = World::new();
        granted(w.ask(at(0), "s", 2, 3, 0).1);
        let (head, _) = w.ask(at(0), "s", 2, 3, 1);
        let (next, _) = w.ask(at(0), "s", 1, 3, 30);
        w.sems.serve(at(0), &mut w.table);
        assert!(w.events().is_empty());
        // Answered a margin before the bound.
        w.sems.serve(at(900), &mut w.table);
        let events = w.events();
        assert_eq!(events[0], PermitEvent::TimedOut { waiter: head });
        assert!(
            matches!(&events[1], PermitEvent::Granted { waiter, grant, .. } if *waiter == next && grant.slots.as_slice() == [2]),
            "{events:?}"
        );
        assert_eq!(w.sems.waiter_count(), 0);
    }

    #[test]
    fn a_cancelled_head_lets_the_next_one_in() {
        let mut w = World::new();
        granted(w.ask(at(0), "s", 2, 3, 0).1);
        let (head, _) = w.ask(at(0), "s", 2, 3, 30);
        let (next, _) = w.ask(at(0), "s", 1, 3, 30);
        assert!(w.sems.cancel(head));
        assert!(!w.sems.cancel(head));
        w.sems.serve(at(1), &mut w.table);
        let events = w.events();
        assert!(
            matches!(&events[..], [PermitEvent::Granted { waiter, .. }] if *waiter == next),
            "{events:?}"
        );
    }

    #[test]
    fn a_force_released_permit_is_handed_to_the_head() {
        let mut w = World::new();
        let held = granted(w.ask(at(0), "s", 1, 1, 0).1);
        let (waiter, _) = w.ask(at(0), "s", 1, 1, 30);
        let key = held.keys.keys()[0].clone();
        let outcome = w
            .table
            .force_release(at(1), key.as_bytes(), Some(held.token));
        assert!(
            matches!(
                outcome,
                crate::inspect::ForceReleaseOutcome::Released { .. }
            ),
            "{outcome:?}"
        );
        w.sems.keys_freed(std::slice::from_ref(&key));
        w.sems.serve(at(1), &mut w.table);
        let events = w.events();
        assert!(
            matches!(&events[..], [PermitEvent::Granted { waiter: got, grant, .. }] if *got == waiter && grant.token > held.token),
            "{events:?}"
        );
    }

    #[test]
    fn limits_answer_busy_and_leave_nothing_behind() {
        let mut w = World::new();
        for name in ["a", "b", "c", "d"] {
            granted(w.ask(at(0), name, 1, 1, 0).1);
        }
        assert_eq!(w.ask(at(0), "e", 1, 1, 0).1, PermitOutcome::Busy);
        // Once one is unused, room is made for a new one.
        let later = at(20_000);
        granted(w.ask(later, "e", 1, 1, 0).1);
        for _ in 0..LIMITS.waiters_per_semaphore_max {
            assert_eq!(w.ask(later, "e", 1, 1, 30).1, PermitOutcome::Queued);
        }
        assert_eq!(w.ask(later, "e", 1, 1, 30).1, PermitOutcome::Busy);
        // Each refusal is counted under the limit that made it.
        assert_eq!(
            w.sems.busy(),
            SemaphoreBusy {
                semaphores_max: 1,
                waiters_per_semaphore_max: 1,
                waiters_total_max: 0,
            }
        );
    }

    /// A full registry of wide semaphores: each request for a new name
    /// looks at no more than the sweep's budget of slots (eight semaphores
    /// of 1,024), going on where the last one stopped, so the unused ones
    /// at the end are found by the third request, not by the first one
    /// scanning everything.
    #[test]
    fn the_sweep_for_unused_semaphores_is_bounded_and_goes_round() {
        let mut w = World::with_limits(SemaphoreLimits {
            semaphores_max: 20,
            ..LIMITS
        });
        let names: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        // The last four are taken first: their 10 s leases end first.
        for name in &names[16..] {
            granted(w.ask(at(0), name, 1, 1_024, 0).1);
        }
        for name in &names[..16] {
            granted(w.ask(at(9_000), name, 1, 1_024, 0).1);
        }
        let later = at(15_000);
        let outcomes: Vec<bool> = (0..3)
            .map(|_| matches!(w.ask(later, "new", 1, 1, 0).1, PermitOutcome::Granted(_)))
            .collect();
        assert_eq!(outcomes, [false, false, true]);
        assert_eq!(w.sems.by_name.len(), 17, "the four unused ones forgotten");
        assert_eq!(w.sems.busy().semaphores_max, 2);
    }

    #[test]
    fn only_slot_shaped_keys_name_a_semaphore() {
        assert_eq!(semaphore_of(b"jobs[0012]"), Some(&b"jobs"[..]));
        assert_eq!(semaphore_of(b"[0012]"), None);
        assert_eq!(semaphore_of(b"jobs[00a2]"), None);
        assert_eq!(semaphore_of(b"jobs"), None);
    }
}
