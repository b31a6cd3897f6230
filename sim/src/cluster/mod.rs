//! The cluster world: 3 or 5 real [`ClusterNode`]s connected by simulated
//! peer connections, and client processes with one real core [`Session`]
//! per node (slot order) routed by the core [`Router`], all driven the way
//! a runtime drives them. Faults: connection resets, symmetric and
//! asymmetric partitions (peer links cut one way or both), an isolated
//! leader, node crashes with a fresh restart (a new generation that joins
//! as a learner and replaces its old self), per-node clock drift and
//! forward jumps, client crashes and pauses, message delay and reordering
//! across connections.
//!
//! Checkers after every event: Raft (one leader per term, log matching,
//! one committed entry per index, commit index never decreasing, equal
//! replicated state at equal applied index), lock state (a key changes
//! holder only when its holder released it, lost it as a ghost, or ran out
//! of lease; tokens strictly increasing), replies, fencing; at the end
//! liveness and per-key linearizability of what clients observed.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};

use ticketing_core::client::KeySet;
use ticketing_core::client::{Backoff, ClientError, CloseReason, Router, Session, SessionConfig};
use ticketing_core::cluster::peer::{PEER_HELLO_LEN, PeerTokens};
use ticketing_core::cluster::recovery::{self, RecoveryFacts};
use ticketing_core::cluster::{
    BOOTSTRAP_GENERATION, ClusterConfig, ClusterNode, NodeEvent, StartFacts, StartMode,
};
use ticketing_core::cluster::{ConnId, ConnState};
use ticketing_core::inspect::{AdminRequestId, ForceRelease, ForceReleaseOutcome, ListingCursor};
use ticketing_core::lock::Limits;
use ticketing_core::machine::{Machine, Output};
use ticketing_core::raft::{Configuration, NodeId, RaftConfig};
use ticketing_core::reserve::TokenReserve;
use ticketing_core::wire::{Capabilities, ErrorCode, Key, Reply, Request};

use crate::adversary::{Adversary, AdversaryRates};
use crate::checks::{ANSWERED_MAX, History, Windows, key_index};
use crate::clients::{
    ClientCall, ClientEv, ClientProc, ClientProcess, ClientWorld, DbKey, LineCalls, OpState, Parts,
    ReleaseFailure, Sessions, V3Sessions, close_expected_of_any,
};
use crate::clock::{Clock, WALL_EPOCH_US, instant};
use crate::config::{ALL_KEYS, SimConfig};
use crate::driver::{self, Marker, SimWorld};
use crate::linear::LinOp;
use crate::net::{self, StreamOracle, Tcp};
use crate::rng::{FaultRoll, Rng, fuzz_streams, seeded_streams};
use crate::run::{Checker, Phase, Queue, Recorder, RunReport, Scheduled, Short};

pub use config::{ClusterFaults, ClusterPlant, ClusterSimConfig};

mod admin;
mod checks;
mod client_world;
mod clients;
mod config;
mod driving;
mod end;
mod faults;
mod majority_loss;
mod nodes;
mod observe;
mod outsider;
mod partitions;
mod pipes;
mod plumbing;

const FINGERPRINT: [u8; 32] = [7; 32];
const PEER_TOKEN: &[u8] = b"ticketing-sim-peer-token-0123456789";
/// A dial over a cut link fails after this long (a SYN timeout).
const DIAL_TIMEOUT_US: u64 = 1_000_000;
/// Share of connection directions that stay stale when their partition
/// heals, parts per million: TCP's retransmission timer has backed off, so
/// what was held (and everything after it, and a close) arrives only
/// [`STALE_US`] later.
const STALE_PPM: u32 = 250_000;
/// How long a stale direction keeps its bytes after the heal: beyond the
/// liveness phase, so only nodes that give up on silent links recover.
const STALE_US: u64 = 120_000_000;
/// Share of node restarts given `--bootstrap` by mistake, parts per million.
const MISTAKEN_BOOTSTRAP_PPM: u32 = 250_000;
/// Share of swarm worlds with the outsider, parts per million.
const ADVERSARY_SEEDS_PPM: u32 = 300_000;
/// Share of swarm worlds with operator force-releases, parts per million.
const FORCE_RELEASE_SEEDS_PPM: u32 = 500_000;
/// Token reserve step of nodes with durable floors (small: writes are
/// frequent, and Appends a follower's floor does not cover yet wait).
const SIM_RESERVE_STEP: u64 = 64;
/// How far back a recovered node's clock is: an hour.
const RECOVERY_CLOCK_BACK_US: u64 = 3_600_000_000;
/// A force-release's era: its grant's validity window and fenced writes are
/// judged on their own (the holder may act on a grant an operator revoked;
/// its writes are fenced, which is the point).
fn force_released_era(token: u64) -> u64 {
    u64::MAX - token
}
/// Most connections the outsider holds open at once (each pair is a relay);
/// well below a node's peer connection limit.
const ADVERSARY_CONNS_MAX: usize = 4;
/// The outsider writes its guessed proof and a forged frame this long
/// after opening a relay.
const ADVERSARY_FINISH_US: u64 = 300_000;

/// Runs the cluster swarm world of `seed` with `nodes` nodes.
pub fn run_cluster_seed(seed: u64, nodes: u8) -> RunReport {
    ClusterWorld::new(seed, ClusterSimConfig::swarm(seed, nodes)).run()
}

#[derive(Clone, Debug)]
pub(crate) enum Ev {
    NodeTimer {
        slot: u8,
        inc: u64,
        generation: u64,
    },
    NodeRestart {
        slot: u8,
    },
    /// The operator recovers the cluster after a majority loss.
    Recover,
    /// A dial's SYN reaches the target.
    DialArrive {
        pipe: u64,
    },
    /// The dialer learns the outcome.
    DialAnswer {
        pipe: u64,
        ok: bool,
    },
    ClientConnectArrive {
        pipe: u64,
    },
    /// The outsider's connection reaches a node's peer port.
    AdversaryArrive {
        pipe: u64,
    },
    /// The outsider gives up waiting for a proof and writes its own.
    AdversaryFinish {
        pipe: u64,
    },
    /// `dir` 0: towards the acceptor (end b); 1: towards the initiator.
    Deliver {
        pipe: u64,
        dir: u8,
        bytes: Vec<u8>,
    },
    /// A node writes a take (or part of it) on its `side` of `pipe`.
    Flush {
        pipe: u64,
        side: u8,
        bytes: Vec<u8>,
        done: bool,
        close: bool,
    },
    SeesClose {
        pipe: u64,
        side: u8,
    },
    Heal {
        id: u64,
    },
    /// A stale direction of `pipe` finally retransmits.
    Retransmit {
        pipe: u64,
        dir: u8,
    },
    /// Everything a client process does on its own.
    Client(ClientCall),
    FaultTick,
    EndSafety,
    /// Liveness phase: ends the run early once everything has resolved.
    Probe,
    End,
}

impl Ev {
    fn code(&self) -> u64 {
        match self {
            Ev::NodeTimer { .. } => 1,
            Ev::NodeRestart { .. } => 2,
            Ev::DialArrive { .. } => 3,
            Ev::DialAnswer { .. } => 4,
            Ev::ClientConnectArrive { .. } => 5,
            Ev::Deliver { .. } => 6,
            Ev::Flush { .. } => 7,
            Ev::SeesClose { .. } => 8,
            Ev::Heal { .. } => 9,
            Ev::Client(call) => 10 + call.code_offset(),
            Ev::FaultTick => 18,
            Ev::EndSafety => 19,
            Ev::End => 20,
            Ev::Probe => 21,
            Ev::AdversaryArrive { .. } => 22,
            Ev::AdversaryFinish { .. } => 23,
            Ev::Retransmit { .. } => 24,
            Ev::Recover => 25,
        }
    }
}

/// The address node `slot` connects from, as its peers see it.
fn node_source(slot: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 1, slot])
}

/// The address client `client` connects from (a few clients share one, as
/// behind a NAT, so per-source caps meet several clients).
fn client_source(client: usize) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 2, (client % 4) as u8])
}

/// The address the outsider connects from.
fn adversary_source() -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 3, 1])
}

/// Who opened a connection (end a). End b is always a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opener {
    Client {
        client: usize,
        inc: u64,
    },
    Node {
        slot: u8,
        inc: u64,
    },
    /// The outsider, on a node's peer port.
    Adversary,
}

/// A simulated TCP connection: end a (a client, or the dialing node) and
/// end b (the accepting node). Direction 0 is a→b, 1 is b→a.
struct Pipe {
    opener: Opener,
    b_slot: u8,
    b_inc: u64,
    /// Node-side connection ids: end a (peer pipes) and end b.
    ids: [Option<ConnId>; 2],
    /// The network's side of it.
    tcp: Tcp,
    open: [bool; 2],
    /// Chunks sent over a cut link, delivered when it heals (TCP
    /// retransmits) unless the connection resets first.
    held: [Vec<Vec<u8>>; 2],
    /// The direction stayed stale at the heal ([`STALE_PPM`]): its bytes
    /// wait for [`Ev::Retransmit`].
    stale: [bool; 2],
    /// A close on a stale direction: the other end learns it only when the
    /// direction is retransmitted.
    fin_stale: [bool; 2],
    /// Bytes that reached a paused client's kernel, and a close after them.
    held_for_client: Vec<u8>,
    close_held: bool,
    /// A node's take is being written on that side.
    writing: [bool; 2],
    /// A dial whose outcome the dialer has not learnt yet: the pipe must
    /// outlive a reset until then, or the dialer would wait forever.
    dialing: bool,
    /// Oracle of client pipes: requests and replies in the two streams.
    oracle: StreamOracle,
    /// Grants in taken bytes whose frame is not yet reported written whole:
    /// token and the stream offset just past the frame.
    unflushed_grants: Vec<(u64, u64)>,
}

impl Pipe {
    fn peer(&self) -> bool {
        matches!(self.opener, Opener::Node { .. })
    }

    fn client(&self) -> bool {
        matches!(self.opener, Opener::Client { .. })
    }

    /// The node at `side` of this pipe, with its incarnation.
    fn node_at(&self, side: u8) -> Option<(u8, u64)> {
        match (side, self.opener) {
            (1, _) => Some((self.b_slot, self.b_inc)),
            (_, Opener::Node { slot, inc }) => Some((slot, inc)),
            _ => None,
        }
    }
}

struct NodeProc {
    node: Option<ClusterNode>,
    inc: u64,
    /// The newest generation this slot used or reserved (a bootstrap
    /// member's generation to join under if it finds the cluster running).
    generation: u64,
    /// The running node's identity as the checks last saw it; a change is a
    /// new incarnation (a bootstrap member that joined as a new generation).
    incarnation: Option<NodeId>,
    clock: Clock,
    conns: BTreeMap<ConnId, u64>,
    timer_generation: u64,
    armed: Option<ticketing_core::time::Instant>,
    /// Highest commit index seen in this incarnation.
    commit_seen: u64,
    /// Highest token seen in this incarnation's applied state.
    token_max: u64,
    /// (last index, its term, commit, applied) at the last check: the
    /// checks rerun only when one of them moved.
    checked: (u64, u64, u64, u64),
    /// (term, leader, configuration) this node last knew, for trace notes.
    known_leader: (u64, Option<NodeId>, Configuration),
    /// Per key: the token holding it in this node's applied state.
    shadow: Vec<Option<u64>>,
    /// The slot's durable token floor (its state file), kept across
    /// crashes; only with majority losses.
    floor: Option<u64>,
}

impl NodeProc {
    /// A slot whose node has not started yet, on `clock`.
    fn new(clock: Clock) -> Self {
        NodeProc {
            node: None,
            inc: 0,
            generation: 1,
            incarnation: None,
            clock,
            conns: BTreeMap::new(),
            timer_generation: 0,
            armed: None,
            commit_seen: 0,
            token_max: 0,
            checked: (0, 0, 0, 0),
            known_leader: (0, None, Configuration::default()),
            shadow: vec![None; ALL_KEYS.len()],
            floor: None,
        }
    }
}

/// The client processes of `config`, each with a session per node: the v3
/// clients, then the line clients, their clocks (and line clients' owner
/// bases) drawn from `clocks` in that order.
fn draw_clients(config: &ClusterSimConfig, clocks: &mut Rng) -> Vec<ClientProc> {
    let n = usize::from(config.nodes);
    let drift = config.base.drift_ppm_max;
    let mut clients: Vec<ClientProc> = (0..config.base.clients)
        .map(|client| {
            let sessions = Sessions::routed(n);
            ClientProc {
                renews: client < config.base.renewing_clients,
                ..ClientProc::new(Clock::draw(clocks, drift), sessions)
            }
        })
        .collect();
    // Drawn after the v3 clients', so worlds without line clients are
    // what they were.
    for _ in 0..config.base.line_clients {
        let clock = Clock::draw(clocks, drift);
        let owner_base = clocks.next_u64();
        let sessions = Sessions::routed(n);
        clients.push(ClientProc::line(clock, owner_base, sessions));
    }
    clients
}

/// What the oracle knows of a grant in the replicated state.
#[derive(Clone, Debug)]
struct GrantInfo {
    keys: Vec<usize>,
    lease_ms: u32,
    /// True time it first appeared in any node's applied state.
    first_applied_us: u64,
    era: u64,
}

/// A simulated cluster world; see the module docs.
pub struct ClusterWorld<'t> {
    config: ClusterSimConfig,
    n: u8,
    now_us: u64,
    queue: Queue<Ev>,
    net: Rng,
    work: Rng,
    fault_rng: Rng,
    phase: Phase,
    nodes: Vec<NodeProc>,
    clients: Vec<ClientProc>,
    pipes: BTreeMap<u64, Pipe>,
    next_pipe: u64,
    next_op: u64,
    /// Cuts in force per directed link `[from][to]` (partitions overlap).
    cut: Vec<Vec<u32>>,
    partitions: BTreeMap<u64, Vec<(u8, u8)>>,
    next_partition: u64,
    lease_era: u64,
    /// Last true time some node led.
    last_leader_us: u64,
    // Raft oracle.
    leaders: HashMap<u64, NodeId>,
    /// Committed entry hash per index.
    committed: HashMap<u64, u64>,
    /// Entry hash per (index, term), committed or not.
    entries: HashMap<(u64, u64), u64>,
    /// Replicated-state hash per applied index.
    states: HashMap<u64, u64>,
    // Lock oracle.
    grants: HashMap<u64, GrantInfo>,
    token_max: u64,
    /// Tokens a client asked to release (any attempt).
    release_requested: HashSet<u64>,
    /// Grants whose reply bytes a node took for writing.
    replied: HashSet<u64>,
    /// Grants a node counted as undelivered when their connection closed.
    ghosts: HashSet<u64>,
    /// Grants a client received.
    received: HashSet<u64>,
    /// Requests a node received and has not answered: (pipe, rid).
    pending: BTreeMap<(u64, u64), bool>,
    /// Renewals among them: their tokens.
    renewals: BTreeMap<(u64, u64), u64>,
    /// Per answered grant or renewal (pipe, rid): the grant's expiry on
    /// the node that answered, in true time as of the answer, and the
    /// lease era (the deadline checker's record).
    answered: BTreeMap<(u64, u64), (u64, u64)>,
    db: Vec<DbKey>,
    windows: Windows,
    history: History,
    adversary: Adversary,
    /// Draws of the operator's force-releases (their own stream).
    force_rng: Rng,
    /// Tokens an operator ordered force-released (any attempt): a key may
    /// change holder once its holder's token was named.
    force_requested: HashSet<u64>,
    /// Force-releases awaiting their answer, by request id.
    admin_pending: BTreeMap<u64, AdminOp>,
    next_admin_id: u64,
    /// Draws of majority losses (their own stream).
    loss_rng: Rng,
    /// Every node is down after a majority loss, until the recovery.
    lost: bool,
    rec: Recorder<'t>,
}

/// A force-release sent to a node, and where its history entries stand.
#[derive(Debug)]
struct AdminOp {
    slot: u8,
    inc: u64,
    token: u64,
    hist: crate::checks::HistRefs,
}

fn hash_of<T: Hash>(value: &T) -> u64 {
    // SipHash with fixed keys: deterministic across processes.
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl<'t> ClusterWorld<'t> {
    /// A cluster world for `seed`.
    pub fn new(seed: u64, config: ClusterSimConfig) -> Self {
        Self::with_rngs(seed, config, seeded_streams(seed, 11))
    }

    /// A cluster world whose every decision comes from `bytes` (fuzzing).
    pub fn from_bytes(bytes: &[u8], config: ClusterSimConfig) -> Self {
        Self::with_rngs(0, config, fuzz_streams(bytes))
    }

    fn with_rngs(seed: u64, config: ClusterSimConfig, rngs: [Rng; 4]) -> Self {
        assert!(matches!(config.nodes, 3 | 5), "a cluster has 3 or 5 nodes");
        let n = config.nodes;
        let [net, mut clocks, work, fault_rng] = rngs;
        let drift = config.base.drift_ppm_max;
        // Node clocks are drawn first, then the clients'.
        let nodes = (0..n)
            .map(|_| NodeProc::new(Clock::draw(&mut clocks, drift)))
            .collect();
        let clients = draw_clients(&config, &mut clocks);
        let keys = ALL_KEYS.len();
        ClusterWorld {
            n,
            now_us: 0,
            queue: Queue::new(),
            net,
            work,
            fault_rng,
            phase: Phase::Safety,
            nodes,
            clients,
            pipes: BTreeMap::new(),
            next_pipe: 1,
            next_op: 1,
            cut: vec![vec![0; usize::from(n)]; usize::from(n)],
            partitions: BTreeMap::new(),
            next_partition: 1,
            lease_era: 0,
            last_leader_us: 0,
            leaders: HashMap::new(),
            committed: HashMap::new(),
            entries: HashMap::new(),
            states: HashMap::new(),
            grants: HashMap::new(),
            token_max: 0,
            release_requested: HashSet::new(),
            replied: HashSet::new(),
            ghosts: HashSet::new(),
            received: HashSet::new(),
            pending: BTreeMap::new(),
            renewals: BTreeMap::new(),
            answered: BTreeMap::new(),
            db: vec![DbKey::default(); keys],
            windows: Windows::new(),
            history: History::new(),
            adversary: Adversary::new(config.faults.adversary.clone(), Rng::new(seed, 95)),
            force_rng: Rng::new(seed, 94),
            force_requested: HashSet::new(),
            admin_pending: BTreeMap::new(),
            next_admin_id: 1,
            loss_rng: Rng::new(seed, 91),
            lost: false,
            rec: Recorder::new(seed, config.base.checkers_off.clone()),
            config,
        }
    }

    /// Prints a readable line per event to `out`.
    pub fn with_trace(mut self, out: &'t mut dyn std::io::Write) -> Self {
        self.rec.set_trace(out);
        self
    }

    /// Runs to the end and checks everything.
    pub fn run(self) -> RunReport {
        driver::run(self)
    }
}

/// The client address node `slot` is configured with, as line clients
/// spell it (`M` and `L` name it).
fn line_address(slot: u8) -> Box<str> {
    format!("node{slot}.sim:7000").into()
}

struct TraceEv<'a>(&'a Ev);

impl std::fmt::Debug for TraceEv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ev::Client(call) => call.trace(f, true),
            Ev::Deliver { pipe, dir, bytes } => {
                let arrow = if *dir == 0 { "→ b" } else { "→ a" };
                write!(
                    f,
                    "deliver pipe {pipe} {arrow} {} bytes {:02x?}",
                    bytes.len(),
                    Short(bytes)
                )
            }
            Ev::Flush {
                pipe,
                side,
                bytes,
                done,
                ..
            } => {
                let part = if *done { "" } else { " (first part)" };
                write!(
                    f,
                    "node on side {side} of pipe {pipe} writes {} bytes{part}",
                    bytes.len()
                )
            }
            other => write!(f, "{other:?}"),
        }
    }
}

/// What one node emitted after an input, by kind, in order.
#[derive(Default)]
struct NodeOutputs {
    admin: Vec<(AdminRequestId, ForceReleaseOutcome)>,
    events: Vec<NodeEvent>,
    dials: Vec<u8>,
    woken: Vec<ConnId>,
}
