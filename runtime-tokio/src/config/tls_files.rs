//! Certificate and key files: the client listener's `[tls]` and the peer
//! links' `[cluster.peer_tls]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;

use super::cli::ServeArgs;
use super::error::ConfigError;
use super::file::{FileConfig, FilePeerTls, FileTls, in_file_dir};
use crate::cluster::PeerTls;
use crate::tls::{self, TlsPart};

pub(super) fn resolve_tls(
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

pub(super) fn resolve_peer_tls(
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

/// A certificate/key error, named after the field of `table` at fault
/// (`table.cert`, `table.key`, or `table` itself when they do not match).
pub(super) fn tls_error(table: &str, e: tls::TlsError) -> ConfigError {
    let field = match e.part {
        TlsPart::Cert => format!("{table}.cert"),
        TlsPart::Key => format!("{table}.key"),
        TlsPart::Pair => table.to_owned(),
    };
    ConfigError::new(field, e.to_string())
}
