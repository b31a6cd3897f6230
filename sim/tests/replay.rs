//! The CLI and the tests describe a world the same way: the command line
//! `--seed N [knobs]`, parsed by the function the binary uses, gives the
//! same configuration and the same trace hash as the world the tests build
//! for that seed — so a replay line printed by a test or by the CLI
//! replays the run that failed.

use ticketing_sim::spec::parse_args;
use ticketing_sim::{
    ClusterSimConfig, ClusterWorld, Knobs, RunReport, SimConfig, World, run_cluster_seed, run_seed,
};

/// The knobs and seed the CLI makes of `line`.
fn cli(line: &str) -> (Knobs, u64) {
    let args = parse_args(line.split_whitespace().map(String::from)).expect("parses");
    assert_eq!(args.seeds.end - args.seeds.start, 1, "{line}: one seed");
    (args.knobs, args.seeds.start)
}

/// The CLI's run of `line`.
fn cli_run(line: &str) -> RunReport {
    let (knobs, seed) = cli(line);
    knobs.run(seed, None)
}

/// The same hash and the same work, and the run did some.
fn assert_same_run(cli: &RunReport, test: &RunReport, what: &str) {
    assert_eq!(
        (cli.trace_hash, cli.events),
        (test.trace_hash, test.events),
        "{what}: the CLI's run differs from the test's"
    );
    assert!(cli.events > 0, "{what}: nothing ran");
}

#[test]
fn a_bare_seed_is_the_tests_swarm_world() {
    for seed in 0..60 {
        let (knobs, parsed) = cli(&format!("--seed {seed}"));
        assert_eq!(parsed, seed);
        assert_eq!(knobs.single_config(seed), SimConfig::swarm(seed));
        assert_same_run(
            &cli_run(&format!("--seed {seed}")),
            &run_seed(seed),
            &format!("seed {seed}"),
        );
    }
    // Most swarm worlds draw partial writes: the CLI must not switch them
    // off behind the seed's back.
    let partial = (0..60)
        .filter(|&seed| {
            cli(&format!("--seed {seed}"))
                .0
                .single_config(seed)
                .faults
                .partial_write_ppm
                > 0
        })
        .count();
    assert!(
        partial > 20,
        "only {partial} of 60 worlds with partial writes"
    );
}

#[test]
fn a_bare_cluster_seed_is_the_tests_cluster_world() {
    for (nodes, seeds) in [(3u8, 0..12u64), (5, 0..4)] {
        for seed in seeds {
            let line = format!("--cluster {nodes} --seed {seed}");
            let (knobs, _) = cli(&line);
            assert_eq!(
                knobs.cluster_config(seed, nodes),
                ClusterSimConfig::swarm(seed, nodes)
            );
            assert_same_run(&cli_run(&line), &run_cluster_seed(seed, nodes), &line);
        }
    }
}

/// The client-mix knobs give the worlds the tests build by hand.
#[test]
fn client_mix_knobs_are_the_tests_line_client_worlds() {
    for seed in 0..30 {
        let line = format!("--seed {seed} --line-clients 3 --v3-clients 0");
        let by_hand = SimConfig {
            clients: 0,
            line_clients: 3,
            ..SimConfig::swarm(seed)
        };
        assert_eq!(cli(&line).0.single_config(seed), by_hand, "{line}");
        assert_same_run(&cli_run(&line), &World::new(seed, by_hand).run(), &line);
    }
    for seed in 0..6 {
        let line = format!("--cluster 3 --seed {seed} --line-clients 2");
        let mut by_hand = ClusterSimConfig::swarm(seed, 3);
        by_hand.base.line_clients = 2;
        assert_eq!(cli(&line).0.cluster_config(seed, 3), by_hand, "{line}");
        assert_same_run(
            &cli_run(&line),
            &ClusterWorld::new(seed, by_hand).run(),
            &line,
        );
    }
}

/// The other knobs, each against the configuration written out by hand.
#[test]
fn every_knob_is_the_world_it_names() {
    let seed = 275;
    let (knobs, _) = cli("--seed 275 --stress --partial-writes 1000000 --line-clients 0");
    let mut by_hand = SimConfig::swarm(seed).stress();
    by_hand.faults.partial_write_ppm = 1_000_000;
    by_hand.line_clients = 0;
    assert_eq!(knobs.single_config(seed), by_hand);

    let (knobs, _) = cli("--seed 275 --no-faults");
    assert_eq!(
        knobs.single_config(seed),
        SimConfig::swarm(seed).without_faults()
    );

    let (knobs, _) = cli("--cluster 5 --seed 275 --full-liveness --force-releases 150000");
    let mut by_hand = ClusterSimConfig::swarm(seed, 5);
    by_hand.end_when_quiet = false;
    by_hand.faults.force_release_ppm = 150_000;
    assert_eq!(knobs.cluster_config(seed, 5), by_hand);

    let (knobs, _) = cli("--cluster 3 --seed 275 --majority-losses 30000");
    let mut by_hand = ClusterSimConfig::swarm(seed, 3);
    by_hand.faults.majority_loss_ppm = 30_000;
    assert_eq!(knobs.cluster_config(seed, 3), by_hand);
    assert_eq!(
        cli(&knobs
            .replay_command(seed)
            .replace("cargo run -p ticketing-sim --release -- ", ""))
        .0,
        knobs,
        "the replay line names the majority losses"
    );
}

/// A replay line printed from knobs, fed back to the CLI's parser, gives
/// the same knobs and seed and so the same run.
#[test]
fn a_printed_replay_line_replays_the_run() {
    let knobs = Knobs {
        stress: true,
        line_clients: Some(2),
        partial_writes_ppm: Some(500_000),
        ..Knobs::default()
    };
    for seed in 0..5 {
        let command = knobs.replay_command(seed);
        let arguments = command.split(" -- ").nth(1).expect("arguments");
        let (parsed, parsed_seed) = cli(arguments);
        assert_eq!((&parsed, parsed_seed), (&knobs, seed), "{command}");
        assert_same_run(&parsed.run(seed, None), &knobs.run(seed, None), &command);
    }
}
