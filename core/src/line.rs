//! The line dialect: the newline-framed protocol of the published 0.3.0
//! clients, served on the same port as wire v3 (see `docs/protocol.md`).
//!
//! This module holds the dialect's bytes only: the shared hello's nonce
//! shape, the handshake answer, the request decoder and the reply encoder
//! (and, for tests, tools and the simulator, the request encoder and reply
//! decoder). What the server does with a request is the client front end's
//! business (`conn::client`), shared by both dialects.
//!
//! Requests have a fixed binary part read by count (it may contain 0x0A),
//! then a key up to LF:
//! - `A` wait u16 s · lease u16 s · owner u64 · key · LF
//! - `R` token u64 · key · LF
//!
//! Replies echo the key and the owner or token, so a client can match them
//! in any order: `A` token owner key, `T`/`B` owner key, `R`/`N` token key,
//! and the text replies `M`/`L` address and `E` reason.

use sha2::{Digest, Sha256};

use crate::auth::{ClientTokens, NONCE_LEN};
use crate::wire::Key;

/// Base64url characters (no padding) of a line handshake answer.
pub const LINE_ANSWER_CHARS: usize = 43;
/// A line handshake answer on the wire: the characters and LF.
pub const LINE_ANSWER_LEN: usize = LINE_ANSWER_CHARS + 1;
/// The line client's nonce: bytes 1..15 of the shared hello's nonce.
pub const LINE_NONCE_LEN: usize = 14;
/// Key bytes read without an LF before the connection is closed
/// (`Etoo_long`): far above a valid key, so only a broken or hostile
/// client reaches it.
pub const LINE_KEY_SCAN_MAX: usize = 1024;
/// Longest text tail of an `M`, `L` or `E` reply: the Rust 0.3.0 client
/// skips reply lines over 192 bytes, op and LF included.
pub const LINE_TEXT_LEN_MAX: usize = 190;
/// The longest wait a line client gets, in seconds: its wait 0 ("without
/// limit") and anything above are served as this.
pub const LINE_MAX_WAIT_S: u8 = 255;

/// Fixed bytes after the op of an acquire: wait, lease, owner.
const ACQUIRE_FIXED: usize = 2 + 2 + 8;
/// Fixed bytes after the op of a release: the token.
const RELEASE_FIXED: usize = 8;

/// Bytes that never appear in a line client's nonce, because some line
/// reader could take them for a line end and cut the greeting short: LF
/// (every reader), CR (readers that split on CR, CRLF or both, such as
/// Java's and .NET's `ReadLine` and Node's `readline`), and the rest of
/// what Python's `str.splitlines` splits on: VT, FF, FS, GS, RS, and NEL
/// (0x85, a line end if the greeting is decoded as Latin-1, and the second
/// byte of U+0085 in UTF-8). 0xE2 is here too: it starts the UTF-8 of
/// U+2028 and U+2029, which `str.splitlines` also splits on.
pub const LINE_END_BYTES: [u8; 9] = [0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0xE2];

/// Number of byte values a line nonce byte can take: all but
/// [`LINE_END_BYTES`].
pub const LINE_NONCE_ALPHABET_LEN: usize = 256 - LINE_END_BYTES.len();

/// Every byte not in [`LINE_END_BYTES`], in increasing order.
const LINE_NONCE_ALPHABET: [u8; LINE_NONCE_ALPHABET_LEN] = {
    let mut alphabet = [0u8; LINE_NONCE_ALPHABET_LEN];
    let mut written = 0;
    let mut byte = 0usize;
    while byte < 256 {
        let mut is_line_end = false;
        let mut i = 0;
        while i < LINE_END_BYTES.len() {
            if LINE_END_BYTES[i] as usize == byte {
                is_line_end = true;
            }
            i += 1;
        }
        if !is_line_end {
            alphabet[written] = byte as u8;
            written += 1;
        }
        byte += 1;
    }
    alphabet
};

/// True for a byte a line reader could take for a line end
/// ([`LINE_END_BYTES`]).
pub fn is_line_end_byte(byte: u8) -> bool {
    LINE_END_BYTES.contains(&byte)
}

/// Shapes the driver's 16 CSPRNG bytes into the shared hello's nonce: a v3
/// client HMACs all 16, a line client reads one line and takes what
/// follows the first space. Byte 0 is a space, byte 15 an LF, and bytes
/// 1–14 are drawn from the 247 bytes that are not in [`LINE_END_BYTES`].
///
/// The 16 input bytes are read as one 128-bit number and written out as
/// 14 base-247 digits, each digit indexing the allowed bytes. So every
/// input bit counts (byte 0 and 15 too), the result is uniform over the
/// 247^14 (about 2^111.3) possible nonces to within 2^-16, and it depends
/// on the input alone, as the simulator needs. Two inputs give the same
/// nonce only if they differ by a multiple of 247^14, never when they
/// differ in a single byte.
pub fn shape_shared_nonce(nonce: &mut [u8; NONCE_LEN]) {
    let mut drawn = u128::from_be_bytes(*nonce);
    let base = LINE_NONCE_ALPHABET_LEN as u128;
    nonce[0] = b' ';
    for byte in &mut nonce[1..NONCE_LEN - 1] {
        // The remainder is below 247, so the index and the cast are exact.
        *byte = LINE_NONCE_ALPHABET[(drawn % base) as usize];
        drawn /= base;
    }
    nonce[NONCE_LEN - 1] = b'\n';
}

/// The nonce a line client reads from a shared hello's nonce.
pub fn line_nonce(nonce: &[u8; NONCE_LEN]) -> &[u8] {
    &nonce[1..1 + LINE_NONCE_LEN]
}

/// The line handshake answer for `token` and the line nonce:
/// base64url without padding of SHA-256(token ‖ nonce).
pub fn line_answer(token: &[u8], nonce: &[u8]) -> [u8; LINE_ANSWER_CHARS] {
    let digest = Sha256::new()
        .chain_update(token)
        .chain_update(nonce)
        .finalize();
    base64url_32(&digest.into())
}

/// True for the 64 characters of base64url.
pub fn is_base64url(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64url without padding of 32 bytes: 43 characters.
fn base64url_32(bytes: &[u8; 32]) -> [u8; LINE_ANSWER_CHARS] {
    let mut out = [0u8; LINE_ANSWER_CHARS];
    let mut written = 0;
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        // 3 bytes give 4 characters; the last chunk (2 bytes) gives 3.
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out[written] = BASE64URL[((n >> (18 - 6 * i)) & 0x3F) as usize];
            written += 1;
        }
    }
    out
}

/// Compares two answers in constant time (no early exit on a difference).
pub(crate) fn answers_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One decoded line request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineRequest {
    /// `A`: acquire `key` for `lease_s`, waiting up to `wait_s`.
    Acquire {
        /// Wait as sent (0: "without limit" to the client).
        wait_s: u16,
        /// Lease as sent (the server accepts 1..=250).
        lease_s: u16,
        /// The call's owner, echoed in the reply.
        owner: u64,
        /// The key.
        key: Key,
    },
    /// `R`: release the grant `token` of `key`.
    Release {
        /// The token, echoed in the reply.
        token: u64,
        /// The key.
        key: Key,
    },
}

/// What the decoder found next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineDecoded {
    /// A request with a valid key.
    Request(LineRequest),
    /// A request whose key is empty, too long, not UTF-8 or holds a space or
    /// CR: answered `Ebad_key`, the session goes on.
    BadKey,
}

/// A fatal framing error: the stream cannot be resynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFrameError {
    /// An op byte that is neither `A`, `R` nor a keep-alive LF.
    UnknownOp(u8),
    /// More than [`LINE_KEY_SCAN_MAX`] key bytes without an LF.
    TooLong,
}

impl core::fmt::Display for LineFrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LineFrameError::UnknownOp(op) => write!(f, "unknown line op 0x{op:02x}"),
            LineFrameError::TooLong => {
                write!(f, "more than {LINE_KEY_SCAN_MAX} key bytes without LF")
            }
        }
    }
}

impl std::error::Error for LineFrameError {}

/// Decodes one line request from the start of `buf`: `Ok(None)` if it is
/// incomplete, else what was found and the bytes it used. Keep-alive LFs
/// before the op are consumed and skipped.
pub fn decode_line_request(buf: &[u8]) -> Result<Option<(LineDecoded, usize)>, LineFrameError> {
    let skipped = buf.iter().take_while(|&&b| b == b'\n').count();
    let frame = &buf[skipped..];
    let Some(&op) = frame.first() else {
        return Ok(None);
    };
    let fixed = match op {
        b'A' => ACQUIRE_FIXED,
        b'R' => RELEASE_FIXED,
        other => return Err(LineFrameError::UnknownOp(other)),
    };
    let key_start = 1 + fixed;
    if frame.len() < key_start {
        return Ok(None);
    }
    let tail = &frame[key_start..];
    let scan = &tail[..tail.len().min(LINE_KEY_SCAN_MAX + 1)];
    let Some(key_len) = scan.iter().position(|&b| b == b'\n') else {
        if scan.len() > LINE_KEY_SCAN_MAX {
            return Err(LineFrameError::TooLong);
        }
        return Ok(None);
    };
    let used = skipped + key_start + key_len + 1;
    let Ok(key) = Key::new(&tail[..key_len]) else {
        return Ok(Some((LineDecoded::BadKey, used)));
    };
    let be_u16 = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
    let be_u64 = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&frame[at..at + 8]);
        u64::from_be_bytes(bytes)
    };
    let request = if op == b'A' {
        LineRequest::Acquire {
            wait_s: be_u16(1),
            lease_s: be_u16(3),
            owner: be_u64(5),
            key,
        }
    } else {
        LineRequest::Release {
            token: be_u64(1),
            key,
        }
    };
    Ok(Some((LineDecoded::Request(request), used)))
}

/// Incremental line request decoder: push bytes as they arrive, pull
/// requests. Buffers at most one partial request between pushes once
/// drained (a key scan is bounded by [`LINE_KEY_SCAN_MAX`]).
#[derive(Debug, Default)]
pub struct LineDecoder {
    buf: Vec<u8>,
    start: usize,
    failed: Option<LineFrameError>,
}

impl LineDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes (dropped after a fatal error).
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next request, `Ok(None)` when more bytes are needed, or the
    /// fatal error (reported again on every later call).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<LineDecoded>, LineFrameError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        match decode_line_request(&self.buf[self.start..]) {
            Ok(Some((decoded, used))) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(decoded))
            }
            Ok(None) => {
                // Keep-alives are consumed even when no request follows.
                let lfs = self.buf[self.start..]
                    .iter()
                    .take_while(|&&b| b == b'\n')
                    .count();
                self.start += lfs;
                Ok(None)
            }
            Err(err) => {
                self.failed = Some(err);
                self.buf = Vec::new();
                self.start = 0;
                Err(err)
            }
        }
    }

    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Appends an acquire request (for clients, tests and tools).
pub fn encode_line_acquire(out: &mut Vec<u8>, wait_s: u16, lease_s: u16, owner: u64, key: &[u8]) {
    out.push(b'A');
    out.extend_from_slice(&wait_s.to_be_bytes());
    out.extend_from_slice(&lease_s.to_be_bytes());
    out.extend_from_slice(&owner.to_be_bytes());
    out.extend_from_slice(key);
    out.push(b'\n');
}

/// Appends a release request (for clients, tests and tools).
pub fn encode_line_release(out: &mut Vec<u8>, token: u64, key: &[u8]) {
    out.push(b'R');
    out.extend_from_slice(&token.to_be_bytes());
    out.extend_from_slice(key);
    out.push(b'\n');
}

/// The reasons of our `E` replies. `auth_failed`, `no_leader` and
/// `not_active` make a client close and reconnect at once, so they are
/// sent only in their meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    /// The handshake answer matched no accepted token.
    AuthFailed,
    /// An unknown op byte; the connection closes.
    BadOp,
    /// A bad key; the session goes on.
    BadKey,
    /// A lease of 0 or over 250 s; `T` follows.
    BadLease,
    /// A key scan without LF over the bound; the connection closes.
    TooLong,
    /// No leader is known; the request had no effect.
    NoLeader,
    /// This node is not an active voter, or shuts down; the request had
    /// no effect.
    NotActive,
}

impl LineError {
    /// The reason text on the wire.
    pub fn reason(self) -> &'static str {
        match self {
            LineError::AuthFailed => "auth_failed",
            LineError::BadOp => "bad_op",
            LineError::BadKey => "bad_key",
            LineError::BadLease => "bad_lease",
            LineError::TooLong => "too_long",
            LineError::NoLeader => "no_leader",
            LineError::NotActive => "not_active",
        }
    }
}

/// A line reply, borrowing its variable parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineReply<'a> {
    /// `A`: acquired.
    Acquired {
        /// The fencing token.
        token: u64,
        /// The request's owner.
        owner: u64,
        /// The request's key.
        key: &'a [u8],
    },
    /// `T`: the wait ended, not acquired.
    TimedOut {
        /// The request's owner.
        owner: u64,
        /// The request's key.
        key: &'a [u8],
    },
    /// `B`: busy (a limit); the client retries inside its wait.
    Busy {
        /// The request's owner.
        owner: u64,
        /// The request's key.
        key: &'a [u8],
    },
    /// `R`: released.
    Released {
        /// The request's token.
        token: u64,
        /// The request's key.
        key: &'a [u8],
    },
    /// `N`: not found, or the token is not current.
    NotFound {
        /// The request's token.
        token: u64,
        /// The request's key.
        key: &'a [u8],
    },
    /// `M`: not the leader; the request had no effect.
    Moved {
        /// The leader's client address.
        address: &'a [u8],
    },
    /// `L`: leader notice.
    Leader {
        /// The leader's client address.
        address: &'a [u8],
    },
    /// `E`: an error line.
    Error {
        /// The reason text.
        reason: &'a [u8],
    },
}

/// A reply that cannot be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineReplyError {
    /// An op that no reply has.
    UnknownOp(u8),
    /// A tail over [`LINE_KEY_SCAN_MAX`] bytes without LF.
    TooLong,
}

impl core::fmt::Display for LineReplyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LineReplyError::UnknownOp(op) => write!(f, "unknown line reply op 0x{op:02x}"),
            LineReplyError::TooLong => write!(f, "line reply tail without LF"),
        }
    }
}

impl std::error::Error for LineReplyError {}

impl<'a> LineReply<'a> {
    /// The op byte.
    pub fn op(&self) -> u8 {
        match self {
            LineReply::Acquired { .. } => b'A',
            LineReply::TimedOut { .. } => b'T',
            LineReply::Busy { .. } => b'B',
            LineReply::Released { .. } => b'R',
            LineReply::NotFound { .. } => b'N',
            LineReply::Moved { .. } => b'M',
            LineReply::Leader { .. } => b'L',
            LineReply::Error { .. } => b'E',
        }
    }

    /// Appends the reply to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.op());
        let tail = match *self {
            LineReply::Acquired { token, owner, key } => {
                out.extend_from_slice(&token.to_be_bytes());
                out.extend_from_slice(&owner.to_be_bytes());
                key
            }
            LineReply::TimedOut { owner, key } | LineReply::Busy { owner, key } => {
                out.extend_from_slice(&owner.to_be_bytes());
                key
            }
            LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                out.extend_from_slice(&token.to_be_bytes());
                key
            }
            LineReply::Moved { address } | LineReply::Leader { address } => address,
            LineReply::Error { reason } => reason,
        };
        out.extend_from_slice(tail);
        out.push(b'\n');
    }

    /// Decodes one reply from the start of `buf`: `Ok(None)` if incomplete,
    /// else the reply and the bytes it used. Fixed parts are read by count.
    pub fn decode(buf: &'a [u8]) -> Result<Option<(LineReply<'a>, usize)>, LineReplyError> {
        let Some(&op) = buf.first() else {
            return Ok(None);
        };
        let fixed = match op {
            b'A' => 16,
            b'T' | b'B' | b'R' | b'N' => 8,
            b'M' | b'L' | b'E' => 0,
            other => return Err(LineReplyError::UnknownOp(other)),
        };
        if buf.len() < 1 + fixed {
            return Ok(None);
        }
        let rest = &buf[1 + fixed..];
        let scan = &rest[..rest.len().min(LINE_KEY_SCAN_MAX + 1)];
        let Some(tail_len) = scan.iter().position(|&b| b == b'\n') else {
            if scan.len() > LINE_KEY_SCAN_MAX {
                return Err(LineReplyError::TooLong);
            }
            return Ok(None);
        };
        let tail = &rest[..tail_len];
        let u64_at = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&buf[at..at + 8]);
            u64::from_be_bytes(bytes)
        };
        let reply = match op {
            b'A' => LineReply::Acquired {
                token: u64_at(1),
                owner: u64_at(9),
                key: tail,
            },
            b'T' => LineReply::TimedOut {
                owner: u64_at(1),
                key: tail,
            },
            b'B' => LineReply::Busy {
                owner: u64_at(1),
                key: tail,
            },
            b'R' => LineReply::Released {
                token: u64_at(1),
                key: tail,
            },
            b'N' => LineReply::NotFound {
                token: u64_at(1),
                key: tail,
            },
            b'M' => LineReply::Moved { address: tail },
            b'L' => LineReply::Leader { address: tail },
            _ => LineReply::Error { reason: tail },
        };
        Ok(Some((reply, 1 + fixed + tail_len + 1)))
    }
}

// The line answer's check beside its definition, so that `auth` needs
// nothing from this module.
impl ClientTokens {
    /// Checks a line-dialect handshake answer (docs/protocol.md §7.3: the
    /// base64url of SHA-256(token ‖ nonce)) against every accepted token,
    /// all of them always tried, each compared in constant time.
    pub fn verify_line(&self, nonce: &[u8], answer: &[u8]) -> bool {
        if self.tokens.is_empty() {
            return answers_equal(&line_answer(&[], nonce), answer);
        }
        let mut matched = false;
        for token in &self.tokens {
            matched |= answers_equal(&line_answer(token, nonce), answer);
        }
        matched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_a_known_encoding() {
        // SHA-256 of the empty string, base64url without padding.
        let digest: [u8; 32] = Sha256::digest(b"").into();
        assert_eq!(
            &base64url_32(&digest),
            b"47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
    }
}
