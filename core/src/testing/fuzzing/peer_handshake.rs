//! Both ends of the peer handshake on a network the fuzzer controls: see
//! [`peer_handshake`].

use crate::auth::PROOF_LEN;
use crate::cluster::peer::{
    PEER_HELLO_LEN, PeerHandshake, PeerHandshakeStatus, PeerIdentity, PeerReject, PeerRole,
    PeerSession, PeerTokens, peer_proof,
};
use crate::raft::{Message, MessageBody, NodeId};
use crate::time::Instant;

use super::script::Cursor;

const FINGERPRINT: [u8; 32] = [0x6e; 32];
const TOKEN_NEW: &[u8] = b"peer-token-new-0123456789-abcdefghijk";
const TOKEN_OLD: &[u8] = b"peer-token-old-0123456789-abcdefghijk";
const TOKEN_WRONG: &[u8] = b"peer-token-wrong-01234567-abcdefghijk";
/// The token lists either side may be configured with: a single token, a
/// rotation in either order, or a token nobody else knows.
const TOKEN_LISTS: [&[&[u8]]; 6] = [
    &[TOKEN_NEW],
    &[TOKEN_OLD],
    &[TOKEN_NEW, TOKEN_OLD],
    &[TOKEN_OLD, TOKEN_NEW],
    &[TOKEN_WRONG],
    &[TOKEN_WRONG, TOKEN_NEW],
];
/// Everything one side sends during the handshake: hello, then proof.
const HANDSHAKE_LEN: usize = PEER_HELLO_LEN + PROOF_LEN;
/// Most bytes a script may queue on one direction.
const PENDING_MAX: usize = 1_024;
const DIALER: NodeId = NodeId::new(0, 3);
const ACCEPTOR: NodeId = NodeId::new(1, 5);
const DEADLINE: Instant = Instant::from_millis(1_000);

fn identity(id: NodeId, token_floor: u64) -> PeerIdentity {
    PeerIdentity {
        fingerprint: FINGERPRINT,
        id,
        slot_count: 3,
        token_floor,
    }
}

fn nonce(tag: u8, seed: &[u8]) -> [u8; 16] {
    let mut nonce = [tag; 16];
    for (at, byte) in seed.iter().enumerate() {
        nonce[1 + at] = *byte;
    }
    nonce
}

/// One end: its handshake, everything it produced and everything delivered
/// to it, and what it reported.
struct End {
    handshake: PeerHandshake,
    tokens: PeerTokens,
    /// Every byte this end has produced (taken from its outbound).
    sent: Vec<u8>,
    /// Every byte delivered to this end, in order.
    received: Vec<u8>,
    /// Bytes the handshake used of `received`.
    used: usize,
    status: PeerHandshakeStatus,
    timed_out: bool,
}

impl End {
    fn new(handshake: PeerHandshake, tokens: PeerTokens) -> End {
        let mut end = End {
            handshake,
            tokens,
            sent: Vec::new(),
            received: Vec::new(),
            used: 0,
            status: PeerHandshakeStatus::NeedMore,
            timed_out: false,
        };
        end.collect(&mut Vec::new());
        end
    }

    /// Moves what the end wants to send onto `wire`.
    fn collect(&mut self, wire: &mut Vec<u8>) {
        let out = self.handshake.take_outbound();
        self.sent.extend_from_slice(&out);
        wire.extend_from_slice(&out);
        assert!(
            self.sent.len() == PEER_HELLO_LEN || self.sent.len() == HANDSHAKE_LEN,
            "{:?} sent {} handshake bytes",
            self.handshake.role(),
            self.sent.len()
        );
    }

    fn feed(&mut self, bytes: &[u8]) {
        let before = self.status;
        let (used, status) = self.handshake.handle_input(&self.tokens, bytes);
        assert!(used <= bytes.len());
        if before != PeerHandshakeStatus::NeedMore {
            assert_eq!(status, before, "a finished handshake changed its outcome");
            assert_eq!(used, 0, "bytes used after the end");
        }
        if status == PeerHandshakeStatus::NeedMore {
            assert_eq!(used, bytes.len(), "an unfinished handshake left bytes");
        }
        self.received.extend_from_slice(bytes);
        self.used += used;
        // The handshake holds a hello or a proof at most, never frames.
        assert!(self.used <= HANDSHAKE_LEN, "used {} bytes", self.used);
        self.status = status;
    }

    fn established(&self) -> bool {
        matches!(self.status, PeerHandshakeStatus::Established(_))
    }

    fn deliver(&mut self, wire: &mut Vec<u8>, len: usize) {
        let len = len.min(wire.len());
        let bytes: Vec<u8> = wire.drain(..len).collect();
        self.feed(&bytes);
    }
}

/// Whether the first `len` bytes `to` received are exactly the first `len`
/// bytes `from` sent.
fn intact(from: &End, to: &End, len: usize) -> bool {
    from.sent.len() >= len && to.received.len() >= len && from.sent[..len] == to.received[..len]
}

/// An honest handshake between the same identities with other nonces and
/// the token both sides know: its bytes are replayed by the attacker, and
/// its sessions are the unrelated third party.
struct OtherRun {
    bytes: [Vec<u8>; 4],
    dialer: PeerSession,
    acceptor: PeerSession,
}

fn other_run() -> OtherRun {
    let tokens = PeerTokens::new([TOKEN_NEW]).expect("token");
    let mut dialer = PeerHandshake::new(identity(DIALER, 9), [0xd1; 16], Some(1), DEADLINE);
    let mut acceptor = PeerHandshake::new(identity(ACCEPTOR, 9), [0xa1; 16], None, DEADLINE);
    let dialer_hello = dialer.take_outbound();
    let acceptor_hello = acceptor.take_outbound();
    acceptor.handle_input(&tokens, &dialer_hello);
    dialer.handle_input(&tokens, &acceptor_hello);
    let dialer_proof = dialer.take_outbound();
    acceptor.handle_input(&tokens, &dialer_proof);
    let acceptor_proof = acceptor.take_outbound();
    dialer.handle_input(&tokens, &acceptor_proof);
    OtherRun {
        bytes: [dialer_hello, acceptor_hello, dialer_proof, acceptor_proof],
        dialer: dialer.take_session().expect("the other run completes"),
        acceptor: acceptor.take_session().expect("the other run completes"),
    }
}

fn probe(from: NodeId, to: NodeId, term: u64) -> Message {
    Message {
        from,
        to,
        term,
        body: MessageBody::Heartbeat { commit: term },
    }
}

/// Seals `msg` with `sender` and opens it with `receiver`.
fn round_trip(sender: &mut PeerSession, receiver: &mut PeerSession, msg: &Message) -> bool {
    let mut frame = Vec::new();
    sender.sealer.seal(msg, &mut frame).expect("a small frame");
    receiver.decoder.push(&frame);
    match receiver.decoder.next() {
        Ok(Some(opened)) => {
            assert_eq!(&opened, msg, "a frame opened to another message");
            true
        }
        Ok(None) => panic!("a whole frame was not enough"),
        Err(_) => false,
    }
}

/// Runs a real dialer and a real acceptor [`PeerHandshake`] against each
/// other. The first byte picks each side's token list (one token, a
/// rotation `[new, old]` or `[old, new]`, a wrong one) and whether the
/// dialer dialed the right slot; the rest is a script: deliver a chunk of
/// either direction, flip a byte in flight, drop bytes, inject bytes (raw,
/// or a hello or proof recorded from another run with other nonces), swap
/// the two directions, or time a side out. Then everything left is
/// delivered.
///
/// Checks: nothing panics; each side sends only its hello, then at most
/// its proof; the acceptor sends nothing beyond its hello before it has
/// verified a dialer proof, and then exactly its proof over what it saw;
/// neither side uses more than a hello and a proof, nor changes its outcome
/// once finished. A side is established only if the dialer's own token is
/// one the acceptor accepts and every handshake byte it depends on arrived
/// unaltered; both are established exactly when, in addition, the dialed
/// slot was right, nothing timed out and no handshake byte was altered.
/// Then both sides name each other, and a frame sealed by either opens on
/// the other and fails on an unrelated session, in both directions.
pub fn peer_handshake(data: &[u8]) {
    let mut cursor = Cursor { data };
    let setup = Setup::read(&mut cursor);
    let mut network = Network::new(&setup, &mut cursor);
    let mut other = other_run();
    network.play_script(&mut cursor, &other);
    network.deliver_the_rest();
    if !network.check_outcome(&setup) {
        return;
    }
    let Network {
        mut dialer,
        mut acceptor,
        ..
    } = network;
    check_established(&mut dialer, &mut acceptor, &setup);
    check_sessions(&mut dialer, &mut acceptor, &mut other);
}

/// What the first byte configures: each side's tokens, the slot dialed,
/// the dialer's token floor.
struct Setup {
    dialer_list: &'static [&'static [u8]],
    acceptor_list: &'static [&'static [u8]],
    /// The slot the dialer meant to reach.
    dialed: u8,
    /// The acceptor accepts the dialer's own token.
    shared: bool,
    /// The token floors the dialer and the acceptor announce.
    floors: (u64, u64),
}

impl Setup {
    fn read(cursor: &mut Cursor<'_>) -> Setup {
        let config = cursor.byte().unwrap_or(0);
        let dialer_list = TOKEN_LISTS[usize::from(config) % TOKEN_LISTS.len()];
        let acceptor_list = TOKEN_LISTS[usize::from(config / 8) % TOKEN_LISTS.len()];
        let dialed = if config & 0x80 != 0 { 2 } else { 1 };
        let shared = acceptor_list.contains(&dialer_list[0]);
        let floors = (u64::from(config), u64::MAX);
        Setup {
            dialer_list,
            acceptor_list,
            dialed,
            shared,
            floors,
        }
    }
}

/// Both ends and the two directions between them, as the script left them.
struct Network {
    dialer: End,
    acceptor: End,
    /// Bytes on their way from the dialer to the acceptor.
    d2a: Vec<u8>,
    /// Bytes on their way from the acceptor to the dialer.
    a2d: Vec<u8>,
    /// The script altered, dropped, injected or swapped bytes.
    tampered: bool,
}

impl Network {
    /// Both ends with their nonces from the next four bytes, each hello on
    /// its way.
    fn new(setup: &Setup, cursor: &mut Cursor<'_>) -> Network {
        let seeds = cursor.bytes(4).to_vec();
        let (dialer_seed, acceptor_seed) = seeds.split_at(seeds.len().min(2));
        let dialer = End::new(
            PeerHandshake::new(
                identity(DIALER, setup.floors.0),
                nonce(1, dialer_seed),
                Some(setup.dialed),
                DEADLINE,
            ),
            PeerTokens::new(setup.dialer_list).expect("tokens"),
        );
        let acceptor = End::new(
            PeerHandshake::new(
                identity(ACCEPTOR, setup.floors.1),
                nonce(2, acceptor_seed),
                None,
                DEADLINE,
            ),
            PeerTokens::new(setup.acceptor_list).expect("tokens"),
        );
        let d2a = dialer.sent.clone();
        let a2d = acceptor.sent.clone();
        Network {
            dialer,
            acceptor,
            d2a,
            a2d,
            tampered: false,
        }
    }

    /// Up to 64 script steps, each followed by what either side answered.
    fn play_script(&mut self, cursor: &mut Cursor<'_>, other: &OtherRun) {
        for _ in 0..64 {
            let Some(op) = cursor.byte() else { break };
            let arg = usize::from(cursor.byte().unwrap_or(0));
            self.step(cursor, other, op, arg);
            // What either side answered goes out behind what is queued.
            self.collect();
        }
    }

    /// One script step: deliver, flip, drop, inject, swap or time out.
    fn step(&mut self, cursor: &mut Cursor<'_>, other: &OtherRun, op: u8, arg: usize) {
        let to_acceptor = op & 0x10 == 0;
        let wire = if to_acceptor {
            &mut self.d2a
        } else {
            &mut self.a2d
        };
        match op % 8 {
            0..=2 => {
                if to_acceptor {
                    self.acceptor.deliver(wire, arg % 80 + 1);
                } else {
                    self.dialer.deliver(wire, arg % 80 + 1);
                }
            }
            3 if !wire.is_empty() => {
                let at = arg % wire.len();
                wire[at] ^= cursor.byte().unwrap_or(0).max(1);
                self.tampered = true;
            }
            4 if !wire.is_empty() => {
                let at = arg % wire.len();
                wire.remove(at);
                self.tampered = true;
            }
            5 => {
                let bytes: Vec<u8> = if arg & 0x80 == 0 {
                    other.bytes[arg % 4].clone()
                } else {
                    cursor.bytes(arg % 64).to_vec()
                };
                if wire.len() + bytes.len() <= PENDING_MAX {
                    wire.extend_from_slice(&bytes);
                    self.tampered = true;
                }
            }
            6 => {
                std::mem::swap(&mut self.d2a, &mut self.a2d);
                self.tampered = true;
            }
            _ => {
                let end = if to_acceptor {
                    &mut self.acceptor
                } else {
                    &mut self.dialer
                };
                time_out(end, Instant::from_millis(arg as u64 * 8));
            }
        }
    }

    /// Queues what either side wants to send, and checks the acceptor's.
    fn collect(&mut self) {
        self.dialer.collect(&mut self.d2a);
        self.acceptor.collect(&mut self.a2d);
        check_acceptor_output(&self.acceptor);
    }

    /// Everything left arrives, in order, until nothing moves.
    fn deliver_the_rest(&mut self) {
        for _ in 0..4 {
            let (d, a) = (self.d2a.len(), self.a2d.len());
            self.acceptor.deliver(&mut self.d2a, d);
            self.dialer.deliver(&mut self.a2d, a);
            self.collect();
        }
    }

    /// Checks who established against what the script did; true if both
    /// sides are established (the handshake was clean).
    fn check_outcome(&self, setup: &Setup) -> bool {
        let (dialer, acceptor) = (&self.dialer, &self.acceptor);
        let Setup { dialed, shared, .. } = *setup;
        let tampered = self.tampered;
        let untouched_d2a = intact(dialer, acceptor, HANDSHAKE_LEN);
        let untouched_a2d = intact(acceptor, dialer, HANDSHAKE_LEN);
        if acceptor.established() {
            assert!(shared, "the acceptor took a token it does not accept");
            assert!(untouched_d2a, "the acceptor established on altered bytes");
            assert!(
                intact(acceptor, dialer, PEER_HELLO_LEN),
                "the acceptor established on a hello the dialer never saw"
            );
        }
        if dialer.established() {
            assert!(shared, "the dialer established with a token not accepted");
            assert!(untouched_a2d, "the dialer established on altered bytes");
            assert!(acceptor.established(), "the dialer established alone");
        }
        let clean = shared
            && dialed == ACCEPTOR.slot
            && !dialer.timed_out
            && !acceptor.timed_out
            && untouched_d2a
            && untouched_a2d;
        assert_eq!(
            dialer.established() && acceptor.established(),
            clean,
            "dialer {:?}, acceptor {:?}, shared {shared}, dialed {dialed}, tampered {tampered}",
            dialer.status,
            acceptor.status
        );
        if !tampered
            && shared
            && dialed == ACCEPTOR.slot
            && !dialer.timed_out
            && !acceptor.timed_out
        {
            assert!(clean, "an untouched handshake did not complete");
        }
        clean
    }
}

/// Fires `end`'s handshake timer at `now`: it fires exactly when the
/// deadline passed, and then rejects the handshake and clears the deadline.
fn time_out(end: &mut End, now: Instant) {
    let deadline = end.handshake.deadline();
    let fired = end.handshake.handle_timeout(now);
    assert_eq!(fired, deadline.is_some_and(|d| now >= d));
    if fired {
        end.timed_out = true;
        end.status = PeerHandshakeStatus::Rejected(PeerReject::Timeout);
        assert_eq!(end.handshake.deadline(), None);
    }
}

/// Both sides of a clean handshake name each other and saw the other's
/// hello as sent.
fn check_established(dialer: &mut End, acceptor: &mut End, setup: &Setup) {
    assert_eq!(dialer.status, PeerHandshakeStatus::Established(ACCEPTOR));
    assert_eq!(acceptor.status, PeerHandshakeStatus::Established(DIALER));
    assert_eq!(dialer.handshake.peer(), Some(ACCEPTOR));
    assert_eq!(acceptor.handshake.peer(), Some(DIALER));
    let hello = acceptor.handshake.peer_hello().expect("established");
    assert_eq!(hello.token_floor, setup.floors.0);
    assert_eq!(hello.role, PeerRole::Dialer);
    let hello = dialer.handshake.peer_hello().expect("established");
    assert_eq!(
        hello.token_floor,
        crate::cluster::peer::TOKEN_FLOOR_LIMIT - 1
    );
}

/// The sessions of a clean handshake: frames sealed by either open on the
/// other, in both directions, and not on an unrelated session.
fn check_sessions(dialer: &mut End, acceptor: &mut End, other: &mut OtherRun) {
    let mut dialer_session = dialer.handshake.take_session().expect("a session");
    let mut acceptor_session = acceptor.handshake.take_session().expect("a session");
    assert!(dialer.handshake.take_session().is_none(), "given out twice");
    for term in 1..=2 {
        let there = probe(DIALER, ACCEPTOR, term);
        let back = probe(ACCEPTOR, DIALER, term);
        assert!(round_trip(
            &mut dialer_session,
            &mut acceptor_session,
            &there
        ));
        assert!(round_trip(
            &mut acceptor_session,
            &mut dialer_session,
            &back
        ));
    }
    // The third party: an unrelated connection between the same nodes.
    let mut to_stranger = PeerSession {
        sealer: dialer_session.sealer.clone(),
        decoder: crate::cluster::peer::PeerDecoder::from_key(&[0; 32]),
    };
    assert!(!round_trip(
        &mut to_stranger,
        &mut other.acceptor,
        &probe(DIALER, ACCEPTOR, 3)
    ));
    let mut from_acceptor = PeerSession {
        sealer: acceptor_session.sealer.clone(),
        decoder: crate::cluster::peer::PeerDecoder::from_key(&[0; 32]),
    };
    assert!(!round_trip(
        &mut from_acceptor,
        &mut other.dialer,
        &probe(ACCEPTOR, DIALER, 3)
    ));
    // And a frame of the unrelated connection does not open here.
    assert!(!round_trip(
        &mut other.dialer,
        &mut acceptor_session,
        &probe(DIALER, ACCEPTOR, 3)
    ));
}

/// The acceptor's output is its hello, then — only once it verified a
/// dialer proof — exactly its proof over the hellos as it saw them.
fn check_acceptor_output(acceptor: &End) {
    if acceptor.sent.len() == PEER_HELLO_LEN {
        return;
    }
    assert!(
        acceptor.established(),
        "the acceptor proved before it verified the dialer"
    );
    let dialer_hello: [u8; PEER_HELLO_LEN] = acceptor.received[..PEER_HELLO_LEN]
        .try_into()
        .expect("a hello");
    let own_hello: [u8; PEER_HELLO_LEN] =
        acceptor.sent[..PEER_HELLO_LEN].try_into().expect("a hello");
    let own_token = TOKEN_LISTS
        .iter()
        .flat_map(|list| list.iter())
        .find(|token| {
            peer_proof(token, PeerRole::Acceptor, &dialer_hello, &own_hello)[..]
                == acceptor.sent[PEER_HELLO_LEN..]
        });
    assert!(
        own_token.is_some_and(|token| {
            peer_proof(token, PeerRole::Dialer, &dialer_hello, &own_hello)[..]
                == acceptor.received[PEER_HELLO_LEN..HANDSHAKE_LEN]
        }),
        "the acceptor's proof is not over the dialer proof it verified"
    );
}
