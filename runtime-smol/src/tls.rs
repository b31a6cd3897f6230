//! TLS with rustls (ring provider only) via futures-rustls: the client's
//! [`TlsMode`] (shared with `ticketing-tokio`, see [`ticketing_tls`]) and a
//! helper building the embedded listener's configuration.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use ticketing_tls::{read_certs, ring_provider};

pub use ticketing_tls::TlsMode;

/// The embedded listener's TLS configuration from a PEM certificate chain
/// (leaf first) and a PEM private key (PKCS#8, PKCS#1 or SEC1): TLS 1.3 and
/// 1.2, ring provider, no client certificates, no ALPN.
pub fn server_config(cert_path: &Path, key_path: &Path) -> io::Result<Arc<rustls::ServerConfig>> {
    let certs = read_certs(cert_path)?;
    let pem = std::fs::read(key_path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", key_path.display())))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut pem.as_slice())?
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no PEM private key", key_path.display()),
            )
        })?;
    let invalid = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidInput, e.to_string());
    let config = rustls::ServerConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(invalid)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(invalid)?;
    Ok(Arc::new(config))
}
