//! What every harness reads its script with: the [`Cursor`] over the fuzz
//! input, and requests built from it.

use crate::lock::{Limits, LockConfig};
use crate::server::ServerConfig;
use crate::wire::{
    AcquireCappedRequest, AcquireRequest, AcquireSharedRequest, Capabilities, DowngradeRequest,
    EXTENSION_VERSION, ExtendRequest, Key, KeyGroup, NegotiateRequest, ObserveRequest,
    PermitsRequest, ReleaseRequest, Request,
};

/// A single server small enough for a script to reach every limit: 3 keys,
/// 3 waiters a key and 5 in all, 4 connections of 4 in-flight requests,
/// `outbound_bytes` unwritten reply bytes per connection.
pub(super) fn tiny_server_config(outbound_bytes: usize) -> ServerConfig {
    ServerConfig {
        lock: LockConfig {
            limits: Limits {
                keys_max: 3,
                waiters_per_key_max: 3,
                waiters_total_max: 5,
            },
            ..LockConfig::default()
        },
        connections_max: 4,
        in_flight_per_connection_max: 4,
        outbound_bytes_per_connection_max: outbound_bytes,
        ..ServerConfig::default()
    }
}

/// The fuzz input, read front to back; reads past its end give `None`
/// or fewer bytes.
pub(super) struct Cursor<'a> {
    pub(super) data: &'a [u8],
}

impl Cursor<'_> {
    /// The next byte.
    pub(super) fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.data.split_first()?;
        self.data = rest;
        Some(first)
    }

    /// The next `len` bytes, or as many as are left.
    pub(super) fn bytes(&mut self, len: usize) -> &[u8] {
        let len = len.min(self.data.len());
        let (taken, rest) = self.data.split_at(len);
        self.data = rest;
        taken
    }
}

/// The keys scripts pick from.
pub(super) const FUZZ_KEYS: [&str; 4] = ["a", "b", "c", "d"];

/// The keys of `FUZZ_KEYS` whose bits are set in `bits` (`a` if none).
pub(super) fn fuzz_keys(bits: u8) -> KeyGroup {
    let mut keys: Vec<Key> = FUZZ_KEYS
        .iter()
        .enumerate()
        .filter(|(index, _)| bits & (1 << index) != 0)
        .map(|(_, name)| Key::new(name.as_bytes()).expect("valid key"))
        .collect();
    if keys.is_empty() {
        keys.push(Key::new(b"a").expect("valid key"));
    }
    KeyGroup::new(keys).expect("ascending keys")
}

/// A request built from the next three input bytes: an acquire or a
/// release, of one key (`A`/`R`) or a non-empty set (`S`/`G`), with a short
/// wait and lease, or a token within 16 of `first_token` (so releases hit
/// live grants). A kind byte of `0xE0` and above builds one of the
/// negotiated extension's requests instead (see [`fuzz_extension`]); the
/// range is narrow so that the corpora from before it keep their meaning
/// almost everywhere.
pub(super) fn fuzz_request(cursor: &mut Cursor<'_>, rid: u64, first_token: u64) -> Request {
    let kind = cursor.byte().unwrap_or(0);
    let bits = cursor.byte().unwrap_or(1);
    let arg = cursor.byte().unwrap_or(0);
    if kind >= 0xE0 {
        return fuzz_extension(kind, bits, arg, rid, first_token);
    }
    let set = kind & 1 == 1;
    let keys = fuzz_keys(if set { bits } else { 1 << (bits % 4) });
    if kind & 2 == 0 {
        Request::Acquire(AcquireRequest {
            rid,
            wait_s: arg % 4,
            lease_s: 1 + arg % 3,
            keys,
            set,
        })
    } else {
        Request::Release(ReleaseRequest {
            rid,
            token: first_token + u64::from(arg % 16),
            keys,
            set,
        })
    }
}

/// One of the extension's requests (docs/protocol.md §8), by the low bits
/// of `kind`: an `X` asking for the capabilities in `bits` (unknown ones
/// too) with a short label; a `W` of the keys in `bits` by a token within
/// 16 of `first_token`, with a lease of up to 250 s or an out-of-range 0;
/// an `H` with a short wait and lease and a cap of up to 4 s (or 0, which
/// is refused), so renewals reach it; a `Q` for a few permits of a
/// small semaphore; an `O` of the first key; or, when bit 3 of `kind` is
/// set, a `Y` with the modes in `arg` or a `D` by a token near
/// `first_token` instead of a `W`.
fn fuzz_extension(kind: u8, bits: u8, arg: u8, rid: u64, first_token: u64) -> Request {
    let set = kind & 0x10 != 0;
    let keys = fuzz_keys(if set { bits } else { 1 << (bits % 4) });
    match kind % 4 {
        0 => Request::Negotiate(NegotiateRequest {
            rid,
            version: EXTENSION_VERSION,
            wanted: Capabilities(u32::from(bits)),
            label: "fuzz".repeat(usize::from(arg % 4)),
        }),
        // Shared and exclusive keys (modes past the last key are refused).
        1 if kind & 0x08 != 0 => Request::AcquireShared(AcquireSharedRequest {
            rid,
            wait_s: arg % 4,
            lease_s: 1 + arg % 3,
            max_hold_s: 0,
            modes: u16::from(arg >> 2),
            keys,
        }),
        2 if kind & 0x08 != 0 => Request::Downgrade(DowngradeRequest {
            rid,
            token: first_token + u64::from(arg % 16),
            keys,
        }),
        1 | 2 => Request::Extend(ExtendRequest {
            rid,
            token: first_token + u64::from(arg % 16),
            // Mostly 1..=3 s, as the acquires; sometimes long, or 0.
            lease_s: match arg >> 4 {
                0 => 0,
                15 => 250,
                n => 1 + n % 3,
            },
            keys,
        }),
        // Who holds the first key (read-only).
        _ if kind & 0x60 == 0x60 => Request::Observe(ObserveRequest {
            rid,
            name: keys.keys()[0].clone(),
        }),
        // Permits of a small semaphore, named by the first key: up to 3
        // of a capacity of 1..=4 (more than the capacity is refused).
        _ if kind & 0x20 != 0 => Request::AcquirePermits(PermitsRequest {
            rid,
            wait_s: arg % 4,
            lease_s: 1 + arg % 3,
            max_hold_s: 0,
            permits: 1 + arg % 3,
            capacity: 1 + u16::from(arg >> 4) % 4,
            name: keys.keys()[0].clone(),
        }),
        _ => Request::AcquireCapped(AcquireCappedRequest {
            rid,
            wait_s: arg % 4,
            lease_s: 1 + arg % 3,
            max_hold_s: u32::from(arg >> 4) % 5,
            keys,
        }),
    }
}
