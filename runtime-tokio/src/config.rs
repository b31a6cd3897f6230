//! Command line, TOML config file and environment → one validated
//! [`Config`].
//!
//! Precedence, highest first: command-line flags, environment
//! (`TICKETING_CLIENT_TOKENS`, `RUST_LOG`), the config file, built-in
//! defaults. Every error names the field at fault and the rule it broke.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use ticketing_core::admin::AdminTokens;
use ticketing_core::auth::{ClientTokens, MIN_TOKEN_LEN};
use ticketing_core::budget::BudgetConfig;
use ticketing_core::lock::{Limits, LockConfig};
use ticketing_core::server::ServerConfig;

use rustls::pki_types::ServerName;
use ticketing_core::cluster::node::ClusterConfig;
use ticketing_core::cluster::peer::{PeerTokenError, PeerTokens};
use ticketing_core::raft::{NodeId, RaftConfig};

use crate::cluster::{ClusterSettings, PeerTls};
use crate::serve::ServeSettings;
use crate::state::StateSettings;
use crate::tls::{self, TlsPart};

/// Listen address used when none is configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5225";
/// State directory of a server running as root (the FHS place for
/// variable state that must survive a reboot).
pub const DEFAULT_ROOT_STATE_DIR: &str = "/var/lib/ticketing";
/// Log level used when none is configured.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Largest accepted `wait_margin_ms`: the margin must stay below the 1 s
/// granularity of the protocol's `wait` field.
pub const WAIT_MARGIN_MS_MAX: u64 = 900;
/// Environment variable with comma-separated client tokens.
pub const ENV_CLIENT_TOKENS: &str = "TICKETING_CLIENT_TOKENS";
/// Environment variable with comma-separated admin tokens.
pub const ENV_ADMIN_TOKENS: &str = "TICKETING_ADMIN_TOKENS";
/// Environment variable with comma-separated peer tokens (cluster mode).
pub const ENV_PEER_TOKENS: &str = "TICKETING_PEER_TOKENS";
/// Largest accepted `worker_threads`.
pub const WORKER_THREADS_MAX: u64 = 256;
/// Accepted values of `log_level`.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// How log lines are written (`log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Inclusive upper bounds of the `[limits]` fields. They keep a typo (an
/// extra digit or three) from turning into an unbounded memory promise.
pub const MAX_KEYS_MAX: u64 = 100_000_000;
/// Upper bound of `max_waiters_per_key`.
pub const MAX_WAITERS_PER_KEY_MAX: u64 = 1_000_000;
/// Upper bound of `max_waiters_total`.
pub const MAX_WAITERS_TOTAL_MAX: u64 = 100_000_000;
/// Upper bound of `max_connections`.
pub const MAX_CONNECTIONS_MAX: u64 = 1_000_000;
/// Upper bound of `max_in_flight_per_connection`.
pub const MAX_IN_FLIGHT_PER_CONNECTION_MAX: u64 = 1_000_000;
/// Upper bound of `max_handshakes` and `max_handshakes_per_source`.
pub const MAX_HANDSHAKES_MAX: u64 = 1_000_000;
/// Upper bound of `max_peer_handshakes` and `max_peer_handshakes_per_source`.
pub const MAX_PEER_HANDSHAKES_MAX: u64 = 1_000;
/// Upper bound of `max_held_per_connection`.
pub const MAX_HELD_PER_CONNECTION_MAX: u64 = 100_000_000;
/// Upper bound of `max_release_misses_in_row`.
pub const MAX_RELEASE_MISSES_IN_ROW_MAX: u64 = 1_000_000;
/// Bounds of `handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_MIN: u64 = 100;
/// Upper bound of `handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_MAX: u64 = 60_000;

/// The `ticketing` command line.
#[derive(Debug, Parser)]
#[command(
    name = "ticketing",
    version,
    about = "Ticketing distributed lock service"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `ticketing` subcommands.
// Parsed once per process: the size difference between variants is moot.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a server (with no options: single mode on 127.0.0.1:5225, no
    /// auth); a cluster node with --cluster or a `[cluster]` table.
    Serve(ServeArgs),
    /// Run a command while holding a lock.
    #[command(after_help = LOCK_AFTER_HELP)]
    Lock(LockArgs),
    /// Load-generate against a server with the built-in client.
    Bench(BenchArgs),
    /// Print a fresh random cluster identity (64 lowercase hex digits).
    Identity,
    /// Inspect and force-release locks through a node's admin listener.
    #[command(subcommand)]
    Locks(LocksCommand),
    /// Readiness and counts of each node, from its admin listener.
    Status(AdminArgs),
}

/// Environment variable naming the admin listener for the CLI
/// (`--admin`).
pub const ENV_ADMIN: &str = "TICKETING_ADMIN";
/// Environment variable with the admin token the CLI presents.
pub const ENV_ADMIN_TOKEN: &str = "TICKETING_ADMIN_TOKEN";

/// Where and how the CLI reaches an admin listener.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The admin listener, IP:PORT (repeatable for `status`; default
    /// $TICKETING_ADMIN, else 127.0.0.1:9225).
    #[arg(long = "admin", value_name = "ADDR")]
    pub admins: Vec<String>,
    /// File holding the admin token (its first non-blank line); default
    /// $TICKETING_ADMIN_TOKEN. Needed for a release, and for inspection
    /// through a non-loopback listener.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Print the server's JSON answer as is instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `ticketing locks …`.
#[derive(Debug, Clone, Subcommand)]
pub enum LocksCommand {
    /// List held or waited-on keys, ascending.
    Ls {
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many keys (the server caps it at 1000).
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Admin listener options.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show a key's holder and every waiter in queue order.
    Show {
        /// The key.
        key: String,
        /// Admin listener options.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Force-release a key: its holder's token is fenced (its release gets
    /// N) and the front waiter is granted under a larger token.
    Release {
        /// The key (any key of a set releases the whole set).
        key: String,
        /// Release only if this token still holds the key.
        #[arg(long)]
        token: Option<u64>,
        /// Admin listener options.
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// Exit codes of `ticketing locks` and `ticketing status`.
pub mod admin_exit {
    /// The answer is "no": the key is not there (404), held by another
    /// token (409), or (`status`) a node is not ready.
    pub const NO: u8 = 1;
    /// Bad command line or arguments.
    pub const USAGE: u8 = 2;
    /// The admin listener cannot be reached, or it is unavailable (503).
    pub const UNAVAILABLE: u8 = 69;
    /// An answer that makes no sense.
    pub const SOFTWARE: u8 = 70;
    /// The outcome is unknown (504): inspect the key.
    pub const INDETERMINATE: u8 = 74;
    /// No admin token (401) or a wrong one (403).
    pub const AUTH: u8 = 77;
}

/// Exit codes of `ticketing lock`, besides the command's own status.
pub mod lock_exit {
    /// Bad command line or arguments.
    pub const USAGE: u8 = 2;
    /// No connection to the server could be made.
    pub const UNAVAILABLE: u8 = 69;
    /// Internal or protocol error.
    pub const SOFTWARE: u8 = 70;
    /// The server was busy: nothing was queued.
    pub const BUSY: u8 = 73;
    /// The acquire may or may not have taken effect; the command was not run.
    pub const INDETERMINATE: u8 = 74;
    /// The wait ended without the lock.
    pub const TIMEOUT: u8 = 75;
    /// The server rejected the client token.
    pub const AUTH: u8 = 77;
    /// The command could not be started.
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

const LOCK_AFTER_HELP: &str = "\
The command runs with TICKETING_KEY (the key) and TICKETING_TOKEN (the fencing
token: strictly increasing; reject writes carrying a token not above the last
one seen) in its environment. The lock is released when it exits. The lease is
not renewed: choose --lease above the command's worst-case run time.

Exit status: the command's own (128+N if killed by signal N), or
   2  bad usage          69  cannot connect       70  internal/protocol error
  73  server busy        74  indeterminate        75  timed out waiting
  77  auth rejected     126  command not runnable 127  command not found";

/// Options of `ticketing lock`.
#[derive(Debug, Clone, Args)]
pub struct LockArgs {
    /// The key to lock (1-128 bytes, no space, CR or LF).
    #[arg(value_name = "KEY")]
    pub key: String,
    /// Server address HOST:PORT.
    #[arg(long = "addr", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub addrs: Vec<String>,
    /// Client token (at least 16 bytes); default $TICKETING_CLIENT_TOKEN, or
    /// none for a loopback server without authentication.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Cluster identity (64 lowercase hex digits, see `ticketing identity`):
    /// cluster mode; give the 3 or 5 node addresses in slot order with --addr.
    #[arg(long = "cluster-identity", value_name = "HEX", value_parser = parse_identity)]
    pub cluster_identity: Option<[u8; 32]>,
    /// How long to wait for the lock (0 = one immediate try), at most 255s.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Lease: the server frees the key after this even if we do not, 1s..=250s.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Lease that must remain when the command starts.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub budget: Duration,
    /// Use TLS, verifying the server against this PEM CA file.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_system_roots")]
    pub tls_ca: Option<PathBuf>,
    /// Use TLS, verifying the server against the system trust store.
    #[arg(long)]
    pub tls_system_roots: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

/// Options of `ticketing bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server address HOST:PORT.
    #[arg(long = "addr", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub addrs: Vec<String>,
    /// Client token; default $TICKETING_CLIENT_TOKEN.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Cluster identity (64 lowercase hex digits, see `ticketing identity`):
    /// cluster mode; give the 3 or 5 node addresses in slot order with --addr.
    #[arg(long = "cluster-identity", value_name = "HEX", value_parser = parse_identity)]
    pub cluster_identity: Option<[u8; 32]>,
    /// Concurrent tasks, each doing acquire+release in a loop.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub clients: usize,
    /// Distinct keys the tasks contend on.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub keys: usize,
    /// Acquire+release pairs in total.
    #[arg(long, value_name = "N", default_value_t = 40_000)]
    pub ops: u64,
    /// Wait of each acquire.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Lease of each acquire.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Minimum work budget of each acquire.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub budget: Duration,
    /// Use TLS, verifying the server against this PEM CA file.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client runtime threads: 1 = a current-thread tokio runtime, more = a
    /// multi-thread runtime with this many workers.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// The server's process id, for its CPU time per operation (repeatable:
    /// a cluster's nodes are summed). Default: the processes listening on
    /// the loopback addresses given, when /proc shows them.
    #[arg(long = "server-pid", value_name = "PID")]
    pub server_pids: Vec<u32>,
}

/// Environment variable with the client token of `lock` and `bench`.
pub const ENV_CLIENT_TOKEN: &str = "TICKETING_CLIENT_TOKEN";

/// Parses `500ms`, `5s`, `2m` (a whole number and a unit), or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a number with a unit: 500ms, 5s, 2m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => value
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text:?}: too long")),
        "" if value == 0 => Ok(Duration::ZERO),
        _ => Err(format!("{text:?}: the unit must be ms, s or m")),
    }
}

/// Options of `ticketing serve`. Each overrides the config file.
#[derive(Debug, Default, Clone, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, IP:PORT.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Accepted client token, at least 16 bytes (repeatable). Visible to
    /// other local users in the process list: prefer the config file or
    /// TICKETING_CLIENT_TOKENS.
    #[arg(long = "client-token", value_name = "TOKEN")]
    pub client_tokens: Vec<String>,
    /// PEM certificate chain; enables TLS (needs --tls-key).
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (needs --tls-cert).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Allow a non-loopback listen address with no client token.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// off, error, warn, info, debug or trace (overrides RUST_LOG).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// `text` (default) or `json` (one JSON object per line).
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Serve the admin HTTP endpoints (/metrics, /livez, /readyz, and the
    /// /v1/locks API) on this address, IP:PORT (off unless set). A
    /// non-loopback address needs an admin token (or
    /// --insecure-admin-no-auth).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// File of admin tokens, one per line, each at least 16 bytes (blank
    /// lines and lines starting with # are skipped). Admin tokens are
    /// never taken on the command line.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Allow a non-loopback admin listener with no admin token: it then
    /// serves /metrics, /livez and /readyz, and refuses the lock API.
    #[arg(long)]
    pub insecure_admin_no_auth: bool,
    /// `--max-*`: the `[limits]` table's fields.
    #[command(flatten)]
    pub limits: FileLimits,
    /// How long before a waiter's deadline it is answered `T`, 0..=900.
    #[arg(long, value_name = "MS")]
    pub wait_margin_ms: Option<u64>,
    /// Threads that run connections, 1..=256 (default 1: the lock table
    /// is one serial state machine; more threads can only spread syscalls
    /// and TLS work).
    #[arg(long, value_name = "N")]
    pub worker_threads: Option<u64>,
    /// Run as a cluster node (implied by any other cluster option or a
    /// `[cluster]` table in the config file).
    #[arg(long)]
    pub cluster: bool,
    /// Cluster identity: 64 lowercase hex digits (`ticketing identity`).
    #[arg(long, value_name = "HEX")]
    pub cluster_identity: Option<String>,
    /// This node's slot, 0-based, in the `--slot` list.
    #[arg(long, value_name = "N")]
    pub self_slot: Option<u64>,
    /// One slot's addresses, `CLIENT_ADDR,PEER_ADDR[,ADVERTISED]`; give 3 or
    /// 5, in slot order (repeatable; replaces the config file's `slots`).
    /// ADVERTISED is the client address as line-dialect (0.3.0) clients
    /// spell it, if not CLIENT_ADDR as written.
    #[arg(long = "slot", value_name = "CLIENT,PEER[,ADVERTISED]")]
    pub slots: Vec<String>,
    /// One slot's admin listener address as operators reach it
    /// (`HOST:PORT`); give one per slot, in slot order, or none (repeatable;
    /// replaces the config file's `slots[].admin`). A follower's admin
    /// endpoints redirect there to the leader's.
    #[arg(long = "slot-admin", value_name = "HOST:PORT")]
    pub slot_admins: Vec<String>,
    /// Peer token, at least 16 bytes (repeatable; the first is this node's
    /// own, the others are also accepted, for rotation). Prefer the config
    /// file or TICKETING_PEER_TOKENS.
    #[arg(long = "peer-token", value_name = "TOKEN")]
    pub peer_tokens: Vec<String>,
    /// Raft timing: `default` (failover 2.3-2.5 s) or `fast` (under 0.65 s,
    /// for LANs and tests).
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// Serve a one-line status on this address (plain TCP, read-only).
    #[arg(long, value_name = "ADDR")]
    pub status_listen: Option<String>,
    /// First start of a brand-new cluster: every slot is started once with
    /// this flag. Never pass it when restarting a node: a restarted node
    /// joins by itself.
    #[arg(long)]
    pub bootstrap: bool,
    /// Folder of the token-floor state file, created if missing (default:
    /// $STATE_DIRECTORY, else /var/lib/ticketing as root, else
    /// $XDG_STATE_HOME/ticketing or ~/.local/state/ticketing).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// The config file, as written. Every field is optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See [`ServeArgs::listen`].
    pub listen: Option<String>,
    /// See [`ServeArgs::client_tokens`].
    pub client_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::insecure_no_auth`].
    pub insecure_no_auth: Option<bool>,
    /// See [`ServeArgs::log_level`].
    pub log_level: Option<String>,
    /// See [`ServeArgs::log_format`].
    pub log_format: Option<String>,
    /// See [`ServeArgs::admin_listen`].
    pub admin_listen: Option<String>,
    /// Accepted admin tokens, each at least 16 bytes.
    pub admin_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::admin_token_file`]; relative to the config file.
    pub admin_token_file: Option<PathBuf>,
    /// See [`ServeArgs::insecure_admin_no_auth`].
    pub insecure_admin_no_auth: Option<bool>,
    /// See [`ServeArgs::wait_margin_ms`].
    pub wait_margin_ms: Option<u64>,
    /// See [`ServeArgs::worker_threads`].
    pub worker_threads: Option<u64>,
    /// See [`ServeArgs::state_dir`]; relative to the config file.
    pub state_dir: Option<PathBuf>,
    /// `[tls]` table.
    pub tls: Option<FileTls>,
    /// `[limits]` table.
    pub limits: Option<FileLimits>,
    /// `[cluster]` table: run as a cluster node.
    pub cluster: Option<FileCluster>,
}

/// The `[cluster]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCluster {
    /// See [`ServeArgs::cluster_identity`].
    pub identity: Option<String>,
    /// See [`ServeArgs::self_slot`].
    pub self_slot: Option<u64>,
    /// `[[cluster.slots]]`: 3 or 5, in slot order.
    pub slots: Option<Vec<FileSlot>>,
    /// See [`ServeArgs::peer_tokens`].
    pub peer_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::profile`].
    pub profile: Option<String>,
    /// See [`ServeArgs::status_listen`].
    pub status_listen: Option<String>,
    /// `[cluster.peer_tls]` table.
    pub peer_tls: Option<FilePeerTls>,
}

/// One `[[cluster.slots]]` entry.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSlot {
    /// Where clients connect, IP:PORT.
    pub client: Option<String>,
    /// Where peers connect, IP:PORT.
    pub peer: Option<String>,
    /// The client address as line-dialect (0.3.0) clients spell it, when it
    /// is not `client` as written (they compare leader addresses as exact
    /// strings with their own list).
    pub advertise: Option<String>,
    /// The slot's admin listener as operators reach it, `HOST:PORT` (every
    /// slot or none): a follower's admin endpoints redirect there.
    pub admin: Option<String>,
}

/// The `[cluster.peer_tls]` table: TLS between peers. Relative paths are
/// relative to the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePeerTls {
    /// PEM certificate chain presented on the peer address.
    pub cert: Option<PathBuf>,
    /// Its PEM private key.
    pub key: Option<PathBuf>,
    /// PEM CA certificates that dialed peers are verified against.
    pub ca: Option<PathBuf>,
    /// The DNS name every peer certificate carries.
    pub server_name: Option<String>,
}

/// The `[tls]` table. Relative paths are relative to the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    /// PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
}

/// The `[limits]` table, and the `--max-*` flags of the same names
/// ([`ServeArgs::limits`]). Each is checked against 1 and its `*_MAX`.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    /// Keys in the lock table at most.
    #[arg(long, value_name = "N")]
    pub max_keys: Option<u64>,
    /// Waiters queued on one key at most.
    #[arg(long, value_name = "N")]
    pub max_waiters_per_key: Option<u64>,
    /// Waiters queued in total at most.
    #[arg(long, value_name = "N")]
    pub max_waiters_total: Option<u64>,
    /// Client connections past their handshake at most (unfinished
    /// handshakes have their own budget, --max-handshakes).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u64>,
    /// Acquires waiting for a held key on one connection at most (cluster
    /// mode: requests awaiting their reply); one over it is answered B.
    #[arg(long, value_name = "N")]
    pub max_in_flight_per_connection: Option<u64>,
    /// Unfinished client handshakes at most; a new connection over it
    /// drops the oldest unfinished one (default: max_connections / 8, at
    /// least 32).
    #[arg(long, value_name = "N")]
    pub max_handshakes: Option<u64>,
    /// Unfinished client handshakes from one source address at most; a new
    /// one over it drops that source's oldest (default: max_handshakes / 2).
    #[arg(long, value_name = "N")]
    pub max_handshakes_per_source: Option<u64>,
    /// Unfinished accepted peer handshakes at most (cluster; default 8).
    #[arg(long, value_name = "N")]
    pub max_peer_handshakes: Option<u64>,
    /// Unfinished accepted peer handshakes from one source at most
    /// (cluster; default 4).
    #[arg(long, value_name = "N")]
    pub max_peer_handshakes_per_source: Option<u64>,
    /// Keys held at once by the grants delivered to one connection (a set
    /// counts its keys); an acquire over it is answered B (default 16384).
    #[arg(long, value_name = "N")]
    pub max_held_per_connection: Option<u64>,
    /// A connection whose releases get this many N replies in a row is
    /// closed and logged (a blind token sweep); 0 turns it off (default 64).
    #[arg(long, value_name = "N")]
    pub max_release_misses_in_row: Option<u64>,
    /// An unfinished handshake (client or peer) is closed after this many
    /// milliseconds, 100..=60000 (default 3000).
    #[arg(long, value_name = "MS")]
    pub handshake_timeout_ms: Option<u64>,
}

/// The environment variables the config reads, gathered once so that the
/// rest is a pure function (and testable).
#[derive(Debug, Default, Clone)]
pub struct Env {
    /// `TICKETING_CLIENT_TOKENS`.
    pub client_tokens: Option<String>,
    /// `TICKETING_ADMIN_TOKENS`.
    pub admin_tokens: Option<String>,
    /// `RUST_LOG`.
    pub rust_log: Option<String>,
    /// `TICKETING_PEER_TOKENS`.
    pub peer_tokens: Option<String>,
    /// `STATE_DIRECTORY` (set by systemd's `StateDirectory=`).
    pub state_directory: Option<String>,
    /// `XDG_STATE_HOME`.
    pub xdg_state_home: Option<String>,
    /// `HOME`.
    pub home: Option<String>,
    /// Whether the process runs as root (effective uid 0).
    pub is_root: bool,
}

impl Env {
    /// Reads the variables from this process's environment.
    pub fn from_process() -> Self {
        Env {
            client_tokens: std::env::var(ENV_CLIENT_TOKENS).ok(),
            admin_tokens: std::env::var(ENV_ADMIN_TOKENS).ok(),
            rust_log: std::env::var("RUST_LOG").ok(),
            peer_tokens: std::env::var(ENV_PEER_TOKENS).ok(),
            state_directory: std::env::var("STATE_DIRECTORY").ok(),
            xdg_state_home: std::env::var("XDG_STATE_HOME").ok(),
            home: std::env::var("HOME").ok(),
            is_root: running_as_root(),
        }
    }
}

/// Whether the effective user is root: the owner of `/proc/self` (Linux)
/// is the process's effective uid. Elsewhere: assumed not.
fn running_as_root() -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }
    #[cfg(not(unix))]
    false
}

/// How clients authenticate, for the startup log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Client tokens are configured; this many.
    Tokens(usize),
    /// No token: only the empty token is accepted.
    None,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// What the server runs with.
    pub settings: ServeSettings,
    /// `tracing_subscriber::EnvFilter` directives.
    pub log_filter: String,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Threads of the runtime; 1 runs everything on the main thread.
    pub worker_threads: usize,
    /// How clients authenticate.
    pub auth: AuthMode,
    /// Cluster mode: what the node runs with (`settings` then only carries
    /// the client listen address and the shared options, already copied
    /// into this).
    pub cluster: Option<ClusterSettings>,
}

/// A configuration that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field at fault, as named in the config file (`limits.max_keys`,
    /// `client_tokens[1]`), or `--config` for the file itself.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Reads the config file named by `args` (if any) and validates everything.
pub fn load(args: &ServeArgs, env: &Env) -> Result<Config, ConfigError> {
    let (file, file_dir) = match &args.config {
        None => (FileConfig::default(), None),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new("--config", format!("cannot read {}: {e}", path.display()))
            })?;
            let file = parse_file(&text).map_err(|e| ConfigError {
                field: e.field,
                message: format!("{} (in {})", e.message, path.display()),
            })?;
            (file, path.parent().map(Path::to_owned))
        }
    };
    resolve(&file, file_dir.as_deref(), args, env)
}

/// Parses config file text. Unknown fields are errors.
pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        // toml's own Display spans several lines (with a source snippet); keep
        // the message on one line and point at the line instead.
        let location = match e.span() {
            Some(span) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!(" at line {line}")
            }
            None => String::new(),
        };
        ConfigError::new(
            "--config",
            format!("invalid TOML{location}: {}", e.message().trim()),
        )
    })
}

/// Merges file, environment and flags and validates the result. `file_dir`
/// is the config file's folder, against which its relative TLS paths are
/// resolved.
pub fn resolve(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
) -> Result<Config, ConfigError> {
    let listen_text = args
        .listen
        .as_deref()
        .or(file.listen.as_deref())
        .unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        ConfigError::new(
            "listen",
            format!("expected IP:PORT such as {DEFAULT_LISTEN} or [::1]:5225, got {listen_text:?}"),
        )
    })?;

    let tokens = pick_tokens(
        &args.client_tokens,
        "--client-token",
        env.client_tokens.as_deref(),
        ENV_CLIENT_TOKENS,
        file.client_tokens.as_deref(),
    );
    let client_tokens = if tokens.values.is_empty() {
        ClientTokens::no_auth()
    } else {
        ClientTokens::new(&tokens.values).map_err(|e| tokens.too_short("client_tokens", e.index))?
    };
    let insecure_no_auth = args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false);

    let limits_file = file.limits.clone().unwrap_or_default();
    let defaults = ServerConfig::default();
    // The flag, else the `[limits]` field, else the default; in 1..=max.
    let limit = |name: &str, pick: fn(&FileLimits) -> Option<u64>, default: usize, max: u64| {
        let value = pick(&args.limits)
            .or(pick(&limits_file))
            .unwrap_or(default as u64);
        check_range(&format!("limits.{name}"), value, 1, max)
    };
    let max_keys = limit(
        "max_keys",
        |l| l.max_keys,
        defaults.lock.limits.max_keys,
        MAX_KEYS_MAX,
    )?;
    let max_waiters_per_key = limit(
        "max_waiters_per_key",
        |l| l.max_waiters_per_key,
        defaults.lock.limits.max_waiters_per_key,
        MAX_WAITERS_PER_KEY_MAX,
    )?;
    let max_waiters_total = limit(
        "max_waiters_total",
        |l| l.max_waiters_total,
        defaults.lock.limits.max_waiters_total,
        MAX_WAITERS_TOTAL_MAX,
    )?;
    let max_connections = limit(
        "max_connections",
        |l| l.max_connections,
        defaults.max_connections,
        MAX_CONNECTIONS_MAX,
    )?;
    let max_in_flight_per_connection = limit(
        "max_in_flight_per_connection",
        |l| l.max_in_flight_per_connection,
        defaults.max_in_flight_per_connection,
        MAX_IN_FLIGHT_PER_CONNECTION_MAX,
    )?;
    let budget_defaults = BudgetConfig::for_max_connections(max_connections);
    let max_handshakes = limit(
        "max_handshakes",
        |l| l.max_handshakes,
        budget_defaults.max_handshakes,
        MAX_HANDSHAKES_MAX,
    )?;
    let max_handshakes_per_source = limit(
        "max_handshakes_per_source",
        |l| l.max_handshakes_per_source,
        (max_handshakes / 2).max(1),
        MAX_HANDSHAKES_MAX,
    )?;
    let max_peer_handshakes = limit(
        "max_peer_handshakes",
        |l| l.max_peer_handshakes,
        budget_defaults.max_peer_handshakes,
        MAX_PEER_HANDSHAKES_MAX,
    )?;
    let max_peer_handshakes_per_source = limit(
        "max_peer_handshakes_per_source",
        |l| l.max_peer_handshakes_per_source,
        budget_defaults.max_peer_handshakes_per_source,
        MAX_PEER_HANDSHAKES_MAX,
    )?;
    let max_held_per_connection = limit(
        "max_held_per_connection",
        |l| l.max_held_per_connection,
        budget_defaults.max_held_per_connection,
        MAX_HELD_PER_CONNECTION_MAX,
    )?;
    let max_release_misses_in_row = check_range(
        "limits.max_release_misses_in_row",
        args.limits
            .max_release_misses_in_row
            .or(limits_file.max_release_misses_in_row)
            .unwrap_or(u64::from(budget_defaults.max_release_misses_in_row)),
        0,
        MAX_RELEASE_MISSES_IN_ROW_MAX,
    )?;
    let default_handshake_ms =
        u64::try_from(defaults.handshake_timeout.as_millis()).unwrap_or(u64::MAX);
    let handshake_timeout_ms = check_range(
        "limits.handshake_timeout_ms",
        args.limits
            .handshake_timeout_ms
            .or(limits_file.handshake_timeout_ms)
            .unwrap_or(default_handshake_ms),
        HANDSHAKE_TIMEOUT_MS_MIN,
        HANDSHAKE_TIMEOUT_MS_MAX,
    )?;
    let budget = BudgetConfig {
        max_handshakes,
        max_handshakes_per_source,
        max_peer_handshakes,
        max_peer_handshakes_per_source,
        max_held_per_connection,
        max_release_misses_in_row: u32::try_from(max_release_misses_in_row).unwrap_or(u32::MAX),
        ..budget_defaults
    };
    let default_margin_ms = u64::try_from(defaults.lock.wait_margin.as_millis()).unwrap_or(0);
    let wait_margin_ms = check_range(
        "wait_margin_ms",
        args.wait_margin_ms
            .or(file.wait_margin_ms)
            .unwrap_or(default_margin_ms),
        0,
        WAIT_MARGIN_MS_MAX,
    )?;

    let worker_threads = check_range(
        "worker_threads",
        args.worker_threads.or(file.worker_threads).unwrap_or(1),
        1,
        WORKER_THREADS_MAX,
    )?;

    let tls = resolve_tls(file, file_dir, args)?;
    let log_filter = resolve_log_filter(file, args, env)?;
    let log_format = match args
        .log_format
        .as_deref()
        .or(file.log_format.as_deref())
        .map(|text| text.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => {
            return Err(ConfigError::new(
                "log_format",
                format!("{other:?} is not one of text, json"),
            ));
        }
    };
    let admin_listen = args
        .admin_listen
        .as_deref()
        .or(file.admin_listen.as_deref())
        .map(|text| parse_addr("admin_listen", text))
        .transpose()?;
    let admin_tokens = resolve_admin_tokens(file, file_dir, args, env)?;
    let insecure_admin_no_auth =
        args.insecure_admin_no_auth || file.insecure_admin_no_auth.unwrap_or(false);
    if let Some(admin) = admin_listen {
        check_admin_listen_auth(admin, !admin_tokens.is_empty(), insecure_admin_no_auth)?;
    }
    let state = StateSettings::new(resolve_state_dir(file, file_dir, args, env));

    let server = ServerConfig {
        lock: LockConfig {
            limits: Limits {
                max_keys,
                max_waiters_per_key,
                max_waiters_total,
            },
            wait_margin: Duration::from_millis(wait_margin_ms as u64),
            ..defaults.lock
        },
        max_connections,
        max_in_flight_per_connection,
        handshake_timeout: Duration::from_millis(handshake_timeout_ms as u64),
        client_tokens,
        budget,
        ..defaults
    };
    let cluster = if cluster_mode(file, args) {
        let cluster = resolve_cluster(file, file_dir, args, env, &server, tls.clone())?;
        if let Some(text) = args.listen.as_deref().or(file.listen.as_deref())
            && listen != cluster.client_listen
        {
            return Err(ConfigError::new(
                "listen",
                format!(
                    "{text} differs from this slot's client address {}; in cluster mode leave listen unset",
                    cluster.client_listen
                ),
            ));
        }
        check_listen_auth(
            cluster.client_listen,
            !tokens.values.is_empty(),
            insecure_no_auth,
        )
        .map_err(|e| {
            ConfigError::new(
                format!("cluster.slots[{}].client", cluster.node.id.slot),
                e.message,
            )
        })?;
        let mut cluster = cluster;
        cluster.state = Some(state.clone());
        cluster.admin_listen = admin_listen;
        cluster.admin_tokens = admin_tokens.clone();
        Some(cluster)
    } else {
        check_listen_auth(listen, !tokens.values.is_empty(), insecure_no_auth)?;
        None
    };
    let mut settings = ServeSettings::new(cluster.as_ref().map_or(listen, |c| c.client_listen));
    settings.server = server;
    settings.tls = tls;
    settings.state = Some(state);
    settings.admin_listen = admin_listen;
    settings.admin_tokens = admin_tokens;
    let auth = if tokens.values.is_empty() {
        AuthMode::None
    } else {
        AuthMode::Tokens(tokens.values.len())
    };
    Ok(Config {
        settings,
        log_filter,
        log_format,
        worker_threads,
        auth,
        cluster,
    })
}

/// Whether any cluster option is set.
fn cluster_mode(file: &FileConfig, args: &ServeArgs) -> bool {
    file.cluster.is_some()
        || args.cluster
        || args.cluster_identity.is_some()
        || args.self_slot.is_some()
        || !args.slots.is_empty()
        || !args.peer_tokens.is_empty()
        || args.profile.is_some()
        || args.status_listen.is_some()
        || args.bootstrap
}

fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("expected IP:PORT such as 127.0.0.1:5225 or [::1]:5225, got {text:?}"),
        )
    })
}

/// Checks a slot's advertised client address: what `M` and `L` lines carry
/// to line-dialect clients, compared by them as an exact string.
fn parse_advertised(field: &str, text: &str) -> Result<Box<str>, ConfigError> {
    let text = text.trim();
    if text.is_empty() || text.len() > ticketing_core::line::MAX_LINE_TEXT_LEN {
        return Err(ConfigError::new(
            field,
            format!(
                "an advertised address has 1..={} bytes, got {}",
                ticketing_core::line::MAX_LINE_TEXT_LEN,
                text.len()
            ),
        ));
    }
    if text.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            field,
            format!("an advertised address has no spaces or control characters, got {text:?}"),
        ));
    }
    Ok(text.into())
}

/// Each slot's admin address, from `--slot-admin` (which replaces the
/// file's) or `slots[].admin`: every slot or none.
fn slot_admins(
    args: &ServeArgs,
    file_slots: Option<&[FileSlot]>,
    slot_count: usize,
) -> Result<Vec<Box<str>>, ConfigError> {
    let (given, flag): (Vec<Option<&str>>, bool) = if args.slot_admins.is_empty() {
        let list = file_slots.unwrap_or_default();
        (
            list.iter().map(|slot| slot.admin.as_deref()).collect(),
            false,
        )
    } else {
        (
            args.slot_admins.iter().map(|a| Some(a.as_str())).collect(),
            true,
        )
    };
    let field = |index: usize| {
        if flag {
            format!("--slot-admin[{index}]")
        } else {
            format!("cluster.slots[{index}].admin")
        }
    };
    if given.iter().all(Option::is_none) {
        return Ok(Vec::new());
    }
    if flag && given.len() != slot_count {
        return Err(ConfigError::new(
            "--slot-admin",
            format!("give one per slot ({slot_count}), got {}", given.len()),
        ));
    }
    let mut out = Vec::with_capacity(given.len());
    for (index, text) in given.iter().enumerate() {
        let Some(text) = text else {
            return Err(ConfigError::new(
                field(index),
                "required: set admin on every slot, or on none",
            ));
        };
        out.push(parse_admin_address(&field(index), text)?);
    }
    Ok(out)
}

/// Checks an admin address as operators reach it: `HOST:PORT` with a
/// numeric port, a non-empty host, no spaces or control characters.
fn parse_admin_address(field: &str, text: &str) -> Result<Box<str>, ConfigError> {
    let text = parse_advertised(field, text)?;
    let port_ok = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok {
        return Err(ConfigError::new(
            field,
            format!("expected HOST:PORT, got {text:?}"),
        ));
    }
    Ok(text)
}

/// Parses a cluster identity: exactly 64 lowercase hex digits.
pub fn parse_identity(text: &str) -> Result<[u8; 32], String> {
    if text.len() != 64
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "expected 64 lowercase hex digits (see `ticketing identity`), got {} characters",
            text.len()
        ));
    }
    let mut out = [0u8; 32];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16)
            .map_err(|_| "not hexadecimal".to_owned())?;
    }
    Ok(out)
}

/// The cluster half of [`resolve`]; `server` carries the limits, margin
/// and client tokens already validated.
fn resolve_cluster(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
    server: &ServerConfig,
    client_tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<ClusterSettings, ConfigError> {
    let table = file.cluster.clone().unwrap_or_default();

    let identity_text = args
        .cluster_identity
        .as_deref()
        .or(table.identity.as_deref())
        .ok_or_else(|| {
            ConfigError::new(
                "cluster.identity",
                "required in cluster mode (--cluster-identity; make one with `ticketing identity`)",
            )
        })?;
    let fingerprint =
        parse_identity(identity_text).map_err(|e| ConfigError::new("cluster.identity", e))?;

    // Slots: the flags replace the file's list as a whole.
    let mut advertised: Vec<Box<str>> = Vec::new();
    let slots: Vec<(SocketAddr, SocketAddr)> = if args.slots.is_empty() {
        let list = table.slots.clone().unwrap_or_default();
        let mut out = Vec::with_capacity(list.len());
        for (index, slot) in list.iter().enumerate() {
            fn get<'a>(
                index: usize,
                name: &str,
                value: &'a Option<String>,
            ) -> Result<(SocketAddr, &'a str), ConfigError> {
                let field = format!("cluster.slots[{index}].{name}");
                let text = value
                    .as_deref()
                    .ok_or_else(|| ConfigError::new(field.clone(), "required"))?;
                parse_addr(&field, text).map(|addr| (addr, text.trim()))
            }
            let (client, client_text) = get(index, "client", &slot.client)?;
            let (peer, _) = get(index, "peer", &slot.peer)?;
            let shown = slot.advertise.as_deref().unwrap_or(client_text);
            advertised.push(parse_advertised(
                &format!("cluster.slots[{index}].advertise"),
                shown,
            )?);
            out.push((client, peer));
        }
        out
    } else {
        let mut out = Vec::with_capacity(args.slots.len());
        for (index, text) in args.slots.iter().enumerate() {
            let field = format!("cluster.slots[{index}]");
            let mut parts = text.splitn(3, ',');
            let (Some(client), Some(peer)) = (parts.next(), parts.next()) else {
                return Err(ConfigError::new(
                    field.clone(),
                    format!("expected CLIENT_ADDR,PEER_ADDR[,ADVERTISED] (--slot), got {text:?}"),
                ));
            };
            let shown = parts.next().unwrap_or(client);
            advertised.push(parse_advertised(&format!("{field}.advertise"), shown)?);
            out.push((
                parse_addr(&format!("{field}.client"), client)?,
                parse_addr(&format!("{field}.peer"), peer)?,
            ));
        }
        out
    };
    if slots.len() != 3 && slots.len() != 5 {
        let why = if slots.len().is_multiple_of(2) {
            "; an even count adds cost but no fault tolerance"
        } else {
            ""
        };
        return Err(ConfigError::new(
            "cluster.slots",
            format!(
                "{} slots given, a cluster has exactly 3 or 5{why}",
                slots.len()
            ),
        ));
    }
    let mut seen: Vec<(SocketAddr, String)> = Vec::new();
    for (index, (client, peer)) in slots.iter().enumerate() {
        for (addr, name) in [(client, "client"), (peer, "peer")] {
            let field = format!("cluster.slots[{index}].{name}");
            if let Some((_, other)) = seen.iter().find(|(a, _)| a == addr) {
                return Err(ConfigError::new(
                    field,
                    format!("{addr} is also {other}; every address must be distinct"),
                ));
            }
            seen.push((*addr, field));
        }
    }

    let self_slot = args.self_slot.or(table.self_slot).ok_or_else(|| {
        ConfigError::new(
            "cluster.self_slot",
            "required in cluster mode (--self-slot)",
        )
    })?;
    if self_slot >= slots.len() as u64 {
        return Err(ConfigError::new(
            "cluster.self_slot",
            format!(
                "{self_slot} is out of range, allowed 0..={}",
                slots.len() - 1
            ),
        ));
    }
    let self_slot = self_slot as u8;

    let tokens = pick_tokens(
        &args.peer_tokens,
        "--peer-token",
        env.peer_tokens.as_deref(),
        ENV_PEER_TOKENS,
        table.peer_tokens.as_deref(),
    );
    let peer_tokens =
        PeerTokens::new(tokens.values.iter().map(String::as_bytes)).map_err(|e| match e {
            PeerTokenError::Empty => ConfigError::new(
                "cluster.peer_tokens",
                format!("at least one peer token is required (--peer-token, {ENV_PEER_TOKENS})"),
            ),
            PeerTokenError::TooShort(index) => tokens.too_short("cluster.peer_tokens", index),
        })?;

    let profile = args
        .profile
        .as_deref()
        .or(table.profile.as_deref())
        .unwrap_or("default");
    let raft = match profile {
        "default" => RaftConfig::default(),
        "fast" => RaftConfig::fast(),
        other => {
            return Err(ConfigError::new(
                "cluster.profile",
                format!("{other:?} is not one of default, fast"),
            ));
        }
    };
    let status_listen = args
        .status_listen
        .as_deref()
        .or(table.status_listen.as_deref())
        .map(|text| parse_addr("cluster.status_listen", text))
        .transpose()?;
    let peer_tls = resolve_peer_tls(table.peer_tls.as_ref(), file_dir)?;

    // The generation is chosen at start (spawn_cluster); 0 until then.
    let mut node = ClusterConfig::new(
        fingerprint,
        NodeId::new(self_slot, 0),
        slots.len() as u8,
        peer_tokens,
        0,
    );
    node.peer_silence_timeout = ticketing_core::cluster::default_peer_silence_timeout(&raft);
    node.raft = raft;
    node.limits = server.lock.limits;
    node.wait_margin = server.lock.wait_margin;
    node.max_connections = server.max_connections;
    node.max_in_flight_per_connection = server.max_in_flight_per_connection;
    node.handshake_timeout = server.handshake_timeout;
    node.budget = server.budget;
    node.client_tokens = server.client_tokens.clone();
    node.client_addresses = advertised;
    node.admin_addresses = slot_admins(args, table.slots.as_deref(), slots.len())?;
    node.validate()
        .map_err(|e| ConfigError::new("cluster", e.to_owned()))?;
    let (client_listen, peer_listen) = slots[usize::from(self_slot)];
    let mut settings = ClusterSettings::new(
        client_listen,
        peer_listen,
        slots.iter().map(|(_, peer)| *peer).collect(),
        node,
    );
    settings.bootstrap = args.bootstrap;
    settings.client_tls = client_tls;
    settings.peer_tls = peer_tls;
    settings.status_listen = status_listen;
    Ok(settings)
}

/// The state directory: the flag, else `state_dir` in the file (relative
/// to its folder), else the default for how the process runs: systemd's
/// `StateDirectory=` (`$STATE_DIRECTORY`, its first entry), else
/// `/var/lib/ticketing` as root, else `$XDG_STATE_HOME/ticketing`, else
/// `~/.local/state/ticketing`, else `/var/lib/ticketing`. Nothing is
/// touched here; the server creates and checks it at start.
pub fn resolve_state_dir(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
) -> PathBuf {
    if let Some(dir) = &args.state_dir {
        return dir.clone();
    }
    if let Some(dir) = &file.state_dir {
        return in_file_dir(file_dir, dir);
    }
    let non_empty = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
    if let Some(dirs) = non_empty(&env.state_directory)
        && let Some(first) = dirs.split(':').find(|d| !d.is_empty())
    {
        return PathBuf::from(first);
    }
    if env.is_root {
        return PathBuf::from(DEFAULT_ROOT_STATE_DIR);
    }
    if let Some(xdg) = non_empty(&env.xdg_state_home) {
        return Path::new(&xdg).join("ticketing");
    }
    if let Some(home) = non_empty(&env.home) {
        return Path::new(&home).join(".local/state/ticketing");
    }
    PathBuf::from(DEFAULT_ROOT_STATE_DIR)
}

fn resolve_peer_tls(
    table: Option<&FilePeerTls>,
    file_dir: Option<&Path>,
) -> Result<Option<PeerTls>, ConfigError> {
    let Some(table) = table else {
        return Ok(None);
    };
    let path = |name: &str, value: &Option<PathBuf>| {
        let value = value.as_ref().ok_or_else(|| {
            ConfigError::new(
                format!("cluster.peer_tls.{name}"),
                "required when [cluster.peer_tls] is present",
            )
        })?;
        Ok::<PathBuf, ConfigError>(in_file_dir(file_dir, value))
    };
    let cert = path("cert", &table.cert)?;
    let key = path("key", &table.key)?;
    let ca = path("ca", &table.ca)?;
    let name_text = table.server_name.clone().ok_or_else(|| {
        ConfigError::new(
            "cluster.peer_tls.server_name",
            "required when [cluster.peer_tls] is present: the DNS name on every peer certificate",
        )
    })?;
    let server_name = ServerName::try_from(name_text.clone()).map_err(|_| {
        ConfigError::new(
            "cluster.peer_tls.server_name",
            format!("{name_text:?} is not a valid DNS name"),
        )
    })?;
    let server =
        tls::load_server_config(&cert, &key).map_err(|e| tls_error("cluster.peer_tls", e))?;
    let client = tls::load_client_config(&ca)
        .map_err(|e| ConfigError::new("cluster.peer_tls.ca", e.to_string()))?;
    Ok(Some(PeerTls {
        server,
        client,
        server_name,
    }))
}

/// Our rule: with no client token, only the empty token is accepted, so
/// anyone who can reach the port can take and release locks. That is fine on
/// loopback only, unless the operator says explicitly that it is meant.
pub fn check_listen_auth(
    listen: SocketAddr,
    has_tokens: bool,
    insecure_no_auth: bool,
) -> Result<(), ConfigError> {
    // `to_canonical` so that ::ffff:127.0.0.1 counts as the loopback it is.
    if has_tokens || insecure_no_auth || listen.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(ConfigError::new(
        "listen",
        format!(
            "{listen} is not a loopback address and no client token is configured; \
             set client_tokens (or --client-token / {ENV_CLIENT_TOKENS}), \
             or insecure_no_auth = true (--insecure-no-auth) to serve without authentication"
        ),
    ))
}

/// The admin tokens: from `--admin-token-file`, else
/// `TICKETING_ADMIN_TOKENS`, else the config file's `admin_token_file`,
/// else its `admin_tokens` list.
fn resolve_admin_tokens(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
) -> Result<AdminTokens, ConfigError> {
    let token_file = match (&args.admin_token_file, &file.admin_token_file) {
        (Some(path), _) => Some(("--admin-token-file", path.clone())),
        (None, Some(path)) => Some(("admin_token_file", in_file_dir(file_dir, path))),
        (None, None) => None,
    };
    let from_token_file = match token_file {
        Some((field, path)) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(field, format!("cannot read {}: {e}", path.display()))
            })?;
            let tokens: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned)
                .collect();
            if tokens.is_empty() {
                return Err(ConfigError::new(
                    field,
                    format!("{} holds no token", path.display()),
                ));
            }
            Some(PickedTokens {
                values: tokens,
                source: field,
            })
        }
        None => None,
    };
    let tokens = match from_token_file {
        Some(tokens) => tokens,
        None => pick_tokens(
            &[],
            "--admin-token-file",
            env.admin_tokens.as_deref(),
            ENV_ADMIN_TOKENS,
            file.admin_tokens.as_deref(),
        ),
    };
    AdminTokens::new(&tokens.values).map_err(|e| tokens.too_short("admin_tokens", e.index))
}

/// Our rule for the admin listener, as for the client port: with no admin
/// token the lock API can only be used from the loopback, so a
/// non-loopback admin listener without one is refused unless the operator
/// says explicitly that it is meant (it then serves metrics and health
/// only).
pub fn check_admin_listen_auth(
    admin_listen: SocketAddr,
    has_tokens: bool,
    insecure_admin_no_auth: bool,
) -> Result<(), ConfigError> {
    if has_tokens || insecure_admin_no_auth || admin_listen.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(ConfigError::new(
        "admin_listen",
        format!(
            "{admin_listen} is not a loopback address and no admin token is configured; \
             set admin_tokens (or --admin-token-file / {ENV_ADMIN_TOKENS}), \
             or insecure_admin_no_auth = true (--insecure-admin-no-auth) to serve \
             metrics and health only"
        ),
    ))
}

/// Client or peer tokens, with where they came from (for error messages).
struct PickedTokens {
    values: Vec<String>,
    source: &'static str,
}

impl PickedTokens {
    /// Token `index` of the list field `list` is too short; the message
    /// gives its length, never its text.
    fn too_short(&self, list: &str, index: usize) -> ConfigError {
        let len = self.values[index].len();
        let source = self.source;
        ConfigError::new(
            format!("{list}[{index}]"),
            format!("token is {len} bytes, must be at least {MIN_TOKEN_LEN} (from {source})"),
        )
    }
}

/// The tokens given by the flags, else by the environment variable
/// (comma-separated; blank entries skipped), else by the config file.
fn pick_tokens(
    flags: &[String],
    flag_name: &'static str,
    env_value: Option<&str>,
    env_name: &'static str,
    from_file: Option<&[String]>,
) -> PickedTokens {
    if !flags.is_empty() {
        return PickedTokens {
            values: flags.to_vec(),
            source: flag_name,
        };
    }
    if let Some(list) = env_value.filter(|s| !s.trim().is_empty()) {
        return PickedTokens {
            values: list
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            source: env_name,
        };
    }
    PickedTokens {
        values: from_file.unwrap_or_default().to_vec(),
        source: "the config file",
    }
}

fn check_range(field: &str, value: u64, min: u64, max: u64) -> Result<usize, ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            field,
            format!("{value} is out of range, allowed {min}..={max}"),
        ));
    }
    usize::try_from(value)
        .map_err(|_| ConfigError::new(field, format!("{value} does not fit this platform's usize")))
}

fn resolve_tls(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
) -> Result<Option<Arc<rustls::ServerConfig>>, ConfigError> {
    let from_file = |pick: fn(&FileTls) -> Option<&PathBuf>| {
        let path = file.tls.as_ref().and_then(pick)?;
        Some(in_file_dir(file_dir, path))
    };
    let cert = args
        .tls_cert
        .clone()
        .or_else(|| from_file(|t| t.cert.as_ref()));
    let key = args
        .tls_key
        .clone()
        .or_else(|| from_file(|t| t.key.as_ref()));
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => {
            return Err(ConfigError::new(
                "tls.key",
                "required when tls.cert is set (--tls-key)",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "tls.cert",
                "required when tls.key is set (--tls-cert)",
            ));
        }
    };
    tls::load_server_config(&cert, &key)
        .map(Some)
        .map_err(|e| tls_error("tls", e))
}

/// A path from the config file: relative ones are relative to its folder.
fn in_file_dir(file_dir: Option<&Path>, path: &Path) -> PathBuf {
    match file_dir {
        Some(dir) => dir.join(path),
        None => path.to_owned(),
    }
}

/// A certificate/key error, named after the field of `table` at fault
/// (`table.cert`, `table.key`, or `table` itself when they do not match).
fn tls_error(table: &str, e: tls::TlsError) -> ConfigError {
    let field = match e.part {
        TlsPart::Cert => format!("{table}.cert"),
        TlsPart::Key => format!("{table}.key"),
        TlsPart::Pair => table.to_owned(),
    };
    ConfigError::new(field, e.to_string())
}

fn resolve_log_filter(
    file: &FileConfig,
    args: &ServeArgs,
    env: &Env,
) -> Result<String, ConfigError> {
    let check_level = |field: &str, level: &str| {
        let lower = level.trim().to_ascii_lowercase();
        if LOG_LEVELS.contains(&lower.as_str()) {
            Ok(lower)
        } else {
            Err(ConfigError::new(
                field,
                format!("{level:?} is not one of {}", LOG_LEVELS.join(", ")),
            ))
        }
    };
    if let Some(level) = &args.log_level {
        return check_level("log_level", level);
    }
    if let Some(directives) = env.rust_log.as_deref().filter(|s| !s.trim().is_empty()) {
        tracing_subscriber::EnvFilter::try_new(directives)
            .map_err(|e| ConfigError::new("RUST_LOG", format!("invalid filter: {e}")))?;
        return Ok(directives.to_owned());
    }
    match &file.log_level {
        Some(level) => check_level("log_level", level),
        None => Ok(DEFAULT_LOG_LEVEL.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> ServeArgs {
        let mut full = vec!["ticketing", "serve"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full)
            .expect("valid command line")
            .command
        {
            Command::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    const IDENTITY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const SLOTS3: [&str; 6] = [
        "--slot",
        "127.0.0.1:5225,127.0.0.1:6225",
        "--slot",
        "127.0.0.1:5226,127.0.0.1:6226",
        "--slot",
        "127.0.0.1:5227,127.0.0.1:6227",
    ];

    fn cluster_args(extra: &[&str]) -> Vec<String> {
        let mut argv = vec![
            "--cluster-identity",
            IDENTITY,
            "--self-slot",
            "1",
            "--peer-token",
            "peer-token-0123456789",
        ];
        argv.extend_from_slice(extra);
        argv.into_iter().map(str::to_owned).collect()
    }

    fn cluster_field(argv: &[String]) -> String {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        field_of(resolve_args(&argv))
    }

    #[test]
    fn cluster_flags_give_the_slot_addresses_and_profile() {
        let mut argv = cluster_args(&SLOTS3);
        argv.extend([
            "--profile".to_owned(),
            "fast".to_owned(),
            "--bootstrap".to_owned(),
        ]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let config = resolve_args(&argv).unwrap();
        let cluster = config.cluster.expect("cluster mode");
        assert_eq!(cluster.client_listen, "127.0.0.1:5226".parse().unwrap());
        assert_eq!(cluster.peer_listen, "127.0.0.1:6226".parse().unwrap());
        assert_eq!(cluster.peer_addrs.len(), 3);
        assert_eq!(cluster.node.slot_count, 3);
        assert_eq!(cluster.node.id.slot, 1);
        assert_eq!(cluster.node.raft, RaftConfig::fast());
        assert!(cluster.bootstrap);
        assert_eq!(config.settings.listen, cluster.client_listen);
    }

    #[test]
    fn cluster_slot_count_must_be_3_or_5() {
        let four = [
            SLOTS3.as_slice(),
            &["--slot", "127.0.0.1:5228,127.0.0.1:6228"],
        ]
        .concat();
        assert_eq!(cluster_field(&cluster_args(&four)), "cluster.slots");
        let err = {
            let argv = cluster_args(&four);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            resolve_args(&argv).unwrap_err()
        };
        assert!(err.message.contains("even"), "{err}");
        assert_eq!(cluster_field(&cluster_args(&SLOTS3[..4])), "cluster.slots");
    }

    #[test]
    fn cluster_errors_name_their_field() {
        let mut bad_identity = cluster_args(&SLOTS3);
        bad_identity[1] = IDENTITY.to_uppercase();
        assert_eq!(cluster_field(&bad_identity), "cluster.identity");
        let mut bad_slot = cluster_args(&SLOTS3);
        bad_slot[3] = "3".to_owned();
        assert_eq!(cluster_field(&bad_slot), "cluster.self_slot");
        let mut short_token = cluster_args(&SLOTS3);
        short_token[5] = "short".to_owned();
        assert_eq!(cluster_field(&short_token), "cluster.peer_tokens[0]");
        let mut dup = cluster_args(&SLOTS3);
        let last = dup.len() - 1;
        dup[last] = "127.0.0.1:5225,127.0.0.1:6227".to_owned();
        assert_eq!(cluster_field(&dup), "cluster.slots[2].client");
        let mut profile = cluster_args(&SLOTS3);
        profile.extend(["--profile".to_owned(), "turbo".to_owned()]);
        assert_eq!(cluster_field(&profile), "cluster.profile");
        assert_eq!(
            cluster_field(&cluster_args(&[
                "--slot", "x", "--slot", "y", "--slot", "z"
            ])),
            "cluster.slots[0]"
        );
    }

    #[test]
    fn slot_admin_addresses_come_from_the_flags_or_the_file_and_a_bad_one_is_named() {
        let mut argv = cluster_args(&SLOTS3);
        for port in [9225, 9226, 9227] {
            argv.extend([
                "--slot-admin".to_owned(),
                format!("node{port}.example:{port}"),
            ]);
        }
        let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
        let node = resolve_args(&argv_ref).unwrap().cluster.unwrap().node;
        let expected: Vec<Box<str>> = [
            "node9225.example:9225",
            "node9226.example:9226",
            "node9227.example:9227",
        ]
        .into_iter()
        .map(Box::from)
        .collect();
        assert_eq!(node.admin_addresses, expected);
        // None given: none known.
        let argv_ref: Vec<String> = cluster_args(&SLOTS3);
        let argv_ref: Vec<&str> = argv_ref.iter().map(String::as_str).collect();
        assert!(
            resolve_args(&argv_ref)
                .unwrap()
                .cluster
                .unwrap()
                .node
                .admin_addresses
                .is_empty()
        );
        // Too few flags, and a port that is not one.
        let mut short = cluster_args(&SLOTS3);
        short.extend(["--slot-admin".to_owned(), "a:1".to_owned()]);
        assert_eq!(cluster_field(&short), "--slot-admin");
        let mut bad = cluster_args(&SLOTS3);
        for admin in ["a:1", "b:x", "c:3"] {
            bad.extend(["--slot-admin".to_owned(), admin.to_owned()]);
        }
        assert_eq!(cluster_field(&bad), "--slot-admin[1]");
        // The file: every slot or none, and the field is named.
        let file = |admins: [&str; 3]| {
            parse_file(&format!(
                r#"
                client_tokens = ["client-token-0123456789"]
                [cluster]
                identity = "{IDENTITY}"
                self_slot = 0
                peer_tokens = ["peer-token-0123456789"]
                slots = [
                  {{ client = "10.0.0.1:5225", peer = "10.0.0.1:6225" {} }},
                  {{ client = "10.0.0.2:5225", peer = "10.0.0.2:6225" {} }},
                  {{ client = "10.0.0.3:5225", peer = "10.0.0.3:6225" {} }},
                ]
                "#,
                admins[0], admins[1], admins[2]
            ))
            .unwrap()
        };
        let all = file([
            r#", admin = "10.0.0.1:9225""#,
            r#", admin = "10.0.0.2:9225""#,
            r#", admin = "10.0.0.3:9225""#,
        ]);
        let config = resolve(&all, None, &args(&[]), &Env::default()).unwrap();
        assert_eq!(
            config.cluster.unwrap().node.admin_addresses[2].as_ref(),
            "10.0.0.3:9225"
        );
        let missing = file([
            r#", admin = "10.0.0.1:9225""#,
            "",
            r#", admin = "10.0.0.3:9225""#,
        ]);
        let err = resolve(&missing, None, &args(&[]), &Env::default()).unwrap_err();
        assert_eq!(err.field, "cluster.slots[1].admin");
    }

    #[test]
    fn cluster_table_in_the_file_is_read() {
        let file = parse_file(&format!(
            r#"
            client_tokens = ["client-token-0123456789"]
            [cluster]
            identity = "{IDENTITY}"
            self_slot = 0
            peer_tokens = ["peer-token-0123456789", "old-peer-token-0123456789"]
            profile = "default"
            slots = [
              {{ client = "10.0.0.1:5225", peer = "10.0.0.1:6225" }},
              {{ client = "10.0.0.2:5225", peer = "10.0.0.2:6225" }},
              {{ client = "10.0.0.3:5225", peer = "10.0.0.3:6225" }},
            ]
            "#
        ))
        .unwrap();
        let config = resolve(&file, None, &args(&[]), &Env::default()).unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(cluster.client_listen, "10.0.0.1:5225".parse().unwrap());
        assert_eq!(cluster.node.raft, RaftConfig::default());
        assert!(!cluster.bootstrap, "bootstrap is a command-line flag only");
        let missing_peer = parse_file(&format!(
            "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 0\npeer_tokens = [\"peer-token-0123456789\"]\nslots = [{{ client = \"127.0.0.1:1\" }}]\n"
        ))
        .unwrap();
        assert_eq!(
            field_of(resolve(&missing_peer, None, &args(&[]), &Env::default())),
            "cluster.slots[0].peer"
        );
    }

    #[test]
    fn peer_tokens_come_from_flags_then_env_then_file() {
        let cluster_file = |tokens: &str| {
            parse_file(&format!(
                "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n{tokens}"
            ))
            .unwrap()
        };
        let short_file = cluster_file("peer_tokens = [\"x\"]\n");
        let slots = args(&SLOTS3);
        let err = resolve(&short_file, None, &slots, &Env::default()).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tokens[0]");
        assert!(err.message.contains("the config file"), "{err}");

        let env = Env {
            peer_tokens: Some(" env-peer-token-0123456, ,env-peer-token-abcdefg".to_owned()),
            ..Env::default()
        };
        assert!(resolve(&short_file, None, &slots, &env).is_ok());
        let env_short = Env {
            peer_tokens: Some("env-peer-token-0123456,tiny".to_owned()),
            ..Env::default()
        };
        let err = resolve(&short_file, None, &slots, &env_short).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tokens[1]");
        assert!(err.message.contains("4 bytes"), "{err}");
        assert!(err.message.contains(ENV_PEER_TOKENS), "{err}");
        assert!(
            !err.to_string().contains("tiny"),
            "a secret was printed: {err}"
        );

        let with_flag = |token: &str| args(&[SLOTS3.as_slice(), &["--peer-token", token]].concat());
        let good_flag = with_flag("flag-peer-token-0123");
        assert!(resolve(&short_file, None, &good_flag, &env_short).is_ok());
        let err = resolve(&short_file, None, &with_flag("x"), &env).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tokens[0]");
        assert!(err.message.contains("--peer-token"), "{err}");

        let no_tokens = cluster_file("");
        assert_eq!(
            field_of(resolve(&no_tokens, None, &slots, &Env::default())),
            "cluster.peer_tokens"
        );
    }

    #[test]
    fn durations_take_ms_s_and_m() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "s", "5h", "-1s", "1.5s", "5 s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lock_takes_the_command_after_the_separator() {
        let cli = Cli::try_parse_from([
            "ticketing",
            "lock",
            "k",
            "--addr",
            "127.0.0.1:1",
            "--wait",
            "0",
            "--",
            "echo",
            "--x",
        ])
        .unwrap();
        let Command::Lock(args) = cli.command else {
            panic!("not lock");
        };
        assert_eq!(args.key, "k");
        assert_eq!(args.addrs, ["127.0.0.1:1"]);
        assert_eq!(args.wait, Duration::ZERO);
        assert_eq!(args.lease, Duration::from_secs(30));
        assert_eq!(args.command, ["echo", "--x"]);
        assert!(Cli::try_parse_from(["ticketing", "lock", "k"]).is_err());
    }

    fn resolve_args(argv: &[&str]) -> Result<Config, ConfigError> {
        resolve(&FileConfig::default(), None, &args(argv), &Env::default())
    }

    fn field_of(result: Result<Config, ConfigError>) -> String {
        result.expect_err("config must be refused").field
    }

    #[test]
    fn admin_tokens_come_from_the_token_file_else_the_env_else_the_file_list() {
        let none = resolve_args(&[]).unwrap();
        assert!(none.settings.admin_tokens.is_empty());
        let file =
            parse_file("admin_tokens = [\"file-admin-token-0123\", \"file-admin-token-4567\"]")
                .unwrap();
        let listed = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
        assert!(
            listed
                .settings
                .admin_tokens
                .accepts(b"file-admin-token-4567")
        );
        let env = Env {
            admin_tokens: Some("env-admin-token-0123456".to_owned()),
            ..Env::default()
        };
        let from_env = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
        assert!(
            from_env
                .settings
                .admin_tokens
                .accepts(b"env-admin-token-0123456")
        );
        assert!(
            !from_env
                .settings
                .admin_tokens
                .accepts(b"file-admin-token-0123")
        );

        let dir =
            std::env::temp_dir().join(format!("ticketing-admin-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "# admin\n\nflag-admin-token-0123456\n").unwrap();
        let flagged = args(&["--admin-token-file", path.to_str().unwrap()]);
        let from_flag = resolve(&file, None, &flagged, &env).unwrap();
        assert!(
            from_flag
                .settings
                .admin_tokens
                .accepts(b"flag-admin-token-0123456")
        );
        assert!(!from_flag.settings.admin_tokens.accepts(b"# admin"));
        std::fs::write(&path, "flag-admin-token-0123456\nshort\n").unwrap();
        let err = resolve(&file, None, &flagged, &env).unwrap_err();
        assert_eq!(err.field, "admin_tokens[1]");
        assert!(!err.message.contains("short"), "never echo a token: {err}");
        std::fs::write(&path, "# nothing\n").unwrap();
        assert_eq!(
            resolve(&file, None, &flagged, &env).unwrap_err().field,
            "--admin-token-file"
        );
        let _ = std::fs::remove_dir_all(&dir);

        let short = parse_file("admin_tokens = [\"tiny\"]").unwrap();
        let err = resolve(&short, None, &ServeArgs::default(), &Env::default()).unwrap_err();
        assert_eq!(err.field, "admin_tokens[0]");
    }

    #[test]
    fn a_non_loopback_admin_listener_needs_an_admin_token_or_the_insecure_flag() {
        let err = resolve_args(&["--admin-listen", "0.0.0.0:9225"]).unwrap_err();
        assert_eq!(err.field, "admin_listen");
        assert!(err.message.contains("insecure_admin_no_auth"), "{err}");
        assert!(resolve_args(&["--admin-listen", "127.0.0.1:9225"]).is_ok());
        assert!(resolve_args(&["--admin-listen", "[::1]:9225"]).is_ok());
        assert!(
            resolve_args(&["--admin-listen", "0.0.0.0:9225", "--insecure-admin-no-auth"]).is_ok()
        );
        let file = parse_file(
            "admin_listen = \"0.0.0.0:9225\"\nadmin_tokens = [\"file-admin-token-0123\"]",
        )
        .unwrap();
        assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
        let file =
            parse_file("admin_listen = \"0.0.0.0:9225\"\ninsecure_admin_no_auth = true").unwrap();
        assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
    }

    #[test]
    fn no_arguments_mean_loopback_5225_without_auth() {
        let config = resolve_args(&[]).unwrap();
        assert_eq!(config.settings.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(config.auth, AuthMode::None);
        assert!(config.settings.server.client_tokens.is_no_auth());
        assert!(config.settings.tls.is_none());
        assert_eq!(config.log_filter, "info");
        let defaults = ServerConfig::default();
        assert_eq!(config.settings.server.lock, defaults.lock);
        assert_eq!(
            config.settings.server.max_connections,
            defaults.max_connections
        );
    }

    #[test]
    fn listen_rule_is_loopback_or_tokens_or_explicit_insecure() {
        let public: SocketAddr = "0.0.0.0:5225".parse().unwrap();
        let err = check_listen_auth(public, false, false).unwrap_err();
        assert_eq!(err.field, "listen");
        assert!(err.message.contains("insecure_no_auth"), "{err}");
        assert!(check_listen_auth(public, true, false).is_ok());
        assert!(check_listen_auth(public, false, true).is_ok());
        for loopback in [
            "127.0.0.1:1",
            "127.3.4.5:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(check_listen_auth(loopback.parse().unwrap(), false, false).is_ok());
        }
        assert!(check_listen_auth("[::]:1".parse().unwrap(), false, false).is_err());
        assert!(check_listen_auth("10.0.0.1:1".parse().unwrap(), false, false).is_err());
    }

    #[test]
    fn non_loopback_without_tokens_is_refused_unless_insecure() {
        assert_eq!(
            field_of(resolve_args(&["--listen", "0.0.0.0:5225"])),
            "listen"
        );
        let config = resolve_args(&["--listen", "0.0.0.0:5225", "--insecure-no-auth"]).unwrap();
        assert_eq!(config.auth, AuthMode::None);
        let file = parse_file("listen = \"0.0.0.0:1\"\ninsecure_no_auth = true\n").unwrap();
        assert!(resolve(&file, None, &ServeArgs::default(), &Env::default()).is_ok());
    }

    #[test]
    fn non_loopback_with_tokens_is_allowed() {
        let config = resolve_args(&[
            "--listen",
            "0.0.0.0:5225",
            "--client-token",
            "0123456789abcdef",
        ])
        .unwrap();
        assert_eq!(config.auth, AuthMode::Tokens(1));
    }

    #[test]
    fn bad_listen_address_names_listen() {
        let err = resolve_args(&["--listen", "localhost"]).unwrap_err();
        assert_eq!(err.field, "listen");
        assert!(err.message.contains("IP:PORT"), "{err}");
    }

    #[test]
    fn log_format_is_text_unless_json_and_a_bad_one_is_named() {
        assert_eq!(resolve_args(&[]).unwrap().log_format, LogFormat::Text);
        let config = resolve_args(&["--log-format", "json"]).unwrap();
        assert_eq!(config.log_format, LogFormat::Json);
        let file = parse_file("log_format = \"json\"").unwrap();
        let config = resolve(
            &file,
            None,
            &args(&["--log-format", "text"]),
            &Env::default(),
        );
        assert_eq!(config.unwrap().log_format, LogFormat::Text, "the flag wins");
        let config = resolve(&file, None, &args(&[]), &Env::default());
        assert_eq!(config.unwrap().log_format, LogFormat::Json);
        assert_eq!(
            field_of(resolve_args(&["--log-format", "yaml"])),
            "log_format"
        );
    }

    #[test]
    fn admin_listen_is_off_unless_set_and_a_bad_one_is_named() {
        assert_eq!(resolve_args(&[]).unwrap().settings.admin_listen, None);
        let config = resolve_args(&["--admin-listen", "127.0.0.1:9225"]).unwrap();
        assert_eq!(
            config.settings.admin_listen,
            Some("127.0.0.1:9225".parse().unwrap())
        );
        let file = parse_file("admin_listen = \"127.0.0.1:9226\"").unwrap();
        let config = resolve(&file, None, &args(&[]), &Env::default()).unwrap();
        assert_eq!(
            config.settings.admin_listen,
            Some("127.0.0.1:9226".parse().unwrap())
        );
        let err = resolve_args(&["--admin-listen", "localhost:9225"]).unwrap_err();
        assert_eq!(err.field, "admin_listen");
        let mut argv = cluster_args(&SLOTS3);
        argv.extend(["--admin-listen".to_owned(), "127.0.0.1:9227".to_owned()]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let config = resolve_args(&argv).unwrap();
        assert_eq!(
            config.cluster.unwrap().admin_listen,
            Some("127.0.0.1:9227".parse().unwrap())
        );
    }

    #[test]
    fn short_token_names_its_index_and_source() {
        let err = resolve_args(&[
            "--client-token",
            "0123456789abcdef",
            "--client-token",
            "short",
        ])
        .unwrap_err();
        assert_eq!(err.field, "client_tokens[1]");
        assert!(err.message.contains("5 bytes"), "{err}");
        assert!(err.message.contains("16"), "{err}");
        assert!(
            !err.to_string().contains("short"),
            "a secret was printed: {err}"
        );
    }

    #[test]
    fn tokens_come_from_flags_then_env_then_file() {
        let file = parse_file("client_tokens = [\"file-token-0123456789\"]").unwrap();
        let env = Env {
            client_tokens: Some("env-token-0123456789, env-token-abcdefghij,".to_owned()),
            rust_log: None,
            ..Env::default()
        };
        let from_env = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
        assert_eq!(from_env.auth, AuthMode::Tokens(2));
        let from_file = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
        assert_eq!(from_file.auth, AuthMode::Tokens(1));
        let flags = args(&["--client-token", "x"]);
        let err = resolve(&file, None, &flags, &env).unwrap_err();
        assert_eq!(err.field, "client_tokens[0]");
        assert!(err.message.contains("--client-token"), "{err}");
        let env_short = Env {
            client_tokens: Some("fine-token-0123456789,tiny".to_owned()),
            rust_log: None,
            ..Env::default()
        };
        let err = resolve(&file, None, &ServeArgs::default(), &env_short).unwrap_err();
        assert_eq!(err.field, "client_tokens[1]");
        assert!(err.message.contains(ENV_CLIENT_TOKENS), "{err}");
    }

    #[test]
    fn limits_must_be_at_least_one_and_sane() {
        for (flag, field, max) in [
            ("--max-keys", "limits.max_keys", MAX_KEYS_MAX),
            (
                "--max-waiters-per-key",
                "limits.max_waiters_per_key",
                MAX_WAITERS_PER_KEY_MAX,
            ),
            (
                "--max-waiters-total",
                "limits.max_waiters_total",
                MAX_WAITERS_TOTAL_MAX,
            ),
            (
                "--max-connections",
                "limits.max_connections",
                MAX_CONNECTIONS_MAX,
            ),
            (
                "--max-in-flight-per-connection",
                "limits.max_in_flight_per_connection",
                MAX_IN_FLIGHT_PER_CONNECTION_MAX,
            ),
            (
                "--max-handshakes",
                "limits.max_handshakes",
                MAX_HANDSHAKES_MAX,
            ),
            (
                "--max-handshakes-per-source",
                "limits.max_handshakes_per_source",
                MAX_HANDSHAKES_MAX,
            ),
            (
                "--max-peer-handshakes",
                "limits.max_peer_handshakes",
                MAX_PEER_HANDSHAKES_MAX,
            ),
            (
                "--max-peer-handshakes-per-source",
                "limits.max_peer_handshakes_per_source",
                MAX_PEER_HANDSHAKES_MAX,
            ),
            (
                "--max-held-per-connection",
                "limits.max_held_per_connection",
                MAX_HELD_PER_CONNECTION_MAX,
            ),
        ] {
            let err = resolve_args(&[flag, "0"]).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.message.contains(&format!("1..={max}")), "{err}");
            let too_big = (max + 1).to_string();
            assert_eq!(field_of(resolve_args(&[flag, &too_big])), field);
            assert!(resolve_args(&[flag, "1"]).is_ok());
            assert!(resolve_args(&[flag, &max.to_string()]).is_ok());
        }
    }

    #[test]
    fn budget_defaults_follow_max_connections_and_fields_apply() {
        let config = resolve_args(&["--max-connections", "200"]).unwrap();
        let server = &config.settings.server;
        assert_eq!(server.budget, BudgetConfig::for_max_connections(200));
        assert_eq!(server.handshake_timeout, Duration::from_secs(3));
        let file = parse_file(
            "[limits]\nmax_handshakes = 40\nmax_held_per_connection = 7\n\
             max_release_misses_in_row = 0\nhandshake_timeout_ms = 500\n",
        )
        .unwrap();
        let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
        let server = &config.settings.server;
        assert_eq!(server.budget.max_handshakes, 40);
        assert_eq!(server.budget.max_handshakes_per_source, 20);
        assert_eq!(server.budget.max_held_per_connection, 7);
        assert_eq!(server.budget.max_release_misses_in_row, 0);
        assert_eq!(server.handshake_timeout, Duration::from_millis(500));
    }

    #[test]
    fn release_misses_and_handshake_timeout_are_range_checked_by_name() {
        let too_many = (MAX_RELEASE_MISSES_IN_ROW_MAX + 1).to_string();
        assert_eq!(
            field_of(resolve_args(&["--max-release-misses-in-row", &too_many])),
            "limits.max_release_misses_in_row"
        );
        let err = resolve_args(&["--handshake-timeout-ms", "99"]).unwrap_err();
        assert_eq!(err.field, "limits.handshake_timeout_ms");
        assert!(err.message.contains("100..=60000"), "{err}");
        assert_eq!(
            field_of(resolve_args(&["--handshake-timeout-ms", "60001"])),
            "limits.handshake_timeout_ms"
        );
    }

    #[test]
    fn wait_margin_is_0_to_900_ms() {
        let err = resolve_args(&["--wait-margin-ms", "901"]).unwrap_err();
        assert_eq!(err.field, "wait_margin_ms");
        assert!(err.message.contains("0..=900"), "{err}");
        let zero = resolve_args(&["--wait-margin-ms", "0"]).unwrap();
        assert_eq!(zero.settings.server.lock.wait_margin, Duration::ZERO);
        let max = resolve_args(&["--wait-margin-ms", "900"]).unwrap();
        assert_eq!(
            max.settings.server.lock.wait_margin,
            Duration::from_millis(900)
        );
    }

    #[test]
    fn worker_threads_default_to_one_and_are_1_to_256() {
        assert_eq!(resolve_args(&[]).unwrap().worker_threads, 1);
        let err = resolve_args(&["--worker-threads", "0"]).unwrap_err();
        assert_eq!(err.field, "worker_threads");
        assert!(err.message.contains("1..=256"), "{err}");
        assert_eq!(
            field_of(resolve_args(&["--worker-threads", "257"])),
            "worker_threads"
        );
        assert_eq!(
            resolve_args(&["--worker-threads", "4"])
                .unwrap()
                .worker_threads,
            4
        );
        let file = parse_file("worker_threads = 2").unwrap();
        let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
        assert_eq!(config.worker_threads, 2);
    }

    #[test]
    fn file_values_apply_and_flags_override_them() {
        let file = parse_file(
            r#"
            listen = "127.0.0.1:7000"
            log_level = "debug"
            wait_margin_ms = 250
            [limits]
            max_keys = 10
            max_waiters_per_key = 20
            max_waiters_total = 30
            max_connections = 40
            max_in_flight_per_connection = 50
            "#,
        )
        .unwrap();
        let config = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap();
        let server = &config.settings.server;
        assert_eq!(config.settings.listen, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(config.log_filter, "debug");
        assert_eq!(server.lock.wait_margin, Duration::from_millis(250));
        assert_eq!(server.lock.limits.max_keys, 10);
        assert_eq!(server.lock.limits.max_waiters_per_key, 20);
        assert_eq!(server.lock.limits.max_waiters_total, 30);
        assert_eq!(server.max_connections, 40);
        assert_eq!(server.max_in_flight_per_connection, 50);

        let flags = args(&[
            "--listen",
            "127.0.0.1:7001",
            "--log-level",
            "WARN",
            "--wait-margin-ms",
            "5",
            "--max-keys",
            "11",
            "--max-connections",
            "41",
        ]);
        let config = resolve(&file, None, &flags, &Env::default()).unwrap();
        let server = &config.settings.server;
        assert_eq!(config.settings.listen, "127.0.0.1:7001".parse().unwrap());
        assert_eq!(config.log_filter, "warn");
        assert_eq!(server.lock.wait_margin, Duration::from_millis(5));
        assert_eq!(server.lock.limits.max_keys, 11);
        assert_eq!(server.lock.limits.max_waiters_per_key, 20);
        assert_eq!(server.max_connections, 41);
    }

    #[test]
    fn file_limit_out_of_range_names_the_field() {
        let file = parse_file("[limits]\nmax_waiters_total = 0\n").unwrap();
        let err = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
        assert_eq!(err.field, "limits.max_waiters_total");
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_name() {
        for text in [
            "listen_addr = \"127.0.0.1:1\"",
            "[limits]\nmax_key = 1",
            "[tls]\ncertificate = \"x\"",
        ] {
            let err = parse_file(text).unwrap_err();
            assert_eq!(err.field, "--config");
            assert!(err.message.contains("unknown field"), "{err}");
            assert!(!err.message.contains('\n'), "not one line: {err}");
        }
        let err = parse_file("listen = 5").unwrap_err();
        assert!(err.message.contains("line 1"), "{err}");
    }

    #[test]
    fn log_level_is_checked_and_rust_log_is_used_below_the_flag() {
        assert_eq!(
            field_of(resolve_args(&["--log-level", "loud"])),
            "log_level"
        );
        let env = Env {
            client_tokens: None,
            rust_log: Some("ticketing_tokio=debug".to_owned()),
            ..Env::default()
        };
        let file = parse_file("log_level = \"error\"").unwrap();
        let config = resolve(&file, None, &ServeArgs::default(), &env).unwrap();
        assert_eq!(config.log_filter, "ticketing_tokio=debug");
        let config = resolve(&file, None, &args(&["--log-level", "trace"]), &env).unwrap();
        assert_eq!(config.log_filter, "trace");
        let bad_file = parse_file("log_level = \"verbose\"").unwrap();
        let err = resolve(&bad_file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
        assert_eq!(err.field, "log_level");
    }

    #[test]
    fn tls_needs_both_files() {
        let err = resolve_args(&["--tls-cert", "a.pem"]).unwrap_err();
        assert_eq!(err.field, "tls.key");
        let err = resolve_args(&["--tls-key", "a.pem"]).unwrap_err();
        assert_eq!(err.field, "tls.cert");
        let file = parse_file("[tls]\ncert = \"a.pem\"").unwrap();
        let err = resolve(&file, None, &ServeArgs::default(), &Env::default()).unwrap_err();
        assert_eq!(err.field, "tls.key");
    }

    #[test]
    fn tls_files_must_be_readable_and_parseable() {
        let dir = std::env::temp_dir().join(format!("ticketing-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not pem at all\n").unwrap();
        let missing = dir.join("missing.pem");

        let err = resolve_args(&[
            "--tls-cert",
            missing.to_str().unwrap(),
            "--tls-key",
            garbage.to_str().unwrap(),
        ])
        .unwrap_err();
        assert_eq!(err.field, "tls.cert");
        assert!(err.message.contains("cannot read"), "{err}");

        let err = resolve_args(&[
            "--tls-cert",
            garbage.to_str().unwrap(),
            "--tls-key",
            garbage.to_str().unwrap(),
        ])
        .unwrap_err();
        assert_eq!(err.field, "tls.cert");
        assert!(err.message.contains("no PEM certificate"), "{err}");

        // Relative paths in the file resolve against the file's folder.
        let file = parse_file("[tls]\ncert = \"missing.pem\"\nkey = \"garbage.pem\"").unwrap();
        let err = resolve(&file, Some(&dir), &ServeArgs::default(), &Env::default()).unwrap_err();
        assert_eq!(err.field, "tls.cert");
        assert!(err.message.contains(&*missing.to_string_lossy()), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn peer_tls_errors_name_their_field() {
        let dir = std::env::temp_dir().join(format!("ticketing-peer-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("garbage.pem"), "not pem at all\n").unwrap();
        let resolve_peer_tls = |table: &str| {
            let file = parse_file(&format!(
                "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n\
                 peer_tokens = [\"peer-token-0123456789\"]\n[cluster.peer_tls]\n{table}"
            ))
            .unwrap();
            resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default())
        };
        let all = "cert = \"missing.pem\"\nkey = \"garbage.pem\"\nca = \"garbage.pem\"\n";
        assert_eq!(
            field_of(resolve_peer_tls("cert = \"a.pem\"\nca = \"c.pem\"\n")),
            "cluster.peer_tls.key"
        );
        assert_eq!(
            field_of(resolve_peer_tls(all)),
            "cluster.peer_tls.server_name"
        );
        let err = resolve_peer_tls(&format!("{all}server_name = \"not a name\"\n")).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tls.server_name");
        // Relative paths resolve against the file's folder.
        let err = resolve_peer_tls(&format!("{all}server_name = \"peers\"\n")).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tls.cert");
        assert!(err.message.contains("cannot read"), "{err}");
        assert!(
            err.message
                .contains(&*dir.join("missing.pem").to_string_lossy()),
            "{err}"
        );
        let err = resolve_peer_tls(
            "cert = \"garbage.pem\"\nkey = \"garbage.pem\"\nca = \"garbage.pem\"\nserver_name = \"peers\"\n",
        )
        .unwrap_err();
        assert_eq!(err.field, "cluster.peer_tls.cert");
        assert!(err.message.contains("no PEM certificate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_key_and_pair_errors_name_their_table() {
        let dir = std::env::temp_dir().join(format!("ticketing-tls-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let leaf = rcgen::generate_simple_self_signed(["peers".to_owned()]).unwrap();
        std::fs::write(dir.join("cert.pem"), leaf.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), leaf.signing_key.serialize_pem()).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("other.pem"), other.serialize_pem()).unwrap();
        std::fs::write(dir.join("garbage.pem"), "not pem at all\n").unwrap();
        let cluster = format!(
            "[cluster]\nidentity = \"{IDENTITY}\"\nself_slot = 1\n\
             peer_tokens = [\"peer-token-0123456789\"]\n"
        );
        for (key, field_suffix) in [("garbage.pem", ".key"), ("other.pem", "")] {
            let text = format!("[tls]\ncert = \"cert.pem\"\nkey = \"{key}\"\n");
            let file = parse_file(&text).unwrap();
            let err = resolve(&file, Some(&dir), &args(&[]), &Env::default()).unwrap_err();
            assert_eq!(err.field, format!("tls{field_suffix}"), "{err}");
            let text = format!(
                "{cluster}[cluster.peer_tls]\ncert = \"cert.pem\"\nkey = \"{key}\"\n\
                 ca = \"cert.pem\"\nserver_name = \"peers\"\n"
            );
            let file = parse_file(&text).unwrap();
            let err = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap_err();
            assert_eq!(
                err.field,
                format!("cluster.peer_tls{field_suffix}"),
                "{err}"
            );
        }
        let text = format!(
            "{cluster}[cluster.peer_tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n\
             ca = \"garbage.pem\"\nserver_name = \"peers\"\n"
        );
        let file = parse_file(&text).unwrap();
        let err = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap_err();
        assert_eq!(err.field, "cluster.peer_tls.ca", "{err}");
        let text = text.replace("garbage.pem", "cert.pem");
        let file = parse_file(&text).unwrap();
        let config = resolve(&file, Some(&dir), &args(&SLOTS3), &Env::default()).unwrap();
        assert!(config.cluster.unwrap().peer_tls.is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_reports_a_missing_config_file() {
        let flags = args(&["--config", "/nonexistent/ticketing.toml"]);
        let err = load(&flags, &Env::default()).unwrap_err();
        assert_eq!(err.field, "--config");
        assert!(err.message.contains("/nonexistent/ticketing.toml"), "{err}");
    }
    #[test]
    fn state_dir_comes_from_flag_then_file_then_the_default_for_the_process() {
        let dir_of = |file: &FileConfig, argv: &[&str], env: &Env| {
            let config =
                resolve(file, Some(Path::new("/etc/ticketing")), &args(argv), env).unwrap();
            config
                .settings
                .state
                .expect("the binary always has a state directory")
                .dir
        };
        let none = FileConfig::default();
        let file = parse_file("state_dir = \"state\"").unwrap();
        let user = Env {
            home: Some("/home/u".into()),
            ..Env::default()
        };
        assert_eq!(
            dir_of(&file, &["--state-dir", "/srv/t"], &user),
            PathBuf::from("/srv/t")
        );
        // Relative to the config file, like the TLS paths.
        assert_eq!(
            dir_of(&file, &[], &user),
            PathBuf::from("/etc/ticketing/state")
        );
        assert_eq!(
            dir_of(&none, &[], &user),
            PathBuf::from("/home/u/.local/state/ticketing")
        );
        let xdg = Env {
            xdg_state_home: Some("/x".into()),
            ..user.clone()
        };
        assert_eq!(dir_of(&none, &[], &xdg), PathBuf::from("/x/ticketing"));
        let root = Env {
            is_root: true,
            ..xdg.clone()
        };
        assert_eq!(
            dir_of(&none, &[], &root),
            PathBuf::from("/var/lib/ticketing")
        );
        // systemd's StateDirectory= wins over every default (first entry).
        let systemd = Env {
            state_directory: Some("/var/lib/tk:/var/lib/other".into()),
            ..root.clone()
        };
        assert_eq!(dir_of(&none, &[], &systemd), PathBuf::from("/var/lib/tk"));
        assert_eq!(
            dir_of(&none, &[], &Env::default()),
            PathBuf::from("/var/lib/ticketing")
        );
        // Cluster nodes use the same folder.
        let mut argv = cluster_args(&SLOTS3);
        argv.extend(["--state-dir".to_owned(), "/srv/c".to_owned()]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let config = resolve_args(&argv).unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(cluster.state.unwrap().dir, PathBuf::from("/srv/c"));
    }
}
