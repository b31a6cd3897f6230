//! A cluster of three nodes over an in-memory network with faults.

use super::*;

/// The cluster fingerprint of a [`ClusterNet`]'s nodes.
pub const CLUSTER_FINGERPRINT: [u8; 32] = [3; 32];

/// The wall clock of a [`ClusterNet`]'s nodes at start, in microseconds:
/// also where their tokens start.
pub const BOOT_US: u64 = 1_700_000_000_000_000;

/// The generation a bootstrap member of a [`ClusterNet`] joins under if it
/// finds the cluster already running.
pub const REJOIN_GENERATION: u64 = 7;

/// The peer token every node of a [`ClusterNet`] shares.
pub const PEER_TOKEN: &[u8] = b"peer-secret-0123456789-abcdefghijk";

/// The configuration of node `id` of a three-node [`ClusterNet`]: fast
/// Raft timing, the default silence rule, clock at [`BOOT_US`].
pub fn cluster_config(id: NodeId) -> ClusterConfig {
    cluster_config_with_clock(id, BOOT_US)
}

/// [`cluster_config`] with the node's wall clock reading
/// `bootstrap_wall_clock_us` at start.
pub fn cluster_config_with_clock(id: NodeId, bootstrap_wall_clock_us: u64) -> ClusterConfig {
    let tokens = PeerTokens::new([PEER_TOKEN]).expect("a valid peer token");
    let mut config =
        ClusterConfig::new(CLUSTER_FINGERPRINT, id, 3, tokens, bootstrap_wall_clock_us);
    config.raft = RaftConfig::fast();
    config.peer_silence_timeout = default_peer_silence_timeout(&config.raft);
    config
}

/// A client of a [`ClusterNet`]: a v3 or line connection to one node whose
/// replies the net decodes as they arrive.
#[derive(Debug)]
pub struct ClusterClient {
    /// The node it is connected to.
    pub node: usize,
    /// Its connection on that node.
    pub conn: ConnId,
    /// The v3 client's side of the handshake.
    pub handshake: ClientHandshake,
    /// The handshake is done.
    pub established: bool,
    /// Bytes received and not yet decoded.
    pub buf: Vec<u8>,
    /// Every v3 reply received, in order.
    pub replies: Vec<Reply>,
    /// The node closed the connection (or is gone).
    pub closed: bool,
    /// The "socket" to this client is stuck: its bytes stay in the node.
    pub stalled: bool,
    /// A line-dialect client: `replies` stays empty, `lines` has its
    /// replies as (op, token or owner, tail).
    pub line: bool,
    /// Every line reply received, in order.
    pub lines: Vec<(u8, u64, Vec<u8>)>,
}

/// Where bytes written on a node's connection go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A peer connection: the other node and its end of the link.
    Peer(usize, ConnId),
    /// A client: its index in [`ClusterNet::clients`].
    Client(usize),
}

/// Three [`ClusterNode`]s over an in-memory network with injected time:
/// bytes are moved between their connections exactly as a driver would,
/// and clients speak the real wire protocol. Peer dials connect at once
/// unless a node is cut off; links can go stale (bytes lost) and closes
/// can get stuck, as on a partitioned TCP network.
///
/// The fields are public: a test reads the nodes and clients, replaces a
/// node, or changes the network's faults directly.
#[derive(Debug)]
pub struct ClusterNet {
    /// The clock every input is given.
    pub now: Instant,
    /// The nodes by slot; `None`: killed (or not started again yet).
    pub nodes: Vec<Option<ClusterNode>>,
    /// Where the bytes written on each (node, connection) go.
    pub links: BTreeMap<(usize, ConnId), Endpoint>,
    /// Every client ever connected, by index.
    pub clients: Vec<ClusterClient>,
    /// The last nonce byte handed out (see [`ClusterNet::nonce`]).
    pub nonce: u8,
    /// Token reserve writes: the last value made durable per node.
    pub durable: Vec<Option<u64>>,
    /// Writes asked for stay unanswered while set (a stalled disk).
    pub hold_reserve_writes: bool,
    /// With `hold_reserve_writes`: only this node's writes are held
    /// (`None`: every node's). A follower appends no entry its durable
    /// reserve does not cover, so holding every node's stops commits.
    pub hold_reserve_writes_of: Option<usize>,
    /// A node cut off from the others: dials to or from it fail.
    pub cut: Option<usize>,
    /// Connection ends whose bytes never arrive (a cut link, and after the
    /// heal a socket whose retransmission timer backed off): only the local
    /// end learns of a close.
    pub stale: BTreeSet<(usize, ConnId)>,
    /// Stale ends whose close the transport never reports (a write stuck
    /// on a silent link).
    pub stuck: BTreeSet<(usize, ConnId)>,
    /// What each node emitted and the test has not looked at yet.
    pub outputs: Vec<OutputQueues>,
    /// Peer dials that connected.
    pub dials_connected: usize,
    /// `dials_connected` when the latest partition began.
    pub dials_at_cut: usize,
}

impl Default for ClusterNet {
    /// [`ClusterNet::new`].
    fn default() -> Self {
        ClusterNet::new()
    }
}

impl ClusterNet {
    /// Three bootstrap members of generation 1, clocks at [`BOOT_US`].
    pub fn new() -> Self {
        ClusterNet::with_boot_clocks([BOOT_US; 3])
    }

    /// Three bootstrap members whose configuration `adjust` changes.
    pub fn with_config(adjust: fn(&mut ClusterConfig)) -> Self {
        ClusterNet::build([BOOT_US; 3], adjust)
    }

    /// Three bootstrap members whose wall clocks read `clocks_us` at start.
    pub fn with_boot_clocks(clocks_us: [u64; 3]) -> Self {
        ClusterNet::build(clocks_us, |_| {})
    }

    fn build(clocks_us: [u64; 3], adjust: fn(&mut ClusterConfig)) -> Self {
        let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
        let nodes = voters
            .iter()
            .map(|id| {
                let mut config = cluster_config_with_clock(*id, clocks_us[usize::from(id.slot)]);
                adjust(&mut config);
                Some(ClusterNode::bootstrap(
                    config,
                    voters.clone(),
                    REJOIN_GENERATION,
                    u64::from(id.slot) + 11,
                    Instant::ZERO,
                ))
            })
            .collect();
        ClusterNet {
            now: Instant::ZERO,
            nodes,
            links: BTreeMap::new(),
            clients: Vec::new(),
            nonce: 0,
            durable: vec![None; 3],
            hold_reserve_writes: false,
            hold_reserve_writes_of: None,
            cut: None,
            stale: BTreeSet::new(),
            stuck: BTreeSet::new(),
            outputs: Vec::new(),
            dials_connected: 0,
            dials_at_cut: 0,
        }
    }

    /// Every node with a token reserve of `step` and nothing stored.
    pub fn with_reserves(step: u64) -> Self {
        let mut net = ClusterNet::new();
        for node in &mut net.nodes {
            *node = node
                .take()
                .map(|node| node.with_token_reserve(TokenReserve::new(step, None)));
        }
        net
    }

    /// Fresh nonce bytes: all the next byte value (wrapping).
    pub fn nonce(&mut self) -> [u8; 16] {
        self.nonce = self.nonce.wrapping_add(1);
        [self.nonce; 16]
    }

    /// Node `i`, which must be alive.
    pub fn node(&mut self, i: usize) -> &mut ClusterNode {
        self.nodes[i].as_mut().expect("node alive")
    }

    /// Node `i`'s outputs not looked at yet, with everything it emits now.
    pub fn outputs(&mut self, i: usize) -> &mut OutputQueues {
        let now = self.now;
        self.outputs
            .resize_with(self.nodes.len(), OutputQueues::default);
        let node = self.nodes[i].as_mut().expect("node alive");
        self.outputs[i].drain(node, now);
        &mut self.outputs[i]
    }

    /// Moves every byte until nothing moves.
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            self.outputs
                .resize_with(self.nodes.len(), OutputQueues::default);
            for i in 0..self.nodes.len() {
                let now = self.now;
                match self.nodes[i].as_mut() {
                    Some(node) => self.outputs[i].drain(node, now),
                    None => self.outputs[i] = OutputQueues::default(),
                }
                // Dials.
                while let Some(slot) = self.outputs[i].dials.pop_front() {
                    moved = true;
                    let target = usize::from(slot);
                    let across_cut = self.cut.is_some_and(|c| c == i || c == target);
                    if !across_cut && self.nodes.get(target).is_some_and(Option::is_some) {
                        self.dials_connected += 1;
                        let (n1, n2) = (self.nonce(), self.nonce());
                        let a = self
                            .node(i)
                            .handle_dialed(now, slot, n1)
                            .expect("a dialed connection is taken");
                        let b = self
                            .node(target)
                            .handle_peer_accept(now, n2, LOOPBACK)
                            .unwrap();
                        self.links.insert((i, a), Endpoint::Peer(target, b));
                        self.links.insert((target, b), Endpoint::Peer(i, a));
                    } else {
                        self.node(i).handle_dial_failed(now, slot);
                    }
                }
                // Token reserve writes, durable at once unless held back
                // (a write asked for then waits in the queue).
                let held = self.hold_reserve_writes
                    && self.hold_reserve_writes_of.is_none_or(|only| only == i);
                if !held && let Some(value) = self.outputs[i].reserves.pop_front() {
                    moved = true;
                    self.durable[i] = Some(value);
                    self.node(i).handle_reserve_persisted(now, value);
                }
                // Transmits.
                let mut deliveries = VecDeque::new();
                if let Some(node) = self.nodes[i].as_mut() {
                    while let Some(conn) = self.outputs[i].wakes.pop_front() {
                        if let Some(Endpoint::Client(c)) = self.links.get(&(i, conn))
                            && self.clients[*c].stalled
                        {
                            continue;
                        }
                        let mut out = Vec::new();
                        let state = node.poll_transmit(conn, &mut out);
                        node.handle_flushed(self.now, conn);
                        deliveries.push_back((conn, out, state));
                    }
                }
                for (conn, bytes, state) in deliveries {
                    moved = true;
                    let endpoint = self.links.get(&(i, conn)).copied();
                    if self.stale.contains(&(i, conn)) {
                        // Bytes are lost; a close reaches only this end.
                        if state != ConnState::Open && !self.stuck.contains(&(i, conn)) {
                            self.stale.remove(&(i, conn));
                            self.links.remove(&(i, conn));
                            let now = self.now;
                            self.node(i).handle_closed(now, conn);
                        }
                        continue;
                    }
                    match endpoint {
                        Some(Endpoint::Peer(j, other)) => {
                            if !bytes.is_empty()
                                && let Some(node) = self.nodes[j].as_mut()
                            {
                                node.handle_input(self.now, other, &bytes);
                            }
                            if state != ConnState::Open {
                                self.close_link(i, conn);
                            }
                        }
                        Some(Endpoint::Client(c)) => {
                            self.client_receive(c, &bytes);
                            if state != ConnState::Open {
                                self.clients[c].closed = true;
                                self.links.remove(&(i, conn));
                                let now = self.now;
                                self.node(i).handle_closed(now, conn);
                            }
                        }
                        // A socket nobody reads (an idle attacker's): the
                        // driver closes it when the node says so.
                        None => {
                            if state != ConnState::Open {
                                let now = self.now;
                                self.node(i).handle_closed(now, conn);
                            }
                        }
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("network did not settle");
    }

    /// Closes the link of node `i`'s `conn` at both ends.
    pub fn close_link(&mut self, i: usize, conn: ConnId) {
        if let Some(Endpoint::Peer(j, other)) = self.links.remove(&(i, conn)) {
            self.links.remove(&(j, other));
            if let Some(node) = self.nodes[j].as_mut() {
                node.handle_closed(self.now, other);
            }
        }
        if let Some(node) = self.nodes[i].as_mut() {
            node.handle_closed(self.now, conn);
        }
    }

    fn client_receive(&mut self, c: usize, mut bytes: &[u8]) {
        if self.clients[c].line {
            self.line_client_receive(c, bytes);
            return;
        }
        if !self.clients[c].established {
            loop {
                let client = &mut self.clients[c];
                let (used, status) = client.handshake.handle_input(bytes);
                bytes = &bytes[used..];
                match status {
                    ClientHandshakeStatus::NeedMore => return,
                    ClientHandshakeStatus::SendProof => {
                        let proof = client.handshake.proof().unwrap();
                        let (node, conn) = (client.node, client.conn);
                        let now = self.now;
                        self.node(node).handle_input(now, conn, &proof);
                        if bytes.is_empty() {
                            return;
                        }
                    }
                    ClientHandshakeStatus::Accepted => {
                        self.clients[c].established = true;
                        break;
                    }
                    other => panic!("client handshake failed: {other:?}"),
                }
            }
        }
        let client = &mut self.clients[c];
        client.buf.extend_from_slice(bytes);
        while let Ok(Some((reply, used))) = Reply::decode(&client.buf) {
            client.replies.push(reply);
            client.buf.drain(..used);
        }
    }

    /// Runs for `duration` of injected time, jumping between deadlines.
    pub fn run_for(&mut self, duration: Duration) {
        let end = self.now.saturating_add(duration);
        loop {
            self.settle();
            let next = self
                .nodes
                .iter()
                .flatten()
                .filter_map(Machine::poll_timeout)
                .min()
                .unwrap_or(end)
                .max(self.now.saturating_add(Duration::from_micros(1)));
            if next > end {
                self.now = end;
                break;
            }
            self.now = next;
            for node in self.nodes.iter_mut().flatten() {
                node.handle_timeout(next);
            }
        }
        for node in self.nodes.iter_mut().flatten() {
            node.handle_timeout(end);
        }
        self.settle();
    }

    /// Cuts node `i` off: its existing peer links go stale for good (in
    /// both directions, also after the heal) and dials across fail.
    pub fn partition(&mut self, i: usize) {
        self.cut = Some(i);
        for (&(n, conn), endpoint) in &self.links {
            if let Endpoint::Peer(j, other) = *endpoint
                && (n == i || j == i)
            {
                self.stale.insert((n, conn));
                self.stale.insert((j, other));
            }
        }
    }

    /// Ends the cut: new connections work, stale ones stay stale.
    pub fn heal(&mut self) {
        self.cut = None;
    }

    /// Whether every node follows the same leader (the leader itself too).
    pub fn all_follow_the_leader(&self) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let id = self.nodes[leader].as_ref().map(ClusterNode::id);
        self.nodes.iter().flatten().all(|node| node.leader() == id)
    }

    /// The node that believes it leads, if any (the first).
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.as_ref().is_some_and(ClusterNode::is_leader))
    }

    /// Kills node `i`: its outputs are dropped, its peer links close at
    /// the other end and its clients see their connection go.
    pub fn kill(&mut self, i: usize) {
        let links: Vec<(usize, ConnId)> = self
            .links
            .keys()
            .filter(|(n, _)| *n == i)
            .copied()
            .collect();
        self.nodes[i] = None;
        if let Some(outputs) = self.outputs.get_mut(i) {
            *outputs = OutputQueues::default();
        }
        for (n, conn) in links {
            match self.links.remove(&(n, conn)) {
                Some(Endpoint::Peer(j, other)) => {
                    self.links.remove(&(j, other));
                    if let Some(node) = self.nodes[j].as_mut() {
                        node.handle_closed(self.now, other);
                    }
                }
                Some(Endpoint::Client(c)) => self.clients[c].closed = true,
                None => {}
            }
        }
    }

    fn line_client_receive(&mut self, c: usize, bytes: &[u8]) {
        let client = &mut self.clients[c];
        client.buf.extend_from_slice(bytes);
        if !client.established {
            if client.buf.len() < 28 {
                return;
            }
            // The challenge: what follows the first space, up to the LF.
            let hello: Vec<u8> = client.buf.drain(..28).collect();
            let mut answer = line_answer(b"", &hello[13..27]).to_vec();
            answer.push(b'\n');
            client.established = true;
            let (node, conn) = (client.node, client.conn);
            let now = self.now;
            self.node(node).handle_input(now, conn, &answer);
        }
        let client = &mut self.clients[c];
        while let Ok(Some((reply, used))) = LineReply::decode(&client.buf) {
            let entry = match reply {
                LineReply::Acquired { token, key, .. } => (b'A', token, key.to_vec()),
                LineReply::TimedOut { owner, key } | LineReply::Busy { owner, key } => {
                    (reply.op(), owner, key.to_vec())
                }
                LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                    (reply.op(), token, key.to_vec())
                }
                LineReply::Moved { address } | LineReply::Leader { address } => {
                    (reply.op(), 0, address.to_vec())
                }
                LineReply::Error { reason } => (b'E', 0, reason.to_vec()),
            };
            client.lines.push(entry);
            client.buf.drain(..used);
        }
    }

    /// A line-dialect client connected to `node` (handshake done).
    pub fn connect_line(&mut self, node: usize) -> usize {
        let c = self.open_client(node, true);
        self.settle();
        assert!(self.clients[c].established && !self.clients[c].closed);
        c
    }

    fn open_client(&mut self, node: usize, line: bool) -> usize {
        let nonce = self.nonce();
        let now = self.now;
        let conn = self
            .node(node)
            .handle_connect(now, nonce, LOOPBACK)
            .unwrap();
        let c = self.clients.len();
        self.clients.push(ClusterClient {
            node,
            conn,
            handshake: ClientHandshake::new(
                b"",
                CLUSTER_FINGERPRINT,
                WireMode::Cluster,
                node as u8,
            ),
            established: false,
            buf: Vec::new(),
            replies: Vec::new(),
            closed: false,
            stalled: false,
            line,
            lines: Vec::new(),
        });
        self.links.insert((node, conn), Endpoint::Client(c));
        c
    }

    /// Sends raw bytes on client `c` without moving any other byte.
    pub fn send_bytes(&mut self, c: usize, bytes: &[u8]) {
        let (node, conn) = (self.clients[c].node, self.clients[c].conn);
        let now = self.now;
        self.node(node).handle_input(now, conn, bytes);
    }

    /// A v3 client connected to `node` (handshake done).
    pub fn connect(&mut self, node: usize) -> usize {
        let c = self.open_client(node, false);
        self.settle();
        assert!(self.clients[c].established);
        c
    }

    /// Sends `request` without moving any other byte.
    pub fn send_only(&mut self, c: usize, request: Request) {
        self.send_bytes(c, &request.to_frame());
    }

    /// Sends `request` on client `c`, runs 200 ms and returns the one
    /// answer it got (replies without a rid, such as leader notices, aside).
    pub fn request(&mut self, c: usize, request: Request) -> Reply {
        let before = self.clients[c].replies.len();
        self.send_only(c, request);
        self.run_for(Duration::from_millis(200));
        let replies = &self.clients[c].replies[before..];
        let answers: Vec<Reply> = replies
            .iter()
            .copied()
            .filter(|r| r.rid().is_some())
            .collect();
        assert_eq!(answers.len(), 1, "replies: {replies:?}");
        answers[0]
    }

    /// Every answer client `c` got so far (replies with a rid).
    pub fn answers(&self, c: usize) -> Vec<Reply> {
        self.clients[c]
            .replies
            .iter()
            .copied()
            .filter(|r| r.rid().is_some())
            .collect()
    }

    /// Runs 2 s and returns the leader, which there must be.
    pub fn elect(&mut self) -> usize {
        self.run_for(Duration::from_secs(2));
        self.leader().expect("a leader is elected")
    }

    /// Opens a connection to node `to` and completes the real peer
    /// handshake on it as node `from` would (same identity, same token):
    /// the connection and the frame sealer of that authenticated session.
    pub fn authenticated_peer(&mut self, from: usize, to: usize) -> (ConnId, PeerSealer) {
        let identity = PeerIdentity {
            fingerprint: CLUSTER_FINGERPRINT,
            id: self.node(from).id(),
            slot_count: 3,
            token_floor: 0,
        };
        let tokens = PeerTokens::new([PEER_TOKEN]).expect("a valid peer token");
        let (now, nonce) = (self.now, self.nonce());
        let mut dialer = PeerHandshake::new(
            identity,
            nonce,
            Some(to as u8),
            Instant::from_micros(u64::MAX),
        );
        let nonce = self.nonce();
        let conn = self
            .node(to)
            .handle_peer_accept(now, nonce, LOOPBACK)
            .expect("accepted");
        for _ in 0..8 {
            let bytes = dialer.take_outbound();
            if !bytes.is_empty() {
                self.node(to).handle_input(now, conn, &bytes);
            }
            let mut answer = Vec::new();
            self.node(to).poll_transmit(conn, &mut answer);
            let (_, status) = dialer.handle_input(&tokens, &answer);
            if let PeerHandshakeStatus::Established(_) = status {
                let bytes = dialer.take_outbound();
                if !bytes.is_empty() {
                    self.node(to).handle_input(now, conn, &bytes);
                }
                let session = dialer.take_session().expect("a session once established");
                return (conn, session.sealer);
            }
        }
        panic!("the peer handshake did not complete");
    }

    /// Every force-release answer node `i` gave and the test has not
    /// looked at yet.
    pub fn admin_replies(&mut self, i: usize) -> Vec<(AdminRequestId, ForceReleaseOutcome)> {
        self.outputs(i).admin_replies.drain(..).collect()
    }

    /// An operator's force-release on node `i` under admin id `id`.
    pub fn force_release(&mut self, i: usize, id: u64, req: ForceRelease) {
        let now = self.now;
        self.node(i)
            .handle_force_release(now, AdminRequestId(id), req);
    }

    /// The token that holds `k` in node `i`'s replicated state, if any.
    pub fn holder_token(&mut self, i: usize, k: &str) -> Option<u64> {
        self.node(i)
            .lock_state()
            .holder(&Key::new(k.as_bytes()).expect("valid key"))
            .map(|(t, _)| t)
    }
}
