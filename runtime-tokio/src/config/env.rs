//! The environment the config reads, gathered once so that resolving is a
//! pure function of its inputs.

use super::defaults::{ENV_ADMIN_TOKENS, ENV_CLIENT_TOKENS, ENV_PEER_TOKENS};

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
            // The CLI's singular spelling works here too.
            admin_tokens: std::env::var(ENV_ADMIN_TOKENS)
                .or_else(|_| std::env::var(super::ENV_ADMIN_TOKEN))
                .ok(),
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
