//! The replicated lock state (docs/cluster.md, "Replicated commands"):
//! commands, their encoding, apply results, determinism and snapshots.

use proptest::prelude::*;
use ticketing_core::cluster::{ApplyResult, Command, GrantOptions, ReplicatedLocks, SnapshotError};
use ticketing_core::lock::ExtendOutcome;
use ticketing_core::time::Instant;
use ticketing_core::wire::{Key, KeyGroup, LeaderLabel};

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

fn initialised(first_token: u64) -> ReplicatedLocks {
    let mut state = ReplicatedLocks::new();
    assert_eq!(
        state.apply(&Command::Init { first_token }, ms(0)),
        ApplyResult::Noop
    );
    state
}

fn grant(keys: &[&str]) -> Command {
    Command::Grant {
        keys: group(keys),
        lease_ms: 10_000,
        max_hold_ms: None,
        options: GrantOptions::default(),
    }
}

#[test]
fn grant_before_init_is_rejected() {
    let mut state = ReplicatedLocks::new();
    assert_eq!(
        state.apply(&grant(&["a"]), ms(1)),
        ApplyResult::GrantRejected
    );
    assert_eq!(state.held_keys(), 0);
}

#[test]
fn only_the_first_init_sets_the_counter() {
    let mut state = initialised(1_000);
    state.apply(&Command::Init { first_token: 5 }, ms(1));
    assert_eq!(state.next_token(), 1_000);
    assert_eq!(
        state.apply(&grant(&["a"]), ms(2)),
        ApplyResult::Granted { token: 1_000 }
    );
}

#[test]
fn tokens_strictly_increase_across_keys_and_sets() {
    let mut state = initialised(77);
    let mut last = 0;
    for (i, keys) in [vec!["a"], vec!["b", "c"], vec!["d"]].iter().enumerate() {
        let ApplyResult::Granted { token } = state.apply(&grant(keys), ms(i as u64)) else {
            panic!("not granted");
        };
        assert!(token > last);
        last = token;
    }
    let release = Command::Release {
        keys: group(&["a"]),
        token: 77,
    };
    assert_eq!(state.apply(&release, ms(5)), ApplyResult::Released);
    assert_eq!(
        state.apply(&grant(&["a"]), ms(6)),
        ApplyResult::Granted { token: last + 1 }
    );
}

#[test]
fn grant_on_a_held_key_is_rejected_and_changes_nothing() {
    let mut state = initialised(10);
    state.apply(&grant(&["b"]), ms(0));
    let before = state.replicated_view();
    assert_eq!(
        state.apply(&grant(&["a", "b"]), ms(1)),
        ApplyResult::GrantRejected
    );
    assert_eq!(state.replicated_view(), before);
}

#[test]
fn release_matches_token_and_group() {
    let mut state = initialised(10);
    state.apply(&grant(&["a", "b"]), ms(0));
    let rel = |keys: &[&str], token| Command::Release {
        keys: group(keys),
        token,
    };
    assert_eq!(
        state.apply(&rel(&["a", "b"], 9), ms(1)),
        ApplyResult::NotFound
    );
    assert_eq!(state.apply(&rel(&["c"], 10), ms(1)), ApplyResult::NotFound);
    assert_eq!(
        state.apply(&rel(&["a"], 10), ms(1)),
        ApplyResult::GroupMismatch
    );
    assert_eq!(
        state.apply(&rel(&["a", "b"], 10), ms(1)),
        ApplyResult::Released
    );
    assert_eq!(
        state.apply(&rel(&["a", "b"], 10), ms(1)),
        ApplyResult::NotFound
    );
    assert_eq!(state.held_keys(), 0);
}

#[test]
fn stale_release_after_regrant_is_not_found() {
    let mut state = initialised(10);
    state.apply(&grant(&["a"]), ms(0));
    let expire = Command::Expire {
        keys: group(&["a"]),
        token: 10,
    };
    assert_eq!(
        state.apply(&expire, ms(10_000)),
        ApplyResult::Expired { existed: true }
    );
    assert_eq!(
        state.apply(&grant(&["a"]), ms(10_001)),
        ApplyResult::Granted { token: 11 }
    );
    let stale = Command::Release {
        keys: group(&["a"]),
        token: 10,
    };
    assert_eq!(state.apply(&stale, ms(10_002)), ApplyResult::NotFound);
    assert_eq!(state.holder(&Key::new(b"a").unwrap()).unwrap().0, 11);
}

#[test]
fn late_or_duplicate_expire_never_removes_a_newer_grant() {
    let mut state = initialised(10);
    state.apply(&grant(&["a"]), ms(0));
    let expire = Command::Expire {
        keys: group(&["a"]),
        token: 10,
    };
    assert_eq!(
        state.apply(&expire, ms(10_000)),
        ApplyResult::Expired { existed: true }
    );
    // Duplicate: nothing left to remove.
    assert_eq!(
        state.apply(&expire, ms(10_001)),
        ApplyResult::Expired { existed: false }
    );
    state.apply(&grant(&["a"]), ms(10_002));
    // Late: the key is held again under a newer token.
    assert_eq!(
        state.apply(&expire, ms(10_003)),
        ApplyResult::Expired { existed: false }
    );
    assert_eq!(state.holder(&Key::new(b"a").unwrap()).unwrap().0, 11);
}

#[test]
fn leader_sees_expired_grants_once_on_its_own_clock() {
    let mut state = initialised(10);
    state.apply(&grant(&["a"]), ms(100));
    assert_eq!(state.next_deadline(), Some(ms(10_100)));
    assert_eq!(state.pop_expired(ms(10_099)), None);
    assert_eq!(state.pop_expired(ms(10_100)), Some((10, group(&["a"]))));
    assert_eq!(state.pop_expired(ms(20_000)), None);
    // A new term of leadership watches every grant again.
    state.rebuild_deadlines();
    assert_eq!(state.pop_expired(ms(20_000)), Some((10, group(&["a"]))));
    // A retry only moves the deadline later.
    state.rearm(10, ms(20_100));
    assert_eq!(state.next_deadline(), Some(ms(20_100)));
}

#[test]
fn snapshot_round_trip_never_shortens_a_lease() {
    let mut state = initialised(500);
    state.apply(&grant(&["a"]), ms(0));
    state.apply(&grant(&["b", "c"]), ms(1));
    state.apply(
        &Command::Release {
            keys: group(&["a"]),
            token: 500,
        },
        ms(2),
    );
    // Taken at 4.5005 s: b,c has 5.5005 s left, rounded up to 5501 ms.
    let bytes = state.snapshot(Instant::from_micros(4_500_500));
    let restored = ReplicatedLocks::restore(&bytes, ms(7_000)).unwrap();
    assert_eq!(restored.replicated_view(), state.replicated_view());
    let (_, holding) = restored.holder(&Key::new(b"c").unwrap()).unwrap();
    assert_eq!(holding.deadline, ms(7_000 + 5_501));
    assert!(holding.deadline >= state.grant(501).unwrap().deadline);
    // Deterministic: the same state at the same instant gives the same bytes.
    assert_eq!(
        restored.snapshot(ms(7_000)),
        ReplicatedLocks::restore(&bytes, ms(7_000))
            .unwrap()
            .snapshot(ms(7_000))
    );
}

#[test]
fn grant_options_are_replicated_and_carried_by_a_snapshot() {
    let mut state = initialised(500);
    state.apply(&grant(&["plain"]), ms(0));
    let options = GrantOptions {
        shared_modes: 0b10,
        capacity: None,
        label: LeaderLabel::new("leader-a"),
    };
    state.apply(
        &Command::Grant {
            keys: group(&["x", "y"]),
            lease_ms: 10_000,
            max_hold_ms: None,
            options,
        },
        ms(1),
    );
    assert_eq!(state.grant(501).unwrap().options, options);
    let bytes = state.snapshot(ms(2));
    // A grant with options needs the third layout.
    assert_eq!(bytes[0], 3);
    let restored = ReplicatedLocks::restore(&bytes, ms(3)).unwrap();
    assert_eq!(restored.grant(501).unwrap().options, options);
    assert!(restored.grant(500).unwrap().options.is_default());
    assert_eq!(restored.snapshot(ms(3))[0], 3);
    // Once the grant with options is gone, the first layout again.
    state.apply(
        &Command::Release {
            keys: group(&["x", "y"]),
            token: 501,
        },
        ms(4),
    );
    let bytes = state.snapshot(ms(5));
    assert_eq!(bytes[0], 1);
    // The same grants written under the third layout are refused: one
    // encoding per value.
    let mut relabelled = bytes.clone();
    relabelled[0] = 3;
    assert!(ReplicatedLocks::restore(&relabelled, ms(5)).is_err());
}

#[test]
fn bad_snapshots_are_errors() {
    let state = initialised(500);
    let mut bytes = state.snapshot(ms(0));
    bytes[0] = 9;
    assert_eq!(
        ReplicatedLocks::restore(&bytes, ms(0)).unwrap_err(),
        SnapshotError::Version(9)
    );
    // A grant whose token is at or above the counter cannot exist.
    let mut holding = initialised(500);
    holding.apply(&grant(&["a"]), ms(0));
    let mut bytes = holding.snapshot(ms(0));
    bytes[1..9].copy_from_slice(&500u64.to_be_bytes());
    assert_eq!(
        ReplicatedLocks::restore(&bytes, ms(0)).unwrap_err(),
        SnapshotError::Inconsistent
    );
    let mut bytes = holding.snapshot(ms(0));
    bytes.push(0);
    assert_eq!(
        ReplicatedLocks::restore(&bytes, ms(0)).unwrap_err(),
        SnapshotError::Malformed
    );
}

#[test]
fn undecodable_entries_apply_as_noop() {
    let mut state = initialised(1);
    assert_eq!(state.apply_bytes(&[0x02, 0, 0], ms(0)), ApplyResult::Noop);
    assert_eq!(state.apply_bytes(&[], ms(0)), ApplyResult::Noop);
    let mut bytes = grant(&["a"]).to_bytes();
    bytes.push(0);
    assert_eq!(state.apply_bytes(&bytes, ms(0)), ApplyResult::Noop);
    assert_eq!(state.held_keys(), 0);
}

#[test]
fn force_release_removes_the_whole_grant_or_names_who_holds() {
    let mut state = initialised(100);
    let key = |k: &str| Key::new(k.as_bytes()).unwrap();
    assert_eq!(
        state.apply(
            &Command::ForceRelease {
                key: key("a"),
                token: None
            },
            ms(1)
        ),
        ApplyResult::ForceNotHeld
    );
    assert_eq!(
        state.apply(&grant(&["a", "b"]), ms(1)),
        ApplyResult::Granted { token: 100 }
    );
    assert_eq!(
        state.apply(
            &Command::ForceRelease {
                key: key("b"),
                token: Some(99)
            },
            ms(2)
        ),
        ApplyResult::ForceTokenMismatch { held: 100 }
    );
    assert_eq!(state.held_keys(), 2, "a mismatch changes nothing");
    assert_eq!(
        state.apply(
            &Command::ForceRelease {
                key: key("b"),
                token: Some(100)
            },
            ms(3)
        ),
        ApplyResult::ForceReleased { revoked: 100 }
    );
    assert_eq!(state.held_keys(), 0, "the set went whole");
    assert_eq!(state.metrics().force_releases, 1);
    assert_eq!(state.metrics().releases, 1, "a release, as in single mode");
    // The old holder's own release is fenced; the next grant is larger.
    assert_eq!(
        state.apply(
            &Command::Release {
                keys: group(&["a", "b"]),
                token: 100
            },
            ms(4)
        ),
        ApplyResult::NotFound
    );
    assert_eq!(
        state.apply(&grant(&["a"]), ms(5)),
        ApplyResult::Granted { token: 101 }
    );
    assert_eq!(
        state.apply(
            &Command::ForceRelease {
                key: key("a"),
                token: None
            },
            ms(6)
        ),
        ApplyResult::ForceReleased { revoked: 101 }
    );
}

#[test]
fn force_release_encoding_has_one_form_per_value() {
    let key = Key::new(b"orders/42").unwrap();
    for token in [None, Some(0), Some(7), Some(u64::MAX)] {
        let command = Command::ForceRelease {
            key: key.clone(),
            token,
        };
        let bytes = command.to_bytes();
        assert_eq!(bytes[0], 0x05);
        assert_eq!(Command::decode(&bytes), Some(command));
    }
    let mut no_flag_with_token = Command::ForceRelease {
        key: key.clone(),
        token: None,
    }
    .to_bytes();
    no_flag_with_token[9] = 1;
    assert_eq!(
        Command::decode(&no_flag_with_token),
        None,
        "a token without its flag"
    );
    let mut bad_flag = Command::ForceRelease {
        key: key.clone(),
        token: Some(1),
    }
    .to_bytes();
    bad_flag[1] = 2;
    assert_eq!(Command::decode(&bad_flag), None);
    let mut bad_key = Command::ForceRelease { key, token: None }.to_bytes();
    bad_key[11] = b' ';
    assert_eq!(Command::decode(&bad_key), None, "a key with a space");
    let mut trailing = Command::ForceRelease {
        key: Key::new(b"a").unwrap(),
        token: None,
    }
    .to_bytes();
    trailing.push(0);
    assert_eq!(Command::decode(&trailing), None);
    assert_eq!(Command::decode(&[0x05, 0]), None, "truncated");
}

fn arb_group() -> impl Strategy<Value = KeyGroup> {
    proptest::collection::btree_set("[a-e]{1,2}", 1..=3).prop_map(|keys| {
        KeyGroup::new(
            keys.iter()
                .map(|k| Key::new(k.as_bytes()).unwrap())
                .collect(),
        )
        .unwrap()
    })
}

/// What of an apply result every replica must agree on: all of it, but
/// for where an extended lease ends (each node's own clock).
fn replicated_part(result: ApplyResult) -> ApplyResult {
    match result {
        ApplyResult::Extension {
            outcome: ExtendOutcome::Extended { .. },
        } => ApplyResult::Extension {
            outcome: ExtendOutcome::Extended {
                expires_at: Instant::ZERO,
            },
        },
        ApplyResult::Extension {
            outcome: ExtendOutcome::Clipped { .. },
        } => ApplyResult::Extension {
            outcome: ExtendOutcome::Clipped {
                expires_at: Instant::ZERO,
            },
        },
        other => other,
    }
}

/// Options as a Grant may carry them: default most of the time.
fn arb_options() -> impl Strategy<Value = GrantOptions> {
    prop_oneof![
        3 => Just(GrantOptions::default()),
        1 => (
            any::<u16>(),
            proptest::option::of(1u16..=u16::MAX),
            proptest::option::of("[a-z ]{1,64}"),
        )
            .prop_map(|(shared_modes, capacity, label)| GrantOptions {
                shared_modes,
                capacity,
                label: label.and_then(|label| LeaderLabel::new(&label)),
            }),
    ]
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (1u64..1_000).prop_map(|first_token| Command::Init { first_token }),
        (
            arb_group(),
            1u32..250_000,
            proptest::option::of(1u32..300_000),
            arb_options(),
        )
            .prop_map(|(keys, lease_ms, max_hold_ms, options)| {
                let modes_mask = (1u32 << keys.len()) - 1;
                let options = GrantOptions {
                    shared_modes: (u32::from(options.shared_modes) & modes_mask) as u16,
                    ..options
                };
                Command::Grant {
                    keys,
                    lease_ms,
                    max_hold_ms,
                    options,
                }
            }),
        (arb_group(), 95u64..130).prop_map(|(keys, token)| Command::Downgrade { keys, token }),
        (95u64..130, 1u32..250_000)
            .prop_map(|(token, lease_ms)| Command::Extend { token, lease_ms }),
        (arb_group(), 95u64..130).prop_map(|(keys, token)| Command::Release { keys, token }),
        (arb_group(), 95u64..130).prop_map(|(keys, token)| Command::Expire { keys, token }),
        ("[a-e]{1,2}", proptest::option::of(95u64..130)).prop_map(|(key, token)| {
            Command::ForceRelease {
                key: Key::new(key.as_bytes()).unwrap(),
                token,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn encoding_round_trips(command in arb_command()) {
        let bytes = command.to_bytes();
        prop_assert!(bytes.len() <= ticketing_core::cluster::COMMAND_LEN_MAX);
        prop_assert_eq!(Command::decode(&bytes), Some(command));
    }

    #[test]
    fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Some(command) = Command::decode(&bytes) {
            prop_assert_eq!(command.to_bytes(), bytes);
        }
    }

    /// Two replicas applying the same committed sequence at different local
    /// times agree on every result and on the replicated state; tokens only
    /// ever grow.
    #[test]
    fn replicas_agree(commands in proptest::collection::vec(arb_command(), 1..60), skew in 0u64..5_000) {
        let mut a = initialised(100);
        let mut b = initialised(100);
        let mut last_token = 0;
        for (i, command) in commands.iter().enumerate() {
            let bytes = command.to_bytes();
            let ra = a.apply_bytes(&bytes, ms(i as u64 * 10));
            let rb = b.apply_bytes(&bytes, ms(i as u64 * 10 + skew));
            prop_assert_eq!(replicated_part(ra), replicated_part(rb));
            if let ApplyResult::Granted { token } = ra {
                prop_assert!(token > last_token);
                last_token = token;
            }
            prop_assert_eq!(a.replicated_view(), b.replicated_view());
        }
        let restored = ReplicatedLocks::restore(&a.snapshot(ms(1_000)), ms(2_000)).unwrap();
        prop_assert_eq!(restored.replicated_view(), a.replicated_view());
        for first in 'a'..='e' {
            for name in std::iter::once(first.to_string())
                .chain(('a'..='e').map(|second| format!("{first}{second}")))
            {
                let key = Key::new(name.as_bytes()).unwrap();
                prop_assert_eq!(a.sharers_of(&key), b.sharers_of(&key));
                prop_assert_eq!(restored.sharers_of(&key), a.sharers_of(&key));
            }
        }
        for (token, holding) in a.grants() {
            prop_assert_eq!(b.grant(token).map(|h| h.options), Some(holding.options));
        }
        for (token, holding) in restored.grants() {
            prop_assert!(holding.deadline >= a.grant(token).unwrap().deadline);
        }
    }
}

#[test]
fn a_snapshot_with_a_lower_counter_is_refused_and_the_state_kept() {
    // An older state: counter at 1,002 after two grants.
    let mut old = initialised(1_000);
    old.apply(&grant(&["x"]), ms(1));
    old.apply(&grant(&["y"]), ms(1));
    let behind = old.snapshot(ms(2));

    let mut state = initialised(5_000);
    let held = match state.apply(&grant(&["a"]), ms(1)) {
        ApplyResult::Granted { token } => token,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        state.install_snapshot(&behind, ms(3)),
        Err(SnapshotError::CounterBehind {
            current: 5_001,
            snapshot: 1_002
        })
    );
    // Nothing changed: the grant is still there and the counter goes on
    // above every token issued before.
    assert_eq!(state.next_token(), 5_001);
    assert_eq!(
        state.holder(&Key::new(b"a").unwrap()).map(|(t, _)| t),
        Some(held)
    );
    assert!(!state.is_held(&Key::new(b"x").unwrap()));
    assert_eq!(
        state.apply(&grant(&["b"]), ms(4)),
        ApplyResult::Granted { token: 5_001 }
    );

    // A snapshot at or above the counter is installed.
    let mut ahead = initialised(9_000);
    ahead.apply(&grant(&["z"]), ms(1));
    assert_eq!(
        state.install_snapshot(&ahead.snapshot(ms(5)), ms(5)),
        Ok(())
    );
    assert_eq!(state.next_token(), 9_001);
    assert!(state.is_held(&Key::new(b"z").unwrap()));
    // An uninitialised node takes any valid snapshot.
    let mut fresh = ReplicatedLocks::new();
    assert_eq!(fresh.install_snapshot(&behind, ms(6)), Ok(()));
    assert_eq!(fresh.next_token(), 1_002);
}

#[test]
fn a_later_init_never_lowers_the_counter() {
    let mut state = initialised(5_000);
    state.apply(&grant(&["a"]), ms(1));
    state.apply(&Command::Init { first_token: 10 }, ms(2));
    assert_eq!(state.next_token(), 5_001);
}
