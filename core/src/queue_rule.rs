//! Two rules single mode ([`crate::lock`]) and the cluster leader
//! ([`crate::cluster::ClusterNode`]) both follow, written once so they
//! cannot drift apart:
//!
//! - **FIFO key sets** ([`key_set_grantable`]): a key set waits in every
//!   one of its keys' queues and is granted when it heads all of them and
//!   all its keys are free. Sequence numbers come from one global arrival
//!   order, so no two sets can each wait for the other: no deadlock.
//! - **Modes** ([`mode_admits`]): a key takes a request when it is free,
//!   or when it is held shared and the request wants it shared.
//! - **Wait minus margin** ([`wait_deadline`]): a queued request is
//!   answered `T` a margin before its wait bound runs out, so the answer
//!   beats the client's own deadline, but never before it arrived.

use crate::time::{Duration, Instant};

/// Whether the key set queued under `seq` may be granted now: for every
/// key, `queue_front` names `seq` and `is_free` holds. Both are pure
/// look-ups (their order of evaluation does not matter).
pub(crate) fn key_set_grantable<K>(
    seq: u64,
    keys: impl IntoIterator<Item = K>,
    mut queue_front: impl FnMut(&K) -> Option<u64>,
    mut is_free: impl FnMut(&K) -> bool,
) -> bool {
    keys.into_iter()
        .all(|key| queue_front(&key) == Some(seq) && is_free(&key))
}

/// How a key is held, as far as a new request's mode cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeldMode {
    /// Nobody holds it.
    Free,
    /// One shared grant or more hold it.
    Shared,
    /// One exclusive grant holds it.
    Exclusive,
}

/// Whether a key held as `held` takes a request wanting it shared (or
/// exclusive), waiters aside: a free key takes either, a key held shared
/// only another sharer, a key held exclusive nobody.
pub(crate) fn mode_admits(held: HeldMode, shared: bool) -> bool {
    match held {
        HeldMode::Free => true,
        HeldMode::Shared => shared,
        HeldMode::Exclusive => false,
    }
}

/// When a request received at `received` that may wait `wait` is
/// answered `T`: `margin` before the bound, never before `received`;
/// saturating, never wrapping.
pub(crate) fn wait_deadline(received: Instant, wait: Duration, margin: Duration) -> Instant {
    received
        .saturating_add(wait)
        .saturating_sub(margin)
        .max(received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_grantable_only_heading_every_queue_with_every_key_free() {
        let keys = ["a", "b"];
        let front = |k: &&str| if *k == "a" { Some(1) } else { Some(2) };
        assert!(!key_set_grantable(1, keys, front, |_| true));
        assert!(key_set_grantable(1, keys, |_| Some(1), |_| true));
        assert!(!key_set_grantable(1, keys, |_| Some(1), |k| *k != "b"));
        assert!(!key_set_grantable(1, keys, |_| None, |_| true));
    }

    #[test]
    fn a_free_key_takes_either_mode_a_shared_one_only_sharers() {
        for shared in [false, true] {
            assert!(mode_admits(HeldMode::Free, shared));
            assert!(!mode_admits(HeldMode::Exclusive, shared));
            assert_eq!(mode_admits(HeldMode::Shared, shared), shared);
        }
    }

    #[test]
    fn the_wait_ends_a_margin_early_but_never_before_arrival() {
        let at = Instant::from_micros;
        let secs = Duration::from_secs;
        let margin = Duration::from_millis(100);
        assert_eq!(
            wait_deadline(at(1_000), secs(2), margin),
            at(1_000 + 1_900_000)
        );
        // A margin longer than the wait: answered at arrival.
        assert_eq!(wait_deadline(at(1_000), secs(0), margin), at(1_000));
        // Saturated at the end of time, then the margin.
        assert_eq!(
            wait_deadline(at(u64::MAX - 500), secs(255), Duration::from_micros(100)),
            at(u64::MAX - 100)
        );
        assert_eq!(
            wait_deadline(at(7), secs(u64::MAX), Duration::ZERO),
            at(u64::MAX)
        );
    }
}
