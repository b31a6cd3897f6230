//! Why connecting to an address has not given a ready session: what the
//! last attempt there saw, in terms a user can act on.

use std::fmt;
use std::io;

use ticketing_core::client::HandshakeClue;

/// Why connecting to one address has not given a ready session, as its
/// last attempt saw it ([`TicketBroker::connect_problems`](super::TicketBroker::connect_problems)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectProblem {
    /// The connection was refused: nothing listens there.
    NothingListening,
    /// We spoke plain TCP; the server accepted, then sent no hello (and
    /// may have closed): it speaks TLS, or is not a Ticketing server.
    SilentServer,
    /// The server's first bytes were not a Ticketing hello.
    NotTicketing,
    /// We spoke TLS, and the server's answer was not TLS: it speaks plain
    /// TCP.
    NotTls,
    /// We spoke TLS, and the server's certificate is not trusted; rustls's
    /// reason.
    CertificateNotTrusted(String),
    /// Any other failure to connect: the error, as text.
    Other(String),
}

impl ConnectProblem {
    /// The problem a failed TCP connect or TLS handshake shows. rustls's
    /// error is the one a handshake ended with (tokio-rustls wraps it in
    /// the `io::Error`).
    pub(super) fn from_connect_error(error: &io::Error) -> Self {
        if error.kind() == io::ErrorKind::ConnectionRefused {
            return ConnectProblem::NothingListening;
        }
        let rustls_error = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        match rustls_error {
            Some(rustls::Error::InvalidCertificate(reason)) => {
                ConnectProblem::CertificateNotTrusted(format!("{reason:?}"))
            }
            // Our server sends its hello first: read as a TLS record, its
            // first byte is no valid record type.
            Some(rustls::Error::InvalidMessage(_)) => ConnectProblem::NotTls,
            _ => ConnectProblem::Other(error.to_string()),
        }
    }

    /// The problem a plain session that connected and then ended (or is
    /// still waiting) shows, if its bytes tell one.
    pub(super) fn from_clue(clue: HandshakeClue) -> Self {
        match clue {
            HandshakeClue::Silent => ConnectProblem::SilentServer,
            HandshakeClue::NotAHello => ConnectProblem::NotTicketing,
        }
    }
}

impl fmt::Display for ConnectProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectProblem::NothingListening => f.write_str("connection refused"),
            ConnectProblem::SilentServer => f.write_str("connected, but the server sent no hello"),
            ConnectProblem::NotTicketing => f.write_str("the server's first bytes are not a hello"),
            ConnectProblem::NotTls => f.write_str("the server's answer to TLS is not TLS"),
            ConnectProblem::CertificateNotTrusted(reason) => {
                write!(f, "certificate not trusted: {reason}")
            }
            ConnectProblem::Other(error) => f.write_str(error),
        }
    }
}
