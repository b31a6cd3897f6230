//! Keeping secrets out of config errors and off readable files: the token
//! lists of the config file are read through [`client_tokens`],
//! [`admin_tokens`] and [`peer_tokens`], whose errors name the field and
//! the kind of value found but never the value; a TOML syntax error inside
//! such a value is reported the same way ([`hides_line`]); and files
//! holding secrets that group or others can read are reported
//! ([`LooseSecretFile`]).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{Deserialize, Deserializer, Error as _};
use toml::Value;

use super::cli::ServeArgs;
use super::file::{FileConfig, in_file_dir};

/// In the message of every error about a secret field: `parse_file`
/// recognises it, and readers learn why the value is missing.
pub(super) const NOT_SHOWN: &str = "invalid value (not shown: it is a secret)";

/// The secret fields of the config file: their names as written (any
/// table) and as errors name them.
const SECRET_FIELDS: [(&str, &str); 3] = [
    ("client_tokens", "client_tokens"),
    ("admin_tokens", "admin_tokens"),
    ("peer_tokens", "cluster.peer_tokens"),
];

/// `client_tokens`: a list of strings, errors without the value.
pub(super) fn client_tokens<'de, D: Deserializer<'de>>(
    de: D,
) -> Result<Option<Vec<String>>, D::Error> {
    secret_list(de, "client_tokens")
}

/// `admin_tokens`: a list of strings, errors without the value.
pub(super) fn admin_tokens<'de, D: Deserializer<'de>>(
    de: D,
) -> Result<Option<Vec<String>>, D::Error> {
    secret_list(de, "admin_tokens")
}

/// `[cluster] peer_tokens`: a list of strings, errors without the value.
pub(super) fn peer_tokens<'de, D: Deserializer<'de>>(
    de: D,
) -> Result<Option<Vec<String>>, D::Error> {
    secret_list(de, "cluster.peer_tokens")
}

/// Any TOML value is taken first (that cannot fail on valid TOML), then
/// checked here: serde's own type errors quote the value they got.
fn secret_list<'de, D: Deserializer<'de>>(
    de: D,
    field: &str,
) -> Result<Option<Vec<String>>, D::Error> {
    let wrong = |what: String| {
        D::Error::custom(format!(
            "{field}: {NOT_SHOWN}: expected a list of strings, got {what}"
        ))
    };
    let items = match Value::deserialize(de)? {
        Value::Array(items) => items,
        other => return Err(wrong(kind_of(&other).to_owned())),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::String(text) => Ok(text),
            other => Err(wrong(format!("{} at index {index}", kind_of(&other)))),
        })
        .collect::<Result<Vec<String>, D::Error>>()
        .map(Some)
}

/// The kind of a TOML value, for an error that must not show the value.
pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(number) if *number < 0 => "a negative integer",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

/// The secret field whose value line `line` (0-based) of `text` lies in,
/// if any: for a TOML syntax error there, whose message must not show
/// that line either. A line mentioning a secret field's name opens its
/// value; a line starting another key closes it (a value spanning lines
/// is an array, whose lines start with a value). Hiding too much is the
/// safe side: a table header does not close it, as it may be a nested
/// array.
pub(super) fn hides_line(text: &str, line: usize) -> Option<&'static str> {
    let mut open = None;
    for current in text.lines().take(line + 1) {
        let named = SECRET_FIELDS
            .iter()
            .find(|(key, _)| current.contains(key))
            .map(|(_, named)| *named);
        if named.is_some() {
            open = named;
        } else if starts_with_key(current.trim_start()) {
            open = None;
        }
    }
    open
}

/// Whether `line` starts with `key =` (bare or dotted key).
fn starts_with_key(line: &str) -> bool {
    let key_len = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .unwrap_or(line.len());
    key_len > 0 && line[key_len..].trim_start().starts_with('=')
}

/// A file holding secrets that group or others may read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LooseSecretFile {
    /// The field (or flag) that names the file.
    pub field: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

impl fmt::Display for LooseSecretFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} has mode {:04o}: readable by group or others; chmod 600",
            self.field,
            self.path.display(),
            self.mode
        )
    }
}

/// The files holding secrets that this config reads and group or others
/// may read: the config file itself (tokens may be in it), the admin token
/// file and the TLS private keys, each as the precedence picks it.
pub(super) fn loose_secret_files(
    file: &FileConfig,
    file_dir: Option<&Path>,
    args: &ServeArgs,
) -> Vec<LooseSecretFile> {
    let from_file = |path: Option<&PathBuf>| path.map(|path| in_file_dir(file_dir, path));
    let candidates = [
        ("--config", args.config.clone()),
        (
            "admin_token_file",
            args.admin_token_file
                .clone()
                .or_else(|| from_file(file.admin_token_file.as_ref())),
        ),
        (
            "tls.key",
            args.tls_key
                .clone()
                .or_else(|| from_file(file.tls.as_ref().and_then(|t| t.key.as_ref()))),
        ),
        (
            "cluster.peer_tls.key",
            from_file(
                file.cluster
                    .as_ref()
                    .and_then(|c| c.peer_tls.as_ref())
                    .and_then(|t| t.key.as_ref()),
            ),
        ),
    ];
    candidates
        .into_iter()
        .filter_map(|(field, path)| loose(field, &path?))
        .collect()
}

/// `path` (named by `field`) as a [`LooseSecretFile`] if group or others
/// may read it; `None` too when it cannot be inspected (reading it fails
/// later with its own error).
fn loose(field: &'static str, path: &Path) -> Option<LooseSecretFile> {
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(path).ok()?.mode() & 0o7777;
    (mode & 0o044 != 0).then(|| LooseSecretFile {
        field,
        path: path.to_owned(),
        mode,
    })
}
