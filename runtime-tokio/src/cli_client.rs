//! What the client subcommands (`lock`, `bench`) share: how they build
//! their broker, and how long they wait for it to connect.

use ticketing_tokio::config;

/// Options shared by the client subcommands.
pub(crate) struct ClientOptions<'a> {
    pub(crate) addrs: &'a [String],
    pub(crate) token: Option<&'a str>,
    pub(crate) tls_ca: Option<&'a std::path::Path>,
    pub(crate) tls_system_roots: bool,
    pub(crate) cluster_identity: Option<[u8; 32]>,
    /// The label naming this client to operators.
    pub(crate) label: Option<&'a str>,
}

/// Builds the broker of `lock` and `bench`: the token from the flag or
/// `TICKETING_CLIENT_TOKEN`; without one, loopback no-auth mode.
pub(crate) fn client_broker(
    options: &ClientOptions<'_>,
) -> Result<ticketing_tokio::TicketBroker, ticketing_tokio::TicketError> {
    use ticketing_tokio::{TicketBroker, TlsMode};
    let token = match options.token {
        Some(token) => token.to_owned(),
        None => std::env::var(config::ENV_CLIENT_TOKEN).unwrap_or_default(),
    };
    let mut builder = TicketBroker::builder().addrs(options.addrs.iter().cloned());
    builder = if token.is_empty() {
        builder.allow_loopback_no_auth()
    } else {
        builder.token(token)
    };
    if let Some(identity_fingerprint) = options.cluster_identity {
        builder = builder.mode(ticketing_tokio::client::BrokerMode::Cluster {
            identity_fingerprint,
        });
    }
    if let Some(label) = options.label {
        builder = builder.label(label);
    }
    if let Some(ca) = options.tls_ca {
        builder = builder.tls(TlsMode::Ca(ca.to_owned()));
    } else if options.tls_system_roots {
        builder = builder.tls(TlsMode::SystemRoots);
    }
    builder.connect()
}

/// How long `bench` waits for a first connection.
pub(crate) const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The least `lock` waits for a first connection, even with `--wait 0`
/// (one immediate try of the lock, not of the connection): time for a
/// TCP and TLS handshake with a server a few round trips away.
pub(crate) const CONNECT_WAIT_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The exit code of a client error, the same for every client subcommand
/// (`lock`, `bench`): [`config::lock_exit`]'s table.
pub(crate) fn exit_code(error: &ticketing_tokio::TicketError) -> u8 {
    match error {
        ticketing_tokio::TicketError::Timeout => config::lock_exit::TIMEOUT,
        ticketing_tokio::TicketError::Busy | ticketing_tokio::TicketError::ClientCapacity => {
            config::lock_exit::BUSY
        }
        ticketing_tokio::TicketError::Indeterminate => config::lock_exit::INDETERMINATE,
        ticketing_tokio::TicketError::Auth => config::lock_exit::AUTH,
        ticketing_tokio::TicketError::NotConnected
        | ticketing_tokio::TicketError::Closed
        | ticketing_tokio::TicketError::Io { .. } => config::lock_exit::UNAVAILABLE,
        ticketing_tokio::TicketError::InvalidInput(_)
        | ticketing_tokio::TicketError::UnsupportedDuration { .. }
        | ticketing_tokio::TicketError::CapacityMismatch { .. } => config::lock_exit::USAGE,
        // Renewal errors do not keep the command from running.
        ticketing_tokio::TicketError::InsufficientLease
        | ticketing_tokio::TicketError::Protocol(_)
        | ticketing_tokio::TicketError::Unsupported(_)
        | ticketing_tokio::TicketError::Lost => config::lock_exit::SOFTWARE,
    }
}

/// Why `broker` did not become ready within `waited`: the exit code and
/// the words, naming the cause its connection attempts saw (or every cause
/// the protocol leaves possible) and what to do about each.
pub(crate) fn connect_failure(
    broker: &ticketing_tokio::TicketBroker,
    options: &ClientOptions<'_>,
    waited: std::time::Duration,
) -> (u8, String) {
    use ticketing_tokio::client::ConnectProblem;
    let addrs = options.addrs.join(", ");
    let tls = options.tls_ca.is_some() || options.tls_system_roots;
    let mut problems = broker.connect_problems();
    // A broker may hold several connections to one address: say each
    // address's problem once.
    let mut seen = Vec::new();
    problems.retain(|problem| {
        let new = !seen.contains(problem);
        seen.push(problem.clone());
        new
    });
    // A server that is not ours fails like a refused token (the broker
    // stops trying it): say what it is first.
    let not_ours = problems
        .iter()
        .any(|(_, problem)| *problem == ConnectProblem::NotTicketing);
    if broker.auth_failed() && !not_ours {
        // The proof covers the token and, in cluster mode, the identity:
        // a refusal cannot say which of them is wrong.
        let why = if options.cluster_identity.is_some() {
            "the client token (--token or TICKETING_CLIENT_TOKEN) is not one the cluster accepts, \
             or --cluster-identity is not this cluster's identity"
        } else {
            "the client token (--token or TICKETING_CLIENT_TOKEN) is not one the server accepts, \
             or the server is a cluster node (give --cluster-identity and every node's --addr)"
        };
        return (
            config::lock_exit::AUTH,
            format!("cannot connect to {addrs}: authentication rejected: {why}"),
        );
    }
    let code = if not_ours {
        config::lock_exit::AUTH
    } else {
        config::lock_exit::UNAVAILABLE
    };
    if !problems.is_empty() {
        let why: Vec<String> = problems
            .iter()
            .map(|(addr, problem)| problem_words(addr, problem, tls))
            .collect();
        return (
            code,
            format!(
                "cannot connect to {addrs} within {waited:?}: {}",
                why.join("; ")
            ),
        );
    }
    let tls_hint = if tls {
        "the server does not speak TLS, or its certificate is not trusted by the CA given"
    } else {
        "a server that speaks TLS needs --tls-ca FILE"
    };
    (
        code,
        format!(
            "cannot connect to {addrs} within {waited:?}: is a server listening there? ({tls_hint})"
        ),
    )
}

/// One address's problem, and what to do about it.
fn problem_words(
    addr: &str,
    problem: &ticketing_tokio::client::ConnectProblem,
    tls: bool,
) -> String {
    use ticketing_tokio::client::ConnectProblem;
    match problem {
        ConnectProblem::NothingListening => format!(
            "nothing listens at {addr} (connection refused): is the server running, on this port?"
        ),
        ConnectProblem::SilentServer if tls => format!(
            "the server at {addr} completed TLS but sent no hello: it is not a Ticketing server"
        ),
        // A server of ours sends its hello at once; a TLS one waits for
        // a TLS hello that we did not send.
        ConnectProblem::SilentServer => format!(
            "the server at {addr} accepted the connection but sent no hello: it speaks TLS \
             (pass --tls-ca FILE with the CA that signed its certificate, or \
             --tls-system-roots), or it is not a Ticketing server"
        ),
        ConnectProblem::NotTicketing => format!(
            "the server at {addr} is not a Ticketing server (its first bytes are not a Ticketing hello)"
        ),
        ConnectProblem::NotTls => {
            format!("the server at {addr} does not speak TLS: drop --tls-ca / --tls-system-roots")
        }
        ConnectProblem::CertificateNotTrusted(reason) => format!(
            "the certificate of the server at {addr} is not trusted ({reason}): pass --tls-ca \
             with the CA that signed it"
        ),
        other => format!("{addr}: {other}"),
    }
}
