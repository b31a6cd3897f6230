//! Server-side TLS: loading a PEM certificate chain and private key into a
//! rustls configuration.
//!
//! rustls 0.23 with the `ring` provider only; TLS 1.3 and 1.2 (the safe
//! defaults); no client certificates; no ALPN (published clients send none).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Which of the two TLS inputs a [`TlsError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsPart {
    /// The certificate chain file.
    Cert,
    /// The private key file.
    Key,
    /// The pair as a whole (for example a key that does not match the
    /// certificate).
    Pair,
}

/// A TLS certificate or key that cannot be used.
#[derive(Debug)]
pub struct TlsError {
    /// The input at fault.
    pub part: TlsPart,
    /// The file involved, if the error is about one file.
    pub path: Option<PathBuf>,
    /// What is wrong, in one line.
    pub message: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: {}", path.display(), self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TlsError {}

/// Reads a PEM certificate chain (leaf first) and a PEM private key (PKCS#8,
/// PKCS#1 or SEC1) and builds the server's rustls configuration.
pub fn load_server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = read_certs(cert_path)?;
    let key = read_key(key_path)?;
    server_config(certs, key)
}

/// Builds the server's rustls configuration from an already parsed chain and
/// key.
pub fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pair_error = |message: String| TlsError {
        part: TlsPart::Pair,
        path: None,
        message,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pair_error(format!("no usable TLS protocol version: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| pair_error(format!("certificate and key cannot be used together: {e}")))?;
    Ok(Arc::new(config))
}

/// Builds a client-side rustls configuration that verifies servers against
/// the CA certificates in the PEM file `ca_path` (used between cluster
/// peers; the dialing node presents no certificate). Errors are about
/// [`TlsPart::Cert`], the CA file.
pub fn load_client_config(ca_path: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(ca_path)? {
        roots.add(cert).map_err(|e| TlsError {
            part: TlsPart::Cert,
            path: Some(ca_path.to_owned()),
            message: format!("unusable CA certificate: {e}"),
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            part: TlsPart::Pair,
            path: None,
            message: format!("no usable TLS protocol version: {e}"),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn read_file(part: TlsPart, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError {
        part,
        path: Some(path.to_owned()),
        message: format!("cannot read: {e}"),
    })
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let error = |message: String| TlsError {
        part: TlsPart::Cert,
        path: Some(path.to_owned()),
        message,
    };
    let pem = read_file(TlsPart::Cert, path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("not a valid PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(error(
            "contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)".to_owned(),
        ));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let error = |message: String| TlsError {
        part: TlsPart::Key,
        path: Some(path.to_owned()),
        message,
    };
    let pem = read_file(TlsPart::Key, path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| error(format!("not a valid PEM key file: {e}")))?
        .ok_or_else(|| error("contains no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned()))
}
