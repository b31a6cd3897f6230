//! Renewing a grant's lease in the single-mode lock table, and the cap on
//! total hold: which tokens may be extended, where the lease ends, and that
//! the table's clock (expiry, hand-over, sweep) follows the moved deadline.
//! Time is injected and jumped; nothing sleeps.

use ticketing_core::inspect::ForceReleaseOutcome;
use ticketing_core::lock::{
    AcquireOptions, AcquireOutcome, ExtendOutcome, LockConfig, LockEvent, LockTable,
    ReleaseOutcome, WaiterId,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Key, KeyGroup};

const FIRST_TOKEN: u64 = 1_000;
/// Tests start away from the clock's origin so that "before" is expressible.
const START_US: u64 = 1_000_000_000;
const SECOND_US: u64 = 1_000_000;

fn group(names: &[&str]) -> KeyGroup {
    let keys = names
        .iter()
        .map(|name| Key::new(name.as_bytes()).unwrap())
        .collect();
    KeyGroup::new(keys).unwrap()
}

/// `s` seconds after the start.
fn at(s: u64) -> Instant {
    Instant::from_micros(START_US + s * SECOND_US)
}

/// One microsecond before `at(s)`.
fn just_before(s: u64) -> Instant {
    Instant::from_micros(START_US + s * SECOND_US - 1)
}

fn table() -> LockTable {
    LockTable::new(LockConfig::default(), FIRST_TOKEN, at(0))
}

fn granted(outcome: AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Granted { token } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Grants `names` at `now` for `lease_s` seconds under a cap of
/// `max_hold_s` seconds (`None`: no cap).
fn acquire_capped(
    table: &mut LockTable,
    now: Instant,
    names: &[&str],
    lease_s: u8,
    max_hold_s: Option<u64>,
) -> AcquireOutcome {
    let options = AcquireOptions {
        wait_s: 0,
        lease_s,
        holder: 0,
        max_hold: max_hold_s.map(Duration::from_secs),
    };
    table.acquire_with(now, WaiterId(0), &group(names), &options)
}

/// Whether `key` is free at `now` for a newcomer (an acquire without wait
/// is granted; it is released again at once).
fn is_free_at(table: &mut LockTable, now: Instant, key: &str) -> bool {
    match table.acquire(now, WaiterId(999), group(&[key]), 0, 1) {
        AcquireOutcome::Granted { token } => {
            table.release(now, &group(&[key]), token);
            true
        }
        _ => false,
    }
}

#[test]
fn extending_a_current_grant_moves_its_expiry_and_it_outlives_its_first_lease() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    let outcome = table.extend(at(8), &group(&["a"]), token, 30);
    assert_eq!(outcome, ExtendOutcome::Extended { expires_at: at(38) });
    assert_eq!(table.holder(b"a"), Some((token, at(38))));
    // Past the first lease (10 s), still held under the same token.
    assert!(!is_free_at(&mut table, at(20), "a"));
    assert!(!is_free_at(&mut table, just_before(38), "a"));
    assert!(is_free_at(&mut table, at(38), "a"));
    let extension = table.extension_of(b"a").map(|e| e.extensions);
    assert_eq!(extension, None, "the key was granted anew and released");
    let metrics = table.metrics();
    assert_eq!(metrics.extensions.extended, 1);
    assert_eq!(metrics.expiries_extended, 1);
    // The hold ran from the grant to the extended end.
    assert_eq!(metrics.hold.sum_us(), 38 * SECOND_US);
}

#[test]
fn an_extended_key_with_a_waiter_is_handed_over_at_the_extended_time_not_the_first() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    assert_eq!(
        table.acquire(at(1), WaiterId(2), group(&["a"]), 60, 10),
        AcquireOutcome::Queued
    );
    let outcome = table.extend(at(5), &group(&["a"]), token, 20);
    assert_eq!(outcome, ExtendOutcome::Extended { expires_at: at(25) });
    // The first lease's end passes without a hand-over.
    table.handle_timeout(at(10));
    assert_eq!(table.poll_event(), None);
    table.handle_timeout(just_before(25));
    assert_eq!(table.poll_event(), None);
    assert_eq!(table.holder(b"a").map(|(t, _)| t), Some(token));
    table.handle_timeout(at(25));
    assert!(matches!(
        table.poll_event(),
        Some(LockEvent::Granted {
            waiter: WaiterId(2),
            ..
        })
    ));
    assert_eq!(table.metrics().expiries_handed_over, 1);
    assert_eq!(table.metrics().expiries_extended, 1);
}

#[test]
fn an_extension_may_shorten_the_lease_to_now_plus_the_lease_asked_for() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 100));
    assert_eq!(
        table.acquire(at(0), WaiterId(2), group(&["a"]), 60, 10),
        AcquireOutcome::Queued
    );
    let outcome = table.extend(at(1), &group(&["a"]), token, 5);
    assert_eq!(outcome, ExtendOutcome::Extended { expires_at: at(6) });
    table.handle_timeout(at(6));
    assert!(matches!(
        table.poll_event(),
        Some(LockEvent::Granted {
            waiter: WaiterId(2),
            ..
        })
    ));
}

#[test]
fn a_released_grant_cannot_be_extended() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    assert_eq!(
        table.release(at(1), &group(&["a"]), token),
        ReleaseOutcome::Released
    );
    let outcome = table.extend(at(2), &group(&["a"]), token, 30);
    assert_eq!(outcome, ExtendOutcome::NotCurrent);
    assert_eq!(table.holder(b"a"), None);
    assert_eq!(table.metrics().extensions.not_current, 1);
}

#[test]
fn an_expired_grant_cannot_be_extended_even_before_its_expiry_is_noticed() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    // Lazy expiry: the key still records the token, its lease is over.
    let outcome = table.extend(at(10), &group(&["a"]), token, 30);
    assert_eq!(outcome, ExtendOutcome::NotCurrent);
    assert!(is_free_at(&mut table, at(10), "a"));
    // And after the sweep removed it.
    let outcome = table.extend(at(60), &group(&["a"]), token, 30);
    assert_eq!(outcome, ExtendOutcome::NotCurrent);
}

#[test]
fn a_force_released_grant_cannot_be_extended() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b"]), 0, 10));
    let forced = table.force_release(at(1), b"b", None);
    assert!(matches!(forced, ForceReleaseOutcome::Released { revoked, .. } if revoked == token));
    let outcome = table.extend(at(2), &group(&["a", "b"]), token, 30);
    assert_eq!(outcome, ExtendOutcome::NotCurrent);
}

#[test]
fn after_a_hand_over_the_waiters_token_is_current_and_the_old_one_is_not() {
    let mut table = table();
    let old = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    assert_eq!(
        table.acquire(at(1), WaiterId(2), group(&["a"]), 60, 10),
        AcquireOutcome::Queued
    );
    table.handle_timeout(at(10));
    let new = match table.poll_event() {
        Some(LockEvent::Granted {
            waiter: WaiterId(2),
            token,
        }) => token,
        other => panic!("expected the waiter's grant, got {other:?}"),
    };
    assert_eq!(
        table.extend(at(11), &group(&["a"]), old, 30),
        ExtendOutcome::NotCurrent
    );
    assert_eq!(table.holder(b"a"), Some((new, at(20))));
    assert_eq!(
        table.extend(at(11), &group(&["a"]), new, 30),
        ExtendOutcome::Extended { expires_at: at(41) }
    );
}

#[test]
fn a_token_never_issued_cannot_be_extended() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    for never in [0, token + 1, u64::MAX] {
        assert_eq!(
            table.extend(at(1), &group(&["a"]), never, 30),
            ExtendOutcome::NotCurrent
        );
    }
    assert_eq!(
        table.extend(at(1), &group(&["zzz"]), token, 30),
        ExtendOutcome::NotCurrent
    );
    assert_eq!(table.holder(b"a"), Some((token, at(10))));
}

#[test]
fn naming_only_part_of_a_key_set_is_not_current_and_changes_nothing() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a", "b"]), 0, 10));
    assert_eq!(
        table.extend(at(1), &group(&["a"]), token, 30),
        ExtendOutcome::NotCurrent
    );
    assert_eq!(
        table.extend(at(1), &group(&["a", "b", "c"]), token, 30),
        ExtendOutcome::NotCurrent
    );
    assert_eq!(table.holder(b"a"), Some((token, at(10))));
    assert_eq!(table.holder(b"b"), Some((token, at(10))));
}

#[test]
fn a_key_set_extended_by_its_one_token_extends_all_its_keys() {
    let mut table = table();
    let set = group(&["a", "b", "c"]);
    let token = granted(table.acquire(at(0), WaiterId(1), set.clone(), 0, 10));
    // A waiter on one key only: that key's hand-over follows the new end.
    assert_eq!(
        table.acquire(at(0), WaiterId(2), group(&["b"]), 60, 10),
        AcquireOutcome::Queued
    );
    assert_eq!(
        table.extend(at(5), &set, token, 20),
        ExtendOutcome::Extended { expires_at: at(25) }
    );
    for key in ["a", "b", "c"] {
        assert_eq!(table.holder(key.as_bytes()), Some((token, at(25))), "{key}");
    }
    table.handle_timeout(at(10));
    assert_eq!(table.poll_event(), None);
    assert!(!is_free_at(&mut table, at(20), "a"));
    assert!(!is_free_at(&mut table, at(20), "c"));
    table.handle_timeout(at(25));
    assert!(matches!(
        table.poll_event(),
        Some(LockEvent::Granted {
            waiter: WaiterId(2),
            ..
        })
    ));
    assert!(is_free_at(&mut table, at(25), "a"));
    assert!(is_free_at(&mut table, at(25), "c"));
    // One grant, one expiry counted.
    assert_eq!(table.metrics().expiries(), 1);
    assert_eq!(table.metrics().expiries_extended, 1);
}

#[test]
fn an_extension_past_the_cap_is_clipped_to_the_cap() {
    let mut table = table();
    let token = granted(acquire_capped(&mut table, at(0), &["a"], 10, Some(30)));
    assert_eq!(
        table.extend(at(8), &group(&["a"]), token, 10),
        ExtendOutcome::Extended { expires_at: at(18) }
    );
    assert_eq!(
        table.extend(at(15), &group(&["a"]), token, 20),
        ExtendOutcome::Clipped { expires_at: at(30) }
    );
    assert_eq!(table.holder(b"a"), Some((token, at(30))));
    let extension = table.extension_of(b"a").unwrap();
    assert_eq!(
        (extension.granted_at, extension.cap_at, extension.extensions),
        (at(0), Some(at(30)), 2)
    );
    assert!(!is_free_at(&mut table, just_before(30), "a"));
    assert!(is_free_at(&mut table, at(30), "a"));
    let counts = table.metrics().extensions;
    assert_eq!((counts.extended, counts.clipped), (1, 1));
}

#[test]
fn an_extension_when_the_lease_already_reaches_the_cap_is_refused_and_changes_nothing() {
    let mut table = table();
    let token = granted(acquire_capped(&mut table, at(0), &["a"], 10, Some(20)));
    assert_eq!(
        table.extend(at(5), &group(&["a"]), token, 100),
        ExtendOutcome::Clipped { expires_at: at(20) }
    );
    assert_eq!(
        table.extend(at(15), &group(&["a"]), token, 100),
        ExtendOutcome::AtCap
    );
    // Not even a shorter lease moves it: the holder is told to let go.
    assert_eq!(
        table.extend(at(15), &group(&["a"]), token, 1),
        ExtendOutcome::AtCap
    );
    assert_eq!(table.holder(b"a"), Some((token, at(20))));
    assert_eq!(table.extension_of(b"a").unwrap().extensions, 1);
    assert_eq!(table.metrics().extensions.at_cap, 2);
}

#[test]
fn a_lease_longer_than_the_cap_is_clipped_at_grant() {
    let mut table = table();
    let token = granted(acquire_capped(&mut table, at(0), &["a"], 60, Some(15)));
    assert_eq!(table.holder(b"a"), Some((token, at(15))));
    assert_eq!(
        table.extend(at(1), &group(&["a"]), token, 5),
        ExtendOutcome::AtCap
    );
    assert!(!is_free_at(&mut table, just_before(15), "a"));
    assert!(is_free_at(&mut table, at(15), "a"));
    // A capped grant that was never extended is not counted as extended,
    // and its hold is its clipped lease.
    assert_eq!(table.metrics().expiries_extended, 0);
    assert_eq!(table.metrics().hold.sum_us(), 15 * SECOND_US);
}

#[test]
fn a_waiters_cap_counts_from_its_grant_not_from_its_arrival() {
    let mut table = table();
    let first = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    let options = AcquireOptions {
        wait_s: 60,
        lease_s: 30,
        holder: 0,
        max_hold: Some(Duration::from_secs(20)),
    };
    let queued = table.acquire_with(at(1), WaiterId(2), &group(&["a"]), &options);
    assert_eq!(queued, AcquireOutcome::Queued);
    assert_eq!(
        table.release(at(4), &group(&["a"]), first),
        ReleaseOutcome::Released
    );
    assert!(matches!(
        table.poll_event(),
        Some(LockEvent::Granted {
            waiter: WaiterId(2),
            ..
        })
    ));
    let (token, expires_at) = table.holder(b"a").unwrap();
    assert_eq!(expires_at, at(24), "clipped to its grant (4 s) plus 20 s");
    assert_eq!(table.extension_of(b"a").unwrap().cap_at, Some(at(24)));
    assert_eq!(
        table.extend(at(10), &group(&["a"]), token, 30),
        ExtendOutcome::AtCap
    );
}

#[test]
fn without_a_cap_acquire_with_behaves_exactly_as_acquire() {
    let run = |capped: bool| {
        let mut table = table();
        let mut trace = Vec::new();
        let options = AcquireOptions {
            wait_s: 30,
            lease_s: 10,
            holder: 7,
            max_hold: None,
        };
        for (i, key) in ["a", "a", "b", "a"].into_iter().enumerate() {
            let now = at(i as u64);
            let outcome = if capped {
                table.acquire_with(now, WaiterId(i as u64), &group(&[key]), &options)
            } else {
                table.acquire_as(now, WaiterId(i as u64), &group(&[key]), 30, 10, 7)
            };
            trace.push(format!("{outcome:?}"));
        }
        for s in [10, 20, 30, 40] {
            table.handle_timeout(at(s));
            while let Some(event) = table.poll_event_lease() {
                trace.push(format!("{event:?}"));
            }
            trace.push(format!("{:?} {:?}", table.grant_of(b"a"), table.stats()));
        }
        (trace, table.metrics().clone())
    };
    assert_eq!(run(true), run(false));
    let (_, metrics) = run(true);
    assert_eq!(metrics.extensions.total(), 0);
    assert_eq!(metrics.expiries_extended, 0);
}

#[test]
fn an_uncapped_grant_reports_its_start_and_no_cap() {
    let mut table = table();
    let token = granted(table.acquire(at(3), WaiterId(1), group(&["a"]), 0, 10));
    let extension = table.extension_of(b"a").unwrap();
    assert_eq!(
        (extension.granted_at, extension.cap_at, extension.extensions),
        (at(3), None, 0)
    );
    table.extend(at(5), &group(&["a"]), token, 100);
    let extension = table.extension_of(b"a").unwrap();
    assert_eq!(
        (extension.granted_at, extension.cap_at, extension.extensions),
        (at(3), None, 1)
    );
    // The operator's view counts the hold from the grant, not from the
    // moved lease.
    let inspection = table.inspect_key(at(6), b"a").unwrap();
    assert_eq!(inspection.holder.unwrap().held_ms, 3_000);
}

#[test]
fn a_released_extended_grant_observes_its_hold_from_its_grant() {
    let mut table = table();
    let token = granted(table.acquire(at(0), WaiterId(1), group(&["a"]), 0, 10));
    table.extend(at(8), &group(&["a"]), token, 30);
    assert_eq!(
        table.release(at(25), &group(&["a"]), token),
        ReleaseOutcome::Released
    );
    assert_eq!(table.metrics().hold.sum_us(), 25 * SECOND_US);
    assert_eq!(table.extension_of(b"a"), None);
}
