//! Connection handshake: hello bytes, proof vectors, token checks, the
//! client state machine, and the server side as the real server runs it,
//! under arbitrary splits.

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr};

use ticketing_core::auth::*;
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState, Server, ServerConfig};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, Reply, Request};

const TOKEN_A: &[u8] = b"0123456789abcdef0123456789abcdef";
const TOKEN_B: &[u8] = b"fedcba9876543210fedcba9876543210";
const CLUSTER_FINGERPRINT: [u8; 32] = {
    let mut bytes = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        bytes[i] = i as u8;
        i += 1;
    }
    bytes
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn single_hello(nonce: [u8; 16]) -> Hello {
    Hello {
        mode: WireMode::Single,
        self_slot: 0xFF,
        nonce,
    }
}

fn cluster_hello(self_slot: u8) -> Hello {
    let mut nonce = [0u8; 16];
    for (i, byte) in nonce.iter_mut().enumerate() {
        *byte = 0x10 + i as u8;
    }
    Hello {
        mode: WireMode::Cluster,
        self_slot,
        nonce,
    }
}

// ------------------------------------------------------- vectors

#[test]
fn single_fingerprint_is_sha256_of_the_single_identity() {
    let digest = Sha256::digest(b"ticketing/single/v3");
    assert_eq!(digest.as_slice(), &SINGLE_FINGERPRINT[..]);
    assert_eq!(
        hex(&SINGLE_FINGERPRINT),
        "ff4d4698ae53ede382f96885dadeba243d2d124ded967b336908d00399c87b97"
    );
}

#[test]
fn vector_single_mode_empty_token() {
    let hello = single_hello([0x5a; 16]);
    let proof = client_proof(b"", &SINGLE_FINGERPRINT, &hello);
    assert_eq!(
        hex(&proof),
        "36d90d5be87c31801dd0a7028e11d5c8f5271be243f4096777a67108f0a26a1b"
    );
}

#[test]
fn vector_cluster_slot_2() {
    let hello = cluster_hello(2);
    let proof = client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &hello);
    assert_eq!(
        hex(&proof),
        "a9f6d44c1d8d8764f1085e2068535bb800c9676ab34e5b9af686f108e94dc611"
    );
}

#[test]
fn the_proof_binds_every_transcript_field() {
    let base = cluster_hello(2);
    let proof = client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &base);
    let mut other_nonce = base;
    other_nonce.nonce[15] ^= 1;
    let other_slot = Hello {
        self_slot: 3,
        ..base
    };
    let other_mode = Hello {
        mode: WireMode::Single,
        ..base
    };
    let mut other_fingerprint = CLUSTER_FINGERPRINT;
    other_fingerprint[0] ^= 1;
    for different in [
        client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &other_nonce),
        client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &other_slot),
        client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &other_mode),
        client_proof(TOKEN_A, &other_fingerprint, &base),
        client_proof(TOKEN_B, &CLUSTER_FINGERPRINT, &base),
    ] {
        assert_ne!(different, proof);
    }
}

// ------------------------------------------------------- hello

#[test]
fn hello_has_the_documented_layout() {
    let hello = cluster_hello(4);
    let bytes = hello.encode();
    assert_eq!(&bytes[..8], b"TCKCLI3\0");
    assert_eq!(&bytes[8..10], &[0, 3]);
    assert_eq!(bytes[10], 1);
    assert_eq!(bytes[11], 4);
    assert_eq!(&bytes[12..], &hello.nonce);
    assert_eq!(Hello::parse(&bytes), Ok(hello));

    let single = single_hello([7; 16]);
    let bytes = single.encode();
    assert_eq!(bytes[10], 0);
    assert_eq!(bytes[11], 0xFF);
    assert_eq!(Hello::parse(&bytes), Ok(single));
}

#[test]
fn hello_parse_refuses_each_bad_field() {
    let good = cluster_hello(0).encode();

    let mut bad = good;
    bad[7] = b'X';
    assert_eq!(Hello::parse(&bad), Err(HelloError::Magic));

    let mut bad = good;
    bad[9] = 2;
    assert_eq!(Hello::parse(&bad), Err(HelloError::Version(2)));

    let mut bad = good;
    bad[10] = 2;
    assert_eq!(Hello::parse(&bad), Err(HelloError::Mode(2)));

    let mut bad = good;
    bad[11] = 5;
    assert_eq!(Hello::parse(&bad), Err(HelloError::Slot(5)));
    bad[11] = 0xFF;
    assert_eq!(
        Hello::parse(&bad),
        Err(HelloError::Slot(0xFF)),
        "cluster needs a real slot"
    );

    let mut bad = single_hello([0; 16]).encode();
    bad[11] = 0;
    assert_eq!(
        Hello::parse(&bad),
        Err(HelloError::Slot(0)),
        "single mode has only 0xFF"
    );

    for slot in 0..5 {
        assert!(Hello::parse(&cluster_hello(slot).encode()).is_ok());
    }
}

// ------------------------------------------------------- tokens

#[test]
fn short_tokens_are_refused_with_their_position() {
    let err = ClientTokens::new([TOKEN_A, b"short".as_slice()]).unwrap_err();
    assert_eq!(err, TokenTooShort { index: 1, len: 5 });
    assert!(err.to_string().contains("16"));
    let err = ClientTokens::new([&b"0123456789abcde"[..]]).unwrap_err();
    assert_eq!(err, TokenTooShort { index: 0, len: 15 });
    assert!(ClientTokens::new([&b"0123456789abcdef"[..]]).is_ok());
}

#[test]
fn token_list_debug_does_not_print_secrets() {
    let tokens = ClientTokens::new([TOKEN_A]).unwrap();
    let text = format!("{tokens:?}");
    assert!(!text.contains("0123456789abcdef"), "{text}");
    let client = ClientHandshake::new(TOKEN_A, CLUSTER_FINGERPRINT, WireMode::Cluster, 2);
    let text = format!("{client:?}");
    assert!(!text.contains("0123456789abcdef"), "{text}");
    assert!(!text.contains("48, 49, 50"), "{text}");
}

#[test]
fn verify_accepts_the_right_token_only() {
    let hello = cluster_hello(1);
    let tokens = ClientTokens::new([TOKEN_A]).unwrap();
    assert!(!tokens.is_no_auth());
    let good = client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &hello);
    assert!(tokens.verify(&CLUSTER_FINGERPRINT, &hello, &good));
    let wrong_token = client_proof(TOKEN_B, &CLUSTER_FINGERPRINT, &hello);
    assert!(!tokens.verify(&CLUSTER_FINGERPRINT, &hello, &wrong_token));
    let empty_token = client_proof(b"", &CLUSTER_FINGERPRINT, &hello);
    assert!(
        !tokens.verify(&CLUSTER_FINGERPRINT, &hello, &empty_token),
        "with tokens configured the empty token is refused"
    );
    let mut flipped = good;
    flipped[31] ^= 0x80;
    assert!(!tokens.verify(&CLUSTER_FINGERPRINT, &hello, &flipped));
    // A proof made for another connection's nonce is not a replayable pass.
    let other = cluster_hello(1);
    let mut other = other;
    other.nonce = [0xAA; 16];
    assert!(!tokens.verify(&CLUSTER_FINGERPRINT, &other, &good));
}

#[test]
fn rotation_accepts_either_configured_token() {
    let hello = cluster_hello(0);
    let tokens = ClientTokens::new([TOKEN_A, TOKEN_B]).unwrap();
    for token in [TOKEN_A, TOKEN_B] {
        let proof = client_proof(token, &CLUSTER_FINGERPRINT, &hello);
        assert!(tokens.verify(&CLUSTER_FINGERPRINT, &hello, &proof));
    }
    let stranger = client_proof(b"not-a-configured-token!!", &CLUSTER_FINGERPRINT, &hello);
    assert!(!tokens.verify(&CLUSTER_FINGERPRINT, &hello, &stranger));
}

#[test]
fn no_auth_accepts_only_the_empty_token() {
    let hello = single_hello([1; 16]);
    for tokens in [
        ClientTokens::no_auth(),
        ClientTokens::new(Vec::<Vec<u8>>::new()).unwrap(),
    ] {
        assert!(tokens.is_no_auth());
        let empty = client_proof(b"", &SINGLE_FINGERPRINT, &hello);
        assert!(tokens.verify(&SINGLE_FINGERPRINT, &hello, &empty));
        let some = client_proof(TOKEN_A, &SINGLE_FINGERPRINT, &hello);
        assert!(!tokens.verify(&SINGLE_FINGERPRINT, &hello, &some));
        assert!(!tokens.verify(&SINGLE_FINGERPRINT, &hello, &[0; 32]));
    }
}

// ------------------------------------------------------- server side

// The server side of the handshake is the client front every served
// connection starts in (shared by the single-mode server and the cluster
// node); these drive it through the real single-mode server.

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const FIRST_TOKEN: u64 = 1_700_000_000_000_000;

/// One connection to a single-mode server accepting `tokens`, its hello
/// taken.
struct Served {
    server: Server,
    conn: ConnId,
    hello: Hello,
    now: Instant,
}

fn served(tokens: ClientTokens) -> Served {
    let now = Instant::from_millis(1_000);
    let config = ServerConfig {
        client_tokens: tokens,
        ..ServerConfig::default()
    };
    let mut server = Server::new(config, FIRST_TOKEN, now);
    let conn = server
        .handle_connect(now, [3; 16], LOOPBACK)
        .expect("connection admitted");
    let mut out = Vec::new();
    assert_eq!(server.poll_transmit(conn, &mut out), ConnState::Open);
    let hello: [u8; HELLO_LEN] = out.try_into().expect("exactly one hello");
    let hello = Hello::parse(&hello).expect("a valid hello");
    Served {
        server,
        conn,
        hello,
        now,
    }
}

impl Served {
    /// The proof of `token` for this connection's hello.
    fn proof(&self, token: &[u8]) -> [u8; PROOF_LEN] {
        client_proof(token, &SINGLE_FINGERPRINT, &self.hello)
    }

    /// Feeds `bytes`; returns what the server sent back and the state.
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, ConnState) {
        self.server.handle_input(self.now, self.conn, bytes);
        self.take()
    }

    fn take(&mut self) -> (Vec<u8>, ConnState) {
        let mut out = Vec::new();
        let state = self.server.poll_transmit(self.conn, &mut out);
        (out, state)
    }

    fn advance_to(&mut self, at: Instant) {
        self.now = at;
        self.server.handle_timeout(at);
    }
}

fn acquire_bytes(rid: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Request::Acquire(AcquireRequest {
        rid,
        wait_s: 0,
        lease_s: 30,
        keys: KeyGroup::single(Key::new(b"k").unwrap()),
        set: false,
    })
    .encode(&mut out);
    out
}

#[test]
fn server_accepts_a_good_proof() {
    let mut s = served(ClientTokens::new([TOKEN_A]).unwrap());
    let proof = s.proof(TOKEN_A);
    assert_eq!(s.feed(&proof), (vec![RESULT_ACCEPTED], ConnState::Open));
    assert!(s.server.wants_input(s.conn));
}

#[test]
fn server_rejects_a_bad_proof() {
    let mut s = served(ClientTokens::new([TOKEN_A]).unwrap());
    let proof = s.proof(TOKEN_B);
    assert_eq!(
        s.feed(&proof),
        (vec![RESULT_REJECTED], ConnState::CloseAfterFlush)
    );
    assert!(!s.server.wants_input(s.conn));
}

#[test]
fn server_checks_the_proof_against_its_own_fingerprint() {
    let mut s = served(ClientTokens::new([TOKEN_A]).unwrap());
    let proof = client_proof(TOKEN_A, &CLUSTER_FINGERPRINT, &s.hello);
    assert_eq!(
        s.feed(&proof),
        (vec![RESULT_REJECTED], ConnState::CloseAfterFlush)
    );
}

#[test]
fn server_collects_a_proof_split_into_pieces() {
    let mut s = served(ClientTokens::new([TOKEN_B]).unwrap());
    let proof = s.proof(TOKEN_B);
    assert_eq!(s.feed(&[]), (vec![], ConnState::Open));
    assert_eq!(s.feed(&proof[..1]), (vec![], ConnState::Open));
    assert_eq!(s.feed(&proof[1..20]), (vec![], ConnState::Open));
    assert_eq!(
        s.feed(&proof[20..]),
        (vec![RESULT_ACCEPTED], ConnState::Open)
    );
}

#[test]
fn server_reads_bytes_after_the_proof_as_frames() {
    let mut s = served(ClientTokens::no_auth());
    let proof = s.proof(b"");
    assert_eq!(s.feed(&proof[..10]), (vec![], ConnState::Open));
    let mut input = proof[10..].to_vec();
    input.extend_from_slice(&acquire_bytes(7));
    let (out, state) = s.feed(&input);
    assert_eq!(state, ConnState::Open);
    assert_eq!(out[0], RESULT_ACCEPTED);
    assert_eq!(
        Reply::decode(&out[1..]).unwrap(),
        Some((
            Reply::Acquired {
                rid: 7,
                token: FIRST_TOKEN
            },
            out.len() - 1
        ))
    );
}

#[test]
fn server_reads_nothing_after_rejecting() {
    let mut s = served(ClientTokens::no_auth());
    assert_eq!(
        s.feed(&[0; 40]),
        (vec![RESULT_REJECTED], ConnState::CloseAfterFlush)
    );
    // Even the right proof is not looked at any more.
    let proof = s.proof(b"");
    assert_eq!(s.feed(&proof), (vec![], ConnState::CloseAfterFlush));
    assert!(!s.server.wants_input(s.conn));
}

#[test]
fn server_closes_an_unfinished_handshake_at_its_deadline() {
    let mut s = served(ClientTokens::no_auth());
    let deadline = s
        .now
        .saturating_add(ServerConfig::default().handshake_timeout);
    assert_eq!(s.feed(&[1; 5]), (vec![], ConnState::Open));
    s.advance_to(deadline.saturating_sub(Duration::from_millis(1)));
    assert_eq!(s.take(), (vec![], ConnState::Open));
    s.advance_to(deadline);
    assert_eq!(
        s.take(),
        (vec![], ConnState::CloseAfterFlush),
        "no result byte, just closed"
    );
    // A late proof is not looked at.
    let proof = s.proof(b"");
    assert_eq!(s.feed(&proof), (vec![], ConnState::CloseAfterFlush));
}

#[test]
fn a_finished_handshake_ignores_the_handshake_deadline() {
    let mut s = served(ClientTokens::no_auth());
    let proof = s.proof(b"");
    assert_eq!(s.feed(&proof), (vec![RESULT_ACCEPTED], ConnState::Open));
    let late = s
        .now
        .saturating_add(ServerConfig::default().handshake_timeout)
        .saturating_add(Duration::from_secs(60));
    s.advance_to(late);
    assert_eq!(s.take(), (vec![], ConnState::Open));
    let (out, state) = s.feed(&acquire_bytes(1));
    assert_eq!(state, ConnState::Open);
    assert!(matches!(
        Reply::decode(&out),
        Ok(Some((Reply::Acquired { rid: 1, .. }, _)))
    ));
}

// ------------------------------------------------------- client handshake

#[test]
fn client_and_server_complete_a_handshake() {
    let mut s = served(ClientTokens::new([TOKEN_B, TOKEN_A]).unwrap());
    let mut cli = ClientHandshake::new(TOKEN_A, SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    assert_eq!(cli.proof(), None);
    assert_eq!(
        cli.handle_input(&s.hello.encode()),
        (28, ClientHandshakeStatus::SendProof)
    );
    let proof = cli.proof().expect("proof after the hello");
    assert_eq!(proof, s.proof(TOKEN_A));
    let (result, state) = s.feed(&proof);
    assert_eq!(
        (result.as_slice(), state),
        (&[RESULT_ACCEPTED][..], ConnState::Open)
    );
    // Result byte followed by an L frame in the same read.
    let input = [RESULT_ACCEPTED, b'L', 0, 1, 0xFF];
    assert_eq!(
        cli.handle_input(&input),
        (1, ClientHandshakeStatus::Accepted)
    );
    assert_eq!(
        cli.handle_input(&input[1..]),
        (0, ClientHandshakeStatus::Accepted)
    );
}

#[test]
fn client_reads_a_hello_fed_byte_by_byte() {
    let hello = single_hello([0x5a; 16]);
    let bytes = hello.encode();
    let mut cli = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    for byte in &bytes[..27] {
        assert_eq!(
            cli.handle_input(std::slice::from_ref(byte)),
            (1, ClientHandshakeStatus::NeedMore)
        );
    }
    assert_eq!(
        cli.handle_input(&bytes[27..]),
        (1, ClientHandshakeStatus::SendProof)
    );
    assert_eq!(
        hex(&cli.proof().unwrap()),
        "36d90d5be87c31801dd0a7028e11d5c8f5271be243f4096777a67108f0a26a1b"
    );
    assert_eq!(cli.handle_input(&[]), (0, ClientHandshakeStatus::NeedMore));
    assert_eq!(
        cli.handle_input(&[RESULT_REJECTED]),
        (1, ClientHandshakeStatus::Rejected)
    );
}

#[test]
fn client_stops_at_the_end_of_the_hello() {
    // Hello and result byte arriving together: the hello is consumed first,
    // the result byte is left for the next call.
    let hello = single_hello([1; 16]);
    let mut input = hello.encode().to_vec();
    input.push(RESULT_ACCEPTED);
    let mut cli = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    assert_eq!(
        cli.handle_input(&input),
        (28, ClientHandshakeStatus::SendProof)
    );
    assert_eq!(
        cli.handle_input(&input[28..]),
        (1, ClientHandshakeStatus::Accepted)
    );
}

#[test]
fn client_refuses_an_unexpected_server() {
    // Slot mismatch.
    let mut cli = ClientHandshake::new(TOKEN_A, CLUSTER_FINGERPRINT, WireMode::Cluster, 1);
    assert_eq!(
        cli.handle_input(&cluster_hello(2).encode()),
        (28, ClientHandshakeStatus::UnexpectedServer)
    );
    assert_eq!(cli.proof(), None, "no proof for the wrong server");
    assert_eq!(
        cli.handle_input(&[1]),
        (0, ClientHandshakeStatus::UnexpectedServer)
    );
    // Mode mismatch.
    let mut cli = ClientHandshake::new(TOKEN_A, CLUSTER_FINGERPRINT, WireMode::Cluster, 0xFF);
    assert_eq!(
        cli.handle_input(&single_hello([0; 16]).encode()).1,
        ClientHandshakeStatus::UnexpectedServer
    );
}

#[test]
fn client_refuses_a_malformed_hello() {
    let mut bytes = single_hello([0; 16]).encode();
    bytes[8..10].copy_from_slice(&4u16.to_be_bytes());
    let mut cli = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    assert_eq!(
        cli.handle_input(&bytes),
        (28, ClientHandshakeStatus::BadHello(HelloError::Version(4)))
    );
    assert_eq!(cli.proof(), None);
}

#[test]
fn client_reports_a_bad_result_byte() {
    let mut cli = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
    assert_eq!(
        cli.handle_input(&single_hello([0; 16]).encode()).1,
        ClientHandshakeStatus::SendProof
    );
    assert_eq!(
        cli.handle_input(&[0x02, 0x01]),
        (1, ClientHandshakeStatus::BadResult(2))
    );
    assert_eq!(
        cli.handle_input(&[0x01]),
        (0, ClientHandshakeStatus::BadResult(2))
    );
}

#[test]
fn hello_errors_display_as_sentences() {
    assert!(HelloError::Magic.to_string().contains("magic"));
    assert!(HelloError::Version(9).to_string().contains('9'));
    assert!(HelloError::Mode(7).to_string().contains('7'));
    assert!(HelloError::Slot(42).to_string().contains("42"));
}

// ------------------------------------------------------- properties

/// Cuts `bytes` into chunks of the given sizes (cycled), at least 1 byte each.
fn chunks<'a>(bytes: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let size = sizes[i % sizes.len()].max(1).min(bytes.len() - at);
        out.push(&bytes[at..at + size]);
        at += size;
        i += 1;
    }
    out
}

proptest! {
    #[test]
    fn server_decides_on_exactly_the_proof_under_any_split(
        nonce in any::<[u8; 16]>(),
        trailing in prop::collection::vec(any::<u8>(), 0..64),
        sizes in prop::collection::vec(1..40usize, 1..8),
        good in any::<bool>(),
    ) {
        let mut s = served(ClientTokens::new([TOKEN_A, TOKEN_B]).unwrap());
        // A connection with this test's nonce (the server shapes it).
        s.conn = s.server.handle_connect(s.now, nonce, LOOPBACK).expect("admitted");
        let (hello, _) = s.take();
        s.hello = Hello::parse(&hello.try_into().expect("one hello")).expect("valid hello");
        let token = if good { TOKEN_B } else { b"not-the-right-token" as &[u8] };
        let mut input = s.proof(token).to_vec();
        input.extend_from_slice(&trailing);
        let mut out = Vec::new();
        let mut state = ConnState::Open;
        for chunk in chunks(&input, &sizes) {
            let (bytes, now_state) = s.feed(chunk);
            out.extend_from_slice(&bytes);
            state = now_state;
        }
        if good {
            // Accepted; whatever followed the proof was read as frames.
            prop_assert_eq!(out.first(), Some(&RESULT_ACCEPTED));
        } else {
            // Rejected on the proof; nothing after it was read.
            prop_assert_eq!(out, vec![RESULT_REJECTED]);
            prop_assert_eq!(state, ConnState::CloseAfterFlush);
        }
    }

    #[test]
    fn client_never_panics_on_arbitrary_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..80),
        sizes in prop::collection::vec(1..40usize, 1..8),
    ) {
        let mut cli = ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, 0xFF);
        let mut consumed = 0;
        for chunk in chunks(&bytes, &sizes) {
            let (used, _) = cli.handle_input(chunk);
            prop_assert!(used <= chunk.len());
            consumed += used;
        }
        // Never more than the hello and one result byte.
        prop_assert!(consumed <= HELLO_LEN + 1);
    }
}
