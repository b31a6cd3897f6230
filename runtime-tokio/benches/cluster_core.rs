//! The cluster core alone: three `ClusterNode`s wired in memory (no
//! sockets, no runtime), driven on one thread with the shape of `ticketing
//! bench --clients 64 --keys 32` against the leader: [`TASKS`] client
//! tasks on [`KEYS`] keys (two tasks per key, so every release is handed
//! to the waiter behind it), pipelined over one client connection. Each
//! task acquires its key, releases it when granted, acquires it again
//! when released, and so on. It is the user-space floor of the 3-node
//! cluster's CPU per acquire+release: what the three cores cost with
//! nothing of the kernel.
//!
//! Each step the client writes, as one input, the first
//! [`PAIRS_PER_INPUT`] × 2 requests its tasks have ready (by default
//! about as many pairs as one append carried per follower in `ticketing
//! bench`); then the injected clock moves [`STEP`], due timers fire, and
//! what was sent in the step before arrives (one network hop per step, so
//! several appends are in flight, as over sockets, and a commit does not
//! wait for the next client input). Every node call is followed by what
//! the tokio driver does after it (`serve/shared.rs`'s dispatch,
//! `wants_input`, `handle_written`).
//!
//! Prints CPU µs per acquire+release of the three nodes, split by node
//! (the thread's CPU from `/proc`, times the share of the run's monotonic
//! time spent inside each node's calls); the rest of the thread's is the
//! test client and the wiring.
//!
//! Instructions: every call into a node runs inside `leader_work`,
//! `follower_1_work` or `follower_2_work`, so `callgrind_annotate
//! --inclusive=yes` gives each node's count (or collect one node alone
//! with `--collect-atstart=no --toggle-collect=cluster_core::leader_work`);
//! run two sizes and divide the difference by the difference in pairs to
//! leave the setup and the election out:
//!
//! ```text
//! TICKETING_BENCH_CLUSTER_PAIRS=5000 TICKETING_BENCH_ROUNDS=1 \
//!   valgrind --tool=callgrind --dump-instr=no target/release/deps/cluster_core-*
//! TICKETING_BENCH_CLUSTER_PAIRS=25000 TICKETING_BENCH_ROUNDS=1 \
//!   valgrind --tool=callgrind --dump-instr=no target/release/deps/cluster_core-*
//! ```
//!
//! Knobs: `TICKETING_BENCH_CLUSTER_PAIRS` (pairs measured per round),
//! `TICKETING_BENCH_CLUSTER_BATCH` (pairs per client input),
//! `TICKETING_BENCH_ROUNDS` (median of).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use ticketing_core::auth::{ClientHandshake, ClientHandshakeStatus, WireMode};
use ticketing_core::cluster::peer::PeerTokens;
use ticketing_core::cluster::{ClusterConfig, ClusterNode};
use ticketing_core::machine::{Machine, Output};
use ticketing_core::raft::NodeId;
use ticketing_core::server::{ConnId, ConnState};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, ReleaseRequest, Reply, Request};

// Only its thread CPU reader is used here.
#[allow(dead_code)]
#[path = "../src/bench/cpu.rs"]
mod proc_cpu;

/// Client tasks, as `ticketing bench --clients 64`.
const TASKS: usize = 64;
/// Keys, as `--keys 32`: two tasks per key.
const KEYS: usize = 32;
/// Pairs measured per round (`TICKETING_BENCH_CLUSTER_PAIRS`).
const PAIRS: usize = 200_000;
/// Pairs per client input (`TICKETING_BENCH_CLUSTER_BATCH`).
const PAIRS_PER_INPUT: usize = 11;
/// Pairs run before the measurement, to reach the steady state.
const WARM_UP_PAIRS: usize = 2_000;
/// Injected time per step: about what 11 pairs take at 70,000 pairs/s.
const STEP: Duration = Duration::from_micros(150);
/// `ticketing bench`'s defaults.
const WAIT_S: u8 = 30;
const LEASE_S: u8 = 30;
const FINGERPRINT: [u8; 32] = [7; 32];
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

// One function per node role, never inlined: callgrind's inclusive count
// of each is that node's work. Each passes its own number through
// `black_box` so that the linker cannot fold the three into one.
#[inline(never)]
fn leader_work(call: &mut dyn FnMut()) {
    std::hint::black_box(0u8);
    call();
}
#[inline(never)]
fn follower_1_work(call: &mut dyn FnMut()) {
    std::hint::black_box(1u8);
    call();
}
#[inline(never)]
fn follower_2_work(call: &mut dyn FnMut()) {
    std::hint::black_box(2u8);
    call();
}

/// Where bytes written on a node's connection go.
#[derive(Clone, Copy)]
enum End {
    Peer(usize, ConnId),
    Client,
}

/// The client: one connection to the leader, its tasks' requests.
struct Client {
    conn: ConnId,
    handshake: ClientHandshake,
    established: bool,
    buf: Vec<u8>,
    /// Requests ready to go, in the order they became ready.
    ready: VecDeque<Request>,
    /// Per task, the token it holds.
    tokens: [u64; TASKS],
    next_rid: u64,
    released: usize,
    /// `bench-0` .. `bench-31`, as `ticketing bench` names them.
    keys: Vec<KeyGroup>,
}

impl Client {
    fn key(&self, task: usize) -> KeyGroup {
        self.keys[task % KEYS].clone()
    }

    /// A request id naming its task.
    fn rid(&mut self, task: usize) -> u64 {
        self.next_rid += 1;
        self.next_rid * TASKS as u64 + task as u64
    }

    fn acquire(&mut self, task: usize) {
        let rid = self.rid(task);
        self.ready.push_back(Request::Acquire(AcquireRequest {
            rid,
            wait_s: WAIT_S,
            lease_s: LEASE_S,
            keys: self.key(task),
            set: false,
        }));
    }

    fn release(&mut self, task: usize) {
        let rid = self.rid(task);
        self.ready.push_back(Request::Release(ReleaseRequest {
            rid,
            token: self.tokens[task],
            keys: self.key(task),
            set: false,
        }));
    }

    /// Replies in: a granted task releases, a released one acquires again.
    fn receive(&mut self) {
        let mut at = 0;
        while let Ok(Some((reply, used))) = Reply::decode(&self.buf[at..]) {
            at += used;
            match reply {
                Reply::Acquired { rid, token } => {
                    let task = (rid % TASKS as u64) as usize;
                    self.tokens[task] = token;
                    self.release(task);
                }
                Reply::Released { rid } => {
                    self.released += 1;
                    self.acquire((rid % TASKS as u64) as usize);
                }
                Reply::Leader { .. } => {}
                other => panic!("unexpected reply {other:?}"),
            }
        }
        self.buf.drain(..at);
    }
}

struct Net {
    now: Instant,
    nodes: Vec<ClusterNode>,
    /// Per node: 0 the leader, 1 and 2 the followers (after the election).
    roles: [usize; 3],
    /// Monotonic time inside each node's calls.
    spent: [std::time::Duration; 3],
    links: HashMap<(usize, ConnId), End>,
    /// Connections each node woke, to transmit.
    woken: Vec<Vec<ConnId>>,
    dials: Vec<(usize, u8)>,
    nonce: u8,
    client: Option<Client>,
    leader: usize,
    /// Peer inputs from the leader to the followers.
    leader_sends: usize,
    /// Inputs the client wrote.
    client_inputs: usize,
    /// Bytes sent and not yet delivered, in order.
    in_flight: VecDeque<(End, Vec<u8>)>,
    /// Buffers to reuse.
    spare: Vec<Vec<u8>>,
}

impl Net {
    fn new() -> Net {
        let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
        let nodes = voters
            .iter()
            .map(|&id| {
                let tokens =
                    PeerTokens::new([b"peer-secret-0123456789-abcdefghijk"]).expect("tokens");
                let config = ClusterConfig::new(FINGERPRINT, id, 3, tokens, 1_700_000_000_000_000);
                ClusterNode::bootstrap(
                    config,
                    voters.clone(),
                    7,
                    u64::from(id.slot) + 11,
                    Instant::ZERO,
                )
            })
            .collect();
        Net {
            now: Instant::ZERO,
            nodes,
            roles: [0, 1, 2],
            spent: [std::time::Duration::ZERO; 3],
            links: HashMap::new(),
            woken: vec![Vec::new(); 3],
            dials: Vec::new(),
            nonce: 0,
            client: None,
            leader: 0,
            leader_sends: 0,
            client_inputs: 0,
            in_flight: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Runs `f` on node `i`, inside its role's function and timed.
    fn on<R>(&mut self, i: usize, f: impl FnOnce(&mut ClusterNode) -> R) -> R {
        let node = &mut self.nodes[i];
        let mut f = Some(f);
        let mut result = None;
        let mut call = || result = f.take().map(|f| f(node));
        let started = std::time::Instant::now();
        match self.roles[i] {
            0 => leader_work(&mut call),
            1 => follower_1_work(&mut call),
            _ => follower_2_work(&mut call),
        }
        self.spent[i] += started.elapsed();
        result.expect("called")
    }

    /// What the driver does after an input: collect wakes and dials, the
    /// reserve write, admin answers, logs, alerts, node events, the next
    /// deadline.
    fn dispatch(&mut self, i: usize) {
        let now = self.now;
        let mut woken = std::mem::take(&mut self.woken[i]);
        let mut dials = std::mem::take(&mut self.dials);
        self.on(i, |node| {
            let mut reserve = None;
            while let Some(output) = node.poll_output(now) {
                match output {
                    Output::Wake(conn) => woken.push(conn),
                    Output::Dial { slot } => dials.push((i, slot)),
                    Output::Reserve { value } => reserve = Some(value),
                    // Logged by the daemon; only drained here.
                    Output::AdminReply { .. }
                    | Output::Log(_)
                    | Output::Alert(_)
                    | Output::Node(_) => {}
                }
            }
            if let Some(value) = reserve {
                node.handle_reserve_persisted(now, value);
            }
            std::hint::black_box(node.poll_timeout());
            std::hint::black_box(node.is_shutting_down());
        });
        self.woken[i] = woken;
        self.dials = dials;
    }

    fn nonce(&mut self) -> [u8; 16] {
        self.nonce = self.nonce.wrapping_add(1);
        [self.nonce; 16]
    }

    fn input(&mut self, i: usize, conn: ConnId, bytes: &[u8]) {
        let now = self.now;
        self.on(i, |node| node.handle_input(now, conn, bytes));
        self.dispatch(i);
        self.on(i, |node| node.wants_input(conn));
    }

    /// Makes the dials asked for and transmits on every woken connection:
    /// the bytes are in flight until the next [`Net::hop`].
    fn flush(&mut self) {
        loop {
            let mut moved = false;
            for (i, slot) in std::mem::take(&mut self.dials) {
                moved = true;
                let target = usize::from(slot);
                let (n1, n2) = (self.nonce(), self.nonce());
                let now = self.now;
                let a = self
                    .on(i, |node| node.handle_dialed(now, slot, n1))
                    .expect("dialed");
                let b = self
                    .on(target, |node| node.handle_peer_accept(now, n2, LOOPBACK))
                    .expect("accepted");
                self.links.insert((i, a), End::Peer(target, b));
                self.links.insert((target, b), End::Peer(i, a));
                self.dispatch(i);
                self.dispatch(target);
            }
            for i in 0..self.nodes.len() {
                let woken = std::mem::take(&mut self.woken[i]);
                for conn in woken {
                    moved = true;
                    self.transmit(i, conn);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Takes what `conn` of node `i` has to send; it arrives at the next
    /// hop.
    fn transmit(&mut self, i: usize, conn: ConnId) {
        let mut out = self.spare.pop().unwrap_or_default();
        out.clear();
        let state = self.on(i, |node| {
            let state = node.poll_transmit(conn, &mut out);
            node.wants_input(conn);
            state
        });
        assert_eq!(state, ConnState::Open, "a connection closed");
        if out.is_empty() {
            self.spare.push(out);
            return;
        }
        let end = *self.links.get(&(i, conn)).expect("a known connection");
        if i == self.leader && matches!(end, End::Peer(..)) {
            self.leader_sends += 1;
        }
        let now = self.now;
        let written = out.len();
        self.in_flight.push_back((end, out));
        self.on(i, |node| node.handle_written(now, conn, written));
        self.dispatch(i);
        self.on(i, |node| node.wants_input(conn));
    }

    /// Delivers what was in flight (one network hop), and transmits what
    /// that made the nodes send.
    fn hop(&mut self) {
        for _ in 0..self.in_flight.len() {
            let Some((end, bytes)) = self.in_flight.pop_front() else {
                break;
            };
            match end {
                End::Peer(j, conn) => self.input(j, conn, &bytes),
                End::Client => self.client_receive(&bytes),
            }
            self.spare.push(bytes);
            self.flush();
        }
        self.flush();
    }

    fn client_receive(&mut self, mut bytes: &[u8]) {
        let Some(mut client) = self.client.take() else {
            return;
        };
        while !client.established {
            let (used, status) = client.handshake.handle_input(bytes);
            bytes = &bytes[used..];
            match status {
                ClientHandshakeStatus::NeedMore => break,
                ClientHandshakeStatus::SendProof => {
                    let proof = client.handshake.proof().expect("proof");
                    self.input(self.leader, client.conn, &proof);
                }
                ClientHandshakeStatus::Accepted => client.established = true,
                other => panic!("client handshake: {other:?}"),
            }
            if bytes.is_empty() {
                break;
            }
        }
        client.buf.extend_from_slice(bytes);
        client.receive();
        self.client = Some(client);
    }

    /// Moves the clock by `by`, fires every due timer and makes one hop.
    fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        let now = self.now;
        for i in 0..self.nodes.len() {
            if self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
                self.on(i, |node| node.handle_timeout(now));
                self.dispatch(i);
            }
        }
        self.flush();
        self.hop();
    }

    /// Elects a leader and connects the client to it, every task's first
    /// acquire ready.
    fn start(&mut self) {
        self.flush();
        for _ in 0..100_000 {
            if self.nodes.iter().any(ClusterNode::is_leader) {
                break;
            }
            let next = self
                .nodes
                .iter()
                .filter_map(Machine::poll_timeout)
                .min()
                .expect("a timer");
            self.advance(next.saturating_duration_since(self.now));
        }
        let leader = self
            .nodes
            .iter()
            .position(ClusterNode::is_leader)
            .expect("a leader");
        self.leader = leader;
        let mut role = 1;
        for i in 0..3 {
            self.roles[i] = if i == leader {
                0
            } else {
                role += 1;
                role - 1
            };
        }
        // Let the leader catch up (its no-op and Init applied).
        for _ in 0..100 {
            self.advance(Duration::from_millis(10));
        }
        let nonce = self.nonce();
        let now = self.now;
        let conn = self
            .on(leader, |node| node.handle_connect(now, nonce, LOOPBACK))
            .expect("client connection");
        self.links.insert((leader, conn), End::Client);
        let mut client = Client {
            conn,
            handshake: ClientHandshake::new(b"", FINGERPRINT, WireMode::Cluster, leader as u8),
            established: false,
            buf: Vec::new(),
            ready: VecDeque::new(),
            tokens: [0; TASKS],
            next_rid: 0,
            released: 0,
            keys: (0..KEYS)
                .map(|key| {
                    KeyGroup::single(Key::new(format!("bench-{key}").as_bytes()).expect("key"))
                })
                .collect(),
        };
        for task in 0..TASKS {
            client.acquire(task);
        }
        self.client = Some(client);
        self.dispatch(leader);
        while !self.client.as_ref().is_some_and(|c| c.established) {
            self.advance(STEP);
        }
    }

    /// Runs steps until `pairs` more releases were answered.
    fn run(&mut self, pairs: usize, batch: usize) {
        let target = self.client.as_ref().map_or(0, |c| c.released) + pairs;
        let mut frames = Vec::new();
        while self.client.as_ref().is_some_and(|c| c.released < target) {
            let Some(mut client) = self.client.take() else {
                return;
            };
            frames.clear();
            let take = client.ready.len().min(2 * batch);
            for request in client.ready.drain(..take) {
                request.encode(&mut frames);
            }
            let conn = client.conn;
            self.client = Some(client);
            if !frames.is_empty() {
                self.client_inputs += 1;
                self.input(self.leader, conn, &frames);
            }
            self.advance(STEP);
        }
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one round measured, per pair.
struct Round {
    /// The thread's CPU µs.
    thread: f64,
    /// Each node's CPU µs: leader, follower 1, follower 2.
    by_role: [f64; 3],
    /// The leader's peer sends.
    sends: f64,
    /// Client inputs.
    inputs: f64,
}

/// One round of `pairs` pairs, `batch` pairs per client input at most.
fn round(pairs: usize, batch: usize) -> Round {
    let mut net = Net::new();
    net.start();
    net.run(WARM_UP_PAIRS, batch);
    net.spent = [std::time::Duration::ZERO; 3];
    net.leader_sends = 0;
    net.client_inputs = 0;
    let started = proc_cpu::this_thread_cpu();
    let wall = std::time::Instant::now();
    net.run(pairs, batch);
    let wall = wall.elapsed().as_secs_f64();
    let cpu = proc_cpu::this_thread_cpu()
        .zip(started)
        .map_or(std::time::Duration::ZERO, |(end, start)| end - start);
    let thread_us = cpu.as_secs_f64() * 1e6 / pairs as f64;
    // Each node's share of the thread's CPU: its share of the run's
    // monotonic time.
    let mut by_role = [0.0; 3];
    for (i, spent) in net.spent.iter().enumerate() {
        by_role[net.roles[i]] = thread_us * spent.as_secs_f64() / wall.max(f64::MIN_POSITIVE);
    }
    Round {
        thread: thread_us,
        by_role,
        sends: net.leader_sends as f64 / pairs as f64,
        inputs: net.client_inputs as f64 / pairs as f64,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let pairs = env_or("TICKETING_BENCH_CLUSTER_PAIRS", PAIRS).max(1);
    let batch = env_or("TICKETING_BENCH_CLUSTER_BATCH", PAIRS_PER_INPUT).max(1);
    let rounds = env_or("TICKETING_BENCH_ROUNDS", 3).max(1);
    let results: Vec<_> = (0..rounds).map(|_| round(pairs, batch)).collect();
    let pick = |f: fn(&Round) -> f64| median(results.iter().map(f).collect());
    let thread = pick(|r| r.thread);
    let leader = pick(|r| r.by_role[0]);
    let follower_1 = pick(|r| r.by_role[1]);
    let follower_2 = pick(|r| r.by_role[2]);
    let sends = pick(|r| r.sends);
    let inputs = pick(|r| r.inputs);
    println!(
        "cluster core alone, in memory (3 nodes, {TASKS} tasks on {KEYS} keys pipelined on one \
         connection to the leader, {batch} pairs per input, {pairs} pairs, median of {rounds}): \
         CPU µs per acquire+release, 3 nodes {:.2} (leader {leader:.2}, followers \
         {follower_1:.2} / {follower_2:.2}), thread {thread:.2}; per pair: {:.3} appends to each follower, {:.3} client inputs",
        leader + follower_1 + follower_2,
        sends / 2.0,
        inputs
    );
}
