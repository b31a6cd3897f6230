//! Entry points shared by the cargo-fuzz targets `fuzz/fuzz_targets/sim_*.rs`
//! and the stable tests that replay their corpora (`sim/tests/fuzz_corpus.rs`),
//! so CI exercises the same code without a nightly toolchain. Each function
//! panics on a violated invariant.

use crate::cluster::{ClusterSimConfig, ClusterWorld};
use crate::config::SimConfig;
use crate::single::World;

pub use crate::lock_model::sim_lock_table;

/// A small, hostile world for fuzzing: few clients, a short safety phase,
/// every fault kind on.
pub fn fuzz_config() -> SimConfig {
    SimConfig {
        clients: 3,
        acquires_per_client_max: 6,
        safety_us: 6_000_000,
        liveness_bound_us: 30_000_000,
        wait_s_max: 3,
        lease_s_max: 3,
        keys_max: 4,
        waiters_per_key_max: 2,
        waiters_total_max: 4,
        ..SimConfig::default()
    }
}

/// Coverage-guided simulation: the fuzzer's bytes make every decision of
/// the world (network delays and chunking, clocks, workload, faults), then
/// every checker runs. Panics with the violations found.
pub fn sim_schedule(data: &[u8]) {
    let report = World::from_bytes(data, fuzz_config()).run();
    assert!(
        report.violations.is_empty(),
        "violations: {:#?}",
        report.violations
    );
}

/// A small, hostile cluster world for fuzzing: the first byte picks 3 or 5
/// nodes, the rest make every decision (delays, chunking, clocks, workload,
/// partitions, node crashes and replacements); every checker runs. Panics
/// with the violations found.
pub fn sim_cluster_schedule(data: &[u8]) {
    let nodes = if data.first().is_some_and(|byte| byte & 1 == 1) {
        5
    } else {
        3
    };
    let mut config = ClusterSimConfig::swarm(0, nodes);
    config.base = SimConfig {
        safety_us: 6_000_000,
        ..fuzz_config()
    };
    let report = ClusterWorld::from_bytes(data.get(1..).unwrap_or(&[]), config).run();
    assert!(
        report.violations.is_empty(),
        "violations: {:#?}",
        report.violations
    );
}
