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
        /// The cluster's identity: [`ClusterIdentity::to_bytes`] of
        /// [`ClusterIdentity::from_hex`] of the 64 hex digits.
        identity_fingerprint: [u8; 32],
    },
}

/// A cluster's identity: the 32 bytes every node of one cluster is started
/// with (`--cluster-identity`, made by `ticketing identity`) and every
/// client of it must present, so that a client pointed at the wrong cluster
/// is refused at the handshake instead of taking locks there. Written as 64
/// lowercase hex digits, the form `ticketing identity` prints and the server
/// reads.
///
/// ```
/// use ticketing_core::client::{BrokerMode, ClusterIdentity};
///
/// let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// let identity = ClusterIdentity::from_hex(hex)?;
/// assert_eq!(identity.to_string(), hex);
/// let mode = BrokerMode::Cluster { identity_fingerprint: identity.to_bytes() };
/// # let _ = mode;
/// # Ok::<(), ticketing_core::client::ClusterIdentityError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterIdentity([u8; 32]);

impl ClusterIdentity {
    /// Number of hex digits in the written form.
    pub const HEX_LEN: usize = 64;

    /// The identity with these bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The identity's bytes, as [`BrokerMode::Cluster`] takes them.
    pub const fn to_bytes(self) -> [u8; 32] {
        self.0
    }

    /// Parses the written form: exactly 64 lowercase hex digits, nothing
    /// around them. Upper case is refused, as the server refuses it, so that
    /// a string accepted here is accepted by `ticketing serve` too.
    pub fn from_hex(text: &str) -> Result<Self, ClusterIdentityError> {
        let length = text.chars().count();
        if length != Self::HEX_LEN {
            return Err(ClusterIdentityError::Length { found: length });
        }
        let mut bytes = [0u8; 32];
        for (index, c) in text.chars().enumerate() {
            let digit = match c {
                '0'..='9' => c as u8 - b'0',
                'a'..='f' => c as u8 - b'a' + 10,
                _ => return Err(ClusterIdentityError::NotHex { index, found: c }),
            };
            bytes[index / 2] |= if index % 2 == 0 { digit << 4 } else { digit };
        }
        Ok(Self(bytes))
    }
}

impl std::str::FromStr for ClusterIdentity {
    type Err = ClusterIdentityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::from_hex(text)
    }
}

/// The written form: 64 lowercase hex digits.
impl fmt::Display for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterIdentity({self})")
    }
}

/// Why a string is not a [`ClusterIdentity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterIdentityError {
    /// Not 64 characters long.
    Length {
        /// Characters found.
        found: usize,
    },
    /// A character that is not a lowercase hex digit.
    NotHex {
        /// Its position, counted in characters from 0.
        index: usize,
        /// The character.
        found: char,
    },
}

impl fmt::Display for ClusterIdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { found } => write!(
                f,
                "a cluster identity is 64 lowercase hex digits (see `ticketing identity`), \
                 got {found} characters"
            ),
            Self::NotHex { index, found } if found.is_ascii_hexdigit() => write!(
                f,
                "a cluster identity is 64 lowercase hex digits (see `ticketing identity`), \
                 character {index} is upper case ({found:?})"
            ),
            Self::NotHex { index, found } => write!(
                f,
                "a cluster identity is 64 lowercase hex digits (see `ticketing identity`), \
                 character {index} is {found:?}"
            ),
        }
    }
}

impl std::error::Error for ClusterIdentityError {}

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
                        extensions: Capabilities::KNOWN,
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
                                extensions: Capabilities::KNOWN,
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

#[cfg(test)]
mod tests {
    use super::{ClusterIdentity, ClusterIdentityError};

    const HEX: &str = "00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210";

    #[test]
    fn valid_hex_decodes_and_prints_back() {
        let identity = ClusterIdentity::from_hex(HEX).expect("valid");
        let bytes = identity.to_bytes();
        assert_eq!(bytes[..4], [0x00, 0x11, 0x22, 0x33]);
        assert_eq!(bytes[16..20], [0x01, 0x23, 0x45, 0x67]);
        assert_eq!(bytes[31], 0x10);
        assert_eq!(identity.to_string(), HEX);
        assert_eq!(HEX.parse::<ClusterIdentity>(), Ok(identity));
        assert_eq!(ClusterIdentity::from_bytes(bytes), identity);
    }

    #[test]
    fn wrong_length_is_refused_with_the_length() {
        for text in ["", &HEX[..63], &format!("{HEX}0"), &format!("{HEX}\n")] {
            assert_eq!(
                ClusterIdentity::from_hex(text),
                Err(ClusterIdentityError::Length {
                    found: text.chars().count()
                })
            );
        }
        // Counted in characters, not bytes: 64 bytes of two-byte characters
        // are 32 characters.
        let wide = "é".repeat(32);
        assert_eq!(
            ClusterIdentity::from_hex(&wide),
            Err(ClusterIdentityError::Length { found: 32 })
        );
        let message = ClusterIdentity::from_hex("abc").unwrap_err().to_string();
        assert!(message.contains("64 lowercase hex digits"), "{message}");
        assert!(message.contains("got 3 characters"), "{message}");
    }

    #[test]
    fn non_hex_is_refused_with_its_position() {
        let mut text = HEX.to_owned();
        text.replace_range(10..11, "g");
        assert_eq!(
            ClusterIdentity::from_hex(&text),
            Err(ClusterIdentityError::NotHex {
                index: 10,
                found: 'g'
            })
        );
        let spaced = format!(" {}", &HEX[1..]);
        assert_eq!(
            ClusterIdentity::from_hex(&spaced),
            Err(ClusterIdentityError::NotHex {
                index: 0,
                found: ' '
            })
        );
        let message = ClusterIdentity::from_hex(&text).unwrap_err().to_string();
        assert!(message.contains("character 10 is 'g'"), "{message}");
    }

    #[test]
    fn upper_case_is_refused_as_the_server_refuses_it() {
        let upper = HEX.to_ascii_uppercase();
        assert_eq!(
            ClusterIdentity::from_hex(&upper),
            Err(ClusterIdentityError::NotHex {
                index: 20,
                found: 'A'
            })
        );
        let message = ClusterIdentity::from_hex(&upper).unwrap_err().to_string();
        assert!(
            message.contains("character 20 is upper case ('A')"),
            "{message}"
        );
    }
}
