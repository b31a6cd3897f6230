//! Nodes: configuration, start, crash, and stepping a node's machine.

use super::*;

impl<'t> ClusterWorld<'t> {
    pub(super) fn node_config(&self, slot: u8, generation: u64) -> ClusterConfig {
        let local = self.nodes[usize::from(slot)].clock.local(self.now_us);
        let tokens = PeerTokens::new([PEER_TOKEN]).expect("sim token is long enough");
        let mut config = ClusterConfig::new(
            FINGERPRINT,
            NodeId::new(slot, generation),
            self.n,
            tokens,
            WALL_EPOCH_US + local,
        );
        config.raft = RaftConfig::fast();
        config.peer_silence_timeout =
            ticketing_core::cluster::default_peer_silence_timeout(&config.raft);
        config.limits = Limits {
            keys_max: self.config.base.keys_max,
            waiters_per_key_max: self.config.base.waiters_per_key_max,
            waiters_total_max: self.config.base.waiters_total_max,
        };
        config.connections_max = 64;
        config.in_flight_per_connection_max = 64;
        config.client_addresses = (0..self.n).map(line_address).collect();
        // The daemon's token floor at start: above the stored one.
        if let Some(stored) = self.nodes[usize::from(slot)].floor {
            config.bootstrap_wall_clock_us = config.bootstrap_wall_clock_us.max(stored + 1);
        }
        config
    }

    /// Starts `slot`: a bootstrap member at time 0, else a new generation
    /// that joins (its old state is gone) — or, as an operator's mistake,
    /// a restart with `--bootstrap`, which the core must turn into a join.
    /// The generation is the core's start rule, as in the daemon.
    pub(super) fn node_start(&mut self, slot: u8, bootstrap: bool) {
        if self.lost || self.nodes[usize::from(slot)].node.is_some() {
            // A restart scheduled before a majority loss: the recovery
            // starts every slot.
            return;
        }
        let seed = self.net.next_u64();
        let now = self.node_now(slot);
        let amnesia = self.config.plant == Some(ClusterPlant::AmnesiacRestart);
        let mistaken_bootstrap =
            !bootstrap && !amnesia && self.fault_rng.chance(MISTAKEN_BOOTSTRAP_PPM);
        if !bootstrap {
            self.nodes[usize::from(slot)].inc += 1;
        }
        if amnesia && !bootstrap {
            // The planted driver bug restarts under generation 1 and skips
            // the core's check that would catch it.
            let voters = (0..self.n).map(|s| NodeId::new(s, BOOTSTRAP_GENERATION));
            let config = self.node_config(slot, BOOTSTRAP_GENERATION);
            let node = ClusterNode::bootstrap_unchecked(config, voters, seed, now);
            self.install_node(slot, node);
            return;
        }
        if mistaken_bootstrap {
            self.note(|| format!("FAULT node {slot} restarts with --bootstrap"));
        }
        let mode = if bootstrap || mistaken_bootstrap {
            StartMode::Bootstrap
        } else {
            StartMode::Join
        };
        self.start_node(slot, mode, seed);
    }

    /// Starts `slot` by the core's start rule from the facts the daemon
    /// would gather: the node's wall clock (an hour behind for a recovery)
    /// and, in worlds with majority
    /// losses (whose nodes keep state files), its token floor, made durable
    /// before the node runs.
    pub(super) fn start_node(&mut self, slot: u8, mode: StartMode, seed: u64) {
        let s = usize::from(slot);
        let now = self.node_now(slot);
        let mut wall_clock_us = WALL_EPOCH_US + self.nodes[s].clock.local(self.now_us);
        if matches!(mode, StartMode::Recover { .. }) {
            // The recovering operator's clocks are an hour behind, so only
            // the evidence (floors) can bound the earlier tokens.
            wall_clock_us = wall_clock_us.saturating_sub(RECOVERY_CLOCK_BACK_US);
        }
        let floor = self.floor_at_start(slot, wall_clock_us, mode);
        // The planted recovery from the clock alone ignores the state file.
        let from_clock_alone = matches!(mode, StartMode::Recover { .. })
            && self.config.plant == Some(ClusterPlant::RecoverFromClock);
        let facts = StartFacts {
            mode,
            wall_clock_us,
            floor_first_token: floor
                .as_ref()
                .filter(|_| !from_clock_alone)
                .map(|(first, _)| *first),
        };
        let config = self.node_config(slot, facts.generation());
        let node = ClusterNode::start(config, &facts, seed, now).expect("sim config is valid");
        let node = match floor {
            Some((_, reserve)) => node.with_token_reserve(reserve),
            None => node,
        };
        self.install_node(slot, node);
    }

    /// With majority losses, the slot's durable token floor at a start, as
    /// the daemon's state file gives it: the first token it allows (above
    /// the clock, the stored floor and a recovery's floor) and the reserve
    /// above it, made durable now.
    fn floor_at_start(
        &mut self,
        slot: u8,
        wall_clock_us: u64,
        mode: StartMode,
    ) -> Option<(u64, TokenReserve)> {
        if self.config.faults.majority_loss_ppm == 0 {
            return None;
        }
        let s = usize::from(slot);
        let now = self.node_now(slot);
        let stored = self.nodes[s].floor;
        let mut reserve = TokenReserve::new(SIM_RESERVE_STEP, stored);
        let recovery_floor = match mode {
            StartMode::Recover { token_floor } => token_floor,
            StartMode::Join | StartMode::Bootstrap => 0,
        };
        // The daemon's rule for the state file's first token, then a
        // recovery's floor above it.
        let since_epoch = ticketing_core::time::Duration::from_micros(wall_clock_us);
        let first = ticketing_core::server::first_token(since_epoch, stored).max(recovery_floor);
        if let Some(value) = reserve.poll_persist(now, first) {
            self.nodes[s].floor = Some(value);
            reserve.handle_persisted(value);
        }
        Some((first, reserve))
    }

    /// Runs `node` in `slot`, checked as a new incarnation.
    pub(super) fn install_node(&mut self, slot: u8, node: ClusterNode) {
        let generation = node.id().generation;
        let proc = &mut self.nodes[usize::from(slot)];
        proc.generation = generation;
        proc.incarnation = Some(node.id());
        proc.node = Some(node);
        proc.conns.clear();
        proc.armed = None;
        proc.commit_seen = 0;
        proc.token_max = 0;
        proc.checked = (0, 0, 0, 0);
        proc.shadow = vec![None; ALL_KEYS.len()];
        self.note(|| format!("node {slot} starts, generation {generation}"));
        self.node_step(slot, None);
    }

    pub(super) fn crash_node(&mut self, slot: u8) {
        let proc = &self.nodes[usize::from(slot)];
        let generation = proc.incarnation.map_or(proc.generation, |id| id.generation);
        self.note(|| format!("FAULT node {slot} generation {generation} crashes"));
        self.crash_node_quietly(slot);
        let at = self.now_us + self.fault_rng.range(200_000, 3_000_000);
        self.schedule(at, Ev::NodeRestart { slot });
    }

    /// Node `slot` crashes with no restart of its own (a majority loss:
    /// the recovery starts it).
    pub(super) fn crash_node_quietly(&mut self, slot: u8) {
        let proc = &mut self.nodes[usize::from(slot)];
        let inc = proc.inc;
        proc.node = None;
        proc.conns.clear();
        proc.armed = None;
        let pipes: Vec<u64> = self.pipes.keys().copied().collect();
        for pipe_id in pipes {
            let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                continue;
            };
            let mut hit = false;
            for side in 0..2u8 {
                if pipe.node_at(side) == Some((slot, inc)) {
                    pipe.open[usize::from(side)] = false;
                    hit = true;
                }
            }
            if hit {
                self.reset_pipe(pipe_id);
            }
        }
    }

    pub(super) fn node_alive(&self, slot: u8, inc: u64) -> bool {
        let proc = &self.nodes[usize::from(slot)];
        proc.inc == inc && proc.node.is_some()
    }

    /// The node's events: the latest one of each kind names the state the
    /// node is in now (they are queued as changes happen, not sampled).
    /// Not part of the trace.
    pub(super) fn check_node_events(&mut self, slot: u8, events: Vec<NodeEvent>) {
        let Some(node) = self.nodes[usize::from(slot)].node.as_ref() else {
            return;
        };
        let (mut leader, mut voter, mut generation) = (None, None, None);
        for event in events {
            match event {
                NodeEvent::LeaderChanged { leader: l, .. } => leader = Some(l),
                NodeEvent::VoterChanged { is_voter } => voter = Some(is_voter),
                NodeEvent::GenerationChanged { generation: g } => generation = Some(g),
                NodeEvent::PeerFramesRefused { .. }
                | NodeEvent::RaftMessagesRefused { .. }
                | NodeEvent::RecoveryEvidence { .. } => {}
            }
        }
        let mut wrong = Vec::new();
        if leader.is_some_and(|l| l != node.leader()) {
            wrong.push(format!("leader {leader:?}, node has {:?}", node.leader()));
        }
        if voter.is_some_and(|v| v != node.raft().is_voter()) {
            wrong.push(format!(
                "voter {voter:?}, node has {}",
                node.raft().is_voter()
            ));
        }
        if generation.is_some_and(|g| g != node.id().generation) {
            wrong.push(format!("generation {generation:?}, node has {}", node.id()));
        }
        for detail in wrong {
            self.violation(Checker::Raft, format!("node {slot} reported {detail}"));
        }
    }

    /// Everything node `slot` emits now, by kind; its alerts and reports
    /// go to the notes (not part of the trace).
    pub(super) fn drain_node_outputs(&mut self, slot: u8) -> NodeOutputs {
        let s = usize::from(slot);
        let now = self.node_now(slot);
        let mut outputs = NodeOutputs::default();
        let mut noted = Vec::new();
        let mut persisted = 0;
        if let Some(node) = self.nodes[s].node.as_mut() {
            while let Some(output) = node.poll_output(now) {
                match output {
                    Output::Wake(id) => outputs.woken.push(id),
                    Output::Dial { slot: target } => outputs.dials.push(target),
                    Output::AdminReply { id, outcome } => outputs.admin.push((id, outcome)),
                    Output::Node(event) => outputs.events.push(event),
                    // Formatted only when tracing.
                    Output::Alert(_) | Output::Log(_) => noted.push(output),
                    // Durable at once (only nodes with a floor ask).
                    Output::Reserve { value } => {
                        persisted = persisted.max(value);
                        node.handle_reserve_persisted(now, value);
                    }
                }
            }
        }
        if persisted > 0 {
            let floor = &mut self.nodes[s].floor;
            *floor = Some(floor.map_or(persisted, |f| f.max(persisted)));
        }
        for output in noted {
            self.note(|| format!("node {slot}: {output:?}"));
        }
        outputs
    }

    /// After any node input: admin answers, events, dials, transmits, timer.
    pub(super) fn node_step(&mut self, slot: u8, retake: Option<ConnId>) {
        let NodeOutputs {
            admin,
            events,
            dials,
            mut woken,
        } = self.drain_node_outputs(slot);
        self.resolve_admin_replies(slot, admin);
        self.check_node_events(slot, events);
        let s = usize::from(slot);
        let inc = self.nodes[s].inc;
        if self.nodes[s].node.is_none() {
            return;
        }
        woken.extend(retake);
        woken.sort();
        woken.dedup();
        for target in dials {
            let pipe = self.new_pipe(Opener::Node { slot, inc }, target);
            self.note(|| format!("node {slot} dials {target} (pipe {pipe})"));
            let at = self.now_us + self.net_delay();
            self.schedule(at, Ev::DialArrive { pipe });
        }
        for id in woken {
            self.write_node_take(slot, inc, id);
        }
        self.arm_node_timer(slot, inc);
    }

    /// Takes what node `slot` (incarnation `inc`) queued on its connection
    /// `id`, shows client replies to the oracle, and schedules the write in
    /// parts; nothing while a take on that side is still being written.
    fn write_node_take(&mut self, slot: u8, inc: u64, id: ConnId) {
        let s = usize::from(slot);
        let Some(&pipe_id) = self.nodes[s].conns.get(&id) else {
            return;
        };
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        let side: u8 = if pipe.node_at(1) == Some((slot, inc)) && pipe.ids[1] == Some(id) {
            1
        } else {
            0
        };
        if pipe.writing[usize::from(side)] {
            // One take at a time, as in the runtimes; retaken after
            // the flush.
            return;
        }
        let mut out = Vec::new();
        let node = self.nodes[s].node.as_mut().expect("node_step checked");
        let state = node.poll_transmit(id, &mut out);
        if state == ConnState::Gone {
            return;
        }
        let close = state == ConnState::CloseAfterFlush;
        if out.is_empty() && !close {
            return;
        }
        if self.pipes[&pipe_id].client() {
            self.observe_replies(slot, pipe_id, &out);
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.writing[usize::from(side)] = true;
        let partial_ppm = self.config.base.faults.partial_write_ppm;
        for part in net::write_parts(&mut self.net, self.now_us, partial_ppm, out) {
            self.schedule(
                part.at_us,
                Ev::Flush {
                    pipe: pipe_id,
                    side,
                    bytes: part.bytes,
                    done: part.done,
                    close: close && part.done,
                },
            );
        }
    }

    /// Re-arms node `slot`'s timer when its next deadline changed: a new
    /// timer generation, so the old timer event does nothing.
    fn arm_node_timer(&mut self, slot: u8, inc: u64) {
        let proc = &mut self.nodes[usize::from(slot)];
        let Some(node) = proc.node.as_ref() else {
            return;
        };
        let deadline = node.poll_timeout();
        if deadline == proc.armed {
            return;
        }
        proc.armed = deadline;
        if let Some(deadline) = deadline {
            proc.timer_generation += 1;
            let generation = proc.timer_generation;
            let at = proc.clock.true_at(deadline.as_micros()).max(self.now_us);
            self.schedule(
                at,
                Ev::NodeTimer {
                    slot,
                    inc,
                    generation,
                },
            );
        }
    }
}
