//! Faults chosen per event.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Whether crashing `slot` (losing its state) leaves, in every
    /// configuration some running node holds (any of them may be the one
    /// in effect), a quorum of voters that still have their state. A
    /// bootstrap member still checking that the cluster is new is no such
    /// voter: it may yet join as a new generation and leave its generation
    /// 1 behind, like a restart.
    pub(super) fn crash_is_survivable(&self, slot: u8) -> bool {
        self.nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .map(|node| node.raft().config())
            .filter(|config| !config.voters.is_empty())
            .all(|config| {
                let healthy = config
                    .voters
                    .iter()
                    .filter(|id| {
                        let proc = &self.nodes[usize::from(id.slot)];
                        id.slot != slot
                            && proc
                                .node
                                .as_ref()
                                .is_some_and(|node| node.id() == **id && !node.checking_genesis())
                    })
                    .count();
                healthy >= config.quorum()
            })
    }

    /// The outsider forgets taps of closed pipes and, with room for two
    /// more connections, may open a relay (its own stream).
    pub(super) fn maybe_adversary_relay(&mut self) {
        let relay_ppm = self.adversary.rates.relay_ppm;
        if relay_ppm == 0 {
            return;
        }
        let pipes = &self.pipes;
        self.adversary
            .taps
            .retain(|(pipe, _), _| pipes.contains_key(pipe));
        if self.adversary.conns.len() + 2 <= ADVERSARY_CONNS_MAX
            && self.adversary.rng.chance(relay_ppm)
        {
            self.adversary_relay();
        }
    }

    /// At most one fault of the fault stream's roll, each kind with its
    /// share of a million.
    pub(super) fn roll_fault(&mut self) {
        let faults = self.config.base.faults.clone();
        let cluster = self.config.faults.clone();
        let mut roll = FaultRoll::new(&mut self.fault_rng);
        let mut pick = |ppm: u32| roll.pick(ppm);
        if pick(faults.reset_ppm) {
            self.fault_reset_pipe();
        } else if pick(faults.client_crash_ppm) {
            self.fault_client_crash();
        } else if pick(cluster.node_crash_ppm) {
            self.fault_node_crash();
        } else if pick(cluster.partition_ppm) {
            self.fault_partition_minority();
        } else if pick(cluster.one_way_ppm) {
            self.fault_one_way_cut();
        } else if pick(cluster.isolate_leader_ppm) {
            self.fault_isolate_leader();
        } else if pick(cluster.node_clock_jump_ppm) {
            let slot = self.fault_rng.below(u64::from(self.n)) as u8;
            self.jump_server_clock(slot, |jump| {
                format!("FAULT node {slot} clock jumps {jump} µs forward")
            });
        } else if pick(faults.pause_ppm) {
            if let Some((client, pause)) = self.fault_pause() {
                self.note(|| format!("FAULT client {client} pauses {pause} µs"));
            }
        } else if pick(faults.clock_jump_ppm) {
            self.fault_client_clock_jump();
        }
    }

    /// Resets a pipe not reset yet, if any.
    fn fault_reset_pipe(&mut self) {
        let live: Vec<u64> = self
            .pipes
            .iter()
            .filter(|(_, pipe)| !pipe.tcp.reset)
            .map(|(&id, _)| id)
            .collect();
        if !live.is_empty() {
            let pipe = live[self.fault_rng.index(live.len())];
            self.rec.report.faults += 1;
            self.note(|| format!("FAULT reset pipe {pipe}"));
            self.reset_pipe(pipe);
        }
    }

    /// Crashes a running node, unless that would lose a quorum's state.
    fn fault_node_crash(&mut self) {
        let slot = self.fault_rng.below(u64::from(self.n)) as u8;
        // Losing the state of a majority of voters is unrecoverable by
        // design (docs/cluster.md); never crash into that.
        let amnesia = self.config.plant == Some(ClusterPlant::AmnesiacRestart);
        if self.nodes[usize::from(slot)].node.is_some()
            && (amnesia || self.crash_is_survivable(slot))
        {
            self.rec.report.faults += 1;
            self.crash_node(slot);
        }
    }

    /// Cuts a minority of the nodes (drawn until distinct) off from the
    /// rest, both ways.
    fn fault_partition_minority(&mut self) {
        let n = self.n;
        let size = self.fault_rng.range(1, u64::from(n / 2)) as usize;
        let mut minority = BTreeSet::new();
        while minority.len() < size {
            minority.insert(self.fault_rng.below(u64::from(n)) as u8);
        }
        let mut links = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if minority.contains(&a) != minority.contains(&b) {
                    links.push((a, b));
                }
            }
        }
        self.rec.report.faults += 1;
        self.partition(links, format!("{minority:?} | rest"));
    }

    /// Cuts the link from one node to another, one way only.
    fn fault_one_way_cut(&mut self) {
        let n = self.n;
        let from = self.fault_rng.below(u64::from(n)) as u8;
        let to = (from + 1 + self.fault_rng.below(u64::from(n) - 1) as u8) % n;
        self.rec.report.faults += 1;
        self.partition(vec![(from, to)], format!("{from} → {to} cut one way"));
    }

    /// Cuts the leader, if any, off from every other node.
    fn fault_isolate_leader(&mut self) {
        if let Some(leader) = self.leader_slot() {
            self.rec.report.faults += 1;
            self.isolate(leader, format!("leader {leader} isolated"));
        }
    }

    /// The slot of the first node (in slot order) that leads now, if any.
    pub(super) fn leader_slot(&self) -> Option<u8> {
        self.nodes
            .iter()
            .filter_map(|proc| proc.node.as_ref())
            .find(|node| node.is_leader())
            .map(|node| node.id().slot)
    }
}
