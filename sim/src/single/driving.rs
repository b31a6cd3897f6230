//! How the shared driver runs the single world: dispatch, faults per event, and the end checks.

use super::*;

impl<'t> SimWorld<'t> for World<'t> {
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
        self.schedule(0, Ev::ServerStart);
    }

    fn start_client(&mut self, client: usize) {
        let at = self.work.below(200_000);
        self.schedule_client(at, client, 0, ClientEv::Connect(0));
        let at = at + self.work.below(300_000);
        self.schedule_client(at, client, 0, ClientEv::StartOp);
    }

    fn hash_event(&mut self, next: &Scheduled<Ev>) {
        let (bytes, extra): (&[u8], u64) = match &next.ev {
            Ev::DeliverToServer { conn, bytes }
            | Ev::DeliverToClient { conn, bytes }
            | Ev::ServerFlush { conn, bytes, .. } => {
                // The bytes themselves: tokens, rids, nonces.
                (bytes, conn ^ ((bytes.len() as u64) << 32))
            }
            Ev::Client(call) => (&[], call.hash_extra()),
            Ev::ConnectArrive { conn }
            | Ev::ServerWritable { conn }
            | Ev::ServerSeesClose { conn }
            | Ev::ClientSeesClose { conn } => (&[], *conn),
            _ => (&[], 0),
        };
        self.rec
            .event(next.at_us, next.ev.code(), bytes, extra, &TraceEv(&next.ev));
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Client(call) => self.client_event(call),
            Ev::ConnectArrive { conn } => self.connect_arrive(conn),
            Ev::DeliverToServer { conn, bytes } => self.deliver_to_server(conn, bytes),
            Ev::DeliverToClient { conn, bytes } => self.deliver_to_client(conn, bytes),
            Ev::ServerFlush {
                conn,
                take,
                bytes,
                done,
            } => self.server_flush(conn, take, bytes, done),
            Ev::ServerSeesClose { conn } => self.server_sees_close(conn),
            Ev::ServerWritable { conn } => {
                if let Some(sim_conn) = self.conns.get_mut(&conn) {
                    sim_conn.stalled = false;
                    self.server_step_with(Vec::new(), Some(conn));
                }
            }
            Ev::ClientSeesClose { conn } => self.client_sees_close(conn),
            Ev::ServerTimer { epoch, generation } => {
                let now = self.server_now();
                if let Some(proc) = self.server.as_mut()
                    && proc.epoch == epoch
                    && proc.timer_generation == generation
                {
                    proc.server.handle_timeout(instant(now));
                    proc.armed = None;
                    self.server_step(Vec::new());
                }
            }
            Ev::ServerStart => self.server_start(),
            Ev::ReserveWritten { epoch, value } => self.reserve_written(epoch, value),
            Ev::FaultTick => self.fault_tick(),
            Ev::EndSafety => self.end_safety(),
            Ev::End => self.end_run(),
        }
    }

    fn inject_fault(&mut self) {
        let faults = self.config.faults.clone();
        let mut roll = FaultRoll::new(&mut self.fault_rng);
        let mut pick = |ppm: u32| roll.pick(ppm);
        if pick(faults.reset_ppm) {
            let live: Vec<u64> = self
                .conns
                .iter()
                .filter(|(_, conn)| !conn.tcp.reset)
                .map(|(&id, _)| id)
                .collect();
            if !live.is_empty() {
                let conn = live[self.fault_rng.index(live.len())];
                self.rec.report.faults += 1;
                self.note(|| format!("FAULT reset conn {conn}"));
                self.reset_conn(conn);
            }
        } else if pick(faults.client_crash_ppm) {
            self.fault_client_crash();
        } else if pick(faults.server_restart_ppm) {
            if self.server.is_some() {
                self.rec.report.faults += 1;
                self.crash_server();
            }
        } else if pick(faults.pause_ppm) {
            if let Some((client, _)) = self.fault_pause() {
                let until = self.clients[client].paused_until_us;
                self.note(|| format!("FAULT client {client} pauses until {until}"));
            }
        } else if pick(faults.server_clock_jump_ppm) {
            self.jump_server_clock(0, |jump| {
                format!("FAULT server clock jumps {jump} µs forward")
            });
        } else if pick(faults.clock_jump_ppm) {
            self.fault_client_clock_jump();
        } else if pick(faults.force_release_ppm) {
            self.fault_force_release();
        }
    }

    fn check_end(&mut self) {
        if !self.clients_resolved(true) {
            return;
        }
        if let Some((key, req)) = self.pending.iter().next() {
            let detail = format!("server never answered {key:?} {req:?}");
            self.violation(Checker::Liveness, detail);
        }
        if let Some(proc) = self.server.as_ref()
            && proc.server.stats().lock.waiters > 0
        {
            let detail = format!(
                "{} waiters still queued at the end",
                proc.server.stats().lock.waiters
            );
            self.violation(Checker::Liveness, detail);
        }
    }

    fn trivial_op(op: &LinOp) -> bool {
        // Keys that saw nothing but server restarts are not checked.
        matches!(op, LinOp::Restart)
    }

    fn server_clock(&mut self, _which: u8) -> &mut Clock {
        &mut self.server_clock
    }

    fn lease_era(&mut self) -> &mut u64 {
        &mut self.lease_era
    }

    fn wake_server(&mut self, _which: u8) {
        let now = self.server_now();
        if let Some(proc) = self.server.as_mut() {
            proc.server.handle_timeout(instant(now));
            proc.armed = None;
        }
        self.server_step(Vec::new());
    }
}
