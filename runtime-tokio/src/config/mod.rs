//! Command line, TOML config file and environment → one validated
//! [`Config`].
//!
//! Precedence, highest first: command-line flags, environment
//! (`TICKETING_CLIENT_TOKENS`, `RUST_LOG`), the config file, built-in
//! defaults. Every error names the field at fault and the rule it broke.
//!
//! The parts, in the order a start goes through them: `cli` (the command
//! line), `file` (the TOML file as written), `env` (the environment),
//! `single` (merging them into one [`Config`]: the settings every node
//! needs), `cluster` (the `[cluster]` half), `auth` (client, admin and peer
//! token sources and the rules for serving without a token), `secret`
//! (secrets kept out of errors, files holding them checked), `tls_files`
//! (certificate and key files), `defaults` (defaults and bounds) and
//! `error` (the error every step answers with, naming its field).

mod auth;
mod cli;
mod cluster;
mod defaults;
mod env;
mod error;
mod file;
mod secret;
mod single;
mod tls_files;

#[cfg(test)]
mod tests;

pub use self::auth::{check_admin_listen_auth, check_listen_auth};
pub use self::cli::{
    AdminArgs, BenchArgs, Cli, Command, ENV_ADMIN, ENV_ADMIN_TOKEN, ENV_CLIENT_TOKEN, ElectArgs,
    LockArgs, LocksCommand, ServeArgs, admin_exit, flag_value_error, lock_exit, parse_duration,
    parse_identity,
};
pub use self::defaults::*;
pub use self::env::Env;
pub use self::error::ConfigError;
pub use self::file::{
    FileCluster, FileConfig, FileLimits, FilePeerTls, FileSlot, FileTls, parse_file,
};
pub use self::secret::LooseSecretFile;
pub use self::single::{AuthMode, Config, LogFormat, load, resolve, resolve_state_dir};
