//! The lock table against a naive reference model, driven by arbitrary
//! operation sequences (the `sim_lock_table` fuzz target). The model and the
//! harness live in `ticketing_core::testing::lock_model` (shared with the proptest in
//! `core/tests/lock_matrix.rs`); here a fuzzer's bytes choose the
//! operations. Panics on any difference.

use ticketing_core::lock::Limits;
use ticketing_core::testing::lock_model::{Op, check_ops};

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

/// Drives a `LockTable` and the reference model with the operations
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
            keys_max: 1 + usize::from(limits_byte >> 1) % 5,
            waiters_per_key_max: 1 + usize::from(limits_byte >> 4) % 3,
            waiters_total_max: 1 + usize::from(limits_byte >> 6) % 5,
        }
    };
    // Bounded, so one input is one short run.
    check_ops(limits, std::iter::from_fn(|| next_op(&mut data)).take(512));
}
