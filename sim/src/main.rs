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

use ticketing_sim::{ClusterSimConfig, ClusterWorld, RunReport, SimConfig, World};

struct Args {
    seeds: std::ops::Range<u64>,
    trace: bool,
    /// Print every seed's trace hash (compare two processes for determinism).
    hashes: bool,
    /// Bigger, busier worlds than the swarm default.
    stress: bool,
    /// Chance per server write of a partial write, ppm (off by default;
    /// cluster worlds keep their swarm draw unless given).
    partial_writes_ppm: Option<u32>,
    /// Cluster worlds: drive nodes by the literal flush contract (a partly
    /// written take is never reported flushed), exposing the open core bug.
    /// Replay a `sim_schedule` fuzz input instead of seeds.
    bytes: Option<String>,
    quiet: bool,
    /// Run cluster worlds of this many nodes (3 or 5) instead.
    cluster: Option<u8>,
    /// Cluster worlds: run the liveness phase to its bound even when
    /// everything resolved early.
    full_liveness: bool,
    #[cfg_attr(not(feature = "planted-bugs"), allow(dead_code))]
    planted: Option<String>,
    /// Line clients per world instead of the swarm's draw.
    line_clients: Option<usize>,
    /// v3 clients per world instead of the swarm's draw.
    v3_clients: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 0..100,
        trace: false,
        hashes: false,
        stress: false,
        bytes: None,
        partial_writes_ppm: None,
        quiet: false,
        cluster: None,
        full_liveness: false,
        planted: None,
        line_clients: None,
        v3_clients: None,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--seeds" => {
                let value = iter.next().ok_or("--seeds needs A..B")?;
                let (a, b) = value.split_once("..").ok_or("--seeds needs A..B")?;
                let a = a.parse().map_err(|_| "bad seed")?;
                let b = b.parse().map_err(|_| "bad seed")?;
                args.seeds = a..b;
            }
            "--seed" => {
                let value: u64 = iter
                    .next()
                    .ok_or("--seed needs N")?
                    .parse()
                    .map_err(|_| "bad seed")?;
                args.seeds = value..value + 1;
            }
            "--trace" => args.trace = true,
            "--line-clients" => {
                let value = iter.next().ok_or("--line-clients needs N")?;
                args.line_clients = Some(value.parse().map_err(|_| "bad --line-clients")?);
            }
            "--v3-clients" => {
                let value = iter.next().ok_or("--v3-clients needs N")?;
                args.v3_clients = Some(value.parse().map_err(|_| "bad --v3-clients")?);
            }
            "--hashes" => args.hashes = true,
            "--stress" => args.stress = true,
            "--partial-writes" => {
                args.partial_writes_ppm = Some(
                    iter.next()
                        .ok_or("--partial-writes needs a rate in ppm")?
                        .parse()
                        .map_err(|_| "bad rate")?,
                );
            }
            "--bytes" => args.bytes = Some(iter.next().ok_or("--bytes needs a file")?),
            "--quiet" => args.quiet = true,
            "--full-liveness" => args.full_liveness = true,
            "--cluster" => {
                let nodes: u8 = iter
                    .next()
                    .ok_or("--cluster needs 3 or 5")?
                    .parse()
                    .map_err(|_| "bad node count")?;
                if nodes != 3 && nodes != 5 {
                    return Err("--cluster needs 3 or 5".into());
                }
                args.cluster = Some(nodes);
            }
            "--planted" => args.planted = Some(iter.next().ok_or("--planted needs a name")?),
            "--help" | "-h" => {
                return Err("usage: ticketing-sim [--seeds A..B | --seed N [--trace]] [--hashes] [--stress] [--partial-writes PPM] [--quiet] [--cluster 3|5 [--full-liveness]] [--bytes FUZZ_INPUT [--trace]] [--planted NAME] [--line-clients N] [--v3-clients N]".into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

#[cfg(feature = "planted-bugs")]
fn plant(name: &Option<String>) -> Result<(), String> {
    use ticketing_core::testing::planted::{self, PlantedBug};
    let bug = match name.as_deref() {
        None => None,
        Some("grant-twice") => Some(PlantedBug::GrantTwice),
        Some("reuse-token") => Some(PlantedBug::ReuseToken),
        Some("skip-waiter") => Some(PlantedBug::SkipWaiter),
        Some("forget-ghost-grant") => Some(PlantedBug::ForgetGhostGrant),
        Some("lose-waiter") => Some(PlantedBug::LoseWaiter),
        Some("skip-peer-frame-mac") => Some(PlantedBug::SkipPeerFrameMac),
        Some("force-release-keeps-grant") => Some(PlantedBug::ForceReleaseKeepsGrant),
        Some("extend-any-token") => Some(PlantedBug::ExtendAnyToken),
        Some("renewal-from-reply") => Some(PlantedBug::RenewalFromReply),
        Some(other) => return Err(format!("unknown planted bug {other}")),
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
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Err(message) = plant(&args.planted) {
        eprintln!("{message}");
        return ExitCode::from(2);
    }
    if let Some(path) = &args.bytes {
        return replay_bytes(path, args.trace);
    }
    let started = Instant::now();
    let mut totals = RunReport::default();
    let mut line_worlds = 0u64;
    let mut failing = Vec::new();
    let mut count = 0u64;
    for seed in args.seeds.clone() {
        let mut config = SimConfig::swarm(seed);
        if args.stress {
            config = config.stress();
        }
        config.faults.partial_write_ppm = args.partial_writes_ppm.unwrap_or(0);
        let clients = |config: &mut SimConfig| {
            if let Some(line) = args.line_clients {
                config.line_clients = line;
            }
            if let Some(v3) = args.v3_clients {
                config.clients = v3;
            }
        };
        clients(&mut config);
        let report = if let Some(nodes) = args.cluster {
            let mut cluster = ClusterSimConfig::swarm(seed, nodes);
            if let Some(ppm) = args.partial_writes_ppm {
                cluster.base.faults.partial_write_ppm = ppm;
            }
            cluster.end_when_quiet = !args.full_liveness;
            if args.stress {
                cluster.base = cluster.base.stress();
            }
            clients(&mut cluster.base);
            if args.trace {
                let stdout = std::io::stdout();
                let mut lock = stdout.lock();
                println!("seed {seed}: {cluster:?}");
                ClusterWorld::new(seed, cluster).with_trace(&mut lock).run()
            } else {
                ClusterWorld::new(seed, cluster).run()
            }
        } else if args.trace {
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            println!("seed {seed}: {config:?}");
            World::new(seed, config).with_trace(&mut lock).run()
        } else {
            World::new(seed, config).run()
        };
        count += 1;
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
        if report.line_clients > 0 {
            line_worlds += 1;
        }
        if !report.violations.is_empty() {
            if !args.quiet || failing.len() < 20 {
                for violation in &report.violations {
                    eprintln!(
                        "seed {seed}: VIOLATION [{:?}] at {} µs: {}",
                        violation.checker, violation.at_us, violation.detail
                    );
                }
                let cluster = args
                    .cluster
                    .map_or(String::new(), |n| format!(" --cluster {n}"));
                eprintln!(
                    "  replay: cargo run -p ticketing-sim --release -- --seed {seed}{cluster} --trace"
                );
            }
            failing.push(seed);
        }
        if args.trace || args.hashes {
            println!("seed {seed}: trace hash {:016x}", report.trace_hash);
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "seeds {}..{}: {count} runs, {} events, {} requests, {} grants, {} faults injected, {} stale writes fenced, {} key histories linearizable-checked ({} inconclusive), {} violating seeds",
        args.seeds.start,
        args.seeds.end,
        totals.events,
        totals.requests,
        totals.grants,
        totals.faults,
        totals.fenced_writes,
        totals.lin_keys_checked,
        totals.lin_inconclusive,
        failing.len()
    );
    if args.cluster.is_none() {
        println!(
            "{} operator force-releases ({} more refused for a stale token)",
            totals.force_releases, totals.force_releases_refused
        );
    }
    println!(
        "line clients in {line_worlds} worlds: {} line grants, {} line requests resent after a close, {} line redirects (M/E)",
        totals.line_grants, totals.line_resends, totals.line_redirects
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
        elapsed,
        count as f64 / elapsed,
        totals.events as f64 / elapsed
    );
    if failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failing seeds: {:?}", &failing[..failing.len().min(50)]);
        ExitCode::FAILURE
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
