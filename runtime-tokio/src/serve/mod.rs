//! The tokio driver of the single-mode [`Server`]: sockets, TLS, the clock
//! and the timer. Every decision is the core's; this module only moves bytes
//! and instants between the two.
//!
//! Shape: one state machine behind a `std::sync::Mutex`, never held across
//! an `.await`. Each connection has one task and one [`Notify`] registered
//! under its [`ConnId`]; after every input the task that fed it drains the
//! core's wakes and notifies the woken connections (its own wake is served
//! inline, without a round trip through its `Notify`). One timer task sleeps
//! until the core's next deadline; an input that makes the deadline earlier
//! notifies it.
//!
//! The same code drives the cluster node ([`crate::cluster`]): the
//! connection tasks, the timer and the supervisor are generic over the
//! core's driver contract, [`Machine`], which both the single-mode
//! [`Server`] and `ClusterNode` implement. The cluster adds a second
//! listener (peers) and outbound peer dials.
//!
//! - `conn`: the connection tasks (accepted and dialed) and their loop;
//! - `supervise`: listeners, dials and the supervisor (accept, shutdown);
//! - `shared`: the clock, the shared state, the drain of the core's
//!   outputs, the timer;
//! - `floor`: the state file and the persister of the token reserve;
//! - `log`: logging what the core reports.
//!
//! [`Notify`]: tokio::sync::Notify
//! [`ConnId`]: ticketing_core::server::ConnId

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tracing::{error, info};

use ticketing_core::admin::AdminTokens;
use ticketing_core::machine::Machine;
use ticketing_core::server::{Server, ServerConfig, ServerStats};

use crate::admin;
use crate::state::{self, FloorFile, StateSettings};

mod admin_node;
mod conn;
mod floor;
mod log;
mod shared;
mod supervise;

pub(crate) use self::admin_node::DrivenNode;
pub(crate) use self::floor::{
    first_token_from_clock, open_floor, read_floor, run_persister, start_floor,
};
pub(crate) use self::shared::{Clock, Shared};
pub(crate) use self::supervise::{Dialer, Listener, start};

/// Default for [`ServeSettings::listen_backlog`]: connections the kernel
/// queues (handshake done, not yet accepted) before it drops new ones. A
/// queue this deep rides out a connect flood and bursts of honest
/// reconnects (a full queue drops connects, which the kernel retries only
/// after 1 s); the handshake budget, per source, is what keeps a flood
/// from crowding out other addresses (docs/operations.md, "Listen
/// backlog"). Linux caps it at `net.core.somaxconn` (4,096 since kernel
/// 5.4).
pub const DEFAULT_LISTEN_BACKLOG: u32 = 1_024;

/// Pending connections the admin listener queues while its connection
/// slots are all taken: there they cost no descriptor, and no lock
/// client waits behind them.
pub(crate) const ADMIN_LISTEN_BACKLOG: u32 = 1_024;

/// Default for [`ServeSettings::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Everything [`spawn_server`] needs.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    /// Address to bind; port 0 picks a free port (see
    /// [`RunningServer::local_addr`]).
    pub listen: SocketAddr,
    /// The core's configuration.
    pub server: ServerConfig,
    /// TLS, if enabled.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// How long shutdown waits for connections to flush and close before it
    /// drops them.
    pub shutdown_grace: Duration,
    /// The state directory that keeps fencing tokens rising across
    /// restarts whatever the wall clock does ([`crate::state`]). `None`:
    /// no file, tokens start from the clock alone (tests); the `ticketing`
    /// binary always sets one.
    pub state: Option<StateSettings>,
    /// Where to serve the admin HTTP endpoints ([`crate::admin`]), if
    /// anywhere; port 0 picks a free port ([`RunningServer::admin_addr`]).
    pub admin_listen: Option<SocketAddr>,
    /// Tokens accepted by the admin lock API (see
    /// [`ticketing_core::admin`]); empty: inspection on a loopback admin
    /// listener only, and no force-release.
    pub admin_tokens: AdminTokens,
    /// `Host` names the admin listener serves besides its own address.
    pub admin_allowed_hosts: Vec<Box<str>>,
    /// The admin listener's connection and time limits.
    pub admin_limits: admin::AdminLimits,
    /// Pending connections each listener queues before the kernel drops
    /// new ones ([`DEFAULT_LISTEN_BACKLOG`]; capped by the kernel's
    /// `net.core.somaxconn`).
    pub listen_backlog: u32,
}

impl ServeSettings {
    /// Default core configuration (no auth), no TLS, on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        ServeSettings {
            listen,
            server: ServerConfig::default(),
            tls: None,
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

/// A server running on the current tokio runtime. Dropping it starts the same
/// shutdown as [`RunningServer::shutdown`] without waiting for it.
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared<Server>>,
    supervisor: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin address actually bound, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The core's current counts.
    pub fn stats(&self) -> ServerStats {
        self.shared.lock().core.stats()
    }

    /// The core's metrics, as `/metrics` shows them.
    pub fn metrics(&self) -> ticketing_core::metrics::ServerMetrics {
        self.shared.lock().core.metrics()
    }

    /// Stops accepting, lets the core answer what is queued, flushes and
    /// closes every connection (giving up after the shutdown grace), and
    /// returns when all tasks are done.
    pub async fn shutdown(mut self) {
        self.shared.stop.notify_one();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(e) = supervisor.await
        {
            error!("server supervisor task failed: {e}");
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        // notify_one keeps a permit, so the supervisor sees it even if it is
        // not waiting right now.
        self.shared.stop.notify_one();
    }
}

/// Binds `settings.listen` and starts serving on the current tokio runtime.
/// With a state directory the first token reserve is made durable before
/// the port listens (connections are refused until then); a state directory or file that cannot
/// be used is an error carrying a [`crate::StateError`]
/// ([`crate::StateError::find`]).
pub async fn spawn_server(settings: ServeSettings) -> io::Result<RunningServer> {
    // Bound now (a port-0 address names the state file), listening only
    // once the token floor is durable: until then a connection is refused
    // rather than left waiting in the backlog of a server not yet serving.
    let socket = bind_socket(settings.listen)?;
    let local_addr = socket.local_addr()?;
    let admin = bind_admin(settings.admin_listen)?;
    let admin_addr = admin
        .as_ref()
        .map(std::net::TcpListener::local_addr)
        .transpose()?;
    let clock = Clock::start();
    // Named after the configured address, or the bound one for port 0
    // (which no two live servers share).
    let name_addr = if settings.listen.port() == 0 {
        local_addr
    } else {
        settings.listen
    };
    let floor = match &settings.state {
        Some(state) => Some(open_floor(state, &state::single_file_name(name_addr), &clock).await?),
        None => None,
    };
    let listener = socket.listen(settings.listen_backlog)?;
    log_listening(&settings, local_addr);
    let (server, persister) = new_server(settings.server.clone(), floor, &clock);
    let shared = Shared::new(server, clock);
    let extra = spawn_side_tasks(&shared, persister, admin, &settings)?;
    let supervisor = start(
        &shared,
        vec![Listener {
            tcp: listener,
            tls: settings.tls.clone(),
            open: <Server as Machine>::handle_connect,
            what: "client",
            link_timeout: None,
        }],
        extra,
        None,
        settings.shutdown_grace,
    );
    Ok(RunningServer {
        local_addr,
        admin_addr,
        shared,
        supervisor: Some(supervisor),
    })
}

/// A listener on `addr` (address reuse on) whose kernel queue holds
/// `backlog` pending connections; for every listener that takes
/// connections from the network.
pub(crate) fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    bind_socket(addr)?.listen(backlog)
}

/// The admin listener, if `admin_listen` is set: bound like every other
/// listener (with [`ADMIN_LISTEN_BACKLOG`]), then handed over as a std
/// listener, since it is served on a runtime of its own.
pub(crate) fn bind_admin(
    admin_listen: Option<SocketAddr>,
) -> io::Result<Option<std::net::TcpListener>> {
    admin_listen
        .map(|addr| bind_listener(addr, ADMIN_LISTEN_BACKLOG)?.into_std())
        .transpose()
}

/// A socket bound to `listen` (address reuse on), not yet listening.
fn bind_socket(listen: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if listen.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    Ok(socket)
}

fn log_listening(settings: &ServeSettings, local_addr: SocketAddr) {
    let auth = if settings.server.client_tokens.is_no_auth() {
        "none (empty token only)"
    } else {
        "client tokens"
    };
    info!(
        listen = %local_addr,
        mode = "single",
        auth,
        tls = if settings.tls.is_some() { "on" } else { "off" },
        "ticketing server listening"
    );
}

/// The core, bounded by the token floor's reserve when there is a state
/// file (whose writer is returned with it).
fn new_server(
    config: ServerConfig,
    floor: Option<state::Floor>,
    clock: &Clock,
) -> (Server, Option<Arc<FloorFile>>) {
    let now = clock.now();
    match floor {
        Some(floor) => (
            Server::new(config, floor.first_token, now).with_token_reserve(now, floor.reserve),
            Some(floor.file),
        ),
        None => (Server::new(config, first_token_from_clock(), now), None),
    }
}

/// Starts the persister (with a state file) and the admin API (when
/// configured).
fn spawn_side_tasks(
    shared: &Arc<Shared<Server>>,
    persister: Option<Arc<FloorFile>>,
    admin: Option<std::net::TcpListener>,
    settings: &ServeSettings,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut extra = persister
        .map(|file| vec![tokio::spawn(run_persister(Arc::clone(shared), file))])
        .unwrap_or_default();
    if let Some(admin) = admin {
        let node = Arc::new(DrivenNode {
            shared: Arc::clone(shared),
            metrics: |server: &Server| admin::NodeMetrics::Single(server.metrics()),
        });
        let settings = admin::AdminSettings {
            tokens: settings.admin_tokens.clone(),
            allowed_hosts: settings.admin_allowed_hosts.clone(),
            limits: settings.admin_limits,
        };
        extra.push(admin::spawn_admin_api(admin, node, settings)?);
    }
    Ok(extra)
}
