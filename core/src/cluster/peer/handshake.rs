//! The asymmetric peer handshake: accepted tokens ([`PeerTokens`]), hellos
//! ([`PeerHello`]), proofs and session keys, and one side's state machine
//! ([`PeerHandshake`]).

use hmac::{KeyInit, Mac};

use super::frame::{PeerDecoder, PeerSealer, get_id};
use super::{
    ACCEPTOR_LABEL, DIALER_LABEL, HmacSha256, PEER_AUTH_DOMAIN, PEER_HELLO_LEN, PEER_KEYS_DOMAIN,
    PEER_MAGIC, PEER_TOKEN_LEN_MIN, PEER_VERSION, TOKEN_FLOOR_LIMIT,
};
use crate::auth::{NONCE_LEN, PROOF_LEN};
use crate::cluster::bytes::Reader;
use crate::raft::NodeId;
use crate::time::Instant;

/// The peer tokens a node accepts. The first one is the node's own (it
/// proves with it when it dials); any of them is accepted from a dialer,
/// and the acceptor answers with the one that matched, so that a token can
/// be rotated one node at a time (see `docs/cluster.md`).
#[derive(Clone)]
pub struct PeerTokens {
    tokens: Vec<Box<[u8]>>,
}

impl core::fmt::Debug for PeerTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print secrets.
        write!(f, "PeerTokens({} configured)", self.tokens.len())
    }
}

/// A peer token configuration that is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerTokenError {
    /// No token given: peers must always authenticate.
    Empty,
    /// A token shorter than [`PEER_TOKEN_LEN_MIN`] bytes, at this position.
    TooShort(usize),
}

impl core::fmt::Display for PeerTokenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PeerTokenError::Empty => f.write_str("no peer token configured"),
            PeerTokenError::TooShort(index) => write!(
                f,
                "peer token #{index} is shorter than {PEER_TOKEN_LEN_MIN} bytes"
            ),
        }
    }
}

impl std::error::Error for PeerTokenError {}

impl PeerTokens {
    /// The node proves with the first token and accepts any of them; each
    /// must be at least [`PEER_TOKEN_LEN_MIN`] bytes.
    pub fn new<I, T>(tokens: I) -> Result<Self, PeerTokenError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let mut accepted = Vec::new();
        for (index, token) in tokens.into_iter().enumerate() {
            let token = token.as_ref();
            if token.len() < PEER_TOKEN_LEN_MIN {
                return Err(PeerTokenError::TooShort(index));
            }
            accepted.push(Box::from(token));
        }
        if accepted.is_empty() {
            return Err(PeerTokenError::Empty);
        }
        Ok(PeerTokens { tokens: accepted })
    }

    fn own(&self) -> &[u8] {
        &self.tokens[0]
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRole {
    /// Opened the connection; proves first.
    Dialer,
    /// Accepted the connection; proves only after the dialer's proof
    /// verified.
    Acceptor,
}

impl PeerRole {
    fn byte(self) -> u8 {
        match self {
            PeerRole::Dialer => 0,
            PeerRole::Acceptor => 1,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(PeerRole::Dialer),
            1 => Some(PeerRole::Acceptor),
            _ => None,
        }
    }

    fn label(self) -> &'static [u8; 8] {
        match self {
            PeerRole::Dialer => &DIALER_LABEL,
            PeerRole::Acceptor => &ACCEPTOR_LABEL,
        }
    }
}

/// A peer hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHello {
    /// The cluster identity fingerprint.
    pub fingerprint: [u8; 32],
    /// The sender's end of the connection.
    pub role: PeerRole,
    /// The sender's Raft identity.
    pub from: NodeId,
    /// The sender's token floor: every fencing token it knows of is below
    /// this (below [`TOKEN_FLOOR_LIMIT`]).
    pub token_floor: u64,
    /// The sender's fresh nonce.
    pub nonce: [u8; NONCE_LEN],
}

impl PeerHello {
    /// The 76 hello bytes.
    pub fn encode(&self) -> [u8; PEER_HELLO_LEN] {
        let mut out = [0; PEER_HELLO_LEN];
        out[0..8].copy_from_slice(&PEER_MAGIC);
        out[8..10].copy_from_slice(&PEER_VERSION.to_be_bytes());
        out[10..42].copy_from_slice(&self.fingerprint);
        out[42] = self.role.byte();
        out[43] = self.from.slot;
        out[44..52].copy_from_slice(&self.from.generation.to_be_bytes());
        out[52..60].copy_from_slice(&self.token_floor.to_be_bytes());
        out[60..76].copy_from_slice(&self.nonce);
        out
    }

    /// Parses hello bytes: `None` on a wrong magic, version or role byte.
    pub fn parse(bytes: &[u8; PEER_HELLO_LEN]) -> Option<PeerHello> {
        let mut r = Reader::new(bytes);
        if r.array::<8>()? != PEER_MAGIC || r.u16()? != PEER_VERSION {
            return None;
        }
        Some(PeerHello {
            fingerprint: r.array()?,
            role: PeerRole::from_byte(r.u8()?)?,
            from: get_id(&mut r)?,
            token_floor: r.u64()?,
            nonce: r.array()?,
        })
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn proof_mac(
    token: &[u8],
    prover: PeerRole,
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
) -> HmacSha256 {
    let mut mac = keyed(token);
    mac.update(&PEER_AUTH_DOMAIN);
    mac.update(prover.label());
    mac.update(dialer_hello);
    mac.update(acceptor_hello);
    mac
}

/// The proof the `prover` end sends with `token` over the two hellos as
/// sent (dialer's first).
pub fn peer_proof(
    token: &[u8],
    prover: PeerRole,
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
) -> [u8; PROOF_LEN] {
    proof_mac(token, prover, dialer_hello, acceptor_hello)
        .finalize()
        .into_bytes()
        .into()
}

/// The two session keys of a connection, `(dialer→acceptor,
/// acceptor→dialer)`, from the token both proved with and the whole
/// handshake transcript.
pub fn peer_session_keys(
    token: &[u8],
    dialer_hello: &[u8; PEER_HELLO_LEN],
    acceptor_hello: &[u8; PEER_HELLO_LEN],
    dialer_proof: &[u8; PROOF_LEN],
    acceptor_proof: &[u8; PROOF_LEN],
) -> ([u8; 32], [u8; 32]) {
    let mut mac = keyed(token);
    mac.update(&PEER_KEYS_DOMAIN);
    mac.update(dialer_hello);
    mac.update(acceptor_hello);
    mac.update(dialer_proof);
    mac.update(acceptor_proof);
    let master: [u8; 32] = mac.finalize().into_bytes().into();
    let derive = |label: &[u8]| -> [u8; 32] {
        let mut mac = keyed(&master);
        mac.update(label);
        mac.finalize().into_bytes().into()
    };
    (derive(b"d2a"), derive(b"a2d"))
}

/// An authenticated connection's frame keys: seal what is sent, open what
/// is received.
#[derive(Debug)]
pub struct PeerSession {
    /// Seals outgoing frames.
    pub sealer: PeerSealer,
    /// Verifies and decodes incoming frames.
    pub decoder: PeerDecoder,
}

/// Why a peer handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerReject {
    /// Not a peer hello (magic, version or role byte).
    BadHello,
    /// The other side claims the same role (two dialers or two acceptors:
    /// a relayed or reflected hello).
    Role,
    /// Another cluster (fingerprint differs).
    Fingerprint,
    /// The other side claims this node's own slot (a loop, or a second
    /// process configured for the same slot).
    SameSlot,
    /// The other side claims a slot outside the cluster.
    SlotOutOfRange(u8),
    /// A dialed peer answered with another slot than the one dialed.
    UnexpectedSlot(u8),
    /// The other side's token floor is at or above [`TOKEN_FLOOR_LIMIT`].
    TokenFloor,
    /// The proof did not verify (with any accepted token, for an acceptor).
    Proof,
    /// The handshake did not finish in time.
    Timeout,
}

/// Outcome of feeding bytes to a [`PeerHandshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerHandshakeStatus {
    /// More bytes are needed (check [`PeerHandshake::take_outbound`]).
    NeedMore,
    /// The other side proved itself: bytes after its proof are frames
    /// (take the keys with [`PeerHandshake::take_session`]).
    Established(NodeId),
    /// Close the connection.
    Rejected(PeerReject),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PeerPhase {
    AwaitHello,
    /// Waiting for the other side's proof; a dialer has sent its own.
    AwaitProof {
        remote: PeerHello,
        remote_bytes: [u8; PEER_HELLO_LEN],
        own_proof: Option<[u8; PROOF_LEN]>,
    },
    Done(PeerHello),
    Failed(PeerReject),
}

/// What a node says about itself in its peer hellos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The cluster identity fingerprint.
    pub fingerprint: [u8; 32],
    /// This node's Raft identity.
    pub id: NodeId,
    /// Slots in the cluster: a remote slot must be below it.
    pub slot_count: u8,
    /// Every token this node knows of is below this (below
    /// [`TOKEN_FLOOR_LIMIT`]).
    pub token_floor: u64,
}

/// One side of the asymmetric peer handshake.
#[derive(Debug)]
pub struct PeerHandshake {
    local: PeerHello,
    local_bytes: [u8; PEER_HELLO_LEN],
    slot_count: u8,
    expected_slot: Option<u8>,
    deadline: Instant,
    phase: PeerPhase,
    /// Bytes of the hello or proof being received; never more than a hello.
    buf: Vec<u8>,
    outbound: Vec<u8>,
    session: Option<PeerSession>,
}

impl PeerHandshake {
    /// Starts a handshake as `local` with a fresh `nonce`. `dialed`: the
    /// slot dialed (this side is the dialer), `None` for an accepted
    /// connection (the acceptor). The hello is queued at once.
    pub fn new(
        local: PeerIdentity,
        nonce: [u8; NONCE_LEN],
        dialed: Option<u8>,
        deadline: Instant,
    ) -> Self {
        let hello = PeerHello {
            fingerprint: local.fingerprint,
            role: if dialed.is_some() {
                PeerRole::Dialer
            } else {
                PeerRole::Acceptor
            },
            from: local.id,
            // An impossible floor is never sent (the other side would
            // refuse it).
            token_floor: local.token_floor.min(TOKEN_FLOOR_LIMIT - 1),
            nonce,
        };
        let local_bytes = hello.encode();
        PeerHandshake {
            local: hello,
            local_bytes,
            slot_count: local.slot_count,
            expected_slot: dialed,
            deadline,
            phase: PeerPhase::AwaitHello,
            buf: Vec::with_capacity(PEER_HELLO_LEN),
            outbound: local_bytes.to_vec(),
            session: None,
        }
    }

    /// This side's role.
    pub fn role(&self) -> PeerRole {
        self.local.role
    }

    /// Bytes to send now (the hello, then this side's proof).
    pub fn take_outbound(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbound)
    }

    /// When an unfinished handshake fails.
    pub fn deadline(&self) -> Option<Instant> {
        matches!(
            self.phase,
            PeerPhase::AwaitHello | PeerPhase::AwaitProof { .. }
        )
        .then_some(self.deadline)
    }

    /// Fails the handshake at or past its deadline; true when it just did.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        if self.deadline().is_some_and(|d| now >= d) {
            self.phase = PeerPhase::Failed(PeerReject::Timeout);
            return true;
        }
        false
    }

    /// The other side, once established.
    pub fn peer(&self) -> Option<NodeId> {
        match self.phase {
            PeerPhase::Done(hello) => Some(hello.from),
            _ => None,
        }
    }

    /// The other side's (authenticated) hello, once established.
    pub fn peer_hello(&self) -> Option<PeerHello> {
        match self.phase {
            PeerPhase::Done(hello) => Some(hello),
            _ => None,
        }
    }

    /// The connection's frame keys, once established (given out once).
    pub fn take_session(&mut self) -> Option<PeerSession> {
        self.session.take()
    }

    /// Feeds received bytes; returns how many were used (the rest are
    /// frames once established).
    pub fn handle_input(
        &mut self,
        tokens: &PeerTokens,
        bytes: &[u8],
    ) -> (usize, PeerHandshakeStatus) {
        let mut used = 0;
        loop {
            match self.phase.clone() {
                PeerPhase::Done(hello) => {
                    return (used, PeerHandshakeStatus::Established(hello.from));
                }
                PeerPhase::Failed(reason) => return (used, PeerHandshakeStatus::Rejected(reason)),
                PeerPhase::AwaitHello => {
                    used += self.fill(&bytes[used..], PEER_HELLO_LEN);
                    let Some(&remote_bytes) = self.buf.first_chunk::<PEER_HELLO_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    self.buf.clear();
                    self.phase = match PeerHello::parse(&remote_bytes) {
                        None => PeerPhase::Failed(PeerReject::BadHello),
                        Some(remote) => self.check_hello(tokens, remote, remote_bytes),
                    };
                }
                PeerPhase::AwaitProof {
                    remote,
                    remote_bytes,
                    own_proof,
                } => {
                    used += self.fill(&bytes[used..], PROOF_LEN);
                    let Some(&proof) = self.buf.first_chunk::<PROOF_LEN>() else {
                        return (used, PeerHandshakeStatus::NeedMore);
                    };
                    self.buf = Vec::new();
                    self.phase = match own_proof {
                        Some(own_proof) => {
                            self.dialer_verifies(tokens, remote, &remote_bytes, own_proof, proof)
                        }
                        None => self.acceptor_verifies(tokens, remote, &remote_bytes, proof),
                    };
                }
            }
        }
    }

    fn check_hello(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        remote_bytes: [u8; PEER_HELLO_LEN],
    ) -> PeerPhase {
        let reject = PeerPhase::Failed;
        if remote.role == self.local.role {
            return reject(PeerReject::Role);
        }
        // Compared in the clear only to give a precise reason; the proofs
        // bind the whole hello too.
        if remote.fingerprint != self.local.fingerprint {
            return reject(PeerReject::Fingerprint);
        }
        if remote.from.slot >= self.slot_count {
            return reject(PeerReject::SlotOutOfRange(remote.from.slot));
        }
        if remote.from.slot == self.local.from.slot {
            return reject(PeerReject::SameSlot);
        }
        if let Some(slot) = self.expected_slot
            && slot != remote.from.slot
        {
            return reject(PeerReject::UnexpectedSlot(remote.from.slot));
        }
        if remote.token_floor >= TOKEN_FLOOR_LIMIT {
            return reject(PeerReject::TokenFloor);
        }
        let own_proof = match self.local.role {
            PeerRole::Dialer => {
                let proof = peer_proof(
                    tokens.own(),
                    PeerRole::Dialer,
                    &self.local_bytes,
                    &remote_bytes,
                );
                self.outbound.extend_from_slice(&proof);
                Some(proof)
            }
            // The acceptor says nothing that depends on a token before
            // the dialer proved itself.
            PeerRole::Acceptor => None,
        };
        PeerPhase::AwaitProof {
            remote,
            remote_bytes,
            own_proof,
        }
    }

    /// The dialer checks the acceptor's proof under the token it proved
    /// with (the acceptor answers with the token that matched).
    fn dialer_verifies(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        acceptor_hello: &[u8; PEER_HELLO_LEN],
        own_proof: [u8; PROOF_LEN],
        proof: [u8; PROOF_LEN],
    ) -> PeerPhase {
        let token = tokens.own();
        if proof_mac(token, PeerRole::Acceptor, &self.local_bytes, acceptor_hello)
            .verify_slice(&proof)
            .is_err()
        {
            return PeerPhase::Failed(PeerReject::Proof);
        }
        let (d2a, a2d) =
            peer_session_keys(token, &self.local_bytes, acceptor_hello, &own_proof, &proof);
        self.session = Some(PeerSession {
            sealer: PeerSealer::from_key(&d2a),
            decoder: PeerDecoder::from_key(&a2d),
        });
        PeerPhase::Done(remote)
    }

    /// The acceptor checks the dialer's proof against every accepted
    /// token, then proves with the one that matched.
    fn acceptor_verifies(
        &mut self,
        tokens: &PeerTokens,
        remote: PeerHello,
        dialer_hello: &[u8; PEER_HELLO_LEN],
        proof: [u8; PROOF_LEN],
    ) -> PeerPhase {
        let mut matched: Option<&[u8]> = None;
        for token in &tokens.tokens {
            // Constant time per token, and every token is tried.
            let ok = proof_mac(token, PeerRole::Dialer, dialer_hello, &self.local_bytes)
                .verify_slice(&proof)
                .is_ok();
            if ok && matched.is_none() {
                matched = Some(token);
            }
        }
        let Some(token) = matched else {
            return PeerPhase::Failed(PeerReject::Proof);
        };
        let own_proof = peer_proof(token, PeerRole::Acceptor, dialer_hello, &self.local_bytes);
        self.outbound.extend_from_slice(&own_proof);
        let (d2a, a2d) =
            peer_session_keys(token, dialer_hello, &self.local_bytes, &proof, &own_proof);
        self.session = Some(PeerSession {
            sealer: PeerSealer::from_key(&a2d),
            decoder: PeerDecoder::from_key(&d2a),
        });
        PeerPhase::Done(remote)
    }

    /// Moves bytes into `buf` until it holds `want`; returns how many.
    fn fill(&mut self, bytes: &[u8], want: usize) -> usize {
        let take = want.saturating_sub(self.buf.len()).min(bytes.len());
        self.buf.extend_from_slice(&bytes[..take]);
        take
    }
}
