//! Snapshots of the replicated state: what a lagging node installs instead
//! of the log entries compacted away.

use super::{
    Holding, ReplicatedLocks, SNAPSHOT_NEXT_TOKEN_MAX, SNAPSHOT_VERSION, SNAPSHOT_VERSION_EXTENDED,
    SNAPSHOT_VERSION_OPTIONS, SnapshotError,
};
use crate::cluster::bytes::{Reader, put_key_group};
use crate::cluster::command::GrantOptions;
use crate::lock::KeyModes;
use crate::time::{Duration, Instant, duration_micros};

impl ReplicatedLocks {
    /// Serializes the state at `now`: the counter and every grant with its
    /// remaining lease (and, if any grant has a cap or was extended, every
    /// grant's cap and remaining time to it, and its extension count),
    /// rounded up to whole milliseconds. Deterministic (grants in token
    /// order).
    ///
    /// Layout: version u8 (1) · next_token u64 · count u32 ·
    /// count × (token u64 · lease_ms u32 · remaining_ms u32 · keys).
    ///
    /// With a capped or extended grant, version 2, whose records are
    /// token u64 · lease_ms u32 · remaining_ms u32 · has_cap u8 (0/1) ·
    /// max_hold_ms u32 · cap_remaining_ms u32 (both 0 unless has_cap) ·
    /// extensions u32 · keys. Version 1 otherwise, so a state that never
    /// used either snapshots exactly as before they existed.
    ///
    /// With a grant whose options are not the default (shared keys,
    /// semaphore slots, a label), version 3: version 2's records with the
    /// grant's options (as in a Grant command) before its keys.
    pub fn snapshot(&self, now: Instant) -> Vec<u8> {
        let with_options = self.grants.values().any(|h| !h.options.is_default());
        let extended = with_options || self.grants.values().any(Holding::is_extended);
        let record_extra = if extended { 13 } else { 0 };
        let mut out = Vec::with_capacity(13 + self.grants.len() * (32 + record_extra));
        out.push(if with_options {
            SNAPSHOT_VERSION_OPTIONS
        } else if extended {
            SNAPSHOT_VERSION_EXTENDED
        } else {
            SNAPSHOT_VERSION
        });
        out.extend_from_slice(&self.next_token.to_be_bytes());
        out.extend_from_slice(
            &u32::try_from(self.grants.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        for (token, holding) in self.sorted_grants() {
            out.extend_from_slice(&token.to_be_bytes());
            out.extend_from_slice(&holding.lease_ms.to_be_bytes());
            out.extend_from_slice(&remaining_ms(holding.deadline, now).to_be_bytes());
            if extended {
                out.push(u8::from(holding.max_hold_ms.is_some()));
                out.extend_from_slice(&holding.max_hold_ms.unwrap_or(0).to_be_bytes());
                let cap_remaining_ms = holding.cap_at.map_or(0, |cap| remaining_ms(cap, now));
                out.extend_from_slice(&cap_remaining_ms.to_be_bytes());
                out.extend_from_slice(&holding.extensions.to_be_bytes());
            }
            if with_options {
                holding.options.encode(&mut out);
            }
            put_key_group(&mut out, &holding.keys);
        }
        out
    }

    /// Replaces this state with the one in [`Self::snapshot`] bytes,
    /// installed at `now` (see [`Self::restore`]), unless they do not decode
    /// or their token counter is below this state's: a counter never goes
    /// down, so such a snapshot is refused and this state kept as it is.
    pub fn install_snapshot(&mut self, bytes: &[u8], now: Instant) -> Result<(), SnapshotError> {
        let restored = ReplicatedLocks::restore(bytes, now)?;
        if restored.next_token < self.next_token {
            return Err(SnapshotError::CounterBehind {
                current: self.next_token,
                snapshot: restored.next_token,
            });
        }
        let mut metrics = std::mem::take(&mut self.metrics);
        metrics.snapshots_installed += 1;
        *self = restored;
        self.metrics = metrics;
        Ok(())
    }

    /// Rebuilds a state from [`Self::snapshot`] bytes installed at `now`:
    /// each lease deadline becomes `now + remaining`, never earlier than
    /// this node learned of the grant.
    pub fn restore(bytes: &[u8], now: Instant) -> Result<ReplicatedLocks, SnapshotError> {
        let mut r = Reader::new(bytes);
        let version = r.u8().ok_or(SnapshotError::Malformed)?;
        let (extended, with_options) = match version {
            SNAPSHOT_VERSION => (false, false),
            SNAPSHOT_VERSION_EXTENDED => (true, false),
            SNAPSHOT_VERSION_OPTIONS => (true, true),
            _ => return Err(SnapshotError::Version(version)),
        };
        let next_token = r
            .u64()
            .filter(|&next| next <= SNAPSHOT_NEXT_TOKEN_MAX)
            .ok_or(SnapshotError::Malformed)?;
        let count = r.u32().ok_or(SnapshotError::Malformed)?;
        let mut state = ReplicatedLocks {
            next_token,
            ..ReplicatedLocks::default()
        };
        let mut last_token = 0;
        for _ in 0..count {
            // Each record is at least 18 bytes, so a hostile count cannot
            // loop long past the end of the data.
            let token = r.u64().ok_or(SnapshotError::Malformed)?;
            let lease_ms = r.u32().ok_or(SnapshotError::Malformed)?;
            let remaining_ms = r.u32().ok_or(SnapshotError::Malformed)?;
            let (max_hold_ms, cap_remaining_ms, extensions) = if extended {
                restore_extension(&mut r)?
            } else {
                (None, None, 0)
            };
            let options = if with_options {
                GrantOptions::decode(&mut r).ok_or(SnapshotError::Malformed)?
            } else {
                GrantOptions::default()
            };
            let keys = r.key_group().ok_or(SnapshotError::Malformed)?;
            if !options.fits(&keys) {
                return Err(SnapshotError::Malformed);
            }
            if token <= last_token || token >= next_token {
                return Err(SnapshotError::Inconsistent);
            }
            last_token = token;
            let modes = KeyModes::from_bits(options.shared_modes);
            for (index, key) in keys.keys().iter().enumerate() {
                // A key held exclusive by one grant and by any other, in
                // either mode, is not a state any order of commands makes;
                // sharers are rebuilt oldest first, as they were granted.
                let hash = state.keys.hash(key.as_bytes());
                if !state.key_takes(hash, key, modes.is_shared(index)) {
                    return Err(SnapshotError::Inconsistent);
                }
                state.hold_key(hash, key, token, modes.is_shared(index));
            }
            let after = |ms: u32| now.saturating_add(Duration::from_millis(u64::from(ms)));
            state.grants.insert(
                token,
                Holding {
                    keys,
                    lease_ms,
                    deadline: after(remaining_ms),
                    granted_at: now,
                    max_hold_ms,
                    cap_at: cap_remaining_ms.map(after),
                    extensions,
                    options,
                },
            );
        }
        if !r.is_empty() {
            return Err(SnapshotError::Malformed);
        }
        let any_options = state.grants.values().any(|h| !h.options.is_default());
        let any_extended = state.grants.values().any(Holding::is_extended);
        if with_options != any_options || (extended && !with_options && !any_extended) {
            // Such a state snapshots under another version: one encoding
            // per value.
            return Err(SnapshotError::Malformed);
        }
        state.rebuild_deadlines();
        Ok(state)
    }
}

/// The time from `now` to `deadline` in whole milliseconds, rounded up so
/// that a lease (or cap) never gets shorter on restore.
fn remaining_ms(deadline: Instant, now: Instant) -> u32 {
    let remaining_us = duration_micros(deadline.saturating_duration_since(now));
    u32::try_from(remaining_us.div_ceil(1_000)).unwrap_or(u32::MAX)
}

/// Reads a version-2 record's extension fields (after its remaining
/// lease, `remaining_ms`): the cap, the time left to it, the extension
/// count.
///
/// The remaining lease may exceed the time to the cap: a leader that
/// could not propose an expiry re-arms it later ([`ReplicatedLocks::rearm`]),
/// past the cap; such a lease is over all the same, only its Expire is
/// late, and the cap still refuses every extension.
fn restore_extension(r: &mut Reader<'_>) -> Result<(Option<u32>, Option<u32>, u32), SnapshotError> {
    let has_cap = r.bool().ok_or(SnapshotError::Malformed)?;
    let max_hold_ms = r.u32().ok_or(SnapshotError::Malformed)?;
    let cap_remaining_ms = r.u32().ok_or(SnapshotError::Malformed)?;
    let extensions = r.u32().ok_or(SnapshotError::Malformed)?;
    if !has_cap {
        if max_hold_ms != 0 || cap_remaining_ms != 0 {
            // One encoding per value.
            return Err(SnapshotError::Malformed);
        }
        return Ok((None, None, extensions));
    }
    Ok((Some(max_hold_ms), Some(cap_remaining_ms), extensions))
}
