//! A tiny deterministic in-memory network for Raft tests (in the spirit of
//! tikv/raft-rs `harness/src/network.rs`): nodes, a delivery queue ordered by
//! injected time, drop / cut / isolate / recover / kill, and safety checks
//! run after every input:
//!
//! - election safety: at most one leader per term;
//! - state machine safety: every node applies the same entry at each index;
//! - leader completeness: a new leader holds every entry applied anywhere;
//! - commit index never decreases;
//! - log matching (`check_log_matching`, called by tests).
//!
//! Time is injected: the loop jumps to the next delivery or deadline.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use ticketing_core::raft::{
    Committed, Entry, EntryKind, Event, Message, NodeId, Raft, RaftConfig, Role,
};
use ticketing_core::time::{Duration, Instant};

/// A splitmix64 for the harness's own choices (drops, delays).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        ticketing_core::rng::splitmix64(&mut self.0)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The test's state machine: the applied (index, term, payload) sequence.
/// Its snapshot is that sequence, encoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppState {
    pub applied: Vec<(u64, u64, Vec<u8>)>,
    pub last_index: u64,
}

impl AppState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.last_index.to_be_bytes());
        for (i, t, p) in &self.applied {
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&t.to_be_bytes());
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }
    pub fn decode(mut b: &[u8]) -> AppState {
        let take = |n: usize, b: &mut &[u8]| {
            let (h, t) = b.split_at(n);
            *b = t;
            h.to_vec()
        };
        let last_index = u64::from_be_bytes(take(8, &mut b).try_into().unwrap());
        let mut applied = Vec::new();
        while !b.is_empty() {
            let i = u64::from_be_bytes(take(8, &mut b).try_into().unwrap());
            let t = u64::from_be_bytes(take(8, &mut b).try_into().unwrap());
            let n = u32::from_be_bytes(take(4, &mut b).try_into().unwrap()) as usize;
            applied.push((i, t, take(n, &mut b)));
        }
        AppState {
            applied,
            last_index,
        }
    }
    /// Payloads of the applied commands.
    pub fn commands(&self) -> Vec<Vec<u8>> {
        self.applied.iter().map(|(_, _, p)| p.clone()).collect()
    }
}

pub struct Node {
    pub raft: Raft,
    pub app: AppState,
    pub alive: bool,
    pub last_commit: u64,
    pub snapshots_installed: u64,
    pub events: Vec<(Instant, Event)>,
    /// Answer `SnapshotWanted` with `compact`.
    pub auto_compact: bool,
}

/// Decides per message whether it is delivered.
pub type MessageFilter = Box<dyn FnMut(&Message) -> bool>;

pub struct Net {
    pub now: Instant,
    pub nodes: BTreeMap<NodeId, Node>,
    queue: BTreeMap<(Instant, u64), Message>,
    seq: u64,
    /// One-way delay: uniform in [min, max] ms.
    pub latency_min_ms: u64,
    pub latency_max_ms: u64,
    /// Percentage of messages dropped at random.
    pub drop_percent: u64,
    /// Percentage of messages delivered twice (with independent delays).
    pub duplicate_percent: u64,
    /// Directed links that drop everything.
    cut: BTreeSet<(NodeId, NodeId)>,
    pub rng: Rng,
    /// Leader of each term ever seen (election safety).
    pub leaders_by_term: BTreeMap<u64, NodeId>,
    /// (time, node, term) of every BecameLeader.
    pub leader_log: Vec<(Instant, NodeId, u64)>,
    /// index -> (term, kind) of every entry applied anywhere.
    pub applied_global: BTreeMap<u64, (u64, EntryKind)>,
    /// Optional message filter: return false to drop.
    pub filter: Option<MessageFilter>,
}

pub fn id(slot: u8, generation: u64) -> NodeId {
    NodeId::new(slot, generation)
}

impl Net {
    /// A bootstrapped cluster of `n` voters (slots 0..n, generation 1).
    pub fn new(n: u8, cfg: RaftConfig, seed: u64) -> Net {
        let voters: Vec<NodeId> = (0..n).map(|s| id(s, 1)).collect();
        let mut net = Net {
            now: Instant::ZERO,
            nodes: BTreeMap::new(),
            queue: BTreeMap::new(),
            seq: 0,
            latency_min_ms: 1,
            latency_max_ms: 1,
            drop_percent: 0,
            duplicate_percent: 0,
            cut: BTreeSet::new(),
            rng: Rng(seed ^ 0xABCD),
            leaders_by_term: BTreeMap::new(),
            leader_log: Vec::new(),
            applied_global: BTreeMap::new(),
            filter: None,
        };
        for &v in &voters {
            let raft = Raft::bootstrap(
                v,
                voters.iter().copied(),
                cfg.clone(),
                seed.wrapping_mul(31).wrapping_add(u64::from(v.slot)),
                net.now,
            );
            net.add(raft);
        }
        net
    }

    pub fn add(&mut self, raft: Raft) {
        let id = raft.id();
        self.nodes.insert(
            id,
            Node {
                raft,
                app: AppState::default(),
                alive: true,
                last_commit: 0,
                snapshots_installed: 0,
                events: Vec::new(),
                auto_compact: true,
            },
        );
        self.drain(id);
    }

    /// A new process (empty state) for `slot` with generation `generation`.
    pub fn join(&mut self, slot: u8, generation: u64, cfg: RaftConfig, seed: u64) -> NodeId {
        let nid = id(slot, generation);
        let raft = Raft::join(nid, cfg, seed, self.now);
        self.add(raft);
        nid
    }

    pub fn raft(&self, id: NodeId) -> &Raft {
        &self.nodes[&id].raft
    }

    pub fn raft_mut(&mut self, id: NodeId) -> &mut Raft {
        &mut self.nodes.get_mut(&id).unwrap().raft
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    pub fn alive_ids(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive)
            .map(|(&i, _)| i)
            .collect()
    }

    // --- faults -----------------------------------------------------------

    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    /// Cuts `a` from every other node (both directions).
    pub fn isolate(&mut self, a: NodeId) {
        for b in self.ids() {
            if b != a {
                self.cut(a, b);
            }
        }
    }

    /// Splits the nodes into groups that cannot talk across.
    pub fn partition(&mut self, groups: &[Vec<NodeId>]) {
        for (i, g) in groups.iter().enumerate() {
            for (j, h) in groups.iter().enumerate() {
                if i != j {
                    for &a in g {
                        for &b in h {
                            self.cut.insert((a, b));
                        }
                    }
                }
            }
        }
    }

    pub fn recover(&mut self) {
        self.cut.clear();
        self.drop_percent = 0;
        self.duplicate_percent = 0;
    }

    /// The process dies: its state is gone for good (volatile).
    pub fn kill(&mut self, a: NodeId) {
        self.nodes.get_mut(&a).unwrap().alive = false;
    }

    // --- driving ----------------------------------------------------------

    fn drain(&mut self, nid: NodeId) {
        let now = self.now;
        let mut outgoing = Vec::new();
        {
            let node = self.nodes.get_mut(&nid).unwrap();
            while let Some((to, msg)) = node.raft.poll_message() {
                assert_eq!(to, msg.to);
                assert_eq!(msg.from, nid);
                outgoing.push(msg);
            }
        }
        for msg in outgoing {
            self.enqueue(msg);
        }
        // Apply.
        let mut applied = Vec::new();
        let mut restored = None;
        {
            let node = self.nodes.get_mut(&nid).unwrap();
            while let Some(c) = node.raft.poll_committed() {
                match c {
                    Committed::Entry(e) => {
                        assert_eq!(
                            e.index,
                            node.app.last_index + 1,
                            "{nid:?} applies out of order"
                        );
                        node.app.last_index = e.index;
                        if let EntryKind::Command(p) = &e.kind {
                            node.app.applied.push((e.index, e.term, p.to_vec()));
                        }
                        applied.push(e);
                    }
                    Committed::Snapshot { meta, data } => {
                        let app = AppState::decode(&data);
                        assert_eq!(app.last_index, meta.index);
                        assert!(meta.index > node.app.last_index);
                        node.app = app.clone();
                        node.snapshots_installed += 1;
                        restored = Some(app);
                    }
                }
            }
            let commit = node.raft.commit_index();
            assert!(
                commit >= node.last_commit,
                "{nid:?} commit index went back: {} -> {commit}",
                node.last_commit
            );
            node.last_commit = commit;
        }
        for e in applied {
            self.check_applied(nid, &e);
        }
        if let Some(app) = restored {
            // Every command in a snapshot must agree with what was applied
            // elsewhere at that index.
            for (i, t, p) in &app.applied {
                let e = Entry {
                    index: *i,
                    term: *t,
                    kind: EntryKind::Command(p.clone().into()),
                };
                self.check_applied(nid, &e);
            }
        }
        // Events.
        let mut events = Vec::new();
        {
            let node = self.nodes.get_mut(&nid).unwrap();
            while let Some(ev) = node.raft.poll_event() {
                events.push(ev);
            }
        }
        for ev in events {
            match &ev {
                Event::BecameLeader { term } => {
                    if let Some(prev) = self.leaders_by_term.insert(*term, nid) {
                        assert_eq!(prev, nid, "two leaders in term {term}");
                    }
                    self.leader_log.push((now, nid, *term));
                    self.check_leader_completeness(nid);
                }
                Event::SnapshotWanted { .. } => {
                    let node = self.nodes.get_mut(&nid).unwrap();
                    if node.auto_compact {
                        let data = node.app.encode();
                        node.raft.compact(data).unwrap();
                    }
                }
                _ => {}
            }
            self.nodes.get_mut(&nid).unwrap().events.push((now, ev));
        }
    }

    fn check_applied(&mut self, nid: NodeId, e: &Entry) {
        let key = (e.term, e.kind.clone());
        match self.applied_global.get(&e.index) {
            Some(prev) => assert_eq!(
                prev, &key,
                "state machine safety: {nid:?} applied a different entry at {}",
                e.index
            ),
            None => {
                self.applied_global.insert(e.index, key);
            }
        }
    }

    fn check_leader_completeness(&self, nid: NodeId) {
        let raft = &self.nodes[&nid].raft;
        for (&index, (term, _)) in &self.applied_global {
            if index < raft.first_index() {
                continue; // in its snapshot, which holds only committed state
            }
            assert_eq!(
                raft.term_at(index),
                Some(*term),
                "leader completeness: new leader {nid:?} (term {}) lacks committed entry {index}",
                raft.term()
            );
        }
    }

    fn enqueue(&mut self, msg: Message) {
        if self.cut.contains(&(msg.from, msg.to)) {
            return;
        }
        if !self.nodes.get(&msg.from).is_some_and(|n| n.alive) {
            return;
        }
        if self.drop_percent > 0 && self.rng.chance(self.drop_percent) {
            return;
        }
        if let Some(f) = self.filter.as_mut()
            && !f(&msg)
        {
            return;
        }
        let copies = if self.duplicate_percent > 0 && self.rng.chance(self.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let span = self.latency_max_ms.saturating_sub(self.latency_min_ms) * 1000;
            let delay_us = self.latency_min_ms * 1000 + self.rng.below(span + 1);
            let at = Instant::from_micros(self.now.as_micros() + delay_us);
            self.seq += 1;
            self.queue.insert((at, self.seq), msg.clone());
        }
    }

    /// The next instant something happens.
    fn next_event(&self) -> Option<Instant> {
        let q = self.queue.keys().next().map(|(t, _)| *t);
        let timers = self
            .nodes
            .values()
            .filter(|n| n.alive)
            .filter_map(|n| n.raft.poll_timeout())
            .min();
        match (q, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs until `until` (inclusive), jumping between events.
    pub fn run_until(&mut self, until: Instant) {
        while let Some(t) = self.next_event() {
            if t > until {
                break;
            }
            self.now = self.now.max(t);
            self.step_once();
        }
        self.now = self.now.max(until);
    }

    pub fn run_for(&mut self, d: Duration) {
        let until = self.now.saturating_add(d);
        self.run_until(until);
    }

    pub fn run_ms(&mut self, ms: u64) {
        self.run_for(Duration::from_millis(ms));
    }

    /// Delivers everything due and fires every due timer, once.
    fn step_once(&mut self) {
        let now = self.now;
        let due: Vec<(Instant, u64)> = self
            .queue
            .range(..=(now, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let msg = self.queue.remove(&k).unwrap();
            // Cut links also drop what is already in flight.
            if self.cut.contains(&(msg.from, msg.to)) {
                continue;
            }
            let to = msg.to;
            let Some(node) = self.nodes.get_mut(&to) else {
                continue;
            };
            if !node.alive {
                continue;
            }
            node.raft.step(now, msg);
            self.drain(to);
        }
        for nid in self.ids() {
            let node = self.nodes.get_mut(&nid).unwrap();
            if !node.alive {
                continue;
            }
            if node.raft.poll_timeout().is_some_and(|t| t <= now) {
                node.raft.handle_timeout(now);
                self.drain(nid);
            }
        }
    }

    // --- queries and helpers ---------------------------------------------

    /// The alive leader with the highest term, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive && n.raft.role() == Role::Leader)
            .max_by_key(|(_, n)| n.raft.term())
            .map(|(&i, _)| i)
    }

    /// Runs until some alive node leads (and its term's no-op is committed),
    /// or panics after `limit_ms`.
    pub fn run_until_leader(&mut self, limit_ms: u64) -> NodeId {
        self.run_until_leader_other_than(None, limit_ms)
    }

    /// Like `run_until_leader`, but a leader equal to `old` does not count.
    pub fn run_until_leader_other_than(&mut self, old: Option<NodeId>, limit_ms: u64) -> NodeId {
        let deadline = self.now.saturating_add(Duration::from_millis(limit_ms));
        loop {
            if let Some(l) = self.leader().filter(|&l| Some(l) != old) {
                let r = self.raft(l);
                if r.term_at(r.commit_index()) == Some(r.term()) {
                    return l;
                }
            }
            let Some(t) = self.next_event() else {
                panic!("no events")
            };
            if t > deadline {
                self.dump();
                panic!("no leader within {limit_ms} ms");
            }
            self.now = self.now.max(t);
            self.step_once();
        }
    }

    pub fn propose(&mut self, nid: NodeId, payload: &[u8]) -> (u64, u64) {
        let now = self.now;
        let r = self
            .raft_mut(nid)
            .propose(now, payload.to_vec())
            .expect("propose");
        self.drain(nid);
        r
    }

    pub fn try_propose(&mut self, nid: NodeId, payload: &[u8]) -> bool {
        let now = self.now;
        let ok = self.raft_mut(nid).propose(now, payload.to_vec()).is_ok();
        self.drain(nid);
        ok
    }

    /// Lets the driver code call any Raft API at `now`, then drains.
    pub fn with<R>(&mut self, nid: NodeId, f: impl FnOnce(&mut Raft, Instant) -> R) -> R {
        let now = self.now;
        let r = f(self.raft_mut(nid), now);
        self.drain(nid);
        r
    }

    /// Log matching: if two logs hold an entry with the same index and
    /// term, they are identical up to it (within what both still hold).
    pub fn check_log_matching(&self) {
        let ids = self.ids();
        for (k, &a) in ids.iter().enumerate() {
            for &b in &ids[k + 1..] {
                let (ra, rb) = (self.raft(a), self.raft(b));
                let lo = ra.first_index().max(rb.first_index());
                let hi = ra.last_index().min(rb.last_index());
                let mut i = hi;
                while i >= lo && i > 0 {
                    if ra.term_at(i) == rb.term_at(i) {
                        for j in lo..=i {
                            assert_eq!(
                                ra.entry(j),
                                rb.entry(j),
                                "log matching: {a:?} and {b:?} agree at {i} but differ at {j}"
                            );
                        }
                        break;
                    }
                    i -= 1;
                }
            }
        }
    }

    /// Every alive node has applied the same commands.
    pub fn assert_converged(&self, nodes: &[NodeId]) {
        let first = &self.nodes[&nodes[0]];
        for n in nodes {
            let node = &self.nodes[n];
            assert_eq!(
                node.raft.commit_index(),
                first.raft.commit_index(),
                "{n:?} commit differs from {:?}",
                nodes[0]
            );
            assert_eq!(
                node.app, first.app,
                "{n:?} state differs from {:?}",
                nodes[0]
            );
        }
    }

    /// Prints every node's state (for failing seeds).
    pub fn dump(&self) {
        eprintln!("--- now {:?}", self.now);
        for (id, n) in &self.nodes {
            let r = &n.raft;
            eprintln!(
                "{id:?} alive={} role={:?} term={} leader={:?} vote={:?} last=({}, {:?}) commit={} first={} voters={:?} learners={:?}",
                n.alive,
                r.role(),
                r.term(),
                r.leader(),
                r.vote(),
                r.last_index(),
                r.term_at(r.last_index()),
                r.commit_index(),
                r.first_index(),
                r.config().voters,
                r.config().learners
            );
        }
    }

    pub fn count_leaders(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| n.alive && n.raft.role() == Role::Leader)
            .count()
    }
}
