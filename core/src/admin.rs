//! Who may use the admin API: the access rule, decided here so that every
//! driver (the tokio daemon's HTTP listener today) applies the same one.
//!
//! - `/metrics`, `/livez`, `/readyz` ([`AdminEndpoint::Health`]) never need
//!   a token: they tell nothing about who holds what.
//! - Inspection (`GET /v1/locks…`, `/v1/node`, `/v1/events`,
//!   [`AdminEndpoint::Read`]) needs an admin
//!   token, except on a loopback listener, which answers a reader without
//!   one [`AdminAccess::Redacted`]: keys and ages, but no fencing token
//!   (one `R` with it would free anyone's lock) and no client address.
//! - A force-release ([`AdminEndpoint::Write`]) always needs an admin token.
//!
//! A token is presented as `Authorization: Bearer <token>`. Tokens are
//! compared as SHA-256 digests, in constant time, against every configured
//! token (no early exit), so neither a token's bytes nor which one matched
//! leak through timing. A presented token is always checked: a wrong one
//! is refused even where no token is needed.
//!
//! Also here, so that every driver applies them alike: which `Host` a
//! request may name ([`host_allowed`], against DNS rebinding), and the
//! count and rate-limited logging of every refusal ([`AdminRefusals`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::auth::{TokenTooShort, each_long_enough};

/// What kind of admin endpoint a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminEndpoint {
    /// `/metrics`, `/livez`, `/readyz`.
    Health,
    /// Read-only inspection (`GET /v1/locks…`, `/v1/node`, `/v1/events`).
    Read,
    /// A state change (`POST /v1/locks/{key}/release`).
    Write,
}

/// The access rule's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAccess {
    /// Serve the request.
    Allow,
    /// Serve it without fencing tokens or client addresses (a reader on
    /// a loopback listener without a token).
    Redacted,
    /// No credentials, or not a `Bearer` token (HTTP 401).
    Unauthorized,
    /// A token that is not an admin token (HTTP 403).
    Forbidden,
}

/// The configured admin tokens, kept as SHA-256 digests.
#[derive(Clone, Default)]
pub struct AdminTokens {
    digests: Vec<[u8; 32]>,
}

impl core::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print secrets, not even their digests.
        write!(f, "AdminTokens({} configured)", self.digests.len())
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl AdminTokens {
    /// Accepts any of `tokens`; each must be at least 16 bytes
    /// ([`crate::auth::TOKEN_LEN_MIN`]). An empty list accepts no token at all.
    pub fn new<I, T>(tokens: I) -> Result<Self, TokenTooShort>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let digests = each_long_enough(tokens, digest)?;
        Ok(AdminTokens { digests })
    }

    /// True when no admin token is configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `token` is one of the admin tokens, in time independent of
    /// its bytes and of which one it matches.
    pub fn accepts(&self, token: &[u8]) -> bool {
        let presented = digest(token);
        let mut matched = 0u8;
        for configured in &self.digests {
            let difference = configured
                .iter()
                .zip(&presented)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            matched |= u8::from(difference == 0);
        }
        matched == 1
    }
}

/// The access rule. `loopback_listener`: the admin listener is bound to a
/// loopback address; `authorization`: the `Authorization` header's value,
/// if any.
pub fn admin_access(
    loopback_listener: bool,
    tokens: &AdminTokens,
    authorization: Option<&[u8]>,
    endpoint: AdminEndpoint,
) -> AdminAccess {
    if endpoint == AdminEndpoint::Health {
        return AdminAccess::Allow;
    }
    let Some(authorization) = authorization else {
        return if endpoint == AdminEndpoint::Read && loopback_listener {
            AdminAccess::Redacted
        } else {
            AdminAccess::Unauthorized
        };
    };
    match bearer_token(authorization) {
        None => AdminAccess::Unauthorized,
        Some(token) if tokens.accepts(token) => AdminAccess::Allow,
        Some(_) => AdminAccess::Forbidden,
    }
}

/// Whether a request naming `host` (its `Host` header) may be served by a
/// listener whose connection arrived on `local`: the host must be that
/// address itself (`IP:PORT`, `[IPv6]:PORT`), `localhost:PORT` when it is
/// a loopback address, or one of `allowed` (exact `name:port`, ASCII case
/// ignored). Anything else, and a missing host, is refused: a web page
/// whose name was rebound to this machine's address names its own host,
/// so a browser cannot be made to read the admin API for it.
pub fn host_allowed(host: Option<&[u8]>, local: SocketAddr, allowed: &[Box<str>]) -> bool {
    let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else {
        return false;
    };
    let host = host.trim();
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        return true;
    }
    if let Ok(named) = host.parse::<SocketAddr>() {
        return named.port() == local.port()
            && named.ip().to_canonical() == local.ip().to_canonical();
    }
    let Some((name, port)) = host.rsplit_once(':') else {
        return false;
    };
    name.eq_ignore_ascii_case("localhost")
        && port.parse::<u16>().is_ok_and(|port| port == local.port())
        && local.ip().to_canonical().is_loopback()
}

/// Why the admin listener turned something away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminRefusal {
    /// No usable credential where one is needed (401).
    Unauthorized,
    /// A token that is not an admin token (403).
    Forbidden,
    /// A `Host` that is not this listener's (421).
    BadHost,
    /// A query parameter the endpoint does not know, or a bad value (400).
    BadRequest,
    /// A connection closed at once: every admin connection slot was taken.
    ConnectionsFull,
    /// A connection closed at once: its source had all it may have.
    SourceFull,
    /// A request without an admin token answered 503: the small share of
    /// core queries such requests may have was in use.
    UnauthenticatedBusy,
    /// A connection closed for not sending its request in time.
    TimedOut,
}

impl AdminRefusal {
    /// Every kind, in a fixed order (metrics).
    pub const ALL: [AdminRefusal; 8] = [
        AdminRefusal::Unauthorized,
        AdminRefusal::Forbidden,
        AdminRefusal::BadHost,
        AdminRefusal::BadRequest,
        AdminRefusal::ConnectionsFull,
        AdminRefusal::SourceFull,
        AdminRefusal::UnauthenticatedBusy,
        AdminRefusal::TimedOut,
    ];

    /// The label of its metric series.
    pub fn label(self) -> &'static str {
        match self {
            AdminRefusal::Unauthorized => "unauthorized",
            AdminRefusal::Forbidden => "forbidden",
            AdminRefusal::BadHost => "bad_host",
            AdminRefusal::BadRequest => "bad_request",
            AdminRefusal::ConnectionsFull => "connections_full",
            AdminRefusal::SourceFull => "source_full",
            AdminRefusal::UnauthenticatedBusy => "unauthenticated_busy",
            AdminRefusal::TimedOut => "timed_out",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Least time between two log lines about refusals, in milliseconds: a
/// flood of refusals costs one line a second, with the count of those not
/// logged.
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 1_000;

/// Refusals counted by kind, and the decision which of them to log. Shared
/// by the admin listener's tasks (atomics, no lock); time comes in as
/// milliseconds on the driver's clock.
#[derive(Debug, Default)]
pub struct AdminRefusals {
    counts: [AtomicU64; AdminRefusal::ALL.len()],
    /// When the last line was logged, plus one (0: never).
    logged_at_ms: AtomicU64,
    /// Refusals since that line.
    unlogged: AtomicU64,
}

impl AdminRefusals {
    /// Counts `refusal` at `now_ms`; `Some(n)` when it is to be logged now,
    /// `n` being the refusals not logged since the last line.
    pub fn note(&self, refusal: AdminRefusal, now_ms: u64) -> Option<u64> {
        self.counts[refusal.index()].fetch_add(1, Ordering::Relaxed);
        let last = self.logged_at_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_add(1) >= last + REFUSAL_LOG_INTERVAL_MS;
        if due
            && self
                .logged_at_ms
                .compare_exchange(
                    last,
                    now_ms.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.unlogged.swap(0, Ordering::Relaxed));
        }
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// How many of `refusal` were counted.
    pub fn count(&self, refusal: AdminRefusal) -> u64 {
        self.counts[refusal.index()].load(Ordering::Relaxed)
    }
}

/// The token of a `Bearer <token>` credential (scheme case-insensitive, as
/// HTTP says); `None` when it is another scheme or empty.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}
