//! Lease extensions and caps in the replicated lock state
//! (docs/cluster.md, "Replicated commands"): each node times an extended
//! lease and a cap from its own apply, the leader's expiry follows the
//! moved deadline, racing commands give the same result on every node, and
//! snapshots carry the extension state. Time is injected; nothing sleeps.

use ticketing_core::cluster::{ApplyResult, Command, GrantOptions, ReplicatedLocks, SnapshotError};
use ticketing_core::lock::ExtendOutcome;
use ticketing_core::time::Instant;
use ticketing_core::wire::{Key, KeyGroup};

const FIRST_TOKEN: u64 = 100;

fn group(keys: &[&str]) -> KeyGroup {
    KeyGroup::new(
        keys.iter()
            .map(|k| Key::new(k.as_bytes()).unwrap())
            .collect(),
    )
    .unwrap()
}

fn ms(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

fn initialised() -> ReplicatedLocks {
    let mut state = ReplicatedLocks::new();
    state.apply(
        &Command::Init {
            first_token: FIRST_TOKEN,
        },
        ms(0),
    );
    state
}

fn grant(keys: &[&str], lease_ms: u32, max_hold_ms: Option<u32>) -> Command {
    Command::Grant {
        keys: group(keys),
        lease_ms,
        max_hold_ms,
        options: GrantOptions::default(),
    }
}

fn extend(token: u64, lease_ms: u32) -> Command {
    Command::Extend { token, lease_ms }
}

fn extension(result: ApplyResult) -> ExtendOutcome {
    match result {
        ApplyResult::Extension { outcome } => outcome,
        other => panic!("expected an extension's result, got {other:?}"),
    }
}

/// The instant the leader would first propose the Expire of `token`: the
/// earliest `now` (in milliseconds, searched up to `limit`) at which
/// `pop_expired` hands it out. Popping does not change the grant.
fn expiry_ms(state: &ReplicatedLocks, token: u64, limit: u64) -> Option<u64> {
    let deadline = state.grant(token)?.deadline;
    let mut probe = state.clone();
    // Exact: nothing before the deadline, the grant at it.
    let before = Instant::from_micros(deadline.as_micros() - 1);
    assert_eq!(
        probe.pop_expired(before),
        None,
        "popped before its deadline"
    );
    let (popped, _) = probe.pop_expired(deadline)?;
    assert_eq!(popped, token);
    let at_ms = deadline.as_micros() / 1_000;
    (at_ms <= limit).then_some(at_ms)
}

#[test]
fn each_node_expires_an_extended_lease_at_its_own_apply_plus_the_lease() {
    let mut a = initialised();
    let mut b = initialised();
    // Node b applies everything later than a, by different amounts.
    assert_eq!(
        a.apply(&grant(&["k"], 10_000, None), ms(1_000)),
        ApplyResult::Granted { token: FIRST_TOKEN }
    );
    assert_eq!(
        b.apply(&grant(&["k"], 10_000, None), ms(1_250)),
        ApplyResult::Granted { token: FIRST_TOKEN }
    );
    let on_a = extension(a.apply(&extend(FIRST_TOKEN, 30_000), ms(6_000)));
    let on_b = extension(b.apply(&extend(FIRST_TOKEN, 30_000), ms(6_700)));
    assert_eq!(
        on_a,
        ExtendOutcome::Extended {
            expires_at: ms(36_000)
        }
    );
    assert_eq!(
        on_b,
        ExtendOutcome::Extended {
            expires_at: ms(36_700)
        }
    );
    // Neither the first lease's end nor the other node's apply decides.
    assert_eq!(expiry_ms(&a, FIRST_TOKEN, u64::MAX), Some(36_000));
    assert_eq!(expiry_ms(&b, FIRST_TOKEN, u64::MAX), Some(36_700));
    assert_eq!(a.pop_expired(ms(11_000)), None);
    assert_eq!(b.pop_expired(ms(11_250)), None);
    assert_eq!(a.replicated_view(), b.replicated_view());
}

#[test]
fn the_leaders_expiry_follows_the_extended_deadline_after_a_rebuild_and_a_rearm() {
    let mut state = initialised();
    state.apply(&grant(&["k"], 10_000, None), ms(0));
    state.apply(&extend(FIRST_TOKEN, 20_000), ms(5_000));
    assert_eq!(state.next_deadline(), Some(ms(25_000)));
    // A new leader rebuilds its heap: still the extended deadline.
    state.rebuild_deadlines();
    assert_eq!(state.pop_expired(ms(24_999)), None);
    let (token, keys) = state.pop_expired(ms(25_000)).unwrap();
    assert_eq!((token, keys), (FIRST_TOKEN, group(&["k"])));
    // Its Expire could not be proposed: re-armed, then extended again.
    state.rearm(FIRST_TOKEN, ms(25_100));
    state.apply(&extend(FIRST_TOKEN, 10_000), ms(25_050));
    assert_eq!(state.pop_expired(ms(35_049)), None);
    assert_eq!(
        state.pop_expired(ms(35_050)).map(|(t, _)| t),
        Some(FIRST_TOKEN)
    );
}

#[test]
fn an_extension_of_a_token_never_issued_or_already_gone_is_not_current_everywhere() {
    let mut state = initialised();
    assert_eq!(
        extension(state.apply(&extend(FIRST_TOKEN, 5_000), ms(0))),
        ExtendOutcome::NotCurrent
    );
    state.apply(&grant(&["k"], 10_000, None), ms(0));
    state.apply(
        &Command::Release {
            keys: group(&["k"]),
            token: FIRST_TOKEN,
        },
        ms(1),
    );
    assert_eq!(
        extension(state.apply(&extend(FIRST_TOKEN, 5_000), ms(2))),
        ExtendOutcome::NotCurrent
    );
    assert!(!state.is_held(&Key::new(b"k").unwrap()));
    assert_eq!(state.next_token(), FIRST_TOKEN + 1);
    assert_eq!(state.metrics().extensions.not_current, 2);
}

/// Applies `log` on two nodes whose clocks differ, and returns each one's
/// results (extension instants dropped: those are local).
fn run_on_two_nodes(log: &[Command]) -> [Vec<String>; 2] {
    [0, 333].map(|skew_ms| {
        let mut state = initialised();
        let mut results: Vec<String> = log
            .iter()
            .enumerate()
            .map(|(i, command)| {
                let result = state.apply(command, ms(skew_ms + 1_000 * i as u64));
                match result {
                    ApplyResult::Extension { outcome } => match outcome {
                        ExtendOutcome::Extended { .. } => "Extended".to_string(),
                        ExtendOutcome::Clipped { .. } => "Clipped".to_string(),
                        other => format!("{other:?}"),
                    },
                    other => format!("{other:?}"),
                }
            })
            .collect();
        results.push(format!("{:?}", state.replicated_view()));
        results
    })
}

#[test]
fn extend_racing_expire_gives_the_same_result_on_both_nodes_in_either_order() {
    let expire = Command::Expire {
        keys: group(&["k"]),
        token: FIRST_TOKEN,
    };
    let grant = grant(&["k"], 1_000, None);
    // Expire first: the extension finds nothing to extend.
    let [a, b] = run_on_two_nodes(&[grant.clone(), expire.clone(), extend(FIRST_TOKEN, 9_000)]);
    assert_eq!(a, b);
    assert_eq!(a[1], "Expired { existed: true }");
    assert_eq!(a[2], "NotCurrent");
    // Extend first: it extends, and the Expire still removes the grant
    // (it names a current token; replicas cannot compare local deadlines).
    let [a, b] = run_on_two_nodes(&[grant, extend(FIRST_TOKEN, 9_000), expire]);
    assert_eq!(a, b);
    assert_eq!(a[1], "Extended");
    assert_eq!(a[2], "Expired { existed: true }");
    assert_eq!(a[3], format!("{:?}", (FIRST_TOKEN + 1, Vec::<()>::new())));
}

#[test]
fn extend_racing_force_release_gives_the_same_result_on_both_nodes_in_either_order() {
    let force = Command::ForceRelease {
        key: Key::new(b"b").unwrap(),
        token: None,
    };
    let grant = grant(&["a", "b"], 1_000, None);
    let [a, b] = run_on_two_nodes(&[grant.clone(), force.clone(), extend(FIRST_TOKEN, 9_000)]);
    assert_eq!(a, b);
    assert_eq!(
        a[1],
        format!(
            "{:?}",
            ApplyResult::ForceReleased {
                revoked: FIRST_TOKEN
            }
        )
    );
    assert_eq!(a[2], "NotCurrent");
    let [a, b] = run_on_two_nodes(&[grant, extend(FIRST_TOKEN, 9_000), force]);
    assert_eq!(a, b);
    assert_eq!(a[1], "Extended");
    assert_eq!(
        a[2],
        format!(
            "{:?}",
            ApplyResult::ForceReleased {
                revoked: FIRST_TOKEN
            }
        )
    );
}

#[test]
fn a_capped_grant_is_clipped_at_grant_and_its_extensions_at_the_cap_of_each_nodes_own_apply() {
    let mut a = initialised();
    let mut b = initialised();
    // A first lease longer than the cap ends at the cap.
    a.apply(&grant(&["k"], 60_000, Some(20_000)), ms(0));
    b.apply(&grant(&["k"], 60_000, Some(20_000)), ms(400));
    assert_eq!(a.grant(FIRST_TOKEN).unwrap().deadline, ms(20_000));
    assert_eq!(b.grant(FIRST_TOKEN).unwrap().cap_at, Some(ms(20_400)));
    assert_eq!(
        extension(a.apply(&extend(FIRST_TOKEN, 5_000), ms(1_000))),
        ExtendOutcome::AtCap
    );
    assert_eq!(a.grant(FIRST_TOKEN).unwrap().extensions, 0);

    let mut c = initialised();
    c.apply(&grant(&["k"], 5_000, Some(20_000)), ms(1_000));
    assert_eq!(
        extension(c.apply(&extend(FIRST_TOKEN, 5_000), ms(4_000))),
        ExtendOutcome::Extended {
            expires_at: ms(9_000)
        }
    );
    assert_eq!(
        extension(c.apply(&extend(FIRST_TOKEN, 15_000), ms(8_000))),
        ExtendOutcome::Clipped {
            expires_at: ms(21_000)
        }
    );
    assert_eq!(
        extension(c.apply(&extend(FIRST_TOKEN, 15_000), ms(9_000))),
        ExtendOutcome::AtCap
    );
    assert_eq!(expiry_ms(&c, FIRST_TOKEN, u64::MAX), Some(21_000));
    let counts = c.metrics().extensions;
    assert_eq!(
        (
            counts.extended,
            counts.clipped,
            counts.at_cap,
            counts.not_current
        ),
        (1, 1, 1, 0)
    );
    assert_eq!(c.grant(FIRST_TOKEN).unwrap().extensions, 2);
    c.apply(
        &Command::Expire {
            keys: group(&["k"]),
            token: FIRST_TOKEN,
        },
        ms(21_000),
    );
    assert_eq!(c.metrics().expiries_extended, 1);
    assert_eq!(c.metrics().hold.sum_us(), 20_000_000);
}

#[test]
fn a_snapshot_carries_the_extended_deadline_the_cap_and_the_extension_count() {
    let mut state = initialised();
    state.apply(&grant(&["k"], 10_000, Some(60_000)), ms(0));
    state.apply(&grant(&["u"], 10_000, None), ms(0));
    state.apply(&extend(FIRST_TOKEN, 20_000), ms(5_000));
    state.apply(&extend(FIRST_TOKEN + 1, 30_000), ms(5_000));
    let snapshot = state.snapshot(ms(10_000));
    assert_eq!(snapshot[0], 2, "a capped or extended grant needs version 2");
    // Installed on another node whose clock reads 50 s.
    let restored = ReplicatedLocks::restore(&snapshot, ms(50_000)).unwrap();
    let capped = restored.grant(FIRST_TOKEN).unwrap();
    // 15 s of lease and 50 s to the cap were left at the snapshot.
    assert_eq!(capped.deadline, ms(65_000));
    assert_eq!(capped.cap_at, Some(ms(100_000)));
    assert_eq!(capped.max_hold_ms, Some(60_000));
    assert_eq!(capped.extensions, 1);
    let uncapped = restored.grant(FIRST_TOKEN + 1).unwrap();
    assert_eq!(
        (uncapped.deadline, uncapped.cap_at, uncapped.extensions),
        (ms(75_000), None, 1)
    );
    assert_eq!(restored.replicated_view(), state.replicated_view());
    assert_eq!(expiry_ms(&restored, FIRST_TOKEN, u64::MAX), Some(65_000));
    // The restored cap still clips.
    let mut restored = restored;
    assert_eq!(
        extension(restored.apply(&extend(FIRST_TOKEN, 200_000), ms(60_000))),
        ExtendOutcome::Clipped {
            expires_at: ms(100_000)
        }
    );
    // Snapshotted at its install instant, it gives the same bytes.
    let again = ReplicatedLocks::restore(&snapshot, ms(50_000)).unwrap();
    assert_eq!(again.snapshot(ms(50_000)), snapshot);
}

#[test]
fn a_state_without_caps_or_extensions_snapshots_as_before_and_old_snapshots_restore() {
    let mut state = initialised();
    state.apply(&grant(&["ab"], 10_000, None), ms(0));
    let snapshot = state.snapshot(ms(4_000));
    // Version 1, as written before caps and extensions existed:
    // version · next_token · count · token · lease_ms · remaining_ms · keys.
    let old: Vec<u8> = [
        &[1][..],
        &(FIRST_TOKEN + 1).to_be_bytes(),
        &1u32.to_be_bytes(),
        &FIRST_TOKEN.to_be_bytes(),
        &10_000u32.to_be_bytes(),
        &6_000u32.to_be_bytes(),
        &[1, 2, b'a', b'b'],
    ]
    .concat();
    assert_eq!(snapshot, old);
    let restored = ReplicatedLocks::restore(&old, ms(100_000)).unwrap();
    let holding = restored.grant(FIRST_TOKEN).unwrap();
    assert_eq!(
        (
            holding.deadline,
            holding.max_hold_ms,
            holding.cap_at,
            holding.extensions
        ),
        (ms(106_000), None, None, 0)
    );
}

#[test]
fn a_version_2_snapshot_that_needs_no_extension_fields_or_breaks_the_cap_is_refused() {
    let record = |has_cap: u8, remaining_ms: u32, cap_remaining_ms: u32, extensions: u32| {
        [
            &[2][..],
            &(FIRST_TOKEN + 1).to_be_bytes(),
            &1u32.to_be_bytes(),
            &FIRST_TOKEN.to_be_bytes(),
            &10_000u32.to_be_bytes(),
            &remaining_ms.to_be_bytes(),
            &[has_cap],
            &(if has_cap == 1 { 60_000u32 } else { 0 }).to_be_bytes(),
            &cap_remaining_ms.to_be_bytes(),
            &extensions.to_be_bytes(),
            &[1, 1, b'k'],
        ]
        .concat()
    };
    // Well-formed: a cap, or an extension.
    assert!(ReplicatedLocks::restore(&record(1, 5_000, 9_000, 0), ms(0)).is_ok());
    assert!(ReplicatedLocks::restore(&record(0, 5_000, 0, 3), ms(0)).is_ok());
    // Nothing a version 1 snapshot could not say: that one is the encoding.
    assert_eq!(
        ReplicatedLocks::restore(&record(0, 5_000, 0, 0), ms(0)).err(),
        Some(SnapshotError::Malformed)
    );
    // A time to the cap without a cap; a flag other than 0/1.
    assert_eq!(
        ReplicatedLocks::restore(&record(0, 5_000, 7, 1), ms(0)).err(),
        Some(SnapshotError::Malformed)
    );
    assert_eq!(
        ReplicatedLocks::restore(&record(2, 5_000, 9_000, 1), ms(0)).err(),
        Some(SnapshotError::Malformed)
    );
}

#[test]
fn an_expiry_retried_past_the_cap_still_snapshots_and_restores() {
    let mut state = initialised();
    state.apply(&grant(&["k"], 10_000, Some(10_000)), ms(0));
    assert_eq!(
        state.pop_expired(ms(10_000)).map(|(t, _)| t),
        Some(FIRST_TOKEN)
    );
    // The leader could not propose the Expire: it watches again later,
    // past the cap.
    state.rearm(FIRST_TOKEN, ms(12_000));
    let snapshot = state.snapshot(ms(11_000));
    let restored = ReplicatedLocks::restore(&snapshot, ms(11_000)).unwrap();
    assert_eq!(restored.snapshot(ms(11_000)), snapshot);
    let mut restored = restored;
    assert_eq!(
        extension(restored.apply(&extend(FIRST_TOKEN, 5_000), ms(11_000))),
        ExtendOutcome::AtCap
    );
}
