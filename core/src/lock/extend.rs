//! Renewing a grant's lease: the rule, written once for both modes (the
//! single-mode [`super::LockTable`] and the cluster's
//! [`crate::cluster::ReplicatedLocks`]), and the single-mode table's
//! extension bookkeeping.
//!
//! The rule: a current grant's lease is renewed to `now + lease`, clipped
//! to the grant's cap on total hold (`max_hold` after the grant) if it has
//! one; if the lease already reaches the cap, the extension is refused and
//! nothing changes. Whether the token is current is the caller's check and
//! comes first: an extension never brings back a grant that ended.

use std::cmp::Reverse;

use super::{GroupHashes, LeaseDeadline, LockTable, lease_duration};
use crate::hash::IdMap;
use crate::time::{Duration, Instant};
use crate::wire::KeyGroup;

/// Answer to an extension of a grant's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExtendOutcome {
    /// The lease now ends at `expires_at` (`now` plus the requested lease).
    Extended {
        /// The grant's new lease deadline.
        expires_at: Instant,
    },
    /// The requested lease would have run past the grant's cap on total
    /// hold: the lease now ends at the cap, `expires_at`.
    Clipped {
        /// The grant's new lease deadline: its cap.
        expires_at: Instant,
    },
    /// The lease already reaches the grant's cap: nothing changed.
    AtCap,
    /// The token is not the current grant of its keys (released, expired,
    /// force-released, handed on, never issued, or naming other keys):
    /// nothing changed.
    NotCurrent,
}

impl ExtendOutcome {
    /// The new lease deadline, if the lease moved.
    pub fn expires_at(self) -> Option<Instant> {
        match self {
            ExtendOutcome::Extended { expires_at } | ExtendOutcome::Clipped { expires_at } => {
                Some(expires_at)
            }
            ExtendOutcome::AtCap | ExtendOutcome::NotCurrent => None,
        }
    }
}

/// The extension rule for a grant already known to be current: renewing,
/// at `now`, a lease that ends at `expires_at` by `lease`, under the cap
/// `cap_at` (`None`: no cap). Pure; never [`ExtendOutcome::NotCurrent`].
pub fn decide_extension(
    now: Instant,
    lease: Duration,
    expires_at: Instant,
    cap_at: Option<Instant>,
) -> ExtendOutcome {
    let wanted = now.saturating_add(lease);
    match cap_at {
        // Refused rather than re-set to the cap: nothing would change, and
        // the holder learns it must let go by then.
        Some(cap_at) if expires_at >= cap_at => ExtendOutcome::AtCap,
        Some(cap_at) if wanted > cap_at => ExtendOutcome::Clipped { expires_at: cap_at },
        _ => ExtendOutcome::Extended { expires_at: wanted },
    }
}

/// A grant's first lease deadline: `lease` after `granted_at`, but never
/// past its cap `cap_at` (a lease longer than the cap is clipped at grant).
pub fn capped_deadline(granted_at: Instant, lease: Duration, cap_at: Option<Instant>) -> Instant {
    let deadline = granted_at.saturating_add(lease);
    cap_at.map_or(deadline, |cap_at| deadline.min(cap_at))
}

/// A grant's extension state, as [`LockTable::extension_of`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantExtension {
    /// When the grant was made (the start of its hold).
    pub granted_at: Instant,
    /// Its cap on total hold: the lease never runs past this instant.
    /// `None`: no cap.
    pub cap_at: Option<Instant>,
    /// How many extensions moved its lease (clipped ones included).
    pub extensions: u32,
}

/// The extension state of the grants that have a cap or were extended, by
/// token; nothing for the others, so a table without extensions keeps
/// exactly its per-key size. A key entry of such a grant has its
/// extension bit set, so the other paths look here only for those.
pub(super) type Extensions = IdMap<u64, GrantExtension>;

impl LockTable {
    /// An extension at `now` (the clock already moved): `token` must be
    /// current, with a running lease, on exactly the named group.
    pub(super) fn extend_at(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        hashes: &GroupHashes,
        token: u64,
        lease_s: u8,
    ) -> ExtendOutcome {
        let outcome = self.decide_extend(now, keys, hashes, token, lease_s);
        let counts = &mut self.metrics.extensions;
        match outcome {
            ExtendOutcome::Extended { .. } => counts.extended += 1,
            ExtendOutcome::Clipped { .. } => counts.clipped += 1,
            ExtendOutcome::AtCap => counts.at_cap += 1,
            ExtendOutcome::NotCurrent => counts.not_current += 1,
        }
        let Some(expires_at) = outcome.expires_at() else {
            return outcome;
        };
        for (key, &hash) in keys.keys().iter().zip(hashes) {
            let Some(entry) = self.keys.find_mut(hash, key.as_bytes()) else {
                unreachable!("checked current above");
            };
            if entry.is_shared() {
                self.extend_sharer(hash, key.as_bytes(), token, expires_at);
                continue;
            }
            if !entry.has_extension() {
                // First extension of an uncapped grant: its start is still
                // readable from its first lease.
                let granted_at = entry.granted_at();
                entry.set_extension(true);
                self.extensions.entry(token).or_insert(GrantExtension {
                    granted_at,
                    cap_at: None,
                    extensions: 0,
                });
            }
            entry.lease_deadline = expires_at;
            if entry.is_queued() {
                // The old heap entry goes stale (its deadline no longer
                // matches); this one hands the key on at the new end.
                self.lease_deadlines.push(Reverse(LeaseDeadline {
                    deadline: expires_at,
                    token,
                    key: super::entry::StoredKey::from_bytes(key.as_bytes()),
                    hash,
                }));
            }
        }
        if let Some(extension) = self.extensions.get_mut(&token) {
            extension.extensions = extension.extensions.saturating_add(1);
        }
        outcome
    }

    /// The outcome of an extension, changing nothing.
    fn decide_extend(
        &self,
        now: Instant,
        keys: &KeyGroup,
        hashes: &GroupHashes,
        token: u64,
        lease_s: u8,
    ) -> ExtendOutcome {
        if token == 0 {
            // 0 marks "no holder" inside the table; it is never current.
            return ExtendOutcome::NotCurrent;
        }
        let mut current = None;
        for (key, &hash) in keys.keys().iter().zip(hashes) {
            let Some(mut entry) = self.keys.find(hash, key.as_bytes()) else {
                return ExtendOutcome::NotCurrent;
            };
            if entry.is_shared() {
                let Some(sharer) = self.grant_entry(hash, key.as_bytes(), token) else {
                    return ExtendOutcome::NotCurrent;
                };
                entry = sharer;
            }
            // A lease that ran out but was not noticed yet (lazy expiry)
            // is over all the same.
            let named = entry.token == token || (entry.token != 0 && any_token_planted());
            if !named || !entry.is_held_at(now) || usize::from(entry.group_len()) != keys.len() {
                return ExtendOutcome::NotCurrent;
            }
            current = Some((entry.lease_deadline, entry.has_extension()));
        }
        let Some((expires_at, has_extension)) = current else {
            return ExtendOutcome::NotCurrent;
        };
        let cap_at = if has_extension {
            self.extensions.get(&token).and_then(|e| e.cap_at)
        } else {
            None
        };
        decide_extension(now, lease_duration(lease_s), expires_at, cap_at)
    }
}

/// Whether the simulator's planted bug "an extension names any token" is
/// switched on (never outside tests with the `planted-bugs` feature).
#[cfg(feature = "planted-bugs")]
fn any_token_planted() -> bool {
    crate::testing::planted::active(crate::testing::planted::PlantedBug::ExtendAnyToken)
}

#[cfg(not(feature = "planted-bugs"))]
fn any_token_planted() -> bool {
    false
}

/// The caps on total hold a server gives the grants of our own clients
/// (connections that negotiated renewal): the cap an acquire gets when it
/// names none, and the most one may name. Grants of every other client
/// have no cap: they cannot be renewed, so their lease (at most 250 s)
/// bounds them already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldCaps {
    /// The cap of an acquire that names none.
    pub default: Duration,
    /// The largest cap an acquire may name; a larger one is cut to it.
    pub limit: Duration,
}

impl Default for HoldCaps {
    /// An hour by default, at most a day.
    fn default() -> Self {
        HoldCaps {
            default: Duration::from_secs(3_600),
            limit: Duration::from_secs(24 * 3_600),
        }
    }
}

impl HoldCaps {
    /// The cap of an acquire that asked for `asked` (`None`: none named),
    /// never above the limit.
    pub fn cap_for(&self, asked: Option<Duration>) -> Duration {
        asked.unwrap_or(self.default).min(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Instant {
        Instant::from_millis(s * 1_000)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_acquire_gets_the_default_cap_or_its_own_never_above_the_limit() {
        let caps = HoldCaps {
            default: Duration::from_secs(60),
            limit: Duration::from_secs(600),
        };
        assert_eq!(caps.cap_for(None), Duration::from_secs(60));
        assert_eq!(
            caps.cap_for(Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
        assert_eq!(
            caps.cap_for(Some(Duration::from_secs(6_000))),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn without_a_cap_the_lease_is_renewed_to_now_plus_the_lease() {
        assert_eq!(
            decide_extension(at(10), secs(30), at(15), None),
            ExtendOutcome::Extended { expires_at: at(40) }
        );
    }

    #[test]
    fn a_renewal_that_would_pass_the_cap_ends_at_the_cap() {
        assert_eq!(
            decide_extension(at(10), secs(30), at(15), Some(at(25))),
            ExtendOutcome::Clipped { expires_at: at(25) }
        );
    }

    #[test]
    fn a_renewal_that_ends_exactly_at_the_cap_is_not_clipped() {
        assert_eq!(
            decide_extension(at(10), secs(15), at(15), Some(at(25))),
            ExtendOutcome::Extended { expires_at: at(25) }
        );
    }

    #[test]
    fn a_lease_that_already_reaches_the_cap_is_refused() {
        assert_eq!(
            decide_extension(at(10), secs(5), at(25), Some(at(25))),
            ExtendOutcome::AtCap
        );
    }

    #[test]
    fn a_first_lease_longer_than_the_cap_ends_at_the_cap() {
        assert_eq!(capped_deadline(at(0), secs(30), Some(at(10))), at(10));
        assert_eq!(capped_deadline(at(0), secs(30), Some(at(40))), at(30));
        assert_eq!(capped_deadline(at(0), secs(30), None), at(30));
    }
}
