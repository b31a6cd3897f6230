//! A cheap hasher for the maps keyed by ids the core hands out itself:
//! connection ids, waiter ids and sequence numbers, fencing tokens (the
//! drivers use it for their maps by [`crate::server::ConnId`] too). Nobody
//! outside picks those values, so nobody can aim them at one bucket; the
//! maps keyed by what clients send (key bytes, source addresses) keep std's
//! keyed SipHash (the lock table's maps by key bytes hash a key once per
//! request and reuse it, `lock/keyed.rs`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The 64-bit golden-ratio constant (odd, so multiplying is a bijection).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// Multiplicative hashing: sequential ids spread over both the low bits
/// (the bucket) and the top bits (hashbrown's tag byte).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(MULTIPLIER);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(MULTIPLIER);
    }
}

/// A `HashMap` keyed by core-assigned ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_spread_over_buckets_and_tags() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let mut buckets = std::collections::HashSet::new();
        let mut tags = std::collections::HashSet::new();
        for id in 0u64..1024 {
            let hash = build.hash_one(id);
            buckets.insert(hash & 1023);
            tags.insert(hash >> 57);
        }
        assert_eq!(buckets.len(), 1024, "every low-bit bucket used once");
        assert_eq!(tags.len(), 128, "every tag value used");
    }
}
