//! The lock table against a naive reference model, driven by arbitrary
//! operation sequences (the `sim_lock_table` fuzz target). The model and the
//! harness are those of `core/tests/lock_matrix.rs` (a proptest there);
//! here a fuzzer's bytes choose the operations. Panics on any difference.

use ticketing_core::lock::{
    AcquireOutcome, Limits, LockConfig, LockEvent, LockTable, ReleaseOutcome, WaiterId,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Key, KeyGroup};

const FIRST_TOKEN: u64 = 1_700_000_000_000_000;
/// Runs start away from the clock's origin so that "before" is expressible.
const START_US: u64 = 1_000_000_000;
const SECOND_US: u64 = 1_000_000;
const MARGIN_US: u64 = 100_000;

use ticketing_core::lock_model as model;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        key_mask: u8,
        wait_s: u8,
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

const UNIVERSE: [&str; 4] = ["a", "b", "c", "d"];

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

/// A grant seen from outside, for the safety checks.
struct SeenGrant {
    token: u64,
    keys: Vec<Vec<u8>>,
    lease_deadline_us: u64,
    released: bool,
}

struct Harness {
    table: LockTable,
    model: model::Model,
    now_us: u64,
    next_waiter: u64,
    /// Queued waiters (id → keys, lease) not yet resolved.
    queued: Vec<(WaiterId, Vec<Vec<u8>>, u8)>,
    grants: Vec<SeenGrant>,
    last_token: u64,
}

impl Harness {
    fn new(config: LockConfig) -> Harness {
        Harness {
            table: LockTable::new(config, FIRST_TOKEN, Instant::from_micros(START_US)),
            model: model::Model::new(config, FIRST_TOKEN, START_US),
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
    fn record_grant(&mut self, token: u64, keys: Vec<Vec<u8>>, lease_s: u8) {
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
            lease_deadline_us: self.now_us + u64::from(lease_s) * SECOND_US,
            released: false,
        });
    }

    fn run(&mut self, op: &Op) {
        let now = self.now();
        match *op {
            Op::Acquire {
                key_mask,
                wait_s,
                lease_s,
            } => {
                let names = names(key_mask);
                let id = WaiterId(self.next_waiter);
                self.next_waiter += 1;
                let got = self
                    .table
                    .acquire(now, id, key_group(&names), wait_s, lease_s);
                let want = self.model.acquire(self.now_us, id, &names, wait_s, lease_s);
                assert_eq!(got, want, "acquire {names:?}");
                self.check_events();
                match got {
                    AcquireOutcome::Granted { token } => self.record_grant(token, names, lease_s),
                    AcquireOutcome::Queued => self.queued.push((id, names, lease_s)),
                    AcquireOutcome::TimedOut | AcquireOutcome::Busy => {}
                }
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
            let (_, names, lease_s) = self.queued.remove(index);
            if let LockEvent::Granted { token, .. } = event {
                self.record_grant(token, names, lease_s);
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
}

/// Reads one operation from `data`, or `None` when it is used up.
fn next_op(data: &mut &[u8]) -> Option<Op> {
    let (&kind, rest) = data.split_first()?;
    *data = rest;
    let mut byte = || {
        let (&first, rest) = data.split_first().unwrap_or((&0, &[]));
        *data = rest;
        first
    };
    Some(match kind % 21 {
        0..=5 => Op::Acquire {
            key_mask: 1 + byte() % 15,
            wait_s: byte() % 4,
            lease_s: 1 + byte() % 3,
        },
        6..=8 => Op::ReleaseGrant {
            pick: usize::from(byte()),
        },
        9 => Op::ReleaseOther {
            pick: usize::from(byte()),
            key_mask: 1 + byte() % 15,
        },
        10 => Op::ReleaseBogus {
            key_mask: 1 + byte() % 15,
            token: u64::from(byte()),
        },
        11 | 12 => Op::Cancel {
            pick: usize::from(byte()),
        },
        13..=15 => Op::Sleep {
            micros: match byte() % 3 {
                0 => u64::from(byte()) * 8,
                1 => u64::from(byte()) * 6_000,
                _ => u64::from(byte()) * 32_000,
            },
        },
        16 | 17 => Op::HandleTimeout,
        18 | 19 => Op::JumpToDeadline,
        _ => Op::TimeOutAll,
    })
}

/// Drives a [`LockTable`] and the reference model with the operations
/// `data` encodes (first byte: limits) and panics on any difference in
/// outcomes, events, holders, queues, stats or deadlines, on a token that
/// does not rise, on two live grants of a key, and if waits or keys outlive
/// every deadline.
pub fn sim_lock_table(data: &[u8]) {
    let Some((&limits_byte, mut data)) = data.split_first() else {
        return;
    };
    let limits = if limits_byte & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_keys: 1 + usize::from(limits_byte >> 1) % 5,
            max_waiters_per_key: 1 + usize::from(limits_byte >> 4) % 3,
            max_waiters_total: 1 + usize::from(limits_byte >> 6) % 5,
        }
    };
    let config = LockConfig {
        limits,
        wait_margin: Duration::from_micros(MARGIN_US),
        sweep_interval: Duration::from_secs(5),
    };
    let mut harness = Harness::new(config);
    // Bounded, so one input is one short run.
    for _ in 0..512 {
        let Some(op) = next_op(&mut data) else {
            break;
        };
        harness.run(&op);
    }
    // Liveness: with time, every wait ends and every key goes away.
    harness.now_us += 300 * SECOND_US;
    harness.run(&Op::HandleTimeout);
    assert!(harness.queued.is_empty(), "waiters outlived every deadline");
    harness.now_us += 10 * SECOND_US;
    harness.run(&Op::HandleTimeout);
    assert_eq!(harness.table.stats().keys, 0, "keys outlived every lease");
}
