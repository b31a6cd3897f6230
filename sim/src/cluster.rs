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
use ticketing_core::cluster::recovery::{self, RECOVERY_GENERATION, RecoveryFacts};
use ticketing_core::cluster::{ClusterConfig, ClusterNode, NodeEvent};
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
    ClientCall, ClientEv, ClientProc, ClientWorld, DbKey, OpState, Parts, ReleaseFailure, Sessions,
    close_expected_of_any,
};
use crate::clock::{Clock, WALL_EPOCH_US, instant};
use crate::config::{ALL_KEYS, SimConfig};
use crate::driver::{self, Marker, SimWorld};
use crate::line_client::LineClientWorld;
use crate::linear::LinOp;
use crate::net::{self, StreamOracle, Tcp};
use crate::rng::{FaultRoll, Rng, fuzz_streams, seeded_streams};
use crate::run::{Checker, Phase, Queue, Recorder, RunReport, Scheduled, Short};

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

/// Cluster-specific fault rates (ppm per fault tick), on top of
/// [`SimConfig`]'s resets, client crashes, pauses and clock jumps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFaults {
    /// Peer links between a random minority and the rest are cut both ways.
    pub partition_ppm: u32,
    /// One peer link is cut in one direction only.
    pub one_way_ppm: u32,
    /// Every peer link of the current leader is cut both ways.
    pub isolate_leader_ppm: u32,
    /// A node crashes and restarts later with nothing (a new generation);
    /// only while the voters that still have their state stay a majority.
    pub node_crash_ppm: u32,
    /// A node's clock jumps forward.
    pub node_clock_jump_ppm: u32,
    /// Longest partition.
    pub partition_max_us: u64,
    /// The outsider without the peer token (`crate::adversary`); off
    /// when both rates are 0.
    pub adversary: AdversaryRates,
    /// An operator force-releases a key the leader's applied state shows
    /// held, naming its token or (a quarter of the time) a stale one, and
    /// in a third of them the leader is isolated at once, so the command
    /// may commit under a leader change or end indeterminate. Drawn from
    /// its own stream: worlds without it are what they were.
    pub force_release_ppm: u32,
    /// Every node crashes at once (a majority's state is lost) and, after
    /// a while, the operator recovers the cluster under the same identity
    /// (`serve --recover` on every slot: `cluster::recovery`), every
    /// recovered clock an hour behind for its token floor. Nodes then keep
    /// durable token floors (written at once); the locks held at the loss
    /// are gone, as an operator's force-release would end them, and the
    /// token checker watches that every grant after it is larger. Drawn
    /// from its own stream: worlds without it are what they were.
    pub majority_loss_ppm: u32,
}

/// A bug planted in the simulated *driver* (the core has no cluster
/// mutations): shows that the cluster checkers can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterPlant {
    /// A crashed node comes back with empty state under its old identity
    /// (bootstrap, same generation) instead of joining as a new generation,
    /// and crashes are not held back to keep a majority's state: Raft's
    /// persistent-state assumption broken.
    AmnesiacRestart,
    /// The driver never reports a write flushed: every grant counts as
    /// undelivered and is released when its connection closes.
    NeverReportFlushed,
    /// Operator force-releases happen but the checkers are not told (no
    /// history entry, no exemption for the revoked grant): shows that they
    /// see a force-release as a real change of holder, accepted only
    /// because it was ordered.
    SilentForceRelease,
    /// The recovery after a majority loss starts the token counter from
    /// the clock alone (an hour behind), ignoring the stored floors.
    RecoverFromClock,
}

/// What a cluster run simulates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSimConfig {
    /// Nodes: 3 or 5.
    pub nodes: u8,
    /// Workload, network, clocks and the fault rates shared with the
    /// single-server world (its server restart, stall and server clock
    /// jump rates are unused here).
    pub base: SimConfig,
    /// Cluster faults.
    pub faults: ClusterFaults,
    /// End the liveness phase as soon as everything has resolved (off: run
    /// it to its bound, to watch a quiet cluster for longer).
    pub end_when_quiet: bool,
    /// A driver bug to plant (tests only).
    pub plant: Option<ClusterPlant>,
}

impl ClusterSimConfig {
    /// The swarm configuration of `seed` for `nodes` nodes: the single
    /// world's swarm draw plus cluster fault rates, each off in about a
    /// third of the worlds.
    pub fn swarm(seed: u64, nodes: u8) -> Self {
        let mut base = SimConfig::swarm(seed);
        // Shorter phases than the single world: a cluster event costs more.
        base.safety_us = base.safety_us.min(15_000_000);
        base.faults.server_restart_ppm = 0;
        base.faults.server_clock_jump_ppm = 0;
        base.faults.server_write_stall_ppm = 0;
        let mut rng = Rng::new(seed, 98);
        let mut faults = ClusterFaults {
            partition_ppm: 80_000,
            one_way_ppm: 60_000,
            isolate_leader_ppm: 60_000,
            node_crash_ppm: 60_000,
            node_clock_jump_ppm: 30_000,
            partition_max_us: rng.range(300_000, 5_000_000),
            adversary: AdversaryRates::default(),
            force_release_ppm: 0,
            majority_loss_ppm: 0,
        };
        for rate in [
            &mut faults.partition_ppm,
            &mut faults.one_way_ppm,
            &mut faults.isolate_leader_ppm,
            &mut faults.node_crash_ppm,
            &mut faults.node_clock_jump_ppm,
        ] {
            if rng.chance(330_000) {
                *rate = 0;
            }
        }
        // Its own stream, so the worlds without it draw what they drew
        // before it existed.
        let mut adversary_rng = Rng::new(seed, 96);
        if adversary_rng.chance(ADVERSARY_SEEDS_PPM) {
            faults.adversary = AdversaryRates {
                relay_ppm: 100_000,
                inject_ppm: adversary_rng.range(500, 5_000) as u32,
            };
        }
        let mut force_rng = Rng::new(seed, 93);
        if force_rng.chance(FORCE_RELEASE_SEEDS_PPM) {
            faults.force_release_ppm = force_rng.range(20_000, 120_000) as u32;
        }
        ClusterSimConfig {
            nodes,
            base,
            faults,
            end_when_quiet: true,
            plant: None,
        }
    }

    /// No faults at all.
    pub fn without_faults(mut self) -> Self {
        self.base = self.base.without_faults();
        self.faults = ClusterFaults {
            partition_ppm: 0,
            one_way_ppm: 0,
            isolate_leader_ppm: 0,
            node_crash_ppm: 0,
            node_clock_jump_ppm: 0,
            partition_max_us: 0,
            adversary: AdversaryRates::default(),
            force_release_ppm: 0,
            majority_loss_ppm: 0,
        };
        self
    }
}

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
    /// The generation of the bootstrap members of the cluster running now:
    /// 1, or the recovery generation after a recovery (a mistaken restart
    /// with the flag of the last start uses it).
    bootstrap_generation: u64,
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
        let nodes = (0..n)
            .map(|_| NodeProc {
                node: None,
                inc: 0,
                generation: 1,
                incarnation: None,
                clock: Clock::draw(&mut clocks, drift),
                conns: BTreeMap::new(),
                timer_generation: 0,
                armed: None,
                commit_seen: 0,
                token_max: 0,
                checked: (0, 0, 0, 0),
                known_leader: (0, None, Configuration::default()),
                shadow: vec![None; ALL_KEYS.len()],
                floor: None,
            })
            .collect();
        let mut clients: Vec<ClientProc> = (0..config.base.clients)
            .map(|client| {
                let sessions = Sessions::routed(usize::from(n));
                ClientProc {
                    renews: client < config.base.renewing_clients,
                    ..ClientProc::new(Clock::draw(&mut clocks, drift), sessions)
                }
            })
            .collect();
        // Drawn after the v3 clients', so worlds without line clients are
        // what they were.
        for _ in 0..config.base.line_clients {
            let clock = Clock::draw(&mut clocks, drift);
            let owner_base = clocks.next_u64();
            let sessions = Sessions::routed(usize::from(n));
            clients.push(ClientProc::line(clock, owner_base, sessions));
        }
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
            bootstrap_generation: 1,
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

    // -----------------------------------------------------------------
    // Plumbing
    // -----------------------------------------------------------------

    fn schedule(&mut self, at_us: u64, ev: Ev) {
        self.queue.push(at_us, ev);
    }

    fn net_delay(&mut self) -> u64 {
        net::delay(&self.config.base, &mut self.net)
    }

    fn node_now(&self, slot: u8) -> ticketing_core::time::Instant {
        instant(self.nodes[usize::from(slot)].clock.local(self.now_us))
    }

    fn nonce(&mut self) -> [u8; 16] {
        net::nonce(&mut self.net, 2)
    }

    /// Whether a peer pipe's direction `dir` is cut now.
    fn is_cut(&self, pipe: &Pipe, dir: u8) -> bool {
        let Opener::Node { slot: a, .. } = pipe.opener else {
            return false;
        };
        let (from, to) = if dir == 0 {
            (a, pipe.b_slot)
        } else {
            (pipe.b_slot, a)
        };
        self.cut[usize::from(from)][usize::from(to)] > 0
    }

    /// Sends `bytes` on `pipe` in direction `dir`, split at random byte
    /// boundaries into chunks that arrive in order.
    fn send(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset || bytes.is_empty() {
            return;
        }
        if pipe.peer() && self.adversary.rates.active() {
            self.tap(pipe_id, dir, &bytes);
        }
        self.transmit(pipe_id, dir, bytes);
    }

    /// The outsider on an honest peer link: maybe writes a forged or
    /// replayed frame before `bytes` (at a frame boundary), then follows
    /// them.
    fn tap(&mut self, pipe_id: u64, dir: u8, bytes: &[u8]) {
        let tap = self.adversary.taps.entry((pipe_id, dir)).or_default();
        let boundary = tap.at_boundary();
        let from = tap.hello().map(|hello| hello.from);
        let inject_ppm = self.adversary.rates.inject_ppm;
        if self.phase == Phase::Safety
            && boundary
            && inject_ppm > 0
            && self.adversary.rng.chance(inject_ppm)
        {
            let to = self
                .adversary
                .taps
                .get(&(pipe_id, 1 - dir))
                .and_then(|tap| tap.hello())
                .map(|hello| hello.from);
            if let (Some(from), Some(to)) = (from, to) {
                let voters = self.adversary_known_ids();
                if let Some((frame, what)) = self.adversary.forge(from, to, voters) {
                    self.adversary.injected += 1;
                    self.rec.report.faults += 1;
                    self.note(|| format!("ADVERSARY writes {what} on pipe {pipe_id} dir {dir}"));
                    self.transmit(pipe_id, dir, frame);
                }
            }
        }
        let tap = self.adversary.taps.entry((pipe_id, dir)).or_default();
        let frames = tap.feed(bytes);
        self.adversary.capture(frames);
    }

    /// The newest identity per slot the outsider saw in a hello.
    fn adversary_known_ids(&self) -> Vec<NodeId> {
        let mut ids: BTreeMap<u8, NodeId> = BTreeMap::new();
        for tap in self.adversary.taps.values() {
            if let Some(hello) = tap.hello() {
                let id = ids.entry(hello.from.slot).or_insert(hello.from);
                *id = (*id).max(hello.from);
            }
        }
        ids.into_values().collect()
    }

    /// Puts `bytes` on the wire of `pipe` in direction `dir`.
    fn transmit(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if self.is_cut(pipe, dir)
            || pipe.stale[usize::from(dir)]
            || !pipe.held[usize::from(dir)].is_empty()
        {
            // The link drops everything; TCP retransmits after it heals.
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.held[usize::from(dir)].push(bytes);
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        let timed = pipe.tcp.transmit(
            usize::from(dir),
            bytes,
            self.now_us,
            &self.config.base,
            &mut self.net,
        );
        for (arrival, bytes) in timed {
            let pipe = pipe_id;
            self.schedule(arrival, Ev::Deliver { pipe, dir, bytes });
        }
    }

    /// Kills a pipe's transport: in-flight bytes after a random boundary
    /// are lost; each open end learns after the bytes that still reach it.
    fn reset_pipe(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        pipe.held = [Vec::new(), Vec::new()];
        let open = pipe.open;
        let seen = pipe
            .tcp
            .reset(open, self.now_us, &self.config.base, &mut self.net);
        for side in 0..2u8 {
            if let Some(at) = seen[usize::from(side)] {
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side,
                    },
                );
            }
        }
        self.drop_pipe_if_done(pipe_id);
    }

    fn drop_pipe_if_done(&mut self, pipe_id: u64) {
        if let Some(pipe) = self.pipes.get(&pipe_id)
            && pipe.tcp.reset
            && !pipe.dialing
            && !pipe.open[0]
            && !pipe.open[1]
        {
            self.pipes.remove(&pipe_id);
        }
    }

    fn new_pipe(&mut self, opener: Opener, b_slot: u8) -> u64 {
        let id = self.next_pipe;
        self.next_pipe += 1;
        let b_inc = self.nodes[usize::from(b_slot)].inc;
        self.pipes.insert(
            id,
            Pipe {
                opener,
                b_slot,
                b_inc,
                ids: [None, None],
                tcp: Tcp::new(),
                open: [!matches!(opener, Opener::Node { .. }), false],
                held: [Vec::new(), Vec::new()],
                stale: [false; 2],
                fin_stale: [false; 2],
                held_for_client: Vec::new(),
                close_held: false,
                writing: [false, false],
                dialing: matches!(opener, Opener::Node { .. }),
                oracle: StreamOracle::new(),
                unflushed_grants: Vec::new(),
            },
        );
        id
    }

    // -----------------------------------------------------------------
    // Nodes
    // -----------------------------------------------------------------

    fn node_config(&self, slot: u8, generation: u64) -> ClusterConfig {
        let local = self.nodes[usize::from(slot)].clock.local(self.now_us);
        let tokens = PeerTokens::new([PEER_TOKEN]).expect("sim token is long enough");
        let mut config = ClusterConfig::new(
            FINGERPRINT,
            NodeId::new(slot, generation),
            self.n,
            tokens,
            WALL_EPOCH_US + local,
        );
        config.raft = RaftConfig::fast();
        config.peer_silence_timeout =
            ticketing_core::cluster::default_peer_silence_timeout(&config.raft);
        config.limits = Limits {
            keys_max: self.config.base.keys_max,
            waiters_per_key_max: self.config.base.waiters_per_key_max,
            waiters_total_max: self.config.base.waiters_total_max,
        };
        config.connections_max = 64;
        config.in_flight_per_connection_max = 64;
        config.client_addresses = (0..self.n).map(line_address).collect();
        // The daemon's token floor at start: above the stored one.
        if let Some(stored) = self.nodes[usize::from(slot)].floor {
            config.bootstrap_wall_clock_us = config.bootstrap_wall_clock_us.max(stored + 1);
        }
        config
    }

    /// Starts `slot`: a bootstrap member at time 0, else a new generation
    /// that joins (its old state is gone) — or, as an operator's mistake,
    /// a restart with `--bootstrap`, which the core must turn into a join.
    fn node_start(&mut self, slot: u8, bootstrap: bool) {
        if self.lost || self.nodes[usize::from(slot)].node.is_some() {
            // A restart scheduled before a majority loss: the recovery
            // starts every slot.
            return;
        }
        let seed = self.net.next_u64();
        let now = self.node_now(slot);
        let amnesia = self.config.plant == Some(ClusterPlant::AmnesiacRestart);
        let mistaken_bootstrap =
            !bootstrap && !amnesia && self.fault_rng.chance(MISTAKEN_BOOTSTRAP_PPM);
        let proc = &mut self.nodes[usize::from(slot)];
        if !bootstrap {
            proc.inc += 1;
        }
        if bootstrap || !amnesia {
            // A joining node's generation, or the one a bootstrap member
            // joins under if it finds the cluster running.
            proc.generation += 1;
        }
        let generation = proc.generation;
        let first = self.bootstrap_generation;
        let voters = (0..self.n).map(|s| NodeId::new(s, first));
        let node = if amnesia && !bootstrap {
            // The planted driver bug restarts under generation 1 and skips
            // the core's check that would catch it.
            ClusterNode::bootstrap_unchecked(self.node_config(slot, 1), voters, seed, now)
        } else if bootstrap || mistaken_bootstrap {
            if mistaken_bootstrap {
                self.note(|| format!("FAULT node {slot} restarts with --bootstrap"));
            }
            ClusterNode::bootstrap(self.node_config(slot, first), voters, generation, seed, now)
        } else {
            ClusterNode::join(self.node_config(slot, generation), seed, now)
        };
        let node = self.with_floor(slot, node);
        self.install_node(slot, node);
    }

    /// With majority losses, `node` keeps a durable token floor, as the
    /// daemon does: its counter starts above the slot's stored floor, and
    /// the first reserve is durable before it runs.
    fn with_floor(&mut self, slot: u8, node: ClusterNode) -> ClusterNode {
        if self.config.faults.majority_loss_ppm == 0 {
            return node;
        }
        let s = usize::from(slot);
        let now = self.node_now(slot);
        let stored = self.nodes[s].floor;
        let mut reserve = TokenReserve::new(SIM_RESERVE_STEP, stored);
        let wall = WALL_EPOCH_US + self.nodes[s].clock.local(self.now_us);
        let first = wall.max(stored.map_or(0, |v| v + 1));
        if let Some(value) = reserve.poll_persist(now, first) {
            self.nodes[s].floor = Some(value);
            reserve.handle_persisted(value);
        }
        node.with_token_reserve(reserve)
    }

    /// Runs `node` in `slot`, checked as a new incarnation.
    fn install_node(&mut self, slot: u8, node: ClusterNode) {
        let generation = node.id().generation;
        let proc = &mut self.nodes[usize::from(slot)];
        proc.incarnation = Some(node.id());
        proc.node = Some(node);
        proc.conns.clear();
        proc.armed = None;
        proc.commit_seen = 0;
        proc.token_max = 0;
        proc.checked = (0, 0, 0, 0);
        proc.shadow = vec![None; ALL_KEYS.len()];
        self.note(|| format!("node {slot} starts, generation {generation}"));
        self.node_step(slot, None);
    }

    fn crash_node(&mut self, slot: u8) {
        let proc = &self.nodes[usize::from(slot)];
        let generation = proc.incarnation.map_or(proc.generation, |id| id.generation);
        self.note(|| format!("FAULT node {slot} generation {generation} crashes"));
        self.crash_node_quietly(slot);
        let at = self.now_us + self.fault_rng.range(200_000, 3_000_000);
        self.schedule(at, Ev::NodeRestart { slot });
    }

    /// Node `slot` crashes with no restart of its own (a majority loss:
    /// the recovery starts it).
    fn crash_node_quietly(&mut self, slot: u8) {
        let proc = &mut self.nodes[usize::from(slot)];
        let inc = proc.inc;
        proc.node = None;
        proc.conns.clear();
        proc.armed = None;
        let pipes: Vec<u64> = self.pipes.keys().copied().collect();
        for pipe_id in pipes {
            let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                continue;
            };
            let mut hit = false;
            for side in 0..2u8 {
                if pipe.node_at(side) == Some((slot, inc)) {
                    pipe.open[usize::from(side)] = false;
                    hit = true;
                }
            }
            if hit {
                self.reset_pipe(pipe_id);
            }
        }
    }

    /// Every node crashes at once: the committed state is gone but for the
    /// slots' token floors. The grants any node held end as an operator's
    /// force-release would end them (their holders' later writes are
    /// fenced); the operator recovers the cluster later.
    fn fault_majority_loss(&mut self) {
        // What the most advanced applied state holds: a lagging node may
        // still show grants released since.
        let mut held: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let newest = self
            .nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .max_by_key(|node| node.raft().applied_index());
        if let Some(node) = newest {
            for (token, holding) in node.lock_state().grants() {
                let keys = holding
                    .keys
                    .keys()
                    .iter()
                    .map(|key| key_index(key.as_bytes()))
                    .collect();
                held.insert(token, keys);
            }
        }
        self.rec.report.faults += 1;
        self.rec.report.cluster_majority_losses += 1;
        self.note(|| {
            format!(
                "FAULT every node crashes: a majority loss ({} grants end)",
                held.len()
            )
        });
        for (token, keys) in held {
            let names: Vec<&str> = keys.iter().map(|&k| ALL_KEYS[k]).collect();
            let key_set = KeySet::new(&names).expect("sim keys are valid");
            let hist = self.history.open(
                self.now_us,
                &key_set,
                LinOp::ForceReleaseIndeterminate { token },
            );
            self.history
                .resolve(self.now_us, &hist, |_| LinOp::ForceReleased { token });
            self.force_requested.insert(token);
            self.exempt_force_released(token);
        }
        // Answers to force-releases in flight never come.
        self.admin_pending.clear();
        for slot in 0..self.n {
            if self.nodes[usize::from(slot)].node.is_some() {
                self.crash_node_quietly(slot);
            }
        }
        self.lost = true;
        let at = self.now_us + self.fault_rng.range(200_000, 3_000_000);
        self.schedule(at, Ev::Recover);
    }

    /// `serve --recover` on every slot: the core decides each node's token
    /// floor from the slot's stored floor and a clock an hour behind, and
    /// the nodes bootstrap in the recovery generation under the same
    /// identity. Raft starts over (terms and indices from 1), so the Raft
    /// oracle does too.
    fn recover(&mut self) {
        self.lost = false;
        self.bootstrap_generation = RECOVERY_GENERATION;
        self.leaders.clear();
        self.committed.clear();
        self.entries.clear();
        self.states.clear();
        self.note(|| "the operator recovers the cluster (--recover on every slot)".into());
        let voters: Vec<NodeId> = (0..self.n)
            .map(|s| NodeId::new(s, RECOVERY_GENERATION))
            .collect();
        for slot in 0..self.n {
            let s = usize::from(slot);
            let wall = WALL_EPOCH_US + self.nodes[s].clock.local(self.now_us);
            let facts = RecoveryFacts {
                slot_count: self.n,
                self_slot: slot,
                stored_floor: self.nodes[s].floor,
                explicit_floor: None,
                peers: Vec::new(),
                wall_clock: ticketing_core::time::Duration::from_micros(
                    wall.saturating_sub(RECOVERY_CLOCK_BACK_US),
                ),
            };
            let plan = match recovery::decide_recovery(&facts) {
                Ok(mut plan) if self.config.plant == Some(ClusterPlant::RecoverFromClock) => {
                    plan.token_floor = wall.saturating_sub(RECOVERY_CLOCK_BACK_US);
                    plan
                }
                Ok(plan) => plan,
                Err(refusal) => {
                    self.violation(Checker::ServerState, format!("recovery refused: {refusal}"));
                    continue;
                }
            };
            let proc = &mut self.nodes[s];
            proc.inc += 1;
            proc.generation = proc.generation.max(RECOVERY_GENERATION) + 1;
            let rejoin = proc.generation;
            let mut config = self.node_config(slot, RECOVERY_GENERATION);
            config.bootstrap_wall_clock_us = plan.token_floor;
            config.recovering = true;
            let seed = self.net.next_u64();
            let now = self.node_now(slot);
            let node = ClusterNode::bootstrap(config, voters.clone(), rejoin, seed, now);
            let node = self.with_floor(slot, node);
            self.install_node(slot, node);
        }
    }

    /// The operator orders a force-release on the leader: of a key its
    /// applied state shows held, naming the holder's token, or (a quarter
    /// of the time) a stale token, which must change nothing; in a third of
    /// them the leader is isolated right after, so the command may commit
    /// across a leader change or end indeterminate. The history gets the
    /// operator's release of that token on every key of the grant.
    fn fault_force_release(&mut self) {
        let Some(slot) = self
            .nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .find(|node| node.is_leader())
            .map(|node| node.id().slot)
        else {
            return;
        };
        let s = usize::from(slot);
        let Some(node) = self.nodes[s].node.as_ref() else {
            return;
        };
        let held: Vec<(u64, Vec<usize>)> = node
            .lock_state()
            .grants()
            .map(|(token, holding)| {
                let keys = holding
                    .keys
                    .keys()
                    .iter()
                    .map(|key| key_index(key.as_bytes()))
                    .collect();
                (token, keys)
            })
            .collect();
        self.check_listing(slot, &held);
        if held.is_empty() {
            return;
        }
        let (holder, keys) = held[self.force_rng.index(held.len())].clone();
        let key = keys[self.force_rng.index(keys.len())];
        let stale = self.force_rng.chance(250_000);
        // A stale token: one issued before the holder's, which no longer
        // holds this key (tokens only grow).
        let token = if stale {
            holder.saturating_sub(1 + self.force_rng.below(3))
        } else {
            holder
        };
        let isolate = self.force_rng.chance(330_000);
        let id = self.next_admin_id;
        self.next_admin_id += 1;
        self.rec.report.faults += 1;
        self.rec.report.cluster_force_releases += 1;
        self.note(|| {
            format!(
                "FAULT operator force-releases {} token {token} on leader {slot} (request {id}{})",
                ALL_KEYS[key],
                if isolate { ", then isolates it" } else { "" }
            )
        });
        // The operator's release of `token` on every key it may free.
        let names: Vec<&str> = if stale {
            vec![ALL_KEYS[key]]
        } else {
            keys.iter().map(|&k| ALL_KEYS[k]).collect()
        };
        let key_set = KeySet::new(&names).expect("sim keys are valid");
        let silent = self.config.plant == Some(ClusterPlant::SilentForceRelease);
        let hist = if silent {
            Vec::new()
        } else {
            self.history.open(
                self.now_us,
                &key_set,
                LinOp::ForceReleaseIndeterminate { token },
            )
        };
        if !stale && !silent {
            // A stale token holds nothing this command can free.
            self.force_requested.insert(token);
            self.exempt_force_released(token);
        }
        let inc = self.nodes[s].inc;
        self.admin_pending.insert(
            id,
            AdminOp {
                slot,
                inc,
                token,
                hist,
            },
        );
        let now = self.node_now(slot);
        let request = ForceRelease {
            key: Key::new(ALL_KEYS[key].as_bytes()).expect("sim keys are valid"),
            token: Some(token),
        };
        if let Some(node) = self.nodes[s].node.as_mut() {
            node.handle_force_release(now, AdminRequestId(id), request);
        }
        self.node_step(slot, None);
        if isolate {
            let links = (0..self.n)
                .filter(|&other| other != slot)
                .flat_map(|other| [(slot, other), (other, slot)])
                .collect();
            self.partition(
                links,
                format!("leader {slot} isolated after a force-release"),
            );
        }
    }

    /// The operator lists the leader's locks as the admin API does, page
    /// by page of three: every key its applied state holds (`held`, by
    /// token) must be listed exactly once with that token, and no key
    /// twice. Read-only and draws nothing from the run's random streams,
    /// so a run's trace is the same with or without it.
    fn check_listing(&mut self, slot: u8, held: &[(u64, Vec<usize>)]) {
        let now = self.node_now(slot);
        let Some(node) = self.nodes[usize::from(slot)].node.as_ref() else {
            return;
        };
        let mut listed: BTreeMap<usize, Vec<Option<u64>>> = BTreeMap::new();
        let mut cursor = Some(ListingCursor::START);
        let mut wrong = Vec::new();
        for _ in 0..=ALL_KEYS.len() * 2 + 2 {
            let Some(at) = cursor else {
                break;
            };
            let Ok(page) = node.locks(now, b"", 3, at) else {
                // Not a caught-up leader: it answers no listing.
                return;
            };
            for view in page.locks {
                listed
                    .entry(key_index(view.key.as_bytes()))
                    .or_default()
                    .push(view.holder.map(|holder| holder.token));
            }
            cursor = page.next;
        }
        if cursor.is_some() {
            wrong.push("the scan did not end".to_owned());
        }
        for (token, keys) in held {
            for &key in keys {
                match listed.get(&key).map(Vec::as_slice) {
                    Some([Some(shown)]) if shown == token => {}
                    other => wrong.push(format!(
                        "{} held by {token} listed as {other:?}",
                        ALL_KEYS[key]
                    )),
                }
            }
        }
        for (key, seen) in &listed {
            if seen.len() > 1 {
                wrong.push(format!("{} listed {} times", ALL_KEYS[*key], seen.len()));
            }
        }
        for detail in wrong {
            self.violation(
                Checker::ServerState,
                format!("leader {slot}'s listing: {detail}"),
            );
        }
    }

    /// Grant `token` may end without its holder knowing: its validity
    /// window and its fenced writes are judged in an era of their own.
    fn exempt_force_released(&mut self, token: u64) {
        let era = force_released_era(token);
        if let Some(info) = self.grants.get_mut(&token) {
            info.era = era;
        }
        for proc in &mut self.clients {
            for op in proc.ops.values_mut() {
                if let OpState::Holding { grant, era: e, .. } = op
                    && grant.token == token
                {
                    *e = era;
                }
            }
        }
    }

    /// The answers to force-releases a node has: each resolves the
    /// operator's history entries as the answer says.
    fn resolve_admin_replies(
        &mut self,
        slot: u8,
        answers: Vec<(AdminRequestId, ForceReleaseOutcome)>,
    ) {
        let s = usize::from(slot);
        let inc = self.nodes[s].inc;
        for (AdminRequestId(id), outcome) in answers {
            let Some(op) = self.admin_pending.remove(&id) else {
                self.violation(
                    Checker::Replies,
                    format!("node {slot} answered force-release {id} twice or unasked"),
                );
                continue;
            };
            if (op.slot, op.inc) != (slot, inc) {
                self.violation(
                    Checker::Replies,
                    format!(
                        "node {slot} answered force-release {id} sent to node {}",
                        op.slot
                    ),
                );
                continue;
            }
            self.note(|| format!("node {slot} answers force-release {id}: {outcome:?}"));
            let token = op.token;
            let bucket = match outcome {
                ForceReleaseOutcome::Released { .. } => 0,
                ForceReleaseOutcome::Indeterminate => 1,
                ForceReleaseOutcome::NotHeld | ForceReleaseOutcome::TokenMismatch { .. } => 2,
                ForceReleaseOutcome::NotLeader { .. } | ForceReleaseOutcome::Busy => 3,
            };
            self.rec.report.force_outcomes[bucket] += 1;
            match outcome {
                ForceReleaseOutcome::Released {
                    revoked, handed_to, ..
                } => {
                    if handed_to.is_some_and(|next| next <= revoked) {
                        self.violation(
                            Checker::Tokens,
                            format!("force-release of {revoked} handed over to {handed_to:?}"),
                        );
                    }
                    if revoked != token {
                        self.violation(
                            Checker::Replies,
                            format!("force-release of token {token} revoked {revoked}"),
                        );
                    }
                    self.history
                        .resolve(self.now_us, &op.hist, |_| LinOp::ForceReleased { token });
                }
                ForceReleaseOutcome::NotHeld | ForceReleaseOutcome::TokenMismatch { .. } => {
                    self.history
                        .resolve(self.now_us, &op.hist, |_| LinOp::NotFound { token });
                }
                // It may still take effect: the entry stays open.
                ForceReleaseOutcome::Indeterminate => {}
                // Refused before proposing: no effect.
                ForceReleaseOutcome::NotLeader { .. } | ForceReleaseOutcome::Busy => {
                    self.history.forget(&op.hist);
                }
            }
        }
    }

    fn node_alive(&self, slot: u8, inc: u64) -> bool {
        let proc = &self.nodes[usize::from(slot)];
        proc.inc == inc && proc.node.is_some()
    }

    /// The node's events: the latest one of each kind names the state the
    /// node is in now (they are queued as changes happen, not sampled).
    /// Not part of the trace.
    fn check_node_events(&mut self, slot: u8, events: Vec<NodeEvent>) {
        let Some(node) = self.nodes[usize::from(slot)].node.as_ref() else {
            return;
        };
        let (mut leader, mut voter, mut generation) = (None, None, None);
        for event in events {
            match event {
                NodeEvent::LeaderChanged { leader: l, .. } => leader = Some(l),
                NodeEvent::VoterChanged { is_voter } => voter = Some(is_voter),
                NodeEvent::GenerationChanged { generation: g } => generation = Some(g),
                NodeEvent::PeerFramesRefused { .. }
                | NodeEvent::RaftMessagesRefused { .. }
                | NodeEvent::RecoveryEvidence { .. } => {}
            }
        }
        let mut wrong = Vec::new();
        if leader.is_some_and(|l| l != node.leader()) {
            wrong.push(format!("leader {leader:?}, node has {:?}", node.leader()));
        }
        if voter.is_some_and(|v| v != node.raft().is_voter()) {
            wrong.push(format!(
                "voter {voter:?}, node has {}",
                node.raft().is_voter()
            ));
        }
        if generation.is_some_and(|g| g != node.id().generation) {
            wrong.push(format!("generation {generation:?}, node has {}", node.id()));
        }
        for detail in wrong {
            self.violation(Checker::Raft, format!("node {slot} reported {detail}"));
        }
    }

    /// Everything node `slot` emits now, by kind; its alerts and reports
    /// go to the notes (not part of the trace).
    fn drain_node_outputs(&mut self, slot: u8) -> NodeOutputs {
        let s = usize::from(slot);
        let now = self.node_now(slot);
        let mut outputs = NodeOutputs::default();
        let mut noted = Vec::new();
        let mut persisted = 0;
        if let Some(node) = self.nodes[s].node.as_mut() {
            while let Some(output) = node.poll_output(now) {
                match output {
                    Output::Wake(id) => outputs.woken.push(id),
                    Output::Dial { slot: target } => outputs.dials.push(target),
                    Output::AdminReply { id, outcome } => outputs.admin.push((id, outcome)),
                    Output::Node(event) => outputs.events.push(event),
                    // Formatted only when tracing.
                    Output::Alert(_) | Output::Log(_) => noted.push(output),
                    // Durable at once (only nodes with a floor ask).
                    Output::Reserve { value } => {
                        persisted = persisted.max(value);
                        node.handle_reserve_persisted(now, value);
                    }
                }
            }
        }
        if persisted > 0 {
            let floor = &mut self.nodes[s].floor;
            *floor = Some(floor.map_or(persisted, |f| f.max(persisted)));
        }
        for output in noted {
            self.note(|| format!("node {slot}: {output:?}"));
        }
        outputs
    }

    /// After any node input: admin answers, events, dials, transmits, timer.
    fn node_step(&mut self, slot: u8, retake: Option<ConnId>) {
        let NodeOutputs {
            admin,
            events,
            dials,
            mut woken,
        } = self.drain_node_outputs(slot);
        self.resolve_admin_replies(slot, admin);
        self.check_node_events(slot, events);
        let s = usize::from(slot);
        let inc = self.nodes[s].inc;
        if self.nodes[s].node.is_none() {
            return;
        }
        woken.extend(retake);
        woken.sort();
        woken.dedup();
        for target in dials {
            let pipe = self.new_pipe(Opener::Node { slot, inc }, target);
            self.note(|| format!("node {slot} dials {target} (pipe {pipe})"));
            let at = self.now_us + self.net_delay();
            self.schedule(at, Ev::DialArrive { pipe });
        }
        for id in woken {
            let Some(&pipe_id) = self.nodes[s].conns.get(&id) else {
                continue;
            };
            let Some(pipe) = self.pipes.get(&pipe_id) else {
                continue;
            };
            let side: u8 = if pipe.node_at(1) == Some((slot, inc)) && pipe.ids[1] == Some(id) {
                1
            } else {
                0
            };
            if pipe.writing[usize::from(side)] {
                // One take at a time, as in the runtimes; retaken after
                // the flush.
                continue;
            }
            let mut out = Vec::new();
            let node = self.nodes[s].node.as_mut().expect("checked above");
            let state = node.poll_transmit(id, &mut out);
            if state == ConnState::Gone {
                continue;
            }
            let close = state == ConnState::CloseAfterFlush;
            if out.is_empty() && !close {
                continue;
            }
            if self.pipes[&pipe_id].client() {
                self.observe_replies(slot, pipe_id, &out);
            }
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.writing[usize::from(side)] = true;
            let partial_ppm = self.config.base.faults.partial_write_ppm;
            for part in net::write_parts(&mut self.net, self.now_us, partial_ppm, out) {
                self.schedule(
                    part.at_us,
                    Ev::Flush {
                        pipe: pipe_id,
                        side,
                        bytes: part.bytes,
                        done: part.done,
                        close: close && part.done,
                    },
                );
            }
        }
        let proc = &mut self.nodes[s];
        let Some(node) = proc.node.as_ref() else {
            return;
        };
        let deadline = node.poll_timeout();
        if deadline == proc.armed {
            return;
        }
        proc.armed = deadline;
        if let Some(deadline) = deadline {
            proc.timer_generation += 1;
            let generation = proc.timer_generation;
            let at = proc.clock.true_at(deadline.as_micros()).max(self.now_us);
            self.schedule(
                at,
                Ev::NodeTimer {
                    slot,
                    inc,
                    generation,
                },
            );
        }
    }

    /// Oracle: the replies in bytes a node took for a client pipe.
    fn observe_replies(&mut self, slot: u8, pipe_id: u64, out: &[u8]) {
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        let (replies, bad) = pipe.oracle.replies(out);
        if let Some(error) = bad {
            self.violation(
                Checker::Replies,
                format!("node wrote a bad frame on pipe {pipe_id}: {error:?}"),
            );
        }
        for (reply, end_offset) in replies {
            let Some(rid) = reply.rid() else {
                continue; // `L` notices
            };
            let renewal = self.renewals.remove(&(pipe_id, rid));
            let Some(acquire) = self.pending.remove(&(pipe_id, rid)) else {
                self.violation(
                    Checker::Replies,
                    format!("reply {reply:?} on pipe {pipe_id} answers no request in flight"),
                );
                continue;
            };
            let fits = match reply {
                Reply::Acquired { .. }
                | Reply::AcquiredSet { .. }
                | Reply::TimedOut { .. }
                | Reply::Busy { .. } => acquire,
                Reply::Released { .. } | Reply::ReleasedSet { .. } | Reply::NotFound { .. } => {
                    !acquire
                }
                Reply::Indeterminate { .. } | Reply::Moved { .. } => true,
                Reply::Error { code, .. } => {
                    matches!(code, ErrorCode::NotActive | ErrorCode::NoLeader)
                        || (!acquire && code == ErrorCode::GroupMismatch)
                }
                Reply::Negotiated { .. } => !acquire && renewal.is_none(),
                Reply::Extended { .. } => renewal.is_some(),
                // Cluster nodes do not serve semaphores.
                // Cluster nodes do not serve semaphores, nor observing.
                Reply::Permits { .. } | Reply::CapacityMismatch { .. } => false,
                Reply::Observed { .. } => false,
                // `P` has no rid and never gets here.
                Reply::Push { .. } => false,
                Reply::Leader { .. } => false,
            };
            if !fits {
                self.violation(
                    Checker::Replies,
                    format!("reply {reply:?} on pipe {pipe_id} does not fit its request"),
                );
            }
            let answered = match (&reply, renewal) {
                (Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. }, _) => {
                    Some(*token)
                }
                (Reply::Extended { .. }, renewed) => renewed,
                _ => None,
            };
            if let Some(token) = answered {
                self.remember_expiry(slot, pipe_id, rid, token);
            }
            if let Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } = reply {
                if !self.replied.insert(token) {
                    self.violation(
                        Checker::Tokens,
                        format!("token {token} granted in two replies"),
                    );
                }
                let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
                pipe.unflushed_grants.push((token, end_offset));
            }
        }
    }

    /// Deadline checker's record: when grant `token`, just granted or
    /// renewed in the answer to `rid` on `pipe_id`, expires on the node in
    /// `slot` that answered (its own apply time plus the lease), in true
    /// time.
    fn remember_expiry(&mut self, slot: u8, pipe_id: u64, rid: u64, token: u64) {
        let proc = &self.nodes[usize::from(slot)];
        let Some(node) = proc.node.as_ref() else {
            return;
        };
        let Some(holding) = node.lock_state().grant(token) else {
            return;
        };
        let expiry_us = proc.clock.true_at(holding.deadline.as_micros());
        if self.answered.len() >= ANSWERED_MAX {
            self.answered.pop_first();
        }
        self.answered
            .insert((pipe_id, rid), (expiry_us, self.lease_era));
    }

    fn dial_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        let Opener::Node { slot: from, inc } = pipe.opener else {
            return;
        };
        let to = pipe.b_slot;
        let to_inc = self.nodes[usize::from(to)].inc;
        let cut = self.cut[usize::from(from)][usize::from(to)] > 0
            || self.cut[usize::from(to)][usize::from(from)] > 0;
        let up = self.nodes[usize::from(to)].node.is_some() && !pipe.tcp.reset;
        if !self.node_alive(from, inc) {
            self.pipes.remove(&pipe_id);
            return;
        }
        if cut || !up {
            let at = if cut {
                self.now_us + DIAL_TIMEOUT_US
            } else {
                self.now_us + self.net_delay()
            };
            return self.dial_fails(pipe_id, at);
        }
        let now = self.node_now(to);
        let nonce = self.nonce();
        let accepted = self.nodes[usize::from(to)]
            .node
            .as_mut()
            .and_then(|node| node.handle_peer_accept(now, nonce, node_source(from)));
        let Some(id) = accepted else {
            let at = self.now_us + self.net_delay();
            return self.dial_fails(pipe_id, at);
        };
        let answer_at = self.now_us + self.net_delay();
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.b_inc = to_inc;
        pipe.ids[1] = Some(id);
        pipe.open[1] = true;
        // The acceptor's bytes travel behind its SYN-ACK.
        pipe.tcp.last_us[1] = answer_at;
        self.nodes[usize::from(to)].conns.insert(id, pipe_id);
        self.schedule(
            answer_at,
            Ev::DialAnswer {
                pipe: pipe_id,
                ok: true,
            },
        );
        self.node_step(to, None);
    }

    /// The dialer of `pipe_id` learns at `at` that its dial failed.
    fn dial_fails(&mut self, pipe_id: u64, at: u64) {
        self.schedule(
            at,
            Ev::DialAnswer {
                pipe: pipe_id,
                ok: false,
            },
        );
    }

    fn dial_answer(&mut self, pipe_id: u64, ok: bool) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        let Opener::Node { slot: from, inc } = pipe.opener else {
            return;
        };
        let to = pipe.b_slot;
        let reset = pipe.tcp.reset;
        self.pipes.get_mut(&pipe_id).expect("checked above").dialing = false;
        if !self.node_alive(from, inc) {
            // The dialer is gone: the acceptor's side dies with it.
            self.reset_pipe(pipe_id);
            return;
        }
        let now = self.node_now(from);
        if !ok || reset {
            // A reset after the accept: the acceptor learns by SeesClose.
            self.drop_pipe_if_done(pipe_id);
            if !ok {
                self.pipes.remove(&pipe_id);
            }
            if let Some(node) = self.nodes[usize::from(from)].node.as_mut() {
                node.handle_dial_failed(now, to);
            }
            self.node_step(from, None);
            return;
        }
        let nonce = self.nonce();
        let node = self.nodes[usize::from(from)]
            .node
            .as_mut()
            .expect("alive checked");
        let id = node
            .handle_dialed(now, to, nonce)
            .expect("a dialed connection is taken");
        self.nodes[usize::from(from)].conns.insert(id, pipe_id);
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.ids[0] = Some(id);
        pipe.open[0] = true;
        self.node_step(from, None);
    }

    fn client_connect_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        let slot = pipe.b_slot;
        let now = self.node_now(slot);
        let source = match pipe.opener {
            Opener::Client { client, .. } => client_source(client),
            Opener::Node { slot, .. } => node_source(slot),
            Opener::Adversary => adversary_source(),
        };
        let nonce = self.nonce();
        let inc = self.nodes[usize::from(slot)].inc;
        let accepted = self.nodes[usize::from(slot)]
            .node
            .as_mut()
            .and_then(|node| node.handle_connect(now, nonce, source));
        match accepted {
            Some(id) => {
                self.nodes[usize::from(slot)].conns.insert(id, pipe_id);
                let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                pipe.ids[1] = Some(id);
                pipe.b_inc = inc;
                pipe.open[1] = true;
                self.node_step(slot, None);
            }
            None => {
                self.note(|| format!("pipe {pipe_id} refused by node {slot}"));
                self.reset_pipe(pipe_id);
            }
        }
    }

    /// The node connection id of `side` of a pipe, if that node still runs
    /// the incarnation that owns it.
    fn node_conn(&self, pipe_id: u64, side: u8) -> Option<(u8, ConnId)> {
        let pipe = self.pipes.get(&pipe_id)?;
        let (slot, inc) = pipe.node_at(side)?;
        let id = pipe.ids[usize::from(side)]?;
        (pipe.open[usize::from(side)] && self.node_alive(slot, inc)).then_some((slot, id))
    }

    fn deliver(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        let d = usize::from(dir);
        pipe.tcp.landed(d, bytes.len());
        let Some(bytes) = pipe.tcp.keep(d, bytes) else {
            return;
        };
        let to_side = if dir == 0 { 1 } else { 0 };
        if to_side == 0
            && let Opener::Client { client, inc } = pipe.opener
        {
            return self.deliver_to_client(pipe_id, client, inc, bytes);
        }
        if to_side == 0 && pipe.opener == Opener::Adversary {
            return self.adversary_receive(pipe_id, bytes);
        }
        let Some((slot, id)) = self.node_conn(pipe_id, to_side) else {
            return;
        };
        if self.pipes[&pipe_id].client() {
            self.observe_requests(pipe_id, &bytes);
        }
        let now = self.node_now(slot);
        if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
            node.handle_input(now, id, &bytes);
        }
        self.node_step(slot, None);
    }

    /// Oracle: requests a node receives on a client pipe.
    fn observe_requests(&mut self, pipe_id: u64, bytes: &[u8]) {
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        for request in pipe.oracle.requests(bytes) {
            self.rec.report.requests += 1;
            let (rid, acquire) = match &request {
                Request::Acquire(acquire) => (acquire.rid, true),
                Request::Release(release) => {
                    self.release_requested.insert(release.token);
                    (release.rid, false)
                }
                Request::Negotiate(req) => (req.rid, false),
                Request::Extend(req) => {
                    self.renewals.insert((pipe_id, req.rid), req.token);
                    (req.rid, false)
                }
                Request::AcquireCapped(req) => (req.rid, true),
                Request::AcquirePermits(req) => (req.rid, true),
                Request::Observe(req) => (req.rid, false),
            };
            if self.pending.insert((pipe_id, rid), acquire).is_some() {
                self.violation(
                    Checker::Client,
                    format!("pipe {pipe_id} reused rid {rid} while in flight"),
                );
            }
        }
    }

    fn flush(&mut self, pipe_id: u64, side: u8, bytes: Vec<u8>, done: bool, close: bool) {
        let Some((slot, id)) = self.node_conn(pipe_id, side) else {
            return;
        };
        let pipe = &self.pipes[&pipe_id];
        if pipe.tcp.reset {
            return;
        }
        let dir = if side == 1 { 1 } else { 0 };
        let written = bytes.len();
        self.send(pipe_id, dir, bytes);
        // Each part is reported as it goes out, as the drivers do: a grant
        // whose frame is written whole is delivered even if the rest is lost.
        let now = self.node_now(slot);
        let report = self.config.plant != Some(ClusterPlant::NeverReportFlushed);
        if report {
            if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
                node.handle_written(now, id, written);
            }
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.oracle.written_total += written as u64;
            let written_total = pipe.oracle.written_total;
            pipe.unflushed_grants
                .retain(|(_, end_offset)| *end_offset > written_total);
        }
        if !done {
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.writing[usize::from(side)] = false;
        if close {
            // Closed after flushing: FIN after the bytes.
            self.node_closes(pipe_id, side);
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.tcp.reset = true;
            let other = 1 - side;
            if pipe.stale[usize::from(dir)] {
                pipe.fin_stale[usize::from(dir)] = true;
            } else if pipe.open[usize::from(other)] {
                let at = pipe.tcp.last_us[usize::from(dir)].max(self.now_us) + 1;
                pipe.tcp.allow = [usize::MAX, usize::MAX];
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side: other,
                    },
                );
            }
            self.drop_pipe_if_done(pipe_id);
        } else {
            self.node_step(slot, Some(id));
        }
    }

    /// The node at `side` learns its connection is gone.
    fn node_closes(&mut self, pipe_id: u64, side: u8) {
        let Some((slot, id)) = self.node_conn(pipe_id, side) else {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[usize::from(side)] = false;
            }
            return;
        };
        let now = self.node_now(slot);
        if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
            node.handle_closed(now, id);
        }
        self.nodes[usize::from(slot)].conns.remove(&id);
        let pipe = self.pipes.get_mut(&pipe_id).expect("node_conn found it");
        pipe.open[usize::from(side)] = false;
        let ghosts = std::mem::take(&mut pipe.unflushed_grants);
        for (token, _) in ghosts {
            // Released at once by the node as never delivered.
            if self.received.contains(&token) {
                self.violation(
                    Checker::Replies,
                    format!(
                        "pipe {pipe_id} closed before grant {token} was reported flushed, so node {slot} releases it, yet a client received it"
                    ),
                );
            }
            self.ghosts.insert(token);
        }
        self.pending.retain(|(p, _), _| *p != pipe_id);
        self.node_step(slot, None);
    }

    fn sees_close(&mut self, pipe_id: u64, side: u8) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if side == 0
            && let Opener::Client { client, inc } = pipe.opener
        {
            self.client_sees_close(pipe_id, client, inc);
        } else if side == 0 && pipe.opener == Opener::Adversary {
            self.adversary.conns.remove(&pipe_id);
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[0] = false;
            }
        } else {
            self.node_closes(pipe_id, side);
        }
        self.drop_pipe_if_done(pipe_id);
    }

    // -----------------------------------------------------------------
    // The outsider
    // -----------------------------------------------------------------

    /// Opens a connection to the leader (or any node) and one to another
    /// node, to relay the hellos between them.
    fn adversary_relay(&mut self) {
        let n = self.n;
        let leader = self
            .nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .find(|node| node.is_leader())
            .map(|node| node.id().slot);
        let x = leader.unwrap_or_else(|| self.adversary.rng.below(u64::from(n)) as u8);
        let y = (x + 1 + self.adversary.rng.below(u64::from(n) - 1) as u8) % n;
        let (px, py) = (
            self.new_pipe(Opener::Adversary, x),
            self.new_pipe(Opener::Adversary, y),
        );
        self.adversary.relays += 1;
        self.rec.report.faults += 1;
        self.note(|| {
            format!("ADVERSARY dials node {x} (pipe {px}) and node {y} (pipe {py}) to relay")
        });
        for (pipe, partner) in [(px, py), (py, px)] {
            self.adversary.conns.insert(
                pipe,
                crate::adversary::AdversaryConn {
                    partner: Some(partner),
                    ..Default::default()
                },
            );
            let at = self.now_us + self.net_delay();
            self.schedule(at, Ev::AdversaryArrive { pipe });
            self.schedule(
                self.now_us + ADVERSARY_FINISH_US,
                Ev::AdversaryFinish { pipe },
            );
        }
    }

    fn adversary_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        let slot = pipe.b_slot;
        let now = self.node_now(slot);
        let nonce = self.nonce();
        let inc = self.nodes[usize::from(slot)].inc;
        let accepted = self.nodes[usize::from(slot)]
            .node
            .as_mut()
            .and_then(|node| node.handle_peer_accept(now, nonce, adversary_source()));
        match accepted {
            Some(id) => {
                self.nodes[usize::from(slot)].conns.insert(id, pipe_id);
                let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                pipe.ids[1] = Some(id);
                pipe.b_inc = inc;
                pipe.open[1] = true;
                self.node_step(slot, None);
            }
            None => {
                self.adversary.conns.remove(&pipe_id);
                self.close_transport(pipe_id);
            }
        }
    }

    /// Bytes a node sent the outsider: its hello, and nothing else, ever
    /// (an acceptor proves only after the dialer did). Once both hellos of
    /// a relay are in, each node gets the other's, claiming to dial;
    /// anything more a node sends is shuttled to the other.
    fn adversary_receive(&mut self, pipe_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.adversary.conns.get_mut(&pipe_id) else {
            return;
        };
        let before = conn.received.len();
        if conn.received.len() < 4_096 {
            conn.received.extend_from_slice(&bytes);
        }
        let (partner, hello_sent) = (conn.partner, conn.hello_sent);
        let from = before.max(PEER_HELLO_LEN).min(conn.received.len());
        let shuttle = conn.received[from..].to_vec();
        let sent = conn.received.len().saturating_sub(PEER_HELLO_LEN);
        if !shuttle.is_empty() {
            let slot = self.pipes.get(&pipe_id).map(|pipe| pipe.b_slot);
            self.violation(
                Checker::Raft,
                format!(
                    "node {slot:?} sent the outsider {sent} bytes after its hello on pipe {pipe_id}"
                ),
            );
            if let Some(partner) = partner {
                self.send(partner, 0, shuttle);
            }
        }
        if hello_sent {
            return;
        }
        let Some(partner) = partner else {
            return;
        };
        let own = self.adversary.conns.get(&pipe_id).and_then(|c| c.hello());
        let other = self.adversary.conns.get(&partner).and_then(|c| c.hello());
        if let (Some(own), Some(other)) = (own, other) {
            for (to, claim) in [(pipe_id, other), (partner, own)] {
                if let Some(conn) = self.adversary.conns.get_mut(&to) {
                    conn.hello_sent = true;
                }
                self.send(to, 0, Adversary::relay_hello(&claim));
            }
        }
    }

    /// The outsider writes a guessed proof and a forged frame claiming to
    /// be the other node of the relay.
    fn adversary_finish(&mut self, pipe_id: u64) {
        if self.phase != Phase::Safety {
            return;
        }
        let Some(conn) = self.adversary.conns.get(&pipe_id) else {
            return;
        };
        let to = conn.hello().map(|hello| hello.from);
        let from = conn
            .partner
            .and_then(|partner| self.adversary.conns.get(&partner))
            .and_then(|partner| partner.hello())
            .map(|hello| hello.from);
        let mut bytes = self.adversary.guessed_proof();
        if let (Some(from), Some(to)) = (from, to) {
            let voters = self.adversary_known_ids();
            if let Some((frame, _)) = self.adversary.forge(from, to, voters) {
                bytes.extend_from_slice(&frame);
            }
        }
        self.send(pipe_id, 0, bytes);
    }

    // -----------------------------------------------------------------
    // Partitions
    // -----------------------------------------------------------------

    fn partition(&mut self, links: Vec<(u8, u8)>, what: String) {
        let id = self.next_partition;
        self.next_partition += 1;
        for &(from, to) in &links {
            self.cut[usize::from(from)][usize::from(to)] += 1;
        }
        self.note(|| format!("FAULT partition {id}: {what}"));
        self.partitions.insert(id, links);
        let max = self.config.faults.partition_max_us.max(300_000);
        let at = self.now_us + self.fault_rng.range(100_000, max);
        self.schedule(at, Ev::Heal { id });
        // Some connections over a cut link time out (TCP user timeout).
        let affected: Vec<u64> = self
            .pipes
            .iter()
            .filter(|(_, pipe)| pipe.peer() && !pipe.tcp.reset)
            .filter(|(_, pipe)| self.is_cut(pipe, 0) || self.is_cut(pipe, 1))
            .map(|(&id, _)| id)
            .collect();
        for pipe_id in affected {
            if self.fault_rng.chance(300_000) {
                self.reset_pipe(pipe_id);
            }
        }
    }

    fn heal(&mut self, id: u64) {
        let Some(links) = self.partitions.remove(&id) else {
            return;
        };
        self.note(|| format!("partition {id} heals"));
        for (from, to) in links {
            self.cut[usize::from(from)][usize::from(to)] -= 1;
        }
        let pipes: Vec<u64> = self.pipes.keys().copied().collect();
        for pipe_id in pipes {
            for dir in 0..2u8 {
                let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                    continue;
                };
                if pipe.held[usize::from(dir)].is_empty() || self.is_cut(&self.pipes[&pipe_id], dir)
                {
                    continue;
                }
                let (peer, stale) = {
                    let pipe = &self.pipes[&pipe_id];
                    (pipe.peer(), pipe.stale[usize::from(dir)])
                };
                if peer && !stale && self.fault_rng.chance(STALE_PPM) {
                    let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                    pipe.stale[usize::from(dir)] = true;
                    self.rec.report.faults += 1;
                    self.note(|| {
                        format!("FAULT pipe {pipe_id} dir {dir} stays stale after the heal")
                    });
                    let at = self.now_us + STALE_US;
                    self.schedule(at, Ev::Retransmit { pipe: pipe_id, dir });
                    continue;
                }
                if self.pipes[&pipe_id].stale[usize::from(dir)] {
                    continue;
                }
                let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                let held = std::mem::take(&mut pipe.held[usize::from(dir)]);
                for chunk in held {
                    self.send(pipe_id, dir, chunk);
                }
            }
        }
    }

    /// A stale direction's retransmission gets through: its held bytes
    /// arrive, then a close that waited behind them.
    fn retransmit(&mut self, pipe_id: u64, dir: u8) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        pipe.stale[usize::from(dir)] = false;
        let fin = std::mem::take(&mut pipe.fin_stale[usize::from(dir)]);
        if fin {
            let other = if dir == 0 { 1 } else { 0 };
            if pipe.open[usize::from(other)] {
                let at = self.now_us + 1;
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side: other,
                    },
                );
            }
            return;
        }
        if self.is_cut(&self.pipes[&pipe_id], dir) {
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        let held = std::mem::take(&mut pipe.held[usize::from(dir)]);
        for chunk in held {
            self.send(pipe_id, dir, chunk);
        }
    }

    // -----------------------------------------------------------------
    // Checkers
    // -----------------------------------------------------------------

    /// Raft and lock-state checks over every running node.
    fn check_cluster(&mut self) {
        let mut found = Vec::new();
        let mut changed = Vec::new();
        let mut notes = Vec::new();
        if self
            .nodes
            .iter()
            .any(|proc| proc.node.as_ref().is_some_and(|node| node.is_leader()))
        {
            self.last_leader_us = self.now_us;
        }
        for slot in 0..self.n {
            let s = usize::from(slot);
            let proc = &mut self.nodes[s];
            let Some(node) = proc.node.as_ref() else {
                continue;
            };
            let raft = node.raft();
            let id = raft.id();
            if proc.incarnation != Some(id) {
                // A bootstrap member found the cluster running and joined
                // as a new generation: a new incarnation for the checks.
                proc.incarnation = Some(id);
                proc.commit_seen = 0;
                proc.token_max = 0;
                proc.checked = (0, 0, 0, 0);
                proc.shadow = vec![None; ALL_KEYS.len()];
                notes.push(format!("node {slot} rejoins as {id:?}"));
            }
            let known = (raft.term(), raft.leader(), raft.config());
            if (known.0, known.1, known.2)
                != (
                    proc.known_leader.0,
                    proc.known_leader.1,
                    &proc.known_leader.2,
                )
            {
                proc.known_leader = (known.0, known.1, known.2.clone());
                if self.rec.tracing() {
                    notes.push(format!(
                        "{id:?} term {}: leader {:?}, {:?}, commit {}, voters {:?}, learners {:?}",
                        known.0,
                        known.1,
                        raft.role(),
                        raft.commit_index(),
                        raft.config().voters,
                        raft.config().learners,
                    ));
                }
            }
            if raft.is_leader() {
                match self.leaders.get(&raft.term()) {
                    Some(other) if *other != id => found.push((
                        Checker::Raft,
                        format!("two leaders in term {}: {other:?} and {id:?}", raft.term()),
                    )),
                    Some(_) => {}
                    None => {
                        self.leaders.insert(raft.term(), id);
                    }
                }
            }
            let commit = raft.commit_index();
            let last = raft.last_index();
            let mark = (
                last,
                raft.term_at(last).unwrap_or(0),
                commit,
                raft.applied_index(),
            );
            if mark == proc.checked {
                continue;
            }
            if mark.3 != proc.checked.3 {
                changed.push(slot);
            }
            proc.checked = mark;
            if commit < proc.commit_seen {
                found.push((
                    Checker::Raft,
                    format!(
                        "{id:?} commit index went back from {} to {commit}",
                        proc.commit_seen
                    ),
                ));
            }
            // Every entry this node has: one entry per (index, term) across
            // the cluster (log matching), one per committed index.
            let from = raft
                .first_index()
                .max(proc.commit_seen.saturating_sub(1))
                .max(1);
            for index in from..=raft.last_index() {
                let Some(entry) = raft.entry(index) else {
                    continue;
                };
                let h = hash_of(entry);
                if *self.entries.entry((index, entry.term)).or_insert(h) != h {
                    found.push((
                        Checker::Raft,
                        format!(
                            "{id:?} has another entry at index {index} term {}",
                            entry.term
                        ),
                    ));
                }
                if index <= commit && *self.committed.entry(index).or_insert(h) != h {
                    found.push((
                        Checker::Raft,
                        format!("{id:?} committed another entry at index {index}"),
                    ));
                }
            }
            let view = node.lock_state().replicated_view();
            let applied = raft.applied_index();
            let h = hash_of(&view);
            if *self.states.entry(applied).or_insert(h) != h {
                found.push((
                    Checker::Raft,
                    format!("{id:?} has another replicated state at applied index {applied}"),
                ));
            }
            proc.commit_seen = proc.commit_seen.max(commit);
        }
        for (checker, detail) in found {
            self.violation(checker, detail);
        }
        for note in notes {
            self.note(|| note);
        }
        for slot in changed {
            self.check_locks(slot);
        }
    }

    /// A node's applied lock state: tokens only grow; a key changes holder
    /// only once the old holder released it, was a ghost, never reached a
    /// client, or ran out of lease.
    fn check_locks(&mut self, slot: u8) {
        let s = usize::from(slot);
        let Some(node) = self.nodes[s].node.as_ref() else {
            return;
        };
        let mut fresh = Vec::new();
        let mut holders = vec![None; ALL_KEYS.len()];
        for (token, holding) in node.lock_state().grants() {
            let keys: Vec<usize> = holding
                .keys
                .keys()
                .iter()
                .map(|key| key_index(key.as_bytes()))
                .collect();
            for &key in &keys {
                holders[key] = Some(token);
            }
            if token > self.nodes[s].token_max {
                fresh.push((token, keys, holding.lease_ms));
            }
        }
        let mut found = Vec::new();
        for (token, keys, lease_ms) in fresh {
            self.nodes[s].token_max = token;
            match self.grants.get(&token) {
                Some(info) if info.keys != keys || info.lease_ms != lease_ms => found.push((
                    Checker::Tokens,
                    format!(
                        "token {token} names {keys:?} on node {slot}, {:?} elsewhere",
                        info.keys
                    ),
                )),
                Some(_) => {}
                None => {
                    if token <= self.token_max {
                        found.push((
                            Checker::Tokens,
                            format!(
                                "new grant {token} on node {slot} is not above earlier token {}",
                                self.token_max
                            ),
                        ));
                    }
                    self.token_max = self.token_max.max(token);
                    self.grants.insert(
                        token,
                        GrantInfo {
                            keys,
                            lease_ms,
                            first_applied_us: self.now_us,
                            era: self.lease_era,
                        },
                    );
                }
            }
        }
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let old = self.nodes[s].shadow[key];
            let new = holders[key];
            if let (Some(old), Some(new)) = (old, new)
                && old != new
            {
                let info = self.grants.get(&old);
                let lease_over = info.is_none_or(|info| {
                    info.era != self.lease_era
                        || self.now_us
                            >= info.first_applied_us
                                + self.lease_min_us(u64::from(info.lease_ms) * 1_000)
                });
                let free = lease_over
                    || self.release_requested.contains(&old)
                    || self.force_requested.contains(&old)
                    || self.ghosts.contains(&old)
                    || !self.replied.contains(&old);
                if !free {
                    found.push((
                        Checker::ServerState,
                        format!(
                            "{name} passed from {old} to {new} on node {slot}: two live holders"
                        ),
                    ));
                }
            }
            self.nodes[s].shadow[key] = new;
        }
        for (checker, detail) in found {
            self.violation(checker, detail);
        }
    }

    /// The shortest true duration of a lease of `lease_us` on a node clock
    /// that may run fast by the drift bound.
    fn lease_min_us(&self, lease_us: u64) -> u64 {
        crate::clock::lease_min_us(lease_us, self.config.base.drift_ppm_max)
    }

    // -----------------------------------------------------------------
    // Clients
    // -----------------------------------------------------------------

    fn client_connect(&mut self, client: usize, slot: u8) {
        let proc = &self.clients[client];
        if proc.link.sessions[usize::from(slot)].is_some() || proc.crashed {
            return;
        }
        let local = proc.clock.local(self.now_us);
        let inc = proc.inc;
        let pipe = self.new_pipe(Opener::Client { client, inc }, slot);
        let mut config = SessionConfig::cluster(b"", FINGERPRINT, slot, usize::from(self.n));
        if self.clients[client].renews {
            config.extensions = Capabilities::EXTEND.union(Capabilities::PUSH);
        }
        let session = Session::new(instant(local), config);
        self.clients[client].link.sessions[usize::from(slot)] = Some((session, pipe));
        self.note(|| format!("client {client} connects to node {slot} as pipe {pipe}"));
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ClientConnectArrive { pipe });
        self.client_pump(client, slot);
    }

    fn deliver_to_client(&mut self, pipe_id: u64, client: usize, inc: u64, bytes: Vec<u8>) {
        let proc = &self.clients[client];
        if proc.inc != inc || proc.crashed || !self.pipes[&pipe_id].open[0] {
            return;
        }
        let paused = proc.paused_until_us > self.now_us;
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        if paused || !pipe.held_for_client.is_empty() {
            pipe.held_for_client.extend_from_slice(&bytes);
            return;
        }
        let slot = pipe.b_slot;
        self.client_input(client, slot, pipe_id, &bytes);
    }

    fn client_resume(&mut self, client: usize) {
        self.note(|| format!("client {client} resumes"));
        for pipe_id in self.client_pipes(client) {
            let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                continue;
            };
            let bytes = std::mem::take(&mut pipe.held_for_client);
            let close = std::mem::take(&mut pipe.close_held);
            let slot = pipe.b_slot;
            if !bytes.is_empty() {
                self.client_input(client, slot, pipe_id, &bytes);
            }
            if close {
                let inc = self.clients[client].inc;
                self.client_sees_close(pipe_id, client, inc);
                self.drop_pipe_if_done(pipe_id);
            }
        }
        for slot in 0..self.n {
            self.client_pump(client, slot);
        }
    }

    /// The pipes `client` opened (any incarnation).
    fn client_pipes(&self, client: usize) -> Vec<u64> {
        self.pipes
            .iter()
            .filter(
                |(_, pipe)| matches!(pipe.opener, Opener::Client { client: c, .. } if c == client),
            )
            .map(|(&id, _)| id)
            .collect()
    }

    fn client_sees_close(&mut self, pipe_id: u64, client: usize, inc: u64) {
        let proc = &self.clients[client];
        let current = proc.inc == inc && !proc.crashed;
        if current && proc.paused_until_us > self.now_us {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.close_held = true;
            }
            return;
        }
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        pipe.open[0] = false;
        let slot = pipe.b_slot;
        if current {
            self.transport_closed(client, slot, pipe_id);
        }
    }

    fn client_restart(&mut self, client: usize) {
        let n = usize::from(self.n);
        let proc = &mut self.clients[client];
        proc.crashed = false;
        proc.inc += 1;
        proc.link.router = Some(Router::new(n));
        proc.link.backoffs = vec![Backoff::new(); n];
        let inc = proc.inc;
        self.note(|| format!("client {client} restarts as incarnation {inc}"));
        for slot in 0..self.n {
            self.schedule_client(self.now_us, client, inc, ClientEv::Connect(slot));
        }
        self.schedule_client(self.now_us + 1, client, inc, ClientEv::StartOp);
    }

    // -----------------------------------------------------------------
    // Faults
    // -----------------------------------------------------------------

    /// Whether crashing `slot` (losing its state) leaves, in every
    /// configuration some running node holds (any of them may be the one
    /// in effect), a quorum of voters that still have their state. A
    /// bootstrap member still checking that the cluster is new is no such
    /// voter: it may yet join as a new generation and leave its generation
    /// 1 behind, like a restart.
    fn crash_is_survivable(&self, slot: u8) -> bool {
        self.nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .map(|node| node.raft().config())
            .filter(|config| !config.voters.is_empty())
            .all(|config| {
                let healthy = config
                    .voters
                    .iter()
                    .filter(|id| {
                        let proc = &self.nodes[usize::from(id.slot)];
                        id.slot != slot
                            && proc
                                .node
                                .as_ref()
                                .is_some_and(|node| node.id() == **id && !node.checking_genesis())
                    })
                    .count();
                healthy >= config.quorum()
            })
    }

    // -----------------------------------------------------------------
    // End of run
    // -----------------------------------------------------------------

    /// Every node's configuration has exactly the running generations as
    /// voters: every restarted node replaced its old self.
    fn replaced(&self) -> bool {
        let current: BTreeSet<NodeId> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(slot, proc)| {
                proc.node
                    .as_ref()
                    .map_or(NodeId::new(slot as u8, proc.generation), |node| node.id())
            })
            .collect();
        self.nodes.iter().all(|proc| {
            proc.node.as_ref().is_some_and(|node| {
                let config = node.raft().config();
                config.voters == current && config.learners.is_empty()
            })
        })
    }

    /// Every node up with one leader, no client work left, every request a
    /// node received answered, no waiter queued.
    fn quiescent(&self) -> bool {
        let mut leaders = 0;
        for proc in &self.nodes {
            let Some(node) = proc.node.as_ref() else {
                return false;
            };
            if node.stats().waiters > 0 || node.raft().conf_change_pending() {
                return false;
            }
            leaders += usize::from(node.is_leader());
        }
        leaders == 1
            && self.replaced()
            && self.pending.is_empty()
            && self
                .clients
                .iter()
                .all(|proc| !proc.crashed && proc.ops.is_empty())
    }
}

impl<'t> ClientWorld<'t> for ClusterWorld<'t> {
    const CONN: &'static str = "pipe";

    fn parts(&mut self) -> Parts<'_, 't> {
        Parts {
            now_us: self.now_us,
            config: &self.config.base,
            safety: self.phase == Phase::Safety,
            clients: &mut self.clients,
            next_op: &mut self.next_op,
            history: &mut self.history,
            windows: &mut self.windows,
            db: &mut self.db,
            lease_era: self.lease_era,
            work: &mut self.work,
            fault_rng: &mut self.fault_rng,
            rec: &mut self.rec,
        }
    }

    fn schedule_client(&mut self, at_us: u64, client: usize, inc: u64, ev: ClientEv) {
        self.schedule(at_us, Ev::Client(ClientCall { client, inc, ev }));
    }

    fn send_from_client(&mut self, pipe: u64, bytes: Vec<u8>) {
        self.send(pipe, 0, bytes);
    }

    fn close_transport(&mut self, pipe_id: u64) {
        if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
            pipe.open[0] = false;
        }
        self.reset_pipe(pipe_id);
    }

    fn close_expected(&self, reason: &CloseReason) -> bool {
        // Besides what any server may cause: a node that is not (or no
        // longer) active. (`M` and `E 4` do not close a session.)
        close_expected_of_any(reason)
            || matches!(reason, CloseReason::ServerError(ErrorCode::NotActive))
    }

    fn on_ready(&mut self, client: usize, slot: u8, pipe_id: u64) {
        self.note(|| format!("client {client} ready on node {slot} (pipe {pipe_id})"));
    }

    /// The router (fed by the shared pump) follows leader notices.
    fn on_leader_notice(&mut self, _client: usize) {}

    fn resume(&mut self, client: usize) {
        self.client_resume(client);
    }

    fn connect(&mut self, client: usize, slot: u8) {
        if self.clients[client].line.is_some() {
            self.line_connect(client, slot);
        } else {
            self.client_connect(client, slot);
        }
    }

    fn restart(&mut self, client: usize) {
        self.client_restart(client);
    }

    fn crash_client(&mut self, client: usize) {
        self.note(|| format!("FAULT client {client} crashes"));
        self.crash_ops(client);
        self.clients[client].link.clear();
        for pipe_id in self.client_pipes(client) {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[0] = false;
            }
            self.reset_pipe(pipe_id);
        }
        let at = self.now_us + self.fault_rng.range(100_000, 3_000_000);
        let inc = self.clients[client].inc;
        self.schedule_client(at, client, inc, ClientEv::Restart);
    }

    fn after_op_step(&mut self, _client: usize) {}

    fn on_grant(&mut self, client: usize, token: u64, caller: bool) {
        self.received.insert(token);
        if caller && self.ghosts.contains(&token) {
            self.violation(
                Checker::Replies,
                format!(
                    "client {client} holds grant {token} that a node released as never delivered"
                ),
            );
        }
    }

    fn new_holding(&mut self, token: u64) -> (u64, u64) {
        // A holding is named by its token here: one grant, one holding.
        let era = self
            .grants
            .get(&token)
            .map_or(self.lease_era, |info| info.era);
        (token, era)
    }

    fn release_failure(&self, error: ClientError) -> ReleaseFailure {
        match error {
            // No final reply within the release window; an attempt may
            // have taken effect (the history entry stays open).
            ClientError::Indeterminate | ClientError::NotConnected | ClientError::Timeout => {
                ReleaseFailure::LeaveOpen
            }
            ClientError::ClientCapacity => ReleaseFailure::Forget,
            // `E 6` cannot happen: the sim always releases a grant's exact
            // key group.
            ClientError::Protocol(message) if message.contains("GroupMismatch") => {
                ReleaseFailure::Unexpected(format!("release got {message}"))
            }
            error => ReleaseFailure::Unexpected(format!("release failed with {error:?}")),
        }
    }

    fn slot_of(&self, pipe: u64) -> Option<u8> {
        self.pipes.get(&pipe).map(|pipe| pipe.b_slot)
    }

    fn open_line_conn(&mut self, client: usize, slot: u8) -> Option<u64> {
        let inc = self.clients[client].inc;
        let pipe = self.new_pipe(Opener::Client { client, inc }, slot);
        let addresses = (0..self.n).map(|slot| line_address(slot).into()).collect();
        if let Some(sim_pipe) = self.pipes.get_mut(&pipe) {
            sim_pipe.oracle = StreamOracle::line(addresses);
        }
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ClientConnectArrive { pipe });
        Some(pipe)
    }

    fn line_slots(&self) -> u8 {
        self.n
    }

    fn line_address_slot(&self, address: &[u8]) -> Option<u8> {
        (0..self.n).find(|&slot| line_address(slot).as_bytes() == address)
    }

    fn answered_expiry(&mut self, conn: u64, rid: u64) -> Option<(u64, u64)> {
        self.answered.remove(&(conn, rid))
    }
}

impl<'t> SimWorld<'t> for ClusterWorld<'t> {
    type Ev = Ev;

    fn marker(marker: Marker) -> Ev {
        match marker {
            Marker::FaultTick => Ev::FaultTick,
            Marker::EndSafety => Ev::EndSafety,
            Marker::End => Ev::End,
        }
    }

    fn queue(&mut self) -> &mut Queue<Ev> {
        &mut self.queue
    }

    fn set_now(&mut self, now_us: u64) {
        self.now_us = now_us;
    }

    fn phase(&self) -> Phase {
        self.phase
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
    }

    fn recorder(&mut self) -> &mut Recorder<'t> {
        &mut self.rec
    }

    fn into_recorder(self) -> Recorder<'t> {
        self.rec
    }

    fn start_servers(&mut self) {
        for slot in 0..self.n {
            self.node_start(slot, true);
        }
    }

    fn start_client(&mut self, client: usize) {
        let at = self.work.below(200_000);
        for slot in 0..self.n {
            self.schedule_client(at, client, 0, ClientEv::Connect(slot));
        }
        // Give the cluster a moment to elect a first leader.
        let at = at + 500_000 + self.work.below(500_000);
        self.schedule_client(at, client, 0, ClientEv::StartOp);
    }

    fn hash_event(&mut self, next: &Scheduled<Ev>) {
        let (bytes, extra): (&[u8], u64) = match &next.ev {
            Ev::Deliver { pipe, bytes, .. } | Ev::Flush { pipe, bytes, .. } => {
                (bytes, pipe ^ ((bytes.len() as u64) << 32))
            }
            Ev::DialArrive { pipe }
            | Ev::DialAnswer { pipe, .. }
            | Ev::ClientConnectArrive { pipe }
            | Ev::AdversaryArrive { pipe }
            | Ev::AdversaryFinish { pipe }
            | Ev::SeesClose { pipe, .. } => (&[], *pipe),
            Ev::NodeTimer { slot, .. } | Ev::NodeRestart { slot } => (&[], u64::from(*slot)),
            Ev::Client(call) => (&[], call.hash_extra()),
            _ => (&[], 0),
        };
        self.rec
            .event(next.at_us, next.ev.code(), bytes, extra, &TraceEv(&next.ev));
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::NodeTimer {
                slot,
                inc,
                generation,
            } => {
                let now = self.node_now(slot);
                let proc = &mut self.nodes[usize::from(slot)];
                if proc.inc == inc && proc.timer_generation == generation {
                    proc.armed = None;
                    if let Some(node) = proc.node.as_mut() {
                        node.handle_timeout(now);
                    }
                    self.node_step(slot, None);
                }
            }
            Ev::NodeRestart { slot } => self.node_start(slot, false),
            Ev::Recover => self.recover(),
            Ev::DialArrive { pipe } => self.dial_arrive(pipe),
            Ev::DialAnswer { pipe, ok } => self.dial_answer(pipe, ok),
            Ev::ClientConnectArrive { pipe } => self.client_connect_arrive(pipe),
            Ev::AdversaryArrive { pipe } => self.adversary_arrive(pipe),
            Ev::AdversaryFinish { pipe } => self.adversary_finish(pipe),
            Ev::Deliver { pipe, dir, bytes } => self.deliver(pipe, dir, bytes),
            Ev::Flush {
                pipe,
                side,
                bytes,
                done,
                close,
            } => self.flush(pipe, side, bytes, done, close),
            Ev::SeesClose { pipe, side } => self.sees_close(pipe, side),
            Ev::Heal { id } => self.heal(id),
            Ev::Retransmit { pipe, dir } => self.retransmit(pipe, dir),
            Ev::Client(call) => self.client_event(call),
            Ev::FaultTick => self.fault_tick(),
            Ev::EndSafety => self.end_safety(),
            Ev::Probe => {
                if self.config.end_when_quiet && self.quiescent() {
                    // Everything resolved within the bound: the rest of the
                    // phase would only be heartbeats.
                    self.note(|| "everything resolved: the liveness phase ends early".into());
                    self.end_run();
                } else {
                    self.schedule(self.now_us + 1_000_000, Ev::Probe);
                }
            }
            Ev::End => self.end_run(),
        }
    }

    fn after_event(&mut self) {
        self.check_cluster();
    }

    fn inject_fault(&mut self) {
        let relay_ppm = self.adversary.rates.relay_ppm;
        if relay_ppm > 0 {
            let pipes = &self.pipes;
            self.adversary
                .taps
                .retain(|(pipe, _), _| pipes.contains_key(pipe));
            if self.adversary.conns.len() + 2 <= ADVERSARY_CONNS_MAX
                && self.adversary.rng.chance(relay_ppm)
            {
                self.adversary_relay();
            }
        }
        let force_ppm = self.config.faults.force_release_ppm;
        if force_ppm > 0 && self.force_rng.chance(force_ppm) {
            self.fault_force_release();
        }
        let loss_ppm = self.config.faults.majority_loss_ppm;
        if loss_ppm > 0 && !self.lost && self.loss_rng.chance(loss_ppm) {
            self.fault_majority_loss();
            return;
        }
        let faults = self.config.base.faults.clone();
        let cluster = self.config.faults.clone();
        let mut roll = FaultRoll::new(&mut self.fault_rng);
        let mut pick = |ppm: u32| roll.pick(ppm);
        let n = self.n;
        if pick(faults.reset_ppm) {
            let live: Vec<u64> = self
                .pipes
                .iter()
                .filter(|(_, pipe)| !pipe.tcp.reset)
                .map(|(&id, _)| id)
                .collect();
            if !live.is_empty() {
                let pipe = live[self.fault_rng.index(live.len())];
                self.rec.report.faults += 1;
                self.note(|| format!("FAULT reset pipe {pipe}"));
                self.reset_pipe(pipe);
            }
        } else if pick(faults.client_crash_ppm) {
            self.fault_client_crash();
        } else if pick(cluster.node_crash_ppm) {
            let slot = self.fault_rng.below(u64::from(n)) as u8;
            // Losing the state of a majority of voters is unrecoverable by
            // design (docs/cluster.md); never crash into that.
            let amnesia = self.config.plant == Some(ClusterPlant::AmnesiacRestart);
            if self.nodes[usize::from(slot)].node.is_some()
                && (amnesia || self.crash_is_survivable(slot))
            {
                self.rec.report.faults += 1;
                self.crash_node(slot);
            }
        } else if pick(cluster.partition_ppm) {
            let size = self.fault_rng.range(1, u64::from(n / 2)) as usize;
            let mut minority = BTreeSet::new();
            while minority.len() < size {
                minority.insert(self.fault_rng.below(u64::from(n)) as u8);
            }
            let mut links = Vec::new();
            for a in 0..n {
                for b in 0..n {
                    if minority.contains(&a) != minority.contains(&b) {
                        links.push((a, b));
                    }
                }
            }
            self.rec.report.faults += 1;
            self.partition(links, format!("{minority:?} | rest"));
        } else if pick(cluster.one_way_ppm) {
            let from = self.fault_rng.below(u64::from(n)) as u8;
            let to = (from + 1 + self.fault_rng.below(u64::from(n) - 1) as u8) % n;
            self.rec.report.faults += 1;
            self.partition(vec![(from, to)], format!("{from} → {to} cut one way"));
        } else if pick(cluster.isolate_leader_ppm) {
            let leader = self
                .nodes
                .iter()
                .filter_map(|proc| proc.node.as_ref())
                .find(|node| node.is_leader())
                .map(|node| node.id().slot);
            if let Some(leader) = leader {
                let links = (0..n)
                    .filter(|&other| other != leader)
                    .flat_map(|other| [(leader, other), (other, leader)])
                    .collect();
                self.rec.report.faults += 1;
                self.partition(links, format!("leader {leader} isolated"));
            }
        } else if pick(cluster.node_clock_jump_ppm) {
            let slot = self.fault_rng.below(u64::from(n)) as u8;
            self.jump_server_clock(slot, |jump| {
                format!("FAULT node {slot} clock jumps {jump} µs forward")
            });
        } else if pick(faults.pause_ppm) {
            if let Some((client, pause)) = self.fault_pause() {
                self.note(|| format!("FAULT client {client} pauses {pause} µs"));
            }
        } else if pick(faults.clock_jump_ppm) {
            self.fault_client_clock_jump();
        }
    }

    fn after_safety(&mut self) {
        // The outsider leaves too.
        let conns: Vec<u64> = std::mem::take(&mut self.adversary.conns)
            .into_keys()
            .collect();
        for pipe_id in conns {
            self.close_transport(pipe_id);
        }
        let ids: Vec<u64> = self.partitions.keys().copied().collect();
        for id in ids {
            self.heal(id);
        }
        self.schedule(self.now_us + 1_000_000, Ev::Probe);
    }

    fn check_end(&mut self) {
        // An election may be running at any instant (a delay spike can
        // trip check-quorum), but not for long in a quiet cluster.
        if self.now_us > self.last_leader_us + 5_000_000 {
            let since = self.last_leader_us;
            self.violation(
                Checker::Liveness,
                format!("no leader since {since} µs at the end of the liveness phase"),
            );
        }
        if self.config.plant.is_none() && !self.replaced() {
            self.violation(
                Checker::Liveness,
                "restarted nodes have not replaced their old generations by the end".into(),
            );
        }
        if !self.clients_resolved(false) {
            return;
        }
        let open_pending = self
            .pending
            .keys()
            .find(|(pipe, _)| self.pipes.get(pipe).is_some_and(|p| !p.tcp.reset))
            .copied();
        if let Some((pipe, rid)) = open_pending {
            self.violation(
                Checker::Liveness,
                format!("no node answered pipe {pipe} rid {rid}"),
            );
        }
        for proc in &self.nodes {
            if let Some(node) = proc.node.as_ref()
                && node.stats().waiters > 0
            {
                let detail = format!(
                    "{:?}: {} waiters still queued at the end",
                    node.id(),
                    node.stats().waiters
                );
                self.violation(Checker::Liveness, detail);
                return;
            }
        }
    }

    fn trivial_op(op: &LinOp) -> bool {
        // Keys that saw nothing but lease cuts are not checked.
        matches!(op, LinOp::LeaseCut { .. })
    }

    fn server_clock(&mut self, which: u8) -> &mut Clock {
        &mut self.nodes[usize::from(which)].clock
    }

    fn lease_era(&mut self) -> &mut u64 {
        &mut self.lease_era
    }

    fn wake_server(&mut self, which: u8) {
        let now = self.node_now(which);
        if let Some(node) = self.nodes[usize::from(which)].node.as_mut() {
            node.handle_timeout(now);
            self.nodes[usize::from(which)].armed = None;
        }
        self.node_step(which, None);
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
