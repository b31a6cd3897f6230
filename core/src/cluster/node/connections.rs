//! The connections a node owns, client and peer alike: one [`Connections`]
//! value (the map, id and wake bookkeeping, handshake deadlines and
//! budgets, session counts, per-slot dialing state), so that a node that
//! rejoins as a new generation carries it over whole.
//!
//! Here too: accepting a client, decoding its input into requests,
//! answering them, closing a connection (its queued waiters leave with it,
//! its undelivered grants are released), leader notices, and the driver's
//! wake/transmit contract. Peer-specific work is in `peers`.

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasherDefault;
use std::net::IpAddr;

use crate::auth::{Hello, NONCE_LEN, WireMode};
use crate::budget::{AbuseKind, CloseReason, HandshakeBudget};
use crate::cluster::command::{ApplyResult, Command};
use crate::cluster::peer::{PeerHandshake, PeerSession};
use crate::conn::admission::{Accept, ClientAdmission, Handshake};
use crate::conn::client::{Answer, ClientFront, Delivery, FrontTimeout, ReplyTo};
use crate::conn::{ConnId, Dialect, HandshakeDeadlines, Outbound, WakeQueue};
use crate::hash::IdHasher;
use crate::machine::Machine;
use crate::raft::NodeId;
use crate::time::{Duration, Instant};
use crate::wire::{Capabilities, LeaderLabel, NO_LEADER_SLOT};

use super::{ClusterConfig, ClusterNode};

/// A client connection's own state.
#[derive(Debug)]
pub(super) struct ClientConn {
    /// Handshake, dialect and session decoding.
    pub(super) front: ClientFront,
    /// Requests awaiting a reply.
    pub(super) in_flight: usize,
    /// Sequence numbers of its queued waiters (unordered: closing sorts
    /// them, so its waiters leave in arrival order).
    pub(super) queued: HashSet<u64, BuildHasherDefault<IdHasher>>,
    /// Releases answered `N` since the last one that released.
    pub(super) release_misses_in_row: u32,
}

/// A peer connection's own state: its handshake, then its session.
#[derive(Debug)]
pub(super) struct PeerConn {
    // Boxed: the handshake and the keyed MAC states are large next to a
    // client connection.
    pub(super) handshake: Box<PeerHandshake>,
    /// The peer's authenticated identity, once the handshake completed.
    pub(super) established: Option<NodeId>,
    /// The slot this node dialed (outbound connections).
    pub(super) dialed: Option<u8>,
    /// Frame keys, once established: every frame is sealed and verified.
    pub(super) session: Option<Box<PeerSession>>,
    /// When the last authenticated frame arrived (the establishment at
    /// first).
    pub(super) last_frame_at: Instant,
    /// When a frame was last queued on it (keepalives go out when idle).
    pub(super) last_sealed_at: Instant,
    /// Since when output has waited to be taken or written (`None`:
    /// everything queued was reported written).
    pub(super) output_pending_since: Option<Instant>,
}

/// What a connection is.
#[derive(Debug)]
pub(super) enum ConnKind {
    Client(ClientConn),
    Peer(PeerConn),
}

/// One connection as the node sees it.
#[derive(Debug)]
pub(super) struct Conn {
    /// Client or peer, with that kind's state.
    pub(super) kind: ConnKind,
    /// Bytes for the driver (replies or Raft messages), and which grants
    /// they carry (client connections only).
    pub(super) out: Outbound,
    /// Where an accepted connection comes from (`None`: dialed by us).
    pub(super) source: Option<IpAddr>,
    /// Why the node closes it, once it decided to.
    pub(super) close_reason: Option<CloseReason>,
}

/// Per-slot dialing state.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct DialState {
    /// A connection (dialing, handshaking or established) exists.
    pub(super) connected: bool,
    /// The driver was asked to dial and has not answered yet.
    pub(super) dialing: bool,
    /// Not before this instant.
    pub(super) next_attempt: Instant,
    /// The wait after the next failure (doubles up to the maximum).
    pub(super) backoff: Duration,
}

/// Every connection of a node, client and peer, with what counts and
/// schedules them. A node that rejoins as a new generation keeps all of it.
#[derive(Debug)]
pub(super) struct Connections {
    /// Ordered so that every iteration (leader notices, shutdown) is
    /// deterministic: a simulator run must be a pure function of its seed.
    pub(super) by_id: BTreeMap<ConnId, Conn>,
    /// The id of the next connection (ids are never reused).
    pub(super) next_id: u64,
    /// Connections with work for the driver.
    pub(super) wakes: WakeQueue,
    /// When each unfinished handshake times out.
    pub(super) handshake_deadlines: HandshakeDeadlines,
    /// Admission of client connections: sessions, unfinished handshakes.
    pub(super) clients: ClientAdmission,
    /// Unfinished accepted peer handshakes and their sources.
    pub(super) peer_handshakes: HandshakeBudget,
    /// Peer connections that this node dialed or that authenticated.
    pub(super) known_peer_conns: usize,
    /// Per-slot dialing state, indexed by slot.
    pub(super) dials: Vec<DialState>,
}

impl Connections {
    /// No connections; every slot may be dialed at `now`.
    pub(super) fn new(config: &ClusterConfig, now: Instant) -> Self {
        let dials = (0..config.slot_count)
            .map(|_| DialState {
                next_attempt: now,
                backoff: config.dial_backoff_min,
                ..DialState::default()
            })
            .collect();
        Connections {
            by_id: BTreeMap::new(),
            next_id: 1,
            wakes: WakeQueue::default(),
            handshake_deadlines: HandshakeDeadlines::default(),
            clients: ClientAdmission::new(
                config.connections_max,
                config.budget.handshakes_max,
                config.budget.handshakes_per_source_max,
                config.handshake_timeout,
            ),
            peer_handshakes: HandshakeBudget::new(
                config.budget.peer_handshakes_max,
                config.budget.peer_handshakes_per_source_max,
            ),
            known_peer_conns: 0,
            dials,
        }
    }

    /// Whether a peer connection to `slot` (dialed, handshaking or
    /// established) exists that the node has not decided to close. One
    /// being closed does not count: its transport may take long to report
    /// the close (a write stuck on a silent link), and the slot must be
    /// dialed again meanwhile, or the two nodes stay apart for good.
    pub(super) fn slot_connected(&self, slot: u8) -> bool {
        self.by_id.values().any(|c| {
            !c.out.is_closing()
                && matches!(&c.kind, ConnKind::Peer(p)
                    if p.established.map(|id| id.slot).or(p.dialed) == Some(slot))
        })
    }

    /// Whether some connection could carry a Raft message now.
    pub(super) fn has_established_peer(&self) -> bool {
        self.by_id.values().any(carries_raft)
    }

    /// Wakes every connection that could carry a Raft message, whether or
    /// not anything is queued on it (the messages wait for its take).
    pub(super) fn wake_established_peers(&mut self) {
        for (conn_id, conn) in &mut self.by_id {
            if carries_raft(conn) {
                self.wakes.wake(*conn_id, &mut conn.out);
            }
        }
    }
}

/// An established peer connection not being closed: one that
/// `route_messages` may pick.
pub(super) fn carries_raft(conn: &Conn) -> bool {
    !conn.out.is_closing()
        && matches!(&conn.kind, ConnKind::Peer(p) if p.established.is_some() && p.session.is_some())
}

/// Records since when `conn`'s output has been waiting (peer connections).
pub(super) fn note_output(now: Instant, conn: &mut Conn) {
    let drained = conn.out.is_drained();
    if let ConnKind::Peer(peer) = &mut conn.kind {
        if drained {
            peer.output_pending_since = None;
        } else if peer.output_pending_since.is_none() {
            peer.output_pending_since = Some(now);
        }
    }
}

impl ClusterNode {
    pub(super) fn new_conn(
        &mut self,
        kind: ConnKind,
        hello: &[u8],
        deadline: Instant,
        source: Option<IpAddr>,
    ) -> ConnId {
        let conn_id = ConnId(self.conns.next_id);
        self.conns.next_id += 1;
        let mut conn = Conn {
            kind,
            out: Outbound::new(hello.to_vec()),
            source,
            close_reason: None,
        };
        self.conns.wakes.wake(conn_id, &mut conn.out);
        self.conns.by_id.insert(conn_id, conn);
        self.conns.handshake_deadlines.push(deadline, conn_id);
        conn_id
    }

    /// Counts a new peer connection from `source` in the peers' handshake
    /// budget, closing the unfinished handshake it displaces.
    pub(super) fn admit_peer_handshake(&mut self, now: Instant, conn_id: ConnId, source: IpAddr) {
        let evicted = self.conns.peer_handshakes.admit(conn_id, source);
        self.close_evicted(now, evicted);
    }

    /// Closes the unfinished handshake a new connection displaced.
    fn close_evicted(&mut self, now: Instant, evicted: Option<ConnId>) {
        if let Some(evicted) = evicted {
            let old_source = self.conns.by_id.get(&evicted).and_then(|c| c.source);
            self.reports
                .abuse(now, old_source, AbuseKind::HandshakeEvicted);
            self.close_conn(evicted, CloseReason::HandshakeEvicted);
        }
    }

    /// A client connection from `source` was accepted. `nonce` must be
    /// fresh CSPRNG bytes. `None`: refuse it (every session slot taken or
    /// shutting down). Otherwise it joins the client handshake budget,
    /// which may drop an older unfinished handshake (never this one).
    pub(super) fn accept_client(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.handle_timeout(now);
        let conn_id = ConnId(self.conns.next_id);
        let evicted = match self
            .conns
            .clients
            .accept(self.shutting_down, conn_id, source)
        {
            Accept::Refused => {
                self.reports.abuse(now, Some(source), AbuseKind::Refused);
                return None;
            }
            Accept::Admitted { evicted } => evicted,
        };
        self.close_evicted(now, evicted);
        let hello = Hello {
            mode: WireMode::Cluster,
            self_slot: self.config.id.slot,
            nonce,
        };
        // Every extension: a permit grant is a committed Grant of slot
        // keys that carries its semaphore's capacity (`permits`), a shared
        // grant and a downgrade are committed commands like any grant
        // (`shared`), and OBSERVE reads the label each Grant carries.
        let served = Capabilities::EXTEND
            .union(Capabilities::PUSH)
            .union(Capabilities::PERMITS)
            .union(Capabilities::OBSERVE)
            .union(Capabilities::SHARED);
        let (front, deadline) =
            self.conns
                .clients
                .front(now, hello, self.config.fingerprint, served);
        let hello_bytes = front.hello_bytes();
        let kind = ConnKind::Client(ClientConn {
            front,
            in_flight: 0,
            queued: HashSet::default(),
            release_misses_in_row: 0,
        });
        Some(self.new_conn(kind, &hello_bytes, deadline, Some(source)))
    }

    /// The label client connection `conn_id` negotiated, as a Grant for it
    /// carries it: an election's leader is named by it on every node.
    /// An empty label is none (one encoding per value).
    pub(super) fn holder_label(&self, conn_id: ConnId) -> Option<LeaderLabel> {
        match self.conns.by_id.get(&conn_id) {
            Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) => client
                .front
                .label()
                .and_then(LeaderLabel::new)
                .filter(|label| !label.is_empty()),
            _ => None,
        }
    }

    /// Bytes from a client: its handshake while unfinished, then the
    /// requests they complete.
    pub(super) fn client_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        if self.client_handshake_input(now, conn_id, bytes) {
            self.client_requests(now, conn_id);
        }
    }

    /// Feeds `bytes` to `conn_id`'s front end; a handshake accepted now
    /// starts a session (within the session limit) and gets the leader
    /// notice. True when the connection is in session and its requests
    /// should be read.
    fn client_handshake_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) -> bool {
        let leader_slot = self.announced_leader;
        let Some(conn) = self.conns.by_id.get_mut(&conn_id) else {
            return false;
        };
        let ConnKind::Client(client) = &mut conn.kind else {
            return false;
        };
        let step = self.conns.clients.handshake_input(
            now,
            conn_id,
            &mut client.front,
            &self.config.client_tokens,
            bytes,
            conn.out.buffer_mut(),
        );
        match step {
            Handshake::Pending => return false,
            Handshake::Session => {}
            Handshake::Started(_) => {
                // Clients route by the leader notice; send it at once.
                client.front.leader_notice(
                    leader_slot,
                    &self.config.client_addresses,
                    conn.out.buffer_mut(),
                );
                self.conns.wakes.wake(conn_id, &mut conn.out);
            }
            Handshake::SessionLimit => {
                self.reports.abuse(now, conn.source, AbuseKind::Refused);
                self.close_conn(conn_id, CloseReason::SessionLimit);
                return false;
            }
            Handshake::Rejected { answer_at } => {
                self.reports.abuse(now, conn.source, AbuseKind::FailedProof);
                match answer_at {
                    // The line dialect answers a failed handshake late.
                    Some(at) => self.conns.handshake_deadlines.push(at, conn_id),
                    None => self.close_conn(conn_id, CloseReason::ProofRejected),
                }
                return false;
            }
        }
        true
    }

    /// Serves the complete requests buffered on `conn_id` in order; stops
    /// once the connection is closing (a request may close it).
    fn client_requests(&mut self, now: Instant, conn_id: ConnId) {
        loop {
            // A request may have closed the connection: read no further.
            let Some(conn) = self
                .conns
                .by_id
                .get_mut(&conn_id)
                .filter(|c| !c.out.is_closing())
            else {
                return;
            };
            let ConnKind::Client(client) = &mut conn.kind else {
                return;
            };
            let next = client
                .front
                .next_request(conn.out.buffer_mut(), &mut self.replies);
            if !conn.out.pending().is_empty() {
                self.conns.wakes.wake(conn_id, &mut conn.out);
            }
            match next {
                Ok(None) => break,
                Ok(Some(request)) => {
                    client.in_flight += 1;
                    self.handle_request(now, conn_id, request);
                }
                Err(reason) => {
                    self.close_conn(conn_id, reason);
                    break;
                }
            }
        }
    }

    /// Sends the terminal reply of a request (one of its in-flight ones).
    /// An answer the connection's dialect cannot tell (an unknown outcome
    /// on a line connection) closes the connection instead: its client
    /// resends on a new one.
    pub(super) fn answer(&mut self, conn_id: ConnId, to: &ReplyTo, answer: Answer) {
        let Some(Conn {
            kind: ConnKind::Client(client),
            out,
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        else {
            return;
        };
        client.in_flight = client.in_flight.saturating_sub(1);
        if out.is_closing() {
            return;
        }
        self.replies.count(&to.counted_as(answer));
        match to.encode(answer, &self.config.client_addresses, out.buffer_mut()) {
            Delivery::Queued => self.conns.wakes.wake(conn_id, out),
            Delivery::Close => self.close_conn(conn_id, CloseReason::OutcomeUnknown),
        }
    }

    /// The node gives up on `conn`: nothing more is read, what is queued
    /// is flushed, then the driver closes it.
    pub(super) fn close_conn(&mut self, conn_id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.by_id.get_mut(&conn_id) else {
            return;
        };
        conn.close_reason.get_or_insert(reason);
        match conn.kind {
            ConnKind::Client(_) => self.conns.clients.closing(conn_id),
            ConnKind::Peer(_) => self.conns.peer_handshakes.finish(conn_id),
        }
        self.conns.wakes.close_after_flush(conn_id, &mut conn.out);
        let queued: Vec<u64> = match &mut conn.kind {
            ConnKind::Client(client) => {
                let mut queued: Vec<u64> = std::mem::take(&mut client.queued).into_iter().collect();
                queued.sort_unstable();
                queued
            }
            ConnKind::Peer(_) => Vec::new(),
        };
        // Queued waiters leave their queues now; nobody will read a grant.
        for seq in queued {
            if self.remove_waiter(seq).is_none() {
                self.remove_permit_waiter(seq);
            }
        }
    }

    /// Handshakes (client and peer) whose deadline passed by `now` are
    /// closed, and a line client's late refusal goes out.
    pub(super) fn time_out_handshakes(&mut self, now: Instant) {
        while let Some(conn_id) = self.conns.handshake_deadlines.pop_due(now) {
            let Some(conn) = self.conns.by_id.get_mut(&conn_id) else {
                continue;
            };
            let timed_out = match &mut conn.kind {
                ConnKind::Client(client) => {
                    match client.front.handle_timeout(now, conn.out.buffer_mut()) {
                        FrontTimeout::Nothing => false,
                        FrontTimeout::HandshakeTimedOut => true,
                        FrontTimeout::AuthFailedSent => {
                            self.close_conn(conn_id, CloseReason::ProofRejected);
                            false
                        }
                    }
                }
                ConnKind::Peer(peer) if peer.established.is_none() => {
                    peer.handshake.handle_timeout(now)
                }
                ConnKind::Peer(_) => false,
            };
            if timed_out {
                let source = self.conns.by_id.get(&conn_id).and_then(|c| c.source);
                self.reports
                    .abuse(now, source, AbuseKind::HandshakeTimedOut);
                self.close_conn(conn_id, CloseReason::HandshakeTimedOut);
            }
        }
    }

    /// The transport of `conn` is gone. A client's queued waiters are
    /// dropped and grants not yet flushed to it are released at once
    /// (proposed as `Release` — only possible while this node leads; a
    /// former leader leaves them to lease expiry). A peer slot is redialed
    /// after a backoff.
    pub(super) fn forget_connection(&mut self, now: Instant, conn_id: ConnId) {
        self.handle_timeout(now);
        self.close_conn(conn_id, CloseReason::TransportClosed);
        let Some(conn) = self.conns.by_id.remove(&conn_id) else {
            return;
        };
        let reason = conn.close_reason.unwrap_or(CloseReason::TransportClosed);
        self.reports.closed(conn_id, conn.source, reason);
        match conn.kind {
            ConnKind::Client(client) => {
                self.conns.clients.closed(conn_id, &client.front);
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership.held_keys.forget_conn(conn_id);
                }
                for grant in conn.out.into_undelivered() {
                    let (keys, token) = (grant.keys, grant.token);
                    self.propose_internal(now, Command::Release { keys, token });
                }
            }
            ConnKind::Peer(peer) => {
                if peer.established.is_some() || peer.dialed.is_some() {
                    self.conns.known_peer_conns -= 1;
                }
                let slot = peer.established.map(|id| id.slot).or(peer.dialed);
                if let Some(slot) = slot
                    && !self.conns.slot_connected(slot)
                {
                    self.back_off(now, slot);
                }
            }
        }
        self.pump(now);
    }

    /// The dialect client connection `conn` speaks, once its handshake
    /// succeeded.
    pub fn dialect(&self, conn_id: ConnId) -> Option<Dialect> {
        match self.conns.by_id.get(&conn_id).map(|conn| &conn.kind) {
            Some(ConnKind::Client(client)) => client.front.dialect(),
            _ => None,
        }
    }

    /// Counts a release's outcome in its connection's run of misses.
    pub(super) fn count_release_miss(
        &mut self,
        _now: Instant,
        conn_id: ConnId,
        result: &ApplyResult,
    ) {
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.by_id.get_mut(&conn_id)
        {
            match result {
                ApplyResult::Released => client.release_misses_in_row = 0,
                ApplyResult::GroupMismatch => {}
                _ => {
                    client.release_misses_in_row = client.release_misses_in_row.saturating_add(1);
                }
            }
        }
    }

    /// Closes `conn_id` once its releases missed too often in a row: that is
    /// what trying tokens blindly looks like. Fencing at the storage is the
    /// real protection; this makes a sweep slow and visible.
    pub(super) fn close_if_sweeping(&mut self, now: Instant, conn_id: ConnId) {
        let misses_max = self.config.budget.release_misses_in_row_max;
        let Some(conn) = self.conns.by_id.get(&conn_id) else {
            return;
        };
        let ConnKind::Client(client) = &conn.kind else {
            return;
        };
        if misses_max == 0 || client.release_misses_in_row < misses_max || conn.out.is_closing() {
            return;
        }
        self.reports
            .abuse(now, conn.source, AbuseKind::ReleaseSweep);
        self.close_conn(conn_id, CloseReason::ReleaseMisses);
    }

    /// Sends `L` to every client session when the known leader changed.
    pub(super) fn announce_leader(&mut self) {
        let slot = self.raft.leader().map_or(NO_LEADER_SLOT, |l| l.slot);
        if slot == self.announced_leader {
            return;
        }
        self.announced_leader = slot;
        for (conn_id, conn) in &mut self.conns.by_id {
            if let ConnKind::Client(client) = &conn.kind
                && client.front.in_session()
                && !conn.out.is_closing()
            {
                let before = conn.out.pending().len();
                let addresses = &self.config.client_addresses;
                client
                    .front
                    .leader_notice(slot, addresses, conn.out.buffer_mut());
                if conn.out.pending().len() > before {
                    self.conns.wakes.wake(*conn_id, &mut conn.out);
                }
            }
        }
    }
}
