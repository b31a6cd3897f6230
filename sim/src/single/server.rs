//! The server process: start, stepping its machine, delivering, flushing and closing connections.

use ticketing_core::wire::KeyGroup;

use super::*;

impl<'t> World<'t> {
    pub(super) fn server_start(&mut self) {
        let local = self.server_now();
        let step = self.config.token_reserve_step;
        let back_max = self.config.faults.restart_clock_back_max_us;
        if step > 0 && self.next_epoch > 0 && back_max > 0 && self.fault_rng.chance(500_000) {
            let back = self.fault_rng.below(back_max);
            self.wall_back_us += back;
            self.note(|| format!("FAULT the server's wall clock is {back} µs behind at restart"));
        }
        // By our rule a domain's counter starts at its wall clock in µs, or
        // above the stored token floor if that is larger.
        let wall_us = (WALL_EPOCH_US + local).saturating_sub(self.wall_back_us);
        let stored = if self.config.forget_token_floor {
            None
        } else {
            self.disk_reserve
        };
        let first_token =
            ticketing_core::reserve::start_token(Duration::from_micros(wall_us), stored);
        let config = ServerConfig {
            lock: LockConfig {
                limits: Limits {
                    keys_max: self.config.keys_max,
                    waiters_per_key_max: self.config.waiters_per_key_max,
                    waiters_total_max: self.config.waiters_total_max,
                },
                ..LockConfig::default()
            },
            connections_max: 64,
            in_flight_per_connection_max: 64,
            ..ServerConfig::default()
        };
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.note(|| format!("server epoch {epoch} starts, first token {first_token}"));
        if first_token <= self.token_seen_max {
            self.violation(
                Checker::Tokens,
                format!(
                    "restarted server starts at token {first_token}, not above {}",
                    self.token_seen_max
                ),
            );
        }
        let mut server = Server::new(config, first_token, instant(local));
        if step > 0 {
            // As the drivers do: the first reserve is durable before
            // anything is served.
            let mut reserve = TokenReserve::new(step, stored);
            if let Some(value) = reserve.poll_persist(instant(local), first_token) {
                self.disk_reserve = Some(value);
                reserve.handle_persisted(value);
            }
            server = server.with_token_reserve(instant(local), reserve);
        }
        self.server = Some(ServerProc {
            server,
            epoch,
            timer_generation: 0,
            armed: None,
            conns: BTreeMap::new(),
            outputs: OutputQueues::default(),
        });
        self.server_step(Vec::new());
    }

    /// Drains the server's outputs: notes its alerts and reports, and
    /// starts the reserve write it asks for, if any (durable after a random
    /// delay, lost if the server crashes first). Wakes and force-release
    /// answers stay in `proc.outputs` for the step that serves them.
    pub(super) fn drain_server_outputs(&mut self) {
        let now = self.server_now();
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        let epoch = proc.epoch;
        proc.outputs.drain(&mut proc.server, instant(now));
        let alerts: Vec<_> = proc.outputs.alerts.drain(..).collect();
        let logs: Vec<_> = proc.outputs.logs.drain(..).collect();
        let asked = proc.outputs.reserves.pop_front();
        for alert in alerts {
            self.note(|| format!("server epoch {epoch}: {alert}"));
        }
        for event in logs {
            self.note(|| format!("server epoch {epoch}: {event:?}"));
        }
        if let Some(value) = asked {
            let delay = self
                .fault_rng
                .below(self.config.reserve_write_max_us.max(1));
            self.schedule(self.now_us + 1 + delay, Ev::ReserveWritten { epoch, value });
        }
    }

    pub(super) fn reserve_written(&mut self, epoch: u64, value: u64) {
        let now = self.server_now();
        let Some(proc) = self.server.as_mut().filter(|proc| proc.epoch == epoch) else {
            // The server crashed first: the write never landed.
            return;
        };
        self.disk_reserve = Some(self.disk_reserve.map_or(value, |d| d.max(value)));
        proc.server.handle_reserve_persisted(instant(now), value);
        self.server_step(Vec::new());
    }

    pub(super) fn connect_arrive(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.tcp.reset {
            return;
        }
        let local = self.server_now();
        let nonce = net::nonce(&mut self.net, 1);
        let accepted = self.server.as_mut().and_then(|proc| {
            // Every simulated client connects from the same address, like
            // clients on one host: per-source caps meet them all.
            let source = std::net::IpAddr::from([10, 0, 0, 1]);
            let id = proc.server.handle_connect(instant(local), nonce, source)?;
            proc.conns.insert(id, conn_id);
            Some((id, proc.epoch))
        });
        match accepted {
            Some((id, epoch)) => {
                let conn = self.conns.get_mut(&conn_id).expect("checked above");
                conn.server_id = Some(id);
                conn.epoch = epoch;
                conn.server_open = true;
                self.server_step(Vec::new());
            }
            None => {
                self.note(|| format!("conn {conn_id} refused"));
                self.reset_conn(conn_id);
            }
        }
    }

    pub(super) fn server_conn(&self, conn_id: u64) -> Option<ConnId> {
        let conn = self.conns.get(&conn_id)?;
        let proc = self.server.as_ref()?;
        (conn.server_open && conn.epoch == proc.epoch)
            .then_some(conn.server_id)
            .flatten()
    }

    pub(super) fn deliver_to_server(&mut self, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.tcp.landed(0, bytes.len());
        let Some(bytes) = conn.tcp.keep(0, bytes) else {
            return;
        };
        let Some(id) = self.server_conn(conn_id) else {
            return;
        };
        // Oracle: what requests does this chunk complete?
        let conn = self.conns.get_mut(&conn_id).expect("checked above");
        let arrived = conn.oracle.requests(&bytes);
        let local = self.server_now();
        let mut fresh = Vec::new();
        for request in arrived {
            self.rec.report.requests += 1;
            self.arrival_seq += 1;
            let Some((rid, req)) = self.server_req(conn_id, &request, local) else {
                continue;
            };
            if self.pending.insert((conn_id, rid), req).is_some() {
                self.violation(
                    Checker::Client,
                    format!("conn {conn_id} reused rid {rid} while in flight"),
                );
            }
            fresh.push((conn_id, rid));
        }
        if let Some(proc) = self.server.as_mut() {
            proc.server.handle_input(instant(local), id, &bytes);
        }
        self.server_step(fresh);
    }

    /// What the oracle tracks of `request`, arriving on `conn_id` at
    /// server-local time `local` as the latest arrival: its rid, and what
    /// it asks. None for a kind the sim never sends, which is a violation.
    fn server_req(
        &mut self,
        conn_id: u64,
        request: &Request,
        local: u64,
    ) -> Option<(u64, ServerReq)> {
        let arrived = ServerReq {
            acquire: false,
            other: Other::Lock,
            keys: Vec::new(),
            wait_s: 0,
            token: 0,
            arrival_local_us: local,
            seq: self.arrival_seq,
        };
        let tracked = match request {
            Request::Acquire(acquire) => (
                acquire.rid,
                ServerReq {
                    acquire: true,
                    keys: key_indices(&acquire.keys),
                    wait_s: acquire.wait_s,
                    ..arrived
                },
            ),
            Request::Release(release) => (
                release.rid,
                ServerReq {
                    keys: key_indices(&release.keys),
                    token: release.token,
                    ..arrived
                },
            ),
            Request::Negotiate(negotiate) => (
                negotiate.rid,
                ServerReq {
                    other: Other::Negotiate,
                    ..arrived
                },
            ),
            Request::Extend(extend) => {
                let keys = key_indices(&extend.keys);
                // Requests ahead of it in this chunk come from the same
                // client and cannot make an old token current again.
                let current = keys.iter().all(|&key| {
                    self.holder(key)
                        .is_some_and(|(token, deadline)| token == extend.token && deadline > local)
                });
                (
                    extend.rid,
                    ServerReq {
                        other: Other::Extend { current },
                        keys,
                        token: extend.token,
                        ..arrived
                    },
                )
            }
            Request::AcquireCapped(_)
            | Request::AcquirePermits(_)
            | Request::Observe(_)
            | Request::AcquireShared(_)
            | Request::Downgrade(_) => {
                self.violation(
                    Checker::Client,
                    format!(
                        "conn {conn_id} sent {request:?}: the sim asks for no hold cap, no permits, no observe and no shared lock"
                    ),
                );
                return None;
            }
        };
        Some(tracked)
    }

    /// After any server input: take what the server wants to send, feed
    /// the oracle, run the server-side checkers, re-arm the timer.
    /// `fresh` are the requests this input delivered.
    pub(super) fn server_step(&mut self, fresh: Vec<(u64, u64)>) {
        self.server_step_with(fresh, None);
    }

    /// [`World::server_step`], also taking `writable`'s bytes (its socket
    /// just became writable again).
    pub(super) fn server_step_with(&mut self, fresh: Vec<(u64, u64)>, writable: Option<u64>) {
        self.drain_server_outputs();
        let Some(replies) = self.read_new_replies() else {
            return;
        };
        self.check_replies(replies, fresh);
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        if self.rec.tracing() {
            let stats = proc.server.stats();
            self.note(|| {
                format!(
                    "server: {} conns, {} keys, {} waiters, next token {}",
                    stats.connections, stats.lock.keys, stats.lock.waiters, stats.lock.next_token
                )
            });
        }
        self.drain_server_outputs();
        let Some(takes) = self.take_woken(writable) else {
            return;
        };
        self.write_takes(takes);
        self.check_server_state();
        self.arm_server_timer();
    }

    /// Oracle: reads every reply the server queued since the last read,
    /// whether or not the driver takes it now, as (conn, reply, end offset
    /// of its frame). None if the server is down, or wrote a bad frame
    /// (recorded whatever checkers are off): the step ends.
    fn read_new_replies(&mut self) -> Option<Vec<(u64, Reply, u64)>> {
        let proc = self.server.as_mut()?;
        let mut replies = Vec::new();
        for (&id, &conn_id) in &proc.conns {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            let queued = proc.server.pending_transmit(id);
            let Some(new) = queued.get(conn.observed..) else {
                continue;
            };
            conn.observed = queued.len();
            let (decoded, bad) = conn.oracle.replies(new);
            if let Some(error) = bad {
                // Recorded whatever checkers are off, and the step ends.
                let detail = format!("server wrote a bad frame on conn {conn_id}: {error:?}");
                self.rec.report.violations.push(Violation {
                    checker: Checker::Replies,
                    at_us: self.now_us,
                    detail,
                });
                return None;
            }
            replies.extend(
                decoded
                    .into_iter()
                    .map(|(reply, end_offset)| (conn_id, reply, end_offset)),
            );
        }
        Some(replies)
    }

    /// Takes the bytes of every connection the server woke (and of
    /// `writable`), one take at a time per connection, as the runtimes do;
    /// a full socket (a write stall) leaves them in the server for a while.
    /// Returns the takes as (conn, bytes, state); none if the server is down.
    fn take_woken(&mut self, writable: Option<u64>) -> Option<Vec<(u64, Vec<u8>, ConnState)>> {
        let proc = self.server.as_mut()?;
        let mut woken: Vec<_> = proc.outputs.wakes.drain(..).collect();
        if let Some(conn_id) = writable
            && let Some(id) = self.conns.get(&conn_id).and_then(|conn| conn.server_id)
            && proc.conns.get(&id) == Some(&conn_id)
        {
            woken.push(id);
        }
        woken.sort();
        woken.dedup();
        let mut takes = Vec::new();
        let mut stalls = Vec::new();
        for id in woken {
            let Some(&conn_id) = proc.conns.get(&id) else {
                continue;
            };
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            if conn.stalled || conn.writing {
                // Like the runtimes: no new take until the last one is
                // written and reported flushed.
                continue;
            }
            if self.net.chance(self.config.faults.server_write_stall_ppm) {
                // The socket is full for a while: the bytes (and any grant
                // in them) stay untaken in the server.
                conn.stalled = true;
                let at = self.now_us + self.net.range(100, 50_000);
                stalls.push((at, conn_id));
                continue;
            }
            let mut out = Vec::new();
            let state = proc.server.poll_transmit(id, &mut out);
            debug_assert_eq!(out.len(), conn.observed, "took what the oracle read");
            conn.observed = 0;
            let taken = std::mem::take(&mut conn.untaken_grants);
            conn.unflushed_grants.extend(taken);
            takes.push((conn_id, out, state));
        }
        for (at, conn_id) in stalls {
            self.schedule(at, Ev::ServerWritable { conn: conn_id });
        }
        Some(takes)
    }

    /// Schedules each take's write, in parts, as a numbered take of its
    /// connection; a close after the flush is remembered.
    fn write_takes(&mut self, takes: Vec<(u64, Vec<u8>, ConnState)>) {
        for (conn_id, out, state) in takes {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            if state == ConnState::CloseAfterFlush {
                conn.close_after_flush = true;
            }
            conn.takes += 1;
            let take = conn.takes;
            if out.is_empty() && state != ConnState::CloseAfterFlush {
                continue;
            }
            conn.writing = true;
            let partial_ppm = self.config.faults.partial_write_ppm;
            for part in net::write_parts(&mut self.net, self.now_us, partial_ppm, out) {
                self.schedule(
                    part.at_us,
                    Ev::ServerFlush {
                        conn: conn_id,
                        take,
                        bytes: part.bytes,
                        done: part.done,
                    },
                );
            }
        }
    }

    /// Re-arms the server's timer when its next deadline changed: a new
    /// timer generation, so the old timer event does nothing.
    fn arm_server_timer(&mut self) {
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        let deadline = proc.server.poll_timeout();
        if deadline != proc.armed {
            proc.armed = deadline;
        } else {
            return;
        }
        if let Some(deadline) = deadline {
            proc.timer_generation += 1;
            let generation = proc.timer_generation;
            let epoch = proc.epoch;
            let at = self
                .server_clock
                .true_at(deadline.as_micros())
                .max(self.now_us);
            self.schedule(at, Ev::ServerTimer { epoch, generation });
        }
    }

    pub(super) fn server_flush(&mut self, conn_id: u64, take: u64, bytes: Vec<u8>, done: bool) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.tcp.reset {
            return;
        }
        debug_assert_eq!(conn.takes, take, "one take in flight at a time");
        let close = conn.close_after_flush && done;
        let written = bytes.len();
        self.send(conn_id, false, bytes);
        // Each part is reported as it goes out, as the drivers do: a grant
        // whose frame is written whole is delivered even if the rest is lost.
        if let Some(id) = self.server_conn(conn_id) {
            let local = self.server_now();
            if let Some(proc) = self.server.as_mut() {
                proc.server.handle_written(instant(local), id, written);
            }
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.oracle.written_total += written as u64;
                let written_total = conn.oracle.written_total;
                conn.unflushed_grants
                    .retain(|(_, _, end_offset)| *end_offset > written_total);
            }
        }
        if !done {
            return;
        }
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.writing = false;
        }
        if let Some(id) = self.server_conn(conn_id) {
            let local = self.server_now();
            if let Some(proc) = self.server.as_mut() {
                proc.server.handle_flushed(instant(local), id);
            }
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.unflushed_grants.clear();
            }
            if !close {
                // Whatever the server queued meanwhile goes next.
                self.server_step_with(Vec::new(), Some(conn_id));
            }
        }
        if close {
            // The server asked to close after flushing: FIN after the bytes.
            self.server_closes(conn_id);
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                let at = conn.tcp.last_us[1].max(self.now_us) + 1;
                conn.tcp.reset = true;
                self.schedule(at, Ev::ClientSeesClose { conn: conn_id });
            }
        }
    }

    pub(super) fn server_sees_close(&mut self, conn_id: u64) {
        self.server_closes(conn_id);
        self.drop_conn_if_done(conn_id);
    }

    pub(super) fn server_closes(&mut self, conn_id: u64) {
        let Some(id) = self.server_conn(conn_id) else {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.server_open = false;
            }
            return;
        };
        let local = self.server_now();
        if let Some(proc) = self.server.as_mut() {
            proc.server.handle_closed(instant(local), id);
            proc.conns.remove(&id);
        }
        let conn = self.conns.get_mut(&conn_id).expect("server_conn found it");
        conn.server_open = false;
        let mut ghosts = std::mem::take(&mut conn.unflushed_grants);
        ghosts.append(&mut conn.untaken_grants);
        // The server may hand these keys on at once.
        self.ghost_tokens
            .extend(ghosts.iter().map(|(token, _, _)| *token));
        // Its queued waiters are dropped by the server.
        let gone: Vec<(u64, u64)> = self
            .pending
            .range((conn_id, 0)..=(conn_id, u64::MAX))
            .map(|(key, _)| *key)
            .collect();
        for key in gone {
            self.pending.remove(&key);
        }
        self.server_step(Vec::new());
        // Grants that never left must not stay held.
        for (token, keys, _) in ghosts {
            if let Some(&client) = self.handed_tokens.get(&token) {
                self.violation(
                    Checker::Replies,
                    format!(
                        "conn {conn_id} closed and the server released grant {token} as never delivered, yet client {client} holds it"
                    ),
                );
            }
            for &key in &keys {
                let holder = self.holder(key);
                if holder.is_some_and(|(held, _)| held == token) {
                    self.violation(
                        Checker::Replies,
                        format!(
                            "conn {conn_id} closed before grant {token} was flushed, yet {} is still held by it",
                            ALL_KEYS[key]
                        ),
                    );
                }
            }
        }
    }
}

/// The simulator's indices of the keys of `group`.
fn key_indices(group: &KeyGroup) -> Vec<usize> {
    group
        .keys()
        .iter()
        .map(|k| key_index(k.as_bytes()))
        .collect()
}
