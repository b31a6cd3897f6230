//! A three-node Raft group whose network the fuzzer controls, plus hostile
//! peer messages: see [`raft_hostile_peer`].

use std::collections::BTreeMap;

use crate::raft::{
    Committed, Entry, EntryKind, Event, Message, MessageBody, NodeId, RAFT_NUMBER_MAX, Raft,
    RaftConfig, Role,
};
use crate::time::{Duration, Instant};

use super::script::Cursor;

/// Most messages in flight; newer ones are dropped (Raft tolerates loss).
const IN_FLIGHT_MAX: usize = 256;
/// Simulated time the group gets to recover once the hostile input stops.
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// What a node's state machine holds: a counter that every committed command
/// increments (the stand-in for the fencing-token counter) and the index it
/// has applied up to. Its snapshot is both, big-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct App {
    counter: u64,
    applied: u64,
}

impl App {
    fn encode(self) -> Vec<u8> {
        let mut out = self.counter.to_be_bytes().to_vec();
        out.extend_from_slice(&self.applied.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> App {
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(b)
        };
        assert_eq!(bytes.len(), 16, "snapshot of another shape");
        App {
            counter: word(0),
            applied: word(8),
        }
    }
}

struct Node {
    raft: Raft,
    app: App,
    commit: u64,
}

/// The group, the network and every safety record.
struct Group {
    now: Instant,
    nodes: Vec<Node>,
    in_flight: Vec<Message>,
    /// Leader of each term ever seen (election safety).
    leaders: BTreeMap<u64, NodeId>,
    /// Every entry applied anywhere, by index (state machine safety).
    applied: BTreeMap<u64, (u64, EntryKind)>,
    /// Counter value after applying each index (the counter is a function
    /// of the committed prefix, so every node must agree on it).
    counter_at: BTreeMap<u64, u64>,
    proposals: u64,
}

fn config() -> RaftConfig {
    RaftConfig {
        // Small enough that snapshots and their chunks are sent.
        snapshot_threshold_entries: 6,
        snapshot_chunk_bytes: 7,
        append_entries_max: 4,
        inflight_appends_max: 4,
        outbox_messages_max: 64,
        ..RaftConfig::fast()
    }
}

impl Group {
    fn new(seed: u64) -> Group {
        let ids: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
        let now = Instant::from_millis(1);
        let nodes = ids
            .iter()
            .map(|&id| Node {
                raft: Raft::bootstrap(id, ids.iter().copied(), config(), seed, now),
                app: App::default(),
                commit: 0,
            })
            .collect();
        let mut group = Group {
            now,
            nodes,
            in_flight: Vec::new(),
            leaders: BTreeMap::new(),
            applied: BTreeMap::new(),
            counter_at: BTreeMap::new(),
            proposals: 0,
        };
        for i in 0..3 {
            group.drain(i);
        }
        group
    }

    fn index_of(&self, id: NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| n.raft.id() == id)
    }

    /// Collects node `i`'s outputs and checks every safety property on them.
    fn drain(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        while let Some((to, msg)) = node.raft.poll_message() {
            assert_eq!(to, msg.to);
            assert!(msg.numbers_in_bounds(), "a node sent {msg:?}");
            if self.in_flight.len() < IN_FLIGHT_MAX {
                self.in_flight.push(msg);
            }
        }
        while let Some(committed) = node.raft.poll_committed() {
            match committed {
                Committed::Entry(Entry { index, term, kind }) => {
                    assert_eq!(index, node.app.applied + 1, "applied out of order");
                    if let EntryKind::Command(_) = kind {
                        node.app.counter += 1;
                    }
                    node.app.applied = index;
                    let seen = self.applied.entry(index).or_insert((term, kind.clone()));
                    assert_eq!(*seen, (term, kind), "two entries committed at {index}");
                    let counter = *self.counter_at.entry(index).or_insert(node.app.counter);
                    assert_eq!(counter, node.app.counter, "counters differ at {index}");
                }
                Committed::Snapshot { meta, data } => {
                    let app = App::decode(&data);
                    assert_eq!(app.applied, meta.index);
                    assert!(
                        app.counter >= node.app.counter,
                        "the counter went down: {} -> {}",
                        node.app.counter,
                        app.counter
                    );
                    if let Some(&counter) = self.counter_at.get(&meta.index) {
                        assert_eq!(counter, app.counter, "snapshot counter at {}", meta.index);
                    }
                    node.app = app;
                }
            }
        }
        let commit = node.raft.commit_index();
        assert!(commit >= node.commit, "commit index went back");
        node.commit = commit;
        while let Some(event) = node.raft.poll_event() {
            match event {
                Event::BecameLeader { term } => {
                    let id = node.raft.id();
                    let first = *self.leaders.entry(term).or_insert(id);
                    assert_eq!(first, id, "two leaders in term {term}");
                }
                Event::SnapshotWanted { .. } => {
                    let data = node.app.encode();
                    let _ = node.raft.compact(data);
                }
                _ => {}
            }
        }
    }

    fn deliver(&mut self, msg: Message) {
        if let Some(i) = self.index_of(msg.to) {
            let now = self.now;
            self.nodes[i].raft.step(now, msg);
            self.drain(i);
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        for i in 0..self.nodes.len() {
            let now = self.now;
            self.nodes[i].raft.handle_timeout(now);
            self.drain(i);
        }
    }

    fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.raft.role() == Role::Leader)
            .max_by_key(|(_, n)| n.raft.term())
            .map(|(i, _)| i)
    }

    fn propose(&mut self) -> Option<(u64, u64)> {
        let i = self.leader()?;
        self.proposals += 1;
        let now = self.now;
        let proposed = self.nodes[i]
            .raft
            .propose(now, self.proposals.to_be_bytes().to_vec());
        self.drain(i);
        proposed.ok()
    }

    /// Steps a message that carries an out-of-bounds number: it must be
    /// refused, counted, and change nothing anyone can see.
    fn deliver_refused(&mut self, msg: Message) {
        assert!(!msg.numbers_in_bounds());
        let Some(i) = self.index_of(msg.to) else {
            return;
        };
        let observe = |raft: &Raft| {
            (
                raft.term(),
                raft.role(),
                raft.leader(),
                raft.vote(),
                raft.commit_index(),
                raft.last_index(),
            )
        };
        let before = observe(&self.nodes[i].raft);
        let refused = self.nodes[i].raft.refused_messages();
        let in_flight = self.in_flight.len();
        self.deliver(msg);
        let raft = &self.nodes[i].raft;
        assert_eq!(raft.refused_messages(), refused + 1, "not counted");
        assert_eq!(observe(raft), before, "a refused message changed the node");
        assert_eq!(
            self.in_flight.len(),
            in_flight,
            "a refused message was answered"
        );
    }

    /// Delivers everything in order, without loss, jumping the clock between
    /// deadlines, until a leader of the current term has committed a fresh
    /// command on every node.
    fn recover(&mut self) {
        let deadline = self.now.saturating_add(RECOVERY_LIMIT);
        let mut target: Option<(u64, u64)> = None;
        while self.now < deadline {
            // Messages beget messages, but finitely: no clock, no new term.
            for _ in 0..100_000 {
                if self.in_flight.is_empty() {
                    break;
                }
                let msg = self.in_flight.remove(0);
                self.deliver(msg);
            }
            if let Some((index, term)) = target {
                match self.applied.get(&index) {
                    Some((committed, _))
                        if *committed == term
                            && self.nodes.iter().all(|n| n.app.applied >= index) =>
                    {
                        return;
                    }
                    Some((committed, _)) if *committed == term => {}
                    // Overwritten before it committed (the leader changed).
                    Some(_) => target = None,
                    // Not committed yet: still possible while its term
                    // leads; otherwise it may be gone, so propose again.
                    None => {
                        let leader_term = self.leader().map(|l| self.nodes[l].raft.term());
                        if leader_term != Some(term) {
                            target = None;
                        }
                    }
                }
            }
            if target.is_none()
                && let Some(leader) = self.leader()
            {
                let raft = &self.nodes[leader].raft;
                if raft.term_at(raft.commit_index()) == Some(raft.term()) {
                    target = self.propose();
                }
            }
            let next = self
                .nodes
                .iter()
                .filter_map(|n| n.raft.poll_timeout())
                .min()
                .unwrap_or(deadline)
                .max(self.now.saturating_add(Duration::from_millis(1)));
            let by = next.saturating_duration_since(self.now);
            self.advance(by);
        }
        panic!(
            "no leader committed a new command within {RECOVERY_LIMIT:?} after the hostile \
             input stopped: terms {:?}, roles {:?}",
            self.nodes.iter().map(|n| n.raft.term()).collect::<Vec<_>>(),
            self.nodes.iter().map(|n| n.raft.role()).collect::<Vec<_>>(),
        );
    }
}

/// Every number field of `msg` a peer could set, for the hostile mutation.
pub(super) fn numbers_mut(msg: &mut Message) -> Vec<&mut u64> {
    let mut fields = vec![&mut msg.term];
    match &mut msg.body {
        MessageBody::PreVote {
            last_index,
            last_term,
        }
        | MessageBody::Vote {
            last_index,
            last_term,
            ..
        } => fields.extend([last_index, last_term]),
        MessageBody::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => {
            fields.extend([prev_index, prev_term, commit]);
            for entry in entries {
                fields.extend([&mut entry.index, &mut entry.term]);
            }
        }
        MessageBody::AppendResponse {
            index,
            hint_index,
            hint_term,
            ..
        } => fields.extend([index, hint_index, hint_term]),
        MessageBody::Heartbeat { commit } => fields.push(commit),
        MessageBody::InstallSnapshot { meta, offset, .. } => {
            fields.extend([&mut meta.index, &mut meta.term, offset]);
        }
        MessageBody::SnapshotResponse {
            index, next_offset, ..
        } => fields.extend([index, next_offset]),
        MessageBody::PreVoteResponse { .. }
        | MessageBody::VoteResponse { .. }
        | MessageBody::HeartbeatResponse
        | MessageBody::TimeoutNow => {}
    }
    fields
}

/// A number no honest peer sends.
pub(super) fn hostile_number(cursor: &mut Cursor<'_>) -> u64 {
    match cursor.byte().unwrap_or(0) % 5 {
        0 => u64::MAX,
        1 => RAFT_NUMBER_MAX,
        2 => RAFT_NUMBER_MAX + u64::from(cursor.byte().unwrap_or(1)),
        3 => u64::MAX - u64::from(cursor.byte().unwrap_or(1)),
        _ => {
            let mut bytes = [0xffu8; 8];
            let taken = cursor.bytes(8);
            bytes[..taken.len()].copy_from_slice(taken);
            u64::from_be_bytes(bytes) | RAFT_NUMBER_MAX
        }
    }
}

/// A message from a node that is not a member (slot 7): any kind, numbers
/// in bounds, but never a leader's message in a term the recipient could
/// accept it in (a non-member that claims leadership is a Byzantine peer,
/// which Raft does not tolerate; the peer handshake keeps those out).
fn stranger_message(cursor: &mut Cursor<'_>, to: NodeId, to_term: u64) -> Option<Message> {
    let kind = cursor.byte()?;
    let small = |cursor: &mut Cursor<'_>| u64::from(cursor.byte().unwrap_or(0));
    let from = NodeId::new(7, small(cursor));
    let (term, body) = match kind % 11 {
        0 => (
            to_term + small(cursor) % 3,
            MessageBody::PreVote {
                last_index: small(cursor),
                last_term: small(cursor),
            },
        ),
        1 => (
            to_term + small(cursor) % 3,
            MessageBody::Vote {
                last_index: small(cursor),
                last_term: small(cursor),
                transfer: small(cursor) & 1 == 1,
            },
        ),
        2 => (
            to_term + small(cursor) % 2,
            MessageBody::PreVoteResponse {
                reject: small(cursor) & 1 == 1,
            },
        ),
        3 => (
            to_term,
            MessageBody::VoteResponse {
                reject: small(cursor) & 1 == 1,
            },
        ),
        4 => (
            to_term,
            MessageBody::AppendResponse {
                reject: small(cursor) & 1 == 1,
                index: small(cursor),
                hint_index: small(cursor),
                hint_term: small(cursor),
            },
        ),
        5 => (to_term, MessageBody::HeartbeatResponse),
        6 => (
            to_term,
            MessageBody::SnapshotResponse {
                index: small(cursor),
                next_offset: small(cursor),
                done: small(cursor) & 1 == 1,
            },
        ),
        7 => (to_term, MessageBody::TimeoutNow),
        8 => (
            to_term.checked_sub(1 + small(cursor) % 2)?,
            MessageBody::Heartbeat {
                commit: small(cursor),
            },
        ),
        9 => (
            to_term.checked_sub(1)?,
            MessageBody::Append {
                prev_index: small(cursor),
                prev_term: small(cursor),
                entries: Vec::new(),
                commit: small(cursor),
            },
        ),
        _ => (
            to_term.checked_sub(1)?,
            MessageBody::InstallSnapshot {
                meta: Default::default(),
                offset: small(cursor),
                data: cursor.bytes(4).to_vec(),
                done: small(cursor) & 1 == 1,
            },
        ),
    };
    Some(Message {
        from,
        to,
        term,
        body,
    })
}

/// Runs a three-node Raft group on a script read from `data`: deliveries in
/// any order, duplicates, losses, clock jumps, proposals, honest messages
/// with one number replaced by one no honest peer sends (a term of
/// `u64::MAX`, an index at 2^62, …), and messages from a non-member.
///
/// Checks after every step: at most one leader per term, no two different
/// entries committed at one index, commit indexes and the replicated counter
/// (the stand-in for the fencing-token counter) never go down, nodes only
/// send numbers in bounds, and every out-of-bounds message is refused,
/// counted and changes nothing. Once the script ends, the network turns
/// reliable: a leader must be elected and commit a new command on every
/// node within a minute of simulated time (liveness).
pub fn raft_hostile_peer(data: &[u8]) {
    let mut cursor = Cursor { data };
    let seed = u64::from(cursor.byte().unwrap_or(0));
    let mut group = Group::new(seed);
    // Bounded work per input, whatever its length.
    let mut steps = 0;
    while let Some(op) = cursor.byte() {
        steps += 1;
        if steps > 2_000 {
            break;
        }
        let pick = usize::from(cursor.byte().unwrap_or(0));
        let queued = group.in_flight.len();
        match op % 8 {
            0 | 1 if queued > 0 => {
                let msg = group.in_flight.remove(pick % queued);
                group.deliver(msg);
            }
            2 if queued > 0 => {
                let msg = group.in_flight[pick % queued].clone();
                group.deliver(msg);
            }
            3 if queued > 0 => {
                group.in_flight.remove(pick % queued);
            }
            4 => group.advance(Duration::from_millis(pick as u64 * 5)),
            5 => {
                group.propose();
            }
            6 if queued > 0 => {
                let mut msg = group.in_flight[pick % queued].clone();
                let which = usize::from(cursor.byte().unwrap_or(0));
                let value = hostile_number(&mut cursor);
                let mut fields = numbers_mut(&mut msg);
                let count = fields.len();
                *fields[which % count] = value;
                group.deliver_refused(msg);
            }
            7 => {
                let to = group.nodes[pick % 3].raft.id();
                let to_term = group.nodes[pick % 3].raft.term();
                if let Some(msg) = stranger_message(&mut cursor, to, to_term) {
                    group.deliver(msg);
                }
            }
            _ => {}
        }
    }
    group.recover();
}
