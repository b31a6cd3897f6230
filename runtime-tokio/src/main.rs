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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            match config::flag_value_error(&error) {
                Some(message) => eprintln!("ticketing: {message}; see --help"),
                None => {
                    let _ = error.print();
                }
            }
            if missed_the_separator(&error) {
                eprintln!(
                    "\ntip: the command goes after `--`: ticketing lock KEY [OPTIONS] -- CMD [ARGS...]"
                );
            }
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    if prints_to_stdout(&cli.command) {
        end_quietly_on_a_closed_stdout();
    }
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Lock(args) => cli_lock::run(args),
        Command::Elect(args) => cli_elect::run(args),
        Command::Bench(args) => bench::run(&args),
        Command::Identity => print_random_hex(),
        Command::Token => print_random_hex(),
        Command::Locks(command) => cli_admin::locks(command),
        Command::Status(args) => cli_admin::status(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "ticketing",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Man => {
            use clap::CommandFactory;
            match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ticketing: cannot write the manual page: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// True when `ticketing lock` met a word it does not know and no `--`
/// came before: most likely the command, given without the separator.
fn missed_the_separator(error: &clap::Error) -> bool {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    error.kind() == clap::error::ErrorKind::UnknownArgument
        && args.first().is_some_and(|first| first == "lock")
        && !args.iter().any(|arg| arg == "--")
}

/// The subcommands whose output is for a pipe (`| head`, `| grep`): the
/// server and `lock` (whose command owns stdout) are not among them.
fn prints_to_stdout(command: &Command) -> bool {
    match command {
        Command::Serve(_) | Command::Lock(_) => false,
        // Without --observe the command owns stdout.
        Command::Elect(args) => args.observe,
        _ => true,
    }
}

/// A reader that stops reading (`ticketing locks ls | head -1`) ends this
/// process as it ends every other filter: by SIGPIPE, quietly, instead of
/// a panic on the failed write (Rust ignores SIGPIPE by default).
fn end_quietly_on_a_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: called first thing in `main`, before any thread exists, to
    // restore the signal's default disposition; no handler is installed.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
                fatal(&format!("cannot listen on {listen}: {e}"));
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
        Err(e) if ticketing_tokio::cluster::RecoveryRefused::find(&e).is_some() => {
            // Like a config error: exit 2 with one line naming what is
            // missing, whatever the log level.
            eprintln!("ticketing: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            fatal(&format!(
                "cannot start the cluster node on {client} / {peer}: {e}"
            ));
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

/// Why the server stops, said once: as a log event when error events are
/// logged (in the log format chosen, so JSON logs stay JSON), else as a
/// plain line on stderr, so that it is never lost to `log_level = "off"`.
fn fatal(message: &str) {
    if tracing::enabled!(tracing::Level::ERROR) {
        error!("{message}");
    } else {
        eprintln!("ticketing: {message}");
    }
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

mod cli_elect;
mod cli_lock;

mod holder_files;

mod bench;

mod guard;
