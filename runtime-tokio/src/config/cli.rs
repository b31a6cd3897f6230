//! The `ticketing` command line: subcommands and their flags (clap).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::defaults::DEFAULT_LISTEN;
use super::file::FileLimits;

/// The `ticketing` command line.
#[derive(Debug, Parser)]
#[command(
    name = "ticketing",
    version = env!("TICKETING_VERSION_LONG"),
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
    /// Run a command while leader of an election, or follow who leads.
    #[command(after_help = ELECT_AFTER_HELP)]
    Elect(ElectArgs),
    /// Load-generate against a server with the built-in client.
    #[command(after_help = BENCH_AFTER_HELP)]
    Bench(BenchArgs),
    /// Print a fresh random cluster identity (64 lowercase hex digits).
    Identity,
    /// Print a fresh random token (32 bytes from the OS CSPRNG as 64
    /// lowercase hex digits), for a peer, client or admin token.
    Token,
    /// Inspect and force-release locks through a node's admin listener.
    #[command(subcommand)]
    Locks(LocksCommand),
    /// Readiness and counts of each node, from its admin listener.
    Status(AdminArgs),
    /// Print a shell completion script: `ticketing completions bash >
    /// /etc/bash_completion.d/ticketing`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `ticketing man > ticketing.1`.
    Man,
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
    /// The lock was lost while the command ran (its lease was about to
    /// lapse): the command was stopped.
    pub const LOST: u8 = 76;
    /// The server rejected the client token.
    pub const AUTH: u8 = 77;
    /// The command could not be started.
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

const LOCK_AFTER_HELP: &str = "\
The command runs in its own process group with TICKETING_KEY (the key),
TICKETING_TOKEN (the fencing token: strictly increasing; reject writes carrying
a token not above the last one seen) and TICKETING_DEADLINE_UNIX_MS (when the
lock may be lost, by this machine's clock, in ms since the Unix epoch: check it
before a critical write) in its environment. The lock is released when it
exits. Without --renew the lease is not renewed: before it could lapse the
command's process group gets SIGTERM, SIGKILL --kill-after later (still before
the lease ends), and the exit status is 76. With --renew it is renewed every
third of the lease, and the command is stopped the same way if renewal fails,
the --max-hold cap is reached, or (with --progress-timeout) the command shows
no life. If an operator force-releases the lock, the command is stopped within
about a second (SIGTERM, SIGKILL at most a second later), exit status 76.
TICKETING_DEADLINE_FILE names a file holding the current deadline (as
TICKETING_DEADLINE_UNIX_MS, rewritten as renewals move it). The command also
ends if this CLI dies (Linux).
--no-kill only warns instead, and leaves the command in this process group
(where it may read the terminal: an interactive command needs it). A paused or frozen CLI stops nothing: fencing at the
storage is the guarantee, stopping the command the courtesy.

Exit status: the command's own (128+N if killed by signal N), or
   2  bad usage          69  cannot connect       70  internal/protocol error
  73  server busy        74  indeterminate        75  timed out waiting
  76  lock lost, command stopped                  77  auth rejected
 126  command not runnable                       127  command not found";

const BENCH_AFTER_HELP: &str = "\
Exit status: 0, or 1 when the run finished but some operations failed; a run
that could not start exits as `ticketing lock` does:
   2  bad usage          69  cannot connect       70  internal/protocol error
  73  server busy        74  indeterminate        75  timed out waiting
  77  auth rejected";

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
    /// How long to wait for the lock (0 = one immediate try), at most 255s;
    /// also how long to keep trying to connect (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Lease: the server frees the key after this even if we do not, 1s..=250s.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Lease that must remain when the command starts.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub budget: Duration,
    /// Between SIGTERM and SIGKILL of a command stopped before its lease
    /// lapses; shortened to fit, SIGKILL always comes before the lease ends.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub kill_after: Duration,
    /// Do not stop the command when its lease is about to lapse: only warn
    /// (the lock then no longer excludes others while it runs). The command
    /// stays in this process group, so it may read the terminal.
    #[arg(long)]
    pub no_kill: bool,
    /// Renew the lease every third of it while the command runs (by exact
    /// token: a lost lock is never renewed back). Needs a server that
    /// renews leases.
    #[arg(long)]
    pub renew: bool,
    /// A cap on the whole hold, however often renewed (at most what the
    /// server allows, by default a day): at the cap the command is stopped
    /// like at a lapsing lease. Needs a server that renews leases.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_hold: Option<Duration>,
    /// Take permits of the FIFO semaphore KEY, which has this many numbered
    /// slots (1..=1024), instead of the lock KEY: at most N commands hold
    /// one at a time. The slots taken are in $TICKETING_SLOTS. Every user
    /// of the semaphore must give the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub semaphore: Option<u16>,
    /// Hold KEY shared: other --shared holders run at the same time, while
    /// an exclusive holder waits for all of them (and a --shared run queued
    /// behind a waiting exclusive one waits behind it). Needs a server of
    /// this version (single or cluster). $TICKETING_MODE says `shared`.
    #[arg(long, conflicts_with = "semaphore")]
    pub shared: bool,
    /// With --semaphore: how many permits (slots) this command takes at
    /// once, 1..=16 and at most N.
    #[arg(long, value_name = "K", requires = "semaphore", value_parser = clap::value_parser!(u8).range(1..=16))]
    pub permits: Option<u8>,
    /// With --renew: renew only while the command showed life within this
    /// long, by sending a datagram to the socket named by $TICKETING_NOTIFY
    /// (e.g. `printf 1 | socat - UNIX-SENDTO:$TICKETING_NOTIFY`) or
    /// by touching the file named by $TICKETING_PROGRESS_FILE.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "renew")]
    pub progress_timeout: Option<Duration>,
    /// The label naming this holder to operators in `ticketing locks`
    /// (at most 64 bytes); default `ticketing-lock/PID`.
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Use TLS, verifying the server against this PEM CA file.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_system_roots")]
    pub tls_ca: Option<PathBuf>,
    /// Use TLS, verifying the server against the system trust store.
    #[arg(long)]
    pub tls_system_roots: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
    /// Campaign for the election KEY instead of locking it (set by
    /// `ticketing elect`): queue until leader, however long it takes.
    #[arg(skip)]
    pub campaign: bool,
}

const ELECT_AFTER_HELP: &str = "\
The election NAME is a lock key: its holder leads, and the holder's fencing
token is the term (every later leader has a larger one). CMD runs while
this process leads, with $TICKETING_TERM (= $TICKETING_TOKEN) and the other
variables of `ticketing lock`; the lease is renewed meanwhile, and CMD is
stopped if leadership is lost. When CMD exits, this process resigns and the
next candidate leads at once. A leader that dies leads until its lease ends.

  ticketing elect scheduler --label host-a -- ./run-scheduler
  ticketing elect scheduler --observe

With --observe it prints `leader LABEL term T` (or `no leader`) and a new
line whenever that changes, until interrupted. Needs a server of this
version (single or cluster). Exit codes as for `ticketing lock`.";

/// Options of `ticketing elect`.
#[derive(Debug, Clone, Args)]
pub struct ElectArgs {
    /// The election's name: a lock key (1-128 bytes, no space, CR or LF).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Server address HOST:PORT.
    #[arg(long = "addr", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub addrs: Vec<String>,
    /// Client token (at least 16 bytes); default $TICKETING_CLIENT_TOKEN, or
    /// none for a loopback server without authentication.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The label observers see for this candidate while it leads (at most
    /// 64 bytes); default `ticketing-elect/PID`.
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Lease of the leadership, renewed every third of it while CMD runs:
    /// a leader that dies leads this long at most. 3s..=250s, whole seconds.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Between SIGTERM and SIGKILL of a CMD stopped before the lease lapses.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub kill_after: Duration,
    /// Print who leads, and again on every change, instead of campaigning.
    #[arg(long, conflicts_with = "command")]
    pub observe: bool,
    /// With --observe: how often to ask the server, 100ms..=60s.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration, requires = "observe")]
    pub interval: Duration,
    /// Use TLS, verifying the server against this PEM CA file.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_system_roots")]
    pub tls_ca: Option<PathBuf>,
    /// Use TLS, verifying the server against the system trust store.
    #[arg(long)]
    pub tls_system_roots: bool,
    /// The command and its arguments (not with --observe).
    #[arg(last = true, required_unless_present = "observe", value_name = "CMD")]
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
    /// Client connections the tasks are spread over, round robin, each its
    /// own broker. Default: one per core against a single server (the
    /// client works on one connection's replies while the server answers
    /// another's requests), one against a cluster (whose leader answers each
    /// connection's batch with appends of its own, so more connections cost
    /// it CPU without adding throughput).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: Option<u16>,
    /// The server's process id, for its CPU time per operation (repeatable:
    /// a cluster's nodes are summed). Default: the processes listening on
    /// the loopback addresses given, when /proc shows them.
    #[arg(long = "server-pid", value_name = "PID")]
    pub server_pids: Vec<u32>,
    /// Measure renewals instead of pairs: each task acquires a key of its
    /// own (no contention), renews it with `--lease` until `--ops`
    /// renewals are done in all, then releases it. Reports renewals/s and
    /// the CPU per renewal.
    #[arg(long)]
    pub extend: bool,
    /// Take one permit of a FIFO semaphore of N slots per pair instead of a
    /// lock: the `--keys` keys name the semaphores. Reports permits/s and
    /// the CPU per permit acquire+release.
    #[arg(long, value_name = "N", conflicts_with = "extend", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub semaphore: Option<u16>,
    /// Take each key shared instead of exclusive (a server that negotiates
    /// shared locks): the tasks on a key share it, so nothing waits.
    /// Reports shared grants/s and the CPU per shared acquire+release.
    #[arg(long, conflicts_with_all = ["extend", "semaphore"])]
    pub shared: bool,
}

/// Environment variable with the client token of `lock` and `bench`.
pub const ENV_CLIENT_TOKEN: &str = "TICKETING_CLIENT_TOKEN";

/// Parses `500ms`, `5s`, `2m` (a whole number and a unit), or `0`. Errors
/// do not repeat the text: see [`flag_value_error`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const ACCEPTED: &str =
        "expected a number with a unit: 500ms, 1.5s, 2m (fractions allowed; 0 alone is zero)";
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(ACCEPTED.to_owned());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| ACCEPTED.to_owned())?
    };
    // The fraction as nanoseconds of one unit: at most 9 digits count.
    let digits = fraction.len().min(9);
    let fraction_nanos: u64 = if digits == 0 {
        0
    } else {
        fraction[..digits]
            .parse::<u64>()
            .map_err(|_| ACCEPTED.to_owned())?
            * 10u64.pow(9 - digits as u32)
    };
    let unit_nanos: u64 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "" if whole == 0 && fraction_nanos == 0 => return Ok(Duration::ZERO),
        "" => return Err(format!("a unit is needed: {ACCEPTED}")),
        _ => return Err(format!("the unit must be ms, s or m ({ACCEPTED})")),
    };
    let nanos = u128::from(whole) * u128::from(unit_nanos)
        + u128::from(fraction_nanos) * u128::from(unit_nanos) / 1_000_000_000;
    u64::try_from(nanos / 1_000_000_000)
        .map(|secs| Duration::new(secs, (nanos % 1_000_000_000) as u32))
        .map_err(|_| "too long".to_owned())
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
    /// A `Host` (NAME:PORT) the admin listener serves besides its own
    /// address (IP:PORT, and localhost:PORT on loopback); repeat for
    /// more. Any other Host is refused 421, so that a web page whose name
    /// was rebound to this machine cannot read the admin API.
    #[arg(long = "admin-allowed-host", value_name = "NAME:PORT")]
    pub admin_allowed_hosts: Vec<String>,
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
    /// Pending connections each client and peer listener queues before
    /// the kernel drops new ones, 1..=65535 (default 128; Linux caps it
    /// at net.core.somaxconn).
    #[arg(long, value_name = "N")]
    pub listen_backlog: Option<u64>,
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
    /// Raft timing: `default` (failover 2.3-2.5 s) or `fast` (under 0.5 s,
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
    /// Recover a cluster that lost a majority of its nodes, under the same
    /// identity: start every slot whose state file survived with this
    /// flag. Refused (exit 2) while old nodes still run or when this
    /// slot has no token floor file (see docs/cluster.md, "Losing the
    /// majority").
    #[arg(long, conflicts_with = "bootstrap")]
    pub recover: bool,
    /// With --recover: a token at or above every token this fencing
    /// domain ever issued, for a slot whose state file is lost.
    #[arg(long, value_name = "N")]
    pub token_floor: Option<u64>,
    /// Folder of the token-floor state file, created if missing (default:
    /// $STATE_DIRECTORY, else /var/lib/ticketing as root, else
    /// $XDG_STATE_HOME/ticketing or ~/.local/state/ticketing).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Start even if the state directory, or a folder above it, could be
    /// changed by another user (group- or world-writable, or owned by
    /// someone other than this user or root). Such a user could make the
    /// server overwrite files or roll fencing tokens back.
    #[arg(long)]
    pub state_dir_insecure_ok: bool,
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

/// A flag's bad value in plain words: the flag, and what it takes; `None`
/// for a command-line error that is not about a value (clap's own message
/// is right for those). clap's own message quotes the value, and a value
/// may be a secret given to the wrong flag (`--max-keys` followed by a
/// token meant for the flag before it), so the value is never shown.
pub fn flag_value_error(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        error.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    // `--max-keys <N>`: the flag, then the name of its value.
    let arg = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.as_str(),
        _ => "",
    };
    let (flag, value_name) = arg.split_once(' ').unwrap_or((arg, ""));
    let source = std::error::Error::source(error).map(ToString::to_string);
    // clap's range check says `{value} is not in {range}`.
    let range = source
        .as_deref()
        .and_then(|source| source.split_once("is not in "))
        .map_or_else(String::new, |(_, range)| format!(" in {range}"));
    let wanted = match value_name {
        "<N>" => format!("a whole number{range}"),
        "<MS>" => "a whole number of milliseconds".to_owned(),
        "<S>" => "a whole number of seconds".to_owned(),
        _ => match (error.get(ContextKind::ValidValue), source) {
            (Some(ContextValue::Strings(valid)), _) => format!("one of {}", valid.join(", ")),
            (_, Some(source)) => source,
            _ => "a different value".to_owned(),
        },
    };
    let wanted = wanted.strip_prefix("expected ").unwrap_or(&wanted);
    Some(format!(
        "flag `{flag}`: expected {wanted} (the value given is not shown)"
    ))
}
