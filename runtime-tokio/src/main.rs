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

    use ticketing_core::client::holder::StopPlan;

    use crate::guard;
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
        let valid_before = ticket.conservative_valid_before();
        let mut command = tokio::process::Command::new(program);
        command
            .args(rest)
            .env("TICKETING_KEY", &args.key)
            .env("TICKETING_TOKEN", ticket.token().to_string())
            .env(
                "TICKETING_DEADLINE_UNIX_MS",
                unix_ms(valid_before).to_string(),
            );
        if !args.no_kill {
            // Today's behaviour with --no-kill: the command stays in this
            // process group, where it may read the terminal.
            guard::own_group_ended_with_us(&mut command);
        }
        let spawned = command.spawn();
        let status = match spawned {
            Ok(mut child) => {
                let stop = (!args.no_kill).then_some(args.kill_after);
                wait_child(&mut child, valid_before, stop).await
            }
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

    /// `at` as milliseconds since the Unix epoch by this machine's clock.
    fn unix_ms(at: std::time::Instant) -> u128 {
        let wall = std::time::SystemTime::now();
        let now = std::time::Instant::now();
        let at_wall = match at.checked_duration_since(now) {
            Some(ahead) => wall + ahead,
            None => wall - now.duration_since(at),
        };
        at_wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis())
    }

    /// Waits for the command. With `stop` (the grace between SIGTERM and
    /// SIGKILL), its process group is stopped before the lease could
    /// lapse, by the core's [`StopPlan`], and the exit is [`lock_exit::LOST`];
    /// without, it only warns once when the lease lapses (the lock no
    /// longer excludes anyone). SIGINT and SIGTERM received are passed on
    /// to the command's group, and this waits for it to exit.
    async fn wait_child(
        child: &mut tokio::process::Child,
        valid_before: std::time::Instant,
        stop: Option<std::time::Duration>,
    ) -> Result<std::process::ExitStatus, u8> {
        let now = std::time::Instant::now();
        let left = valid_before.saturating_duration_since(now);
        let plan = stop.map(|grace| StopPlan::for_deadline(left, grace));
        let far = now + std::time::Duration::from_secs(365 * 24 * 3_600);
        let ask_at = plan.map_or(far, |plan| now + plan.ask_in);
        let force_at = plan.map_or(far, |plan| now + plan.force_in);
        let ask = tokio::time::sleep_until(ask_at.into());
        let force = tokio::time::sleep_until(force_at.into());
        let lapse = tokio::time::sleep_until(valid_before.into());
        tokio::pin!(ask, force, lapse);
        let (mut asked, mut forced, mut warned) = (false, false, stop.is_some());
        let group = child.id();
        let mut signals = Signals::new();
        loop {
            tokio::select! {
                status = child.wait() => {
                    let status = status.map_err(|e| {
                        eprintln!("ticketing lock: waiting for the command failed: {e}");
                        lock_exit::SOFTWARE
                    })?;
                    if stop.is_some() {
                        // Whatever else of its group still runs goes too:
                        // the lock is about to be released.
                        guard::signal_group(group, guard::Stop::Kill);
                    }
                    return if asked { Err(lock_exit::LOST) } else { Ok(status) };
                }
                () = &mut ask, if !asked => {
                    asked = true;
                    eprintln!(
                        "ticketing lock: the lease ends in {} ms and is not renewed: stopping the command (SIGTERM)",
                        valid_before.saturating_duration_since(std::time::Instant::now()).as_millis()
                    );
                    guard::signal_group(group, guard::Stop::Ask);
                }
                () = &mut force, if asked && !forced => {
                    forced = true;
                    eprintln!("ticketing lock: the command did not stop: SIGKILL before the lease ends");
                    guard::signal_group(group, guard::Stop::Kill);
                }
                () = &mut lapse, if !warned => {
                    warned = true;
                    eprintln!("ticketing lock: warning: the lease has lapsed while the command runs; the lock no longer excludes others");
                }
                terminate = signals.recv() => {
                    if stop.is_some() {
                        // Its own group: the terminal's SIGINT did not
                        // reach it.
                        let signal = if terminate { guard::Stop::Ask } else { guard::Stop::Interrupt };
                        guard::signal_group(group, signal);
                    } else if terminate {
                        // In our group: SIGINT reached it from the
                        // terminal; SIGTERM did not.
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

/// The guarded command's process: its own process group (so a stop
/// reaches everything it started), ended by the kernel if this CLI dies
/// (Linux), and signalled as a group.
mod guard {
    /// A signal to the command's group.
    #[derive(Clone, Copy, Debug)]
    pub(crate) enum Stop {
        /// SIGINT, passed on from the terminal.
        Interrupt,
        /// SIGTERM: stop now, cleanly.
        Ask,
        /// SIGKILL.
        Kill,
    }

    /// Makes the command a process group of its own, ended with SIGTERM
    /// when this process dies.
    #[cfg(unix)]
    pub(crate) fn own_group_ended_with_us(command: &mut tokio::process::Command) {
        command.process_group(0);
        #[cfg(target_os = "linux")]
        {
            let parent = rustix::process::getpid();
            // SAFETY: the closure runs in the child between fork and exec,
            // where only async-signal-safe calls are allowed: it makes two
            // raw system calls (prctl, getppid) and allocates nothing.
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(move || {
                    rustix::process::set_parent_process_death_signal(Some(
                        rustix::process::Signal::TERM,
                    ))?;
                    // This CLI died before the request took hold: its
                    // lock is not ours to run under.
                    if rustix::process::getppid() != Some(parent) {
                        return Err(std::io::Error::other("ticketing lock exited"));
                    }
                    Ok(())
                });
            }
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn own_group_ended_with_us(_command: &mut tokio::process::Command) {}

    /// Sends `stop` to the process group led by `leader` (the command's
    /// pid); nothing if it is gone.
    #[cfg(unix)]
    pub(crate) fn signal_group(leader: Option<u32>, stop: Stop) {
        use rustix::process::{Pid, Signal, kill_process_group};
        let Some(pid) = leader
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
        else {
            return;
        };
        let signal = match stop {
            Stop::Interrupt => Signal::INT,
            Stop::Ask => Signal::TERM,
            Stop::Kill => Signal::KILL,
        };
        // ESRCH: the group is gone already, which is what was wanted.
        let _ = kill_process_group(pid, signal);
    }

    #[cfg(not(unix))]
    pub(crate) fn signal_group(_leader: Option<u32>, _stop: Stop) {}
}
