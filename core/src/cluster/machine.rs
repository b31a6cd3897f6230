//! A cluster node under the driver contract ([`Machine`]). Each verb is
//! the node's public method of that meaning (see [`ClusterNode`] for what
//! it does); the decisions that are the contract's own (`quiesced`, what
//! inspection on a node that does not serve it returns) are made here.

use std::net::IpAddr;

use crate::auth::NONCE_LEN;
use crate::budget::LogEvent;
use crate::cluster::{ClusterNode, ConnId, ConnState, NodeEvent};
use crate::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, LockListing, LockView, NotLeader,
};
use crate::machine::Machine;
use crate::raft::NodeId;
use crate::reserve::TokenAlert;
use crate::time::Instant;
use crate::wire::Key;

impl Machine for ClusterNode {
    fn handle_connect(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        ClusterNode::handle_connect(self, now, nonce, source)
    }

    fn handle_peer_accept(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        ClusterNode::handle_peer_accept(self, now, nonce, source)
    }

    fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]) {
        ClusterNode::handle_input(self, now, conn, bytes);
    }

    fn handle_written(&mut self, now: Instant, conn: ConnId, bytes: usize) {
        ClusterNode::handle_written(self, now, conn, bytes);
    }

    fn handle_flushed(&mut self, now: Instant, conn: ConnId) {
        ClusterNode::handle_flushed(self, now, conn);
    }

    fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        ClusterNode::handle_closed(self, now, conn);
    }

    fn handle_timeout(&mut self, now: Instant) {
        ClusterNode::handle_timeout(self, now);
    }

    /// The node's [`ClusterNode::handle_peer_connected`]: a dialed
    /// connection is always taken.
    fn handle_dialed(&mut self, now: Instant, slot: u8, nonce: [u8; NONCE_LEN]) -> Option<ConnId> {
        Some(self.handle_peer_connected(now, slot, nonce))
    }

    fn handle_dial_failed(&mut self, now: Instant, slot: u8) {
        ClusterNode::handle_dial_failed(self, now, slot);
    }

    fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        ClusterNode::handle_reserve_persisted(self, now, value);
    }

    fn handle_reserve_failed(&mut self, now: Instant) {
        ClusterNode::handle_reserve_failed(self, now);
    }

    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        ClusterNode::handle_force_release(self, now, id, req);
    }

    fn begin_shutdown(&mut self, now: Instant) {
        ClusterNode::begin_shutdown(self, now);
    }

    fn poll_wake(&mut self) -> Option<ConnId> {
        ClusterNode::poll_wake(self)
    }

    /// The node's [`ClusterNode::take_transmit`].
    fn poll_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState {
        self.take_transmit(conn, out)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        ClusterNode::poll_timeout(self)
    }

    fn poll_dial(&mut self, now: Instant) -> Option<u8> {
        ClusterNode::poll_dial(self, now)
    }

    fn poll_reserve(&mut self, now: Instant) -> Option<u64> {
        ClusterNode::poll_reserve(self, now)
    }

    fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        ClusterNode::poll_admin_reply(self)
    }

    fn poll_log(&mut self) -> Option<LogEvent> {
        ClusterNode::poll_log(self)
    }

    fn poll_alert(&mut self) -> Option<TokenAlert> {
        ClusterNode::poll_alert(self)
    }

    /// The node's [`ClusterNode::poll_event`].
    fn poll_node_event(&mut self) -> Option<NodeEvent> {
        self.poll_event()
    }

    fn wants_input(&self, conn: ConnId) -> bool {
        ClusterNode::wants_input(self, conn)
    }

    fn is_shutting_down(&self) -> bool {
        ClusterNode::is_shutting_down(self)
    }

    /// Clients answered and closed, leadership handed over: the peer
    /// connections left may be dropped.
    fn quiesced(&self) -> bool {
        self.stats().clients == 0 && !self.is_leader()
    }

    fn node_id(&self) -> Option<NodeId> {
        Some(self.id())
    }

    /// The node's [`ClusterNode::lock`]; a node that does not serve
    /// inspection ([`Machine::not_leader`], which the admin layer asks
    /// first) sees nothing.
    fn inspect_lock(&self, now: Instant, key: &Key) -> Option<LockView> {
        self.lock(now, key).ok().flatten()
    }

    /// The node's [`ClusterNode::locks`]; empty on a node that does not
    /// serve inspection.
    fn inspect_locks(&self, now: Instant, prefix: &[u8], limit: usize) -> LockListing {
        self.locks(now, prefix, limit).unwrap_or(LockListing {
            locks: Vec::new(),
            truncated: false,
        })
    }

    fn not_leader(&self) -> Option<NotLeader> {
        ClusterNode::not_leader(self)
    }
}
