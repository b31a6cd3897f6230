//! Replays the committed fuzz corpora (`fuzz/corpus/sim_*/`) through the
//! same entry points the cargo-fuzz targets call, plus a fixed batch of
//! pseudo-random inputs, so that stable CI exercises them without nightly.

#[path = "../../fuzz/corpus_replay.rs"]
mod corpus_replay;

use corpus_replay::{pseudo_random_inputs, replay};
use ticketing_sim::fuzzing;

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
