//! Peer connections: the authenticated handshake, dialing each slot with
//! backoff, the frames that carry Raft messages (routed to the newest
//! established connection of a slot), keepalives on idle links, closing
//! silent ones, and the liveness a driver reports. A handshake that shows
//! a new generation of a slot makes the leader add it as a learner.

use std::net::IpAddr;

use crate::auth::NONCE_LEN;
use crate::budget::{AbuseKind, CloseReason};
use crate::cluster::events::NodeEvent;
use crate::cluster::peer::{PeerHandshake, PeerHandshakeStatus, PeerIdentity};
use crate::conn::ConnId;
use crate::machine::Machine;
use crate::raft::{ConfChange, Configuration, Message, MessageBody, NodeId};
use crate::time::Instant;

use super::ClusterNode;
use super::connections::{Conn, ConnKind, PeerConn, note_output};

/// The generation a keepalive frame is addressed to: no node has it (a
/// node's generation is 1 or its start's wall clock), so a node that does
/// not know keepalives drops the frame in Raft's addressee check.
const KEEPALIVE_GENERATION: u64 = 0;

/// How a peer slot's link looks to this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLiveness {
    /// No established connection to the slot (or it is this node's own).
    Down,
    /// An established connection received a frame within
    /// [`LIVE_HEARTBEATS`](super::LIVE_HEARTBEATS) heartbeat intervals.
    Live,
    /// Established connections exist but none received a frame recently:
    /// the link may be cut (it is closed once past
    /// [`ClusterConfig::peer_silence_timeout`](super::ClusterConfig::peer_silence_timeout)).
    Silent,
}

/// A keepalive frame: addressed to a generation no node has.
pub(super) fn is_keepalive(msg: &Message) -> bool {
    msg.to.generation == KEEPALIVE_GENERATION && msg.body == MessageBody::HeartbeatResponse
}

impl ClusterNode {
    fn new_peer_conn(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        dialed: Option<u8>,
        source: Option<IpAddr>,
    ) -> ConnId {
        let deadline = now.saturating_add(self.config.handshake_timeout);
        let local = PeerIdentity {
            fingerprint: self.config.fingerprint,
            id: self.config.id,
            slot_count: self.config.slot_count,
            token_floor: self.local_token_floor(),
        };
        let mut handshake = Box::new(PeerHandshake::new(local, nonce, dialed, deadline));
        let hello = handshake.take_outbound();
        let kind = ConnKind::Peer(PeerConn {
            handshake,
            established: None,
            dialed,
            session: None,
            last_frame_at: now,
            last_sealed_at: now,
            output_pending_since: None,
        });
        self.new_conn(kind, &hello, deadline, source)
    }

    /// Every fencing token this node knows of is below this: the larger of
    /// the configured bootstrap clock and the replicated token counter. Sent
    /// in peer hellos so that a cluster bootstrapped again starts above it.
    pub fn local_token_floor(&self) -> u64 {
        self.config
            .bootstrap_wall_clock_us
            .max(self.state.next_token())
    }

    /// The largest token floor an authenticated peer has sent.
    pub fn peer_token_floor_max(&self) -> u64 {
        self.peer_token_floor_max
    }

    /// A peer connection from `source` was accepted on the peer address.
    /// Unauthenticated ones have their own small budget, capped per source,
    /// the oldest dropped first, so idle sockets can never keep a
    /// restarted node from rejoining.
    pub(super) fn accept_peer(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.handle_timeout(now);
        // Each slot needs at most two connections (one each way); the bound
        // keeps authenticated and dialed connections from growing state.
        // Unauthenticated accepted ones are bounded by their own budget.
        if self.conns.known_peer_conns >= 4 * usize::from(self.config.slot_count) {
            self.reports.abuse(now, Some(source), AbuseKind::Refused);
            return None;
        }
        let conn_id = ConnId(self.conns.next_id);
        self.admit_peer_handshake(now, conn_id, source);
        Some(self.new_peer_conn(now, nonce, None, Some(source)))
    }

    /// The dial of `slot` succeeded: the transport is up. `nonce` must be
    /// fresh CSPRNG bytes.
    pub(super) fn take_dialed(&mut self, now: Instant, slot: u8, nonce: [u8; NONCE_LEN]) -> ConnId {
        if let Some(dial) = self.conns.dials.get_mut(usize::from(slot)) {
            dial.dialing = false;
            dial.connected = true;
        }
        self.conns.known_peer_conns += 1;
        self.new_peer_conn(now, nonce, Some(slot), None)
    }

    pub(super) fn back_off(&mut self, now: Instant, slot: u8) {
        let (min, max) = (self.config.dial_backoff_min, self.config.dial_backoff_max);
        if let Some(dial) = self.conns.dials.get_mut(usize::from(slot)) {
            dial.dialing = false;
            dial.connected = false;
            dial.next_attempt = now.saturating_add(dial.backoff);
            dial.backoff = (dial.backoff * 2).clamp(min, max);
        }
    }

    /// Bytes from a peer: its handshake while unfinished, then
    /// authenticated frames.
    pub(super) fn peer_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        let Some(rest) = self.peer_handshake_input(now, conn_id, bytes) else {
            return;
        };
        self.peer_frames_input(now, conn_id, rest);
    }

    /// Feeds `bytes` to `conn_id`'s handshake if it is unfinished; the
    /// bytes after the handshake (all of them once established), `None`
    /// when nothing more is read now (the handshake wants more, or failed).
    fn peer_handshake_input<'a>(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        bytes: &'a [u8],
    ) -> Option<&'a [u8]> {
        let Some(Conn {
            kind: ConnKind::Peer(peer),
            out,
            source,
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        else {
            return None;
        };
        if peer.established.is_some() {
            return Some(bytes);
        }
        let source = *source;
        let (used, status) = peer.handshake.handle_input(&self.config.peer_tokens, bytes);
        out.buffer_mut()
            .extend_from_slice(&peer.handshake.take_outbound());
        match status {
            PeerHandshakeStatus::NeedMore => {
                if let Some(conn) = self.conns.by_id.get_mut(&conn_id) {
                    self.conns.wakes.wake(conn_id, &mut conn.out);
                }
                None
            }
            PeerHandshakeStatus::Rejected(_) => {
                self.reports
                    .abuse(now, source, AbuseKind::FailedPeerHandshake);
                self.close_conn(conn_id, CloseReason::PeerHandshakeFailed);
                None
            }
            PeerHandshakeStatus::Established(remote) => {
                self.peer_established(now, conn_id, remote);
                Some(&bytes[used..])
            }
        }
    }

    /// `conn_id`'s handshake authenticated `remote`: frames are sealed and
    /// verified with the session keys from now on, its slot counts as
    /// connected with the backoff reset, and a leader may add `remote` as
    /// a learner.
    fn peer_established(&mut self, now: Instant, conn_id: ConnId, remote: NodeId) {
        self.conns.peer_handshakes.finish(conn_id);
        let Some(Conn {
            kind: ConnKind::Peer(peer),
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        else {
            return;
        };
        if peer.dialed.is_none() {
            self.conns.known_peer_conns += 1;
        }
        peer.established = Some(remote);
        peer.session = peer.handshake.take_session().map(Box::new);
        peer.last_frame_at = now;
        peer.last_sealed_at = now;
        // Its deadlines may come before those of the links already watched.
        self.peer_scan_at = now;
        // The handshake refused floors at or above 2^63.
        if let Some(hello) = peer.handshake.peer_hello() {
            self.peer_token_floor_max = self.peer_token_floor_max.max(hello.token_floor);
            if hello.from.generation == self.config.id.generation {
                self.floor_slots_heard.insert(hello.from.slot);
            }
        }
        if let Some(conn) = self.conns.by_id.get_mut(&conn_id) {
            self.conns.wakes.wake(conn_id, &mut conn.out);
        }
        if let Some(dial) = self.conns.dials.get_mut(usize::from(remote.slot)) {
            dial.connected = true;
            dial.backoff = self.config.dial_backoff_min;
        }
        self.maybe_add_learner(now, remote);
    }

    /// Decodes the frames in `bytes` from established `conn_id` and steps
    /// the messages its authenticated peer sent; a frame that fails to
    /// verify or decode closes the connection (counted and reported).
    fn peer_frames_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        let Some(Conn {
            kind: ConnKind::Peer(peer),
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        else {
            return;
        };
        let (Some(remote), Some(session)) = (peer.established, peer.session.as_mut()) else {
            return;
        };
        let decoder = &mut session.decoder;
        decoder.push(bytes);
        let mut messages = Vec::new();
        let mut failed = None;
        loop {
            // Each frame's tag is verified before its payload is decoded; a
            // bad one (forged, replayed, corrupted) closes the connection.
            match decoder.next() {
                Ok(Some(msg)) => messages.push(msg),
                Ok(None) => break,
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        if !messages.is_empty() {
            peer.last_frame_at = now;
        }
        for msg in messages {
            // Only the authenticated identity may speak on this connection;
            // a keepalive has done its job by arriving.
            if msg.from == remote && !is_keepalive(&msg) {
                self.step_peer_message(now, msg);
            }
        }
        if let Some(error) = failed {
            self.refused_peer_frames += 1;
            self.last_refused_peer_frame = Some((remote.slot, error));
            self.events.push(NodeEvent::PeerFramesRefused {
                slot: remote.slot,
                error,
                refused: self.refused_peer_frames,
            });
            self.close_conn(conn_id, CloseReason::BadFrame);
        }
    }

    /// On the leader: a handshake showed a generation of a slot that the
    /// configuration does not know and that is newer than its members →
    /// add it as a learner (Raft's auto-membership replaces the old one).
    pub(super) fn maybe_add_learner(&mut self, now: Instant, remote: NodeId) {
        if !self.raft.is_leader() || self.raft.conf_change_pending() {
            return;
        }
        if is_known_member(self.raft.config(), remote) {
            return;
        }
        // Refusals (a change in flight, the term's first commit not yet
        // made) are retried on the next handshake or timer tick.
        let _ = self
            .raft
            .propose_conf_change(now, ConfChange::AddLearner(remote));
    }

    /// On the leader: every established peer whose generation the
    /// configuration does not know yet is offered as a learner (retried on
    /// every timer tick, since a proposal may be refused for now).
    pub(super) fn add_established_learners(&mut self, now: Instant) {
        if !self.raft.is_leader() {
            return;
        }
        if self.raft.conf_change_pending() {
            return;
        }
        let leader = self.raft.id();
        let config = self.raft.config();
        // Runs on every input: only the peers `maybe_add_learner` would
        // propose are collected (none, almost always: no allocation).
        let members: Vec<NodeId> = self
            .conns
            .by_id
            .values()
            .filter_map(|c| match &c.kind {
                ConnKind::Peer(p) => p.established,
                ConnKind::Client(_) => None,
            })
            .filter(|id| *id != leader && !is_known_member(config, *id))
            .collect();
        for id in members {
            self.maybe_add_learner(now, id);
        }
    }

    pub(super) fn route_messages(&mut self, now: Instant) {
        self.route_messages_waking(now, &[]);
    }

    /// [`Self::route_messages`], waking no connection in `handed`: the
    /// driver already has their wakes and takes them anyway.
    pub(super) fn route_messages_waking(&mut self, now: Instant, handed: &[ConnId]) {
        while let Some((to, msg)) = self.raft.poll_message() {
            // The newest established connection to the slot carries it; a
            // message without one is dropped (Raft retries).
            let target = self
                .conns.by_id
                .iter_mut()
                .filter(|(_, c)| {
                    !c.out.is_closing()
                        && matches!(&c.kind, ConnKind::Peer(p) if p.established.map(|id| id.slot) == Some(to.slot))
                })
                .max_by_key(|(id, _)| **id);
            let Some((conn_id, conn)) = target else {
                continue;
            };
            // A peer that does not keep up loses messages rather than
            // growing the buffer without bound; Raft retries them.
            if conn.out.pending().len() >= self.config.outbound_bytes_per_connection_max {
                continue;
            }
            let ConnKind::Peer(PeerConn {
                session: Some(session),
                last_sealed_at,
                ..
            }) = &mut conn.kind
            else {
                continue;
            };
            if session.sealer.seal(&msg, conn.out.buffer_mut()).is_ok() {
                *last_sealed_at = now;
                if !handed.contains(conn_id) {
                    self.conns.wakes.wake(*conn_id, &mut conn.out);
                }
                note_output(now, conn);
            }
        }
    }

    /// Queues a keepalive on every established peer connection on which
    /// nothing was queued for [`KEEPALIVE_HEARTBEATS`](super::KEEPALIVE_HEARTBEATS) heartbeat intervals.
    pub(super) fn send_keepalives(&mut self, now: Instant) {
        let interval = self.config.keepalive_interval();
        let from = self.config.id;
        for (conn_id, conn) in &mut self.conns.by_id {
            if conn.out.is_closing() {
                continue;
            }
            let ConnKind::Peer(PeerConn {
                established: Some(remote),
                session: Some(session),
                last_sealed_at,
                ..
            }) = &mut conn.kind
            else {
                continue;
            };
            if now < last_sealed_at.saturating_add(interval) {
                continue;
            }
            let keepalive = Message {
                from,
                to: NodeId::new(remote.slot, KEEPALIVE_GENERATION),
                term: 0,
                body: MessageBody::HeartbeatResponse,
            };
            if session
                .sealer
                .seal(&keepalive, conn.out.buffer_mut())
                .is_ok()
            {
                *last_sealed_at = now;
                self.conns.wakes.wake(*conn_id, &mut conn.out);
                note_output(now, conn);
            }
        }
    }

    /// Closes established peer connections silent past the bound and lets
    /// their slots be redialed at once.
    pub(super) fn close_silent_peers(&mut self, now: Instant) {
        let bound = self.config.peer_silence_timeout;
        let silent: Vec<(ConnId, u8)> = self
            .conns
            .by_id
            .iter()
            .filter(|(_, c)| !c.out.is_closing())
            .filter_map(|(id, c)| match &c.kind {
                ConnKind::Peer(p) => {
                    let remote = p.established?;
                    let quiet = now >= p.last_frame_at.saturating_add(bound);
                    let stuck = p
                        .output_pending_since
                        .is_some_and(|since| now >= since.saturating_add(bound));
                    (quiet || stuck).then_some((*id, remote.slot))
                }
                ConnKind::Client(_) => None,
            })
            .collect();
        for (conn_id, slot) in silent {
            if let Some(conn) = self.conns.by_id.get_mut(&conn_id) {
                // Nobody will read these; Raft resends what matters.
                conn.out.discard_pending();
            }
            self.close_conn(conn_id, CloseReason::PeerSilent);
            // The transport may take long to report the close (a stuck
            // write); the slot is dialed again without waiting for it.
            if !self.conns.slot_connected(slot)
                && let Some(dial) = self.conns.dials.get_mut(usize::from(slot))
            {
                dial.connected = false;
            }
        }
    }

    /// Whether `slot`'s link is established and heard from recently.
    pub fn peer_liveness(&self, now: Instant, slot: u8) -> PeerLiveness {
        let window = self.config.live_window();
        let mut liveness = PeerLiveness::Down;
        for conn in self.conns.by_id.values() {
            let ConnKind::Peer(peer) = &conn.kind else {
                continue;
            };
            if conn.out.is_closing() || peer.established.map(|id| id.slot) != Some(slot) {
                continue;
            }
            if now < peer.last_frame_at.saturating_add(window) {
                return PeerLiveness::Live;
            }
            liveness = PeerLiveness::Silent;
        }
        liveness
    }

    /// Peer slots with a [`PeerLiveness::Live`] link.
    pub fn live_peers(&self, now: Instant) -> usize {
        (0..self.config.slot_count)
            .filter(|slot| *slot != self.config.id.slot)
            .filter(|slot| self.peer_liveness(now, *slot) == PeerLiveness::Live)
            .count()
    }
}

/// Whether `remote` is in `config`, or its slot has a member of the same
/// or a newer generation there (no learner to add).
fn is_known_member(config: &Configuration, remote: NodeId) -> bool {
    config.contains(remote)
        || config
            .members()
            .any(|m| m.slot == remote.slot && m.generation >= remote.generation)
}
