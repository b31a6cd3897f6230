//! The tokio driver of a cluster node ([`ClusterNode`]): a client listener,
//! a peer listener, outbound peer dials, an optional status listener, the
//! clock and the timer. It shares its connection tasks, timer and
//! supervisor with the single-mode driver ([`crate::serve`]); every
//! decision (Raft, who serves, when to dial, backoff, membership) is the
//! core's.
//!
//! # Identity: generations and bootstrap
//!
//! State is volatile, so a process must never come back under an identity
//! it had before (it would have forgotten its votes and log). Every start
//! therefore picks the node's generation itself:
//!
//! - **`--bootstrap`** (first start of a brand-new cluster only): the node
//!   is `(self_slot, BOOTSTRAP_GENERATION)` and starts with
//!   [`ClusterNode::bootstrap`] and the voters `(s, BOOTSTRAP_GENERATION)`
//!   for every slot `s`, so all bootstrap members agree on the first
//!   configuration without talking first. The flag exists on the command
//!   line only (not in the config file), so a supervisor restarting the
//!   process with the same config file never bootstraps again. If the flag
//!   is passed to a restart anyway (or a member starts after the others
//!   already elected a leader), the core's genesis check sees the running
//!   cluster before the node acts as generation 1 and it joins under the
//!   wall-clock generation instead, as below.
//! - **otherwise** the node is `(self_slot, token floor at start)` (the
//!   wall-clock µs, or the slot's stored token reserve plus one if that is
//!   larger, so a clock stepped back still gives a newer generation) and
//!   starts with [`ClusterNode::join`]: the leader sees the newer generation
//!   in the peer handshake, adds it as a learner, and once it is caught up
//!   removes the slot's old generation and promotes it (Raft auto
//!   membership). No operator step, as long as a majority of the current
//!   voters is up.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tracing::{debug, error, info, warn};

use ticketing_core::auth::NONCE_LEN;
use ticketing_core::cluster::node::{ClusterConfig, ClusterNode, ClusterStats};
use ticketing_core::cluster::{ConnId, ConnState, NodeEvent};
use ticketing_core::raft::NodeId;
use ticketing_core::time::Instant;

use ticketing_core::admin::AdminTokens;
use ticketing_core::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, LockListing, LockView, NotLeader,
};
use ticketing_core::wire::Key;

use crate::admin;
use crate::serve::{
    Clock, DEFAULT_SHUTDOWN_GRACE, Dialer, Listener, Machine, Shared, first_token_from_clock,
    log_token_alert, open_floor, run_persister, start,
};
use crate::state::{self, StateSettings};

/// The generation of every member of a freshly bootstrapped cluster. Any
/// later start of a slot uses its token floor (wall-clock microseconds or
/// above), which is far larger.
pub const BOOTSTRAP_GENERATION: u64 = 1;

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
            client_tls: None,
            peer_tls: None,
            status_listen: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            state: None,
            admin_listen: None,
            admin_tokens: AdminTokens::default(),
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

/// The cluster node as the generic driver sees it.
#[derive(Debug)]
pub(crate) struct ClusterCore {
    node: ClusterNode,
}

impl ClusterCore {
    fn status(&self, now: Instant) -> ClusterStatus {
        let raft = self.node.raft();
        ClusterStatus {
            id: self.node.id(),
            is_leader: self.node.is_leader(),
            leader: self.node.leader(),
            is_voter: raft.is_voter(),
            checking_genesis: self.node.checking_genesis(),
            term: raft.term(),
            voters: raft.config().voters.iter().copied().collect(),
            learners: raft.config().learners.iter().copied().collect(),
            commit_index: raft.commit_index(),
            stats: self.node.stats(),
            live_peers: self.node.live_peers(now),
        }
    }

    fn open_client(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.node.handle_connect(now, nonce, source)
    }

    fn open_peer(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId> {
        self.node.handle_peer_accept(now, nonce, source)
    }
}

impl Machine for ClusterCore {
    fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]) {
        self.node.handle_input(now, conn, bytes);
    }
    fn poll_wake(&mut self) -> Option<ConnId> {
        self.node.poll_wake()
    }
    fn take_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState {
        self.node.take_transmit(conn, out)
    }
    fn wants_input(&self, conn: ConnId) -> bool {
        self.node.wants_input(conn)
    }
    fn handle_written(&mut self, now: Instant, conn: ConnId, written: usize) {
        self.node.handle_written(now, conn, written);
    }
    fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        self.node.handle_closed(now, conn);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.node.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.node.handle_timeout(now);
    }
    fn begin_shutdown(&mut self, now: Instant) {
        self.node.begin_shutdown(now);
    }
    fn is_shutting_down(&self) -> bool {
        self.node.is_shutting_down()
    }
    fn poll_dial(&mut self, now: Instant) -> Option<u8> {
        self.node.poll_dial(now)
    }
    fn handle_dial_failed(&mut self, now: Instant, slot: u8) {
        self.node.handle_dial_failed(now, slot);
    }
    fn handle_dialed(&mut self, now: Instant, slot: u8, nonce: [u8; NONCE_LEN]) -> ConnId {
        self.node.handle_peer_connected(now, slot, nonce)
    }
    fn quiesced(&self) -> bool {
        // Clients answered and closed, leadership handed over: the peer
        // connections left may be dropped.
        self.node.stats().clients == 0 && !self.node.is_leader()
    }
    fn poll_reserve(&mut self, now: Instant) -> Option<u64> {
        self.node.poll_reserve(now)
    }
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64) {
        self.node.handle_reserve_persisted(now, value);
    }
    fn handle_reserve_failed(&mut self, now: Instant) {
        self.node.handle_reserve_failed(now);
    }
    fn inspect_lock(&self, now: Instant, key: &Key) -> Option<LockView> {
        // A node that is not the leader is asked through `not_leader`
        // first; here it sees nothing.
        self.node.lock(now, key).ok().flatten()
    }
    fn inspect_locks(&self, now: Instant, prefix: &[u8], limit: usize) -> LockListing {
        self.node.locks(now, prefix, limit).unwrap_or(LockListing {
            locks: Vec::new(),
            truncated: false,
        })
    }
    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.node.handle_force_release(now, id, req);
    }
    fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)> {
        self.node.poll_admin_reply()
    }
    fn not_leader(&self) -> Option<NotLeader> {
        self.node.not_leader()
    }
    fn observe(&mut self) {
        while let Some(event) = self.node.poll_log() {
            crate::serve::log_event(event);
        }
        while let Some(alert) = self.node.poll_alert() {
            log_token_alert(alert);
        }
        while let Some(event) = self.node.poll_event() {
            log_node_event(self.node.id(), event);
        }
    }
}

/// Logs what the node reported about itself.
fn log_node_event(own_id: NodeId, event: NodeEvent) {
    match event {
        NodeEvent::GenerationChanged { generation } => warn!(
            generation,
            "--bootstrap found this cluster already running: joined as a new generation \
             instead (never pass --bootstrap to a restart)"
        ),
        NodeEvent::PeerFramesRefused {
            slot,
            error,
            refused,
        } => warn!(
            slot,
            refused, "refused a peer frame ({error}); closed that connection"
        ),
        NodeEvent::RaftMessagesRefused { refused } => warn!(
            refused,
            "dropped a peer message carrying an out-of-bounds term or index"
        ),
        NodeEvent::LeaderChanged {
            leader: Some(leader),
            term,
        } if leader == own_id => info!(term, "this node leads"),
        NodeEvent::LeaderChanged {
            leader: Some(leader),
            term,
        } => info!(
            leader_slot = leader.slot,
            leader_generation = leader.generation,
            term,
            "leader changed"
        ),
        NodeEvent::LeaderChanged { leader: None, term } => info!(term, "no leader known"),
        NodeEvent::VoterChanged { is_voter: true } => info!("this node is a voter"),
        NodeEvent::VoterChanged { is_voter: false } => {
            info!("this node is not a voter (learner or removed)");
        }
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
    shared: Arc<Shared<ClusterCore>>,
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
        inner.core.status(self.shared.clock.now())
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
    let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidInput, message);
    let slot_count = settings.node.slot_count;
    if settings.peer_addrs.len() != usize::from(slot_count) {
        return Err(invalid(format!(
            "{} peer addresses for {slot_count} slots",
            settings.peer_addrs.len()
        )));
    }
    let slot = settings.node.id.slot;
    let clock = Clock::start();
    let floor = match &settings.state {
        Some(state) => {
            let name = state::cluster_file_name(&settings.node.fingerprint, slot);
            Some(open_floor(state, &name, &clock).await?)
        }
        None => None,
    };
    // The token floor at start: above the clock and above every floor this
    // slot started with before. It is also the generation of a joining
    // start, so that a restart with the clock stepped back still comes back
    // newer than its last generation (the leader adds only newer ones).
    // Strictly above the bootstrap generation whatever the clock says; a
    // bootstrap member joins under it if it finds the cluster running.
    let token_floor = floor
        .as_ref()
        .map_or_else(first_token_from_clock, |floor| floor.first_token);
    let join_generation = floor
        .as_ref()
        .map_or_else(wall_clock_micros, |floor| floor.first_token)
        .max(BOOTSTRAP_GENERATION + 1);
    let generation = if settings.bootstrap {
        BOOTSTRAP_GENERATION
    } else {
        join_generation
    };
    settings.node.id = NodeId::new(slot, generation);
    // The domain's first token if this node's leadership initialises the
    // counter.
    settings.node.bootstrap_wall_clock_us = token_floor;
    settings
        .node
        .validate()
        .map_err(|e| invalid(format!("cluster configuration: {e}")))?;

    let client = TcpListener::bind(settings.client_listen).await?;
    let peer = TcpListener::bind(settings.peer_listen).await?;
    let status = match settings.status_listen {
        Some(addr) => Some(TcpListener::bind(addr).await?),
        None => None,
    };
    let client_addr = client.local_addr()?;
    let peer_addr = peer.local_addr()?;
    let status_addr = status.as_ref().map(TcpListener::local_addr).transpose()?;
    let admin = admin::bind(settings.admin_listen).await?;
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;

    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| io::Error::other(format!("no OS randomness: {e}")))?;
    let seed = u64::from_le_bytes(seed);
    let now = clock.now();
    let auth = if settings.node.client_tokens.is_no_auth() {
        "none (empty token only)"
    } else {
        "client tokens"
    };
    let node = if settings.bootstrap {
        let voters = (0..slot_count).map(|s| NodeId::new(s, BOOTSTRAP_GENERATION));
        ClusterNode::bootstrap(settings.node.clone(), voters, join_generation, seed, now)
    } else {
        ClusterNode::join(settings.node.clone(), seed, now)
    };
    let (node, persister) = match floor {
        Some(floor) => (node.with_token_reserve(floor.reserve), Some(floor.file)),
        None => (node, None),
    };
    info!(
        client = %client_addr,
        peer = %peer_addr,
        status = ?status_addr,
        mode = "cluster",
        slot,
        generation,
        slots = slot_count,
        start = if settings.bootstrap { "bootstrap" } else { "join" },
        auth,
        client_tls = if settings.client_tls.is_some() { "on" } else { "off" },
        peer_tls = if settings.peer_tls.is_some() { "on" } else { "off" },
        "ticketing cluster node listening"
    );
    let core = ClusterCore { node };
    let shared = Shared::new(core, clock);
    let mut extra = Vec::new();
    if let Some(file) = persister {
        extra.push(tokio::spawn(run_persister(Arc::clone(&shared), file)));
    }
    if let Some(status) = status {
        extra.push(tokio::spawn(serve_status(Arc::clone(&shared), status)));
    }
    if let Some(admin) = admin {
        let node = Arc::new(admin::DrivenNode {
            shared: Arc::clone(&shared),
            metrics: |core: &ClusterCore| admin::NodeMetrics::Cluster(core.node.metrics()),
        });
        let tokens = settings.admin_tokens.clone();
        extra.push(tokio::spawn(admin::serve_admin_api(admin, node, tokens)));
    }
    let listeners = vec![
        Listener {
            tcp: client,
            tls: settings.client_tls.clone(),
            open: ClusterCore::open_client,
            what: "client",
            link_timeout: None,
        },
        Listener {
            tcp: peer,
            tls: settings.peer_tls.as_ref().map(|t| Arc::clone(&t.server)),
            open: ClusterCore::open_peer,
            what: "peer",
            link_timeout: Some(settings.node.peer_silence_timeout),
        },
    ];
    let dialer = Dialer {
        link_timeout: settings.node.peer_silence_timeout,
        addrs: settings.peer_addrs.clone(),
        tls: settings.peer_tls.as_ref().map(|t| {
            (
                TlsConnector::from(Arc::clone(&t.client)),
                t.server_name.clone(),
            )
        }),
    };
    let supervisor = start(
        &shared,
        listeners,
        extra,
        Some(dialer),
        settings.shutdown_grace,
    );
    // No kick needed for the first dials: their attempts are due at once,
    // so the timer's first wake-up drains them.
    Ok(RunningCluster {
        client_addr,
        peer_addr,
        status_addr,
        admin_addr,
        shared,
        supervisor: Some(supervisor),
    })
}

/// Writes one status line to every connection, then closes it.
async fn serve_status(shared: Arc<Shared<ClusterCore>>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((mut tcp, peer)) => {
                let mut line = {
                    let inner = shared.lock();
                    inner.core.status(shared.clock.now()).line()
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
