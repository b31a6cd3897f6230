//! The tokio driver of a cluster node ([`ClusterNode`]): a client listener,
//! a peer listener, outbound peer dials, an optional status listener, the
//! clock and the timer. It shares its connection tasks, timer and
//! supervisor with the single-mode driver ([`crate::serve`]); every
//! decision (Raft, who serves, when to dial, backoff, membership) is the
//! core's.
//!
//! # Identity: generations and bootstrap
//!
//! Which generation a start takes (`--bootstrap`, a join, `--recover`) is
//! the core's start rule ([`ClusterNode::start`], described in
//! `ticketing_core::cluster::StartFacts`); this driver only gathers its
//! facts: the operator's flags, the wall clock and the slot's state file.
//! The `--bootstrap` flag exists on the command line only (not in the
//! config file), so a supervisor restarting the process with the same
//! config file never bootstraps again. For `--recover` the driver reads
//! this slot's state file without writing it and probes every other
//! slot's peer address for the hello a node sends on accepting a
//! connection; the core decides from those facts
//! ([`recovery::decide_recovery`]) whether to refuse (old nodes still run,
//! or no floor for this slot) or with what token floor to start.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tracing::{debug, error, info, warn};

use ticketing_core::admin::AdminTokens;
use ticketing_core::cluster::node::{
    ClusterConfig, ClusterNode, ClusterStats, StartFacts, StartMode,
};
use ticketing_core::cluster::peer::PEER_HELLO_LEN;
use ticketing_core::cluster::recovery::{
    self, PeerProbe, RecoveryFacts, RecoveryPlan, RecoveryRefusal,
};
use ticketing_core::raft::NodeId;
use ticketing_core::time::Instant;

use crate::admin;
use crate::serve::{
    Clock, DEFAULT_LISTEN_BACKLOG, DEFAULT_SHUTDOWN_GRACE, Dialer, Listener, Shared, bind_admin,
    bind_listener, open_floor, read_floor, run_persister, start, start_floor,
};
use crate::state::{self, FloorFile, StateSettings};
use ticketing_core::machine::Machine;

pub use ticketing_core::cluster::BOOTSTRAP_GENERATION;

/// TLS between peers: each node serves `server` on its peer address and
/// verifies the peers it dials with `client` under `server_name`.
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// Presented to dialing peers.
    pub server: Arc<rustls::ServerConfig>,
    /// Verifies dialed peers.
    pub client: Arc<rustls::ClientConfig>,
    /// The name every peer certificate carries.
    pub server_name: ServerName<'static>,
}

/// A recovery after a majority of the cluster lost its state (see the
/// module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoverySettings {
    /// A token the operator vouches is at or above every token of the
    /// domain (`--token-floor`), for a slot whose state file is lost.
    pub explicit_floor: Option<u64>,
}

/// How long a recovery's probe waits for a peer to accept and to send its
/// hello.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A recovery the core refused: the process exits with code 2 and this
/// line.
#[derive(Debug)]
pub struct RecoveryRefused(pub RecoveryRefusal);

impl std::fmt::Display for RecoveryRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "recovery refused: {}", self.0)
    }
}

impl std::error::Error for RecoveryRefused {}

impl RecoveryRefused {
    /// The refusal inside `error`, if it is one.
    pub fn find(error: &io::Error) -> Option<&RecoveryRefused> {
        error.get_ref()?.downcast_ref::<RecoveryRefused>()
    }
}

/// Everything [`spawn_cluster`] needs.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// Client address to bind (this slot's `client` address).
    pub client_listen: SocketAddr,
    /// Peer address to bind (this slot's `peer` address).
    pub peer_listen: SocketAddr,
    /// Every slot's peer address, in slot order (this slot's included).
    pub peer_addrs: Vec<SocketAddr>,
    /// The core's configuration. `node.id.generation` is replaced at start
    /// (see the module documentation); `node.bootstrap_wall_clock_us` too.
    pub node: ClusterConfig,
    /// Start a brand-new cluster (first start only).
    pub bootstrap: bool,
    /// Recover a cluster that lost a majority, under the same identity
    /// (command line only).
    pub recovery: Option<RecoverySettings>,
    /// TLS towards clients, if enabled.
    pub client_tls: Option<Arc<rustls::ServerConfig>>,
    /// TLS between peers, if enabled.
    pub peer_tls: Option<PeerTls>,
    /// Where to serve a one-line plain-text status (for operators and
    /// tests), if anywhere.
    pub status_listen: Option<SocketAddr>,
    /// How long shutdown waits for clients to be answered and leadership to
    /// be handed over.
    pub shutdown_grace: Duration,
    /// The state directory that keeps this slot's token floor
    /// ([`crate::state`]); `None`: no file (tests). The `ticketing` binary
    /// always sets one.
    pub state: Option<StateSettings>,
    /// Where to serve the admin HTTP endpoints ([`crate::admin`]), if
    /// anywhere.
    pub admin_listen: Option<SocketAddr>,
    /// Tokens accepted by the admin lock API (see
    /// [`ticketing_core::admin`]); empty: inspection on a loopback admin
    /// listener only, and no force-release.
    pub admin_tokens: AdminTokens,
    /// `Host` names the admin listener serves besides its own address and
    /// this slot's configured admin address (`slots[].admin`, which the
    /// other nodes send operators to).
    pub admin_allowed_hosts: Vec<Box<str>>,
    /// The admin listener's connection and time limits.
    pub admin_limits: admin::AdminLimits,
    /// Pending connections the client and peer listeners each queue
    /// before the kernel drops new ones
    /// ([`DEFAULT_LISTEN_BACKLOG`]).
    pub listen_backlog: u32,
}

impl ClusterSettings {
    /// Settings with the core's defaults, no TLS and no status listener.
    pub fn new(
        client_listen: SocketAddr,
        peer_listen: SocketAddr,
        peer_addrs: Vec<SocketAddr>,
        node: ClusterConfig,
    ) -> Self {
        ClusterSettings {
            client_listen,
            peer_listen,
            peer_addrs,
            node,
            bootstrap: false,
            recovery: None,
            client_tls: None,
            peer_tls: None,
            status_listen: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            state: None,
            admin_listen: None,
            admin_tokens: AdminTokens::default(),
            admin_allowed_hosts: Vec::new(),
            admin_limits: admin::AdminLimits::default(),
            listen_backlog: DEFAULT_LISTEN_BACKLOG,
        }
    }
}

/// A snapshot of a node's view, as served on the status address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    /// This node.
    pub id: NodeId,
    /// Whether it leads.
    pub is_leader: bool,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Whether it is a voter of its current configuration.
    pub is_voter: bool,
    /// A bootstrap member still checking that the cluster is new: it may
    /// yet join as a new generation, so it does not count as a voter yet.
    pub checking_genesis: bool,
    /// Its current term.
    pub term: u64,
    /// Voters of its current configuration.
    pub voters: Vec<NodeId>,
    /// Learners of its current configuration.
    pub learners: Vec<NodeId>,
    /// Its commit index.
    pub commit_index: u64,
    /// The core's counts.
    pub stats: ClusterStats,
    /// Peer slots whose link the core counts as live (a frame arrived
    /// within a few heartbeat intervals); `stats.peers_established` also
    /// counts connections that went silent.
    pub live_peers: usize,
}

impl ClusterStatus {
    /// `node`'s view at `now`.
    pub(crate) fn of(node: &ClusterNode, now: Instant) -> Self {
        let raft = node.raft();
        ClusterStatus {
            id: node.id(),
            is_leader: node.is_leader(),
            leader: node.leader(),
            is_voter: raft.is_voter(),
            checking_genesis: node.checking_genesis(),
            term: raft.term(),
            voters: raft.config().voters.iter().copied().collect(),
            learners: raft.config().learners.iter().copied().collect(),
            commit_index: raft.commit_index(),
            stats: node.stats(),
            live_peers: node.live_peers(now),
        }
    }

    /// One line: `slot=0 generation=1 role=leader leader=0 voter=1
    /// checking=0 term=3 commit=12 voters=0:1,1:1,2:1 learners= clients=2
    /// peers=2 live=2 held=0 waiters=0 pending=0`.
    pub fn line(&self) -> String {
        let list = |ids: &[NodeId]| {
            ids.iter()
                .map(|id| format!("{}:{}", id.slot, id.generation))
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "slot={} generation={} role={} leader={} voter={} checking={} term={} commit={} voters={} learners={} clients={} peers={} live={} held={} waiters={} pending={}",
            self.id.slot,
            self.id.generation,
            if self.is_leader { "leader" } else { "follower" },
            self.leader
                .map_or_else(|| "none".to_owned(), |l| l.slot.to_string()),
            u8::from(self.is_voter),
            u8::from(self.checking_genesis),
            self.term,
            self.commit_index,
            list(&self.voters),
            list(&self.learners),
            self.stats.clients,
            self.stats.peers_established,
            self.live_peers,
            self.stats.held_keys,
            self.stats.waiters,
            self.stats.pending,
        )
    }
}

/// A cluster node running on the current tokio runtime. Dropping it starts
/// the same shutdown as [`RunningCluster::shutdown`] without waiting for it.
#[derive(Debug)]
pub struct RunningCluster {
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    status_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared<ClusterNode>>,
    supervisor: Option<JoinHandle<()>>,
}

impl RunningCluster {
    /// The client address actually bound.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The peer address actually bound.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// The status address actually bound, if configured.
    pub fn status_addr(&self) -> Option<SocketAddr> {
        self.status_addr
    }

    /// The admin address actually bound, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The node's current view.
    pub fn status(&self) -> ClusterStatus {
        let inner = self.shared.lock();
        ClusterStatus::of(&inner.core, self.shared.clock.now())
    }

    /// Stops accepting clients, answers what is queued (`E 3`), hands
    /// leadership over if this node leads, and returns once clients are
    /// closed and leadership is gone, or after the shutdown grace.
    pub async fn shutdown(mut self) {
        self.shared.stop.notify_one();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(e) = supervisor.await
        {
            error!("cluster supervisor task failed: {e}");
        }
    }
}

impl Drop for RunningCluster {
    fn drop(&mut self) {
        self.shared.stop.notify_one();
    }
}

fn wall_clock_micros() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

/// Binds the client, peer and status addresses and starts the node on the
/// current tokio runtime.
pub async fn spawn_cluster(mut settings: ClusterSettings) -> io::Result<RunningCluster> {
    check_peer_addrs(&settings)?;
    let clock = Clock::start();
    let name = state::cluster_file_name(&settings.node.fingerprint, settings.node.id.slot);
    let (floor, plan) = match (&settings.recovery, &settings.state) {
        (Some(recovery), state) => {
            let read = match state {
                Some(state) => Some(read_floor(state, &name).await?),
                None => None,
            };
            let stored = read.as_ref().and_then(|(_, stored)| *stored);
            let plan = plan_recovery(&settings, recovery, stored).await?;
            let floor = match (state, read) {
                (Some(state), Some((file, stored))) => {
                    Some(start_floor(state, file, stored, plan.token_floor, &clock).await?)
                }
                _ => None,
            };
            (floor, Some(plan))
        }
        (None, Some(state)) => (Some(open_floor(state, &name, &clock).await?), None),
        (None, None) => (None, None),
    };
    let facts = StartFacts {
        mode: match (&plan, settings.bootstrap) {
            (Some(plan), _) => StartMode::Recover {
                token_floor: plan.token_floor,
            },
            (None, true) => StartMode::Bootstrap,
            (None, false) => StartMode::Join,
        },
        wall_clock_us: wall_clock_micros(),
        floor_first_token: floor.as_ref().map(|floor| floor.first_token),
    };
    let seed = os_seed()?;
    let node = ClusterNode::start(settings.node.clone(), &facts, seed, clock.now())
        .map_err(|e| invalid_input(format!("cluster configuration: {e}")))?;
    let sockets = ClusterSockets::bind(&settings).await?;
    settings.node.id = node.id();
    let (node, persister) = match floor {
        Some(floor) => (node.with_token_reserve(floor.reserve), Some(floor.file)),
        None => (node, None),
    };
    log_listening(&settings, &sockets);
    let shared = Shared::new(node, clock);
    let extra = spawn_side_tasks(&shared, &settings, persister, sockets.status, sockets.admin)?;
    let listeners = vec![
        Listener {
            tcp: sockets.client,
            tls: settings.client_tls.clone(),
            open: <ClusterNode as Machine>::handle_connect,
            what: "client",
            link_timeout: None,
        },
        Listener {
            tcp: sockets.peer,
            tls: settings.peer_tls.as_ref().map(|t| Arc::clone(&t.server)),
            open: <ClusterNode as Machine>::handle_peer_accept,
            what: "peer",
            link_timeout: Some(settings.node.peer_silence_timeout),
        },
    ];
    let supervisor = start(
        &shared,
        listeners,
        extra,
        Some(dialer(&settings)),
        settings.shutdown_grace,
    );
    // No kick needed for the first dials: their attempts are due at once,
    // so the timer's first wake-up drains them.
    Ok(RunningCluster {
        client_addr: sockets.client_addr,
        peer_addr: sockets.peer_addr,
        status_addr: sockets.status_addr,
        admin_addr: sockets.admin_addr,
        shared,
        supervisor: Some(supervisor),
    })
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// One peer address per slot.
fn check_peer_addrs(settings: &ClusterSettings) -> io::Result<()> {
    let slot_count = settings.node.slot_count;
    if settings.peer_addrs.len() != usize::from(slot_count) {
        return Err(invalid_input(format!(
            "{} peer addresses for {slot_count} slots",
            settings.peer_addrs.len()
        )));
    }
    Ok(())
}

/// Probes the other slots, then asks the core whether this node may
/// recover and with what token floor (`stored`: this slot's state file).
async fn plan_recovery(
    settings: &ClusterSettings,
    recovery: &RecoverySettings,
    stored: Option<u64>,
) -> io::Result<RecoveryPlan> {
    let self_slot = settings.node.id.slot;
    let mut probes = tokio::task::JoinSet::new();
    for (slot, addr) in settings.peer_addrs.iter().enumerate() {
        let slot = u8::try_from(slot).unwrap_or(u8::MAX);
        if slot == self_slot {
            continue;
        }
        let (addr, tls) = (*addr, settings.peer_tls.clone());
        probes.spawn(async move { (slot, probe_hello(addr, tls.as_ref()).await) });
    }
    let mut peers = Vec::new();
    while let Some(probe) = probes.join_next().await {
        let (slot, hello) = probe.map_err(io::Error::other)?;
        let found = recovery::classify_probe(&settings.node.fingerprint, slot, hello.as_ref());
        peers.push((slot, found));
    }
    peers.sort_by_key(|(slot, _)| *slot);
    let facts = RecoveryFacts {
        slot_count: settings.node.slot_count,
        self_slot,
        stored_floor: stored,
        explicit_floor: recovery.explicit_floor,
        peers,
        wall_clock: state::wall_clock(),
    };
    let plan = recovery::decide_recovery(&facts)
        .map_err(|refusal| io::Error::other(RecoveryRefused(refusal)))?;
    let probes: Vec<String> = facts
        .peers
        .iter()
        .map(|(slot, probe)| format!("{slot}:{}", probe_word(*probe)))
        .collect();
    warn!(
        slot = self_slot,
        token_floor = plan.token_floor,
        from = ?plan.source,
        stored_floor = ?stored,
        explicit_floor = ?recovery.explicit_floor,
        peers = %probes.join(","),
        "recovering the fencing domain under the same identity"
    );
    Ok(plan)
}

fn probe_word(probe: PeerProbe) -> &'static str {
    match probe {
        PeerProbe::Unreachable => "unreachable",
        PeerProbe::Running { .. } => "running",
        PeerProbe::Recovering => "recovering",
        PeerProbe::Foreign => "foreign",
    }
}

/// The hello a node sends on accepting a connection to `addr` (after TLS
/// when peers use it), or `None` if nothing answered in time. Nothing is
/// sent: the node sees a handshake that never finished.
async fn probe_hello(addr: SocketAddr, tls: Option<&PeerTls>) -> Option<[u8; PEER_HELLO_LEN]> {
    let probe = async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        match tls {
            Some(tls) => {
                let connector = TlsConnector::from(Arc::clone(&tls.client));
                let stream = connector.connect(tls.server_name.clone(), tcp).await.ok()?;
                read_hello(stream).await
            }
            None => read_hello(tcp).await,
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe).await.ok()?
}

async fn read_hello(mut stream: impl AsyncRead + Unpin) -> Option<[u8; PEER_HELLO_LEN]> {
    let mut hello = [0u8; PEER_HELLO_LEN];
    stream.read_exact(&mut hello).await.ok()?;
    Some(hello)
}

/// The node's listeners, bound, with their addresses.
struct ClusterSockets {
    client: TcpListener,
    peer: TcpListener,
    status: Option<TcpListener>,
    admin: Option<std::net::TcpListener>,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    status_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
}

impl ClusterSockets {
    async fn bind(settings: &ClusterSettings) -> io::Result<Self> {
        let client = bind_listener(settings.client_listen, settings.listen_backlog)?;
        let peer = bind_listener(settings.peer_listen, settings.listen_backlog)?;
        let status = match settings.status_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let admin = bind_admin(settings.admin_listen)?;
        Ok(ClusterSockets {
            client_addr: client.local_addr()?,
            peer_addr: peer.local_addr()?,
            status_addr: status.as_ref().map(TcpListener::local_addr).transpose()?,
            admin_addr: admin
                .as_ref()
                .map(std::net::TcpListener::local_addr)
                .transpose()?,
            client,
            peer,
            status,
            admin,
        })
    }
}

/// The seed of the node's randomised timeouts, from the OS.
fn os_seed() -> io::Result<u64> {
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| io::Error::other(format!("no OS randomness: {e}")))?;
    Ok(u64::from_le_bytes(seed))
}

fn log_listening(settings: &ClusterSettings, sockets: &ClusterSockets) {
    let auth = if settings.node.client_tokens.is_no_auth() {
        "none (empty token only)"
    } else {
        "client tokens"
    };
    info!(
        client = %sockets.client_addr,
        peer = %sockets.peer_addr,
        // The address, or "none": never Rust's `Some(…)`.
        status = %sockets
            .status_addr
            .map_or_else(|| "none".to_owned(), |addr| addr.to_string()),
        mode = "cluster",
        slot = settings.node.id.slot,
        generation = settings.node.id.generation,
        slots = settings.node.slot_count,
        start = if settings.recovery.is_some() {
            "recover"
        } else if settings.bootstrap {
            "bootstrap"
        } else {
            "join"
        },
        auth,
        client_tls = if settings.client_tls.is_some() { "on" } else { "off" },
        peer_tls = if settings.peer_tls.is_some() { "on" } else { "off" },
        "ticketing cluster node listening"
    );
}

/// Starts the persister (with a state file), the status listener and the
/// admin API (when configured).
fn spawn_side_tasks(
    shared: &Arc<Shared<ClusterNode>>,
    settings: &ClusterSettings,
    persister: Option<Arc<FloorFile>>,
    status: Option<TcpListener>,
    admin: Option<std::net::TcpListener>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut extra = Vec::new();
    if let Some(file) = persister {
        extra.push(tokio::spawn(run_persister(Arc::clone(shared), file)));
    }
    if let Some(status) = status {
        extra.push(tokio::spawn(serve_status(Arc::clone(shared), status)));
    }
    if let Some(admin) = admin {
        let node = Arc::new(crate::serve::DrivenNode {
            shared: Arc::clone(shared),
            metrics: |node: &ClusterNode| admin::NodeMetrics::Cluster(node.metrics()),
        });
        let own_admin = settings
            .node
            .admin_addresses
            .get(usize::from(settings.node.id.slot))
            .filter(|addr| !addr.is_empty())
            .cloned();
        let settings = admin::AdminSettings {
            tokens: settings.admin_tokens.clone(),
            allowed_hosts: settings
                .admin_allowed_hosts
                .iter()
                .cloned()
                .chain(own_admin)
                .collect(),
            limits: settings.admin_limits,
        };
        extra.push(admin::spawn_admin_api(admin, node, settings)?);
    }
    Ok(extra)
}

/// Where and how to dial each peer slot.
fn dialer(settings: &ClusterSettings) -> Dialer {
    Dialer {
        link_timeout: settings.node.peer_silence_timeout,
        addrs: settings.peer_addrs.clone(),
        tls: settings.peer_tls.as_ref().map(|t| {
            (
                TlsConnector::from(Arc::clone(&t.client)),
                t.server_name.clone(),
            )
        }),
    }
}

/// Writes one status line to every connection, then closes it.
async fn serve_status(shared: Arc<Shared<ClusterNode>>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((mut tcp, peer)) => {
                let mut line = {
                    let inner = shared.lock();
                    ClusterStatus::of(&inner.core, shared.clock.now()).line()
                };
                line.push('\n');
                tokio::spawn(async move {
                    if let Err(e) = tcp.write_all(line.as_bytes()).await {
                        debug!(%peer, "status write failed: {e}");
                    }
                    let _ = tcp.shutdown().await;
                });
            }
            Err(e) => {
                warn!("status accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
