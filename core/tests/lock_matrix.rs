//! The lock table against the request × key-state matrix (PROTOCOL.md §3,
//! seeds/ENGLISH.md page 000), one test per row, plus a property test against
//! a naive reference model. Time is injected and jumped; nothing sleeps.

use proptest::prelude::*;
use ticketing_core::lock::{
    AcquireOutcome, Limits, LockConfig, LockEvent, LockTable, ReleaseOutcome, WaiterId,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Key, KeyGroup};

const FIRST_TOKEN: u64 = 1_700_000_000_000_000;
/// Tests start away from the clock's origin so that "before" is expressible.
const START_US: u64 = 1_000_000_000;
const SECOND_US: u64 = 1_000_000;
const MARGIN_US: u64 = 100_000;

fn group(names: &[&str]) -> KeyGroup {
    let keys = names
        .iter()
        .map(|name| Key::new(name.as_bytes()).unwrap())
        .collect();
    KeyGroup::new(keys).unwrap()
}

fn at(micros_after_start: u64) -> Instant {
    Instant::from_micros(START_US + micros_after_start)
}

fn table() -> LockTable {
    table_with(Limits::default())
}

fn table_with(limits: Limits) -> LockTable {
    let config = LockConfig {
        limits,
        ..LockConfig::default()
    };
    LockTable::new(config, FIRST_TOKEN, at(0))
}

fn events(table: &mut LockTable) -> Vec<LockEvent> {
    std::iter::from_fn(|| table.poll_event()).collect()
}

fn granted(outcome: AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Granted { token } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn single_granted_event(table: &mut LockTable, waiter: WaiterId) -> u64 {
    match events(table).as_slice() {
        [LockEvent::Granted { waiter: got, token }] if *got == waiter => *token,
        other => panic!("expected one grant for {waiter:?}, got {other:?}"),
    }
}

#[test]
fn free_key_is_granted_at_once() {
    let mut table = table();
    let outcome = table.acquire(at(0), WaiterId(1), group(&["a"]), 5, 10);
    assert_eq!(outcome, AcquireOutcome::Granted { token: FIRST_TOKEN });
    assert_eq!(table.holder(b"a"), Some((FIRST_TOKEN, at(10 * SECOND_US))));
    assert_eq!(table.next_token(), FIRST_TOKEN + 1);
    assert!(events(&mut table).is_empty());
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held_keys, stats.waiters), (1, 1, 0));
}

#[test]
fn expired_key_is_granted_to_a_newcomer_with_a_new_larger_token() {
    let mut table = table();
    let first = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 1));
    // Still held one microsecond before the deadline.
    let early = table.acquire(at(SECOND_US - 1), WaiterId(2), group(&["a"]), 0, 1);
    assert_eq!(early, AcquireOutcome::TimedOut);
    let second = granted(table.acquire(at(SECOND_US), WaiterId(3), group(&["a"]), 0, 7));
    assert!(second > first);
    assert_eq!(table.holder(b"a"), Some((second, at(8 * SECOND_US))));
    // The old token is dead.
    assert_eq!(
        table.release(at(SECOND_US), &group(&["a"]), first),
        ReleaseOutcome::NotFound
    );
}

#[test]
fn held_key_with_wait_zero_times_out_at_once_and_queues_nothing() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    let outcome = table.acquire(at(1), WaiterId(2), group(&["a"]), 0, 10);
    assert_eq!(outcome, AcquireOutcome::TimedOut);
    assert_eq!(table.queue_len(b"a"), 0);
    assert_eq!(table.stats().waiters, 0);
    assert_eq!(table.holder(b"a"), Some((token, at(10 * SECOND_US))));
    assert!(events(&mut table).is_empty());
}

#[test]
fn held_key_with_wait_queues_and_release_grants_the_waiter() {
    let mut table = table();
    let first = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    let outcome = table.acquire(at(1), WaiterId(2), group(&["a"]), 5, 20);
    assert_eq!(outcome, AcquireOutcome::Queued);
    assert!(events(&mut table).is_empty());
    assert_eq!(
        table.release(at(SECOND_US), &group(&["a"]), first),
        ReleaseOutcome::Released
    );
    let second = single_granted_event(&mut table, WaiterId(2));
    assert!(second > first);
    // The lease starts at the handoff.
    assert_eq!(table.holder(b"a"), Some((second, at(21 * SECOND_US))));
    assert_eq!(table.stats().waiters, 0);
}

#[test]
fn lease_expiry_grants_the_front_waiter_at_the_deadline_and_not_before() {
    let mut table = table();
    let first = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 2));
    assert_eq!(
        table.acquire(at(0), WaiterId(2), group(&["a"]), 10, 3),
        AcquireOutcome::Queued
    );
    assert_eq!(table.poll_timeout(), Some(at(2 * SECOND_US)));
    table.handle_timeout(at(2 * SECOND_US - 1));
    assert!(events(&mut table).is_empty());
    assert_eq!(table.holder(b"a"), Some((first, at(2 * SECOND_US))));
    table.handle_timeout(at(2 * SECOND_US));
    let second = single_granted_event(&mut table, WaiterId(2));
    assert!(second > first);
    assert_eq!(table.holder(b"a"), Some((second, at(5 * SECOND_US))));
}

#[test]
fn late_timer_hands_over_with_a_fresh_lease_from_the_handoff() {
    // etcd #11456: a waiter must never be handed a lease that already lapsed.
    let mut table = table();
    granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 1));
    table.acquire(at(0), WaiterId(2), group(&["a"]), 30, 2);
    // The driver oversleeps the lease deadline by 9 s.
    table.handle_timeout(at(10 * SECOND_US));
    let token = single_granted_event(&mut table, WaiterId(2));
    assert_eq!(table.holder(b"a"), Some((token, at(12 * SECOND_US))));
}

#[test]
fn wait_deadline_answers_t_a_margin_early_and_not_a_microsecond_before() {
    let mut table = table();
    granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 100));
    table.acquire(at(SECOND_US), WaiterId(2), group(&["a"]), 3, 10);
    let deadline_us = SECOND_US + 3 * SECOND_US - MARGIN_US;
    assert_eq!(table.poll_timeout(), Some(at(deadline_us)));
    table.handle_timeout(at(deadline_us - 1));
    assert!(events(&mut table).is_empty());
    assert_eq!(table.stats().waiters, 1);
    table.handle_timeout(at(deadline_us));
    assert_eq!(
        events(&mut table),
        [LockEvent::TimedOut {
            waiter: WaiterId(2)
        }]
    );
    assert_eq!(table.stats().waiters, 0);
    assert_eq!(table.queue_len(b"a"), 0);
}

#[test]
fn max_keys_answers_busy_and_changes_nothing() {
    let limits = Limits {
        max_keys: 2,
        ..Limits::default()
    };
    let mut table = table_with(limits);
    let a = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    granted(table.acquire(at(0), WaiterId(2), group(&["b"]), 0, 10));
    let before = table.stats();
    // A third key, granted at once or queued in a set, is over the limit.
    let fresh = table.acquire(at(1), WaiterId(3), group(&["c"]), 0, 10);
    assert_eq!(fresh, AcquireOutcome::Busy);
    let set = table.acquire(at(1), WaiterId(4), group(&["a", "c"]), 5, 10);
    assert_eq!(set, AcquireOutcome::Busy);
    assert_eq!(table.stats(), before);
    assert_eq!(table.queue_len(b"a"), 0);
    // Existing keys still queue.
    let queued = table.acquire(at(1), WaiterId(5), group(&["a"]), 5, 10);
    assert_eq!(queued, AcquireOutcome::Queued);
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(a));
}

#[test]
fn max_waiters_per_key_answers_busy_and_changes_nothing() {
    let limits = Limits {
        max_waiters_per_key: 2,
        ..Limits::default()
    };
    let mut table = table_with(limits);
    granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    for id in 2..=3 {
        let outcome = table.acquire(at(0), WaiterId(id), group(&["a"]), 5, 10);
        assert_eq!(outcome, AcquireOutcome::Queued);
    }
    let before = table.stats();
    let single = table.acquire(at(1), WaiterId(4), group(&["a"]), 5, 10);
    assert_eq!(single, AcquireOutcome::Busy);
    // A set is refused as a whole if any one of its queues is full.
    let set = table.acquire(at(1), WaiterId(5), group(&["a", "b"]), 5, 10);
    assert_eq!(set, AcquireOutcome::Busy);
    assert_eq!(table.stats(), before);
    assert_eq!(table.queue_len(b"a"), 2);
    assert_eq!(table.queue_len(b"b"), 0);
    assert!(!table.cancel(at(1), WaiterId(4)));
}

#[test]
fn max_waiters_total_answers_busy_and_changes_nothing() {
    let limits = Limits {
        max_waiters_total: 2,
        ..Limits::default()
    };
    let mut table = table_with(limits);
    granted(table.acquire(at(0), WaiterId(1), group(&["a", "b", "c"]), 0, 10));
    // A set waiter counts once in the total.
    let set = table.acquire(at(0), WaiterId(2), group(&["a", "b"]), 5, 10);
    assert_eq!(set, AcquireOutcome::Queued);
    let single = table.acquire(at(0), WaiterId(3), group(&["c"]), 5, 10);
    assert_eq!(single, AcquireOutcome::Queued);
    let before = table.stats();
    let over = table.acquire(at(1), WaiterId(4), group(&["a"]), 5, 10);
    assert_eq!(over, AcquireOutcome::Busy);
    assert_eq!(table.stats(), before);
    assert_eq!(table.queue_len(b"a"), 1);
}

#[test]
fn release_with_waiters_hands_the_key_directly_to_the_front_waiter() {
    let mut table = table();
    let first = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    table.acquire(at(1), WaiterId(2), group(&["a"]), 5, 10);
    table.acquire(at(2), WaiterId(3), group(&["a"]), 5, 10);
    assert_eq!(
        table.release(at(3), &group(&["a"]), first),
        ReleaseOutcome::Released
    );
    let second = single_granted_event(&mut table, WaiterId(2));
    // No re-contention: a newcomer cannot slip in between.
    assert_eq!(
        table.acquire(at(3), WaiterId(4), group(&["a"]), 0, 10),
        AcquireOutcome::TimedOut
    );
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(second));
    assert_eq!(table.queue_len(b"a"), 1);
}

#[test]
fn release_without_waiters_deletes_the_key() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    assert_eq!(
        table.release(at(1), &group(&["a"]), token),
        ReleaseOutcome::Released
    );
    assert_eq!(table.stats().keys, 0);
    assert_eq!(table.stats().held_keys, 0);
    assert_eq!(table.holder(b"a"), None);
    // Releasing twice finds nothing.
    assert_eq!(
        table.release(at(2), &group(&["a"]), token),
        ReleaseOutcome::NotFound
    );
}

#[test]
fn stale_token_is_not_found_and_the_lock_stays_intact() {
    let mut table = table();
    let old = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 1));
    let current = granted(table.acquire(at(2 * SECOND_US), WaiterId(2), group(&["a"]), 0, 10));
    table.acquire(at(2 * SECOND_US), WaiterId(3), group(&["a"]), 5, 10);
    let before = table.stats();
    for token in [old, 0, current + 1, u64::MAX] {
        assert_eq!(
            table.release(at(3 * SECOND_US), &group(&["a"]), token),
            ReleaseOutcome::NotFound
        );
    }
    assert_eq!(table.stats(), before);
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(current));
    assert_eq!(table.queue_len(b"a"), 1);
    assert!(events(&mut table).is_empty());
}

#[test]
fn absent_key_is_not_found() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    assert_eq!(
        table.release(at(1), &group(&["b"]), token),
        ReleaseOutcome::NotFound
    );
    assert_eq!(
        table.release(at(1), &group(&["b", "c"]), token),
        ReleaseOutcome::NotFound
    );
    assert_eq!(table.stats().keys, 1);
}

#[test]
fn five_waiters_are_served_in_arrival_order() {
    let mut table = table();
    let mut token = granted(table.acquire(at(0), WaiterId(100), group(&["a"]), 0, 10));
    // Caller ids deliberately not in arrival order.
    let arrivals = [
        WaiterId(5),
        WaiterId(3),
        WaiterId(9),
        WaiterId(1),
        WaiterId(7),
    ];
    for (i, waiter) in arrivals.iter().enumerate() {
        let outcome = table.acquire(at(i as u64 + 1), *waiter, group(&["a"]), 60, 10);
        assert_eq!(outcome, AcquireOutcome::Queued);
    }
    for (i, waiter) in arrivals.iter().enumerate() {
        let now = at(SECOND_US * (i as u64 + 1));
        assert_eq!(
            table.release(now, &group(&["a"]), token),
            ReleaseOutcome::Released
        );
        let next = single_granted_event(&mut table, *waiter);
        assert!(next > token);
        token = next;
    }
    assert_eq!(table.stats().waiters, 0);
}

#[test]
fn a_set_is_granted_atomically_under_one_token() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b", "c"]), 0, 10));
    for key in [b"a", b"b", b"c"] {
        assert_eq!(table.holder(key), Some((token, at(10 * SECOND_US))));
    }
    assert_eq!(table.next_token(), token + 1);
    // Any one key held blocks the whole set, and nothing is taken.
    granted(table.acquire(at(0), WaiterId(2), group(&["x"]), 0, 10));
    assert_eq!(
        table.acquire(at(0), WaiterId(3), group(&["w", "x"]), 0, 10),
        AcquireOutcome::TimedOut
    );
    assert_eq!(table.holder(b"w"), None);
    assert_eq!(
        table.release(at(1), &group(&["a", "b", "c"]), token),
        ReleaseOutcome::Released
    );
    assert_eq!(table.stats().keys, 1);
}

#[test]
fn a_set_waits_for_single_key_holders_and_later_singles_queue_behind_it() {
    let mut table = table();
    let a = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 30));
    let b = granted(table.acquire(at(0), WaiterId(2), group(&["b"]), 0, 30));
    assert_eq!(
        table.acquire(at(1), WaiterId(3), group(&["a", "b"]), 60, 10),
        AcquireOutcome::Queued
    );
    // Arrived after the set: behind it, even on a key that frees first.
    assert_eq!(
        table.acquire(at(2), WaiterId(4), group(&["a"]), 60, 10),
        AcquireOutcome::Queued
    );
    assert_eq!(
        table.release(at(3), &group(&["a"]), a),
        ReleaseOutcome::Released
    );
    assert!(events(&mut table).is_empty(), "set still blocked by b");
    assert_eq!(table.holder(b"a"), None);
    // Nobody may take the free key ahead of the queue.
    assert_eq!(
        table.acquire(at(3), WaiterId(5), group(&["a"]), 0, 10),
        AcquireOutcome::TimedOut
    );
    assert_eq!(
        table.release(at(4), &group(&["b"]), b),
        ReleaseOutcome::Released
    );
    let set = single_granted_event(&mut table, WaiterId(3));
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(set));
    assert_eq!(table.holder(b"b").map(|(token, _)| token), Some(set));
    assert_eq!(
        table.release(at(5), &group(&["a", "b"]), set),
        ReleaseOutcome::Released
    );
    let single = single_granted_event(&mut table, WaiterId(4));
    assert!(single > set);
    assert_eq!(table.holder(b"b"), None);
}

#[test]
fn crossing_sets_cannot_deadlock() {
    let mut table = table();
    let a = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 30));
    let c = granted(table.acquire(at(0), WaiterId(2), group(&["c"]), 0, 30));
    // A cycle of sets over a, b, c: each overlaps the next.
    for (id, keys) in [(10, ["a", "b"]), (11, ["b", "c"]), (12, ["a", "c"])] {
        let outcome = table.acquire(at(id), WaiterId(id), group(&keys), 60, 5);
        assert_eq!(outcome, AcquireOutcome::Queued);
    }
    table.release(at(100), &group(&["c"]), c);
    assert!(events(&mut table).is_empty());
    table.release(at(200), &group(&["a"]), a);
    let first = single_granted_event(&mut table, WaiterId(10));
    table.release(at(300), &group(&["a", "b"]), first);
    let second = single_granted_event(&mut table, WaiterId(11));
    // The third set is served by lease expiry alone.
    table.handle_timeout(at(300 + 5 * SECOND_US));
    let third = single_granted_event(&mut table, WaiterId(12));
    assert!(first < second && second < third);
    assert_eq!(table.stats().waiters, 0);
}

#[test]
fn releasing_a_subset_of_a_set_is_a_group_mismatch() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b", "c"]), 0, 10));
    for keys in [&["a", "b"][..], &["a", "b", "c", "d"], &["a", "x"]] {
        assert_eq!(
            table.release(at(1), &group(keys), token),
            ReleaseOutcome::GroupMismatch,
            "{keys:?}"
        );
    }
    for key in [b"a", b"b", b"c"] {
        assert_eq!(table.holder(key).map(|(token, _)| token), Some(token));
    }
    assert_eq!(
        table.release(at(1), &group(&["a", "b", "c"]), token),
        ReleaseOutcome::Released
    );
}

#[test]
fn releasing_one_key_of_a_set_with_r_is_a_group_mismatch() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b"]), 0, 10));
    table.acquire(at(0), WaiterId(2), group(&["a"]), 5, 10);
    assert_eq!(
        table.release(at(1), &group(&["a"]), token),
        ReleaseOutcome::GroupMismatch
    );
    assert!(events(&mut table).is_empty());
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(token));
    // And a single-key grant released as a set is one too.
    let single = granted(table.acquire(at(1), WaiterId(3), group(&["c"]), 0, 10));
    assert_eq!(
        table.release(at(1), &group(&["c", "d"]), single),
        ReleaseOutcome::GroupMismatch
    );
}

#[test]
fn the_sweep_removes_expired_keys_without_waiters_and_keeps_live_leases() {
    let mut table = table();
    granted(table.acquire(at(0), WaiterId(1), group(&["short"]), 0, 1));
    granted(table.acquire(at(0), WaiterId(2), group(&["long"]), 0, 60));
    table.handle_timeout(at(2 * SECOND_US));
    // Lazy: expired but not yet swept.
    let stats = table.stats();
    assert_eq!((stats.keys, stats.held_keys), (2, 1));
    assert_eq!(table.poll_timeout(), Some(at(5 * SECOND_US)));
    table.handle_timeout(at(5 * SECOND_US - 1));
    assert_eq!(table.stats().keys, 2);
    table.handle_timeout(at(5 * SECOND_US));
    assert_eq!(table.stats().keys, 1);
    assert_eq!(table.holder(b"short"), None);
    assert!(table.holder(b"long").is_some());
    assert_eq!(table.poll_timeout(), Some(at(10 * SECOND_US)));
}

#[test]
fn tokens_strictly_increase_across_keys_and_paths() {
    let mut table = table();
    let mut tokens = Vec::new();
    tokens.push(granted(table.acquire(
        at(0),
        WaiterId(1),
        group(&["a"]),
        0,
        1,
    )));
    tokens.push(granted(table.acquire(
        at(0),
        WaiterId(2),
        group(&["b", "c"]),
        0,
        10,
    )));
    table.acquire(at(0), WaiterId(3), group(&["b"]), 60, 10);
    tokens.push(granted(table.acquire(
        at(1),
        WaiterId(4),
        group(&["d"]),
        0,
        10,
    )));
    table.release(at(2), &group(&["b", "c"]), tokens[1]);
    tokens.push(single_granted_event(&mut table, WaiterId(3)));
    tokens.push(granted(table.acquire(
        at(2 * SECOND_US),
        WaiterId(5),
        group(&["a"]),
        0,
        1,
    )));
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    assert!(tokens.iter().all(|&token| token >= FIRST_TOKEN));
    assert_eq!(table.next_token(), tokens[tokens.len() - 1] + 1);
}

#[test]
fn first_token_zero_is_never_issued() {
    let mut table = LockTable::new(LockConfig::default(), 0, at(0));
    assert_eq!(
        table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 1),
        AcquireOutcome::Granted { token: 1 }
    );
}

#[test]
fn release_of_an_expired_but_unswept_key_answers_released() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b"]), 0, 1));
    table.handle_timeout(at(3 * SECOND_US));
    assert_eq!(table.stats().held_keys, 0);
    assert_eq!(
        table.release(at(3 * SECOND_US), &group(&["a", "b"]), token),
        ReleaseOutcome::Released
    );
    assert_eq!(table.stats().keys, 0);
    // A lapsed grant named with the wrong group is simply not current.
    let other = granted(table.acquire(at(4 * SECOND_US), WaiterId(2), group(&["c", "d"]), 0, 1));
    assert_eq!(
        table.release(at(6 * SECOND_US), &group(&["c"]), other),
        ReleaseOutcome::NotFound
    );
}

#[test]
fn cancelling_a_front_set_waiter_lets_the_next_waiter_in() {
    let mut table = table();
    let b = granted(table.acquire(at(0), WaiterId(1), group(&["b"]), 0, 30));
    // The set is first on a (free) but blocked by b; the single waits behind.
    table.acquire(at(1), WaiterId(2), group(&["a", "b"]), 60, 10);
    table.acquire(at(2), WaiterId(3), group(&["a"]), 60, 10);
    assert!(events(&mut table).is_empty());
    assert!(table.cancel(at(3), WaiterId(2)));
    single_granted_event(&mut table, WaiterId(3));
    assert_eq!(table.queue_len(b"b"), 0);
    assert_eq!(table.holder(b"b").map(|(token, _)| token), Some(b));
    assert!(!table.cancel(at(4), WaiterId(2)), "already gone");
    assert!(!table.cancel(at(4), WaiterId(3)), "granted, not queued");
}

#[test]
fn time_out_all_waiters_ends_every_wait_in_arrival_order() {
    let mut table = table();
    let a = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 30));
    table.acquire(at(1), WaiterId(9), group(&["a"]), 60, 10);
    table.acquire(at(2), WaiterId(4), group(&["a", "b"]), 60, 10);
    table.acquire(at(3), WaiterId(6), group(&["b"]), 60, 10);
    table.time_out_all_waiters(at(4));
    assert_eq!(
        events(&mut table),
        [9, 4, 6].map(|id| LockEvent::TimedOut {
            waiter: WaiterId(id)
        })
    );
    let stats = table.stats();
    assert_eq!((stats.keys, stats.waiters), (1, 0));
    assert_eq!(table.holder(b"a").map(|(token, _)| token), Some(a));
    assert_eq!(table.poll_timeout(), Some(at(5 * SECOND_US)));
    table.handle_timeout(at(120 * SECOND_US));
    assert!(events(&mut table).is_empty());
}

#[test]
fn time_going_backwards_is_treated_as_standing_still() {
    let mut table = table();
    granted(table.acquire(at(10 * SECOND_US), WaiterId(1), group(&["a"]), 0, 1));
    // A stale `now` must not revive or extend anything.
    assert_eq!(
        table.acquire(at(0), WaiterId(2), group(&["a"]), 0, 1),
        AcquireOutcome::TimedOut
    );
    assert_eq!(
        table.holder(b"a").map(|(_, deadline)| deadline),
        Some(at(11 * SECOND_US))
    );
}

// ---------------------------------------------------------------------------
// Property test: the table against a naive reference model.
// ---------------------------------------------------------------------------

use ticketing_core::lock_model as model;

const UNIVERSE: [&str; 4] = ["a", "b", "c", "d"];

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

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..16, 0u8..4, 1u8..4).prop_map(|(key_mask, wait_s, lease_s)| Op::Acquire {
            key_mask,
            wait_s,
            lease_s
        }),
        3 => any::<usize>().prop_map(|pick| Op::ReleaseGrant { pick }),
        1 => (any::<usize>(), 1u8..16).prop_map(|(pick, key_mask)| Op::ReleaseOther { pick, key_mask }),
        1 => (1u8..16, prop_oneof![Just(0u64), 1u64..FIRST_TOKEN])
            .prop_map(|(key_mask, token)| Op::ReleaseBogus { key_mask, token }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        3 => prop_oneof![0u64..2_000, 0u64..1_500_000, 0u64..8_000_000]
            .prop_map(|micros| Op::Sleep { micros }),
        2 => Just(Op::HandleTimeout),
        2 => Just(Op::JumpToDeadline),
        1 => (0..20u8).prop_filter_map("rare", |n| (n == 0).then_some(Op::TimeOutAll)),
    ]
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

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (1usize..6, 1usize..4, 1usize..6).prop_map(
        |(max_keys, max_waiters_per_key, max_waiters_total)| Limits {
            max_keys,
            max_waiters_per_key,
            max_waiters_total,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn table_matches_the_reference_model(
        limits in prop_oneof![Just(Limits::default()), limits_strategy()],
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        let config = LockConfig {
            limits,
            wait_margin: Duration::from_micros(MARGIN_US),
            sweep_interval: Duration::from_secs(5),
        };
        let mut harness = Harness::new(config);
        for op in &ops {
            harness.run(op);
        }
        // Liveness: with time, every wait ends and every key goes away.
        harness.now_us += 300 * SECOND_US;
        harness.run(&Op::HandleTimeout);
        prop_assert!(harness.queued.is_empty());
        harness.now_us += 10 * SECOND_US;
        harness.run(&Op::HandleTimeout);
        prop_assert_eq!(harness.table.stats().keys, 0);
    }
}
