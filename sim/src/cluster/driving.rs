//! How the shared driver runs the cluster world: dispatch, faults per event, and the end checks.

use super::*;

impl<'t> SimWorld<'t> for ClusterWorld<'t> {
    type Ev = Ev;

    fn marker(marker: Marker) -> Ev {
        match marker {
            Marker::FaultTick => Ev::FaultTick,
            Marker::EndSafety => Ev::EndSafety,
            Marker::End => Ev::End,
        }
    }

    fn queue(&mut self) -> &mut Queue<Ev> {
        &mut self.queue
    }

    fn set_now(&mut self, now_us: u64) {
        self.now_us = now_us;
    }

    fn phase(&self) -> Phase {
        self.phase
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
    }

    fn recorder(&mut self) -> &mut Recorder<'t> {
        &mut self.rec
    }

    fn into_recorder(self) -> Recorder<'t> {
        self.rec
    }

    fn start_servers(&mut self) {
        for slot in 0..self.n {
            self.node_start(slot, true);
        }
    }

    fn start_client(&mut self, client: usize) {
        let at = self.work.below(200_000);
        for slot in 0..self.n {
            self.schedule_client(at, client, 0, ClientEv::Connect(slot));
        }
        // Give the cluster a moment to elect a first leader.
        let at = at + 500_000 + self.work.below(500_000);
        self.schedule_client(at, client, 0, ClientEv::StartOp);
    }

    fn hash_event(&mut self, next: &Scheduled<Ev>) {
        let (bytes, extra): (&[u8], u64) = match &next.ev {
            Ev::Deliver { pipe, bytes, .. } | Ev::Flush { pipe, bytes, .. } => {
                (bytes, pipe ^ ((bytes.len() as u64) << 32))
            }
            Ev::DialArrive { pipe }
            | Ev::DialAnswer { pipe, .. }
            | Ev::ClientConnectArrive { pipe }
            | Ev::AdversaryArrive { pipe }
            | Ev::AdversaryFinish { pipe }
            | Ev::SeesClose { pipe, .. } => (&[], *pipe),
            Ev::NodeTimer { slot, .. } | Ev::NodeRestart { slot } => (&[], u64::from(*slot)),
            Ev::Client(call) => (&[], call.hash_extra()),
            _ => (&[], 0),
        };
        self.rec
            .event(next.at_us, next.ev.code(), bytes, extra, &TraceEv(&next.ev));
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::NodeTimer {
                slot,
                inc,
                generation,
            } => {
                let now = self.node_now(slot);
                let proc = &mut self.nodes[usize::from(slot)];
                if proc.inc == inc && proc.timer_generation == generation {
                    proc.armed = None;
                    if let Some(node) = proc.node.as_mut() {
                        node.handle_timeout(now);
                    }
                    self.node_step(slot, None);
                }
            }
            Ev::NodeRestart { slot } => self.node_start(slot, false),
            Ev::Recover => self.recover(),
            Ev::DialArrive { pipe } => self.dial_arrive(pipe),
            Ev::DialAnswer { pipe, ok } => self.dial_answer(pipe, ok),
            Ev::ClientConnectArrive { pipe } => self.client_connect_arrive(pipe),
            Ev::AdversaryArrive { pipe } => self.adversary_arrive(pipe),
            Ev::AdversaryFinish { pipe } => self.adversary_finish(pipe),
            Ev::Deliver { pipe, dir, bytes } => self.deliver(pipe, dir, bytes),
            Ev::Flush {
                pipe,
                side,
                bytes,
                done,
                close,
            } => self.flush(pipe, side, bytes, done, close),
            Ev::SeesClose { pipe, side } => self.sees_close(pipe, side),
            Ev::Heal { id } => self.heal(id),
            Ev::Retransmit { pipe, dir } => self.retransmit(pipe, dir),
            Ev::Client(call) => self.client_event(call),
            Ev::FaultTick => self.fault_tick(),
            Ev::EndSafety => self.end_safety(),
            Ev::Probe => {
                if self.config.end_when_quiet && self.quiescent() {
                    // Everything resolved within the bound: the rest of the
                    // phase would only be heartbeats.
                    self.note(|| "everything resolved: the liveness phase ends early".into());
                    self.end_run();
                } else {
                    self.schedule(self.now_us + 1_000_000, Ev::Probe);
                }
            }
            Ev::End => self.end_run(),
        }
    }

    fn after_event(&mut self) {
        self.check_cluster();
    }

    fn inject_fault(&mut self) {
        self.maybe_adversary_relay();
        let force_ppm = self.config.faults.force_release_ppm;
        if force_ppm > 0 && self.force_rng.chance(force_ppm) {
            self.fault_force_release();
        }
        let loss_ppm = self.config.faults.majority_loss_ppm;
        if loss_ppm > 0 && !self.lost && self.loss_rng.chance(loss_ppm) {
            self.fault_majority_loss();
            return;
        }
        self.roll_fault();
    }

    fn after_safety(&mut self) {
        // The outsider leaves too.
        let conns: Vec<u64> = std::mem::take(&mut self.adversary.conns)
            .into_keys()
            .collect();
        for pipe_id in conns {
            self.close_transport(pipe_id);
        }
        let ids: Vec<u64> = self.partitions.keys().copied().collect();
        for id in ids {
            self.heal(id);
        }
        self.schedule(self.now_us + 1_000_000, Ev::Probe);
    }

    fn check_end(&mut self) {
        // An election may be running at any instant (a delay spike can
        // trip check-quorum), but not for long in a quiet cluster.
        if self.now_us > self.last_leader_us + 5_000_000 {
            let since = self.last_leader_us;
            self.violation(
                Checker::Liveness,
                format!("no leader since {since} µs at the end of the liveness phase"),
            );
        }
        if self.config.plant.is_none() && !self.replaced() {
            self.violation(
                Checker::Liveness,
                "restarted nodes have not replaced their old generations by the end".into(),
            );
        }
        if !self.clients_resolved(false) {
            return;
        }
        let open_pending = self
            .pending
            .keys()
            .find(|(pipe, _)| self.pipes.get(pipe).is_some_and(|p| !p.tcp.reset))
            .copied();
        if let Some((pipe, rid)) = open_pending {
            self.violation(
                Checker::Liveness,
                format!("no node answered pipe {pipe} rid {rid}"),
            );
        }
        for proc in &self.nodes {
            if let Some(node) = proc.node.as_ref()
                && node.stats().waiters > 0
            {
                let detail = format!(
                    "{:?}: {} waiters still queued at the end",
                    node.id(),
                    node.stats().waiters
                );
                self.violation(Checker::Liveness, detail);
                return;
            }
        }
    }

    fn trivial_op(op: &LinOp) -> bool {
        // Keys that saw nothing but lease cuts are not checked.
        matches!(op, LinOp::LeaseCut { .. })
    }

    fn server_clock(&mut self, which: u8) -> &mut Clock {
        &mut self.nodes[usize::from(which)].clock
    }

    fn lease_era(&mut self) -> &mut u64 {
        &mut self.lease_era
    }

    fn wake_server(&mut self, which: u8) {
        let now = self.node_now(which);
        if let Some(node) = self.nodes[usize::from(which)].node.as_mut() {
            node.handle_timeout(now);
            self.nodes[usize::from(which)].armed = None;
        }
        self.node_step(which, None);
    }
}
