//! A cluster's client side fed raw bytes: see [`cluster_clients`].

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::{ClientHandshake, ClientHandshakeStatus, HELLO_LEN, WireMode};
use crate::cluster::peer::PeerTokens;
use crate::cluster::{ClusterConfig, ClusterNode};
use crate::machine::{Machine, Output};
use crate::raft::{NodeId, RaftConfig};
use crate::server::{ConnId, ConnState};
use crate::time::{Duration, Instant};
use crate::wire::Reply;

use super::script::{Cursor, fuzz_request};

pub(super) const FINGERPRINT: [u8; 32] = [0x3c; 32];
pub(super) const BOOT_US: u64 = 1_700_000_000_000_000;

/// The peer token every node of [`Cluster`] proves with.
pub(super) const PEER_TOKEN: &[u8] = b"fuzz-peer-secret-0123456789-abcdefghijk";

/// Three cluster nodes whose peer connections move bytes reliably.
pub(super) struct Cluster {
    pub(super) now: Instant,
    pub(super) nodes: Vec<ClusterNode>,
    /// (node, peer conn) → (node, peer conn) at the other end.
    peer_links: BTreeMap<(usize, ConnId), (usize, ConnId)>,
    /// Connections whose other end is the harness itself: what the node
    /// writes there is discarded.
    pub(super) taps: BTreeSet<(usize, ConnId)>,
    nonce: u8,
}

pub(super) struct Client {
    pub(super) node: usize,
    pub(super) conn: ConnId,
    pub(super) received: Vec<u8>,
    pub(super) closed: bool,
}

impl Cluster {
    pub(super) fn new() -> Cluster {
        let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
        let now = Instant::from_millis(1);
        let nodes = voters
            .iter()
            .map(|&id| {
                let tokens = PeerTokens::new([PEER_TOKEN]).expect("token");
                let mut config = ClusterConfig::new(FINGERPRINT, id, 3, tokens, BOOT_US);
                config.raft = RaftConfig::fast();
                config.limits.keys_max = 3;
                config.limits.waiters_per_key_max = 3;
                config.limits.waiters_total_max = 5;
                config.connections_max = 6;
                config.in_flight_per_connection_max = 4;
                config.outbound_bytes_per_connection_max = 256;
                ClusterNode::bootstrap(config, voters.clone(), 2, u64::from(id.slot) + 1, now)
            })
            .collect();
        Cluster {
            now,
            nodes,
            peer_links: BTreeMap::new(),
            taps: BTreeSet::new(),
            nonce: 0,
        }
    }

    pub(super) fn nonce(&mut self) -> [u8; 16] {
        self.nonce = self.nonce.wrapping_add(1);
        [self.nonce; 16]
    }

    /// Moves peer bytes and dials until nothing moves; client bytes are
    /// collected into `clients`.
    pub(super) fn settle(&mut self, clients: &mut [Client]) {
        for _ in 0..1_000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                let now = self.now;
                while let Some(output) = self.nodes[i].poll_output(now) {
                    match output {
                        Output::Dial { slot } => {
                            moved = true;
                            let target = usize::from(slot);
                            let (n1, n2) = (self.nonce(), self.nonce());
                            let a = self.nodes[i]
                                .handle_dialed(now, slot, n1)
                                .expect("a dialed connection is taken");
                            match self.nodes[target].handle_peer_accept(now, n2, node_source(i)) {
                                Some(b) => {
                                    self.peer_links.insert((i, a), (target, b));
                                    self.peer_links.insert((target, b), (i, a));
                                }
                                None => self.nodes[i].handle_closed(now, a),
                            }
                        }
                        Output::Wake(conn) => {
                            let mut out = Vec::new();
                            let state = self.nodes[i].poll_transmit(conn, &mut out);
                            self.nodes[i].handle_flushed(now, conn);
                            if let Some(&(j, other)) = self.peer_links.get(&(i, conn)) {
                                if !out.is_empty() {
                                    moved = true;
                                    self.nodes[j].handle_input(now, other, &out);
                                }
                                if state != ConnState::Open {
                                    moved = true;
                                    self.peer_links.remove(&(i, conn));
                                    self.peer_links.remove(&(j, other));
                                    self.nodes[i].handle_closed(now, conn);
                                    self.nodes[j].handle_closed(now, other);
                                }
                            } else if self.taps.contains(&(i, conn)) {
                                if state != ConnState::Open {
                                    self.taps.remove(&(i, conn));
                                    self.nodes[i].handle_closed(now, conn);
                                }
                            } else if let Some(client) = clients
                                .iter_mut()
                                .find(|c| c.node == i && c.conn == conn && !c.closed)
                            {
                                client.received.extend_from_slice(&out);
                                if state != ConnState::Open {
                                    client.closed = true;
                                    self.nodes[i].handle_closed(now, conn);
                                }
                            }
                        }
                        // Unlimited tokens, no operator, nobody logging.
                        Output::Reserve { .. }
                        | Output::AdminReply { .. }
                        | Output::Log(_)
                        | Output::Alert(_)
                        | Output::Node(_) => {}
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    pub(super) fn advance(&mut self, by: Duration, clients: &mut [Client]) {
        let end = self.now.saturating_add(by);
        loop {
            self.settle(clients);
            let next = self
                .nodes
                .iter()
                .filter_map(Machine::poll_timeout)
                .min()
                .unwrap_or(end)
                .max(self.now.saturating_add(Duration::from_micros(1)));
            if next > end {
                break;
            }
            self.now = next;
            for node in &mut self.nodes {
                node.handle_timeout(next);
            }
        }
        self.now = end;
        for node in &mut self.nodes {
            node.handle_timeout(end);
        }
        self.settle(clients);
    }

    pub(super) fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(ClusterNode::is_leader)
    }
}

/// Checks that `bytes` is a cluster hello naming `slot`, optionally a result
/// byte, and then only well-formed replies; returns the tokens granted.
fn check_output(bytes: &[u8], slot: u8) -> Vec<u64> {
    let mut tokens = Vec::new();
    if bytes.len() < HELLO_LEN {
        return tokens;
    }
    let mut client = ClientHandshake::new(b"", FINGERPRINT, WireMode::Cluster, slot);
    let (used, status) = client.handle_input(&bytes[..HELLO_LEN]);
    assert_eq!(
        (used, status),
        (HELLO_LEN, ClientHandshakeStatus::SendProof)
    );
    let Some((&result, mut rest)) = bytes[HELLO_LEN..].split_first() else {
        return tokens;
    };
    assert!(result <= 1, "result byte {result}");
    assert!(result == 1 || rest.is_empty(), "bytes after a rejection");
    while !rest.is_empty() {
        match Reply::decode(rest) {
            Ok(Some((reply, used))) => {
                if let Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } = reply {
                    tokens.push(token);
                }
                if let Reply::Leader { leader_slot } | Reply::Moved { leader_slot, .. } = reply {
                    assert!(leader_slot < 3 || leader_slot == 0xff, "slot {leader_slot}");
                }
                rest = &rest[used..];
            }
            Ok(None) => panic!("a node wrote a partial frame"),
            Err(error) => panic!("a node wrote a bad frame: {error:?}"),
        }
    }
    tokens
}

/// Elects a leader among three in-memory cluster nodes, then runs a script
/// of client connections to any of them: raw bytes, valid handshakes and
/// requests, short reads, closes and clock jumps (the cluster counterpart
/// of [`super::server_session`]).
///
/// Checks: no node panics; every node writes only a cluster hello naming
/// itself, a result byte and well-formed replies; tokens granted anywhere
/// are unique and every replica's counter never goes down; once every
/// connection is closed and every lease has run out, no key is held and no
/// waiter is left, and all replicas hold the same replicated state.
pub fn cluster_clients(data: &[u8]) {
    let mut harness = ClientsHarness::new();
    let mut cursor = Cursor { data };
    for _ in 0..200 {
        let Some(op) = cursor.byte() else { break };
        let pick = usize::from(cursor.byte().unwrap_or(0));
        harness.step(&mut cursor, op, pick);
        harness.check_counters();
    }
    harness.finish();
}

/// The cluster under test, its clients, and what was checked so far.
struct ClientsHarness {
    cluster: Cluster,
    clients: Vec<Client>,
    /// The last request id used.
    rid: u64,
    /// Each node's token counter when last checked.
    counters: Vec<u64>,
}

impl ClientsHarness {
    /// Three nodes with a leader elected.
    fn new() -> ClientsHarness {
        let mut cluster = Cluster::new();
        let mut clients: Vec<Client> = Vec::new();
        cluster.advance(Duration::from_secs(2), &mut clients);
        if cluster.leader().is_none() {
            // Fast-profile elections among reliable nodes end well within 2 s.
            panic!("no leader elected before the script");
        }
        let counters: Vec<u64> = cluster
            .nodes
            .iter()
            .map(|n| n.lock_state().next_token())
            .collect();
        ClientsHarness {
            cluster,
            clients,
            rid: 0,
            counters,
        }
    }

    /// One script step, picked by `op`, on the live client `pick` picks.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8, pick: usize) {
        let live: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].closed)
            .collect();
        let target = (!live.is_empty()).then(|| live[pick % live.len()]);
        match (op % 8, target) {
            (0, _) => self.connect(pick),
            (1, Some(index)) => self.send_raw(cursor, index),
            (2, Some(index)) => self.send_proof(index),
            (3, Some(index)) => self.send_request(cursor, index),
            (4, _) => self.advance_clock(pick),
            (5, Some(index)) => self.close(index),
            (6, Some(index)) => self.short_write(cursor, index),
            _ => self.cluster.settle(&mut self.clients),
        }
    }

    /// Connects a client to node `pick % 3`.
    fn connect(&mut self, pick: usize) {
        let now = self.cluster.now;
        let node = pick % 3;
        let nonce = self.cluster.nonce();
        if let Some(conn) = self.cluster.nodes[node].handle_connect(now, nonce, client_source(pick))
        {
            self.clients.push(Client {
                node,
                conn,
                received: Vec::new(),
                closed: false,
            });
        }
    }

    /// Sends raw bytes.
    fn send_raw(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        let now = self.cluster.now;
        let len = usize::from(cursor.byte().unwrap_or(0));
        let bytes = cursor.bytes(len).to_vec();
        let client = &self.clients[index];
        self.cluster.nodes[client.node].handle_input(now, client.conn, &bytes);
    }

    /// Sends the handshake proof, once the hello is in.
    fn send_proof(&mut self, index: usize) {
        let now = self.cluster.now;
        // The proof, once the hello is in.
        self.cluster.settle(&mut self.clients);
        let client = &self.clients[index];
        if client.received.len() >= HELLO_LEN {
            let mut handshake =
                ClientHandshake::new(b"", FINGERPRINT, WireMode::Cluster, client.node as u8);
            handshake.handle_input(&client.received[..HELLO_LEN]);
            if let Some(proof) = handshake.proof() {
                self.cluster.nodes[client.node].handle_input(now, client.conn, &proof);
            }
        }
    }

    /// Sends a well-formed request.
    fn send_request(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        let now = self.cluster.now;
        self.rid += 1;
        // Tokens start at BOOT_US: small offsets hit live grants.
        let request = fuzz_request(cursor, self.rid, BOOT_US);
        let client = &self.clients[index];
        self.cluster.nodes[client.node].handle_input(now, client.conn, &request.to_frame());
    }

    /// Moves the clock on by `pick` × 20 ms.
    fn advance_clock(&mut self, pick: usize) {
        self.cluster
            .advance(Duration::from_millis(pick as u64 * 20), &mut self.clients);
    }

    /// Closes the client's connection.
    fn close(&mut self, index: usize) {
        let now = self.cluster.now;
        let client = &self.clients[index];
        self.cluster.nodes[client.node].handle_closed(now, client.conn);
        self.clients[index].closed = true;
    }

    /// Takes the output, of which only a prefix is written.
    fn short_write(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        let now = self.cluster.now;
        // A short write: only a prefix of what was taken goes out.
        let client = &mut self.clients[index];
        let node = &mut self.cluster.nodes[client.node];
        let mut out = Vec::new();
        node.poll_transmit(client.conn, &mut out);
        let written = usize::from(cursor.byte().unwrap_or(0)).min(out.len());
        node.handle_written(now, client.conn, written);
        client.received.extend_from_slice(&out);
    }

    /// No replica's token counter went down.
    fn check_counters(&mut self) {
        for (i, node) in self.cluster.nodes.iter().enumerate() {
            let counter = node.lock_state().next_token();
            assert!(
                counter >= self.counters[i],
                "node {i}'s token counter went down"
            );
            self.counters[i] = counter;
        }
    }

    /// Closes every client and lets every lease run out: nothing is left,
    /// no token was granted twice, and every replica agrees.
    fn finish(mut self) {
        self.cluster.settle(&mut self.clients);
        let mut granted = Vec::new();
        for client in &mut self.clients {
            granted.extend(check_output(&client.received, client.node as u8));
            if !client.closed {
                client.closed = true;
                let now = self.cluster.now;
                self.cluster.nodes[client.node].handle_closed(now, client.conn);
            }
        }
        let count = granted.len();
        granted.sort_unstable();
        granted.dedup();
        assert_eq!(granted.len(), count, "a token was granted twice");
        // Every lease runs out and is expired through the log (the leader
        // checks every 100 ms); then every replica agrees and holds nothing.
        let last_deadline = self
            .cluster
            .nodes
            .iter()
            .flat_map(|node| {
                node.lock_state()
                    .grants()
                    .map(|(_, holding)| holding.deadline)
            })
            .max()
            .unwrap_or(self.cluster.now);
        let wait = last_deadline.saturating_duration_since(self.cluster.now);
        self.cluster.advance(
            wait.saturating_add(Duration::from_secs(1)),
            &mut self.clients,
        );
        let leader = self.cluster.leader().expect("a leader after the script");
        let stats = self.cluster.nodes[leader].stats();
        assert_eq!(stats.waiters, 0, "waiters outlived their connections");
        let view = self.cluster.nodes[leader].lock_state().replicated_view();
        assert!(
            view.1.is_empty(),
            "grants left after every lease ended: {view:?}"
        );
        for node in &self.cluster.nodes {
            assert_eq!(node.stats().clients, 0);
            assert_eq!(node.lock_state().replicated_view(), view, "replicas differ");
        }
    }
}

/// The address node `slot` dials from.
pub(super) fn node_source(slot: usize) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 1, slot as u8])
}

/// The address a client connects from (a few share one, as behind a NAT).
pub(super) fn client_source(pick: usize) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 2, (pick % 4) as u8])
}
