//! What every simulated world shares around its event loop: the checkers'
//! names and findings, the run report, the event queue ordered by
//! (time, sequence), and the recorder that hashes, traces and reports.
//!
//! Both worlds ([`crate::single::World`], [`crate::cluster::ClusterWorld`])
//! keep their own event enums (and event codes, so trace hashes stay what
//! they were); this is the machinery around them, and `driver` the one
//! loop that runs them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Which checker found a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Checker {
    /// Server state: one live holder per key, a set held by one grant.
    ServerState,
    /// Tokens strictly increasing and never reused, across restarts.
    Tokens,
    /// Grants follow waiters' arrival order.
    Fifo,
    /// Exactly one terminal reply per request; no lost waiter; no ghost grant.
    Replies,
    /// The fenced resource and the clients' validity windows.
    Fencing,
    /// Client-observed history against the sequential model.
    Linearizability,
    /// Everything outstanding resolves once faults stop.
    Liveness,
    /// A client saw something a correct server never causes.
    Client,
    /// Raft (cluster worlds): one leader per term, log matching, one
    /// committed entry per index, commit index never decreasing, equal
    /// replicated state at equal applied index.
    Raft,
    /// No renewal is answered "renewed" for a token that was not the
    /// current grant of its keys when the renewal arrived.
    Extensions,
    /// A holder's conservative deadline (the core's, from the send time of
    /// its last answered acquire or renewal) is never after the expiry of
    /// that grant on the server that answered.
    Deadlines,
}

impl Checker {
    /// Every checker.
    pub const ALL: [Checker; 11] = [
        Checker::ServerState,
        Checker::Tokens,
        Checker::Fifo,
        Checker::Replies,
        Checker::Fencing,
        Checker::Linearizability,
        Checker::Liveness,
        Checker::Client,
        Checker::Raft,
        Checker::Extensions,
        Checker::Deadlines,
    ];
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The checker.
    pub checker: Checker,
    /// True time of detection.
    pub at_us: u64,
    /// What was seen.
    pub detail: String,
}

/// The outcome of one run.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Requests the server received.
    pub requests: u64,
    /// Grants the clients saw.
    pub grants: u64,
    /// Faults injected.
    pub faults: u64,
    /// Fenced (rejected) stale writes: expected after pauses.
    pub fenced_writes: u64,
    /// Operator force-releases that revoked a grant (single world).
    pub force_releases: u64,
    /// Operator force-releases with a stale token (refused, no effect).
    pub force_releases_refused: u64,
    /// Violations, in order of detection (the run stops at the first few).
    pub violations: Vec<Violation>,
    /// Hash of the event trace: equal for equal runs.
    pub trace_hash: u64,
    /// Keys whose history was checked for linearizability.
    pub lin_keys_checked: u64,
    /// Keys whose search ran out of budget.
    pub lin_inconclusive: u64,
    /// True time at the end.
    pub end_us: u64,
    /// Line clients (published 0.3.0 model) in the world.
    pub line_clients: u64,
    /// Line requests resent after their connection closed while they were
    /// outstanding.
    pub line_resends: u64,
    /// Grants line clients received.
    pub line_grants: u64,
    /// Line connections closed by the client for `M`, `Eno_leader` or
    /// `Enot_active` (reconnect, resend).
    pub line_redirects: u64,
    /// Operator force-releases ordered (cluster worlds).
    pub cluster_force_releases: u64,
    /// Majority losses the operator recovered from (cluster worlds).
    pub cluster_majority_losses: u64,
    /// Of those, answered "released" / "indeterminate" / "token mismatch or
    /// not held" / refused (not the leader any more, busy).
    pub force_outcomes: [u64; 4],
    /// Renewals answered "renewed" (or clipped).
    pub extensions: u64,
    /// Renewals answered `N` (the grant was gone).
    pub extensions_refused: u64,
    /// Holders' deadlines compared with the answering server's expiry.
    pub deadlines_checked: u64,
}

/// Where a run is: faults and new work (safety), then none while
/// everything outstanding must resolve (liveness), then over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Safety,
    Liveness,
    Done,
}

/// A run stops after this many violations: later ones mostly echo the first.
pub(crate) const VIOLATIONS_MAX: usize = 4;

/// An event due at `at_us`; `seq` breaks ties in scheduling order.
pub(crate) struct Scheduled<E> {
    pub(crate) at_us: u64,
    seq: u64,
    pub(crate) ev: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_us, self.seq).cmp(&(other.at_us, other.seq))
    }
}

/// The event queue: earliest first, equal times in scheduling order (which
/// makes a run a pure function of its random draws).
pub(crate) struct Queue<E> {
    seq: u64,
    heap: BinaryHeap<Reverse<Scheduled<E>>>,
}

impl<E> Queue<E> {
    pub(crate) fn new() -> Self {
        Queue {
            seq: 0,
            heap: BinaryHeap::new(),
        }
    }

    pub(crate) fn push(&mut self, at_us: u64, ev: E) {
        let seq = self.seq;
        self.seq += 1;
        self.heap.push(Reverse(Scheduled { at_us, seq, ev }));
    }

    pub(crate) fn pop(&mut self) -> Option<Scheduled<E>> {
        self.heap.pop().map(|Reverse(next)| next)
    }
}

/// FNV-1a offset basis: the trace hash before any event.
const HASH_START: u64 = 0xcbf2_9ce4_8422_2325;
const HASH_PRIME: u64 = 0x0100_0000_01b3;

/// The report being built, the optional trace, and the trace hash.
pub(crate) struct Recorder<'t> {
    pub(crate) report: RunReport,
    trace: Option<&'t mut dyn std::io::Write>,
    hash: u64,
    /// Checkers whose findings are dropped (planted-bug tests switch the
    /// others off to see that one checker alone catches a bug).
    checkers_off: Vec<Checker>,
}

impl<'t> Recorder<'t> {
    pub(crate) fn new(seed: u64, checkers_off: Vec<Checker>) -> Self {
        Recorder {
            report: RunReport {
                seed,
                ..RunReport::default()
            },
            trace: None,
            hash: HASH_START,
            checkers_off,
        }
    }

    pub(crate) fn set_trace(&mut self, out: &'t mut dyn std::io::Write) {
        self.trace = Some(out);
    }

    pub(crate) fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn mix_byte(&mut self, byte: u8) {
        self.hash ^= u64::from(byte);
        self.hash = self.hash.wrapping_mul(HASH_PRIME);
    }

    fn mix(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.mix_byte(byte);
        }
    }

    /// Counts and hashes one event: its time, its code, the bytes it
    /// carries (tokens, rids, nonces), and one more number that names what
    /// it is about; traces it when tracing.
    pub(crate) fn event(
        &mut self,
        at_us: u64,
        code: u64,
        bytes: &[u8],
        extra: u64,
        shown: &dyn std::fmt::Debug,
    ) {
        self.report.events += 1;
        self.mix(at_us);
        self.mix(code);
        for &byte in bytes {
            self.mix_byte(byte);
        }
        self.mix(extra);
        if self.trace.is_some() {
            let line = format!("{:>12.6}s {:?}", at_us as f64 / 1e6, shown);
            self.trace_line(&line);
        }
    }

    pub(crate) fn trace_line(&mut self, line: &str) {
        if let Some(out) = self.trace.as_mut() {
            let _ = writeln!(out, "{line}");
        }
    }

    /// A trace note; `text` only runs when tracing.
    pub(crate) fn note(&mut self, text: impl FnOnce() -> String) {
        if self.trace.is_some() {
            let line = format!("              . {}", text());
            self.trace_line(&line);
        }
    }

    pub(crate) fn violation(&mut self, checker: Checker, at_us: u64, detail: String) {
        if self.checkers_off.contains(&checker) {
            return;
        }
        let line = format!("VIOLATION [{checker:?}] {detail}");
        self.trace_line(&line);
        self.report.violations.push(Violation {
            checker,
            at_us,
            detail,
        });
    }

    /// Whether the run should stop: enough violations found.
    pub(crate) fn saturated(&self) -> bool {
        self.report.violations.len() >= VIOLATIONS_MAX
    }

    pub(crate) fn finish(mut self, end_us: u64) -> RunReport {
        self.report.trace_hash = self.hash;
        self.report.end_us = end_us;
        self.report
    }
}

/// A byte string shown short in traces: the first 24 bytes.
pub(crate) struct Short<'a>(pub(crate) &'a [u8]);

impl std::fmt::Debug for Short<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.0[..self.0.len().min(24)];
        write!(f, "{shown:02x?}")?;
        if self.0.len() > shown.len() {
            write!(f, "…")?;
        }
        Ok(())
    }
}
