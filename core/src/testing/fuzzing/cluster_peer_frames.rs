//! Sealed hostile peer frames on an authenticated connection into a
//! three-node cluster: see [`cluster_peer_frames`].

use std::collections::BTreeMap;

use crate::auth::{ClientHandshake, HELLO_LEN, WireMode};
use crate::cluster::ClusterNode;
use crate::cluster::peer::{
    PeerHandshake, PeerHandshakeStatus, PeerIdentity, PeerSession, PeerTokens,
};
use crate::machine::Machine;
use crate::raft::{Entry, EntryKind, Message, MessageBody, NodeId, SnapshotMeta};
use crate::server::ConnId;
use crate::time::Duration;
use crate::wire::{AcquireRequest, Key, KeyGroup, ReleaseRequest, Reply, Request};

use super::cluster_clients::{
    BOOT_US, Client, Cluster, FINGERPRINT, PEER_TOKEN, client_source, node_source,
};
use super::raft_group::{hostile_number, numbers_mut};
use super::script::Cursor;

/// Most script steps per input: keeps each run cheap.
const STEPS_MAX: usize = 120;
/// Simulated time the cluster gets, once the hostile input stops, to elect
/// a leader that grants.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// An extra, authenticated peer connection held by the harness in the name
/// of node `as_node`, into node `target`.
struct Attacker {
    target: usize,
    as_node: usize,
    conn: ConnId,
    session: PeerSession,
    /// The last frame sent, for replays.
    last_frame: Vec<u8>,
}

/// The safety records, updated after every step.
#[derive(Default)]
struct Watch {
    /// The leader seen in each term.
    leaders: BTreeMap<u64, usize>,
    /// The term of every committed index seen anywhere.
    committed: BTreeMap<u64, u64>,
    /// Each node's commit index when last checked.
    commits: Vec<u64>,
    /// Each node's token counter when last checked.
    counters: Vec<u64>,
    /// Largest token granted so far.
    last_token: u64,
    grants: usize,
    /// How far each client's output was read.
    read: Vec<usize>,
}

impl Watch {
    fn check(&mut self, cluster: &Cluster, clients: &[Client]) {
        self.commits.resize(cluster.nodes.len(), 0);
        self.counters.resize(cluster.nodes.len(), 0);
        for (i, node) in cluster.nodes.iter().enumerate() {
            let raft = node.raft();
            if raft.is_leader() {
                let first = *self.leaders.entry(raft.term()).or_insert(i);
                assert_eq!(first, i, "two leaders in term {}", raft.term());
            }
            let commit = raft.commit_index();
            assert!(
                commit >= self.commits[i],
                "node {i}'s commit index went back"
            );
            for index in self.commits[i] + 1..=commit {
                // Compacted indexes are checked by the nodes that still
                // hold them.
                if let Some(term) = raft.term_at(index) {
                    let first = *self.committed.entry(index).or_insert(term);
                    assert_eq!(first, term, "the entry committed at {index} changed");
                }
            }
            self.commits[i] = commit;
            let counter = node.lock_state().next_token();
            assert!(
                counter >= self.counters[i],
                "node {i}'s token counter went down"
            );
            self.counters[i] = counter;
        }
        self.read.resize(clients.len(), 0);
        // Grants of one step are compared with earlier steps' and among
        // themselves in token order (clients are read in no particular one).
        let mut fresh = Vec::new();
        for (client, read) in clients.iter().zip(&mut self.read) {
            let start = HELLO_LEN + 1;
            if client.received.len() <= start {
                continue;
            }
            assert_eq!(client.received[HELLO_LEN], 1, "a client was refused");
            *read = (*read).max(start);
            while let Ok(Some((reply, used))) = Reply::decode(&client.received[*read..]) {
                *read += used;
                if let Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } = reply {
                    fresh.push(token);
                }
            }
        }
        fresh.sort_unstable();
        for token in fresh {
            assert!(
                token > self.last_token,
                "token {token} granted after {}",
                self.last_token
            );
            self.last_token = token;
            self.grants += 1;
        }
    }
}

/// Completes a real dialer handshake as node `as_node`, with the right
/// token, on a new connection accepted by node `target`.
fn attack(cluster: &mut Cluster, as_node: usize, target: usize) -> Option<Attacker> {
    let identity = PeerIdentity {
        fingerprint: FINGERPRINT,
        id: cluster.nodes[as_node].id(),
        slot_count: 3,
        token_floor: BOOT_US,
    };
    let tokens = PeerTokens::new([PEER_TOKEN]).expect("token");
    let now = cluster.now;
    let nonce = cluster.nonce();
    let mut dialer = PeerHandshake::new(
        identity,
        nonce,
        Some(target as u8),
        now.saturating_add(Duration::from_secs(5)),
    );
    let nonce = cluster.nonce();
    let conn = cluster.nodes[target].handle_peer_accept(now, nonce, node_source(as_node))?;
    cluster.taps.insert((target, conn));
    for _ in 0..4 {
        let bytes = dialer.take_outbound();
        if !bytes.is_empty() {
            cluster.nodes[target].handle_input(now, conn, &bytes);
        }
        let mut answer = Vec::new();
        cluster.nodes[target].poll_transmit(conn, &mut answer);
        let (_, status) = dialer.handle_input(&tokens, &answer);
        match status {
            PeerHandshakeStatus::Established(_) => {
                return Some(Attacker {
                    target,
                    as_node,
                    conn,
                    session: dialer.take_session().expect("a session once established"),
                    last_frame: Vec::new(),
                });
            }
            PeerHandshakeStatus::Rejected(reason) => {
                panic!("the right token was refused: {reason:?}")
            }
            PeerHandshakeStatus::NeedMore => {}
        }
    }
    panic!("the peer handshake did not complete");
}

fn small(cursor: &mut Cursor<'_>) -> u64 {
    u64::from(cursor.byte().unwrap_or(0))
}

/// Any message body with small numbers.
fn any_body(cursor: &mut Cursor<'_>, members: &[NodeId]) -> MessageBody {
    let bit = |cursor: &mut Cursor<'_>| small(cursor) & 1 == 1;
    match small(cursor) % 11 {
        0 => MessageBody::PreVote {
            last_index: small(cursor),
            last_term: small(cursor),
        },
        1 => MessageBody::PreVoteResponse {
            reject: bit(cursor),
        },
        2 => MessageBody::Vote {
            last_index: small(cursor),
            last_term: small(cursor),
            transfer: bit(cursor),
        },
        3 => MessageBody::VoteResponse {
            reject: bit(cursor),
        },
        4 => {
            let prev_index = small(cursor);
            let count = small(cursor) % 4;
            let term = small(cursor);
            let entries = (1..=count)
                .map(|offset| Entry {
                    index: prev_index + offset,
                    term,
                    kind: match small(cursor) % 3 {
                        0 => EntryKind::Noop,
                        1 => EntryKind::Command(cursor.bytes(6).into()),
                        _ => EntryKind::Config(crate::raft::Configuration {
                            voters: members.iter().copied().collect(),
                            learners: Default::default(),
                        }),
                    },
                })
                .collect();
            MessageBody::Append {
                prev_index,
                prev_term: small(cursor),
                entries,
                commit: small(cursor),
            }
        }
        5 => MessageBody::AppendResponse {
            reject: bit(cursor),
            index: small(cursor),
            hint_index: small(cursor),
            hint_term: small(cursor),
        },
        6 => MessageBody::Heartbeat {
            commit: small(cursor),
        },
        7 => MessageBody::HeartbeatResponse,
        8 => MessageBody::InstallSnapshot {
            meta: SnapshotMeta {
                index: small(cursor),
                term: small(cursor),
                config: Default::default(),
            },
            offset: small(cursor),
            data: cursor.bytes(8).to_vec(),
            done: bit(cursor),
        },
        9 => MessageBody::SnapshotResponse {
            index: small(cursor),
            next_offset: small(cursor),
            done: bit(cursor),
        },
        _ => MessageBody::TimeoutNow,
    }
}

/// A message the node must survive from an authenticated member that does
/// not lie about its own Raft state, or `None`. Forged vote grants,
/// acknowledgements of entries the member does not hold, or leader
/// messages in a term the member does not lead are Byzantine faults, which
/// Raft does not tolerate and the peer token exists to keep out; so they
/// only appear where Raft must discard them (a stale term, another sender,
/// another recipient generation) or with a number out of bounds.
fn hostile_message(cursor: &mut Cursor<'_>, cluster: &Cluster, at: &Attacker) -> Option<Message> {
    let members: Vec<NodeId> = cluster.nodes.iter().map(|n| n.id()).collect();
    let me = &cluster.nodes[at.as_node];
    let target = &cluster.nodes[at.target];
    let (from, to, target_term) = (me.id(), target.id(), target.raft().term());
    let mut msg = Message {
        from,
        to,
        term: target_term,
        body: MessageBody::TimeoutNow,
    };
    match cursor.byte()? % 6 {
        0 => stale_term(cursor, &mut msg, target_term, &members)?,
        1 => misaddressed(cursor, &mut msg, at, to, target_term, &members)?,
        2 => out_of_bounds(cursor, &mut msg, target_term, &members)?,
        3 => request_or_refusal(cursor, &mut msg, me, target_term)?,
        4 => true_acknowledgement(cursor, &mut msg, me, target)?,
        _ => return None,
    }
    Some(msg)
}

/// `msg` in a stale term, with any body.
fn stale_term(
    cursor: &mut Cursor<'_>,
    msg: &mut Message,
    target_term: u64,
    members: &[NodeId],
) -> Option<()> {
    // A stale term: anything at all.
    msg.term = target_term.checked_sub(1 + small(cursor) % 3)?;
    msg.body = any_body(cursor, members);
    Some(())
}

/// `msg` from another sender or to another generation of the recipient.
fn misaddressed(
    cursor: &mut Cursor<'_>,
    msg: &mut Message,
    at: &Attacker,
    to: NodeId,
    target_term: u64,
    members: &[NodeId],
) -> Option<()> {
    // Another sender (a member or a stranger), or another
    // generation of the recipient: anything at all, any term.
    match small(cursor) % 3 {
        // The third member: neither the one authenticated nor
        // the recipient.
        0 => msg.from = members[3 - at.as_node - at.target],
        1 => msg.from = NodeId::new(7, small(cursor)),
        _ => msg.to = NodeId::new(to.slot, to.generation + 1 + small(cursor)),
    }
    if msg.from == to {
        msg.from = NodeId::new(7, 0);
    }
    msg.term = target_term + small(cursor) % 3;
    msg.body = any_body(cursor, members);
    Some(())
}

/// `msg` with one number out of bounds.
fn out_of_bounds(
    cursor: &mut Cursor<'_>,
    msg: &mut Message,
    target_term: u64,
    members: &[NodeId],
) -> Option<()> {
    // A number no honest peer sends: refused by the decoder.
    msg.term = target_term + small(cursor) % 2;
    msg.body = any_body(cursor, members);
    let which = usize::from(cursor.byte().unwrap_or(0));
    let value = hostile_number(cursor);
    let mut fields = numbers_mut(msg);
    let count = fields.len();
    *fields[which % count] = value;
    Some(())
}

/// `msg` as a pre-vote, a vote on the member's real log, or a refusal.
fn request_or_refusal(
    cursor: &mut Cursor<'_>,
    msg: &mut Message,
    me: &ClusterNode,
    target_term: u64,
) -> Option<()> {
    // Requests and refusals: they may cost an election, never a
    // committed entry. A pre-vote may claim any log (it changes no
    // term and grants nothing lasting); a vote claims the member's
    // real log.
    msg.term = target_term + small(cursor) % 3;
    let raft = me.raft();
    let last_index = raft.last_index();
    let last_term = raft.term_at(last_index)?;
    msg.body = match small(cursor) % 7 {
        0 => MessageBody::PreVote {
            last_index: small(cursor),
            last_term: small(cursor),
        },
        1 => MessageBody::Vote {
            last_index,
            last_term,
            transfer: small(cursor) & 1 == 1,
        },
        2 => MessageBody::PreVoteResponse { reject: true },
        3 => MessageBody::VoteResponse { reject: true },
        4 => MessageBody::AppendResponse {
            reject: true,
            index: small(cursor),
            hint_index: small(cursor),
            hint_term: small(cursor),
        },
        5 => MessageBody::HeartbeatResponse,
        _ => MessageBody::TimeoutNow,
    };
    Some(())
}

/// `msg` as a true acknowledgement of the leader's entries; `None` if
/// the member cannot give one.
fn true_acknowledgement(
    cursor: &mut Cursor<'_>,
    msg: &mut Message,
    me: &ClusterNode,
    target: &ClusterNode,
) -> Option<()> {
    // A true acknowledgement, duplicated or late: the member holds
    // the leader's entries up to `index` and is in its term.
    let (mine, theirs) = (me.raft(), target.raft());
    if !theirs.is_leader() || mine.term() != theirs.term() {
        return None;
    }
    let top = mine.last_index().min(theirs.last_index());
    let agreed = (mine.first_index().max(theirs.first_index())..=top)
        .rev()
        .find(|&i| mine.term_at(i).is_some() && mine.term_at(i) == theirs.term_at(i))?;
    msg.body = MessageBody::AppendResponse {
        reject: false,
        index: agreed.saturating_sub(small(cursor) % 3),
        hint_index: 0,
        hint_term: 0,
    };
    Some(())
}

fn acquire_frame(rid: u64, key: u8, wait_s: u8, lease_s: u8) -> Vec<u8> {
    let key = Key::new(&[b'a' + key % 3]).expect("a valid key");
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: KeyGroup::new(vec![key]).expect("one key"),
        set: false,
    })
    .to_frame()
}

/// Connects a client to `node` and completes its handshake.
fn connect(cluster: &mut Cluster, clients: &mut Vec<Client>, node: usize) {
    let (now, nonce) = (cluster.now, cluster.nonce());
    let conn = cluster.nodes[node]
        .handle_connect(now, nonce, client_source(node))
        .expect("a client slot");
    clients.push(Client {
        node,
        conn,
        received: Vec::new(),
        closed: false,
    });
    cluster.settle(clients);
    let client = clients.last().expect("just pushed");
    let mut handshake = ClientHandshake::new(b"", FINGERPRINT, WireMode::Cluster, node as u8);
    handshake.handle_input(&client.received[..HELLO_LEN]);
    let proof = handshake.proof().expect("a cluster hello");
    cluster.nodes[node].handle_input(now, conn, &proof);
    cluster.settle(clients);
}

/// Elects a leader among three in-memory cluster nodes, opens a client on
/// each, then runs a script: extra peer connections authenticated (a real
/// dialer handshake with the right token) in the name of one node into
/// another, carrying sealed hostile messages — any kind in a stale term,
/// from another sender or to another generation; numbers out of bounds;
/// pre-votes claiming any log, votes, refusals, timeouts, true late
/// acknowledgements — and frames replayed or corrupted on the session;
/// interleaved with clock jumps and client acquires and releases.
///
/// Checks after every step: at most one leader per term, no committed
/// entry changes, no node's token counter goes down, every token granted
/// is above every earlier one; a frame with a number out of bounds, a
/// replayed or a corrupted frame is refused, counted and closes only that
/// connection. Once the script ends and the hostile connections close, a
/// leader is elected and grants within 30 s of simulated time (liveness).
pub fn cluster_peer_frames(data: &[u8]) {
    let mut harness = FramesHarness::new();
    let mut cursor = Cursor { data };
    for _ in 0..STEPS_MAX {
        let Some(op) = cursor.byte() else { break };
        let pick = usize::from(cursor.byte().unwrap_or(0));
        if harness.step(&mut cursor, op, pick) {
            harness.cluster.settle(&mut harness.clients);
            harness.watch.check(&harness.cluster, &harness.clients);
        }
    }
    harness.finish();
}

/// The cluster under test, its clients, the safety records and the
/// hostile peer connections.
struct FramesHarness {
    cluster: Cluster,
    clients: Vec<Client>,
    watch: Watch,
    attackers: Vec<Attacker>,
    /// The last client request id used.
    rid: u64,
}

impl FramesHarness {
    /// Three nodes with a leader and a client on each.
    fn new() -> FramesHarness {
        let mut cluster = Cluster::new();
        let mut clients: Vec<Client> = Vec::new();
        cluster.advance(Duration::from_secs(2), &mut clients);
        assert!(cluster.leader().is_some(), "no leader before the script");
        for node in 0..3 {
            connect(&mut cluster, &mut clients, node);
        }
        let mut watch = Watch::default();
        watch.check(&cluster, &clients);
        FramesHarness {
            cluster,
            clients,
            watch,
            attackers: Vec::new(),
            rid: 0,
        }
    }

    /// One script step, picked by `op`; false if it ended early (nothing
    /// sent), so the cluster is not settled and checked after it.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8, pick: usize) -> bool {
        match op % 8 {
            0 if self.attackers.len() < 2 => self.open_attacker(pick),
            1..=3 if !self.attackers.is_empty() => self.send_hostile(cursor, pick),
            4 if !self.attackers.is_empty() => self.send_replayed_or_altered(cursor, pick),
            5 => self.client_acquire(cursor, pick),
            6 => self.client_release(cursor, pick),
            _ => {
                self.cluster
                    .advance(Duration::from_millis(pick as u64 * 10), &mut self.clients);
                true
            }
        }
    }

    /// Authenticates a peer connection in the name of one node into another.
    fn open_attacker(&mut self, pick: usize) -> bool {
        let as_node = pick % 3;
        let target = (as_node + 1 + (pick / 3) % 2) % 3;
        if let Some(attacker) = attack(&mut self.cluster, as_node, target) {
            self.attackers.push(attacker);
        }
        true
    }

    /// The attacker `pick` chooses, if its connection is still open; one
    /// the node closed (cleared in `settle`) is forgotten.
    fn open_attacker_index(&mut self, pick: usize) -> Option<usize> {
        let index = pick % self.attackers.len();
        let attacker = &self.attackers[index];
        if !self
            .cluster
            .taps
            .contains(&(attacker.target, attacker.conn))
        {
            self.attackers.remove(index);
            return None;
        }
        Some(index)
    }

    /// Sends a sealed hostile message on an attacker connection: refused
    /// exactly when a number is out of bounds.
    fn send_hostile(&mut self, cursor: &mut Cursor<'_>, pick: usize) -> bool {
        let now = self.cluster.now;
        let Some(index) = self.open_attacker_index(pick) else {
            return false;
        };
        let Some(msg) = hostile_message(cursor, &self.cluster, &self.attackers[index]) else {
            return false;
        };
        let attacker = &mut self.attackers[index];
        let mut frame = Vec::new();
        if attacker.session.sealer.seal(&msg, &mut frame).is_err() {
            return false;
        }
        let node = &mut self.cluster.nodes[attacker.target];
        let refused = node.refused_peer_frames();
        node.handle_input(now, attacker.conn, &frame);
        let refused_now = node.refused_peer_frames();
        if msg.numbers_in_bounds() {
            assert_eq!(refused_now, refused, "a sound frame was refused");
            attacker.last_frame = frame;
        } else {
            assert_eq!(refused_now, refused + 1, "{msg:?} was not refused");
            self.attackers.remove(index);
        }
        true
    }

    /// Sends a replayed or altered frame on an attacker connection: always
    /// refused.
    fn send_replayed_or_altered(&mut self, cursor: &mut Cursor<'_>, pick: usize) -> bool {
        let now = self.cluster.now;
        // The last frame again, or a fresh one with a byte flipped
        // past its length: the tag does not verify.
        let Some(index) = self.open_attacker_index(pick) else {
            return false;
        };
        let attacker = &mut self.attackers[index];
        let mut frame = std::mem::take(&mut attacker.last_frame);
        if frame.is_empty() || pick & 1 == 1 {
            let msg = Message {
                from: self.cluster.nodes[attacker.as_node].id(),
                to: self.cluster.nodes[attacker.target].id(),
                term: 0,
                body: MessageBody::HeartbeatResponse,
            };
            frame.clear();
            attacker
                .session
                .sealer
                .seal(&msg, &mut frame)
                .expect("small");
            let at = 4 + usize::from(cursor.byte().unwrap_or(0)) % (frame.len() - 4);
            frame[at] ^= cursor.byte().unwrap_or(0).max(1);
        }
        let node = &mut self.cluster.nodes[attacker.target];
        let refused = node.refused_peer_frames();
        node.handle_input(now, attacker.conn, &frame);
        assert_eq!(
            node.refused_peer_frames(),
            refused + 1,
            "a replayed or altered frame was accepted"
        );
        self.attackers.remove(index);
        true
    }

    /// A client acquires one of three keys.
    fn client_acquire(&mut self, cursor: &mut Cursor<'_>, pick: usize) -> bool {
        let now = self.cluster.now;
        let client = &self.clients[pick % self.clients.len()];
        self.rid += 1;
        let frame = acquire_frame(
            self.rid,
            cursor.byte().unwrap_or(0),
            cursor.byte().unwrap_or(0) % 3,
            1 + cursor.byte().unwrap_or(0) % 3,
        );
        self.cluster.nodes[client.node].handle_input(now, client.conn, &frame);
        true
    }

    /// A client releases one of three keys.
    fn client_release(&mut self, cursor: &mut Cursor<'_>, pick: usize) -> bool {
        let now = self.cluster.now;
        // Release what the client may hold (or a token it never had).
        let client = &self.clients[pick % self.clients.len()];
        self.rid += 1;
        let key = Key::new(&[b'a' + cursor.byte().unwrap_or(0) % 3]).expect("key");
        let token = self.watch.last_token.saturating_sub(small(cursor) % 4);
        let frame = Request::Release(ReleaseRequest {
            rid: self.rid,
            token,
            keys: KeyGroup::new(vec![key]).expect("one key"),
            set: false,
        })
        .to_frame();
        self.cluster.nodes[client.node].handle_input(now, client.conn, &frame);
        true
    }

    /// Closes the hostile connections, then checks the cluster recovers.
    fn finish(mut self) {
        // The hostile input stops: its connections close.
        for attacker in self.attackers {
            let now = self.cluster.now;
            if self.cluster.taps.remove(&(attacker.target, attacker.conn)) {
                self.cluster.nodes[attacker.target].handle_closed(now, attacker.conn);
            }
        }
        recover(&mut self.cluster, &mut self.clients, &mut self.watch);
    }
}

/// Lets the cluster run until a leader grants a fresh acquire to one of
/// the clients, checking everything along the way.
fn recover(cluster: &mut Cluster, clients: &mut Vec<Client>, watch: &mut Watch) {
    let deadline = cluster.now.saturating_add(RECOVERY_LIMIT);
    let grants = watch.grants;
    // A key nobody else uses, so nothing held blocks the grant.
    let mut rid = 1 << 32;
    while cluster.now < deadline {
        cluster.advance(Duration::from_millis(100), clients);
        watch.check(cluster, clients);
        if watch.grants > grants {
            return;
        }
        if let Some(leader) = cluster.leader() {
            if !clients.iter().any(|c| c.node == leader && !c.closed) {
                connect(cluster, clients, leader);
            }
            if let Some(client) = clients.iter().find(|c| c.node == leader && !c.closed) {
                rid += 1;
                let key = Key::new(b"recovery").expect("key");
                let frame = Request::Acquire(AcquireRequest {
                    rid,
                    wait_s: 0,
                    lease_s: 1,
                    keys: KeyGroup::new(vec![key]).expect("one key"),
                    set: false,
                })
                .to_frame();
                let now = cluster.now;
                cluster.nodes[leader].handle_input(now, client.conn, &frame);
            }
        }
    }
    panic!(
        "no grant within {RECOVERY_LIMIT:?} after the hostile input stopped: terms {:?}, \
         leaders {:?}",
        cluster
            .nodes
            .iter()
            .map(|n| n.raft().term())
            .collect::<Vec<_>>(),
        cluster
            .nodes
            .iter()
            .map(|n| n.is_leader())
            .collect::<Vec<_>>(),
    );
}
