//! The client handshake with tokens configured: see [`client_handshake`].

use crate::auth::{
    ClientHandshake, ClientHandshakeStatus, ClientTokens, HandshakeStatus, Hello, NONCE_LEN,
    PROOF_LEN, RESULT_ACCEPTED, RESULT_REJECTED, ServerHandshake, WireMode, client_proof,
};
use crate::time::Instant;

use super::Cursor;

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

/// Runs the client and the server side of one client handshake against each
/// other, with the byte streams in both directions split, corrupted or
/// replaced as the input says; three tokens are configured on the server
/// and the client uses one of them, a wrong one, or none.
///
/// Checks: neither side panics or uses more bytes than it was given; each
/// finishes once and then repeats its outcome without using bytes; the
/// server accepts exactly when the 32 bytes it got are the proof of a
/// configured token for its own hello; the client is accepted only after a
/// hello for the mode and slot it expects and the result byte `0x01`; and
/// with both streams untouched, the handshake ends as the token says.
pub fn client_handshake(data: &[u8]) {
    let mut cursor = Cursor { data };
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
    let mut server = ServerHandshake::new(hello, FINGERPRINT, Instant::from_millis(10_000));
    let mut client = ClientHandshake::new(client_token, FINGERPRINT, mode, slot);

    // Server → client: the hello, then its result byte once it has one.
    let mut to_client: Vec<u8> = hello.encode().to_vec();
    // Client → server: the proof once the client has one.
    let mut to_server: Vec<u8> = Vec::new();
    let mut proof_queued = false;
    let mut result_queued = false;
    let mut proof_received: Vec<u8> = Vec::new();
    let mut client_seen: Vec<u8> = Vec::new();
    let mut server_outcome: Option<HandshakeStatus> = None;
    let mut client_outcome: Option<ClientHandshakeStatus> = None;
    let mut tampered = false;

    for _ in 0..64 {
        let Some(op) = cursor.byte() else { break };
        let len = usize::from(cursor.byte().unwrap_or(64));
        match op % 6 {
            // Deliver up to `len` bytes to the client.
            0 | 1 => {
                let take = len.min(to_client.len());
                let bytes: Vec<u8> = to_client.drain(..take).collect();
                feed_client(&mut client, &bytes, &mut client_seen, &mut client_outcome);
            }
            // Deliver up to `len` bytes to the server.
            2 | 3 => {
                let take = len.min(to_server.len());
                let bytes: Vec<u8> = to_server.drain(..take).collect();
                feed_server(
                    &mut server,
                    &tokens,
                    &bytes,
                    &mut proof_received,
                    &mut server_outcome,
                );
            }
            // Corrupt one byte in flight.
            4 => {
                let value = cursor.byte().unwrap_or(0);
                let stream = if len & 1 == 0 {
                    &mut to_client
                } else {
                    &mut to_server
                };
                if !stream.is_empty() {
                    let at = len % stream.len();
                    tampered |= stream[at] != value;
                    stream[at] = value;
                }
            }
            // Arbitrary bytes injected in one direction.
            _ => {
                let bytes = cursor.bytes(len % 40).to_vec();
                tampered |= !bytes.is_empty();
                if len & 1 == 0 {
                    to_client.extend_from_slice(&bytes);
                } else {
                    to_server.extend_from_slice(&bytes);
                }
            }
        }
        if !proof_queued && let Some(proof) = client.proof() {
            proof_queued = true;
            to_server.extend_from_slice(&proof);
        }
        if !result_queued && let Some(outcome) = server_outcome {
            result_queued = true;
            to_client.push(if outcome == HandshakeStatus::Accepted {
                RESULT_ACCEPTED
            } else {
                RESULT_REJECTED
            });
        }
    }
    if tampered {
        return;
    }
    // Untouched streams: run to the end.
    for _ in 0..4 {
        let bytes = std::mem::take(&mut to_client);
        feed_client(&mut client, &bytes, &mut client_seen, &mut client_outcome);
        if !proof_queued && let Some(proof) = client.proof() {
            proof_queued = true;
            to_server.extend_from_slice(&proof);
        }
        let bytes = std::mem::take(&mut to_server);
        feed_server(
            &mut server,
            &tokens,
            &bytes,
            &mut proof_received,
            &mut server_outcome,
        );
        if !result_queued && let Some(outcome) = server_outcome {
            result_queued = true;
            to_client.push(if outcome == HandshakeStatus::Accepted {
                RESULT_ACCEPTED
            } else {
                RESULT_REJECTED
            });
        }
    }
    let configured = SERVER_TOKENS.contains(&client_token);
    let expected = if configured {
        ClientHandshakeStatus::Accepted
    } else {
        ClientHandshakeStatus::Rejected
    };
    assert_eq!(client_outcome, Some(expected), "token {client_token:?}");
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

fn feed_server(
    server: &mut ServerHandshake,
    tokens: &ClientTokens,
    bytes: &[u8],
    received: &mut Vec<u8>,
    outcome: &mut Option<HandshakeStatus>,
) {
    let (used, status) = server.handle_input(tokens, bytes);
    assert!(used <= bytes.len());
    received.extend_from_slice(&bytes[..used]);
    assert!(
        received.len() <= PROOF_LEN,
        "the server used more than a proof"
    );
    match status {
        HandshakeStatus::NeedMore => assert!(outcome.is_none()),
        finished => {
            if let Some(earlier) = *outcome {
                assert_eq!(finished, earlier, "the outcome changed");
                assert_eq!(used, 0, "bytes used after the end");
                return;
            }
            *outcome = Some(finished);
            let hello = Hello::parse(&server.hello_bytes()).expect("own hello");
            let valid = SERVER_TOKENS
                .iter()
                .any(|token| client_proof(token, &FINGERPRINT, &hello)[..] == received[..]);
            assert_eq!(
                finished == HandshakeStatus::Accepted,
                valid,
                "accepted must mean a configured token's proof"
            );
        }
    }
}
