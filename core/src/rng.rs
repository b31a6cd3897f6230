//! SplitMix64, the one small PRNG the core and the simulator share.
//!
//! Deterministic and **not cryptographic**: it spreads election timeouts and
//! derives the simulator's streams, nothing an attacker may need to guess.
//! The core never seeds it from the environment; the driver hands in the
//! seed (a node's `seed` at construction, a simulator world's seed), so a
//! run stays a pure function of its inputs.

/// One step of SplitMix64: advances `state` and returns the next 64 bits.
///
/// The same `state` always yields the same sequence, on every platform.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 generator seeded by its owner.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose first draw is `splitmix64` of `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in `0..bound`, or 0 when `bound` is 0 (the small modulo bias
    /// does not matter for jitter).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 0 (Vigna's reference).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn below_stays_under_the_bound_and_zero_bound_is_zero() {
        let mut rng = SplitMix64::new(42);
        assert!((0..1000).all(|_| rng.below(7) < 7));
        assert_eq!(rng.below(0), 0);
    }
}
