//! What the worlds of the primitives (`semaphores.rs`, `elections.rs`,
//! `shared.rs`) share: the seeded generator, and the runs of clean worlds
//! and of worlds with a planted bug, judged by each world's own checkers.

use ticketing_core::testing::planted::{self, PlantedBug};

/// A small deterministic generator (xorshift64*), so a seed is a world.
pub struct Rng(u64);

impl Rng {
    /// The generator of world `seed` (never zero, which xorshift keeps).
    pub fn of_world(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a world's verdict says of its `N` checkers.
pub trait Judged<const N: usize> {
    /// The first thing each checker saw, in the order of the world's
    /// checker names (a world goes on after a checker fired, so every
    /// checker judges every world).
    fn fired(&self) -> &[Option<String>; N];
}

/// Runs worlds 0..`worlds` with every bug off; each must pass every one
/// of `checkers`. Their verdicts, for the totals the tests hold to.
pub fn clean<V: Judged<N>, const N: usize>(
    checkers: [&str; N],
    worlds: u64,
    run_world: fn(u64) -> V,
) -> Vec<V> {
    (0..worlds)
        .map(|seed| {
            let verdict = run_world(seed);
            for (checker, fired) in checkers.iter().zip(verdict.fired()) {
                assert!(fired.is_none(), "seed {seed}: {checker}: {fired:?}");
            }
            verdict
        })
        .collect()
}

/// Runs 100 worlds with `bug` on; the number in which each of `checkers`
/// fired. A planted bug may also trip one of the core's own debug
/// assertions before a checker speaks: such worlds are counted apart and
/// must stay a minority.
pub fn firing<V: Judged<N>, const N: usize>(
    bug: PlantedBug,
    checkers: [&str; N],
    run_world: fn(u64) -> V,
) -> [usize; N] {
    planted::set(Some(bug));
    let runs: Vec<std::thread::Result<V>> = (0..100)
        .map(|seed| std::panic::catch_unwind(|| run_world(seed)))
        .collect();
    planted::set(None);
    let verdicts: Vec<&V> = runs.iter().filter_map(|run| run.as_ref().ok()).collect();
    let asserted = runs.len() - verdicts.len();
    let mut counts = [0; N];
    for verdict in &verdicts {
        for (checker, fired) in verdict.fired().iter().enumerate() {
            counts[checker] += usize::from(fired.is_some());
        }
    }
    for (checker, count) in checkers.iter().zip(counts) {
        println!(
            "{bug:?}: the {checker} checker fired in {count} of {} worlds run to their end ({asserted} more stopped at a core debug assertion)",
            verdicts.len()
        );
    }
    assert!(
        asserted * 2 < runs.len(),
        "{asserted} of 100 worlds asserted"
    );
    counts
}

/// Runs [`firing`] for `bug` and holds the world to its promise that
/// checker `checker` (an index into `checkers`) alone catches it, in
/// `floor` of the 100 worlds at least.
pub fn caught_alone<V: Judged<N>, const N: usize>(
    bug: PlantedBug,
    checkers: [&str; N],
    run_world: fn(u64) -> V,
    checker: usize,
    floor: usize,
) {
    let counts = firing(bug, checkers, run_world);
    for (other, &count) in counts.iter().enumerate() {
        if other != checker {
            assert_eq!(count, 0, "the {} checker fired too", checkers[other]);
        }
    }
    let caught = counts[checker];
    assert!(caught >= floor, "caught in only {caught} of 100 worlds");
}
