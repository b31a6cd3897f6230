//! Seeded randomness: splitmix64 to derive streams, xoshiro256** to draw,
//! or — for coverage-guided fuzzing — the fuzzer's own bytes.

pub use ticketing_core::rng::splitmix64;

/// A stream of random numbers: xoshiro256** from a seed, or bytes chosen by
/// a fuzzer (each draw eats up to 8 bytes; once they run out it falls back to
/// a fixed generator, so every input is a complete run).
#[derive(Clone, Debug)]
pub struct Rng {
    state: [u64; 4],
    bytes: Option<(std::sync::Arc<[u8]>, usize)>,
}

impl Rng {
    /// The stream named `stream` of the world seeded with `seed`; different
    /// streams are independent, so changing how often one is drawn from
    /// leaves the others unchanged.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut mix = seed ^ stream.wrapping_mul(0xd6e8_feb8_6659_fd93);
        let state = [
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
        ];
        Rng { state, bytes: None }
    }

    /// A stream whose draws come from `bytes` (shared by every stream of a
    /// fuzzed world, each starting at its own offset).
    pub fn from_bytes(bytes: std::sync::Arc<[u8]>, stream: u64) -> Self {
        let start = usize::try_from(stream).unwrap_or(0) * 8;
        let mut rng = Rng::new(bytes.len() as u64, stream);
        rng.bytes = Some((bytes, start));
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        if let Some((bytes, at)) = &mut self.bytes
            && *at < bytes.len()
        {
            let end = (*at + 8).min(bytes.len());
            let mut word = [0u8; 8];
            word[..end - *at].copy_from_slice(&bytes[*at..end]);
            // Streams interleave in the byte string so each fuzzer byte
            // steers one decision of one stream.
            *at += 8 * STREAMS;
            return u64::from_le_bytes(word);
        }
        let result = self.state[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.state[1] << 17;
        self.state[2] ^= self.state[0];
        self.state[3] ^= self.state[1];
        self.state[1] ^= self.state[2];
        self.state[0] ^= self.state[3];
        self.state[2] ^= t;
        self.state[3] = self.state[3].rotate_left(45);
        result
    }

    /// Uniform in `0..bound` (`bound` > 0); the tiny modulo bias is
    /// irrelevant for a simulator.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        self.next_u64() % bound.max(1)
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        self.below(1_000_000) < u64::from(per_million)
    }

    /// An index into a slice of `len` (> 0) items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

/// Number of streams a world draws from (network, clocks, workload, faults).
pub const STREAMS: usize = 4;

/// A world's streams (network, clocks, workload, faults) for `seed`,
/// numbered from `first` (each world has its own numbers).
pub(crate) fn seeded_streams(seed: u64, first: u64) -> [Rng; STREAMS] {
    [0, 1, 2, 3].map(|offset| Rng::new(seed, first + offset))
}

/// A world's streams all drawn from one fuzz input.
pub(crate) fn fuzz_streams(bytes: &[u8]) -> [Rng; STREAMS] {
    let shared: std::sync::Arc<[u8]> = bytes.into();
    [0, 1, 2, 3].map(|stream| Rng::from_bytes(shared.clone(), stream))
}

/// One fault tick's roll: each fault's rate claims the next slice of a
/// million, so one draw picks at most one fault.
pub(crate) struct FaultRoll {
    roll: u32,
    threshold: u32,
}

impl FaultRoll {
    /// Draws the roll (one draw from `rng`).
    pub(crate) fn new(rng: &mut Rng) -> Self {
        FaultRoll {
            roll: rng.below(1_000_000) as u32,
            threshold: 0,
        }
    }

    /// Whether the roll falls in the next slice, `ppm` wide.
    pub(crate) fn pick(&mut self, ppm: u32) -> bool {
        let hit = self.roll >= self.threshold && self.roll < self.threshold.saturating_add(ppm);
        self.threshold = self.threshold.saturating_add(ppm);
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7, 1).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut one = Rng::new(7, 1);
        let mut two = Rng::new(7, 2);
        assert_ne!(one.next_u64(), two.next_u64());
    }

    #[test]
    fn byte_streams_read_then_fall_back() {
        let bytes: std::sync::Arc<[u8]> = vec![1u8; 8].into();
        let mut rng = Rng::from_bytes(bytes, 0);
        assert_eq!(rng.next_u64(), u64::from_le_bytes([1; 8]));
        let fallback = rng.next_u64();
        assert_ne!(fallback, u64::from_le_bytes([1; 8]));
    }
}
