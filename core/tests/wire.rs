//! Client protocol v3 codec: exact bytes, validation order, fatal framing
//! errors, incremental decoding under arbitrary splits.

use proptest::prelude::*;
use ticketing_core::wire::*;

// ---------------------------------------------------------------- helpers

fn key(text: &str) -> Key {
    Key::new(text.as_bytes()).expect("test key is valid")
}

fn group(keys: &[&str]) -> KeyGroup {
    KeyGroup::new(keys.iter().map(|k| key(k)).collect()).expect("test group is valid")
}

fn acquire(rid: u64, wait_s: u8, lease_s: u8, keys: &[&str], set: bool) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: group(keys),
        set,
    })
}

fn release(rid: u64, token: u64, keys: &[&str], set: bool) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: group(keys),
        set,
    })
}

/// `[op][body_len][body]` with the body's true length.
fn frame(op: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![op];
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Set records: `count · count × (len · key)`.
fn records(keys: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![keys.len() as u8];
    for k in keys {
        out.push(k.len() as u8);
        out.extend_from_slice(k);
    }
    out
}

/// A body: `rid · wait · lease · key`.
fn a_body(rid: u64, wait_s: u8, lease_s: u8, key: &[u8]) -> Vec<u8> {
    [&rid.to_be_bytes()[..], &[wait_s, lease_s], key].concat()
}

/// R body: `rid · token · key`.
fn r_body(rid: u64, token: u64, key: &[u8]) -> Vec<u8> {
    [&rid.to_be_bytes()[..], &token.to_be_bytes(), key].concat()
}

/// S body: the A layout with set records in place of the key.
fn s_body(rid: u64, wait_s: u8, lease_s: u8, recs: &[u8]) -> Vec<u8> {
    a_body(rid, wait_s, lease_s, recs)
}

/// G body: the R layout with set records in place of the key.
fn g_body(rid: u64, token: u64, recs: &[u8]) -> Vec<u8> {
    r_body(rid, token, recs)
}

/// A fresh decoder given `chunks`, one push each.
fn fed(chunks: &[&[u8]]) -> RequestDecoder {
    let mut decoder = RequestDecoder::new();
    for chunk in chunks {
        decoder.push(chunk);
    }
    decoder
}

/// Decodes one complete frame through a fresh decoder and checks it used
/// every byte.
fn decode_one(bytes: &[u8]) -> Result<Decoded, FrameError> {
    let mut decoder = RequestDecoder::new();
    decoder.push(bytes);
    let decoded = decoder.next()?.expect("a complete frame");
    assert_eq!(decoder.buffered(), 0, "the whole frame is consumed");
    Ok(decoded)
}

fn rejected(bytes: &[u8]) -> (u64, RequestKind, ErrorCode) {
    match decode_one(bytes) {
        Ok(Decoded::Rejected { rid, kind, code }) => (rid, kind, code),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn code_of(bytes: &[u8]) -> ErrorCode {
    rejected(bytes).2
}

fn long_key(len: usize) -> Vec<u8> {
    vec![b'k'; len]
}

/// The longest key (128 bytes) and the largest set: 16 distinct keys of
/// 128 bytes.
fn largest_keys() -> (String, Vec<String>) {
    let key_max = String::from_utf8(long_key(128)).unwrap();
    let set_max = (0..16u8)
        .map(|i| {
            let mut k = long_key(127);
            k.push(b'a' + i);
            String::from_utf8(k).unwrap()
        })
        .collect();
    (key_max, set_max)
}

// ------------------------------------------------------- kinds and tables

#[test]
fn request_ops_map_both_ways() {
    for (kind, op) in [
        (RequestKind::Acquire, b'A'),
        (RequestKind::Release, b'R'),
        (RequestKind::AcquireSet, b'S'),
        (RequestKind::ReleaseSet, b'G'),
        (RequestKind::Negotiate, b'X'),
    ] {
        assert_eq!(kind.op(), op);
        assert_eq!(RequestKind::from_op(op, Capabilities::NONE), Some(kind));
    }
    assert_eq!(RequestKind::Extend.op(), b'W');
    assert_eq!(
        RequestKind::from_op(b'W', Capabilities::EXTEND),
        Some(RequestKind::Extend)
    );
    // A connection that negotiated nothing (every published client) knows
    // the four v3 ops and `X`, and nothing else.
    let request_ops = [b'A', b'R', b'S', b'G', b'X'];
    for op in 0..=u8::MAX {
        if !request_ops.contains(&op) {
            assert_eq!(
                RequestKind::from_op(op, Capabilities::NONE),
                None,
                "op {op}"
            );
        }
    }
}

#[test]
fn fixed_and_max_body_lengths_match_the_protocol() {
    let expected = [
        (RequestKind::Acquire, 10, 138),
        (RequestKind::Release, 16, 144),
        (RequestKind::AcquireSet, 11, 2075),
        (RequestKind::ReleaseSet, 17, 2081),
    ];
    for (kind, fixed, max) in expected {
        assert_eq!(kind.fixed_body_len(), fixed, "{kind:?}");
        assert_eq!(kind.body_len_max(), max, "{kind:?}");
    }
}

#[test]
fn error_codes_map_from_bytes() {
    let all = [
        (1, ErrorCode::BadKey),
        (2, ErrorCode::BadLease),
        (3, ErrorCode::NotActive),
        (4, ErrorCode::NoLeader),
        (5, ErrorCode::BadKeySet),
        (6, ErrorCode::GroupMismatch),
        (7, ErrorCode::BadToken),
        (8, ErrorCode::BadExtension),
        (9, ErrorCode::BadPermits),
        (10, ErrorCode::BadModes),
    ];
    for (byte, code) in all {
        assert_eq!(ErrorCode::from_u8(byte), Some(code));
        assert_eq!(code as u8, byte);
    }
    assert_eq!(ErrorCode::from_u8(0), None);
    assert_eq!(ErrorCode::from_u8(11), None);
    assert_eq!(ErrorCode::from_u8(0xFF), None);
}

const KINDS: [RequestKind; 4] = [
    RequestKind::Acquire,
    RequestKind::Release,
    RequestKind::AcquireSet,
    RequestKind::ReleaseSet,
];

#[test]
fn error_codes_answer_only_their_kinds() {
    use RequestKind::*;
    let table: [(ErrorCode, &[RequestKind]); 7] = [
        (
            ErrorCode::BadKey,
            &[Acquire, Release, AcquireSet, ReleaseSet],
        ),
        (ErrorCode::BadLease, &[Acquire, AcquireSet]),
        (
            ErrorCode::NotActive,
            &[Acquire, Release, AcquireSet, ReleaseSet],
        ),
        (
            ErrorCode::NoLeader,
            &[Acquire, Release, AcquireSet, ReleaseSet],
        ),
        (ErrorCode::BadKeySet, &[AcquireSet, ReleaseSet]),
        (ErrorCode::GroupMismatch, &[Release, ReleaseSet]),
        (ErrorCode::BadToken, &[Release, ReleaseSet]),
    ];
    for (code, allowed) in table {
        for kind in KINDS {
            assert_eq!(
                code.allowed_for(kind),
                allowed.contains(&kind),
                "{code:?} for {kind:?}"
            );
        }
    }
}

#[test]
fn replies_answer_only_their_kinds() {
    use RequestKind::*;
    let table: [(Reply, &[RequestKind]); 11] = [
        (Reply::Acquired { rid: 1, token: 1 }, &[Acquire]),
        (Reply::AcquiredSet { rid: 1, token: 1 }, &[AcquireSet]),
        (Reply::Released { rid: 1 }, &[Release]),
        (Reply::ReleasedSet { rid: 1 }, &[ReleaseSet]),
        (Reply::NotFound { rid: 1 }, &[Release, ReleaseSet]),
        (Reply::TimedOut { rid: 1 }, &[Acquire, AcquireSet]),
        (Reply::Busy { rid: 1 }, &[Acquire, AcquireSet]),
        (
            Reply::Indeterminate { rid: 1 },
            &[Acquire, Release, AcquireSet, ReleaseSet],
        ),
        (
            Reply::Moved {
                rid: 1,
                leader_slot: 0,
            },
            &[Acquire, Release, AcquireSet, ReleaseSet],
        ),
        (
            Reply::Error {
                rid: 1,
                code: ErrorCode::BadLease,
            },
            &[Acquire, AcquireSet],
        ),
        (Reply::Leader { leader_slot: 0 }, &[]),
    ];
    for (reply, allowed) in table {
        for kind in KINDS {
            assert_eq!(
                reply.answers(kind),
                allowed.contains(&kind),
                "{reply:?} for {kind:?}"
            );
        }
    }
    // E follows its code's table.
    for code_byte in 1..=7 {
        let code = ErrorCode::from_u8(code_byte).unwrap();
        for kind in KINDS {
            assert_eq!(
                Reply::Error { rid: 1, code }.answers(kind),
                code.allowed_for(kind)
            );
        }
    }
}

// ------------------------------------------------------- keys and groups

#[test]
fn key_validation() {
    assert!(Key::new(b"a").is_ok());
    assert!(Key::new(&long_key(128)).is_ok());
    assert!(Key::new("schlüssel/日本".as_bytes()).is_ok());
    assert!(Key::new(b"tab\tis-allowed").is_ok());
    assert_eq!(Key::new(b""), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(&long_key(129)), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(b"has space"), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(b"has\rcr"), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(b"has\nlf"), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(b"\xff\xfe"), Err(ErrorCode::BadKey));
    assert_eq!(Key::new(b"cut\xe6\x97"), Err(ErrorCode::BadKey));
    assert_eq!(key("abc").as_str(), "abc");
    assert_eq!(&*key("abc").into_boxed_bytes(), b"abc");
    // From text: the same rules, the UTF-8 check already done by `str`.
    assert_eq!(Key::from_text("abc"), Ok(key("abc")));
    assert_eq!(Key::from_text("é/ключ"), Key::new("é/ключ".as_bytes()));
    for bad in ["", "has space", "has\rcr", "has\nlf"] {
        assert_eq!(Key::from_text(bad), Err(ErrorCode::BadKey), "{bad:?}");
    }
    assert_eq!(Key::from_text(&"k".repeat(129)), Err(ErrorCode::BadKey));
}

#[test]
fn key_group_validation() {
    assert_eq!(group(&["a"]).len(), 1);
    assert!(!group(&["a"]).is_empty());
    let sixteen: Vec<Key> = (0..16).map(|i| key(&format!("k{i:02}"))).collect();
    assert_eq!(KeyGroup::new(sixteen.clone()).unwrap().len(), 16);
    let mut seventeen = sixteen;
    seventeen.push(key("k99"));
    assert_eq!(KeyGroup::new(seventeen), Err(ErrorCode::BadKeySet));
    assert_eq!(KeyGroup::new(vec![]), Err(ErrorCode::BadKeySet));
    assert_eq!(
        KeyGroup::new(vec![key("b"), key("a")]),
        Err(ErrorCode::BadKeySet)
    );
    assert_eq!(
        KeyGroup::new(vec![key("a"), key("a")]),
        Err(ErrorCode::BadKeySet)
    );
    // Raw byte order, not "natural" or locale order: "B" (0x42) < "a" (0x61),
    // and a prefix sorts first.
    assert!(KeyGroup::new(vec![key("B"), key("a")]).is_ok());
    assert!(KeyGroup::new(vec![key("a"), key("ab")]).is_ok());
    assert_eq!(
        KeyGroup::new(vec![key("ab"), key("a")]),
        Err(ErrorCode::BadKeySet)
    );
    assert_eq!(
        KeyGroup::single(key("x")).into_keys(),
        vec![key("x")],
        "a single group holds its key"
    );
}

#[test]
fn short_and_long_keys_behave_alike() {
    // Keys up to 22 bytes are stored inline, longer ones boxed: the two
    // forms must compare, order, hash and print exactly as their bytes.
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};
    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        hasher.finish()
    }
    for len in [1, 21, 22, 23, 24, 127, 128] {
        let bytes = vec![b'k'; len];
        let key = Key::new(&bytes).unwrap();
        assert_eq!(key.as_bytes(), &bytes[..], "len {len}");
        assert_eq!(key.as_str().len(), len);
        assert_eq!(hash_of(&key), hash_of(&bytes[..]), "len {len}");
        assert_eq!(format!("{key:?}"), format!("Key({:?})", &bytes[..]));
        assert_eq!(&*key.clone().into_boxed_bytes(), &bytes[..]);
    }
    // Order by raw bytes across the inline/boxed boundary.
    let short = key(&"a".repeat(22));
    let long = key(&"a".repeat(23));
    let after = key("b");
    assert!(short < long && long < after, "a prefix sorts first");
    assert_ne!(short, long);
    let group = KeyGroup::new(vec![short.clone(), long.clone(), after.clone()]).unwrap();
    assert_eq!(group.keys(), &[short.clone(), long, after][..]);
    // A group built of one key is the single group, whichever way it was made.
    assert_eq!(
        KeyGroup::new(vec![short.clone()]).unwrap(),
        KeyGroup::single(short.clone())
    );
    assert_eq!(
        hash_of(&KeyGroup::single(short.clone())),
        hash_of(&vec![short.clone()])
    );
    assert_eq!(
        format!("{:?}", KeyGroup::single(short.clone())),
        format!("KeyGroup({:?})", vec![short])
    );
}

// ------------------------------------------------------- exact bytes

#[test]
fn acquire_frame_has_the_documented_layout() {
    let bytes = acquire(0x0102_0304_0506_0708, 5, 30, &["k/1"], false).to_frame();
    let expected = [b'A', 0, 13, 1, 2, 3, 4, 5, 6, 7, 8, 5, 30, b'k', b'/', b'1'];
    assert_eq!(bytes, expected);
}

#[test]
fn the_example_in_docs_protocol_md_is_exact() {
    let bytes = acquire(1, 5, 30, &["k/1"], false).to_frame();
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex.join(" "),
        "41 00 0d 00 00 00 00 00 00 00 01 05 1e 6b 2f 31"
    );
}

#[test]
fn release_frame_has_the_documented_layout() {
    let bytes = release(7, 0x1122_3344_5566_7788, &["k"], false).to_frame();
    let expected = [
        b'R', 0, 17, 0, 0, 0, 0, 0, 0, 0, 7, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, b'k',
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn set_frames_have_the_documented_layout() {
    let bytes = acquire(1, 0, 9, &["a", "bc"], true).to_frame();
    let expected = [
        b'S', 0, 16, 0, 0, 0, 0, 0, 0, 0, 1, 0, 9, 2, 1, b'a', 2, b'b', b'c',
    ];
    assert_eq!(bytes, expected);

    let bytes = release(2, 3, &["a", "bc"], true).to_frame();
    let expected = [
        b'G', 0, 22, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 2, 1, b'a', 2, b'b', b'c',
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn encode_appends_to_the_buffer() {
    let mut out = vec![0xEE];
    acquire(1, 0, 1, &["x"], false).encode(&mut out);
    acquire(2, 0, 1, &["y"], false).encode(&mut out);
    assert_eq!(out[0], 0xEE);
    assert_eq!(out.len(), 1 + 2 * 14);
    assert_eq!(&out[1..4], &[b'A', 0, 11]);
    assert_eq!(&out[15..18], &[b'A', 0, 11]);
}

#[test]
#[should_panic(expected = "exactly one key")]
fn encoding_a_single_key_op_with_many_keys_panics() {
    acquire(1, 0, 1, &["a", "b"], false).to_frame();
}

#[test]
fn reply_frames_have_the_documented_layout() {
    let cases: [(Reply, Vec<u8>); 11] = [
        (
            Reply::Acquired {
                rid: 1,
                token: 0x0A0B,
            },
            [
                vec![b'A', 0, 16],
                1u64.to_be_bytes().to_vec(),
                0x0A0Bu64.to_be_bytes().to_vec(),
            ]
            .concat(),
        ),
        (
            Reply::AcquiredSet { rid: 2, token: 3 },
            [
                vec![b'S', 0, 16],
                2u64.to_be_bytes().to_vec(),
                3u64.to_be_bytes().to_vec(),
            ]
            .concat(),
        ),
        (
            Reply::Released { rid: 4 },
            [vec![b'R', 0, 8], 4u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::ReleasedSet { rid: 5 },
            [vec![b'G', 0, 8], 5u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::NotFound { rid: 6 },
            [vec![b'N', 0, 8], 6u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::TimedOut { rid: 7 },
            [vec![b'T', 0, 8], 7u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::Busy { rid: 8 },
            [vec![b'B', 0, 8], 8u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::Indeterminate { rid: 9 },
            [vec![b'I', 0, 8], 9u64.to_be_bytes().to_vec()].concat(),
        ),
        (
            Reply::Moved {
                rid: 10,
                leader_slot: 2,
            },
            [vec![b'M', 0, 9], 10u64.to_be_bytes().to_vec(), vec![2]].concat(),
        ),
        (
            Reply::Error {
                rid: 11,
                code: ErrorCode::GroupMismatch,
            },
            [vec![b'E', 0, 9], 11u64.to_be_bytes().to_vec(), vec![6]].concat(),
        ),
        (
            Reply::Leader {
                leader_slot: NO_LEADER_SLOT,
            },
            vec![b'L', 0, 1, 0xFF],
        ),
    ];
    for (reply, bytes) in cases {
        let mut out = Vec::new();
        reply.encode(&mut out);
        assert_eq!(out, bytes, "{reply:?}");
        assert_eq!(out[0], reply.op());
        assert_eq!(
            Reply::decode(&bytes),
            Ok(Some((reply, bytes.len()))),
            "{reply:?}"
        );
        assert_eq!(reply.rid().is_none(), matches!(reply, Reply::Leader { .. }));
    }
}

// ------------------------------------------------------- round trips

#[test]
fn every_request_kind_round_trips() {
    let (key_max, set_max) = largest_keys();
    let set_max: Vec<&str> = set_max.iter().map(String::as_str).collect();
    let requests = [
        acquire(1, 0, 1, &["a"], false),
        acquire(u64::MAX, 255, 250, &[&key_max], false),
        release(2, 1, &["b"], false),
        release(3, u64::MAX, &[&key_max], false),
        acquire(4, 10, 30, &["only"], true),
        acquire(5, 3, 250, &set_max, true),
        release(6, 77, &["only"], true),
        release(7, 78, &set_max, true),
        acquire(8, 1, 2, &["ключ", "鍵"], true),
    ];
    for request in requests {
        let bytes = request.to_frame();
        assert_eq!(decode_one(&bytes), Ok(Decoded::Request(request.clone())));
        assert_eq!(
            decode_request(&bytes),
            Ok(Some((Decoded::Request(request.clone()), bytes.len())))
        );
        assert_eq!(request.kind().op(), bytes[0]);
        assert_eq!(
            request.rid(),
            u64::from_be_bytes(bytes[3..11].try_into().unwrap())
        );
    }
}

#[test]
fn largest_frames_are_exactly_the_limits() {
    let (key_max, set_max) = largest_keys();
    let set_max: Vec<&str> = set_max.iter().map(String::as_str).collect();
    assert_eq!(
        acquire(1, 0, 1, &[&key_max], false).to_frame().len(),
        ACQUIRE_FRAME_LEN_MAX
    );
    assert_eq!(
        release(1, 1, &[&key_max], false).to_frame().len(),
        RELEASE_FRAME_LEN_MAX
    );
    assert_eq!(
        acquire(1, 0, 1, &set_max, true).to_frame().len(),
        ACQUIRE_SET_FRAME_LEN_MAX
    );
    assert_eq!(
        release(1, 1, &set_max, true).to_frame().len(),
        RELEASE_SET_FRAME_LEN_MAX
    );
}

#[test]
fn every_reply_round_trips() {
    let replies = [
        Reply::Acquired {
            rid: 1,
            token: u64::MAX,
        },
        Reply::AcquiredSet {
            rid: u64::MAX,
            token: 1,
        },
        Reply::Released { rid: 3 },
        Reply::ReleasedSet { rid: 4 },
        Reply::NotFound { rid: 5 },
        Reply::TimedOut { rid: 6 },
        Reply::Busy { rid: 7 },
        Reply::Indeterminate { rid: 8 },
        Reply::Moved {
            rid: 9,
            leader_slot: 4,
        },
        Reply::Moved {
            rid: 9,
            leader_slot: NO_LEADER_SLOT,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::BadKey,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::BadLease,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::NotActive,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::NoLeader,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::BadKeySet,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::GroupMismatch,
        },
        Reply::Error {
            rid: 10,
            code: ErrorCode::BadToken,
        },
        Reply::Leader { leader_slot: 0 },
    ];
    let mut stream = Vec::new();
    for reply in replies {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        assert_eq!(Reply::decode(&bytes), Ok(Some((reply, bytes.len()))));
        stream.extend_from_slice(&bytes);
    }
    // Back to back in one buffer, each decode uses exactly its frame.
    let mut at = 0;
    for reply in replies {
        let (decoded, used) = Reply::decode(&stream[at..]).unwrap().unwrap();
        assert_eq!(decoded, reply);
        at += used;
    }
    assert_eq!(at, stream.len());
}

// ------------------------------------------------------- fatal framing errors

#[test]
fn unknown_op_is_reported_from_the_first_byte() {
    assert_eq!(fed(&[b"Z"]).next(), Err(FrameError::UnknownOp(b'Z')));
    // Reply ops are not request ops.
    for op in [b'N', b'T', b'B', b'I', b'M', b'E', b'L', 0, 0xFF, b'a'] {
        assert_eq!(fed(&[&[op]]).next(), Err(FrameError::UnknownOp(op)));
    }
}

#[test]
fn empty_body_is_fatal() {
    for op in [b'A', b'R', b'S', b'G'] {
        assert_eq!(
            fed(&[&[op, 0, 0]]).next(),
            Err(FrameError::EmptyBody),
            "op {op}"
        );
    }
}

#[test]
fn too_long_is_reported_from_the_header_alone() {
    assert_eq!(
        fed(&[&[b'S', 0xFF, 0xFF]]).next(),
        Err(FrameError::TooLong {
            kind: RequestKind::AcquireSet,
            body_len: 0xFFFF
        })
    );
    for kind in KINDS {
        let max = kind.body_len_max();
        assert_eq!(
            fed(&[&[kind.op()], &((max + 1) as u16).to_be_bytes()]).next(),
            Err(FrameError::TooLong {
                kind,
                body_len: max + 1
            }),
            "{kind:?}"
        );
        // Exactly the maximum is fine: the decoder waits for the body.
        let mut decoder = fed(&[&[kind.op()], &(max as u16).to_be_bytes()]);
        assert_eq!(decoder.next(), Ok(None), "{kind:?}");
        assert_eq!(decoder.buffered(), 3);
    }
}

#[test]
fn an_acquire_key_over_128_bytes_cannot_fit_its_frame() {
    // A 129-byte key makes the A body 139 bytes, over the 138-byte maximum:
    // the frame is fatal, not an E1.
    let bytes = frame(b'A', &a_body(1, 0, 1, &long_key(129)));
    assert_eq!(
        decode_one(&bytes),
        Err(FrameError::TooLong {
            kind: RequestKind::Acquire,
            body_len: 139
        })
    );
}

#[test]
fn too_short_is_reported_from_the_header_alone() {
    for (kind, fixed) in [
        (RequestKind::Acquire, 10u16),
        (RequestKind::Release, 16),
        (RequestKind::AcquireSet, 11),
        (RequestKind::ReleaseSet, 17),
    ] {
        assert_eq!(
            fed(&[&[kind.op()], &(fixed - 1).to_be_bytes()]).next(),
            Err(FrameError::TooShort {
                kind,
                body_len: usize::from(fixed - 1)
            }),
            "{kind:?}"
        );
        assert_eq!(
            fed(&[&[kind.op()], &1u16.to_be_bytes()]).next(),
            Err(FrameError::TooShort { kind, body_len: 1 })
        );
    }
}

#[test]
fn zero_rid_is_fatal_for_every_kind() {
    let frames = [
        frame(b'A', &a_body(0, 0, 10, b"k")),
        frame(b'R', &r_body(0, 5, b"k")),
        frame(b'S', &s_body(0, 0, 10, &records(&[b"k"]))),
        frame(b'G', &g_body(0, 5, &records(&[b"k"]))),
        // rid 0 wins over every field error: without a rid there is nothing
        // to address an E reply to.
        frame(b'A', &a_body(0, 0, 0, b"")),
        frame(b'G', &g_body(0, 0, &[0])),
    ];
    for bytes in frames {
        assert_eq!(decode_one(&bytes), Err(FrameError::ZeroRid), "{bytes:?}");
    }
}

#[test]
fn zero_rid_waits_for_the_whole_frame() {
    // The rid is only judged on a complete frame, so a split after the rid
    // gives no early answer (the header was fine).
    let bytes = frame(b'A', &a_body(0, 0, 10, b"key"));
    let mut decoder = RequestDecoder::new();
    decoder.push(&bytes[..bytes.len() - 1]);
    assert_eq!(decoder.next(), Ok(None));
    decoder.push(&bytes[bytes.len() - 1..]);
    assert_eq!(decoder.next(), Err(FrameError::ZeroRid));
}

#[test]
fn after_a_fatal_error_the_decoder_stays_failed_and_buffers_nothing() {
    let mut decoder = RequestDecoder::new();
    let good = acquire(1, 0, 1, &["k"], false).to_frame();
    decoder.push(&[b'A', 0, 0]);
    decoder.push(&good);
    assert_eq!(decoder.next(), Err(FrameError::EmptyBody));
    assert_eq!(decoder.buffered(), 0);
    decoder.push(&good);
    assert_eq!(decoder.buffered(), 0);
    assert_eq!(decoder.next(), Err(FrameError::EmptyBody));
}

#[test]
fn frame_errors_display_as_sentences() {
    let cases = [
        (FrameError::UnknownOp(b'X'), "0x58"),
        (FrameError::UnknownOp(0), "0x00"),
        (FrameError::EmptyBody, "empty"),
        (
            FrameError::TooLong {
                kind: RequestKind::AcquireSet,
                body_len: 65535,
            },
            "65535",
        ),
        (
            FrameError::TooLong {
                kind: RequestKind::AcquireSet,
                body_len: 65535,
            },
            "2075",
        ),
        (
            FrameError::TooShort {
                kind: RequestKind::Release,
                body_len: 3,
            },
            "16",
        ),
        (FrameError::ZeroRid, "request id 0"),
    ];
    for (err, needle) in cases {
        let text = err.to_string();
        assert!(text.contains(needle), "{text:?} should mention {needle:?}");
    }
}

// ------------------------------------------------------- rejections (E codes)

#[test]
fn acquire_field_errors_get_their_codes() {
    assert_eq!(
        rejected(&frame(b'A', &a_body(9, 0, 10, b""))),
        (9, RequestKind::Acquire, ErrorCode::BadKey)
    );
    for bad in [&b"a b"[..], b"a\rb", b"a\nb", b"\xc3\x28"] {
        assert_eq!(
            code_of(&frame(b'A', &a_body(1, 0, 10, bad))),
            ErrorCode::BadKey,
            "{bad:?}"
        );
    }
    assert_eq!(
        code_of(&frame(b'A', &a_body(1, 0, 0, b"k"))),
        ErrorCode::BadLease
    );
    assert_eq!(
        code_of(&frame(b'A', &a_body(1, 0, 251, b"k"))),
        ErrorCode::BadLease
    );
    assert_eq!(
        code_of(&frame(b'A', &a_body(1, 0, 255, b"k"))),
        ErrorCode::BadLease
    );
    // Edges that are fine: lease 1 and 250, any wait.
    for (wait_s, lease_s) in [(0, 1), (255, 250), (128, 125)] {
        let bytes = frame(b'A', &a_body(1, wait_s, lease_s, b"k"));
        assert_eq!(
            decode_one(&bytes),
            Ok(Decoded::Request(acquire(1, wait_s, lease_s, &["k"], false)))
        );
    }
}

#[test]
fn acquire_key_is_checked_before_lease() {
    assert_eq!(
        code_of(&frame(b'A', &a_body(1, 0, 0, b""))),
        ErrorCode::BadKey
    );
    assert_eq!(
        code_of(&frame(b'A', &a_body(1, 0, 251, b"a b"))),
        ErrorCode::BadKey
    );
}

#[test]
fn release_field_errors_get_their_codes() {
    assert_eq!(
        rejected(&frame(b'R', &r_body(4, 5, b""))),
        (4, RequestKind::Release, ErrorCode::BadKey)
    );
    assert_eq!(
        code_of(&frame(b'R', &r_body(4, 5, b"x y"))),
        ErrorCode::BadKey
    );
    assert_eq!(
        rejected(&frame(b'R', &r_body(4, 0, b"k"))),
        (4, RequestKind::Release, ErrorCode::BadToken)
    );
    // key before token
    assert_eq!(code_of(&frame(b'R', &r_body(4, 0, b""))), ErrorCode::BadKey);
}

#[test]
fn acquire_set_structure_errors_are_bad_key_set() {
    let rid = 12;
    let cases: [(&str, Vec<u8>); 6] = [
        ("count 0", s_body(rid, 0, 10, &[0])),
        ("count 17", {
            let keys: Vec<Vec<u8>> = (0..17u8).map(|i| vec![b'a' + i]).collect();
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            s_body(rid, 0, 10, &records(&refs))
        }),
        (
            "record overruns the body",
            s_body(rid, 0, 10, &[1, 5, b'a', b'b']),
        ),
        (
            "fewer records than count",
            s_body(rid, 0, 10, &[2, 1, b'a']),
        ),
        (
            "bytes after the last record",
            s_body(rid, 0, 10, &[1, 1, b'a', b'x']),
        ),
        ("no records at all", s_body(rid, 0, 10, &[3])),
    ];
    for (what, body) in cases {
        assert_eq!(
            rejected(&frame(b'S', &body)),
            (rid, RequestKind::AcquireSet, ErrorCode::BadKeySet),
            "{what}"
        );
    }
}

#[test]
fn acquire_set_key_and_order_errors() {
    // Each record is checked as a key.
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"a", b""])))),
        ErrorCode::BadKey
    );
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"a", b"b c"])))),
        ErrorCode::BadKey
    );
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"\xff"])))),
        ErrorCode::BadKey
    );
    // A 129-byte record fits an S body, so it is a key error, not framing.
    let long = long_key(129);
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[&long])))),
        ErrorCode::BadKey
    );
    // Order.
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"b", b"a"])))),
        ErrorCode::BadKeySet
    );
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"a", b"a"])))),
        ErrorCode::BadKeySet
    );
    // Lease.
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 0, &records(&[b"a"])))),
        ErrorCode::BadLease
    );
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 251, &records(&[b"a", b"b"])))),
        ErrorCode::BadLease
    );
}

#[test]
fn acquire_set_check_order_is_structure_key_order_lease() {
    // structure (count 0) beats lease
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 0, &[0]))),
        ErrorCode::BadKeySet
    );
    // structure (trailing byte) beats a bad key
    let mut recs = records(&[b"a b"]);
    recs.push(b'!');
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &recs))),
        ErrorCode::BadKeySet
    );
    // key beats order: unsorted and one bad key → E1
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 10, &records(&[b"z", b"a b"])))),
        ErrorCode::BadKey
    );
    // order beats lease
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 0, &records(&[b"b", b"a"])))),
        ErrorCode::BadKeySet
    );
    // key beats lease
    assert_eq!(
        code_of(&frame(b'S', &s_body(1, 0, 0, &records(&[b""])))),
        ErrorCode::BadKey
    );
}

#[test]
fn release_set_errors_and_check_order() {
    let rid = 33;
    assert_eq!(
        rejected(&frame(b'G', &g_body(rid, 5, &[0]))),
        (rid, RequestKind::ReleaseSet, ErrorCode::BadKeySet)
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 5, &[1, 9, b'a']))),
        ErrorCode::BadKeySet
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 5, &records(&[b"a\n"])))),
        ErrorCode::BadKey
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 5, &records(&[b"b", b"a"])))),
        ErrorCode::BadKeySet
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 0, &records(&[b"a", b"b"])))),
        ErrorCode::BadToken
    );
    // order of checks: structure, key, order, then token
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 0, &[17]))),
        ErrorCode::BadKeySet
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 0, &records(&[b""])))),
        ErrorCode::BadKey
    );
    assert_eq!(
        code_of(&frame(b'G', &g_body(rid, 0, &records(&[b"b", b"a"])))),
        ErrorCode::BadKeySet
    );
}

#[test]
fn a_set_of_one_key_is_accepted() {
    let s = frame(b'S', &s_body(1, 2, 3, &records(&[b"solo"])));
    assert_eq!(
        decode_one(&s),
        Ok(Decoded::Request(acquire(1, 2, 3, &["solo"], true)))
    );
    let g = frame(b'G', &g_body(2, 9, &records(&[b"solo"])));
    assert_eq!(
        decode_one(&g),
        Ok(Decoded::Request(release(2, 9, &["solo"], true)))
    );
}

#[test]
fn every_rejection_code_is_allowed_for_its_kind() {
    // The decoder never produces an E code that the client would refuse.
    let frames = [
        frame(b'A', &a_body(1, 0, 10, b"")),
        frame(b'A', &a_body(1, 0, 0, b"k")),
        frame(b'R', &r_body(1, 1, b"")),
        frame(b'R', &r_body(1, 0, b"k")),
        frame(b'S', &s_body(1, 0, 10, &[0])),
        frame(b'S', &s_body(1, 0, 10, &records(&[b""]))),
        frame(b'S', &s_body(1, 0, 0, &records(&[b"k"]))),
        frame(b'G', &g_body(1, 1, &[0])),
        frame(b'G', &g_body(1, 1, &records(&[b""]))),
        frame(b'G', &g_body(1, 0, &records(&[b"k"]))),
    ];
    for bytes in frames {
        let (_, kind, code) = rejected(&bytes);
        assert!(code.allowed_for(kind), "{code:?} for {kind:?}");
        assert_eq!(kind.op(), bytes[0]);
    }
}

#[test]
fn the_session_goes_on_after_a_rejection() {
    let mut stream = frame(b'A', &a_body(1, 0, 0, b"k"));
    stream.extend(acquire(2, 0, 5, &["k"], false).to_frame());
    let mut decoder = fed(&[&stream]);
    assert_eq!(
        decoder.next(),
        Ok(Some(Decoded::Rejected {
            rid: 1,
            kind: RequestKind::Acquire,
            code: ErrorCode::BadLease
        }))
    );
    assert_eq!(
        decoder.next(),
        Ok(Some(Decoded::Request(acquire(2, 0, 5, &["k"], false))))
    );
    assert_eq!(decoder.next(), Ok(None));
    assert_eq!(decoder.buffered(), 0);
}

// ------------------------------------------------------- incremental decoding

fn sample_requests() -> Vec<Request> {
    vec![
        acquire(1, 0, 10, &["alpha"], false),
        release(2, 99, &["alpha"], false),
        acquire(3, 5, 250, &["a", "b", "c"], true),
        release(4, 100, &["a", "b", "c"], true),
        acquire(5, 255, 1, &["ω"], false),
    ]
}

#[test]
fn byte_by_byte_feeding_yields_every_request() {
    let requests = sample_requests();
    let stream: Vec<u8> = requests.iter().flat_map(Request::to_frame).collect();
    let mut decoder = RequestDecoder::new();
    let mut out = Vec::new();
    for byte in &stream {
        decoder.push(std::slice::from_ref(byte));
        while let Some(decoded) = decoder.next().unwrap() {
            out.push(decoded);
        }
    }
    let expected: Vec<Decoded> = requests.into_iter().map(Decoded::Request).collect();
    assert_eq!(out, expected);
    assert_eq!(decoder.buffered(), 0);
}

#[test]
fn buffered_counts_only_undecoded_bytes() {
    let frame_a = acquire(1, 0, 10, &["k"], false).to_frame();
    let mut decoder = RequestDecoder::new();
    assert_eq!(decoder.buffered(), 0);
    decoder.push(&frame_a);
    decoder.push(&frame_a[..4]);
    assert_eq!(decoder.buffered(), frame_a.len() + 4);
    assert!(decoder.next().unwrap().is_some());
    assert_eq!(decoder.buffered(), 4);
    assert_eq!(decoder.next(), Ok(None));
    assert_eq!(decoder.buffered(), 4);
}

// ------------------------------------------------------- reply decoding errors

#[test]
fn reply_unknown_op_is_reported_from_the_first_byte() {
    assert_eq!(Reply::decode(b"Z"), Err(ReplyError::UnknownOp(b'Z')));
    assert_eq!(Reply::decode(&[0]), Err(ReplyError::UnknownOp(0)));
}

#[test]
fn reply_wrong_length_is_reported_from_the_header() {
    for (op, good) in [
        (b'A', 16u16),
        (b'S', 16),
        (b'R', 8),
        (b'G', 8),
        (b'N', 8),
        (b'T', 8),
        (b'B', 8),
        (b'I', 8),
        (b'M', 9),
        (b'E', 9),
        (b'L', 1),
    ] {
        for bad in [0, good - 1, good + 1, 0xFFFF] {
            let mut header = vec![op];
            header.extend_from_slice(&bad.to_be_bytes());
            assert_eq!(
                Reply::decode(&header),
                Err(ReplyError::BadLength {
                    op,
                    body_len: usize::from(bad)
                }),
                "op {op} len {bad}"
            );
        }
        let mut header = vec![op];
        header.extend_from_slice(&good.to_be_bytes());
        assert_eq!(
            Reply::decode(&header),
            Ok(None),
            "op {op} waits for its body"
        );
    }
}

#[test]
fn reply_incomplete_frames_wait() {
    assert_eq!(Reply::decode(&[]), Ok(None));
    assert_eq!(Reply::decode(b"A"), Ok(None));
    assert_eq!(Reply::decode(&[b'A', 0]), Ok(None));
    let mut bytes = Vec::new();
    Reply::Acquired { rid: 1, token: 2 }.encode(&mut bytes);
    for cut in 0..bytes.len() {
        assert_eq!(Reply::decode(&bytes[..cut]), Ok(None), "cut at {cut}");
    }
}

#[test]
fn reply_zero_rid_or_token_is_refused() {
    let zero_rid = [vec![b'R', 0, 8], vec![0; 8]].concat();
    assert_eq!(Reply::decode(&zero_rid), Err(ReplyError::Zero));
    let zero_rid_e = [vec![b'E', 0, 9], vec![0; 8], vec![1]].concat();
    assert_eq!(Reply::decode(&zero_rid_e), Err(ReplyError::Zero));
    for op in [b'A', b'S'] {
        let zero_token = [vec![op, 0, 16], 1u64.to_be_bytes().to_vec(), vec![0; 8]].concat();
        assert_eq!(Reply::decode(&zero_token), Err(ReplyError::Zero));
    }
}

#[test]
fn reply_unknown_error_code_is_refused() {
    for code in [0u8, 11, 0xFF] {
        let bytes = [vec![b'E', 0, 9], 1u64.to_be_bytes().to_vec(), vec![code]].concat();
        assert_eq!(Reply::decode(&bytes), Err(ReplyError::UnknownCode(code)));
    }
}

#[test]
fn reply_errors_display_as_sentences() {
    assert!(ReplyError::UnknownOp(b'X').to_string().contains("0x58"));
    assert!(
        ReplyError::BadLength {
            op: b'A',
            body_len: 3
        }
        .to_string()
        .contains("16")
    );
    assert!(ReplyError::Zero.to_string().contains('0'));
    assert!(ReplyError::UnknownCode(9).to_string().contains('9'));
}

// ------------------------------------------------------- properties

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Any Unicode without space, CR, LF: up to 32 chars is ≤ 128 bytes.
        "[^ \r\n]{1,32}".prop_map(String::into_bytes),
        // Long printable ASCII up to the limit.
        "[!-~]{1,128}".prop_map(String::into_bytes),
    ]
}

fn key_set_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
    // A BTreeSet is ordered by raw bytes, exactly the wire order.
    prop::collection::btree_set(key_strategy(), 1..=16).prop_map(|set| set.into_iter().collect())
}

fn to_group(keys: &[Vec<u8>]) -> KeyGroup {
    KeyGroup::new(keys.iter().map(|k| Key::new(k).unwrap()).collect()).unwrap()
}

fn request_strategy() -> impl Strategy<Value = Request> {
    prop_oneof![
        (1..=u64::MAX, any::<u8>(), 1..=250u8, key_strategy()).prop_map(
            |(rid, wait_s, lease_s, k)| {
                Request::Acquire(AcquireRequest {
                    rid,
                    wait_s,
                    lease_s,
                    keys: to_group(&[k]),
                    set: false,
                })
            }
        ),
        (1..=u64::MAX, 1..=u64::MAX, key_strategy()).prop_map(|(rid, token, k)| {
            Request::Release(ReleaseRequest {
                rid,
                token,
                keys: to_group(&[k]),
                set: false,
            })
        }),
        (1..=u64::MAX, any::<u8>(), 1..=250u8, key_set_strategy()).prop_map(
            |(rid, wait_s, lease_s, keys)| {
                Request::Acquire(AcquireRequest {
                    rid,
                    wait_s,
                    lease_s,
                    keys: to_group(&keys),
                    set: true,
                })
            }
        ),
        (1..=u64::MAX, 1..=u64::MAX, key_set_strategy()).prop_map(|(rid, token, keys)| {
            Request::Release(ReleaseRequest {
                rid,
                token,
                keys: to_group(&keys),
                set: true,
            })
        }),
    ]
}

/// A frame the decoder must reject with an E code (rid readable), paired
/// with what it must decode to.
fn rejected_frame_strategy() -> impl Strategy<Value = (Vec<u8>, Decoded)> {
    prop_oneof![
        (1..=u64::MAX, prop_oneof![Just(0u8), 251..=255u8]).prop_map(|(rid, lease_s)| (
            frame(b'A', &a_body(rid, 0, lease_s, b"k")),
            Decoded::Rejected {
                rid,
                kind: RequestKind::Acquire,
                code: ErrorCode::BadLease
            }
        )),
        (1..=u64::MAX).prop_map(|rid| (
            frame(b'R', &r_body(rid, 0, b"k")),
            Decoded::Rejected {
                rid,
                kind: RequestKind::Release,
                code: ErrorCode::BadToken
            }
        )),
        (1..=u64::MAX).prop_map(|rid| (
            frame(b'S', &s_body(rid, 0, 5, &records(&[b"b", b"a"]))),
            Decoded::Rejected {
                rid,
                kind: RequestKind::AcquireSet,
                code: ErrorCode::BadKeySet
            }
        )),
    ]
}

fn stream_item_strategy() -> impl Strategy<Value = (Vec<u8>, Decoded)> {
    prop_oneof![
        4 => request_strategy().prop_map(|r| (r.to_frame(), Decoded::Request(r))),
        1 => rejected_frame_strategy(),
    ]
}

/// Plausible-looking frames: a real op and a length near the valid range,
/// with random content, so the validation paths are exercised, not just
/// UnknownOp on the first byte.
fn noisy_frame_strategy() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![b'A', b'R', b'S', b'G']),
        prop::collection::vec(any::<u8>(), 0..200),
        any::<bool>(),
    )
        .prop_map(|(op, mut body, rid_nonzero)| {
            if rid_nonzero && body.len() >= 8 && body[..8].iter().all(|&b| b == 0) {
                body[7] = 1;
            }
            frame(op, &body)
        })
}

/// A valid frame with a few bytes overwritten: near-valid input that
/// reaches every field check (lease, token, order), not only the key checks.
fn mutated_frame_strategy() -> impl Strategy<Value = Vec<u8>> {
    (
        request_strategy(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..3),
    )
        .prop_map(|(request, edits)| {
            let mut bytes = request.to_frame();
            for (at, value) in edits {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            bytes
        })
}

fn noisy_stream_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..3000),
        prop::collection::vec(noisy_frame_strategy(), 0..20).prop_map(|frames| frames.concat()),
        prop::collection::vec(
            prop_oneof![
                mutated_frame_strategy(),
                request_strategy().prop_map(|r| r.to_frame())
            ],
            0..20
        )
        .prop_map(|frames| frames.concat()),
    ]
}

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

/// Decodes `bytes` in one go with `decode_request`, the reference for the
/// incremental decoder.
fn decode_whole(bytes: &[u8]) -> (Vec<Decoded>, Option<FrameError>, usize) {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        match decode_request(&bytes[at..]) {
            Ok(Some((decoded, used))) => {
                assert!(used > 0 && at + used <= bytes.len());
                out.push(decoded);
                at += used;
            }
            Ok(None) => return (out, None, bytes.len() - at),
            Err(err) => return (out, Some(err), bytes.len() - at),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_streams_decode_exactly_under_any_split(
        items in prop::collection::vec(stream_item_strategy(), 0..24),
        sizes in prop::collection::vec(1..400usize, 1..16),
    ) {
        let stream: Vec<u8> = items.iter().flat_map(|(bytes, _)| bytes.clone()).collect();
        let expected: Vec<Decoded> = items.into_iter().map(|(_, decoded)| decoded).collect();
        let mut decoder = RequestDecoder::new();
        let mut out = Vec::new();
        for chunk in chunks(&stream, &sizes) {
            decoder.push(chunk);
            while let Some(decoded) = decoder.next().expect("valid stream") {
                out.push(decoded);
            }
            prop_assert!(decoder.buffered() < RELEASE_SET_FRAME_LEN_MAX);
        }
        prop_assert_eq!(out, expected);
        prop_assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_match_one_shot_decoding(
        stream in noisy_stream_strategy(),
        sizes in prop::collection::vec(1..300usize, 1..16),
    ) {
        let (whole, whole_err, _) = decode_whole(&stream);
        let mut decoder = RequestDecoder::new();
        let mut out = Vec::new();
        let mut err = None;
        'feed: for chunk in chunks(&stream, &sizes) {
            let before = decoder.buffered();
            decoder.push(chunk);
            prop_assert_eq!(decoder.buffered(), before + chunk.len());
            loop {
                match decoder.next() {
                    Ok(Some(decoded)) => out.push(decoded),
                    Ok(None) => break,
                    Err(e) => {
                        err = Some(e);
                        break 'feed;
                    }
                }
            }
            // Between pushes at most one partial frame is held.
            prop_assert!(decoder.buffered() < RELEASE_SET_FRAME_LEN_MAX);
        }
        prop_assert_eq!(&out, &whole);
        prop_assert_eq!(err, whole_err);
    }

    #[test]
    fn decoded_requests_re_encode_to_their_exact_frame(stream in noisy_stream_strategy()) {
        let mut at = 0;
        while let Ok(Some((decoded, used))) = decode_request(&stream[at..]) {
            let frame_bytes = &stream[at..at + used];
            match decoded {
                Decoded::Request(request) => {
                    prop_assert_eq!(request.to_frame(), frame_bytes);
                }
                Decoded::Rejected { rid, kind, code } => {
                    prop_assert_eq!(kind.op(), frame_bytes[0]);
                    prop_assert_eq!(rid, u64::from_be_bytes(frame_bytes[3..11].try_into().unwrap()));
                    prop_assert!(code.allowed_for(kind));
                }
            }
            at += used;
        }
    }

    #[test]
    fn reply_decode_never_panics_and_round_trips(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(Some((reply, used))) = Reply::decode(&bytes) {
            prop_assert!(used <= bytes.len());
            let mut out = Vec::new();
            reply.encode(&mut out);
            prop_assert_eq!(&out[..], &bytes[..used]);
        }
    }

    #[test]
    fn reply_frames_with_real_ops_never_panic(
        op in prop::sample::select(b"ASRGNTBIMEL".to_vec()),
        body in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let bytes = frame(op, &body);
        match Reply::decode(&bytes) {
            Ok(Some((reply, used))) => {
                prop_assert_eq!(used, bytes.len());
                prop_assert_eq!(reply.op(), op);
            }
            Ok(None) => prop_assert!(false, "a complete frame never needs more bytes"),
            Err(_) => {}
        }
    }
}

// ------------------------------------------------------------ extensions

fn negotiate(rid: u64, version: u8, wanted: u32, label: &str) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version,
        wanted: Capabilities(wanted),
        label: label.to_owned(),
    })
}

/// X body: `rid · version · capabilities · label length · label`.
fn x_body(rid: u64, version: u8, wanted: u32, label: &[u8]) -> Vec<u8> {
    [
        &rid.to_be_bytes()[..],
        &[version],
        &wanted.to_be_bytes(),
        &[label.len() as u8],
        label,
    ]
    .concat()
}

#[test]
fn an_x_frame_has_the_documented_bytes_and_decodes_to_itself() {
    let request = negotiate(7, EXTENSION_VERSION, 1, "host-a/4242/nightly");
    let bytes = request.to_frame();
    assert_eq!(bytes, frame(b'X', &x_body(7, 1, 1, b"host-a/4242/nightly")));
    assert_eq!(bytes.len(), request.frame_len());
    assert_eq!(decode_one(&bytes), Ok(Decoded::Request(request)));
    // An empty label is allowed: naming oneself is optional.
    let bare = negotiate(8, EXTENSION_VERSION, 0, "");
    assert_eq!(decode_one(&bare.to_frame()), Ok(Decoded::Request(bare)));
}

#[test]
fn an_x_with_another_version_or_a_long_unprintable_or_mislabelled_label_gets_e8() {
    for body in [
        x_body(3, 2, 1, b"job"),
        x_body(3, 1, 1, b"job\x1b[2J"),
        x_body(3, 1, 1, b"\xff\xfe"),
        // The label length byte says 5, the body carries 3.
        [&x_body(3, 1, 1, b"job")[..13], &[5], b"job"].concat(),
    ] {
        assert_eq!(
            rejected(&frame(b'X', &body)),
            (3, RequestKind::Negotiate, ErrorCode::BadExtension),
            "{body:?}"
        );
    }
    // The longest label there is decodes; one byte more and the frame is
    // over its op's limit, which closes the stream like any other.
    let longest = "y".repeat(LABEL_LEN_MAX);
    assert!(matches!(
        decode_one(&frame(b'X', &x_body(3, 1, 1, longest.as_bytes()))),
        Ok(Decoded::Request(Request::Negotiate(_)))
    ));
    let long = "x".repeat(LABEL_LEN_MAX + 1);
    assert_eq!(
        decode_one(&frame(b'X', &x_body(3, 1, 1, long.as_bytes()))),
        Err(FrameError::TooLong {
            kind: RequestKind::Negotiate,
            body_len: 14 + LABEL_LEN_MAX + 1
        })
    );
}

/// W body: `rid · token · lease · set records`.
fn w_body(rid: u64, token: u64, lease_s: u8, recs: &[u8]) -> Vec<u8> {
    [
        &rid.to_be_bytes()[..],
        &token.to_be_bytes(),
        &[lease_s],
        recs,
    ]
    .concat()
}

#[test]
fn w_is_an_unknown_op_until_the_extension_is_granted() {
    let bytes = frame(b'W', &w_body(4, 99, 30, &records(&[b"a", b"b"])));
    assert_eq!(decode_one(&bytes), Err(FrameError::UnknownOp(b'W')));
    let request = Request::Extend(ExtendRequest {
        rid: 4,
        token: 99,
        lease_s: 30,
        keys: group(&["a", "b"]),
    });
    let mut decoder = RequestDecoder::new();
    decoder.grant(Capabilities::EXTEND);
    decoder.push(&bytes);
    assert_eq!(decoder.next(), Ok(Some(Decoded::Request(request.clone()))));
    assert_eq!(request.to_frame(), bytes);
    assert_eq!(request.frame_len(), bytes.len());
    // One key is a set of one: `W` has one layout.
    let single = Request::Extend(ExtendRequest {
        rid: 5,
        token: 9,
        lease_s: 1,
        keys: group(&["k"]),
    });
    assert_eq!(
        single.to_frame(),
        frame(b'W', &w_body(5, 9, 1, &records(&[b"k"])))
    );
}

#[test]
fn a_w_with_token_0_a_lease_out_of_range_or_a_bad_set_gets_its_code() {
    let decode = |body: Vec<u8>| {
        let mut decoder = RequestDecoder::new();
        decoder.grant(Capabilities::EXTEND);
        decoder.push(&frame(b'W', &body));
        decoder.next()
    };
    let one = records(&[b"k"]);
    for (body, code) in [
        (w_body(5, 0, 30, &one), ErrorCode::BadToken),
        (w_body(5, 9, 0, &one), ErrorCode::BadLease),
        (w_body(5, 9, 251, &one), ErrorCode::BadLease),
        (
            w_body(5, 9, 30, &records(&[b"b", b"a"])),
            ErrorCode::BadKeySet,
        ),
        (w_body(5, 9, 30, &records(&[b"a b"])), ErrorCode::BadKey),
    ] {
        assert_eq!(
            decode(body),
            Ok(Some(Decoded::Rejected {
                rid: 5,
                kind: RequestKind::Extend,
                code
            }))
        );
    }
    // A body too short for its fixed fields cannot be read: the stream
    // closes.
    assert!(decode(w_body(5, 9, 30, &[])[..17].to_vec()).is_err());
    assert_eq!(RequestKind::Extend.body_len_max(), EXTEND_FRAME_LEN_MAX - 3);
}

#[test]
fn extension_replies_round_trip_and_answer_only_their_requests() {
    let negotiated = Reply::Negotiated {
        rid: 2,
        granted: Capabilities::EXTEND,
    };
    let extended = Reply::Extended {
        rid: 3,
        status: ExtendStatus::Clipped,
        lease_ms: 4_500,
    };
    let mut bytes = Vec::new();
    negotiated.encode(&mut bytes);
    assert_eq!(
        bytes,
        frame(
            b'X',
            &[&2u64.to_be_bytes()[..], &1u32.to_be_bytes()].concat()
        )
    );
    bytes.clear();
    extended.encode(&mut bytes);
    assert_eq!(
        bytes,
        frame(
            b'W',
            &[&3u64.to_be_bytes()[..], &[1], &4_500u32.to_be_bytes()].concat()
        )
    );
    for reply in [negotiated, extended] {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        assert_eq!(Reply::decode(&bytes), Ok(Some((reply, bytes.len()))));
        assert_eq!(bytes.len(), reply.frame_len());
    }
    let mut bad_status = bytes.clone();
    bad_status[11] = 3;
    assert_eq!(
        Reply::decode(&bad_status),
        Err(ReplyError::UnknownStatus(3))
    );
    use RequestKind::*;
    for kind in [Acquire, Release, AcquireSet, ReleaseSet, Negotiate, Extend] {
        assert_eq!(negotiated.answers(kind), kind == Negotiate, "{kind:?}");
        assert_eq!(extended.answers(kind), kind == Extend, "{kind:?}");
    }
    // Not current: the same `N` a release gets.
    assert!(Reply::NotFound { rid: 3 }.answers(Extend));
    assert!(!Reply::NotFound { rid: 3 }.answers(Negotiate));
}

#[test]
fn a_push_has_the_documented_bytes_no_rid_and_answers_nothing() {
    let reply = Reply::Push {
        token: 9,
        kind: PushKind::LeaseEnding,
        lease_ms: 1_500,
    };
    let mut bytes = Vec::new();
    reply.encode(&mut bytes);
    assert_eq!(
        bytes,
        frame(
            b'P',
            &[&9u64.to_be_bytes()[..], &[1], &1_500u32.to_be_bytes()].concat()
        )
    );
    assert_eq!(Reply::decode(&bytes), Ok(Some((reply, bytes.len()))));
    assert_eq!(reply.rid(), None);
    use RequestKind::*;
    for kind in [Acquire, Release, AcquireSet, ReleaseSet, Negotiate, Extend] {
        assert!(!reply.answers(kind), "{kind:?}");
    }
    for (byte, kind) in [
        (2, PushKind::Expired),
        (3, PushKind::ForceReleased),
        (4, PushKind::CapReached),
    ] {
        assert_eq!(PushKind::from_u8(byte), Some(kind));
        assert!(kind.is_lost());
    }
    let mut unknown = bytes.clone();
    unknown[11] = 5;
    assert_eq!(Reply::decode(&unknown), Err(ReplyError::UnknownPush(5)));
    let mut zero = bytes;
    zero[3..11].copy_from_slice(&0u64.to_be_bytes());
    assert_eq!(Reply::decode(&zero), Err(ReplyError::Zero));
}

// ---------------------------------------------------------------- observe

fn observed_frame(state: u8, term: u64, lease_ms: u32, label: &[u8], pad: u8) -> Vec<u8> {
    let mut body = 7u64.to_be_bytes().to_vec();
    body.push(state);
    body.extend_from_slice(&term.to_be_bytes());
    body.extend_from_slice(&lease_ms.to_be_bytes());
    body.push(label.len() as u8);
    body.extend_from_slice(label);
    body.resize(8 + 1 + 8 + 4 + 1 + 64, pad);
    [vec![b'O', 0, 86], body].concat()
}

#[test]
fn an_observe_is_o_with_its_rid_and_name_and_decodes_only_with_observe() {
    let request = Request::Observe(ObserveRequest {
        rid: 2,
        name: key("e"),
    });
    let bytes = request.to_frame();
    assert_eq!(bytes, [b'O', 0, 9, 0, 0, 0, 0, 0, 0, 0, 2, b'e']);
    assert_eq!(
        decode_request_with(&bytes, Capabilities::OBSERVE),
        Ok(Some((Decoded::Request(request), bytes.len())))
    );
    let all_but = Capabilities::EXTEND
        .union(Capabilities::PUSH)
        .union(Capabilities::PERMITS);
    assert_eq!(
        decode_request_with(&bytes, all_but),
        Err(FrameError::UnknownOp(b'O'))
    );
    // A name that is no key is `E 1`; one over 128 bytes does not fit.
    let spaced_frame = [&[b'O', 0, 11][..], &3u64.to_be_bytes(), b"a b"].concat();
    assert_eq!(
        decode_request_with(&spaced_frame, Capabilities::OBSERVE),
        Ok(Some((
            Decoded::Rejected {
                rid: 3,
                kind: RequestKind::Observe,
                code: ErrorCode::BadKey
            },
            spaced_frame.len()
        )))
    );
    assert!(matches!(
        decode_request_with(&[b'O', 0, 137], Capabilities::OBSERVE),
        Err(FrameError::TooLong { .. })
    ));
    assert_eq!(Capabilities::KNOWN, Capabilities(0x1f));
}

#[test]
fn an_observe_reply_round_trips_and_answers_only_an_observe() {
    for observed in [
        Observed::NO_LEADER,
        Observed {
            state: LeaderState::Connected,
            term: 42,
            lease_ms: 9_000,
            label: LeaderLabel::new("host-a/1").unwrap(),
        },
        Observed {
            state: LeaderState::Departed,
            term: 41,
            lease_ms: 1,
            label: LeaderLabel::EMPTY,
        },
    ] {
        let reply = Reply::Observed { rid: 7, observed };
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        assert_eq!(bytes.len(), 89);
        assert_eq!(Reply::decode(&bytes), Ok(Some((reply, 89))));
        assert_eq!(reply.check(), Ok(()));
        assert!(reply.answers(RequestKind::Observe));
        assert!(!reply.answers(RequestKind::Acquire));
        assert!(!reply.answers(RequestKind::AcquirePermits));
    }
}

#[test]
fn an_observe_reply_that_does_not_fit_its_state_is_refused() {
    let refused = [
        (observed_frame(3, 1, 0, b"", 0), ReplyError::BadObserved),
        (observed_frame(0, 1, 0, b"", 0), ReplyError::BadObserved),
        (observed_frame(0, 0, 5, b"", 0), ReplyError::BadObserved),
        (observed_frame(0, 0, 0, b"x", 0), ReplyError::BadObserved),
        (observed_frame(1, 0, 5, b"x", 0), ReplyError::Zero),
        (observed_frame(1, 1, 5, b"x", 1), ReplyError::BadObserved),
        (observed_frame(1, 1, 5, b"\x07", 0), ReplyError::BadObserved),
        (
            observed_frame(1, 1, 5, &[0xff, 0xfe], 0),
            ReplyError::BadObserved,
        ),
    ];
    for (bytes, error) in refused {
        assert_eq!(Reply::decode(&bytes), Err(error), "{bytes:?}");
    }
    let mut too_long = observed_frame(1, 1, 5, b"", 0);
    too_long[3 + 21] = 65;
    assert_eq!(Reply::decode(&too_long), Err(ReplyError::BadObserved));
    let bad_value = Reply::Observed {
        rid: 1,
        observed: Observed {
            term: 3,
            ..Observed::NO_LEADER
        },
    };
    assert_eq!(bad_value.check(), Err(ReplyError::BadObserved));
}

#[test]
fn a_shared_acquire_and_a_downgrade_round_trip_and_decode_only_with_shared() {
    use ticketing_core::wire::{AcquireSharedRequest, DowngradeRequest};
    let keys = KeyGroup::new(vec![
        Key::from_text("catalog").unwrap(),
        Key::from_text("orders/42").unwrap(),
    ])
    .unwrap();
    let shared = Request::AcquireShared(AcquireSharedRequest {
        rid: 7,
        wait_s: 5,
        lease_s: 30,
        max_hold_s: 0,
        modes: 0b01,
        keys: keys.clone(),
    });
    let frame = shared.to_frame();
    assert_eq!(&frame[..3], &[b'Y', 0, 17 + 8 + 10]);
    assert_eq!(frame.len(), shared.frame_len());
    assert_eq!(
        decode_request_with(&frame, Capabilities::SHARED),
        Ok(Some((Decoded::Request(shared.clone()), frame.len())))
    );
    // Not negotiated: an unknown op, as for a published client.
    assert_eq!(
        decode_request_with(&frame, Capabilities::KNOWN.intersection(Capabilities(0xf))),
        Err(FrameError::UnknownOp(b'Y'))
    );
    let downgrade = Request::Downgrade(DowngradeRequest {
        rid: 8,
        token: 42,
        keys,
    });
    let frame = downgrade.to_frame();
    assert_eq!(frame[0], b'D');
    assert_eq!(
        decode_request_with(&frame, Capabilities::SHARED),
        Ok(Some((Decoded::Request(downgrade), frame.len())))
    );
    // A mode bit past the last key is `E 10`.
    let mut bad = shared.to_frame();
    bad[3 + 14..3 + 16].copy_from_slice(&0b100u16.to_be_bytes());
    assert!(matches!(
        decode_request_with(&bad, Capabilities::SHARED),
        Ok(Some((
            Decoded::Rejected {
                rid: 7,
                code: ErrorCode::BadModes,
                ..
            },
            _
        )))
    ));
    // The `D` reply: rid only.
    let reply = Reply::Downgraded { rid: 8 };
    let mut bytes = Vec::new();
    reply.encode(&mut bytes);
    assert_eq!(
        bytes,
        [vec![b'D', 0, 8], 8u64.to_be_bytes().to_vec()].concat()
    );
    assert_eq!(Reply::decode(&bytes), Ok(Some((reply, bytes.len()))));
    assert!(reply.answers(RequestKind::Downgrade));
    assert!(!reply.answers(RequestKind::ReleaseSet));
}
