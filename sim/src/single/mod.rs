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
    ClientCall, ClientEv, ClientProc, ClientProcess, ClientWorld, DbKey, LineCalls, Parts,
    ReleaseFailure, Sessions, V3Sessions, close_expected_of_any,
};
use crate::clock::{Clock, WALL_EPOCH_US, instant};
use crate::config::{ALL_KEYS, SimConfig};
use crate::driver::{self, Marker, SimWorld};
use crate::linear::LinOp;
use crate::net::{self, StreamOracle, Tcp};
use crate::rng::{FaultRoll, Rng, fuzz_streams, seeded_streams};
pub use crate::run::{Checker, RunReport, Violation};
use crate::run::{Phase, Queue, Recorder, Scheduled, Short};

mod checks;
mod client_side;
mod client_world;
mod driving;
mod faults;
mod plumbing;
mod server;

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
