//! The line dialect (clients 0.3.0) served by the single-mode server beside
//! wire v3: the shared hello, telling the dialects apart, the line
//! handshake, every request and reply rule. Time is injected; nothing
//! sleeps.

use ticketing_core::auth::{ClientHandshake, ClientTokens, SINGLE_FINGERPRINT, WireMode};
use ticketing_core::budget::{AbuseKind, LogEvent};
use ticketing_core::line::{
    LINE_ANSWER_CHARS, LINE_END_BYTES, LINE_NONCE_ALPHABET_LEN, LineDecoded, LineDecoder,
    LineFrameError, LineReply, LineRequest, decode_line_request, encode_line_acquire,
    encode_line_release, is_line_end_byte, line_answer, line_nonce, shape_shared_nonce,
};
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, ConnState, Dialect, ServerConfig};
use ticketing_core::testing::net::{FIRST_TOKEN, Nonces, SingleNet, line_answer_for};
use ticketing_core::time::Duration;
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, NO_LEADER_SLOT, Reply, Request};

const TOKEN_A: &str = "0123456789abcdef0123456789abcdef";

/// An owned line reply, for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Line {
    A {
        token: u64,
        owner: u64,
        key: Vec<u8>,
    },
    T {
        owner: u64,
        key: Vec<u8>,
    },
    B {
        owner: u64,
        key: Vec<u8>,
    },
    R {
        token: u64,
        key: Vec<u8>,
    },
    N {
        token: u64,
        key: Vec<u8>,
    },
    M(String),
    L(String),
    E(String),
}

fn owned(reply: LineReply<'_>) -> Line {
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    match reply {
        LineReply::Acquired { token, owner, key } => Line::A {
            token,
            owner,
            key: key.to_vec(),
        },
        LineReply::TimedOut { owner, key } => Line::T {
            owner,
            key: key.to_vec(),
        },
        LineReply::Busy { owner, key } => Line::B {
            owner,
            key: key.to_vec(),
        },
        LineReply::Released { token, key } => Line::R {
            token,
            key: key.to_vec(),
        },
        LineReply::NotFound { token, key } => Line::N {
            token,
            key: key.to_vec(),
        },
        LineReply::Moved { address } => Line::M(text(address)),
        LineReply::Leader { address } => Line::L(text(address)),
        LineReply::Error { reason } => Line::E(text(reason)),
    }
}

fn decode_lines(mut bytes: &[u8]) -> Vec<Line> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (reply, used) = LineReply::decode(bytes)
            .expect("valid line reply")
            .expect("complete line reply");
        out.push(owned(reply));
        bytes = &bytes[used..];
    }
    out
}

fn e(reason: &str) -> Line {
    Line::E(reason.to_owned())
}

fn acquire_frame(wait_s: u16, lease_s: u16, owner: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_acquire(&mut out, wait_s, lease_s, owner, key);
    out
}

fn release_frame(token: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_release(&mut out, token, key);
    out
}

/// The net of these tests with `config`: each connection gets nonce bytes
/// of its own, with an LF among them that the shared hello must map away.
fn net_with(config: ServerConfig) -> SingleNet {
    SingleNet::new(config).with_nonces(Nonces::CountingWithLineEnd)
}

/// [`net_with`] the default configuration.
fn net() -> SingleNet {
    net_with(ServerConfig::default())
}

/// What the net takes for a line connection, as the owned replies of this
/// file.
trait LineReplies {
    /// Takes what the server has for `conn` (flushed) as line replies.
    fn lines(&mut self, conn: ConnId) -> Vec<Line>;
    /// Sends `bytes` on `conn` and takes the line replies.
    fn call_line(&mut self, conn: ConnId, bytes: &[u8]) -> Vec<Line>;
    /// Acquires `key` for `owner` on `conn` (wait 5 s, lease 30 s), which
    /// must be granted at once; the token.
    fn grant(&mut self, conn: ConnId, owner: u64, key: &str) -> u64;
}

impl LineReplies for SingleNet {
    fn lines(&mut self, conn: ConnId) -> Vec<Line> {
        decode_lines(&self.take(conn).0)
    }

    fn call_line(&mut self, conn: ConnId, bytes: &[u8]) -> Vec<Line> {
        self.send_bytes(conn, bytes);
        self.lines(conn)
    }

    fn grant(&mut self, conn: ConnId, owner: u64, key: &str) -> u64 {
        match self.call_line(conn, &acquire_frame(5, 30, owner, key.as_bytes()))[..] {
            [
                Line::A {
                    token, owner: o, ..
                },
            ] if o == owner => token,
            ref other => panic!("expected a grant, got {other:?}"),
        }
    }
}

fn v3_acquire(rid: u64, key: &str, wait_s: u8) -> Vec<u8> {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s: 30,
        keys: KeyGroup::single(Key::new(key.as_bytes()).unwrap()),
        set: false,
    })
    .to_frame()
}

fn v3_replies(mut bytes: &[u8]) -> Vec<Reply> {
    let mut out = Vec::new();
    while let Some((reply, used)) = Reply::decode(bytes).unwrap() {
        out.push(reply);
        bytes = &bytes[used..];
    }
    out
}

// ---------------------------------------------------------------------
// The shared hello and the handshake
// ---------------------------------------------------------------------

/// Checks the shape of a shared hello's nonce and returns its line part.
fn assert_shaped(nonce: &[u8; 16], input: &[u8; 16]) {
    assert_eq!(nonce[0], b' ', "input {input:02x?}");
    assert_eq!(nonce[15], b'\n', "input {input:02x?}");
    assert!(
        !nonce[1..15].iter().copied().any(is_line_end_byte),
        "input {input:02x?} gave a line end in {nonce:02x?}"
    );
    assert_eq!(line_nonce(nonce), &nonce[1..15]);
}

fn shaped(input: [u8; 16]) -> [u8; 16] {
    let mut nonce = input;
    shape_shared_nonce(&mut nonce);
    assert_shaped(&nonce, &input);
    nonce
}

/// A few inputs every position is varied over: the extremes, every line
/// end, and a run of the bytes that follow them.
const BACKGROUNDS: [[u8; 16]; 5] = [
    [0x00; 16],
    [0xFF; 16],
    [b'\n'; 16],
    [b'\r'; 16],
    [
        0x0A, 0x0D, 0x0B, 0x0C, 0x1C, 0x1D, 0x1E, 0x85, 0xE2, 0x80, 0xA8, 0x0D, 0x0A, 0x20, 0x00,
        0x0A,
    ],
];

#[test]
fn every_byte_value_in_every_position_gives_a_line_end_free_nonce_of_its_own() {
    for background in BACKGROUNDS {
        for position in 0..16 {
            let mut seen = std::collections::HashSet::new();
            for value in 0..=255u8 {
                let mut input = background;
                input[position] = value;
                seen.insert(shaped(input));
            }
            assert_eq!(
                seen.len(),
                256,
                "position {position} over {background:02x?}: some values gave the same nonce"
            );
        }
    }
}

#[test]
fn the_shared_hello_is_one_line_for_a_line_client_over_many_seeds() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut seen = std::collections::HashSet::new();
    // How often each allowed byte shows up in each line nonce position.
    let mut counts = [[0u32; 256]; 14];
    let draws = 100_000u32;
    for _ in 0..draws {
        let mut input = [0u8; 16];
        for byte in &mut input {
            // xorshift: every byte value, the line ends included, shows up
            // often.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let nonce = shaped(input);
        for (position, &byte) in line_nonce(&nonce).iter().enumerate() {
            counts[position][usize::from(byte)] += 1;
        }
        seen.insert(nonce);
    }
    assert_eq!(seen.len(), draws as usize, "distinct inputs, same nonce");
    // Every allowed byte is used in every position, about equally often:
    // the nonce keeps close to 14 × log2(247) ≈ 111 bits.
    let allowed = 256 - LINE_END_BYTES.len();
    assert_eq!(allowed, LINE_NONCE_ALPHABET_LEN);
    let expected = draws as f64 / allowed as f64;
    for (position, counts) in counts.iter().enumerate() {
        for (byte, &count) in counts.iter().enumerate() {
            if is_line_end_byte(byte as u8) {
                assert_eq!(count, 0);
            } else {
                assert!(
                    (count as f64 - expected).abs() < expected * 0.3,
                    "byte {byte:#04x} at {position}: {count} times, expected about {expected:.0}"
                );
            }
        }
    }
    // On the wire: under a line reader that splits on any line end (as
    // Python's str.splitlines does on the bytes decoded as Latin-1), the
    // first line ends at the hello's last byte, and the first space is at
    // the nonce, so a line client's challenge is bytes 1..15 of the nonce.
    let mut h = net();
    for _ in 0..300 {
        let (_, hello) = h.open();
        assert_eq!(hello.iter().position(|&b| is_line_end_byte(b)), Some(27));
        assert_eq!(hello.iter().position(|&b| b == b' '), Some(12));
    }
}

proptest::proptest! {
    #[test]
    fn any_driver_bytes_give_a_line_end_free_nonce(
        first in proptest::array::uniform16(proptest::num::u8::ANY),
        second in proptest::array::uniform16(proptest::num::u8::ANY),
    ) {
        let (a, b) = (shaped(first), shaped(second));
        // Same input, same nonce (the simulator replays runs by seed);
        // different inputs collide with probability about 2^-111.
        proptest::prop_assert_eq!(shaped(first), a);
        proptest::prop_assert_eq!(first == second, a == b);
    }
}

#[test]
fn the_line_answer_matches_both_published_vectors() {
    assert_eq!(
        &line_answer(b"secret", b"aB3dEf_g"),
        b"WvDLEd0VIA9cVatiwxXYXRGMDSXw0ibHllLgAMBffdg"
    );
    assert_eq!(
        &line_answer(b"", b"aB3dEf_g"),
        b"V2o6RKSLU7HNO8I1-W-CsbAXKL3GKvBgFahf6AueTo4"
    );
    assert_eq!(LINE_ANSWER_CHARS, 43);
}

#[test]
fn a_v3_proof_makes_a_v3_session_and_a_line_answer_a_line_session() {
    let mut h = net();
    let v3 = h.connect();
    let line = h.connect_line();
    assert_eq!(h.server.dialect(v3), Some(Dialect::V3));
    assert_eq!(h.server.dialect(line), Some(Dialect::Line));
    assert_eq!(h.server.stats().sessions, 2);
    let metrics = h.server.metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (2, 1));
    h.server.handle_closed(h.now, line);
    let metrics = h.server.metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (1, 0));
}

#[test]
fn answers_split_across_many_reads_are_assembled_in_both_dialects() {
    let mut h = net();
    // Line: the answer and a pipelined request, one byte per read.
    let (conn, hello) = h.open();
    let mut bytes = line_answer_for(&hello, b"");
    bytes.extend(acquire_frame(1, 30, 0x0A0A_0A0A_0A0A_0A0A, b"k"));
    for byte in &bytes {
        h.send_bytes(conn, std::slice::from_ref(byte));
    }
    let lines = h.lines(conn);
    assert!(
        matches!(&lines[..], [Line::A { owner: 0x0A0A_0A0A_0A0A_0A0A, key, .. }] if key == b"k"),
        "{lines:?}"
    );
    // V3: the proof one byte per read.
    let (conn, hello) = h.open();
    let mut client =
        ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
    client.handle_input(&hello);
    for byte in client.proof().unwrap() {
        h.send_bytes(conn, &[byte]);
    }
    assert_eq!(h.take(conn).0, vec![1]);
    assert_eq!(h.server.dialect(conn), Some(Dialect::V3));
}

#[test]
fn garbage_answers_get_the_v3_rejection_and_close() {
    let mut h = net();
    let (conn, _) = h.open();
    h.send_bytes(conn, &[0xFF; 32]);
    let (bytes, state) = h.take(conn);
    assert_eq!(bytes, vec![0]);
    assert_eq!(state, ConnState::CloseAfterFlush);
}

#[test]
fn a_failing_v3_proof_is_rejected_at_once() {
    let config = ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    };
    let mut h = net_with(config);
    let (conn, hello) = h.open();
    let mut client = ClientHandshake::new(
        b"wrong-token-0123456789",
        SINGLE_FINGERPRINT,
        WireMode::Single,
        NO_LEADER_SLOT,
    );
    client.handle_input(&hello);
    h.send_bytes(conn, &client.proof().unwrap());
    let (bytes, state) = h.take(conn);
    assert_eq!(bytes, vec![0]);
    assert_eq!(state, ConnState::CloseAfterFlush);
}

#[test]
fn a_failing_line_answer_waits_a_second_then_says_auth_failed_and_closes() {
    let config = ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    };
    let mut h = net_with(config);
    let (conn, hello) = h.open();
    let mut bytes = line_answer_for(&hello, b"wrong-token-0123456789");
    // A pipelined request behind the answer is never served.
    bytes.extend(acquire_frame(1, 30, 7, b"k"));
    h.send_bytes(conn, &bytes);
    let (now_bytes, state) = h.take(conn);
    assert!(now_bytes.is_empty(), "nothing before the delay");
    assert_eq!(state, ConnState::Open);
    assert!(!h.server.wants_input(conn), "nothing more is read");
    h.advance(Duration::from_millis(999));
    assert!(h.take(conn).0.is_empty());
    h.advance(Duration::from_millis(1));
    let (bytes, state) = h.take(conn);
    assert_eq!(decode_lines(&bytes), vec![e("auth_failed")]);
    assert_eq!(state, ConnState::CloseAfterFlush);
    assert_eq!(h.server.stats().lock.held_keys, 0);
    let failed = h
        .outputs
        .logs(&mut h.server, h.now)
        .into_iter()
        .any(|event| {
            matches!(
                event,
                LogEvent::Abuse {
                    kind: AbuseKind::FailedProof,
                    ..
                }
            )
        });
    assert!(failed, "the failed proof is reported");
}

#[test]
fn a_configured_token_admits_a_line_client_that_proves_it() {
    let config = ServerConfig {
        client_tokens: ClientTokens::new([TOKEN_A]).unwrap(),
        ..ServerConfig::default()
    };
    let mut h = net_with(config);
    let conn = h.connect_line_with(TOKEN_A.as_bytes());
    assert!(h.grant(conn, 1, "k") >= FIRST_TOKEN);
}

#[test]
fn a_line_answer_with_a_bad_tail_fails_as_a_line_handshake() {
    let mut h = net();
    let (conn, hello) = h.open();
    let mut answer = line_answer_for(&hello, b"");
    answer[43] = b'x'; // no LF where it must be
    h.send_bytes(conn, &answer);
    assert!(h.take(conn).0.is_empty());
    h.advance(Duration::from_secs(1));
    let (bytes, state) = h.take(conn);
    assert_eq!(decode_lines(&bytes), vec![e("auth_failed")]);
    assert_eq!(state, ConnState::CloseAfterFlush);
}

// ---------------------------------------------------------------------
// Codec
// ---------------------------------------------------------------------

#[test]
fn requests_decode_by_count_even_when_binary_fields_hold_lf() {
    let owner = u64::from_be_bytes([0x0A; 8]);
    let frame = acquire_frame(0x0A0A, 0x000A, owner, "ключ/1".as_bytes());
    assert_eq!(frame.len(), 1 + 12 + "ключ/1".len() + 1);
    let (decoded, used) = decode_line_request(&frame).unwrap().unwrap();
    assert_eq!(used, frame.len());
    assert_eq!(
        decoded,
        LineDecoded::Request(LineRequest::Acquire {
            wait_s: 0x0A0A,
            lease_s: 10,
            owner,
            key: Key::new("ключ/1".as_bytes()).unwrap(),
        })
    );
    let frame = release_frame(owner, b"k");
    assert_eq!(frame.len(), 11);
    let (decoded, _) = decode_line_request(&frame).unwrap().unwrap();
    assert_eq!(
        decoded,
        LineDecoded::Request(LineRequest::Release {
            token: owner,
            key: Key::new(b"k").unwrap()
        })
    );
    // Every prefix is incomplete, never an error.
    for cut in 0..frame.len() {
        assert_eq!(decode_line_request(&frame[..cut]), Ok(None), "cut {cut}");
    }
}

#[test]
fn replies_encode_and_decode_with_lf_inside_fixed_parts() {
    let lf8 = u64::from_be_bytes([0x0A; 8]);
    let replies = [
        LineReply::Acquired {
            token: lf8,
            owner: lf8,
            key: b"a/b",
        },
        LineReply::TimedOut {
            owner: lf8,
            key: b"k",
        },
        LineReply::Busy {
            owner: 1,
            key: b"k",
        },
        LineReply::Released {
            token: lf8,
            key: b"k",
        },
        LineReply::NotFound {
            token: 2,
            key: b"k",
        },
        LineReply::Moved {
            address: b"127.0.0.1:5225",
        },
        LineReply::Leader {
            address: b"10.0.0.2:5225",
        },
        LineReply::Error { reason: b"bad_key" },
    ];
    let mut bytes = Vec::new();
    for reply in &replies {
        reply.encode(&mut bytes);
    }
    let mut rest = &bytes[..];
    for reply in &replies {
        let (decoded, used) = LineReply::decode(rest).unwrap().unwrap();
        assert_eq!(&decoded, reply);
        rest = &rest[used..];
    }
    assert!(rest.is_empty());
    assert_eq!(bytes[0], b'A');
    assert_eq!(bytes.len(), {
        let sizes = [1 + 16 + 3, 1 + 8 + 1, 1 + 8 + 1, 1 + 8 + 1, 1 + 8 + 1];
        sizes.iter().map(|s| s + 1).sum::<usize>() + (1 + 14 + 1) + (1 + 13 + 1) + (1 + 7 + 1)
    });
}

#[test]
fn the_decoder_yields_the_same_requests_however_the_input_is_chunked() {
    let mut stream = Vec::new();
    stream.extend(b"\n\n");
    stream.extend(acquire_frame(0x0A00, 30, 0x0A, b"k1"));
    stream.push(b'\n');
    stream.extend(release_frame(0x0A0A, b"k2"));
    stream.extend(acquire_frame(1, 1, 1, b"bad key"));
    stream.extend(acquire_frame(2, 2, 2, b"k3"));
    let whole = {
        let mut decoder = LineDecoder::new();
        decoder.push(&stream);
        std::iter::from_fn(|| decoder.next().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(whole.len(), 4);
    assert_eq!(whole[2], LineDecoded::BadKey);
    for chunk in 1..stream.len() {
        let mut decoder = LineDecoder::new();
        let mut got = Vec::new();
        for piece in stream.chunks(chunk) {
            decoder.push(piece);
            while let Some(decoded) = decoder.next().unwrap() {
                got.push(decoded);
            }
        }
        assert_eq!(got, whole, "chunk {chunk}");
        assert_eq!(decoder.buffered(), 0);
    }
}

#[test]
fn the_decoder_stops_at_an_unknown_op_and_at_an_endless_key() {
    let mut decoder = LineDecoder::new();
    decoder.push(b"X");
    assert_eq!(decoder.next(), Err(LineFrameError::UnknownOp(b'X')));
    let mut decoder = LineDecoder::new();
    let mut frame = vec![b'R'];
    frame.extend([0; 8]);
    frame.extend(vec![b'k'; 1024]);
    decoder.push(&frame);
    assert_eq!(decoder.next(), Ok(None), "1,024 key bytes may still end");
    decoder.push(b"k");
    assert_eq!(decoder.next(), Err(LineFrameError::TooLong));
    assert_eq!(decoder.buffered(), 0, "nothing kept after the error");
}

// ---------------------------------------------------------------------
// Server rules
// ---------------------------------------------------------------------

#[test]
fn acquire_and_release_echo_owner_token_and_key_byte_for_byte() {
    let mut h = net();
    let conn = h.connect_line();
    let key = "заказ/42";
    let owner = 0xDEAD_0A0A_BEEF_0A0A;
    let token = h.grant(conn, owner, key);
    assert_eq!(token, FIRST_TOKEN);
    assert_eq!(
        h.call_line(conn, &release_frame(token, key.as_bytes())),
        vec![Line::R {
            token,
            key: key.as_bytes().to_vec()
        }]
    );
    assert_eq!(
        h.call_line(conn, &release_frame(token, key.as_bytes())),
        vec![Line::N {
            token,
            key: key.as_bytes().to_vec()
        }]
    );
}

#[test]
fn wait_zero_on_a_held_key_queues_rather_than_trying_once() {
    let mut h = net();
    let holder = h.connect_line();
    let waiter = h.connect_line();
    let v3 = h.connect();
    h.grant(holder, 1, "k");
    // On v3, wait 0 is one immediate try.
    h.send_bytes(v3, &v3_acquire(1, "k", 0));
    assert!(matches!(
        v3_replies(&h.take(v3).0)[..],
        [Reply::TimedOut { rid: 1 }]
    ));
    // On a line connection it is "without limit", served as 255 s.
    assert!(
        h.call_line(waiter, &acquire_frame(0, 30, 2, b"k"))
            .is_empty()
    );
    h.advance(Duration::from_secs(29));
    assert!(h.lines(waiter).is_empty(), "still queued");
    h.advance(Duration::from_secs(2));
    let lines = h.lines(waiter);
    assert!(
        matches!(&lines[..], [Line::A { owner: 2, token, .. }] if *token > FIRST_TOKEN),
        "the expiry hands the key over: {lines:?}"
    );
}

#[test]
fn line_waits_of_zero_or_over_255_s_end_with_t_at_255_s() {
    for wait_s in [0u16, 256, 65_535] {
        let mut h = net();
        let holder = h.connect_line();
        let v3 = h.connect();
        let waiter = h.connect_line();
        // The key stays held past 255 s: the holder's 250 s lease hands it
        // to a v3 waiter queued first, which holds it 250 s more.
        h.send_bytes(holder, &acquire_frame(1, 250, 1, b"k"));
        h.send_bytes(v3, &v3_acquire(1, "k", 255));
        assert!(
            h.call_line(waiter, &acquire_frame(wait_s, 30, 2, b"k"))
                .is_empty()
        );
        h.advance(Duration::from_secs(254));
        assert!(h.lines(waiter).is_empty(), "wait {wait_s}: still queued");
        h.advance(Duration::from_millis(1_100));
        assert_eq!(
            h.lines(waiter),
            vec![Line::T {
                owner: 2,
                key: b"k".to_vec()
            }],
            "wait {wait_s}"
        );
    }
}

#[test]
fn a_line_wait_below_255_s_is_kept() {
    let mut h = net();
    let v3 = h.connect();
    let waiter = h.connect_line();
    h.send_bytes(v3, &v3_acquire(1, "k", 0));
    let replies = v3_replies(&h.take(v3).0);
    assert!(matches!(replies[..], [Reply::Acquired { rid: 1, .. }]));
    assert!(
        h.call_line(waiter, &acquire_frame(20, 30, 5, b"k"))
            .is_empty()
    );
    h.advance(Duration::from_millis(19_000));
    assert!(h.lines(waiter).is_empty());
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.lines(waiter),
        vec![Line::T {
            owner: 5,
            key: b"k".to_vec()
        }]
    );
}

#[test]
fn a_bad_lease_says_why_then_ends_the_call_with_t_and_grants_nothing() {
    let mut h = net();
    let conn = h.connect_line();
    for lease_s in [0u16, 251, 300, 65_535] {
        assert_eq!(
            h.call_line(conn, &acquire_frame(5, lease_s, 3, b"k")),
            vec![
                e("bad_lease"),
                Line::T {
                    owner: 3,
                    key: b"k".to_vec()
                }
            ],
            "lease {lease_s}"
        );
    }
    assert_eq!(h.server.stats().lock.held_keys, 0);
    assert!(h.grant(conn, 4, "k") >= FIRST_TOKEN, "the key stayed free");
}

#[test]
fn bad_keys_get_bad_key_only_and_the_session_goes_on() {
    let mut h = net();
    let conn = h.connect_line();
    let long = vec![b'k'; 129];
    let bad: [&[u8]; 5] = [b"", b"a b", b"a\rb", &[0xFF, 0xFE], &long];
    for key in bad {
        assert_eq!(
            h.call_line(conn, &acquire_frame(5, 30, 3, key)),
            vec![e("bad_key")],
            "{key:?}"
        );
        assert_eq!(
            h.call_line(conn, &release_frame(9, key)),
            vec![e("bad_key")]
        );
    }
    assert!(h.grant(conn, 4, "k") >= FIRST_TOKEN);
}

#[test]
fn an_unknown_op_says_bad_op_and_closes_and_keep_alives_are_ignored() {
    let mut h = net();
    let conn = h.connect_line();
    assert!(h.call_line(conn, b"\n\n\n").is_empty(), "keep-alives");
    let token = h.grant(conn, 1, "k");
    assert_eq!(h.call_line(conn, b"Q"), vec![e("bad_op")]);
    let (_, state) = h.take(conn);
    assert_eq!(state, ConnState::CloseAfterFlush);
    // The grant was delivered, so the bad input loses nothing: it stays
    // until released or expired.
    assert_eq!(h.server.stats().lock.held_keys, 1);
    assert!(token >= FIRST_TOKEN);
}

#[test]
fn a_key_without_lf_past_1024_bytes_says_too_long_and_closes() {
    let mut h = net();
    let conn = h.connect_line();
    let mut frame = release_frame(1, b"");
    frame.pop();
    frame.extend(vec![b'k'; 1025]);
    assert_eq!(h.call_line(conn, &frame), vec![e("too_long")]);
    assert_eq!(h.take(conn).1, ConnState::CloseAfterFlush);
}

#[test]
fn a_release_of_token_zero_gets_n() {
    let mut h = net();
    let conn = h.connect_line();
    h.grant(conn, 1, "k");
    assert_eq!(
        h.call_line(conn, &release_frame(0, b"k")),
        vec![Line::N {
            token: 0,
            key: b"k".to_vec()
        }]
    );
    assert_eq!(h.server.stats().lock.held_keys, 1);
}

#[test]
fn a_release_with_a_token_never_issued_is_reported_as_an_old_client() {
    let mut h = net();
    let conn = h.connect_line();
    // What a 0.1.0 client sends: `R` + key, the key read as a token.
    let mut frame = b"Rorders/1".to_vec();
    frame.extend(b"2\n");
    let lines = h.call_line(conn, &frame);
    assert!(matches!(&lines[..], [Line::N { .. }]), "{lines:?}");
    let reported = h
        .outputs
        .logs(&mut h.server, h.now)
        .into_iter()
        .any(|event| {
            matches!(
                event,
                LogEvent::Abuse {
                    kind: AbuseKind::TokenFromTheFuture,
                    ..
                }
            )
        });
    assert!(reported);
}

#[test]
fn every_pipelined_request_gets_exactly_one_terminal_reply() {
    let mut h = net();
    let holder = h.connect_line();
    let conn = h.connect_line();
    h.grant(holder, 1, "busy");
    let mut bytes = Vec::new();
    for owner in 0..50u64 {
        let key = format!("k{}", owner % 5);
        bytes.extend(acquire_frame(1, 10, owner + 100, key.as_bytes()));
    }
    bytes.extend(acquire_frame(1, 10, 999, b"busy"));
    h.send_bytes(conn, &bytes);
    h.advance(Duration::from_secs(2));
    let lines = h.lines(conn);
    let mut by_owner = std::collections::BTreeMap::new();
    for line in &lines {
        let owner = match line {
            Line::A { owner, .. } | Line::T { owner, .. } | Line::B { owner, .. } => *owner,
            other => panic!("unexpected {other:?}"),
        };
        *by_owner.entry(owner).or_insert(0) += 1;
    }
    assert_eq!(by_owner.len(), 51);
    assert!(by_owner.values().all(|&n| n == 1), "{by_owner:?}");
    assert_eq!(
        lines.iter().filter(|l| matches!(l, Line::A { .. })).count(),
        5,
        "one grant per free key, the rest time out behind it"
    );
}

#[test]
fn line_and_v3_clients_contend_on_one_key_with_one_token_counter() {
    let mut h = net();
    let v3 = h.connect();
    let line = h.connect_line();
    h.send_bytes(v3, &v3_acquire(1, "shared", 0));
    let t1 = match v3_replies(&h.take(v3).0)[..] {
        [Reply::Acquired { token, .. }] => token,
        ref other => panic!("{other:?}"),
    };
    assert!(
        h.call_line(line, &acquire_frame(10, 30, 7, b"shared"))
            .is_empty()
    );
    h.send_bytes(
        v3,
        &Request::Release(ticketing_core::wire::ReleaseRequest {
            rid: 2,
            token: t1,
            keys: KeyGroup::single(Key::new(b"shared").unwrap()),
            set: false,
        })
        .to_frame(),
    );
    assert!(matches!(
        v3_replies(&h.take(v3).0)[..],
        [Reply::Released { rid: 2 }]
    ));
    let t2 = match h.lines(line)[..] {
        [
            Line::A {
                token, owner: 7, ..
            },
        ] => token,
        ref other => panic!("{other:?}"),
    };
    assert!(t2 > t1, "handed over with a new, larger token");
    // And back: a v3 waiter behind the line holder.
    h.send_bytes(v3, &v3_acquire(3, "shared", 10));
    assert!(h.take(v3).0.is_empty());
    assert_eq!(
        h.call_line(line, &release_frame(t2, b"shared")),
        vec![Line::R {
            token: t2,
            key: b"shared".to_vec()
        }]
    );
    match v3_replies(&h.take(v3).0)[..] {
        [Reply::Acquired { rid: 3, token }] => assert!(token > t2),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn an_undelivered_line_grant_is_released_when_the_connection_dies() {
    let mut h = net();
    let holder = h.connect_line();
    let waiter = h.connect_line();
    let other = h.connect_line();
    let t = h.grant(holder, 1, "k");
    assert!(
        h.call_line(waiter, &acquire_frame(10, 30, 2, b"k"))
            .is_empty()
    );
    assert!(
        h.call_line(other, &acquire_frame(10, 30, 3, b"k"))
            .is_empty()
    );
    h.send_bytes(holder, &release_frame(t, b"k"));
    // The waiter's grant is queued but never written: its transport dies.
    h.server.handle_closed(h.now, waiter);
    let lines = h.lines(other);
    assert!(
        matches!(&lines[..], [Line::A { owner: 3, .. }]),
        "{lines:?}"
    );
}

#[test]
fn shutdown_ends_line_waits_with_t_then_not_active() {
    let mut h = net();
    let holder = h.connect_line();
    let waiter = h.connect_line();
    h.grant(holder, 1, "k");
    assert!(
        h.call_line(waiter, &acquire_frame(10, 30, 2, b"k"))
            .is_empty()
    );
    h.server.begin_shutdown(h.now);
    let (bytes, state) = h.take(waiter);
    assert_eq!(
        decode_lines(&bytes),
        vec![
            Line::T {
                owner: 2,
                key: b"k".to_vec()
            },
            e("not_active")
        ]
    );
    assert_eq!(state, ConnState::CloseAfterFlush);
    let (bytes, _) = h.take(holder);
    assert_eq!(decode_lines(&bytes), vec![e("not_active")]);
}

#[test]
fn busy_is_answered_only_at_a_configured_limit() {
    let config = ServerConfig {
        in_flight_per_connection_max: 2,
        ..ServerConfig::default()
    };
    let mut h = net_with(config);
    let holder = h.connect_line();
    let conn = h.connect_line();
    h.grant(holder, 1, "k");
    let mut bytes = Vec::new();
    for owner in 10..13 {
        bytes.extend(acquire_frame(10, 30, owner, b"k"));
    }
    assert_eq!(
        h.call_line(conn, &bytes),
        vec![Line::B {
            owner: 12,
            key: b"k".to_vec()
        }]
    );
}
