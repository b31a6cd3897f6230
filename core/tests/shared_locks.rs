//! Shared and exclusive modes in the single-mode lock table: one test per
//! queue rule (sharer batches, FIFO across modes, key sets mixing modes,
//! downgrade) and per way a shared grant ends (release, lease expiry,
//! force-release, a waiter's cancel). Time is injected and jumped.

use ticketing_core::inspect::ForceReleaseOutcome;
use ticketing_core::lock::{
    AcquireOptions, AcquireOutcome, DowngradeOutcome, ExtendOutcome, KeyModes, LockConfig,
    LockEvent, LockTable, ReleaseOutcome, WaiterId,
};
use ticketing_core::time::Instant;
use ticketing_core::wire::{Key, KeyGroup};

const FIRST_TOKEN: u64 = 1_000;
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

fn table() -> LockTable {
    LockTable::new(LockConfig::default(), FIRST_TOKEN, at(0))
}

fn options(wait_s: u8, lease_s: u8) -> AcquireOptions {
    AcquireOptions {
        wait_s,
        lease_s,
        holder: 0,
        max_hold: None,
    }
}

/// A shared acquire of every key in `names`.
fn shared(t: &mut LockTable, now: Instant, id: u64, names: &[&str], lease_s: u8) -> AcquireOutcome {
    let modes = KeyModes::all_shared(names.len());
    t.acquire_in_modes(
        now,
        WaiterId(id),
        &group(names),
        &options(60, lease_s),
        modes,
    )
}

/// An exclusive acquire of every key in `names`.
fn exclusive(
    t: &mut LockTable,
    now: Instant,
    id: u64,
    names: &[&str],
    lease_s: u8,
) -> AcquireOutcome {
    t.acquire_with(now, WaiterId(id), &group(names), &options(60, lease_s))
}

fn token(outcome: AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Granted { token } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The grants among the table's pending events, as (waiter, token).
fn grants(t: &mut LockTable) -> Vec<(u64, u64)> {
    let mut granted = Vec::new();
    while let Some(event) = t.poll_event() {
        if let LockEvent::Granted { waiter, token } = event {
            granted.push((waiter.0, token));
        }
    }
    granted
}

#[test]
fn consecutive_shared_requests_are_granted_together_as_a_batch() {
    let mut t = table();
    let writer = token(exclusive(&mut t, at(0), 1, &["k"], 30));
    for id in 2..=4 {
        assert_eq!(
            shared(&mut t, at(0), id, &["k"], 30),
            AcquireOutcome::Queued
        );
    }
    assert_eq!(
        t.release(at(1), &group(&["k"]), writer),
        ReleaseOutcome::Released
    );
    let batch = grants(&mut t);
    assert_eq!(
        batch.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert_eq!(t.sharers_of(b"k", at(1)).len(), 3);
    // A newcomer with nobody waiting joins the batch at once.
    assert!(matches!(
        shared(&mut t, at(2), 5, &["k"], 30),
        AcquireOutcome::Granted { .. }
    ));
    assert_eq!(t.sharers_of(b"k", at(2)).len(), 4);
}

#[test]
fn an_exclusive_request_waits_for_every_sharer() {
    let mut t = table();
    let a = token(shared(&mut t, at(0), 1, &["k"], 30));
    let b = token(shared(&mut t, at(0), 2, &["k"], 30));
    assert_eq!(
        exclusive(&mut t, at(0), 3, &["k"], 30),
        AcquireOutcome::Queued
    );
    assert_eq!(
        t.release(at(1), &group(&["k"]), a),
        ReleaseOutcome::Released
    );
    assert!(grants(&mut t).is_empty(), "one sharer is still in");
    assert_eq!(
        t.release(at(2), &group(&["k"]), b),
        ReleaseOutcome::Released
    );
    let granted = grants(&mut t);
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].0, 3);
    assert!(t.sharers_of(b"k", at(2)).is_empty());
}

#[test]
fn a_shared_request_behind_a_queued_exclusive_one_waits() {
    let mut t = table();
    let a = token(shared(&mut t, at(0), 1, &["k"], 30));
    assert_eq!(
        exclusive(&mut t, at(0), 2, &["k"], 30),
        AcquireOutcome::Queued
    );
    // Compatible with the sharers, but the writer came first.
    assert_eq!(shared(&mut t, at(0), 3, &["k"], 30), AcquireOutcome::Queued);
    assert_eq!(t.sharers_of(b"k", at(0)).len(), 1);
    assert_eq!(
        t.release(at(1), &group(&["k"]), a),
        ReleaseOutcome::Released
    );
    let writer = grants(&mut t);
    assert_eq!(writer.iter().map(|&(id, _)| id).collect::<Vec<_>>(), [2]);
    assert_eq!(
        t.release(at(2), &group(&["k"]), writer[0].1),
        ReleaseOutcome::Released
    );
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [3]
    );
}

#[test]
fn a_sharer_batch_stops_at_the_first_exclusive_request() {
    let mut t = table();
    let writer = token(exclusive(&mut t, at(0), 1, &["k"], 30));
    shared(&mut t, at(0), 2, &["k"], 30);
    exclusive(&mut t, at(0), 3, &["k"], 30);
    shared(&mut t, at(0), 4, &["k"], 30);
    t.release(at(1), &group(&["k"]), writer);
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2]
    );
    assert_eq!(t.queue_len(b"k"), 2);
}

#[test]
fn a_downgrade_keeps_token_and_lease_and_lets_sharers_queued_behind_join() {
    let mut t = table();
    let w = token(exclusive(&mut t, at(0), 1, &["k"], 30));
    shared(&mut t, at(0), 2, &["k"], 30);
    shared(&mut t, at(0), 3, &["k"], 30);
    assert_eq!(
        t.downgrade(at(1), &group(&["k"]), w),
        DowngradeOutcome::Downgraded
    );
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2, 3]
    );
    let sharers = t.sharers_of(b"k", at(1));
    assert_eq!(sharers.len(), 3);
    assert_eq!(sharers[0], (w, at(30)), "same token, same lease");
    // The downgraded grant is released by its token, as a sharer.
    assert_eq!(
        t.release(at(2), &group(&["k"]), w),
        ReleaseOutcome::Released
    );
    assert_eq!(t.sharers_of(b"k", at(2)).len(), 2);
}

#[test]
fn a_writer_queued_behind_a_downgrade_does_not_get_in_beside_the_downgrader() {
    let mut t = table();
    let w = token(exclusive(&mut t, at(0), 1, &["k"], 30));
    assert_eq!(
        exclusive(&mut t, at(0), 2, &["k"], 30),
        AcquireOutcome::Queued
    );
    shared(&mut t, at(0), 3, &["k"], 30);
    assert_eq!(
        t.downgrade(at(1), &group(&["k"]), w),
        DowngradeOutcome::Downgraded
    );
    // The writer heads the queue: neither it nor the reader behind it is in.
    assert!(grants(&mut t).is_empty());
    assert_eq!(t.sharers_of(b"k", at(1)), vec![(w, at(30))]);
    assert_eq!(t.queue_len(b"k"), 2);
    // A second downgrade of the same grant names a grant already shared.
    assert_eq!(
        t.downgrade(at(1), &group(&["k"]), w),
        DowngradeOutcome::Downgraded
    );
    assert!(grants(&mut t).is_empty());
    t.release(at(2), &group(&["k"]), w);
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2]
    );
}

#[test]
fn a_downgrade_names_the_whole_grant_and_a_current_token() {
    let mut t = table();
    let w = token(exclusive(&mut t, at(0), 1, &["a", "b"], 30));
    assert_eq!(
        t.downgrade(at(1), &group(&["a"]), w),
        DowngradeOutcome::GroupMismatch
    );
    assert_eq!(
        t.downgrade(at(1), &group(&["a", "b"]), w + 1),
        DowngradeOutcome::NotFound
    );
    assert_eq!(
        t.downgrade(at(31), &group(&["a", "b"]), w),
        DowngradeOutcome::NotFound
    );
}

#[test]
fn a_key_set_mixing_modes_takes_one_token_and_each_key_in_its_mode() {
    let mut t = table();
    let reader = token(shared(&mut t, at(0), 1, &["catalog"], 30));
    // `catalog` shared (bit 0), `orders/42` exclusive: granted beside the
    // reader of `catalog`, under one new token.
    let mixed = t.acquire_in_modes(
        at(0),
        WaiterId(2),
        &group(&["catalog", "orders/42"]),
        &options(60, 30),
        KeyModes::from_bits(0b01),
    );
    let set = token(mixed);
    assert_eq!(set, reader + 1);
    assert_eq!(t.sharers_of(b"catalog", at(0)).len(), 2);
    assert_eq!(t.holder(b"orders/42").map(|(token, _)| token), Some(set));
    // A writer of `orders/42` waits; a reader of `catalog` joins at once.
    assert_eq!(
        exclusive(&mut t, at(0), 3, &["orders/42"], 30),
        AcquireOutcome::Queued
    );
    assert!(matches!(
        shared(&mut t, at(0), 4, &["catalog"], 30),
        AcquireOutcome::Granted { .. }
    ));
    // The set releases as one grant of both keys.
    let both = group(&["catalog", "orders/42"]);
    assert_eq!(
        t.release(at(1), &group(&["catalog"]), set),
        ReleaseOutcome::GroupMismatch
    );
    assert_eq!(t.release(at(1), &both, set), ReleaseOutcome::Released);
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(t.sharers_of(b"catalog", at(1)).len(), 2);
}

#[test]
fn a_mixed_set_waits_until_every_key_takes_it_in_its_mode() {
    let mut t = table();
    let writer = token(exclusive(&mut t, at(0), 1, &["catalog"], 30));
    let modes = KeyModes::from_bits(0b01);
    let set = group(&["catalog", "orders/42"]);
    let queued = t.acquire_in_modes(at(0), WaiterId(2), &set, &options(60, 30), modes);
    assert_eq!(queued, AcquireOutcome::Queued);
    // A reader of `catalog` behind the set waits behind it (FIFO).
    assert_eq!(
        shared(&mut t, at(0), 3, &["catalog"], 30),
        AcquireOutcome::Queued
    );
    t.release(at(1), &group(&["catalog"]), writer);
    // The set joins `catalog` shared, and so does the reader behind it.
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2, 3]
    );
}

#[test]
fn a_sharer_whose_set_is_granted_elsewhere_lets_the_readers_behind_it_join() {
    let mut t = table();
    let other = token(exclusive(&mut t, at(0), 1, &["orders/42"], 30));
    let r = token(shared(&mut t, at(0), 2, &["catalog"], 30));
    let writer = exclusive(&mut t, at(0), 3, &["catalog"], 30);
    assert_eq!(writer, AcquireOutcome::Queued);
    let set = group(&["catalog", "orders/42"]);
    let modes = KeyModes::from_bits(0b01);
    t.acquire_in_modes(at(0), WaiterId(4), &set, &options(60, 30), modes);
    shared(&mut t, at(0), 5, &["catalog"], 30);
    // The writer gets `catalog`, then lets go.
    t.release(at(1), &group(&["catalog"]), r);
    let w = grants(&mut t);
    assert_eq!(w.iter().map(|&(id, _)| id).collect::<Vec<_>>(), [3]);
    t.release(at(2), &group(&["catalog"]), w[0].1);
    // The set heads `catalog` but waits on `orders/42`; the reader behind it
    // waits too.
    assert!(grants(&mut t).is_empty());
    t.release(at(3), &group(&["orders/42"]), other);
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [4, 5]
    );
}

#[test]
fn force_release_of_a_sharer_revokes_that_sharer_only() {
    let mut t = table();
    let a = token(shared(&mut t, at(0), 1, &["k"], 30));
    let b = token(shared(&mut t, at(0), 2, &["k"], 30));
    exclusive(&mut t, at(0), 3, &["k"], 30);
    let outcome = t.force_release(at(1), b"k", Some(b));
    assert!(
        matches!(outcome, ForceReleaseOutcome::Released { revoked, handed_to: None, .. } if revoked == b)
    );
    assert_eq!(t.sharers_of(b"k", at(1)), vec![(a, at(30))]);
    // Without a token: the oldest sharer; the writer then gets the key.
    let outcome = t.force_release(at(2), b"k", None);
    assert!(
        matches!(outcome, ForceReleaseOutcome::Released { revoked, handed_to: Some(_), .. } if revoked == a)
    );
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [3]
    );
    // A token that is no sharer's is refused, naming the oldest.
    let mut t = table();
    let a = token(shared(&mut t, at(0), 1, &["k"], 30));
    assert_eq!(
        t.force_release(at(1), b"k", Some(a + 7)),
        ForceReleaseOutcome::TokenMismatch { held: a }
    );
}

#[test]
fn the_lease_of_a_sharer_ends_alone_and_the_last_one_hands_the_key_on() {
    let mut t = table();
    let short = token(shared(&mut t, at(0), 1, &["k"], 10));
    let long = token(shared(&mut t, at(0), 2, &["k"], 20));
    exclusive(&mut t, at(0), 3, &["k"], 30);
    t.handle_timeout(at(10));
    assert!(grants(&mut t).is_empty(), "the longer sharer still holds");
    assert_eq!(t.sharers_of(b"k", at(10)), vec![(long, at(20))]);
    // The expired sharer's token is over: its renewal is refused.
    assert_eq!(
        t.extend(at(11), &group(&["k"]), short, 30),
        ExtendOutcome::NotCurrent
    );
    t.handle_timeout(at(20));
    let writer = grants(&mut t);
    assert_eq!(writer.iter().map(|&(id, _)| id).collect::<Vec<_>>(), [3]);
    assert_eq!(t.holder(b"k"), Some((writer[0].1, at(50))));
}

#[test]
fn a_sharer_renewed_by_token_moves_the_hand_over() {
    let mut t = table();
    let a = token(shared(&mut t, at(0), 1, &["k"], 10));
    exclusive(&mut t, at(0), 2, &["k"], 30);
    let renewed = t.extend(at(5), &group(&["k"]), a, 20);
    assert_eq!(renewed, ExtendOutcome::Extended { expires_at: at(25) });
    t.handle_timeout(at(10));
    assert!(grants(&mut t).is_empty());
    t.handle_timeout(at(25));
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [2]
    );
}

#[test]
fn a_cancelled_writer_lets_the_readers_behind_it_join_the_batch() {
    let mut t = table();
    token(shared(&mut t, at(0), 1, &["k"], 30));
    exclusive(&mut t, at(0), 2, &["k"], 30);
    shared(&mut t, at(0), 3, &["k"], 30);
    shared(&mut t, at(0), 4, &["k"], 30);
    // The writer's connection closed (a ghost's waiter is cancelled).
    assert!(t.cancel(at(1), WaiterId(2)));
    assert_eq!(
        grants(&mut t).iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        [3, 4]
    );
    assert_eq!(t.sharers_of(b"k", at(1)).len(), 3);
}

#[test]
fn expired_sharers_are_swept_with_their_key() {
    let mut t = table();
    shared(&mut t, at(0), 1, &["k"], 10);
    shared(&mut t, at(0), 2, &["k"], 10);
    assert_eq!(t.holder_keys(), 1);
    t.handle_timeout(at(60));
    assert_eq!(t.key_count(), 0);
    assert_eq!(t.holder_keys(), 0);
    assert!(t.sharers_of(b"k", at(60)).is_empty());
    // An exclusive request then gets the key at once.
    assert!(matches!(
        exclusive(&mut t, at(61), 3, &["k"], 10),
        AcquireOutcome::Granted { .. }
    ));
}

#[test]
fn the_last_sharer_whose_lease_ends_into_a_writer_s_hands_is_an_expiry_handover() {
    let mut t = table();
    let first = token(shared(&mut t, at(0), 1, &["k"], 10));
    let last = token(shared(&mut t, at(0), 2, &["k"], 20));
    exclusive(&mut t, at(0), 3, &["k"], 30);
    t.handle_timeout(at(10));
    // The first sharer's lease ended with the key still shared: nothing
    // was handed over.
    assert!(t.poll_expiry_handover().is_none());
    t.handle_timeout(at(20));
    let writer = grants(&mut t);
    let handover = t.poll_expiry_handover().expect("an expiry handed over");
    assert_eq!(handover.key.as_bytes(), b"k");
    assert_eq!(handover.expired, last);
    assert_eq!(handover.handed_to, writer[0].1);
    assert_ne!(handover.expired, first);
    assert!(t.poll_expiry_handover().is_none());
}
