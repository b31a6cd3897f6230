//! The replicated-command and lock-snapshot codecs: see
//! [`replicated_codecs`].

use crate::cluster::{ApplyResult, Command, FIRST_TOKEN_MAX, GrantOptions, ReplicatedLocks};
use crate::time::{Duration, Instant};

use super::script::{Cursor, fuzz_keys};

/// A command built from the fuzzer's bytes (always encodable); `last_token`
/// is the newest token issued, which some force-releases name.
fn command(cursor: &mut Cursor<'_>, last_token: u64) -> Option<Command> {
    let kind = cursor.byte()?;
    let keys = fuzz_keys(cursor.byte().unwrap_or(1));
    let mut word = [0u8; 8];
    let taken = cursor.bytes(8);
    word[8 - taken.len()..].copy_from_slice(taken);
    let number = u64::from_be_bytes(word);
    Some(match kind % 7 {
        0 => Command::Init {
            first_token: number % FIRST_TOKEN_MAX,
        },
        // With options when the kind byte says so: modes and capacity from
        // the word's upper half, and a label.
        1 => {
            let options = if kind & 0x80 != 0 {
                let modes_mask = (1u32 << keys.len()) - 1;
                GrantOptions {
                    shared_modes: ((number >> 32) as u32 & modes_mask) as u16,
                    capacity: std::num::NonZeroU16::new((number >> 48) as u16).map(|n| n.get()),
                    label: (kind & 0x40 != 0)
                        .then(|| crate::wire::LeaderLabel::new("fuzz"))
                        .flatten(),
                }
            } else {
                GrantOptions::default()
            };
            Command::Grant {
                keys,
                lease_ms: number as u32,
                max_hold_ms: None,
                options,
            }
        }
        // A capped grant: its lease and cap from the two halves of the word.
        5 => Command::Grant {
            keys,
            lease_ms: number as u32,
            max_hold_ms: Some((number >> 32) as u32),
            options: GrantOptions::default(),
        },
        // A downgrade of a recent grant (or of a token never issued),
        // naming the fuzzed keys, which sometimes are its keys.
        6 if kind & 0x80 != 0 => Command::Downgrade {
            keys,
            token: last_token.saturating_sub(number % 3),
        },
        // An extension of a recent grant (or of a token never issued).
        6 => Command::Extend {
            token: last_token.saturating_sub(number % 3),
            lease_ms: (number >> 32) as u32,
        },
        2 => Command::Release {
            keys,
            token: number,
        },
        3 => Command::Expire {
            keys,
            token: number,
        },
        // Any key of the group; with a token when the kind byte says so,
        // near the grants made so far so that some match.
        _ => {
            let key = keys.keys()[usize::from(kind) % keys.len()].clone();
            let token = match (kind & 0x80 != 0, kind & 0x40 != 0) {
                (false, _) => None,
                (true, true) => Some(last_token.saturating_sub(number % 3)),
                (true, false) => Some(number),
            };
            Command::ForceRelease { key, token }
        }
    })
}

/// Two halves, split by the first byte: the front is decoded as arbitrary
/// bytes, the back drives a structured round trip.
///
/// Arbitrary bytes: [`Command::decode`] and [`ReplicatedLocks::restore`]
/// never panic, and anything either accepts re-encodes to exactly the same
/// bytes (one encoding per value); applying the bytes as an entry never
/// lowers the token counter.
///
/// Structured: commands built from the bytes satisfy
/// `decode(encode(c)) == c`; they are applied to a state (with clock jumps
/// between them), whose token counter never goes down and whose snapshot
/// restores to the same replicated state and snapshots to the same bytes;
/// a downgrade that applies leaves the grant sharing every key it holds.
pub fn replicated_codecs(data: &[u8]) {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let (raw, script) = data.split_at(usize::from(split).min(data.len()));
    let now = Instant::from_millis(1_000);

    if let Some(command) = Command::decode(raw) {
        assert_eq!(command.to_bytes(), raw, "{command:?} has two encodings");
    }
    if let Ok(state) = ReplicatedLocks::restore(raw, now) {
        assert_eq!(state.snapshot(now), raw, "a snapshot with two encodings");
        let mut state = state;
        let before = state.next_token();
        state.apply_bytes(raw, now);
        assert!(state.next_token() >= before);
    }

    let mut cursor = Cursor { data: script };
    let mut state = ReplicatedLocks::new();
    let mut at = now;
    while let Some(command) = command(&mut cursor, state.next_token().saturating_sub(1)) {
        let bytes = command.to_bytes();
        assert_eq!(Command::decode(&bytes), Some(command.clone()));
        let before = state.next_token();
        let result = state.apply(&command, at);
        let after = state.next_token();
        assert!(
            after >= before,
            "the counter went down: {before} -> {after}"
        );
        if let ApplyResult::Granted { token } = result {
            assert!(
                token >= before && token < after,
                "token {token} outside the counter"
            );
        }
        if let (Command::Downgrade { keys, token }, ApplyResult::Downgraded) = (&command, result) {
            // A downgraded grant holds every one of its keys shared, with
            // the token it had.
            for key in keys.keys() {
                assert!(state.sharers_of(key).contains(token), "{key:?} not shared");
            }
        }
        if let Command::ForceRelease { key, token } = &command {
            // A force-release leaves its key free, or names the token that
            // still holds it and changes nothing.
            match result {
                ApplyResult::ForceReleased { revoked } => {
                    assert!(!state.is_held(key));
                    assert!(state.grant(revoked).is_none());
                    assert!(token.is_none_or(|t| t == revoked));
                }
                ApplyResult::ForceNotHeld => assert!(!state.is_held(key)),
                ApplyResult::ForceTokenMismatch { held } => {
                    assert_eq!(state.holder(key).map(|(t, _)| t), Some(held));
                    assert_ne!(*token, Some(held));
                }
                other => panic!("a force-release applied as {other:?}"),
            }
        }
        at = at.saturating_add(Duration::from_millis(u64::from(cursor.byte().unwrap_or(0))));
        // Leases that ran out leave through a committed Expire, as the
        // leader would propose.
        while let Some((token, keys)) = state.pop_expired(at) {
            let result = state.apply(&Command::Expire { keys, token }, at);
            assert_eq!(result, ApplyResult::Expired { existed: true });
        }
        let snapshot = state.snapshot(at);
        let restored = ReplicatedLocks::restore(&snapshot, at).expect("own snapshot restores");
        assert_eq!(restored.replicated_view(), state.replicated_view());
        assert_eq!(restored.snapshot(at), snapshot);
    }
}
