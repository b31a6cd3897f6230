//! Fuzz entry points of the line dialect: its request decoder and reply
//! codec, and a whole single-mode server whose clients speak it.

use std::collections::{BTreeMap, BTreeSet};

use super::script::{Cursor, tiny_server_config};
use crate::auth::HELLO_LEN;
use crate::line::{
    LINE_KEY_SCAN_MAX, LineDecoded, LineDecoder, LineFrameError, LineReply, LineRequest,
    encode_line_acquire, encode_line_release, line_answer,
};
use crate::machine::Machine;
use crate::server::{ConnId, ConnState, Server};
use crate::time::{Duration, Instant};

/// Feeds `data` to a [`LineDecoder`] in chunks whose sizes come from the
/// first byte, and checks: no panic, bounded buffering, every request it
/// yields re-encodes to bytes that decode to the same request, the sequence
/// is the same however the input is chunked; and every reply
/// [`LineReply::decode`] accepts from `data` encodes back to its bytes.
pub fn line_decoder(data: &[u8]) {
    let Some((&chunk_seed, rest)) = data.split_first() else {
        return;
    };
    let chunk_len = usize::from(chunk_seed % 64) + 1;
    let chunked = decode_all(rest, chunk_len);
    let whole = decode_all(rest, rest.len().max(1));
    assert_eq!(chunked, whole, "chunks of {chunk_len} decode differently");
    let mut replies = rest;
    while let Ok(Some((reply, used))) = LineReply::decode(replies) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        assert_eq!(bytes, &replies[..used]);
        replies = &replies[used..];
    }
}

fn decode_all(data: &[u8], chunk_len: usize) -> Vec<Result<LineDecoded, LineFrameError>> {
    let mut decoder = LineDecoder::new();
    let mut seen = Vec::new();
    for chunk in data.chunks(chunk_len) {
        decoder.push(chunk);
        loop {
            match decoder.next() {
                Ok(Some(decoded)) => {
                    if let LineDecoded::Request(request) = &decoded {
                        let mut bytes = Vec::new();
                        match request {
                            LineRequest::Acquire {
                                wait_s,
                                lease_s,
                                owner,
                                key,
                            } => encode_line_acquire(
                                &mut bytes,
                                *wait_s,
                                *lease_s,
                                *owner,
                                key.as_bytes(),
                            ),
                            LineRequest::Release { token, key } => {
                                encode_line_release(&mut bytes, *token, key.as_bytes());
                            }
                        }
                        let mut again = LineDecoder::new();
                        again.push(&bytes);
                        assert_eq!(again.next(), Ok(Some(decoded.clone())));
                        assert_eq!(again.buffered(), 0);
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
        // One partial request at most: the fixed part and a bounded scan.
        assert!(
            decoder.buffered() <= 1 + 12 + LINE_KEY_SCAN_MAX,
            "decoder holds {} bytes after draining",
            decoder.buffered()
        );
    }
    seen
}

const LINE_KEYS: [&[u8]; 4] = [b"a", b"b", b"c", b"bad key"];

struct LineConn {
    id: ConnId,
    received: Vec<u8>,
    /// The line handshake was answered.
    answered: bool,
    /// The first bytes the connection sent were a correct line answer.
    clean: bool,
    /// Only well-formed requests were sent (no raw bytes).
    structured: bool,
    /// Requests sent that end with one terminal reply.
    requests: usize,
    owners: BTreeSet<(u64, Vec<u8>)>,
    tokens: BTreeSet<(u64, Vec<u8>)>,
    closed: bool,
}

/// Runs a single-mode server whose clients speak the line dialect, on a
/// script read from `data`: connects, line handshakes, well-formed requests
/// (any wait and lease, valid and invalid keys, tokens near live ones), raw
/// bytes, flushes, closes and clock jumps. Checks: no panic; after the
/// hello a line connection receives only well-formed line replies; every
/// reply echoes an owner or token and key its connection sent; every grant
/// has a new token; a connection that only sent well-formed requests gets
/// exactly one terminal reply per request once every wait has ended; and
/// once everything is closed and every lease has run out nothing is left.
pub fn line_session(data: &[u8]) {
    let mut harness = LineHarness::new();
    let mut cursor = Cursor { data };
    while let Some(op) = cursor.byte() {
        let pick = usize::from(cursor.byte().unwrap_or(0));
        harness.step(&mut cursor, op, pick);
        // Every output is dropped: the harness reads what the
        // connections were sent, and nothing else is asked of it.
        while harness.server.poll_output(harness.now).is_some() {}
    }
    harness.finish();
}

/// The server under test and its line connections.
struct LineHarness {
    now: Instant,
    server: Server,
    conns: Vec<LineConn>,
}

impl LineHarness {
    fn new() -> LineHarness {
        let config = tiny_server_config(1 << 16);
        let now = Instant::from_millis(1);
        LineHarness {
            now,
            server: Server::new(config, 1, now),
            conns: Vec::new(),
        }
    }

    /// One script step, picked by `op`, on the live connection `pick` picks.
    fn step(&mut self, cursor: &mut Cursor<'_>, op: u8, pick: usize) {
        let live: Vec<usize> = (0..self.conns.len())
            .filter(|&i| !self.conns[i].closed)
            .collect();
        let target = (!live.is_empty()).then(|| live[pick % live.len()]);
        match (op % 7, target) {
            (0, _) => self.connect(pick),
            (1, Some(index)) => self.send_raw(cursor, index),
            (2, Some(index)) => self.answer_hello(index),
            (3, Some(index)) => self.send_request(cursor, index, pick),
            (4, _) => self.advance_clock(pick),
            (5, Some(index)) => self.flush(index),
            (6, Some(index)) => self.close(index),
            _ => {}
        }
    }

    /// Connects from one of four addresses, with a nonce `pick` chooses.
    fn connect(&mut self, pick: usize) {
        let mut nonce = [pick as u8; 16];
        nonce[3] = b'\n';
        let source = std::net::IpAddr::from([10, 0, 0, pick as u8 % 4]);
        if let Some(id) = self.server.handle_connect(self.now, nonce, source) {
            self.conns.push(LineConn {
                id,
                received: Vec::new(),
                answered: false,
                clean: false,
                structured: true,
                requests: 0,
                owners: BTreeSet::new(),
                tokens: BTreeSet::new(),
                closed: false,
            });
        }
    }

    /// Sends raw bytes: the connection is no longer well-formed.
    fn send_raw(&mut self, cursor: &mut Cursor<'_>, index: usize) {
        let len = usize::from(cursor.byte().unwrap_or(0));
        let bytes = cursor.bytes(len).to_vec();
        let conn = &mut self.conns[index];
        conn.structured = false;
        conn.answered |= !bytes.is_empty();
        self.server
            .handle_input(self.now, self.conns[index].id, &bytes);
    }

    /// Takes the output and, once the hello is there, answers it.
    fn answer_hello(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        take(&mut self.server, conn);
        if !conn.answered && conn.received.len() >= HELLO_LEN {
            let challenge = &conn.received[13..27];
            let mut answer = line_answer(b"", challenge).to_vec();
            answer.push(b'\n');
            conn.answered = true;
            conn.clean = true;
            self.server.handle_input(self.now, conn.id, &answer);
        }
    }

    /// Sends a well-formed `A` or `R` (where the answer belongs, if not yet
    /// answered).
    fn send_request(&mut self, cursor: &mut Cursor<'_>, index: usize, pick: usize) {
        let kind = cursor.byte().unwrap_or(0);
        let arg = cursor.byte().unwrap_or(0);
        let key = LINE_KEYS[usize::from(kind >> 1) % LINE_KEYS.len()];
        let conn = &mut self.conns[index];
        let mut bytes = Vec::new();
        if kind & 1 == 0 {
            // Waits and leases across every rule: 0, short, > 255;
            // leases 0 and over 250 included.
            let wait_s = [0u16, 1, 2, 300][usize::from(arg & 3)];
            let lease_s = [0u16, 1, 2, 251][usize::from((arg >> 2) & 3)];
            let owner = u64::from(arg) << 56 | pick as u64;
            encode_line_acquire(&mut bytes, wait_s, lease_s, owner, key);
            conn.owners.insert((owner, key.to_vec()));
        } else {
            // Tokens start at 1 here, so small numbers hit grants.
            let token = u64::from(arg % 16);
            encode_line_release(&mut bytes, token, key);
            conn.tokens.insert((token, key.to_vec()));
        }
        if conn.answered {
            conn.requests += 1;
        } else {
            // Request bytes where the answer belongs.
            conn.answered = true;
            conn.structured = false;
        }
        self.server.handle_input(self.now, conn.id, &bytes);
    }

    /// Moves the clock on by `pick` × 40 ms and serves the timers.
    fn advance_clock(&mut self, pick: usize) {
        self.now = self
            .now
            .saturating_add(Duration::from_millis(pick as u64 * 40));
        self.server.handle_timeout(self.now);
    }

    /// Takes the output, reports it flushed, and closes if the server asked.
    fn flush(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        let state = take(&mut self.server, conn);
        self.server.handle_flushed(self.now, conn.id);
        if state == ConnState::CloseAfterFlush {
            self.server.handle_closed(self.now, conn.id);
            conn.closed = true;
        }
    }

    /// Closes the connection.
    fn close(&mut self, index: usize) {
        self.server.handle_closed(self.now, self.conns[index].id);
        self.conns[index].closed = true;
    }

    /// Lets every wait and then every lease end, checking each
    /// connection's output and that nothing is left.
    fn finish(mut self) {
        // Every wait (at most 255 s) ends.
        self.now = self.now.saturating_add(Duration::from_secs(256));
        self.server.handle_timeout(self.now);
        let mut granted = BTreeMap::new();
        for conn in &mut self.conns {
            let state = take(&mut self.server, conn);
            let open = !conn.closed && state == ConnState::Open;
            check_line_output(conn, open, &mut granted);
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
        self.now = self.now.saturating_add(Duration::from_secs(261));
        self.server.handle_timeout(self.now);
        assert_eq!(
            self.server.stats().lock.keys,
            0,
            "keys left after every lease ended"
        );
    }
}

fn take(server: &mut Server, conn: &mut LineConn) -> ConnState {
    let mut out = Vec::new();
    let state = server.poll_transmit(conn.id, &mut out);
    conn.received.extend_from_slice(&out);
    state
}

/// Checks one connection's whole output (see [`line_session`]).
fn check_line_output(conn: &LineConn, open: bool, granted: &mut BTreeMap<u64, ConnId>) {
    if conn.received.len() < HELLO_LEN || !conn.clean {
        return;
    }
    // Raw bytes may carry requests with owners and tokens of their own.
    let echoes = conn.structured;
    let mut rest = &conn.received[HELLO_LEN..];
    let mut terminal = 0usize;
    let mut closing_reason = false;
    while !rest.is_empty() {
        let (reply, used) = match LineReply::decode(rest) {
            Ok(Some(found)) => found,
            other => panic!("bad line output {other:?} in {rest:?}"),
        };
        rest = &rest[used..];
        match reply {
            LineReply::Acquired { token, owner, key } => {
                assert!(
                    !echoes || conn.owners.contains(&(owner, key.to_vec())),
                    "owner echo"
                );
                assert!(
                    granted.insert(token, conn.id).is_none(),
                    "token {token} twice"
                );
                terminal += 1;
            }
            LineReply::TimedOut { owner, key } | LineReply::Busy { owner, key } => {
                assert!(
                    !echoes || conn.owners.contains(&(owner, key.to_vec())),
                    "owner echo"
                );
                terminal += 1;
            }
            LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                assert!(
                    !echoes || conn.tokens.contains(&(token, key.to_vec())),
                    "token echo"
                );
                terminal += 1;
            }
            LineReply::Error { reason } => match reason {
                b"bad_key" => terminal += 1,
                b"bad_lease" => {}
                b"bad_op" | b"too_long" => closing_reason = true,
                other => panic!("unexpected E {other:?}"),
            },
            LineReply::Moved { .. } | LineReply::Leader { .. } => {
                panic!("single mode sent {reply:?}")
            }
        }
    }
    if conn.structured && open && !closing_reason {
        assert_eq!(terminal, conn.requests, "one terminal reply per request");
    }
}
