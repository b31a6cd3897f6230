//! Client, admin and peer token sources (flags, then environment, then
//! file), and our rules for serving without a token.

use std::net::SocketAddr;
use std::path::Path;

use ticketing_core::admin::AdminTokens;
use ticketing_core::auth::TOKEN_LEN_MIN;

use super::cli::ServeArgs;
use super::defaults::{ENV_ADMIN_TOKENS, ENV_CLIENT_TOKENS};
use super::env::Env;
use super::error::ConfigError;
use super::file::{FileConfig, in_file_dir};

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
pub(super) fn resolve_admin_tokens(
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
pub(super) struct PickedTokens {
    pub(super) values: Vec<String>,
    pub(super) source: &'static str,
}

impl PickedTokens {
    /// Token `index` of the list field `list` is shorter than a client or
    /// admin token may be; the message gives its length, never its text.
    pub(super) fn too_short(&self, list: &str, index: usize) -> ConfigError {
        self.shorter_than(list, index, TOKEN_LEN_MIN)
    }

    /// Token `index` of the list field `list` is shorter than `len_min`
    /// bytes; the message gives its length, never its text, and says how
    /// to make a good one.
    pub(super) fn shorter_than(&self, list: &str, index: usize, len_min: usize) -> ConfigError {
        let len = self.values[index].len();
        let source = self.source;
        ConfigError::new(
            format!("{list}[{index}]"),
            format!(
                "token is {len} bytes, must be at least {len_min} (from {source}); \
                 `ticketing token` prints a fresh random one"
            ),
        )
    }
}

/// The tokens given by the flags, else by the environment variable
/// (comma-separated; blank entries skipped), else by the config file.
pub(super) fn pick_tokens(
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
