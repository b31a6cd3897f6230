//! What a cluster run simulates: fault rates, planted bugs, the configuration.

use super::*;

/// Cluster-specific fault rates (ppm per fault tick), on top of
/// [`SimConfig`]'s resets, client crashes, pauses and clock jumps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFaults {
    /// Peer links between a random minority and the rest are cut both ways.
    pub partition_ppm: u32,
    /// One peer link is cut in one direction only.
    pub one_way_ppm: u32,
    /// Every peer link of the current leader is cut both ways.
    pub isolate_leader_ppm: u32,
    /// A node crashes and restarts later with nothing (a new generation);
    /// only while the voters that still have their state stay a majority.
    pub node_crash_ppm: u32,
    /// A node's clock jumps forward.
    pub node_clock_jump_ppm: u32,
    /// Longest partition.
    pub partition_max_us: u64,
    /// The outsider without the peer token (`crate::adversary`); off
    /// when both rates are 0.
    pub adversary: AdversaryRates,
    /// An operator force-releases a key the leader's applied state shows
    /// held, naming its token or (a quarter of the time) a stale one, and
    /// in a third of them the leader is isolated at once, so the command
    /// may commit under a leader change or end indeterminate. Drawn from
    /// its own stream: worlds without it are what they were.
    pub force_release_ppm: u32,
    /// Every node crashes at once (a majority's state is lost) and, after
    /// a while, the operator recovers the cluster under the same identity
    /// (`serve --recover` on every slot: `cluster::recovery`), every
    /// recovered clock an hour behind for its token floor. Nodes then keep
    /// durable token floors (written at once); the locks held at the loss
    /// are gone, as an operator's force-release would end them, and the
    /// token checker watches that every grant after it is larger. Drawn
    /// from its own stream: worlds without it are what they were.
    pub majority_loss_ppm: u32,
}

/// A bug planted in the simulated *driver* (the core has no cluster
/// mutations): shows that the cluster checkers can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterPlant {
    /// A crashed node comes back with empty state under its old identity
    /// (bootstrap, same generation) instead of joining as a new generation,
    /// and crashes are not held back to keep a majority's state: Raft's
    /// persistent-state assumption broken.
    AmnesiacRestart,
    /// The driver never reports a write flushed: every grant counts as
    /// undelivered and is released when its connection closes.
    NeverReportFlushed,
    /// Operator force-releases happen but the checkers are not told (no
    /// history entry, no exemption for the revoked grant): shows that they
    /// see a force-release as a real change of holder, accepted only
    /// because it was ordered.
    SilentForceRelease,
    /// The recovery after a majority loss starts the token counter from
    /// the clock alone (an hour behind), ignoring the stored floors.
    RecoverFromClock,
}

/// What a cluster run simulates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSimConfig {
    /// Nodes: 3 or 5.
    pub nodes: u8,
    /// Workload, network, clocks and the fault rates shared with the
    /// single-server world (its server restart, stall and server clock
    /// jump rates are unused here).
    pub base: SimConfig,
    /// Cluster faults.
    pub faults: ClusterFaults,
    /// End the liveness phase as soon as everything has resolved (off: run
    /// it to its bound, to watch a quiet cluster for longer).
    pub end_when_quiet: bool,
    /// A driver bug to plant (tests only).
    pub plant: Option<ClusterPlant>,
}

impl ClusterSimConfig {
    /// The swarm configuration of `seed` for `nodes` nodes: the single
    /// world's swarm draw plus cluster fault rates, each off in about a
    /// third of the worlds.
    pub fn swarm(seed: u64, nodes: u8) -> Self {
        let mut base = SimConfig::swarm(seed);
        // Shorter phases than the single world: a cluster event costs more.
        base.safety_us = base.safety_us.min(15_000_000);
        base.faults.server_restart_ppm = 0;
        base.faults.server_clock_jump_ppm = 0;
        base.faults.server_write_stall_ppm = 0;
        let mut rng = Rng::new(seed, 98);
        let mut faults = ClusterFaults {
            partition_ppm: 80_000,
            one_way_ppm: 60_000,
            isolate_leader_ppm: 60_000,
            node_crash_ppm: 60_000,
            node_clock_jump_ppm: 30_000,
            partition_max_us: rng.range(300_000, 5_000_000),
            adversary: AdversaryRates::default(),
            force_release_ppm: 0,
            majority_loss_ppm: 0,
        };
        for rate in [
            &mut faults.partition_ppm,
            &mut faults.one_way_ppm,
            &mut faults.isolate_leader_ppm,
            &mut faults.node_crash_ppm,
            &mut faults.node_clock_jump_ppm,
        ] {
            if rng.chance(330_000) {
                *rate = 0;
            }
        }
        // Its own stream, so the worlds without it draw what they drew
        // before it existed.
        let mut adversary_rng = Rng::new(seed, 96);
        if adversary_rng.chance(ADVERSARY_SEEDS_PPM) {
            faults.adversary = AdversaryRates {
                relay_ppm: 100_000,
                inject_ppm: adversary_rng.range(500, 5_000) as u32,
            };
        }
        let mut force_rng = Rng::new(seed, 93);
        if force_rng.chance(FORCE_RELEASE_SEEDS_PPM) {
            faults.force_release_ppm = force_rng.range(20_000, 120_000) as u32;
        }
        ClusterSimConfig {
            nodes,
            base,
            faults,
            end_when_quiet: true,
            plant: None,
        }
    }

    /// No faults at all.
    pub fn without_faults(mut self) -> Self {
        self.base = self.base.without_faults();
        self.faults = ClusterFaults {
            partition_ppm: 0,
            one_way_ppm: 0,
            isolate_leader_ppm: 0,
            node_crash_ppm: 0,
            node_clock_jump_ppm: 0,
            partition_max_us: 0,
            adversary: AdversaryRates::default(),
            force_release_ppm: 0,
            majority_loss_ppm: 0,
        };
        self
    }
}
