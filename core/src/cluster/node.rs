//! One cluster node: client connections, peer connections, Raft and the
//! replicated lock state, composed behind the same driver contract as the
//! single-mode [`crate::server::Server`].
//!
//! Contract:
//! - inputs: [`ClusterNode::handle_connect`] (a client connection accepted),
//!   [`ClusterNode::handle_peer_accept`] (a peer connection accepted),
//!   [`ClusterNode::handle_peer_connected`] / [`ClusterNode::handle_dial_failed`]
//!   (the outcome of a dial asked for by [`ClusterNode::poll_dial`]),
//!   [`ClusterNode::handle_input`], [`ClusterNode::handle_flushed`],
//!   [`ClusterNode::handle_closed`], [`ClusterNode::handle_timeout`],
//!   [`ClusterNode::begin_shutdown`];
//! - outputs, drained after every input: [`ClusterNode::poll_dial`] (a
//!   peer slot to dial), [`ClusterNode::poll_wake`] then
//!   [`ClusterNode::take_transmit`] for each woken connection (client and
//!   peer alike); with a token reserve ([`ClusterNode::with_token_reserve`])
//!   [`ClusterNode::poll_reserve`] and [`ClusterNode::poll_alert`], as for
//!   the single-mode server;
//! - time: [`ClusterNode::poll_timeout`].
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
//! applied. A release is proposed as `Release` and answered after apply;
//! what it frees is handed to the next waiter by a new `Grant` proposal.
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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use crate::auth::{ClientTokens, Hello, NONCE_LEN, WireMode};
use crate::budget::{
    AbuseKind, BudgetConfig, CloseReason, HandshakeBudget, HeldKeys, LogEvent, Reports,
};
use crate::cluster::command::{ApplyResult, Command, MAX_FIRST_TOKEN};
use crate::cluster::events::{NodeEvent, NodeEvents};
use crate::cluster::peer::{
    MAX_FRAME_LEN, PeerError, PeerHandshake, PeerHandshakeStatus, PeerIdentity, PeerSession,
    PeerTokens,
};
use crate::cluster::state::{ReplicatedLocks, SnapshotError};
use crate::conn::client::{
    Answer, ClientFront, ClientRequest, Delivery, FrontInput, FrontTimeout, ReplyTo,
};
use crate::conn::{ConnId, ConnState, Dialect, HandshakeDeadlines, Outbound, WakeQueue};
use crate::inspect::{
    AdminRequestId, ConnView, ForceRelease, ForceReleaseOutcome, HolderView, LockListing, LockView,
    MAX_LISTED_WAITERS, MAX_LISTING_LIMIT, MAX_WAITERS_PER_LISTED_LOCK, NotLeader, WaiterView,
};
use crate::line::MAX_LINE_TEXT_LEN;
use crate::lock::Limits;
use crate::metrics::{ClusterMetrics, ReplyCounts};
use crate::queue_rule;
use crate::raft::{
    Committed, ConfChange, EntryKind, Event, Message, MessageBody, NodeId, ProposeError, Raft,
    RaftConfig,
};
use crate::reserve::{ReserveStats, TokenAlert, TokenReserve};
use crate::time::{Duration, Instant};
use crate::wire::{Key, KeyGroup, NO_LEADER_SLOT};

/// How soon an `Expire` that could not be proposed is retried; also the
/// longest the leader lets an expired lease go unnoticed (docs/cluster.md,
/// "Expiry": checked at least every 100 ms).
const EXPIRE_RETRY: Duration = Duration::from_millis(100);

/// Configuration of one cluster node.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The cluster's 32-byte identity (one fencing domain).
    pub fingerprint: [u8; 32],
    /// This node's Raft identity: its slot and a generation that is new on
    /// every start with empty state.
    pub id: NodeId,
    /// Slots in the cluster (3 or 5); peers are dialed in `0..slot_count`.
    pub slot_count: u8,
    /// Raft timing and limits.
    pub raft: RaftConfig,
    /// Limits of the leader's waiter table.
    pub limits: Limits,
    /// A queued request gets `T` this long before `wait` seconds after
    /// receipt.
    pub wait_margin: Duration,
    /// Client connections past their handshake (sessions) at most;
    /// unfinished handshakes have their own budget
    /// ([`BudgetConfig::max_handshakes`]).
    pub max_connections: usize,
    /// Requests awaiting a reply on one client connection at most; an
    /// acquire over it is answered `B`.
    pub max_in_flight_per_connection: usize,
    /// Bytes buffered for one connection before the node stops reading
    /// from it (clients) or drops Raft messages to it (peers).
    pub max_outbound_bytes_per_connection: usize,
    /// An unfinished handshake (client or peer) is closed after this long.
    pub handshake_timeout: Duration,
    /// Accepted client tokens.
    pub client_tokens: ClientTokens,
    /// Peer tokens (the first one is this node's own).
    pub peer_tokens: PeerTokens,
    /// Handshake budgets (client and peer), held-key cap, release-miss
    /// limit, report interval.
    pub budget: BudgetConfig,
    /// The token floor at this process's start: the larger of the
    /// wall-clock microseconds since the Unix epoch and the token reserve
    /// this slot stored before plus one
    /// ([`crate::reserve::start_token`]); the first token of the domain if
    /// this node's leadership initialises it.
    pub bootstrap_wall_clock_us: u64,
    /// First redial delay after a failed or lost peer connection.
    pub dial_backoff_min: Duration,
    /// Largest redial delay (the delay doubles up to it).
    pub dial_backoff_max: Duration,
    /// An established peer connection that received no frame for this
    /// long, or whose queued output was not written for this long, is
    /// closed ([`CloseReason::PeerSilent`]) and its slot redialed. Every
    /// live connection carries a frame each way at least every
    /// [`KEEPALIVE_HEARTBEATS`] heartbeat intervals (Raft traffic or a
    /// keepalive), so only a dead or stuck link stays silent this long.
    /// Default: twice the largest election timeout.
    pub peer_silence_timeout: Duration,
    /// Each slot's client address as clients spell it, in slot order (empty:
    /// none known). Line-dialect clients are routed by it (`M` and `L` carry
    /// the address as text, compared as an exact string with the client's
    /// own list); v3 clients route by slot and do not need it. At most
    /// 190 bytes each, no CR or LF.
    pub client_addresses: Vec<Box<str>>,
    /// Each slot's admin listener address (`host:port`), in slot order
    /// (empty: none known). A follower names the leader's with
    /// [`NotLeader`] so that the admin HTTP layer can redirect an operator
    /// there. At most 190 bytes each, no CR or LF.
    pub admin_addresses: Vec<Box<str>>,
}

/// A peer connection on which nothing was sent for this many heartbeat
/// intervals gets a keepalive frame, so that links no Raft message uses
/// (follower to follower, or the second connection of a pair) are not
/// silent while alive.
pub const KEEPALIVE_HEARTBEATS: u32 = 2;

/// A slot whose connection received a frame within this many heartbeat
/// intervals counts as live ([`PeerLiveness::Live`]).
pub const LIVE_HEARTBEATS: u32 = 5;

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
    /// [`LIVE_HEARTBEATS`] heartbeat intervals.
    Live,
    /// Established connections exist but none received a frame recently:
    /// the link may be cut (it is closed once past
    /// [`ClusterConfig::peer_silence_timeout`]).
    Silent,
}

impl ClusterConfig {
    /// Defaults for everything but identities and secrets.
    pub fn new(
        fingerprint: [u8; 32],
        id: NodeId,
        slot_count: u8,
        peer_tokens: PeerTokens,
        bootstrap_wall_clock_us: u64,
    ) -> Self {
        ClusterConfig {
            fingerprint,
            id,
            slot_count,
            raft: RaftConfig::default(),
            limits: Limits::default(),
            wait_margin: Duration::from_millis(100),
            max_connections: 10_000,
            max_in_flight_per_connection: 32_768,
            max_outbound_bytes_per_connection: 16 << 20,
            handshake_timeout: Duration::from_secs(3),
            client_tokens: ClientTokens::no_auth(),
            peer_tokens,
            budget: BudgetConfig::for_max_connections(10_000),
            bootstrap_wall_clock_us,
            dial_backoff_min: Duration::from_millis(100),
            // Bounds how long a healed partition waits for the next dial:
            // a failed dial a second per unreachable peer costs nothing.
            dial_backoff_max: Duration::from_millis(1_000),
            peer_silence_timeout: default_peer_silence_timeout(&RaftConfig::default()),
            client_addresses: Vec::new(),
            admin_addresses: Vec::new(),
        }
    }

    /// Checks what the node relies on.
    pub fn validate(&self) -> Result<(), &'static str> {
        self.raft.validate()?;
        let live_window = self.live_window();
        if self.peer_silence_timeout <= live_window {
            return Err(
                "peer_silence_timeout must exceed the live window of 5 heartbeat intervals",
            );
        }
        if self.slot_count != 3 && self.slot_count != 5 {
            return Err("a cluster has 3 or 5 slots");
        }
        if self.id.slot >= self.slot_count {
            return Err("this node's slot is outside the cluster");
        }
        if !self.client_addresses.is_empty()
            && self.client_addresses.len() != usize::from(self.slot_count)
        {
            return Err("client_addresses must name every slot, or none");
        }
        let unfit =
            |a: &str| a.is_empty() || a.len() > MAX_LINE_TEXT_LEN || a.contains(['\r', '\n']);
        if self.client_addresses.iter().any(|a| unfit(a)) {
            return Err("a client address must be 1..=190 bytes without CR or LF");
        }
        if !self.admin_addresses.is_empty()
            && self.admin_addresses.len() != usize::from(self.slot_count)
        {
            return Err("admin_addresses must name every slot, or none");
        }
        if self.admin_addresses.iter().any(|a| unfit(a)) {
            return Err("an admin address must be 1..=190 bytes without CR or LF");
        }
        if self.bootstrap_wall_clock_us >= MAX_FIRST_TOKEN {
            // Its Init command would not decode on any node.
            return Err("bootstrap_wall_clock_us is beyond the first-token bound");
        }
        // Every Raft message must fit one peer frame: an append carries at
        // most max_append_bytes plus one entry, a snapshot one chunk.
        let append = self.raft.max_append_bytes + self.raft.max_entry_bytes + 1_024;
        if append > MAX_FRAME_LEN || self.raft.snapshot_chunk_bytes + 1_024 > MAX_FRAME_LEN {
            return Err("raft batch or snapshot chunk exceeds the peer frame limit");
        }
        Ok(())
    }
}

/// Twice the largest election timeout of `raft`: the default
/// [`ClusterConfig::peer_silence_timeout`] (set it again with this after
/// changing the Raft timing).
pub fn default_peer_silence_timeout(raft: &RaftConfig) -> Duration {
    let max = raft
        .election_timeout_min
        .saturating_add(raft.election_timeout_jitter);
    max.saturating_mul(2)
}

impl ClusterConfig {
    fn heartbeat_interval(&self) -> Duration {
        self.raft.heartbeat_interval
    }

    fn keepalive_interval(&self) -> Duration {
        self.heartbeat_interval() * KEEPALIVE_HEARTBEATS
    }

    fn live_window(&self) -> Duration {
        self.heartbeat_interval() * LIVE_HEARTBEATS
    }
}

/// What a proposal is waiting for.
#[derive(Debug)]
enum PendingKind {
    /// The domain's counter start; no reply.
    Init,
    /// A grant for a client waiter.
    Grant(Waiter),
    /// A client's release.
    Release { conn: ConnId, reply_to: ReplyTo },
    /// A lease expiry or the release of an undelivered grant; no reply.
    Internal,
    /// An operator's force-release, answered through
    /// [`ClusterNode::poll_admin_reply`] once applied.
    ForceRelease {
        /// The driver's name for the request.
        id: AdminRequestId,
        /// Every key of the grant holding the named key when proposed;
        /// replaced at apply by the keys of the grant actually revoked.
        keys: Vec<Key>,
    },
}

#[derive(Debug)]
struct Pending {
    term: u64,
    kind: PendingKind,
    /// When it was proposed (commit latency is observed at apply).
    proposed_at: Instant,
}

/// A queued or proposed acquire.
#[derive(Clone, Debug)]
struct Waiter {
    conn: ConnId,
    reply_to: ReplyTo,
    keys: KeyGroup,
    lease_ms: u32,
    /// When it gets `T` if still queued.
    deadline: Instant,
    /// When the acquire arrived (the wait-time observation starts here).
    received: Instant,
}

/// Leader-only state, dropped on stepping down.
#[derive(Debug, Default)]
struct Leadership {
    /// Index of this term's no-op: nothing is served until it is applied.
    first_index: u64,
    caught_up: bool,
    init_proposed: bool,
    /// Queued waiters by arrival sequence number.
    waiters: BTreeMap<u64, Waiter>,
    queues: HashMap<Key, VecDeque<u64>>,
    wait_deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Keys of Grant proposals not yet applied.
    reserved: HashSet<Key>,
    /// Tokens with an `Expire` in flight.
    expiring: HashSet<u64>,
    /// Keys whose queue head may have become grantable.
    dirty: Vec<Key>,
    /// Keys whose queue head was grantable but for the token reserve;
    /// dirty again once the reserve grows.
    reserve_stalled: BTreeSet<Key>,
    /// Requests received before catching up, served in order after.
    held: VecDeque<(ConnId, ClientRequest, Instant)>,
    /// Keys held by the grants this leader delivered, per connection.
    held_keys: HeldKeys,
}

#[derive(Debug)]
struct ClientConn {
    /// Handshake, dialect and session decoding.
    front: ClientFront,
    /// Requests awaiting a reply.
    in_flight: usize,
    /// Sequence numbers of its queued waiters.
    queued: BTreeSet<u64>,
    /// Releases answered `N` since the last one that released.
    release_misses_in_row: u32,
}

#[derive(Debug)]
struct PeerConn {
    // Boxed: the handshake and the keyed MAC states are large next to a
    // client connection.
    handshake: Box<PeerHandshake>,
    established: Option<NodeId>,
    /// The slot this node dialed (outbound connections).
    dialed: Option<u8>,
    /// Frame keys, once established: every frame is sealed and verified.
    session: Option<Box<PeerSession>>,
    /// When the last authenticated frame arrived (the establishment at
    /// first).
    last_frame_at: Instant,
    /// When a frame was last queued on it (keepalives go out when idle).
    last_sealed_at: Instant,
    /// Since when output has waited to be taken or written (`None`:
    /// everything queued was reported written).
    output_pending_since: Option<Instant>,
}

#[derive(Debug)]
enum ConnKind {
    Client(ClientConn),
    Peer(PeerConn),
}

#[derive(Debug)]
struct Conn {
    kind: ConnKind,
    /// Bytes for the driver (replies or Raft messages), and which grants
    /// they carry (client connections only).
    out: Outbound,
    /// Where an accepted connection comes from (`None`: dialed by us).
    source: Option<IpAddr>,
    /// Why the node closes it, once it decided to.
    close_reason: Option<CloseReason>,
}

/// Per-slot dialing state.
#[derive(Clone, Copy, Debug, Default)]
struct DialState {
    /// A connection (dialing, handshaking or established) exists.
    connected: bool,
    /// The driver was asked to dial and has not answered yet.
    dialing: bool,
    /// Not before this instant.
    next_attempt: Instant,
    backoff: Duration,
}

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
}

/// One node of a Ticketing cluster.
#[derive(Debug)]
pub struct ClusterNode {
    config: ClusterConfig,
    raft: Raft,
    state: ReplicatedLocks,
    /// Index of the last entry applied to `state`.
    applied_index: u64,
    pending: BTreeMap<u64, Pending>,
    leadership: Option<Leadership>,
    /// The leader's slot as last told to clients.
    announced_leader: u8,
    /// Ordered so that every iteration (leader notices, shutdown) is
    /// deterministic: a simulator run must be a pure function of its seed.
    conns: BTreeMap<ConnId, Conn>,
    next_conn_id: u64,
    next_waiter_seq: u64,
    wakes: WakeQueue,
    handshake_deadlines: HandshakeDeadlines,
    /// Unfinished client handshakes and their sources.
    client_handshakes: HandshakeBudget,
    /// Unfinished accepted peer handshakes and their sources.
    peer_handshakes: HandshakeBudget,
    /// Client connections past their handshake.
    client_sessions: usize,
    /// Of those, the ones that speak the line dialect.
    line_sessions: usize,
    /// Peer connections that this node dialed or that authenticated.
    known_peer_conns: usize,
    /// What the driver should log.
    reports: Reports,
    dials: Vec<DialState>,
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
    /// Leader, voter and generation changes for the driver (bounded).
    events: NodeEvents,
}

/// A force-release that revoked `revoked` on `keys`, waiting to name the
/// token its hand-over got.
#[derive(Debug)]
struct Handover {
    id: AdminRequestId,
    revoked: u64,
    keys: Vec<Key>,
}

/// Most answers to force-releases queued for the driver; it drains them
/// after every input, so the bound is only reached by a driver that does
/// not (answers beyond it are dropped and counted).
pub const MAX_ADMIN_REPLIES: usize = 1_024;

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
}

/// Records since when `conn`'s output has been waiting (peer connections).
fn note_output(now: Instant, conn: &mut Conn) {
    let drained = conn.out.is_drained();
    if let ConnKind::Peer(peer) = &mut conn.kind {
        if drained {
            peer.output_pending_since = None;
        } else if peer.output_pending_since.is_none() {
            peer.output_pending_since = Some(now);
        }
    }
}

/// A keepalive frame: addressed to a generation no node has.
fn is_keepalive(msg: &Message) -> bool {
    msg.to.generation == KEEPALIVE_GENERATION && msg.body == MessageBody::HeartbeatResponse
}

/// Where a bootstrap member stands in checking that the cluster is new (see
/// [`ClusterNode::bootstrap`]).
#[derive(Debug)]
enum GenesisCheck {
    /// Nothing to check: a joining node, or a bootstrap member that saw a
    /// majority with bootstrap-only logs.
    Done,
    /// Still checking; peer messages are observed, not stepped.
    Pending {
        /// Slots seen with a log holding only the bootstrap entry.
        empty_logs: BTreeSet<u8>,
        /// The generation to join under if the cluster is already running.
        rejoin_generation: u64,
        /// Raft's seed, reused for the joining Raft.
        seed: u64,
    },
}

/// What one peer message says about whether the cluster is new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GenesisEvidence {
    /// The sender's log holds only the bootstrap entry.
    BootstrapLog,
    /// A leader exists or existed: the cluster is running.
    Running,
    /// Nothing either way.
    Nothing,
}

/// Index of the bootstrap configuration entry every bootstrap log starts
/// with; an entry after it was appended by a leader.
const BOOTSTRAP_INDEX: u64 = 1;

fn genesis_evidence(body: &MessageBody) -> GenesisEvidence {
    match body {
        MessageBody::PreVote { last_index, .. } | MessageBody::Vote { last_index, .. } => {
            if *last_index <= BOOTSTRAP_INDEX {
                GenesisEvidence::BootstrapLog
            } else {
                GenesisEvidence::Running
            }
        }
        // Only sent to a pre-candidate, and granted only when the granter's
        // log is no longer than ours: bootstrap-only.
        MessageBody::PreVoteResponse { reject: false } => GenesisEvidence::BootstrapLog,
        MessageBody::Append { .. }
        | MessageBody::Heartbeat { .. }
        | MessageBody::InstallSnapshot { .. } => GenesisEvidence::Running,
        _ => GenesisEvidence::Nothing,
    }
}

/// "Not the leader, no effect": `M` with the known leader, else no leader.
fn leader_reply(leader: Option<NodeId>) -> Answer {
    Answer::NotLeader(leader.map(|leader| leader.slot))
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
        let dials = (0..config.slot_count)
            .map(|_| DialState {
                next_attempt: now,
                backoff: config.dial_backoff_min,
                ..DialState::default()
            })
            .collect();
        ClusterNode {
            events: NodeEvents::new(raft.is_voter()),
            raft,
            state: ReplicatedLocks::new(),
            applied_index: 0,
            pending: BTreeMap::new(),
            leadership: None,
            announced_leader: NO_LEADER_SLOT,
            conns: BTreeMap::new(),
            next_conn_id: 1,
            next_waiter_seq: 1,
            wakes: WakeQueue::default(),
            handshake_deadlines: HandshakeDeadlines::default(),
            client_handshakes: HandshakeBudget::new(
                config.budget.max_handshakes,
                config.budget.max_handshakes_per_source,
            ),
            peer_handshakes: HandshakeBudget::new(
                config.budget.max_peer_handshakes,
                config.budget.max_peer_handshakes_per_source,
            ),
            client_sessions: 0,
            line_sessions: 0,
            known_peer_conns: 0,
            reports: Reports::new(config.budget.report_interval),
            dials,
            shutting_down: false,
            bad_snapshots: 0,
            refused_peer_frames: 0,
            last_refused_peer_frame: None,
            genesis: GenesisCheck::Done,
            peer_token_floor_max: 0,
            config,
            reserve: TokenReserve::unlimited(),
            replies: ReplyCounts::default(),
            admin_replies: VecDeque::new(),
            handover_wanted: Vec::new(),
            handovers: BTreeMap::new(),
            counts: NodeCounts::default(),
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

    /// A reserve value the driver must store durably now (then answer
    /// [`ClusterNode::handle_reserve_persisted`] or
    /// [`ClusterNode::handle_reserve_failed`]). Drain after every input.
    pub fn poll_reserve(&mut self, now: Instant) -> Option<u64> {
        let bound = self.next_grant_token_bound();
        self.reserve.poll_persist(now, bound)
    }

    /// `value` is durable; queue heads held back by the reserve are served.
    pub fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        if self.reserve.handle_persisted(value) {
            if let Some(leadership) = self.leadership.as_mut() {
                let stalled = std::mem::take(&mut leadership.reserve_stalled);
                leadership.dirty.extend(stalled);
            }
            self.pump(now);
        }
    }

    /// The write asked for by [`ClusterNode::poll_reserve`] failed; it is
    /// asked for again later ([`ClusterNode::poll_timeout`] says when).
    pub fn handle_reserve_failed(&mut self, now: Instant) {
        self.reserve.handle_persist_failed(now);
    }

    /// The next token alert for the operator (the driver logs it at
    /// `error`).
    pub fn poll_alert(&mut self) -> Option<TokenAlert> {
        self.reserve.poll_alert()
    }

    // ------------------------------------------------------------------
    // Operations: inspection and force-release
    // ------------------------------------------------------------------

    /// The admin address configured for `slot`
    /// ([`ClusterConfig::admin_addresses`]).
    pub fn admin_address(&self, slot: u8) -> Option<&str> {
        self.config
            .admin_addresses
            .get(usize::from(slot))
            .map(|a| &**a)
    }

    /// Why this node does not answer inspection or order force-releases
    /// itself (`None`: it does): it is not the leader (the answer names the
    /// leader's slot and admin address when known, so the admin layer can
    /// redirect), or it leads but has not applied its own term's no-op yet
    /// (its view may miss grants its predecessor committed; it answers like
    /// a node with no known leader until then).
    pub fn not_leader(&self) -> Option<NotLeader> {
        match &self.leadership {
            Some(leadership) if leadership.caught_up && self.raft.is_leader() => None,
            Some(_) => Some(NotLeader {
                leader_slot: None,
                leader_admin: None,
            }),
            None => {
                let leader_slot = self
                    .raft
                    .leader()
                    .map(|l| l.slot)
                    .filter(|&slot| slot != self.config.id.slot);
                Some(NotLeader {
                    leader_slot,
                    leader_admin: leader_slot
                        .and_then(|slot| self.admin_address(slot))
                        .map(Box::from),
                })
            }
        }
    }

    /// `conn` as an operator sees it, while it is an open client
    /// connection.
    fn conn_view(&self, conn_id: ConnId) -> Option<ConnView> {
        let conn = self.conns.get(&conn_id)?;
        let ConnKind::Client(client) = &conn.kind else {
            return None;
        };
        if conn.out.is_closing() {
            return None;
        }
        Some(ConnView {
            conn: conn_id,
            source: conn.source?,
            dialect: client.front.dialect()?,
        })
    }

    /// `key` as the leader sees it at `now`: the holder from the applied
    /// state (ages on this node's clock, which started the lease when it
    /// applied the grant; the connection when this leader delivered the
    /// grant to one it still has), and the waiters of its leader-local
    /// queue in FIFO order. `Ok(None)` when nobody holds or waits for it;
    /// `Err` on a node that is not a caught-up leader.
    pub fn lock(&self, now: Instant, key: &Key) -> Result<Option<LockView>, NotLeader> {
        if let Some(not_leader) = self.not_leader() {
            return Err(not_leader);
        }
        Ok(self.lock_view(now, key, MAX_LISTED_WAITERS))
    }

    /// `key` with at most `max_waiters` of its waiters listed.
    fn lock_view(&self, now: Instant, key: &Key, max_waiters: usize) -> Option<LockView> {
        let leadership = self.leadership.as_ref()?;
        let ms = |d: Duration| crate::time::duration_micros(d) / 1_000;
        let holder = self.state.holder(key).map(|(token, holding)| HolderView {
            token,
            keys: holding.keys.keys().to_vec(),
            held_ms: ms(now.saturating_duration_since(holding.granted_at)),
            lease_remaining_ms: ms(holding.deadline.saturating_duration_since(now)),
            conn: leadership
                .held_keys
                .conn_of(token)
                .and_then(|conn| self.conn_view(conn)),
        });
        let queue = leadership.queues.get(key);
        let waiters: Vec<WaiterView> = queue
            .into_iter()
            .flatten()
            .filter_map(|seq| leadership.waiters.get(seq))
            .take(max_waiters)
            .map(|waiter| WaiterView {
                keys: waiter.keys.keys().to_vec(),
                waited_ms: ms(now.saturating_duration_since(waiter.received)),
                wait_remaining_ms: ms(waiter.deadline.saturating_duration_since(now)),
                conn: self.conn_view(waiter.conn),
            })
            .collect();
        if holder.is_none() && waiters.is_empty() {
            return None;
        }
        Some(LockView {
            key: key.clone(),
            holder,
            waiters,
            waiters_total: queue.map_or(0, VecDeque::len),
        })
    }

    /// Every key starting with `prefix` that is held or waited for, in
    /// ascending key order, at most `limit` (capped at
    /// [`MAX_LISTING_LIMIT`]) of them, each with the front
    /// [`MAX_WAITERS_PER_LISTED_LOCK`] of its waiters; see
    /// [`ClusterNode::lock`]. Costs the
    /// listed held keys plus one pass over the keys with waiters (bounded
    /// by the waiter limit).
    pub fn locks(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
    ) -> Result<LockListing, NotLeader> {
        if let Some(not_leader) = self.not_leader() {
            return Err(not_leader);
        }
        let limit = limit.min(MAX_LISTING_LIMIT);
        let Some(leadership) = self.leadership.as_ref() else {
            return Ok(LockListing {
                locks: Vec::new(),
                truncated: false,
            });
        };
        // One more than the limit tells whether the listing is truncated.
        let mut keys: BTreeSet<&Key> = self
            .state
            .held_keys_with_prefix(prefix)
            .take(limit.saturating_add(1))
            .collect();
        keys.extend(
            leadership
                .queues
                .iter()
                .filter(|(key, queue)| !queue.is_empty() && key.as_bytes().starts_with(prefix))
                .map(|(key, _)| key),
        );
        let truncated = keys.len() > limit;
        let locks = keys
            .into_iter()
            .take(limit)
            .filter_map(|key| self.lock_view(now, key, MAX_WAITERS_PER_LISTED_LOCK))
            .collect();
        Ok(LockListing { locks, truncated })
    }

    /// An operator's force-release, named `id` by the driver. Only a leader
    /// orders it: it proposes [`Command::ForceRelease`], and the answer
    /// ([`ClusterNode::poll_admin_reply`]) comes once the entry is applied,
    /// so nothing takes effect before a majority has it. At apply the
    /// grant holding the key is removed whole, exactly as its holder's
    /// release would remove it, and its keys go to their front waiters
    /// under new, larger tokens; the old holder's later release gets `N`.
    /// A non-leader answers [`ForceReleaseOutcome::NotLeader`] at once; a
    /// leader that loses its leadership before it saw the entry applied
    /// answers [`ForceReleaseOutcome::Indeterminate`].
    pub fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.handle_timeout(now);
        if self.shutting_down || self.leadership.is_none() || !self.raft.is_leader() {
            let leader_slot = self
                .raft
                .leader()
                .map(|l| l.slot)
                .filter(|&slot| slot != self.config.id.slot);
            self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            return;
        }
        let keys = self
            .state
            .holder(&req.key)
            .map_or_else(|| vec![req.key.clone()], |(_, h)| h.keys.keys().to_vec());
        let command = Command::ForceRelease {
            key: req.key,
            token: req.token,
        };
        match self.raft.propose(now, command.to_bytes()) {
            Ok((index, term)) => {
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::ForceRelease { id, keys },
                    },
                );
            }
            Err(ProposeError::Backpressure) => {
                self.admin_reply(id, ForceReleaseOutcome::Busy);
            }
            Err(ProposeError::NotLeader { leader_hint }) => {
                let leader_slot = leader_hint.map(|l| l.slot);
                self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            }
            Err(_) => self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot: None }),
        }
        self.pump(now);
    }

    /// The next answer to a force-release. Drain after every input, like
    /// the wakes.
    pub fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        self.admin_replies.pop_front()
    }

    // ------------------------------------------------------------------
    // Queries
    // ------------------------------------------------------------------

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
            waiters: self.leadership.as_ref().map_or(0, |l| l.waiters.len()),
            reserve: self.reserve.stats(),
            ..ClusterStats::default()
        };
        for conn in self.conns.values() {
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
            ..super::metrics::cluster_metrics(
                &self.raft,
                &self.state,
                self.applied_index,
                self.replies,
                self.reports.totals(),
                self.checking_genesis(),
                (stats.waiters, self.client_sessions, self.line_sessions),
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

    /// True once [`ClusterNode::begin_shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    // ------------------------------------------------------------------
    // Connections
    // ------------------------------------------------------------------

    fn new_conn(
        &mut self,
        kind: ConnKind,
        hello: &[u8],
        deadline: Instant,
        source: Option<IpAddr>,
    ) -> ConnId {
        let conn_id = ConnId(self.next_conn_id);
        self.next_conn_id += 1;
        let mut conn = Conn {
            kind,
            out: Outbound::new(hello.to_vec()),
            source,
            close_reason: None,
        };
        self.wakes.wake(conn_id, &mut conn.out);
        self.conns.insert(conn_id, conn);
        self.handshake_deadlines.push(deadline, conn_id);
        conn_id
    }

    /// Counts a new connection from `source` in `peers`' handshake budget
    /// (or the clients'), closing the unfinished handshake it displaces.
    fn admit_handshake(&mut self, now: Instant, peers: bool, conn_id: ConnId, source: IpAddr) {
        let budget = if peers {
            &mut self.peer_handshakes
        } else {
            &mut self.client_handshakes
        };
        if let Some(evicted) = budget.admit(conn_id, source) {
            let old_source = self.conns.get(&evicted).and_then(|c| c.source);
            self.reports
                .abuse(now, old_source, AbuseKind::HandshakeEvicted);
            self.close_conn(evicted, CloseReason::HandshakeEvicted);
        }
    }

    /// A client connection from `source` was accepted. `nonce` must be
    /// fresh CSPRNG bytes. `None`: refuse it (every session slot taken or
    /// shutting down). Otherwise it joins the client handshake budget,
    /// which may drop an older unfinished handshake (never this one).
    pub fn handle_connect(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.handle_timeout(now);
        if self.shutting_down || self.client_sessions >= self.config.max_connections {
            self.reports.abuse(now, Some(source), AbuseKind::Refused);
            return None;
        }
        let hello = Hello {
            mode: WireMode::Cluster,
            self_slot: self.config.id.slot,
            nonce,
        };
        let deadline = now.saturating_add(self.config.handshake_timeout);
        let front = ClientFront::new(hello, self.config.fingerprint, deadline);
        let hello_bytes = front.hello_bytes();
        let kind = ConnKind::Client(ClientConn {
            front,
            in_flight: 0,
            queued: BTreeSet::new(),
            release_misses_in_row: 0,
        });
        let conn_id = ConnId(self.next_conn_id);
        self.admit_handshake(now, false, conn_id, source);
        Some(self.new_conn(kind, &hello_bytes, deadline, Some(source)))
    }

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
    pub fn handle_peer_accept(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.handle_timeout(now);
        // Each slot needs at most two connections (one each way); the bound
        // keeps authenticated and dialed connections from growing state.
        // Unauthenticated accepted ones are bounded by their own budget.
        if self.known_peer_conns >= 4 * usize::from(self.config.slot_count) {
            self.reports.abuse(now, Some(source), AbuseKind::Refused);
            return None;
        }
        let conn_id = ConnId(self.next_conn_id);
        self.admit_handshake(now, true, conn_id, source);
        Some(self.new_peer_conn(now, nonce, None, Some(source)))
    }

    /// The next peer slot the driver should dial (its configured peer
    /// address). Answer with [`ClusterNode::handle_peer_connected`] or
    /// [`ClusterNode::handle_dial_failed`].
    pub fn poll_dial(&mut self, now: Instant) -> Option<u8> {
        for slot in 0..self.config.slot_count {
            let dial = &mut self.dials[usize::from(slot)];
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

    /// The dial of `slot` succeeded: the transport is up. `nonce` must be
    /// fresh CSPRNG bytes.
    pub fn handle_peer_connected(
        &mut self,
        now: Instant,
        slot: u8,
        nonce: [u8; NONCE_LEN],
    ) -> ConnId {
        if let Some(dial) = self.dials.get_mut(usize::from(slot)) {
            dial.dialing = false;
            dial.connected = true;
        }
        self.known_peer_conns += 1;
        self.new_peer_conn(now, nonce, Some(slot), None)
    }

    /// The dial of `slot` failed: retry after a backoff.
    pub fn handle_dial_failed(&mut self, now: Instant, slot: u8) {
        self.back_off(now, slot);
    }

    fn back_off(&mut self, now: Instant, slot: u8) {
        let (min, max) = (self.config.dial_backoff_min, self.config.dial_backoff_max);
        if let Some(dial) = self.dials.get_mut(usize::from(slot)) {
            dial.dialing = false;
            dial.connected = false;
            dial.next_attempt = now.saturating_add(dial.backoff);
            dial.backoff = (dial.backoff * 2).clamp(min, max);
        }
    }

    /// Bytes received on `conn` (client or peer).
    pub fn handle_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        self.handle_timeout(now);
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.out.is_closing() {
            return;
        }
        match conn.kind {
            ConnKind::Client(_) => self.client_input(now, conn_id, bytes),
            ConnKind::Peer(_) => self.peer_input(now, conn_id, bytes),
        }
        self.pump(now);
    }

    fn client_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        let leader_slot = self.announced_leader;
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let ConnKind::Client(client) = &mut conn.kind else {
            return;
        };
        let input = client.front.handle_input(
            now,
            &self.config.client_tokens,
            bytes,
            conn.out.buffer_mut(),
        );
        match input {
            FrontInput::Pending => return,
            FrontInput::Session => {}
            FrontInput::Accepted(dialect) => {
                self.client_handshakes.finish(conn_id);
                if self.client_sessions >= self.config.max_connections {
                    self.reports.abuse(now, conn.source, AbuseKind::Refused);
                    self.close_conn(conn_id, CloseReason::SessionLimit);
                    return;
                }
                self.client_sessions += 1;
                if dialect == Dialect::Line {
                    self.line_sessions += 1;
                }
                client.front.begin_session(conn.out.buffer_mut());
                // Clients route by the leader notice; send it at once.
                client.front.leader_notice(
                    leader_slot,
                    &self.config.client_addresses,
                    conn.out.buffer_mut(),
                );
                self.wakes.wake(conn_id, &mut conn.out);
            }
            FrontInput::Rejected(_) => {
                self.reports.abuse(now, conn.source, AbuseKind::FailedProof);
                match client.front.auth_failed_at() {
                    // The line dialect answers a failed handshake late.
                    Some(at) => self.handshake_deadlines.push(at, conn_id),
                    None => self.close_conn(conn_id, CloseReason::ProofRejected),
                }
                return;
            }
        }
        loop {
            // A request may have closed the connection: read no further.
            let Some(conn) = self.conns.get_mut(&conn_id).filter(|c| !c.out.is_closing()) else {
                return;
            };
            let ConnKind::Client(client) = &mut conn.kind else {
                return;
            };
            let next = client
                .front
                .next_request(conn.out.buffer_mut(), &mut self.replies);
            if !conn.out.pending().is_empty() {
                self.wakes.wake(conn_id, &mut conn.out);
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
    fn answer(&mut self, conn_id: ConnId, to: &ReplyTo, answer: Answer) {
        let Some(Conn {
            kind: ConnKind::Client(client),
            out,
            ..
        }) = self.conns.get_mut(&conn_id)
        else {
            return;
        };
        client.in_flight = client.in_flight.saturating_sub(1);
        if out.is_closing() {
            return;
        }
        self.replies.count(&to.counted_as(answer));
        match to.encode(answer, &self.config.client_addresses, out.buffer_mut()) {
            Delivery::Queued => self.wakes.wake(conn_id, out),
            Delivery::Close => self.close_conn(conn_id, CloseReason::OutcomeUnknown),
        }
    }

    fn peer_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        let Some(Conn {
            kind: ConnKind::Peer(peer),
            out,
            source,
            ..
        }) = self.conns.get_mut(&conn_id)
        else {
            return;
        };
        let source = *source;
        let mut rest = bytes;
        if peer.established.is_none() {
            let (used, status) = peer.handshake.handle_input(&self.config.peer_tokens, rest);
            rest = &rest[used..];
            out.buffer_mut()
                .extend_from_slice(&peer.handshake.take_outbound());
            match status {
                PeerHandshakeStatus::NeedMore => {
                    if let Some(conn) = self.conns.get_mut(&conn_id) {
                        self.wakes.wake(conn_id, &mut conn.out);
                    }
                    return;
                }
                PeerHandshakeStatus::Rejected(_) => {
                    self.reports
                        .abuse(now, source, AbuseKind::FailedPeerHandshake);
                    self.close_conn(conn_id, CloseReason::PeerHandshakeFailed);
                    return;
                }
                PeerHandshakeStatus::Established(remote) => {
                    self.peer_handshakes.finish(conn_id);
                    if peer.dialed.is_none() {
                        self.known_peer_conns += 1;
                    }
                    peer.established = Some(remote);
                    peer.session = peer.handshake.take_session().map(Box::new);
                    peer.last_frame_at = now;
                    peer.last_sealed_at = now;
                    // The handshake refused floors at or above 2^63.
                    if let Some(hello) = peer.handshake.peer_hello() {
                        self.peer_token_floor_max =
                            self.peer_token_floor_max.max(hello.token_floor);
                    }
                    if let Some(conn) = self.conns.get_mut(&conn_id) {
                        self.wakes.wake(conn_id, &mut conn.out);
                    }
                    if let Some(dial) = self.dials.get_mut(usize::from(remote.slot)) {
                        dial.connected = true;
                        dial.backoff = self.config.dial_backoff_min;
                    }
                    self.maybe_add_learner(now, remote);
                }
            }
        }
        let Some(Conn {
            kind: ConnKind::Peer(peer),
            ..
        }) = self.conns.get_mut(&conn_id)
        else {
            return;
        };
        let (Some(remote), Some(session)) = (peer.established, peer.session.as_mut()) else {
            return;
        };
        let decoder = &mut session.decoder;
        decoder.push(rest);
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

    /// Steps `msg` into Raft, unless this bootstrap member is still checking
    /// that the cluster is new (see [`ClusterNode::bootstrap`]).
    fn step_peer_message(&mut self, now: Instant, msg: Message) {
        let GenesisCheck::Pending {
            empty_logs,
            rejoin_generation,
            seed,
        } = &mut self.genesis
        else {
            self.raft.step(now, msg);
            return;
        };
        match genesis_evidence(&msg.body) {
            GenesisEvidence::Running => {
                let (generation, seed) = (*rejoin_generation, *seed);
                self.rejoin(now, generation, seed);
            }
            GenesisEvidence::BootstrapLog => {
                empty_logs.insert(msg.from.slot);
                // This node's own log is bootstrap-only too.
                if 2 * (empty_logs.len() + 1) > usize::from(self.config.slot_count) {
                    self.genesis = GenesisCheck::Done;
                    self.raft.step(now, msg);
                } else if matches!(msg.body, MessageBody::PreVote { .. }) {
                    // Answering a pre-vote changes no term and casts no
                    // vote, so it is safe while checking; and the answer is
                    // what lets the asker count this node and finish its
                    // own check (otherwise the first pre-candidate of a
                    // five-node cluster, heard by nobody, would end up
                    // joining as a new generation).
                    self.raft.step(now, msg);
                }
            }
            GenesisEvidence::Nothing => {}
        }
    }

    /// Becomes the new generation `generation` of this slot, joining the
    /// running cluster: a fresh joining Raft and empty replicated state;
    /// client connections stay, peer connections (whose handshakes named
    /// the old generation) are closed and dialed again.
    fn rejoin(&mut self, now: Instant, generation: u64, seed: u64) {
        let mut config = self.config.clone();
        config.id = NodeId::new(config.id.slot, generation);
        let mut fresh = ClusterNode::join(config, seed, now);
        fresh.conns = std::mem::take(&mut self.conns);
        fresh.next_conn_id = self.next_conn_id;
        fresh.next_waiter_seq = self.next_waiter_seq;
        fresh.wakes = std::mem::take(&mut self.wakes);
        fresh.handshake_deadlines = std::mem::take(&mut self.handshake_deadlines);
        fresh.client_handshakes =
            std::mem::replace(&mut self.client_handshakes, HandshakeBudget::new(0, 0));
        fresh.peer_handshakes =
            std::mem::replace(&mut self.peer_handshakes, HandshakeBudget::new(0, 0));
        fresh.client_sessions = self.client_sessions;
        fresh.line_sessions = self.line_sessions;
        fresh.replies = self.replies;
        fresh.counts = std::mem::take(&mut self.counts);
        fresh.admin_replies = std::mem::take(&mut self.admin_replies);
        fresh.known_peer_conns = self.known_peer_conns;
        fresh.reports = std::mem::replace(&mut self.reports, Reports::new(Duration::ZERO));
        fresh.dials = std::mem::take(&mut self.dials);
        fresh.shutting_down = self.shutting_down;
        fresh.peer_token_floor_max = self.peer_token_floor_max;
        fresh.reserve = std::mem::take(&mut self.reserve);
        fresh.events = std::mem::replace(&mut self.events, NodeEvents::new(false));
        *self = fresh;
        self.events
            .push(NodeEvent::GenerationChanged { generation });
        self.note_role();
        let peers: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, conn)| matches!(conn.kind, ConnKind::Peer(_)))
            .map(|(id, _)| *id)
            .collect();
        for conn_id in peers {
            self.close_conn(conn_id, CloseReason::Rejoin);
        }
    }

    /// Whether this node was started as a bootstrap member and is still
    /// checking that the cluster is new (it steps no peer message yet).
    pub fn checking_genesis(&self) -> bool {
        matches!(self.genesis, GenesisCheck::Pending { .. })
    }

    /// On the leader: a handshake showed a generation of a slot that the
    /// configuration does not know and that is newer than its members →
    /// add it as a learner (Raft's auto-membership replaces the old one).
    fn maybe_add_learner(&mut self, now: Instant, remote: NodeId) {
        if !self.raft.is_leader() || self.raft.conf_change_pending() {
            return;
        }
        let config = self.raft.config();
        if config.contains(remote)
            || config
                .members()
                .any(|m| m.slot == remote.slot && m.generation >= remote.generation)
        {
            return;
        }
        // Refusals (a change in flight, the term's first commit not yet
        // made) are retried on the next handshake or timer tick.
        let _ = self
            .raft
            .propose_conf_change(now, ConfChange::AddLearner(remote));
    }

    /// The node gives up on `conn`: nothing more is read, what is queued
    /// is flushed, then the driver closes it.
    fn close_conn(&mut self, conn_id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.close_reason.get_or_insert(reason);
        match conn.kind {
            ConnKind::Client(_) => self.client_handshakes.finish(conn_id),
            ConnKind::Peer(_) => self.peer_handshakes.finish(conn_id),
        }
        self.wakes.close_after_flush(conn_id, &mut conn.out);
        let queued: Vec<u64> = match &mut conn.kind {
            ConnKind::Client(client) => std::mem::take(&mut client.queued).into_iter().collect(),
            ConnKind::Peer(_) => Vec::new(),
        };
        // Queued waiters leave their queues now; nobody will read a grant.
        for seq in queued {
            self.remove_waiter(seq);
        }
    }

    /// The next `bytes` of what [`ClusterNode::take_transmit`] gave for
    /// `conn` were handed to the transport (a short write reports its part).
    /// A grant whose reply frame is written whole counts as delivered: the
    /// client may have its token, so it is never released as a ghost.
    pub fn handle_written(&mut self, now: Instant, conn_id: ConnId, bytes: usize) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.out.handle_written(bytes);
            note_output(now, conn);
        }
    }

    /// Everything taken from `conn` so far has been written: grants in it
    /// count as delivered.
    pub fn handle_flushed(&mut self, now: Instant, conn_id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.out.handle_flushed();
            note_output(now, conn);
        }
    }

    /// The transport of `conn` is gone. A client's queued waiters are
    /// dropped and grants not yet flushed to it are released at once
    /// (proposed as `Release` — only possible while this node leads; a
    /// former leader leaves them to lease expiry). A peer slot is redialed
    /// after a backoff.
    pub fn handle_closed(&mut self, now: Instant, conn_id: ConnId) {
        self.handle_timeout(now);
        self.close_conn(conn_id, CloseReason::TransportClosed);
        let Some(conn) = self.conns.remove(&conn_id) else {
            return;
        };
        let reason = conn.close_reason.unwrap_or(CloseReason::TransportClosed);
        self.reports.closed(conn_id, conn.source, reason);
        match conn.kind {
            ConnKind::Client(client) => {
                if client.front.in_session() {
                    self.client_sessions -= 1;
                    if client.front.dialect() == Some(Dialect::Line) {
                        self.line_sessions -= 1;
                    }
                }
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
                    self.known_peer_conns -= 1;
                }
                let slot = peer.established.map(|id| id.slot).or(peer.dialed);
                if let Some(slot) = slot {
                    let still_connected = self.conns.values().any(|c| match &c.kind {
                        ConnKind::Peer(p) => {
                            p.established.map(|id| id.slot).or(p.dialed) == Some(slot)
                        }
                        ConnKind::Client(_) => false,
                    });
                    if !still_connected {
                        self.back_off(now, slot);
                    }
                }
            }
        }
        self.pump(now);
    }

    // ------------------------------------------------------------------
    // Requests
    // ------------------------------------------------------------------

    fn not_serving_reply(&self) -> Option<Answer> {
        if self.shutting_down || !self.raft.is_voter() {
            return Some(Answer::NotActive);
        }
        if !self.raft.is_leader() {
            return Some(leader_reply(self.raft.leader()));
        }
        None
    }

    fn handle_request(&mut self, now: Instant, conn_id: ConnId, request: ClientRequest) {
        if let Some(answer) = self.not_serving_reply() {
            self.answer(conn_id, request.reply_to(), answer);
            return;
        }
        let Some(leadership) = self.leadership.as_mut() else {
            self.answer(conn_id, request.reply_to(), leader_reply(None));
            return;
        };
        if !leadership.caught_up {
            if leadership.held.len() >= self.config.limits.max_waiters_total {
                let answer = if request.is_acquire() {
                    self.counts.busy.max_waiters_total += 1;
                    Answer::Busy
                } else {
                    // `B` may not answer a release.
                    leader_reply(None)
                };
                self.answer(conn_id, request.reply_to(), answer);
            } else {
                leadership.held.push_back((conn_id, request, now));
            }
            return;
        }
        self.serve_request(now, conn_id, request, now);
    }

    fn serve_request(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        request: ClientRequest,
        received: Instant,
    ) {
        match request {
            ClientRequest::Acquire {
                wait_s,
                lease_s,
                keys,
                reply_to,
            } => self.handle_acquire(now, conn_id, (wait_s, lease_s, keys, reply_to), received),
            ClientRequest::Release {
                token,
                keys,
                reply_to,
            } => self.handle_release(now, conn_id, token, keys, reply_to),
        }
    }

    fn handle_release(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        token: u64,
        keys: KeyGroup,
        reply_to: ReplyTo,
    ) {
        if reply_to.is_unissued_line_release(token, self.state.next_token()) {
            let source = self.conns.get(&conn_id).and_then(|conn| conn.source);
            self.reports
                .abuse(now, source, AbuseKind::TokenFromTheFuture);
        }
        let command = Command::Release { keys, token };
        match self.raft.propose(now, command.to_bytes()) {
            Ok((index, term)) => {
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Release {
                            conn: conn_id,
                            reply_to,
                        },
                    },
                );
            }
            // `B` may not answer a release; every refusal had no effect.
            Err(ProposeError::NotLeader { leader_hint }) => {
                self.answer(conn_id, &reply_to, leader_reply(leader_hint));
            }
            Err(_) => self.answer(conn_id, &reply_to, leader_reply(None)),
        }
    }

    fn handle_acquire(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        acquire: (u8, u8, KeyGroup, ReplyTo),
        received: Instant,
    ) {
        let (wait_s, lease_s, keys, reply_to) = acquire;
        let limits = self.config.limits;
        let over_in_flight = match self.conns.get(&conn_id) {
            Some(Conn {
                kind: ConnKind::Client(client),
                ..
            }) => client.in_flight > self.config.max_in_flight_per_connection,
            _ => return,
        };
        let over_held = match self.leadership.as_mut() {
            Some(leadership) => {
                leadership.held_keys.expire(now);
                leadership
                    .held_keys
                    .held(conn_id)
                    .saturating_add(keys.len())
                    > self.config.budget.max_held_per_connection
            }
            None => false,
        };
        let Some(leadership) = self.leadership.as_ref() else {
            self.answer(conn_id, &reply_to, leader_reply(self.raft.leader()));
            return;
        };
        let free = keys.keys().iter().all(|k| {
            !self.state.is_held(k)
                && !leadership.reserved.contains(k)
                && leadership.queues.get(k).is_none_or(VecDeque::is_empty)
        });
        let waiter = Waiter {
            conn: conn_id,
            reply_to,
            keys,
            lease_ms: u32::from(lease_s) * 1_000,
            deadline: queue_rule::wait_deadline(
                received,
                Duration::from_secs(u64::from(wait_s)),
                self.config.wait_margin,
            ),
            received,
        };
        if over_in_flight || over_held {
            self.counts.busy_per_connection += 1;
            self.answer(conn_id, &waiter.reply_to, Answer::Busy);
            return;
        }
        if free {
            let new_keys = waiter.keys.len();
            let bound = self.next_grant_token_bound();
            if !self.reserve.covers(bound) {
                self.reserve.note_exhausted(bound);
                self.counts.busy.token_reserve += 1;
                self.answer(conn_id, &waiter.reply_to, Answer::Busy);
                return;
            }
            if self.state.held_keys() + new_keys > limits.max_keys {
                self.counts.busy.max_keys += 1;
                self.answer(conn_id, &waiter.reply_to, Answer::Busy);
                return;
            }
            self.propose_grant(now, waiter);
            return;
        }
        if wait_s == 0 || waiter.deadline <= now {
            self.answer(conn_id, &waiter.reply_to, Answer::TimedOut);
            return;
        }
        let over_total = leadership.waiters.len() >= limits.max_waiters_total;
        let over_per_key = waiter.keys.keys().iter().any(|k| {
            leadership.queues.get(k).map_or(0, VecDeque::len) >= limits.max_waiters_per_key
        });
        if over_total || over_per_key {
            if over_total {
                self.counts.busy.max_waiters_total += 1;
            } else {
                self.counts.busy.max_waiters_per_key += 1;
            }
            self.answer(conn_id, &waiter.reply_to, Answer::Busy);
            return;
        }
        let seq = self.next_waiter_seq;
        self.next_waiter_seq += 1;
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        for key in waiter.keys.keys() {
            leadership
                .queues
                .entry(key.clone())
                .or_default()
                .push_back(seq);
        }
        leadership
            .wait_deadlines
            .push(Reverse((waiter.deadline, seq)));
        leadership.waiters.insert(seq, waiter);
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.get_mut(&conn_id)
        {
            client.queued.insert(seq);
        }
    }

    /// Proposes a Grant for `waiter` (keys free and unreserved); the
    /// entry's index if it was proposed.
    fn propose_grant(&mut self, now: Instant, waiter: Waiter) -> Option<u64> {
        let command = Command::Grant {
            keys: waiter.keys.clone(),
            lease_ms: waiter.lease_ms,
        };
        match self.raft.propose(now, command.to_bytes()) {
            Ok((index, term)) => {
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership
                        .reserved
                        .extend(waiter.keys.keys().iter().cloned());
                }
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Grant(waiter),
                    },
                );
                return Some(index);
            }
            Err(ProposeError::Backpressure) => {
                self.counts.busy_backpressure += 1;
                self.answer(waiter.conn, &waiter.reply_to, Answer::Busy);
            }
            Err(ProposeError::NotLeader { leader_hint }) => {
                self.answer(waiter.conn, &waiter.reply_to, leader_reply(leader_hint));
            }
            Err(_) => self.answer(waiter.conn, &waiter.reply_to, leader_reply(None)),
        }
        None
    }

    /// A force-release's answer without a hand-over token: nobody took
    /// its keys in this pump, or the hand-over's outcome will not be seen.
    fn answer_handover(&mut self, handover: Handover, handed_to: Option<u64>) {
        let Handover { id, revoked, keys } = handover;
        self.admin_reply(
            id,
            ForceReleaseOutcome::Released {
                revoked,
                keys,
                handed_to,
            },
        );
    }

    /// Proposes a command nobody waits for (expiry, ghost release).
    fn propose_internal(&mut self, now: Instant, command: Command) -> bool {
        if !self.raft.is_leader() {
            return false;
        }
        match self.raft.propose(now, command.to_bytes()) {
            Ok((index, term)) => {
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Internal,
                    },
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Removes a queued waiter from the leader's table (no reply).
    fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let leadership = self.leadership.as_mut()?;
        let waiter = leadership.waiters.remove(&seq)?;
        for key in waiter.keys.keys() {
            if let Some(queue) = leadership.queues.get_mut(key) {
                queue.retain(|s| *s != seq);
                if queue.is_empty() {
                    leadership.queues.remove(key);
                } else {
                    leadership.dirty.push(key.clone());
                }
            }
        }
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.get_mut(&waiter.conn)
        {
            client.queued.remove(&seq);
        }
        Some(waiter)
    }

    // ------------------------------------------------------------------
    // Raft outputs
    // ------------------------------------------------------------------

    /// Drains Raft and runs the leader's duties until nothing changes, then
    /// routes outgoing messages.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(committed) = self.raft.poll_committed() {
                progressed = true;
                self.apply(now, committed);
            }
            while let Some(event) = self.raft.poll_event() {
                progressed = true;
                self.handle_event(now, event);
            }
            progressed |= self.leader_duties(now);
            if !progressed {
                break;
            }
        }
        // Force-releases whose keys nobody took now: answered without a
        // hand-over.
        for handover in std::mem::take(&mut self.handover_wanted) {
            self.answer_handover(handover, None);
        }
        // Raft's own event queue is bounded too: the state reached is
        // reported even if an event in between was dropped.
        self.note_role();
        self.events.note_raft_refused(self.raft.refused_messages());
        self.route_messages(now);
    }

    /// Queues a node event for each of leader and voter status that
    /// differs from what was last reported.
    fn note_role(&mut self) {
        self.events
            .note_leader(self.raft.leader(), self.raft.term());
        self.events.note_voter(self.raft.is_voter());
    }

    fn apply(&mut self, now: Instant, committed: Committed) {
        match committed {
            Committed::Snapshot { meta, data } => {
                match self.state.install_snapshot(&data, now) {
                    Ok(()) => {}
                    Err(SnapshotError::CounterBehind { current, snapshot }) => {
                        self.reserve
                            .refused_lowering(TokenAlert::SnapshotCounterBehind {
                                current,
                                snapshot,
                            });
                    }
                    Err(_) => self.bad_snapshots += 1,
                }
                self.applied_index = meta.index;
            }
            Committed::Entry(entry) => {
                self.applied_index = entry.index;
                let command = match &entry.kind {
                    EntryKind::Command(bytes) => Command::decode(bytes),
                    _ => None,
                };
                // The keys of a force-released grant, read before it goes.
                let forced_keys = match &command {
                    Some(Command::ForceRelease { key, .. }) => self
                        .state
                        .holder(key)
                        .map(|(_, holding)| holding.keys.clone()),
                    _ => None,
                };
                let result = match &command {
                    Some(command) => self.state.apply(command, now),
                    None => ApplyResult::Noop,
                };
                if let Some(leadership) = self.leadership.as_mut() {
                    let freed = match (&command, result) {
                        (Some(Command::Release { keys, .. }), ApplyResult::Released)
                        | (
                            Some(Command::Expire { keys, .. }),
                            ApplyResult::Expired { existed: true },
                        ) => Some(keys),
                        (Some(Command::ForceRelease { .. }), ApplyResult::ForceReleased { .. }) => {
                            forced_keys.as_ref()
                        }
                        _ => None,
                    };
                    if let Some(keys) = freed {
                        let waited_for = keys
                            .keys()
                            .iter()
                            .any(|k| leadership.queues.get(k).is_some_and(|q| !q.is_empty()));
                        match (&command, waited_for) {
                            (Some(Command::Expire { .. }), true) => {
                                self.counts.expiries_handed_over += 1;
                            }
                            (Some(Command::Expire { .. }), false) => {
                                self.counts.expiries_not_handed_over += 1;
                            }
                            (
                                Some(Command::Release { .. } | Command::ForceRelease { .. }),
                                true,
                            ) => {
                                self.counts.release_handovers += 1;
                            }
                            _ => {}
                        }
                        // Freed keys go to their queue heads.
                        leadership.dirty.extend(keys.keys().iter().cloned());
                    }
                    if let Some(Command::Expire { token, .. }) = &command {
                        leadership.expiring.remove(token);
                    }
                    match (&command, result) {
                        (Some(Command::Release { token, .. }), ApplyResult::Released)
                        | (Some(Command::Expire { token, .. }), _) => {
                            leadership.held_keys.remove(*token);
                        }
                        (_, ApplyResult::ForceReleased { revoked }) => {
                            leadership.held_keys.remove(revoked);
                        }
                        _ => {}
                    }
                }

                if let (ApplyResult::ForceReleased { revoked }, Some(keys)) = (result, &forced_keys)
                {
                    // Every node that applies it says so: the revoked
                    // holder's later writes are fenced.
                    self.reports
                        .force_released(keys.keys().to_vec(), revoked, None);
                }
                let mut pending = match self.pending.remove(&entry.index) {
                    Some(p) if p.term == entry.term => {
                        let latency = now.saturating_duration_since(p.proposed_at);
                        self.counts.commit_latency.observe(latency);
                        Some(p)
                    }
                    Some(p) => {
                        // Overwritten: that proposal never takes effect.
                        self.answer_unapplied(entry.index, p);
                        None
                    }
                    None => None,
                };
                if let (
                    Some(Pending {
                        kind: PendingKind::ForceRelease { keys, .. },
                        ..
                    }),
                    Some(forced),
                ) = (pending.as_mut(), &forced_keys)
                {
                    // The grant revoked at apply, whatever held when it
                    // was proposed.
                    *keys = forced.keys().to_vec();
                }
                self.after_apply(now, entry.index, pending, result);
                if let Some(leadership) = self.leadership.as_mut()
                    && !leadership.caught_up
                    && self.applied_index >= leadership.first_index
                {
                    leadership.caught_up = true;
                }
            }
        }
    }

    /// A proposal whose entry was replaced by another leader's: no effect.
    fn answer_unapplied(&mut self, index: u64, pending: Pending) {
        if let Some(handover) = self.handovers.remove(&index) {
            // The force-release itself was applied; its hand-over was not.
            self.answer_handover(handover, None);
        }
        let leader = self.raft.leader();
        match pending.kind {
            PendingKind::Grant(w) => self.answer(w.conn, &w.reply_to, leader_reply(leader)),
            PendingKind::Release { conn, reply_to } => {
                self.answer(conn, &reply_to, leader_reply(leader));
            }
            PendingKind::ForceRelease { id, .. } => {
                // Another leader's entry took its place: no effect.
                let leader_slot = leader.map(|l| l.slot);
                self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            }
            PendingKind::Init | PendingKind::Internal => {}
        }
    }

    fn after_apply(
        &mut self,
        now: Instant,
        index: u64,
        pending: Option<Pending>,
        result: ApplyResult,
    ) {
        // Whatever was applied, held keys may have been freed.
        let Some(pending) = pending else {
            return;
        };
        match pending.kind {
            PendingKind::Grant(waiter) => {
                if let Some(leadership) = self.leadership.as_mut() {
                    for key in waiter.keys.keys() {
                        leadership.reserved.remove(key);
                        leadership.dirty.push(key.clone());
                    }
                }
                self.deliver_grant(now, waiter, result);
                if let Some(handover) = self.handovers.remove(&index) {
                    let token = match result {
                        ApplyResult::Granted { token } => Some(token),
                        _ => None,
                    };
                    self.answer_handover(handover, token);
                }
            }
            PendingKind::Release { conn, reply_to } => {
                self.count_release_miss(now, conn, &result);
                let answer = match result {
                    ApplyResult::Released => Answer::Released,
                    ApplyResult::GroupMismatch => Answer::GroupMismatch,
                    _ => Answer::NotFound,
                };
                self.answer(conn, &reply_to, answer);
                self.close_if_sweeping(now, conn);
            }
            PendingKind::ForceRelease { id, keys } => {
                let outcome = match result {
                    ApplyResult::ForceReleased { revoked } => {
                        // The hand-over is a Grant proposed after this
                        // apply: the answer waits to name its token (or
                        // goes out when the pump ends without one).
                        let handover = Handover { id, revoked, keys };
                        if self.leadership.is_some() {
                            self.handover_wanted.push(handover);
                        } else {
                            self.answer_handover(handover, None);
                        }
                        return;
                    }
                    ApplyResult::ForceTokenMismatch { held } => {
                        ForceReleaseOutcome::TokenMismatch { held }
                    }
                    _ => ForceReleaseOutcome::NotHeld,
                };
                self.admin_reply(id, outcome);
            }
            PendingKind::Init | PendingKind::Internal => {}
        }
    }

    /// Queues the answer to force-release `id` for the driver.
    fn admin_reply(&mut self, id: AdminRequestId, outcome: ForceReleaseOutcome) {
        if self.admin_replies.len() >= MAX_ADMIN_REPLIES {
            self.counts.dropped_admin_replies += 1;
        } else {
            self.admin_replies.push_back((id, outcome));
        }
    }

    /// Counts a release's outcome in its connection's run of misses.
    fn count_release_miss(&mut self, _now: Instant, conn_id: ConnId, result: &ApplyResult) {
        if let Some(Conn {
            kind: ConnKind::Client(client),
            ..
        }) = self.conns.get_mut(&conn_id)
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
    fn close_if_sweeping(&mut self, now: Instant, conn_id: ConnId) {
        let max_misses = self.config.budget.max_release_misses_in_row;
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let ConnKind::Client(client) = &conn.kind else {
            return;
        };
        if max_misses == 0 || client.release_misses_in_row < max_misses || conn.out.is_closing() {
            return;
        }
        self.reports
            .abuse(now, conn.source, AbuseKind::ReleaseSweep);
        self.close_conn(conn_id, CloseReason::ReleaseMisses);
    }

    /// The dialect client connection `conn` speaks, once its handshake
    /// succeeded.
    pub fn dialect(&self, conn_id: ConnId) -> Option<Dialect> {
        match self.conns.get(&conn_id).map(|conn| &conn.kind) {
            Some(ConnKind::Client(client)) => client.front.dialect(),
            _ => None,
        }
    }

    /// Keys held by the grants this leader delivered to `conn` (for tests
    /// and metrics; 0 on a follower).
    pub fn held_keys(&self, conn_id: ConnId) -> usize {
        self.leadership
            .as_ref()
            .map_or(0, |leadership| leadership.held_keys.held(conn_id))
    }

    /// The next thing to log: aggregated abuse reports (`warn`) and close
    /// reasons (`debug`). Drain after every input, like the wakes.
    pub fn poll_log(&mut self) -> Option<LogEvent> {
        self.reports.poll()
    }

    /// Log events dropped because the driver did not drain
    /// [`ClusterNode::poll_log`] (a bounded queue).
    pub fn dropped_log_events(&self) -> u64 {
        self.reports.dropped_events()
    }

    /// The next change to this node the driver should log or act on:
    /// leader, voter and generation changes, refused peer input. Queued
    /// when it happens (bounded, see [`crate::cluster::events`]); drain
    /// after every input, like the wakes.
    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.poll()
    }

    /// Node events dropped because a newer one of their kind superseded
    /// them while the queue was full (the driver did not drain
    /// [`ClusterNode::poll_event`]).
    pub fn coalesced_node_events(&self) -> u64 {
        self.events.coalesced()
    }

    fn deliver_grant(&mut self, now: Instant, waiter: Waiter, result: ApplyResult) {
        let ApplyResult::Granted { token } = result else {
            // Defensive (a grant never reaches a held key once caught up):
            // a definite "not acquired".
            self.answer(waiter.conn, &waiter.reply_to, Answer::TimedOut);
            return;
        };
        let open = matches!(
            self.conns.get(&waiter.conn),
            Some(Conn {
                kind: ConnKind::Client(_),
                out,
                ..
            }) if !out.is_closing()
        );
        if !open {
            // Nobody will learn this token: release it at once rather than
            // leave the keys blocked until the lease ends (docs/cluster.md,
            // "How a grant flows", step 7).
            self.propose_internal(
                now,
                Command::Release {
                    keys: waiter.keys,
                    token,
                },
            );
            return;
        }
        self.answer(waiter.conn, &waiter.reply_to, Answer::Granted { token });
        let waited = now.saturating_duration_since(waiter.received);
        self.counts.wait.observe(waited);
        if let Some(leadership) = self.leadership.as_mut() {
            let lease = Duration::from_millis(u64::from(waiter.lease_ms));
            leadership.held_keys.add(
                waiter.conn,
                token,
                waiter.keys.len(),
                now.saturating_add(lease),
            );
        }
        if let Some(Conn {
            kind: ConnKind::Client(_),
            out,
            ..
        }) = self.conns.get_mut(&waiter.conn)
        {
            // The reply was just queued: its frame ends at the stream's end.
            out.record_grant(token, waiter.keys);
        }
    }

    fn handle_event(&mut self, now: Instant, event: Event) {
        match event {
            Event::BecameLeader { term } => {
                self.events.note_leader(Some(self.config.id), term);
                self.state.rebuild_deadlines();
                self.leadership = Some(Leadership {
                    // The no-op of this term is the last entry now.
                    first_index: self.raft.last_index(),
                    ..Leadership::default()
                });
                self.announce_leader();
            }
            Event::SteppedDown { .. } => self.step_down(),
            Event::LeaderChanged { leader, term } => {
                self.events.note_leader(leader, term);
                self.announce_leader();
            }
            Event::ConfigChanged { .. } => self.events.note_voter(self.raft.is_voter()),
            Event::SnapshotWanted { .. } => {
                let _ = self.raft.compact(self.state.snapshot(now));
            }
        }
    }

    /// Leadership lost: proposed requests get `I` (they may still commit),
    /// queued and held ones `M`/`E 4` (they had no effect).
    fn step_down(&mut self) {
        // Applied force-releases whose hand-over will not be seen.
        let handovers = std::mem::take(&mut self.handovers);
        for handover in handovers.into_values() {
            self.answer_handover(handover, None);
        }
        for handover in std::mem::take(&mut self.handover_wanted) {
            self.answer_handover(handover, None);
        }
        let leader = self.raft.leader();
        let pending = std::mem::take(&mut self.pending);
        for (_, p) in pending {
            match p.kind {
                PendingKind::Grant(w) => self.answer(w.conn, &w.reply_to, Answer::Indeterminate),
                PendingKind::Release { conn, reply_to } => {
                    self.answer(conn, &reply_to, Answer::Indeterminate);
                }
                // It may still commit under the next leader.
                PendingKind::ForceRelease { id, .. } => {
                    self.admin_reply(id, ForceReleaseOutcome::Indeterminate);
                }
                PendingKind::Init | PendingKind::Internal => {}
            }
        }
        if let Some(leadership) = self.leadership.take() {
            for (_, waiter) in leadership.waiters {
                if let Some(Conn {
                    kind: ConnKind::Client(client),
                    ..
                }) = self.conns.get_mut(&waiter.conn)
                {
                    client.queued.clear();
                }
                self.answer(waiter.conn, &waiter.reply_to, leader_reply(leader));
            }
            for (conn, request, _) in leadership.held {
                self.answer(conn, request.reply_to(), leader_reply(leader));
            }
        }
    }

    /// Sends `L` to every client session when the known leader changed.
    fn announce_leader(&mut self) {
        let slot = self.raft.leader().map_or(NO_LEADER_SLOT, |l| l.slot);
        if slot == self.announced_leader {
            return;
        }
        self.announced_leader = slot;
        for (conn_id, conn) in &mut self.conns {
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
                    self.wakes.wake(*conn_id, &mut conn.out);
                }
            }
        }
    }

    /// The leader's work: initialise the domain, serve held requests once
    /// caught up, hand freed keys to queue heads, expire leases. True when
    /// something was proposed or answered.
    fn leader_duties(&mut self, now: Instant) -> bool {
        let Some(leadership) = self.leadership.as_mut() else {
            return false;
        };
        let mut progressed = false;
        if !leadership.init_proposed && !self.state.is_initialised() {
            // Above every token an authenticated peer knew of, so that a
            // cluster bootstrapped again with one clock behind still starts
            // above what it issued before.
            let command = Command::Init {
                first_token: self
                    .config
                    .bootstrap_wall_clock_us
                    .max(self.peer_token_floor_max),
            };
            if let Ok((index, term)) = self.raft.propose(now, command.to_bytes()) {
                leadership.init_proposed = true;
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::Init,
                    },
                );
                progressed = true;
            }
        }
        let Some(leadership) = self.leadership.as_mut() else {
            return progressed;
        };
        if !leadership.caught_up {
            return progressed;
        }
        let held = std::mem::take(&mut leadership.held);
        for (conn, request, received) in held {
            progressed = true;
            self.serve_request(now, conn, request, received);
        }
        progressed |= self.serve_dirty(now);
        progressed |= self.expire_due(now);
        progressed
    }

    /// Proposes a Grant for every queue head that has become grantable.
    fn serve_dirty(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        loop {
            let Some(leadership) = self.leadership.as_mut() else {
                return progressed;
            };
            let Some(key) = leadership.dirty.pop() else {
                return progressed;
            };
            let Some(&seq) = leadership.queues.get(&key).and_then(VecDeque::front) else {
                continue;
            };
            let Some(waiter) = leadership.waiters.get(&seq) else {
                continue;
            };
            // Free here: not held and not reserved by a Grant in flight.
            let grantable = queue_rule::key_set_grantable(
                seq,
                waiter.keys.keys(),
                |k| leadership.queues.get(*k).and_then(VecDeque::front).copied(),
                |k| !self.state.is_held(k) && !leadership.reserved.contains(*k),
            );
            if !grantable {
                continue;
            }
            let bound = self.next_grant_token_bound();
            if !self.reserve.covers(bound) {
                self.reserve.note_exhausted(bound);
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership.reserve_stalled.insert(key);
                }
                continue;
            }
            if let Some(waiter) = self.remove_waiter(seq) {
                progressed = true;
                let keys = (!self.handover_wanted.is_empty()).then(|| waiter.keys.clone());
                let index = self.propose_grant(now, waiter);
                if let (Some(index), Some(keys)) = (index, keys) {
                    // A hand-over of a force-released grant's keys: its
                    // answer names this Grant's token once applied.
                    let freed = |h: &Handover| keys.keys().iter().any(|k| h.keys.contains(k));
                    if let Some(pos) = self.handover_wanted.iter().position(freed) {
                        let handover = self.handover_wanted.swap_remove(pos);
                        self.handovers.insert(index, handover);
                    }
                }
            }
        }
    }

    /// Proposes `Expire` for every lease that ended on this node's clock.
    fn expire_due(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        while let Some((token, keys)) = self.state.pop_expired(now) {
            let Some(leadership) = self.leadership.as_mut() else {
                break;
            };
            if !leadership.expiring.insert(token) {
                continue;
            }
            if self.propose_internal(now, Command::Expire { keys, token }) {
                progressed = true;
            } else {
                if let Some(leadership) = self.leadership.as_mut() {
                    leadership.expiring.remove(&token);
                }
                self.state.rearm(token, now.saturating_add(EXPIRE_RETRY));
                break;
            }
        }
        progressed
    }

    fn route_messages(&mut self, now: Instant) {
        while let Some((to, msg)) = self.raft.poll_message() {
            // The newest established connection to the slot carries it; a
            // message without one is dropped (Raft retries).
            let target = self
                .conns
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
            if conn.out.pending().len() >= self.config.max_outbound_bytes_per_connection {
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
                self.wakes.wake(*conn_id, &mut conn.out);
                note_output(now, conn);
            }
        }
    }

    /// Queues a keepalive on every established peer connection on which
    /// nothing was queued for [`KEEPALIVE_HEARTBEATS`] heartbeat intervals.
    fn send_keepalives(&mut self, now: Instant) {
        let interval = self.config.keepalive_interval();
        let from = self.config.id;
        for (conn_id, conn) in &mut self.conns {
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
                self.wakes.wake(*conn_id, &mut conn.out);
                note_output(now, conn);
            }
        }
    }

    /// Closes established peer connections silent past the bound and lets
    /// their slots be redialed at once.
    fn close_silent_peers(&mut self, now: Instant) {
        let bound = self.config.peer_silence_timeout;
        let silent: Vec<(ConnId, u8)> = self
            .conns
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
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                // Nobody will read these; Raft resends what matters.
                conn.out.discard_pending();
            }
            self.close_conn(conn_id, CloseReason::PeerSilent);
            // The transport may take long to report the close (a stuck
            // write); the slot is dialed again without waiting for it.
            let still_connected = self.conns.values().any(|c| {
                !c.out.is_closing()
                    && matches!(&c.kind, ConnKind::Peer(p)
                        if p.established.map(|id| id.slot).or(p.dialed) == Some(slot))
            });
            if !still_connected && let Some(dial) = self.dials.get_mut(usize::from(slot)) {
                dial.connected = false;
            }
        }
    }

    /// Whether `slot`'s link is established and heard from recently.
    pub fn peer_liveness(&self, now: Instant, slot: u8) -> PeerLiveness {
        let window = self.config.live_window();
        let mut liveness = PeerLiveness::Down;
        for conn in self.conns.values() {
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

    // ------------------------------------------------------------------
    // Time
    // ------------------------------------------------------------------

    /// Processes every deadline at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.raft.handle_timeout(now);
        self.close_silent_peers(now);
        self.send_keepalives(now);
        while let Some(conn_id) = self.handshake_deadlines.pop_due(now) {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
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
                let source = self.conns.get(&conn_id).and_then(|c| c.source);
                self.reports
                    .abuse(now, source, AbuseKind::HandshakeTimedOut);
                self.close_conn(conn_id, CloseReason::HandshakeTimedOut);
            }
        }
        self.reports.handle_timeout(now);
        if let Some(leadership) = self.leadership.as_mut() {
            leadership.held_keys.expire(now);
        }
        self.time_out_waiters(now);
        if self.raft.is_leader() {
            let leader = self.raft.id();
            let members: Vec<NodeId> = self
                .conns
                .values()
                .filter_map(|c| match &c.kind {
                    ConnKind::Peer(p) => p.established,
                    ConnKind::Client(_) => None,
                })
                .filter(|id| *id != leader)
                .collect();
            for id in members {
                self.maybe_add_learner(now, id);
            }
        }
        self.pump(now);
    }

    fn time_out_waiters(&mut self, now: Instant) {
        loop {
            let Some(leadership) = self.leadership.as_mut() else {
                return;
            };
            let Some(Reverse((deadline, seq))) = leadership.wait_deadlines.peek().copied() else {
                return;
            };
            if deadline > now {
                return;
            }
            leadership.wait_deadlines.pop();
            if let Some(waiter) = self.remove_waiter(seq) {
                self.answer(waiter.conn, &waiter.reply_to, Answer::TimedOut);
            }
        }
    }

    /// The earliest instant at which [`ClusterNode::handle_timeout`] has
    /// work (may be early; never late).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut earliest = self.raft.poll_timeout();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
        };
        consider(self.handshake_deadlines.earliest());
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
        }
        for (slot, dial) in self.dials.iter().enumerate() {
            if slot != usize::from(self.config.id.slot) && !dial.connected && !dial.dialing {
                consider(Some(dial.next_attempt));
            }
        }
        let bound = self.config.peer_silence_timeout;
        let keepalive = self.config.keepalive_interval();
        for conn in self.conns.values() {
            if let (ConnKind::Peer(peer), false) = (&conn.kind, conn.out.is_closing())
                && peer.established.is_some()
            {
                consider(Some(peer.last_frame_at.saturating_add(bound)));
                consider(Some(peer.last_sealed_at.saturating_add(keepalive)));
                consider(peer.output_pending_since.map(|t| t.saturating_add(bound)));
            }
        }
        earliest
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------

    /// A connection with bytes to send or to be closed.
    pub fn poll_wake(&mut self) -> Option<ConnId> {
        self.wakes.poll(|conn_id| {
            self.conns
                .get_mut(&conn_id)
                .is_some_and(|conn| conn.out.leave_wake_queue())
        })
    }

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection.
    pub fn take_transmit(&mut self, conn_id: ConnId, out: &mut Vec<u8>) -> ConnState {
        self.conns
            .get_mut(&conn_id)
            .map_or(ConnState::Gone, |conn| conn.out.take(out))
    }

    /// False while `conn` has too many bytes waiting to be written: the
    /// driver should stop reading from it until it has written them.
    pub fn wants_input(&self, conn_id: ConnId) -> bool {
        let max_bytes = self.config.max_outbound_bytes_per_connection;
        self.conns
            .get(&conn_id)
            .is_some_and(|conn| conn.out.wants_input(max_bytes))
    }

    /// Stop serving clients: a leader hands leadership over; queued and
    /// held waiters get `E 3`; client connections are flushed and closed;
    /// new client connections are refused. Peer connections stay so the
    /// transfer can complete; the driver exits once
    /// [`ClusterNode::is_leader`] is false (or after its own timeout).
    pub fn begin_shutdown(&mut self, now: Instant) {
        self.handle_timeout(now);
        self.shutting_down = true;
        self.reports.flush();
        if self.raft.is_leader() {
            let _ = self.raft.transfer_leadership(now, None);
        }
        if let Some(leadership) = self.leadership.as_mut() {
            let waiters = std::mem::take(&mut leadership.waiters);
            let held = std::mem::take(&mut leadership.held);
            leadership.queues.clear();
            for (_, waiter) in waiters {
                self.answer(waiter.conn, &waiter.reply_to, Answer::NotActive);
            }
            for (conn, request, _) in held {
                self.answer(conn, request.reply_to(), Answer::NotActive);
            }
        }
        let clients: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.kind, ConnKind::Client(_)))
            .map(|(id, _)| *id)
            .collect();
        for conn_id in clients {
            if let Some(Conn {
                kind: ConnKind::Client(client),
                out,
                ..
            }) = self.conns.get_mut(&conn_id)
                && !out.is_closing()
            {
                client.front.farewell(out.buffer_mut());
            }
            self.close_conn(conn_id, CloseReason::Shutdown);
        }
        self.pump(now);
    }
}
