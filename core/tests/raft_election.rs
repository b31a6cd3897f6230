//! Raft elections: one test per rule (in the spirit of etcd's
//! raft_paper_test.go). Injected time only.

mod raft_harness;

use raft_harness::{Net, id};
use ticketing_core::raft::{Event, Message, MessageBody, Raft, RaftConfig, Role};
use ticketing_core::time::{Duration, Instant, duration_millis};

fn fast() -> RaftConfig {
    RaftConfig::fast()
}

#[test]
fn a_single_leader_is_elected_and_everyone_follows_it() {
    for n in [3u8, 5] {
        for seed in 0..20 {
            let mut net = Net::new(n, fast(), seed);
            let leader = net.run_until_leader(5_000);
            net.run_ms(3_000);
            assert_eq!(net.count_leaders(), 1, "n={n} seed={seed}");
            assert_eq!(
                net.leader(),
                Some(leader),
                "leadership is stable without faults"
            );
            let term = net.raft(leader).term();
            for nid in net.ids() {
                let r = net.raft(nid);
                assert_eq!(r.term(), term);
                assert_eq!(r.leader(), Some(leader));
            }
        }
    }
}

/// A narrow jitter window (15 ms) makes simultaneous candidacies common
/// among 5 voters; returns the term of the first leader of each seed.
fn first_terms_with_narrow_jitter(latency_ms: u64) -> Vec<u64> {
    let cfg = RaftConfig {
        heartbeat_interval: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(300),
        election_timeout_jitter: Duration::from_millis(15),
        ..RaftConfig::default()
    };
    (0..40)
        .map(|seed| {
            let mut net = Net::new(5, cfg.clone(), seed);
            net.latency_min_ms = latency_ms;
            net.latency_max_ms = latency_ms;
            let leader = net.run_until_leader(30_000);
            let term = net.raft(leader).term();
            net.run_ms(2_000);
            assert_eq!(net.count_leaders(), 1, "seed {seed}");
            term
        })
        .collect()
}

#[test]
fn split_votes_resolve() {
    // Links slower than a heartbeat interval (60 ms against 50): pre-vote
    // rounds that collide are no longer fresh when the rival's request
    // arrives, so the tie is not broken and votes split; each must still
    // end with one leader.
    let terms = first_terms_with_narrow_jitter(60);
    // Bootstrap term is 1; an election won at the first try is term 2.
    assert!(
        terms.iter().any(|&term| term > 2),
        "the scenario never produced a split vote"
    );
}

#[test]
fn colliding_pre_vote_rounds_elect_a_leader_at_the_first_try() {
    // The same narrow window with 10 ms links, where pre-vote rounds often
    // start within a one-way delay of each other: the tie goes to the
    // smaller id and only it campaigns, so every seed elects in term 2.
    let terms = first_terms_with_narrow_jitter(10);
    assert!(terms.iter().all(|&term| term == 2), "terms {terms:?}");
}

#[test]
fn a_node_with_a_stale_log_cannot_win() {
    for seed in 0..10 {
        let mut net = Net::new(3, fast(), seed);
        let leader = net.run_until_leader(5_000);
        let others: Vec<_> = net.ids().into_iter().filter(|&n| n != leader).collect();
        let (fresh, stale) = (others[0], others[1]);
        net.isolate(stale);
        for k in 0..5u8 {
            net.propose(leader, &[k]);
        }
        net.run_ms(500);
        assert!(net.raft(fresh).commit_index() > net.raft(stale).last_index());
        net.kill(leader);
        net.recover();
        let new_leader = net.run_until_leader(10_000);
        assert_eq!(new_leader, fresh, "seed {seed}: the stale node won");
        net.run_ms(2_000);
        net.assert_converged(&[fresh, stale]);
    }
}

#[test]
fn vote_is_refused_to_a_stale_log_directly() {
    let voters = [id(0, 1), id(1, 1), id(2, 1)];
    let mut r = Raft::bootstrap(voters[0], voters, fast(), 1, Instant::ZERO);
    // Give r an entry of term 2 from a leader.
    r.step(
        Instant::from_millis(1),
        Message {
            from: voters[1],
            to: voters[0],
            term: 2,
            body: MessageBody::Append {
                prev_index: 1,
                prev_term: 1,
                entries: vec![ticketing_core::raft::Entry {
                    index: 2,
                    term: 2,
                    kind: ticketing_core::raft::EntryKind::Noop,
                }],
                commit: 1,
            },
        },
    );
    while r.poll_message().is_some() {}
    // Long after the lease: a candidate in term 3 whose log ends at (1, 1).
    r.step(
        Instant::from_millis(10_000),
        Message {
            from: voters[2],
            to: voters[0],
            term: 3,
            body: MessageBody::Vote {
                last_index: 1,
                last_term: 1,
                transfer: false,
            },
        },
    );
    let (_, reply) = r.poll_message().unwrap();
    assert_eq!(reply.body, MessageBody::VoteResponse { reject: true });
    assert_eq!(r.vote(), None);
}

#[test]
fn prevote_keeps_a_rejoining_partitioned_node_from_disrupting_the_term() {
    for seed in 0..10 {
        let mut net = Net::new(3, fast(), seed);
        let leader = net.run_until_leader(5_000);
        let term = net.raft(leader).term();
        let lonely = net.ids().into_iter().find(|&n| n != leader).unwrap();
        net.isolate(lonely);
        // Many election timeouts pass; the lonely node keeps pre-voting.
        net.run_ms(20_000);
        assert_eq!(net.raft(lonely).term(), term, "pre-vote changed the term");
        assert_ne!(net.raft(lonely).role(), Role::Leader);
        net.recover();
        net.run_ms(5_000);
        assert_eq!(
            net.leader(),
            Some(leader),
            "seed {seed}: leader was deposed"
        );
        assert_eq!(net.raft(leader).term(), term);
        assert_eq!(net.raft(lonely).term(), term);
        assert_eq!(net.raft(lonely).leader(), Some(leader));
    }
}

#[test]
fn voters_ignore_votes_while_the_leader_lease_holds() {
    let voters = [id(0, 1), id(1, 1), id(2, 1)];
    let mut r = Raft::bootstrap(voters[0], voters, fast(), 1, Instant::ZERO);
    r.step(
        Instant::from_millis(100),
        Message {
            from: voters[1],
            to: voters[0],
            term: 2,
            body: MessageBody::Heartbeat { commit: 1 },
        },
    );
    while r.poll_message().is_some() {}
    // 100 ms later (lease = 300 ms): a vote request for term 3 is ignored,
    // the term does not move.
    let vote = |t: u64, transfer: bool| Message {
        from: voters[2],
        to: voters[0],
        term: t,
        body: MessageBody::Vote {
            last_index: 5,
            last_term: 2,
            transfer,
        },
    };
    r.step(Instant::from_millis(200), vote(3, false));
    assert!(r.poll_message().is_none());
    assert_eq!(r.term(), 2);
    // A transfer vote overrides the lease.
    r.step(Instant::from_millis(210), vote(3, true));
    assert_eq!(r.term(), 3);
    let (_, reply) = r.poll_message().unwrap();
    assert_eq!(reply.body, MessageBody::VoteResponse { reject: false });
}

#[test]
fn check_quorum_partitioned_leader_steps_down_and_rejoins_as_follower() {
    for seed in 0..10 {
        let mut net = Net::new(5, fast(), seed);
        let old = net.run_until_leader(5_000);
        let term = net.raft(old).term();
        net.isolate(old);
        let isolated_at = net.now;
        // Check-quorum fires within two election timeouts.
        net.run_ms(2 * 300 + 10);
        assert_eq!(net.raft(old).role(), Role::Follower, "seed {seed}");
        assert_eq!(net.raft(old).term(), term, "stepping down keeps the term");
        let stepped = net.nodes[&old]
            .events
            .iter()
            .any(|(t, e)| *t >= isolated_at && matches!(e, Event::SteppedDown { .. }));
        assert!(stepped);
        let new = net.run_until_leader(5_000);
        assert_ne!(new, old);
        let new_term = net.raft(new).term();
        assert!(new_term > term);
        for k in 0..3u8 {
            net.propose(new, &[k]);
        }
        net.recover();
        net.run_ms(2_000);
        assert_eq!(net.raft(old).role(), Role::Follower);
        assert_eq!(net.raft(old).leader(), Some(new));
        assert_eq!(net.raft(old).term(), new_term);
        assert_eq!(net.leader(), Some(new));
        net.assert_converged(&net.ids());
    }
}

/// Measures leader failover: kill the leader at a random phase of the
/// heartbeat cycle and time until another node is elected.
fn failover_ms(cfg: RaftConfig, seed: u64) -> u64 {
    let mut net = Net::new(3, cfg.clone(), seed);
    let leader = net.run_until_leader(20_000);
    // Random phase within a heartbeat interval, after a settle period.
    let phase_ms = net.rng.below(duration_millis(cfg.heartbeat_interval));
    net.run_ms(3_000 + phase_ms);
    let killed_at = net.now;
    net.kill(leader);
    let new = net.run_until_leader(20_000);
    assert_ne!(new, leader);
    let (at, _, _) = *net
        .leader_log
        .iter()
        .rev()
        .find(|(_, n, _)| *n == new)
        .unwrap();
    (at.as_micros() - killed_at.as_micros()) / 1000
}

#[test]
fn failover_with_defaults_takes_2_3_to_2_5_seconds() {
    let mut samples = Vec::new();
    for seed in 0..30 {
        let ms = failover_ms(RaftConfig::default(), seed);
        assert!(
            (2_300..=2_510).contains(&ms),
            "seed {seed}: failover took {ms} ms"
        );
        samples.push(ms);
    }
    let mean = samples.iter().sum::<u64>() / samples.len() as u64;
    eprintln!(
        "default failover: min {:?} max {:?} mean {mean} ms",
        samples.iter().min(),
        samples.iter().max()
    );
}

#[test]
fn failover_with_the_fast_profile_is_under_a_second() {
    for seed in 0..30 {
        let ms = failover_ms(RaftConfig::fast(), seed);
        assert!(ms < 1_000, "seed {seed}: failover took {ms} ms");
    }
}

#[test]
fn messages_for_another_generation_of_the_slot_are_ignored() {
    let old = id(0, 1);
    let new = id(0, 2);
    let mut r = Raft::join(new, fast(), 1, Instant::ZERO);
    r.step(
        Instant::from_millis(1),
        Message {
            from: id(1, 1),
            to: old,
            term: 9,
            body: MessageBody::Heartbeat { commit: 0 },
        },
    );
    assert_eq!(r.term(), 0);
    assert!(r.poll_message().is_none());
}

/// Two of three voters (the leader dead) whose timers fire at the same
/// instant: every message between them is delivered after `delay_ms`, the
/// dead one's are dropped. Returns the two rafts after `run_ms`.
fn survivors_timing_out_together(delay_ms: u64, run_ms: u64) -> (Raft, Raft) {
    let voters = [id(0, 1), id(1, 1), id(2, 1)];
    let cfg = RaftConfig::default();
    let mut a = Raft::bootstrap(voters[0], voters, cfg.clone(), 1, Instant::ZERO);
    let mut b = Raft::bootstrap(voters[1], voters, cfg, 2, Instant::ZERO);
    // Both deadlines have passed: each starts a pre-vote round now.
    let start = Instant::from_millis(10_000);
    a.handle_timeout(start);
    b.handle_timeout(start);
    assert_eq!(
        (a.role(), b.role()),
        (Role::PreCandidate, Role::PreCandidate)
    );
    // Messages in flight, each with its delivery time, in send order.
    let mut flight: Vec<(Instant, Message)> = Vec::new();
    let delay = Duration::from_millis(delay_ms);
    let end = start.saturating_add(Duration::from_millis(run_ms));
    let mut now = start;
    loop {
        for raft in [&mut a, &mut b] {
            while let Some((to, msg)) = raft.poll_message() {
                if to != voters[2] {
                    flight.push((now.saturating_add(delay), msg));
                }
            }
        }
        // The next event: a delivery or a timer, whichever comes first.
        let next_delivery = flight.iter().map(|(at, _)| *at).min();
        let next_timer = [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = [next_delivery, next_timer].into_iter().flatten().min() else {
            break;
        };
        if next > end {
            break;
        }
        now = next;
        if next_delivery == Some(now) {
            let position = flight.iter().position(|(at, _)| *at == now).unwrap();
            let (_, msg) = flight.remove(position);
            if msg.to == voters[0] {
                a.step(now, msg);
            } else {
                b.step(now, msg);
            }
        } else {
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
    }
    (a, b)
}

#[test]
fn two_survivors_whose_timers_fire_together_elect_the_smaller_id_in_one_term() {
    // Both pre-vote rounds start before either request arrives (a one-way
    // delay of 1 to 20 ms). Each would grant the other, both would then
    // campaign in term 2 and vote for themselves, and with the third voter
    // dead neither would win before another whole election timeout
    // (2.4–2.5 s). The pre-candidate with the smaller id refuses the tie,
    // so the other grants it alone and it wins term 2 within a few delays.
    for delay_ms in [1, 5, 20] {
        let (a, b) = survivors_timing_out_together(delay_ms, 6 * delay_ms);
        assert_eq!(a.role(), Role::Leader, "delay {delay_ms} ms");
        assert_eq!(a.term(), 2, "delay {delay_ms} ms");
        assert_eq!(b.role(), Role::Follower, "delay {delay_ms} ms");
        assert_eq!(b.leader(), Some(a.id()), "delay {delay_ms} ms");
        assert_eq!(b.term(), 2, "delay {delay_ms} ms");
    }
}

#[test]
fn a_pre_candidate_refuses_a_tie_only_within_a_heartbeat_of_its_round() {
    // Voter 0 starts a pre-vote round at 10 s; voter 1 (a larger id, the
    // same log) asks for a pre-vote in the same term 99 ms and 100 ms
    // later. The first ties with a fresh round and is refused; the second
    // comes when the round is a heartbeat interval (100 ms) old, which a
    // round that could win does not reach, and is granted.
    let voters = [id(0, 1), id(1, 1), id(2, 1)];
    for (after_ms, granted) in [(99, false), (100, true)] {
        let mut r = Raft::bootstrap(voters[0], voters, RaftConfig::default(), 1, Instant::ZERO);
        let start = Instant::from_millis(10_000);
        r.handle_timeout(start);
        assert_eq!(r.role(), Role::PreCandidate);
        while r.poll_message().is_some() {}
        r.step(
            start.saturating_add(Duration::from_millis(after_ms)),
            Message {
                from: voters[1],
                to: voters[0],
                term: 2,
                body: MessageBody::PreVote {
                    last_index: 1,
                    last_term: 1,
                },
            },
        );
        let (to, reply) = r.poll_message().unwrap();
        assert_eq!(to, voters[1]);
        assert_eq!(
            reply.body,
            MessageBody::PreVoteResponse { reject: !granted },
            "{after_ms} ms into the round"
        );
    }
}

#[test]
fn a_pre_candidate_grants_a_rival_with_a_smaller_id_or_a_longer_log() {
    // The tie goes to the smaller id: voter 1 in a fresh round grants voter
    // 0 and gives up its own round; voter 0 grants voter 2 when 2's log is
    // longer (no tie) and keeps its round.
    let voters = [id(0, 1), id(1, 1), id(2, 1)];
    let start = Instant::from_millis(10_000);
    let mut one = Raft::bootstrap(voters[1], voters, RaftConfig::default(), 1, Instant::ZERO);
    one.handle_timeout(start);
    while one.poll_message().is_some() {}
    one.step(
        start,
        Message {
            from: voters[0],
            to: voters[1],
            term: 2,
            body: MessageBody::PreVote {
                last_index: 1,
                last_term: 1,
            },
        },
    );
    let (_, reply) = one.poll_message().unwrap();
    assert_eq!(reply.body, MessageBody::PreVoteResponse { reject: false });
    assert_eq!(one.role(), Role::Follower, "the larger id stands down");
    let mut zero = Raft::bootstrap(voters[0], voters, RaftConfig::default(), 1, Instant::ZERO);
    zero.handle_timeout(start);
    while zero.poll_message().is_some() {}
    zero.step(
        start,
        Message {
            from: voters[2],
            to: voters[0],
            term: 2,
            body: MessageBody::PreVote {
                last_index: 2,
                last_term: 1,
            },
        },
    );
    let (_, reply) = zero.poll_message().unwrap();
    assert_eq!(reply.body, MessageBody::PreVoteResponse { reject: false });
    assert_eq!(zero.role(), Role::PreCandidate, "no tie: the round goes on");
}
