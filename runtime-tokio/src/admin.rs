//! The admin HTTP listener (`admin_listen`): `GET /metrics` (OpenMetrics
//! text), `GET /livez` and `GET /readyz`, the lock API (`/v1/locks…`,
//! see the `api` submodule and `docs/admin-api.md`), `/v1/node` and
//! `/v1/events`, and a status page
//! at `GET /` that reads them from a browser (the `page` submodule).
//!
//! It only serves what the core counted and decided: each request takes one
//! snapshot ([`ticketing_core::server::Server::metrics`] or
//! [`ticketing_core::cluster::ClusterNode::metrics`]) under the core's
//! mutex and renders it outside it; readiness is the core's
//! `readiness()`; refusals are counted by the core's
//! [`AdminRefusals`]. No series is per key and no gauge scans the table,
//! so a scrape costs the same with a million keys as with one.
//!
//! The listener runs on a thread of its own with bounded connections,
//! time and memory (the `listener` submodule): nothing on the admin port
//! can starve the lock service.

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use ticketing_core::admin::{AdminRefusal, AdminRefusals, AdminTokens};
use ticketing_core::budget::AbuseKind;
use ticketing_core::metrics::{
    BusyByLimit, ClusterMetrics, DurationHistogram, ERROR_CODES, ReplyCounts, ReplyKind,
    ServerMetrics,
};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

mod api;
mod listener;
mod page;
pub use api::{
    ADMIN_REPLY_TIMEOUT, AdminNode, DEFAULT_LISTING_LIMIT, PENDING_ADMIN_REQUESTS_MAX,
    UNAUTHENTICATED_QUERIES_MAX, UNAUTHENTICATED_QUEUE_TIMEOUT, rfc3339,
};
pub(crate) use api::{AdminApp, AppState, PendingAdmin};
pub use listener::{AdminLimits, REQUEST_HEAD_BYTES_MAX};

/// One snapshot of what a node's core counted.
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one snapshot per scrape, taken and rendered once"
)]
pub enum NodeMetrics {
    /// A single-mode server.
    Single(ServerMetrics),
    /// A cluster node.
    Cluster(ClusterMetrics),
}

impl NodeMetrics {
    /// The core's readiness verdict.
    pub fn readiness(&self) -> Result<(), &'static str> {
        match self {
            NodeMetrics::Single(m) => m.readiness(),
            NodeMetrics::Cluster(m) => m.readiness(),
        }
    }
}

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the admin listener is told at its start.
#[derive(Clone, Debug, Default)]
pub struct AdminSettings {
    /// Tokens accepted by the lock API.
    pub tokens: AdminTokens,
    /// `Host` names (`name:port`) served besides the listener's own
    /// address (see [`ticketing_core::admin::host_allowed`]).
    pub allowed_hosts: Vec<Box<str>>,
    /// Connections, per-source connections and time limits.
    pub limits: AdminLimits,
}

/// Starts serving every admin endpoint `node` offers on `listener`, on a
/// thread of its own (see [`listener`]). The returned task stands for it:
/// aborting it stops the listener.
pub(crate) fn spawn_admin_api(
    listener: std::net::TcpListener,
    node: Arc<dyn AdminNode>,
    settings: AdminSettings,
) -> std::io::Result<JoinHandle<()>> {
    let addr = listener.local_addr().ok();
    let loopback = addr.is_some_and(|addr| addr.ip().to_canonical().is_loopback());
    let app = Arc::new(AdminApp {
        node,
        loopback,
        tokens: settings.tokens,
        allowed_hosts: settings.allowed_hosts,
        refusals: Arc::new(AdminRefusals::default()),
        unauthenticated: Semaphore::new(api::UNAUTHENTICATED_QUERIES_MAX),
        started: std::time::Instant::now(),
    });
    let router = Router::new()
        .route("/", get(page::index))
        .route("/page.css", get(page::css))
        .route("/page.js", get(page::js))
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/v1/node", get(api::node))
        .route("/v1/events", get(api::events))
        .route("/v1/locks", get(api::list))
        .route("/v1/locks/{*key}", get(api::show).post(api::release))
        // Every route, the open ones too: they say nothing secret, but a
        // rebinding page must not learn even that.
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            api::host_guard,
        ))
        .with_state(Arc::clone(&app));
    listener::spawn(listener, router, app, settings.limits)
}

async fn metrics(State(app): State<AppState>) -> Response {
    // The core's mutex is held for the copy only, never across an await.
    let metrics = app.node.metrics();
    match render_with(&metrics, Some(&app.refusals)) {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(fmt::Error) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(State(app): State<AppState>) -> Response {
    match app.node.metrics().readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

/// Renders `metrics` as OpenMetrics text (`ticketing_` prefix, base units,
/// ending with `# EOF`).
pub fn render(metrics: &NodeMetrics) -> Result<String, fmt::Error> {
    render_with(metrics, None)
}

/// [`render`], with the admin listener's refusal counts when given.
fn render_with(
    metrics: &NodeMetrics,
    refusals: Option<&Arc<AdminRefusals>>,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::with_prefix("ticketing");
    registry.register_collector(Box::new(Collected(metrics.clone())));
    if let Some(refusals) = refusals {
        registry.register_collector(Box::new(Refusals(Arc::clone(refusals))));
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// The admin listener's refusals as a prometheus-client collector.
#[derive(Debug)]
struct Refusals(Arc<AdminRefusals>);

impl prometheus_client::collector::Collector for Refusals {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let values: Vec<(&str, u64)> = AdminRefusal::ALL
            .iter()
            .map(|&refusal| (refusal.label(), self.0.count(refusal)))
            .collect();
        counters(
            &mut encoder,
            "admin_refusals",
            "Admin listener refusals, by reason: 401, 403, a Host not this listener's (421), \
             a bad query parameter (400), a connection closed at the connection or per-source \
             cap, a request without a token over its budget (503), a request head not sent in time.",
            "reason",
            &values,
        )
    }
}

/// The snapshot as a prometheus-client collector.
#[derive(Debug)]
struct Collected(NodeMetrics);

impl prometheus_client::collector::Collector for Collected {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let e = &mut encoder;
        match &self.0 {
            NodeMetrics::Single(m) => encode_single(e, m),
            NodeMetrics::Cluster(m) => encode_cluster(e, m),
        }
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    metric.encode_counter::<NoLabelSet, u64, f64>(&value, None)
}

fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (label_value, value) in values {
        let labels = [(label, *label_value)];
        metric
            .encode_family(&labels)?
            .encode_counter::<NoLabelSet, u64, f64>(value, None)?;
    }
    Ok(())
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    metric.encode_gauge(&value)
}

fn flag(e: &mut DescriptorEncoder, name: &str, help: &str, value: bool) -> fmt::Result {
    gauge(e, name, help, u64::from(value))
}

fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &DurationHistogram,
) -> fmt::Result {
    let unit = Unit::Seconds;
    let mut metric = e.encode_descriptor(name, help, Some(&unit), MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(h.sum_seconds(), h.count(), &h.buckets_seconds(), None)
}

fn replies(e: &mut DescriptorEncoder, r: &ReplyCounts) -> fmt::Result {
    let by_kind: Vec<(&str, u64)> = ReplyKind::ALL
        .iter()
        .map(|&kind| (kind.letter(), r.of(kind)))
        .collect();
    counters(
        e,
        "replies",
        "Replies sent to clients, by kind (the reply's letter on the wire).",
        "kind",
        &by_kind,
    )?;
    let codes: Vec<String> = ERROR_CODES.iter().map(|&c| (c as u8).to_string()).collect();
    let by_code: Vec<(&str, u64)> = ERROR_CODES
        .iter()
        .zip(&codes)
        .map(|(&code, text)| (text.as_str(), r.errors(code)))
        .collect();
    counters(
        e,
        "error_replies",
        "E replies sent to clients, by error code.",
        "code",
        &by_code,
    )
}

fn abuse(e: &mut DescriptorEncoder, m: &ticketing_core::metrics::AbuseCounts) -> fmt::Result {
    counters(
        e,
        "failed_handshakes",
        "Handshakes that failed: a client proof rejected, a peer handshake failed, \
         an unfinished handshake timed out or dropped for a newer one.",
        "reason",
        &[
            ("client_proof", m.of(AbuseKind::FailedProof)),
            ("peer", m.of(AbuseKind::FailedPeerHandshake)),
            ("timed_out", m.of(AbuseKind::HandshakeTimedOut)),
            ("evicted", m.of(AbuseKind::HandshakeEvicted)),
        ],
    )?;
    counter(
        e,
        "refused_connections",
        "Connections refused because every session slot was taken or the node was shutting down.",
        m.of(AbuseKind::Refused),
    )?;
    counter(
        e,
        "release_miss_closes",
        "Connections closed after a run of releases answered N.",
        m.of(AbuseKind::ReleaseSweep),
    )?;
    counter(
        e,
        "unissued_token_releases",
        "Line-dialect releases naming a token above every token issued: the sign of an \
         unsupported 0.1.0-or-older client.",
        m.of(AbuseKind::TokenFromTheFuture),
    )
}

/// Renewals by exact token, by result, and leases that ran out after one
/// (a renewer that hung or lost its way to the server).
fn extensions(
    e: &mut DescriptorEncoder,
    counts: &ticketing_core::metrics::ExtensionCounts,
    expiries_extended: u64,
) -> fmt::Result {
    counters(
        e,
        "extensions",
        "Renewals by exact token (W), by result: renewed, clipped at the hold cap, refused at \
         the cap, or the token not current (nothing changed).",
        "result",
        &[
            ("ok", counts.extended),
            ("clipped", counts.clipped),
            ("at_cap", counts.at_cap),
            ("not_current", counts.not_current),
        ],
    )?;
    counter(
        e,
        "lease_expiries_after_extension",
        "Leases that ran out after at least one renewal: a renewer that stopped renewing \
         (hung, partitioned, or its work ended without a release).",
        expiries_extended,
    )
}

/// Pushes sent to holders, by kind.
fn pushes(e: &mut DescriptorEncoder, m: &ticketing_core::metrics::PushCounts) -> fmt::Result {
    counters(
        e,
        "pushes",
        "Pushes to holders that asked for them, by kind: the lease is ending, or lost (it \
         ran out, was force-released, or reached its hold cap).",
        "kind",
        &[
            ("lease_ending", m.lease_ending),
            ("expired", m.expired),
            ("force_released", m.force_released),
            ("cap_reached", m.cap_reached),
        ],
    )
}

/// Single mode's series, in exposition order.
fn encode_single(e: &mut DescriptorEncoder, m: &ServerMetrics) -> fmt::Result {
    single_lock_events(e, m)?;
    replies(e, &m.replies)?;
    abuse(e, &m.abuse)?;
    single_occupancy(e, m)?;
    single_latencies(e, m)
}

/// What the lock table did: grants, releases, expiries, T and B answers.
fn single_lock_events(e: &mut DescriptorEncoder, m: &ServerMetrics) -> fmt::Result {
    let l = &m.lock;
    counters(
        e,
        "grants",
        "Acquires granted: at once (wait=none) or after queueing (wait=queued).",
        "wait",
        &[
            ("none", l.grants_immediate),
            ("queued", l.grants_after_wait),
        ],
    )?;
    counter(
        e,
        "releases",
        "Releases that released a current grant.",
        l.releases,
    )?;
    counter(
        e,
        "release_handovers",
        "Waiters granted because of a release.",
        l.handovers_on_release,
    )?;
    counter(
        e,
        "force_releases",
        "Releases ordered by an operator over the admin API (also counted in releases).",
        l.force_releases,
    )?;
    counters(
        e,
        "lease_expiries",
        "Leases that ran out, by whether the key went to a waiter at once. Keys nobody \
         waits for are counted when noticed (next acquire, or the 5 s sweep).",
        "handed_over",
        &[
            ("true", l.expiries_handed_over),
            ("false", l.expiries_not_handed_over),
        ],
    )?;
    extensions(e, &l.extensions, l.expiries_extended)?;
    pushes(e, &m.pushes)?;
    counters(
        e,
        "timeouts",
        "Acquires answered T, by why: wait 0 on a held key, the wait ran out, shutdown.",
        "reason",
        &[
            ("wait_zero", l.timeouts_wait_zero),
            ("wait_ended", l.timeouts_wait_ended),
            ("shutdown", l.timeouts_shutdown),
        ],
    )?;
    busy(
        e,
        "Acquires answered B, by the limit that was reached.",
        &l.busy,
        m.busy_per_connection,
        None,
    )?;
    counters(
        e,
        "busy_permits",
        "Permit requests answered B by a semaphore limit: as many semaphores as max_keys allows, or a semaphore's queue or all permit queues at the waiter limits (a B from the lock table under them is in busy).",
        "limit",
        &[
            ("max_semaphores", m.busy_semaphores.semaphores_max),
            (
                "max_waiters_per_key",
                m.busy_semaphores.waiters_per_semaphore_max,
            ),
            ("max_waiters_total", m.busy_semaphores.waiters_total_max),
        ],
    )
}

/// What the server holds now: keys, waiters, connections.
fn single_occupancy(e: &mut DescriptorEncoder, m: &ServerMetrics) -> fmt::Result {
    gauge(
        e,
        "held_keys",
        "Keys whose holder's lease is running.",
        m.held_keys,
    )?;
    gauge(
        e,
        "table_keys",
        "Keys in the lock table: held, expired but not yet swept, or with waiters.",
        m.keys,
    )?;
    gauge(e, "waiters", "Queued acquires.", m.waiters)?;
    connections(e, m.sessions, m.line_sessions, m.handshakes)
}

fn single_latencies(e: &mut DescriptorEncoder, m: &ServerMetrics) -> fmt::Result {
    histogram(
        e,
        "lock_wait",
        "Time from an acquire's arrival to its grant (0 for an immediate grant).",
        &m.lock.wait,
    )?;
    histogram(
        e,
        "lock_hold",
        "Time from a grant to its release or the end of its lease.",
        &m.lock.hold,
    )
}

/// Acquires answered B, by the limit reached: the lock table's limits and
/// the per-connection bound, then (cluster) Raft backpressure.
fn busy(
    e: &mut DescriptorEncoder,
    help: &str,
    table: &BusyByLimit,
    per_connection: u64,
    raft_backpressure: Option<u64>,
) -> fmt::Result {
    let mut by_limit = vec![
        ("max_keys", table.keys_max),
        ("max_waiters_per_key", table.waiters_per_key_max),
        ("max_waiters_total", table.waiters_total_max),
        ("token_reserve", table.token_reserve),
        ("per_connection", per_connection),
    ];
    by_limit.extend(raft_backpressure.map(|count| ("raft_backpressure", count)));
    counters(e, "busy", help, "limit", &by_limit)
}

fn connections(
    e: &mut DescriptorEncoder,
    sessions: u64,
    line_sessions: u64,
    handshakes: u64,
) -> fmt::Result {
    let mut metric = e.encode_descriptor(
        "connections",
        "Open client connections, by state and (sessions) dialect.",
        None,
        MetricType::Gauge,
    )?;
    let v3_sessions = sessions.saturating_sub(line_sessions);
    for (state, dialect, value) in [
        ("session", "v3", v3_sessions),
        ("session", "line", line_sessions),
        ("handshake", "unknown", handshakes),
    ] {
        let labels = [("state", state), ("dialect", dialect)];
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// Cluster mode's series, in exposition order.
fn encode_cluster(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    cluster_role(e, m)?;
    raft_progress(e, m)?;
    raft_traffic(e, m)?;
    peer_replication_lag(e, m)?;
    cluster_lock_events(e, m)?;
    replies(e, &m.replies)?;
    abuse(e, &m.abuse)?;
    cluster_occupancy(e, m)?;
    cluster_latencies(e, m)
}

/// This node's place in the cluster: leader, voter, bootstrap check.
fn cluster_role(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    flag(e, "is_leader", "1 if this node leads.", m.is_leader)?;
    flag(
        e,
        "has_leader",
        "1 if this node knows a leader (itself or another).",
        m.has_leader,
    )?;
    flag(
        e,
        "is_voter",
        "1 if this node is a voter of its configuration.",
        m.is_voter,
    )?;
    flag(
        e,
        "checking_genesis",
        "1 while a bootstrap member checks that its cluster is new.",
        m.checking_genesis,
    )
}

/// Where this node's Raft log stands.
fn raft_progress(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    gauge(e, "raft_term", "The current Raft term.", m.term)?;
    gauge(
        e,
        "raft_commit_index",
        "The highest log index known committed.",
        m.commit_index,
    )?;
    gauge(
        e,
        "raft_applied_index",
        "The highest log index applied to the lock state.",
        m.applied_index,
    )?;
    gauge(
        e,
        "raft_last_index",
        "The last index in this node's log.",
        m.last_index,
    )?;
    gauge(
        e,
        "node_generation",
        "This node's generation (new on every start).",
        m.generation,
    )
}

/// Leader changes, snapshots and appends this node saw or sent.
fn raft_traffic(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    counter(
        e,
        "leader_changes",
        "Times this node learned of a new leader.",
        m.raft.leader_changes,
    )?;
    counter(
        e,
        "snapshots_sent",
        "Snapshot transfers started to followers.",
        m.raft.snapshots_sent,
    )?;
    counter(
        e,
        "snapshots_received",
        "Snapshots received from a leader and installed.",
        m.raft.snapshots_received,
    )?;
    counter(
        e,
        "raft_appends_sent",
        "Appends sent to followers while leading (empty ones included).",
        m.raft.appends_sent,
    )?;
    counter(
        e,
        "raft_append_entries_sent",
        "Log entries those appends carried.",
        m.raft.append_entries_sent,
    )?;
    counter(
        e,
        "raft_append_responses_sent",
        "Append answers sent to the leader while following.",
        m.raft.append_responses_sent,
    )?;
    counter(
        e,
        "raft_appends_uncovered",
        "Appends this follower dropped until its durable token reserve covered their entries (sent again by the leader).",
        m.appends_uncovered,
    )
}

fn peer_replication_lag(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    let mut metric = e.encode_descriptor(
        "peer_replication_lag_entries",
        "Leader only: log entries each peer slot is known to lack.",
        None,
        MetricType::Gauge,
    )?;
    for peer in &m.peers {
        let slot = peer.slot.to_string();
        let labels = [("slot", slot.as_str())];
        metric
            .encode_family(&labels)?
            .encode_gauge(&peer.lag_entries)?;
    }
    Ok(())
}

/// What the replicated lock state did: grants, releases, expiries, B answers.
fn cluster_lock_events(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    counter(
        e,
        "grants",
        "Grants applied to the replicated lock state.",
        m.locks.grants,
    )?;
    counter(
        e,
        "releases",
        "Releases applied that released a current grant (force-releases included).",
        m.locks.releases,
    )?;
    counter(
        e,
        "lease_expiries_applied",
        "Lease expiries applied that removed a current grant (every node).",
        m.locks.expiries,
    )?;
    counters(
        e,
        "lease_expiries",
        "Leader: applied lease expiries, by whether a waiter was queued for the keys.",
        "handed_over",
        &[
            ("true", m.expiries_handed_over),
            ("false", m.expiries_not_handed_over),
        ],
    )?;
    counter(
        e,
        "release_handovers",
        "Leader: applied releases (force-releases included) whose keys had a waiter queued.",
        m.release_handovers,
    )?;
    counter(
        e,
        "force_releases",
        "Operator force-releases applied that revoked a grant (also counted in releases).",
        m.locks.force_releases,
    )?;
    extensions(e, &m.locks.extensions, m.locks.expiries_extended)?;
    pushes(e, &m.pushes)?;
    busy(
        e,
        "Leader: acquires answered B, by the limit that was reached.",
        &m.busy,
        m.busy_per_connection,
        Some(m.busy_backpressure),
    )
}

/// What the node holds now: keys, waiters, sessions.
fn cluster_occupancy(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    gauge(
        e,
        "held_keys",
        "Keys held in the applied state.",
        m.held_keys,
    )?;
    gauge(e, "waiters", "Queued acquires (leader only).", m.waiters)?;
    gauge(
        e,
        "client_sessions",
        "Client connections past their handshake.",
        m.sessions,
    )?;
    let mut metric = e.encode_descriptor(
        "client_sessions_by_dialect",
        "Client connections past their handshake, by dialect.",
        None,
        MetricType::Gauge,
    )?;
    let v3_sessions = m.sessions.saturating_sub(m.line_sessions);
    for (dialect, value) in [("v3", v3_sessions), ("line", m.line_sessions)] {
        metric
            .encode_family(&[("dialect", dialect)])?
            .encode_gauge(&value)?;
    }
    Ok(())
}

fn cluster_latencies(e: &mut DescriptorEncoder, m: &ClusterMetrics) -> fmt::Result {
    histogram(
        e,
        "lock_hold",
        "Time from a grant's apply to its release's or expiry's apply, on this node's clock.",
        &m.locks.hold,
    )?;
    histogram(
        e,
        "lock_wait",
        "Leader: time from an acquire's arrival to its grant's reply.",
        &m.wait,
    )?;
    histogram(
        e,
        "raft_commit_latency",
        "Leader: time from proposing a command to applying it (committed by a majority).",
        &m.commit_latency,
    )
}
