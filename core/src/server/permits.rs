//! Permits: requests for a semaphore's slots, their grants and their queue's
//! events.

use super::*;

impl Server {
    /// Takes permits of a semaphore: granted, queued or refused by the
    /// semaphores' FIFO rule, under the same per-connection limits as an
    /// acquire.
    pub(super) fn handle_permits(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        request: PermitsRequest,
        max_hold: Option<Duration>,
        reply_to: ReplyTo,
    ) {
        let outcome = if self.over_connection_limits(now, conn_id, usize::from(request.permits)) {
            PermitOutcome::Busy
        } else {
            let waiter = WaiterId(self.next_waiter_id);
            self.next_waiter_id += 1;
            let ask = PermitAsk {
                name: request.name,
                permits: request.permits,
                capacity: request.capacity,
                wait_s: request.wait_s,
                lease_s: request.lease_s,
                holder: conn_id.0,
                max_hold,
            };
            let outcome = self.semaphores.acquire(now, &mut self.table, waiter, ask);
            if outcome == PermitOutcome::Queued {
                let Some(conn) = self.conns.get_mut(&conn_id) else {
                    self.semaphores.cancel(waiter);
                    return;
                };
                conn.queued.insert(waiter);
                self.permit_waiters.insert(
                    waiter,
                    QueuedPermits {
                        conn: conn_id,
                        reply_to,
                    },
                );
                return;
            }
            outcome
        };
        let answer = match outcome {
            PermitOutcome::Granted(grant) => {
                let expires = lease_end(&self.table, &grant.keys, grant.token, now);
                self.deliver_permits(now, conn_id, &reply_to, grant, expires);
                return;
            }
            PermitOutcome::TimedOut => Answer::TimedOut,
            PermitOutcome::Busy => Answer::Busy,
            PermitOutcome::CapacityMismatch { capacity } => Answer::CapacityMismatch {
                asked: request.capacity,
                capacity,
            },
            PermitOutcome::Queued => unreachable!("queued requests returned above"),
        };
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            send(conn_id, conn, &mut self.wakes, &reply_to, answer);
        }
    }

    /// Sends a permit grant to its holder, counted, watched and recorded
    /// as a grant of its slot keys (so an undelivered one is released).
    /// A holder already closing does not get it: its slots go to the next
    /// waiter at once.
    pub(super) fn deliver_permits(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        reply_to: &ReplyTo,
        grant: PermitGrant,
        expires: Instant,
    ) {
        let Some(conn) = self
            .conns
            .get_mut(&conn_id)
            .filter(|conn| !conn.out.is_closing())
        else {
            self.table.release(now, &grant.keys, grant.token);
            self.semaphores.keys_freed(grant.keys.keys());
            return;
        };
        self.held.add(conn_id, grant.keys.len(), expires);
        let lease = expires.saturating_duration_since(now);
        watch_grant(
            &self.table,
            &mut self.watches,
            (conn_id, conn),
            grant.token,
            &grant.keys,
            (lease, expires),
        );
        let answer = Answer::PermitsGranted {
            token: grant.token,
            free: grant.free,
            slots: grant.slots,
        };
        send(conn_id, conn, &mut self.wakes, reply_to, answer);
        conn.out.record_grant(grant.token, grant.keys);
    }

    /// Answers what became of queued permit requests, serving the
    /// semaphores first when something is due.
    pub(super) fn drain_permit_events(&mut self, now: Instant) -> bool {
        if !self.semaphores.has_work(now) {
            return false;
        }
        self.semaphores.serve(now, &mut self.table);
        while let Some(event) = self.semaphores.poll_event() {
            let waiter = match &event {
                PermitEvent::Granted { waiter, .. } | PermitEvent::TimedOut { waiter } => *waiter,
            };
            let Some(queued) = self.permit_waiters.remove(&waiter) else {
                debug_assert!(false, "permit event for unknown waiter {waiter:?}");
                continue;
            };
            if let Some(conn) = self.conns.get_mut(&queued.conn) {
                conn.queued.remove(&waiter);
            }
            match event {
                PermitEvent::Granted {
                    grant,
                    lease_deadline,
                    ..
                } => {
                    self.deliver_permits(now, queued.conn, &queued.reply_to, grant, lease_deadline)
                }
                PermitEvent::TimedOut { .. } => {
                    if let Some(conn) = self.conns.get_mut(&queued.conn) {
                        send(
                            queued.conn,
                            conn,
                            &mut self.wakes,
                            &queued.reply_to,
                            Answer::TimedOut,
                        );
                    }
                }
            }
        }
        true
    }
}
