//! The node's driver surface: `impl` [`Machine`] `for` [`ClusterNode`].
//! The node has no public verb of its own; every input and output the
//! driver sees is here. A short verb's body lives here; a long one is a
//! step in the file of its concern (`accept_client`, `forget_connection`
//! in `connections.rs`, `accept_peer`, `take_dialed` in `peers.rs`,
//! `force_release`, `leader_elsewhere` in `inspect.rs`, `start_shutdown`,
//! `next_deadline` in `mod.rs`). The decisions that are the contract's own
//! (`quiesced`, what inspection on a node that does not serve it returns)
//! are made here.

use std::net::IpAddr;

use crate::auth::NONCE_LEN;
use crate::cluster::{ClusterNode, ConnId, ConnState};
use crate::events::EventView;
use crate::inspect::{
    AdminRequestId, ForceRelease, ListingCursor, LockListing, LockView, MemberView, NotLeader,
};
use crate::machine::{Machine, Output};

use super::connections::{ConnKind, carries_raft, note_output};
use crate::conn::admission::ClientAdmission;
use crate::raft::NodeId;
use crate::time::Instant;
use crate::wire::Key;

impl Machine for ClusterNode {
    fn handle_connect(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.accept_client(now, nonce, source)
    }

    fn handle_peer_accept(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.accept_peer(now, nonce, source)
    }

    /// Bytes received on `conn` (client or peer).
    fn handle_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        let Some(conn) = self.conns.by_id.get(&conn_id) else {
            self.catch_up(now);
            return;
        };
        let client = matches!(conn.kind, ConnKind::Client(_));
        if client {
            self.defer_routing(now);
        } else {
            self.stop_holding();
        }
        self.catch_up(now);
        let Some(conn) = self.conns.by_id.get(&conn_id) else {
            return;
        };
        if conn.out.is_closing() {
            return;
        }
        if client {
            self.client_input(now, conn_id, bytes);
        } else {
            self.peer_input(now, conn_id, bytes);
        }
        self.pump(now);
    }

    /// The next `bytes` of what [`Machine::poll_transmit`] gave for
    /// `conn` were handed to the transport (a short write reports its part).
    /// A grant whose reply frame is written whole counts as delivered: the
    /// client may have its token, so it is never released as a ghost.
    fn handle_written(&mut self, now: Instant, conn_id: ConnId, bytes: usize) {
        if let Some(conn) = self.conns.by_id.get_mut(&conn_id) {
            conn.out.handle_written(bytes);
            note_output(now, conn);
        }
    }

    /// Everything taken from `conn` so far has been written: grants in it
    /// count as delivered.
    fn handle_flushed(&mut self, now: Instant, conn_id: ConnId) {
        if let Some(conn) = self.conns.by_id.get_mut(&conn_id) {
            conn.out.handle_flushed();
            note_output(now, conn);
        }
    }

    fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        self.forget_connection(now, conn);
    }

    /// Processes every deadline at or before `now`.
    fn handle_timeout(&mut self, now: Instant) {
        self.stop_holding();
        self.catch_up(now);
    }

    /// A dialed
    /// connection is always taken.
    fn handle_dialed(&mut self, now: Instant, slot: u8, nonce: [u8; NONCE_LEN]) -> Option<ConnId> {
        Some(self.take_dialed(now, slot, nonce))
    }

    /// The dial of `slot` failed: retry after a backoff.
    fn handle_dial_failed(&mut self, now: Instant, slot: u8) {
        self.back_off(now, slot);
    }

    /// `value` is durable; queue heads held back by the reserve are served.
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        if self.reserve.handle_persisted(value) {
            if let Some(leadership) = self.leadership.as_mut() {
                let stalled = std::mem::take(&mut leadership.reserve_stalled);
                leadership.dirty.extend(stalled);
            }
            self.pump(now);
        }
    }

    /// The write asked for by [`Output::Reserve`] failed; it is
    /// asked for again later ([`Machine::poll_timeout`] says when).
    fn handle_reserve_failed(&mut self, now: Instant) {
        self.reserve.handle_persist_failed(now);
    }

    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.force_release(now, id, req);
    }

    fn begin_shutdown(&mut self, now: Instant) {
        self.start_shutdown(now);
    }

    /// The next output, in this order: answers to force-releases, the
    /// reserve write, dials, token alerts, connections to serve (peer links
    /// among them), node events, reports to log.
    fn poll_output(&mut self, now: Instant) -> Option<Output> {
        if let Some((id, outcome)) = self.admin_replies.pop_front() {
            return Some(Output::AdminReply { id, outcome });
        }
        // Also what an Append dropped for want of reserve needs.
        let bound = self.next_grant_token_bound().max(self.log_bound_wanted);
        if let Some(value) = self.reserve.poll_persist(now, bound) {
            return Some(Output::Reserve { value });
        }
        if let Some(slot) = self.next_dial(now) {
            return Some(Output::Dial { slot });
        }
        if let Some(alert) = self.reserve.poll_alert() {
            return Some(Output::Alert(alert));
        }
        if let Some(conn) = self.next_wake() {
            return Some(Output::Wake(conn));
        }
        if let Some(event) = self.events.poll() {
            return Some(Output::Node(event));
        }
        self.reports.poll().map(Output::Log)
    }

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection. The take of a peer link first routes Raft's
    /// held messages (to every link).
    fn poll_transmit(&mut self, conn_id: ConnId, out: &mut Vec<u8>) -> ConnState {
        self.route_if_deferred(conn_id);
        self.conns
            .by_id
            .get_mut(&conn_id)
            .map_or(ConnState::Gone, |conn| conn.out.take(out))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_deadline()
    }

    /// False while `conn` has too many bytes waiting to be written: the
    /// driver should stop reading from it until it has written them.
    fn wants_input(&self, conn_id: ConnId) -> bool {
        let bytes_max = self.config.outbound_bytes_per_connection_max;
        self.conns
            .by_id
            .get(&conn_id)
            .is_some_and(|conn| match &conn.kind {
                ConnKind::Client(client) => {
                    ClientAdmission::wants_input(&client.front, &conn.out, bytes_max)
                }
                ConnKind::Peer(_) => conn.out.wants_input(bytes_max),
            })
    }

    /// True once [`ClusterNode::begin_shutdown`] was called.
    fn is_shutting_down(&self) -> bool {
        self.shutting_down
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
    fn inspect_locks(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
        cursor: ListingCursor,
    ) -> LockListing {
        self.locks(now, prefix, limit, cursor)
            .unwrap_or_else(|_| LockListing::empty())
    }

    fn not_leader(&self) -> Option<NotLeader> {
        self.leader_elsewhere()
    }

    /// This node's recent events: the leader changes it saw, the
    /// force-releases it applied, and (as leader) the expiries it applied
    /// with a waiter queued; refusals counted per reason per interval.
    fn recent_events(&self, now: Instant) -> Vec<EventView> {
        self.reports.recent_events(now)
    }

    fn members(&self, now: Instant) -> Vec<MemberView> {
        self.member_views(now)
    }
}

/// The queues [`Machine::poll_output`] drains.
impl ClusterNode {
    /// A connection with bytes to send or to be closed, or a peer link
    /// whose take routes Raft's held messages.
    fn next_wake(&mut self) -> Option<ConnId> {
        let deferred = self.route_deferred_at.is_some();
        let handed = &mut self.route_handed;
        self.conns.wakes.poll(|conn_id| {
            self.conns.by_id.get_mut(&conn_id).is_some_and(|conn| {
                // While Raft's messages wait, a peer connection is woken
                // with nothing queued: its take routes them.
                let waits = deferred && carries_raft(conn);
                if waits && !handed.contains(&conn_id) {
                    handed.push(conn_id);
                }
                conn.out.leave_wake_queue() || waits
            })
        })
    }

    /// The next peer slot the driver should dial (its configured peer
    /// address). Answer with [`Machine::handle_dialed`] or
    /// [`Machine::handle_dial_failed`].
    fn next_dial(&mut self, now: Instant) -> Option<u8> {
        for slot in 0..self.config.slot_count {
            let dial = &mut self.conns.dials[usize::from(slot)];
            if slot == self.config.id.slot || dial.connected || dial.dialing {
                continue;
            }
            if dial.next_attempt <= now {
                dial.dialing = true;
                return Some(slot);
            }
        }
        None
    }
}
