//! Losing a majority and recovering the fencing domain under the same identity.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Every node crashes at once: the committed state is gone but for the
    /// slots' token floors. The grants any node held end as an operator's
    /// force-release would end them (their holders' later writes are
    /// fenced); the operator recovers the cluster later.
    pub(super) fn fault_majority_loss(&mut self) {
        // What the most advanced applied state holds: a lagging node may
        // still show grants released since.
        let mut held: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let newest = self
            .nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .max_by_key(|node| node.raft().applied_index());
        if let Some(node) = newest {
            for (token, holding) in node.lock_state().grants() {
                let keys = holding
                    .keys
                    .keys()
                    .iter()
                    .map(|key| key_index(key.as_bytes()))
                    .collect();
                held.insert(token, keys);
            }
        }
        self.rec.report.faults += 1;
        self.rec.report.cluster_majority_losses += 1;
        self.note(|| {
            format!(
                "FAULT every node crashes: a majority loss ({} grants end)",
                held.len()
            )
        });
        for (token, keys) in held {
            let names: Vec<&str> = keys.iter().map(|&k| ALL_KEYS[k]).collect();
            let key_set = KeySet::new(&names).expect("sim keys are valid");
            let hist = self.history.open(
                self.now_us,
                &key_set,
                LinOp::ForceReleaseIndeterminate { token },
            );
            self.history
                .resolve(self.now_us, &hist, |_| LinOp::ForceReleased { token });
            self.force_requested.insert(token);
            self.exempt_force_released(token);
        }
        // Answers to force-releases in flight never come.
        self.admin_pending.clear();
        for slot in 0..self.n {
            if self.nodes[usize::from(slot)].node.is_some() {
                self.crash_node_quietly(slot);
            }
        }
        self.lost = true;
        let at = self.now_us + self.fault_rng.range(200_000, 3_000_000);
        self.schedule(at, Ev::Recover);
    }

    /// `serve --recover` on every slot: the core decides each node's token
    /// floor from the slot's stored floor and a clock an hour behind, and
    /// the nodes bootstrap in the recovery generation under the same
    /// identity. Raft starts over (terms and indices from 1), so the Raft
    /// oracle does too.
    pub(super) fn recover(&mut self) {
        self.lost = false;
        self.leaders.clear();
        self.committed.clear();
        self.entries.clear();
        self.states.clear();
        self.note(|| "the operator recovers the cluster (--recover on every slot)".into());
        for slot in 0..self.n {
            let s = usize::from(slot);
            let wall = WALL_EPOCH_US + self.nodes[s].clock.local(self.now_us);
            let facts = RecoveryFacts {
                slot_count: self.n,
                self_slot: slot,
                stored_floor: self.nodes[s].floor,
                explicit_floor: None,
                peers: Vec::new(),
                wall_clock: ticketing_core::time::Duration::from_micros(
                    wall.saturating_sub(RECOVERY_CLOCK_BACK_US),
                ),
            };
            let plan = match recovery::decide_recovery(&facts) {
                Ok(mut plan) if self.config.plant == Some(ClusterPlant::RecoverFromClock) => {
                    plan.token_floor = wall.saturating_sub(RECOVERY_CLOCK_BACK_US);
                    plan
                }
                Ok(plan) => plan,
                Err(refusal) => {
                    self.violation(Checker::ServerState, format!("recovery refused: {refusal}"));
                    continue;
                }
            };
            self.nodes[s].inc += 1;
            let seed = self.net.next_u64();
            let mode = StartMode::Recover {
                token_floor: plan.token_floor,
            };
            self.start_node(slot, mode, seed);
        }
    }
}
