//! Timing and limits of one Raft node, with the production defaults and
//! the fast profile (see the module documentation of [`super`] for the
//! failover arithmetic behind them).

use crate::time::Duration;

/// Timing and limits of one Raft node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftConfig {
    /// How often a leader sends heartbeats. At least 1 ms.
    pub heartbeat_interval: Duration,
    /// Lower bound of the randomized election timeout; also the leader-lease
    /// and check-quorum window. At least three heartbeat intervals.
    pub election_timeout_min: Duration,
    /// Width of the randomization window above the minimum. At least 1 ms;
    /// the timeout is drawn from it in whole milliseconds.
    pub election_timeout_jitter: Duration,
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
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(2_400),
            election_timeout_jitter: Duration::from_millis(100),
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
            heartbeat_interval: Duration::from_millis(50),
            election_timeout_min: Duration::from_millis(300),
            election_timeout_jitter: Duration::from_millis(300),
            ..RaftConfig::default()
        }
    }

    /// Checks the relations the algorithm relies on. The messages name
    /// the field at fault.
    pub fn validate(&self) -> Result<(), &'static str> {
        // Whole milliseconds at the low end keep every timer at least one
        // tick of the microsecond clock and the jitter draw non-empty.
        let millisecond = Duration::from_millis(1);
        if self.heartbeat_interval < millisecond {
            return Err("heartbeat_interval must be at least 1 ms");
        }
        if self.election_timeout_min < self.heartbeat_interval.saturating_mul(3) {
            return Err("election_timeout_min must be at least 3 heartbeat intervals");
        }
        if self.election_timeout_jitter < millisecond {
            return Err("election_timeout_jitter must be at least 1 ms");
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_timing_field_at_fault() {
        assert_eq!(RaftConfig::default().validate(), Ok(()));
        assert_eq!(RaftConfig::fast().validate(), Ok(()));
        let fast = RaftConfig::fast;
        let fault = |cfg: RaftConfig| cfg.validate().unwrap_err();
        let heartbeat = RaftConfig {
            heartbeat_interval: Duration::from_micros(999),
            ..fast()
        };
        assert!(fault(heartbeat).starts_with("heartbeat_interval "));
        // Three fast heartbeats are 150 ms.
        let timeout = RaftConfig {
            election_timeout_min: Duration::from_micros(149_999),
            ..fast()
        };
        assert!(fault(timeout).starts_with("election_timeout_min "));
        let at_three = RaftConfig {
            election_timeout_min: Duration::from_millis(150),
            ..fast()
        };
        assert_eq!(at_three.validate(), Ok(()));
        let jitter = RaftConfig {
            election_timeout_jitter: Duration::from_micros(999),
            ..fast()
        };
        assert!(fault(jitter).starts_with("election_timeout_jitter "));
    }
}
