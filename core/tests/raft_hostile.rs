//! One peer message carrying an impossible number must not end a
//! cluster. Each message is refused twice over — by the peer decoder (an
//! authenticated frame, sealed with the session key, so only the number
//! bound can refuse it) and by `Raft::step` when stepped directly — and a three-node cluster that
//! received it still elects leaders and commits.

mod raft_harness;

use raft_harness::Net;
use ticketing_core::cluster::peer::{PeerDecoder, PeerError, PeerSealer};
use ticketing_core::raft::{Message, MessageBody, NodeId, RAFT_NUMBER_MAX, RaftConfig};

/// A cluster with a leader whose no-op is committed, and its followers.
fn cluster(seed: u64) -> (Net, NodeId, Vec<NodeId>) {
    let mut net = Net::new(3, RaftConfig::fast(), seed);
    let leader = net.run_until_leader(5_000);
    net.propose(leader, b"before");
    net.run_ms(200);
    let followers = net.ids().into_iter().filter(|&n| n != leader).collect();
    (net, leader, followers)
}

/// The frame key of the decoder tests (any key: the tag verifies, so only
/// the number bound refuses).
const KEY: [u8; 32] = [7; 32];

/// The message does not get through the peer decoder, whole or byte by byte.
fn assert_decoder_refuses(msg: &Message) {
    let mut frame = Vec::new();
    PeerSealer::from_key(&KEY)
        .seal(msg, &mut frame)
        .expect("encodes");
    let mut whole = PeerDecoder::from_key(&KEY);
    whole.push(&frame);
    assert_eq!(whole.next(), Err(PeerError::Malformed), "{msg:?}");
    let mut decoder = PeerDecoder::from_key(&KEY);
    let mut outcome = Ok(None);
    for byte in &frame {
        decoder.push(std::slice::from_ref(byte));
        outcome = decoder.next();
        if outcome != Ok(None) {
            break;
        }
    }
    assert_eq!(outcome, Err(PeerError::Malformed), "{msg:?}");
}

/// What a node's Raft state looks like from outside, for "nothing changed".
fn observable(net: &Net, node: NodeId) -> (u64, Option<NodeId>, Option<NodeId>, u64, u64) {
    let raft = net.raft(node);
    (
        raft.term(),
        raft.leader(),
        raft.vote(),
        raft.commit_index(),
        raft.last_index(),
    )
}

/// Steps `msg` into `to` directly: it must be dropped, counted, and leave
/// the node's term, leader, vote, commit and log as they were.
fn assert_raft_refuses(net: &mut Net, to: NodeId, msg: Message) {
    let before = observable(net, to);
    let refused = net.raft(to).refused_messages();
    net.with(to, |raft, now| raft.step(now, msg));
    assert_eq!(net.raft(to).refused_messages(), refused + 1);
    assert_eq!(observable(net, to), before);
}

/// Whatever the hostile message did, a new leader is elected once the old
/// one is cut off (every follower's election timeout fires, which is where
/// the accepted `u64::MAX` term overflowed), and it commits a new command on
/// a majority; after the partition heals everyone converges.
fn assert_cluster_recovers(net: &mut Net, old_leader: NodeId) {
    net.isolate(old_leader);
    let leader = net.run_until_leader_other_than(Some(old_leader), 10_000);
    let term = net.raft(leader).term();
    assert!(term < 100, "term {term} after one failover");
    let (index, _) = net.propose(leader, b"after");
    net.run_ms(500);
    assert!(net.raft(leader).commit_index() >= index);
    net.recover();
    net.run_ms(3_000);
    let all = net.ids();
    net.assert_converged(&all);
    net.check_log_matching();
}

#[test]
fn a_heartbeat_with_term_u64_max_is_refused_and_the_cluster_elects_again() {
    for seed in 0..5 {
        let (mut net, leader, followers) = cluster(seed);
        for &to in &followers {
            let msg = Message {
                from: leader,
                to,
                term: u64::MAX,
                body: MessageBody::Heartbeat { commit: 0 },
            };
            assert_decoder_refuses(&msg);
            assert_raft_refuses(&mut net, to, msg);
        }
        // The first term refused, and the last one accepted.
        let at_bound = Message {
            from: leader,
            to: followers[0],
            term: RAFT_NUMBER_MAX,
            body: MessageBody::Heartbeat { commit: 0 },
        };
        assert_decoder_refuses(&at_bound);
        let mut frame = Vec::new();
        let below = Message {
            term: RAFT_NUMBER_MAX - 1,
            ..at_bound.clone()
        };
        PeerSealer::from_key(&KEY)
            .seal(&below, &mut frame)
            .expect("encodes");
        let mut decoder = PeerDecoder::from_key(&KEY);
        decoder.push(&frame);
        assert_eq!(decoder.next(), Ok(Some(below)));
        assert_raft_refuses(&mut net, followers[0], at_bound);
        assert_cluster_recovers(&mut net, leader);
    }
}

#[test]
fn an_append_response_with_index_u64_max_is_refused() {
    for seed in 0..5 {
        let (mut net, leader, followers) = cluster(seed);
        let term = net.raft(leader).term();
        let matched = net.raft(leader).match_index(followers[0]);
        let msg = Message {
            from: followers[0],
            to: leader,
            term,
            body: MessageBody::AppendResponse {
                reject: false,
                index: u64::MAX,
                hint_index: 0,
                hint_term: 0,
            },
        };
        assert_decoder_refuses(&msg);
        assert_raft_refuses(&mut net, leader, msg);
        // In bounds but beyond the leader's log: no honest follower of this
        // term acknowledges entries its leader never had.
        let beyond = Message {
            from: followers[0],
            to: leader,
            term,
            body: MessageBody::AppendResponse {
                reject: false,
                index: net.raft(leader).last_index() + 1_000,
                hint_index: 0,
                hint_term: 0,
            },
        };
        assert_raft_refuses(&mut net, leader, beyond);
        assert_eq!(net.raft(leader).match_index(followers[0]), matched);
        assert!(net.raft(leader).is_leader());
        assert_cluster_recovers(&mut net, leader);
    }
}

#[test]
fn a_rejecting_append_response_with_hint_u64_max_is_refused() {
    for seed in 0..5 {
        let (mut net, leader, followers) = cluster(seed);
        let term = net.raft(leader).term();
        for (index, hint_term) in [(u64::MAX, 0), (1, 0), (u64::MAX, u64::MAX)] {
            let msg = Message {
                from: followers[1],
                to: leader,
                term,
                body: MessageBody::AppendResponse {
                    reject: true,
                    index,
                    hint_index: u64::MAX,
                    hint_term,
                },
            };
            assert_decoder_refuses(&msg);
            assert_raft_refuses(&mut net, leader, msg);
        }
        assert!(net.raft(leader).is_leader());
        assert_cluster_recovers(&mut net, leader);
    }
}

/// Found by the `cluster_peer_frames` fuzz target: a rejection naming an
/// index past the leader's log (in bounds) moved that follower's probe past
/// the log, where no append can be built, so it was never sent another
/// entry. It is refused and counted like an acknowledgement of entries the
/// leader never had, and the follower keeps receiving entries.
#[test]
fn a_rejection_of_an_append_never_sent_is_refused() {
    for seed in 0..5 {
        let (mut net, leader, followers) = cluster(seed);
        let term = net.raft(leader).term();
        let last = net.raft(leader).last_index();
        for (index, hint_index) in [(last + 44, last + 29), (last + 1, 0), (last + 1, last)] {
            let msg = Message {
                from: followers[0],
                to: leader,
                term,
                body: MessageBody::AppendResponse {
                    reject: true,
                    index,
                    hint_index,
                    hint_term: 0,
                },
            };
            assert_raft_refuses(&mut net, leader, msg);
        }
        assert!(net.raft(leader).is_leader());
        let (index, _) = net.propose(leader, b"after");
        net.run_ms(500);
        assert!(
            net.raft(leader).match_index(followers[0]) >= Some(index),
            "the follower was not sent the new entry"
        );
        assert_cluster_recovers(&mut net, leader);
    }
}

#[test]
fn every_number_field_is_bounded() {
    // One message per field, that field at the bound and everything else
    // ordinary: each must be refused by the decoder.
    let (from, to) = (NodeId::new(0, 1), NodeId::new(1, 1));
    let max = RAFT_NUMBER_MAX;
    let entry = |index, term| ticketing_core::raft::Entry {
        index,
        term,
        kind: ticketing_core::raft::EntryKind::Noop,
    };
    let snapshot = |index, term, offset| MessageBody::InstallSnapshot {
        meta: ticketing_core::raft::SnapshotMeta {
            index,
            term,
            config: Default::default(),
        },
        offset,
        data: vec![1, 2, 3],
        done: false,
    };
    let bodies = [
        (
            1,
            MessageBody::PreVote {
                last_index: max,
                last_term: 1,
            },
        ),
        (
            1,
            MessageBody::PreVote {
                last_index: 1,
                last_term: max,
            },
        ),
        (
            1,
            MessageBody::Vote {
                last_index: max,
                last_term: 1,
                transfer: false,
            },
        ),
        (
            1,
            MessageBody::Vote {
                last_index: 1,
                last_term: max,
                transfer: true,
            },
        ),
        (max, MessageBody::PreVoteResponse { reject: false }),
        (max, MessageBody::VoteResponse { reject: true }),
        (max, MessageBody::HeartbeatResponse),
        (max, MessageBody::TimeoutNow),
        (
            1,
            MessageBody::Append {
                prev_index: max,
                prev_term: 1,
                entries: vec![],
                commit: 0,
            },
        ),
        (
            1,
            MessageBody::Append {
                prev_index: 1,
                prev_term: max,
                entries: vec![],
                commit: 0,
            },
        ),
        (
            1,
            MessageBody::Append {
                prev_index: 1,
                prev_term: 1,
                entries: vec![],
                commit: max,
            },
        ),
        (
            1,
            MessageBody::Append {
                prev_index: max - 1,
                prev_term: 1,
                entries: vec![entry(max, 1)],
                commit: 0,
            },
        ),
        (
            1,
            MessageBody::Append {
                prev_index: 1,
                prev_term: 1,
                entries: vec![entry(2, max)],
                commit: 0,
            },
        ),
        (1, MessageBody::Heartbeat { commit: max }),
        (1, snapshot(max, 1, 0)),
        (1, snapshot(1, max, 0)),
        (1, snapshot(1, 1, max)),
        // The chunk's end is bounded too (offset + len).
        (1, snapshot(1, 1, max - 2)),
        (
            1,
            MessageBody::SnapshotResponse {
                index: max,
                next_offset: 0,
                done: true,
            },
        ),
        (
            1,
            MessageBody::SnapshotResponse {
                index: 1,
                next_offset: max,
                done: false,
            },
        ),
    ];
    for (term, body) in bodies {
        let msg = Message {
            from,
            to,
            term,
            body,
        };
        assert!(!msg.numbers_in_bounds(), "{msg:?}");
        assert_decoder_refuses(&msg);
    }
}

#[test]
fn a_node_at_the_last_term_stops_campaigning_instead_of_overflowing() {
    // The largest term the decoder accepts: the follower takes it (no
    // honest node sends it, but it is in bounds), and then must never
    // campaign into a term its peers would refuse.
    let (mut net, leader, followers) = cluster(1);
    let to = followers[0];
    let msg = Message {
        from: leader,
        to,
        term: RAFT_NUMBER_MAX - 1,
        body: MessageBody::Heartbeat { commit: 0 },
    };
    net.with(to, |raft, now| raft.step(now, msg));
    assert_eq!(net.raft(to).term(), RAFT_NUMBER_MAX - 1);
    net.isolate(to);
    net.run_ms(10_000);
    assert_eq!(
        net.raft(to).term(),
        RAFT_NUMBER_MAX - 1,
        "campaigned past the bound"
    );
    assert_eq!(net.raft(to).refused_messages(), 0);
}
