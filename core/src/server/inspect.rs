//! What the single-mode server's inspection and force-release verbs
//! ([`crate::machine::Machine::inspect_lock`],
//! [`crate::machine::Machine::handle_force_release`]; vocabulary in
//! [`crate::inspect`]) are made of: the lock table's view plus the
//! connections the server knows grants and waits by, and the queue of
//! answers. Costs are the table's (see
//! [`crate::lock::LockTable::inspect_key`]); nothing is stored per key.

use std::collections::VecDeque;

use super::Server;
use crate::inspect::{
    AdminRequestId, ConnView, ForceReleaseOutcome, HolderView, LockView, WaiterView,
};
use crate::lock::{HolderInspection, KeyInspection};
use crate::server::ConnId;

/// Admin answers kept for a driver that does not drain
/// [`crate::machine::Output::AdminReply`]; past it the oldest is dropped (its caller
/// times out; the force-release itself took effect).
pub const QUEUED_ADMIN_REPLIES_MAX: usize = 1_024;

/// Answers to force-releases, in the order they were decided.
#[derive(Debug, Default)]
pub(crate) struct AdminReplies(VecDeque<(AdminRequestId, ForceReleaseOutcome)>);

impl AdminReplies {
    /// Queues an answer, dropping the oldest past the bound.
    pub(super) fn push(&mut self, id: AdminRequestId, outcome: ForceReleaseOutcome) {
        if self.0.len() >= QUEUED_ADMIN_REPLIES_MAX {
            self.0.pop_front();
        }
        self.0.push_back((id, outcome));
    }

    /// The oldest answer not yet handed to the driver.
    pub(super) fn pop(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        self.0.pop_front()
    }
}

impl Server {
    fn conn_view(&self, conn_id: ConnId) -> Option<ConnView> {
        let conn = self.conns.get(&conn_id)?;
        Some(ConnView {
            conn: conn_id,
            source: conn.source,
            dialect: conn.front.dialect()?,
            label: conn.front.label().map(Box::from),
        })
    }

    /// The operator's view of one key the table inspected.
    pub(super) fn lock_view(&self, inspection: KeyInspection) -> LockView {
        let key = inspection.key.as_bytes();
        let holder = inspection
            .holder
            .map(|holder| self.holder_view(key, holder));
        let sharers = inspection
            .sharers
            .into_iter()
            .map(|sharer| self.holder_view(key, sharer))
            .collect();
        let waiters = inspection
            .waiters
            .into_iter()
            .map(|waiter| WaiterView {
                conn: self
                    .waiters
                    .get(&waiter.waiter)
                    .and_then(|queued| self.conn_view(queued.conn)),
                keys: waiter.keys,
                shared: waiter.shared,
                waited_ms: waiter.waited_ms,
                wait_remaining_ms: waiter.wait_remaining_ms,
            })
            .collect();
        LockView {
            key: inspection.key,
            holder,
            sharers,
            waiters,
            waiters_total: inspection.waiters_total,
        }
    }

    /// The operator's view of grant `holder` on `key`, with its connection.
    fn holder_view(&self, key: &[u8], holder: HolderInspection) -> HolderView {
        HolderView {
            conn: self
                .table
                .grant_of_token(key, holder.token)
                .and_then(|grant| self.conn_view(ConnId(grant.holder))),
            token: holder.token,
            keys: holder.keys,
            held_ms: holder.held_ms,
            lease_remaining_ms: holder.lease_remaining_ms,
            extensions: holder.extensions,
            hold_remaining_ms: holder.hold_remaining_ms,
        }
    }
}
