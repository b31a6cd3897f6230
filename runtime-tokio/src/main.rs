//! `ticketing`: the Ticketing daemon.
//!
//! Exit codes: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when the server
//! cannot start (for example the address is in use), 2 for a bad command line
//! or config.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use ticketing_tokio::config::{self, AuthMode, Cli, Command, Env, ServeArgs};
use ticketing_tokio::spawn_server;
use tracing::{error, info};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(&args),
    }
}

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match config::load(args, &Env::from_process()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ticketing: config error: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&config.log_filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    fail_stop_on_panic();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ticketing: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        let listen = config.settings.listen;
        let server = match spawn_server(config.settings).await {
            Ok(server) => server,
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
