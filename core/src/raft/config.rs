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
    pub append_entries_max: usize,
    /// Most entry bytes in one append (at least one entry is always sent).
    pub append_bytes_max: usize,
    /// Most appends in flight to one follower while pipelining.
    pub inflight_appends_max: usize,
    /// How long a commit index that no append carries yet may wait for one
    /// before it goes to an idle follower alone (zero: at once), when it
    /// covers more than one entry the follower was not told of. Such a
    /// batch means several clients are active, and their next entries come
    /// sooner and carry it: that spares an append, its answer and a
    /// wake-up of both nodes per commit. The commit of a single entry (one
    /// client alone) is told at once, because there the early wake-up of
    /// the follower made the next round trip faster (docs/cluster.md). At
    /// most one heartbeat interval.
    pub commit_notice_delay: Duration,
    /// Most entries a leader holds beyond its commit index; `propose` fails
    /// with [`super::ProposeError::Backpressure`] past it.
    pub uncommitted_entries_max: u64,
    /// Largest command payload accepted by `propose`.
    pub entry_bytes_max: usize,
    /// Most messages waiting in the outbox; newer ones are dropped beyond.
    pub outbox_messages_max: usize,
    /// Snapshot chunk size.
    pub snapshot_chunk_bytes: usize,
    /// Largest snapshot a follower accepts.
    pub snapshot_bytes_max: usize,
    /// Applied entries beyond the last snapshot after which
    /// [`super::Event::SnapshotWanted`] is emitted while the application's
    /// state is small (0 = never). The threshold in effect is this,
    /// `snapshot_entries_per_state_item` times the state's size, whichever
    /// is larger, capped at `snapshot_threshold_entries_max`
    /// ([`super::Raft::snapshot_threshold_entries`]).
    pub snapshot_threshold_entries: u64,
    /// Entries to apply between snapshots per item of the application's
    /// state, as told by [`super::Raft::set_state_items`] (0: the fixed
    /// threshold alone). A snapshot's cost grows with the state, so a
    /// threshold that grows with it keeps the snapshot work per applied
    /// entry constant instead of growing with the state.
    pub snapshot_entries_per_state_item: u64,
    /// Most applied entries held beyond the last snapshot however large
    /// the state: this bounds the memory of the log. At least
    /// `snapshot_threshold_entries`.
    pub snapshot_threshold_entries_max: u64,
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
            append_entries_max: 256,
            append_bytes_max: 256 * 1024,
            // A short window makes the entries proposed while appends are
            // in flight leave together in the next, larger append: fewer
            // messages and wake-ups per entry (docs/cluster.md). 4 full
            // appends still keep a follower over a slow link busy.
            inflight_appends_max: 4,
            // Longer than the gap between a client's reply and its next
            // request (a loopback or LAN round trip), short enough that a
            // follower's applied state trails by little when traffic stops.
            commit_notice_delay: Duration::from_millis(2),
            uncommitted_entries_max: 16_384,
            entry_bytes_max: 8 * 1024,
            outbox_messages_max: 4_096,
            snapshot_chunk_bytes: 256 * 1024,
            snapshot_bytes_max: 1 << 30,
            snapshot_threshold_entries: 10_000,
            // Two entries per grant: a snapshot of g grants then comes at
            // most once per 2·g entries, so its cost per entry is half that
            // of writing one grant record (docs/cluster.md, "Snapshots").
            snapshot_entries_per_state_item: 2,
            // About 120 bytes an entry of one short key in memory
            // (docs/cluster.md): at most ~120 MB of log on each node,
            // reached at 500,000 grants.
            snapshot_threshold_entries_max: 1_000_000,
            catch_up_lag_entries: 64,
            auto_membership: true,
        }
    }
}

impl RaftConfig {
    /// The fast profile: heartbeat 50 ms, election timeout in [300, 450) ms,
    /// failover under half a second. For LANs and tests.
    pub fn fast() -> Self {
        RaftConfig {
            heartbeat_interval: Duration::from_millis(50),
            election_timeout_min: Duration::from_millis(300),
            // Half the classic `[T, 2T)` spread: the failover's tail is the
            // window's top (the first of the survivors' timers to fire),
            // and 150 ms still spreads two timers far wider than a LAN
            // round trip; the pre-vote tie-break settles the rare two
            // that fire together. The lower end, which check-quorum and
            // the leader lease use, is unchanged (docs/performance.md,
            // "Failover and partitions").
            election_timeout_jitter: Duration::from_millis(150),
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
        if self.commit_notice_delay > self.heartbeat_interval {
            return Err("commit_notice_delay must be at most one heartbeat interval");
        }
        if self.append_entries_max == 0
            || self.inflight_appends_max == 0
            || self.uncommitted_entries_max == 0
            || self.outbox_messages_max == 0
            || self.snapshot_chunk_bytes == 0
        {
            return Err("limits must be positive");
        }
        if self.snapshot_threshold_entries_max < self.snapshot_threshold_entries {
            return Err(
                "snapshot_threshold_entries_max must be at least snapshot_threshold_entries",
            );
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
        let notice = |micros| RaftConfig {
            commit_notice_delay: Duration::from_micros(micros),
            ..fast()
        };
        // The fast heartbeat is 50 ms; zero means at once.
        assert!(fault(notice(50_001)).starts_with("commit_notice_delay "));
        assert_eq!(notice(50_000).validate(), Ok(()));
        assert_eq!(notice(0).validate(), Ok(()));
        let snapshot_max = |entries| RaftConfig {
            snapshot_threshold_entries: 100,
            snapshot_threshold_entries_max: entries,
            ..fast()
        };
        assert!(fault(snapshot_max(99)).starts_with("snapshot_threshold_entries_max "));
        assert_eq!(snapshot_max(100).validate(), Ok(()));
    }
}
