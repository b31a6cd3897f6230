//! Pushes to holders that asked for them: what their grants' watches found.

use super::*;

impl Server {
    /// Tells the holders whose watches are due at `now`: a lease ending
    /// soon, or lost (it ran out, at its cap or not). The table says
    /// whether the grant is current; a holder whose connection is gone is
    /// told nothing.
    pub(super) fn serve_watches(&mut self, now: Instant) {
        while let Some((token, mut watch)) = self.watches.next_due(now) {
            if self
                .conns
                .get(&watch.conn)
                .is_none_or(|conn| conn.out.is_closing())
            {
                continue;
            }
            let current = self
                .table
                .grant_of_token(watch.key.as_bytes(), token)
                .filter(|grant| grant.lease_deadline > now);
            match current {
                Some(grant) if grant.lease_deadline != watch.deadline => {
                    // Renewed from another connection: watch the new lease.
                    watch.lease = grant.lease_deadline.saturating_duration_since(now);
                    watch.deadline = grant.lease_deadline;
                    watch.warned = false;
                    self.watches.watch(token, watch);
                }
                Some(grant) => {
                    if !watch.warned {
                        let left = grant.lease_deadline.saturating_duration_since(now);
                        let ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
                        self.push(watch.conn, token, PushKind::LeaseEnding, ms);
                        watch.warned = true;
                    }
                    self.watches.watch(token, watch);
                }
                None => {
                    // Neither released by its holder nor revoked (those end
                    // the watch): its lease ran out.
                    let kind = if watch.cap_at == Some(watch.deadline) {
                        PushKind::CapReached
                    } else {
                        PushKind::Expired
                    };
                    self.push(watch.conn, token, kind, 0);
                }
            }
        }
    }

    /// Queues a push about `token` for `conn` (a connection that
    /// negotiated pushes).
    pub(super) fn push(&mut self, conn_id: ConnId, token: u64, kind: PushKind, lease_ms: u32) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if conn.out.is_closing() {
            return;
        }
        let reply = Reply::Push {
            token,
            kind,
            lease_ms,
        };
        if conn.values {
            conn.out.queue_reply(reply);
        } else {
            reply.encode(conn.out.buffer_mut());
        }
        self.pushes.count(kind);
        self.wakes.wake(conn_id, &mut conn.out);
    }
}
