//! Shared locks in the single-mode server (`Y` and `D`, docs/protocol.md
//! §8.7): a `Y` is an acquire with a mode per key and goes through
//! `handle_acquire`; a downgrade is answered here.

use super::{ConnId, Server, send};
use crate::conn::client::{Answer, ReplyTo};
use crate::lock::DowngradeOutcome;
use crate::time::Instant;
use crate::wire::KeyGroup;

impl Server {
    /// Turns the grant `token` of `keys` (every key of it) from exclusive
    /// to shared in place: same token, same lease, so the holder's
    /// deadline, its pushes and its count of held keys stay as they are.
    /// Shared requests queued directly behind it join it; their grants are
    /// drained by the caller.
    pub(super) fn handle_downgrade(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        token: u64,
        keys: &KeyGroup,
        reply_to: &ReplyTo,
    ) {
        let answer = match self.table.downgrade(now, keys, token) {
            DowngradeOutcome::Downgraded => Answer::Downgraded,
            DowngradeOutcome::NotFound => Answer::NotFound,
            DowngradeOutcome::GroupMismatch => Answer::GroupMismatch,
        };
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            send(conn_id, conn, &mut self.wakes, reply_to, answer);
        }
    }
}
