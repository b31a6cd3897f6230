//! Defaults, bounds and environment variable names of the serve config.

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
/// Largest accepted `listen_backlog` (Linux caps it lower, at
/// `net.core.somaxconn`, by itself).
pub const LISTEN_BACKLOG_MAX: u64 = 65_535;
/// Accepted values of `log_level`.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Inclusive upper bounds of the `[limits]` fields. They keep a typo (an
/// extra digit or three) from turning into an unbounded memory promise.
pub const MAX_KEYS_MAX: u64 = 100_000_000;
/// Upper bound of `waiters_per_key_max`.
pub const MAX_WAITERS_PER_KEY_MAX: u64 = 1_000_000;
/// Upper bound of `waiters_total_max`.
pub const MAX_WAITERS_TOTAL_MAX: u64 = 100_000_000;
/// Upper bound of `connections_max`.
pub const MAX_CONNECTIONS_MAX: u64 = 1_000_000;
/// Upper bound of `in_flight_per_connection_max`.
pub const MAX_IN_FLIGHT_PER_CONNECTION_MAX: u64 = 1_000_000;
/// Upper bound of `handshakes_max` and `handshakes_per_source_max`.
pub const MAX_HANDSHAKES_MAX: u64 = 1_000_000;
/// Upper bound of `peer_handshakes_max` and `peer_handshakes_per_source_max`.
pub const MAX_PEER_HANDSHAKES_MAX: u64 = 1_000;
/// Upper bound of `held_per_connection_max`.
pub const MAX_HELD_PER_CONNECTION_MAX: u64 = 100_000_000;
/// Upper bound of `release_misses_in_row_max`.
pub const MAX_RELEASE_MISSES_IN_ROW_MAX: u64 = 1_000_000;
/// Bounds of `handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_MIN: u64 = 100;
/// Upper bound of `handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_MAX: u64 = 60_000;
