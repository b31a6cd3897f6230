//! The lock table against the request × key-state matrix (docs/protocol.md
//! §3 and §5, docs/architecture.md, "Request × key state"), one test per case, plus a
//! property test against a naive reference model. Time is injected and jumped; nothing sleeps.

use proptest::prelude::*;
use ticketing_core::lock::{
    AcquireOutcome, Limits, LockConfig, LockEvent, LockTable, ReleaseOutcome, WaiterId,
};
use ticketing_core::time::Instant;
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
        keys_max: 2,
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
        waiters_per_key_max: 2,
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
        waiters_total_max: 2,
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
// Property test: the table against a naive reference model. The model and
// the harness that compares it with the table live in
// `ticketing_core::testing::lock_model`, shared with the simulator's fuzz target.
// ---------------------------------------------------------------------------

use ticketing_core::testing::lock_model::{self as model, Op};

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..16, 0u8..4, 1u8..4).prop_map(|(key_mask, wait_s, lease_s)| Op::Acquire {
            key_mask,
            wait_s,
            lease_s
        }),
        3 => any::<usize>().prop_map(|pick| Op::ReleaseGrant { pick }),
        1 => (any::<usize>(), 1u8..16).prop_map(|(pick, key_mask)| Op::ReleaseOther { pick, key_mask }),
        1 => (1u8..16, prop_oneof![Just(0u64), 1u64..model::FIRST_TOKEN])
            .prop_map(|(key_mask, token)| Op::ReleaseBogus { key_mask, token }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        3 => prop_oneof![0u64..2_000, 0u64..1_500_000, 0u64..8_000_000]
            .prop_map(|micros| Op::Sleep { micros }),
        2 => Just(Op::HandleTimeout),
        2 => Just(Op::JumpToDeadline),
        1 => (0..20u8).prop_filter_map("rare", |n| (n == 0).then_some(Op::TimeOutAll)),
    ]
}

/// [`op_strategy`] with capped acquires and extensions (of grants seen,
/// under their own group or another) mixed in. Leases and caps are short,
/// so extensions meet running, lapsed, handed-over and capped grants.
fn op_strategy_with_extensions() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op_strategy(),
        2 => (1u8..16, 0u8..4, 1u8..4, 1u8..6).prop_map(|(key_mask, wait_s, lease_s, max_hold_s)| {
            Op::AcquireCapped {
                key_mask,
                wait_s,
                lease_s,
                max_hold_s,
            }
        }),
        3 => (any::<usize>(), 1u8..5).prop_map(|(pick, lease_s)| Op::ExtendGrant { pick, lease_s }),
        1 => (any::<usize>(), 1u8..16, 1u8..5)
            .prop_map(|(pick, key_mask, lease_s)| Op::ExtendOther { pick, key_mask, lease_s }),
    ]
}

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (1usize..6, 1usize..4, 1usize..6).prop_map(
        |(keys_max, waiters_per_key_max, waiters_total_max)| Limits {
            keys_max,
            waiters_per_key_max,
            waiters_total_max,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Every op is checked against the model as it runs (outcomes, events,
    /// holders, queues, stats, deadlines, rising tokens, no two live grants
    /// of a key); then, with time, every wait ends and every key goes away.
    #[test]
    fn table_matches_the_reference_model(
        limits in prop_oneof![Just(Limits::default()), limits_strategy()],
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        model::check_ops(limits, ops);
    }

    /// The same with capped grants and extensions: an extension agrees
    /// with the model's (current only for a running grant's own group,
    /// clipped and refused at the cap), the grant's lease then ends where
    /// both say, and no extended grant overlaps a newer one.
    #[test]
    fn table_matches_the_reference_model_with_extensions(
        limits in prop_oneof![Just(Limits::default()), limits_strategy()],
        ops in proptest::collection::vec(op_strategy_with_extensions(), 1..120),
    ) {
        model::check_ops(limits, ops);
    }
}
