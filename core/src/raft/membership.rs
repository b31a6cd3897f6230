//! Membership: configuration changes (single-server, one at a time,
//! effective on append), the configuration in effect, and the leader's
//! automatic replacement driver (see the module documentation of
//! [`super`]).

use super::leader::LeaderState;
use super::progress::ProgressState;
use super::{
    ConfChange, Configuration, EntryKind, Event, NodeId, ProposeError, Raft, RoleState, Shared,
};
use crate::time::Instant;

impl Raft {
    /// Proposes a membership change (one at a time; see the module
    /// documentation). Returns the `(index, term)` of the configuration entry.
    pub fn propose_conf_change(
        &mut self,
        now: Instant,
        change: ConfChange,
    ) -> Result<(u64, u64), ProposeError> {
        self.shared.now = self.shared.now.max(now);
        let RoleState::Leader(leader) = &mut self.role else {
            return Err(self.shared.not_leader());
        };
        let s = &mut self.shared;
        leader.check_can_propose(s)?;
        if s.config_index > s.log.committed {
            return Err(ProposeError::ConfChangePending);
        }
        if s.log.term(s.log.committed) != Some(s.term) {
            return Err(ProposeError::NotCommittedInTerm);
        }
        let next = leader.next_config(s, change)?;
        let (appended, tenure) = leader.append(s, EntryKind::Config(next));
        self.end_tenure_if(tenure);
        Ok(appended)
    }
}

impl LeaderState {
    /// The configuration `change` makes of the one in effect.
    fn next_config(&self, s: &Shared, change: ConfChange) -> Result<Configuration, ProposeError> {
        let invalid = ProposeError::InvalidConfChange;
        let mut next = s.config.clone();
        match change {
            ConfChange::AddLearner(id) => {
                if next.contains(id) {
                    return Err(invalid("already a member"));
                }
                next.learners.insert(id);
            }
            ConfChange::PromoteLearner(id) => {
                if !next.learners.remove(&id) {
                    return Err(invalid("not a learner"));
                }
                next.voters.insert(id);
            }
            ConfChange::RemoveNode(id) => {
                if !next.voters.remove(&id) && !next.learners.remove(&id) {
                    return Err(invalid("not a member"));
                }
                if next.voters.is_empty() {
                    return Err(invalid("would remove the last voter"));
                }
            }
            ConfChange::ReplaceVoter { old, new } => {
                if !next.is_voter(old) {
                    return Err(invalid("old is not a voter"));
                }
                if !next.is_learner(new) {
                    return Err(invalid("new is not a learner"));
                }
                if !self.caught_up(s, new) {
                    return Err(invalid("new is not caught up"));
                }
                // Never fewer than two voters: every committed entry is then
                // on at least two slots, which is what lets the floors of
                // every slot but one bound every token after a majority is
                // lost (crate::cluster::recovery).
                if next.voters.len() < 3 {
                    return Err(invalid("would leave fewer than two voters"));
                }
                next.voters.remove(&old);
            }
        }
        Ok(next)
    }

    fn caught_up(&self, s: &Shared, id: NodeId) -> bool {
        self.progress.get(&id).is_some_and(|p| {
            p.state == ProgressState::Replicate
                && p.match_index.saturating_add(s.cfg.catch_up_lag_entries) >= s.log.last_index()
        })
    }

    /// The leader's replacement driver (see the module documentation): the
    /// one change to propose now, if any. `propose_conf_change` enforces the
    /// one-at-a-time and committed-in-term rules.
    pub(super) fn auto_membership_change(&self, s: &Shared) -> Option<ConfChange> {
        if !s.cfg.auto_membership || self.transfer.is_some() {
            return None;
        }
        let config = &s.config;
        // Caught-up learners in slots with no voter: two of them can be
        // promoted one after the other into an odd voter set (3 → 4 → 5)
        // and leave it odd again.
        let ready_for_empty_slots = config
            .learners
            .iter()
            .filter(|l| config.voter_in_slot(l.slot).is_none() && self.caught_up(s, **l))
            .count();
        for &learner in &config.learners {
            // A learner superseded by a newer generation of its slot.
            if config
                .members()
                .any(|m| m.slot == learner.slot && m.generation > learner.generation)
            {
                return Some(ConfChange::RemoveNode(learner));
            }
            if !self.caught_up(s, learner) {
                continue;
            }
            match config.voter_in_slot(learner.slot) {
                // Not from two voters (see `next_config`): the slot
                // without a voter is filled first.
                Some(old) if old.generation < learner.generation && config.voters.len() > 2 => {
                    return Some(ConfChange::ReplaceVoter { old, new: learner });
                }
                Some(_) => {}
                // Promote into an even voter set (the middle of a
                // replacement: 2 → 3 or 4 → 5), or into an odd one when a
                // second caught-up learner will follow (two slots replaced
                // at once: 3 → 4 → 5). Otherwise an odd set is complete: a
                // promotion would make it even, which adds a member to every
                // majority without tolerating one more failure.
                None if config.voters.len().is_multiple_of(2) || ready_for_empty_slots >= 2 => {
                    return Some(ConfChange::PromoteLearner(learner));
                }
                None => {}
            }
        }
        None
    }
}

impl Shared {
    pub(super) fn set_config(&mut self, config: Configuration, index: u64) {
        self.config_index = index;
        if self.config != config {
            self.config = config.clone();
            self.push_event(Event::ConfigChanged { config });
        }
    }

    /// The configuration is that of the last configuration entry in the log
    /// (appended counts, committed or not), else the snapshot base's.
    pub(super) fn recompute_config(&mut self) {
        let found = self.log.entries().rev().find_map(|e| match &e.kind {
            EntryKind::Config(c) => Some((c.clone(), e.index)),
            _ => None,
        });
        let (config, index) =
            found.unwrap_or_else(|| (self.base_config.clone(), self.log.snapshot_index()));
        self.set_config(config, index);
    }

    pub(super) fn config_at(&self, index: u64) -> Configuration {
        self.log
            .entries()
            .rev()
            .filter(|e| e.index <= index)
            .find_map(|e| match &e.kind {
                EntryKind::Config(c) => Some(c.clone()),
                _ => None,
            })
            .unwrap_or_else(|| self.base_config.clone())
    }
}
