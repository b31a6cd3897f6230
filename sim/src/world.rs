//! The simulated world: one server process and several client processes,
//! each with its own drifting clock, talking over simulated TCP
//! connections; an event queue ordered by (time, sequence); faults; and the
//! checkers, run after every event.
//!
//! True time (`now_us`) is the simulator's; every process sees only its own
//! clock, mapped from true time by a rate error within the drift bound plus
//! forward jumps. The core state machines (`Server`, `Session`,
//! `AcquireOperation`, `ReleaseOperation`, `Backoff`) are the real ones.

use std::collections::{BTreeMap, HashMap, HashSet};

use ticketing_core::client::{Backoff, ClientError, CloseReason, Session, SessionConfig};
use ticketing_core::inspect::{AdminRequestId, ForceRelease, ForceReleaseOutcome};
use ticketing_core::lock::{Limits, LockConfig};
use ticketing_core::machine::Machine;
use ticketing_core::reserve::TokenReserve;
use ticketing_core::server::{ConnId, ConnState, Server, ServerConfig};
use ticketing_core::testing::outputs::OutputQueues;
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Capabilities, Key, Reply, Request};

use crate::checks::{ANSWERED_MAX, History, Windows, key_index};
use crate::clients::{
    ClientCall, ClientEv, ClientProc, ClientWorld, DbKey, Parts, ReleaseFailure, Sessions,
    close_expected_of_any,
};
use crate::clock::{Clock, WALL_EPOCH_US, instant};
use crate::config::{ALL_KEYS, SimConfig};
use crate::driver::{self, Marker, SimWorld};
use crate::line_client::LineClientWorld;
use crate::linear::LinOp;
use crate::net::{self, StreamOracle, Tcp};
use crate::rng::{FaultRoll, Rng, fuzz_streams, seeded_streams};
pub use crate::run::{Checker, RunReport, Violation};
use crate::run::{Phase, Queue, Recorder, Scheduled, Short};

/// Each side of a connection keeps at most this many bytes in flight; a
/// bound, never reached by this workload.
const IN_FLIGHT_BYTES_MAX: usize = 1 << 20;

#[derive(Clone, Debug)]
pub(crate) enum Ev {
    /// Everything a client process does on its own.
    Client(ClientCall),
    ConnectArrive {
        conn: u64,
    },
    DeliverToServer {
        conn: u64,
        bytes: Vec<u8>,
    },
    DeliverToClient {
        conn: u64,
        bytes: Vec<u8>,
    },
    /// Part of a take reaches the kernel; `done` on its last part.
    ServerFlush {
        conn: u64,
        take: u64,
        bytes: Vec<u8>,
        done: bool,
    },
    ServerWritable {
        conn: u64,
    },
    ServerSeesClose {
        conn: u64,
    },
    ClientSeesClose {
        conn: u64,
    },
    ServerTimer {
        epoch: u64,
        generation: u64,
    },
    ServerStart,
    /// A token reserve write of server `epoch` is durable.
    ReserveWritten {
        epoch: u64,
        value: u64,
    },
    FaultTick,
    EndSafety,
    End,
}

impl Ev {
    fn code(&self) -> u64 {
        match self {
            Ev::Client(call) => 1 + call.code_offset(),
            Ev::ConnectArrive { .. } => 9,
            Ev::DeliverToServer { .. } => 10,
            Ev::DeliverToClient { .. } => 11,
            Ev::ServerFlush { .. } => 12,
            Ev::ServerWritable { .. } => 20,
            Ev::ServerSeesClose { .. } => 13,
            Ev::ClientSeesClose { .. } => 14,
            Ev::ServerTimer { .. } => 15,
            Ev::ServerStart => 16,
            Ev::FaultTick => 17,
            Ev::EndSafety => 18,
            Ev::End => 19,
            Ev::ReserveWritten { .. } => 21,
        }
    }
}

/// A simulated TCP connection between one client incarnation and one
/// server epoch, plus the oracle's decoding of both byte streams.
struct SimConn {
    client: usize,
    inc: u64,
    server_id: Option<ConnId>,
    epoch: u64,
    /// The network's side: direction 0 to the server, 1 to the client.
    tcp: Tcp,
    client_open: bool,
    server_open: bool,
    /// Bytes that reached a paused client's kernel, in order, and whether
    /// the reset notice came after them: handed over when it resumes.
    held_for_client: Vec<u8>,
    close_held: bool,
    /// The server's socket is not writable: its bytes stay in the server
    /// (untaken) until a `ServerWritable` event.
    stalled: bool,
    /// A take is being written; the next one waits (as in the runtimes).
    writing: bool,
    /// Oracle: the requests and replies in the two byte streams.
    oracle: StreamOracle,
    takes: u64,
    /// Bytes of the server's pending output for this connection the oracle
    /// has read.
    observed: usize,
    /// Grants in bytes the driver has not taken yet: token, keys, and the
    /// stream offset just past the grant's frame.
    untaken_grants: Vec<(u64, Vec<usize>, u64)>,
    /// Grants in taken bytes whose frame is not yet written whole (released
    /// by the server if the connection dies first).
    unflushed_grants: Vec<(u64, Vec<usize>, u64)>,
    close_after_flush: bool,
}

/// A request as the server received it (oracle).
#[derive(Clone, Debug)]
struct ServerReq {
    acquire: bool,
    /// What besides an acquire or release the request is.
    other: Other,
    keys: Vec<usize>,
    wait_s: u8,
    token: u64,
    arrival_local_us: u64,
    seq: u64,
}

/// Requests of the extension channel, as the oracle tracks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Other {
    /// An acquire or a release.
    Lock,
    /// The client's `X`.
    Negotiate,
    /// A renewal, and whether its token was the current grant of its keys
    /// (running lease) when it arrived.
    Extend { current: bool },
}

struct ServerProc {
    server: Server,
    epoch: u64,
    timer_generation: u64,
    /// The deadline the pending timer event stands for.
    armed: Option<Instant>,
    conns: BTreeMap<ConnId, u64>,
    /// What the server emitted and the world has not served yet.
    outputs: OutputQueues,
}

/// A simulated world; see the module docs.
pub struct World<'t> {
    config: SimConfig,
    now_us: u64,
    queue: Queue<Ev>,
    net: Rng,
    work: Rng,
    fault_rng: Rng,
    phase: Phase,
    server: Option<ServerProc>,
    server_clock: Clock,
    next_epoch: u64,
    /// Bumped whenever server leases may end early in true time (a restart
    /// from nothing, a forward jump of the server's clock): validity windows
    /// are only compared within one era.
    lease_era: u64,
    clients: Vec<ClientProc>,
    conns: BTreeMap<u64, SimConn>,
    next_conn: u64,
    next_op: u64,
    next_grant_id: u64,
    // Oracle of the server's side.
    pending: BTreeMap<(u64, u64), ServerReq>,
    arrival_seq: u64,
    token_seen_max: u64,
    /// The token floor's file: the last reserve made durable.
    disk_reserve: Option<u64>,
    /// How far the server's wall clock was stepped back at restarts.
    wall_back_us: u64,
    tokens_seen: HashSet<u64>,
    token_groups: HashMap<u64, Vec<usize>>,
    /// The lease era each grant was made in.
    token_eras: HashMap<u64, u64>,
    released_tokens: HashSet<u64>,
    ghost_tokens: HashSet<u64>,
    /// Grants handed to a caller, with the client.
    handed_tokens: HashMap<u64, usize>,
    shadow: Vec<Option<(u64, u64)>>,
    /// Per answered grant or renewal (connection, rid): the grant's expiry
    /// on the server in true time as of the answer, and the lease era.
    answered: BTreeMap<(u64, u64), (u64, u64)>,
    // Clients' side.
    db: Vec<DbKey>,
    windows: Windows,
    history: History,
    rec: Recorder<'t>,
}

impl<'t> World<'t> {
    /// A world for `seed`, drawing from seeded streams.
    pub fn new(seed: u64, config: SimConfig) -> Self {
        Self::with_rngs(seed, config, seeded_streams(seed, 1))
    }

    /// A world whose every decision comes from `bytes` (fuzzing).
    pub fn from_bytes(bytes: &[u8], config: SimConfig) -> Self {
        Self::with_rngs(0, config, fuzz_streams(bytes))
    }

    fn with_rngs(seed: u64, config: SimConfig, rngs: [Rng; 4]) -> Self {
        let [net, mut clocks, work, fault_rng] = rngs;
        let drift = config.drift_ppm_max;
        let server_clock = Clock::draw(&mut clocks, drift);
        let mut clients: Vec<ClientProc> = (0..config.clients)
            .map(|client| ClientProc {
                renews: client < config.renewing_clients,
                ..ClientProc::new(Clock::draw(&mut clocks, drift), Sessions::single())
            })
            .collect();
        // Drawn after the v3 clients', so worlds without line clients are
        // what they were.
        for _ in 0..config.line_clients {
            let clock = Clock::draw(&mut clocks, drift);
            let owner_base = clocks.next_u64();
            clients.push(ClientProc::line(clock, owner_base, Sessions::single()));
        }
        let keys = ALL_KEYS.len();
        World {
            now_us: 0,
            queue: Queue::new(),
            net,
            work,
            fault_rng,
            phase: Phase::Safety,
            server: None,
            server_clock,
            next_epoch: 1,
            lease_era: 0,
            clients,
            conns: BTreeMap::new(),
            next_conn: 1,
            next_op: 1,
            next_grant_id: 1,
            pending: BTreeMap::new(),
            arrival_seq: 0,
            token_seen_max: 0,
            disk_reserve: None,
            wall_back_us: 0,
            tokens_seen: HashSet::new(),
            token_groups: HashMap::new(),
            token_eras: HashMap::new(),
            answered: BTreeMap::new(),
            released_tokens: HashSet::new(),
            ghost_tokens: HashSet::new(),
            handed_tokens: HashMap::new(),
            shadow: vec![None; keys],
            db: vec![DbKey::default(); keys],
            windows: Windows::new(),
            history: History::new(),
            rec: Recorder::new(seed, config.checkers_off.clone()),
            config,
        }
    }

    /// Prints a readable line per event to `out`.
    pub fn with_trace(mut self, out: &'t mut dyn std::io::Write) -> Self {
        self.rec.set_trace(out);
        self
    }

    /// Runs to the end and checks everything.
    pub fn run(self) -> RunReport {
        driver::run(self)
    }

    // -----------------------------------------------------------------
    // Plumbing
    // -----------------------------------------------------------------

    fn schedule(&mut self, at_us: u64, ev: Ev) {
        self.queue.push(at_us, ev);
    }

    fn net_delay(&mut self) -> u64 {
        net::delay(&self.config, &mut self.net)
    }

    fn server_now(&self) -> u64 {
        self.server_clock.local(self.now_us)
    }

    /// Sends `bytes` on `conn` in `to_server` direction, split at random
    /// byte boundaries into chunks that arrive in order.
    fn send(&mut self, conn_id: u64, to_server: bool, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.tcp.reset || bytes.is_empty() {
            return;
        }
        let dir = if to_server { 0 } else { 1 };
        assert!(
            conn.tcp.in_flight[dir] + bytes.len() <= IN_FLIGHT_BYTES_MAX,
            "unbounded bytes in flight"
        );
        let conn = self.conns.get_mut(&conn_id).expect("checked above");
        let timed = conn
            .tcp
            .transmit(dir, bytes, self.now_us, &self.config, &mut self.net);
        for (arrival, bytes) in timed {
            let ev = if to_server {
                Ev::DeliverToServer {
                    conn: conn_id,
                    bytes,
                }
            } else {
                Ev::DeliverToClient {
                    conn: conn_id,
                    bytes,
                }
            };
            self.schedule(arrival, ev);
        }
    }

    /// Kills `conn`'s transport: in-flight bytes are lost, both ends learn
    /// of it after a network delay.
    fn reset_conn(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if conn.tcp.reset {
            return;
        }
        let open = [conn.client_open, conn.server_open];
        let [client_sees, server_sees] =
            conn.tcp
                .reset(open, self.now_us, &self.config, &mut self.net);
        if let Some(at) = client_sees {
            self.schedule(at, Ev::ClientSeesClose { conn: conn_id });
        }
        if let Some(at) = server_sees {
            self.schedule(at, Ev::ServerSeesClose { conn: conn_id });
        }
        self.drop_conn_if_done(conn_id);
    }

    fn drop_conn_if_done(&mut self, conn_id: u64) {
        if let Some(conn) = self.conns.get(&conn_id)
            && conn.tcp.reset
            && !conn.client_open
            && !conn.server_open
        {
            self.conns.remove(&conn_id);
        }
    }

    // -----------------------------------------------------------------
    // Server side
    // -----------------------------------------------------------------

    fn server_start(&mut self) {
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
    fn drain_server_outputs(&mut self) {
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

    fn reserve_written(&mut self, epoch: u64, value: u64) {
        let now = self.server_now();
        let Some(proc) = self.server.as_mut().filter(|proc| proc.epoch == epoch) else {
            // The server crashed first: the write never landed.
            return;
        };
        self.disk_reserve = Some(self.disk_reserve.map_or(value, |d| d.max(value)));
        proc.server.handle_reserve_persisted(instant(now), value);
        self.server_step(Vec::new());
    }

    fn connect_arrive(&mut self, conn_id: u64) {
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

    fn server_conn(&self, conn_id: u64) -> Option<ConnId> {
        let conn = self.conns.get(&conn_id)?;
        let proc = self.server.as_ref()?;
        (conn.server_open && conn.epoch == proc.epoch)
            .then_some(conn.server_id)
            .flatten()
    }

    fn deliver_to_server(&mut self, conn_id: u64, bytes: Vec<u8>) {
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
            let (rid, req) = match &request {
                Request::Acquire(acquire) => (
                    acquire.rid,
                    ServerReq {
                        acquire: true,
                        other: Other::Lock,
                        keys: acquire
                            .keys
                            .keys()
                            .iter()
                            .map(|k| key_index(k.as_bytes()))
                            .collect(),
                        wait_s: acquire.wait_s,
                        token: 0,
                        arrival_local_us: local,
                        seq: self.arrival_seq,
                    },
                ),
                Request::Release(release) => (
                    release.rid,
                    ServerReq {
                        acquire: false,
                        other: Other::Lock,
                        keys: release
                            .keys
                            .keys()
                            .iter()
                            .map(|k| key_index(k.as_bytes()))
                            .collect(),
                        wait_s: 0,
                        token: release.token,
                        arrival_local_us: local,
                        seq: self.arrival_seq,
                    },
                ),
                Request::Negotiate(negotiate) => (
                    negotiate.rid,
                    ServerReq {
                        acquire: false,
                        other: Other::Negotiate,
                        keys: Vec::new(),
                        wait_s: 0,
                        token: 0,
                        arrival_local_us: local,
                        seq: self.arrival_seq,
                    },
                ),
                Request::Extend(extend) => {
                    let keys: Vec<usize> = extend
                        .keys
                        .keys()
                        .iter()
                        .map(|k| key_index(k.as_bytes()))
                        .collect();
                    // Requests ahead of it in this chunk come from the same
                    // client and cannot make an old token current again.
                    let current = keys.iter().all(|&key| {
                        self.holder(key).is_some_and(|(token, deadline)| {
                            token == extend.token && deadline > local
                        })
                    });
                    (
                        extend.rid,
                        ServerReq {
                            acquire: false,
                            other: Other::Extend { current },
                            keys,
                            wait_s: 0,
                            token: extend.token,
                            arrival_local_us: local,
                            seq: self.arrival_seq,
                        },
                    )
                }
                Request::AcquireCapped(_) | Request::AcquirePermits(_) | Request::Observe(_) => {
                    self.violation(
                        Checker::Client,
                        format!(
                            "conn {conn_id} sent {request:?}: the sim asks for no hold cap, no permits and no observe"
                        ),
                    );
                    continue;
                }
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

    /// After any server input: take what the server wants to send, feed
    /// the oracle, run the server-side checkers, re-arm the timer.
    /// `fresh` are the requests this input delivered.
    fn server_step(&mut self, fresh: Vec<(u64, u64)>) {
        self.server_step_with(fresh, None);
    }

    /// [`World::server_step`], also taking `writable`'s bytes (its socket
    /// just became writable again).
    fn server_step_with(&mut self, fresh: Vec<(u64, u64)>, writable: Option<u64>) {
        self.drain_server_outputs();
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        // Oracle: read every reply when the server produces it, whether or
        // not the driver takes it now.
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
                return;
            }
            replies.extend(
                decoded
                    .into_iter()
                    .map(|(reply, end_offset)| (conn_id, reply, end_offset)),
            );
        }
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
        let Some(proc) = self.server.as_mut() else {
            return;
        };
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
        self.check_server_state();
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

    fn server_flush(&mut self, conn_id: u64, take: u64, bytes: Vec<u8>, done: bool) {
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

    fn server_sees_close(&mut self, conn_id: u64) {
        self.server_closes(conn_id);
        self.drop_conn_if_done(conn_id);
    }

    fn server_closes(&mut self, conn_id: u64) {
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

    /// Deadline checker's record: when grant `token` of `keys`, just
    /// granted or renewed in the answer to `rid` on `conn`, expires on the
    /// server (its earliest key), in true time.
    fn remember_expiry(&mut self, conn_id: u64, rid: u64, token: u64, keys: &[usize]) {
        let expiry_local_us = keys
            .iter()
            .filter_map(|&key| self.holder(key))
            .filter(|&(held, _)| held == token)
            .map(|(_, deadline)| deadline)
            .min();
        let Some(expiry_local_us) = expiry_local_us else {
            return;
        };
        if self.answered.len() >= ANSWERED_MAX {
            self.answered.pop_first();
        }
        let expiry_us = self.server_clock.true_at(expiry_local_us);
        self.answered
            .insert((conn_id, rid), (expiry_us, self.lease_era));
    }

    fn holder(&self, key: usize) -> Option<(u64, u64)> {
        let proc = self.server.as_ref()?;
        proc.server
            .lock_table()
            .holder(ALL_KEYS[key].as_bytes())
            .map(|(token, deadline)| (token, deadline.as_micros()))
    }

    /// Replies checker, token checker and FIFO checker, fed with every reply
    /// the server produced in one step.
    fn check_replies(&mut self, replies: Vec<(u64, Reply, u64)>, fresh: Vec<(u64, u64)>) {
        let mut grants = Vec::new();
        for (conn_id, reply, end_offset) in replies {
            let Some(rid) = reply.rid() else {
                // Pushes go to connections that negotiated them (the
                // session drops any other as a protocol error).
                if !matches!(reply, Reply::Push { .. }) {
                    self.violation(Checker::Replies, format!("single server sent {reply:?}"));
                }
                continue;
            };
            let Some(req) = self.pending.get(&(conn_id, rid)) else {
                self.violation(
                    Checker::Replies,
                    format!("reply {reply:?} on conn {conn_id} answers no request in flight"),
                );
                continue;
            };
            match reply {
                Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } if req.acquire => {
                    grants.push((token, conn_id, rid, end_offset));
                }
                Reply::TimedOut { .. } | Reply::Busy { .. } if req.acquire => {
                    self.pending.remove(&(conn_id, rid));
                }
                Reply::Released { .. } | Reply::ReleasedSet { .. }
                    if !req.acquire && req.other == Other::Lock =>
                {
                    self.released_tokens.insert(req.token);
                    self.pending.remove(&(conn_id, rid));
                }
                Reply::Negotiated { .. } if req.other == Other::Negotiate => {
                    self.pending.remove(&(conn_id, rid));
                }
                Reply::Extended { status, .. } if matches!(req.other, Other::Extend { .. }) => {
                    let req = self.pending.remove(&(conn_id, rid)).expect("found above");
                    if req.other == (Other::Extend { current: false }) {
                        let detail = format!(
                            "renewal of token {} on conn {conn_id} rid {rid} answered {status:?}, but it was not the current grant of {:?} when it arrived",
                            req.token,
                            req.keys.iter().map(|&k| ALL_KEYS[k]).collect::<Vec<_>>()
                        );
                        self.violation(Checker::Extensions, detail);
                    }
                    self.remember_expiry(conn_id, rid, req.token, &req.keys);
                }
                Reply::NotFound { .. } if !req.acquire && req.other != Other::Negotiate => {
                    self.pending.remove(&(conn_id, rid));
                }
                other => {
                    self.violation(
                        Checker::Replies,
                        format!("reply {other:?} does not fit request {req:?}"),
                    );
                    self.pending.remove(&(conn_id, rid));
                }
            }
        }
        grants.sort();
        for (token, conn_id, rid, end_offset) in grants {
            let req = self.pending.remove(&(conn_id, rid)).expect("found above");
            if token <= self.token_seen_max || !self.tokens_seen.insert(token) {
                self.violation(
                    Checker::Tokens,
                    format!(
                        "grant {token} to conn {conn_id} rid {rid} is not above every earlier token (max {})",
                        self.token_seen_max
                    ),
                );
            }
            self.token_seen_max = self.token_seen_max.max(token);
            // FIFO: nobody still waiting on these keys arrived earlier.
            let earlier = self.pending.iter().find(|(_, other)| {
                other.acquire
                    && other.wait_s > 0
                    && other.seq < req.seq
                    && other.keys.iter().any(|key| req.keys.contains(key))
            });
            if let Some((&(other_conn, other_rid), other)) = earlier {
                let detail = format!(
                    "grant {token} of {:?} to conn {conn_id} rid {rid} (arrival {}) while conn {other_conn} rid {other_rid} (arrival {}) still waits",
                    req.keys.iter().map(|&k| ALL_KEYS[k]).collect::<Vec<_>>(),
                    req.seq,
                    other.seq
                );
                self.violation(Checker::Fifo, detail);
            }
            self.remember_expiry(conn_id, rid, token, &req.keys);
            self.token_groups.insert(token, req.keys.clone());
            self.token_eras.insert(token, self.lease_era);
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.untaken_grants.push((token, req.keys, end_offset));
            }
        }
        // A release or an immediate acquire is answered in the same step.
        for key in fresh {
            if let Some(req) = self.pending.get(&key)
                && (!req.acquire || req.wait_s == 0)
            {
                let detail = format!("request {key:?} {req:?} got no immediate reply");
                self.violation(Checker::Replies, detail);
            }
        }
        // A queued waiter is answered by its wait's end.
        let local = self.server_now();
        let lost = self.pending.iter().find(|(_, req)| {
            req.acquire && local > req.arrival_local_us + u64::from(req.wait_s) * 1_000_000 + 1_000
        });
        if let Some((key, req)) = lost {
            let detail = format!("waiter {key:?} {req:?} outlived its wait without a reply");
            self.violation(Checker::Replies, detail);
        }
    }

    /// Server-state checker: at most one live holder per key (a key only
    /// changes hands once its client-visible holder released it, lost it as a
    /// ghost, or ran out of lease), and every key of a live set grant is held
    /// by that grant.
    fn check_server_state(&mut self) {
        let local = self.server_now();
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let holder = self.holder(key);
            let previous = self.shadow[key];
            if let (Some((old, old_deadline)), Some((new, _))) = (previous, holder)
                && old != new
            {
                let free = old_deadline <= local
                    || self.released_tokens.contains(&old)
                    || self.ghost_tokens.contains(&old)
                    || !self.tokens_seen.contains(&old);
                if !free {
                    self.violation(
                        Checker::ServerState,
                        format!(
                            "{name} passed from {old} (lease to {old_deadline}, now {local}) to {new}: two live holders"
                        ),
                    );
                }
            }
            self.shadow[key] = holder;
            if let Some((token, deadline)) = holder
                && deadline > local
                && let Some(group) = self.token_groups.get(&token)
            {
                let split = group
                    .iter()
                    .find(|&&other| self.holder(other).is_none_or(|(t, _)| t != token));
                if let Some(&other) = split {
                    self.violation(
                        Checker::ServerState,
                        format!(
                            "live set grant {token} holds {name} but not {}",
                            ALL_KEYS[other]
                        ),
                    );
                }
            }
        }
    }

    // -----------------------------------------------------------------
    // Client side
    // -----------------------------------------------------------------

    fn client_connect(&mut self, client: usize) {
        let proc = &mut self.clients[client];
        if proc.link.sessions[0].is_some() || proc.crashed {
            return;
        }
        let local = proc.clock.local(self.now_us);
        let conn_id = self.next_conn;
        self.next_conn += 1;
        let mut config = SessionConfig::single(b"");
        if proc.renews {
            config.extensions = Capabilities::EXTEND.union(Capabilities::PUSH);
        }
        let session = Session::new(instant(local), config);
        proc.link.sessions[0] = Some((session, conn_id));
        self.open_conn(client, conn_id, StreamOracle::new());
        self.client_pump(client, 0);
    }

    /// A new connection from `client` to the server, read by `oracle`.
    fn open_conn(&mut self, client: usize, conn_id: u64, oracle: StreamOracle) {
        let inc = self.clients[client].inc;
        self.conns.insert(
            conn_id,
            SimConn {
                client,
                inc,
                server_id: None,
                epoch: 0,
                tcp: Tcp::new(),
                client_open: true,
                server_open: false,
                stalled: false,
                writing: false,
                held_for_client: Vec::new(),
                close_held: false,
                oracle,
                takes: 0,
                observed: 0,
                untaken_grants: Vec::new(),
                unflushed_grants: Vec::new(),
                close_after_flush: false,
            },
        );
        self.note(|| format!("client {client} connects as conn {conn_id}"));
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ConnectArrive { conn: conn_id });
    }

    fn deliver_to_client(&mut self, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.tcp.landed(1, bytes.len());
        if !conn.client_open {
            return;
        }
        let Some(bytes) = conn.tcp.keep(1, bytes) else {
            return;
        };
        let client = conn.client;
        let proc = &self.clients[client];
        if proc.inc != conn.inc || proc.crashed {
            return;
        }
        let paused = proc.paused_until_us > self.now_us;
        let conn = self.conns.get_mut(&conn_id).expect("checked above");
        if paused || !conn.held_for_client.is_empty() {
            // The kernel holds the bytes, in order, until the process runs.
            conn.held_for_client.extend_from_slice(&bytes);
            return;
        }
        self.client_input(client, 0, conn_id, &bytes);
    }

    /// A paused client runs again: what its kernel held is read first, in
    /// order, then any reset that came after it.
    fn client_resume(&mut self, client: usize) {
        self.note(|| format!("client {client} resumes"));
        for conn_id in self.client_conns(client) {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            let bytes = std::mem::take(&mut conn.held_for_client);
            let close = std::mem::take(&mut conn.close_held);
            if !bytes.is_empty() {
                self.client_input(client, 0, conn_id, &bytes);
            }
            if close {
                self.client_sees_close(conn_id);
            }
        }
        self.client_pump(client, 0);
    }

    /// The connections `client` opened (any incarnation).
    fn client_conns(&self, client: usize) -> Vec<u64> {
        self.conns
            .iter()
            .filter(|(_, conn)| conn.client == client)
            .map(|(&id, _)| id)
            .collect()
    }

    fn client_sees_close(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (client, inc) = (conn.client, conn.inc);
        let proc = &self.clients[client];
        let current = proc.inc == inc && !proc.crashed;
        if current && proc.paused_until_us > self.now_us {
            // Noticed after the held bytes, when the process runs again.
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.close_held = true;
            }
            return;
        }
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.client_open = false;
        }
        if current {
            self.transport_closed(client, 0, conn_id);
        }
        self.drop_conn_if_done(conn_id);
    }

    fn client_restart(&mut self, client: usize) {
        let proc = &mut self.clients[client];
        proc.crashed = false;
        proc.inc += 1;
        let inc = proc.inc;
        self.note(|| format!("client {client} restarts as incarnation {inc}"));
        self.schedule_client(self.now_us, client, inc, ClientEv::Connect(0));
        self.schedule_client(self.now_us + 1, client, inc, ClientEv::StartOp);
    }

    // -----------------------------------------------------------------
    // Faults
    // -----------------------------------------------------------------

    /// An operator force-releases a key held now, with its holder's token
    /// (three times in four), none, or a stale one. The outcome is checked
    /// against the lock table; a release ends the grant for every checker
    /// (the key is free in the history model, leases ended early: a new
    /// lease era), and the old holder's later release must get `N`.
    fn fault_force_release(&mut self) {
        let local = self.server_now();
        let held: Vec<(usize, u64)> = (0..ALL_KEYS.len())
            .filter_map(|key| {
                self.holder(key)
                    .filter(|&(_, deadline)| deadline > local)
                    .map(|(token, _)| (key, token))
            })
            .collect();
        if held.is_empty() {
            return;
        }
        let (key, token) = held[self.fault_rng.index(held.len())];
        let asked = match self.fault_rng.below(4) {
            0 => None,
            1 => Some(token - 1),
            _ => Some(token),
        };
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        let id = AdminRequestId(self.rec.report.faults);
        let req = ForceRelease {
            key: Key::new(ALL_KEYS[key].as_bytes()).expect("the sim's keys are keys"),
            token: asked,
        };
        proc.server.handle_force_release(instant(local), id, req);
        proc.outputs.drain(&mut proc.server, instant(local));
        let answer = proc.outputs.admin_replies.pop_front();
        self.rec.report.faults += 1;
        let group = self
            .token_groups
            .get(&token)
            .cloned()
            .unwrap_or_else(|| vec![key]);
        let names: Vec<Key> = group
            .iter()
            .map(|&k| Key::new(ALL_KEYS[k].as_bytes()).expect("a key"))
            .collect();
        let releases = asked.is_none_or(|t| t == token);
        match answer {
            Some((
                answered,
                ForceReleaseOutcome::Released {
                    revoked,
                    keys,
                    handed_to,
                },
            )) if answered == id && releases => {
                self.note(|| {
                    format!(
                        "FAULT operator force-releases {} ({asked:?}): token {revoked} revoked, handed to {handed_to:?}",
                        ALL_KEYS[key]
                    )
                });
                if revoked != token || keys != names {
                    self.violation(
                        Checker::Replies,
                        format!(
                            "force-release of {} revoked {revoked} on {keys:?}, but {token} held {names:?}",
                            ALL_KEYS[key]
                        ),
                    );
                }
                self.rec.report.force_releases += 1;
                self.released_tokens.insert(revoked);
                // The grant ends now, before its lease: windows and fenced
                // writes are judged within a new era.
                self.lease_era += 1;
                self.history
                    .mark(self.now_us, &group, LinOp::ForceReleased { token: revoked });
            }
            Some((answered, ForceReleaseOutcome::TokenMismatch { held }))
                if answered == id && !releases =>
            {
                self.note(|| {
                    format!(
                        "FAULT operator force-releases {} with stale token {asked:?}: held by {held}",
                        ALL_KEYS[key]
                    )
                });
                self.rec.report.force_releases_refused += 1;
                if held != token {
                    self.violation(
                        Checker::Replies,
                        format!(
                            "force-release of {} with stale {asked:?} says {held} holds it, but {token} does",
                            ALL_KEYS[key]
                        ),
                    );
                }
            }
            answer => self.violation(
                Checker::Replies,
                format!(
                    "force-release of {} held by {token} with {asked:?} answered {answer:?}",
                    ALL_KEYS[key]
                ),
            ),
        }
        self.server_step(Vec::new());
    }

    fn crash_server(&mut self) {
        let epoch = self.server.as_ref().map_or(0, |proc| proc.epoch);
        self.note(|| format!("FAULT server epoch {epoch} crashes; restarts from nothing"));
        self.server = None;
        self.lease_era += 1;
        self.pending.clear();
        self.shadow.iter_mut().for_each(|slot| *slot = None);
        self.history.mark_all(self.now_us, LinOp::Restart);
        let conns: Vec<u64> = self.conns.keys().copied().collect();
        for conn_id in conns {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.server_open = false;
                conn.unflushed_grants.clear();
                conn.untaken_grants.clear();
            }
            self.reset_conn(conn_id);
        }
        let at = self.now_us + self.fault_rng.range(50_000, 2_000_000);
        self.schedule(at, Ev::ServerStart);
    }
}

impl<'t> ClientWorld<'t> for World<'t> {
    const CONN: &'static str = "conn";

    fn parts(&mut self) -> Parts<'_, 't> {
        Parts {
            now_us: self.now_us,
            config: &self.config,
            safety: self.phase == Phase::Safety,
            clients: &mut self.clients,
            next_op: &mut self.next_op,
            history: &mut self.history,
            windows: &mut self.windows,
            db: &mut self.db,
            lease_era: self.lease_era,
            work: &mut self.work,
            fault_rng: &mut self.fault_rng,
            rec: &mut self.rec,
        }
    }

    fn schedule_client(&mut self, at_us: u64, client: usize, inc: u64, ev: ClientEv) {
        self.schedule(at_us, Ev::Client(ClientCall { client, inc, ev }));
    }

    fn send_from_client(&mut self, conn: u64, bytes: Vec<u8>) {
        self.send(conn, true, bytes);
    }

    fn close_transport(&mut self, conn_id: u64) {
        // Our side drops the transport too.
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.client_open = false;
        }
        self.reset_conn(conn_id);
    }

    fn close_expected(&self, reason: &CloseReason) -> bool {
        close_expected_of_any(reason)
    }

    fn on_ready(&mut self, client: usize, _slot: u8, conn_id: u64) {
        self.note(|| format!("client {client} ready on conn {conn_id}"));
    }

    fn on_leader_notice(&mut self, client: usize) {
        self.violation(
            Checker::Client,
            format!("client {client}: a single server sent a leader notice"),
        );
    }

    fn resume(&mut self, client: usize) {
        self.client_resume(client);
    }

    fn connect(&mut self, client: usize, slot: u8) {
        if self.clients[client].line.is_some() {
            self.line_connect(client, slot);
        } else {
            self.client_connect(client);
        }
    }

    fn restart(&mut self, client: usize) {
        self.client_restart(client);
    }

    fn crash_client(&mut self, client: usize) {
        self.note(|| format!("FAULT client {client} crashes"));
        self.crash_ops(client);
        let link = &mut self.clients[client].link;
        link.clear();
        link.backoffs[0] = Backoff::new();
        for conn_id in self.client_conns(client) {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.client_open = false;
            }
            self.reset_conn(conn_id);
        }
        let at = self.now_us + self.fault_rng.range(100_000, 3_000_000);
        let inc = self.clients[client].inc;
        self.schedule_client(at, client, inc, ClientEv::Restart);
    }

    fn after_op_step(&mut self, client: usize) {
        self.client_pump(client, 0);
    }

    fn on_grant(&mut self, client: usize, token: u64, caller: bool) {
        if !caller {
            return;
        }
        self.handed_tokens.insert(token, client);
        if self.ghost_tokens.contains(&token) {
            // Its bytes were written (else the client could not have it),
            // yet the server counted it undelivered.
            self.violation(
                Checker::Replies,
                format!(
                    "client {client} holds grant {token} that the server released as never delivered"
                ),
            );
        }
    }

    fn new_holding(&mut self, token: u64) -> (u64, u64) {
        let grant_id = self.next_grant_id;
        self.next_grant_id += 1;
        // Leases are cut by what happens after the grant at the server, not
        // after the client heard of it.
        let era = self
            .token_eras
            .get(&token)
            .copied()
            .unwrap_or(self.lease_era);
        (grant_id, era)
    }

    fn release_failure(&self, error: ClientError) -> ReleaseFailure {
        match error {
            ClientError::Indeterminate => ReleaseFailure::LeaveOpen,
            ClientError::NotConnected | ClientError::ClientCapacity => ReleaseFailure::Forget,
            error => ReleaseFailure::Unexpected(format!("release failed with {error:?}")),
        }
    }

    fn slot_of(&self, _conn: u64) -> Option<u8> {
        Some(0)
    }

    fn open_line_conn(&mut self, client: usize, _slot: u8) -> Option<u64> {
        let conn_id = self.next_conn;
        self.next_conn += 1;
        self.open_conn(client, conn_id, StreamOracle::line(Vec::new()));
        Some(conn_id)
    }

    fn line_slots(&self) -> u8 {
        1
    }

    fn line_address_slot(&self, _address: &[u8]) -> Option<u8> {
        None
    }

    fn answered_expiry(&mut self, conn: u64, rid: u64) -> Option<(u64, u64)> {
        self.answered.remove(&(conn, rid))
    }
}

impl<'t> SimWorld<'t> for World<'t> {
    type Ev = Ev;

    fn marker(marker: Marker) -> Ev {
        match marker {
            Marker::FaultTick => Ev::FaultTick,
            Marker::EndSafety => Ev::EndSafety,
            Marker::End => Ev::End,
        }
    }

    fn queue(&mut self) -> &mut Queue<Ev> {
        &mut self.queue
    }

    fn set_now(&mut self, now_us: u64) {
        self.now_us = now_us;
    }

    fn phase(&self) -> Phase {
        self.phase
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
    }

    fn recorder(&mut self) -> &mut Recorder<'t> {
        &mut self.rec
    }

    fn into_recorder(self) -> Recorder<'t> {
        self.rec
    }

    fn start_servers(&mut self) {
        self.schedule(0, Ev::ServerStart);
    }

    fn start_client(&mut self, client: usize) {
        let at = self.work.below(200_000);
        self.schedule_client(at, client, 0, ClientEv::Connect(0));
        let at = at + self.work.below(300_000);
        self.schedule_client(at, client, 0, ClientEv::StartOp);
    }

    fn hash_event(&mut self, next: &Scheduled<Ev>) {
        let (bytes, extra): (&[u8], u64) = match &next.ev {
            Ev::DeliverToServer { conn, bytes }
            | Ev::DeliverToClient { conn, bytes }
            | Ev::ServerFlush { conn, bytes, .. } => {
                // The bytes themselves: tokens, rids, nonces.
                (bytes, conn ^ ((bytes.len() as u64) << 32))
            }
            Ev::Client(call) => (&[], call.hash_extra()),
            Ev::ConnectArrive { conn }
            | Ev::ServerWritable { conn }
            | Ev::ServerSeesClose { conn }
            | Ev::ClientSeesClose { conn } => (&[], *conn),
            _ => (&[], 0),
        };
        self.rec
            .event(next.at_us, next.ev.code(), bytes, extra, &TraceEv(&next.ev));
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Client(call) => self.client_event(call),
            Ev::ConnectArrive { conn } => self.connect_arrive(conn),
            Ev::DeliverToServer { conn, bytes } => self.deliver_to_server(conn, bytes),
            Ev::DeliverToClient { conn, bytes } => self.deliver_to_client(conn, bytes),
            Ev::ServerFlush {
                conn,
                take,
                bytes,
                done,
            } => self.server_flush(conn, take, bytes, done),
            Ev::ServerSeesClose { conn } => self.server_sees_close(conn),
            Ev::ServerWritable { conn } => {
                if let Some(sim_conn) = self.conns.get_mut(&conn) {
                    sim_conn.stalled = false;
                    self.server_step_with(Vec::new(), Some(conn));
                }
            }
            Ev::ClientSeesClose { conn } => self.client_sees_close(conn),
            Ev::ServerTimer { epoch, generation } => {
                let now = self.server_now();
                if let Some(proc) = self.server.as_mut()
                    && proc.epoch == epoch
                    && proc.timer_generation == generation
                {
                    proc.server.handle_timeout(instant(now));
                    proc.armed = None;
                    self.server_step(Vec::new());
                }
            }
            Ev::ServerStart => self.server_start(),
            Ev::ReserveWritten { epoch, value } => self.reserve_written(epoch, value),
            Ev::FaultTick => self.fault_tick(),
            Ev::EndSafety => self.end_safety(),
            Ev::End => self.end_run(),
        }
    }

    fn inject_fault(&mut self) {
        let faults = self.config.faults.clone();
        let mut roll = FaultRoll::new(&mut self.fault_rng);
        let mut pick = |ppm: u32| roll.pick(ppm);
        if pick(faults.reset_ppm) {
            let live: Vec<u64> = self
                .conns
                .iter()
                .filter(|(_, conn)| !conn.tcp.reset)
                .map(|(&id, _)| id)
                .collect();
            if !live.is_empty() {
                let conn = live[self.fault_rng.index(live.len())];
                self.rec.report.faults += 1;
                self.note(|| format!("FAULT reset conn {conn}"));
                self.reset_conn(conn);
            }
        } else if pick(faults.client_crash_ppm) {
            self.fault_client_crash();
        } else if pick(faults.server_restart_ppm) {
            if self.server.is_some() {
                self.rec.report.faults += 1;
                self.crash_server();
            }
        } else if pick(faults.pause_ppm) {
            if let Some((client, _)) = self.fault_pause() {
                let until = self.clients[client].paused_until_us;
                self.note(|| format!("FAULT client {client} pauses until {until}"));
            }
        } else if pick(faults.server_clock_jump_ppm) {
            self.jump_server_clock(0, |jump| {
                format!("FAULT server clock jumps {jump} µs forward")
            });
        } else if pick(faults.clock_jump_ppm) {
            self.fault_client_clock_jump();
        } else if pick(faults.force_release_ppm) {
            self.fault_force_release();
        }
    }

    fn check_end(&mut self) {
        if !self.clients_resolved(true) {
            return;
        }
        if let Some((key, req)) = self.pending.iter().next() {
            let detail = format!("server never answered {key:?} {req:?}");
            self.violation(Checker::Liveness, detail);
        }
        if let Some(proc) = self.server.as_ref()
            && proc.server.stats().lock.waiters > 0
        {
            let detail = format!(
                "{} waiters still queued at the end",
                proc.server.stats().lock.waiters
            );
            self.violation(Checker::Liveness, detail);
        }
    }

    fn trivial_op(op: &LinOp) -> bool {
        // Keys that saw nothing but server restarts are not checked.
        matches!(op, LinOp::Restart)
    }

    fn server_clock(&mut self, _which: u8) -> &mut Clock {
        &mut self.server_clock
    }

    fn lease_era(&mut self) -> &mut u64 {
        &mut self.lease_era
    }

    fn wake_server(&mut self, _which: u8) {
        let now = self.server_now();
        if let Some(proc) = self.server.as_mut() {
            proc.server.handle_timeout(instant(now));
            proc.armed = None;
        }
        self.server_step(Vec::new());
    }
}

struct TraceEv<'a>(&'a Ev);

impl std::fmt::Debug for TraceEv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ev::Client(call) => call.trace(f, false),
            Ev::DeliverToServer { conn, bytes } => {
                write!(
                    f,
                    "deliver conn {conn} → server {} bytes {:02x?}",
                    bytes.len(),
                    Short(bytes)
                )
            }
            Ev::DeliverToClient { conn, bytes } => {
                write!(
                    f,
                    "deliver conn {conn} → client {} bytes {:02x?}",
                    bytes.len(),
                    Short(bytes)
                )
            }
            Ev::ServerFlush {
                conn,
                take,
                bytes,
                done,
            } => {
                let part = if *done { "" } else { " (first part)" };
                write!(
                    f,
                    "server writes take {take} on conn {conn}: {} bytes{part}",
                    bytes.len()
                )
            }
            other => write!(f, "{other:?}"),
        }
    }
}
