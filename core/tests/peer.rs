//! The peer protocol (version 2): sealed message framing, hostile input,
//! and the asymmetric handshake against an outsider without the peer token
//! (relay, reflection, replay, wrong role, forged and replayed frames).

use std::collections::BTreeSet;

use hmac::{Hmac, KeyInit, Mac};
use proptest::prelude::*;
use sha2::Sha256;
use ticketing_core::cluster::peer::{
    FRAME_LEN_BYTES, FRAME_LEN_MAX, FRAME_TAG_LEN, PEER_HELLO_LEN, PEER_TOKEN_LEN_MIN, PeerDecoder,
    PeerError, PeerHandshake, PeerHandshakeStatus, PeerHello, PeerIdentity, PeerReject, PeerRole,
    PeerSealer, PeerSession, PeerTokenError, PeerTokens, TOKEN_FLOOR_LIMIT, peer_proof,
    peer_session_keys,
};
use ticketing_core::raft::{
    Configuration, Entry, EntryKind, Message, MessageBody, NodeId, RAFT_NUMBER_MAX, SnapshotMeta,
};
use ticketing_core::time::Instant;

const FINGERPRINT: [u8; 32] = [7; 32];
const TOKEN: &[u8] = b"peer-token-0123456789-abcdefghijk";
const KEY: [u8; 32] = [0x42; 32];

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
                    kind: EntryKind::Command(b"\x02grant".to_vec().into()),
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
        term: RAFT_NUMBER_MAX - 1,
        body,
    }
}

fn seal(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    PeerSealer::from_key(&KEY).seal(msg, &mut out).unwrap();
    out
}

/// The tag a sealer with `key` writes at `seq` over `frame` (without tag).
fn tag_of(key: &[u8; 32], seq: u64, frame: &[u8]) -> [u8; FRAME_TAG_LEN] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
    mac.update(&seq.to_be_bytes());
    mac.update(frame);
    mac.finalize().into_bytes()[..FRAME_TAG_LEN]
        .try_into()
        .unwrap()
}

/// Rewrites the tag of a (modified) frame at sequence 0, as if whoever
/// changed it held the key: exercises the payload decoder past the MAC.
fn retag(frame: &mut [u8]) {
    let end = frame.len() - FRAME_TAG_LEN;
    let tag = tag_of(&KEY, 0, &frame[..end]);
    frame[end..].copy_from_slice(&tag);
}

/// Decodes the first frame of `bytes` with a fresh decoder under `KEY`.
fn open(bytes: &[u8]) -> Result<Option<Message>, PeerError> {
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(bytes);
    decoder.next()
}

#[test]
fn every_message_kind_round_trips() {
    for body in every_body() {
        let msg = message(body);
        let frame = seal(&msg);
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len + FRAME_LEN_BYTES, frame.len());
        assert_eq!(frame[4], 2, "frame version");
        assert_eq!(open(&frame), Ok(Some(msg.clone())));
        // Every strict prefix just needs more bytes.
        for cut in 0..frame.len() {
            assert_eq!(open(&frame[..cut]), Ok(None), "{msg:?} cut at {cut}");
        }
    }
}

#[test]
fn heartbeat_layout_is_exact() {
    let frame = seal(&message(MessageBody::Heartbeat { commit: 0x0a0b }));
    let mut expected = vec![0, 0, 0, 36 + 16, 2, 7, 1, 1, 2, 3, 4, 5, 6, 7, 8, 2];
    expected.extend_from_slice(&5u64.to_be_bytes());
    expected.extend_from_slice(&(RAFT_NUMBER_MAX - 1).to_be_bytes());
    expected.extend_from_slice(&0x0a0bu64.to_be_bytes());
    let tag = tag_of(&KEY, 0, &expected);
    expected.extend_from_slice(&tag);
    assert_eq!(frame, expected);
    // The second frame of a direction is tagged under sequence 1.
    let mut sealer = PeerSealer::from_key(&KEY);
    let mut first = Vec::new();
    sealer
        .seal(&message(MessageBody::TimeoutNow), &mut first)
        .unwrap();
    let mut second = Vec::new();
    sealer
        .seal(
            &message(MessageBody::Heartbeat { commit: 0x0a0b }),
            &mut second,
        )
        .unwrap();
    let untagged = &expected[..expected.len() - FRAME_TAG_LEN];
    assert_eq!(&second[..untagged.len()], untagged);
    assert_eq!(second[untagged.len()..], tag_of(&KEY, 1, untagged));
    assert_eq!(sealer.seq(), 2);
}

#[test]
fn frames_stream_through_the_decoder_byte_by_byte() {
    let msgs: Vec<Message> = every_body().into_iter().map(message).collect();
    let mut sealer = PeerSealer::from_key(&KEY);
    let mut stream = Vec::new();
    for msg in &msgs {
        sealer.seal(msg, &mut stream).unwrap();
    }
    let mut decoder = PeerDecoder::from_key(&KEY);
    let mut got = Vec::new();
    for byte in stream {
        decoder.push(&[byte]);
        while let Some(msg) = decoder.next().unwrap() {
            got.push(msg);
        }
    }
    assert_eq!(got, msgs);
    assert_eq!(decoder.buffered(), 0);
    assert_eq!(decoder.seq(), msgs.len() as u64);
}

#[test]
fn oversized_or_bad_headers_are_refused_at_once() {
    let too_long = ((FRAME_LEN_MAX + 1) as u32).to_be_bytes();
    assert_eq!(
        open(&too_long),
        Err(PeerError::BadLength(FRAME_LEN_MAX as u32 + 1))
    );
    // Shorter than version, kind and tag.
    assert_eq!(open(&[0, 0, 0, 17]), Err(PeerError::BadLength(17)));
    assert_eq!(open(&[0, 0, 0, 40, 1]), Err(PeerError::Version(1)));
    assert_eq!(open(&[0, 0, 0, 40, 2, 12]), Err(PeerError::Kind(12)));
    // A stream that claims a huge frame fails before buffering it.
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(&[0xff, 0xff, 0xff, 0xff]);
    assert!(decoder.next().is_err());
    assert_eq!(decoder.buffered(), 0);
    assert!(decoder.next().is_err(), "a failed decoder stays failed");
}

#[test]
fn malformed_payloads_behind_a_valid_tag_are_errors() {
    let mut frame = seal(&message(MessageBody::Vote {
        last_index: 1,
        last_term: 1,
        transfer: false,
    }));
    // A bool other than 0/1.
    let last = frame.len() - FRAME_TAG_LEN - 1;
    frame[last] = 2;
    assert_eq!(open(&frame), Err(PeerError::BadTag), "untouched tag");
    retag(&mut frame);
    assert_eq!(open(&frame), Err(PeerError::Malformed));
    // Trailing bytes inside the frame.
    let mut frame = seal(&message(MessageBody::HeartbeatResponse));
    frame.insert(frame.len() - FRAME_TAG_LEN, 0);
    frame[3] += 1;
    retag(&mut frame);
    assert_eq!(open(&frame), Err(PeerError::Malformed));
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
    assert_eq!(open(&seal(&gap)), Err(PeerError::Malformed));
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
    assert_eq!(open(&seal(&snap)), Err(PeerError::Malformed));
}

#[test]
fn messages_over_the_frame_limit_are_not_sealed() {
    let msg = message(MessageBody::InstallSnapshot {
        meta: SnapshotMeta::default(),
        offset: 0,
        // Fits without the tag, not with it (75 bytes of header, body
        // fields and tag around the data).
        data: vec![0; FRAME_LEN_MAX - 65],
        done: false,
    });
    let mut sealer = PeerSealer::from_key(&KEY);
    let mut out = vec![9];
    assert_eq!(sealer.seal(&msg, &mut out), Err(PeerError::TooLarge));
    assert_eq!(out, vec![9], "nothing appended on error");
    assert_eq!(sealer.seq(), 0, "the sequence number did not move");
    let fits = message(MessageBody::InstallSnapshot {
        meta: SnapshotMeta::default(),
        offset: 0,
        data: vec![0; FRAME_LEN_MAX - 75],
        done: false,
    });
    let mut out = vec![9];
    sealer.seal(&fits, &mut out).unwrap();
    assert_eq!(
        out.len() - 1,
        FRAME_LEN_BYTES + FRAME_LEN_MAX,
        "exactly the limit"
    );
}

#[test]
fn a_tampered_frame_is_refused_before_decoding() {
    let msg = message(MessageBody::InstallSnapshot {
        meta: SnapshotMeta {
            index: 100,
            term: 3,
            config: config(),
        },
        offset: 0,
        data: vec![1, 2, 3, 4],
        done: true,
    });
    let frame = seal(&msg);
    assert_eq!(open(&frame), Ok(Some(msg)));
    // One bit flipped in the payload.
    let mut payload = frame.clone();
    payload[FRAME_LEN_BYTES + 30] ^= 0x01;
    assert_eq!(open(&payload), Err(PeerError::BadTag));
    // One bit flipped in the tag.
    let mut tag = frame.clone();
    *tag.last_mut().unwrap() ^= 0x80;
    assert_eq!(open(&tag), Err(PeerError::BadTag));
    // One bit flipped in the length: shorter frames fail their tag...
    let low = frame[3];
    let set_bit = (0..8).map(|b| 1u8 << b).find(|m| low & m != 0).unwrap();
    let clear_bit = (0..8).map(|b| 1u8 << b).find(|m| low & m == 0).unwrap();
    let mut shorter = frame.clone();
    shorter[3] ^= set_bit;
    assert!(u32::from_be_bytes(shorter[..4].try_into().unwrap()) < frame.len() as u32 - 4);
    assert_eq!(open(&shorter), Err(PeerError::BadTag));
    // ...longer ones wait for their bytes, then fail it too.
    let mut longer = frame.clone();
    longer[3] ^= clear_bit;
    assert!(u32::from_be_bytes(longer[..4].try_into().unwrap()) > frame.len() as u32 - 4);
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(&longer);
    assert_eq!(decoder.next(), Ok(None));
    decoder.push(&[0; 128]);
    assert_eq!(decoder.next(), Err(PeerError::BadTag));
    // The top bit of the length: out of range at once.
    let mut huge = frame;
    huge[0] ^= 0x80;
    assert!(matches!(open(&huge), Err(PeerError::BadLength(_))));
}

#[test]
fn frames_replayed_or_reordered_within_a_connection_are_refused() {
    let mut sealer = PeerSealer::from_key(&KEY);
    let (mut f0, mut f1) = (Vec::new(), Vec::new());
    sealer
        .seal(&message(MessageBody::Heartbeat { commit: 1 }), &mut f0)
        .unwrap();
    sealer
        .seal(&message(MessageBody::Heartbeat { commit: 2 }), &mut f1)
        .unwrap();
    // Replayed: the second copy is tagged for sequence 0, expected 1.
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(&f0);
    decoder.push(&f0);
    assert!(decoder.next().unwrap().is_some());
    assert_eq!(decoder.next(), Err(PeerError::BadTag));
    // Reordered.
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(&f1);
    assert_eq!(decoder.next(), Err(PeerError::BadTag));
    // In order.
    let mut decoder = PeerDecoder::from_key(&KEY);
    decoder.push(&f0);
    decoder.push(&f1);
    assert!(decoder.next().unwrap().is_some());
    assert!(decoder.next().unwrap().is_some());
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

fn tokens() -> PeerTokens {
    PeerTokens::new([TOKEN]).unwrap()
}

fn identity(slot: u8, generation: u64) -> PeerIdentity {
    PeerIdentity {
        fingerprint: FINGERPRINT,
        id: id(slot, generation),
        slot_count: 3,
        token_floor: 1_000 + u64::from(slot),
    }
}

const DEADLINE: Instant = Instant::from_millis(10_000);

fn dialer(slot: u8, dials: u8, nonce: u8) -> PeerHandshake {
    PeerHandshake::new(identity(slot, 1), [nonce; 16], Some(dials), DEADLINE)
}

fn acceptor(slot: u8, nonce: u8) -> PeerHandshake {
    PeerHandshake::new(identity(slot, 2), [nonce; 16], None, DEADLINE)
}

/// Runs two handshakes against each other until both settle; returns their
/// statuses and every byte each one emitted.
fn run(
    d: &mut PeerHandshake,
    td: &PeerTokens,
    a: &mut PeerHandshake,
    ta: &PeerTokens,
) -> (PeerHandshakeStatus, PeerHandshakeStatus, Vec<u8>, Vec<u8>) {
    let (mut sd, mut sa) = (PeerHandshakeStatus::NeedMore, PeerHandshakeStatus::NeedMore);
    let (mut from_d, mut from_a) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let to_a = d.take_outbound();
        let to_d = a.take_outbound();
        from_d.extend_from_slice(&to_a);
        from_a.extend_from_slice(&to_d);
        if sa == PeerHandshakeStatus::NeedMore {
            let (used, status) = a.handle_input(ta, &to_a);
            assert_eq!(used, to_a.len());
            sa = status;
        }
        if sd == PeerHandshakeStatus::NeedMore {
            let (used, status) = d.handle_input(td, &to_d);
            assert_eq!(used, to_d.len());
            sd = status;
        }
    }
    (sd, sa, from_d, from_a)
}

/// An established dialer (slot 0) and acceptor (slot 1) with their sessions.
fn established(nonce_d: u8, nonce_a: u8) -> (PeerSession, PeerSession) {
    let (mut d, mut a) = (dialer(0, 1, nonce_d), acceptor(1, nonce_a));
    let (sd, sa, _, _) = run(&mut d, &tokens(), &mut a, &tokens());
    assert_eq!(sd, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sa, PeerHandshakeStatus::Established(id(0, 1)));
    (d.take_session().unwrap(), a.take_session().unwrap())
}

/// Sends `msg` over `from`'s sealer into `to`'s decoder.
fn send(
    from: &mut PeerSession,
    to: &mut PeerSession,
    msg: &Message,
) -> Result<Option<Message>, PeerError> {
    let mut bytes = Vec::new();
    from.sealer.seal(msg, &mut bytes).unwrap();
    to.decoder.push(&bytes);
    to.decoder.next()
}

fn hello_bytes(bytes: &[u8]) -> [u8; PEER_HELLO_LEN] {
    bytes[..PEER_HELLO_LEN].try_into().unwrap()
}

#[test]
fn handshake_establishes_both_directions_with_working_sessions() {
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let (sd, sa, from_d, from_a) = run(&mut d, &tokens(), &mut a, &tokens());
    assert_eq!(sd, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sa, PeerHandshakeStatus::Established(id(0, 1)));
    assert_eq!(d.peer(), Some(id(1, 2)));
    assert_eq!(d.deadline(), None);
    assert_eq!((d.role(), a.role()), (PeerRole::Dialer, PeerRole::Acceptor));
    // Each side sent its hello and one proof, in the documented form.
    assert_eq!(from_d.len(), PEER_HELLO_LEN + 32);
    assert_eq!(from_a.len(), PEER_HELLO_LEN + 32);
    let (hd, ha) = (hello_bytes(&from_d), hello_bytes(&from_a));
    assert_eq!(hd[42], 0, "dialer role byte");
    assert_eq!(ha[42], 1, "acceptor role byte");
    let pd = peer_proof(TOKEN, PeerRole::Dialer, &hd, &ha);
    let pa = peer_proof(TOKEN, PeerRole::Acceptor, &hd, &ha);
    assert_eq!(from_d[PEER_HELLO_LEN..], pd);
    assert_eq!(from_a[PEER_HELLO_LEN..], pa);
    // Token floors arrive with the authenticated hello.
    assert_eq!(d.peer_hello().unwrap().token_floor, 1_001);
    assert_eq!(a.peer_hello().unwrap().token_floor, 1_000);
    // Keys as documented; the sessions work both ways.
    let (d2a, a2d) = peer_session_keys(TOKEN, &hd, &ha, &pd, &pa);
    assert_ne!(d2a, a2d);
    let (mut sd, mut sa) = (d.take_session().unwrap(), a.take_session().unwrap());
    assert!(d.take_session().is_none(), "keys are given out once");
    let msg = message(MessageBody::Heartbeat { commit: 3 });
    assert_eq!(send(&mut sd, &mut sa, &msg), Ok(Some(msg.clone())));
    assert_eq!(send(&mut sa, &mut sd, &msg), Ok(Some(msg.clone())));
    let mut expected = Vec::new();
    PeerSealer::from_key(&d2a)
        .seal(&msg, &mut expected)
        .unwrap();
    let mut sealed = Vec::new();
    PeerSealer::from_key(&d2a).seal(&msg, &mut sealed).unwrap();
    let mut decoder = PeerDecoder::from_key(&d2a);
    decoder.push(&sealed);
    assert_eq!(decoder.next(), Ok(Some(msg)));
    assert_eq!(sealed, expected);
}

#[test]
fn the_acceptor_sends_nothing_but_its_hello_before_the_dialer_proved() {
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let hello_d = d.take_outbound();
    let hello_a = a.take_outbound();
    assert_eq!(
        (hello_d.len(), hello_a.len()),
        (PEER_HELLO_LEN, PEER_HELLO_LEN)
    );
    assert_eq!(
        a.handle_input(&tokens(), &hello_d).1,
        PeerHandshakeStatus::NeedMore
    );
    assert!(a.take_outbound().is_empty(), "no proof before the dialer's");
    // The dialer proves as soon as it has the acceptor's hello.
    assert_eq!(
        d.handle_input(&tokens(), &hello_a).1,
        PeerHandshakeStatus::NeedMore
    );
    let proof_d = d.take_outbound();
    assert_eq!(proof_d.len(), 32);
    assert_eq!(
        a.handle_input(&tokens(), &proof_d).1,
        PeerHandshakeStatus::Established(id(0, 1))
    );
    assert_eq!(a.take_outbound().len(), 32, "now the acceptor's proof");
}

#[test]
fn wrong_token_gets_no_proof_and_is_rejected() {
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let other = PeerTokens::new([b"another-token-abcdef-0123456789abc"]).unwrap();
    let (sd, sa, _, from_a) = run(&mut d, &other, &mut a, &tokens());
    assert_eq!(sa, PeerHandshakeStatus::Rejected(PeerReject::Proof));
    assert_eq!(
        sd,
        PeerHandshakeStatus::NeedMore,
        "the dialer waits for a proof that never comes"
    );
    assert_eq!(
        from_a.len(),
        PEER_HELLO_LEN,
        "the acceptor sent only its hello"
    );
    assert!(a.take_session().is_none());
}

#[test]
fn rotation_the_acceptor_answers_with_the_token_that_matched() {
    let new: &[u8] = b"new-token-0123456789-abcdefghijklm";
    let new_and_old = PeerTokens::new([new, TOKEN]).unwrap();
    // Acceptor already on [new, old], dialer still on [old].
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let (sd, sa, from_d, from_a) = run(&mut d, &tokens(), &mut a, &new_and_old);
    assert_eq!(sd, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sa, PeerHandshakeStatus::Established(id(0, 1)));
    let (hd, ha) = (hello_bytes(&from_d), hello_bytes(&from_a));
    assert_eq!(
        from_a[PEER_HELLO_LEN..],
        peer_proof(TOKEN, PeerRole::Acceptor, &hd, &ha),
        "proved with the old token, the one that matched"
    );
    let (mut sd, mut sa) = (d.take_session().unwrap(), a.take_session().unwrap());
    let msg = message(MessageBody::TimeoutNow);
    assert_eq!(send(&mut sd, &mut sa, &msg), Ok(Some(msg.clone())));
    assert_eq!(send(&mut sa, &mut sd, &msg), Ok(Some(msg)));
    // A dialer on [new, old] reaches an acceptor on [new, old] (step 2 of
    // the rotation)...
    let (mut d, mut a) = (dialer(0, 1, 3), acceptor(1, 4));
    let (sd, sa, _, _) = run(&mut d, &new_and_old, &mut a, &new_and_old);
    assert_eq!(sd, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(sa, PeerHandshakeStatus::Established(id(0, 1)));
    // ...but not one that does not accept the new token yet: why every
    // node must accept it before any proves with it.
    let (mut d, mut a) = (dialer(0, 1, 5), acceptor(1, 6));
    let (_, sa, _, _) = run(&mut d, &new_and_old, &mut a, &tokens());
    assert_eq!(sa, PeerHandshakeStatus::Rejected(PeerReject::Proof));
}

#[test]
fn handshake_rejects_bad_hellos() {
    let check = |d: &mut PeerHandshake, a: &mut PeerHandshake| run(d, &tokens(), a, &tokens());
    // Another cluster.
    let mut other = identity(1, 2);
    other.fingerprint = [8; 32];
    let mut a = PeerHandshake::new(other, [2; 16], None, DEADLINE);
    let (sd, _, _, _) = check(&mut dialer(0, 1, 1), &mut a);
    assert_eq!(sd, PeerHandshakeStatus::Rejected(PeerReject::Fingerprint));
    // Own slot.
    let (sd, sa, _, _) = check(&mut dialer(0, 0, 1), &mut acceptor(0, 2));
    assert_eq!(sd, PeerHandshakeStatus::Rejected(PeerReject::SameSlot));
    assert_eq!(sa, PeerHandshakeStatus::Rejected(PeerReject::SameSlot));
    // Not the slot dialed.
    let (sd, _, _, _) = check(&mut dialer(0, 1, 1), &mut acceptor(2, 2));
    assert_eq!(
        sd,
        PeerHandshakeStatus::Rejected(PeerReject::UnexpectedSlot(2))
    );
    // A slot outside the cluster, on both ends.
    let mut outside = identity(3, 1);
    outside.slot_count = 5;
    let mut d = PeerHandshake::new(outside, [1; 16], Some(1), DEADLINE);
    let (_, sa, _, from_a) = check(&mut d, &mut acceptor(1, 2));
    assert_eq!(
        sa,
        PeerHandshakeStatus::Rejected(PeerReject::SlotOutOfRange(3))
    );
    assert_eq!(from_a.len(), PEER_HELLO_LEN);
    let mut a = PeerHandshake::new(outside, [2; 16], None, DEADLINE);
    let (sd, _, _, _) = check(&mut dialer(0, 3, 1), &mut a);
    assert_eq!(
        sd,
        PeerHandshakeStatus::Rejected(PeerReject::SlotOutOfRange(3))
    );
    // Two dialers, two acceptors.
    let (sd, sa, _, _) = check(&mut dialer(0, 1, 1), &mut dialer(1, 0, 2));
    assert_eq!(sd, PeerHandshakeStatus::Rejected(PeerReject::Role));
    assert_eq!(sa, PeerHandshakeStatus::Rejected(PeerReject::Role));
    let (sd, _, _, _) = check(&mut acceptor(0, 1), &mut acceptor(1, 2));
    assert_eq!(sd, PeerHandshakeStatus::Rejected(PeerReject::Role));
    // An impossible token floor.
    let mut a = acceptor(1, 2);
    let mut hello = PeerHello::parse(&hello_bytes(&dialer(0, 1, 1).take_outbound())).unwrap();
    hello.token_floor = TOKEN_FLOOR_LIMIT;
    let (_, status) = a.handle_input(&tokens(), &hello.encode());
    assert_eq!(
        status,
        PeerHandshakeStatus::Rejected(PeerReject::TokenFloor)
    );
    hello.token_floor = TOKEN_FLOOR_LIMIT - 1;
    let (_, status) = acceptor(1, 2).handle_input(&tokens(), &hello.encode());
    assert_eq!(status, PeerHandshakeStatus::NeedMore);
}

#[test]
fn garbage_hello_and_timeout_reject() {
    let mut a = acceptor(1, 2);
    let (used, status) = a.handle_input(&tokens(), &[0u8; PEER_HELLO_LEN + 5]);
    assert_eq!(used, PEER_HELLO_LEN);
    assert_eq!(status, PeerHandshakeStatus::Rejected(PeerReject::BadHello));
    // A role byte other than 0/1.
    let mut bytes = dialer(0, 1, 1).take_outbound();
    bytes[42] = 2;
    let (_, status) = acceptor(1, 2).handle_input(&tokens(), &bytes);
    assert_eq!(status, PeerHandshakeStatus::Rejected(PeerReject::BadHello));
    let mut a = acceptor(1, 2);
    assert!(!a.handle_timeout(Instant::from_millis(9_999)));
    assert!(a.handle_timeout(Instant::from_millis(10_000)));
    assert_eq!(
        a.handle_input(&tokens(), &[]).1,
        PeerHandshakeStatus::Rejected(PeerReject::Timeout)
    );
}

/// The relay attack on the peer handshake: an outsider dials leader L claiming to be
/// follower F and dials F claiming to be L, shuttling hellos. Both honest
/// sides are acceptors, so neither ever proves first: the outsider has no
/// proof to relay and nobody accepts it.
#[test]
fn relay_attack_gets_no_proof_and_no_acceptance() {
    let t = tokens();
    let mut leader = acceptor(0, 0xA0);
    let mut follower = acceptor(1, 0xF0);
    let leader_hello = leader.take_outbound();
    let follower_hello = follower.take_outbound();
    let (hl, hf) = (
        PeerHello::parse(&hello_bytes(&leader_hello)).unwrap(),
        PeerHello::parse(&hello_bytes(&follower_hello)).unwrap(),
    );
    // To L: "I am F, dialing" with F's nonce; to F: "I am L, dialing" with L's.
    let as_follower = PeerHello {
        role: PeerRole::Dialer,
        ..hf
    };
    let as_leader = PeerHello {
        role: PeerRole::Dialer,
        ..hl
    };
    assert_eq!(
        leader.handle_input(&t, &as_follower.encode()).1,
        PeerHandshakeStatus::NeedMore
    );
    assert_eq!(
        follower.handle_input(&t, &as_leader.encode()).1,
        PeerHandshakeStatus::NeedMore
    );
    // Neither emits anything beyond its hello: nothing to shuttle.
    assert!(leader.take_outbound().is_empty());
    assert!(follower.take_outbound().is_empty());
    // What the outsider can send as a proof: the hellos' bytes, or guesses.
    let guess = [0u8; 32];
    assert_eq!(
        leader.handle_input(&t, &guess).1,
        PeerHandshakeStatus::Rejected(PeerReject::Proof)
    );
    assert_eq!(
        follower.handle_input(&t, &leader_hello[..32]).1,
        PeerHandshakeStatus::Rejected(PeerReject::Proof)
    );
    assert!(leader.take_outbound().is_empty());
    assert!(follower.take_outbound().is_empty());
    assert!(leader.take_session().is_none() && follower.take_session().is_none());
    // Relaying the acceptor hellos unchanged fails at once on the role.
    let mut leader = acceptor(0, 0xA1);
    let mut follower = acceptor(1, 0xF1);
    let follower_hello = follower.take_outbound();
    assert_eq!(
        leader.handle_input(&t, &follower_hello).1,
        PeerHandshakeStatus::Rejected(PeerReject::Role)
    );
}

/// When an honest node dials and the outsider sits on the path, all it can
/// do is forward: the two honest nodes authenticate each other end to end
/// and a frame the outsider writes into the stream is refused.
#[test]
fn an_outsider_in_the_middle_can_only_forward() {
    let t = tokens();
    let mut follower = dialer(1, 0, 0xF2);
    let mut leader = acceptor(0, 0xA2);
    let (sf, sl, _, _) = run(&mut follower, &t, &mut leader, &t);
    assert_eq!(sf, PeerHandshakeStatus::Established(id(0, 2)));
    assert_eq!(sl, PeerHandshakeStatus::Established(id(1, 1)));
    let mut at_leader = leader.take_session().unwrap();
    // Forged InstallSnapshot with a low next_token, sealed under a key the
    // outsider can make up (it has no token to derive the real one).
    let forged = Message {
        from: id(1, 1),
        to: id(0, 2),
        term: 99,
        body: MessageBody::InstallSnapshot {
            meta: SnapshotMeta {
                index: 1_000,
                term: 99,
                config: config(),
            },
            offset: 0,
            data: b"next_token=1000".to_vec(),
            done: true,
        },
    };
    let mut bytes = Vec::new();
    PeerSealer::from_key(&[0; 32])
        .seal(&forged, &mut bytes)
        .unwrap();
    at_leader.decoder.push(&bytes);
    assert_eq!(at_leader.decoder.next(), Err(PeerError::BadTag));
}

#[test]
fn a_reflected_proof_does_not_verify() {
    // The outsider answers a dialer as if it were slot 1 and sends the
    // dialer's own proof back as the acceptor's: the role label differs.
    let t = tokens();
    let mut d = dialer(0, 1, 1);
    let hello_d = d.take_outbound();
    let fake = PeerHello {
        role: PeerRole::Acceptor,
        from: id(1, 2),
        ..PeerHello::parse(&hello_bytes(&hello_d)).unwrap()
    };
    assert_eq!(
        d.handle_input(&t, &fake.encode()).1,
        PeerHandshakeStatus::NeedMore
    );
    let proof_d = d.take_outbound();
    assert_eq!(
        proof_d,
        peer_proof(
            TOKEN,
            PeerRole::Dialer,
            &hello_bytes(&hello_d),
            &fake.encode()
        )
        .to_vec()
    );
    assert_eq!(
        d.handle_input(&t, &proof_d).1,
        PeerHandshakeStatus::Rejected(PeerReject::Proof)
    );
}

#[test]
fn a_recorded_handshake_replayed_on_a_new_connection_is_rejected() {
    let t = tokens();
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let (_, sa, from_d, _) = run(&mut d, &t, &mut a, &t);
    assert_eq!(sa, PeerHandshakeStatus::Established(id(0, 1)));
    // The same acceptor node, a new connection (fresh nonce).
    let mut again = acceptor(1, 3);
    let (used, status) = again.handle_input(&t, &from_d);
    assert_eq!(used, from_d.len());
    assert_eq!(status, PeerHandshakeStatus::Rejected(PeerReject::Proof));
    assert_eq!(
        again.take_outbound().len(),
        PEER_HELLO_LEN,
        "only its hello"
    );
}

#[test]
fn an_acceptors_proof_presented_as_a_dialers_is_rejected() {
    let t = tokens();
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let (_, _, from_d, from_a) = run(&mut d, &t, &mut a, &t);
    let proof_a = &from_a[PEER_HELLO_LEN..];
    // Even with the very same hellos (an acceptor reusing its nonce), the
    // acceptor's proof is not a dialer's.
    let mut twin = acceptor(1, 2);
    let _ = twin.take_outbound();
    let (_, status) = twin.handle_input(&t, &from_d[..PEER_HELLO_LEN]);
    assert_eq!(status, PeerHandshakeStatus::NeedMore);
    assert_eq!(
        twin.handle_input(&t, proof_a).1,
        PeerHandshakeStatus::Rejected(PeerReject::Proof)
    );
    // Control: the dialer's proof over those hellos does verify there.
    let mut twin = acceptor(1, 2);
    assert_eq!(
        twin.handle_input(&t, &from_d).1,
        PeerHandshakeStatus::Established(id(0, 1))
    );
}

#[test]
fn frames_from_another_connection_or_reflected_are_refused() {
    let (mut d1, mut a1) = established(1, 2);
    let (_, mut a2) = established(3, 4);
    let msg = message(MessageBody::Heartbeat { commit: 7 });
    let mut bytes = Vec::new();
    d1.sealer.seal(&msg, &mut bytes).unwrap();
    // Same sequence number, another connection's key.
    a2.decoder.push(&bytes);
    assert_eq!(a2.decoder.next(), Err(PeerError::BadTag));
    // Reflected to its sender: the other direction's key.
    d1.decoder.push(&bytes);
    assert_eq!(d1.decoder.next(), Err(PeerError::BadTag));
    // Where it belongs.
    a1.decoder.push(&bytes);
    assert_eq!(a1.decoder.next(), Ok(Some(msg)));
}

#[test]
fn frames_after_the_proof_are_left_for_the_decoder() {
    let t = tokens();
    let (mut d, mut a) = (dialer(0, 1, 1), acceptor(1, 2));
    let hello_d = d.take_outbound();
    assert_eq!(
        a.handle_input(&t, &hello_d).1,
        PeerHandshakeStatus::NeedMore
    );
    let hello_a = a.take_outbound();
    assert_eq!(
        d.handle_input(&t, &hello_a).1,
        PeerHandshakeStatus::NeedMore
    );
    let proof_d = d.take_outbound();
    assert_eq!(
        a.handle_input(&t, &proof_d).1,
        PeerHandshakeStatus::Established(id(0, 1))
    );
    // The acceptor's proof and its first frame arrive together.
    let mut session_a = a.take_session().unwrap();
    let mut bytes = a.take_outbound();
    let msg = message(MessageBody::TimeoutNow);
    let frame_start = bytes.len();
    session_a.sealer.seal(&msg, &mut bytes).unwrap();
    let (used, status) = d.handle_input(&t, &bytes);
    assert_eq!(status, PeerHandshakeStatus::Established(id(1, 2)));
    assert_eq!(used, frame_start);
    let mut session_d = d.take_session().unwrap();
    session_d.decoder.push(&bytes[used..]);
    assert_eq!(session_d.decoder.next(), Ok(Some(msg)));
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
    // A client token's 16 bytes are not enough for a peer: a proof sent to
    // a port squatter is an offline guessing oracle against the token.
    let one_short = [b'k'; PEER_TOKEN_LEN_MIN - 1];
    assert_eq!(PEER_TOKEN_LEN_MIN, 32);
    assert_eq!(
        PeerTokens::new([TOKEN, one_short.as_slice()]).unwrap_err(),
        PeerTokenError::TooShort(1)
    );
    assert!(PeerTokens::new([[b'k'; PEER_TOKEN_LEN_MIN]]).is_ok());
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
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|bytes| EntryKind::Command(bytes.into())),
        arb_config().prop_map(EntryKind::Config),
    ]
}

/// A term, index or offset the decoder accepts (numbers at or above the
/// bound are refused; `raft_hostile.rs` covers those).
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![0..RAFT_NUMBER_MAX, Just(RAFT_NUMBER_MAX - 1)]
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
            0..RAFT_NUMBER_MAX - 64,
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
        prop_assert_eq!(open(&seal(&msg)), Ok(Some(msg)));
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        prop_assert!(!matches!(open(&bytes), Ok(Some(_))), "garbage never carries a valid tag");
        ticketing_core::testing::fuzzing::peer_decoder(&bytes);
    }

    #[test]
    fn corrupted_frames_never_decode(body in arb_body(), flip in any::<prop::sample::Index>(), value in any::<u8>()) {
        let frame = seal(&message(body));
        let at = flip.index(frame.len());
        prop_assume!(frame[at] != value);
        let mut corrupted = frame.clone();
        corrupted[at] = value;
        // A changed byte never yields a message, whatever follows.
        let mut decoder = PeerDecoder::from_key(&KEY);
        decoder.push(&corrupted);
        decoder.push(&frame);
        prop_assert!(!matches!(decoder.next(), Ok(Some(_))));
        let _ = open(&corrupted[..at]);
    }
}
