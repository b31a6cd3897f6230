//! A release: checking that the token is current on exactly the named key
//! group, freeing the keys, and handing each on to its front waiter.

use super::{LockTable, ReleaseOutcome};
use crate::time::Instant;
use crate::wire::KeyGroup;

impl LockTable {
    /// A release at `now` (the clock already moved): the token must be
    /// current on exactly the named group.
    pub(super) fn release_at(
        &mut self,
        now: Instant,
        keys: &KeyGroup,
        token: u64,
    ) -> ReleaseOutcome {
        if token == 0 {
            // 0 marks "no holder" inside the table; it is never current.
            return ReleaseOutcome::NotFound;
        }
        let mut matched = 0;
        let mut grant = None;
        for key in keys.keys() {
            if let Some(entry) = self.keys.get(key.as_bytes())
                && entry.token == token
            {
                matched += 1;
                grant = Some((entry.group_len(), entry.lease_deadline, entry.granted_at()));
            }
        }
        let Some((group_len, lease_deadline, granted_at)) = grant else {
            return ReleaseOutcome::NotFound;
        };
        // Tokens are unique per grant, so `matched` named keys carrying it
        // plus an equal group size means the named group is the granted one.
        if matched != keys.len() || usize::from(group_len) != keys.len() {
            // A lapsed grant may already be partly handed on or swept; the
            // client's token is simply not current any more.
            return if lease_deadline > now {
                ReleaseOutcome::GroupMismatch
            } else {
                ReleaseOutcome::NotFound
            };
        }
        // Free every key first, then hand each on, so a set waiting at the
        // front of several of these keys is granted in one go.
        let mut some_waiters = false;
        for key in keys.keys() {
            let bytes = key.as_bytes();
            if let Some(entry) = self.keys.get_mut(bytes) {
                // Every named key carries the released token.
                self.holder_keys -= 1;
                if entry.is_queued() {
                    entry.token = 0;
                    some_waiters = true;
                } else {
                    self.keys.remove(bytes);
                }
            }
        }
        self.metrics.releases += 1;
        self.metrics
            .hold
            .observe(now.saturating_duration_since(granted_at));
        if some_waiters {
            for key in keys.keys() {
                if self.grant_front(key.as_bytes(), now, now) {
                    self.metrics.handovers_on_release += 1;
                }
            }
        }
        ReleaseOutcome::Released
    }
}
