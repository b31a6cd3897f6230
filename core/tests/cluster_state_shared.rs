//! Shared holds in the replicated lock state (docs/cluster.md, "Shared
//! holds"): several shared grants on one key, what removes one of them,
//! the downgrade, and snapshots that carry sharers.

use ticketing_core::cluster::command::GrantOptions;
use ticketing_core::cluster::{ApplyResult, Command, ReplicatedLocks, SnapshotError};
use ticketing_core::time::Instant;
use ticketing_core::wire::{Key, KeyGroup};

fn key(name: &str) -> Key {
    Key::new(name.as_bytes()).unwrap()
}

fn group(names: &[&str]) -> KeyGroup {
    KeyGroup::new(names.iter().map(|name| key(name)).collect()).unwrap()
}

fn ms(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

fn initialised() -> ReplicatedLocks {
    let mut state = ReplicatedLocks::new();
    state.apply(&Command::Init { first_token: 100 }, ms(0));
    state
}

/// A Grant of `names` with `shared_modes` (bit `i`: key `i` shared).
fn grant(names: &[&str], shared_modes: u16) -> Command {
    Command::Grant {
        keys: group(names),
        lease_ms: 10_000,
        max_hold_ms: None,
        options: GrantOptions {
            shared_modes,
            ..GrantOptions::default()
        },
    }
}

fn granted(state: &mut ReplicatedLocks, command: &Command, at: u64) -> u64 {
    match state.apply(command, ms(at)) {
        ApplyResult::Granted { token } => token,
        other => panic!("{command:?} not granted: {other:?}"),
    }
}

fn release(names: &[&str], token: u64) -> Command {
    Command::Release {
        keys: group(names),
        token,
    }
}

#[test]
fn sharers_hold_a_key_together_and_an_exclusive_grant_is_rejected_until_the_last_leaves() {
    let mut state = initialised();
    let first = granted(&mut state, &grant(&["k"], 1), 1);
    let second = granted(&mut state, &grant(&["k"], 1), 2);
    assert_eq!(state.sharers_of(&key("k")), [first, second]);
    assert_eq!(
        state.apply(&grant(&["k"], 0), ms(3)),
        ApplyResult::GrantRejected
    );
    // The key map names the oldest sharer.
    assert_eq!(state.holder(&key("k")).map(|(t, _)| t), Some(first));
    assert_eq!(state.key_holds(), 2);

    assert_eq!(
        state.apply(&release(&["k"], first), ms(4)),
        ApplyResult::Released
    );
    assert_eq!(state.sharers_of(&key("k")), [second]);
    assert_eq!(state.holder(&key("k")).map(|(t, _)| t), Some(second));
    assert_eq!(
        state.apply(&grant(&["k"], 0), ms(5)),
        ApplyResult::GrantRejected
    );
    let expire = Command::Expire {
        keys: group(&["k"]),
        token: second,
    };
    assert_eq!(
        state.apply(&expire, ms(6)),
        ApplyResult::Expired { existed: true }
    );
    assert!(!state.is_held(&key("k")));
    assert_eq!(state.key_holds(), 0);
    let writer = granted(&mut state, &grant(&["k"], 0), 7);
    // A sharer never joins an exclusive holder.
    assert_eq!(
        state.apply(&grant(&["k"], 1), ms(8)),
        ApplyResult::GrantRejected
    );
    assert!(state.sharers_of(&key("k")).is_empty());
    assert_eq!(state.holder(&key("k")).map(|(t, _)| t), Some(writer));
}

#[test]
fn a_key_set_mixing_modes_shares_one_key_and_holds_the_other_alone() {
    let mut state = initialised();
    let set = granted(&mut state, &grant(&["a", "b"], 0b01), 1);
    let reader = granted(&mut state, &grant(&["a"], 1), 2);
    assert_eq!(
        state.apply(&grant(&["b"], 1), ms(3)),
        ApplyResult::GrantRejected
    );
    assert_eq!(
        state.apply(&grant(&["a"], 0), ms(3)),
        ApplyResult::GrantRejected
    );
    // A set one of whose keys is refused takes none.
    assert_eq!(
        state.apply(&grant(&["a", "c"], 0b10), ms(3)),
        ApplyResult::GrantRejected
    );
    assert!(!state.is_held(&key("c")));
    assert_eq!(state.sharers_of(&key("a")), [set, reader]);
    assert!(state.sharers_of(&key("b")).is_empty());
    assert_eq!(
        state.apply(&release(&["a", "b"], set), ms(4)),
        ApplyResult::Released
    );
    assert_eq!(state.sharers_of(&key("a")), [reader]);
    assert!(!state.is_held(&key("b")));
}

#[test]
fn a_force_release_revokes_the_named_sharer_or_else_the_oldest() {
    let mut state = initialised();
    let first = granted(&mut state, &grant(&["k"], 1), 1);
    let second = granted(&mut state, &grant(&["k"], 1), 2);
    let third = granted(&mut state, &grant(&["k"], 1), 3);
    let force = |token| Command::ForceRelease {
        key: key("k"),
        token,
    };
    assert_eq!(
        state.apply(&force(Some(third + 1)), ms(4)),
        ApplyResult::ForceTokenMismatch { held: first }
    );
    assert_eq!(
        state.apply(&force(Some(second)), ms(4)),
        ApplyResult::ForceReleased { revoked: second }
    );
    assert_eq!(state.sharers_of(&key("k")), [first, third]);
    assert_eq!(
        state.apply(&force(None), ms(5)),
        ApplyResult::ForceReleased { revoked: first }
    );
    assert_eq!(state.sharers_of(&key("k")), [third]);
    assert_eq!(
        state.apply(&force(None), ms(6)),
        ApplyResult::ForceReleased { revoked: third }
    );
    assert_eq!(state.apply(&force(None), ms(7)), ApplyResult::ForceNotHeld);
}

#[test]
fn a_downgrade_turns_a_whole_grant_shared_in_place_or_changes_nothing() {
    let mut state = initialised();
    let token = granted(&mut state, &grant(&["a", "b"], 0), 1);
    let deadline = state.grant(token).unwrap().deadline;
    let downgrade = |names: &[&str], token| Command::Downgrade {
        keys: group(names),
        token,
    };
    assert_eq!(
        state.apply(&downgrade(&["a"], token), ms(2)),
        ApplyResult::GroupMismatch
    );
    assert_eq!(
        state.apply(&downgrade(&["z"], token), ms(2)),
        ApplyResult::NotFound
    );
    assert_eq!(
        state.apply(&downgrade(&["a", "b"], token + 1), ms(2)),
        ApplyResult::NotFound
    );
    assert!(state.sharers_of(&key("a")).is_empty());
    assert_eq!(
        state.apply(&grant(&["a"], 1), ms(2)),
        ApplyResult::GrantRejected
    );

    assert_eq!(
        state.apply(&downgrade(&["a", "b"], token), ms(3)),
        ApplyResult::Downgraded
    );
    let holding = state.grant(token).unwrap();
    assert_eq!(holding.deadline, deadline, "same lease");
    assert_eq!(holding.options.shared_modes, 0b11);
    assert_eq!(state.sharers_of(&key("a")), [token]);
    // A second one is answered as the first and changes nothing.
    assert_eq!(
        state.apply(&downgrade(&["a", "b"], token), ms(4)),
        ApplyResult::Downgraded
    );
    let reader = granted(&mut state, &grant(&["b"], 1), 5);
    assert_eq!(state.sharers_of(&key("b")), [token, reader]);
    assert_eq!(
        state.apply(&grant(&["a"], 0), ms(6)),
        ApplyResult::GrantRejected
    );
    assert_eq!(state.metrics().downgrades, 1);
    assert_eq!(
        state.apply(&release(&["a", "b"], token), ms(7)),
        ApplyResult::Released
    );
    assert!(!state.is_held(&key("a")));
    assert_eq!(state.sharers_of(&key("b")), [reader]);
}

#[test]
fn a_snapshot_restores_every_sharer_and_their_modes() {
    let mut state = initialised();
    let set = granted(&mut state, &grant(&["a", "b"], 0b01), 1);
    let reader = granted(&mut state, &grant(&["a"], 1), 2);
    let writer = granted(&mut state, &grant(&["c"], 0), 3);
    let bytes = state.snapshot(ms(4));
    let mut restored = ReplicatedLocks::restore(&bytes, ms(4)).unwrap();
    assert_eq!(restored.replicated_view(), state.replicated_view());
    assert_eq!(restored.sharers_of(&key("a")), [set, reader]);
    assert!(restored.sharers_of(&key("b")).is_empty());
    assert_eq!(restored.holder(&key("c")).map(|(t, _)| t), Some(writer));
    assert_eq!(restored.key_holds(), state.key_holds());
    assert_eq!(restored.snapshot(ms(4)), bytes, "one encoding");
    // The restored state applies the same rules.
    assert_eq!(
        restored.apply(&grant(&["b"], 1), ms(5)),
        ApplyResult::GrantRejected
    );
    assert!(matches!(
        restored.apply(&grant(&["a"], 1), ms(5)),
        ApplyResult::Granted { .. }
    ));
}

#[test]
fn a_snapshot_with_a_key_held_exclusive_and_by_another_grant_is_inconsistent() {
    let mut state = initialised();
    granted(&mut state, &grant(&["k"], 1), 1);
    granted(&mut state, &grant(&["k"], 1), 2);
    let mut bytes = state.snapshot(ms(3));
    assert!(ReplicatedLocks::restore(&bytes, ms(3)).is_ok());
    // The last record is the second sharer's; its options (modes u16 ·
    // capacity u16 · label_len u8, no label) come right before its keys
    // (count 1 · len 1 · "k"). Marked exclusive, it holds "k" beside the
    // first sharer.
    let modes_at = bytes.len() - 3 - 5;
    assert_eq!(bytes[modes_at..modes_at + 2], 1u16.to_be_bytes());
    bytes[modes_at..modes_at + 2].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(
        ReplicatedLocks::restore(&bytes, ms(3)).map(|_| ()),
        Err(SnapshotError::Inconsistent)
    );
    // And the other way round: the first one exclusive, the second shared.
    let mut bytes = state.snapshot(ms(3));
    let first_keys_end = bytes.len() - record_len(&bytes);
    let first_modes_at = first_keys_end - 3 - 5;
    assert_eq!(
        bytes[first_modes_at..first_modes_at + 2],
        1u16.to_be_bytes()
    );
    bytes[first_modes_at..first_modes_at + 2].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(
        ReplicatedLocks::restore(&bytes, ms(3)).map(|_| ()),
        Err(SnapshotError::Inconsistent)
    );
}

/// The length of a snapshot's last record: both records of the test are
/// alike (same lease, options and one-key group), so it is the length of
/// either.
fn record_len(bytes: &[u8]) -> usize {
    // version u8 · next_token u64 · count u32, then two equal records.
    (bytes.len() - 13) / 2
}
