//! The lock API of the admin listener:
//! `GET /v1/locks?prefix=P&limit=N&cursor=C`, `GET /v1/locks/{key}`,
//! `POST /v1/locks/{key}/release[?token=T]`, `GET /v1/node` (this
//! node's slot, the leader it knows and, in a cluster, every member as it
//! sees them), and `GET /v1/events` (the core's recent events).
//!
//! Thin by design: each handler checks the request's `Host` and query
//! parameters, asks the core's access rule
//! ([`ticketing_core::admin::admin_access`]) whether and how to serve,
//! makes one bounded call into the core through [`AdminNode`] (under the
//! core's mutex, never across an await), and renders the answer as JSON. A force-release gets
//! an [`AdminRequestId`] and waits on a oneshot that the drive loop
//! completes when the core answers ([`PendingAdmin`]); at most
//! [`PENDING_ADMIN_REQUESTS_MAX`] wait at once.
//!
//! Keys are bytes on the wire of this API: the path and the `prefix` are
//! percent-decoded (a `/` inside a key may be sent as is or as `%2F`). In
//! answers a key is a JSON string when it is UTF-8 (`"key_encoding":
//! "utf8"`) and lowercase hex otherwise (`"hex"`). See `docs/admin-api.md`.

#![expect(
    clippy::result_large_err,
    reason = "a refusal is the HTTP response itself, built once and sent at once"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Extension;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};
use ticketing_core::admin::{
    AdminAccess, AdminEndpoint, AdminRefusal, AdminRefusals, AdminTokens, admin_access,
    host_allowed,
};
use ticketing_core::budget::AbuseKind;
use ticketing_core::events::{EVENTS_MAX, Event, EventView};
use ticketing_core::inspect::{
    AdminRequestId, ConnView, ForceRelease, ForceReleaseOutcome, HolderView, LISTING_LIMIT_MAX,
    ListingCursor, LockListing, LockView, MemberView, NotLeader,
};
use ticketing_core::server::Dialect;
use ticketing_core::wire::Key;
use tokio::sync::Semaphore;
use tokio::sync::oneshot;
use tracing::warn;

use super::NodeMetrics;

mod json;

pub use json::rfc3339;
use json::{event_json, lock_json, member_json, outcome_response};

/// Most force-releases waiting for the core's answer at once; one more is
/// answered 503.
pub const PENDING_ADMIN_REQUESTS_MAX: usize = 64;
/// A listing's size when the request names no `limit`.
pub const DEFAULT_LISTING_LIMIT: usize = 100;
/// How long a force-release waits for the core's answer (a cluster node
/// answers once its command is applied) before the request gets 504.
pub const ADMIN_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the admin handlers need from a node.
pub trait AdminNode: Send + Sync + 'static {
    /// A snapshot of what the core counted.
    fn metrics(&self) -> NodeMetrics;
    /// One key as the core sees it now.
    fn lock(&self, key: &Key) -> Option<LockView>;
    /// One page of the keys by prefix as the core sees them now, going on
    /// from `cursor` (bounded work per call).
    fn locks(&self, prefix: &[u8], limit: usize, cursor: ListingCursor) -> LockListing;
    /// Orders a force-release; the receiver gets the core's answer. `None`
    /// when [`PENDING_ADMIN_REQUESTS_MAX`] are already waiting.
    fn force_release(&self, req: ForceRelease) -> Option<oneshot::Receiver<ForceReleaseOutcome>>;
    /// Where the core sends an operator instead (a cluster node that is
    /// not the leader); `None`: this node serves the lock API itself.
    fn not_leader(&self) -> Option<NotLeader> {
        None
    }
    /// The core's recent events, the most recent first.
    fn events(&self) -> Vec<EventView>;
    /// Every cluster member as the core sees it (empty in single mode).
    fn members(&self) -> Vec<MemberView>;
}

/// Force-releases waiting for the core's answer, by the id the core was
/// given (kept in the driver's shared state, completed by the drive loop).
#[derive(Debug, Default)]
pub(crate) struct PendingAdmin {
    next_id: u64,
    waiting: HashMap<AdminRequestId, oneshot::Sender<ForceReleaseOutcome>>,
}

impl PendingAdmin {
    /// A fresh id and the receiver of its answer; `None` when full.
    pub(crate) fn register(
        &mut self,
    ) -> Option<(AdminRequestId, oneshot::Receiver<ForceReleaseOutcome>)> {
        if self.waiting.len() >= PENDING_ADMIN_REQUESTS_MAX {
            // Callers that gave up (timed out, disconnected) free their slot.
            self.waiting.retain(|_, sender| !sender.is_closed());
            if self.waiting.len() >= PENDING_ADMIN_REQUESTS_MAX {
                return None;
            }
        }
        self.next_id += 1;
        let id = AdminRequestId(self.next_id);
        let (sender, receiver) = oneshot::channel();
        self.waiting.insert(id, sender);
        Some((id, receiver))
    }

    /// The core answered `id`.
    pub(crate) fn answer(&mut self, id: AdminRequestId, outcome: ForceReleaseOutcome) {
        if let Some(sender) = self.waiting.remove(&id) {
            // A caller that gave up no longer listens; nothing to do.
            let _ = sender.send(outcome);
        }
    }
}

/// How long a request without an admin token waits for its share of core
/// queries before it is answered `503`.
pub const UNAUTHENTICATED_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

/// Core queries (a listing page, one key) that requests without an admin
/// token may have under way at once: their own small budget, so that a
/// flood of anonymous readers on a loopback listener takes at most this
/// share of the state machine's time.
pub const UNAUTHENTICATED_QUERIES_MAX: usize = 1;

/// The addresses of the connection a request came on (set by the
/// listener on every request).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnAddrs {
    /// The listener's address the connection arrived at.
    pub(crate) local: SocketAddr,
    /// The client's address.
    pub(crate) peer: SocketAddr,
}

/// Everything a handler needs.
pub(crate) struct AdminApp {
    pub(crate) node: Arc<dyn AdminNode>,
    /// The listener is bound to a loopback address.
    pub(crate) loopback: bool,
    pub(crate) tokens: AdminTokens,
    /// `Host` names served besides the listener's own address.
    pub(crate) allowed_hosts: Vec<Box<str>>,
    /// Every refusal, counted (and served in `/metrics`).
    pub(crate) refusals: Arc<AdminRefusals>,
    /// The share of core queries of requests without an admin token.
    pub(crate) unauthenticated: Semaphore,
    /// The origin of the milliseconds the refusal log is timed by.
    pub(crate) started: std::time::Instant,
}

impl AdminApp {
    /// Counts `refusal` and logs it, at most once a second with the count
    /// of those not logged since.
    pub(crate) fn refused(&self, refusal: AdminRefusal, peer: Option<SocketAddr>) {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(unlogged) = self.refusals.note(refusal, now_ms) {
            let source = peer.map(|p| p.ip().to_string()).unwrap_or_default();
            warn!(
                reason = refusal.label(),
                source,
                unlogged,
                "admin request refused (counted in ticketing_admin_refusals_total)"
            );
        }
    }
}

pub(crate) type AppState = Arc<AdminApp>;

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({ "error": code, "message": message });
    let mut response = (status, json_text(&body)).into_response();
    set_json(&mut response);
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

fn json_text(value: &Value) -> String {
    let mut text = value.to_string();
    text.push('\n');
    text
}

fn set_json(response: &mut Response) {
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
}

fn ok_json(status: StatusCode, value: &Value) -> Response {
    let mut response = (status, json_text(value)).into_response();
    set_json(&mut response);
    response
}

/// How a request that passed its checks is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    /// In full: the reader presented an admin token.
    Full,
    /// Without fencing tokens or client addresses.
    Redacted,
}

/// The access rule's answer: how to serve, or the refusal to send.
fn access(
    app: &AdminApp,
    headers: &HeaderMap,
    endpoint: AdminEndpoint,
    peer: SocketAddr,
) -> Result<Served, Response> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(header::HeaderValue::as_bytes);
    match admin_access(app.loopback, &app.tokens, authorization, endpoint) {
        AdminAccess::Allow => Ok(Served::Full),
        AdminAccess::Redacted => Ok(Served::Redacted),
        AdminAccess::Unauthorized => {
            app.refused(AdminRefusal::Unauthorized, Some(peer));
            Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                if app.tokens.is_empty() {
                    // No token could work: say what would.
                    "this server has no admin token configured, so this needs one it cannot \
                     accept: start it with --admin-token-file FILE (or admin_tokens)"
                } else {
                    "an admin token is needed: Authorization: Bearer <token>"
                },
            ))
        }
        AdminAccess::Forbidden => {
            app.refused(AdminRefusal::Forbidden, Some(peer));
            Err(error(
                StatusCode::FORBIDDEN,
                "forbidden",
                if app.tokens.is_empty() {
                    "the token is not an admin token: this server has no admin token \
                     configured (start it with --admin-token-file FILE, or admin_tokens)"
                } else {
                    "the token is not an admin token"
                },
            ))
        }
    }
}

/// Answers `421` unless the request's `Host` names this listener (see
/// [`host_allowed`]), before any route: a page whose name was rebound to
/// this address cannot read the API through a local browser.
pub(crate) async fn host_guard(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(header::HeaderValue::as_bytes);
    if host_allowed(host, addrs.local, &app.allowed_hosts) {
        return next.run(request).await;
    }
    app.refused(AdminRefusal::BadHost, Some(addrs.peer));
    error(
        StatusCode::MISDIRECTED_REQUEST,
        "bad_host",
        "the Host header must name this listener's address (or a name in admin_allowed_hosts)",
    )
}

/// `400` unless every query parameter is one of `known`, each at most
/// once.
fn check_params(
    app: &AdminApp,
    uri: &Uri,
    known: &[&str],
    peer: SocketAddr,
) -> Result<(), Response> {
    let mut seen: Vec<&str> = Vec::new();
    for pair in uri.query().unwrap_or_default().split('&') {
        if pair.is_empty() {
            continue;
        }
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let problem = if !known.contains(&name) {
            Some(format!(
                "unknown query parameter; this endpoint takes: {}",
                list_or_none(known)
            ))
        } else if seen.contains(&name) {
            Some(format!("query parameter {name} given twice"))
        } else {
            seen.push(name);
            None
        };
        if let Some(message) = problem {
            app.refused(AdminRefusal::BadRequest, Some(peer));
            return Err(error(StatusCode::BAD_REQUEST, "bad_request", &message));
        }
    }
    Ok(())
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The query parameter `name`, percent-decoded to bytes (`+` is a space).
fn query_param(uri: &Uri, name: &str) -> Option<Vec<u8>> {
    uri.query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode_str(&value.replace('+', " ")).collect())
    })
}

/// A request that cannot be served as written (400), as a small value.
struct BadRequest {
    code: &'static str,
    message: String,
}

impl BadRequest {
    /// Counts the refusal and answers it `400`.
    fn refuse(self, app: &AdminApp, peer: SocketAddr) -> Response {
        app.refused(AdminRefusal::BadRequest, Some(peer));
        error(StatusCode::BAD_REQUEST, self.code, &self.message)
    }
}

fn parse_number(uri: &Uri, name: &str) -> Result<Option<u64>, BadRequest> {
    match query_param(uri, name) {
        None => Ok(None),
        Some(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| BadRequest {
                code: "bad_request",
                message: format!("{name} must be a non-negative integer"),
            }),
    }
}

fn parse_key(raw: &str) -> Result<Key, BadRequest> {
    let bytes: Vec<u8> = percent_decode_str(raw).collect();
    Key::new(&bytes).map_err(|_| BadRequest {
        code: "bad_key",
        message: "a key is 1..=128 bytes of UTF-8 without space, CR or LF".to_owned(),
    })
}

/// The part of the path after `/v1/locks/`, still percent-encoded.
fn key_path(uri: &Uri) -> &str {
    uri.path().strip_prefix("/v1/locks/").unwrap_or_default()
}

/// What every lock API request passes after its `Host`: its query
/// parameters (`known`), the access rule, then (on a node that is not
/// the leader) the redirect to the leader. `Err` is the answer instead of
/// serving it.
fn turned_away(
    app: &AppState,
    request: &Request<'_>,
    endpoint: AdminEndpoint,
    known: &[&str],
) -> Result<Served, Response> {
    check_params(app, request.uri, known, request.addrs.peer)?;
    let served = access(app, request.headers, endpoint, request.addrs.peer)?;
    match app.node.not_leader() {
        Some(not_leader) => Err(to_the_leader(&not_leader, request.uri)),
        None => Ok(served),
    }
}

/// What a handler was given.
struct Request<'a> {
    headers: &'a HeaderMap,
    uri: &'a Uri,
    addrs: ConnAddrs,
}

/// Runs `query` against the core: at once for a reader with an admin
/// token; within the small shared budget of readers without one, or
/// `503` after [`UNAUTHENTICATED_QUEUE_TIMEOUT`].
async fn query_core<T>(
    app: &AppState,
    served: Served,
    peer: SocketAddr,
    query: impl FnOnce() -> T,
) -> Result<T, Response> {
    if served == Served::Full {
        return Ok(query());
    }
    match tokio::time::timeout(UNAUTHENTICATED_QUEUE_TIMEOUT, app.unauthenticated.acquire()).await {
        Ok(Ok(_permit)) => Ok(query()),
        Ok(Err(_)) | Err(_) => {
            app.refused(AdminRefusal::UnauthenticatedBusy, Some(peer));
            Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many requests without an admin token; retry, or send one",
            ))
        }
    }
}

/// `GET /v1/node`: this node's place, answered by every node (a follower
/// does not redirect it): single or cluster, its slot, and the leader it
/// knows (slot, and admin address when configured). Read access, like the
/// lock API: the leader's address is what a redirect would reveal.
pub(crate) async fn node(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(refused) = check_params(&app, &uri, &[], addrs.peer) {
        return refused;
    }
    if let Err(refused) = access(&app, &headers, AdminEndpoint::Read, addrs.peer) {
        return refused;
    }
    // Asked first: a node that knows another leader says so here, one
    // that leads answers None (and its metrics say it leads).
    let elsewhere = app.node.not_leader();
    let body = match app.node.metrics() {
        NodeMetrics::Single(_) => json!({
            "mode": "single",
            "slot": Value::Null,
            "leader_slot": Value::Null,
            "leader_admin": Value::Null,
        }),
        NodeMetrics::Cluster(m) => {
            let (leader_slot, leader_admin) = match elsewhere {
                Some(not_leader) => (not_leader.leader_slot, not_leader.leader_admin),
                None if m.is_leader => (Some(m.slot), None),
                None => (None, None),
            };
            let members: Vec<Value> = app.node.members().iter().map(member_json).collect();
            json!({
                "mode": "cluster",
                "slot": m.slot,
                "leader_slot": leader_slot,
                "leader_admin": leader_admin.as_deref(),
                "members": members,
            })
        }
    };
    ok_json(StatusCode::OK, &body)
}

/// `GET /v1/events`: this node's recent events, the most recent first
/// (every node answers with its own; a follower does not redirect).
/// Read access, like the lock API: without the admin token (loopback
/// only) every token in them is `null`.
pub(crate) async fn events(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(refused) = check_params(&app, &uri, &[], addrs.peer) {
        return refused;
    }
    let served = match access(&app, &headers, AdminEndpoint::Read, addrs.peer) {
        Ok(served) => served,
        Err(refused) => return refused,
    };
    let events = match query_core(&app, served, addrs.peer, || app.node.events()).await {
        Ok(events) => events,
        Err(busy) => return busy,
    };
    let now = SystemTime::now();
    let events: Vec<Value> = events
        .iter()
        .map(|view| event_json(view, now, served))
        .collect();
    ok_json(
        StatusCode::OK,
        &json!({
            "events": events,
            "events_max": EVENTS_MAX,
            "redacted": served == Served::Redacted,
        }),
    )
}

pub(crate) async fn list(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let request = Request {
        headers: &headers,
        uri: &uri,
        addrs,
    };
    let served = match turned_away(
        &app,
        &request,
        AdminEndpoint::Read,
        &["prefix", "limit", "cursor"],
    ) {
        Ok(served) => served,
        Err(refused) => return refused,
    };
    let prefix = query_param(&uri, "prefix").unwrap_or_default();
    let limit = match parse_number(&uri, "limit") {
        Ok(limit) => limit.map_or(DEFAULT_LISTING_LIMIT, |n| {
            usize::try_from(n)
                .unwrap_or(usize::MAX)
                .clamp(1, LISTING_LIMIT_MAX)
        }),
        Err(bad) => return bad.refuse(&app, addrs.peer),
    };
    let cursor = match query_param(&uri, "cursor") {
        None => ListingCursor::START,
        Some(text) => match std::str::from_utf8(&text)
            .ok()
            .and_then(ListingCursor::parse)
        {
            Some(cursor) => cursor,
            None => {
                return BadRequest {
                    code: "bad_cursor",
                    message: "cursor must be a next_cursor this API returned".to_owned(),
                }
                .refuse(&app, addrs.peer);
            }
        },
    };
    let listing = match query_core(&app, served, addrs.peer, || {
        app.node.locks(&prefix, limit, cursor)
    })
    .await
    {
        Ok(listing) => listing,
        Err(busy) => return busy,
    };
    let now = SystemTime::now();
    let locks: Vec<Value> = listing
        .locks
        .iter()
        .map(|view| lock_json(view, now, served))
        .collect();
    let next_cursor = listing.next.map(|next| next.to_text());
    ok_json(
        StatusCode::OK,
        &json!({
            "locks": locks,
            "next_cursor": next_cursor,
            "truncated": next_cursor.is_some(),
            "redacted": served == Served::Redacted,
        }),
    )
}

pub(crate) async fn show(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let request = Request {
        headers: &headers,
        uri: &uri,
        addrs,
    };
    let served = match turned_away(&app, &request, AdminEndpoint::Read, &[]) {
        Ok(served) => served,
        Err(refused) => return refused,
    };
    let key = match parse_key(key_path(&uri)) {
        Ok(key) => key,
        Err(bad) => return bad.refuse(&app, addrs.peer),
    };
    let view = match query_core(&app, served, addrs.peer, || app.node.lock(&key)).await {
        Ok(view) => view,
        Err(busy) => return busy,
    };
    match view {
        Some(view) => ok_json(StatusCode::OK, &lock_json(&view, SystemTime::now(), served)),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "the key is neither held nor waited on",
        ),
    }
}

pub(crate) async fn release(
    axum::extract::State(app): axum::extract::State<AppState>,
    Extension(addrs): Extension<ConnAddrs>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let Some(raw_key) = key_path(&uri).strip_suffix("/release") else {
        return error(
            StatusCode::NOT_FOUND,
            "no_route",
            "POST /v1/locks/{key}/release is the only write",
        );
    };
    let request = Request {
        headers: &headers,
        uri: &uri,
        addrs,
    };
    if let Err(refused) = turned_away(&app, &request, AdminEndpoint::Write, &["token"]) {
        return refused;
    }
    let key = match parse_key(raw_key) {
        Ok(key) => key,
        Err(bad) => return bad.refuse(&app, addrs.peer),
    };
    let token = match parse_number(&uri, "token") {
        Ok(token) => token,
        Err(bad) => return bad.refuse(&app, addrs.peer),
    };
    let Some(answer) = app.node.force_release(ForceRelease { key, token }) else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "too many force-releases in flight; retry",
        );
    };
    let outcome = match tokio::time::timeout(ADMIN_REPLY_TIMEOUT, answer).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) | Err(_) => {
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                "indeterminate",
                "no answer from the core in time; inspect the key",
            );
        }
    };
    if let ForceReleaseOutcome::NotLeader { leader_slot } = outcome {
        // Leadership moved between the check and the order: send the
        // operator on with what the core knows now.
        let not_leader = app.node.not_leader().unwrap_or(NotLeader {
            leader_slot,
            leader_admin: None,
        });
        return to_the_leader(&not_leader, &uri);
    }
    outcome_response(&outcome)
}

/// A cluster node that is not the leader: `307 Temporary Redirect` to the
/// same path and query on the leader's admin address (a POST stays a
/// POST), with the same facts as JSON; `503` when no leader, or no admin
/// address for it, is known.
fn to_the_leader(not_leader: &NotLeader, uri: &Uri) -> Response {
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    match (&not_leader.leader_admin, not_leader.leader_slot) {
        (Some(admin), slot) => {
            let location = format!("http://{admin}{path}");
            let body = json!({
                "error": "not_leader",
                "message": "this node is not the leader; ask the leader's admin address",
                "leader_slot": slot,
                "leader_admin": admin.as_ref(),
                "location": location,
            });
            let mut response = ok_json(StatusCode::TEMPORARY_REDIRECT, &body);
            if let Ok(value) = header::HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            response
        }
        (None, Some(slot)) => ok_json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({
                "error": "not_leader",
                "message": "this node is not the leader, and no admin address is configured \
                            for the leader's slot (slots[].admin)",
                "leader_slot": slot,
            }),
        ),
        (None, None) => ok_json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({
                "error": "no_leader",
                "message": "no leader is known (an election, or this node is cut off); retry",
                "leader_slot": Value::Null,
            }),
        ),
    }
}
