//! Client TLS setup for Ticketing's brokers, shared by the tokio and smol
//! runtimes: the [`TlsMode`] a user picks, the rustls client configuration
//! it means ([`client_config`]), and the server name to verify
//! ([`server_name`]).
//!
//! rustls with the `ring` provider only, TLS 1.3 and 1.2 (the safe
//! defaults); the client never presents a certificate. Nothing here does
//! network IO or needs an async runtime: each runtime wraps the
//! configuration in its own connector (tokio-rustls, futures-rustls).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use ticketing_core::client::ClientError;

/// How a broker secures its connections. The client never presents a
/// certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Off,
    /// TLS, server verified against the operating system's trust store.
    SystemRoots,
    /// TLS, server verified against the CA certificates in this PEM file.
    Ca(PathBuf),
    /// TLS without verifying the server: anyone on the path can impersonate
    /// it. For tests only.
    InsecureSkipVerify,
}

/// The crypto provider of every configuration built here.
pub fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(message: impl fmt::Display) -> ClientError {
    ClientError::Io {
        kind: io::ErrorKind::InvalidInput,
        message: format!("TLS setup: {message}"),
    }
}

/// The client configuration of `mode`, `None` for [`TlsMode::Off`]. Built
/// once, when the broker is built, so that a bad CA file fails there rather
/// than on every reconnect. Errors are [`ClientError::Io`] with
/// [`io::ErrorKind::InvalidInput`].
pub fn client_config(mode: &TlsMode) -> Result<Option<Arc<rustls::ClientConfig>>, ClientError> {
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
            return Ok(Some(Arc::new(config)));
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
    Ok(Some(Arc::new(config)))
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

/// The TLS server name of a broker address, `host:port` or `[v6]:port`
/// (validated by the core's [`BrokerConfig`](ticketing_core::client::BrokerConfig)).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, ClientError> {
    let host = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => addr.rsplit_once(':').map_or(addr, |(host, _)| host),
    };
    ServerName::try_from(host.to_owned()).map_err(|_| tls_error("invalid server name"))
}

/// The certificates of a PEM file; an error names the file, and a file
/// without any certificate is one.
pub fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_of_host_and_bracketed_v6_addresses() {
        let name = |addr| server_name(addr).unwrap().to_str().into_owned();
        assert_eq!(name("locks.example:5225"), "locks.example");
        assert_eq!(name("127.0.0.1:5225"), "127.0.0.1");
        assert_eq!(name("[::1]:5225"), "::1");
    }

    #[test]
    fn off_is_plain_tcp_and_a_missing_ca_file_fails_at_build() {
        assert!(client_config(&TlsMode::Off).unwrap().is_none());
        assert!(
            client_config(&TlsMode::InsecureSkipVerify)
                .unwrap()
                .is_some()
        );
        let err = client_config(&TlsMode::Ca("/nonexistent/ca.pem".into())).unwrap_err();
        match err {
            ClientError::Io { kind, message } => {
                assert_eq!(kind, io::ErrorKind::InvalidInput);
                assert!(
                    message.starts_with("TLS setup: /nonexistent/ca.pem: "),
                    "{message}"
                );
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
}
