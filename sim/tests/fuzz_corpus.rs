//! Replays the committed fuzz corpora (`fuzz/corpus/sim_*/`) through the
//! same entry points the cargo-fuzz targets call, plus a fixed batch of
//! pseudo-random inputs, so that stable CI exercises them without nightly.

use std::path::PathBuf;

use ticketing_sim::fuzzing;

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
fn pseudo_random_inputs(seed: u64, count: usize, max_len: usize) -> Vec<Vec<u8>> {
    let mut state = seed;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..count)
        .map(|_| {
            let len = (next() as usize) % max_len;
            (0..len).map(|_| next() as u8).collect()
        })
        .collect()
}

fn replay(target: &str, run: fn(&[u8])) {
    for (path, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(|| run(&bytes));
        assert!(outcome.is_ok(), "{target} failed on {}", path.display());
    }
}

#[test]
fn sim_schedule_corpus() {
    replay("sim_schedule", fuzzing::sim_schedule);
    for input in pseudo_random_inputs(11, 200, 4_096) {
        fuzzing::sim_schedule(&input);
    }
}

#[test]
fn sim_lock_table_corpus() {
    replay("sim_lock_table", fuzzing::sim_lock_table);
    for input in pseudo_random_inputs(12, 2_000, 600) {
        fuzzing::sim_lock_table(&input);
    }
}

#[test]
fn sim_cluster_schedule_corpus() {
    replay("sim_cluster_schedule", fuzzing::sim_cluster_schedule);
    for input in pseudo_random_inputs(13, 24, 2_048) {
        fuzzing::sim_cluster_schedule(&input);
    }
}
