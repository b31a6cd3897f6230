//! One cluster node: client connections, peer connections, Raft and the
//! replicated lock state, composed behind the same driver contract as the
//! single-mode [`crate::server::Server`].
//!
//! Contract:
//! - inputs: [`Machine::handle_connect`] (a client connection accepted),
//!   [`Machine::handle_peer_accept`] (a peer connection accepted),
//!   [`Machine::handle_dialed`] / [`Machine::handle_dial_failed`]
//!   (the outcome of a dial asked for by [`Output::Dial`](crate::machine::Output::Dial)),
//!   [`Machine::handle_input`], [`Machine::handle_flushed`],
//!   [`Machine::handle_closed`], [`Machine::handle_timeout`],
//!   [`Machine::begin_shutdown`];
//! - outputs, drained after every input: [`Output::Dial`](crate::machine::Output::Dial) (a
//!   peer slot to dial), [`Output::Wake`](crate::machine::Output::Wake) then
//!   [`Machine::poll_transmit`] for each woken connection (client and
//!   peer alike); with a token reserve ([`ClusterNode::with_token_reserve`])
//!   [`Output::Reserve`](crate::machine::Output::Reserve) and [`Output::Alert`](crate::machine::Output::Alert), as for
//!   the single-mode server;
//! - time: [`Machine::poll_timeout`].
//!
//! # How a request is served
//!
//! Only the leader serves. A non-leader answers `E 3` when it is not a
//! voter (a learner catching up) or shutting down, `M` with the leader's
//! slot when it knows one, else `E 4` — all "no effect, retry".
//!
//! On the leader an acquire whose keys are free (not held in the applied
//! state, no Grant in flight for them, nobody queued) is proposed as a
//! `Grant` at once; otherwise it queues FIFO in a leader-local waiter table
//! (or gets `T` for wait 0, `B` over a limit). The reply goes out only when
//! the entry with exactly the proposal's `(index, term)` is committed and
//! applied. A release is proposed as `Release` and answered after apply.
//! When it names exactly its grant, what it frees is handed to the queue
//! head by a `Grant` proposed right behind it (same batch, one commit for
//! the pair); keys freed otherwise (expiry, force-release) go to the queue
//! head by a `Grant` proposed after they apply.
//! Lease expiry: the leader watches lease deadlines on its own clock and
//! proposes `Expire{keys, token}`.
//!
//! A new leader serves nothing until it has applied everything up to the
//! no-op of its own term: before that its view of who holds what may miss
//! grants committed by its predecessor. Requests arriving meanwhile are
//! held (bounded) and served in order once it has caught up.
//!
//! On `SteppedDown` every proposed, unanswered request gets `I`, and every
//! queued waiter gets `M`/`E 4` (it had no effect yet). Waiters are not
//! replicated: the new leader starts with an empty waiter table.
//!
//! # Where things are
//!
//! - this file: [`ClusterNode`] itself (its state, construction, queries,
//!   timers and shutdown) and [`ClusterStats`];
//! - `config`: [`ClusterConfig`], its defaults and its checks;
//! - `connections`: the client and peer connections a node owns, kept in
//!   one value that a rejoining node carries over whole; client input,
//!   replies, closing, wake and transmit;
//! - `peers`: peer handshakes, dialing, routing Raft messages, keepalives
//!   and link liveness;
//! - `leadership`: the leader-only state (waiter queues, serving acquires
//!   and releases, wait timeouts, lease expiry, hand-over), dropped on
//!   stepping down;
//! - `permits`: semaphores on the leader (permit waiters FIFO per
//!   semaphore, capacities derived from the applied grants);
//! - `shared`: shared locks on the leader (the mode rules of its queues,
//!   the downgrade);
//! - `apply`: proposals in flight, the pump that drains Raft, applying
//!   committed entries and answering their proposals, Raft events;
//! - `genesis`: a bootstrap member's check that the cluster is new, and
//!   rejoining as a new generation when it is not;
//! - `inspect`: inspection and force-release for the admin layer;
//! - `machine`: the node's driver surface, `impl` [`Machine`]: every
//!   verb the driver calls.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::budget::{CloseReason, Reports};
use crate::cluster::events::NodeEvents;
use crate::cluster::peer::PeerError;
use crate::cluster::state::ReplicatedLocks;
use crate::conn::ConnId;
use crate::conn::client::Answer;
use crate::inspect::{AdminRequestId, ForceReleaseOutcome};
use crate::machine::Machine;
use crate::metrics::PushCounts;
use crate::metrics::{ClusterMetrics, ReplyCounts};
use crate::raft::{NodeId, Raft};
use crate::reserve::{ReserveStats, TokenReserve};
use crate::time::Instant;
use crate::wire::NO_LEADER_SLOT;
use crate::wire::PushKind;

mod apply;
mod config;
mod connections;
mod genesis;
mod inspect;
mod keys;
mod leadership;
mod machine;
mod observe;
mod peers;
mod permits;
mod shared;
mod start;

pub use self::config::{
    ClusterConfig, KEEPALIVE_HEARTBEATS, LIVE_HEARTBEATS, default_peer_silence_timeout,
};
pub use self::inspect::ADMIN_REPLIES_MAX;
pub use self::peers::PeerLiveness;
pub use self::start::{BOOTSTRAP_GENERATION, StartFacts, StartMode};

use self::apply::PendingProposals;
use self::connections::{Conn, ConnKind, Connections};
use self::genesis::GenesisCheck;
use self::leadership::{Handover, Leadership};

/// Counts for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Open client connections.
    pub clients: usize,
    /// Peer connections whose handshake completed.
    pub peers_established: usize,
    /// Held keys in the applied state.
    pub held_keys: usize,
    /// Queued waiters (leader only).
    pub waiters: usize,
    /// Proposals awaiting apply.
    pub pending: usize,
    /// Token reserve counts.
    pub reserve: ReserveStats,
    /// Appends dropped because this node's durable reserve did not cover
    /// the tokens their entries could allocate (sent again by the leader
    /// once the reserve grew).
    pub appends_uncovered: u64,
}

/// One node of a Ticketing cluster.
#[derive(Debug)]
pub struct ClusterNode {
    config: ClusterConfig,
    raft: Raft,
    state: ReplicatedLocks,
    /// Index of the last entry applied to `state`.
    applied_index: u64,
    pending: PendingProposals,
    leadership: Option<Leadership>,
    /// The leader's slot as last told to clients.
    announced_leader: u8,
    /// Client and peer connections, with everything that counts them.
    conns: Connections,
    next_waiter_seq: u64,
    /// What the driver should log.
    reports: Reports,
    shutting_down: bool,
    /// A snapshot from the leader that did not decode (should never happen;
    /// counted for operators).
    bad_snapshots: u64,
    /// Peer frames refused by the decoder (each closed its connection).
    refused_peer_frames: u64,
    /// The slot and reason of the latest refused peer frame.
    last_refused_peer_frame: Option<(u8, PeerError)>,
    /// A bootstrap member's check that the cluster is new.
    genesis: GenesisCheck,
    /// The largest token floor an authenticated peer sent in its hello
    /// (below 2^63): the first `Init` starts at least there.
    peer_token_floor_max: u64,
    /// Slots of authenticated peers of this node's own generation whose
    /// hello floors were heard (a recovering leader's evidence, see
    /// [`crate::cluster::recovery`]).
    floor_slots_heard: BTreeSet<u8>,
    /// The largest token bound of an `Append` dropped because the durable
    /// reserve did not cover it: the reserve is asked to cover it.
    log_bound_wanted: u64,
    /// The durable bound on tokens this node proposes; unlimited unless
    /// [`ClusterNode::with_token_reserve`] set one.
    reserve: TokenReserve,
    /// Replies sent to clients, by kind.
    replies: ReplyCounts,
    /// Answers to force-releases, for the driver (bounded).
    admin_replies: VecDeque<(AdminRequestId, ForceReleaseOutcome)>,
    /// Force-releases applied in this pump whose keys may go to a waiter:
    /// answered once it is known whether a hand-over Grant was proposed
    /// (at the latest when the pump ends).
    handover_wanted: Vec<Handover>,
    /// Force-releases answered when the hand-over Grant at this index
    /// applies (one per pending Grant at most).
    handovers: BTreeMap<u64, Handover>,
    /// What this node counted beyond Raft and the applied state.
    counts: NodeCounts,
    /// Holders to tell of a lost grant, found while applying (sent when
    /// the pump is done).
    pushes_due: Vec<(ConnId, u64, PushKind)>,
    /// Pushes sent, by kind.
    pushes: PushCounts,
    /// Leader, voter and generation changes for the driver (bounded).
    events: NodeEvents,
    /// No established peer link had a silence, stuck-output or keepalive
    /// deadline before this when they were last looked at; their scan
    /// waits for it rather than running on every input. Deadlines only
    /// move later, but for a link just established, which resets this.
    peer_scan_at: Instant,
    /// Where a proposed command is encoded (kept: no allocation but the
    /// entry's own).
    encode_buf: Vec<u8>,
    /// Raft's messages wait for the first peer connection's
    /// [`Machine::poll_transmit`](crate::machine::Machine::poll_transmit)
    /// (or the next peer input or timer), set at this instant by a client
    /// input: the inputs of other clients the driver takes in the same
    /// wake-up then join the same appends.
    route_deferred_at: Option<Instant>,
    /// The peer links [`Output::Wake`](crate::machine::Output::Wake)(crate::machine::Machine::poll_wake)
    /// handed to the driver while messages were held (each once), empty
    /// when nothing is held.
    route_handed: Vec<ConnId>,
}

/// What a node counts beyond Raft's counters and the applied state.
#[derive(Clone, Debug, Default)]
struct NodeCounts {
    /// Leader: proposal → applied, for proposals this leader made.
    commit_latency: crate::metrics::DurationHistogram,
    /// Leader: acquire arrival → grant delivered.
    wait: crate::metrics::DurationHistogram,
    /// Leader: applied expiries whose keys had a waiter queued.
    expiries_handed_over: u64,
    /// Leader: applied expiries with nobody queued on their keys.
    expiries_not_handed_over: u64,
    /// Leader: applied releases whose keys had a waiter queued.
    release_handovers: u64,
    /// Acquires answered `B`, by the limit.
    busy: crate::metrics::BusyByLimit,
    /// Acquires answered `B` for a per-connection limit.
    busy_per_connection: u64,
    /// Acquires answered `B` because Raft refused a proposal (too many
    /// uncommitted entries).
    busy_backpressure: u64,
    /// Force-release answers dropped because the driver did not drain
    /// them.
    dropped_admin_replies: u64,
    /// Appends dropped because the durable reserve did not cover the
    /// tokens their entries could allocate.
    appends_uncovered: u64,
}

impl ClusterNode {
    /// A member of a freshly bootstrapped cluster; every bootstrap member is
    /// given the same `voters`.
    ///
    /// State lives in memory only, so nothing tells a process whether its
    /// `(slot, generation)` has run before; a bootstrap member started by
    /// mistake on a running cluster would vote and acknowledge again under
    /// an identity whose earlier votes and acknowledgements it forgot, which
    /// can lose committed entries. So a bootstrap member first checks that
    /// the cluster is new: it steps no peer message into Raft until a
    /// majority of the slots (itself included) showed a log holding only the
    /// bootstrap entry (in a pre-vote or vote request, or by granting its
    /// own pre-vote). Any sign of a running cluster before that (a leader's
    /// append, heartbeat or snapshot, or a longer log) makes it join instead
    /// as the new generation `rejoin_generation`, exactly like a restart
    /// without `--bootstrap`; it has cast no vote and acknowledged nothing
    /// as generation 1 by then.
    pub fn bootstrap(
        config: ClusterConfig,
        voters: impl IntoIterator<Item = NodeId>,
        rejoin_generation: u64,
        seed: u64,
        now: Instant,
    ) -> Self {
        assert!(
            rejoin_generation > config.id.generation,
            "rejoin_generation must be newer than the bootstrap generation"
        );
        let mut node = ClusterNode::bootstrap_unchecked(config, voters, seed, now);
        node.genesis = GenesisCheck::Pending {
            empty_logs: BTreeSet::new(),
            rejoin_generation,
            seed,
        };
        node
    }

    /// A bootstrap member that acts as generation 1 at once, without
    /// checking that the cluster is new. Only for the simulator's planted
    /// driver bug (a restart under generation 1, which its checkers must
    /// catch); a real start uses [`ClusterNode::bootstrap`].
    #[doc(hidden)]
    pub fn bootstrap_unchecked(
        config: ClusterConfig,
        voters: impl IntoIterator<Item = NodeId>,
        seed: u64,
        now: Instant,
    ) -> Self {
        let raft = Raft::bootstrap(config.id, voters, config.raft.clone(), seed, now);
        ClusterNode::with_raft(config, raft, now)
    }

    /// A new generation of a slot joining a running cluster: it starts as a
    /// learner once the leader adds it (on seeing its peer handshake), and
    /// replaces its slot's old generation when caught up.
    pub fn join(config: ClusterConfig, seed: u64, now: Instant) -> Self {
        let raft = Raft::join(config.id, config.raft.clone(), seed, now);
        ClusterNode::with_raft(config, raft, now)
    }

    fn with_raft(config: ClusterConfig, raft: Raft, now: Instant) -> Self {
        assert!(
            config.validate().is_ok(),
            "invalid ClusterConfig: {:?}",
            config.validate()
        );
        ClusterNode {
            events: NodeEvents::new(raft.is_voter()),
            raft,
            state: ReplicatedLocks::new(),
            applied_index: 0,
            pending: PendingProposals::default(),
            leadership: None,
            announced_leader: NO_LEADER_SLOT,
            conns: Connections::new(&config, now),
            next_waiter_seq: 1,
            reports: Reports::new(config.budget.report_interval),
            shutting_down: false,
            bad_snapshots: 0,
            refused_peer_frames: 0,
            last_refused_peer_frame: None,
            genesis: GenesisCheck::Done,
            peer_token_floor_max: 0,
            floor_slots_heard: BTreeSet::new(),
            log_bound_wanted: 0,
            config,
            reserve: TokenReserve::unlimited(),
            replies: ReplyCounts::default(),
            admin_replies: VecDeque::new(),
            handover_wanted: Vec::new(),
            handovers: BTreeMap::new(),
            counts: NodeCounts::default(),
            pushes_due: Vec::new(),
            pushes: PushCounts::default(),
            peer_scan_at: Instant::ZERO,
            route_deferred_at: None,
            route_handed: Vec::new(),
            encode_buf: Vec::new(),
        }
    }

    /// Proposes no Grant whose token could exceed what `reserve` has
    /// confirmed durable (see [`crate::reserve`]); every node also asks for
    /// its reserve to follow the replicated counter as it applies. Without
    /// it the node is unlimited. When the reserve is used up a leader
    /// answers an acquire that would be proposed at once `B`, and queue
    /// heads wait until the write succeeds or their wait ends.
    pub fn with_token_reserve(mut self, reserve: TokenReserve) -> Self {
        self.reserve = reserve;
        self
    }

    /// The highest token the next Grant could get: the counter (or, before
    /// `Init` is applied, the value this node's `Init` carries) plus one
    /// for every proposal in flight. Each in-flight Grant takes at most one
    /// token; counting every pending proposal is an upper bound that needs
    /// no bookkeeping of its own. A leader serves only once caught up, when
    /// its own proposals are the only unapplied entries.
    fn next_grant_token_bound(&self) -> u64 {
        let counter = if self.state.is_initialised() {
            self.state.next_token()
        } else {
            self.config.bootstrap_wall_clock_us.max(1)
        };
        counter.saturating_add(self.pending.len() as u64)
    }

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// Whether this node leads.
    pub fn is_leader(&self) -> bool {
        self.raft.is_leader()
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.leader()
    }

    /// The Raft node, read-only (for checkers and metrics).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The applied lock state, read-only (for checkers and metrics).
    pub fn lock_state(&self) -> &ReplicatedLocks {
        &self.state
    }

    /// Current counts.
    pub fn stats(&self) -> ClusterStats {
        let mut stats = ClusterStats {
            held_keys: self.state.held_keys(),
            pending: self.pending.len(),
            waiters: self
                .leadership
                .as_ref()
                .map_or(0, |l| l.waiters.len() + l.semaphores.waiter_count()),
            reserve: self.reserve.stats(),
            appends_uncovered: self.counts.appends_uncovered,
            ..ClusterStats::default()
        };
        for conn in self.conns.by_id.values() {
            match &conn.kind {
                ConnKind::Client(_) => stats.clients += 1,
                ConnKind::Peer(peer) if peer.established.is_some() => {
                    stats.peers_established += 1;
                }
                ConnKind::Peer(_) => {}
            }
        }
        stats
    }

    /// A snapshot of what the node counted (see [`crate::metrics`]).
    pub fn metrics(&self) -> ClusterMetrics {
        let stats = self.stats();
        let counts = &self.counts;
        ClusterMetrics {
            commit_latency: counts.commit_latency.clone(),
            wait: counts.wait.clone(),
            expiries_handed_over: counts.expiries_handed_over,
            expiries_not_handed_over: counts.expiries_not_handed_over,
            release_handovers: counts.release_handovers,
            busy: counts.busy,
            busy_per_connection: counts.busy_per_connection,
            busy_backpressure: counts.busy_backpressure,
            dropped_admin_replies: counts.dropped_admin_replies,
            appends_uncovered: counts.appends_uncovered,
            pushes: self.pushes,
            ..super::metrics::cluster_metrics(
                &self.raft,
                &self.state,
                self.applied_index,
                self.replies,
                self.reports.totals(),
                self.checking_genesis(),
                {
                    let (sessions, line_sessions) = self.conns.clients.sessions();
                    (stats.waiters, sessions, line_sessions)
                },
                self.shutting_down,
            )
        }
    }

    /// Snapshots from the leader that could not be restored.
    pub fn bad_snapshots(&self) -> u64 {
        self.bad_snapshots
    }

    /// Peer frames the decoder refused (malformed, or carrying a number no
    /// honest peer sends); each closed its connection. The driver logs them.
    pub fn refused_peer_frames(&self) -> u64 {
        self.refused_peer_frames
    }

    /// The slot of the peer and the reason of the latest refused frame.
    pub fn last_refused_peer_frame(&self) -> Option<(u8, PeerError)> {
        self.last_refused_peer_frame
    }

    /// Keys held by the grants this leader delivered to `conn` (for tests
    /// and metrics; 0 on a follower).
    pub fn held_keys(&self, conn_id: ConnId) -> usize {
        self.leadership
            .as_ref()
            .map_or(0, |leadership| leadership.held_keys.held(conn_id))
    }

    /// Log events dropped because the driver did not drain
    /// [`Output::Log`](crate::machine::Output::Log) (a bounded queue).
    pub fn dropped_log_events(&self) -> u64 {
        self.reports.dropped_events()
    }

    /// Node events dropped because a newer one of their kind superseded
    /// them while the queue was full (the driver did not drain
    /// [`Output::Node`](crate::machine::Output::Node)).
    pub fn coalesced_node_events(&self) -> u64 {
        self.events.coalesced()
    }

    /// The earliest instant at which [`ClusterNode::handle_timeout`] has
    /// work (may be early; never late).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let mut earliest = self.raft.poll_timeout();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
        };
        consider(self.conns.handshake_deadlines.earliest());
        consider(self.reports.poll_timeout());
        consider(self.reserve.poll_timeout());
        if let Some(leadership) = &self.leadership {
            consider(
                leadership
                    .wait_deadlines
                    .peek()
                    .map(|Reverse((deadline, _))| *deadline),
            );
            // Expiry runs only once caught up; before that a due deadline
            // would only make the driver spin.
            if leadership.caught_up {
                consider(self.state.peek_deadline());
            }
            consider(leadership.watches.poll_timeout());
        }
        for (slot, dial) in self.conns.dials.iter().enumerate() {
            if slot != usize::from(self.config.id.slot) && !dial.connected && !dial.dialing {
                consider(Some(dial.next_attempt));
            }
        }
        consider(self.peer_deadline());
        earliest
    }

    /// The earliest silence, stuck-output or keepalive deadline of an
    /// established peer link.
    fn peer_deadline(&self) -> Option<Instant> {
        let bound = self.config.peer_silence_timeout;
        let keepalive = self.config.keepalive_interval();
        let mut earliest: Option<Instant> = None;
        for conn in self.conns.by_id.values() {
            if let (ConnKind::Peer(peer), false) = (&conn.kind, conn.out.is_closing())
                && peer.established.is_some()
            {
                let silent = peer.last_frame_at.saturating_add(bound);
                let keepalive = peer.last_sealed_at.saturating_add(keepalive);
                let stuck = peer.output_pending_since.map(|t| t.saturating_add(bound));
                let due = stuck.map_or(silent.min(keepalive), |s| s.min(silent).min(keepalive));
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
            }
        }
        earliest
    }

    /// Closes silent or stuck peer links and sends keepalives, when one of
    /// their deadlines may have come.
    pub(super) fn scan_peers(&mut self, now: Instant) {
        if now < self.peer_scan_at {
            return;
        }
        self.close_silent_peers(now);
        self.send_keepalives(now);
        // With no link to watch, the next one established resets this.
        self.peer_scan_at = self
            .peer_deadline()
            .unwrap_or(Instant::from_micros(u64::MAX));
    }

    /// Stop serving clients: a leader hands leadership over; queued and
    /// held waiters get `E 3`; client connections are flushed and closed;
    /// new client connections are refused. Peer connections stay so the
    /// transfer can complete; the driver exits once
    /// [`ClusterNode::is_leader`] is false (or after its own timeout).
    pub(super) fn start_shutdown(&mut self, now: Instant) {
        self.handle_timeout(now);
        self.shutting_down = true;
        self.reports.flush();
        if self.raft.is_leader() {
            let _ = self.raft.transfer_leadership(now, None);
        }
        if let Some(leadership) = self.leadership.as_mut() {
            let waiters = leadership.waiters_in_order();
            let held = std::mem::take(&mut leadership.held);
            let permit_waiters = leadership.semaphores.take_waiters();
            leadership.keys.clear_waiters();
            for waiter in waiters {
                self.answer(waiter.conn, &waiter.reply_to, Answer::NotActive);
            }
            for (conn, request, _) in held {
                self.answer(conn, request.reply_to(), Answer::NotActive);
            }
            self.answer_permit_waiters(permit_waiters, Answer::NotActive);
        }
        let clients: Vec<ConnId> = self
            .conns
            .by_id
            .iter()
            .filter(|(_, c)| matches!(c.kind, ConnKind::Client(_)))
            .map(|(id, _)| *id)
            .collect();
        for conn_id in clients {
            if let Some(Conn {
                kind: ConnKind::Client(client),
                out,
                ..
            }) = self.conns.by_id.get_mut(&conn_id)
                && !out.is_closing()
            {
                client.front.farewell(out.buffer_mut());
            }
            self.close_conn(conn_id, CloseReason::Shutdown);
        }
        self.pump(now);
    }
}
