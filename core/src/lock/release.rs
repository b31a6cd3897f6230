//! A release: checking that the token is current on exactly the named key
//! group, freeing the keys, and handing each on to its front waiter.

use super::{GrantRecord, GroupHashes, LockTable, ReleaseOutcome};
use crate::time::Instant;
use crate::wire::KeyGroup;

impl LockTable {
    /// A release at `now` (the clock already moved): the token must be
    /// current on exactly the named group. `hashes` are the keys' hashes,
    /// in order. With the outcome, the grant released (if it was).
    pub(super) fn release_at(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        hashes: &GroupHashes,
        token: u64,
    ) -> (ReleaseOutcome, Option<GrantRecord>) {
        if token == 0 {
            // 0 marks "no holder" inside the table; it is never current.
            return (ReleaseOutcome::NotFound, None);
        }
        let mut matched = 0;
        let mut grant = None;
        for (key, &hash) in keys.keys().iter().zip(hashes) {
            if let Some(entry) = self.grant_entry(hash, key.as_bytes(), token) {
                matched += 1;
                grant = Some((
                    GrantRecord {
                        token,
                        holder: entry.holder(),
                        lease_deadline: entry.lease_deadline,
                        keys: usize::from(entry.group_len()),
                    },
                    self.grant_start(entry),
                ));
            }
        }
        let Some((grant, granted_at)) = grant else {
            return (ReleaseOutcome::NotFound, None);
        };
        // Tokens are unique per grant, so `matched` named keys carrying it
        // plus an equal group size means the named group is the granted one.
        if matched != keys.len() || grant.keys != keys.len() {
            // A lapsed grant may already be partly handed on or swept; the
            // client's token is simply not current any more.
            let outcome = if grant.lease_deadline > now {
                ReleaseOutcome::GroupMismatch
            } else {
                ReleaseOutcome::NotFound
            };
            return (outcome, None);
        }
        // Free every key first, then hand each on, so a set waiting at the
        // front of several of these keys is granted in one go.
        let mut some_waiters = false;
        for (key, &hash) in keys.keys().iter().zip(hashes) {
            let bytes = key.as_bytes();
            let shared = match self.keys.find_mut(hash, bytes) {
                Some(entry) if entry.is_shared() => true,
                Some(entry) => {
                    // Every named key carries the released token.
                    self.holder_keys -= 1;
                    if entry.is_queued() {
                        entry.token = 0;
                        some_waiters = true;
                    } else {
                        self.keys.remove(hash, bytes);
                    }
                    false
                }
                None => false,
            };
            if shared {
                // One sharer of the key's batch leaves.
                some_waiters |= self.remove_sharer(hash, bytes, token);
            }
        }
        self.sets.ended(token);
        self.extensions.remove(&token);
        self.metrics.releases += 1;
        self.metrics
            .hold
            .observe(now.saturating_duration_since(granted_at));
        if some_waiters {
            for (key, &hash) in keys.keys().iter().zip(hashes) {
                if self.grant_front(hash, key.as_bytes(), now, now) {
                    self.metrics.handovers_on_release += 1;
                }
            }
        }
        (ReleaseOutcome::Released, Some(grant))
    }
}
