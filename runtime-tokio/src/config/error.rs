//! The error every step answers with, and the field checks shared by them.

use std::fmt;
use std::net::SocketAddr;

/// A configuration that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field at fault, as named in the config file (`limits.keys_max`,
    /// `client_tokens[1]`), or `--config` for the file itself.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ConfigError {
    pub(super) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
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

pub(super) fn check_range(
    field: &str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<usize, ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            field,
            format!("{value} is out of range, allowed {min}..={max}"),
        ));
    }
    usize::try_from(value)
        .map_err(|_| ConfigError::new(field, format!("{value} does not fit this platform's usize")))
}

pub(super) fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("expected IP:PORT such as 127.0.0.1:5225 or [::1]:5225, got {text:?}"),
        )
    })
}
