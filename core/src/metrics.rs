//! What the core counts for operators: plain counters, gauges and
//! fixed-bucket histograms, in base units (seconds, whole events).
//!
//! No IO and no clock: every observation is made by the state machine that
//! decided the event, from the `now` its caller passed, so the figures are
//! as deterministic as the decisions and can be tested with injected time.
//! The driver only reads a snapshot ([`crate::server::Server::metrics`],
//! [`crate::cluster::ClusterNode::metrics`]) and renders it; it counts
//! nothing itself.
//!
//! Counts are per process (they start at zero on every start) and only
//! grow, except the gauges. Nothing is kept per key and no gauge scans the
//! table, so a snapshot costs the same with a million keys as with one.

pub use crate::budget::AbuseCounts;
use crate::time::{Duration, duration_micros};
use crate::wire::{ErrorCode, Reply};

/// Upper bounds of the duration histograms' buckets, in microseconds: from
/// a millisecond to the longest lease or wait (250 s, 255 s); slower
/// observations land in the implicit `+Inf` bucket.
pub const DURATION_BUCKETS_US: [u64; 16] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    250_000_000,
];

/// A histogram of durations over [`DURATION_BUCKETS_US`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationHistogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [u64; DURATION_BUCKETS_US.len() + 1],
    /// Sum of all observations, microseconds (saturating).
    sum_us: u64,
    /// Number of observations.
    count: u64,
}

impl DurationHistogram {
    /// Records one duration (in whole microseconds, saturating: the
    /// histogram's grain).
    pub fn observe(&mut self, duration: Duration) {
        let us = duration_micros(duration);
        let bucket = DURATION_BUCKETS_US.partition_point(|&bound| bound < us);
        self.buckets[bucket] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_us as f64 / 1e6
    }

    /// Sum of the observations in microseconds (saturating).
    pub fn sum_us(&self) -> u64 {
        self.sum_us
    }

    /// `(upper bound in seconds, observations at or below it)` for every
    /// finite bucket, ascending; the `+Inf` bucket is [`Self::count`].
    pub fn cumulative_seconds(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        DURATION_BUCKETS_US
            .iter()
            .zip(self.buckets.iter())
            .map(|(&bound_us, &n)| {
                total += n;
                (bound_us as f64 / 1e6, total)
            })
            .collect()
    }

    /// `(upper bound in seconds, observations in that bucket alone)` for
    /// every bucket, ascending, ending with `(+Inf, slower ones)`: the
    /// shape exposition encoders take.
    pub fn buckets_seconds(&self) -> Vec<(f64, u64)> {
        DURATION_BUCKETS_US
            .iter()
            .map(|&bound_us| bound_us as f64 / 1e6)
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().copied())
            .collect()
    }

    /// Observations at or below `bound_us`, which must be one of
    /// [`DURATION_BUCKETS_US`] (else those of the first bucket above it).
    pub fn count_at_most_us(&self, bound_us: u64) -> u64 {
        let last = DURATION_BUCKETS_US.partition_point(|&bound| bound < bound_us);
        self.buckets[..=last.min(DURATION_BUCKETS_US.len())]
            .iter()
            .sum()
    }
}

/// Acquires answered `B` by the lock table, by the limit that was reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusyByLimit {
    /// `keys_max`: the table has no room for another key.
    pub keys_max: u64,
    /// `waiters_per_key_max`: a requested key's queue is full.
    pub waiters_per_key_max: u64,
    /// `waiters_total_max`: the table holds as many waiters as allowed.
    pub waiters_total_max: u64,
    /// The token reserve: the next token is not durable yet.
    pub token_reserve: u64,
}

/// Permit requests answered `B` by the semaphores' own limits (single
/// mode); a `B` from the lock table under them (keys, token reserve) is
/// counted in [`BusyByLimit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SemaphoreBusy {
    /// No room for another semaphore (at most `keys_max` of them).
    pub semaphores_max: u64,
    /// The semaphore's queue is full (`waiters_per_key_max`).
    pub waiters_per_semaphore_max: u64,
    /// As many permit waiters as `waiters_total_max` allows.
    pub waiters_total_max: u64,
}

impl SemaphoreBusy {
    /// Every `B` counted here.
    pub fn total(&self) -> u64 {
        self.semaphores_max + self.waiters_per_semaphore_max + self.waiters_total_max
    }
}

/// What the single-mode lock table counted ([`crate::lock::LockTable`]).
///
/// A key set counts once per grant, release or expiry, like one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockMetrics {
    /// Acquires granted on arrival.
    pub grants_immediate: u64,
    /// Queued acquires granted later (after a release, an expiry, a
    /// cancelled or timed-out waiter ahead, or a raised token limit).
    pub grants_after_wait: u64,
    /// Releases that released a current grant.
    pub releases: u64,
    /// Waiters granted because of a release (one release of a key set can
    /// hand over to several).
    pub handovers_on_release: u64,
    /// Releases ordered by an operator (`POST /v1/locks/{key}/release`);
    /// each is also counted in `releases` (and its hand-overs in
    /// `handovers_on_release`), since it is exactly a release.
    pub force_releases: u64,
    /// Leases that ran out and whose key went to a waiter at once.
    pub expiries_handed_over: u64,
    /// Leases that ran out with nobody to hand over to. Keys nobody waits
    /// for expire lazily: counted when the table notices (the next acquire
    /// of the key, or the sweep every 5 s).
    pub expiries_not_handed_over: u64,
    /// Acquires with wait 0 on a held key (`T` at once).
    pub timeouts_wait_zero: u64,
    /// Queued acquires whose wait ran out (`T`).
    pub timeouts_wait_ended: u64,
    /// Queued acquires ended by shutdown (`T`).
    pub timeouts_shutdown: u64,
    /// Acquires answered `B` by the table, by limit.
    pub busy: BusyByLimit,
    /// Lease extensions, by outcome.
    pub extensions: ExtensionCounts,
    /// Leases that ran out after at least one extension had moved them
    /// (also counted in the two expiry counts above).
    pub expiries_extended: u64,
    /// Time from an acquire's arrival to its grant; an immediate grant
    /// observes 0. One observation per grant.
    pub wait: DurationHistogram,
    /// Time from a grant to its release or the end of its lease. One
    /// observation per release or expiry.
    pub hold: DurationHistogram,
}

impl LockMetrics {
    /// Every grant.
    pub fn grants(&self) -> u64 {
        self.grants_immediate + self.grants_after_wait
    }

    /// Every lease expiry.
    pub fn expiries(&self) -> u64 {
        self.expiries_handed_over + self.expiries_not_handed_over
    }

    /// Every `B` the table answered.
    pub fn busy_total(&self) -> u64 {
        let b = &self.busy;
        b.keys_max + b.waiters_per_key_max + b.waiters_total_max + b.token_reserve
    }
}

/// Pushes (`P`) sent to holders that asked for them, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushCounts {
    /// The lease ends soon.
    pub lease_ending: u64,
    /// Lost: the lease ran out.
    pub expired: u64,
    /// Lost: an operator force-released it.
    pub force_released: u64,
    /// Lost: the lease ran out at the hold cap.
    pub cap_reached: u64,
}

impl PushCounts {
    /// Counts one push of `kind`.
    pub fn count(&mut self, kind: crate::wire::PushKind) {
        use crate::wire::PushKind;
        let counter = match kind {
            PushKind::LeaseEnding => &mut self.lease_ending,
            PushKind::Expired => &mut self.expired,
            PushKind::ForceReleased => &mut self.force_released,
            PushKind::CapReached => &mut self.cap_reached,
        };
        *counter += 1;
    }
}

/// The kinds of reply a server sends, by their wire letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReplyKind {
    /// `A`: granted.
    Acquired,
    /// `S`: a key set granted.
    AcquiredSet,
    /// `R`: released.
    Released,
    /// `G`: a key set released.
    ReleasedSet,
    /// `N`: the token is not current.
    NotFound,
    /// `T`: the wait ended without the lock.
    TimedOut,
    /// `B`: a limit was reached.
    Busy,
    /// `I`: the outcome is unknown (cluster).
    Indeterminate,
    /// `M`: ask the leader (cluster).
    Moved,
    /// `E`: an error (see [`ReplyCounts::errors`] for codes).
    Error,
    /// `X`: capabilities granted (our clients only).
    Negotiated,
    /// `W`: an extension by a current token (our clients only).
    Extended,
    /// `Q`: permits granted (our clients only).
    Permits,
    /// `C`: a semaphore's capacity differs from the one declared (our
    /// clients only).
    CapacityMismatch,
    /// `O`: who holds a key observed (our clients only).
    Observed,
    /// `D`: downgraded to shared.
    Downgraded,
}

impl ReplyKind {
    /// Every kind, in exposition order.
    pub const ALL: [ReplyKind; 16] = [
        ReplyKind::Acquired,
        ReplyKind::AcquiredSet,
        ReplyKind::Released,
        ReplyKind::ReleasedSet,
        ReplyKind::NotFound,
        ReplyKind::TimedOut,
        ReplyKind::Busy,
        ReplyKind::Indeterminate,
        ReplyKind::Moved,
        ReplyKind::Error,
        ReplyKind::Negotiated,
        ReplyKind::Extended,
        ReplyKind::Permits,
        ReplyKind::CapacityMismatch,
        ReplyKind::Observed,
        ReplyKind::Downgraded,
    ];

    /// The reply's letter on the wire.
    pub fn letter(self) -> &'static str {
        match self {
            ReplyKind::Acquired => "A",
            ReplyKind::AcquiredSet => "S",
            ReplyKind::Released => "R",
            ReplyKind::ReleasedSet => "G",
            ReplyKind::NotFound => "N",
            ReplyKind::TimedOut => "T",
            ReplyKind::Busy => "B",
            ReplyKind::Indeterminate => "I",
            ReplyKind::Moved => "M",
            ReplyKind::Error => "E",
            ReplyKind::Negotiated => "X",
            ReplyKind::Extended => "W",
            ReplyKind::Permits => "Q",
            ReplyKind::CapacityMismatch => "C",
            ReplyKind::Observed => "O",
            ReplyKind::Downgraded => "D",
        }
    }

    /// The kind of `reply`; `None` for messages that answer no request
    /// (the leader notice).
    pub fn of(reply: &Reply) -> Option<ReplyKind> {
        Some(match reply {
            Reply::Acquired { .. } => ReplyKind::Acquired,
            Reply::AcquiredSet { .. } => ReplyKind::AcquiredSet,
            Reply::Released { .. } => ReplyKind::Released,
            Reply::ReleasedSet { .. } => ReplyKind::ReleasedSet,
            Reply::NotFound { .. } => ReplyKind::NotFound,
            Reply::TimedOut { .. } => ReplyKind::TimedOut,
            Reply::Busy { .. } => ReplyKind::Busy,
            Reply::Indeterminate { .. } => ReplyKind::Indeterminate,
            Reply::Moved { .. } => ReplyKind::Moved,
            Reply::Error { .. } => ReplyKind::Error,
            Reply::Negotiated { .. } => ReplyKind::Negotiated,
            Reply::Extended { .. } => ReplyKind::Extended,
            Reply::Permits { .. } => ReplyKind::Permits,
            Reply::CapacityMismatch { .. } => ReplyKind::CapacityMismatch,
            Reply::Observed { .. } => ReplyKind::Observed,
            Reply::Downgraded { .. } => ReplyKind::Downgraded,
            Reply::Leader { .. } | Reply::Push { .. } => return None,
        })
    }
}

/// Error codes in exposition order (`E` replies by code).
pub const ERROR_CODES: [ErrorCode; 10] = [
    ErrorCode::BadKey,
    ErrorCode::BadLease,
    ErrorCode::NotActive,
    ErrorCode::NoLeader,
    ErrorCode::BadKeySet,
    ErrorCode::GroupMismatch,
    ErrorCode::BadToken,
    ErrorCode::BadExtension,
    ErrorCode::BadPermits,
    ErrorCode::BadModes,
];

/// Replies sent, by kind and (for `E`) by code. Counted where the reply is
/// queued for its connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyCounts {
    by_kind: [u64; ReplyKind::ALL.len()],
    /// `E` replies by code, indexed by the code's position in
    /// [`ERROR_CODES`].
    errors: [u64; ERROR_CODES.len()],
}

impl ReplyCounts {
    /// Counts one reply.
    pub fn count(&mut self, reply: &Reply) {
        let Some(kind) = ReplyKind::of(reply) else {
            return;
        };
        self.by_kind[kind as usize] += 1;
        if let Reply::Error { code, .. } = reply
            && let Some(i) = ERROR_CODES.iter().position(|c| c == code)
        {
            self.errors[i] += 1;
        }
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ReplyCounts) {
        for (a, b) in self.by_kind.iter_mut().zip(other.by_kind) {
            *a += b;
        }
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
    }

    /// Replies of `kind` sent.
    pub fn of(&self, kind: ReplyKind) -> u64 {
        self.by_kind[kind as usize]
    }

    /// `E` replies with `code` sent.
    pub fn errors(&self, code: ErrorCode) -> u64 {
        ERROR_CODES
            .iter()
            .position(|&c| c == code)
            .map_or(0, |i| self.errors[i])
    }
}

/// A snapshot of a single-mode server's counts
/// ([`crate::server::Server::metrics`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerMetrics {
    /// What the lock table counted.
    pub lock: LockMetrics,
    /// Pushes sent to holders, by kind.
    pub pushes: PushCounts,
    /// Replies sent, by kind.
    pub replies: ReplyCounts,
    /// Permit requests answered `B` by the semaphores' own limits.
    pub busy_semaphores: SemaphoreBusy,
    /// Acquires answered `B` for a per-connection limit
    /// (`in_flight_per_connection_max`, `held_per_connection_max`): every
    /// `B` neither the table nor the semaphores decided.
    pub busy_per_connection: u64,
    /// Abusive or refused connections.
    pub abuse: AbuseCounts,
    /// Gauge: keys with a holder. A lease that ended on a key nobody waits
    /// for counts until the table notices (the next acquire of the key, or
    /// the sweep every 5 s), like [`LockMetrics::expiries_not_handed_over`]:
    /// an exact count would scan the table at every scrape.
    pub held_keys: u64,
    /// Gauge: keys in the table (held, expired but not yet swept, or with
    /// waiters).
    pub keys: u64,
    /// Gauge: queued acquires.
    pub waiters: u64,
    /// Gauge: connections past their handshake.
    pub sessions: u64,
    /// Gauge: of those, the ones speaking the line dialect (the rest speak
    /// v3).
    pub line_sessions: u64,
    /// Gauge: unfinished handshakes.
    pub handshakes: u64,
    /// The server is shutting down.
    pub shutting_down: bool,
}

impl ServerMetrics {
    /// Whether the server should get traffic (`/readyz`): yes while it
    /// serves, with the reason why not otherwise.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.shutting_down {
            return Err("shutting down");
        }
        Ok(())
    }
}

/// The replies of the connections a server still has and of those it
/// closed, so a closed connection's counts are not lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClosedReplies(ReplyCounts);

impl ClosedReplies {
    /// A connection with `replies` closed.
    pub(crate) fn add(&mut self, replies: &ReplyCounts) {
        self.0.add(replies);
    }

    /// These plus the replies of the live connections.
    pub(crate) fn total<'a>(&self, live: impl Iterator<Item = &'a ReplyCounts>) -> ReplyCounts {
        let mut total = self.0;
        for replies in live {
            total.add(replies);
        }
        total
    }
}

/// Lease extensions by outcome (single mode's [`LockMetrics`], the
/// cluster's [`ReplicatedLockMetrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtensionCounts {
    /// Extensions that moved the lease to the requested end.
    pub extended: u64,
    /// Extensions that moved the lease to the grant's cap instead of the
    /// requested end.
    pub clipped: u64,
    /// Extensions refused because the lease already reached the cap.
    pub at_cap: u64,
    /// Extensions of a token that was not current: nothing changed.
    pub not_current: u64,
}

impl ExtensionCounts {
    /// Every extension asked for.
    pub fn total(&self) -> u64 {
        self.extended + self.clipped + self.at_cap + self.not_current
    }
}

/// What the replicated lock state counted
/// ([`crate::cluster::ReplicatedLocks`]): applied commands, the same on
/// every node that applied them (followers included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicatedLockMetrics {
    /// Grants applied.
    pub grants: u64,
    /// Releases applied that released a current grant.
    pub releases: u64,
    /// Lease expiries applied that removed a current grant.
    pub expiries: u64,
    /// Force-releases applied that removed a current grant (also counted
    /// in [`Self::releases`], as in single mode).
    pub force_releases: u64,
    /// Snapshots installed into the lock state.
    pub snapshots_installed: u64,
    /// Extensions applied, by outcome on this node (whether one reached
    /// the cap depends on this node's apply times).
    pub extensions: ExtensionCounts,
    /// Lease expiries applied that removed a grant an extension had moved.
    pub expiries_extended: u64,
    /// Downgrades applied that turned a current grant shared.
    pub downgrades: u64,
    /// Time from a grant's apply to its release's or expiry's apply, on
    /// this node's clock (grants restored from a snapshot count from the
    /// install).
    pub hold: DurationHistogram,
}

/// Raft's own counts ([`crate::raft::Raft::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftCounters {
    /// Times this node learned of a leader other than the last one it
    /// knew (the first leader counts).
    pub leader_changes: u64,
    /// Snapshot transfers this node started as leader.
    pub snapshots_sent: u64,
    /// Snapshots this node received whole and installed.
    pub snapshots_received: u64,
    /// Appends this node sent as leader (empty ones, which carry only the
    /// commit index or probe, included).
    pub appends_sent: u64,
    /// Entries those appends carried: divided by [`Self::appends_sent`],
    /// how well replication batches.
    pub append_entries_sent: u64,
    /// Append answers this node sent as follower (appends that arrived
    /// together share one acceptance).
    pub append_responses_sent: u64,
}

/// Replication of one peer, as the leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerReplication {
    /// The peer's slot.
    pub slot: u8,
    /// The peer's generation.
    pub generation: u64,
    /// Entries the peer is known to lack: the leader's last index minus
    /// the peer's match index.
    pub lag_entries: u64,
}

/// A snapshot of a cluster node's counts
/// ([`crate::cluster::ClusterNode::metrics`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterMetrics {
    /// This node's slot.
    pub slot: u8,
    /// This node's generation.
    pub generation: u64,
    /// Gauge: this node leads.
    pub is_leader: bool,
    /// Gauge: this node knows a leader (itself or another).
    pub has_leader: bool,
    /// Gauge: this node is a voter of the current configuration.
    pub is_voter: bool,
    /// Gauge: a bootstrap member still checking that its cluster is new.
    pub checking_genesis: bool,
    /// Gauge: the current Raft term.
    pub term: u64,
    /// Gauge: the highest index known committed.
    pub commit_index: u64,
    /// Gauge: the highest index applied to the lock state.
    pub applied_index: u64,
    /// Gauge: the last index in this node's log.
    pub last_index: u64,
    /// Raft's counters.
    pub raft: RaftCounters,
    /// Leader only: every other member's replication, by slot.
    pub peers: Vec<PeerReplication>,
    /// What the replicated lock state counted.
    pub locks: ReplicatedLockMetrics,
    /// Pushes this node sent to holders (as leader), by kind.
    pub pushes: PushCounts,
    /// Replies sent, by kind.
    pub replies: ReplyCounts,
    /// Abusive or refused connections.
    pub abuse: AbuseCounts,
    /// Gauge: keys held in the applied state.
    pub held_keys: u64,
    /// Gauge: queued acquires (leader only).
    pub waiters: u64,
    /// Gauge: client connections past their handshake.
    pub sessions: u64,
    /// Gauge: of those, the ones speaking the line dialect.
    pub line_sessions: u64,
    /// The node is shutting down.
    pub shutting_down: bool,
    /// Leader: time from proposing a command to applying it (its commit
    /// by a majority in between), one observation per proposal this node
    /// made and saw applied in the term it proposed it.
    pub commit_latency: DurationHistogram,
    /// Leader: time from an acquire's arrival to its grant's reply (0 when
    /// the key was free, apart from the commit).
    pub wait: DurationHistogram,
    /// Leader: applied lease expiries whose keys had a waiter queued, who
    /// got them next.
    pub expiries_handed_over: u64,
    /// Leader: applied lease expiries with nobody queued on their keys.
    pub expiries_not_handed_over: u64,
    /// Leader: applied releases whose keys had a waiter queued.
    pub release_handovers: u64,
    /// Leader: acquires answered `B`, by the limit reached.
    pub busy: BusyByLimit,
    /// Leader: acquires answered `B` for a per-connection limit.
    pub busy_per_connection: u64,
    /// Leader: acquires answered `B` because Raft refused the proposal
    /// (too many uncommitted entries).
    pub busy_backpressure: u64,
    /// Force-release answers dropped because the driver did not drain
    /// them (0 unless the driver is broken).
    pub dropped_admin_replies: u64,
    /// Follower: appends dropped because this node's durable token reserve
    /// did not yet cover the tokens their entries could allocate (the
    /// leader sends them again once the reserve has grown). Steady growth
    /// means the state dir's writes lag behind the cluster's grants.
    pub appends_uncovered: u64,
}

impl ClusterMetrics {
    /// Whether the node should get client traffic (`/readyz`): a voter,
    /// not still checking that a new cluster is new, knowing a leader, and
    /// not shutting down; otherwise the first reason why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.shutting_down {
            Err("shutting down")
        } else if self.checking_genesis {
            Err("checking that the cluster is new")
        } else if !self.is_voter {
            Err("not a voter yet")
        } else if !self.has_leader {
            Err("no known leader")
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_upper_inclusive() {
        let mut h = DurationHistogram::default();
        h.observe(Duration::ZERO);
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_micros(1_001));
        h.observe(Duration::from_secs(300));
        assert_eq!(h.count(), 4);
        assert_eq!(h.sum_us(), 300_002_001);
        assert_eq!(h.count_at_most_us(1_000), 2);
        assert_eq!(h.count_at_most_us(2_500), 3);
        let cumulative = h.cumulative_seconds();
        assert_eq!(cumulative.len(), DURATION_BUCKETS_US.len());
        assert_eq!(cumulative.last(), Some(&(250.0, 3)));
        let buckets = h.buckets_seconds();
        assert_eq!(buckets.len(), DURATION_BUCKETS_US.len() + 1);
        assert_eq!(buckets[0], (0.001, 2));
        assert_eq!(buckets[1], (0.0025, 1));
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, 1)));
    }

    #[test]
    fn replies_count_by_kind_and_error_code() {
        let mut counts = ReplyCounts::default();
        counts.count(&Reply::Busy { rid: 1 });
        counts.count(&Reply::NotFound { rid: 2 });
        counts.count(&Reply::Error {
            rid: 3,
            code: ErrorCode::GroupMismatch,
        });
        counts.count(&Reply::Leader { leader_slot: 1 });
        assert_eq!(counts.of(ReplyKind::Busy), 1);
        assert_eq!(counts.of(ReplyKind::NotFound), 1);
        assert_eq!(counts.of(ReplyKind::Error), 1);
        assert_eq!(counts.errors(ErrorCode::GroupMismatch), 1);
        assert_eq!(counts.errors(ErrorCode::BadKey), 0);
        let total: u64 = ReplyKind::ALL.iter().map(|&k| counts.of(k)).sum();
        assert_eq!(total, 3, "the leader notice answers no request");
    }
}
