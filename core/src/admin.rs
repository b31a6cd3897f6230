//! Who may use the admin API: the access rule, decided here so that every
//! driver (the tokio daemon's HTTP listener today) applies the same one.
//!
//! - `/metrics`, `/livez`, `/readyz` ([`AdminEndpoint::Health`]) never need
//!   a token: they tell nothing about who holds what.
//! - Inspection (`GET /v1/locks…`, [`AdminEndpoint::Read`]) needs no token
//!   on a loopback listener and an admin token otherwise.
//! - A force-release ([`AdminEndpoint::Write`]) always needs an admin token.
//!
//! A token is presented as `Authorization: Bearer <token>`. Tokens are
//! compared as SHA-256 digests, in constant time, against every configured
//! token (no early exit), so neither a token's bytes nor which one matched
//! leak through timing.

use sha2::{Digest, Sha256};

use crate::auth::{TokenTooShort, each_long_enough};

/// What kind of admin endpoint a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminEndpoint {
    /// `/metrics`, `/livez`, `/readyz`.
    Health,
    /// Read-only inspection (`GET /v1/locks…`).
    Read,
    /// A state change (`POST /v1/locks/{key}/release`).
    Write,
}

/// The access rule's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAccess {
    /// Serve the request.
    Allow,
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
    match endpoint {
        AdminEndpoint::Health => return AdminAccess::Allow,
        AdminEndpoint::Read if loopback_listener => return AdminAccess::Allow,
        AdminEndpoint::Read | AdminEndpoint::Write => {}
    }
    let Some(token) = authorization.and_then(bearer_token) else {
        return AdminAccess::Unauthorized;
    };
    if tokens.accepts(token) {
        AdminAccess::Allow
    } else {
        AdminAccess::Forbidden
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
