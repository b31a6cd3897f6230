//! One description of a simulated world: the seed plus the knobs that
//! change it from its swarm draw. The CLI parses its flags into [`Knobs`],
//! the tests build their worlds from [`Knobs`] too, and every replay line
//! is printed from the same [`Knobs`] — so a printed command replays the
//! very world that failed, and `--seed N` without knobs is `run_seed(N)`
//! (or `run_cluster_seed(N, n)`) exactly.

use crate::adversary::AdversaryRates;
use crate::cluster::{ClusterSimConfig, ClusterWorld};
use crate::config::{FaultConfig, SimConfig};
use crate::run::RunReport;
use crate::single::World;

/// Everything besides the seed that shapes a run. The default is the swarm
/// world of the seed, untouched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// Cluster worlds of this many nodes (3 or 5) instead of one server.
    pub cluster: Option<u8>,
    /// Bigger, busier worlds ([`SimConfig::stress`]).
    pub stress: bool,
    /// Chance per server write of a partial write, ppm, instead of the
    /// swarm's draw.
    pub partial_writes_ppm: Option<u32>,
    /// Line clients per world instead of the swarm's draw.
    pub line_clients: Option<usize>,
    /// Wire v3 clients per world instead of the swarm's draw.
    pub v3_clients: Option<usize>,
    /// No faults at all (a quiet baseline); applied before the fault
    /// knobs below, which may switch one kind back on.
    pub no_faults: bool,
    /// Server restarts are the only fault, at this rate per fault tick
    /// (ppm), with a fault tick every 0.4 s on average.
    pub server_crashes_only_ppm: Option<u32>,
    /// Cluster worlds: operator force-releases at this rate (ppm per fault
    /// tick) instead of the swarm's draw.
    pub force_releases_ppm: Option<u32>,
    /// Cluster worlds: the outsider's rates (relay ppm, inject ppm)
    /// instead of the swarm's draw.
    pub adversary: Option<(u32, u32)>,
    /// Cluster worlds: majority losses (every node crashes at once and the
    /// operator recovers under the same identity) at this rate (ppm per
    /// fault tick) instead of none.
    pub majority_losses_ppm: Option<u32>,
    /// Cluster worlds: run the liveness phase to its bound even when
    /// everything resolved early.
    pub full_liveness: bool,
    /// A core bug switched on (its CLI name; the binary needs the
    /// `planted-bugs` feature). Recorded here so replay lines name it; the
    /// caller switches it on.
    pub planted: Option<String>,
}

impl Knobs {
    /// The single-server configuration of `seed`.
    pub fn single_config(&self, seed: u64) -> SimConfig {
        let mut config = SimConfig::swarm(seed);
        self.shape(&mut config);
        config
    }

    /// The cluster configuration of `seed` for `nodes` nodes.
    pub fn cluster_config(&self, seed: u64, nodes: u8) -> ClusterSimConfig {
        let mut config = ClusterSimConfig::swarm(seed, nodes);
        if self.no_faults {
            config = config.without_faults();
        }
        self.shape(&mut config.base);
        if let Some(ppm) = self.force_releases_ppm {
            config.faults.force_release_ppm = ppm;
        }
        if let Some((relay_ppm, inject_ppm)) = self.adversary {
            config.faults.adversary = AdversaryRates {
                relay_ppm,
                inject_ppm,
            };
        }
        if let Some(ppm) = self.majority_losses_ppm {
            config.faults.majority_loss_ppm = ppm;
        }
        config.end_when_quiet = !self.full_liveness;
        config
    }

    /// The knobs shared by both kinds of world, in one order.
    fn shape(&self, config: &mut SimConfig) {
        if self.no_faults {
            config.faults = FaultConfig::none();
        }
        if self.stress {
            *config = config.clone().stress();
        }
        if let Some(ppm) = self.server_crashes_only_ppm {
            config.faults = FaultConfig {
                tick_mean_us: 400_000,
                server_restart_ppm: ppm,
                ..FaultConfig::none()
            };
        }
        if let Some(ppm) = self.partial_writes_ppm {
            config.faults.partial_write_ppm = ppm;
        }
        if let Some(line) = self.line_clients {
            config.line_clients = line;
        }
        if let Some(v3) = self.v3_clients {
            config.clients = v3;
        }
    }

    /// Runs the world of `seed`, tracing into `trace` if given.
    pub fn run(&self, seed: u64, trace: Option<&mut dyn std::io::Write>) -> RunReport {
        match (self.cluster, trace) {
            (Some(nodes), Some(out)) => {
                let config = self.cluster_config(seed, nodes);
                let _ = writeln!(out, "seed {seed}: {config:?}");
                ClusterWorld::new(seed, config).with_trace(out).run()
            }
            (Some(nodes), None) => ClusterWorld::new(seed, self.cluster_config(seed, nodes)).run(),
            (None, Some(out)) => {
                let config = self.single_config(seed);
                let _ = writeln!(out, "seed {seed}: {config:?}");
                World::new(seed, config).with_trace(out).run()
            }
            (None, None) => World::new(seed, self.single_config(seed)).run(),
        }
    }

    /// The CLI flags that give these knobs (none for the defaults).
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut flag = |name: &str, value: Option<String>| {
            flags.push(name.to_string());
            flags.extend(value);
        };
        if let Some(nodes) = self.cluster {
            flag("--cluster", Some(nodes.to_string()));
        }
        if self.stress {
            flag("--stress", None);
        }
        if self.no_faults {
            flag("--no-faults", None);
        }
        if let Some(ppm) = self.server_crashes_only_ppm {
            flag("--server-crashes-only", Some(ppm.to_string()));
        }
        if let Some(ppm) = self.partial_writes_ppm {
            flag("--partial-writes", Some(ppm.to_string()));
        }
        if let Some(line) = self.line_clients {
            flag("--line-clients", Some(line.to_string()));
        }
        if let Some(v3) = self.v3_clients {
            flag("--v3-clients", Some(v3.to_string()));
        }
        if let Some(ppm) = self.force_releases_ppm {
            flag("--force-releases", Some(ppm.to_string()));
        }
        if let Some((relay, inject)) = self.adversary {
            flag("--adversary", Some(format!("{relay},{inject}")));
        }
        if let Some(ppm) = self.majority_losses_ppm {
            flag("--majority-losses", Some(ppm.to_string()));
        }
        if self.full_liveness {
            flag("--full-liveness", None);
        }
        if let Some(name) = &self.planted {
            flag("--planted", Some(name.clone()));
        }
        flags
    }

    /// The complete command that replays `seed` in these knobs' world,
    /// with its trace.
    pub fn replay_command(&self, seed: u64) -> String {
        let features = if self.planted.is_some() {
            " --features planted-bugs"
        } else {
            ""
        };
        let mut command =
            format!("cargo run -p ticketing-sim --release{features} -- --seed {seed}");
        for flag in self.flags() {
            command.push(' ');
            command.push_str(&flag);
        }
        command.push_str(" --trace");
        command
    }

    /// Takes `flag` (and its value from `rest`) if it is a knob:
    /// `Ok(false)` if it is not one.
    fn take(&mut self, flag: &str, rest: &mut dyn Iterator<Item = String>) -> Result<bool, String> {
        fn value<T: std::str::FromStr>(
            flag: &str,
            rest: &mut dyn Iterator<Item = String>,
        ) -> Result<T, String> {
            let text = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
            text.parse()
                .map_err(|_| format!("bad value for {flag}: {text:?}"))
        }
        match flag {
            "--cluster" => {
                let nodes: u8 = value(flag, rest)?;
                if nodes != 3 && nodes != 5 {
                    return Err("--cluster needs 3 or 5".into());
                }
                self.cluster = Some(nodes);
            }
            "--stress" => self.stress = true,
            "--no-faults" => self.no_faults = true,
            "--server-crashes-only" => self.server_crashes_only_ppm = Some(value(flag, rest)?),
            "--partial-writes" => self.partial_writes_ppm = Some(value(flag, rest)?),
            "--line-clients" => self.line_clients = Some(value(flag, rest)?),
            "--v3-clients" => self.v3_clients = Some(value(flag, rest)?),
            "--force-releases" => self.force_releases_ppm = Some(value(flag, rest)?),
            "--adversary" => {
                let text: String = value(flag, rest)?;
                let parsed = text
                    .split_once(',')
                    .and_then(|(relay, inject)| Some((relay.parse().ok()?, inject.parse().ok()?)));
                self.adversary = Some(
                    parsed.ok_or_else(|| format!("--adversary needs RELAY,INJECT: {text:?}"))?,
                );
            }
            "--majority-losses" => self.majority_losses_ppm = Some(value(flag, rest)?),
            "--full-liveness" => self.full_liveness = true,
            "--planted" => self.planted = Some(value(flag, rest)?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliArgs {
    /// Seeds to run.
    pub seeds: std::ops::Range<u64>,
    /// Print each run's events.
    pub trace: bool,
    /// Print every seed's trace hash (compare two processes for
    /// determinism).
    pub hashes: bool,
    /// Replay a `sim_schedule` fuzz input instead of seeds.
    pub bytes: Option<String>,
    /// At most 20 failing seeds reported in full.
    pub quiet: bool,
    /// The world of each seed.
    pub knobs: Knobs,
}

/// The CLI's usage line.
pub const USAGE: &str = "usage: ticketing-sim [--seeds A..B | --seed N [--trace]] [--hashes] [--quiet] [--bytes FUZZ_INPUT [--trace]] \
[--cluster 3|5 [--full-liveness] [--force-releases PPM] [--adversary RELAY_PPM,INJECT_PPM] [--majority-losses PPM]] [--stress] [--no-faults] \
[--server-crashes-only PPM] [--partial-writes PPM] [--line-clients N] [--v3-clients N] [--planted NAME]";

/// Parses the CLI's arguments (without the program name).
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<CliArgs, String> {
    let mut parsed = CliArgs {
        seeds: 0..100,
        trace: false,
        hashes: false,
        bytes: None,
        quiet: false,
        knobs: Knobs::default(),
    };
    let mut iter = args.into_iter();
    while let Some(arg) = iter.next() {
        if parsed.knobs.take(&arg, &mut iter)? {
            continue;
        }
        match arg.as_str() {
            "--seeds" => {
                let value = iter.next().ok_or("--seeds needs A..B")?;
                let (a, b) = value.split_once("..").ok_or("--seeds needs A..B")?;
                let a = a.parse().map_err(|_| format!("bad seed {a:?}"))?;
                let b = b.parse().map_err(|_| format!("bad seed {b:?}"))?;
                parsed.seeds = a..b;
            }
            "--seed" => {
                let value = iter.next().ok_or("--seed needs N")?;
                let seed: u64 = value.parse().map_err(|_| format!("bad seed {value:?}"))?;
                parsed.seeds = seed..seed + 1;
            }
            "--trace" => parsed.trace = true,
            "--hashes" => parsed.hashes = true,
            "--bytes" => parsed.bytes = Some(iter.next().ok_or("--bytes needs a file")?),
            "--quiet" => parsed.quiet = true,
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> CliArgs {
        parse_args(line.split_whitespace().map(String::from)).expect("parses")
    }

    /// Every knob's flags parse back to the same knobs.
    #[test]
    fn printed_flags_parse_back() {
        let all = Knobs {
            cluster: Some(5),
            stress: true,
            partial_writes_ppm: Some(1_000_000),
            line_clients: Some(3),
            v3_clients: Some(0),
            no_faults: true,
            server_crashes_only_ppm: Some(300_000),
            force_releases_ppm: Some(150_000),
            majority_losses_ppm: Some(30_000),
            adversary: Some((300_000, 10_000)),
            full_liveness: true,
            planted: Some("grant-twice".into()),
        };
        for knobs in [Knobs::default(), all] {
            let parsed = parse_args(knobs.flags()).expect("parses");
            assert_eq!(parsed.knobs, knobs);
        }
    }

    #[test]
    fn a_replay_command_names_every_knob() {
        let knobs = Knobs {
            stress: true,
            line_clients: Some(0),
            planted: Some("reuse-token".into()),
            ..Knobs::default()
        };
        assert_eq!(
            knobs.replay_command(10_589),
            "cargo run -p ticketing-sim --release --features planted-bugs -- --seed 10589 \
             --stress --line-clients 0 --planted reuse-token --trace"
        );
        let line = knobs.replay_command(10_589);
        let tail = line.split(" -- ").nth(1).expect("arguments");
        let parsed = args(tail);
        assert_eq!(
            (parsed.knobs, parsed.seeds, parsed.trace),
            (knobs, 10_589..10_590, true)
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        for (line, flag) in [
            ("--line-clients x", "--line-clients"),
            ("--partial-writes", "--partial-writes"),
            ("--cluster 4", "--cluster"),
            ("--adversary 5", "--adversary"),
        ] {
            let error = parse_args(line.split_whitespace().map(String::from)).unwrap_err();
            assert!(error.contains(flag), "{line}: {error}");
        }
    }
}
