//! A test's view of [`Machine::poll_output`]: everything a machine emits,
//! sorted by kind, so a test can ask "was a reserve write asked for?"
//! without dropping the wakes and logs that came before it.

use std::collections::VecDeque;

use crate::budget::LogEvent;
use crate::conn::ConnId;
use crate::inspect::{AdminRequestId, ForceReleaseOutcome};
use crate::machine::{Machine, NodeEvent, Output};
use crate::reserve::TokenAlert;
use crate::time::Instant;

/// Most outputs of one kind kept; a test that lets more pile up without
/// looking is broken, so going over it panics.
const OUTPUTS_PER_KIND_MAX: usize = 1 << 20;

/// Outputs drained from a machine and not yet looked at, by kind, each in
/// the order the machine emitted it.
#[derive(Debug, Default)]
pub struct OutputQueues {
    /// Connections to serve.
    pub wakes: VecDeque<ConnId>,
    /// Peer slots to dial.
    pub dials: VecDeque<u8>,
    /// Reserve values to store.
    pub reserves: VecDeque<u64>,
    /// Answers to force-releases.
    pub admin_replies: VecDeque<(AdminRequestId, ForceReleaseOutcome)>,
    /// Reports to log.
    pub logs: VecDeque<LogEvent>,
    /// Token alerts.
    pub alerts: VecDeque<TokenAlert>,
    /// Node events.
    pub node_events: VecDeque<NodeEvent>,
}

fn keep<T>(queue: &mut VecDeque<T>, item: T) {
    assert!(
        queue.len() < OUTPUTS_PER_KIND_MAX,
        "outputs piled up unread"
    );
    queue.push_back(item);
}

impl OutputQueues {
    /// Moves everything `machine` emits now into the queues.
    pub fn drain<M: Machine>(&mut self, machine: &mut M, now: Instant) {
        while let Some(output) = machine.poll_output(now) {
            match output {
                Output::Wake(conn) => keep(&mut self.wakes, conn),
                Output::Dial { slot } => keep(&mut self.dials, slot),
                Output::Reserve { value } => keep(&mut self.reserves, value),
                Output::AdminReply { id, outcome } => {
                    keep(&mut self.admin_replies, (id, outcome));
                }
                Output::Log(event) => keep(&mut self.logs, event),
                Output::Alert(alert) => keep(&mut self.alerts, alert),
                Output::Node(event) => keep(&mut self.node_events, event),
            }
        }
    }

    /// Drains `machine`, then takes the next wake.
    pub fn wake<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Option<ConnId> {
        self.drain(machine, now);
        self.wakes.pop_front()
    }

    /// Drains `machine`, then takes the next dial.
    pub fn dial<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Option<u8> {
        self.drain(machine, now);
        self.dials.pop_front()
    }

    /// Drains `machine`, then takes the next reserve write asked for.
    pub fn reserve<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Option<u64> {
        self.drain(machine, now);
        self.reserves.pop_front()
    }

    /// Drains `machine`, then takes the next force-release answer.
    pub fn admin_reply<M: Machine>(
        &mut self,
        machine: &mut M,
        now: Instant,
    ) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        self.drain(machine, now);
        self.admin_replies.pop_front()
    }

    /// Drains `machine`, then takes every report to log.
    pub fn logs<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Vec<LogEvent> {
        self.drain(machine, now);
        self.logs.drain(..).collect()
    }

    /// Drains `machine`, then takes every token alert.
    pub fn alerts<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Vec<TokenAlert> {
        self.drain(machine, now);
        self.alerts.drain(..).collect()
    }

    /// Drains `machine`, then takes every node event.
    pub fn node_events<M: Machine>(&mut self, machine: &mut M, now: Instant) -> Vec<NodeEvent> {
        self.drain(machine, now);
        self.node_events.drain(..).collect()
    }
}
