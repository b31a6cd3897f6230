//! The client handshake with tokens configured, against the server's real
//! client front: see [`client_handshake`].

use crate::auth::{
    ClientHandshake, ClientHandshakeStatus, ClientTokens, Hello, NONCE_LEN, PROOF_LEN,
    RESULT_ACCEPTED, RESULT_REJECTED, WireMode, client_proof,
};
use crate::conn::Dialect;
use crate::conn::client::{ClientFront, FrontInput};
use crate::line::{LINE_ANSWER_LEN, is_base64url};
use crate::time::Instant;

use super::script::Cursor;

/// When every byte arrives (the front's handshake deadline is later).
const NOW: Instant = Instant::from_millis(1_000);

/// The tokens the server accepts (rotation: several at once).
const SERVER_TOKENS: [&[u8]; 3] = [
    b"fuzz-token-zero-0123456789",
    b"fuzz-token-one-0123456789",
    b"fuzz-token-two-0123456789abcdef",
];
/// What the client may try: each configured token, a wrong one, none.
const CLIENT_TOKENS: [&[u8]; 5] = [
    SERVER_TOKENS[0],
    SERVER_TOKENS[1],
    SERVER_TOKENS[2],
    b"fuzz-token-wrong-0123456789",
    b"",
];
const FINGERPRINT: [u8; 32] = [0x5a; 32];

/// Runs a [`ClientHandshake`] against the client front that the server and
/// the cluster node greet every connection with, with the byte streams in
/// both directions split, corrupted or replaced as the input says; three
/// tokens are configured on the server and the client uses one of them, a
/// wrong one, or none.
///
/// Checks: neither side panics or uses more bytes than it was given; each
/// finishes once and then keeps its outcome (a rejected front reads nothing
/// more, an accepted one hands later bytes to its session); the front
/// accepts exactly when the first 32 bytes it got are the proof of a
/// configured token for the hello it sent, and answers with the result byte
/// only then (`0x01` once the session is admitted, `0x00` for a v3 proof
/// that fails); the client is accepted only after a hello for the mode and
/// slot it expects and the result byte `0x01`; and with both streams
/// untouched, the handshake ends as the token says.
pub fn client_handshake(data: &[u8]) {
    let mut cursor = Cursor { data };
    let (mut run, client_token) = HandshakeRun::new(&mut cursor);
    for _ in 0..64 {
        let Some(op) = cursor.byte() else { break };
        let len = usize::from(cursor.byte().unwrap_or(64));
        run.step(&mut cursor, op, len);
        run.queue_proof();
    }
    if run.tampered {
        return;
    }
    run.run_to_end();
    run.check_outcome(client_token);
}

/// Both sides of the handshake and the two byte streams between them.
struct HandshakeRun {
    server: ServerSide,
    client: ClientHandshake,
    /// Server → client: the hello, then whatever the front answers.
    to_client: Vec<u8>,
    /// Client → server: the proof once the client has one.
    to_server: Vec<u8>,
    proof_queued: bool,
    client_seen: Vec<u8>,
    client_outcome: Option<ClientHandshakeStatus>,
    /// Some byte in flight was altered or injected.
    tampered: bool,
}

impl HandshakeRun {
    /// Both sides as the first byte (token, mode, slot) and the next
    /// [`NONCE_LEN`] (the server's nonce) configure them, and the token the
    /// client uses.
    fn new(cursor: &mut Cursor<'_>) -> (HandshakeRun, &'static [u8]) {
        let choice = cursor.byte().unwrap_or(0);
        let client_token = CLIENT_TOKENS[usize::from(choice % 5)];
        let mode = if choice & 0x10 == 0 {
            WireMode::Single
        } else {
            WireMode::Cluster
        };
        let slot = match mode {
            WireMode::Single => 0xff,
            WireMode::Cluster => (choice >> 5) % 3,
        };
        let mut nonce = [0u8; NONCE_LEN];
        let taken = cursor.bytes(NONCE_LEN);
        nonce[..taken.len()].copy_from_slice(taken);
        let hello = Hello {
            mode,
            self_slot: slot,
            nonce,
        };
        let tokens = ClientTokens::new(SERVER_TOKENS).expect("long tokens");
        let server = ServerSide {
            front: ClientFront::new(hello, FINGERPRINT, Instant::from_millis(10_000)),
            tokens,
            received: Vec::new(),
            outcome: None,
        };
        let run = HandshakeRun {
            client: ClientHandshake::new(client_token, FINGERPRINT, mode, slot),
            to_client: server.front.hello_bytes().to_vec(),
            server,
            to_server: Vec::new(),
            proof_queued: false,
            client_seen: Vec::new(),
            client_outcome: None,
            tampered: false,
        };
        (run, client_token)
    }

    /// One script step, picked by `op`, moving or altering up to `len` bytes.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8, len: usize) {
        match op % 6 {
            0 | 1 => self.deliver_to_client(len),
            2 | 3 => self.deliver_to_server(len),
            4 => self.corrupt(cursor, len),
            _ => self.inject(cursor, len),
        }
    }

    /// Delivers up to `len` bytes to the client.
    fn deliver_to_client(&mut self, len: usize) {
        let take = len.min(self.to_client.len());
        let bytes: Vec<u8> = self.to_client.drain(..take).collect();
        feed_client(
            &mut self.client,
            &bytes,
            &mut self.client_seen,
            &mut self.client_outcome,
        );
    }

    /// Delivers up to `len` bytes to the server.
    fn deliver_to_server(&mut self, len: usize) {
        let take = len.min(self.to_server.len());
        let bytes: Vec<u8> = self.to_server.drain(..take).collect();
        feed_server(&mut self.server, &bytes, &mut self.to_client);
    }

    /// Corrupts one byte in flight.
    fn corrupt(&mut self, cursor: &mut Cursor<'_>, len: usize) {
        let value = cursor.byte().unwrap_or(0);
        let stream = if len & 1 == 0 {
            &mut self.to_client
        } else {
            &mut self.to_server
        };
        if !stream.is_empty() {
            let at = len % stream.len();
            self.tampered |= stream[at] != value;
            stream[at] = value;
        }
    }

    /// Injects arbitrary bytes in one direction.
    fn inject(&mut self, cursor: &mut Cursor<'_>, len: usize) {
        let bytes = cursor.bytes(len % 40).to_vec();
        self.tampered |= !bytes.is_empty();
        if len & 1 == 0 {
            self.to_client.extend_from_slice(&bytes);
        } else {
            self.to_server.extend_from_slice(&bytes);
        }
    }

    /// Queues the client's proof once it has one.
    fn queue_proof(&mut self) {
        if !self.proof_queued
            && let Some(proof) = self.client.proof()
        {
            self.proof_queued = true;
            self.to_server.extend_from_slice(&proof);
        }
    }

    /// Untouched streams: run to the end.
    fn run_to_end(&mut self) {
        for _ in 0..4 {
            let bytes = std::mem::take(&mut self.to_client);
            feed_client(
                &mut self.client,
                &bytes,
                &mut self.client_seen,
                &mut self.client_outcome,
            );
            self.queue_proof();
            let bytes = std::mem::take(&mut self.to_server);
            feed_server(&mut self.server, &bytes, &mut self.to_client);
        }
    }

    /// The handshake ended as the client's token says.
    fn check_outcome(&self, client_token: &[u8]) {
        let configured = SERVER_TOKENS.contains(&client_token);
        let expected = if configured {
            ClientHandshakeStatus::Accepted
        } else {
            ClientHandshakeStatus::Rejected
        };
        assert_eq!(
            self.client_outcome,
            Some(expected),
            "token {client_token:?}"
        );
    }
}

fn feed_client(
    client: &mut ClientHandshake,
    mut bytes: &[u8],
    seen: &mut Vec<u8>,
    outcome: &mut Option<ClientHandshakeStatus>,
) {
    // A split may hold the rest of the hello and the result byte.
    for _ in 0..3 {
        let (used, status) = client.handle_input(bytes);
        assert!(used <= bytes.len());
        seen.extend_from_slice(&bytes[..used]);
        bytes = &bytes[used..];
        match status {
            ClientHandshakeStatus::NeedMore | ClientHandshakeStatus::SendProof => {
                assert!(outcome.is_none(), "unfinished after {outcome:?}");
            }
            finished => {
                if let Some(earlier) = *outcome {
                    assert_eq!(finished, earlier, "the outcome changed");
                    assert_eq!(used, 0, "bytes used after the end");
                } else {
                    *outcome = Some(finished);
                }
                if finished == ClientHandshakeStatus::Accepted {
                    // Accepted only after a hello it expects and then 0x01.
                    assert_eq!(seen.len(), crate::auth::HELLO_LEN + 1);
                    assert_eq!(seen.last(), Some(&RESULT_ACCEPTED));
                    let hello: [u8; crate::auth::HELLO_LEN] =
                        seen[..crate::auth::HELLO_LEN].try_into().expect("hello");
                    assert!(Hello::parse(&hello).is_ok());
                }
                return;
            }
        }
        if bytes.is_empty() {
            return;
        }
    }
}

/// The server's side: its client front and what it was fed until it decided.
struct ServerSide {
    front: ClientFront,
    tokens: ClientTokens,
    /// Every byte fed to the front before it decided.
    received: Vec<u8>,
    /// `Accepted` or `Rejected`, once decided.
    outcome: Option<FrontInput>,
}

fn feed_server(server: &mut ServerSide, bytes: &[u8], to_client: &mut Vec<u8>) {
    let mut out = Vec::new();
    let input = server
        .front
        .handle_input(NOW, &server.tokens, bytes, &mut out);
    if let Some(earlier) = server.outcome {
        // Decided: a rejected front reads nothing more, an accepted one
        // hands the bytes to its session; neither answers on its own.
        match earlier {
            FrontInput::Accepted(_) => assert_eq!(input, FrontInput::Session),
            _ => {
                assert_eq!(input, FrontInput::Pending, "read after the rejection");
                assert!(!server.front.wants_input());
            }
        }
        assert!(out.is_empty(), "bytes sent after the decision");
        return;
    }
    server.received.extend_from_slice(bytes);
    let received = &server.received;
    match input {
        FrontInput::Pending => {
            assert!(out.is_empty(), "an answer before the decision");
            // Undecided past 32 bytes only while they may be a line answer.
            assert!(
                received.len() < PROOF_LEN
                    || (received[..PROOF_LEN].iter().all(|&b| is_base64url(b))
                        && received.len() < LINE_ANSWER_LEN),
                "undecided after {} bytes",
                received.len()
            );
            return;
        }
        FrontInput::Accepted(_) => {
            assert!(
                out.is_empty(),
                "a result byte before the session is admitted"
            );
            server.front.begin_session(&mut out);
            assert_eq!(out, [RESULT_ACCEPTED]);
        }
        FrontInput::Rejected(Dialect::V3) => assert_eq!(out, [RESULT_REJECTED]),
        // A line answer's `Eauth_failed` follows after a delay.
        FrontInput::Rejected(Dialect::Line) => assert!(out.is_empty()),
        FrontInput::Session => panic!("a session before the handshake ended"),
    }
    server.outcome = Some(input);
    let hello = Hello::parse(&server.front.hello_bytes()).expect("own hello");
    let valid = received.len() >= PROOF_LEN
        && SERVER_TOKENS
            .iter()
            .any(|token| client_proof(token, &FINGERPRINT, &hello)[..] == received[..PROOF_LEN]);
    assert_eq!(
        input == FrontInput::Accepted(Dialect::V3),
        valid,
        "accepted must mean a configured token's proof"
    );
    to_client.extend_from_slice(&out);
}
