//! Connection handshake: server hello, client proof, result byte.
//!
//! The client proves it knows a token by HMAC-SHA256 over a transcript that
//! includes a fresh server nonce, so the token never crosses the wire and a
//! proof cannot be replayed on another connection.
//!
//! SKELETON: bodies marked `todo!` are being written; signatures are fixed.

use crate::time::Instant;

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
pub const MIN_TOKEN_LEN: usize = 16;
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

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        todo!()
    }
    /// Parses and checks a hello.
    pub fn parse(bytes: &[u8; HELLO_LEN]) -> Result<Hello, HelloError> {
        let _ = bytes;
        todo!()
    }
}

/// The 32-byte proof a client sends for `hello` with `token` (UTF-8 bytes;
/// empty in loopback no-auth mode) and the server identity `fingerprint`.
pub fn client_proof(token: &[u8], fingerprint: &[u8; 32], hello: &Hello) -> [u8; PROOF_LEN] {
    let _ = (token, fingerprint, hello);
    todo!()
}

/// A configured token shorter than [`MIN_TOKEN_LEN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTooShort {
    /// Position of the token in the configured list.
    pub index: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// The tokens a server accepts. Several may be configured at once so that
/// tokens can be rotated without downtime. With none configured, only the
/// empty token is accepted (loopback no-auth mode).
#[derive(Clone)]
pub struct ClientTokens {
    tokens: Vec<Box<[u8]>>,
}

impl core::fmt::Debug for ClientTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print secrets.
        write!(f, "ClientTokens({} configured)", self.tokens.len())
    }
}

impl ClientTokens {
    /// Loopback no-auth mode: only the empty token is accepted.
    pub fn no_auth() -> Self {
        ClientTokens { tokens: Vec::new() }
    }
    /// Accepts any of `tokens`; each must be at least 16 bytes.
    pub fn new<I, T>(tokens: I) -> Result<Self, TokenTooShort>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let _ = tokens;
        todo!()
    }
    /// True when no token is configured (no-auth mode).
    pub fn is_no_auth(&self) -> bool {
        self.tokens.is_empty()
    }
    /// Checks `proof` against every accepted token in constant time per
    /// token (all tokens are always tried, so timing does not reveal which
    /// matched).
    pub fn verify(&self, fingerprint: &[u8; 32], hello: &Hello, proof: &[u8; PROOF_LEN]) -> bool {
        let _ = (fingerprint, hello, proof);
        todo!()
    }
}

/// Outcome of feeding bytes to a [`ServerHandshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStatus {
    /// The proof is not complete yet.
    NeedMore,
    /// Proof accepted: send [`RESULT_ACCEPTED`]; bytes after the proof are frames.
    Accepted,
    /// Proof rejected: send [`RESULT_REJECTED`] and close.
    Rejected,
}

/// States of the server side of the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerHandshakeState {
    /// Hello sent; collecting the 32-byte proof.
    AwaitProof {
        /// Proof bytes received so far (at most 32).
        received: Vec<u8>,
    },
    /// Authenticated.
    Ready,
    /// Rejected or timed out; the connection is closing.
    Failed,
}

/// Server side of one connection's handshake.
#[derive(Clone, Debug)]
pub struct ServerHandshake {
    hello: Hello,
    fingerprint: [u8; 32],
    deadline: Instant,
    state: ServerHandshakeState,
}

impl ServerHandshake {
    /// Starts a handshake: the caller sends [`ServerHandshake::hello_bytes`]
    /// at once. `deadline` is when an unfinished handshake fails.
    pub fn new(hello: Hello, fingerprint: [u8; 32], deadline: Instant) -> Self {
        ServerHandshake {
            hello,
            fingerprint,
            deadline,
            state: ServerHandshakeState::AwaitProof {
                received: Vec::with_capacity(PROOF_LEN),
            },
        }
    }
    /// The hello to send.
    pub fn hello_bytes(&self) -> [u8; HELLO_LEN] {
        self.hello.encode()
    }
    /// Feeds received bytes; returns how many were used (at most what the
    /// proof still needs) and the status. Bytes past the proof belong to the
    /// session and are left to the caller.
    pub fn handle_input(&mut self, tokens: &ClientTokens, bytes: &[u8]) -> (usize, HandshakeStatus) {
        let _ = (tokens, bytes, &self.fingerprint);
        todo!()
    }
    /// When the handshake fails if still unfinished (`None` once finished).
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            ServerHandshakeState::AwaitProof { .. } => Some(self.deadline),
            _ => None,
        }
    }
    /// Fails the handshake if `now` is at or past its deadline; returns true
    /// if it just failed.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        let _ = now;
        todo!()
    }
    /// The current state.
    pub fn state(&self) -> &ServerHandshakeState {
        &self.state
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
#[derive(Clone, Debug)]
pub struct ClientHandshake {
    token: Vec<u8>,
    fingerprint: [u8; 32],
    expected_mode: WireMode,
    expected_slot: u8,
    received: Vec<u8>,
    proof: Option<[u8; PROOF_LEN]>,
    done: bool,
}

impl ClientHandshake {
    /// A handshake expecting a server in `mode` at `slot` (single: `0xFF`).
    pub fn new(token: &[u8], fingerprint: [u8; 32], expected_mode: WireMode, expected_slot: u8) -> Self {
        ClientHandshake {
            token: token.to_vec(),
            fingerprint,
            expected_mode,
            expected_slot,
            received: Vec::with_capacity(HELLO_LEN + 1),
            proof: None,
            done: false,
        }
    }
    /// Feeds received bytes; returns how many were used and the status.
    pub fn handle_input(&mut self, bytes: &[u8]) -> (usize, ClientHandshakeStatus) {
        let _ = (bytes, &self.token, self.fingerprint, self.expected_mode, self.expected_slot, &self.received, self.done);
        todo!()
    }
    /// The proof to send, once the hello has been checked.
    pub fn proof(&self) -> Option<[u8; PROOF_LEN]> {
        self.proof
    }
}
