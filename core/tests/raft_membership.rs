//! Learners, snapshots, membership changes and leadership transfer.
//! Injected time only.

mod raft_harness;

use raft_harness::{Net, id};
use ticketing_core::raft::{
    ConfChange, Configuration, Event, NodeId, ProposeError, RaftConfig, Role, TransferError,
};

fn fast() -> RaftConfig {
    RaftConfig::fast()
}

fn manual() -> RaftConfig {
    RaftConfig {
        auto_membership: false,
        ..RaftConfig::fast()
    }
}

/// Proposes a change at the leader, retrying while the leader is not ready
/// (its no-op or a previous change not yet committed).
fn change(net: &mut Net, change: ConfChange) -> (u64, u64) {
    for _ in 0..200 {
        let leader = net.run_until_leader(10_000);
        match net.with(leader, |r, now| r.propose_conf_change(now, change)) {
            Ok(at) => return at,
            Err(ProposeError::ConfChangePending | ProposeError::NotCommittedInTerm) => {
                net.run_ms(20)
            }
            Err(e) => panic!("{change:?}: {e:?}"),
        }
    }
    panic!("change never accepted")
}

#[test]
fn a_learner_catches_up_by_snapshot_after_log_compaction() {
    let cfg = RaftConfig {
        snapshot_threshold_entries: 50,
        snapshot_chunk_bytes: 100,
        ..manual()
    };
    let mut net = Net::new(3, cfg.clone(), 21);
    let leader = net.run_until_leader(5_000);
    for k in 0..300u16 {
        net.propose(leader, &k.to_be_bytes());
        if k % 20 == 0 {
            net.run_ms(5);
        }
    }
    net.run_ms(1_000);
    let first = net.raft(leader).first_index();
    assert!(
        first > 200,
        "the leader compacted its log (first index {first})"
    );
    assert!(
        // A log compacted up to its last entry has first = last + 1.
        net.raft(leader).last_index().saturating_sub(first) < 100,
        "log length bounded"
    );

    let learner = net.join(3, 1, cfg, 99);
    change(&mut net, ConfChange::AddLearner(learner));
    net.run_ms(2_000);
    let node = &net.nodes[&learner];
    assert_eq!(node.snapshots_installed, 1, "caught up through a snapshot");
    assert!(net.raft(learner).config().is_learner(learner));
    let leader = net.leader().unwrap();
    net.assert_converged(&[leader, learner]);
    assert_eq!(net.nodes[&learner].app.commands().len(), 300);
    // It keeps up with new entries by plain replication.
    for k in 0..10u8 {
        net.propose(leader, &[k]);
    }
    net.run_ms(500);
    net.assert_converged(&net.ids());
    assert_eq!(net.raft(learner).role(), Role::Follower);
    net.check_log_matching();
}

#[test]
fn learners_neither_vote_nor_count_for_commit() {
    let mut net = Net::new(3, manual(), 22);
    let learner = net.join(3, 1, manual(), 5);
    change(&mut net, ConfChange::AddLearner(learner));
    net.run_ms(500);
    let leader = net.leader().unwrap();
    let followers: Vec<NodeId> = (0..3).map(|s| id(s, 1)).filter(|&n| n != leader).collect();
    // With both voting followers gone, leader + learner are 2 of 4 nodes
    // but 1 of 3 voters: nothing commits.
    net.kill(followers[0]);
    net.kill(followers[1]);
    let commit = net.raft(leader).commit_index();
    let _ = net.try_propose(leader, b"x");
    net.run_ms(250);
    assert_eq!(net.raft(leader).commit_index(), commit);
    assert!(
        net.raft(learner).last_index() > commit,
        "the learner got the entry"
    );
    // And the learner never campaigns.
    net.run_ms(10_000);
    assert_ne!(net.raft(learner).role(), Role::Leader);
    assert_ne!(net.raft(learner).role(), Role::Candidate);
    assert_ne!(net.raft(learner).role(), Role::PreCandidate);
}

#[test]
fn one_membership_change_at_a_time() {
    let mut net = Net::new(3, manual(), 23);
    let leader = net.run_until_leader(5_000);
    net.run_ms(200);
    let a = net.join(3, 1, manual(), 1);
    let b = net.join(4, 1, manual(), 2);
    let now = net.now;
    let r = net.raft_mut(leader);
    r.propose_conf_change(now, ConfChange::AddLearner(a))
        .unwrap();
    assert_eq!(
        r.propose_conf_change(now, ConfChange::AddLearner(b)),
        Err(ProposeError::ConfChangePending)
    );
    // Takes effect on append, before commit.
    assert!(r.config().is_learner(a));
    net.run_ms(200);
    net.with(leader, |r, now| {
        r.propose_conf_change(now, ConfChange::AddLearner(b))
    })
    .unwrap();
    net.run_ms(200);
    assert!(net.raft(leader).config().is_learner(b));
    // Invalid changes are refused.
    assert_eq!(
        net.with(leader, |r, now| r
            .propose_conf_change(now, ConfChange::AddLearner(b))),
        Err(ProposeError::InvalidConfChange("already a member"))
    );
    assert!(matches!(
        net.with(leader, |r, now| r
            .propose_conf_change(now, ConfChange::PromoteLearner(id(9, 9)))),
        Err(ProposeError::InvalidConfChange(_))
    ));
}

#[test]
fn a_new_leader_changes_membership_only_after_committing_in_its_term() {
    let mut net = Net::new(3, manual(), 24);
    let old = net.run_until_leader(5_000);
    net.run_ms(200);
    net.kill(old);
    // Catch the new leader the moment it is elected: its no-op is not yet
    // committed (acknowledgements take 1 ms).
    let deadline = net.now.as_micros() + 10_000_000;
    let new = loop {
        if let Some(l) = net.leader().filter(|&l| l != old) {
            break l;
        }
        assert!(net.now.as_micros() < deadline);
        net.run_for(std::time::Duration::from_micros(100));
    };
    let a = net.join(3, 1, manual(), 1);
    assert_eq!(
        net.with(new, |r, now| r
            .propose_conf_change(now, ConfChange::AddLearner(a))),
        Err(ProposeError::NotCommittedInTerm)
    );
    net.run_ms(50);
    assert!(
        net.with(new, |r, now| r
            .propose_conf_change(now, ConfChange::AddLearner(a)))
            .is_ok()
    );
}

#[test]
fn a_voter_is_replaced_by_a_new_generation_while_the_old_one_is_alive_but_partitioned() {
    for seed in 0..5 {
        let mut net = Net::new(3, fast(), seed);
        let leader = net.run_until_leader(5_000);
        for k in 0..20u8 {
            net.propose(leader, &[k]);
        }
        net.run_ms(200);
        // Slot 2's old generation is cut off (alive, state intact), and a
        // new process for slot 2 starts with empty state.
        let old = if leader == id(2, 1) {
            id(1, 1)
        } else {
            id(2, 1)
        };
        net.isolate(old);
        let new = net.join(old.slot, 2, fast(), 1000 + seed);
        // The server adds it as a learner; the leader does the rest.
        change(&mut net, ConfChange::AddLearner(new));
        net.run_ms(3_000);
        let leader = net.leader().unwrap();
        let expected = Configuration::with_voters(
            (0..3u8).map(|s| if s == old.slot { new } else { id(s, 1) }),
        );
        assert_eq!(net.raft(leader).config(), &expected, "seed {seed}");
        assert!(net.raft(leader).commit_index() >= net.raft(leader).last_index() - 1);
        assert!(net.raft(new).is_voter());
        let term = net.raft(leader).term();
        // The old generation comes back: it still believes it is a voter,
        // but nobody listens to it, and it does not disrupt the term.
        net.recover();
        net.run_ms(10_000);
        assert_eq!(net.leader(), Some(leader));
        assert_eq!(
            net.raft(leader).term(),
            term,
            "seed {seed}: the old generation disrupted"
        );
        // The new generation counts: with the third voter gone, leader +
        // new still commit.
        let third = (0..3u8)
            .map(|s| if s == old.slot { new } else { id(s, 1) })
            .find(|&n| n != leader && n != new)
            .unwrap();
        net.kill(third);
        net.propose(leader, b"after");
        net.run_ms(500);
        assert_eq!(net.nodes[&new].app.commands().last().unwrap(), b"after");
        net.assert_converged(&[leader, new]);
        net.check_log_matching();
    }
}

#[test]
fn a_dead_voter_is_replaced_automatically_in_a_five_node_cluster() {
    let mut net = Net::new(5, fast(), 31);
    let leader = net.run_until_leader(5_000);
    for k in 0..10u8 {
        net.propose(leader, &[k]);
    }
    net.run_ms(200);
    let victim = (0..5u8).map(|s| id(s, 1)).find(|&n| n != leader).unwrap();
    net.kill(victim);
    let new = net.join(victim.slot, 7, fast(), 77);
    change(&mut net, ConfChange::AddLearner(new));
    net.run_ms(3_000);
    let leader = net.leader().unwrap();
    let cfg = net.raft(leader).config().clone();
    assert_eq!(cfg.voters.len(), 5);
    assert!(cfg.is_voter(new) && !cfg.contains(victim));
    assert!(cfg.learners.is_empty());
}

#[test]
fn leadership_transfer_hands_over_quickly() {
    for seed in 0..5 {
        let mut net = Net::new(3, fast(), seed);
        let old = net.run_until_leader(5_000);
        let target = net.ids().into_iter().find(|&n| n != old).unwrap();
        // Make the target lag, then transfer: it is caught up first.
        net.isolate(target);
        for k in 0..10u8 {
            net.propose(old, &[k]);
        }
        net.run_ms(100);
        net.recover();
        let t0 = net.now;
        assert_eq!(
            net.with(old, |r, now| r.transfer_leadership(now, Some(target))),
            Ok(target)
        );
        assert_eq!(
            net.with(old, |r, now| r.propose(now, vec![1])),
            Err(ProposeError::TransferInProgress)
        );
        let new = net.run_until_leader_other_than(Some(old), 1_000);
        assert_eq!(new, target);
        // Well before any election timeout (300 ms) could have fired.
        assert!(net.now.as_micros() - t0.as_micros() < 100_000);
        net.run_ms(500);
        assert_eq!(net.raft(old).role(), Role::Follower);
        assert_eq!(net.raft(old).leader(), Some(target));
        net.assert_converged(&net.ids());
    }
}

#[test]
fn leadership_transfer_refusals_and_timeout() {
    let mut net = Net::new(3, fast(), 41);
    let leader = net.run_until_leader(5_000);
    let f = net.ids().into_iter().find(|&n| n != leader).unwrap();
    assert_eq!(
        net.with(f, |r, now| r.transfer_leadership(now, None)),
        Err(TransferError::NotLeader)
    );
    assert_eq!(
        net.with(leader, |r, now| r.transfer_leadership(now, Some(leader))),
        Err(TransferError::BadTarget)
    );
    // An unreachable target: the transfer is abandoned after an election
    // timeout and the leader accepts proposals again.
    net.isolate(f);
    net.with(leader, |r, now| r.transfer_leadership(now, Some(f)))
        .unwrap();
    net.run_ms(350);
    assert_eq!(net.raft(leader).role(), Role::Leader);
    assert_eq!(net.raft(leader).transfer_target(), None);
    assert!(net.try_propose(leader, b"ok"));
}

#[test]
fn a_leader_that_removes_itself_steps_down_after_commit() {
    let mut net = Net::new(3, manual(), 51);
    let leader = net.run_until_leader(5_000);
    net.run_ms(100);
    change(&mut net, ConfChange::RemoveNode(leader));
    net.run_ms(50);
    assert_eq!(net.raft(leader).role(), Role::Follower);
    assert!(
        net.nodes[&leader]
            .events
            .iter()
            .any(|(_, e)| matches!(e, Event::SteppedDown { .. }))
    );
    let new = net.run_until_leader_other_than(Some(leader), 5_000);
    assert_eq!(net.raft(new).config().voters.len(), 2);
    assert!(net.try_propose(new, b"x"));
    net.run_ms(1_000);
    assert_eq!(net.leader(), Some(new));
}

#[test]
fn automatic_membership_never_makes_the_voter_count_even() {
    let mut net = Net::new(3, fast(), 61);
    let extra = net.join(3, 1, fast(), 9);
    change(&mut net, ConfChange::AddLearner(extra));
    net.run_ms(3_000);
    let leader = net.leader().unwrap();
    let cfg = net.raft(leader).config();
    assert_eq!(cfg.voters.len(), 3);
    assert!(cfg.is_learner(extra));
}

#[test]
fn manual_replacement_is_remove_then_promote() {
    let mut net = Net::new(3, manual(), 62);
    let leader = net.run_until_leader(5_000);
    let old = (0..3u8).map(|s| id(s, 1)).find(|&n| n != leader).unwrap();
    net.kill(old);
    let new = net.join(old.slot, 2, manual(), 3);
    change(&mut net, ConfChange::AddLearner(new));
    // Not caught up yet: refused.
    let leader = net.leader().unwrap();
    assert!(matches!(
        net.with(leader, |r, now| r
            .propose_conf_change(now, ConfChange::ReplaceVoter { old, new })),
        Err(ProposeError::InvalidConfChange(_) | ProposeError::ConfChangePending)
    ));
    net.run_ms(500);
    change(&mut net, ConfChange::ReplaceVoter { old, new });
    net.run_ms(200);
    let leader = net.leader().unwrap();
    let cfg = net.raft(leader).config().clone();
    assert_eq!(cfg.voters.len(), 2, "first step: the old voter is removed");
    assert!(cfg.is_learner(new));
    change(&mut net, ConfChange::PromoteLearner(new));
    net.run_ms(200);
    let leader = net.leader().unwrap();
    let cfg = net.raft(leader).config().clone();
    assert_eq!(cfg.voters.len(), 3);
    assert!(cfg.is_voter(new) && !cfg.contains(old));
    assert!(!net.raft(leader).conf_change_pending());
}

/// Found by the simulator (5-node seed 426): when two slots are replaced at
/// once and both old generations are removed first, the voter set is odd
/// (3) with two caught-up learners in empty slots. Both must be promoted
/// (3 → 4 → 5), or the cluster tolerates one failure instead of two forever.
#[test]
fn two_replacements_at_once_both_finish_in_a_five_node_cluster() {
    let mut net = Net::new(5, fast(), 43);
    let leader = net.run_until_leader(5_000);
    let victims: Vec<NodeId> = (0..5u8)
        .map(|s| id(s, 1))
        .filter(|&n| n != leader)
        .take(2)
        .collect();
    // With no learner around, automatic membership has nothing to do: the
    // removals leave 3 voters.
    for &victim in &victims {
        net.kill(victim);
        change(&mut net, ConfChange::RemoveNode(victim));
    }
    let leader = net.run_until_leader(5_000);
    assert_eq!(net.raft(leader).config().voters.len(), 3);
    let new: Vec<NodeId> = victims
        .iter()
        .enumerate()
        .map(|(i, v)| net.join(v.slot, 2, fast(), 100 + i as u64))
        .collect();
    for &learner in &new {
        change(&mut net, ConfChange::AddLearner(learner));
    }
    net.run_ms(3_000);
    let leader = net.leader().unwrap();
    let cfg = net.raft(leader).config().clone();
    assert_eq!(cfg.voters.len(), 5, "{cfg:?}");
    assert!(new.iter().all(|&n| cfg.is_voter(n)));
    assert!(cfg.learners.is_empty());
}
