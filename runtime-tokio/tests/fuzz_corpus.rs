//! Replays the committed corpus of the `config_loader` fuzz target
//! (`fuzz/corpus/config_loader/`) through the entry point it calls, plus a
//! fixed batch of pseudo-random inputs, so that stable CI runs it without
//! nightly.

#[path = "../../fuzz/corpus_replay.rs"]
mod corpus_replay;

use corpus_replay::{pseudo_random_inputs, replay};
use ticketing_tokio::testing;

#[test]
fn config_loader_corpus() {
    replay("config_loader", testing::config_loader);
    for input in pseudo_random_inputs(41, 2_000, 256) {
        testing::config_loader(&input);
    }
}
