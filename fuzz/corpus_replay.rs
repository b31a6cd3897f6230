//! Replay support for the stable tests that run the fuzz corpora without
//! nightly: `core/tests/fuzz_corpus.rs` and `sim/tests/fuzz_corpus.rs` each
//! include this file with `#[path]`. It lives here, beside the corpora it
//! reads, rather than in `ticketing_core::testing::fuzzing`, because walking a
//! directory is IO and core does none; it is not part of the fuzz crate.

use std::path::PathBuf;

/// Every file of `fuzz/corpus/<target>/`, sorted by path; panics if the
/// directory is unreadable or empty.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut entries: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("corpus {} unreadable: {error}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let bytes = std::fs::read(&path).expect("corpus file");
            (path, bytes)
        })
        .collect();
    entries.sort();
    assert!(!entries.is_empty(), "corpus {} is empty", dir.display());
    entries
}

/// xorshift64*: a fixed stream of inputs, the same on every run.
pub fn pseudo_random_inputs(seed: u64, count: usize, len_max: usize) -> Vec<Vec<u8>> {
    let mut state = seed;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..count)
        .map(|_| {
            let len = (next() as usize) % len_max;
            (0..len).map(|_| next() as u8).collect()
        })
        .collect()
}

/// Runs `run` on every file of the corpus of `target`; fails naming the
/// first file it panics on.
pub fn replay(target: &str, run: fn(&[u8])) {
    for (path, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(|| run(&bytes));
        assert!(outcome.is_ok(), "{target} failed on {}", path.display());
    }
}
