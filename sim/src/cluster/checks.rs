//! Checkers run after every event: Raft, lock state, replies, fencing.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Raft and lock-state checks over every running node.
    pub(super) fn check_cluster(&mut self) {
        let mut found = Vec::new();
        let mut changed = Vec::new();
        let mut notes = Vec::new();
        if self
            .nodes
            .iter()
            .any(|proc| proc.node.as_ref().is_some_and(|node| node.is_leader()))
        {
            self.last_leader_us = self.now_us;
        }
        for slot in 0..self.n {
            let s = usize::from(slot);
            let proc = &mut self.nodes[s];
            let Some(node) = proc.node.as_ref() else {
                continue;
            };
            if node.checking_genesis() {
                // A bootstrap member still checking that the cluster is new
                // belongs to no Raft group yet: it steps nothing, and its
                // log is only its own bootstrap entry, which after a
                // recovery is not the running cluster's (a mistaken
                // `--bootstrap` names generation 1's voters).
                continue;
            }
            let raft = node.raft();
            let id = raft.id();
            if proc.incarnation != Some(id) {
                // A bootstrap member found the cluster running and joined
                // as a new generation: a new incarnation for the checks.
                proc.incarnation = Some(id);
                proc.commit_seen = 0;
                proc.token_max = 0;
                proc.checked = (0, 0, 0, 0);
                proc.shadow = vec![None; ALL_KEYS.len()];
                notes.push(format!("node {slot} rejoins as {id:?}"));
            }
            let known = (raft.term(), raft.leader(), raft.config());
            if (known.0, known.1, known.2)
                != (
                    proc.known_leader.0,
                    proc.known_leader.1,
                    &proc.known_leader.2,
                )
            {
                proc.known_leader = (known.0, known.1, known.2.clone());
                if self.rec.tracing() {
                    notes.push(format!(
                        "{id:?} term {}: leader {:?}, {:?}, commit {}, voters {:?}, learners {:?}",
                        known.0,
                        known.1,
                        raft.role(),
                        raft.commit_index(),
                        raft.config().voters,
                        raft.config().learners,
                    ));
                }
            }
            if raft.is_leader() {
                match self.leaders.get(&raft.term()) {
                    Some(other) if *other != id => found.push((
                        Checker::Raft,
                        format!("two leaders in term {}: {other:?} and {id:?}", raft.term()),
                    )),
                    Some(_) => {}
                    None => {
                        self.leaders.insert(raft.term(), id);
                    }
                }
            }
            let commit = raft.commit_index();
            let last = raft.last_index();
            let mark = (
                last,
                raft.term_at(last).unwrap_or(0),
                commit,
                raft.applied_index(),
            );
            if mark == proc.checked {
                continue;
            }
            if mark.3 != proc.checked.3 {
                changed.push(slot);
            }
            proc.checked = mark;
            if commit < proc.commit_seen {
                found.push((
                    Checker::Raft,
                    format!(
                        "{id:?} commit index went back from {} to {commit}",
                        proc.commit_seen
                    ),
                ));
            }
            // Every entry this node has: one entry per (index, term) across
            // the cluster (log matching), one per committed index.
            let from = raft
                .first_index()
                .max(proc.commit_seen.saturating_sub(1))
                .max(1);
            for index in from..=raft.last_index() {
                let Some(entry) = raft.entry(index) else {
                    continue;
                };
                let h = hash_of(entry);
                if *self.entries.entry((index, entry.term)).or_insert(h) != h {
                    found.push((
                        Checker::Raft,
                        format!(
                            "{id:?} has another entry at index {index} term {}",
                            entry.term
                        ),
                    ));
                }
                if index <= commit && *self.committed.entry(index).or_insert(h) != h {
                    found.push((
                        Checker::Raft,
                        format!("{id:?} committed another entry at index {index}"),
                    ));
                }
            }
            let view = node.lock_state().replicated_view();
            let applied = raft.applied_index();
            let h = hash_of(&view);
            if *self.states.entry(applied).or_insert(h) != h {
                found.push((
                    Checker::Raft,
                    format!("{id:?} has another replicated state at applied index {applied}"),
                ));
            }
            proc.commit_seen = proc.commit_seen.max(commit);
        }
        for (checker, detail) in found {
            self.violation(checker, detail);
        }
        for note in notes {
            self.note(|| note);
        }
        for slot in changed {
            self.check_locks(slot);
        }
    }

    /// A node's applied lock state: tokens only grow; a key changes holder
    /// only once the old holder released it, was a ghost, never reached a
    /// client, or ran out of lease.
    pub(super) fn check_locks(&mut self, slot: u8) {
        let s = usize::from(slot);
        let Some(node) = self.nodes[s].node.as_ref() else {
            return;
        };
        let mut fresh = Vec::new();
        let mut holders = vec![None; ALL_KEYS.len()];
        for (token, holding) in node.lock_state().grants() {
            let keys: Vec<usize> = holding
                .keys
                .keys()
                .iter()
                .map(|key| key_index(key.as_bytes()))
                .collect();
            for &key in &keys {
                holders[key] = Some(token);
            }
            if token > self.nodes[s].token_max {
                fresh.push((token, keys, holding.lease_ms));
            }
        }
        let mut found = Vec::new();
        for (token, keys, lease_ms) in fresh {
            self.nodes[s].token_max = token;
            match self.grants.get(&token) {
                Some(info) if info.keys != keys || info.lease_ms != lease_ms => found.push((
                    Checker::Tokens,
                    format!(
                        "token {token} names {keys:?} on node {slot}, {:?} elsewhere",
                        info.keys
                    ),
                )),
                Some(_) => {}
                None => {
                    if token <= self.token_max {
                        found.push((
                            Checker::Tokens,
                            format!(
                                "new grant {token} on node {slot} is not above earlier token {}",
                                self.token_max
                            ),
                        ));
                    }
                    self.token_max = self.token_max.max(token);
                    self.grants.insert(
                        token,
                        GrantInfo {
                            keys,
                            lease_ms,
                            first_applied_us: self.now_us,
                            era: self.lease_era,
                        },
                    );
                }
            }
        }
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let old = self.nodes[s].shadow[key];
            let new = holders[key];
            if let (Some(old), Some(new)) = (old, new)
                && old != new
            {
                let info = self.grants.get(&old);
                let lease_over = info.is_none_or(|info| {
                    info.era != self.lease_era
                        || self.now_us
                            >= info.first_applied_us
                                + self.lease_min_us(u64::from(info.lease_ms) * 1_000)
                });
                let free = lease_over
                    || self.release_requested.contains(&old)
                    || self.force_requested.contains(&old)
                    || self.ghosts.contains(&old)
                    || !self.replied.contains(&old);
                if !free {
                    found.push((
                        Checker::ServerState,
                        format!(
                            "{name} passed from {old} to {new} on node {slot}: two live holders"
                        ),
                    ));
                }
            }
            self.nodes[s].shadow[key] = new;
        }
        for (checker, detail) in found {
            self.violation(checker, detail);
        }
    }

    /// The shortest true duration of a lease of `lease_us` on a node clock
    /// that may run fast by the drift bound.
    pub(super) fn lease_min_us(&self, lease_us: u64) -> u64 {
        crate::clock::lease_min_us(lease_us, self.config.base.drift_ppm_max)
    }
}
