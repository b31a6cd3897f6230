//! The client processes both worlds run: the workload (which acquires a
//! client starts, with what wait, lease and plan), the real core
//! `AcquireOperation` / `ReleaseOperation` driven to their ends, holding a
//! grant and writing to the fenced resource with it, cancels, pauses, and
//! the history and validity windows all of that leaves for the checkers.
//!
//! Its sessions too: input, timers, transport closes, session events and
//! reconnect backoff, over one session (single server) or one per node
//! slot with the core `Router` choosing among them (cluster).
//!
//! What differs between the worlds — how bytes travel and connections
//! close, what the oracle learns of a grant and how it names a holding,
//! which release errors and close reasons a correct server may cause — is
//! asked of the world through [`ClientWorld`]; everything else is in this
//! folder, once, drawing from the worlds' random streams in the order it
//! always did.
//!
//! This module holds what both client dialects share: the process state
//! ([`ClientProc`], [`OpState`] and the plans of a holder) and the view of
//! the world the client code works on ([`Parts`], [`ClientWorld`]). Beside
//! it: the client events ([`events`]), running them and the client faults
//! ([`process`]), and holding a grant and writing to the fenced resource
//! with it ([`holding`]), where both dialects' grants end up; these two
//! are where the dialects meet. The dialects live in
//! [`v3`] (the core `Session` client: its operations, their outcomes,
//! renewals and sessions) and [`line`](mod@line) (the published 0.3.0
//! line client); each uses this shared module, neither the other.

mod events;
mod holding;
mod line;
mod process;
mod v3;

use std::collections::BTreeMap;

use ticketing_core::client::{
    AcquireOperation, ClientError, CloseReason, ExtendOperation, Grant, KeySet, ReleaseOperation,
};

use crate::checks::{HistRefs, History, Windows};
use crate::clock::Clock;
use crate::config::SimConfig;
use crate::rng::Rng;
use crate::run::{Checker, Recorder};

pub(crate) use events::{ClientCall, ClientEv, Gate};
pub(crate) use holding::Holdings;
pub(crate) use line::{LineCall, LineCalls, LineLink, LineReplies};
pub(crate) use process::ClientProcess;
pub(crate) use v3::{Sessions, V3Ops, V3Renewals, V3Sessions};

/// Indeterminate acquires remembered per client for matching a later
/// `Compensate` event.
pub(crate) const RECENT_INDETERMINATE_MAX: usize = 64;

/// What a client does with a grant: how many writes, how far apart, and
/// whether it releases at the end (or lets the lease run out).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) writes: u8,
    pub(crate) write_gap_us: u64,
    pub(crate) release: bool,
    /// Renew the lease while the work shows progress (clients that
    /// negotiated renewal only).
    pub(crate) renew: Option<RenewPlan>,
}

/// How a renewing holder's work goes: it renews every third of its lease
/// (as `ticketing lock --renew` does) while its last write is at most
/// `progress_timeout_us` old; with `stall_after` its work hangs after that
/// many writes, its renewals stop, and it must let go by its deadline.
#[derive(Clone, Debug)]
pub(crate) struct RenewPlan {
    pub(crate) progress_timeout_us: u64,
    pub(crate) stall_after: Option<u8>,
}

/// A renewing holder's state.
#[derive(Debug)]
pub(crate) struct Renewal {
    pub(crate) plan: RenewPlan,
    /// Local time of the work's last sign of life (a write, or the grant).
    pub(crate) progress_local_us: u64,
    /// Writes done so far.
    pub(crate) writes_done: u8,
    /// The renewal in flight (its op id), if any.
    pub(crate) extending: Option<u64>,
}

impl Renewal {
    /// The work hung: it made as many writes as its plan lets it make
    /// before stalling.
    pub(crate) fn stalled(&self) -> bool {
        self.plan
            .stall_after
            .is_some_and(|after| self.writes_done >= after)
    }
}

/// One logical operation of a client.
pub(crate) enum OpState {
    Acquiring {
        op: AcquireOperation,
        /// The attempt in flight: (connection, rid).
        attempt: Option<(u64, u64)>,
        plan: Plan,
        hist: HistRefs,
    },
    Holding {
        grant: Grant,
        /// Names this holding among validity windows.
        holding: u64,
        plan: Plan,
        writes_left: u8,
        /// Local instant after which the client must not act (the grant's
        /// conservative end shrunk by the drift bound).
        act_before_local_us: u64,
        start_us: u64,
        /// The lease era the grant was made in.
        era: u64,
        /// The next write was checked before a pause and goes ahead
        /// unchecked after it.
        write_after_pause: bool,
        /// The lease asked for, seconds.
        lease_s: u8,
        /// Renewing holders only.
        renewal: Option<Renewal>,
    },
    /// A renewal (`W`) of holding `holder`'s grant.
    Extending {
        op: ExtendOperation,
        attempt: Option<(u64, u64)>,
        holder: u64,
        lease_s: u8,
        any_indeterminate: bool,
        hist: HistRefs,
    },
    Releasing {
        op: ReleaseOperation,
        attempt: Option<(u64, u64)>,
        any_indeterminate: bool,
        hist: HistRefs,
    },
    /// A line client's call (acquire or release), see `line.rs`.
    Line(LineCall),
}

/// A client process.
pub(crate) struct ClientProc {
    /// Incarnation: bumped by each restart, so a dead one's events drop.
    pub(crate) inc: u64,
    pub(crate) clock: Clock,
    pub(crate) crashed: bool,
    pub(crate) paused_until_us: u64,
    pub(crate) ops: BTreeMap<u64, OpState>,
    pub(crate) acquires_started: usize,
    /// (keys, history refs) of acquires that ended Indeterminate, newest
    /// last, to attach a later `Compensate` to.
    pub(crate) recent_indeterminate: Vec<(KeySet, HistRefs)>,
    pub(crate) link: Sessions,
    /// A line client (published 0.3.0 model) instead of v3 sessions.
    pub(crate) line: Option<LineLink>,
    /// Negotiates renewal and pushes, and renews some grants.
    pub(crate) renews: bool,
    /// The attempt (connection, rid) whose outcome is being handled: the
    /// deadline checker asks the world what that server answered.
    pub(crate) answered: Option<(u64, u64)>,
    /// Per v3 operation: the router's leader epoch when its last attempt
    /// was made, and when its retry falls due without a leader notice.
    /// The runtimes' rule (`ticketing_core::client::wait_for_retry`): a
    /// retry runs at its fallback instant or as soon as a leader becomes
    /// reachable, whichever comes first. One entry per operation alive.
    pub(crate) retries: BTreeMap<u64, RetryWait>,
}

/// When a v3 operation's retry runs (see [`ClientProc::retries`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryWait {
    /// `Router::leader_epoch` when the last attempt was made.
    pub(crate) epoch: u64,
    /// True instant of the fallback retry, once the attempt asked for one.
    pub(crate) fallback_us: Option<u64>,
}

impl ClientProc {
    pub(crate) fn new(clock: Clock, link: Sessions) -> Self {
        ClientProc {
            inc: 0,
            clock,
            crashed: false,
            paused_until_us: 0,
            ops: BTreeMap::new(),
            acquires_started: 0,
            recent_indeterminate: Vec::new(),
            link,
            line: None,
            renews: false,
            answered: None,
            retries: BTreeMap::new(),
        }
    }

    /// A line client whose owners start from `owner_base`.
    pub(crate) fn line(clock: Clock, owner_base: u64, link: Sessions) -> Self {
        ClientProc {
            line: Some(LineLink::new(owner_base)),
            ..ClientProc::new(clock, link)
        }
    }
}

/// The fenced resource's record of one key: the highest token that wrote,
/// and which holding (and client) it came from.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DbKey {
    high_water: u64,
    holding: u64,
    client: usize,
}

/// Whether any correct server may make a session close for `reason`
/// (timeouts, a dead transport); a cluster adds its redirects.
pub(crate) fn close_expected_of_any(reason: &CloseReason) -> bool {
    matches!(
        reason,
        CloseReason::TransportClosed
            | CloseReason::DeadlineAfterSend
            | CloseReason::CancelledAfterSend
            | CloseReason::HandshakeTimeout
            | CloseReason::StalledReply
            | CloseReason::Silent
            // A connection reset while our `X` is unanswered looks like a
            // published-protocol server closing on it.
            | CloseReason::ExtensionsUnsupported
    )
}

/// What the fenced resource and the oracle make of a release error.
pub(crate) enum ReleaseFailure {
    /// An attempt may have taken effect: the history entry stays open.
    LeaveOpen,
    /// Certainly without effect, unless an earlier attempt's answer was
    /// indeterminate.
    Forget,
    /// A correct server never causes this: a `Client` violation saying this.
    Unexpected(String),
}

/// The world's state the shared client code works on, borrowed at once.
pub(crate) struct Parts<'a, 't> {
    pub(crate) now_us: u64,
    pub(crate) config: &'a SimConfig,
    /// In the safety phase: new work and faults.
    pub(crate) safety: bool,
    pub(crate) clients: &'a mut Vec<ClientProc>,
    pub(crate) next_op: &'a mut u64,
    pub(crate) history: &'a mut History,
    pub(crate) windows: &'a mut Windows,
    /// The fenced resource, per key.
    pub(crate) db: &'a mut Vec<DbKey>,
    /// Bumped whenever leases may end early in true time: validity
    /// windows and fencing are only judged within one era.
    pub(crate) lease_era: u64,
    pub(crate) work: &'a mut Rng,
    pub(crate) fault_rng: &'a mut Rng,
    pub(crate) rec: &'a mut Recorder<'t>,
}

/// A world whose client processes the shared code drives: the required
/// methods are where the worlds differ; the extension traits of this
/// module ([`ClientProcess`], [`Holdings`], the v3 and line clients'
/// traits) are the client side of both worlds, written once.
pub(crate) trait ClientWorld<'t> {
    /// What the worlds call a connection in traces and findings.
    const CONN: &'static str;

    /// The world's state the shared code works on.
    fn parts(&mut self) -> Parts<'_, 't>;
    /// Schedules `ev` for incarnation `inc` of `client`.
    fn schedule_client(&mut self, at_us: u64, client: usize, inc: u64, ev: ClientEv);
    /// Sends a client's bytes towards the server on connection `conn`.
    fn send_from_client(&mut self, conn: u64, bytes: Vec<u8>);
    /// The client closed connection `conn` (its session ended): the
    /// transport goes too.
    fn close_transport(&mut self, conn: u64);
    /// Whether a correct server can make a session close for `reason`.
    fn close_expected(&self, reason: &CloseReason) -> bool;
    /// A session became ready.
    fn on_ready(&mut self, client: usize, slot: u8, conn: u64);
    /// A session heard a leader notice (`L`) or a not-leader answer.
    fn on_leader_notice(&mut self, client: usize);
    /// A paused client runs again.
    fn resume(&mut self, client: usize);
    /// `client` opens a session (on `slot`) if it has none there.
    fn connect(&mut self, client: usize, slot: u8);
    /// A crashed client starts again.
    fn restart(&mut self, client: usize);
    /// A client process crashes.
    fn crash_client(&mut self, client: usize);
    /// The single world pumps its one session after an operation step
    /// (the cluster world pumps per slot where it submits).
    fn after_op_step(&mut self, client: usize);
    /// The oracle's bookkeeping of a grant handed to `client` (`caller`:
    /// to the caller, not only to be compensated); checks it was not
    /// released as never delivered.
    fn on_grant(&mut self, client: usize, token: u64, caller: bool);
    /// Names a new holding of `token` among validity windows, and the lease
    /// era it was granted in.
    fn new_holding(&mut self, token: u64) -> (u64, u64);
    /// What a release that ended with `error` means in this world.
    fn release_failure(&self, error: ClientError) -> ReleaseFailure;
    /// The slot of the session connection `conn` belongs to (while the
    /// world still knows the connection).
    fn slot_of(&self, conn: u64) -> Option<u8>;
    /// Opens a line connection from `client` to `slot`: its id.
    fn open_line_conn(&mut self, client: usize, slot: u8) -> Option<u64>;
    /// Slots a line client may dial.
    fn line_slots(&self) -> u8;
    /// The slot whose client address is `address` (`M`/`L`).
    fn line_address_slot(&self, address: &[u8]) -> Option<u8>;
    /// When the grant named in the answer to `rid` on connection `conn`
    /// (a grant or a renewal) expired on the server that answered, in true
    /// time as of the answer, and the lease era then; taken (asked once).
    fn answered_expiry(&mut self, conn: u64, rid: u64) -> Option<(u64, u64)>;

    /// A trace note; `text` only runs when tracing.
    fn note(&mut self, text: impl FnOnce() -> String) {
        self.parts().rec.note(text);
    }

    /// Records a violation (unless that checker is off).
    fn violation(&mut self, checker: Checker, detail: String) {
        let parts = self.parts();
        parts.rec.violation(checker, parts.now_us, detail);
    }

    /// `client`'s clock now.
    fn local_now(&mut self, client: usize) -> u64 {
        let parts = self.parts();
        parts.clients[client].clock.local(parts.now_us)
    }
}
