//! Where requests go and when to reconnect: [`Router`] picks a ready
//! connection (leader first), [`Backoff`] spaces reconnects.
use super::error::{ClientError, CloseReason};
use super::session::{Session, SessionEvent};
use crate::time::Duration;

/// First reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(3200);

/// A session that lived at least this long (from ready to closed) resets the
/// backoff and reconnects at once.
pub const SHORT_SESSION: Duration = Duration::from_secs(1);

/// [`Router::pick_coalescing`] keeps sending to one connection for at most
/// this many requests in a row, then moves to the next ready one.
pub const ROUTE_RUN_REQUESTS: usize = 1024;

/// [`Router::pick_coalescing`] moves on from a connection on which this
/// many requests wait for a write, so one whose writes stall cannot draw
/// every request to itself.
pub const COALESCE_MAX_UNSENT: usize = 256;

/// Reconnect delays of one connection: 100 ms doubling to 3.2 s after every
/// failed connect or short session; a session that was ready for at least
/// [`SHORT_SESSION`] resets it and reconnects at once. No jitter, so runs
/// are reproducible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
}

impl Backoff {
    /// A fresh backoff.
    pub fn new() -> Self {
        Self::default()
    }
    /// The delay before the next connect after a failed connect or handshake.
    pub fn after_connect_failure(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
    /// The delay before reconnecting after `session` (the endpoint's last
    /// session, if any) ended, or `None` when reconnecting cannot help: it
    /// failed authentication (a wrong token, or not the configured server).
    pub fn after_ended(&mut self, session: Option<&Session>) -> Option<Duration> {
        let reason = session.and_then(Session::close_reason);
        if reason.is_some_and(CloseReason::is_auth_failure) {
            return None;
        }
        Some(self.after_session(session.and_then(Session::lived), reason))
    }
    /// The delay before the next connect after a session ended;
    /// `lived` = [`Session::lived`] (`None`: it never became ready),
    /// `reason` = [`Session::close_reason`].
    pub fn after_session(
        &mut self,
        lived: Option<Duration>,
        reason: Option<&CloseReason>,
    ) -> Duration {
        if reason.is_some_and(|reason| reason.is_routing() || reason.refuses_extensions()) {
            // A node that answered `E 3` is reachable (a learner catching
            // up, or a node shutting down; `E 4` keeps the session, so it
            // is met here only from a server that closes after it), and
            // growing the backoff would keep the client away from it for
            // up to 3.2 s once it can serve. Come back soon, without
            // spinning. A server that closed on our `X` is reachable too,
            // and the next session does not negotiate.
            self.next = BACKOFF_MIN;
            return BACKOFF_MIN;
        }
        match lived {
            Some(lived) if lived >= SHORT_SESSION => {
                self.next = BACKOFF_MIN;
                Duration::ZERO
            }
            _ => self.after_connect_failure(),
        }
    }
}

/// Picks the connection for each request: the remembered leader if it is
/// ready, else round-robin over ready connections ([`Router::pick`]) or in
/// runs ([`Router::pick_coalescing`]). Connection `i` of a cluster is slot
/// `i`. It also counts the leader notices an attempt that had no effect
/// waits for ([`Router::leader_epoch`]).
#[derive(Clone, Debug)]
pub struct Router {
    ready: Vec<bool>,
    leader: Option<usize>,
    /// The remembered leader while its connection is ready, as last
    /// counted in `leader_epoch`.
    reachable_leader: Option<usize>,
    leader_epoch: u64,
    next_rr: usize,
    /// The connection of the current run of [`Router::pick_coalescing`]
    /// and how many requests it has taken.
    run: Option<usize>,
    run_len: usize,
    auth_failed: bool,
}

impl Router {
    /// A router over `connections` connections (all down).
    pub fn new(connections: usize) -> Self {
        Router {
            ready: vec![false; connections],
            leader: None,
            reachable_leader: None,
            leader_epoch: 0,
            next_rr: 0,
            run: None,
            run_len: 0,
            auth_failed: false,
        }
    }
    /// Number of connections.
    pub fn len(&self) -> usize {
        self.ready.len()
    }
    /// True when there are no connections.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }
    /// The remembered leader's connection.
    pub fn leader(&self) -> Option<usize> {
        self.leader
    }
    /// How many times a leader became reachable: the remembered leader
    /// changed to a node whose connection is ready, or the remembered
    /// leader's connection became ready (an `L` or `M` naming a new leader,
    /// or the session to the named leader coming up). An attempt answered
    /// "no effect, try again" (`E 4`, `M`) while this stood still waits
    /// for it to move, or for its fallback delay
    /// ([`super::run_acquire`]): the request then goes to the new
    /// leader as soon as it is known, not at the next step of a fixed
    /// schedule. A leader forgotten (`L` naming none, its connection down)
    /// does not count: there is nowhere to retry.
    pub fn leader_epoch(&self) -> u64 {
        self.leader_epoch
    }
    /// Counts a newly reachable leader in `leader_epoch`. *Why this does
    /// not make retries spin:* each count needs a notice or an `M` naming
    /// another node than the last one (or a session coming up), and the
    /// nodes of a correct cluster name another leader only when the
    /// leadership changed; so retries on notices are bounded by leader
    /// changes, the rest wait their fallback delays.
    fn note_reachable_leader(&mut self) {
        let reachable = self.leader.filter(|&leader| self.is_ready(leader));
        if reachable != self.reachable_leader {
            self.reachable_leader = reachable;
            if reachable.is_some() {
                self.leader_epoch += 1;
            }
        }
    }
    /// Whether connection `index` is ready.
    pub fn is_ready(&self, index: usize) -> bool {
        self.ready.get(index).copied().unwrap_or(false)
    }
    /// True once any connection failed authentication.
    pub fn auth_failed(&self) -> bool {
        self.auth_failed
    }
    /// The error for "no connection to use right now".
    pub fn no_connection_error(&self) -> ClientError {
        if self.auth_failed {
            ClientError::Auth
        } else {
            ClientError::NotConnected
        }
    }
    /// Updates from an event of connection `index`'s session.
    pub fn handle_event(&mut self, index: usize, event: &SessionEvent) {
        match event {
            SessionEvent::Ready => self.set_ready(index, true),
            SessionEvent::LeaderHint(slot) => {
                self.set_leader_hint(*slot);
            }
            SessionEvent::NotLeader => {
                self.forget_leader_if(index);
                // The session stays up over `E 4` (the node answered; it
                // may lead after the election), but the next requests
                // go to the next ready connection rather than to the
                // same node again: a node cut off from the others
                // answers `E 4` for as long as the cut lasts.
                if self.run == Some(index) {
                    self.run_len = ROUTE_RUN_REQUESTS;
                }
            }
            SessionEvent::Closed(reason) => {
                self.set_ready(index, false);
                if reason.is_auth_failure() {
                    self.auth_failed = true;
                }
            }
            SessionEvent::Outcome { .. }
            | SessionEvent::Compensate(_)
            | SessionEvent::Push { .. } => {}
        }
        self.note_reachable_leader();
    }
    /// Marks connection `index` ready or down; a down leader is forgotten.
    pub fn set_ready(&mut self, index: usize, ready: bool) {
        if let Some(flag) = self.ready.get_mut(index) {
            *flag = ready;
        }
        if !ready {
            self.forget_leader_if(index);
        }
        self.note_reachable_leader();
    }
    /// Remembers the leader named by `L` or `M` (`None` = no leader known).
    /// Returns false (and changes nothing) for a slot with no connection.
    pub fn set_leader_hint(&mut self, slot: Option<u8>) -> bool {
        match slot.map(usize::from) {
            None => self.leader = None,
            Some(index) if index < self.ready.len() => self.leader = Some(index),
            Some(_) => return false,
        }
        self.note_reachable_leader();
        true
    }
    fn forget_leader_if(&mut self, index: usize) {
        if self.leader == Some(index) {
            self.leader = None;
        }
    }
    /// The connection for the next request when requests share writes:
    /// the remembered leader if it is ready; else the connection the last
    /// requests went to, for up to [`ROUTE_RUN_REQUESTS`] requests in a
    /// row and while fewer than [`COALESCE_MAX_UNSENT`] of them wait for
    /// its next write (`unsent(index)` = [`Session::unsent_len`]); else the
    /// next ready one after it. The requests of one wake-up then leave in
    /// one write and their replies come back in one read, instead of one by
    /// one over every connection, and every ready connection still carries
    /// requests in turn (none idles until it is needed and found dead).
    pub fn pick_coalescing(&mut self, unsent: impl Fn(usize) -> usize) -> Option<usize> {
        if let Some(leader) = self.leader.filter(|&leader| self.is_ready(leader)) {
            return Some(leader);
        }
        if let Some(current) = self.run.filter(|&current| {
            self.is_ready(current)
                && self.run_len < ROUTE_RUN_REQUESTS
                && unsent(current) < COALESCE_MAX_UNSENT
        }) {
            self.run_len += 1;
            return Some(current);
        }
        // The next ready connection after the run's, the run's own only if
        // it is the only one ready.
        let count = self.ready.len();
        let after = match self.run {
            Some(current) => current + 1,
            None => {
                self.next_rr = self.next_rr.wrapping_add(1);
                self.next_rr
            }
        };
        self.run = (0..count)
            .map(|offset| (after + offset) % count)
            .find(|&index| self.ready[index]);
        self.run_len = 1;
        self.run
    }
    /// The connection for the next request, `None` if none is ready.
    pub fn pick(&mut self) -> Option<usize> {
        if let Some(leader) = self.leader.filter(|&leader| self.is_ready(leader)) {
            return Some(leader);
        }
        let count = self.ready.len();
        if count == 0 {
            return None;
        }
        let start = self.next_rr % count;
        self.next_rr = self.next_rr.wrapping_add(1);
        (0..count)
            .map(|offset| (start + offset) % count)
            .find(|&index| self.ready[index])
    }
}
