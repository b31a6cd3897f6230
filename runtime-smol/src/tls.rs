//! TLS with rustls (ring provider only) via futures-rustls: the client's
//! [`TlsMode`] and a helper building the embedded listener's configuration.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use ticketing_core::client::ClientError as TicketError;

pub use ticketing_core::client::TlsMode;

fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(message: impl fmt::Display) -> TicketError {
    TicketError::Io {
        kind: io::ErrorKind::InvalidInput,
        message: format!("TLS setup: {message}"),
    }
}

/// Builds the connector once, when the broker is built, so that a bad CA
/// file fails there rather than on every reconnect.
pub(crate) fn connector(mode: &TlsMode) -> Result<Option<TlsConnector>, TicketError> {
    let builder = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?;
    let mut roots = rustls::RootCertStore::empty();
    match mode {
        TlsMode::Off => return Ok(None),
        TlsMode::InsecureSkipVerify => {
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SkipVerify(ring_provider())))
                .with_no_client_auth();
            return Ok(Some(TlsConnector::from(Arc::new(config))));
        }
        TlsMode::SystemRoots => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // One unusable system certificate must not disable the rest.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(tls_error(
                    "no usable certificates in the system trust store",
                ));
            }
        }
        TlsMode::Ca(path) => {
            for cert in read_certs(path).map_err(tls_error)? {
                roots
                    .add(cert)
                    .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            }
        }
    }
    let config = builder.with_root_certificates(roots).with_no_client_auth();
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// The verifier of [`TlsMode::InsecureSkipVerify`]: accepts any certificate
/// but still checks handshake signatures.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS server name of `host:port` or `[v6]:port` (validated by core).
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>, TicketError> {
    let host = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => addr.rsplit_once(':').map_or(addr, |(host, _)| host),
    };
    ServerName::try_from(host.to_owned()).map_err(|_| tls_error("invalid server name"))
}

fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: no PEM certificates", path.display()),
        ));
    }
    Ok(certs)
}

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
