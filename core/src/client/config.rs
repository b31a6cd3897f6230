//! What a user configures for a broker ([`BrokerConfig`]), its validation,
//! and the connections it implies ([`Endpoint`]).
use std::fmt;

use super::error::ClientError;
use super::session::{DEFAULT_SILENCE_TIMEOUT, SessionConfig};
use crate::time::Duration;
use crate::wire::Capabilities;

/// Shortest [`BrokerConfig::silence_timeout`] a configuration may ask for.
pub const SILENCE_TIMEOUT_MIN: Duration = Duration::from_millis(100);

/// Longest [`BrokerConfig::silence_timeout`] a configuration may ask for.
pub const SILENCE_TIMEOUT_MAX: Duration = Duration::from_secs(300);

/// Default broker-wide bound on acquires in flight.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// Largest broker-wide bound a configuration may ask for.
pub const PENDING_LIMIT_MAX: usize = 16_384;

/// Shortest client token a published client accepts.
const CLIENT_TOKEN_LEN_MIN: usize = 16;

/// Single server or cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerMode {
    /// One server.
    Single,
    /// 3 or 5 nodes, addresses in slot order.
    Cluster {
        /// The cluster's identity (decoded from 64 hex digits).
        identity_fingerprint: [u8; 32],
    },
}

/// How a broker secures its connections; every runtime builds its TLS
/// connector from it. The client never presents a certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Off,
    /// TLS, server verified against the operating system's trust store.
    SystemRoots,
    /// TLS, server verified against the CA certificates in this PEM file.
    Ca(std::path::PathBuf),
    /// TLS without verifying the server: anyone on the path can impersonate
    /// it. For tests only.
    InsecureSkipVerify,
}

/// What a user configures for a broker.
#[derive(Clone)]
pub struct BrokerConfig {
    /// Server addresses, `host:port` or `[v6]:port`; cluster: slot order.
    pub addrs: Vec<String>,
    /// Client token (≥ 16 bytes), or empty with `allow_loopback_no_auth`.
    pub token: String,
    /// Mode.
    pub mode: BrokerMode,
    /// Acquires in flight across the broker (1..=16384).
    pub pending_max: usize,
    /// Allows the empty token, for IP loopback addresses only.
    pub allow_loopback_no_auth: bool,
    /// [`SessionConfig::silence_timeout`] of every connection
    /// ([`SILENCE_TIMEOUT_MIN`]..=[`SILENCE_TIMEOUT_MAX`], default
    /// [`DEFAULT_SILENCE_TIMEOUT`]).
    pub silence_timeout: Duration,
    /// Names this client to operators (e.g. `host/pid/job`): sent with the
    /// negotiation after each handshake and shown with its connections in
    /// inspection. At most 64 bytes without control characters; empty:
    /// none.
    pub label: String,
}

impl fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("addrs", &self.addrs)
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("mode", &self.mode)
            .field("pending_max", &self.pending_max)
            .field("allow_loopback_no_auth", &self.allow_loopback_no_auth)
            .field("silence_timeout", &self.silence_timeout)
            .field("label", &self.label)
            .finish()
    }
}

/// One connection a broker keeps.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Where to connect.
    pub addr: String,
    /// What to expect there.
    pub session: SessionConfig,
}

impl BrokerConfig {
    /// A single-mode configuration with defaults.
    pub fn single(addr: impl Into<String>, token: impl Into<String>) -> Self {
        BrokerConfig {
            addrs: vec![addr.into()],
            token: token.into(),
            mode: BrokerMode::Single,
            pending_max: DEFAULT_MAX_PENDING,
            allow_loopback_no_auth: false,
            silence_timeout: DEFAULT_SILENCE_TIMEOUT,
            label: String::new(),
        }
    }

    /// Validates the configuration and lists the connections to keep, in
    /// router order (each asks for [`Capabilities::EXTEND`] and [`Capabilities::PUSH`] after its
    /// handshake, so tickets can be renewed): a single address gets two connections (so one dropped
    /// socket does not interrupt service); cluster connection `i` is slot `i`.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, ClientError> {
        if self.addrs.is_empty() {
            return Err(ClientError::InvalidInput(
                "at least one server address is required",
            ));
        }
        if !(1..=PENDING_LIMIT_MAX).contains(&self.pending_max) {
            return Err(ClientError::InvalidInput("max_pending must be 1..=16384"));
        }
        if !(SILENCE_TIMEOUT_MIN..=SILENCE_TIMEOUT_MAX).contains(&self.silence_timeout) {
            return Err(ClientError::InvalidInput(
                "silence_timeout must be 100 ms..=300 s",
            ));
        }
        for addr in &self.addrs {
            validate_addr(addr)?;
        }
        if self.token.is_empty() {
            if !self.allow_loopback_no_auth {
                return Err(ClientError::InvalidInput(
                    "client token is required unless loopback no-auth mode is explicit",
                ));
            }
            if !self.addrs.iter().all(|addr| is_loopback_addr(addr)) {
                return Err(ClientError::InvalidInput(
                    "loopback no-auth mode requires loopback server addresses (127.0.0.1, [::1] or localhost); give a client token for any other",
                ));
            }
        } else if self.token.len() < CLIENT_TOKEN_LEN_MIN {
            return Err(ClientError::InvalidInput(
                "client token must be at least 16 bytes",
            ));
        }
        let token = self.token.as_bytes();
        match self.mode {
            BrokerMode::Single => {
                if self.addrs.len() != 1 {
                    return Err(ClientError::InvalidInput(
                        "single mode requires exactly one server address",
                    ));
                }
                let endpoint = Endpoint {
                    addr: self.addrs[0].clone(),
                    session: SessionConfig {
                        silence_timeout: self.silence_timeout,
                        extensions: Capabilities::EXTEND.union(Capabilities::PUSH),
                        ..SessionConfig::single(token)
                    }
                    .with_label(&self.label)?,
                };
                Ok(vec![endpoint.clone(), endpoint])
            }
            BrokerMode::Cluster {
                identity_fingerprint,
            } => {
                let size = self.addrs.len();
                if !matches!(size, 3 | 5) {
                    return Err(ClientError::InvalidInput(
                        "cluster mode requires exactly 3 or 5 slot-ordered server addresses",
                    ));
                }
                self.addrs
                    .iter()
                    .zip(0u8..)
                    .map(|(addr, slot)| {
                        Ok(Endpoint {
                            addr: addr.clone(),
                            session: SessionConfig {
                                silence_timeout: self.silence_timeout,
                                extensions: Capabilities::EXTEND.union(Capabilities::PUSH),
                                ..SessionConfig::cluster(token, identity_fingerprint, slot, size)
                            }
                            .with_label(&self.label)?,
                        })
                    })
                    .collect()
            }
        }
    }
}

/// `(host, port)` of `host:port` or `[v6]:port`.
fn split_addr(addr: &str) -> Result<(&str, &str), ClientError> {
    const INVALID: ClientError = ClientError::InvalidInput("invalid server address");
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, suffix) = rest.split_once(']').ok_or(INVALID)?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(INVALID);
        }
        Ok((host, suffix.strip_prefix(':').ok_or(INVALID)?))
    } else {
        let (host, port) = addr.rsplit_once(':').ok_or(INVALID)?;
        if host.contains([':', '[', ']']) {
            return Err(ClientError::InvalidInput(
                "IPv6 server addresses must use brackets",
            ));
        }
        Ok((host, port))
    }
}

fn validate_addr(addr: &str) -> Result<(), ClientError> {
    const INVALID: ClientError = ClientError::InvalidInput("invalid server address");
    if addr.is_empty()
        || addr.len() > 1024
        || addr.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(INVALID);
    }
    let (host, port) = split_addr(addr)?;
    let port = port
        .parse::<u16>()
        .map_err(|_| ClientError::InvalidInput("invalid server address port"))?;
    if host.is_empty() || port == 0 {
        return Err(INVALID);
    }
    Ok(())
}

/// An IP loopback address, or `localhost` (which names the loopback
/// interface by definition, RFC 6761).
fn is_loopback_addr(addr: &str) -> bool {
    split_addr(addr).ok().is_some_and(|(host, _)| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}
