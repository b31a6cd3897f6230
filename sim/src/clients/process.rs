//! The client process as a whole: running its events (the dispatch to the
//! v3 or the line client, dropping a dead incarnation's events, holding a
//! paused one's back), what a crash does to its operations, liveness at
//! the end, and the client faults (crash, pause, clock jump). Here and in
//! `holding.rs` (a finished holding is released the way its dialect
//! releases) are the only places that know both dialects; each dialect
//! knows only the shared module.

use super::{
    ClientCall, ClientEv, ClientWorld, Gate, Holdings, LineCalls, LineReplies, OpState, V3Ops,
    V3Renewals, V3Sessions,
};
use crate::run::Checker;

/// The client process code both worlds run (a blanket extension of
/// [`ClientWorld`]).
pub(crate) trait ClientProcess<'t>: ClientWorld<'t> {
    /// Runs a client event: events of a dead incarnation drop, those of a
    /// paused process wait until it runs again.
    fn client_event(&mut self, call: ClientCall) {
        let ClientCall { client, inc, ev } = call;
        if !matches!(ev, ClientEv::Resume | ClientEv::Restart) {
            match self.client_gate(client, inc) {
                Gate::Stale => return,
                Gate::PausedUntil(at) => return self.schedule_client(at, client, inc, ev),
                Gate::Runs => {}
            }
        }
        match ev {
            ClientEv::Timer { slot, generation } => self.client_timer(client, slot, generation),
            ClientEv::Connect(slot) => self.connect(client, slot),
            ClientEv::StartOp => self.client_start_op(client),
            ClientEv::OpRetry(op) => {
                if self.retry_due(client, op) {
                    self.op_attempt(client, op);
                }
            }
            ClientEv::WorkStep(op) => self.work_step(client, op),
            ClientEv::CancelOp(op) => self.cancel_op(client, op),
            ClientEv::RenewStep(op) => self.renew_step(client, op),
            ClientEv::Resume => self.resume_event(client, inc),
            ClientEv::Restart => self.restart(client),
        }
    }

    /// Whether an event of incarnation `inc` of `client` runs now.
    fn client_gate(&mut self, client: usize, inc: u64) -> Gate {
        let parts = self.parts();
        let proc = &parts.clients[client];
        if proc.inc != inc || proc.crashed {
            Gate::Stale
        } else if proc.paused_until_us > parts.now_us {
            // A paused process runs nothing; its work waits.
            Gate::PausedUntil(proc.paused_until_us)
        } else {
            Gate::Runs
        }
    }

    /// A `Resume` event: the pause of incarnation `inc` is over (unless a
    /// later, longer pause or a crash came since).
    fn resume_event(&mut self, client: usize, inc: u64) {
        let parts = self.parts();
        let proc = &parts.clients[client];
        if proc.inc == inc && !proc.crashed && proc.paused_until_us <= parts.now_us {
            self.resume(client);
        }
    }

    /// Starts the next acquire of `client` (if it may) and schedules the
    /// one after: a line call for a line client, else a v3 acquire.
    fn client_start_op(&mut self, client: usize) {
        if self.parts().clients[client].line.is_some() {
            return self.line_start_op(client);
        }
        self.v3_start_op(client);
    }

    /// Submits operation `id`'s next attempt, or lets it see that it
    /// cannot; a line call is sent again.
    fn op_attempt(&mut self, client: usize, id: u64) {
        if matches!(
            self.parts().clients[client].ops.get(&id),
            Some(OpState::Line(_))
        ) {
            return self.line_retry(client, id);
        }
        self.v3_attempt(client, id);
    }

    /// Whether an `OpRetry` of operation `id` runs: always for a line
    /// call; for a v3 operation as [`V3Ops::v3_retry_due`] says.
    fn retry_due(&mut self, client: usize, id: u64) -> bool {
        if matches!(
            self.parts().clients[client].ops.get(&id),
            Some(OpState::Line(_))
        ) {
            return true;
        }
        self.v3_retry_due(client, id)
    }

    /// Bytes from connection `conn` reach `client`: its line connection,
    /// or its session on `slot`.
    fn client_input(&mut self, client: usize, slot: u8, conn: u64, bytes: &[u8]) {
        if self.parts().clients[client].line.is_some() {
            return self.line_input(client, conn, bytes);
        }
        self.session_input(client, slot, conn, bytes);
    }

    /// `client` learns that connection `conn` is gone: its line
    /// connection, or that of its session on `slot`.
    fn transport_closed(&mut self, client: usize, slot: u8, conn: u64) {
        if self.parts().clients[client].line.is_some() {
            return self.line_closed(client, conn, false);
        }
        self.session_transport_closed(client, slot, conn);
    }

    /// Stops `client` for `pause_us` (a GC pause): it runs nothing until a
    /// `Resume`.
    fn pause_client(&mut self, client: usize, pause_us: u64) {
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        proc.paused_until_us = proc.paused_until_us.max(parts.now_us + pause_us);
        let (inc, until) = (proc.inc, proc.paused_until_us);
        self.schedule_client(until, client, inc, ClientEv::Resume);
    }

    /// A crash: `client` loses its operations (its holdings' windows end
    /// now, or at their end if earlier) and its memory of indeterminate
    /// acquires.
    fn crash_ops(&mut self, client: usize) {
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        proc.crashed = true;
        proc.paused_until_us = 0;
        proc.recent_indeterminate.clear();
        proc.retries.clear();
        if let Some(line) = proc.line.as_mut() {
            line.reset();
        }
        let ops = std::mem::take(&mut proc.ops);
        for op in ops.into_values() {
            if let OpState::Holding {
                grant,
                holding,
                act_before_local_us,
                start_us,
                era,
                ..
            } = op
            {
                let parts = self.parts();
                let clock = parts.clients[client].clock;
                let end_us = parts.now_us.min(clock.true_at(act_before_local_us));
                self.record_window(&grant, holding, start_us, end_us, era);
            }
        }
    }

    /// Liveness at the end: every running client's operations resolved
    /// (and, with `sessions_too`, nothing pending in its sessions). Reports
    /// the first that is not; false then.
    fn clients_resolved(&mut self, sessions_too: bool) -> bool {
        let parts = self.parts();
        let mut found = None;
        for (client, proc) in parts.clients.iter().enumerate() {
            if proc.crashed {
                continue;
            }
            if let Some((&id, _)) = proc.ops.iter().next() {
                found = Some(format!(
                    "client {client} op {id} still unresolved at the end of the liveness phase"
                ));
                break;
            }
            let pending = proc
                .link
                .sessions
                .iter()
                .flatten()
                .map(|(session, _)| session.pending_len())
                .find(|&pending| sessions_too && pending > 0);
            if let Some(pending) = pending {
                found = Some(format!(
                    "client {client} session has {pending} requests pending"
                ));
                break;
            }
        }
        match found {
            Some(detail) => {
                self.violation(Checker::Liveness, detail);
                false
            }
            None => true,
        }
    }

    /// Fault: a random client crashes (unless it is down already).
    fn fault_client_crash(&mut self) {
        let parts = self.parts();
        let client = parts.fault_rng.index(parts.clients.len());
        if !parts.clients[client].crashed {
            parts.rec.report.faults += 1;
            self.crash_client(client);
        }
    }

    /// Fault: a random client pauses for a random while (unless it is
    /// down): which, and how long.
    fn fault_pause(&mut self) -> Option<(usize, u64)> {
        let parts = self.parts();
        let client = parts.fault_rng.index(parts.clients.len());
        let pause = parts
            .fault_rng
            .range(1, parts.config.faults.pause_max_us.max(1));
        if parts.clients[client].crashed {
            return None;
        }
        parts.rec.report.faults += 1;
        self.pause_client(client, pause);
        Some((client, pause))
    }

    /// Fault: a random client's clock jumps forward.
    fn fault_client_clock_jump(&mut self) {
        let parts = self.parts();
        let client = parts.fault_rng.index(parts.clients.len());
        let jump = parts
            .fault_rng
            .range(1, parts.config.faults.clock_jump_max_us.max(1));
        parts.rec.report.faults += 1;
        parts.clients[client].clock.jump_us += jump;
        self.note(|| format!("FAULT client {client} clock jumps {jump} µs forward"));
        self.client_timeouts(client);
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> ClientProcess<'t> for W {}
