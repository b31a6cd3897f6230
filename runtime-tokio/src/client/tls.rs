//! The client's TLS setup: the connector built once from the configured
//! [`TlsMode`] and the server name of an address.

use std::fmt;
use std::io;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::{TicketError, TlsMode};

fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(message: impl fmt::Display) -> TicketError {
    TicketError::Io {
        kind: io::ErrorKind::InvalidInput,
        message: format!("TLS setup: {message}"),
    }
}

/// Builds the connector once, at [`TicketBrokerBuilder::connect`], so that a
/// bad CA file fails there rather than on every reconnect.
pub(super) fn tls_connector(mode: &TlsMode) -> Result<Option<TlsConnector>, TicketError> {
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
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
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
            let pem = std::fs::read(path)
                .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            let certs = rustls_pemfile::certs(&mut &pem[..])
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_error(format_args!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(tls_error(format_args!(
                    "{}: no PEM certificates",
                    path.display()
                )));
            }
            for cert in certs {
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
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
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
        cert: &rustls::pki_types::CertificateDer<'_>,
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
pub(super) fn server_name(addr: &str) -> Result<ServerName<'static>, TicketError> {
    let host = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => addr.rsplit_once(':').map_or(addr, |(host, _)| host),
    };
    ServerName::try_from(host.to_owned()).map_err(|_| tls_error("invalid server name"))
}
