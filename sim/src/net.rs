//! The simulated network both worlds share: per-chunk delays, byte streams
//! split at random boundaries and kept in order, resets that cut what is in
//! flight at a random byte, server writes that reach the kernel in one or
//! two parts, and the oracle that decodes a client connection's two byte
//! streams.
//!
//! Each helper draws from the `net` stream in exactly the order the worlds
//! always drew, so a seed's run (and its trace hash) does not depend on
//! which world's code made the draw.

use ticketing_core::auth::{HELLO_LEN, PROOF_LEN};
use ticketing_core::line::{
    LINE_ANSWER_LEN, LINE_MAX_WAIT_S, LineDecoded, LineDecoder, LineReply, LineRequest,
};
use ticketing_core::wire::{
    AcquireRequest, Decoded, ErrorCode, KeyGroup, ReleaseRequest, Reply, Request, RequestDecoder,
};

use crate::config::SimConfig;
use crate::rng::Rng;

/// One chunk's one-way delay: the minimum, uniform jitter, and now and then
/// a spike.
pub(crate) fn delay(config: &SimConfig, net: &mut Rng) -> u64 {
    let mut delay = config.net_delay_min_us + net.below(config.net_jitter_us + 1);
    if net.chance(config.net_spike_ppm) {
        delay += net.below(config.net_spike_max_us + 1);
    }
    delay
}

/// Splits `bytes` at random boundaries (TCP keeps the order, not the
/// segmentation): the chunks, in order.
pub(crate) fn chunks(net: &mut Rng, mut bytes: Vec<u8>) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    while bytes.len() > 1 && net.chance(300_000) {
        let at = 1 + net.index(bytes.len() - 1);
        let rest = bytes.split_off(at);
        chunks.push(std::mem::replace(&mut bytes, rest));
    }
    chunks.push(bytes);
    chunks
}

/// One part of a server write: when it reaches the kernel, its bytes, and
/// whether it is the last.
pub(crate) struct WritePart {
    pub(crate) at_us: u64,
    pub(crate) bytes: Vec<u8>,
    pub(crate) done: bool,
}

/// When a taken output reaches the kernel: after a moment (a reset before
/// then loses the bytes and makes their grants ghosts), and with chance
/// `partial_ppm` in two parts, a prefix first and the rest later (and
/// before the driver can report the take flushed).
pub(crate) fn write_parts(
    net: &mut Rng,
    now_us: u64,
    partial_ppm: u32,
    mut out: Vec<u8>,
) -> Vec<WritePart> {
    let mut parts = Vec::with_capacity(2);
    let mut at = now_us + net.below(3) * net.below(2_000);
    if out.len() > 1 && net.chance(partial_ppm) {
        let rest = out.split_off(1 + net.index(out.len() - 1));
        let first = std::mem::replace(&mut out, rest);
        parts.push(WritePart {
            at_us: at,
            bytes: first,
            done: false,
        });
        at += net.range(100, 100_000);
    }
    parts.push(WritePart {
        at_us: at,
        bytes: out,
        done: true,
    });
    parts
}

/// The network's side of one simulated TCP connection. Direction 0 runs
/// from the end that opened it (a client, or a dialing node) to the end
/// that accepted it; direction 1 back. Side 0 (the opener) reads direction
/// 1, side 1 reads direction 0.
pub(crate) struct Tcp {
    /// The transport is dead: bytes in flight after the cut are lost.
    pub(crate) reset: bool,
    /// Arrival time of the last chunk each way (TCP keeps order).
    pub(crate) last_us: [u64; 2],
    pub(crate) in_flight: [usize; 2],
    /// After a reset, how many more bytes each way still arrive.
    pub(crate) allow: [usize; 2],
}

impl Tcp {
    pub(crate) fn new() -> Self {
        Tcp {
            reset: false,
            last_us: [0, 0],
            in_flight: [0, 0],
            allow: [0, 0],
        }
    }

    /// Splits `bytes` at random boundaries and times each chunk's arrival
    /// in direction `dir`, no earlier than the chunk before it: the chunks
    /// with their arrival times, in order.
    pub(crate) fn transmit(
        &mut self,
        dir: usize,
        bytes: Vec<u8>,
        now_us: u64,
        config: &SimConfig,
        net: &mut Rng,
    ) -> Vec<(u64, Vec<u8>)> {
        let mut timed = Vec::new();
        for chunk in chunks(net, bytes) {
            let arrival = self.last_us[dir].max(now_us + delay(config, net));
            self.last_us[dir] = arrival;
            self.in_flight[dir] += chunk.len();
            timed.push((arrival, chunk));
        }
        timed
    }

    /// A chunk of `len` bytes in direction `dir` reached its end.
    pub(crate) fn landed(&mut self, dir: usize, len: usize) {
        self.in_flight[dir] -= len.min(self.in_flight[dir]);
    }

    /// What of a landed chunk its end reads: all of it, or after a reset
    /// only the bytes before the cut; `None` when nothing.
    pub(crate) fn keep(&mut self, dir: usize, mut bytes: Vec<u8>) -> Option<Vec<u8>> {
        if self.reset {
            bytes.truncate(self.allow[dir]);
            self.allow[dir] -= bytes.len();
        }
        (!bytes.is_empty()).then_some(bytes)
    }

    /// Kills the transport: each way, the bytes in flight after a random
    /// boundary are lost. Returns when each `open` side learns of it: after
    /// a network delay, and after the bytes that still reach it.
    pub(crate) fn reset(
        &mut self,
        open: [bool; 2],
        now_us: u64,
        config: &SimConfig,
        net: &mut Rng,
    ) -> [Option<u64>; 2] {
        self.reset = true;
        self.allow = self
            .in_flight
            .map(|in_flight| net.below(in_flight as u64 + 1) as usize);
        let mut seen = [None, None];
        for side in 0..2 {
            if open[side] {
                let at = (now_us + delay(config, net)).max(self.last_us[1 - side] + 1);
                seen[side] = Some(at);
            }
        }
        seen
    }
}

/// A random connection nonce of which the first `words` × 8 bytes are drawn.
pub(crate) fn nonce(net: &mut Rng, words: usize) -> [u8; 16] {
    let mut nonce = [0u8; 16];
    for word in 0..words {
        nonce[word * 8..word * 8 + 8].copy_from_slice(&net.next_u64().to_le_bytes());
    }
    nonce
}

/// The oracle's reading of a client connection: the requests in the
/// client's stream (after its proof) and the replies in the server's (after
/// its hello and result byte), with the server-stream offsets the server
/// itself counts when it decides which grants were written whole.
///
/// A line connection ([`StreamOracle::line`]) is read in the line dialect
/// and translated into v3 terms, so both worlds check both dialects with
/// one set of checkers: each line request gets a made-up request id, and a
/// reply is matched to the request it echoes (op family, key, owner or
/// token; `M` and `E` answer the oldest request in flight).
pub(crate) struct StreamOracle {
    /// Proof bytes still to skip, then requests.
    c2s_skip: usize,
    decoder: RequestDecoder,
    /// Hello and result bytes still to skip, then replies.
    s2c_skip: usize,
    reply_buf: Vec<u8>,
    /// Bytes of the server's output stream read so far, hello and result
    /// byte included.
    pub(crate) observed_total: u64,
    /// Bytes of that stream reported written so far.
    pub(crate) written_total: u64,
    /// The line dialect's state, on a line connection.
    line: Option<LineOracle>,
}

/// What the oracle keeps of a line connection.
struct LineOracle {
    decoder: LineDecoder,
    /// Line requests not answered yet: made-up rid, acquire or release,
    /// key, owner or token.
    in_flight: Vec<(u64, bool, Vec<u8>, u64)>,
    next_rid: u64,
    /// The slots' client addresses (cluster worlds), to read `M`/`L`.
    addresses: Vec<String>,
}

/// The rid a line reply gets when it echoes no request in flight (the
/// checkers report it).
pub(crate) const UNMATCHED_LINE_RID: u64 = u64::MAX;

impl StreamOracle {
    pub(crate) fn new() -> Self {
        StreamOracle {
            c2s_skip: PROOF_LEN,
            decoder: RequestDecoder::new(),
            s2c_skip: HELLO_LEN + 1,
            reply_buf: Vec::new(),
            observed_total: 0,
            written_total: 0,
            line: None,
        }
    }

    /// The oracle of a line connection: after the shared hello there is no
    /// result byte, and the client's answer is 44 bytes.
    pub(crate) fn line(addresses: Vec<String>) -> Self {
        StreamOracle {
            c2s_skip: LINE_ANSWER_LEN,
            s2c_skip: HELLO_LEN,
            line: Some(LineOracle {
                decoder: LineDecoder::new(),
                in_flight: Vec::new(),
                next_rid: 1,
                addresses,
            }),
            ..StreamOracle::new()
        }
    }

    /// The requests `bytes` (the next of the client's stream) complete.
    pub(crate) fn requests(&mut self, bytes: &[u8]) -> Vec<Request> {
        let skip = self.c2s_skip.min(bytes.len());
        self.c2s_skip -= skip;
        let mut arrived = Vec::new();
        if let Some(line) = self.line.as_mut() {
            line.decoder.push(&bytes[skip..]);
            while let Ok(Some(decoded)) = line.decoder.next() {
                if let LineDecoded::Request(request) = decoded {
                    arrived.push(line.translate(request));
                }
            }
            return arrived;
        }
        self.decoder.push(&bytes[skip..]);
        while let Ok(Some(decoded)) = self.decoder.next() {
            if let Decoded::Request(request) = decoded {
                arrived.push(request);
            }
        }
        arrived
    }

    /// The replies `new` (the next of the server's stream) completes, each
    /// with the stream offset just past its frame; and a bad frame, if one
    /// came (the buffer is dropped then, and the replies before it kept).
    pub(crate) fn replies(&mut self, new: &[u8]) -> (Vec<(Reply, u64)>, Option<String>) {
        self.observed_total += new.len() as u64;
        let skip = self.s2c_skip.min(new.len());
        self.s2c_skip -= skip;
        self.reply_buf.extend_from_slice(&new[skip..]);
        let mut used_total = 0;
        let mut replies = Vec::new();
        loop {
            let decoded = match self.line.as_mut() {
                Some(line) => line.decode(&self.reply_buf[used_total..]),
                None => Reply::decode(&self.reply_buf[used_total..])
                    .map(|decoded| decoded.map(|(reply, used)| (Some(reply), used)))
                    .map_err(|error| format!("{error:?}")),
            };
            match decoded {
                Ok(Some((reply, used))) => {
                    used_total += used;
                    // The buffer's end is the stream's observed end.
                    let unparsed = (self.reply_buf.len() - used_total) as u64;
                    if let Some(Reply::Negotiated { granted, .. }) = &reply {
                        // The client's extension ops decode from now on, as
                        // in the server's own decoder.
                        self.decoder.grant(*granted);
                    }
                    if let Some(reply) = reply {
                        replies.push((reply, self.observed_total - unparsed));
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    self.reply_buf.clear();
                    return (replies, Some(error));
                }
            }
        }
        self.reply_buf.drain(..used_total);
        (replies, None)
    }
}

impl LineOracle {
    /// A line request in v3 terms, under a made-up rid; the wait as the
    /// server serves it (0 and over 255: 255 s).
    fn translate(&mut self, request: LineRequest) -> Request {
        let rid = self.next_rid;
        self.next_rid += 1;
        match request {
            LineRequest::Acquire {
                wait_s,
                lease_s,
                owner,
                key,
            } => {
                self.in_flight
                    .push((rid, true, key.as_bytes().to_vec(), owner));
                let wait_s = match u8::try_from(wait_s) {
                    Ok(0) | Err(_) => LINE_MAX_WAIT_S,
                    Ok(wait_s) => wait_s,
                };
                Request::Acquire(AcquireRequest {
                    rid,
                    wait_s,
                    lease_s: u8::try_from(lease_s).unwrap_or(u8::MAX),
                    keys: KeyGroup::single(key),
                    set: false,
                })
            }
            LineRequest::Release { token, key } => {
                self.in_flight
                    .push((rid, false, key.as_bytes().to_vec(), token));
                Request::Release(ReleaseRequest {
                    rid,
                    token,
                    keys: KeyGroup::single(key),
                    set: false,
                })
            }
        }
    }

    /// Takes the request in flight a reply answers: by family, key and
    /// echo; `None` for the oldest.
    fn answered(&mut self, by: Option<(bool, &[u8], u64)>) -> u64 {
        let position = match by {
            Some((acquire, key, echo)) => self
                .in_flight
                .iter()
                .position(|(_, a, k, e)| *a == acquire && k.as_slice() == key && *e == echo),
            None => (!self.in_flight.is_empty()).then_some(0),
        };
        position.map_or(UNMATCHED_LINE_RID, |at| self.in_flight.remove(at).0)
    }

    fn slot_of(&self, address: &[u8]) -> u8 {
        self.addresses
            .iter()
            .position(|known| known.as_bytes() == address)
            .map_or(u8::MAX, |slot| slot as u8)
    }

    /// One line reply in v3 terms (`None`: the `E` line of the lease rule,
    /// which only precedes the request's `T`), and the bytes it used.
    fn decode(&mut self, buf: &[u8]) -> Result<Option<(Option<Reply>, usize)>, String> {
        let Some((reply, used)) = LineReply::decode(buf).map_err(|error| error.to_string())? else {
            return Ok(None);
        };
        let reply = match reply {
            LineReply::Acquired { token, owner, key } => Some(Reply::Acquired {
                rid: self.answered(Some((true, key, owner))),
                token,
            }),
            LineReply::TimedOut { owner, key } => Some(Reply::TimedOut {
                rid: self.answered(Some((true, key, owner))),
            }),
            LineReply::Busy { owner, key } => Some(Reply::Busy {
                rid: self.answered(Some((true, key, owner))),
            }),
            LineReply::Released { token, key } => Some(Reply::Released {
                rid: self.answered(Some((false, key, token))),
            }),
            LineReply::NotFound { token, key } => Some(Reply::NotFound {
                rid: self.answered(Some((false, key, token))),
            }),
            LineReply::Moved { address } => Some(Reply::Moved {
                leader_slot: self.slot_of(address),
                rid: self.answered(None),
            }),
            LineReply::Leader { address } => Some(Reply::Leader {
                leader_slot: self.slot_of(address),
            }),
            LineReply::Error { reason } => match reason {
                b"bad_lease" => None,
                b"no_leader" => Some(Reply::Error {
                    rid: self.answered(None),
                    code: ErrorCode::NoLeader,
                }),
                b"not_active" => Some(Reply::Error {
                    rid: self.answered(None),
                    code: ErrorCode::NotActive,
                }),
                other => {
                    return Err(format!("line error E{}", String::from_utf8_lossy(other)));
                }
            },
        };
        Ok(Some((reply, used)))
    }
}
