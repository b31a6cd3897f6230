//! `ticketing`: the Ticketing daemon, `ticketing lock`, `ticketing bench`,
//! and the admin commands `ticketing locks` and `ticketing status`.
//!
//! `serve` exit codes: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when the
//! server cannot start (for example the address is in use), 2 for a bad
//! command line or config, or an unusable state directory. `lock` exit codes: see [`config::lock_exit`];
//! `locks` and `status`: [`config::admin_exit`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use ticketing_tokio::config::{self, AuthMode, Cli, Command, Env, LogFormat, ServeArgs};
use ticketing_tokio::{StateError, spawn_server};
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Lock(args) => lock::run(args),
        Command::Bench(args) => bench::run(&args),
        Command::Identity => print_random_hex(),
        Command::Token => print_random_hex(),
        Command::Locks(command) => cli_admin::locks(command),
        Command::Status(args) => cli_admin::status(args),
    }
}

mod cli_admin;
mod cli_client;

/// `ticketing identity` and `ticketing token`: 32 fresh CSPRNG bytes as 64
/// lowercase hex digits. Hex because a token must survive every place it
/// is configured: the comma-separated environment list, a TOML string, a
/// command-line flag and a token file line (trimmed, `#` starts a comment).
fn print_random_hex() -> ExitCode {
    let mut bytes = [0u8; 32];
    if let Err(e) = getrandom::fill(&mut bytes) {
        eprintln!("ticketing: no OS randomness: {e}");
        return ExitCode::from(1);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    println!("{hex}");
    ExitCode::SUCCESS
}

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match config::load(args, &Env::from_process()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ticketing: config error: {e}");
            return ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&config.log_filter))
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // One object per line: timestamp, level, target, fields.
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    fail_stop_on_panic();
    for loose in &config.loose_secret_files {
        warn!(
            path = %loose.path.display(),
            mode = format_args!("{:04o}", loose.mode),
            field = loose.field,
            "{loose}"
        );
    }

    // One thread by default: the core is one serial state machine, and a
    // single thread spares the cross-thread wake-ups that dominate small
    // lock operations.
    let runtime = if config.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ticketing: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(cluster) = config.cluster {
        return runtime.block_on(serve_cluster(cluster, config.auth));
    }
    runtime.block_on(async {
        // Watched before anything is served: a stop asked for while the
        // server starts (its listeners log as they come up) is a graceful
        // stop, not the signal's default death.
        let stop = StopSignals::watch();
        let listen = config.settings.listen;
        let server = match spawn_server(config.settings).await {
            Ok(server) => server,
            Err(e) if StateError::find(&e).is_some() => return state_error(&e),
            Err(e) => {
                error!("cannot listen on {listen}: {e}");
                eprintln!("ticketing: cannot listen on {listen}: {e}");
                return ExitCode::from(1);
            }
        };
        match config.auth {
            AuthMode::Tokens(count) => info!(tokens = count, "client authentication on"),
            AuthMode::None => info!("client authentication off: only the empty token is accepted"),
        }
        stop.wait().await;
        info!("stop signal received");
        server.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn serve_cluster(settings: ticketing_tokio::ClusterSettings, auth: AuthMode) -> ExitCode {
    let stop = StopSignals::watch();
    let (client, peer) = (settings.client_listen, settings.peer_listen);
    let node = match ticketing_tokio::spawn_cluster(settings).await {
        Ok(node) => node,
        Err(e) if StateError::find(&e).is_some() => return state_error(&e),
        Err(e) => {
            error!("cannot start the cluster node on {client} / {peer}: {e}");
            eprintln!("ticketing: cannot start the cluster node on {client} / {peer}: {e}");
            return ExitCode::from(1);
        }
    };
    match auth {
        AuthMode::Tokens(count) => info!(tokens = count, "client authentication on"),
        AuthMode::None => info!("client authentication off: only the empty token is accepted"),
    }
    stop.wait().await;
    info!("stop signal received");
    node.shutdown().await;
    ExitCode::SUCCESS
}

/// The state directory or file is unusable: like a config error, exit 2
/// with one line naming the field and the path.
fn state_error(e: &std::io::Error) -> ExitCode {
    if let Some(state) = StateError::find(e) {
        eprintln!("ticketing: config error: {state}");
    }
    ExitCode::from(2)
}

/// A lock service that keeps serving from state a panic left half-updated
/// could grant one key twice; stopping is the safe failure.
fn fail_stop_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        default_hook(panic);
        eprintln!("ticketing: internal error, stopping");
        std::process::abort();
    }));
}

/// SIGINT and SIGTERM, watched from the moment they are installed.
#[cfg(unix)]
struct StopSignals {
    /// `None` when they could not be installed (logged): nothing stops
    /// the server but a kill.
    watched: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

#[cfg(unix)]
impl StopSignals {
    fn watch() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let watched = signal(SignalKind::interrupt())
            .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)));
        match watched {
            Ok(watched) => StopSignals {
                watched: Some(watched),
            },
            Err(e) => {
                error!("cannot watch for stop signals: {e}");
                StopSignals { watched: None }
            }
        }
    }

    async fn wait(self) {
        match self.watched {
            Some((mut interrupt, mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(not(unix))]
struct StopSignals;

#[cfg(not(unix))]
impl StopSignals {
    fn watch() -> Self {
        StopSignals
    }

    async fn wait(self) {
        if let Err(e) = tokio::signal::ctrl_c().await {
            error!("cannot watch for stop signals: {e}");
            std::future::pending::<()>().await;
        }
    }
}

mod lock {
    //! `ticketing lock KEY -- CMD...`.

    use std::process::ExitCode;

    use ticketing_tokio::TicketError;
    use ticketing_tokio::config::{LockArgs, lock_exit};
    use ticketing_tokio::terminal::terminal_safe;

    use crate::cli_client::{CONNECT_TIMEOUT, ClientOptions, client_broker};

    fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
        eprintln!("ticketing lock: {message}");
        ExitCode::from(code)
    }

    /// The exit code of an error that kept the command from running.
    fn exit_code(error: &TicketError) -> u8 {
        match error {
            TicketError::Timeout => lock_exit::TIMEOUT,
            TicketError::Busy | TicketError::ClientCapacity => lock_exit::BUSY,
            TicketError::Indeterminate => lock_exit::INDETERMINATE,
            TicketError::Auth => lock_exit::AUTH,
            TicketError::NotConnected | TicketError::Closed | TicketError::Io { .. } => {
                lock_exit::UNAVAILABLE
            }
            TicketError::InvalidInput(_) | TicketError::UnsupportedDuration { .. } => {
                lock_exit::USAGE
            }
            // The command does not renew, so it never meets the renewal
            // errors.
            TicketError::InsufficientLease
            | TicketError::Protocol(_)
            | TicketError::Unsupported(_)
            | TicketError::Lost => lock_exit::SOFTWARE,
        }
    }

    pub fn run(args: LockArgs) -> ExitCode {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => return fail(lock_exit::SOFTWARE, format_args!("cannot start: {e}")),
        };
        runtime.block_on(run_locked(args))
    }

    async fn run_locked(args: LockArgs) -> ExitCode {
        let options = ClientOptions {
            addrs: &args.addrs,
            token: args.token.as_deref(),
            tls_ca: args.tls_ca.as_deref(),
            tls_system_roots: args.tls_system_roots,
            cluster_identity: args.cluster_identity,
        };
        let broker = match client_broker(&options) {
            Ok(broker) => broker,
            Err(e) => {
                let code = match e {
                    TicketError::Io { .. } => lock_exit::USAGE,
                    ref other => exit_code(other),
                };
                return fail(code, e);
            }
        };
        if !broker.wait_ready(CONNECT_TIMEOUT).await {
            let code = if broker.auth_failed() {
                lock_exit::AUTH
            } else {
                lock_exit::UNAVAILABLE
            };
            broker.close().await;
            return fail(
                code,
                format_args!(
                    "cannot connect to {}: {}",
                    args.addrs.join(", "),
                    if code == lock_exit::AUTH {
                        "authentication rejected"
                    } else {
                        "no connection"
                    }
                ),
            );
        }
        let ticket = match broker
            .acquire(&args.key, args.wait, args.lease, args.budget)
            .await
        {
            Ok(ticket) => ticket,
            Err(e) => {
                broker.close().await;
                let key = terminal_safe(args.key.as_bytes());
                return fail(exit_code(&e), format_args!("{key}: {e}"));
            }
        };
        let (program, rest) = args.command.split_first().expect("clap requires a command");
        let spawned = tokio::process::Command::new(program)
            .args(rest)
            .env("TICKETING_KEY", &args.key)
            .env("TICKETING_TOKEN", ticket.token().to_string())
            .spawn();
        let status = match spawned {
            Ok(mut child) => wait_child(&mut child, ticket.conservative_valid_before()).await,
            Err(e) => {
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    lock_exit::NOT_FOUND
                } else {
                    lock_exit::CANNOT_RUN
                };
                eprintln!(
                    "ticketing lock: cannot run {}: {e}",
                    program.to_string_lossy()
                );
                Err(code)
            }
        };
        if let Err(e) = ticket.release().await {
            // The command has finished; the lease frees the key in the end.
            let key = terminal_safe(args.key.as_bytes());
            eprintln!("ticketing lock: release of {key} failed: {e}");
        }
        broker.close().await;
        match status {
            Ok(status) => ExitCode::from(status_code(status)),
            Err(code) => ExitCode::from(code),
        }
    }

    /// Waits for the command, warning once if the lease lapses first (the
    /// lock no longer excludes anyone), and passing SIGINT/SIGTERM on by
    /// staying alive until the command exits: SIGINT from a terminal
    /// reaches the command through the process group; SIGTERM kills it.
    async fn wait_child(
        child: &mut tokio::process::Child,
        valid_before: std::time::Instant,
    ) -> Result<std::process::ExitStatus, u8> {
        let lapse = tokio::time::sleep_until(valid_before.into());
        tokio::pin!(lapse);
        let mut warned = false;
        let mut signals = Signals::new();
        loop {
            tokio::select! {
                status = child.wait() => {
                    return status.map_err(|e| {
                        eprintln!("ticketing lock: waiting for the command failed: {e}");
                        lock_exit::SOFTWARE
                    });
                }
                () = &mut lapse, if !warned => {
                    warned = true;
                    eprintln!("ticketing lock: warning: the lease has lapsed while the command runs; the lock no longer excludes others");
                }
                terminate = signals.recv() => {
                    if terminate {
                        let _ = child.start_kill();
                    }
                }
            }
        }
    }

    /// SIGINT and SIGTERM while the command runs.
    struct Signals {
        #[cfg(unix)]
        interrupt: Option<tokio::signal::unix::Signal>,
        #[cfg(unix)]
        terminate: Option<tokio::signal::unix::Signal>,
    }

    impl Signals {
        fn new() -> Self {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                Signals {
                    interrupt: signal(SignalKind::interrupt()).ok(),
                    terminate: signal(SignalKind::terminate()).ok(),
                }
            }
            #[cfg(not(unix))]
            Signals {}
        }

        /// Resolves on a signal: true for SIGTERM, false for SIGINT.
        async fn recv(&mut self) -> bool {
            #[cfg(unix)]
            {
                async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                    match signal {
                        Some(signal) => {
                            signal.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                }
                tokio::select! {
                    () = next(&mut self.interrupt) => false,
                    () = next(&mut self.terminate) => true,
                }
            }
            #[cfg(not(unix))]
            std::future::pending().await
        }
    }

    /// The command's exit code, or 128 + signal number like a shell.
    fn status_code(status: std::process::ExitStatus) -> u8 {
        if let Some(code) = status.code() {
            return u8::try_from(code & 0xff).unwrap_or(1);
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return u8::try_from((128 + signal) & 0xff).unwrap_or(1);
            }
        }
        1
    }
}

mod bench;
