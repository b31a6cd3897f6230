//! The peer protocol: message framing round trips, hostile input, and the
//! symmetric challenge-response handshake.

use std::collections::BTreeSet;

use proptest::prelude::*;
use ticketing_core::peer::{
    FRAME_LEN_BYTES, MAX_FRAME_LEN, PEER_HELLO_LEN, PeerDecoder, PeerError, PeerHandshake,
    PeerHandshakeStatus, PeerHello, PeerReject, PeerTokenError, PeerTokens, decode_frame,
    encode_message, message_to_frame, peer_proof,
};
use ticketing_core::raft::{
    Configuration, Entry, EntryKind, MAX_RAFT_NUMBER, Message, MessageBody, NodeId, SnapshotMeta,
};
use ticketing_core::time::Instant;

const FINGERPRINT: [u8; 32] = [7; 32];
const TOKEN: &[u8] = b"peer-token-0123456789";

fn id(slot: u8, generation: u64) -> NodeId {
    NodeId::new(slot, generation)
}

fn config() -> Configuration {
    Configuration {
        voters: [id(0, 1), id(1, 1), id(2, 3)].into_iter().collect(),
        learners: [id(2, 9)].into_iter().collect(),
    }
}

fn every_body() -> Vec<MessageBody> {
    vec![
        MessageBody::PreVote {
            last_index: 9,
            last_term: 2,
        },
        MessageBody::PreVoteResponse { reject: true },
        MessageBody::Vote {
            last_index: 9,
            last_term: 2,
            transfer: true,
        },
        MessageBody::VoteResponse { reject: false },
        MessageBody::Append {
            prev_index: 4,
            prev_term: 1,
            entries: vec![
                Entry {
                    index: 5,
                    term: 2,
                    kind: EntryKind::Noop,
                },
                Entry {
                    index: 6,
                    term: 2,
                    kind: EntryKind::Command(b"\x02grant".to_vec()),
                },
                Entry {
                    index: 7,
                    term: 2,
                    kind: EntryKind::Config(config()),
                },
            ],
            commit: 5,
        },
        MessageBody::Append {
            prev_index: 4,
            prev_term: 1,
            entries: vec![],
            commit: 4,
        },
        MessageBody::AppendResponse {
            reject: true,
            index: 4,
            hint_index: 3,
            hint_term: 1,
        },
        MessageBody::Heartbeat { commit: 11 },
        MessageBody::HeartbeatResponse,
        MessageBody::InstallSnapshot {
            meta: SnapshotMeta {
                index: 100,
                term: 3,
                config: config(),
            },
            offset: 4096,
            data: vec![1, 2, 3, 4],
            done: true,
        },
        MessageBody::SnapshotResponse {
            index: 100,
            next_offset: 4100,
            done: false,
        },
        MessageBody::TimeoutNow,
    ]
}

fn message(body: MessageBody) -> Message {
    Message {
        from: id(1, 0x0102_0304_0506_0708),
        to: id(2, 5),
        // The largest term the decoder accepts.
        term: MAX_RAFT_NUMBER - 1,
        body,
    }
}

#[test]
fn every_message_kind_round_trips() {
    for body in every_body() {
        let msg = message(body);
        let frame = message_to_frame(&msg).unwrap();
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len + FRAME_LEN_BYTES, frame.len());
        assert_eq!(frame[4], 1, "frame version");
        assert_eq!(decode_frame(&frame), Ok(Some((msg.clone(), frame.len()))));
        // Every strict prefix just needs more bytes.
        for cut in 0..frame.len() {
            assert_eq!(
                decode_frame(&frame[..cut]),
                Ok(None),
                "{msg:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn heartbeat_layout_is_exact() {
    let frame = message_to_frame(&message(MessageBody::Heartbeat { commit: 0x0a0b })).unwrap();
    let mut expected = vec![0, 0, 0, 36, 1, 7, 1, 1, 2, 3, 4, 5, 6, 7, 8, 2];
    expected.extend_from_slice(&5u64.to_be_bytes());
    expected.extend_from_slice(&(MAX_RAFT_NUMBER - 1).to_be_bytes());
    expected.extend_from_slice(&0x0a0bu64.to_be_bytes());
    assert_eq!(frame, expected);
}

#[test]
fn frames_stream_through_the_decoder_byte_by_byte() {
    let msgs: Vec<Message> = every_body().into_iter().map(message).collect();
    let mut stream = Vec::new();
    for msg in &msgs {
        encode_message(msg, &mut stream).unwrap();
    }
    let mut decoder = PeerDecoder::new();
    let mut got = Vec::new();
    for byte in stream {
        decoder.push(&[byte]);
        while let Some(msg) = decoder.next().unwrap() {
            got.push(msg);
        }
    }
    assert_eq!(got, msgs);
    assert_eq!(decoder.buffered(), 0);
}

#[test]
fn oversized_or_bad_headers_are_refused_at_once() {
    let too_long = ((MAX_FRAME_LEN + 1) as u32).to_be_bytes();
    assert_eq!(
        decode_frame(&too_long),
        Err(PeerError::BadLength(MAX_FRAME_LEN as u32 + 1))
    );
    assert_eq!(decode_frame(&[0, 0, 0, 1]), Err(PeerError::BadLength(1)));
    assert_eq!(decode_frame(&[0, 0, 0, 40, 2]), Err(PeerError::Version(2)));
    assert_eq!(
        decode_frame(&[0, 0, 0, 40, 1, 12]),
        Err(PeerError::Kind(12))
    );
    // A stream that claims a huge frame fails before buffering it.
    let mut decoder = PeerDecoder::new();
    decoder.push(&[0xff, 0xff, 0xff, 0xff]);
    assert!(decoder.next().is_err());
    assert_eq!(decoder.buffered(), 0);
    assert!(decoder.next().is_err(), "a failed decoder stays failed");
}

#[test]
fn malformed_payloads_are_errors() {
    let mut frame = message_to_frame(&message(MessageBody::Vote {
        last_index: 1,
        last_term: 1,
        transfer: false,
    }))
    .unwrap();
    // A bool other than 0/1.
    let last = frame.len() - 1;
    frame[last] = 2;
    assert_eq!(decode_frame(&frame), Err(PeerError::Malformed));
    // Trailing bytes inside the frame.
    let mut frame = message_to_frame(&message(MessageBody::HeartbeatResponse)).unwrap();
    frame.push(0);
    frame[3] += 1;
    assert_eq!(decode_frame(&frame), Err(PeerError::Malformed));
    // Entries not consecutive from prev_index + 1.
    let gap = message(MessageBody::Append {
        prev_index: 4,
        prev_term: 1,
        entries: vec![Entry {
            index: 6,
            term: 1,
            kind: EntryKind::Noop,
        }],
        commit: 0,
    });
    let frame = message_to_frame(&gap).unwrap();
    assert_eq!(decode_frame(&frame), Err(PeerError::Malformed));
    // A node both voter and learner.
    let mut both = config();
    both.learners.insert(id(0, 1));
    let snap = message(MessageBody::InstallSnapshot {
        meta: SnapshotMeta {
            index: 1,
            term: 1,
            config: both,
        },
        offset: 0,
        data: vec![],
        done: true,
    });
    let frame = message_to_frame(&snap).unwrap();
    assert_eq!(decode_frame(&frame), Err(PeerError::Malformed));
}

#[test]
fn messages_over_the_frame_limit_are_not_encoded() {
    let msg = message(MessageBody::InstallSnapshot {
        meta: SnapshotMeta::default(),
        offset: 0,
        data: vec![0; MAX_FRAME_LEN],
        done: false,
    });
    let mut out = vec![9];
    assert_eq!(encode_message(&msg, &mut out), Err(PeerError::TooLarge));
    assert_eq!(out, vec![9], "nothing appended on error");
}

fn arb_id() -> impl Strategy<Value = NodeId> {
    (0u8..5, 0u64..4).prop_map(|(s, g)| NodeId::new(s, g))
}

fn arb_config() -> impl Strategy<Value = Configuration> {
    (
        proptest::collection::btree_set(arb_id(), 0..5),
        proptest::collection::btree_set(arb_id(), 0..3),
    )
        .prop_map(|(voters, learners)| {
            let learners: BTreeSet<NodeId> = learners.difference(&voters).copied().collect();
            Configuration { voters, learners }
        })
}

fn arb_kind() -> impl Strategy<Value = EntryKind> {
    prop_oneof![
        Just(EntryKind::Noop),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(EntryKind::Command),
        arb_config().prop_map(EntryKind::Config),
    ]
}

/// A term, index or offset the decoder accepts (numbers at or above the
/// bound are refused; `raft_hostile.rs` covers those).
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![0..MAX_RAFT_NUMBER, Just(MAX_RAFT_NUMBER - 1)]
}

fn arb_body() -> impl Strategy<Value = MessageBody> {
    prop_oneof![
        (number(), number()).prop_map(|(last_index, last_term)| MessageBody::PreVote {
            last_index,
            last_term
        }),
        any::<bool>().prop_map(|reject| MessageBody::PreVoteResponse { reject }),
        (number(), number(), any::<bool>()).prop_map(|(last_index, last_term, transfer)| {
            MessageBody::Vote {
                last_index,
                last_term,
                transfer,
            }
        }),
        any::<bool>().prop_map(|reject| MessageBody::VoteResponse { reject }),
        (
            0u64..1_000,
            number(),
            number(),
            proptest::collection::vec((number(), arb_kind()), 0..6)
        )
            .prop_map(
                |(prev_index, prev_term, commit, entries)| MessageBody::Append {
                    prev_index,
                    prev_term,
                    entries: entries
                        .into_iter()
                        .enumerate()
                        .map(|(i, (term, kind))| Entry {
                            index: prev_index + 1 + i as u64,
                            term,
                            kind,
                        })
                        .collect(),
                    commit,
                }
            ),
        (any::<bool>(), number(), number(), number()).prop_map(
            |(reject, index, hint_index, hint_term)| MessageBody::AppendResponse {
                reject,
                index,
                hint_index,
                hint_term,
            }
        ),
        number().prop_map(|commit| MessageBody::Heartbeat { commit }),
        Just(MessageBody::HeartbeatResponse),
        (
            number(),
            number(),
            arb_config(),
            // The chunk's end (offset + len) is bounded too.
            0..MAX_RAFT_NUMBER - 64,
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<bool>()
        )
            .prop_map(|(index, term, config, offset, data, done)| {
                MessageBody::InstallSnapshot {
                    meta: SnapshotMeta {
                        index,
                        term,
                        config,
                    },
                    offset,
                    data,
                    done,
                }
            }),
        (number(), number(), any::<bool>()).prop_map(|(index, next_offset, done)| {
            MessageBody::SnapshotResponse {
                index,
                next_offset,
                done,
            }
        }),
        Just(MessageBody::TimeoutNow),
    ]
}

proptest! {
    #[test]
    fn arbitrary_messages_round_trip(from in arb_id(), to in arb_id(), term in number(), body in arb_body()) {
        let msg = Message { from, to, term, body };
        let frame = message_to_frame(&msg).unwrap();
        prop_assert_eq!(decode_frame(&frame), Ok(Some((msg, frame.len()))));
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Some((msg, used))) = decode_frame(&bytes) {
            prop_assert_eq!(message_to_frame(&msg).unwrap(), bytes[..used].to_vec());
        }
        ticketing_core::fuzzing::peer_decoder(&bytes);
    }

    #[test]
    fn corrupted_frames_never_panic(body in arb_body(), flip in any::<prop::sample::Index>(), value in any::<u8>()) {
        let mut frame = message_to_frame(&message(body)).unwrap();
        let at = flip.index(frame.len());
        frame[at] = value;
        let _ = decode_frame(&frame);
        let _ = decode_frame(&frame[..at]);
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

fn tokens() -> PeerTokens {
    PeerTokens::new([TOKEN]).unwrap()
}

/// Runs two handshakes against each other until both settle.
fn run(
    a: &mut PeerHandshake,
    ta: &PeerTokens,
    b: &mut PeerHandshake,
    tb: &PeerTokens,
) -> (PeerHandshakeStatus, PeerHandshakeStatus) {
    let mut sa = PeerHandshakeStatus::NeedMore;
    let mut sb = PeerHandshakeStatus::NeedMore;
    for _ in 0..4 {
        let to_b = a.take_outbound();
        let to_a = b.take_outbound();
        if sb == PeerHandshakeStatus::NeedMore {
            let (used, status) = b.handle_input(tb, &to_b);
            assert_eq!(used, to_b.len());
            sb = status;
        }
        if sa == PeerHandshakeStatus::NeedMore {
            let (used, status) = a.handle_input(ta, &to_a);
            assert_eq!(used, to_a.len());
            sa = status;
        }
    }
    (sa, sb)
}

fn pair(fp_b: [u8; 32], slot_b: u8, expected: Option<u8>) -> (PeerHandshake, PeerHandshake) {
    let deadline = Instant::from_millis(10_000);
    let a = PeerHandshake::new(FINGERPRINT, id(0, 1), [1; 16], expected, deadline);
    let b = PeerHandshake::new(fp_b, id(slot_b, 2), [2; 16], None, deadline);
    (a, b)
}

#[test]
fn handshake_establishes_both_directions() {
    let (mut a, mut b) = pair(FINGERPRINT, 1, Some(1));
    let (sa, sb) = run(&mut a, &tokens(), &mut b, &tokens());
    assert_eq!(sa, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sb, PeerHandshakeStatus::Established(id(0, 1)));
    assert_eq!(a.peer(), Some(id(1, 2)));
    assert_eq!(a.deadline(), None);
}

#[test]
fn handshake_rejects_wrong_token_on_both_sides() {
    let (mut a, mut b) = pair(FINGERPRINT, 1, None);
    let other = PeerTokens::new([b"another-token-abcdef"]).unwrap();
    let (sa, sb) = run(&mut a, &tokens(), &mut b, &other);
    assert_eq!(sa, PeerHandshakeStatus::Rejected(PeerReject::Proof));
    assert_eq!(sb, PeerHandshakeStatus::Rejected(PeerReject::Proof));
}

#[test]
fn rotation_accepts_any_configured_token() {
    let (mut a, mut b) = pair(FINGERPRINT, 1, None);
    let old_and_new = PeerTokens::new([b"new-token-0123456789".as_slice(), TOKEN]).unwrap();
    let (sa, sb) = run(&mut a, &old_and_new, &mut b, &tokens());
    // b proves with TOKEN, which a accepts; a proves with the new token,
    // which b does not know yet.
    assert_eq!(sa, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sb, PeerHandshakeStatus::Rejected(PeerReject::Proof));
}

#[test]
fn handshake_rejects_other_cluster_same_slot_and_wrong_dial() {
    let (mut a, mut b) = pair([8; 32], 1, None);
    assert_eq!(
        run(&mut a, &tokens(), &mut b, &tokens()).0,
        PeerHandshakeStatus::Rejected(PeerReject::Fingerprint)
    );
    let (mut a, mut b) = pair(FINGERPRINT, 0, None);
    assert_eq!(
        run(&mut a, &tokens(), &mut b, &tokens()).0,
        PeerHandshakeStatus::Rejected(PeerReject::SameSlot)
    );
    let (mut a, mut b) = pair(FINGERPRINT, 2, Some(1));
    assert_eq!(
        run(&mut a, &tokens(), &mut b, &tokens()).0,
        PeerHandshakeStatus::Rejected(PeerReject::UnexpectedSlot(2))
    );
}

#[test]
fn garbage_hello_and_timeout_reject() {
    let (mut a, _) = pair(FINGERPRINT, 1, None);
    let (used, status) = a.handle_input(&tokens(), &[0u8; PEER_HELLO_LEN + 5]);
    assert_eq!(used, PEER_HELLO_LEN);
    assert_eq!(status, PeerHandshakeStatus::Rejected(PeerReject::BadHello));
    let (mut a, _) = pair(FINGERPRINT, 1, None);
    assert!(!a.handle_timeout(Instant::from_millis(9_999)));
    assert!(a.handle_timeout(Instant::from_millis(10_000)));
    assert_eq!(
        a.handle_input(&tokens(), &[]).1,
        PeerHandshakeStatus::Rejected(PeerReject::Timeout)
    );
}

#[test]
fn a_reflected_proof_does_not_verify() {
    // An attacker without the token connects to a, replays a's own hello
    // back with another slot, and reflects a's proof: the proof binds the
    // prover's identity and the nonces by role, so it fails.
    let (mut a, _) = pair(FINGERPRINT, 1, None);
    let hello_a = PeerHello::parse(a.take_outbound()[..].try_into().unwrap()).unwrap();
    let fake = PeerHello {
        from: id(1, 2),
        ..hello_a
    };
    let (_, status) = a.handle_input(&tokens(), &fake.encode());
    assert_eq!(status, PeerHandshakeStatus::NeedMore);
    let proof_of_a = a.take_outbound();
    assert_eq!(
        proof_of_a,
        peer_proof(TOKEN, &FINGERPRINT, &hello_a, &fake).to_vec()
    );
    let (_, status) = a.handle_input(&tokens(), &proof_of_a);
    assert_eq!(status, PeerHandshakeStatus::Rejected(PeerReject::Proof));
}

#[test]
fn frames_after_the_proof_are_left_for_the_decoder() {
    let (mut a, mut b) = pair(FINGERPRINT, 1, None);
    let t = tokens();
    let hello_a = a.take_outbound();
    let (_, status) = b.handle_input(&t, &hello_a);
    assert_eq!(status, PeerHandshakeStatus::NeedMore);
    let hello_and_proof_b = b.take_outbound();
    let (_, status) = a.handle_input(&t, &hello_and_proof_b);
    assert_eq!(status, PeerHandshakeStatus::Established(id(1, 2)));
    let mut bytes = a.take_outbound();
    let frame = message_to_frame(&message(MessageBody::TimeoutNow)).unwrap();
    bytes.extend_from_slice(&frame);
    let (used, status) = b.handle_input(&t, &bytes);
    assert_eq!(status, PeerHandshakeStatus::Established(id(0, 1)));
    assert_eq!(&bytes[used..], frame.as_slice());
}

#[test]
fn peer_tokens_must_exist_and_be_long() {
    assert_eq!(
        PeerTokens::new(Vec::<&[u8]>::new()).unwrap_err(),
        PeerTokenError::Empty
    );
    assert_eq!(
        PeerTokens::new([b"short".as_slice()]).unwrap_err(),
        PeerTokenError::TooShort(0)
    );
}
