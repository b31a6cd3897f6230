//! Data-driven Raft tests, after etcd-io/raft's `testdata/*.txt`: each file
//! in `raft_transcripts/` is a script of commands, each followed by the
//! output it must produce.
//!
//! ```text
//! # a comment
//! campaign 1
//! ----
//! 1.1->2.1 PreVote t2 1/1
//! 1.1->3.1 PreVote t2 1/1
//! ```
//!
//! A block is optional `#` comments, one command line, `----`, then the
//! expected output up to a blank line (`ok` when the command prints
//! nothing). The output lists, in order, the messages delivered and dropped,
//! the messages sent, and each node's events (see [`Message`]'s `Display`
//! for the message form). On a difference the test fails with the
//! expected and actual output of every block that differs; `REWRITE=1`
//! rewrites the files instead (review the diff before committing it).
//!
//! Commands (`S` is a slot; the node is the live node in that slot):
//!
//! - `bootstrap N`: voters `1.1` … `N.1`, default timing, at time 0.
//! - `tick MS`: time moves on by `MS`; every live node handles its
//!   deadlines.
//! - `campaign S`: node `S`'s next deadline fires now (a follower's
//!   election timeout starts its pre-vote): `S` alone runs ahead to that
//!   deadline, the shared clock and the other nodes stay where they are.
//! - `deliver`: every message sent so far is delivered once, in order (or
//!   dropped across a cut link or to a dead node).
//! - `stabilize`: `deliver` until no message is left.
//! - `propose S TEXT`: proposes the command `TEXT` at node `S`.
//! - `add-learner S S.G`: node `S` proposes adding learner `S.G`.
//! - `isolate S`, `heal`: cut every link of slot `S`; restore all links.
//! - `kill S`: node `S` stops (its messages are dropped).
//! - `join S G`: a new node `S.G` with an empty log starts.
//! - `status`: the time, then one line per live node: role, term, leader, commit index,
//!   last entry, configuration.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ticketing_core::raft::{
    ConfChange, Entry, EntryKind, Event, Message, MessageBody, NodeId, Raft, RaftConfig,
    SnapshotMeta,
};
use ticketing_core::time::{Duration, Instant};

/// Election jitter seed shared by every transcript node.
const SEED: u64 = 7;
/// Most `deliver` rounds one `stabilize` runs.
const ROUNDS_MAX: usize = 100;

struct World {
    now: Instant,
    nodes: BTreeMap<NodeId, Raft>,
    dead: BTreeSet<NodeId>,
    isolated: BTreeSet<u8>,
    in_flight: VecDeque<Message>,
}

impl World {
    fn new() -> Self {
        World {
            now: Instant::ZERO,
            nodes: BTreeMap::new(),
            dead: BTreeSet::new(),
            isolated: BTreeSet::new(),
            in_flight: VecDeque::new(),
        }
    }

    /// The live node in `slot`.
    fn node(&self, slot: &str) -> Result<NodeId, String> {
        let slot: u8 = slot.parse().map_err(|_| format!("bad slot {slot:?}"))?;
        self.nodes
            .keys()
            .copied()
            .filter(|id| id.slot == slot && !self.dead.contains(id))
            .max()
            .ok_or_else(|| format!("no live node in slot {slot}"))
    }

    fn run(&mut self, line: &str) -> Result<String, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut out = String::new();
        match words.as_slice() {
            ["bootstrap", n] => {
                let n: u8 = n.parse().map_err(|_| "bad count")?;
                let voters: Vec<NodeId> = (1..=n).map(|s| NodeId::new(s, 1)).collect();
                for &id in &voters {
                    let raft =
                        Raft::bootstrap(id, voters.clone(), transcript_config(), SEED, self.now);
                    self.nodes.insert(id, raft);
                }
            }
            ["tick", ms] => {
                let ms: u64 = ms.parse().map_err(|_| "bad ms")?;
                self.now = self.now.saturating_add(Duration::from_millis(ms));
                let now = self.now;
                for (id, raft) in &mut self.nodes {
                    if !self.dead.contains(id) {
                        raft.handle_timeout(now);
                    }
                }
            }
            ["campaign", slot] => {
                let id = self.node(slot)?;
                let raft = self.nodes.get_mut(&id).expect("live node");
                let deadline = raft.poll_timeout().ok_or("node has no deadline")?;
                raft.handle_timeout(deadline.max(self.now));
            }
            ["deliver"] => self.deliver(&mut out),
            ["stabilize"] => {
                let mut rounds = 0;
                while !self.in_flight.is_empty() {
                    rounds += 1;
                    if rounds > ROUNDS_MAX {
                        return Err(format!("not stable after {ROUNDS_MAX} rounds"));
                    }
                    self.deliver(&mut out);
                    self.collect(&mut out);
                }
            }
            ["propose", slot, text] => {
                let id = self.node(slot)?;
                let now = self.now;
                let raft = self.nodes.get_mut(&id).expect("live node");
                match raft.propose(now, text.as_bytes().to_vec()) {
                    Ok((index, term)) => writeln!(out, "{id}: proposed {index}/{term}").unwrap(),
                    Err(e) => writeln!(out, "{id}: refused {e:?}").unwrap(),
                }
            }
            ["add-learner", slot, learner] => {
                let id = self.node(slot)?;
                let learner = parse_id(learner)?;
                let now = self.now;
                let raft = self.nodes.get_mut(&id).expect("live node");
                match raft.propose_conf_change(now, ConfChange::AddLearner(learner)) {
                    Ok((index, term)) => writeln!(out, "{id}: proposed {index}/{term}").unwrap(),
                    Err(e) => writeln!(out, "{id}: refused {e:?}").unwrap(),
                }
            }
            ["isolate", slot] => {
                self.isolated.insert(slot.parse().map_err(|_| "bad slot")?);
            }
            ["heal"] => self.isolated.clear(),
            ["kill", slot] => {
                let id = self.node(slot)?;
                self.dead.insert(id);
            }
            ["join", slot, generation] => {
                let slot: u8 = slot.parse().map_err(|_| "bad slot")?;
                let generation: u64 = generation.parse().map_err(|_| "bad generation")?;
                let id = NodeId::new(slot, generation);
                let raft = Raft::join(id, transcript_config(), SEED, self.now);
                self.nodes.insert(id, raft);
            }
            ["status"] => {
                writeln!(out, "time {}ms", self.now.as_micros() / 1_000).unwrap();
                for (id, raft) in &self.nodes {
                    if self.dead.contains(id) {
                        continue;
                    }
                    let leader = raft.leader().map_or("none".into(), |l| l.to_string());
                    let last = raft.last_index();
                    let last_term = raft.term_at(last).unwrap_or(0);
                    writeln!(
                        out,
                        "{id}: {:?} t{} leader {leader} commit {} last {last}/{last_term} {}",
                        raft.role(),
                        raft.term(),
                        raft.commit_index(),
                        raft.config()
                    )
                    .unwrap();
                }
            }
            _ => return Err(format!("unknown command {line:?}")),
        }
        self.collect(&mut out);
        if out.is_empty() {
            out.push_str("ok\n");
        }
        Ok(out)
    }

    /// Steps every message in flight once.
    fn deliver(&mut self, out: &mut String) {
        let now = self.now;
        for msg in std::mem::take(&mut self.in_flight) {
            let cut =
                self.isolated.contains(&msg.from.slot) || self.isolated.contains(&msg.to.slot);
            match self.nodes.get_mut(&msg.to) {
                Some(raft) if !cut && !self.dead.contains(&msg.to) => {
                    writeln!(out, "{msg}").unwrap();
                    raft.step(now, msg);
                }
                _ => writeln!(out, "dropped {msg}").unwrap(),
            }
        }
    }

    /// Moves every node's outgoing messages in flight, and prints its events
    /// and what it applied.
    fn collect(&mut self, out: &mut String) {
        for (id, raft) in &mut self.nodes {
            if self.dead.contains(id) {
                continue;
            }
            while let Some((_, msg)) = raft.poll_message() {
                writeln!(out, "  sent {msg}").unwrap();
                self.in_flight.push_back(msg);
            }
            while let Some(event) = raft.poll_event() {
                writeln!(out, "  {id}: {}", describe_event(&event)).unwrap();
            }
            let mut applied = Vec::new();
            while raft.poll_committed().is_some() {
                applied.push(raft.applied_index());
            }
            if let (Some(first), Some(last)) = (applied.first(), applied.last()) {
                writeln!(out, "  {id}: applied {first}..={last}").unwrap();
            }
        }
    }
}

fn parse_id(text: &str) -> Result<NodeId, String> {
    let (slot, generation) = text.split_once('.').ok_or("id needs S.G")?;
    Ok(NodeId::new(
        slot.parse().map_err(|_| "bad slot")?,
        generation.parse().map_err(|_| "bad generation")?,
    ))
}

fn describe_event(event: &Event) -> String {
    match event {
        Event::BecameLeader { term } => format!("became leader t{term}"),
        Event::SteppedDown { term } => format!("stepped down t{term}"),
        Event::LeaderChanged {
            leader: Some(leader),
            term,
        } => format!("leader {leader} t{term}"),
        Event::LeaderChanged { leader: None, term } => format!("leader none t{term}"),
        Event::ConfigChanged { config } => format!("config {config}"),
        Event::SnapshotWanted { applied_index } => format!("snapshot wanted at {applied_index}"),
    }
}

/// One command with its comments and expected output.
struct Block {
    comments: Vec<String>,
    command: String,
    expected: String,
}

fn parse(text: &str, path: &Path) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().peekable();
    loop {
        let mut comments = Vec::new();
        while let Some(line) = lines.peek() {
            if line.starts_with('#') {
                comments.push(line.to_string());
            } else if !line.trim().is_empty() {
                break;
            }
            lines.next();
        }
        let Some(command) = lines.next() else {
            break;
        };
        let separator = lines.next();
        assert_eq!(
            separator,
            Some("----"),
            "{}: `----` expected after {command:?}",
            path.display()
        );
        let mut expected = String::new();
        for line in lines.by_ref() {
            if line.is_empty() {
                break;
            }
            expected.push_str(line);
            expected.push('\n');
        }
        blocks.push(Block {
            comments,
            command: command.to_string(),
            expected,
        });
    }
    blocks
}

fn run_file(path: &Path) {
    let text = std::fs::read_to_string(path).expect("transcript readable");
    let blocks = parse(&text, path);
    assert!(!blocks.is_empty(), "{}: no commands", path.display());
    let mut world = World::new();
    let mut rewritten = String::new();
    let mut differences = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let actual = world
            .run(&block.command)
            .unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), block.command));
        if actual != block.expected {
            write!(
                differences,
                "\n== {} (block {}) ==\n-- expected\n{}-- actual\n{}",
                block.command,
                i + 1,
                block.expected,
                actual
            )
            .unwrap();
        }
        if i > 0 {
            rewritten.push('\n');
        }
        for comment in &block.comments {
            writeln!(rewritten, "{comment}").unwrap();
        }
        write!(rewritten, "{}\n----\n{actual}", block.command).unwrap();
    }
    if differences.is_empty() {
        return;
    }
    if std::env::var_os("REWRITE").is_some() {
        std::fs::write(path, rewritten).expect("transcript writable");
        return;
    }
    panic!(
        "{}: output differs (REWRITE=1 regenerates){differences}",
        path.display()
    );
}

/// The defaults, with commit notices sent at once: the transcripts show
/// each exchange as it settles, without the clock moving between steps
/// (the delay has tests of its own in `raft_replication.rs`).
fn transcript_config() -> RaftConfig {
    RaftConfig {
        commit_notice_delay: std::time::Duration::ZERO,
        ..RaftConfig::default()
    }
}

fn transcript(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/raft_transcripts")
        .join(name)
}

#[test]
fn pre_vote_transcript() {
    run_file(&transcript("pre_vote.txt"));
}

#[test]
fn check_quorum_transcript() {
    run_file(&transcript("check_quorum.txt"));
}

#[test]
fn voter_replacement_transcript() {
    run_file(&transcript("voter_replacement.txt"));
}

#[test]
fn messages_display_in_the_documented_compact_forms() {
    let (a, b) = (NodeId::new(1, 1), NodeId::new(2, 1));
    let msg = |term, body| Message {
        from: a,
        to: b,
        term,
        body,
    };
    let config = ticketing_core::raft::Configuration::with_voters([a, b]);
    let cases = [
        (
            msg(
                3,
                MessageBody::Vote {
                    last_index: 5,
                    last_term: 2,
                    transfer: true,
                },
            ),
            "1.1->2.1 Vote t3 5/2 transfer",
        ),
        (
            msg(3, MessageBody::PreVoteResponse { reject: true }),
            "1.1->2.1 PreVoteResp t3 reject",
        ),
        (
            msg(
                3,
                MessageBody::Append {
                    prev_index: 5,
                    prev_term: 2,
                    entries: vec![
                        Entry {
                            index: 6,
                            term: 3,
                            kind: EntryKind::Command(b"x".to_vec().into()),
                        },
                        Entry {
                            index: 7,
                            term: 3,
                            kind: EntryKind::Noop,
                        },
                        Entry {
                            index: 8,
                            term: 3,
                            kind: EntryKind::Config(config.clone()),
                        },
                    ],
                    commit: 5,
                },
            ),
            "1.1->2.1 Append t3 5/2 c5 [6/3, 7/3 noop, 8/3 conf v[1.1 2.1] l[]]",
        ),
        (
            msg(
                3,
                MessageBody::AppendResponse {
                    reject: true,
                    index: 7,
                    hint_index: 5,
                    hint_term: 2,
                },
            ),
            "1.1->2.1 AppendResp t3 reject 7 hint 5/2",
        ),
        (
            msg(
                3,
                MessageBody::InstallSnapshot {
                    meta: SnapshotMeta {
                        index: 10,
                        term: 2,
                        config,
                    },
                    offset: 0,
                    data: vec![0; 4],
                    done: true,
                },
            ),
            "1.1->2.1 Snapshot t3 10/2 @0 4B done",
        ),
        (
            msg(
                3,
                MessageBody::SnapshotResponse {
                    index: 10,
                    next_offset: 4,
                    done: false,
                },
            ),
            "1.1->2.1 SnapshotResp t3 10 @4",
        ),
        (msg(3, MessageBody::TimeoutNow), "1.1->2.1 TimeoutNow t3"),
    ];
    for (message, text) in cases {
        assert_eq!(message.to_string(), text);
    }
}
