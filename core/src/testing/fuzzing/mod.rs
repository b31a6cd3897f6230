//! Entry points shared by the cargo-fuzz targets in `fuzz/` and the stable
//! tests that replay their corpora, so CI exercises the same code without a
//! nightly toolchain. Each function panics on a violated invariant.

mod client_session;
mod cluster_clients;
mod cluster_peer_frames;
mod codecs;
mod handshake;
mod line;
mod peer_handshake;
mod raft_group;
mod script;

pub use client_session::client_session;
pub use cluster_clients::cluster_clients;
pub use cluster_peer_frames::cluster_peer_frames;
pub use codecs::replicated_codecs;
pub use handshake::client_handshake;
pub use line::{line_decoder, line_session};
pub use peer_handshake::peer_handshake;
pub use raft_group::raft_hostile_peer;

use crate::auth::{
    ClientHandshake, ClientHandshakeStatus, HELLO_LEN, SINGLE_FINGERPRINT, WireMode,
};
use crate::machine::Machine;
use crate::server::{ConnId, ConnState, Server};
use crate::time::{Duration, Instant};
use crate::wire::{
    Capabilities, Decoded, NO_LEADER_SLOT, PushKind, RELEASE_SET_FRAME_LEN_MAX, Reply,
    RequestDecoder,
};

use self::script::{Cursor, fuzz_request, tiny_server_config};

/// Feeds `data` to a [`RequestDecoder`] in chunks whose sizes come from the
/// low four bits of the first byte, on a connection that negotiated the
/// capabilities in its top four bits (EXTEND lets `W` and `H` decode,
/// PERMITS `Q`, OBSERVE `O`; all four also SHARED's `Y` and `D`), and
/// checks: no panic, bounded buffering, every request it yields
/// re-encodes to bytes that decode to the same request, and the sequence
/// decoded (requests, rejections, the error that ends it) is the same as
/// when the whole input arrives at once.
pub fn request_decoder(data: &[u8]) {
    let Some((&chunk_seed, data)) = data.split_first() else {
        return;
    };
    let chunk_len = usize::from(chunk_seed % 16) + 1;
    // Four bits: the first four capabilities in every mix; all four set
    // stands for every capability this build knows (SHARED too).
    let caps = match chunk_seed >> 4 {
        0xF => Capabilities::KNOWN,
        bits => Capabilities(u32::from(bits)),
    };
    let chunked = decode_requests(data, chunk_len, caps);
    let whole = decode_requests(data, data.len().max(1), caps);
    assert_eq!(chunked, whole, "chunks of {chunk_len} decode differently");
}

/// Everything a [`RequestDecoder`] granted `caps` yields for `data` pushed
/// in chunks of `chunk_len`, up to and including the first error.
fn decode_requests(
    data: &[u8],
    chunk_len: usize,
    caps: Capabilities,
) -> Vec<Result<Decoded, crate::wire::FrameError>> {
    let mut decoder = RequestDecoder::new();
    decoder.grant(caps);
    let mut seen = Vec::new();
    for chunk in data.chunks(chunk_len) {
        decoder.push(chunk);
        loop {
            match decoder.next() {
                Ok(Some(decoded)) => {
                    match &decoded {
                        Decoded::Request(request) => {
                            let mut bytes = Vec::new();
                            request.encode(&mut bytes);
                            let mut again = RequestDecoder::new();
                            again.grant(caps);
                            again.push(&bytes);
                            assert_eq!(again.next(), Ok(Some(Decoded::Request(request.clone()))));
                            assert_eq!(again.buffered(), 0);
                        }
                        Decoded::Rejected { code, kind, .. } => {
                            assert!(code.allowed_for(*kind), "{code:?} may not answer {kind:?}");
                        }
                    }
                    seen.push(Ok(decoded));
                }
                Ok(None) => break,
                Err(error) => {
                    seen.push(Err(error));
                    return seen;
                }
            }
        }
        assert!(
            decoder.buffered() < RELEASE_SET_FRAME_LEN_MAX,
            "decoder holds {} bytes after draining",
            decoder.buffered()
        );
    }
    seen
}

/// Decodes reply frames from `data`: never panics, and every reply it
/// accepts encodes back to the same bytes. Then feeds `data` to a ready
/// single-mode client [`crate::client::Session`] in chunks whose sizes
/// come from the first byte (the session's partial-frame path), and checks
/// that it reports exactly what it reports when the input arrives whole.
pub fn reply_decoder(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some((reply, used))) = Reply::decode(rest) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        assert_eq!(bytes, &rest[..used]);
        rest = &rest[used..];
    }
    let Some((&chunk_seed, frames)) = data.split_first() else {
        return;
    };
    let chunk_len = usize::from(chunk_seed % 16) + 1;
    let chunked = session_events(frames, chunk_len);
    let whole = session_events(frames, frames.len().max(1));
    assert_eq!(chunked, whole, "chunks of {chunk_len} end differently");
}

/// The events of a ready session fed `frames` in chunks of `chunk_len`.
fn session_events(frames: &[u8], chunk_len: usize) -> Vec<crate::client::SessionEvent> {
    use crate::auth::{Hello, SINGLE_SELF_SLOT};
    use crate::client::{Session, SessionConfig};
    let now = Instant::from_millis(1);
    let mut session = Session::new(now, SessionConfig::single(b""));
    let hello = Hello {
        mode: WireMode::Single,
        self_slot: SINGLE_SELF_SLOT,
        nonce: [7; 16],
    };
    session.handle_input(now, &hello.encode());
    session.handle_input(now, &[crate::auth::RESULT_ACCEPTED]);
    assert!(session.is_ready());
    for chunk in frames.chunks(chunk_len) {
        session.handle_input(now, chunk);
    }
    let mut events = Vec::new();
    while let Some(event) = session.poll_event() {
        events.push(event);
    }
    events
}

struct FuzzConn {
    id: ConnId,
    /// Everything the server sent to this connection.
    received: Vec<u8>,
    closed: bool,
}

/// Checks that `bytes` is a hello, optionally a result byte, and then only
/// well-formed replies.
fn check_server_output(bytes: &[u8]) {
    if bytes.len() < HELLO_LEN {
        return;
    }
    let mut client =
        ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
    let (used, status) = client.handle_input(&bytes[..HELLO_LEN]);
    assert_eq!(
        (used, status),
        (HELLO_LEN, ClientHandshakeStatus::SendProof)
    );
    // A failed line-looking answer is told so in the line dialect, late.
    if &bytes[HELLO_LEN..] == b"Eauth_failed\n" {
        return;
    }
    let Some((&result, mut rest)) = bytes[HELLO_LEN..].split_first() else {
        return;
    };
    assert!(result <= 1, "result byte {result}");
    assert!(result == 1 || rest.is_empty(), "bytes after a rejection");
    let mut extension = ExtensionReplies::default();
    while !rest.is_empty() {
        match Reply::decode(rest) {
            Ok(Some((reply, used))) => {
                assert!(!matches!(reply, Reply::Leader { .. } | Reply::Moved { .. }));
                extension.check(&reply);
                rest = &rest[used..];
            }
            Ok(None) => panic!("server wrote a partial frame"),
            Err(error) => panic!("server wrote a bad frame: {error:?}"),
        }
    }
}

/// What one connection's replies say about the negotiated extension, in
/// the order they were written (docs/protocol.md §8).
#[derive(Default)]
struct ExtensionReplies {
    /// The capabilities an `X` answer granted, if one came.
    granted: Option<Capabilities>,
    /// Tokens granted on the connection.
    tokens: Vec<u64>,
    /// Tokens whose loss was pushed: nothing more is said of them.
    lost: Vec<u64>,
}

impl ExtensionReplies {
    /// Checks one reply: at most one `X` answer, granting only bits the
    /// server knows; a `W` answer only on a connection granted EXTEND; a
    /// `P` only on one granted PUSH, about a token granted on it, at most
    /// one loss per token and nothing after it, and a lease left only in a
    /// warning.
    fn check(&mut self, reply: &Reply) {
        match *reply {
            Reply::Negotiated { granted, .. } => {
                assert!(self.granted.is_none(), "a second X granted");
                assert!(Capabilities::KNOWN.contains(granted), "{granted:?}");
                self.granted = Some(granted);
            }
            Reply::Extended { .. } => assert!(
                self.granted
                    .is_some_and(|g| g.contains(Capabilities::EXTEND)),
                "a W answered without EXTEND"
            ),
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => {
                self.tokens.push(token);
            }
            Reply::Permits { token, .. } => {
                assert!(
                    self.granted
                        .is_some_and(|g| g.contains(Capabilities::PERMITS)),
                    "a Q answered without PERMITS"
                );
                self.tokens.push(token);
            }
            Reply::Downgraded { .. } => assert!(
                self.granted
                    .is_some_and(|g| g.contains(Capabilities::SHARED)),
                "a D answered without SHARED"
            ),
            Reply::Observed { observed, .. } => {
                assert!(
                    self.granted
                        .is_some_and(|g| g.contains(Capabilities::OBSERVE)),
                    "an O answered without OBSERVE"
                );
                assert!(
                    Reply::Observed { rid: 1, observed }.check().is_ok(),
                    "an O whose fields do not fit its state: {observed:?}"
                );
            }
            Reply::Push {
                token,
                kind,
                lease_ms,
            } => {
                assert!(
                    self.granted.is_some_and(|g| g.contains(Capabilities::PUSH)),
                    "a P without PUSH"
                );
                assert!(self.tokens.contains(&token), "a P about another's token");
                assert!(!self.lost.contains(&token), "a P after the loss");
                if kind == PushKind::LeaseEnding {
                    assert!(lease_ms > 0, "a warning with nothing left");
                } else {
                    assert_eq!(lease_ms, 0, "a loss with lease left");
                    self.lost.push(token);
                }
            }
            _ => {}
        }
    }
}

/// Runs a whole single-mode server on a script read from `data`: connects,
/// raw bytes, valid handshakes and requests (the extension's `X`, `W` and
/// `H` among them), flushes, closes and clock jumps.
/// Checks that the server never panics, only ever writes a hello, a result
/// byte and well-formed replies, extension replies and pushes only as
/// negotiated (see `ExtensionReplies`), and that once every connection is closed and
/// every lease has run out, the table is empty (no ghost lock, no lost waiter).
pub fn server_session(data: &[u8]) {
    let mut harness = ServerHarness::new();
    let mut cursor = Cursor { data };
    while let Some(op) = cursor.byte() {
        let pick = usize::from(cursor.byte().unwrap_or(0));
        harness.step(&mut cursor, op, pick);
        // Every output is dropped: the harness reads what the
        // connections were sent, and nothing else is asked of it.
        while harness.server.poll_output(harness.now).is_some() {}
        if let Some(deadline) = harness.server.poll_timeout() {
            assert!(deadline.as_micros() > 0);
        }
    }
    harness.finish();
}

/// The server under test and its connections.
struct ServerHarness {
    now: Instant,
    server: Server,
    conns: Vec<FuzzConn>,
    /// The last request id used.
    rid: u64,
}

impl ServerHarness {
    fn new() -> ServerHarness {
        let config = tiny_server_config(256);
        let now = Instant::from_millis(1);
        ServerHarness {
            now,
            server: Server::new(config, 1, now),
            conns: Vec::new(),
            rid: 0,
        }
    }

    /// One script step, picked by `op`, on the live connection `pick` picks.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8, pick: usize) {
        let live: Vec<usize> = (0..self.conns.len())
            .filter(|&i| !self.conns[i].closed)
            .collect();
        let target = (!live.is_empty()).then(|| live[pick % live.len()]);
        match (op % 8, target) {
            (0, _) => self.connect(pick),
            (1, Some(index)) => self.send_raw(cursor, index),
            (2, Some(index)) => self.send_proof(index),
            (3, Some(index)) => self.send_request(cursor, index),
            (4, _) => self.advance_clock(pick),
            (5, Some(index)) => self.flush(index),
            (6, Some(index)) => self.short_write(cursor, index),
            (7, Some(index)) => self.close(index),
            _ => {}
        }
    }

    /// Connects from one of four addresses.
    fn connect(&mut self, pick: usize) {
        let mut nonce = [0u8; 16];
        nonce[0] = pick as u8;
        // A few sources, so the per-source handshake cap is exercised.
        let source = std::net::IpAddr::from([10, 0, 0, pick as u8 % 4]);
        if let Some(id) = self.server.handle_connect(self.now, nonce, source) {
            self.conns.push(FuzzConn {
                id,
                received: Vec::new(),
                closed: false,
            });
        }
    }

    /// Sends raw bytes.
    fn send_raw(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        let len = usize::from(cursor.byte().unwrap_or(0));
        let bytes = cursor.bytes(len).to_vec();
        self.server
            .handle_input(self.now, self.conns[index].id, &bytes);
    }

    /// Takes the output and, once the hello is there, sends the proof.
    fn send_proof(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        let mut out = Vec::new();
        self.server.poll_transmit(conn.id, &mut out);
        conn.received.extend_from_slice(&out);
        if conn.received.len() >= HELLO_LEN {
            let mut client =
                ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
            client.handle_input(&conn.received[..HELLO_LEN]);
            if let Some(proof) = client.proof() {
                self.server.handle_input(self.now, conn.id, &proof);
            }
        }
    }

    /// Sends a well-formed request.
    fn send_request(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        self.rid += 1;
        // Tokens start at 1 here, so small numbers hit live grants.
        let request = fuzz_request(cursor, self.rid, 1);
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        self.server
            .handle_input(self.now, self.conns[index].id, &bytes);
    }

    /// Moves the clock on by `pick` × 20 ms and serves the timers.
    fn advance_clock(&mut self, pick: usize) {
        self.now = self
            .now
            .saturating_add(Duration::from_millis(pick as u64 * 20));
        self.server.handle_timeout(self.now);
    }

    /// Takes the output, reports it flushed, and closes if the server asked.
    fn flush(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        let mut out = Vec::new();
        let state = self.server.poll_transmit(conn.id, &mut out);
        conn.received.extend_from_slice(&out);
        self.server.handle_flushed(self.now, conn.id);
        if state == ConnState::CloseAfterFlush {
            self.server.handle_closed(self.now, conn.id);
            conn.closed = true;
        }
    }

    /// Takes the output, of which only a prefix is written.
    fn short_write(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        // A short write: only a prefix of what was taken goes out.
        let conn = &mut self.conns[index];
        let mut out = Vec::new();
        self.server.poll_transmit(conn.id, &mut out);
        let written = usize::from(cursor.byte().unwrap_or(0)).min(out.len());
        self.server.handle_written(self.now, conn.id, written);
        conn.received.extend_from_slice(&out);
    }

    /// Closes the connection.
    fn close(&mut self, index: usize) {
        self.server.handle_closed(self.now, self.conns[index].id);
        self.conns[index].closed = true;
    }

    /// Checks every connection's output, closes them all and lets every
    /// lease end: nothing is left.
    fn finish(mut self) {
        for conn in &mut self.conns {
            let mut out = Vec::new();
            self.server.poll_transmit(conn.id, &mut out);
            conn.received.extend_from_slice(&out);
            check_server_output(&conn.received);
            if !conn.closed {
                self.server.handle_closed(self.now, conn.id);
            }
        }
        assert_eq!(self.server.stats().connections, 0);
        assert_eq!(
            self.server.stats().lock.waiters,
            0,
            "waiters outlived their connections"
        );
        // Every lease (at most 250 s: raw bytes can carry any valid frame) runs
        // out, then the sweep removes the keys.
        self.now = self.now.saturating_add(Duration::from_secs(251));
        self.server.handle_timeout(self.now);
        self.now = self.now.saturating_add(Duration::from_secs(10));
        self.server.handle_timeout(self.now);
        assert_eq!(
            self.server.stats().lock.keys,
            0,
            "keys left after every lease ended"
        );
    }
}

/// Feeds `data` to a [`crate::cluster::peer::PeerDecoder`] keyed with a fixed key,
/// in chunks whose sizes come from the low bits of the first byte, and
/// checks: no panic, bounded buffering, and every message it yields seals
/// again to exactly the bytes it came from. With the first byte's high bit
/// set, the tag of every whole frame in `data` is first rewritten to the
/// valid one (so the fuzzer reaches the payload decoder past the MAC);
/// otherwise tags are as given and almost every frame must fail.
pub fn peer_decoder(data: &[u8]) {
    use crate::cluster::peer::{
        FRAME_LEN_BYTES, FRAME_LEN_MAX, FRAME_LEN_MIN, FRAME_TAG_LEN, PeerDecoder, PeerSealer,
    };
    const KEY: [u8; 32] = [0x5a; 32];
    let Some((&seed, data)) = data.split_first() else {
        return;
    };
    let chunk_len = usize::from(seed % 64) + 1;
    let mut data = data.to_vec();
    if seed & 0x80 != 0 {
        fix_up_tags(&mut data, &KEY);
    }
    let mut decoder = PeerDecoder::from_key(&KEY);
    let mut mirror = PeerSealer::from_key(&KEY);
    let mut consumed = 0;
    for chunk in data.chunks(chunk_len) {
        decoder.push(chunk);
        loop {
            match decoder.next() {
                Ok(Some(msg)) => {
                    let mut bytes = Vec::new();
                    mirror
                        .seal(&msg, &mut bytes)
                        .expect("a decoded message seals");
                    assert_eq!(
                        bytes.as_slice(),
                        &data[consumed..consumed + bytes.len()],
                        "a decoded frame seals back to its own bytes"
                    );
                    consumed += bytes.len();
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(
            decoder.buffered() < FRAME_LEN_BYTES + FRAME_LEN_MAX,
            "peer decoder holds {} bytes after draining",
            decoder.buffered()
        );
    }

    /// Rewrites the tag of each whole frame in `data`, in order, to the one
    /// a sealer with `key` would have written.
    fn fix_up_tags(data: &mut [u8], key: &[u8; 32]) {
        use hmac::{Hmac, KeyInit, Mac};
        let mut at = 0;
        let mut seq = 0u64;
        while let Some(len) = data.get(at..at + FRAME_LEN_BYTES) {
            let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
            let end = at + FRAME_LEN_BYTES + len;
            if !(FRAME_LEN_MIN..=FRAME_LEN_MAX).contains(&len) || end > data.len() {
                return;
            }
            let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key)
                .expect("HMAC accepts keys of any length");
            mac.update(&seq.to_be_bytes());
            mac.update(&data[at..end - FRAME_TAG_LEN]);
            let tag = mac.finalize().into_bytes();
            data[end - FRAME_TAG_LEN..end].copy_from_slice(&tag[..FRAME_TAG_LEN]);
            seq += 1;
            at = end;
        }
    }
}
