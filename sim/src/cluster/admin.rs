//! Admin faults: fenced force-release, listings, and the admin replies they are checked against.

use super::*;

/// An operator's force-release as drawn: the grant's keys, the key named,
/// the token named (the holder's, or a stale one), and whether the leader
/// is isolated right after.
struct ForceReleaseOrder {
    keys: Vec<usize>,
    key: usize,
    token: u64,
    stale: bool,
    isolate: bool,
}

impl<'t> ClusterWorld<'t> {
    /// The operator orders a force-release on the leader: of a key its
    /// applied state shows held, naming the holder's token, or (a quarter
    /// of the time) a stale token, which must change nothing; in a third of
    /// them the leader is isolated right after, so the command may commit
    /// across a leader change or end indeterminate. The history gets the
    /// operator's release of that token on every key of the grant.
    pub(super) fn fault_force_release(&mut self) {
        let Some(slot) = self.leader_slot() else {
            return;
        };
        let Some(held) = self.applied_grants(slot) else {
            return;
        };
        self.check_listing(slot, &held);
        if held.is_empty() {
            return;
        }
        let order = self.draw_force_release(&held);
        let id = self.open_force_release(slot, &order);
        self.send_force_release(slot, id, order.key, order.token);
        if order.isolate {
            self.isolate(
                slot,
                format!("leader {slot} isolated after a force-release"),
            );
        }
    }

    /// The grants in node `slot`'s applied state, by token, with their
    /// keys; none if the node is down.
    fn applied_grants(&self, slot: u8) -> Option<Vec<(u64, Vec<usize>)>> {
        let node = self.nodes[usize::from(slot)].node.as_ref()?;
        let held = node
            .lock_state()
            .grants()
            .map(|(token, holding)| {
                let keys = holding
                    .keys
                    .keys()
                    .iter()
                    .map(|key| key_index(key.as_bytes()))
                    .collect();
                (token, keys)
            })
            .collect();
        Some(held)
    }

    /// Draws which of the `held` grants (not empty) the operator names,
    /// which of its keys, whether with a stale token, and whether the
    /// leader is isolated after; all from the force-release stream.
    fn draw_force_release(&mut self, held: &[(u64, Vec<usize>)]) -> ForceReleaseOrder {
        let (holder, keys) = held[self.force_rng.index(held.len())].clone();
        let key = keys[self.force_rng.index(keys.len())];
        let stale = self.force_rng.chance(250_000);
        // A stale token: one issued before the holder's, which no longer
        // holds this key (tokens only grow).
        let token = if stale {
            holder.saturating_sub(1 + self.force_rng.below(3))
        } else {
            holder
        };
        let isolate = self.force_rng.chance(330_000);
        ForceReleaseOrder {
            keys,
            key,
            token,
            stale,
            isolate,
        }
    }

    /// Counts and notes the force-release `order` to the leader in `slot`,
    /// opens its history entries and exemptions, and records it as awaiting
    /// its answer; returns its request id.
    fn open_force_release(&mut self, slot: u8, order: &ForceReleaseOrder) -> u64 {
        let ForceReleaseOrder {
            ref keys,
            key,
            token,
            stale,
            isolate,
        } = *order;
        let id = self.next_admin_id;
        self.next_admin_id += 1;
        self.rec.report.faults += 1;
        self.rec.report.cluster_force_releases += 1;
        self.note(|| {
            format!(
                "FAULT operator force-releases {} token {token} on leader {slot} (request {id}{})",
                ALL_KEYS[key],
                if isolate { ", then isolates it" } else { "" }
            )
        });
        // The operator's release of `token` on every key it may free.
        let names: Vec<&str> = if stale {
            vec![ALL_KEYS[key]]
        } else {
            keys.iter().map(|&k| ALL_KEYS[k]).collect()
        };
        let key_set = KeySet::new(&names).expect("sim keys are valid");
        let silent = self.config.plant == Some(ClusterPlant::SilentForceRelease);
        let hist = if silent {
            Vec::new()
        } else {
            self.history.open(
                self.now_us,
                &key_set,
                LinOp::ForceReleaseIndeterminate { token },
            )
        };
        if !stale && !silent {
            // A stale token holds nothing this command can free.
            self.force_requested.insert(token);
            self.exempt_force_released(token);
        }
        let inc = self.nodes[usize::from(slot)].inc;
        self.admin_pending.insert(
            id,
            AdminOp {
                slot,
                inc,
                token,
                hist,
            },
        );
        id
    }

    /// Hands force-release `id` of `key` with `token` to the node in
    /// `slot`, and steps it.
    fn send_force_release(&mut self, slot: u8, id: u64, key: usize, token: u64) {
        let now = self.node_now(slot);
        let request = ForceRelease {
            key: Key::new(ALL_KEYS[key].as_bytes()).expect("sim keys are valid"),
            token: Some(token),
        };
        if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
            node.handle_force_release(now, AdminRequestId(id), request);
        }
        self.node_step(slot, None);
    }

    /// The operator lists the leader's locks as the admin API does, page
    /// by page of three: every key its applied state holds (`held`, by
    /// token) must be listed exactly once with that token, and no key
    /// twice. Read-only and draws nothing from the run's random streams,
    /// so a run's trace is the same with or without it.
    pub(super) fn check_listing(&mut self, slot: u8, held: &[(u64, Vec<usize>)]) {
        let now = self.node_now(slot);
        let Some(node) = self.nodes[usize::from(slot)].node.as_ref() else {
            return;
        };
        let mut listed: BTreeMap<usize, Vec<Option<u64>>> = BTreeMap::new();
        let mut cursor = Some(ListingCursor::START);
        let mut wrong = Vec::new();
        for _ in 0..=ALL_KEYS.len() * 2 + 2 {
            let Some(at) = cursor else {
                break;
            };
            let Ok(page) = node.locks(now, b"", 3, at) else {
                // Not a caught-up leader: it answers no listing.
                return;
            };
            for view in page.locks {
                listed
                    .entry(key_index(view.key.as_bytes()))
                    .or_default()
                    .push(view.holder.map(|holder| holder.token));
            }
            cursor = page.next;
        }
        if cursor.is_some() {
            wrong.push("the scan did not end".to_owned());
        }
        for (token, keys) in held {
            for &key in keys {
                match listed.get(&key).map(Vec::as_slice) {
                    Some([Some(shown)]) if shown == token => {}
                    other => wrong.push(format!(
                        "{} held by {token} listed as {other:?}",
                        ALL_KEYS[key]
                    )),
                }
            }
        }
        for (key, seen) in &listed {
            if seen.len() > 1 {
                wrong.push(format!("{} listed {} times", ALL_KEYS[*key], seen.len()));
            }
        }
        for detail in wrong {
            self.violation(
                Checker::ServerState,
                format!("leader {slot}'s listing: {detail}"),
            );
        }
    }

    /// Grant `token` may end without its holder knowing: its validity
    /// window and its fenced writes are judged in an era of their own.
    pub(super) fn exempt_force_released(&mut self, token: u64) {
        let era = force_released_era(token);
        if let Some(info) = self.grants.get_mut(&token) {
            info.era = era;
        }
        for proc in &mut self.clients {
            for op in proc.ops.values_mut() {
                if let OpState::Holding { grant, era: e, .. } = op
                    && grant.token == token
                {
                    *e = era;
                }
            }
        }
    }

    /// The answers to force-releases a node has: each resolves the
    /// operator's history entries as the answer says.
    pub(super) fn resolve_admin_replies(
        &mut self,
        slot: u8,
        answers: Vec<(AdminRequestId, ForceReleaseOutcome)>,
    ) {
        let s = usize::from(slot);
        let inc = self.nodes[s].inc;
        for (AdminRequestId(id), outcome) in answers {
            let Some(op) = self.admin_pending.remove(&id) else {
                self.violation(
                    Checker::Replies,
                    format!("node {slot} answered force-release {id} twice or unasked"),
                );
                continue;
            };
            if (op.slot, op.inc) != (slot, inc) {
                self.violation(
                    Checker::Replies,
                    format!(
                        "node {slot} answered force-release {id} sent to node {}",
                        op.slot
                    ),
                );
                continue;
            }
            self.note(|| format!("node {slot} answers force-release {id}: {outcome:?}"));
            let token = op.token;
            let bucket = match outcome {
                ForceReleaseOutcome::Released { .. } => 0,
                ForceReleaseOutcome::Indeterminate => 1,
                ForceReleaseOutcome::NotHeld | ForceReleaseOutcome::TokenMismatch { .. } => 2,
                ForceReleaseOutcome::NotLeader { .. } | ForceReleaseOutcome::Busy => 3,
            };
            self.rec.report.force_outcomes[bucket] += 1;
            match outcome {
                ForceReleaseOutcome::Released {
                    revoked, handed_to, ..
                } => {
                    if handed_to.is_some_and(|next| next <= revoked) {
                        self.violation(
                            Checker::Tokens,
                            format!("force-release of {revoked} handed over to {handed_to:?}"),
                        );
                    }
                    if revoked != token {
                        self.violation(
                            Checker::Replies,
                            format!("force-release of token {token} revoked {revoked}"),
                        );
                    }
                    self.history
                        .resolve(self.now_us, &op.hist, |_| LinOp::ForceReleased { token });
                }
                ForceReleaseOutcome::NotHeld | ForceReleaseOutcome::TokenMismatch { .. } => {
                    self.history
                        .resolve(self.now_us, &op.hist, |_| LinOp::NotFound { token });
                }
                // It may still take effect: the entry stays open.
                ForceReleaseOutcome::Indeterminate => {}
                // Refused before proposing: no effect.
                ForceReleaseOutcome::NotLeader { .. } | ForceReleaseOutcome::Busy => {
                    self.history.forget(&op.hist);
                }
            }
        }
    }
}
