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
//! asked of the world through [`ClientWorld`]; everything else is here
//! once, drawing from the worlds' random streams in the order it always
//! did.

mod line;

use std::collections::BTreeMap;

use ticketing_core::client::{
    AcquireOperation, AcquireParams, AcquireStep, Backoff, CancelOutcome, ClientError, CloseReason,
    Compensation, DRIFT_PARTS, EXTEND_RETRY_WINDOW, ExtendOperation, ExtendStep, Grant,
    HolderWatch, KeySet, LossCause, Outcome, ReleaseOperation, ReleaseOutcome, ReleaseStep, Router,
    Session, SessionEvent,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::ExtendStatus;

use crate::checks::{HistRefs, History, Window, Windows, key_indices};
use crate::clock::{Clock, act_before_local_us, duration_us, instant, lease_min_us};
use crate::config::{ALL_KEYS, COLD_KEYS, HOT_KEYS, SimConfig};
use crate::linear::LinOp;
use crate::rng::Rng;
use crate::run::{Checker, Recorder};

pub(crate) use line::{LineCall, LineClientWorld, LineLink};

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

/// A client's sessions, one per slot: one slot for the single server, one
/// per node in a cluster, where the core [`Router`] picks among them.
pub(crate) struct Sessions {
    /// Per slot: the session and its connection.
    pub(crate) sessions: Vec<Option<(Session, u64)>>,
    pub(crate) backoffs: Vec<Backoff>,
    pub(crate) router: Option<Router>,
    pub(crate) timer_generation: Vec<u64>,
    /// Per slot: the deadline the pending timer event stands for.
    pub(crate) armed: Vec<Option<Instant>>,
}

impl Sessions {
    /// One session to a single server.
    pub(crate) fn single() -> Self {
        Sessions::new(1, None)
    }

    /// One session per node of an `n`-node cluster, routed.
    pub(crate) fn routed(n: usize) -> Self {
        Sessions::new(n, Some(Router::new(n)))
    }

    fn new(n: usize, router: Option<Router>) -> Self {
        Sessions {
            sessions: (0..n).map(|_| None).collect(),
            backoffs: vec![Backoff::new(); n],
            router,
            timer_generation: vec![0; n],
            armed: vec![None; n],
        }
    }

    /// Slots, as the worlds number them.
    pub(crate) fn slots(&self) -> u8 {
        self.sessions.len() as u8
    }

    /// The router's count of leaders that became reachable (0 for a single
    /// server, which has no router).
    fn leader_epoch(&self) -> u64 {
        self.router.as_ref().map_or(0, Router::leader_epoch)
    }

    /// The ready session an attempt goes out on now, with its connection
    /// and slot; or the error an attempt gets when there is none.
    fn attempt_session(&mut self) -> Result<(&mut Session, u64, u8), ClientError> {
        let Some(router) = self.router.as_mut() else {
            return match self.sessions[0]
                .as_mut()
                .filter(|(session, _)| session.is_ready())
            {
                Some((session, conn)) => Ok((session, *conn, 0)),
                None => Err(ClientError::NotConnected),
            };
        };
        // Leader first, then runs over ready sessions (the runtimes' rule).
        let sessions = &self.sessions;
        let picked = router.pick_coalescing(|index| {
            sessions[index]
                .as_ref()
                .map_or(0, |(session, _)| session.unsent_len())
        });
        let error = router.no_connection_error();
        picked
            .and_then(|index| {
                self.sessions[index]
                    .as_mut()
                    .filter(|(session, _)| session.is_ready())
                    .map(|(session, conn)| (session, *conn, index as u8))
            })
            .ok_or(error)
    }

    /// Drops every session (a crash).
    pub(crate) fn clear(&mut self) {
        self.sessions.iter_mut().for_each(|session| *session = None);
        self.armed.iter_mut().for_each(|armed| *armed = None);
    }
}

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

/// A world whose client processes the shared code drives. The provided
/// methods are the client side of both worlds; the required ones are where
/// the worlds differ.
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

    /// Starts the next acquire of `client` (if it may) and schedules the
    /// one after.
    fn client_start_op(&mut self, client: usize) {
        if self.parts().clients[client].line.is_some() {
            return self.line_start_op(client);
        }
        let parts = self.parts();
        if !parts.safety {
            return;
        }
        let config = parts.config;
        let (acquires_max, concurrent_max, wait_s_max, lease_s_max, drift) = (
            config.acquires_per_client_max,
            config.concurrent_per_client_max,
            config.wait_s_max,
            config.lease_s_max,
            config.drift_ppm_max,
        );
        let proc = &parts.clients[client];
        let active = proc
            .ops
            .values()
            .filter(|op| !matches!(op, OpState::Releasing { .. }))
            .count();
        let inc = proc.inc;
        if proc.acquires_started >= acquires_max {
            return;
        }
        let work = parts.work;
        let think = work.below(600_000);
        let now_us = parts.now_us;
        self.schedule_client(now_us + think, client, inc, ClientEv::StartOp);
        if active >= concurrent_max {
            return;
        }
        let parts = self.parts();
        let work = parts.work;
        // Keys: mostly one hot key; sometimes a cold one or a small set.
        let keys: Vec<&str> = match work.below(10) {
            0..=4 => vec![HOT_KEYS[work.index(HOT_KEYS.len())]],
            5..=6 => vec![COLD_KEYS[work.index(COLD_KEYS.len())]],
            _ => {
                let mut set = vec![HOT_KEYS[work.index(HOT_KEYS.len())]];
                for _ in 0..work.range(1, 2) {
                    set.push(ALL_KEYS[work.index(ALL_KEYS.len())]);
                }
                set
            }
        };
        let keys = KeySet::new(&keys).expect("sim keys are valid");
        let wait_s = if work.chance(300_000) {
            0
        } else {
            work.range(1, u64::from(wait_s_max))
        };
        let lease_s = if work.chance(600_000) {
            work.range(1, 2)
        } else {
            work.range(1, u64::from(lease_s_max))
        };
        let budget_us = if work.chance(500_000) {
            0
        } else {
            work.below(lease_s * 1_000_000)
        };
        let params = AcquireParams::new(
            Duration::from_secs(wait_s),
            Duration::from_secs(lease_s),
            Duration::from_micros(budget_us),
        )
        .expect("sim parameters are valid");
        let mut plan = Plan {
            writes: work.range(1, 4) as u8,
            write_gap_us: work.range(1_000, lease_s * 400_000),
            release: work.chance(800_000),
            renew: None,
        };
        if parts.clients[client].renews && work.chance(600_000) {
            // Work that outlasts its lease several times over: it holds on
            // only by renewing, and a stall must cost it the key.
            plan.writes = work.range(3, 10) as u8;
            plan.write_gap_us = work.range(lease_s * 200_000, lease_s * 600_000);
            let stall_after = work
                .chance(300_000)
                .then(|| work.below(u64::from(plan.writes)) as u8);
            plan.renew = Some(RenewPlan {
                progress_timeout_us: lease_s * 700_000,
                stall_after,
            });
        }
        let cancel_after =
            (wait_s > 0 && work.chance(100_000)).then(|| work.below(wait_s * 1_000_000));
        let local = parts.clients[client].clock.local(now_us);
        let op = AcquireOperation::new(instant(local), keys.clone(), params);
        let id = *parts.next_op;
        *parts.next_op += 1;
        let lease_min_us = lease_min_us(lease_s * 1_000_000, drift);
        let hist = parts
            .history
            .open(now_us, &keys, LinOp::AcquireIndeterminate { lease_min_us });
        let proc = &mut parts.clients[client];
        proc.acquires_started += 1;
        proc.ops.insert(
            id,
            OpState::Acquiring {
                op,
                attempt: None,
                plan,
                hist,
            },
        );
        self.note(|| format!("client {client} op {id}: acquire {keys:?} {params:?}"));
        if let Some(delay) = cancel_after {
            self.schedule_client(now_us + delay, client, inc, ClientEv::CancelOp(id));
        }
        self.op_attempt(client, id);
    }

    /// Submits operation `id`'s next attempt, or lets it see that it
    /// cannot.
    fn op_attempt(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        if matches!(
            proc.ops.get(&id),
            Some(OpState::Acquiring { .. } | OpState::Releasing { .. } | OpState::Extending { .. })
        ) {
            let epoch = proc.link.leader_epoch();
            proc.retries.insert(
                id,
                RetryWait {
                    epoch,
                    fallback_us: None,
                },
            );
        }
        let session = proc.link.attempt_session();
        let slot;
        match (proc.ops.get_mut(&id), session) {
            (Some(OpState::Acquiring { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.acquire_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Acquiring { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.acquire_step(client, id, step);
            }
            (Some(OpState::Releasing { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.release_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Releasing { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.release_step(client, id, step);
            }
            (Some(OpState::Extending { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.extend_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Extending { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.extend_step(client, id, step);
            }
            (Some(OpState::Line(_)), _) => return self.line_retry(client, id),
            _ => return,
        }
        self.client_pump(client, slot);
    }

    /// A session reported the outcome of `rid` on `conn`: the operation
    /// whose attempt it was takes its next step.
    fn attempt_outcome(&mut self, client: usize, conn: u64, rid: u64, outcome: Outcome) {
        let parts = self.parts();
        let found = parts.clients[client]
            .ops
            .iter()
            .find_map(|(&id, op)| match op {
                OpState::Acquiring { attempt, .. }
                | OpState::Releasing { attempt, .. }
                | OpState::Extending { attempt, .. }
                    if *attempt == Some((conn, rid)) =>
                {
                    Some(id)
                }
                _ => None,
            });
        if let Some(op) = found {
            self.op_outcome(client, op, outcome);
        }
    }

    fn op_outcome(&mut self, client: usize, id: u64, outcome: Outcome) {
        let local = self.local_now(client);
        match self.parts().clients[client].ops.get_mut(&id) {
            Some(OpState::Acquiring { op, attempt, .. }) => {
                let answered = attempt.take();
                let step = op.on_outcome(instant(local), outcome);
                self.parts().clients[client].answered = answered;
                self.acquire_step(client, id, step);
            }
            Some(OpState::Extending {
                op,
                attempt,
                any_indeterminate,
                ..
            }) => {
                let answered = attempt.take();
                if outcome == Outcome::Indeterminate {
                    *any_indeterminate = true;
                }
                let step = op.on_outcome(instant(local), outcome);
                self.parts().clients[client].answered = answered;
                self.extend_step(client, id, step);
            }
            Some(OpState::Releasing {
                op,
                attempt,
                any_indeterminate,
                ..
            }) => {
                *attempt = None;
                if outcome == Outcome::Indeterminate {
                    *any_indeterminate = true;
                }
                let step = op.on_outcome(instant(local), outcome);
                self.release_step(client, id, step);
            }
            _ => {}
        }
    }

    /// A session asks to release a grant that arrived after its acquire
    /// ended Indeterminate: that acquire was granted after all.
    fn compensate(&mut self, client: usize, compensation: Compensation) {
        self.note(|| format!("client {client} compensates {compensation:?}"));
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let position = proc
            .recent_indeterminate
            .iter()
            // The newest: a late grant's Indeterminate outcome comes right
            // before its compensation.
            .rposition(|(keys, _)| *keys == compensation.keys);
        if let Some(position) = position {
            let (_, hist) = proc.recent_indeterminate.remove(position);
            parts.history.resolve(parts.now_us, &hist, |op| match op {
                LinOp::AcquireIndeterminate { lease_min_us } => LinOp::Granted {
                    token: compensation.token,
                    lease_min_us,
                },
                other => other,
            });
        } else {
            self.violation(
                Checker::Client,
                format!("client {client}: compensation {compensation:?} for no known acquire"),
            );
        }
        let local = self.local_now(client);
        let op = ReleaseOperation::new(instant(local), compensation.keys, compensation.token);
        self.start_release(client, op);
    }

    fn remember_indeterminate(&mut self, client: usize, keys: KeySet, hist: HistRefs) {
        let proc = &mut self.parts().clients[client];
        if proc.recent_indeterminate.len() >= RECENT_INDETERMINATE_MAX {
            proc.recent_indeterminate.remove(0);
        }
        proc.recent_indeterminate.push((keys, hist));
    }

    /// Schedules a retry of operation `id` at local instant `at_local_us`,
    /// or now if a leader became reachable since its attempt was made; a
    /// leader that becomes reachable before then brings it forward
    /// ([`ClientWorld::wake_retries`]).
    fn schedule_retry(&mut self, client: usize, id: u64, at_local_us: u64) {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        let fallback_us = proc.clock.true_at(at_local_us).max(now_us);
        let epoch = proc.link.leader_epoch();
        let wait = proc.retries.entry(id).or_insert(RetryWait {
            epoch,
            fallback_us: None,
        });
        wait.fallback_us = Some(fallback_us);
        let at = if wait.epoch == epoch {
            fallback_us
        } else {
            now_us
        };
        self.schedule_client(at, client, inc, ClientEv::OpRetry(id));
    }

    /// A leader became reachable for `client`: every v3 operation waiting
    /// to retry since an attempt made before it retries now.
    fn wake_retries(&mut self, client: usize) {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &parts.clients[client];
        let inc = proc.inc;
        let epoch = proc.link.leader_epoch();
        let due: Vec<u64> = proc
            .retries
            .iter()
            .filter(|(_, wait)| wait.fallback_us.is_some() && wait.epoch != epoch)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.note(|| format!("client {client} op {id}: retried on a leader notice"));
            self.schedule_client(now_us, client, inc, ClientEv::OpRetry(id));
        }
    }

    /// Whether an `OpRetry` of operation `id` runs: always for a line
    /// call; for a v3 operation only while it waits to retry and the wait
    /// is over (its fallback instant came, or a leader became reachable
    /// since its attempt). An early retry leaves its fallback event
    /// behind, which then finds nothing to do.
    fn retry_due(&mut self, client: usize, id: u64) -> bool {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        if matches!(proc.ops.get(&id), Some(OpState::Line(_))) {
            return true;
        }
        let epoch = proc.link.leader_epoch();
        let Some(wait) = proc.retries.get(&id) else {
            return false;
        };
        match wait.fallback_us {
            Some(fallback_us) => now_us >= fallback_us || wait.epoch != epoch,
            None => false,
        }
    }

    fn acquire_step(&mut self, client: usize, id: u64, step: AcquireStep) {
        if let AcquireStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let parts = self.parts();
        let drift = parts.config.drift_ppm_max;
        let Some(OpState::Acquiring { op, plan, hist, .. }) = parts.clients[client].ops.remove(&id)
        else {
            return;
        };
        let lease_min_us = lease_min_us(duration_us(op.params().lease()), drift);
        self.note(|| format!("client {client} op {id}: {step:?}"));
        match step {
            AcquireStep::Granted(grant) => {
                self.parts().rec.report.grants += 1;
                self.on_grant(client, grant.token, true);
                let token = grant.token;
                self.resolve_history(&hist, |_| LinOp::Granted {
                    token,
                    lease_min_us,
                });
                self.start_holding(client, id, grant, plan, op.params().lease_s());
            }
            AcquireStep::Compensate { grant, .. } => {
                let token = grant.token;
                self.on_grant(client, token, false);
                self.resolve_history(&hist, |_| LinOp::Granted {
                    token,
                    lease_min_us,
                });
                let local = self.local_now(client);
                let release = ReleaseOperation::new(instant(local), grant.keys, grant.token);
                self.start_release(client, release);
            }
            AcquireStep::Failed(ClientError::Timeout | ClientError::Busy) => {
                self.forget_history(&hist);
            }
            AcquireStep::Failed(ClientError::Indeterminate) => {
                self.remember_indeterminate(client, op.keys().clone(), hist);
            }
            AcquireStep::Failed(ClientError::ClientCapacity) => self.forget_history(&hist),
            AcquireStep::Failed(error) => {
                self.violation(
                    Checker::Client,
                    format!("client {client} op {id}: acquire failed with {error:?}"),
                );
            }
            AcquireStep::RetryAt(_) => unreachable!("handled above"),
        }
        self.after_op_step(client);
    }

    fn resolve_history(&mut self, hist: &[(usize, usize)], map: impl Fn(LinOp) -> LinOp) {
        let parts = self.parts();
        parts.history.resolve(parts.now_us, hist, map);
    }

    fn forget_history(&mut self, hist: &[(usize, usize)]) {
        self.parts().history.forget(hist);
    }

    fn start_holding(&mut self, client: usize, id: u64, grant: Grant, plan: Plan, lease_s: u8) {
        let (holding, era) = self.new_holding(grant.token);
        self.check_deadline(client, grant.token, grant.valid_before.as_micros(), lease_s);
        let local = self.local_now(client);
        let parts = self.parts();
        let act_before_local_us = act_before_local_us(
            grant.valid_before.as_micros(),
            lease_s,
            parts.config.drift_ppm_max,
        );
        let now_us = parts.now_us;
        let renewal = plan.renew.clone().map(|plan| Renewal {
            plan,
            progress_local_us: local,
            writes_done: 0,
            extending: None,
        });
        let renews = renewal.is_some();
        let valid_before_us = grant.valid_before.as_micros();
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        proc.ops.insert(
            id,
            OpState::Holding {
                writes_left: plan.writes,
                grant,
                holding,
                plan,
                act_before_local_us,
                start_us: now_us,
                era,
                write_after_pause: false,
                lease_s,
                renewal,
            },
        );
        self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
        if renews {
            self.schedule_renewal(client, id, valid_before_us, lease_s);
        }
    }

    /// Deadline checker: the core's conservative deadline of a grant of
    /// `token` valid before `valid_before_us` (local) with a lease of
    /// `lease_s`, taken to true time, is not after the grant's expiry on
    /// the server whose answer gave it. Only where the world's clocks keep
    /// the rate error the core allows for ([`DRIFT_PARTS`]), and within
    /// one lease era (a server clock jump or restart ends leases early).
    fn check_deadline(&mut self, client: usize, token: u64, valid_before_us: u64, lease_s: u8) {
        let Some((conn, rid)) = self.parts().clients[client].answered.take() else {
            return;
        };
        let Some((expiry_us, era)) = self.answered_expiry(conn, rid) else {
            return;
        };
        let parts = self.parts();
        // Two clocks, each off by up to the bound, in opposite directions.
        let rate_error_ppm = 2 * u64::from(parts.config.drift_ppm_max);
        if era != parts.lease_era || rate_error_ppm > 1_000_000 / DRIFT_PARTS {
            return;
        }
        let watch = HolderWatch::new(
            instant(valid_before_us),
            Duration::from_secs(u64::from(lease_s)),
        );
        let deadline_us = parts.clients[client]
            .clock
            .true_at(watch.deadline().as_micros());
        parts.rec.report.deadlines_checked += 1;
        if deadline_us > expiry_us {
            self.violation(
                Checker::Deadlines,
                format!(
                    "client {client}: the deadline of token {token} ({deadline_us}) is after its expiry on the server that answered ({expiry_us})"
                ),
            );
        }
    }

    /// Schedules holder `id`'s next renewal a third of its lease after the
    /// last renewal (at the end of a lease valid before `valid_before_us`,
    /// less two thirds of it), as the CLI's `--renew` does.
    fn schedule_renewal(&mut self, client: usize, id: u64, valid_before_us: u64, lease_s: u8) {
        let lease_us = u64::from(lease_s) * 1_000_000;
        let due_local = valid_before_us.saturating_sub(lease_us * 2 / 3);
        let parts = self.parts();
        let proc = &parts.clients[client];
        let at = proc.clock.true_at(due_local).max(parts.now_us);
        let inc = proc.inc;
        self.schedule_client(at, client, inc, ClientEv::RenewStep(id));
    }

    /// Holder `id` renews its lease if its work showed life within its
    /// progress timeout and its deadline has not passed (a renewal never
    /// tries to win back a grant the holder already had to let go of).
    fn renew_step(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        let parts = self.parts();
        let safety = parts.safety;
        let Some(OpState::Holding {
            grant,
            act_before_local_us,
            lease_s,
            renewal: Some(renewal),
            ..
        }) = parts.clients[client].ops.get_mut(&id)
        else {
            return;
        };
        let alive =
            local.saturating_sub(renewal.progress_local_us) <= renewal.plan.progress_timeout_us;
        if !safety || !alive || renewal.extending.is_some() || local >= *act_before_local_us {
            // No renewal: the lease runs out and the holder stops at its
            // deadline (the work step sees it).
            return;
        }
        let lease_s = *lease_s;
        let deadline = instant(
            local
                .saturating_add(duration_us(EXTEND_RETRY_WINDOW))
                .min(*act_before_local_us),
        );
        let Ok(op) = ExtendOperation::new(
            grant.keys.clone(),
            grant.token,
            Duration::from_secs(u64::from(lease_s)),
            deadline,
        ) else {
            return;
        };
        let ext_id = *parts.next_op;
        *parts.next_op += 1;
        renewal.extending = Some(ext_id);
        let lease_min_us = lease_min_us(u64::from(lease_s) * 1_000_000, parts.config.drift_ppm_max);
        let token = grant.token;
        let hist = parts.history.open(
            parts.now_us,
            op.keys(),
            LinOp::ExtendIndeterminate {
                token,
                lease_min_us,
            },
        );
        parts.clients[client].ops.insert(
            ext_id,
            OpState::Extending {
                op,
                attempt: None,
                holder: id,
                lease_s,
                any_indeterminate: false,
                hist,
            },
        );
        self.note(|| format!("client {client} op {ext_id}: renew token {token} of holder {id}"));
        self.op_attempt(client, ext_id);
    }

    /// A renewal took a step: on an answer, its holder learns its new
    /// deadline (renewed), that its grant is gone (`N`: it stops now), or
    /// nothing (no definite answer: the old deadline stands, and the next
    /// renewal by the same token settles it).
    fn extend_step(&mut self, client: usize, id: u64, step: ExtendStep) {
        if let ExtendStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Extending {
            op,
            holder,
            lease_s,
            any_indeterminate,
            hist,
            ..
        }) = self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        self.note(|| format!("client {client} op {id}: {step:?}"));
        let token = op.token();
        let drift = self.parts().config.drift_ppm_max;
        let ExtendStep::Done(done) = step else {
            unreachable!("handled above")
        };
        let mut renewed = None;
        let mut lost = false;
        match done {
            Ok(extension) => {
                self.parts().rec.report.extensions += 1;
                let lease_min_us = match extension.status {
                    ExtendStatus::Extended => lease_min_us(u64::from(lease_s) * 1_000_000, drift),
                    // Cut at the hold cap: the model learns nothing of how
                    // long the lease still runs.
                    _ => 0,
                };
                self.resolve_history(&hist, |_| LinOp::Extended {
                    token,
                    lease_min_us,
                });
                self.check_deadline(client, token, extension.valid_before.as_micros(), lease_s);
                renewed = Some(extension.valid_before.as_micros());
            }
            Err(ClientError::Lost) => {
                self.parts().rec.report.extensions_refused += 1;
                if !any_indeterminate {
                    self.resolve_history(&hist, |_| LinOp::NotFound { token });
                }
                lost = true;
            }
            Err(ClientError::Indeterminate) => {}
            Err(ClientError::Timeout | ClientError::ClientCapacity) => {
                if !any_indeterminate {
                    self.forget_history(&hist);
                }
            }
            Err(error) => {
                self.violation(
                    Checker::Client,
                    format!("client {client} op {id}: renewal failed with {error:?}"),
                );
            }
        }
        self.parts().clients[client].answered = None;
        let local = self.local_now(client);
        let parts = self.parts();
        let Some(OpState::Holding {
            grant,
            act_before_local_us,
            renewal: Some(renewal),
            ..
        }) = parts.clients[client].ops.get_mut(&holder)
        else {
            return;
        };
        if grant.token != token {
            return;
        }
        renewal.extending = None;
        let mut next_from = grant.valid_before.as_micros();
        if lost {
            // The grant is gone: stop acting now.
            *act_before_local_us = (*act_before_local_us).min(local);
            let inc = parts.clients[client].inc;
            let now_us = parts.now_us;
            return self.schedule_client(now_us, client, inc, ClientEv::WorkStep(holder));
        }
        if let Some(valid_before_us) = renewed {
            *act_before_local_us =
                crate::clock::act_before_local_us(valid_before_us, lease_s, drift);
            grant.valid_before = instant(valid_before_us);
            next_from = valid_before_us;
        }
        // Without an answer the next renewal is due from the old end, or
        // at once if that is already past.
        self.schedule_renewal(client, holder, next_from.max(local), lease_s);
    }

    /// A holder's next step: write (checked against its validity window,
    /// or unchecked right after a pause that came between check and
    /// write), pause before a write, or finish.
    fn work_step(&mut self, client: usize, id: u64) {
        enum Action {
            Finish,
            Pause,
            Write {
                checked: bool,
            },
            /// The work hangs: nothing happens until the deadline.
            Hang {
                until_local_us: u64,
            },
        }
        let local = self.local_now(client);
        let parts = self.parts();
        let inc = parts.clients[client].inc;
        let pause_chance = if parts.safety {
            parts.config.faults.pause_before_write_ppm
        } else {
            0
        };
        let pause_max_us = parts.config.faults.pause_max_us;
        let Some(OpState::Holding {
            grant,
            holding,
            era,
            writes_left,
            act_before_local_us,
            write_after_pause,
            plan,
            renewal,
            ..
        }) = parts.clients[client].ops.get_mut(&id)
        else {
            return;
        };
        let stalled = renewal.as_ref().is_some_and(|renewal| {
            renewal
                .plan
                .stall_after
                .is_some_and(|after| renewal.writes_done >= after)
        });
        let action = if *write_after_pause {
            *write_after_pause = false;
            Action::Write { checked: false }
        } else if stalled && local < *act_before_local_us {
            Action::Hang {
                until_local_us: *act_before_local_us,
            }
        } else if *writes_left > 0 && local < *act_before_local_us {
            if pause_chance > 0 && parts.fault_rng.chance(pause_chance) {
                // Checked, then stopped before writing: the write lands
                // after the pause, perhaps long after the lease.
                *write_after_pause = true;
                Action::Pause
            } else {
                Action::Write { checked: true }
            }
        } else {
            Action::Finish
        };
        if matches!(action, Action::Write { .. }) {
            *writes_left = writes_left.saturating_sub(1);
            if let Some(renewal) = renewal.as_mut() {
                renewal.progress_local_us = local;
                renewal.writes_done = renewal.writes_done.saturating_add(1);
            }
        }
        let token = grant.token;
        let keys = key_indices(&grant.keys);
        let (gap, holding, era) = (plan.write_gap_us, *holding, *era);
        let now_us = parts.now_us;
        match action {
            Action::Finish => self.finish_holding(client, id),
            Action::Pause => {
                let parts = self.parts();
                let pause = parts.fault_rng.range(1, pause_max_us.max(1));
                parts.rec.report.faults += 1;
                self.pause_client(client, pause);
                self.note(|| format!("FAULT client {client} pauses {pause} µs before a write"));
                self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
            }
            Action::Write { checked } => {
                for key in keys {
                    self.db_write(client, key, token, holding, checked, era);
                }
                self.schedule_client(now_us + gap, client, inc, ClientEv::WorkStep(id));
            }
            Action::Hang { until_local_us } => {
                let parts = self.parts();
                let at = parts.clients[client]
                    .clock
                    .true_at(until_local_us)
                    .max(now_us + 1);
                self.schedule_client(at, client, inc, ClientEv::WorkStep(id));
            }
        }
    }

    /// The fenced resource: accepts a write iff its token is at least the
    /// key's high-water mark. A write the holder checked against its
    /// validity window (in the lease era of its grant) must not be fenced,
    /// and one token must not be accepted from two holdings.
    fn db_write(
        &mut self,
        client: usize,
        key: usize,
        token: u64,
        holding: u64,
        checked: bool,
        era: u64,
    ) {
        let parts = self.parts();
        let entry = parts.db[key];
        if token >= entry.high_water {
            parts.db[key] = DbKey {
                high_water: token,
                holding,
                client,
            };
            if token == entry.high_water && entry.holding != holding && entry.holding != 0 {
                self.violation(
                    Checker::Fencing,
                    format!(
                        "{}: token {token} accepted from two grants ({} and {holding})",
                        ALL_KEYS[key], entry.holding
                    ),
                );
            }
            self.note(|| {
                format!(
                    "db {}: write by client {client} token {token} accepted",
                    ALL_KEYS[key]
                )
            });
        } else {
            parts.rec.report.fenced_writes += 1;
            let lease_era = parts.lease_era;
            self.note(|| {
                format!(
                    "db {}: stale write by client {client} token {token} < {} fenced",
                    ALL_KEYS[key], entry.high_water
                )
            });
            if checked && lease_era == era {
                self.violation(
                    Checker::Fencing,
                    format!(
                        "{}: client {client} wrote inside its validity window with token {token}, but token {} (client {}) had already written",
                        ALL_KEYS[key], entry.high_water, entry.client
                    ),
                );
            }
        }
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

    /// The holding ends: its window is recorded, and the grant released
    /// or dropped as planned.
    fn finish_holding(&mut self, client: usize, id: u64) {
        let parts = self.parts();
        let Some(OpState::Holding {
            grant,
            holding,
            plan,
            act_before_local_us,
            start_us,
            era,
            ..
        }) = parts.clients[client].ops.remove(&id)
        else {
            return;
        };
        let clock = parts.clients[client].clock;
        let end_us = parts.now_us.min(clock.true_at(act_before_local_us));
        self.record_window(&grant, holding, start_us, end_us, era);
        if plan.release && self.parts().clients[client].line.is_some() {
            self.line_start_release(client, grant);
        } else if plan.release {
            let local = self.local_now(client);
            let op = ReleaseOperation::new(instant(local), grant.keys, grant.token);
            self.start_release(client, op);
        } else {
            self.note(|| format!("client {client} drops ticket {}", grant.token));
        }
        self.after_op_step(client);
    }

    /// Validity-window checker: no two holdings of a key (in one lease
    /// era) have overlapping windows in true time.
    fn record_window(&mut self, grant: &Grant, holding: u64, start_us: u64, end_us: u64, era: u64) {
        let window = Window {
            start_us,
            end_us,
            holding,
            token: grant.token,
            era,
        };
        for detail in self.parts().windows.record(grant, window) {
            self.violation(Checker::Fencing, detail);
        }
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

    fn start_release(&mut self, client: usize, op: ReleaseOperation) {
        let parts = self.parts();
        let id = *parts.next_op;
        *parts.next_op += 1;
        let hist = parts.history.open(
            parts.now_us,
            op.keys(),
            LinOp::ReleaseIndeterminate { token: op.token() },
        );
        self.note(|| {
            format!(
                "client {client} op {id}: release {:?} token {}",
                op.keys(),
                op.token()
            )
        });
        self.parts().clients[client].ops.insert(
            id,
            OpState::Releasing {
                op,
                attempt: None,
                any_indeterminate: false,
                hist,
            },
        );
        self.op_attempt(client, id);
    }

    fn release_step(&mut self, client: usize, id: u64, step: ReleaseStep) {
        if let ReleaseStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Releasing {
            op,
            any_indeterminate,
            hist,
            ..
        }) = self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        self.note(|| format!("client {client} op {id}: {step:?}"));
        let token = op.token();
        match step {
            ReleaseStep::Done(Ok(ReleaseOutcome::Released)) => {
                self.resolve_history(&hist, |_| LinOp::Released { token });
            }
            ReleaseStep::Done(Ok(ReleaseOutcome::AlreadyGoneOrNotCurrent)) => {
                // Unless an earlier attempt may have released it.
                if !any_indeterminate {
                    self.resolve_history(&hist, |_| LinOp::NotFound { token });
                }
            }
            ReleaseStep::Done(Err(error)) => match self.release_failure(error) {
                ReleaseFailure::LeaveOpen => {}
                ReleaseFailure::Forget => {
                    if !any_indeterminate {
                        self.forget_history(&hist);
                    }
                }
                ReleaseFailure::Unexpected(what) => {
                    self.violation(Checker::Client, format!("client {client} op {id}: {what}"));
                }
            },
            ReleaseStep::RetryAt(_) => unreachable!("handled above"),
        }
    }

    /// Cancels acquire `id` while its attempt is in flight.
    fn cancel_op(&mut self, client: usize, id: u64) {
        let Some(OpState::Acquiring {
            attempt: Some((conn, rid)),
            ..
        }) = self.parts().clients[client].ops.get(&id)
        else {
            return;
        };
        let (conn, rid) = (*conn, *rid);
        let Some((outcome, slot)) = self.cancel_in_session(client, conn, rid) else {
            return;
        };
        self.note(|| format!("client {client} cancels op {id} (rid {rid}): {outcome:?}"));
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Acquiring { hist, op, .. }) =
            self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        match outcome {
            CancelOutcome::Unsent => self.forget_history(&hist),
            CancelOutcome::PossiblySent | CancelOutcome::Withdrawn | CancelOutcome::Unknown => {
                self.remember_indeterminate(client, op.keys().clone(), hist);
            }
        }
        self.client_pump(client, slot);
    }

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

    /// Cancels `rid` in `client`'s session on connection `conn`, if that
    /// is still the session's connection: the outcome and the slot.
    fn cancel_in_session(
        &mut self,
        client: usize,
        conn: u64,
        rid: u64,
    ) -> Option<(CancelOutcome, u8)> {
        let local = self.local_now(client);
        let slot = self.slot_of(conn)?;
        let (session, current) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()?;
        (*current == conn).then(|| (session.cancel(instant(local), rid), slot))
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

    /// `slot`'s session timer fires, if it is still the one armed.
    fn client_timer(&mut self, client: usize, slot: u8, generation: u64) {
        let s = usize::from(slot);
        let link = &mut self.parts().clients[client].link;
        if link.timer_generation[s] == generation {
            link.armed[s] = None;
            let local = self.local_now(client);
            if let Some((session, _)) = self.parts().clients[client].link.sessions[s].as_mut() {
                session.handle_timeout(instant(local));
            }
            self.client_pump(client, slot);
        }
    }

    /// Bytes from connection `conn` reach `client`'s session on `slot`
    /// (if that is still its connection).
    fn client_input(&mut self, client: usize, slot: u8, conn: u64, bytes: &[u8]) {
        if self.parts().clients[client].line.is_some() {
            return self.line_input(client, conn, bytes);
        }
        let local = self.local_now(client);
        if let Some((session, current)) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            && *current == conn
        {
            session.handle_input(instant(local), bytes);
        }
        self.client_pump(client, slot);
    }

    /// `client` learns that connection `conn` of its session on `slot` is
    /// gone.
    fn transport_closed(&mut self, client: usize, slot: u8, conn: u64) {
        if self.parts().clients[client].line.is_some() {
            return self.line_closed(client, conn, false);
        }
        let local = self.local_now(client);
        if let Some((session, open)) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            && *open == conn
        {
            session.handle_transport_closed(instant(local));
        }
        self.client_pump(client, slot);
    }

    /// A client clock jump (or other kick): every session looks at its
    /// deadlines now.
    fn client_timeouts(&mut self, client: usize) {
        let local = self.local_now(client);
        for slot in 0..self.parts().clients[client].link.slots() {
            if let Some((session, _)) =
                self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            {
                session.handle_timeout(instant(local));
            }
            self.client_pump(client, slot);
        }
    }

    /// After any input to `client`'s session on `slot`: handle its
    /// events, hand out its bytes, re-arm its timer.
    fn client_pump(&mut self, client: usize, slot: u8) {
        let s = usize::from(slot);
        loop {
            let local = self.local_now(client);
            let Some((session, conn)) = self.parts().clients[client].link.sessions[s].as_mut()
            else {
                return;
            };
            let conn = *conn;
            let mut events = Vec::new();
            while let Some(event) = session.poll_event() {
                events.push(event);
            }
            let mut out = Vec::new();
            if !session.is_closed() {
                session.poll_transmit(instant(local), &mut out);
            }
            if events.is_empty() && out.is_empty() {
                break;
            }
            self.send_from_client(conn, out);
            for event in events {
                let epoch = self.parts().clients[client].link.leader_epoch();
                if let Some(router) = self.parts().clients[client].link.router.as_mut() {
                    router.handle_event(s, &event);
                }
                self.session_event(client, slot, conn, event);
                if self.parts().clients[client].link.leader_epoch() != epoch {
                    self.wake_retries(client);
                }
            }
        }
        let local = self.local_now(client);
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let link = &mut proc.link;
        let deadline = link.sessions[s]
            .as_ref()
            .and_then(|(session, _)| session.poll_timeout());
        if deadline == link.armed[s] {
            return;
        }
        link.armed[s] = deadline;
        if let Some(deadline) = deadline {
            link.timer_generation[s] += 1;
            let generation = link.timer_generation[s];
            let inc = proc.inc;
            let at = proc
                .clock
                .true_at(deadline.as_micros().max(local))
                .max(parts.now_us);
            self.schedule_client(at, client, inc, ClientEv::Timer { slot, generation });
        }
    }

    fn session_event(&mut self, client: usize, slot: u8, conn: u64, event: SessionEvent) {
        let name = Self::CONN;
        match event {
            SessionEvent::Ready => self.on_ready(client, slot, conn),
            SessionEvent::Outcome { rid, outcome } => {
                self.note(|| format!("client {client} {name} {conn} rid {rid}: {outcome:?}"));
                self.attempt_outcome(client, conn, rid, outcome);
            }
            SessionEvent::Compensate(compensation) => self.compensate(client, compensation),
            SessionEvent::Closed(reason) => self.session_closed(client, slot, conn, reason),
            SessionEvent::LeaderHint(_) | SessionEvent::NotLeader => self.on_leader_notice(client),
            SessionEvent::Push { token, kind, .. } => self.on_push(client, token, kind),
        }
    }

    /// A push about grant `token`: a loss stops its holder now (a push may
    /// only ever make a holder stop earlier); an "ending soon" changes
    /// nothing (the holder's own deadline already bounds it).
    fn on_push(&mut self, client: usize, token: u64, kind: ticketing_core::wire::PushKind) {
        self.note(|| format!("client {client} push {kind:?} for token {token}"));
        if LossCause::of_push(kind).is_none() {
            return;
        }
        let local = self.local_now(client);
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        let holder = proc.ops.iter_mut().find_map(|(&id, op)| match op {
            OpState::Holding {
                grant,
                act_before_local_us,
                ..
            } if grant.token == token => {
                *act_before_local_us = (*act_before_local_us).min(local);
                Some(id)
            }
            _ => None,
        });
        if let Some(id) = holder {
            self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
        }
    }

    /// `client`'s session on `slot` ended: it reconnects after its
    /// backoff, and drops the transport.
    fn session_closed(&mut self, client: usize, slot: u8, conn: u64, reason: CloseReason) {
        let name = Self::CONN;
        self.note(|| format!("client {client} {name} {conn} closed: {reason:?}"));
        let s = usize::from(slot);
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let link = &mut proc.link;
        let lived = link.sessions[s]
            .as_ref()
            .filter(|(_, current)| *current == conn)
            .and_then(|(session, _)| session.lived());
        if link.sessions[s].as_ref().is_some_and(|(_, c)| *c == conn) {
            link.sessions[s] = None;
            link.armed[s] = None;
        }
        let delay = link.backoffs[s].after_session(lived, Some(&reason));
        let inc = proc.inc;
        let at = parts.now_us + duration_us(delay);
        self.schedule_client(at, client, inc, ClientEv::Connect(slot));
        self.close_transport(conn);
        if !self.close_expected(&reason) {
            self.violation(
                Checker::Client,
                format!("client {client} {name} {conn} closed by the protocol: {reason:?}"),
            );
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
