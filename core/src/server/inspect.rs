//! Inspection and force-release on the single-mode server (see
//! [`crate::inspect`]): the lock table's view plus the connections the
//! server knows grants and waits by. Costs are the table's (see
//! [`crate::lock::LockTable::inspect_key`]); nothing is stored per key.

use std::collections::VecDeque;

use super::Server;
use crate::inspect::{
    AdminRequestId, ConnView, ForceRelease, ForceReleaseOutcome, HolderView, LockListing, LockView,
    WaiterView,
};
use crate::lock::KeyInspection;
use crate::server::ConnId;
use crate::time::Instant;
use crate::wire::Key;

/// Admin answers kept for a driver that does not drain
/// [`Server::poll_admin_reply`]; past it the oldest is dropped (its caller
/// times out; the force-release itself took effect).
pub const MAX_QUEUED_ADMIN_REPLIES: usize = 1_024;

/// Answers to force-releases, in the order they were decided.
#[derive(Debug, Default)]
pub(crate) struct AdminReplies(VecDeque<(AdminRequestId, ForceReleaseOutcome)>);

impl AdminReplies {
    fn push(&mut self, id: AdminRequestId, outcome: ForceReleaseOutcome) {
        if self.0.len() >= MAX_QUEUED_ADMIN_REPLIES {
            self.0.pop_front();
        }
        self.0.push_back((id, outcome));
    }
}

impl Server {
    /// `key` as an operator sees it at `now`: its holder (token, whole
    /// group, ages, connection) and its waiters in queue order; `None` when
    /// it is neither held nor waited on.
    pub fn lock(&self, now: Instant, key: &Key) -> Option<LockView> {
        let inspection = self.table.inspect_key(now, key.as_bytes())?;
        Some(self.lock_view(inspection))
    }

    /// The keys starting with `prefix` that are held or waited on at `now`,
    /// in ascending key order, at most `limit` (clamped to
    /// [`crate::inspect::MAX_LISTING_LIMIT`]). Walks the whole table:
    /// O(keys × log limit).
    pub fn locks(&self, now: Instant, prefix: &[u8], limit: usize) -> LockListing {
        let (inspections, truncated) = self.table.inspect_prefix(now, prefix, limit);
        LockListing {
            locks: inspections
                .into_iter()
                .map(|inspection| self.lock_view(inspection))
                .collect(),
            truncated,
        }
    }

    /// An operator's force-release, decided at once: the answer is ready
    /// from [`Server::poll_admin_reply`] under `id`. A release is exactly a
    /// holder's release (hand-over to the front waiter under a larger token,
    /// wakes follow), counted and reported through [`Server::poll_log`].
    pub fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.handle_timeout(now);
        // Read before the release: the key may go straight to a waiter.
        let grant = self.table.grant_of(req.key.as_bytes());
        let outcome = self.table.force_release(now, req.key.as_bytes(), req.token);
        if let ForceReleaseOutcome::Released {
            revoked,
            keys,
            handed_to,
        } = &outcome
        {
            if let Some(grant) = grant.filter(|grant| grant.token == *revoked) {
                self.held
                    .released(ConnId(grant.holder), grant.keys, grant.lease_deadline);
            }
            self.reports
                .force_released(keys.clone(), *revoked, *handed_to);
            self.drain_lock_events(now);
        }
        self.admin_replies.push(id, outcome);
    }

    /// The next answer to a force-release. Drain after every input.
    pub fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        self.admin_replies.0.pop_front()
    }

    fn conn_view(&self, conn_id: ConnId) -> Option<ConnView> {
        let conn = self.conns.get(&conn_id)?;
        Some(ConnView {
            conn: conn_id,
            source: conn.source,
            dialect: conn.front.dialect()?,
        })
    }

    fn lock_view(&self, inspection: KeyInspection) -> LockView {
        let holder = inspection.holder.map(|holder| HolderView {
            conn: self
                .table
                .grant_of(inspection.key.as_bytes())
                .filter(|grant| grant.token == holder.token)
                .and_then(|grant| self.conn_view(ConnId(grant.holder))),
            token: holder.token,
            keys: holder.keys,
            held_ms: holder.held_ms,
            lease_remaining_ms: holder.lease_remaining_ms,
        });
        let waiters = inspection
            .waiters
            .into_iter()
            .map(|waiter| WaiterView {
                conn: self
                    .waiters
                    .get(&waiter.waiter)
                    .and_then(|queued| self.conn_view(queued.conn)),
                keys: waiter.keys,
                waited_ms: waiter.waited_ms,
                wait_remaining_ms: waiter.wait_remaining_ms,
            })
            .collect();
        LockView {
            key: inspection.key,
            holder,
            waiters,
            waiters_total: inspection.waiters_total,
        }
    }
}
