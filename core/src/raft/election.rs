//! Role changes and elections: following, pre-vote and vote requests (which
//! every role answers), the (pre-)candidate's handler and vote counting, and
//! becoming leader.

use std::collections::BTreeMap;

use super::leader::{LeaderState, Tenure};
use super::{
    Configuration, EntryKind, Event, Message, MessageBody, NodeId, RAFT_NUMBER_MAX, Raft,
    RoleState, Shared,
};
use crate::time::{Duration, Instant, duration_millis};

/// How a pre-candidate breaks the tie with a rival's fresh pre-vote round
/// ([`Raft::pre_vote_tie`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PreVoteTie {
    /// We have the smaller id: refuse the rival, keep our round.
    Refuse,
    /// The rival has the smaller id: grant it and give up our round.
    StandDown,
}

/// Where an election stands after counting the answers.
enum Tally {
    /// A majority granted.
    Won,
    /// A majority refused: the election cannot be won.
    Lost,
    /// Still waiting for answers.
    Open,
}

impl Raft {
    pub(super) fn become_follower(&mut self, now: Instant, term: u64, leader: Option<NodeId>) {
        let s = &mut self.shared;
        if let RoleState::Leader(_) = self.role {
            s.push_event(Event::SteppedDown { term: s.term });
        }
        if term != s.term {
            debug_assert!(term > s.term);
            s.term = term;
            s.vote = None;
        }
        // Drops whatever the old role held: votes, or the leader's progress,
        // deadlines and transfer.
        self.role = RoleState::Follower;
        s.set_leader(leader);
        s.leader_contact = leader.map(|_| now);
        s.reset_election_deadline(now);
    }

    /// Whether the lease rule holds (see [`Raft::step`]): we lead, or heard
    /// from the leader of our term less than the minimum election timeout
    /// ago.
    pub(super) fn in_lease(&self, now: Instant) -> bool {
        if let RoleState::Leader(_) = self.role {
            return true;
        }
        let s = &self.shared;
        match (s.leader, s.leader_contact) {
            (Some(_), Some(contact)) => now < contact.saturating_add(s.cfg.election_timeout_min),
            _ => false,
        }
    }

    /// The handler of a pre-candidate and a candidate (after the term checks
    /// and the vote requests every role answers).
    pub(super) fn step_candidate(&mut self, now: Instant, msg: Message) {
        let from = msg.from;
        match msg.body {
            MessageBody::PreVoteResponse { reject } => {
                let term = self.shared.term;
                let current =
                    (!reject && msg.term == term.saturating_add(1)) || (reject && msg.term == term);
                if let RoleState::PreCandidate { votes, .. } = &mut self.role
                    && current
                {
                    votes.insert(from, !reject);
                    let tally = tally(&self.shared.config, votes);
                    self.conclude(now, true, tally);
                }
            }
            MessageBody::VoteResponse { reject } => {
                if let RoleState::Candidate { votes } = &mut self.role {
                    votes.insert(from, !reject);
                    let tally = tally(&self.shared.config, votes);
                    self.conclude(now, false, tally);
                }
            }
            MessageBody::Append { .. }
            | MessageBody::Heartbeat { .. }
            | MessageBody::InstallSnapshot { .. } => {
                // The term already has a leader: follow it, then handle its
                // message as a follower does.
                self.become_follower(now, self.shared.term, Some(from));
                self.step_follower(now, msg);
            }
            MessageBody::TimeoutNow => self.campaign_on_transfer(now),
            MessageBody::PreVote { .. }
            | MessageBody::Vote { .. }
            | MessageBody::AppendResponse { .. }
            | MessageBody::HeartbeatResponse
            | MessageBody::SnapshotResponse { .. } => {}
        }
    }

    /// The leader hands over (`TimeoutNow`): campaign at once, skipping
    /// pre-vote, and flag the votes so that voters set the lease rule aside
    /// (they did hear from a live leader — the very one that asked for this).
    pub(super) fn campaign_on_transfer(&mut self, now: Instant) {
        if self.is_voter() && self.shared.term.saturating_add(1) < RAFT_NUMBER_MAX {
            self.campaign(now, false, true);
        }
    }

    /// Starts a pre-vote (`pre_vote`) or an election. Callers check that
    /// `term + 1` stays below [`RAFT_NUMBER_MAX`].
    pub(super) fn campaign(&mut self, now: Instant, pre_vote: bool, transfer: bool) {
        let mut votes = BTreeMap::new();
        votes.insert(self.shared.id, true);
        let s = &mut self.shared;
        s.set_leader(None);
        s.leader_contact = None;
        s.reset_election_deadline(now);
        let last_index = s.log.last_index();
        let last_term = s.log.last_term();
        let (term, body) = if pre_vote {
            let body = MessageBody::PreVote {
                last_index,
                last_term,
            };
            (s.term.saturating_add(1), body)
        } else {
            s.term = s.term.saturating_add(1);
            s.vote = Some(s.id);
            let body = MessageBody::Vote {
                last_index,
                last_term,
                transfer,
            };
            (s.term, body)
        };
        let voters: Vec<NodeId> = s
            .config
            .voters
            .iter()
            .copied()
            .filter(|&v| v != s.id)
            .collect();
        for voter in voters {
            s.send_with_term(voter, term, body.clone());
        }
        let tally = tally(&s.config, &votes);
        self.role = if pre_vote {
            RoleState::PreCandidate { votes, since: now }
        } else {
            RoleState::Candidate { votes }
        };
        self.conclude(now, pre_vote, tally);
    }

    /// How the pre-vote request of `from` (for `term`, with a log ending at
    /// `last_index`/`last_term`) ties with our own pre-vote round, if it
    /// does.
    ///
    /// Two voters whose timers fire within a one-way delay of each other
    /// both ask for pre-votes before either hears the other, and each
    /// grants the other (neither has a leader or a newer term). Both then
    /// campaign in the same term and each votes for itself: in a 3-node
    /// cluster whose leader died neither can reach a majority, and both
    /// wait out another whole election timeout (the 5 s failovers of the
    /// default profile); with more voters the others' votes may split
    /// between them the same way. So a tie between two fresh pre-vote
    /// rounds of the same term from logs exactly as up to date goes to the
    /// smaller id: it refuses the larger's request ([`PreVoteTie::Refuse`])
    /// and the larger grants the smaller's and stands down
    /// ([`PreVoteTie::StandDown`]), so only one of them campaigns. A
    /// pre-vote binds nobody, so refusing one or giving up a round never
    /// affects safety; a log that is more up to date still wins as before
    /// (and a less up to date one is refused as before).
    ///
    /// A round is fresh for one heartbeat interval (by design far longer
    /// than a round trip) from its start: a pre-candidate that has waited
    /// longer is one that could not win (cut off from the leader and from
    /// a majority of grants), and must not stall a rival that can.
    pub(super) fn pre_vote_tie(
        &self,
        now: Instant,
        from: NodeId,
        term: u64,
        last_index: u64,
        last_term: u64,
    ) -> Option<PreVoteTie> {
        let RoleState::PreCandidate { since, .. } = self.role else {
            return None;
        };
        let s = &self.shared;
        let tie = term == s.term.saturating_add(1)
            && last_index == s.log.last_index()
            && last_term == s.log.last_term()
            && now < since.saturating_add(s.cfg.heartbeat_interval);
        if !tie {
            None
        } else if s.id < from {
            Some(PreVoteTie::Refuse)
        } else {
            Some(PreVoteTie::StandDown)
        }
    }

    /// A pre-vote request, after the term checks: answered in every role
    /// ([`Shared::handle_pre_vote`]), with the tie of two fresh pre-vote
    /// rounds broken ([`Raft::pre_vote_tie`]).
    pub(super) fn step_pre_vote(
        &mut self,
        now: Instant,
        from: NodeId,
        term: u64,
        last_index: u64,
        last_term: u64,
    ) {
        let tie = self.pre_vote_tie(now, from, term, last_index, last_term);
        let refuse = tie == Some(PreVoteTie::Refuse);
        self.shared
            .handle_pre_vote(from, term, last_index, last_term, refuse);
        if tie == Some(PreVoteTie::StandDown) {
            // Back to following nobody in the same term, with a fresh
            // timer: the rival's vote request comes within a round trip
            // and is granted (we cast no vote in its term).
            self.become_follower(now, self.shared.term, None);
        }
    }

    fn conclude(&mut self, now: Instant, pre_vote: bool, tally: Tally) {
        match tally {
            Tally::Won if pre_vote => self.campaign(now, false, false),
            Tally::Won => self.become_leader(now),
            // Go back to following (same term) and wait for a leader or a
            // new timeout.
            Tally::Lost => self.become_follower(now, self.shared.term, None),
            Tally::Open => {}
        }
    }

    fn become_leader(&mut self, now: Instant) {
        let s = &mut self.shared;
        s.set_leader(Some(s.id));
        s.push_event(Event::BecameLeader { term: s.term });
        s.leader_contact = Some(now);
        let mut leader = LeaderState::new(s, now);
        // The no-op of this term: committing it commits everything before
        // it, and until then the leader commits nothing from older terms by
        // counting (Figure 8).
        let (_, tenure) = leader.append(s, EntryKind::Noop);
        if tenure == Tenure::Continues {
            // Probe everyone now (with the no-op) rather than at the next
            // flush.
            leader.probe_all(s);
        }
        self.role = RoleState::Leader(leader);
        self.end_tenure_if(tenure);
    }
}

/// Counts the voters' answers in `votes` against the configuration.
fn tally(config: &Configuration, votes: &BTreeMap<NodeId, bool>) -> Tally {
    let quorum = config.quorum();
    let granted = votes
        .iter()
        .filter(|(id, granted)| **granted && config.is_voter(**id))
        .count();
    let rejected = votes
        .iter()
        .filter(|(id, granted)| !**granted && config.is_voter(**id))
        .count();
    if granted >= quorum {
        Tally::Won
    } else if rejected > 0 && rejected + quorum > config.voters.len() {
        Tally::Lost
    } else {
        Tally::Open
    }
}

impl Shared {
    /// A pre-vote request, answered in every role. The candidate asks about
    /// term `term` (our term + 1 if it is level with us). Grant only for a
    /// later term, only to a log at least as up to date as ours (§5.4.1),
    /// and not to a rival that lost the tie with our own pre-vote round
    /// (`tie_lost`, [`Raft::pre_vote_tie`]).
    pub(super) fn handle_pre_vote(
        &mut self,
        from: NodeId,
        term: u64,
        last_index: u64,
        last_term: u64,
        tie_lost: bool,
    ) {
        let grant = term > self.term && self.log.is_up_to_date(last_index, last_term) && !tie_lost;
        let term = if grant { term } else { self.term };
        self.send_with_term(from, term, MessageBody::PreVoteResponse { reject: !grant });
    }

    /// A vote request (of our term, after the term checks), answered in
    /// every role.
    pub(super) fn handle_vote(
        &mut self,
        now: Instant,
        from: NodeId,
        last_index: u64,
        last_term: u64,
    ) {
        // One vote per term: we may repeat a vote, or cast one when we have
        // neither voted nor learned of a leader this term.
        let can_vote = self.vote == Some(from) || (self.vote.is_none() && self.leader.is_none());
        let grant = can_vote && self.log.is_up_to_date(last_index, last_term);
        if grant {
            self.vote = Some(from);
            // Granting resets our timer, so we do not immediately compete
            // with the candidate we just voted for.
            self.reset_election_deadline(now);
        }
        self.send(from, MessageBody::VoteResponse { reject: !grant });
    }

    pub(super) fn set_leader(&mut self, leader: Option<NodeId>) {
        if self.leader != leader {
            self.leader = leader;
            if leader.is_some() && leader != self.last_known_leader {
                self.last_known_leader = leader;
                self.counters.leader_changes += 1;
            }
            self.push_event(Event::LeaderChanged {
                leader,
                term: self.term,
            });
        }
    }

    pub(super) fn reset_election_deadline(&mut self, now: Instant) {
        // Whole milliseconds are fine enough to spread candidates, and
        // seeded runs (the simulator's traces) depend on this exact draw.
        let jitter_ms = self
            .rng
            .below(duration_millis(self.cfg.election_timeout_jitter));
        let timeout = self
            .cfg
            .election_timeout_min
            .saturating_add(Duration::from_millis(jitter_ms));
        self.election_deadline = now.saturating_add(timeout);
    }
}
