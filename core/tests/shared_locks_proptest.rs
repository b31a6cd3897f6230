//! Random sequences of shared and exclusive acquires (single keys and sets
//! mixing modes), releases, downgrades, force-releases, cancels and clock
//! jumps: an exclusive holder never has anyone beside it on its key, and
//! every key grants in arrival order (no waiter passes an earlier one on a
//! key they share, and a newcomer passes nobody).

use std::collections::BTreeMap;

use proptest::prelude::*;
use ticketing_core::inspect::ForceReleaseOutcome;
use ticketing_core::lock::{
    AcquireOptions, AcquireOutcome, KeyModes, LockConfig, LockEvent, LockTable, ReleaseOutcome,
    WaiterId,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Key, KeyGroup};

const KEYS: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    /// Keys as a bit mask over `KEYS` (non-empty), modes as a mask over
    /// the chosen keys in order.
    Acquire {
        keys: u8,
        modes: u16,
        wait_s: u8,
        lease_s: u8,
    },
    /// Release the n-th live grant (modulo their number).
    Release(usize),
    Downgrade(usize),
    ForceRelease {
        key: usize,
        by_token: Option<usize>,
    },
    Cancel(usize),
    AdvanceMs(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u8..8, any::<u16>(), 0u8..4, 1u8..6).prop_map(|(keys, modes, wait_s, lease_s)| {
            Op::Acquire { keys, modes, wait_s, lease_s }
        }),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Downgrade),
        1 => (0usize..3, proptest::option::of(any::<usize>()))
            .prop_map(|(key, by_token)| Op::ForceRelease { key, by_token }),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (0u64..3_000).prop_map(Op::AdvanceMs),
    ]
}

/// A grant as the test saw it made: keys with their mode, lease end.
#[derive(Clone, Debug)]
struct Grant {
    keys: Vec<(usize, bool)>,
    deadline: Instant,
}

/// A queued request: its arrival number, keys and modes, lease.
#[derive(Clone, Debug)]
struct Queued {
    arrival: u64,
    keys: Vec<(usize, bool)>,
    lease_s: u8,
}

#[derive(Default)]
struct Model {
    grants: BTreeMap<u64, Grant>,
    queued: BTreeMap<u64, Queued>,
    next_id: u64,
}

impl Model {
    fn live_grants(&self, now: Instant) -> Vec<u64> {
        self.grants
            .iter()
            .filter(|(_, grant)| grant.deadline > now)
            .map(|(&token, _)| token)
            .collect()
    }

    /// No exclusive holder beside any other live holder of its key.
    fn check_exclusion(&self, now: Instant) {
        for key in 0..KEYS.len() {
            let holders: Vec<(u64, bool)> = self
                .grants
                .iter()
                .filter(|(_, grant)| grant.deadline > now)
                .filter_map(|(&token, grant)| {
                    let (_, shared) = grant.keys.iter().find(|(k, _)| *k == key)?;
                    Some((token, *shared))
                })
                .collect();
            if holders.iter().any(|&(_, shared)| !shared) {
                assert_eq!(
                    holders.len(),
                    1,
                    "exclusive holder beside others on {key}: {holders:?}"
                );
            }
        }
    }

    /// `keys` granted to a request that arrived as `arrival` (`None`: a
    /// newcomer): nobody earlier still waits on any of them.
    fn check_fifo(&self, arrival: Option<u64>, keys: &[(usize, bool)]) {
        for queued in self.queued.values() {
            let earlier = arrival.is_none_or(|arrival| queued.arrival < arrival);
            let shares_key = queued
                .keys
                .iter()
                .any(|(k, _)| keys.iter().any(|(g, _)| g == k));
            assert!(!(earlier && shares_key), "a grant passed waiter {queued:?}");
        }
    }
}

fn keys_of(mask: u8, modes: u16) -> Vec<(usize, bool)> {
    (0..KEYS.len())
        .filter(|i| mask & (1 << i) != 0)
        .enumerate()
        .map(|(n, i)| (i, modes & (1 << n) != 0))
        .collect()
}

fn group(keys: &[(usize, bool)]) -> KeyGroup {
    let keys = keys
        .iter()
        .map(|&(i, _)| Key::new(KEYS[i].as_bytes()).unwrap())
        .collect();
    KeyGroup::new(keys).unwrap()
}

fn drain(table: &mut LockTable, model: &mut Model, now: Instant) {
    while let Some((event, lease)) = table.poll_event_lease() {
        match event {
            LockEvent::Granted { waiter, token } => {
                let queued = model
                    .queued
                    .remove(&waiter.0)
                    .expect("granted a known waiter");
                model.check_fifo(Some(queued.arrival), &queued.keys);
                let deadline = lease.expect("a grant has a lease");
                assert_eq!(
                    deadline,
                    now.saturating_add(Duration::from_secs(u64::from(queued.lease_s)))
                );
                model.grants.insert(
                    token,
                    Grant {
                        keys: queued.keys,
                        deadline,
                    },
                );
                model.check_exclusion(now);
            }
            LockEvent::TimedOut { waiter } => {
                model.queued.remove(&waiter.0);
            }
        }
    }
}

fn run(ops: Vec<Op>) {
    let mut now = Instant::from_micros(1_000_000_000);
    let mut table = LockTable::new(LockConfig::default(), 1, now);
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Acquire {
                keys,
                modes,
                wait_s,
                lease_s,
            } => {
                let keys = keys_of(keys, modes);
                let id = model.next_id;
                model.next_id += 1;
                let options = AcquireOptions {
                    wait_s,
                    lease_s,
                    holder: 0,
                    max_hold: None,
                };
                let bits = keys
                    .iter()
                    .enumerate()
                    .fold(0u16, |bits, (n, (_, shared))| {
                        bits | (u16::from(*shared) << n)
                    });
                // The clock moves inside the call first: drain what it did.
                table.handle_timeout(now);
                drain(&mut table, &mut model, now);
                let outcome = table.acquire_in_modes(
                    now,
                    WaiterId(id),
                    &group(&keys),
                    &options,
                    KeyModes::from_bits(bits),
                );
                match outcome {
                    AcquireOutcome::Granted { token } => {
                        model.check_fifo(None, &keys);
                        let deadline = now.saturating_add(Duration::from_secs(u64::from(lease_s)));
                        model.grants.insert(token, Grant { keys, deadline });
                        model.check_exclusion(now);
                    }
                    AcquireOutcome::Queued => {
                        model.queued.insert(
                            id,
                            Queued {
                                arrival: id,
                                keys,
                                lease_s,
                            },
                        );
                    }
                    AcquireOutcome::TimedOut | AcquireOutcome::Busy => {}
                }
            }
            Op::Release(n) => {
                let live = model.live_grants(now);
                if let Some(&token) = live.get(n % live.len().max(1)) {
                    let grant = model.grants[&token].clone();
                    let outcome = table.release(now, &group(&grant.keys), token);
                    assert_eq!(outcome, ReleaseOutcome::Released);
                    model.grants.remove(&token);
                }
            }
            Op::Downgrade(n) => {
                let live = model.live_grants(now);
                if let Some(&token) = live.get(n % live.len().max(1)) {
                    let grant = model.grants.get_mut(&token).expect("live");
                    table.downgrade(now, &group(&grant.keys), token);
                    for (_, shared) in &mut grant.keys {
                        *shared = true;
                    }
                }
            }
            Op::ForceRelease { key, by_token } => {
                let live = model.live_grants(now);
                let token = by_token.and_then(|n| live.get(n % live.len().max(1)).copied());
                if let ForceReleaseOutcome::Released { revoked, .. } =
                    table.force_release(now, KEYS[key].as_bytes(), token)
                {
                    let grant = model
                        .grants
                        .remove(&revoked)
                        .expect("revoked a known grant");
                    assert!(grant.keys.iter().any(|(k, _)| *k == key));
                    assert!(grant.deadline > now);
                }
            }
            Op::Cancel(n) => {
                let ids: Vec<u64> = model.queued.keys().copied().collect();
                if let Some(&id) = ids.get(n % ids.len().max(1)) {
                    assert!(table.cancel(now, WaiterId(id)));
                    model.queued.remove(&id);
                }
            }
            Op::AdvanceMs(ms) => {
                now = now.saturating_add(Duration::from_millis(ms));
                table.handle_timeout(now);
            }
        }
        drain(&mut table, &mut model, now);
        model.check_exclusion(now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn no_exclusive_holder_beside_another_and_grants_keep_fifo(
        ops in proptest::collection::vec(op_strategy(), 1..150),
    ) {
        run(ops);
    }
}
