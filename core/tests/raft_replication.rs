//! Raft log replication and commit rules. Injected time only.

mod raft_harness;

use raft_harness::{Net, id};
use ticketing_core::raft::{
    Entry, EntryKind, Event, Message, MessageBody, NodeId, ProposeError, Raft, RaftConfig, Role,
};
use ticketing_core::time::{Duration, Instant};

fn fast() -> RaftConfig {
    RaftConfig::fast()
}

#[test]
fn committed_entries_are_applied_everywhere_in_order() {
    let mut net = Net::new(3, fast(), 7);
    let leader = net.run_until_leader(5_000);
    for k in 0..100u8 {
        net.propose(leader, &[k]);
        if k % 7 == 0 {
            net.run_ms(3);
        }
    }
    net.run_ms(1_000);
    net.assert_converged(&net.ids());
    let expected: Vec<Vec<u8>> = (0..100u8).map(|k| vec![k]).collect();
    assert_eq!(net.nodes[&leader].app.commands(), expected);
    net.check_log_matching();
}

#[test]
fn followers_apply_only_committed_entries() {
    let mut net = Net::new(3, fast(), 3);
    let leader = net.run_until_leader(5_000);
    let f: Vec<NodeId> = net.ids().into_iter().filter(|&n| n != leader).collect();
    // f[0] receives entries but its acknowledgements are lost, and f[1] is
    // cut off: nothing can commit.
    net.cut(leader, f[1]);
    net.filter = Some(Box::new(move |m: &Message| m.to != leader));
    let before = net.raft(f[0]).commit_index();
    // Proposed before one drain, so they travel in one append: a later
    // partial append would wait for the acknowledgement that is lost.
    net.with(leader, |r, now| {
        for k in 0..5u8 {
            r.propose(now, vec![k]).expect("propose");
        }
    });
    net.run_ms(200);
    let r = net.raft(f[0]);
    let before = before.max(2);
    assert_eq!(r.last_index(), before + 5, "the follower holds the entries");
    assert_eq!(r.commit_index(), before, "but they are not committed");
    assert_eq!(r.applied_index(), before, "and not applied");
    assert!(net.nodes[&f[0]].app.applied.is_empty());
}

#[test]
fn a_diverged_log_is_repaired_by_the_new_leader() {
    for seed in 0..10 {
        let mut net = Net::new(5, fast(), seed);
        let old = net.run_until_leader(5_000);
        // The old leader appends entries nobody else gets, then is cut off.
        net.isolate(old);
        for k in 0..20u8 {
            net.propose(old, &[0xEE, k]);
        }
        let others: Vec<NodeId> = net.ids().into_iter().filter(|&n| n != old).collect();
        let new = net.run_until_leader_other_than(Some(old), 5_000);
        for k in 0..30u8 {
            net.propose(new, &[0x11, k]);
        }
        net.run_ms(500);
        net.recover();
        net.run_ms(2_000);
        assert_eq!(net.leader(), Some(new));
        net.check_log_matching();
        let r_old = net.raft(old);
        let r_new = net.raft(new);
        assert_eq!(r_old.last_index(), r_new.last_index());
        for i in r_old.first_index()..=r_old.last_index() {
            assert_eq!(r_old.entry(i), r_new.entry(i), "seed {seed} index {i}");
        }
        // None of the old leader's uncommitted entries survived anywhere.
        for nid in net.ids() {
            assert!(
                net.nodes[&nid].app.commands().iter().all(|c| c[0] != 0xEE),
                "seed {seed}: an uncommitted entry was applied"
            );
        }
        net.assert_converged(&others);
        net.assert_converged(&net.ids());
    }
}

/// Drives a single node through messages built by hand.
fn msg(from: NodeId, to: NodeId, term: u64, body: MessageBody) -> Message {
    Message {
        from,
        to,
        term,
        body,
    }
}

#[test]
fn an_older_terms_entry_is_not_committed_by_counting_replicas_figure_8() {
    // Figure 8 of the Raft paper, on the node that matters. S1 leads term 2
    // and appends entry 3 (term 2) but replicates it to S2 only. S5 leads
    // term 3 with its own entry 3 (not replicated). S1 then leads term 4:
    // once entry 3 (term 2) is on a majority {S1, S2, S3} it must NOT be
    // committed by counting — S5 could still win an election (its last term
    // 3 beats 2) and overwrite it. Only when the term-4 no-op is on a
    // majority are both committed.
    let ids: Vec<NodeId> = (0..5).map(|s| id(s, 1)).collect();
    let (s1, s2, s3) = (ids[0], ids[1], ids[2]);
    let mut r = Raft::bootstrap(s1, ids.iter().copied(), fast(), 5, Instant::ZERO);
    // S1's log as left by its term-2 leadership: [1:t1 cfg][2:t2 noop][3:t2 X].
    r.step(
        Instant::from_millis(1),
        msg(
            s2,
            s1,
            2,
            MessageBody::Append {
                prev_index: 1,
                prev_term: 1,
                entries: vec![
                    Entry {
                        index: 2,
                        term: 2,
                        kind: EntryKind::Noop,
                    },
                    Entry {
                        index: 3,
                        term: 2,
                        kind: EntryKind::Command(b"X".to_vec().into()),
                    },
                ],
                commit: 2,
            },
        ),
    );
    while r.poll_message().is_some() {}
    assert_eq!(r.commit_index(), 2);
    // Term 3 passes elsewhere; S1 learns of it.
    r.step(
        Instant::from_millis(2),
        msg(ids[4], s1, 3, MessageBody::Heartbeat { commit: 2 }),
    );
    while r.poll_message().is_some() {}
    // S1 times out and wins term 4 (S2, S3 grant).
    let deadline = r.poll_timeout().unwrap();
    r.handle_timeout(deadline);
    assert_eq!(r.role(), Role::PreCandidate);
    for &v in &[s2, s3] {
        r.step(
            deadline,
            msg(v, s1, 4, MessageBody::PreVoteResponse { reject: false }),
        );
    }
    assert_eq!(r.role(), Role::Candidate);
    assert_eq!(r.term(), 4);
    for &v in &[s2, s3] {
        r.step(
            deadline,
            msg(v, s1, 4, MessageBody::VoteResponse { reject: false }),
        );
    }
    assert_eq!(r.role(), Role::Leader);
    assert_eq!(r.last_index(), 4, "term-4 no-op appended at 4");
    assert_eq!(r.term_at(4), Some(4));
    while r.poll_message().is_some() {}
    let ack = |index: u64| MessageBody::AppendResponse {
        reject: false,
        index,
        hint_index: 0,
        hint_term: 0,
    };
    // S2 and S3 now hold entry 3 (term 2): 3 of 5, a majority — still not
    // committed.
    r.step(deadline, msg(s2, s1, 4, ack(3)));
    r.step(deadline, msg(s3, s1, 4, ack(3)));
    assert_eq!(r.match_index(s2), Some(3));
    assert_eq!(r.match_index(s3), Some(3));
    assert_eq!(
        r.commit_index(),
        2,
        "committed an older term's entry by counting"
    );
    // The term-4 entry reaches the majority: everything up to it commits.
    r.step(deadline, msg(s2, s1, 4, ack(4)));
    assert_eq!(r.commit_index(), 2);
    r.step(deadline, msg(s3, s1, 4, ack(4)));
    assert_eq!(r.commit_index(), 4);
}

#[test]
fn commit_index_never_decreases_under_partitions() {
    // The harness asserts monotonic commit on every node after every input;
    // this drives many leader changes to give it something to check.
    for seed in 0..5 {
        let mut net = Net::new(5, fast(), seed);
        let ids = net.ids();
        for round in 0..20u64 {
            if let Some(l) = net.leader() {
                for k in 0..5u8 {
                    let _ = net.try_propose(l, &[round as u8, k]);
                }
            }
            let victim = ids[(net.rng.below(5)) as usize];
            net.isolate(victim);
            net.run_ms(700);
            net.recover();
            net.run_ms(400);
        }
        net.run_ms(3_000);
        net.check_log_matching();
        net.assert_converged(&ids);
    }
}

#[test]
fn appends_are_batched_and_bounded() {
    let cfg = RaftConfig {
        append_entries_max: 8,
        ..fast()
    };
    let mut net = Net::new(3, cfg, 11);
    let leader = net.run_until_leader(5_000);
    net.run_ms(500);
    // 20 proposals before the next drain travel in batches of at most 8.
    let now = net.now;
    for k in 0..20u8 {
        net.raft_mut(leader).propose(now, vec![k]).unwrap();
    }
    let mut sizes = Vec::new();
    while let Some((_, m)) = net.raft_mut(leader).poll_message() {
        if let MessageBody::Append { entries, .. } = m.body {
            sizes.push(entries.len());
        }
    }
    // Two followers, each 8 + 8 + 4.
    sizes.sort_unstable();
    assert_eq!(sizes, vec![4, 4, 8, 8, 8, 8]);
}

#[test]
fn pipelining_is_bounded_by_the_inflight_window() {
    let cfg = RaftConfig {
        append_entries_max: 1,
        inflight_appends_max: 4,
        ..fast()
    };
    let mut net = Net::new(3, cfg, 12);
    let leader = net.run_until_leader(5_000);
    net.run_ms(500);
    let now = net.now;
    for k in 0..10u8 {
        net.raft_mut(leader).propose(now, vec![k]).unwrap();
    }
    let mut per_peer = std::collections::BTreeMap::<NodeId, usize>::new();
    while let Some((to, m)) = net.raft_mut(leader).poll_message() {
        if matches!(m.body, MessageBody::Append { .. }) {
            *per_peer.entry(to).or_default() += 1;
        }
    }
    assert!(per_peer.values().all(|&n| n == 4), "{per_peer:?}");
}

#[test]
fn proposals_past_the_uncommitted_limit_are_refused() {
    let cfg = RaftConfig {
        uncommitted_entries_max: 10,
        ..fast()
    };
    let mut net = Net::new(3, cfg, 13);
    let leader = net.run_until_leader(5_000);
    net.run_ms(200);
    for n in net.ids() {
        if n != leader {
            net.isolate(n);
        }
    }
    let now = net.now;
    let mut accepted = 0;
    loop {
        match net.raft_mut(leader).propose(now, vec![1]) {
            Ok(_) => accepted += 1,
            Err(e) => {
                assert_eq!(e, ProposeError::Backpressure);
                break;
            }
        }
    }
    assert_eq!(accepted, 10);
    let big = vec![0u8; RaftConfig::default().entry_bytes_max + 1];
    net.recover();
    net.run_ms(300);
    let now = net.now;
    assert_eq!(
        net.raft_mut(leader).propose(now, big),
        Err(ProposeError::TooLarge)
    );
    assert!(net.try_propose(leader, &[2]));
}

#[test]
fn a_follower_refuses_proposals_with_a_leader_hint() {
    let mut net = Net::new(3, fast(), 14);
    let leader = net.run_until_leader(5_000);
    net.run_ms(100);
    let f = net.ids().into_iter().find(|&n| n != leader).unwrap();
    let now = net.now;
    assert_eq!(
        net.raft_mut(f).propose(now, vec![1]),
        Err(ProposeError::NotLeader {
            leader_hint: Some(leader)
        })
    );
}

#[test]
fn leadership_events_are_reported() {
    let mut net = Net::new(3, fast(), 15);
    let leader = net.run_until_leader(5_000);
    let evs = &net.nodes[&leader].events;
    assert!(
        evs.iter()
            .any(|(_, e)| matches!(e, Event::BecameLeader { .. }))
    );
    assert!(
        evs.iter().any(
            |(_, e)| matches!(e, Event::LeaderChanged { leader: Some(l), .. } if *l == leader)
        )
    );
    let f = net.ids().into_iter().find(|&n| n != leader).unwrap();
    net.run_ms(100);
    assert!(
        net.nodes[&f].events.iter().any(
            |(_, e)| matches!(e, Event::LeaderChanged { leader: Some(l), .. } if *l == leader)
        )
    );
    net.isolate(leader);
    net.run_ms(1_000);
    assert!(
        net.nodes[&leader]
            .events
            .iter()
            .any(|(_, e)| matches!(e, Event::SteppedDown { .. }))
    );
}

// --------------------------------------------------------------------------
// Batching of the commit path: driven by hand (messages taken from one node
// and stepped into another), so every append and answer is counted.
// --------------------------------------------------------------------------

/// Every message `nid` has to send now.
fn drain_messages(net: &mut Net, nid: NodeId) -> Vec<Message> {
    let mut out = Vec::new();
    while let Some((_, msg)) = net.raft_mut(nid).poll_message() {
        out.push(msg);
    }
    out
}

/// Steps `msg` into its recipient at the network's time.
fn deliver(net: &mut Net, msg: Message) {
    let now = net.now;
    net.raft_mut(msg.to).step(now, msg);
}

/// Delivers the message of `sent` addressed to `to`, then every answer
/// `to` gives to it.
fn deliver_and_answer(net: &mut Net, sent: &[Message], to: NodeId) {
    let msg = sent.iter().find(|m| m.to == to).expect("a message to `to`");
    deliver(net, msg.clone());
    for answer in drain_messages(net, to) {
        deliver(net, answer);
    }
}

/// The appends among `msgs`, as (recipient, entry payloads, commit).
fn appends(msgs: &[Message]) -> Vec<(NodeId, Vec<Vec<u8>>, u64)> {
    msgs.iter()
        .filter_map(|m| match &m.body {
            MessageBody::Append {
                entries, commit, ..
            } => Some((
                m.to,
                entries
                    .iter()
                    .map(|e| match &e.kind {
                        EntryKind::Command(bytes) => bytes.to_vec(),
                        _ => Vec::new(),
                    })
                    .collect(),
                *commit,
            )),
            _ => None,
        })
        .collect()
}

/// A settled 3-node cluster: its leader and followers, nothing in flight.
fn settled_three(seed: u64) -> (Net, NodeId, Vec<NodeId>) {
    let mut net = Net::new(3, fast(), seed);
    let leader = net.run_until_leader(5_000);
    net.run_ms(500);
    let followers = net.ids().into_iter().filter(|&n| n != leader).collect();
    assert!(drain_messages(&mut net, leader).is_empty());
    (net, leader, followers)
}

fn propose_and_drain(net: &mut Net, leader: NodeId, payloads: &[&[u8]]) -> Vec<Message> {
    let now = net.now;
    for payload in payloads {
        net.raft_mut(leader)
            .propose(now, payload.to_vec())
            .expect("propose");
    }
    drain_messages(net, leader)
}

#[test]
fn appends_that_arrive_together_get_one_answer_and_the_commit_rides_on_the_next() {
    let (mut net, leader, followers) = settled_three(42);
    let fast = followers[0];
    let mut to_fast = Vec::new();
    for payload in [b"y1", b"y2", b"y3"] {
        let msgs = propose_and_drain(&mut net, leader, &[payload]);
        to_fast.extend(msgs.into_iter().filter(|m| m.to == fast));
    }
    assert_eq!(to_fast.len(), 3, "one append per drain: {to_fast:?}");
    let last = net.raft(leader).last_index();
    let answers_before = net.raft(fast).counters().append_responses_sent;
    for msg in to_fast {
        deliver(&mut net, msg);
    }
    let answers = drain_messages(&mut net, fast);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(matches!(
        answers[0].body,
        MessageBody::AppendResponse { reject: false, index, .. } if index == last
    ));
    assert_eq!(
        net.raft(fast).counters().append_responses_sent,
        answers_before + 1
    );
    // The answer commits everything; what the leader proposes before its
    // next drain goes out with the new commit index, one append per
    // follower, with no separate empty append to tell it.
    let commit_before = net.raft(leader).commit_index();
    let appends_before = net.raft(leader).counters().appends_sent;
    deliver(&mut net, answers[0].clone());
    assert_eq!(net.raft(leader).commit_index(), last);
    assert!(last > commit_before);
    let next = appends(&propose_and_drain(&mut net, leader, &[b"y4"]));
    assert_eq!(
        next,
        vec![
            (followers[0], vec![b"y4".to_vec()], last),
            (followers[1], vec![b"y4".to_vec()], last),
        ]
    );
    assert_eq!(net.raft(leader).counters().appends_sent, appends_before + 2);
}

#[test]
fn an_idle_follower_is_told_the_commit_index_once_a_busy_one_with_its_next_append() {
    let (mut net, leader, followers) = settled_three(44);
    let (fast, slow) = (followers[0], followers[1]);
    let sent = propose_and_drain(&mut net, leader, &[b"w1"]);
    let last = net.raft(leader).last_index();
    deliver_and_answer(&mut net, &sent, fast);
    assert_eq!(net.raft(leader).commit_index(), last);
    // `fast` has nothing in flight: one empty append tells it the commit.
    // `slow` still has w1 in flight: nothing now.
    let told = appends(&drain_messages(&mut net, leader));
    assert_eq!(told, vec![(fast, Vec::new(), last)]);
    // `slow` answers w1: then it is told.
    deliver_and_answer(&mut net, &sent, slow);
    let told = appends(&drain_messages(&mut net, leader));
    assert_eq!(told, vec![(slow, Vec::new(), last)]);
    // Told once: nothing more until something changes.
    let fast_answer = appends(&drain_messages(&mut net, fast));
    assert!(fast_answer.is_empty());
    assert!(drain_messages(&mut net, leader).is_empty());
}

/// A commit of more than one entry new to an idle follower waits
/// `commit_notice_delay` for entries to carry it, then goes alone.
#[test]
fn an_idle_follower_is_told_a_batch_commit_after_the_notice_delay_a_busy_one_after_its_answer() {
    let (mut net, leader, followers) = settled_three(44);
    let (fast, slow) = (followers[0], followers[1]);
    let delay = fast_cfg_notice_delay();
    let sent = propose_and_drain(&mut net, leader, &[b"w1", b"w2"]);
    let last = net.raft(leader).last_index();
    deliver_and_answer(&mut net, &sent, fast);
    assert_eq!(net.raft(leader).commit_index(), last);
    // Nobody is told at once: entries proposed within the delay would
    // carry the commit index.
    assert!(appends(&drain_messages(&mut net, leader)).is_empty());
    let notice_at = net.now.saturating_add(delay);
    assert!(net.raft(leader).poll_timeout() <= Some(notice_at));
    net.raft_mut(leader)
        .handle_timeout(notice_at.saturating_sub(Duration::from_micros(1)));
    assert!(appends(&drain_messages(&mut net, leader)).is_empty());
    // Then `fast`, with nothing in flight, gets one empty append; `slow`
    // still has w1 in flight: nothing.
    net.raft_mut(leader).handle_timeout(notice_at);
    let told = appends(&drain_messages(&mut net, leader));
    assert_eq!(told, vec![(fast, Vec::new(), last)]);
    // `slow` answers w1 and w2: it is told after a delay of its own.
    net.now = notice_at;
    deliver_and_answer(&mut net, &sent, slow);
    assert!(appends(&drain_messages(&mut net, leader)).is_empty());
    net.raft_mut(leader)
        .handle_timeout(notice_at.saturating_add(delay));
    let told = appends(&drain_messages(&mut net, leader));
    assert_eq!(told, vec![(slow, Vec::new(), last)]);
    // Told once: nothing more until something changes.
    let fast_answer = appends(&drain_messages(&mut net, fast));
    assert!(fast_answer.is_empty());
    assert!(drain_messages(&mut net, leader).is_empty());
}

fn fast_cfg_notice_delay() -> Duration {
    let delay = fast().commit_notice_delay;
    assert!(!delay.is_zero(), "the fast profile delays commit notices");
    delay
}

/// With `commit_notice_delay` zero an idle follower is told a batch's
/// commit at once.
#[test]
fn a_zero_notice_delay_tells_an_idle_follower_at_once() {
    let cfg = RaftConfig {
        commit_notice_delay: Duration::ZERO,
        ..fast()
    };
    let mut net = Net::new(3, cfg, 45);
    let leader = net.run_until_leader(5_000);
    net.run_ms(500);
    assert!(drain_messages(&mut net, leader).is_empty());
    let fast = net.ids().into_iter().find(|&n| n != leader).unwrap();
    let sent = propose_and_drain(&mut net, leader, &[b"z1", b"z2"]);
    let last = net.raft(leader).last_index();
    deliver_and_answer(&mut net, &sent, fast);
    assert_eq!(net.raft(leader).commit_index(), last);
    let told = appends(&drain_messages(&mut net, leader));
    assert_eq!(told, vec![(fast, Vec::new(), last)]);
}

/// A lone voter elected leader, with a threshold of 10 entries (20 per
/// state item, at most 50).
fn lone_leader_with_snapshot_rule() -> Raft {
    let cfg = RaftConfig {
        snapshot_threshold_entries: 10,
        snapshot_entries_per_state_item: 2,
        snapshot_threshold_entries_max: 50,
        ..fast()
    };
    let me = id(0, 1);
    let mut raft = Raft::bootstrap(me, [me], cfg, 5, Instant::ZERO);
    while !raft.is_leader() {
        let at = raft
            .poll_timeout()
            .expect("a voter has an election deadline");
        raft.handle_timeout(at);
        while raft.poll_message().is_some() {}
    }
    raft
}

/// Proposes and applies one entry at a time, telling the state size
/// `items` after each, until `SnapshotWanted`; compacts then and returns
/// the entries applied since the previous snapshot.
fn entries_until_snapshot(raft: &mut Raft, items: u64) -> u64 {
    let base = raft.snapshot_meta().map_or(0, |m| m.index);
    for _ in 0..1_000 {
        raft.propose(Instant::ZERO, &b"x"[..]).unwrap();
        while raft.poll_committed().is_some() {
            raft.set_state_items(items);
        }
        while let Some(event) = raft.poll_event() {
            if let Event::SnapshotWanted { applied_index } = event {
                assert_eq!(raft.compact(Vec::new()), Ok(applied_index));
                return applied_index - base;
            }
        }
    }
    panic!("no snapshot in 1,000 entries");
}

#[test]
fn the_snapshot_threshold_grows_with_the_state_up_to_its_cap() {
    let mut raft = lone_leader_with_snapshot_rule();
    // Nothing told: the fixed threshold.
    assert_eq!(raft.snapshot_threshold_entries(), 10);
    let threshold = |raft: &mut Raft, items| {
        raft.set_state_items(items);
        raft.snapshot_threshold_entries()
    };
    assert_eq!(threshold(&mut raft, 5), 10, "small: the base");
    assert_eq!(threshold(&mut raft, 6), 12, "two entries an item");
    assert_eq!(threshold(&mut raft, 25), 50);
    assert_eq!(threshold(&mut raft, 26), 50, "capped");
    assert_eq!(threshold(&mut raft, u64::MAX), 50, "no overflow");

    // The snapshots taken follow it: a small state at the base, a larger
    // one twice its size, a huge one at the cap, and a shrunk one at the
    // base again.
    raft.set_state_items(0);
    entries_until_snapshot(&mut raft, 0);
    assert_eq!(entries_until_snapshot(&mut raft, 3), 10);
    assert_eq!(entries_until_snapshot(&mut raft, 20), 40);
    assert_eq!(entries_until_snapshot(&mut raft, 1_000), 50);
    raft.set_state_items(3);
    assert_eq!(entries_until_snapshot(&mut raft, 3), 10);

    // Zero keeps meaning "never", whatever the state.
    let never = RaftConfig {
        snapshot_threshold_entries: 0,
        ..fast()
    };
    let mut raft = Raft::bootstrap(id(0, 1), [id(0, 1)], never, 5, Instant::ZERO);
    raft.set_state_items(1_000);
    assert_eq!(raft.snapshot_threshold_entries(), 0);
}
