//! Connection handshake: server hello, client proof, result byte.
//!
//! The client proves it knows a token by HMAC-SHA256 over a transcript that
//! includes a fresh server nonce, so the token never crosses the wire and a
//! proof cannot be replayed on another connection.
//!
//! The client side ([`ClientHandshake`]) is a byte-driven state machine: it
//! never touches a socket, takes whatever bytes arrived, and says how many
//! it used, so the caller can hand the rest (the session's first frames) to
//! the reply decoder. The server side is part of the shared client front of
//! the connection layer (it also tells a v3 proof from a line answer); it
//! verifies with [`ClientTokens::verify`].

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Server hello length.
pub const HELLO_LEN: usize = 28;
/// Client proof length.
pub const PROOF_LEN: usize = 32;
/// Nonce length.
pub const NONCE_LEN: usize = 16;
/// Wire protocol version.
pub const WIRE_VERSION: u16 = 3;
/// Hello magic: `TCKCLI3` and a NUL.
pub const CLIENT_MAGIC: [u8; 8] = *b"TCKCLI3\0";
/// Domain string that starts the proof transcript.
pub const CLIENT_AUTH_DOMAIN: [u8; 16] = *b"TCK/CLIENT/AUTH3";
/// Result byte: accepted.
pub const RESULT_ACCEPTED: u8 = 0x01;
/// Result byte: rejected (the server then closes).
pub const RESULT_REJECTED: u8 = 0x00;
/// Shortest client token a server accepts in its configuration.
pub const TOKEN_LEN_MIN: usize = 16;
/// Self slot of a single-mode server in its hello.
pub const SINGLE_SELF_SLOT: u8 = 0xFF;
/// Number of cluster slots: a cluster node's self slot is below this.
pub const CLUSTER_SLOT_COUNT_MAX: u8 = 5;
/// SHA-256 of `ticketing/single/v3`: the identity of every single-mode server.
pub const SINGLE_FINGERPRINT: [u8; 32] = [
    0xff, 0x4d, 0x46, 0x98, 0xae, 0x53, 0xed, 0xe3, 0x82, 0xf9, 0x68, 0x85, 0xda, 0xde, 0xba, 0x24,
    0x3d, 0x2d, 0x12, 0x4d, 0xed, 0x96, 0x7b, 0x33, 0x69, 0x08, 0xd0, 0x03, 0x99, 0xc8, 0x7b, 0x97,
];

/// Single (one process) or cluster (Raft) server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireMode {
    /// One process, state in memory.
    Single = 0,
    /// A Raft cluster of 3 or 5 nodes.
    Cluster = 1,
}

/// The 28-byte server hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Server mode.
    pub mode: WireMode,
    /// Single: `0xFF`; cluster: this node's slot.
    pub self_slot: u8,
    /// Fresh random bytes for this connection.
    pub nonce: [u8; NONCE_LEN],
}

/// Why a hello was refused by a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelloError {
    /// Wrong magic.
    Magic,
    /// Wire version other than 3.
    Version(u16),
    /// Mode byte other than 0 or 1.
    Mode(u8),
    /// Slot not valid for the mode (single must be `0xFF`, cluster below 5).
    Slot(u8),
}

impl core::fmt::Display for HelloError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            HelloError::Magic => f.write_str("server hello has the wrong magic"),
            HelloError::Version(version) => {
                write!(
                    f,
                    "server speaks wire version {version}, not {WIRE_VERSION}"
                )
            }
            HelloError::Mode(mode) => write!(f, "server hello has unknown mode byte {mode}"),
            HelloError::Slot(slot) => write!(f, "server hello has invalid self slot {slot}"),
        }
    }
}

impl std::error::Error for HelloError {}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut bytes = [0u8; HELLO_LEN];
        bytes[..8].copy_from_slice(&CLIENT_MAGIC);
        bytes[8..10].copy_from_slice(&WIRE_VERSION.to_be_bytes());
        bytes[10] = self.mode as u8;
        bytes[11] = self.self_slot;
        bytes[12..].copy_from_slice(&self.nonce);
        bytes
    }
    /// Parses and checks a hello.
    pub fn parse(bytes: &[u8; HELLO_LEN]) -> Result<Hello, HelloError> {
        if bytes[..8] != CLIENT_MAGIC {
            return Err(HelloError::Magic);
        }
        let version = u16::from_be_bytes([bytes[8], bytes[9]]);
        if version != WIRE_VERSION {
            return Err(HelloError::Version(version));
        }
        let mode = match bytes[10] {
            0 => WireMode::Single,
            1 => WireMode::Cluster,
            other => return Err(HelloError::Mode(other)),
        };
        let self_slot = bytes[11];
        let slot_ok = match mode {
            WireMode::Single => self_slot == SINGLE_SELF_SLOT,
            WireMode::Cluster => self_slot < CLUSTER_SLOT_COUNT_MAX,
        };
        if !slot_ok {
            return Err(HelloError::Slot(self_slot));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[12..]);
        Ok(Hello {
            mode,
            self_slot,
            nonce,
        })
    }
}

/// The 32-byte proof a client sends for `hello` with `token` (UTF-8 bytes;
/// empty in loopback no-auth mode) and the server identity `fingerprint`.
pub fn client_proof(token: &[u8], fingerprint: &[u8; 32], hello: &Hello) -> [u8; PROOF_LEN] {
    proof_mac(token, fingerprint, hello)
        .finalize()
        .into_bytes()
        .into()
}

/// The HMAC over the 68-byte proof transcript, ready to finalize or verify:
/// domain ‖ version ‖ mode ‖ fingerprint ‖ self slot ‖ nonce.
fn proof_mac(token: &[u8], fingerprint: &[u8; 32], hello: &Hello) -> HmacSha256 {
    // HMAC takes keys of any length (long ones are hashed first), so this
    // cannot fail; the empty token of no-auth mode is a valid key too.
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(token).expect("HMAC accepts keys of any length");
    mac.update(&CLIENT_AUTH_DOMAIN);
    mac.update(&WIRE_VERSION.to_be_bytes());
    mac.update(&[hello.mode as u8]);
    mac.update(fingerprint);
    mac.update(&[hello.self_slot]);
    mac.update(&hello.nonce);
    mac
}

/// A configured token shorter than [`TOKEN_LEN_MIN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTooShort {
    /// Position of the token in the configured list.
    pub index: usize,
    /// Its length in bytes.
    pub len: usize,
}

impl core::fmt::Display for TokenTooShort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "client token #{} is {} bytes long; at least {TOKEN_LEN_MIN} bytes are required",
            self.index, self.len
        )
    }
}

impl std::error::Error for TokenTooShort {}

/// The tokens a server accepts. Several may be configured at once so that
/// tokens can be rotated without downtime. With none configured, only the
/// empty token is accepted (loopback no-auth mode).
#[derive(Clone)]
pub struct ClientTokens {
    pub(crate) tokens: Vec<Box<[u8]>>,
}

impl core::fmt::Debug for ClientTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print secrets.
        write!(f, "ClientTokens({} configured)", self.tokens.len())
    }
}

/// Maps every token through `keep`, refusing the first one shorter than
/// [`TOKEN_LEN_MIN`] by its position (client and admin tokens share the
/// rule).
pub(crate) fn each_long_enough<I, T, K>(
    tokens: I,
    keep: impl Fn(&[u8]) -> K,
) -> Result<Vec<K>, TokenTooShort>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut kept = Vec::new();
    for (index, token) in tokens.into_iter().enumerate() {
        let token = token.as_ref();
        if token.len() < TOKEN_LEN_MIN {
            return Err(TokenTooShort {
                index,
                len: token.len(),
            });
        }
        kept.push(keep(token));
    }
    Ok(kept)
}

impl ClientTokens {
    /// Loopback no-auth mode: only the empty token is accepted.
    pub fn no_auth() -> Self {
        ClientTokens { tokens: Vec::new() }
    }
    /// Accepts any of `tokens`; each must be at least 16 bytes.
    ///
    /// An empty list gives the same no-auth mode as [`ClientTokens::no_auth`];
    /// refusing that on a non-loopback address is the caller's job.
    pub fn new<I, T>(tokens: I) -> Result<Self, TokenTooShort>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let tokens = each_long_enough(tokens, |token| Box::from(token))?;
        Ok(ClientTokens { tokens })
    }
    /// True when no token is configured (no-auth mode).
    pub fn is_no_auth(&self) -> bool {
        self.tokens.is_empty()
    }
    /// Checks `proof` against every accepted token in constant time per
    /// token (all tokens are always tried, so timing does not reveal which
    /// matched).
    pub fn verify(&self, fingerprint: &[u8; 32], hello: &Hello, proof: &[u8; PROOF_LEN]) -> bool {
        if self.tokens.is_empty() {
            return proof_mac(&[], fingerprint, hello)
                .verify_slice(proof)
                .is_ok();
        }
        let mut matched = false;
        for token in &self.tokens {
            // `verify_slice` compares in constant time, and `|=` on bool does
            // not short-circuit: every token is tried whatever the outcome.
            matched |= proof_mac(token, fingerprint, hello)
                .verify_slice(proof)
                .is_ok();
        }
        matched
    }
}

/// Outcome of feeding bytes to a [`ClientHandshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientHandshakeStatus {
    /// Waiting for more bytes.
    NeedMore,
    /// Hello checked: send the proof ([`ClientHandshake::proof`]), then wait
    /// for the result byte.
    SendProof,
    /// Accepted: the session starts; bytes after the result byte are frames.
    Accepted,
    /// Rejected by the server.
    Rejected,
    /// The hello was malformed or not the server we expected.
    BadHello(HelloError),
    /// The hello was well-formed but its mode or slot is not what we expected.
    UnexpectedServer,
    /// A result byte other than 0 or 1.
    BadResult(u8),
}

/// Client side of one connection's handshake (used by our clients and tests).
#[derive(Clone)]
pub struct ClientHandshake {
    token: Vec<u8>,
    fingerprint: [u8; 32],
    expected_mode: WireMode,
    expected_slot: u8,
    /// Hello bytes so far (at most [`HELLO_LEN`]).
    received: Vec<u8>,
    /// Set once the hello has been checked; from then on the next byte is
    /// the result.
    proof: Option<[u8; PROOF_LEN]>,
    /// The final status, once there is one.
    outcome: Option<ClientHandshakeStatus>,
}

impl core::fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the token.
        f.debug_struct("ClientHandshake")
            .field("expected_mode", &self.expected_mode)
            .field("expected_slot", &self.expected_slot)
            .field("hello_received_len", &self.received.len())
            .field("proof_ready", &self.proof.is_some())
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl ClientHandshake {
    /// A handshake expecting a server in `mode` at `slot` (single: `0xFF`).
    pub fn new(
        token: &[u8],
        fingerprint: [u8; 32],
        expected_mode: WireMode,
        expected_slot: u8,
    ) -> Self {
        ClientHandshake {
            token: token.to_vec(),
            fingerprint,
            expected_mode,
            expected_slot,
            received: Vec::with_capacity(HELLO_LEN),
            proof: None,
            outcome: None,
        }
    }
    /// Feeds received bytes; returns how many were used and the status.
    ///
    /// Uses at most the rest of the hello and, on a later call, exactly the
    /// one result byte: after `SendProof`, call again with the unused bytes;
    /// after `Accepted`, the unused bytes are the session's first frames.
    /// Once finished, nothing more is consumed and the final status is
    /// returned again.
    pub fn handle_input(&mut self, bytes: &[u8]) -> (usize, ClientHandshakeStatus) {
        if let Some(outcome) = self.outcome {
            return (0, outcome);
        }
        if self.proof.is_some() {
            let Some(&result) = bytes.first() else {
                return (0, ClientHandshakeStatus::NeedMore);
            };
            let outcome = match result {
                RESULT_ACCEPTED => ClientHandshakeStatus::Accepted,
                RESULT_REJECTED => ClientHandshakeStatus::Rejected,
                other => ClientHandshakeStatus::BadResult(other),
            };
            self.outcome = Some(outcome);
            return (1, outcome);
        }
        let used = (HELLO_LEN - self.received.len()).min(bytes.len());
        self.received.extend_from_slice(&bytes[..used]);
        if self.received.len() < HELLO_LEN {
            return (used, ClientHandshakeStatus::NeedMore);
        }
        let mut raw = [0u8; HELLO_LEN];
        raw.copy_from_slice(&self.received);
        let outcome = match Hello::parse(&raw) {
            Err(err) => ClientHandshakeStatus::BadHello(err),
            // Another node or mode than configured: routing by slot would go
            // wrong, and the proof would be computed for the wrong identity.
            Ok(hello)
                if hello.mode != self.expected_mode || hello.self_slot != self.expected_slot =>
            {
                ClientHandshakeStatus::UnexpectedServer
            }
            Ok(hello) => {
                self.proof = Some(client_proof(&self.token, &self.fingerprint, &hello));
                return (used, ClientHandshakeStatus::SendProof);
            }
        };
        self.outcome = Some(outcome);
        (used, outcome)
    }
    /// The proof to send, once the hello has been checked.
    pub fn proof(&self) -> Option<[u8; PROOF_LEN]> {
        self.proof
    }
}
