//! The client events both worlds schedule ([`ClientEv`], wrapped as a
//! [`ClientCall`] naming the client and incarnation), how they mix into the
//! trace hash and show in a trace, and whether one runs now ([`Gate`]).
//! Kept apart so the worlds' event enums and the trace code see only
//! these types, not the client logic.

/// A client event; the world wraps it (as a [`ClientCall`]) in its own
/// event type.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClientEv {
    /// Maybe start an acquire (the workload's next step).
    StartOp,
    /// Operation `op`'s next attempt is due.
    OpRetry(u64),
    /// The holder of operation `op` takes its next step.
    WorkStep(u64),
    /// Cancel acquire `op` while it waits.
    CancelOp(u64),
    /// A pause may be over.
    Resume,
    /// The session timer of `slot`, armed as `generation`.
    Timer { slot: u8, generation: u64 },
    /// Connect `slot`'s session again.
    Connect(u8),
    /// A crashed client process starts again, as a new incarnation.
    Restart,
    /// Holder `op` considers renewing its lease.
    RenewStep(u64),
}

/// A client event as scheduled: for which client and incarnation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientCall {
    pub(crate) client: usize,
    pub(crate) inc: u64,
    pub(crate) ev: ClientEv,
}

impl ClientCall {
    /// Where this event's code lies after the world's first client-event
    /// code: both worlds number their client events in this order, so the
    /// trace hash is what it was when each world had its own variants.
    pub(crate) fn code_offset(&self) -> u64 {
        match self.ev {
            ClientEv::Timer { .. } => 0,
            ClientEv::Connect(_) => 1,
            ClientEv::StartOp => 2,
            ClientEv::OpRetry(_) => 3,
            ClientEv::WorkStep(_) => 4,
            ClientEv::CancelOp(_) => 5,
            ClientEv::Resume => 6,
            ClientEv::Restart => 7,
            // Past every world's own codes (added after them).
            ClientEv::RenewStep(_) => 100,
        }
    }

    /// The number the trace hash mixes in besides time and code.
    pub(crate) fn hash_extra(&self) -> u64 {
        match self.ev {
            ClientEv::OpRetry(op)
            | ClientEv::WorkStep(op)
            | ClientEv::CancelOp(op)
            | ClientEv::RenewStep(op) => op,
            _ => self.client as u64,
        }
    }

    /// Shows the event in a trace; `slots`: with the slot of timers and
    /// connects (cluster worlds).
    pub(crate) fn trace(&self, f: &mut std::fmt::Formatter<'_>, slots: bool) -> std::fmt::Result {
        let (name, op) = match self.ev {
            ClientEv::Timer { slot, generation } => {
                let mut shown = f.debug_struct("ClientTimer");
                shown.field("client", &self.client).field("inc", &self.inc);
                if slots {
                    shown.field("slot", &slot);
                }
                return shown.field("generation", &generation).finish();
            }
            ClientEv::Connect(slot) => {
                let mut shown = f.debug_struct("ClientConnect");
                shown.field("client", &self.client).field("inc", &self.inc);
                if slots {
                    shown.field("slot", &slot);
                }
                return shown.finish();
            }
            ClientEv::Restart => {
                return f
                    .debug_struct("ClientRestart")
                    .field("client", &self.client)
                    .finish();
            }
            ClientEv::StartOp => ("ClientStartOp", None),
            ClientEv::Resume => ("ClientResume", None),
            ClientEv::OpRetry(op) => ("OpRetry", Some(op)),
            ClientEv::WorkStep(op) => ("WorkStep", Some(op)),
            ClientEv::CancelOp(op) => ("CancelOp", Some(op)),
            ClientEv::RenewStep(op) => ("RenewStep", Some(op)),
        };
        let mut shown = f.debug_struct(name);
        shown.field("client", &self.client).field("inc", &self.inc);
        if let Some(op) = op {
            shown.field("op", &op);
        }
        shown.finish()
    }
}

/// Whether a client event runs now.
pub(crate) enum Gate {
    /// Its incarnation crashed or was replaced: dropped.
    Stale,
    /// The process is paused: the event waits until then.
    PausedUntil(u64),
    Runs,
}
