//! What a run simulates: sizes, timings, fault rates. Every seed draws its
//! own mix (swarm testing, as in TigerBeetle's VOPR) so that one long run
//! covers quiet worlds and hostile ones.

use crate::rng::Rng;
use crate::run::Checker;

/// Keys clients contend for most.
pub const HOT_KEYS: [&str; 2] = ["h0", "h1"];
/// Keys touched now and then.
pub const COLD_KEYS: [&str; 5] = ["c0", "c1", "c2", "c3", "c4"];
/// Every key of the world (hot first); a key is named by its index here.
pub const ALL_KEYS: [&str; 7] = ["h0", "h1", "c0", "c1", "c2", "c3", "c4"];

/// Fault probabilities and sizes (probabilities per fault tick, in parts per
/// million).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultConfig {
    /// Mean time between fault ticks.
    pub tick_mean_us: u64,
    /// A connection resets (in-flight bytes after a random chunk boundary
    /// are lost).
    pub reset_ppm: u32,
    /// A client process crashes and restarts later with nothing.
    pub client_crash_ppm: u32,
    /// The server restarts from nothing.
    pub server_restart_ppm: u32,
    /// A client process stops (GC pause) for up to `pause_max_us`.
    pub pause_ppm: u32,
    /// Longest pause.
    pub pause_max_us: u64,
    /// A client's clock jumps forward by up to `clock_jump_max_us`.
    pub clock_jump_ppm: u32,
    /// Longest clock jump.
    pub clock_jump_max_us: u64,
    /// The server's clock jumps forward by up to `clock_jump_max_us`: its
    /// leases end early in true time (fencing must still hold).
    pub server_clock_jump_ppm: u32,
    /// Chance per server write that the socket is full for a while, so
    /// replies (and grants) stay untaken in the server (ppm per write, not
    /// per tick).
    pub server_write_stall_ppm: u32,
    /// Chance per server write that only a prefix reaches the kernel at
    /// first and the rest later (ppm per write). Off by default: it exposes
    /// the flush-accounting bug in `docs/testing.md` (a grant written in the
    /// prefix is released as a ghost if the rest never goes out).
    pub partial_write_ppm: u32,
    /// A write pauses between its validity check and the write itself
    /// (the GC pause that makes a holder outlive its lease).
    pub pause_before_write_ppm: u32,
    /// An operator force-releases a held key (`ticketing locks release`):
    /// with the holder's token in most cases, else with a stale one (which
    /// must change nothing).
    pub force_release_ppm: u32,
    /// With a token floor (`SimConfig::token_reserve_step` > 0): at a
    /// server restart the wall clock is stepped back by up to this, in
    /// half of the restarts (NTP at boot, a wrong RTC).
    pub restart_clock_back_max_us: u64,
}

impl FaultConfig {
    /// No faults at all.
    pub fn none() -> Self {
        FaultConfig {
            tick_mean_us: 1_000_000,
            reset_ppm: 0,
            client_crash_ppm: 0,
            server_restart_ppm: 0,
            pause_ppm: 0,
            pause_max_us: 0,
            clock_jump_ppm: 0,
            clock_jump_max_us: 0,
            server_clock_jump_ppm: 0,
            server_write_stall_ppm: 0,
            partial_write_ppm: 0,
            pause_before_write_ppm: 0,
            force_release_ppm: 0,
            restart_clock_back_max_us: 0,
        }
    }
}

/// Everything that shapes a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Client processes speaking wire v3 (the core client `Session`).
    pub clients: usize,
    /// Client processes speaking the line dialect (a model of the published
    /// 0.3.0 clients), besides `clients`, on the same keys.
    pub line_clients: usize,
    /// Logical operations (acquires) one client incarnation starts at most;
    /// keeps per-key histories small enough for the linearizability search.
    pub acquires_per_client_max: usize,
    /// Concurrent logical acquires per client.
    pub concurrent_per_client_max: usize,
    /// Length of the safety phase (faults on, workload running).
    pub safety_us: u64,
    /// After the safety phase every outstanding request must resolve within
    /// this long (no faults, no new work).
    pub liveness_bound_us: u64,
    /// Shortest one-way network delay.
    pub net_delay_min_us: u64,
    /// Random extra delay on top (uniform), per chunk.
    pub net_jitter_us: u64,
    /// Chance of a delay spike of up to `net_spike_max_us` (ppm per chunk).
    pub net_spike_ppm: u32,
    /// Longest delay spike.
    pub net_spike_max_us: u64,
    /// Largest clock rate error of any process, parts per million.
    pub drift_ppm_max: u32,
    /// Longest wait an acquire asks for, seconds (≥ 1).
    pub wait_s_max: u8,
    /// Longest lease, seconds.
    pub lease_s_max: u8,
    /// Small server limits, to provoke `B`.
    pub keys_max: usize,
    /// Waiters per key.
    pub waiters_per_key_max: usize,
    /// Waiters in total.
    pub waiters_total_max: usize,
    /// Faults in the safety phase.
    pub faults: FaultConfig,
    /// Checkers whose findings are ignored: the planted-bug tests switch off
    /// all but one to show that that one alone catches its bug.
    pub checkers_off: Vec<Checker>,
    /// The server keeps a token floor "on disk" with this reserve step
    /// (`ticketing_core::reserve`); 0: none, the first token of a restart
    /// is its wall clock alone (and the wall clock never steps back).
    pub token_reserve_step: u64,
    /// Of the wire v3 clients, how many negotiate renewal (`X`) and renew
    /// some of their grants (`W`) while their work shows progress.
    pub renewing_clients: usize,
    /// Longest time a reserve write takes to become durable.
    pub reserve_write_max_us: u64,
    /// Planted driver bug: a restart ignores the stored floor (starts from
    /// the wall clock alone), so a clock stepped back lowers the tokens.
    pub forget_token_floor: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            clients: 4,
            line_clients: 1,
            acquires_per_client_max: 12,
            concurrent_per_client_max: 2,
            safety_us: 30_000_000,
            liveness_bound_us: 40_000_000,
            net_delay_min_us: 200,
            net_jitter_us: 3_000,
            net_spike_ppm: 10_000,
            net_spike_max_us: 400_000,
            drift_ppm_max: 1_000,
            wait_s_max: 4,
            lease_s_max: 8,
            keys_max: 5,
            waiters_per_key_max: 3,
            waiters_total_max: 6,
            faults: FaultConfig {
                tick_mean_us: 700_000,
                reset_ppm: 250_000,
                client_crash_ppm: 60_000,
                server_restart_ppm: 40_000,
                pause_ppm: 150_000,
                pause_max_us: 6_000_000,
                clock_jump_ppm: 80_000,
                clock_jump_max_us: 1_500_000,
                server_clock_jump_ppm: 30_000,
                server_write_stall_ppm: 30_000,
                partial_write_ppm: 100_000,
                pause_before_write_ppm: 100_000,
                force_release_ppm: 30_000,
                restart_clock_back_max_us: 3_600_000_000,
            },
            checkers_off: Vec::new(),
            token_reserve_step: 0,
            reserve_write_max_us: 30_000,
            forget_token_floor: false,
            renewing_clients: 2,
        }
    }
}

impl SimConfig {
    /// The swarm configuration of `seed`: the defaults with sizes and fault
    /// rates redrawn, some faults switched off entirely.
    pub fn swarm(seed: u64) -> Self {
        let mut rng = Rng::new(seed, 99);
        let mut config = SimConfig {
            clients: rng.range(2, 5) as usize,
            acquires_per_client_max: rng.range(4, 12) as usize,
            concurrent_per_client_max: rng.range(1, 2) as usize,
            safety_us: rng.range(5, 30) * 1_000_000,
            net_jitter_us: rng.range(0, 10_000),
            drift_ppm_max: [0, 100, 1_000, 5_000][rng.index(4)],
            wait_s_max: rng.range(1, 5) as u8,
            lease_s_max: rng.range(1, 8) as u8,
            keys_max: rng.range(3, 8) as usize,
            waiters_per_key_max: rng.range(1, 4) as usize,
            waiters_total_max: rng.range(2, 10) as usize,
            ..SimConfig::default()
        };
        let faults = &mut config.faults;
        // Each fault kind is off in about a third of the worlds.
        for rate in [
            &mut faults.reset_ppm,
            &mut faults.client_crash_ppm,
            &mut faults.server_restart_ppm,
            &mut faults.pause_ppm,
            &mut faults.clock_jump_ppm,
            &mut faults.server_clock_jump_ppm,
            &mut faults.server_write_stall_ppm,
            &mut faults.partial_write_ppm,
            &mut faults.pause_before_write_ppm,
        ] {
            if rng.chance(330_000) {
                *rate = 0;
            }
        }
        faults.tick_mean_us = rng.range(200_000, 2_000_000);
        // Drawn last, so the draws above stay those of earlier versions. A
        // step of 4 runs the reserve out all the time (`B`, waiters held
        // back); the default step never does within a run.
        config.token_reserve_step = [0, 4, 64, 1_000_000][rng.index(4)];
        // Line clients in three worlds of four (drawn last, as above).
        config.line_clients = [0, 1, 1, 2][rng.index(4)];
        // Operator force-releases off in a third of the worlds (drawn last).
        if rng.chance(330_000) {
            config.faults.force_release_ppm = 0;
        }
        // Renewing clients in three worlds of four (drawn last, as above).
        config.renewing_clients = [0, 1, 2, 4][rng.index(4)].min(config.clients);
        config
    }

    /// The same world with only `checker` reporting.
    pub fn only(mut self, checker: Checker) -> Self {
        self.checkers_off = Checker::ALL
            .into_iter()
            .filter(|other| *other != checker)
            .collect();
        self
    }

    /// A bigger, busier version of the same world: two more clients, three
    /// acquires in flight per client, longer histories, a longer safety
    /// phase.
    pub fn stress(mut self) -> Self {
        self.clients += 2;
        self.concurrent_per_client_max = 3;
        self.acquires_per_client_max = 16;
        self.safety_us *= 2;
        self
    }

    /// The same world with no faults (a quiet baseline).
    pub fn without_faults(mut self) -> Self {
        self.faults = FaultConfig::none();
        self
    }
}
