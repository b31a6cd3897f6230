//! The driver contract for the single-mode server: what each input means
//! and what it emits.

use super::*;

/// The queues [`Machine::poll_output`] drains.
impl Server {
    /// A connection that has bytes to send or must be closed. A connection
    /// whose bytes were already taken since it was queued is skipped, so each
    /// is reported once per batch of bytes.
    fn next_wake(&mut self) -> Option<ConnId> {
        self.wakes.poll(|conn_id| {
            self.conns
                .get_mut(&conn_id)
                .is_some_and(|conn| conn.out.leave_wake_queue())
        })
    }

    /// A reserve value the driver must store durably now. The table refuses
    /// every token above the limit, so a next token beyond it means grants
    /// are being held back right now: that is an alert.
    fn next_reserve_write(&mut self, now: Instant) -> Option<u64> {
        let next_token = self.table.next_token();
        self.reserve.note_exhausted(next_token);
        self.reserve.poll_persist(now, next_token)
    }
}

/// The driver contract (see [`crate::machine`]); the doc of each method
/// says what it means for the single-mode server.
impl Machine for Server {
    /// A transport connection opened from `source`. `nonce` must be fresh
    /// CSPRNG bytes. Returns `None` if every session slot is taken or the
    /// server is shutting down (close it at once). Otherwise the connection
    /// joins the handshake budget, which may drop an older unfinished
    /// handshake (never this one). The hello is queued for sending (a wake
    /// follows).
    fn handle_connect(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.handle_timeout(now);
        // Connection ids are the table's 48-bit holder tags: past 2^48
        // connections (nine years at a million a second) none is accepted.
        let conn_id = ConnId(self.next_conn_id);
        let closed_to_new = self.shutting_down || conn_id.0 > HOLDER_MAX;
        let evicted = match self.clients.accept(closed_to_new, conn_id, source) {
            Accept::Refused => {
                self.reports.abuse(now, Some(source), AbuseKind::Refused);
                return None;
            }
            Accept::Admitted { evicted } => evicted,
        };
        self.next_conn_id += 1;
        if let Some(evicted) = evicted {
            if let Some(old) = self.conns.get(&evicted) {
                let old_source = old.source;
                self.reports
                    .abuse(now, Some(old_source), AbuseKind::HandshakeEvicted);
            }
            self.close_conn(now, evicted, CloseReason::HandshakeEvicted);
        }
        let hello = Hello {
            mode: WireMode::Single,
            self_slot: NO_LEADER_SLOT,
            nonce,
        };
        let (front, deadline) =
            self.clients
                .front(now, hello, SINGLE_FINGERPRINT, Capabilities::KNOWN);
        let mut conn = Conn {
            out: Outbound::new(front.hello_bytes().to_vec()),
            front,
            queued: BTreeSet::new(),
            source,
            close_reason: None,
            release_misses_in_row: 0,
            replies: ReplyCounts::default(),
            values: false,
        };
        self.wakes.wake(conn_id, &mut conn.out);
        self.conns.insert(conn_id, conn);
        self.handshake_deadlines.push(deadline, conn_id);
        Some(conn_id)
    }

    /// Bytes received on `conn`.
    fn handle_input(&mut self, now: Instant, conn_id: ConnId, bytes: &[u8]) {
        self.handle_timeout(now);
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if conn.out.is_closing() {
            return;
        }
        if conn.values {
            // Its requests come as values (`handle_requests`): bytes now
            // could only be a driver's mistake, and mixed with values the
            // order of replies would be lost.
            self.close_conn(now, conn_id, CloseReason::BadFrame);
            return;
        }
        let step = self.clients.handshake_input(
            now,
            conn_id,
            &mut conn.front,
            &self.config.client_tokens,
            bytes,
            conn.out.buffer_mut(),
        );
        match step {
            Handshake::Pending => return,
            Handshake::Session => {}
            Handshake::Started(_) => self.wakes.wake(conn_id, &mut conn.out),
            Handshake::SessionLimit => {
                let source = conn.source;
                self.reports.abuse(now, Some(source), AbuseKind::Refused);
                self.close_conn(now, conn_id, CloseReason::SessionLimit);
                return;
            }
            Handshake::Rejected { answer_at } => {
                let source = conn.source;
                self.reports
                    .abuse(now, Some(source), AbuseKind::FailedProof);
                match answer_at {
                    // The line dialect answers a failed handshake late.
                    Some(at) => self.handshake_deadlines.push(at, conn_id),
                    None => self.close_conn(now, conn_id, CloseReason::ProofRejected),
                }
                return;
            }
        }
        loop {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                return;
            };
            if conn.out.is_closing() {
                break;
            }
            let next = conn
                .front
                .next_request(conn.out.buffer_mut(), &mut conn.replies);
            if !conn.out.pending().is_empty() {
                self.wakes.wake(conn_id, &mut conn.out);
            }
            match next {
                Ok(None) => break,
                Ok(Some(request)) => self.handle_request(now, conn_id, request),
                Err(reason) => {
                    self.close_conn(now, conn_id, reason);
                    break;
                }
            }
        }
        self.drain_lock_events(now);
    }

    /// The next `bytes` of what [`Server::poll_transmit`] gave for `conn`
    /// were handed to the transport (a short write reports its part). A
    /// grant whose reply frame is written whole counts as delivered: the
    /// client may have its token, so it is never released as a ghost.
    /// No time is needed here (a cluster node times its peer links by
    /// their writes, hence `now` in the contract).
    fn handle_written(&mut self, _now: Instant, conn_id: ConnId, bytes: usize) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.out.handle_written(bytes);
        }
    }

    /// Everything taken from `conn` by [`Server::poll_transmit`] so far has
    /// been written to the transport: grants in it count as delivered.
    /// (`now`: as for [`Server::handle_written`].)
    fn handle_flushed(&mut self, _now: Instant, conn_id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.out.handle_flushed();
        }
    }

    /// The transport of `conn` is gone (EOF, error, or after
    /// [`ConnState::CloseAfterFlush`]). Its queued waiters are dropped and
    /// grants whose reply was not written whole are released at once.
    fn handle_closed(&mut self, now: Instant, conn_id: ConnId) {
        self.handle_timeout(now);
        self.close_conn(now, conn_id, CloseReason::TransportClosed);
        let Some(conn) = self.conns.remove(&conn_id) else {
            return;
        };
        self.clients.closed(conn_id, &conn.front);
        // A connection that closes holding keys keeps its held-key count
        // (it ends with the grants' leases) and its label, so observers
        // still name the holder; everything else is forgotten now.
        let departing_label = conn.front.label().filter(|_| self.held.held(conn_id) > 0);
        match departing_label {
            Some(label) => {
                if let Some(evicted) = self.departed.insert(conn_id, label) {
                    self.held.forget_conn(evicted);
                }
                self.prune_departed();
            }
            None => self.held.forget_conn(conn_id),
        }
        self.closed_replies.add(&conn.replies);
        let reason = conn.close_reason.unwrap_or(CloseReason::TransportClosed);
        self.reports.closed(conn_id, Some(conn.source), reason);
        #[cfg(feature = "planted-bugs")]
        if crate::testing::planted::active(crate::testing::planted::PlantedBug::ForgetGhostGrant) {
            self.drain_lock_events(now);
            return;
        }
        for grant in conn.out.into_undelivered() {
            // The holder never learned its token: release it now rather than
            // leave the key blocked until the lease ends. A token that is no
            // longer current (expired and re-granted) is simply not found.
            self.table.release(now, &grant.keys, grant.token);
            self.semaphores.keys_freed(grant.keys.keys());
        }
        self.drain_lock_events(now);
    }

    /// Processes every deadline at or before `now`.
    fn handle_timeout(&mut self, now: Instant) {
        self.table.handle_timeout(now);
        while let Some(conn_id) = self.handshake_deadlines.pop_due(now) {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            match conn.front.handle_timeout(now, conn.out.buffer_mut()) {
                FrontTimeout::Nothing => {}
                FrontTimeout::HandshakeTimedOut => {
                    let source = conn.source;
                    self.reports
                        .abuse(now, Some(source), AbuseKind::HandshakeTimedOut);
                    self.close_conn(now, conn_id, CloseReason::HandshakeTimedOut);
                }
                FrontTimeout::AuthFailedSent => {
                    self.close_conn(now, conn_id, CloseReason::ProofRejected);
                }
            }
        }
        self.held.expire(now);
        self.reports.handle_timeout(now);
        self.drain_lock_events(now);
        self.serve_watches(now);
    }

    /// `value` is durable: tokens up to it may be issued; waiters held back
    /// by the reserve are granted now (wakes follow).
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        if self.reserve.handle_persisted(value) {
            self.table.set_token_limit(now, self.reserve.limit());
            self.semaphores.recheck_all();
            self.drain_lock_events(now);
        }
    }

    /// The write asked for by [`Output::Reserve`] failed; it is asked
    /// for again later ([`Server::poll_timeout`] says when).
    fn handle_reserve_failed(&mut self, now: Instant) {
        self.reserve.handle_persist_failed(now);
    }

    /// An operator's force-release, decided at once: the answer is ready
    /// from [`Output::AdminReply`] under `id`. A release is exactly a
    /// holder's release (hand-over to the front waiter under a larger token,
    /// wakes follow), counted and reported through [`Output::Log`].
    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.handle_timeout(now);
        // Read before the release: the key may go straight to a waiter.
        let grant = match req.token {
            Some(token) => self.table.grant_of_token(req.key.as_bytes(), token),
            None => self.table.grant_of(req.key.as_bytes()),
        };
        let outcome = self.table.force_release(now, req.key.as_bytes(), req.token);
        if let ForceReleaseOutcome::Released {
            revoked,
            keys,
            handed_to,
        } = &outcome
        {
            if let Some(grant) = grant.filter(|grant| grant.token == *revoked) {
                self.held
                    .released(ConnId(grant.holder), grant.keys, grant.lease_deadline);
            }
            if let Some(watch) = self.watches.forget(*revoked) {
                self.push(watch.conn, *revoked, PushKind::ForceReleased, 0);
            }
            self.semaphores.keys_freed(keys);
            self.reports
                .force_released(now, keys.clone(), *revoked, *handed_to);
            self.drain_lock_events(now);
        }
        self.admin_replies.push(id, outcome);
    }

    /// Stop serving: every queued waiter gets `T`, every connection is
    /// flushed and then closed (a line session is told `Enot_active`
    /// first), and new connections are refused.
    fn begin_shutdown(&mut self, now: Instant) {
        self.handle_timeout(now);
        self.shutting_down = true;
        self.reports.flush();
        self.table.time_out_all_waiters(now);
        self.semaphores.time_out_all();
        self.drain_lock_events(now);
        let mut conn_ids: Vec<ConnId> = self.conns.keys().copied().collect();
        conn_ids.sort_unstable();
        for conn_id in conn_ids {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.close_reason.get_or_insert(CloseReason::Shutdown);
                conn.front.farewell(conn.out.buffer_mut());
                self.wakes.close_after_flush(conn_id, &mut conn.out);
            }
        }
    }

    /// The next output, in this order: answers to force-releases, the
    /// reserve write, token alerts, connections to serve, reports to log.
    fn poll_output(&mut self, now: Instant) -> Option<Output> {
        if let Some((id, outcome)) = self.admin_replies.pop() {
            return Some(Output::AdminReply { id, outcome });
        }
        if let Some(value) = self.next_reserve_write(now) {
            return Some(Output::Reserve { value });
        }
        if let Some(alert) = self.reserve.poll_alert() {
            return Some(Output::Alert(alert));
        }
        if let Some(conn) = self.next_wake() {
            return Some(Output::Wake(conn));
        }
        self.reports.poll().map(Output::Log)
    }

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection.
    fn poll_transmit(&mut self, conn_id: ConnId, out: &mut Vec<u8>) -> ConnState {
        self.conns
            .get_mut(&conn_id)
            .map_or(ConnState::Gone, |conn| conn.out.take(out))
    }

    /// The earliest instant at which [`Server::handle_timeout`] has work.
    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.table.poll_timeout(),
            self.handshake_deadlines.earliest(),
            self.reports.poll_timeout(),
            self.reserve.poll_timeout(),
            self.watches.poll_timeout(),
            self.semaphores.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn handle_requests(&mut self, now: Instant, conn_id: ConnId, requests: &mut Vec<Request>) {
        self.serve_request_values(now, conn_id, requests);
    }

    fn poll_transmit_replies(
        &mut self,
        conn_id: ConnId,
        out: &mut Vec<u8>,
        replies: &mut Vec<Reply>,
    ) -> ConnState {
        self.conns
            .get_mut(&conn_id)
            .map_or(ConnState::Gone, |conn| {
                conn.out.take_with_replies(out, replies)
            })
    }

    /// False while `conn` has too many reply bytes waiting to be written: the
    /// driver should stop reading from it until it has written them.
    fn wants_input(&self, conn_id: ConnId) -> bool {
        let bytes_max = self.config.outbound_bytes_per_connection_max;
        self.conns
            .get(&conn_id)
            .is_some_and(|conn| ClientAdmission::wants_input(&conn.front, &conn.out, bytes_max))
    }

    /// True once [`Server::begin_shutdown`] was called.
    fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// `key` as an operator sees it at `now`: its holder (token, whole
    /// group, ages, connection) and its waiters in queue order; `None` when
    /// it is neither held nor waited on.
    fn inspect_lock(&self, now: Instant, key: &Key) -> Option<LockView> {
        let inspection = self.table.inspect_key(now, key.as_bytes())?;
        Some(self.lock_view(inspection))
    }

    /// The recent events, the most recent first (see [`crate::events`]).
    fn recent_events(&self, now: Instant) -> Vec<EventView> {
        self.reports.recent_events(now)
    }

    /// One page of the keys starting with `prefix` that are held or
    /// waited on at `now` (see [`LockTable::inspect_page`]).
    fn inspect_locks(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
        cursor: ListingCursor,
    ) -> LockListing {
        let (inspections, next) = self.table.inspect_page(now, prefix, limit, cursor);
        LockListing {
            locks: inspections
                .into_iter()
                .map(|inspection| self.lock_view(inspection))
                .collect(),
            next,
        }
    }
}
