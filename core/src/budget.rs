//! Connection budgets and reports shared by the single-mode
//! [`crate::server::Server`] and the [`crate::cluster::ClusterNode`]:
//!
//! - `HandshakeBudget`: unfinished handshakes have their own budget and a
//!   per-source cap. A new connection is never the one refused: when its
//!   source is at its cap, that source's oldest unfinished handshake is
//!   dropped; when the whole budget is full, the oldest of all is. A client
//!   that finishes its handshake in a round trip therefore gets in however
//!   many idle sockets an attacker keeps refilling.
//! - `Reports`: failed proofs, failed peer handshakes, evictions and
//!   refusals, aggregated per source per interval (one [`LogEvent::Abuse`]
//!   per source and kind per interval, with a count), and every
//!   connection's close reason ([`LogEvent::Closed`]); the driver logs them.
//! - `HeldKeys` (cluster mode): keys held by grants delivered to each
//!   connection, for [`BudgetConfig::held_per_connection_max`]. Single
//!   mode, whose lock table records each grant's connection, counts them
//!   in `server::held` instead.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::net::IpAddr;

use crate::conn::ConnId;
use crate::events::{Event, EventRing, EventView};
use crate::hash::IdMap;
use crate::time::{Duration, Instant};

/// Limits against connection abuse. Build with
/// [`BudgetConfig::for_connections_max`] and adjust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Unfinished client handshakes at most; a new one over it drops the
    /// oldest.
    pub handshakes_max: usize,
    /// Unfinished client handshakes from one source address at most; a new
    /// one over it drops that source's oldest.
    pub handshakes_per_source_max: usize,
    /// Unfinished accepted peer handshakes at most (cluster only).
    pub peer_handshakes_max: usize,
    /// Unfinished accepted peer handshakes from one source at most.
    pub peer_handshakes_per_source_max: usize,
    /// Keys held at once by the grants delivered to one connection; an
    /// acquire that would go over it is answered `B`. A set counts its keys.
    pub held_per_connection_max: usize,
    /// A connection whose releases get this many `N` replies in a row is
    /// closed (a blind sweep over tokens). 0 turns the check off.
    pub release_misses_in_row_max: u32,
    /// Abuse reports are aggregated over this long per source.
    pub report_interval: Duration,
}

/// The floor of the derived handshake budget.
pub const HANDSHAKES_MIN: usize = 32;
/// Sources tracked at once in `Reports`; events from further sources are
/// counted together (`source: None`).
pub const REPORTED_SOURCES_MAX: usize = 1_024;
/// Events kept for a driver that does not drain them at most; further ones
/// are dropped and counted (see `dropped_log_events` on the server and node).
pub const QUEUED_LOG_EVENTS_MAX: usize = 4_096;

impl BudgetConfig {
    /// Defaults for a server of `connections_max` sessions: an eighth of it
    /// for handshakes (at least [`HANDSHAKES_MIN`]), half of that per
    /// source, 8 unfinished peer handshakes (4 per source), 16,384 held keys
    /// per connection, 64 release misses in a row, 10 s report interval.
    pub fn for_connections_max(connections_max: usize) -> Self {
        let handshakes_max = (connections_max / 8).max(HANDSHAKES_MIN);
        BudgetConfig {
            handshakes_max,
            handshakes_per_source_max: (handshakes_max / 2).max(1),
            peer_handshakes_max: 8,
            peer_handshakes_per_source_max: 4,
            held_per_connection_max: 16_384,
            release_misses_in_row_max: 64,
            report_interval: Duration::from_secs(10),
        }
    }
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig::for_connections_max(10_000)
    }
}

/// What a source did that an operator should see, aggregated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AbuseKind {
    /// A client sent a proof that matches no configured token.
    FailedProof,
    /// A peer handshake failed (bad proof, wrong cluster, bad bytes).
    FailedPeerHandshake,
    /// An unfinished handshake was dropped to make room for a newer one.
    HandshakeEvicted,
    /// A handshake did not finish within the handshake timeout.
    HandshakeTimedOut,
    /// A connection was refused: the session limit was full or the server
    /// is shutting down.
    Refused,
    /// A connection was closed after too many release misses in a row.
    ReleaseSweep,
    /// A line-dialect release named a token above every token ever issued:
    /// what a client of 0.1.0 or older looks like (its releases carry no
    /// token, so key bytes are read as one). Those clients are not served.
    TokenFromTheFuture,
}

impl AbuseKind {
    /// Every kind, in declaration order (the order of
    /// [`crate::metrics::AbuseCounts`]).
    pub const ALL: [AbuseKind; 7] = [
        AbuseKind::FailedProof,
        AbuseKind::FailedPeerHandshake,
        AbuseKind::HandshakeEvicted,
        AbuseKind::HandshakeTimedOut,
        AbuseKind::Refused,
        AbuseKind::ReleaseSweep,
        AbuseKind::TokenFromTheFuture,
    ];

    /// A short description for logs.
    pub fn describe(self) -> &'static str {
        match self {
            AbuseKind::FailedProof => "failed client proofs",
            AbuseKind::FailedPeerHandshake => "failed peer handshakes",
            AbuseKind::HandshakeEvicted => "unfinished handshakes dropped for newer ones",
            AbuseKind::HandshakeTimedOut => "handshakes timed out",
            AbuseKind::Refused => "connections refused (session limit or shutdown)",
            AbuseKind::ReleaseSweep => "connections closed after a run of release misses",
            AbuseKind::TokenFromTheFuture => {
                "line releases with a token never issued (a 0.1.0-or-older client? unsupported)"
            }
        }
    }
}

/// Why the core closed (or saw close) a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The transport went away (EOF, error) while the core had no reason
    /// of its own.
    TransportClosed,
    /// The client proof matched no token.
    ProofRejected,
    /// The peer handshake failed.
    PeerHandshakeFailed,
    /// The handshake did not finish in time.
    HandshakeTimedOut,
    /// The unfinished handshake was dropped for a newer connection.
    HandshakeEvicted,
    /// The handshake finished but every session slot is taken.
    SessionLimit,
    /// A frame could not be parsed.
    BadFrame,
    /// A line-dialect request's outcome became unknown (leadership lost
    /// after proposing): the dialect has no "indeterminate" reply, so the
    /// connection is closed and the client resends.
    OutcomeUnknown,
    /// Too many release misses in a row.
    ReleaseMisses,
    /// Server shutdown.
    Shutdown,
    /// A cluster node took a new generation and redials its peers.
    Rejoin,
    /// An established peer connection received no frame, or could not
    /// write what was queued, for longer than the silence bound
    /// (`ClusterConfig::peer_silence_timeout`); the slot is redialed.
    PeerSilent,
}

impl CloseReason {
    /// A short description for logs.
    pub fn describe(self) -> &'static str {
        match self {
            CloseReason::TransportClosed => "transport closed",
            CloseReason::ProofRejected => "client proof rejected",
            CloseReason::PeerHandshakeFailed => "peer handshake failed",
            CloseReason::HandshakeTimedOut => "handshake timed out",
            CloseReason::HandshakeEvicted => "unfinished handshake dropped for a newer one",
            CloseReason::SessionLimit => "session limit reached",
            CloseReason::BadFrame => "unparseable frame",
            CloseReason::OutcomeUnknown => "a line request's outcome is unknown",
            CloseReason::ReleaseMisses => "too many release misses in a row",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Rejoin => "node rejoined as a new generation",
            CloseReason::PeerSilent => "peer link silent past the silence bound",
        }
    }
}

/// Something the driver should log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEvent {
    /// `count` events of `kind` from `source` (`None`: sources beyond
    /// [`REPORTED_SOURCES_MAX`], counted together). The first event of a
    /// source is reported at once; further ones are counted and reported
    /// once per [`BudgetConfig::report_interval`]. Log at `warn`.
    Abuse {
        /// The source address.
        source: Option<IpAddr>,
        /// What happened.
        kind: AbuseKind,
        /// How many times since the last report.
        count: u64,
    },
    /// A connection was closed (log at `debug`).
    Closed {
        /// The connection.
        conn: ConnId,
        /// Its source (`None` for a connection this node dialed).
        source: Option<IpAddr>,
        /// Why.
        reason: CloseReason,
    },
    /// An operator force-released a grant: `revoked` no longer holds
    /// `keys` (log at `warn`: its holder's later writes are fenced).
    ForceReleased {
        /// Every key of the revoked grant.
        keys: Vec<crate::wire::Key>,
        /// The revoked token.
        revoked: u64,
        /// The token of the grant the hand-over made, if any.
        handed_to: Option<u64>,
    },
}

/// Unfinished handshakes, oldest first, and their sources.
#[derive(Debug)]
pub(crate) struct HandshakeBudget {
    total_max: usize,
    per_source_max: usize,
    /// Connection ids only grow, so the smallest is the oldest.
    order: BTreeMap<ConnId, IpAddr>,
    per_source: HashMap<IpAddr, BTreeSet<ConnId>>,
}

impl HandshakeBudget {
    pub(crate) fn new(total_max: usize, per_source_max: usize) -> Self {
        HandshakeBudget {
            total_max: total_max.max(1),
            per_source_max: per_source_max.max(1),
            order: BTreeMap::new(),
            per_source: HashMap::new(),
        }
    }

    /// Counts `conn` from `source` and returns the unfinished handshake to
    /// drop to make room for it, if any: the source's oldest when the
    /// source is at its cap, else the oldest of all when the budget is full.
    pub(crate) fn admit(&mut self, conn: ConnId, source: IpAddr) -> Option<ConnId> {
        let from_source = self.per_source.get(&source).map_or(0, BTreeSet::len);
        let evict = if from_source >= self.per_source_max {
            self.per_source
                .get(&source)
                .and_then(|set| set.first().copied())
        } else if self.order.len() >= self.total_max {
            self.order.keys().next().copied()
        } else {
            None
        };
        if let Some(old) = evict {
            self.finish(old);
        }
        self.order.insert(conn, source);
        self.per_source.entry(source).or_default().insert(conn);
        evict
    }

    /// `conn` no longer counts (handshake finished, or the connection closed).
    pub(crate) fn finish(&mut self, conn: ConnId) {
        if let Some(source) = self.order.remove(&conn)
            && let Some(set) = self.per_source.get_mut(&source)
        {
            set.remove(&conn);
            if set.is_empty() {
                self.per_source.remove(&source);
            }
        }
    }

    /// Unfinished handshakes counted.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

#[derive(Debug)]
struct Window {
    /// Events since the last report.
    unreported: u64,
}

type ReportKey = (Option<IpAddr>, AbuseKind);

/// Aggregated abuse reports and close events for the driver.
#[derive(Debug)]
pub(crate) struct Reports {
    interval: Duration,
    windows: HashMap<ReportKey, Window>,
    /// When each open window ends, in order (windows open at the latest
    /// `now`, so pushing at the back keeps it sorted).
    window_ends: VecDeque<(Instant, ReportKey)>,
    events: VecDeque<LogEvent>,
    dropped_events: u64,
    /// Every event, also those the log aggregates (for metrics).
    totals: AbuseCounts,
    /// The latest `now` seen; keeps `window_ends` sorted if a driver's
    /// clock readings arrive out of order.
    last_now: Instant,
    /// The recent events operators see (refusals counted per reason per
    /// interval, see [`crate::events`]).
    ring: EventRing,
}

impl Reports {
    pub(crate) fn new(interval: Duration) -> Self {
        Reports {
            interval: interval.max(Duration::from_millis(1)),
            windows: HashMap::new(),
            window_ends: VecDeque::new(),
            events: VecDeque::new(),
            dropped_events: 0,
            totals: AbuseCounts::default(),
            last_now: Instant::ZERO,
            ring: EventRing::new(interval),
        }
    }

    /// One event of `kind` from `source` at `now`.
    pub(crate) fn abuse(&mut self, now: Instant, source: Option<IpAddr>, kind: AbuseKind) {
        self.totals.count(kind);
        self.handle_timeout(now);
        let now = self.last_now;
        // A release naming an unissued token refuses no connection: it is
        // logged and counted, not an event of the ring.
        if kind != AbuseKind::TokenFromTheFuture {
            self.ring.refused(now, kind);
        }
        let mut key = (source, kind);
        if !self.windows.contains_key(&key) && self.windows.len() >= REPORTED_SOURCES_MAX {
            key = (None, kind);
        }
        match self.windows.get_mut(&key) {
            Some(window) => window.unreported += 1,
            None => {
                // First from this source: report at once, then aggregate.
                self.push(LogEvent::Abuse {
                    source: key.0,
                    kind,
                    count: 1,
                });
                self.windows.insert(key, Window { unreported: 0 });
                self.window_ends
                    .push_back((now.saturating_add(self.interval), key));
            }
        }
    }

    /// Every abuse event so far, by kind.
    pub(crate) fn totals(&self) -> AbuseCounts {
        self.totals
    }

    /// `conn` from `source` was closed for `reason`.
    pub(crate) fn closed(&mut self, conn: ConnId, source: Option<IpAddr>, reason: CloseReason) {
        self.push(LogEvent::Closed {
            conn,
            source,
            reason,
        });
    }

    /// An operator force-released grant `revoked` on `keys` at `now`:
    /// logged, and an event of the ring.
    pub(crate) fn force_released(
        &mut self,
        now: Instant,
        keys: Vec<crate::wire::Key>,
        revoked: u64,
        handed_to: Option<u64>,
    ) {
        self.ring.record(
            now,
            Event::ForceReleased {
                keys: keys.clone(),
                revoked,
                handed_to,
            },
        );
        self.push(LogEvent::ForceReleased {
            keys,
            revoked,
            handed_to,
        });
    }

    /// The leader this cluster node knows changed at `now` (an event of
    /// the ring; the driver logs the node event).
    pub(crate) fn leader_changed(&mut self, now: Instant, leader_slot: Option<u8>, term: u64) {
        self.ring
            .record(now, Event::LeaderChanged { leader_slot, term });
    }

    /// The lease of `expired` on `keys` ran out at `now` with a waiter
    /// queued, who got the keys (under `handed_to`, when known).
    pub(crate) fn expired_with_waiters(
        &mut self,
        now: Instant,
        keys: Vec<crate::wire::Key>,
        expired: u64,
        handed_to: Option<u64>,
    ) {
        self.ring.record(
            now,
            Event::ExpiredWithWaiters {
                keys,
                expired,
                handed_to,
            },
        );
    }

    /// The ring's events, the most recent first, aged at `now`.
    pub(crate) fn recent_events(&self, now: Instant) -> Vec<EventView> {
        self.ring.view(now)
    }

    fn push(&mut self, event: LogEvent) {
        if self.events.len() >= QUEUED_LOG_EVENTS_MAX {
            self.dropped_events += 1;
        } else {
            self.events.push_back(event);
        }
    }

    /// Reports every window that ended by `now`; a window with events goes
    /// on for another interval, an empty one is forgotten.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        let now = self.last_now;
        while let Some(&(end, key)) = self.window_ends.front() {
            if end > now {
                break;
            }
            self.window_ends.pop_front();
            let Some(window) = self.windows.get_mut(&key) else {
                continue;
            };
            if window.unreported == 0 {
                self.windows.remove(&key);
                continue;
            }
            let count = std::mem::take(&mut window.unreported);
            self.push(LogEvent::Abuse {
                source: key.0,
                kind: key.1,
                count,
            });
            self.window_ends
                .push_back((now.saturating_add(self.interval), key));
        }
    }

    /// Reports every count not yet reported, now (shutdown: nothing is
    /// left unsaid).
    pub(crate) fn flush(&mut self) {
        let mut keys: Vec<ReportKey> = self
            .windows
            .iter()
            .filter(|(_, window)| window.unreported > 0)
            .map(|(key, _)| *key)
            .collect();
        keys.sort_unstable();
        for key in keys {
            if let Some(window) = self.windows.get_mut(&key) {
                let count = std::mem::take(&mut window.unreported);
                self.push(LogEvent::Abuse {
                    source: key.0,
                    kind: key.1,
                    count,
                });
            }
        }
    }

    /// When the next window ends.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.window_ends.front().map(|(end, _)| *end)
    }

    pub(crate) fn poll(&mut self) -> Option<LogEvent> {
        self.events.pop_front()
    }

    pub(crate) fn dropped_events(&self) -> u64 {
        self.dropped_events
    }
}

#[derive(Debug)]
struct HeldGrant {
    conn: ConnId,
    expires: Instant,
    /// A grant covers one key group (at most 16 keys); `u32` keeps the
    /// entry at 24 bytes.
    keys: u32,
}

/// Stale expiry-heap entries (of grants released before their lease ended)
/// allowed beyond twice the live grants before the heap is rebuilt.
const EXPIRY_HEAP_SLACK: usize = 64;

/// Keys held by the grants delivered to each connection, until released
/// (by anyone) or expired.
///
/// Layout, kept small because a busy server holds one grant per held key
/// set: a map from token to grant (24-byte entries), a key count per
/// connection, and a min-heap of (lease end, token) that may hold entries of
/// grants already released; those are skipped when they come to the top,
/// and the heap is rebuilt once they outnumber the live grants. A closed
/// connection's grants are not looked up at once: connection ids are never
/// reused, so they count against nobody, and they leave the map when
/// released or when their lease ends, like any other.
#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    grants: IdMap<u64, HeldGrant>,
    per_conn: IdMap<ConnId, usize>,
    by_expiry: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl HeldKeys {
    /// `conn` received the grant of `token` on `keys` keys, whose lease ends
    /// at `expires`.
    pub(crate) fn add(&mut self, conn: ConnId, token: u64, keys: usize, expires: Instant) {
        self.remove(token);
        let keys = u32::try_from(keys).unwrap_or(u32::MAX);
        self.grants.insert(
            token,
            HeldGrant {
                conn,
                expires,
                keys,
            },
        );
        *self.per_conn.entry(conn).or_default() += keys as usize;
        if self.by_expiry.len() > 2 * self.grants.len() + EXPIRY_HEAP_SLACK {
            self.by_expiry = self
                .grants
                .iter()
                .map(|(&token, grant)| Reverse((grant.expires, token)))
                .collect();
        } else {
            self.by_expiry.push(Reverse((expires, token)));
        }
    }

    /// The grant of `token` was released or expired.
    pub(crate) fn remove(&mut self, token: u64) {
        let Some(grant) = self.grants.remove(&token) else {
            return;
        };
        // Its expiry-heap entry stays behind, stale (see the type's docs).
        if let Some(held) = self.per_conn.get_mut(&grant.conn) {
            // Saturating: a forgotten connection's count can start again
            // from a grant applied after its close (a cluster waiter's),
            // while its older grants still leave one by one.
            *held = held.saturating_sub(grant.keys as usize);
            if *held == 0 {
                self.per_conn.remove(&grant.conn);
            }
        }
    }

    /// Forgets grants whose lease ended by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some(&Reverse((expires, token))) = self.by_expiry.peek() {
            if expires > now {
                break;
            }
            self.by_expiry.pop();
            // Stale unless the token's grant is still there with this lease
            // end (a token is granted once; `add` of the same token again
            // pushes its new lease end).
            if self
                .grants
                .get(&token)
                .is_some_and(|grant| grant.expires == expires)
            {
                self.remove(token);
            }
        }
    }

    /// `conn` is gone for good: its grants no longer count against anybody.
    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        self.per_conn.remove(&conn);
    }

    /// The connection grant `token` was delivered to, while it is held.
    pub(crate) fn conn_of(&self, token: u64) -> Option<ConnId> {
        self.grants.get(&token).map(|grant| grant.conn)
    }

    /// Keys held by `conn`'s delivered grants (after [`HeldKeys::expire`]).
    pub(crate) fn held(&self, conn: ConnId) -> usize {
        self.per_conn.get(&conn).copied().unwrap_or(0)
    }
}

/// Abusive or refused connections, by kind, as reported to the log (every
/// event, also those the log aggregates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AbuseCounts {
    counts: [u64; AbuseKind::ALL.len()],
}

impl AbuseCounts {
    /// Counts one event.
    pub fn count(&mut self, kind: AbuseKind) {
        self.counts[kind as usize] += 1;
    }

    /// Events of `kind`.
    pub fn of(&self, kind: AbuseKind) -> u64 {
        self.counts[kind as usize]
    }

    /// Failed handshakes of every kind: client proofs rejected, peer
    /// handshakes failed, unfinished handshakes timed out or evicted.
    pub fn failed_handshakes(&self) -> u64 {
        self.of(AbuseKind::FailedProof)
            + self.of(AbuseKind::FailedPeerHandshake)
            + self.of(AbuseKind::HandshakeTimedOut)
            + self.of(AbuseKind::HandshakeEvicted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn budget_drops_the_sources_oldest_then_the_oldest_of_all() {
        let mut budget = HandshakeBudget::new(4, 2);
        assert_eq!(budget.admit(ConnId(1), ip(1)), None);
        assert_eq!(budget.admit(ConnId(2), ip(1)), None);
        // Source 1 at its cap: its own oldest goes.
        assert_eq!(budget.admit(ConnId(3), ip(1)), Some(ConnId(1)));
        assert_eq!(budget.admit(ConnId(4), ip(2)), None);
        assert_eq!(budget.admit(ConnId(5), ip(3)), None);
        assert_eq!(budget.len(), 4);
        // Budget full, source 4 under its cap: the oldest of all goes.
        assert_eq!(budget.admit(ConnId(6), ip(4)), Some(ConnId(2)));
        budget.finish(ConnId(3));
        assert_eq!(budget.len(), 3);
        assert_eq!(budget.admit(ConnId(7), ip(1)), None);
    }

    #[test]
    fn reports_aggregate_per_source_per_interval() {
        let mut reports = Reports::new(Duration::from_secs(10));
        let t0 = Instant::from_micros(1_000_000);
        for _ in 0..5 {
            reports.abuse(t0, Some(ip(1)), AbuseKind::FailedProof);
        }
        reports.abuse(t0, Some(ip(2)), AbuseKind::FailedProof);
        let first: Vec<_> = std::iter::from_fn(|| reports.poll()).collect();
        assert_eq!(
            first,
            vec![
                LogEvent::Abuse {
                    source: Some(ip(1)),
                    kind: AbuseKind::FailedProof,
                    count: 1
                },
                LogEvent::Abuse {
                    source: Some(ip(2)),
                    kind: AbuseKind::FailedProof,
                    count: 1
                },
            ]
        );
        assert_eq!(
            reports.poll_timeout(),
            Some(t0.saturating_add(Duration::from_secs(10)))
        );
        reports.handle_timeout(t0.saturating_add(Duration::from_secs(10)));
        let second: Vec<_> = std::iter::from_fn(|| reports.poll()).collect();
        assert_eq!(
            second,
            vec![LogEvent::Abuse {
                source: Some(ip(1)),
                kind: AbuseKind::FailedProof,
                count: 4
            }]
        );
        // Quiet for an interval: forgotten, so the next one is reported at once.
        reports.handle_timeout(t0.saturating_add(Duration::from_secs(20)));
        assert_eq!(reports.poll(), None);
        assert_eq!(reports.poll_timeout(), None);
    }

    #[test]
    fn reports_bound_their_sources() {
        let mut reports = Reports::new(Duration::from_secs(10));
        let now = Instant::from_micros(1);
        for n in 0..(REPORTED_SOURCES_MAX as u32 + 10) {
            let source = IpAddr::V4(Ipv4Addr::from(n.to_be_bytes()));
            reports.abuse(now, Some(source), AbuseKind::Refused);
        }
        let events: Vec<_> = std::iter::from_fn(|| reports.poll()).collect();
        assert_eq!(events.len(), REPORTED_SOURCES_MAX + 1);
        assert_eq!(
            events.last(),
            Some(&LogEvent::Abuse {
                source: None,
                kind: AbuseKind::Refused,
                count: 1
            })
        );
        reports.handle_timeout(now.saturating_add(Duration::from_secs(10)));
        assert_eq!(
            reports.poll(),
            Some(LogEvent::Abuse {
                source: None,
                kind: AbuseKind::Refused,
                count: 9
            })
        );
    }

    #[test]
    fn held_keys_count_until_release_expiry_or_close() {
        let mut held = HeldKeys::default();
        let t = |s: u64| Instant::from_micros(s * 1_000_000);
        held.add(ConnId(1), 10, 3, t(5));
        held.add(ConnId(1), 11, 1, t(9));
        held.add(ConnId(2), 12, 2, t(9));
        assert_eq!(held.held(ConnId(1)), 4);
        held.remove(10);
        assert_eq!(held.held(ConnId(1)), 1);
        held.expire(t(9));
        assert_eq!(held.held(ConnId(1)), 0);
        assert_eq!(held.held(ConnId(2)), 0);
        held.add(ConnId(2), 13, 2, t(20));
        held.forget_conn(ConnId(2));
        assert_eq!(held.held(ConnId(2)), 0);
        // The closed connection's grant leaves when its lease ends, and
        // releasing it then or before touches nobody's count.
        held.add(ConnId(3), 14, 1, t(30));
        held.remove(13);
        assert_eq!(held.held(ConnId(3)), 1);
        held.expire(t(30));
        assert_eq!(held.held(ConnId(3)), 0);
        assert!(held.grants.is_empty());
        assert!(held.by_expiry.is_empty());
    }

    #[test]
    fn a_grant_counted_after_its_connection_was_forgotten_does_not_underflow() {
        // A cluster waiter's grant can apply after its connection closed
        // and was forgotten; the connection's older grants leave later.
        let mut held = HeldKeys::default();
        let far = Instant::from_micros(60_000_000);
        held.add(ConnId(1), 1, 2, far);
        held.forget_conn(ConnId(1));
        held.add(ConnId(1), 2, 1, far);
        held.remove(1);
        assert_eq!(held.held(ConnId(1)), 0);
        held.remove(2);
        assert_eq!(held.held(ConnId(1)), 0);
        held.add(ConnId(2), 3, 1, far);
        assert_eq!(held.held(ConnId(2)), 1, "other connections count as before");
    }

    #[test]
    fn held_keys_expiry_heap_stays_bounded_by_live_grants() {
        let mut held = HeldKeys::default();
        let far = Instant::from_micros(1_000_000_000);
        // Grants released long before their lease ends leave stale heap
        // entries; the heap never grows past twice the live ones plus slack.
        for token in 1..10_000u64 {
            held.add(ConnId(1), token, 1, far);
            if token % 100 != 0 {
                held.remove(token);
            }
            assert!(held.by_expiry.len() <= 2 * held.grants.len() + EXPIRY_HEAP_SLACK + 3);
        }
        assert_eq!(held.held(ConnId(1)), 99);
        held.expire(far);
        assert_eq!(held.held(ConnId(1)), 0);
        assert!(held.by_expiry.is_empty());
    }
}
