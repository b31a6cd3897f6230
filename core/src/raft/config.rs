//! Timing and limits of one Raft node, with the production defaults and
//! the fast profile (see the module documentation of [`super`] for the
//! failover arithmetic behind them).

use crate::time::Duration;

/// Timing and limits of one Raft node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftConfig {
    /// How often a leader sends heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Lower bound of the randomized election timeout; also the leader-lease
    /// and check-quorum window.
    pub election_timeout_min_ms: u64,
    /// Width of the randomization window above the minimum.
    pub election_timeout_jitter_ms: u64,
    /// Most entries in one append.
    pub max_append_entries: usize,
    /// Most entry bytes in one append (at least one entry is always sent).
    pub max_append_bytes: usize,
    /// Most appends in flight to one follower while pipelining.
    pub max_inflight_appends: usize,
    /// Most entries a leader holds beyond its commit index; `propose` fails
    /// with [`super::ProposeError::Backpressure`] past it.
    pub max_uncommitted_entries: u64,
    /// Largest command payload accepted by `propose`.
    pub max_entry_bytes: usize,
    /// Most messages waiting in the outbox; newer ones are dropped beyond.
    pub max_outbox_messages: usize,
    /// Snapshot chunk size.
    pub snapshot_chunk_bytes: usize,
    /// Largest snapshot a follower accepts.
    pub max_snapshot_bytes: usize,
    /// Applied entries beyond the last snapshot after which
    /// [`super::Event::SnapshotWanted`] is emitted (0 = never).
    pub snapshot_threshold_entries: u64,
    /// A learner within this many entries of the leader's last index counts
    /// as caught up for promotion.
    pub catch_up_lag_entries: u64,
    /// Let the leader drive node replacement by itself (see the module
    /// documentation).
    pub auto_membership: bool,
}

impl Default for RaftConfig {
    /// Production defaults: leader failover in about 2.3–2.5 s.
    fn default() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 2_400,
            election_timeout_jitter_ms: 100,
            max_append_entries: 256,
            max_append_bytes: 256 * 1024,
            max_inflight_appends: 64,
            max_uncommitted_entries: 16_384,
            max_entry_bytes: 8 * 1024,
            max_outbox_messages: 4_096,
            snapshot_chunk_bytes: 256 * 1024,
            max_snapshot_bytes: 1 << 30,
            snapshot_threshold_entries: 10_000,
            catch_up_lag_entries: 64,
            auto_membership: true,
        }
    }
}

impl RaftConfig {
    /// The fast profile: heartbeat 50 ms, election timeout in [300, 600) ms,
    /// failover well under a second. For LANs and tests.
    pub fn fast() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_jitter_ms: 300,
            ..RaftConfig::default()
        }
    }

    /// Checks the relations the algorithm relies on.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.heartbeat_interval_ms == 0 {
            return Err("heartbeat_interval_ms must be positive");
        }
        if self.election_timeout_min_ms < 3 * self.heartbeat_interval_ms {
            return Err("election_timeout_min_ms must be at least 3 heartbeats");
        }
        if self.election_timeout_jitter_ms == 0 {
            return Err("election_timeout_jitter_ms must be positive");
        }
        if self.max_append_entries == 0
            || self.max_inflight_appends == 0
            || self.max_uncommitted_entries == 0
            || self.max_outbox_messages == 0
            || self.snapshot_chunk_bytes == 0
        {
            return Err("limits must be positive");
        }
        Ok(())
    }

    pub(super) fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    pub(super) fn election_timeout_min(&self) -> Duration {
        Duration::from_millis(self.election_timeout_min_ms)
    }
}
