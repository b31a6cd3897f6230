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
use tracing::{error, info};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Lock(args) => lock::run(args),
        Command::Bench(args) => bench::run(&args),
        Command::Identity => identity(),
        Command::Locks(command) => cli_admin::locks(command),
        Command::Status(args) => cli_admin::status(args),
    }
}

mod cli_admin;

/// `ticketing identity`: 32 fresh CSPRNG bytes as 64 lowercase hex digits.
fn identity() -> ExitCode {
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
        if let Err(e) = wait_for_stop_signal().await {
            error!("cannot watch for stop signals: {e}");
        }
        info!("stop signal received");
        server.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn serve_cluster(settings: ticketing_tokio::ClusterSettings, auth: AuthMode) -> ExitCode {
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
    if let Err(e) = wait_for_stop_signal().await {
        error!("cannot watch for stop signals: {e}");
    }
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

#[cfg(unix)]
async fn wait_for_stop_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_stop_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

/// Options shared by the client subcommands.
struct ClientOptions<'a> {
    addrs: &'a [String],
    token: Option<&'a str>,
    tls_ca: Option<&'a std::path::Path>,
    tls_system_roots: bool,
    cluster_identity: Option<[u8; 32]>,
}

/// Builds the broker of `lock` and `bench`: the token from the flag or
/// `TICKETING_CLIENT_TOKEN`; without one, loopback no-auth mode.
fn client_broker(
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
    if let Some(ca) = options.tls_ca {
        builder = builder.tls(TlsMode::Ca(ca.to_owned()));
    } else if options.tls_system_roots {
        builder = builder.tls(TlsMode::SystemRoots);
    }
    builder.connect()
}

/// How long `lock` and `bench` wait for a first connection.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

mod lock {
    //! `ticketing lock KEY -- CMD...`.

    use std::process::ExitCode;

    use ticketing_tokio::TicketError;
    use ticketing_tokio::config::{LockArgs, lock_exit};

    use super::{CONNECT_TIMEOUT, ClientOptions, client_broker};

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
            TicketError::InsufficientLease | TicketError::Protocol(_) => lock_exit::SOFTWARE,
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
                return fail(exit_code(&e), format_args!("{}: {e}", args.key));
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
            eprintln!("ticketing lock: release of {} failed: {e}", args.key);
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

mod bench {
    //! `ticketing bench`: acquire+release pairs from many tasks.

    use std::io::{IsTerminal, Write};
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use hdrhistogram::Histogram;
    use ticketing_tokio::config::BenchArgs;
    use ticketing_tokio::{ReleaseOutcome, TicketBroker};

    use super::{CONNECT_TIMEOUT, ClientOptions, client_broker};

    /// Progress line refresh interval.
    const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
    /// Highest latency the histogram records (longer ones are clamped).
    const LATENCY_MAX_MICROS: u64 = 300_000_000;

    pub fn run(args: &BenchArgs) -> ExitCode {
        if args.clients == 0 || args.keys == 0 || args.ops == 0 {
            eprintln!("ticketing bench: --clients, --keys and --ops must be positive");
            return ExitCode::from(2);
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("ticketing bench: cannot start: {e}");
                return ExitCode::from(1);
            }
        };
        runtime.block_on(bench(args))
    }

    struct Totals {
        histogram: Histogram<u64>,
        errors: Vec<String>,
    }

    async fn bench(args: &BenchArgs) -> ExitCode {
        let options = ClientOptions {
            addrs: &args.addrs,
            token: args.token.as_deref(),
            tls_ca: args.tls_ca.as_deref(),
            tls_system_roots: false,
            cluster_identity: args.cluster_identity,
        };
        let broker = match client_broker(&options) {
            Ok(broker) => broker,
            Err(e) => {
                eprintln!("ticketing bench: {e}");
                return ExitCode::from(2);
            }
        };
        if !broker.wait_ready(CONNECT_TIMEOUT).await {
            eprintln!(
                "ticketing bench: cannot connect to {}",
                args.addrs.join(", ")
            );
            return ExitCode::from(1);
        }
        let claimed = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(args.clients);
        for client in 0..args.clients {
            tasks.push(tokio::spawn(worker(
                broker.clone(),
                args.clone(),
                client,
                Arc::clone(&claimed),
                Arc::clone(&done),
            )));
        }
        let progress = std::io::stderr()
            .is_terminal()
            .then(|| tokio::spawn(show_progress(Arc::clone(&done), args.ops, started)));
        let mut histogram = new_histogram();
        let mut errors: Vec<String> = Vec::new();
        for task in tasks {
            match task.await {
                Ok(totals) => {
                    histogram
                        .add(&totals.histogram)
                        .expect("histograms share bounds");
                    errors.extend(totals.errors);
                }
                Err(e) => errors.push(format!("task failed: {e}")),
            }
        }
        let elapsed = started.elapsed();
        if let Some(progress) = progress {
            progress.abort();
            eprint!("\r\x1b[K");
        }
        broker.close().await;

        let ok = histogram.len();
        let rate = ok as f64 / elapsed.as_secs_f64();
        println!(
            "{ok} acquire+release pairs in {:.2} s: {rate:.0} ops/s ({} clients, {} keys)",
            elapsed.as_secs_f64(),
            args.clients,
            args.keys
        );
        println!(
            "latency (acquire+release): p50 {} p99 {} p99.9 {} max {}",
            micros(histogram.value_at_quantile(0.5)),
            micros(histogram.value_at_quantile(0.99)),
            micros(histogram.value_at_quantile(0.999)),
            micros(histogram.max()),
        );
        if errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            let mut counts = std::collections::BTreeMap::new();
            for error in &errors {
                *counts.entry(error.as_str()).or_insert(0u64) += 1;
            }
            for (error, count) in counts {
                println!("errors: {count} × {error}");
            }
            ExitCode::from(1)
        }
    }

    fn new_histogram() -> Histogram<u64> {
        Histogram::new_with_bounds(1, LATENCY_MAX_MICROS, 3).expect("valid histogram bounds")
    }

    fn micros(value: u64) -> String {
        if value >= 10_000 {
            format!("{:.1} ms", value as f64 / 1000.0)
        } else {
            format!("{value} µs")
        }
    }

    async fn worker(
        broker: TicketBroker,
        args: BenchArgs,
        client: usize,
        claimed: Arc<AtomicU64>,
        done: Arc<AtomicU64>,
    ) -> Totals {
        let mut totals = Totals {
            histogram: new_histogram(),
            errors: Vec::new(),
        };
        // xorshift64 seeded per client: a spread of keys with no shared RNG.
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (client as u64 + 1).wrapping_mul(0x2545_f491);
        while claimed.fetch_add(1, Ordering::Relaxed) < args.ops {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = format!("bench-{}", state % args.keys as u64);
            let started = Instant::now();
            let result = match broker
                .acquire(&key, args.wait, args.lease, args.budget)
                .await
            {
                Ok(ticket) => ticket.release().await.and_then(|outcome| match outcome {
                    ReleaseOutcome::Released => Ok(()),
                    ReleaseOutcome::AlreadyGoneOrNotCurrent => Err(
                        ticketing_tokio::TicketError::Protocol("lease lapsed".into()),
                    ),
                }),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                    totals
                        .histogram
                        .saturating_record(micros.clamp(1, LATENCY_MAX_MICROS));
                }
                Err(e) => totals.errors.push(e.to_string()),
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        totals
    }

    async fn show_progress(done: Arc<AtomicU64>, ops: u64, started: Instant) {
        let mut interval = tokio::time::interval(PROGRESS_INTERVAL);
        loop {
            interval.tick().await;
            let count = done.load(Ordering::Relaxed);
            let rate = count as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[K{count}/{ops} pairs, {rate:.0} ops/s");
            let _ = stderr.flush();
        }
    }
}
