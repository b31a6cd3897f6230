//! The one run loop both worlds go through ([`crate::single::World`] and
//! [`crate::cluster::ClusterWorld`]): the opening schedule, the event loop
//! with its stop rule, the fault tick's own rescheduling, the phase
//! changes, a server clock's forward jump and the checks at the end.
//!
//! A world says how it differs through [`SimWorld`]: how its servers and
//! clients start, how an event is hashed and handled, which fault a tick
//! injects, and what the end-of-run checks are. The order of scheduling
//! and of random draws here is the order each world had on its own, so
//! every trace hash is what it was.

use crate::clients::ClientWorld;
use crate::clock::Clock;
use crate::config::SimConfig;
use crate::linear::LinOp;
use crate::run::{Checker, Phase, Queue, Recorder, RunReport, Scheduled};

/// The events the shared loop schedules itself.
pub(crate) enum Marker {
    /// The next fault tick.
    FaultTick,
    /// The end of the safety phase: no more faults or new work.
    EndSafety,
    /// The end of the liveness bound: the run is over.
    End,
}

/// A world the shared loop drives; see the module docs.
pub(crate) trait SimWorld<'t>: ClientWorld<'t> + Sized {
    /// The world's own events.
    type Ev;
    /// The world's event for `marker`.
    fn marker(marker: Marker) -> Self::Ev;
    /// Each world's events waiting to happen.
    fn queue(&mut self) -> &mut Queue<Self::Ev>;
    /// Moves true time to `now_us` (the next event's).
    fn set_now(&mut self, now_us: u64);
    /// Where the run is.
    fn phase(&self) -> Phase;
    /// Moves the run on to `phase`.
    fn set_phase(&mut self, phase: Phase);
    /// The report being built.
    fn recorder(&mut self) -> &mut Recorder<'t>;
    /// Hands back the recorder once the run is over.
    fn into_recorder(self) -> Recorder<'t>;

    /// Starts the server side (the server, or every node) at time 0.
    fn start_servers(&mut self);
    /// Schedules `client`'s first connection(s) and first operation.
    fn start_client(&mut self, client: usize);
    /// Counts, hashes and traces `next` before it is handled.
    fn hash_event(&mut self, next: &Scheduled<Self::Ev>);
    /// Handles one event.
    fn dispatch(&mut self, ev: Self::Ev);
    /// Runs after every event (the cluster world's Raft checkers).
    fn after_event(&mut self) {}
    /// Injects at most one fault (the tick has already been rescheduled).
    fn inject_fault(&mut self);
    /// What else the world does when the safety phase ends.
    fn after_safety(&mut self) {}
    /// The liveness checks at the end of the run.
    fn check_end(&mut self);
    /// History entries that alone leave a key unchecked for
    /// linearizability (nothing but restarts, or nothing but lease cuts).
    fn trivial_op(op: &LinOp) -> bool;

    /// The clock of server `which` (the single server, or a node's slot).
    fn server_clock(&mut self, which: u8) -> &mut Clock;
    /// Bumped whenever server leases may end early in true time.
    fn lease_era(&mut self) -> &mut u64;
    /// Lets server `which` see its timers at its (new) local time and
    /// steps it.
    fn wake_server(&mut self, which: u8);

    /// When the next fault tick is due.
    fn fault_delay(&mut self) -> u64 {
        let parts = self.parts();
        let mean = parts.config.faults.tick_mean_us.max(1);
        parts.now_us + 1 + parts.fault_rng.below(2 * mean)
    }

    /// A fault tick: in the safety phase, reschedules itself and injects.
    fn fault_tick(&mut self) {
        if self.phase() != Phase::Safety {
            return;
        }
        let next = self.fault_delay();
        self.queue().push(next, Self::marker(Marker::FaultTick));
        self.inject_fault();
    }

    /// The safety phase ends: no more faults or new work.
    fn end_safety(&mut self) {
        self.note(|| "safety phase ends: no more faults or new work".into());
        self.set_phase(Phase::Liveness);
        self.after_safety();
    }

    /// The run ends here, after the end checks.
    fn end_run(&mut self) {
        self.check_end();
        self.set_phase(Phase::Done);
    }

    /// Server `which`'s clock jumps forward (by a drawn amount up to the
    /// configured maximum): its leases now end that much earlier in true
    /// time, so a new lease era starts and every key's history is marked.
    /// `describe` names the server in the trace.
    fn jump_server_clock(&mut self, which: u8, describe: impl FnOnce(u64) -> String) {
        let parts = self.parts();
        let us_max = parts.config.faults.clock_jump_max_us.max(1);
        let jump = parts.fault_rng.range(1, us_max);
        parts.rec.report.faults += 1;
        self.server_clock(which).jump_us += jump;
        *self.lease_era() += 1;
        let parts = self.parts();
        parts
            .history
            .mark_all(parts.now_us, LinOp::LeaseCut { by_us: jump });
        self.note(|| describe(jump));
        self.wake_server(which);
    }

    /// Every key's client-observed history against the sequential model.
    fn check_linearizability(&mut self) {
        let parts = self.parts();
        let details = parts.history.check(Self::trivial_op, &mut parts.rec.report);
        for detail in details {
            self.violation(Checker::Linearizability, detail);
        }
    }
}

/// Runs `world` to the end and checks everything.
pub(crate) fn run<'t, W: SimWorld<'t>>(mut world: W) -> RunReport {
    let line_clients = world.parts().config.line_clients as u64;
    world.recorder().report.line_clients = line_clients;
    world.start_servers();
    let clients = world.parts().clients.len();
    for client in 0..clients {
        world.start_client(client);
    }
    let tick = world.fault_delay();
    world.queue().push(tick, W::marker(Marker::FaultTick));
    let config: &SimConfig = world.parts().config;
    let (safety_us, end_us) = (
        config.safety_us,
        config.safety_us + config.liveness_bound_us,
    );
    world.queue().push(safety_us, W::marker(Marker::EndSafety));
    world.queue().push(end_us, W::marker(Marker::End));
    while let Some(next) = world.queue().pop() {
        world.set_now(next.at_us);
        world.hash_event(&next);
        world.dispatch(next.ev);
        world.after_event();
        if world.phase() == Phase::Done || world.recorder().saturated() {
            break;
        }
    }
    if world.recorder().report.violations.is_empty() {
        world.check_linearizability();
    }
    let now_us = world.parts().now_us;
    world.into_recorder().finish(now_us)
}
