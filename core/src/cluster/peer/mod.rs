//! The cluster protocol between nodes: handshake, authenticated framing and
//! the encoding of every Raft message. Sans-IO like the rest of the core:
//! bytes in, bytes and decisions out.
//!
//! # Handshake (after TCP and optional TLS), peer protocol version 2
//!
//! Asymmetric, one round trip: both sides send a 76-byte hello as soon as
//! the transport is up; the **dialer proves first**, and the acceptor sends
//! its proof only after the dialer's verified, so nobody learns a proof
//! without having given one. A side that could not verify closes the
//! connection without a word.
//!
//! | offset | len | field |
//! |---|---|---|
//! | 0 | 8 | magic `TCKPEER2` |
//! | 8 | 2 | peer protocol version (2) |
//! | 10 | 32 | cluster identity fingerprint |
//! | 42 | 1 | role: 0 dialer, 1 acceptor |
//! | 43 | 1 | sender slot |
//! | 44 | 8 | sender generation |
//! | 52 | 8 | sender token floor (below 2^63) |
//! | 60 | 16 | nonce (fresh CSPRNG bytes per connection) |
//!
//! ```text
//! dialer                                  acceptor
//!   hello_D  ------------------------------>
//!            <------------------------------  hello_A
//!   proof_D  ------------------------------>  verified against every
//!                                             accepted token
//!            <------------------------------  proof_A (with the matched token)
//!   frames   <=============================>  frames
//! ```
//!
//! proof_R = HMAC-SHA256(token, `"TCK/PEER/AUTH2"` ‖ label_R ‖ hello_D ‖
//! hello_A) with label `"dialer\0\0"` or `"acceptor"`: bound to the role,
//! the fingerprint, both identities, both nonces and the version (all in
//! the hello bytes). The dialer proves with its own (first) token; the
//! acceptor tries every accepted token in constant time and answers, and
//! derives keys, with the one that matched.
//!
//! Session keys: `K = HMAC(token, "TCK/PEER/KEYS2" ‖ hello_D ‖ hello_A ‖
//! proof_D ‖ proof_A)`, `k_d2a = HMAC(K, "d2a")`, `k_a2d = HMAC(K, "a2d")`,
//! so every connection and direction has its own key.
//!
//! # Frames
//!
//! `[len u32][version u8 = 2][kind u8][payload][tag 16]`, `len` counting
//! version, kind, payload and tag (so at least 18), at most
//! [`FRAME_LEN_MAX`]. `tag` is the first 16 bytes of HMAC-SHA256(key of the
//! direction, `seq u64 ‖ len ‖ version ‖ kind ‖ payload`) where `seq`
//! counts the frames sent in that direction from 0: a frame replayed,
//! reordered, reflected or taken from another connection does not verify.
//! The receiver checks the tag before decoding the payload. Every frame
//! carries one [`Message`](crate::raft::Message): `kind` is the body's tag,
//! the payload starts with `from slot u8 · from generation u64 · to slot u8
//! · to generation u64 · term u64`, then the body fields (see `docs/cluster.md`). A bad tag or
//! anything that does not decode is an error that closes the connection;
//! Raft tolerates the lost messages.
//!
//! Files: `frame.rs` (sealing and decoding frames, the byte encoding of
//! every Raft message) and `handshake.rs` (tokens, hellos, proofs, session
//! keys).

use hmac::Hmac;
use sha2::Sha256;

mod frame;
mod handshake;

pub use frame::{PeerDecoder, PeerSealer};
pub use handshake::{
    PeerHandshake, PeerHandshakeStatus, PeerHello, PeerIdentity, PeerReject, PeerRole, PeerSession,
    PeerTokenError, PeerTokens, peer_proof, peer_session_keys,
};

type HmacSha256 = Hmac<Sha256>;

/// Hello magic.
pub const PEER_MAGIC: [u8; 8] = *b"TCKPEER2";
/// Domain string that starts the proof transcript.
pub const PEER_AUTH_DOMAIN: [u8; 14] = *b"TCK/PEER/AUTH2";
/// Domain string that starts the session key derivation.
pub const PEER_KEYS_DOMAIN: [u8; 14] = *b"TCK/PEER/KEYS2";
/// Role label of the dialer's proof.
pub const DIALER_LABEL: [u8; 8] = *b"dialer\0\0";
/// Role label of the acceptor's proof.
pub const ACCEPTOR_LABEL: [u8; 8] = *b"acceptor";
/// Shortest peer token a node accepts, in bytes. Higher than a client
/// token's minimum because a peer proof sent to whoever listens at a downed
/// peer's address is an offline guessing oracle against the token, so its
/// entropy is the only defence without peer TLS (see `docs/cluster.md`).
pub const PEER_TOKEN_LEN_MIN: usize = 32;
/// Peer protocol version carried in the hello.
pub const PEER_VERSION: u16 = 2;
/// Peer hello length.
pub const PEER_HELLO_LEN: usize = 76;
/// Version byte of every frame.
pub const FRAME_VERSION: u8 = 2;
/// Length prefix size.
pub const FRAME_LEN_BYTES: usize = 4;
/// Bytes of the truncated HMAC tag that ends every frame.
pub const FRAME_TAG_LEN: usize = 16;
/// Smallest value of a frame's length field: version, kind and tag.
pub const FRAME_LEN_MIN: usize = 2 + FRAME_TAG_LEN;
/// Largest value of a frame's length field: 4 MiB, well above the largest
/// append (`append_bytes_max` plus one `entry_bytes_max` entry) and snapshot
/// chunk a node is configured to send (checked by the node at start).
pub const FRAME_LEN_MAX: usize = 4 << 20;
/// Token floors at or above this are impossible (a token is a microsecond
/// wall-clock count or a counter grown from one) and refused.
pub const TOKEN_FLOOR_LIMIT: u64 = 1 << 63;
/// Most voters or learners a configuration on the wire may list.
pub const CONFIG_MEMBERS_MAX: usize = 16;
/// Bytes of the message header in every payload.
const MESSAGE_HEADER_LEN: usize = 9 + 9 + 8;
/// Smallest encoded entry (a no-op): index, term, kind.
const ENTRY_LEN_MIN: usize = 17;

/// Tags of the message kinds.
mod kind {
    pub const PRE_VOTE: u8 = 1;
    pub const PRE_VOTE_RESPONSE: u8 = 2;
    pub const VOTE: u8 = 3;
    pub const VOTE_RESPONSE: u8 = 4;
    pub const APPEND: u8 = 5;
    pub const APPEND_RESPONSE: u8 = 6;
    pub const HEARTBEAT: u8 = 7;
    pub const HEARTBEAT_RESPONSE: u8 = 8;
    pub const INSTALL_SNAPSHOT: u8 = 9;
    pub const SNAPSHOT_RESPONSE: u8 = 10;
    pub const TIMEOUT_NOW: u8 = 11;
}

/// Tags of the entry kinds.
const ENTRY_NOOP: u8 = 0;
const ENTRY_COMMAND: u8 = 1;
const ENTRY_CONFIG: u8 = 2;

pub use crate::machine::PeerError;

impl std::error::Error for PeerError {}
