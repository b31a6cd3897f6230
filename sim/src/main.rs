//! `ticketing-sim`: run many seeds, or replay one with a trace.
//!
//! ```text
//! ticketing-sim --seeds 0..10000          # summary over a range
//! ticketing-sim --seed 42 --trace         # replay one seed, event by event
//! ticketing-sim --seed 42 --planted grant-twice   # with --features planted-bugs
//! ticketing-sim --cluster 3 --seeds 0..1000       # cluster worlds (3 or 5 nodes)
//! ```

use std::process::ExitCode;
use std::time::Instant;

use ticketing_sim::spec::{CliArgs, parse_args};
use ticketing_sim::{RunReport, World};

#[cfg(feature = "planted-bugs")]
fn plant(name: &Option<String>) -> Result<(), String> {
    use ticketing_core::testing::planted::{self, PlantedBug};
    let bug = match name.as_deref() {
        None => None,
        Some(name) => {
            Some(PlantedBug::from_name(name).ok_or(format!("unknown planted bug {name}"))?)
        }
    };
    planted::set(bug);
    Ok(())
}

#[cfg(not(feature = "planted-bugs"))]
fn plant(name: &Option<String>) -> Result<(), String> {
    match name {
        None => Ok(()),
        Some(_) => Err("built without --features planted-bugs".into()),
    }
}

fn main() -> ExitCode {
    let args: CliArgs = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Err(message) = plant(&args.knobs.planted) {
        eprintln!("{message}");
        return ExitCode::from(2);
    }
    if let Some(path) = &args.bytes {
        return replay_bytes(path, args.trace);
    }
    let started = Instant::now();
    let mut sweep = Sweep::default();
    for seed in args.seeds.clone() {
        // The same function the tests build their worlds with.
        let report = if args.trace {
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            args.knobs.run(seed, Some(&mut lock))
        } else {
            args.knobs.run(seed, None)
        };
        sweep.record(&args, seed, &report);
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    sweep.print_summary(&args, elapsed);
    if sweep.failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        let failing = &sweep.failing;
        println!("failing seeds: {:?}", &failing[..failing.len().min(50)]);
        ExitCode::FAILURE
    }
}

/// What a run over a range of seeds adds up to.
#[derive(Default)]
struct Sweep {
    totals: RunReport,
    /// Seeds run.
    count: u64,
    /// Worlds with line clients.
    line_worlds: u64,
    /// Seeds with a violation, in order.
    failing: Vec<u64>,
}

impl Sweep {
    /// Adds `seed`'s `report`: its counts; its violations (to stderr, with
    /// the command that replays it; with `--quiet`, for the first 20
    /// failing seeds only); and its trace hash when asked.
    fn record(&mut self, args: &CliArgs, seed: u64, report: &RunReport) {
        self.count += 1;
        add_counts(&mut self.totals, report);
        if report.line_clients > 0 {
            self.line_worlds += 1;
        }
        if !report.violations.is_empty() {
            if !args.quiet || self.failing.len() < 20 {
                for violation in &report.violations {
                    eprintln!(
                        "seed {seed}: VIOLATION [{:?}] at {} µs: {}",
                        violation.checker, violation.at_us, violation.detail
                    );
                }
                eprintln!("  replay: {}", args.knobs.replay_command(seed));
            }
            self.failing.push(seed);
        }
        if args.trace || args.hashes {
            println!("seed {seed}: trace hash {:016x}", report.trace_hash);
        }
    }

    /// The summary lines, ending with the speed over `elapsed_s` seconds.
    fn print_summary(&self, args: &CliArgs, elapsed_s: f64) {
        let totals = &self.totals;
        println!(
            "seeds {}..{}: {} runs, {} events, {} requests, {} grants, {} faults injected, {} stale writes fenced, {} key histories linearizable-checked ({} inconclusive), {} violating seeds",
            args.seeds.start,
            args.seeds.end,
            self.count,
            totals.events,
            totals.requests,
            totals.grants,
            totals.faults,
            totals.fenced_writes,
            totals.lin_keys_checked,
            totals.lin_inconclusive,
            self.failing.len()
        );
        if args.knobs.cluster.is_none() {
            println!(
                "{} operator force-releases ({} more refused for a stale token)",
                totals.force_releases, totals.force_releases_refused
            );
        }
        println!(
            "line clients in {} worlds: {} line grants, {} line requests resent after a close, {} line redirects (M/E)",
            self.line_worlds, totals.line_grants, totals.line_resends, totals.line_redirects
        );
        println!(
            "renewals: {} renewed, {} refused (grant gone); {} holder deadlines checked against the answering server's expiry",
            totals.extensions, totals.extensions_refused, totals.deadlines_checked
        );
        if totals.cluster_force_releases > 0 {
            let [released, indeterminate, unchanged, refused] = totals.force_outcomes;
            println!(
                "cluster force-releases: {} ordered, {released} released, {indeterminate} indeterminate, {unchanged} token mismatch or not held, {refused} refused",
                totals.cluster_force_releases
            );
        }
        println!(
            "{:.1} s, {:.0} seeds/s, {:.0} events/s",
            elapsed_s,
            self.count as f64 / elapsed_s,
            totals.events as f64 / elapsed_s
        );
    }
}

/// Adds the counts of one run's `report` to `totals`.
fn add_counts(totals: &mut RunReport, report: &RunReport) {
    totals.events += report.events;
    totals.requests += report.requests;
    totals.grants += report.grants;
    totals.faults += report.faults;
    totals.fenced_writes += report.fenced_writes;
    totals.force_releases += report.force_releases;
    totals.force_releases_refused += report.force_releases_refused;
    totals.lin_keys_checked += report.lin_keys_checked;
    totals.lin_inconclusive += report.lin_inconclusive;
    totals.line_grants += report.line_grants;
    totals.line_resends += report.line_resends;
    totals.line_redirects += report.line_redirects;
    totals.cluster_force_releases += report.cluster_force_releases;
    totals.extensions += report.extensions;
    totals.extensions_refused += report.extensions_refused;
    totals.deadlines_checked += report.deadlines_checked;
    for (total, n) in totals.force_outcomes.iter_mut().zip(report.force_outcomes) {
        *total += n;
    }
}

/// Replays a `sim_schedule` fuzz input (a crash file) with the fuzz world.
fn replay_bytes(path: &str, trace: bool) -> ExitCode {
    let data = match std::fs::read(path) {
        Ok(data) => data,
        Err(error) => {
            eprintln!("{path}: {error}");
            return ExitCode::from(2);
        }
    };
    let config = ticketing_sim::fuzzing::fuzz_config();
    let report = if trace {
        let stdout = std::io::stdout();
        let mut lock = stdout.lock();
        World::from_bytes(&data, config).with_trace(&mut lock).run()
    } else {
        World::from_bytes(&data, config).run()
    };
    for violation in &report.violations {
        eprintln!(
            "VIOLATION [{:?}] at {} µs: {}",
            violation.checker, violation.at_us, violation.detail
        );
    }
    println!(
        "{}: {} events, trace hash {:016x}",
        path, report.events, report.trace_hash
    );
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
