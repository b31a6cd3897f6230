//! The start rule: which identity a starting node takes, and the token
//! floor its leadership would start the domain's counter at.
//!
//! State is volatile, so a process must never come back under an identity
//! it had before (it would have forgotten its votes and log). Every start
//! therefore takes a generation the slot never had:
//!
//! - [`StartMode::Bootstrap`] (first start of a brand-new cluster only):
//!   generation [`BOOTSTRAP_GENERATION`], every slot's bootstrap generation
//!   as voters, so all members agree on the first configuration without
//!   talking first. If the cluster turns out to be running already (a
//!   restart given the flag by mistake), the genesis check joins under the
//!   join generation instead.
//! - [`StartMode::Join`]: the join generation, the token floor at start
//!   (wall-clock µs, or the slot's stored floor plus one if larger), so a
//!   clock stepped back still comes back newer; the leader adds it as a
//!   learner and replaces the slot's old generation.
//! - [`StartMode::Recover`] (a cluster that lost a majority, under the same
//!   identity): generation [`RECOVERY_GENERATION`] with every slot's
//!   recovery generation as voters, and the recovery plan's token floor.
//!
//! Every driver (the daemon, the simulator) starts nodes through
//! [`ClusterNode::start`], so the rule the daemon follows is the one the
//! simulator checks.

use crate::cluster::recovery::RECOVERY_GENERATION;
use crate::raft::NodeId;
use crate::time::{Duration, Instant};

use super::{ClusterConfig, ClusterNode};

/// The generation of every member of a freshly bootstrapped cluster. Any
/// later start of a slot uses its token floor (wall-clock microseconds or
/// above), which is far larger.
pub const BOOTSTRAP_GENERATION: u64 = 1;

/// How the operator started the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartMode {
    /// A restart, or a node added to a running cluster.
    Join,
    /// The first start of a brand-new cluster (`--bootstrap`).
    Bootstrap,
    /// A start after losing a majority (`--recover`), with the token floor
    /// the recovery decided ([`crate::cluster::recovery::RecoveryPlan`]).
    Recover {
        /// Every token the domain issued before the loss is below this.
        token_floor: u64,
    },
}

/// What the driver knows when it starts a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartFacts {
    /// What the operator asked for.
    pub mode: StartMode,
    /// The process's wall clock, microseconds since the Unix epoch.
    pub wall_clock_us: u64,
    /// The first token the slot's state file allows at this start (its
    /// durable floor plus one, or the wall clock if larger), when the node
    /// keeps a state file.
    pub floor_first_token: Option<u64>,
}

impl StartFacts {
    /// The domain's first token, were this node's leadership to initialise
    /// the counter: above the wall clock, the state file's floor and a
    /// recovery's floor.
    pub fn token_floor(&self) -> u64 {
        let clock = crate::reserve::start_token(Duration::from_micros(self.wall_clock_us), None);
        self.floor_first_token
            .unwrap_or(clock)
            .max(self.recovery_floor())
    }

    /// The generation of a joining start, which is also the one a
    /// bootstrap member or a recovered node joins under when it finds the
    /// cluster running: the floor at start, strictly above the bootstrap
    /// and recovery generations whatever the clock says.
    pub fn join_generation(&self) -> u64 {
        self.floor_first_token
            .unwrap_or(self.wall_clock_us)
            .max(self.recovery_floor())
            .max(RECOVERY_GENERATION + 1)
    }

    /// The generation the node starts under.
    pub fn generation(&self) -> u64 {
        match self.mode {
            StartMode::Join => self.join_generation(),
            StartMode::Bootstrap => BOOTSTRAP_GENERATION,
            StartMode::Recover { .. } => RECOVERY_GENERATION,
        }
    }

    fn recovery_floor(&self) -> u64 {
        match self.mode {
            StartMode::Recover { token_floor } => token_floor,
            StartMode::Join | StartMode::Bootstrap => 0,
        }
    }
}

impl ClusterNode {
    /// Starts a node by the start rule (see [`StartFacts`]): sets the
    /// generation in `config.id`, the token floor and the recovering flag,
    /// checks the configuration, and bootstraps or joins.
    ///
    /// # Errors
    ///
    /// The configuration is invalid (the reason).
    pub fn start(
        mut config: ClusterConfig,
        facts: &StartFacts,
        seed: u64,
        now: Instant,
    ) -> Result<ClusterNode, &'static str> {
        let generation = facts.generation();
        config.id = NodeId::new(config.id.slot, generation);
        config.bootstrap_wall_clock_us = facts.token_floor();
        config.recovering = matches!(facts.mode, StartMode::Recover { .. });
        config.validate()?;
        Ok(match facts.mode {
            StartMode::Join => ClusterNode::join(config, seed, now),
            StartMode::Bootstrap | StartMode::Recover { .. } => {
                let voters = (0..config.slot_count).map(|s| NodeId::new(s, generation));
                ClusterNode::bootstrap(config, voters, facts.join_generation(), seed, now)
            }
        })
    }
}
