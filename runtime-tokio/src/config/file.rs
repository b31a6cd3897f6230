//! The config file as written: every table and field optional, unknown
//! fields refused.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;
use toml::{Table, Value};

use super::error::ConfigError;
use super::secret;

/// The config file, as written. Every field is optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See [`ServeArgs::listen`](super::ServeArgs::listen).
    pub listen: Option<String>,
    /// See [`ServeArgs::client_tokens`](super::ServeArgs::client_tokens).
    #[serde(default, deserialize_with = "secret::client_tokens")]
    pub client_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::insecure_no_auth`](super::ServeArgs::insecure_no_auth).
    pub insecure_no_auth: Option<bool>,
    /// See [`ServeArgs::log_level`](super::ServeArgs::log_level).
    pub log_level: Option<String>,
    /// See [`ServeArgs::log_format`](super::ServeArgs::log_format).
    pub log_format: Option<String>,
    /// See [`ServeArgs::admin_listen`](super::ServeArgs::admin_listen).
    pub admin_listen: Option<String>,
    /// See [`ServeArgs::admin_allowed_hosts`](super::ServeArgs::admin_allowed_hosts).
    pub admin_allowed_hosts: Option<Vec<String>>,
    /// Accepted admin tokens, each at least 16 bytes.
    #[serde(default, deserialize_with = "secret::admin_tokens")]
    pub admin_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::admin_token_file`](super::ServeArgs::admin_token_file); relative to the config file.
    pub admin_token_file: Option<PathBuf>,
    /// See [`ServeArgs::insecure_admin_no_auth`](super::ServeArgs::insecure_admin_no_auth).
    pub insecure_admin_no_auth: Option<bool>,
    /// See [`ServeArgs::wait_margin_ms`](super::ServeArgs::wait_margin_ms).
    pub wait_margin_ms: Option<u64>,
    /// See [`ServeArgs::worker_threads`](super::ServeArgs::worker_threads).
    pub worker_threads: Option<u64>,
    /// See [`ServeArgs::listen_backlog`](super::ServeArgs::listen_backlog).
    pub listen_backlog: Option<u64>,
    /// See [`ServeArgs::state_dir`](super::ServeArgs::state_dir); relative to the config file.
    pub state_dir: Option<PathBuf>,
    /// See [`ServeArgs::state_dir_insecure_ok`](super::ServeArgs::state_dir_insecure_ok).
    pub state_dir_insecure_ok: Option<bool>,
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
    /// See [`ServeArgs::cluster_identity`](super::ServeArgs::cluster_identity).
    pub identity: Option<String>,
    /// See [`ServeArgs::self_slot`](super::ServeArgs::self_slot).
    pub self_slot: Option<u64>,
    /// `[[cluster.slots]]`: 3 or 5, in slot order.
    pub slots: Option<Vec<FileSlot>>,
    /// See [`ServeArgs::peer_tokens`](super::ServeArgs::peer_tokens).
    #[serde(default, deserialize_with = "secret::peer_tokens")]
    pub peer_tokens: Option<Vec<String>>,
    /// See [`ServeArgs::profile`](super::ServeArgs::profile).
    pub profile: Option<String>,
    /// See [`ServeArgs::status_listen`](super::ServeArgs::status_listen).
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
/// ([`ServeArgs::limits`](super::ServeArgs::limits)). Each is checked against 1 and its `*_MAX`.
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
    /// The cap on total hold, in seconds, of a grant to a client that can
    /// renew (ours) and named no cap (default 3600: an hour). Other
    /// clients' grants are bounded by their lease of at most 250 s.
    #[arg(long, value_name = "S")]
    pub max_hold_default_s: Option<u64>,
    /// The largest cap on total hold, in seconds, a client may name; a
    /// larger one is cut to it (default 86400: a day).
    #[arg(long, value_name = "S")]
    pub max_hold_limit_s: Option<u64>,
}

/// Parses config file text. Unknown fields are errors. Every error names
/// the field at fault (`--config` for TOML that does not parse), and an
/// error about a value never shows the value: it may be a secret pasted
/// into the wrong field.
pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        // toml's own Display spans several lines (with a source snippet); keep
        // the message on one line and point at the line instead.
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count());
        let at = line.map_or_else(String::new, |line| format!(" (at line {})", line + 1));
        match toml::from_str::<Table>(text) {
            // Valid TOML: a value of the wrong kind, or an unknown field.
            Ok(table) => match first_wrong_field(&table) {
                Some(wrong) => ConfigError::new(wrong.field, format!("{}{at}", wrong.message)),
                // Not found field by field: say where, not what.
                None => ConfigError::new("--config", format!("a value of the wrong kind{at}")),
            },
            Err(_) => syntax_error(text, line, e.message().trim()),
        }
    })
}

/// Text that is not TOML: the error names the line, and the secret field
/// whose value the line lies in, if any, instead of toml's message.
fn syntax_error(text: &str, line: Option<usize>, message: &str) -> ConfigError {
    let location = line.map_or_else(String::new, |line| format!(" at line {}", line + 1));
    if let Some(field) = line.and_then(|line| secret::hides_line(text, line)) {
        return ConfigError::new(
            field,
            format!("invalid TOML{location}: {}", secret::NOT_SHOWN),
        );
    }
    let field = line
        .and_then(|line| field_at_line(text, line))
        .unwrap_or_else(|| "--config".to_owned());
    ConfigError::new(field, format!("invalid TOML{location}: {message}"))
}

/// The field whose value line `line` (0-based) of `text` holds or
/// continues, as errors name it (`limits.max_keys`,
/// `cluster.slots[1].peer`), if the lines say plainly: the last `key =`
/// at or above it under the last table header. Only keys spelled like
/// ours (lowercase words joined by `_`) count; anything else leaves the
/// error naming the file.
fn field_at_line(text: &str, line: usize) -> Option<String> {
    let plain = |name: &str| {
        // Every field of ours is lowercase words joined by `_`.
        name.split('.').all(|part| {
            part.starts_with(|c: char| c.is_ascii_lowercase())
                && part.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
    };
    let mut table = String::new();
    let mut slots = 0usize;
    let mut key = None;
    for current in text.lines().take(line + 1) {
        let current = current.trim();
        if let Some(header) = current
            .strip_prefix("[[")
            .and_then(|rest| rest.split_once("]]"))
        {
            let name = header.0.trim();
            // Only `[[cluster.slots]]` is a list of tables here.
            if name != "cluster.slots" {
                return None;
            }
            table = format!("cluster.slots[{slots}].");
            slots += 1;
            key = None;
        } else if let Some(header) = current
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
        {
            let name = header.0.trim();
            if !plain(name) {
                return None;
            }
            table = format!("{name}.");
            key = None;
        } else if let Some((name, _)) = current.split_once('=') {
            let name = name.trim();
            if plain(name) {
                key = Some(name.to_owned());
            }
        }
    }
    key.map(|key| format!("{table}{key}"))
}

/// A field of valid TOML that [`FileConfig`] refuses, as the error names it.
struct WrongField {
    /// Its path: `limits.max_keys`, `cluster.slots[1].peer`.
    field: String,
    /// What is wrong, without the value.
    message: String,
}

/// The first field of `table` that [`FileConfig`] refuses. serde's errors
/// carry no path, and quote the value they got, so each field is tried
/// alone (every field is optional, so a table of one field is a whole
/// config) and the error is rewritten from the value's kind and the type
/// serde expected.
fn first_wrong_field(table: &Table) -> Option<WrongField> {
    first_wrong_in::<FileConfig>("", table, |key, value| match (key, value) {
        ("tls", Value::Table(inner)) => first_wrong_in::<FileTls>("tls.", inner, no_nesting),
        ("limits", Value::Table(inner)) => {
            first_wrong_in::<FileLimits>("limits.", inner, no_nesting)
        }
        ("cluster", Value::Table(inner)) => first_wrong_in_cluster(inner),
        _ => None,
    })
}

fn first_wrong_in_cluster(table: &Table) -> Option<WrongField> {
    first_wrong_in::<FileCluster>("cluster.", table, |key, value| match (key, value) {
        ("peer_tls", Value::Table(inner)) => {
            first_wrong_in::<FilePeerTls>("cluster.peer_tls.", inner, no_nesting)
        }
        ("slots", Value::Array(slots)) => slots.iter().enumerate().find_map(|(index, slot)| {
            let prefix = format!("cluster.slots[{index}]");
            match slot {
                Value::Table(inner) => {
                    first_wrong_in::<FileSlot>(&format!("{prefix}."), inner, no_nesting)
                }
                other => Some(WrongField {
                    field: prefix,
                    message: format!("expected a table, got {}", secret::kind_of(other)),
                }),
            }
        }),
        _ => None,
    })
}

/// A key as written in TOML: bare when it can be, else quoted (an unknown
/// key may hold anything, a line break included).
fn key_name(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

fn no_nesting(_: &str, _: &Value) -> Option<WrongField> {
    None
}

/// The first field of `table` (whose path starts with `prefix`) that `T`
/// refuses; `nested` looks inside a refused field that is a table or list
/// of tables itself, for the field within it.
fn first_wrong_in<T: serde::de::DeserializeOwned>(
    prefix: &str,
    table: &Table,
    nested: impl Fn(&str, &Value) -> Option<WrongField>,
) -> Option<WrongField> {
    table.iter().find_map(|(key, value)| {
        let mut alone = Table::new();
        alone.insert(key.clone(), value.clone());
        let error = T::deserialize(Value::Table(alone)).err()?;
        nested(key, value).or_else(|| {
            let field = format!("{prefix}{}", key_name(key));
            let message = plain_message(&field, value, error.message());
            Some(WrongField { field, message })
        })
    })
}

/// serde's message about `field` (holding `value`) in plain words, without
/// the value: serde quotes it (`invalid type: string "…", expected u64`).
fn plain_message(field: &str, value: &Value, serde_message: &str) -> String {
    let serde_message = serde_message.trim();
    // The secret fields' own errors already hide the value.
    if let Some(detail) = serde_message.split_once(secret::NOT_SHOWN) {
        return format!("{}{}", secret::NOT_SHOWN, detail.1);
    }
    let expected = serde_message
        .rsplit_once(", expected ")
        .map_or("", |(_, expected)| expected);
    if serde_message.starts_with("unknown field") {
        let allowed = expected.trim_start_matches("one of ").replace('`', "");
        return format!("unknown field (allowed here: {allowed})");
    }
    let wanted = match expected {
        "u64" | "u32" | "usize" => whole_number(field),
        "a boolean" => "true or false".to_owned(),
        "a string" | "path string" => "a string".to_owned(),
        "a sequence" => "a list".to_owned(),
        expected if expected.starts_with("struct ") => "a table".to_owned(),
        _ => "a different kind of value".to_owned(),
    };
    format!("expected {wanted}, got {}", secret::kind_of(value))
}

/// A whole number, in the unit the field's name ends with.
fn whole_number(field: &str) -> String {
    let unit = if field.ends_with("_ms") {
        " of milliseconds"
    } else if field.ends_with("_s") {
        " of seconds"
    } else {
        ""
    };
    format!("a whole number{unit}")
}

/// A path from the config file: relative ones are relative to its folder.
pub(super) fn in_file_dir(file_dir: Option<&Path>, path: &Path) -> PathBuf {
    match file_dir {
        Some(dir) => dir.join(path),
        None => path.to_owned(),
    }
}
