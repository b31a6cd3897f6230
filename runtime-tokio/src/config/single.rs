//! Merging flags, environment and file into one [`Config`]: the single-mode
//! settings every node needs, then the cluster half when asked for.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ticketing_core::admin::AdminTokens;
use ticketing_core::auth::ClientTokens;
use ticketing_core::budget::BudgetConfig;
use ticketing_core::lock::{HoldCaps, Limits, LockConfig};
use ticketing_core::server::ServerConfig;

use super::auth::{check_admin_listen_auth, check_listen_auth, pick_tokens, resolve_admin_tokens};
use super::cli::ServeArgs;
use super::cluster::resolve_cluster;
use super::defaults::*;
use super::env::Env;
use super::error::{ConfigError, check_range, parse_addr};
use super::file::{FileConfig, FileLimits, in_file_dir, parse_file};
use super::secret::{LooseSecretFile, loose_secret_files};
use super::tls_files::resolve_tls;
use crate::cluster::ClusterSettings;
use crate::serve::{DEFAULT_LISTEN_BACKLOG, ServeSettings};
use crate::state::StateSettings;

/// How log lines are written (`log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
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
    /// Files holding secrets that group or others may read: warned about
    /// once logging is up.
    pub loose_secret_files: Vec<LooseSecretFile>,
}

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

/// Merges file, environment and flags and validates the result. `file_dir`
/// is the config file's folder, against which its relative TLS paths are
/// resolved.
///
/// The steps run in a fixed order, so a config with several faults is
/// always answered with the same first one.
pub fn resolve(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
) -> Result<Config, ConfigError> {
    let listen = resolve_listen(file, args)?;
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
    let has_client_tokens = !tokens.values.is_empty();
    let insecure_no_auth = args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false);
    let server = resolve_server(file, args, client_tokens)?;
    let worker_threads = check_range(
        "worker_threads",
        args.worker_threads.or(file.worker_threads).unwrap_or(1),
        1,
        WORKER_THREADS_MAX,
    )?;
    let listen_backlog = check_range(
        "listen_backlog",
        args.listen_backlog
            .or(file.listen_backlog)
            .unwrap_or(u64::from(DEFAULT_LISTEN_BACKLOG)),
        1,
        LISTEN_BACKLOG_MAX,
    )?;
    // In range, so it fits.
    let listen_backlog = u32::try_from(listen_backlog).unwrap_or(u32::MAX);
    let tls = resolve_tls(file, file_dir, args)?;
    let log_filter = resolve_log_filter(file, args, env)?;
    let log_format = resolve_log_format(file, args)?;
    let admin = resolve_admin(file, file_dir, args, env)?;
    let mut state = StateSettings::new(resolve_state_dir(file, file_dir, args, env));
    state.dir_insecure_ok =
        args.state_dir_insecure_ok || file.state_dir_insecure_ok.unwrap_or(false);
    let cluster = if cluster_mode(file, args) {
        let mut cluster = resolve_cluster(file, file_dir, args, env, &server, tls.clone())?;
        check_cluster_listen(
            file,
            args,
            listen,
            &cluster,
            has_client_tokens,
            insecure_no_auth,
        )?;
        cluster.state = Some(state.clone());
        cluster.admin_listen = admin.listen;
        cluster.admin_tokens = admin.tokens.clone();
        cluster.admin_allowed_hosts = admin.allowed_hosts.clone();
        cluster.listen_backlog = listen_backlog;
        Some(cluster)
    } else {
        check_listen_auth(listen, has_client_tokens, insecure_no_auth)?;
        None
    };
    let mut settings = ServeSettings::new(cluster.as_ref().map_or(listen, |c| c.client_listen));
    settings.server = server;
    settings.tls = tls;
    settings.state = Some(state);
    settings.admin_listen = admin.listen;
    settings.admin_tokens = admin.tokens;
    settings.admin_allowed_hosts = admin.allowed_hosts;
    settings.listen_backlog = listen_backlog;
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
        loose_secret_files: loose_secret_files(file, file_dir, args),
    })
}

/// The client listen address: the flag, else the file, else the default.
fn resolve_listen(file: &FileConfig, args: &ServeArgs) -> Result<SocketAddr, ConfigError> {
    let listen_text = args
        .listen
        .as_deref()
        .or(file.listen.as_deref())
        .unwrap_or(DEFAULT_LISTEN);
    listen_text.parse().map_err(|_| {
        ConfigError::new(
            "listen",
            format!("expected IP:PORT such as {DEFAULT_LISTEN} or [::1]:5225, got {listen_text:?}"),
        )
    })
}

/// Where a `[limits]` value comes from: its `--max-*` flag, else the
/// file's table.
struct LimitSource<'a> {
    flags: &'a FileLimits,
    file: FileLimits,
}

impl LimitSource<'_> {
    /// The flag, else the `[limits]` field, if either is given.
    fn given(&self, pick: fn(&FileLimits) -> Option<u64>) -> Option<u64> {
        pick(self.flags).or(pick(&self.file))
    }

    /// The flag, else the `[limits]` field, else `default`; in 1..=max.
    fn pick(
        &self,
        name: &str,
        pick: fn(&FileLimits) -> Option<u64>,
        default: usize,
        max: u64,
    ) -> Result<usize, ConfigError> {
        let value = self.given(pick).unwrap_or(default as u64);
        check_range(&format!("limits.{name}"), value, 1, max)
    }
}

/// The server's config: the `[limits]`, `wait_margin_ms` and the client
/// tokens already checked.
fn resolve_server(
    file: &FileConfig,
    args: &ServeArgs,
    client_tokens: ClientTokens,
) -> Result<ServerConfig, ConfigError> {
    let limits = LimitSource {
        flags: &args.limits,
        file: file.limits.clone().unwrap_or_default(),
    };
    let defaults = ServerConfig::default();
    let lock_limits = resolve_lock_limits(&limits, &defaults.lock.limits)?;
    let connections_max = limits.pick(
        "max_connections",
        |l| l.max_connections,
        defaults.connections_max,
        MAX_CONNECTIONS_MAX,
    )?;
    let in_flight_per_connection_max = limits.pick(
        "max_in_flight_per_connection",
        |l| l.max_in_flight_per_connection,
        defaults.in_flight_per_connection_max,
        MAX_IN_FLIGHT_PER_CONNECTION_MAX,
    )?;
    let budget = resolve_budget(&limits, connections_max)?;
    let default_handshake_ms =
        u64::try_from(defaults.handshake_timeout.as_millis()).unwrap_or(u64::MAX);
    let handshake_timeout_ms = check_range(
        "limits.handshake_timeout_ms",
        limits
            .given(|l| l.handshake_timeout_ms)
            .unwrap_or(default_handshake_ms),
        HANDSHAKE_TIMEOUT_MS_MIN,
        HANDSHAKE_TIMEOUT_MS_MAX,
    )?;
    let default_margin_ms = u64::try_from(defaults.lock.wait_margin.as_millis()).unwrap_or(0);
    let wait_margin_ms = check_range(
        "wait_margin_ms",
        args.wait_margin_ms
            .or(file.wait_margin_ms)
            .unwrap_or(default_margin_ms),
        0,
        WAIT_MARGIN_MS_MAX,
    )?;
    let hold_caps = resolve_hold_caps(&limits, &defaults.hold_caps)?;
    Ok(ServerConfig {
        hold_caps,
        lock: LockConfig {
            limits: lock_limits,
            wait_margin: Duration::from_millis(wait_margin_ms as u64),
            ..defaults.lock
        },
        connections_max,
        in_flight_per_connection_max,
        handshake_timeout: Duration::from_millis(handshake_timeout_ms as u64),
        client_tokens,
        budget,
        ..defaults
    })
}

/// The caps on total hold of renewing clients' grants: each 1 s..=30 days,
/// the default not above the limit.
fn resolve_hold_caps(limits: &LimitSource, defaults: &HoldCaps) -> Result<HoldCaps, ConfigError> {
    const HOLD_S_MAX: u64 = 30 * 24 * 3_600;
    let limit_s = check_range(
        "limits.max_hold_limit_s",
        limits
            .given(|l| l.max_hold_limit_s)
            .unwrap_or(defaults.limit.as_secs()),
        1,
        HOLD_S_MAX,
    )? as u64;
    let default_s = check_range(
        "limits.max_hold_default_s",
        limits
            .given(|l| l.max_hold_default_s)
            .unwrap_or(defaults.default.as_secs().min(limit_s)),
        1,
        HOLD_S_MAX,
    )? as u64;
    if default_s > limit_s {
        return Err(ConfigError::new(
            "limits.max_hold_default_s",
            format!("{default_s} is above limits.max_hold_limit_s ({limit_s})"),
        ));
    }
    Ok(HoldCaps {
        default: Duration::from_secs(default_s),
        limit: Duration::from_secs(limit_s),
    })
}

/// The lock table's limits (`keys_max`, `waiters_per_key_max`,
/// `waiters_total_max`).
fn resolve_lock_limits(limits: &LimitSource, defaults: &Limits) -> Result<Limits, ConfigError> {
    Ok(Limits {
        keys_max: limits.pick("max_keys", |l| l.max_keys, defaults.keys_max, MAX_KEYS_MAX)?,
        waiters_per_key_max: limits.pick(
            "max_waiters_per_key",
            |l| l.max_waiters_per_key,
            defaults.waiters_per_key_max,
            MAX_WAITERS_PER_KEY_MAX,
        )?,
        waiters_total_max: limits.pick(
            "max_waiters_total",
            |l| l.max_waiters_total,
            defaults.waiters_total_max,
            MAX_WAITERS_TOTAL_MAX,
        )?,
    })
}

/// The per-source budgets; their defaults follow `connections_max`.
fn resolve_budget(
    limits: &LimitSource,
    connections_max: usize,
) -> Result<BudgetConfig, ConfigError> {
    let budget_defaults = BudgetConfig::for_connections_max(connections_max);
    let handshakes_max = limits.pick(
        "max_handshakes",
        |l| l.max_handshakes,
        budget_defaults.handshakes_max,
        MAX_HANDSHAKES_MAX,
    )?;
    let handshakes_per_source_max = limits.pick(
        "max_handshakes_per_source",
        |l| l.max_handshakes_per_source,
        (handshakes_max / 2).max(1),
        MAX_HANDSHAKES_MAX,
    )?;
    let peer_handshakes_max = limits.pick(
        "max_peer_handshakes",
        |l| l.max_peer_handshakes,
        budget_defaults.peer_handshakes_max,
        MAX_PEER_HANDSHAKES_MAX,
    )?;
    let peer_handshakes_per_source_max = limits.pick(
        "max_peer_handshakes_per_source",
        |l| l.max_peer_handshakes_per_source,
        budget_defaults.peer_handshakes_per_source_max,
        MAX_PEER_HANDSHAKES_MAX,
    )?;
    let held_per_connection_max = limits.pick(
        "max_held_per_connection",
        |l| l.max_held_per_connection,
        budget_defaults.held_per_connection_max,
        MAX_HELD_PER_CONNECTION_MAX,
    )?;
    let release_misses_in_row_max = check_range(
        "limits.max_release_misses_in_row",
        limits
            .given(|l| l.max_release_misses_in_row)
            .unwrap_or(u64::from(budget_defaults.release_misses_in_row_max)),
        0,
        MAX_RELEASE_MISSES_IN_ROW_MAX,
    )?;
    Ok(BudgetConfig {
        handshakes_max,
        handshakes_per_source_max,
        peer_handshakes_max,
        peer_handshakes_per_source_max,
        held_per_connection_max,
        release_misses_in_row_max: u32::try_from(release_misses_in_row_max).unwrap_or(u32::MAX),
        ..budget_defaults
    })
}

/// `log_format`: the flag, else the file; text unless `json`.
fn resolve_log_format(file: &FileConfig, args: &ServeArgs) -> Result<LogFormat, ConfigError> {
    match args
        .log_format
        .as_deref()
        .or(file.log_format.as_deref())
        .map(|text| text.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("text") => Ok(LogFormat::Text),
        Some("json") => Ok(LogFormat::Json),
        Some(other) => Err(ConfigError::new(
            "log_format",
            format!("{other:?} is not one of text, json"),
        )),
    }
}

/// The admin listener and its tokens, as checked together.
struct AdminListen {
    listen: Option<SocketAddr>,
    tokens: AdminTokens,
    allowed_hosts: Vec<Box<str>>,
}

/// The admin listener (off unless set), its tokens, and our rule for a
/// non-loopback one.
fn resolve_admin(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
    env: &Env,
) -> Result<AdminListen, ConfigError> {
    let listen = args
        .admin_listen
        .as_deref()
        .or(file.admin_listen.as_deref())
        .map(|text| parse_addr("admin_listen", text))
        .transpose()?;
    let tokens = resolve_admin_tokens(file, file_dir, args, env)?;
    let insecure_admin_no_auth =
        args.insecure_admin_no_auth || file.insecure_admin_no_auth.unwrap_or(false);
    if let Some(admin) = listen {
        check_admin_listen_auth(admin, !tokens.is_empty(), insecure_admin_no_auth)?;
    }
    let named = if args.admin_allowed_hosts.is_empty() {
        file.admin_allowed_hosts.as_deref().unwrap_or_default()
    } else {
        &args.admin_allowed_hosts
    };
    let allowed_hosts = named
        .iter()
        .map(|host| {
            let valid = host.rsplit_once(':').is_some_and(|(name, port)| {
                !name.is_empty()
                    && name.len() <= 253
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b))
                    && port.parse::<u16>().is_ok()
            });
            if valid {
                Ok(Box::from(host.as_str()))
            } else {
                Err(ConfigError::new(
                    "admin_allowed_hosts",
                    format!("{host:?} is not NAME:PORT (a host name or address, then its port)"),
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(AdminListen {
        listen,
        tokens,
        allowed_hosts,
    })
}

/// Cluster mode: a `listen` given must be this slot's client address, and
/// that address follows the client-token rule (named after the slot).
fn check_cluster_listen(
    file: &FileConfig,
    args: &ServeArgs,
    listen: SocketAddr,
    cluster: &ClusterSettings,
    has_client_tokens: bool,
    insecure_no_auth: bool,
) -> Result<(), ConfigError> {
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
    check_listen_auth(cluster.client_listen, has_client_tokens, insecure_no_auth).map_err(|e| {
        ConfigError::new(
            format!("cluster.slots[{}].client", cluster.node.id.slot),
            e.message,
        )
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
        || args.recover
        || args.token_floor.is_some()
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
