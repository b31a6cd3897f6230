//! A driven core as the admin API sees it: [`DrivenNode`] adapts the
//! driver's shared state to [`AdminNode`], so that the admin module needs
//! nothing from the driver (the driver starts the admin API, not the
//! other way round).

use std::sync::Arc;

use ticketing_core::events::EventView;
use ticketing_core::inspect::{
    ForceRelease, ForceReleaseOutcome, ListingCursor, LockListing, LockView, MemberView, NotLeader,
};
use ticketing_core::machine::Machine;
use ticketing_core::wire::Key;
use tokio::sync::oneshot;

use super::shared::Shared;
use crate::admin::{AdminNode, NodeMetrics};

/// A driven core (the driver's shared state) as an [`AdminNode`].
pub(crate) struct DrivenNode<M> {
    pub(crate) shared: Arc<Shared<M>>,
    pub(crate) metrics: fn(&M) -> NodeMetrics,
}

impl<M: Machine> AdminNode for DrivenNode<M> {
    fn metrics(&self) -> NodeMetrics {
        (self.metrics)(&self.shared.lock().core)
    }
    fn lock(&self, key: &Key) -> Option<LockView> {
        let inner = self.shared.lock();
        inner.core.inspect_lock(self.shared.clock.now(), key)
    }
    fn locks(&self, prefix: &[u8], limit: usize, cursor: ListingCursor) -> LockListing {
        let inner = self.shared.lock();
        inner
            .core
            .inspect_locks(self.shared.clock.now(), prefix, limit, cursor)
    }
    fn force_release(&self, req: ForceRelease) -> Option<oneshot::Receiver<ForceReleaseOutcome>> {
        let mut inner = self.shared.lock();
        let (id, receiver) = inner.admin.register()?;
        let now = self.shared.clock.now();
        inner.core.handle_force_release(now, id, req);
        // Forwards the answer (single mode: at once) and wakes the
        // connection of a waiter the key was handed to.
        inner.dispatch(&self.shared, None);
        Some(receiver)
    }
    fn not_leader(&self) -> Option<NotLeader> {
        self.shared.lock().core.not_leader()
    }
    fn events(&self) -> Vec<EventView> {
        let inner = self.shared.lock();
        inner.core.recent_events(self.shared.clock.now())
    }
    fn members(&self) -> Vec<MemberView> {
        let inner = self.shared.lock();
        inner.core.members(self.shared.clock.now())
    }
}
