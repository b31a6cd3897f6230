//! The lock table's rules written the slow, obvious way — vectors, linear
//! scans, no heaps, every sweep run one by one — as a reference model, and
//! the [`Harness`] that applies each [`Op`] to a real [`LockTable`] and to
//! the model and compares them. Two drivers share it: the property test in
//! `core/tests/lock_matrix.rs` (ops from proptest strategies) and the
//! simulator's `sim_lock_table` fuzz target (ops decoded from bytes). Not
//! part of the API.
#![allow(missing_docs)]

use crate::lock::{
    AcquireOptions, AcquireOutcome, ExtendOutcome, Limits, LockConfig, LockEvent, LockStats,
    LockTable, ReleaseOutcome, WaiterId,
};
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup};

const SECOND_US: u64 = 1_000_000;
pub struct ModelKey {
    pub name: Vec<u8>,
    pub token: u64,
    pub lease_deadline_us: u64,
    pub group_len: usize,
    pub queue: Vec<u64>,
    /// The holder's cap on total hold, if its grant has one.
    pub cap_us: Option<u64>,
}

pub struct ModelWaiter {
    pub seq: u64,
    pub id: WaiterId,
    pub keys: Vec<Vec<u8>>,
    pub lease_s: u8,
    pub max_hold_s: Option<u8>,
    pub wait_deadline_us: u64,
}

pub struct Model {
    pub limits: Limits,
    pub margin_us: u64,
    pub sweep_interval_us: u64,
    pub next_sweep_us: u64,
    pub next_token: u64,
    pub next_seq: u64,
    pub last_now_us: u64,
    pub keys: Vec<ModelKey>,
    pub waiters: Vec<ModelWaiter>,
    pub events: Vec<LockEvent>,
}

fn held_at(key: &ModelKey, at_us: u64) -> bool {
    key.token != 0 && key.lease_deadline_us > at_us
}

/// The cap instant and first lease deadline of a grant made at `now_us`.
fn first_lease(now_us: u64, lease_s: u8, max_hold_s: Option<u8>) -> (Option<u64>, u64) {
    let cap_us = max_hold_s.map(|cap| now_us + u64::from(cap) * SECOND_US);
    let lease_us = now_us + u64::from(lease_s) * SECOND_US;
    (cap_us, cap_us.map_or(lease_us, |cap| cap.min(lease_us)))
}

impl Model {
    pub fn new(config: LockConfig, first_token: u64, now_us: u64) -> Model {
        let sweep_interval_us = config.sweep_interval.as_micros() as u64;
        Model {
            limits: config.limits,
            margin_us: config.wait_margin.as_micros() as u64,
            sweep_interval_us,
            next_sweep_us: now_us + sweep_interval_us,
            next_token: first_token,
            next_seq: 0,
            last_now_us: now_us,
            keys: Vec::new(),
            waiters: Vec::new(),
            events: Vec::new(),
        }
    }

    fn key(&self, name: &[u8]) -> Option<&ModelKey> {
        self.keys.iter().find(|key| key.name == name)
    }

    fn key_mut(&mut self, name: &[u8]) -> Option<&mut ModelKey> {
        self.keys.iter_mut().find(|key| key.name == name)
    }

    fn advance(&mut self, now_us: u64) -> u64 {
        let now_us = now_us.max(self.last_now_us);
        self.last_now_us = now_us;
        loop {
            let wait = self
                .waiters
                .iter()
                .filter(|w| w.wait_deadline_us <= now_us)
                .map(|w| (w.wait_deadline_us, w.seq))
                .min();
            let lease = self
                .keys
                .iter()
                .filter(|k| k.token != 0 && !k.queue.is_empty())
                .filter(|k| k.lease_deadline_us <= now_us)
                .map(|k| (k.lease_deadline_us, k.token, k.name.clone()))
                .min();
            let sweep = (self.next_sweep_us <= now_us).then_some(self.next_sweep_us);
            // Ties: wait deadlines, then lease deadlines, then the sweep.
            let mut next: Option<(u64, u8)> = wait.map(|(t, _)| (t, 0));
            if let Some((t, _, _)) = lease
                && next.is_none_or(|(best, _)| t < best)
            {
                next = Some((t, 1));
            }
            if let Some(t) = sweep
                && next.is_none_or(|(best, _)| t < best)
            {
                next = Some((t, 2));
            }
            match next {
                None => break,
                Some((t, 0)) => self.remove_waiter(wait.unwrap().1, t, now_us, true),
                Some((t, 1)) => {
                    let name = lease.unwrap().2;
                    self.key_mut(&name).unwrap().token = 0;
                    self.grant_front(&name, t, now_us);
                }
                Some((t, _)) => {
                    self.keys.retain(|k| !k.queue.is_empty() || held_at(k, t));
                    self.next_sweep_us += self.sweep_interval_us;
                }
            }
        }
        now_us
    }

    fn remove_waiter(&mut self, seq: u64, at_us: u64, now_us: u64, timed_out: bool) {
        let index = self.waiters.iter().position(|w| w.seq == seq).unwrap();
        let waiter = self.waiters.remove(index);
        if timed_out {
            self.events.push(LockEvent::TimedOut { waiter: waiter.id });
        }
        let mut fronts = Vec::new();
        for name in &waiter.keys {
            let key = self.key_mut(name).unwrap();
            let position = key.queue.iter().position(|&s| s == seq).unwrap();
            key.queue.remove(position);
            if position == 0 {
                fronts.push(name.clone());
            }
            if key.queue.is_empty() && key.token == 0 {
                self.keys.retain(|k| k.name != *name);
            }
        }
        for name in fronts {
            self.grant_front(&name, at_us, now_us);
        }
    }

    fn grant_front(&mut self, name: &[u8], at_us: u64, now_us: u64) {
        let Some(key) = self.key(name) else { return };
        if held_at(key, at_us) {
            return;
        }
        let Some(&seq) = key.queue.first() else {
            return;
        };
        let index = self.waiters.iter().position(|w| w.seq == seq).unwrap();
        let all_ready = self.waiters[index].keys.iter().all(|name| {
            let key = self.key(name).unwrap();
            key.queue.first() == Some(&seq) && !held_at(key, at_us)
        });
        if !all_ready {
            return;
        }
        let waiter = self.waiters.remove(index);
        let token = self.next_token;
        self.next_token += 1;
        let (cap_us, deadline_us) = first_lease(now_us, waiter.lease_s, waiter.max_hold_s);
        for name in &waiter.keys {
            let key = self.key_mut(name).unwrap();
            key.queue.remove(0);
            key.token = token;
            key.lease_deadline_us = deadline_us;
            key.group_len = waiter.keys.len();
            key.cap_us = cap_us;
        }
        self.events.push(LockEvent::Granted {
            waiter: waiter.id,
            token,
        });
    }

    pub fn acquire(
        &mut self,
        now_us: u64,
        id: WaiterId,
        names: &[Vec<u8>],
        wait_s: u8,
        lease_s: u8,
    ) -> AcquireOutcome {
        self.acquire_capped(now_us, id, names, (wait_s, lease_s), None)
    }

    /// [`Model::acquire`] with a cap on total hold of `max_hold_s`.
    pub fn acquire_capped(
        &mut self,
        now_us: u64,
        id: WaiterId,
        names: &[Vec<u8>],
        (wait_s, lease_s): (u8, u8),
        max_hold_s: Option<u8>,
    ) -> AcquireOutcome {
        let now_us = self.advance(now_us);
        let new_keys = names.iter().filter(|n| self.key(n).is_none()).count();
        let all_free = names.iter().all(|n| {
            self.key(n)
                .is_none_or(|k| k.queue.is_empty() && !held_at(k, now_us))
        });
        let over_keys = self.keys.len() + new_keys > self.limits.keys_max;
        if all_free {
            if over_keys {
                return AcquireOutcome::Busy;
            }
            let token = self.next_token;
            self.next_token += 1;
            let (cap_us, deadline_us) = first_lease(now_us, lease_s, max_hold_s);
            for name in names {
                if self.key(name).is_none() {
                    self.keys.push(ModelKey {
                        name: name.clone(),
                        token: 0,
                        lease_deadline_us: 0,
                        group_len: 0,
                        queue: Vec::new(),
                        cap_us: None,
                    });
                }
                let key = self.key_mut(name).unwrap();
                key.token = token;
                key.lease_deadline_us = deadline_us;
                key.group_len = names.len();
                key.cap_us = cap_us;
            }
            return AcquireOutcome::Granted { token };
        }
        if wait_s == 0 {
            return AcquireOutcome::TimedOut;
        }
        let queue_full = names.iter().any(|n| {
            self.key(n)
                .is_some_and(|k| k.queue.len() >= self.limits.waiters_per_key_max)
        });
        if over_keys || queue_full || self.waiters.len() >= self.limits.waiters_total_max {
            return AcquireOutcome::Busy;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for name in names {
            if self.key(name).is_none() {
                self.keys.push(ModelKey {
                    name: name.clone(),
                    token: 0,
                    lease_deadline_us: 0,
                    group_len: 0,
                    queue: Vec::new(),
                    cap_us: None,
                });
            }
            let key = self.key_mut(name).unwrap();
            if !held_at(key, now_us) {
                key.token = 0;
            }
            key.queue.push(seq);
        }
        let wait_deadline_us = (now_us + u64::from(wait_s) * SECOND_US)
            .saturating_sub(self.margin_us)
            .max(now_us);
        self.waiters.push(ModelWaiter {
            seq,
            id,
            keys: names.to_vec(),
            lease_s,
            max_hold_s,
            wait_deadline_us,
        });
        AcquireOutcome::Queued
    }

    /// Renews grant `token` on exactly `names` to `now + lease_s`, clipped
    /// to its cap, refused at it; not current unless every named key
    /// carries the token with a running lease and the grant has exactly
    /// these keys.
    pub fn extend(
        &mut self,
        now_us: u64,
        names: &[Vec<u8>],
        token: u64,
        lease_s: u8,
    ) -> ExtendOutcome {
        let now_us = self.advance(now_us);
        let current = token != 0
            && names.iter().all(|n| {
                self.key(n).is_some_and(|k| {
                    k.token == token && held_at(k, now_us) && k.group_len == names.len()
                })
            });
        if !current {
            return ExtendOutcome::NotCurrent;
        }
        let key = self.key(&names[0]).unwrap();
        let wanted_us = now_us + u64::from(lease_s) * SECOND_US;
        let (deadline_us, clipped) = match key.cap_us {
            Some(cap_us) if key.lease_deadline_us >= cap_us => return ExtendOutcome::AtCap,
            Some(cap_us) if wanted_us > cap_us => (cap_us, true),
            _ => (wanted_us, false),
        };
        for name in names {
            self.key_mut(name).unwrap().lease_deadline_us = deadline_us;
        }
        let expires_at = Instant::from_micros(deadline_us);
        if clipped {
            ExtendOutcome::Clipped { expires_at }
        } else {
            ExtendOutcome::Extended { expires_at }
        }
    }

    pub fn release(&mut self, now_us: u64, names: &[Vec<u8>], token: u64) -> ReleaseOutcome {
        let now_us = self.advance(now_us);
        if token == 0 {
            return ReleaseOutcome::NotFound;
        }
        let matched: Vec<&ModelKey> = names
            .iter()
            .filter_map(|n| self.key(n))
            .filter(|k| k.token == token)
            .collect();
        let Some(first) = matched.first() else {
            return ReleaseOutcome::NotFound;
        };
        if matched.len() != names.len() || first.group_len != names.len() {
            return if first.lease_deadline_us > now_us {
                ReleaseOutcome::GroupMismatch
            } else {
                ReleaseOutcome::NotFound
            };
        }
        for name in names {
            let key = self.key_mut(name).unwrap();
            if key.queue.is_empty() {
                self.keys.retain(|k| k.name != *name);
            } else {
                key.token = 0;
            }
        }
        for name in names {
            self.grant_front(name, now_us, now_us);
        }
        ReleaseOutcome::Released
    }

    pub fn cancel(&mut self, now_us: u64, id: WaiterId) -> bool {
        let now_us = self.advance(now_us);
        match self.waiters.iter().find(|w| w.id == id) {
            Some(waiter) => {
                self.remove_waiter(waiter.seq, now_us, now_us, false);
                true
            }
            None => false,
        }
    }

    pub fn time_out_all_waiters(&mut self, now_us: u64) {
        self.advance(now_us);
        self.waiters.sort_by_key(|w| w.seq);
        for waiter in self.waiters.drain(..) {
            self.events.push(LockEvent::TimedOut { waiter: waiter.id });
        }
        for key in &mut self.keys {
            key.queue.clear();
        }
        self.keys.retain(|k| k.token != 0);
    }

    pub fn handle_timeout(&mut self, now_us: u64) {
        self.advance(now_us);
    }

    pub fn poll_timeout(&self) -> u64 {
        let wait = self.waiters.iter().map(|w| w.wait_deadline_us).min();
        let lease = self
            .keys
            .iter()
            .filter(|k| k.token != 0 && !k.queue.is_empty())
            .map(|k| k.lease_deadline_us)
            .min();
        [wait, lease]
            .into_iter()
            .flatten()
            .fold(self.next_sweep_us, u64::min)
    }

    pub fn stats(&self) -> LockStats {
        LockStats {
            keys: self.keys.len(),
            held_keys: self
                .keys
                .iter()
                .filter(|k| held_at(k, self.last_now_us))
                .count(),
            waiters: self.waiters.len(),
            next_token: self.next_token,
        }
    }

    pub fn holder(&self, name: &[u8]) -> Option<(u64, u64)> {
        self.key(name)
            .filter(|k| k.token != 0)
            .map(|k| (k.token, k.lease_deadline_us))
    }

    pub fn queue_len(&self, name: &[u8]) -> usize {
        self.key(name).map_or(0, |k| k.queue.len())
    }
}

// ---------------------------------------------------------------------------
// The harness: one operation applied to the table and the model, compared.
// ---------------------------------------------------------------------------

/// The first fencing token the harness's table and model hand out.
pub const FIRST_TOKEN: u64 = 1_700_000_000_000_000;
/// Runs start away from the clock's origin so that "before" is expressible.
pub const START_US: u64 = 1_000_000_000;
const MARGIN_US: u64 = 100_000;

/// The keys every operation draws from; bit `i` of a `key_mask` is
/// `UNIVERSE[i]`.
pub const UNIVERSE: [&str; 4] = ["a", "b", "c", "d"];

/// The configuration every harness run uses, with `limits`.
pub fn harness_config(limits: Limits) -> LockConfig {
    LockConfig {
        limits,
        wait_margin: Duration::from_micros(MARGIN_US),
        sweep_interval: Duration::from_secs(5),
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    Acquire {
        key_mask: u8,
        wait_s: u8,
        lease_s: u8,
    },
    /// An acquire with a cap on total hold.
    AcquireCapped {
        key_mask: u8,
        wait_s: u8,
        lease_s: u8,
        max_hold_s: u8,
    },
    /// Extend the grant `pick` (modulo grants seen) under its own group.
    ExtendGrant {
        pick: usize,
        lease_s: u8,
    },
    /// Extend under the token of grant `pick` but an arbitrary group.
    ExtendOther {
        pick: usize,
        key_mask: u8,
        lease_s: u8,
    },
    /// Release the grant `pick` (modulo grants seen) under its own group.
    ReleaseGrant {
        pick: usize,
    },
    /// Release under the token of grant `pick` but an arbitrary group.
    ReleaseOther {
        pick: usize,
        key_mask: u8,
    },
    /// Release with a token that was never issued (or 0).
    ReleaseBogus {
        key_mask: u8,
        token: u64,
    },
    Cancel {
        pick: usize,
    },
    /// Moves the clock without telling the table (a late driver).
    Sleep {
        micros: u64,
    },
    HandleTimeout,
    /// Jumps to the table's own next deadline (a punctual driver).
    JumpToDeadline,
    TimeOutAll,
}

fn names(key_mask: u8) -> Vec<Vec<u8>> {
    UNIVERSE
        .iter()
        .enumerate()
        .filter(|(i, _)| key_mask & (1 << i) != 0)
        .map(|(_, name)| name.as_bytes().to_vec())
        .collect()
}

fn key_group(names: &[Vec<u8>]) -> KeyGroup {
    KeyGroup::new(names.iter().map(|n| Key::new(n).unwrap()).collect()).unwrap()
}

/// A grant's lease and cap on total hold, in seconds, as asked for.
type Lease = (u8, Option<u8>);

/// A grant seen from outside, for the safety checks.
struct SeenGrant {
    token: u64,
    keys: Vec<Vec<u8>>,
    lease_deadline_us: u64,
    released: bool,
}

/// A [`LockTable`] and a [`Model`] driven in lockstep. Every method panics
/// on a difference in outcomes, events, holders, queues, stats or
/// deadlines, on a token that does not rise, and on two live grants of a
/// key.
pub struct Harness {
    table: LockTable,
    model: Model,
    now_us: u64,
    next_waiter: u64,
    /// Queued waiters (id → keys, lease and cap) not yet resolved.
    queued: Vec<(WaiterId, Vec<Vec<u8>>, Lease)>,
    grants: Vec<SeenGrant>,
    last_token: u64,
}

impl Harness {
    pub fn new(config: LockConfig) -> Harness {
        Harness {
            table: LockTable::new(config, FIRST_TOKEN, Instant::from_micros(START_US)),
            model: Model::new(config, FIRST_TOKEN, START_US),
            now_us: START_US,
            next_waiter: 1,
            queued: Vec::new(),
            grants: Vec::new(),
            last_token: 0,
        }
    }

    fn now(&self) -> Instant {
        Instant::from_micros(self.now_us)
    }

    /// Safety: a new grant is above every earlier token and overlaps no other
    /// grant whose lease is still running and which was not released.
    fn record_grant(&mut self, token: u64, keys: Vec<Vec<u8>>, (lease_s, max_hold_s): Lease) {
        assert!(token > self.last_token, "token {token} not increasing");
        self.last_token = token;
        for other in &self.grants {
            let live = !other.released && other.lease_deadline_us > self.now_us;
            let overlaps = other.keys.iter().any(|k| keys.contains(k));
            assert!(
                !(live && overlaps),
                "token {token} granted over live token {}",
                other.token
            );
        }
        self.grants.push(SeenGrant {
            token,
            keys,
            lease_deadline_us: first_lease(self.now_us, lease_s, max_hold_s).1,
            released: false,
        });
    }

    /// Applies `op` to the table and the model, then compares their state.
    pub fn run(&mut self, op: &Op) {
        let now = self.now();
        match *op {
            Op::Acquire {
                key_mask,
                wait_s,
                lease_s,
            } => self.acquire(key_mask, (wait_s, lease_s), None),
            Op::AcquireCapped {
                key_mask,
                wait_s,
                lease_s,
                max_hold_s,
            } => self.acquire(key_mask, (wait_s, lease_s), Some(max_hold_s)),
            Op::ExtendGrant { pick, lease_s } => {
                if self.grants.is_empty() {
                    return;
                }
                let grant = &self.grants[pick % self.grants.len()];
                let (names, token) = (grant.keys.clone(), grant.token);
                self.extend(&names, token, lease_s);
            }
            Op::ExtendOther {
                pick,
                key_mask,
                lease_s,
            } => {
                if self.grants.is_empty() {
                    return;
                }
                let token = self.grants[pick % self.grants.len()].token;
                self.extend(&names(key_mask), token, lease_s);
            }
            Op::ReleaseGrant { pick } => {
                if self.grants.is_empty() {
                    return;
                }
                let grant = &self.grants[pick % self.grants.len()];
                let (names, token) = (grant.keys.clone(), grant.token);
                self.release(&names, token);
            }
            Op::ReleaseOther { pick, key_mask } => {
                if self.grants.is_empty() {
                    return;
                }
                let token = self.grants[pick % self.grants.len()].token;
                self.release(&names(key_mask), token);
            }
            Op::ReleaseBogus { key_mask, token } => self.release(&names(key_mask), token),
            Op::Cancel { pick } => {
                let id = WaiterId(pick as u64 % self.next_waiter);
                let got = self.table.cancel(now, id);
                let want = self.model.cancel(self.now_us, id);
                assert_eq!(got, want, "cancel {id:?}");
                if got {
                    self.queued.retain(|(queued, _, _)| *queued != id);
                }
                self.check_events();
            }
            Op::Sleep { micros } => self.now_us += micros,
            Op::HandleTimeout => {
                self.table.handle_timeout(now);
                self.model.handle_timeout(self.now_us);
                self.check_events();
            }
            Op::JumpToDeadline => {
                let deadline = self.table.poll_timeout().unwrap().as_micros();
                self.now_us = self.now_us.max(deadline);
                self.table.handle_timeout(self.now());
                self.model.handle_timeout(self.now_us);
                self.check_events();
            }
            Op::TimeOutAll => {
                self.table.time_out_all_waiters(now);
                self.model.time_out_all_waiters(self.now_us);
                self.check_events();
                assert!(self.queued.is_empty());
            }
        }
        self.check_state();
    }

    fn acquire(&mut self, key_mask: u8, (wait_s, lease_s): (u8, u8), max_hold_s: Option<u8>) {
        let names = names(key_mask);
        let id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        let now = self.now();
        let got = match max_hold_s {
            None => self
                .table
                .acquire(now, id, key_group(&names), wait_s, lease_s),
            Some(max_hold_s) => {
                let options = AcquireOptions {
                    wait_s,
                    lease_s,
                    holder: 0,
                    max_hold: Some(Duration::from_secs(u64::from(max_hold_s))),
                };
                self.table
                    .acquire_with(now, id, &key_group(&names), &options)
            }
        };
        let want =
            self.model
                .acquire_capped(self.now_us, id, &names, (wait_s, lease_s), max_hold_s);
        assert_eq!(got, want, "acquire {names:?}");
        self.check_events();
        match got {
            AcquireOutcome::Granted { token } => {
                self.record_grant(token, names, (lease_s, max_hold_s));
            }
            AcquireOutcome::Queued => self.queued.push((id, names, (lease_s, max_hold_s))),
            AcquireOutcome::TimedOut | AcquireOutcome::Busy => {}
        }
    }

    /// Safety: only a running grant's own group extends it, and its lease
    /// then ends where both say; the seen grant's deadline moves with it.
    fn extend(&mut self, names: &[Vec<u8>], token: u64, lease_s: u8) {
        let got = self
            .table
            .extend(self.now(), &key_group(names), token, lease_s);
        let want = self.model.extend(self.now_us, names, token, lease_s);
        assert_eq!(got, want, "extend {names:?} with {token}");
        if let Some(expires_at) = got.expires_at() {
            let grant = self.grants.iter_mut().find(|g| g.token == token).unwrap();
            assert!(!grant.released, "token {token} extended after its release");
            assert!(
                grant.lease_deadline_us > self.now_us,
                "token {token} extended after its lease ended"
            );
            assert_eq!(grant.keys, names, "extended under another group");
            grant.lease_deadline_us = expires_at.as_micros();
        }
        self.check_events();
    }

    fn release(&mut self, names: &[Vec<u8>], token: u64) {
        let got = self.table.release(self.now(), &key_group(names), token);
        let want = self.model.release(self.now_us, names, token);
        assert_eq!(got, want, "release {names:?} with {token}");
        if got == ReleaseOutcome::Released {
            let grant = self.grants.iter_mut().find(|g| g.token == token).unwrap();
            assert!(!grant.released, "token {token} released twice");
            assert_eq!(grant.keys, names, "released under another group");
            grant.released = true;
        }
        self.check_events();
    }

    /// Same events as the model, each for a waiter that was queued and is
    /// resolved exactly once.
    fn check_events(&mut self) {
        let got: Vec<LockEvent> = std::iter::from_fn(|| self.table.poll_event()).collect();
        let want = std::mem::take(&mut self.model.events);
        assert_eq!(got, want, "events");
        for event in got {
            let waiter = match event {
                LockEvent::Granted { waiter, .. } | LockEvent::TimedOut { waiter } => waiter,
            };
            let index = self
                .queued
                .iter()
                .position(|(id, _, _)| *id == waiter)
                .expect("event for a waiter that is not queued");
            let (_, names, lease) = self.queued.remove(index);
            if let LockEvent::Granted { token, .. } = event {
                self.record_grant(token, names, lease);
            }
        }
    }

    fn check_state(&self) {
        assert_eq!(self.table.stats(), self.model.stats(), "stats");
        assert_eq!(
            self.table.poll_timeout().map(Instant::as_micros),
            Some(self.model.poll_timeout()),
            "poll_timeout"
        );
        assert_eq!(self.table.stats().waiters, self.queued.len());
        for name in UNIVERSE {
            let name = name.as_bytes();
            assert_eq!(
                self.table
                    .holder(name)
                    .map(|(token, deadline)| (token, deadline.as_micros())),
                self.model.holder(name),
                "holder of {name:?}"
            );
            assert_eq!(self.table.queue_len(name), self.model.queue_len(name));
        }
    }

    /// Liveness: with time, every wait ends and every key goes away. Lets
    /// 300 s pass (past every wait and lease), then 10 s more (a sweep).
    pub fn check_liveness(&mut self) {
        self.now_us += 300 * SECOND_US;
        self.run(&Op::HandleTimeout);
        assert!(self.queued.is_empty(), "waiters outlived every deadline");
        self.now_us += 10 * SECOND_US;
        self.run(&Op::HandleTimeout);
        assert_eq!(self.table.stats().keys, 0, "keys outlived every lease");
    }
}

/// Runs `ops` through a fresh [`Harness`] with [`harness_config`]`(limits)`,
/// then [`Harness::check_liveness`]. Panics on any difference or violation.
pub fn check_ops(limits: Limits, ops: impl IntoIterator<Item = Op>) {
    let mut harness = Harness::new(harness_config(limits));
    for op in ops {
        harness.run(&op);
    }
    harness.check_liveness();
}
