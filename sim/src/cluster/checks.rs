//! Checkers run after every event: Raft, lock state, replies, fencing.

use ticketing_core::raft::Raft;

use super::*;

/// What one pass of the Raft checks found over every node. It is reported
/// once the pass is over and no node is borrowed, in this order: the
/// violations, the trace notes, then the lock checks of the nodes whose
/// applied index moved.
#[derive(Default)]
struct RaftFindings {
    found: Vec<(Checker, String)>,
    notes: Vec<String>,
    changed: Vec<u8>,
}

/// A node's applied lock state, read in one pass: the token holding each
/// key, and the grants above the highest token checked on that node.
struct AppliedLocks {
    holders: Vec<Option<u64>>,
    /// (token, keys, lease) of each grant new to this node, by token.
    fresh: Vec<(u64, Vec<usize>, u32)>,
}

impl<'t> ClusterWorld<'t> {
    /// Raft and lock-state checks over every running node.
    pub(super) fn check_cluster(&mut self) {
        if self
            .nodes
            .iter()
            .any(|proc| proc.node.as_ref().is_some_and(|node| node.is_leader()))
        {
            self.last_leader_us = self.now_us;
        }
        let mut findings = RaftFindings::default();
        for slot in 0..self.n {
            self.check_node_raft(slot, &mut findings);
        }
        let RaftFindings {
            found,
            notes,
            changed,
        } = findings;
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

    /// The Raft checks of node `slot`: a new incarnation, its view of the
    /// leader, one leader per term; and once its log, commit or applied
    /// index moved, its commit index, log and replicated state against
    /// every other node's.
    fn check_node_raft(&mut self, slot: u8, findings: &mut RaftFindings) {
        let tracing = self.rec.tracing();
        let proc = &mut self.nodes[usize::from(slot)];
        let Some(node) = proc.node.as_ref() else {
            return;
        };
        if node.checking_genesis() {
            // A bootstrap member still checking that the cluster is new
            // belongs to no Raft group yet: it steps nothing, and its
            // log is only its own bootstrap entry, which after a
            // recovery is not the running cluster's (a mistaken
            // `--bootstrap` names generation 1's voters).
            return;
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
            findings
                .notes
                .push(format!("node {slot} rejoins as {id:?}"));
        }
        note_leader_change(&mut proc.known_leader, raft, tracing, &mut findings.notes);
        check_one_leader_per_term(&mut self.leaders, raft, &mut findings.found);
        let commit = raft.commit_index();
        let last = raft.last_index();
        let mark = (
            last,
            raft.term_at(last).unwrap_or(0),
            commit,
            raft.applied_index(),
        );
        if mark == proc.checked {
            return;
        }
        if mark.3 != proc.checked.3 {
            findings.changed.push(slot);
        }
        proc.checked = mark;
        if commit < proc.commit_seen {
            findings.found.push((
                Checker::Raft,
                format!(
                    "{id:?} commit index went back from {} to {commit}",
                    proc.commit_seen
                ),
            ));
        }
        check_log_matching(
            &mut self.entries,
            &mut self.committed,
            raft,
            proc.commit_seen,
            &mut findings.found,
        );
        check_replicated_state(&mut self.states, node, &mut findings.found);
        proc.commit_seen = proc.commit_seen.max(commit);
    }

    /// A node's applied lock state: tokens only grow; a key changes holder
    /// only once the old holder released it, was a ghost, never reached a
    /// client, or ran out of lease.
    pub(super) fn check_locks(&mut self, slot: u8) {
        let Some(applied) = self.applied_locks(slot) else {
            return;
        };
        let mut found = Vec::new();
        self.check_fresh_grants(slot, applied.fresh, &mut found);
        self.check_holder_changes(slot, &applied.holders, &mut found);
        for (checker, detail) in found {
            self.violation(checker, detail);
        }
    }

    /// Node `slot`'s applied lock state as the lock checks read it; none
    /// if the node is down.
    fn applied_locks(&self, slot: u8) -> Option<AppliedLocks> {
        let proc = &self.nodes[usize::from(slot)];
        let node = proc.node.as_ref()?;
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
            if token > proc.token_max {
                fresh.push((token, keys, holding.lease_ms));
            }
        }
        Some(AppliedLocks { holders, fresh })
    }

    /// Grants new to node `slot`: one that another node applied must name
    /// the same keys and lease; one new to the cluster must be above every
    /// earlier token, and is remembered for the holder-change checks.
    fn check_fresh_grants(
        &mut self,
        slot: u8,
        fresh: Vec<(u64, Vec<usize>, u32)>,
        found: &mut Vec<(Checker, String)>,
    ) {
        let s = usize::from(slot);
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
    }

    /// Every key of node `slot` whose holder changed since the last check
    /// must have been free to change hands; `holders` become the new shadow.
    fn check_holder_changes(
        &mut self,
        slot: u8,
        holders: &[Option<u64>],
        found: &mut Vec<(Checker, String)>,
    ) {
        let s = usize::from(slot);
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let old = self.nodes[s].shadow[key];
            let new = holders[key];
            if let (Some(old), Some(new)) = (old, new)
                && old != new
                && !self.grant_may_end(old)
            {
                found.push((
                    Checker::ServerState,
                    format!("{name} passed from {old} to {new} on node {slot}: two live holders"),
                ));
            }
            self.nodes[s].shadow[key] = new;
        }
    }

    /// Whether grant `token` may have ended by now, so its keys may go to
    /// another holder: its lease ran out (or belongs to an earlier era), or
    /// its holder or an operator asked for its release, or no client ever
    /// got it (a ghost, or never replied).
    fn grant_may_end(&self, token: u64) -> bool {
        let info = self.grants.get(&token);
        let lease_over = info.is_none_or(|info| {
            info.era != self.lease_era
                || self.now_us
                    >= info.first_applied_us + self.lease_min_us(u64::from(info.lease_ms) * 1_000)
        });
        lease_over
            || self.release_requested.contains(&token)
            || self.force_requested.contains(&token)
            || self.ghosts.contains(&token)
            || !self.replied.contains(&token)
    }

    /// The shortest true duration of a lease of `lease_us` on a node clock
    /// that may run fast by the drift bound.
    pub(super) fn lease_min_us(&self, lease_us: u64) -> u64 {
        crate::clock::lease_min_us(lease_us, self.config.base.drift_ppm_max)
    }
}

/// Adds a trace note when a node's term, leader or configuration changed
/// since it was last seen (`known`, updated); the note is formatted only
/// when tracing.
fn note_leader_change(
    known: &mut (u64, Option<NodeId>, Configuration),
    raft: &Raft,
    tracing: bool,
    notes: &mut Vec<String>,
) {
    let now = (raft.term(), raft.leader(), raft.config());
    if (now.0, now.1, now.2) == (known.0, known.1, &known.2) {
        return;
    }
    *known = (now.0, now.1, now.2.clone());
    if tracing {
        notes.push(format!(
            "{:?} term {}: leader {:?}, {:?}, commit {}, voters {:?}, learners {:?}",
            raft.id(),
            now.0,
            now.1,
            raft.role(),
            raft.commit_index(),
            raft.config().voters,
            raft.config().learners,
        ));
    }
}

/// Election safety: at most one leader per term across the cluster
/// (`leaders` remembers the first leader seen in each term).
fn check_one_leader_per_term(
    leaders: &mut HashMap<u64, NodeId>,
    raft: &Raft,
    found: &mut Vec<(Checker, String)>,
) {
    if !raft.is_leader() {
        return;
    }
    let id = raft.id();
    match leaders.get(&raft.term()) {
        Some(other) if *other != id => found.push((
            Checker::Raft,
            format!("two leaders in term {}: {other:?} and {id:?}", raft.term()),
        )),
        Some(_) => {}
        None => {
            leaders.insert(raft.term(), id);
        }
    }
}

/// Log matching over every entry this node has from just below the commit
/// index it had reached: one entry per (index, term) across the cluster
/// (`entries`), and one per committed index (`committed`).
fn check_log_matching(
    entries: &mut HashMap<(u64, u64), u64>,
    committed: &mut HashMap<u64, u64>,
    raft: &Raft,
    commit_seen: u64,
    found: &mut Vec<(Checker, String)>,
) {
    let id = raft.id();
    let commit = raft.commit_index();
    let from = raft.first_index().max(commit_seen.saturating_sub(1)).max(1);
    for index in from..=raft.last_index() {
        let Some(entry) = raft.entry(index) else {
            continue;
        };
        let h = hash_of(entry);
        if *entries.entry((index, entry.term)).or_insert(h) != h {
            found.push((
                Checker::Raft,
                format!(
                    "{id:?} has another entry at index {index} term {}",
                    entry.term
                ),
            ));
        }
        if index <= commit && *committed.entry(index).or_insert(h) != h {
            found.push((
                Checker::Raft,
                format!("{id:?} committed another entry at index {index}"),
            ));
        }
    }
}

/// State machine safety: every node that applied up to the same index has
/// the same replicated state (`states`, a hash per applied index).
fn check_replicated_state(
    states: &mut HashMap<u64, u64>,
    node: &ClusterNode,
    found: &mut Vec<(Checker, String)>,
) {
    let raft = node.raft();
    let view = node.lock_state().replicated_view();
    let applied = raft.applied_index();
    let h = hash_of(&view);
    if *states.entry(applied).or_insert(h) != h {
        found.push((
            Checker::Raft,
            format!(
                "{:?} has another replicated state at applied index {applied}",
                raft.id()
            ),
        ));
    }
}
