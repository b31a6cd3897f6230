//! The token floor under faults: servers restarted with their wall clock
//! stepped back up to an hour (and reserve writes that are slow or lost in
//! a crash) never issue a token at or below one issued before; and the
//! token checker catches a restart that ignores the stored floor.

use ticketing_sim::{Checker, SimConfig, World};

/// A swarm world with a token floor of reserve `step`, frequent server
/// restarts and the wall clock stepped back at half of them.
fn floor_world(seed: u64, step: u64) -> SimConfig {
    let mut config = SimConfig::swarm(seed);
    config.token_reserve_step = step;
    config.faults.server_restart_ppm = 300_000;
    config.faults.restart_clock_back_max_us = 3_600_000_000;
    config
}

#[test]
fn restarts_with_the_clock_stepped_back_keep_tokens_rising() {
    let (mut clock_backs, mut grants) = (0, 0);
    for seed in 0..120 {
        // A step of 4 runs the reserve out constantly; 64 now and then.
        for step in [4, 64] {
            let mut trace = Vec::new();
            let report = World::new(seed, floor_world(seed, step))
                .with_trace(&mut trace)
                .run();
            assert!(
                report.violations.is_empty(),
                "seed {seed}, step {step}: {:#?}",
                report.violations
            );
            let trace = String::from_utf8(trace).unwrap();
            clock_backs += trace.matches("wall clock is").count();
            grants += report.grants;
        }
    }
    // The scenario happened, often.
    assert!(clock_backs > 100, "only {clock_backs} clock steps back");
    assert!(grants > 1_000, "only {grants} grants");
}

#[test]
fn the_token_checker_catches_a_restart_that_forgets_the_floor() {
    for seed in 0..200 {
        let mut config = floor_world(seed, 64).only(Checker::Tokens);
        config.forget_token_floor = true;
        let report = World::new(seed, config).run();
        if let Some(violation) = report.violations.first() {
            assert_eq!(violation.checker, Checker::Tokens);
            return;
        }
    }
    panic!("no seed below 200 caught a restart below the earlier tokens");
}
