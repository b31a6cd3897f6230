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

#[test]
fn split_votes_resolve() {
    // A narrow jitter window and slow links make simultaneous candidacies
    // (and so split votes) common; each must still end with one leader.
    let cfg = RaftConfig {
        heartbeat_interval: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(300),
        election_timeout_jitter: Duration::from_millis(15),
        ..RaftConfig::default()
    };
    let mut splits = 0;
    for seed in 0..40 {
        let mut net = Net::new(5, cfg.clone(), seed);
        net.latency_min_ms = 10;
        net.latency_max_ms = 10;
        let leader = net.run_until_leader(30_000);
        let term = net.raft(leader).term();
        // Bootstrap term is 1; an election won at the first try is term 2.
        if term > 2 {
            splits += 1;
        }
        net.run_ms(2_000);
        assert_eq!(net.count_leaders(), 1);
    }
    assert!(splits > 0, "the scenario never produced a split vote");
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
