//! Assembly of the single-mode server's metrics snapshot
//! ([`crate::metrics::ServerMetrics`]) from the lock table and the
//! connections' counts.

use crate::budget::AbuseCounts;
use crate::lock::LockTable;
use crate::metrics::{PushCounts, ReplyCounts, ReplyKind, SemaphoreBusy, ServerMetrics};

impl ServerMetrics {
    /// Assembles a snapshot; the `B` replies neither the table nor the
    /// semaphores decided are those of the per-connection limits.
    pub(crate) fn assemble(
        (table, busy_semaphores): (&LockTable, SemaphoreBusy),
        (replies, pushes): (ReplyCounts, PushCounts),
        abuse: AbuseCounts,
        (sessions, line_sessions): (usize, usize),
        handshakes: usize,
        shutting_down: bool,
    ) -> ServerMetrics {
        let busy_per_connection = replies
            .of(ReplyKind::Busy)
            .saturating_sub(table.metrics().busy_total())
            .saturating_sub(busy_semaphores.total());
        ServerMetrics {
            lock: table.metrics().clone(),
            pushes,
            replies,
            busy_semaphores,
            busy_per_connection,
            abuse,
            held_keys: table.holder_keys() as u64,
            keys: table.key_count() as u64,
            waiters: table.waiter_count() as u64,
            sessions: sessions as u64,
            line_sessions: line_sessions as u64,
            handshakes: handshakes as u64,
            shutting_down,
        }
    }
}
