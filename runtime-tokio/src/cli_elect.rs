//! `ticketing elect NAME -- CMD` (campaign, then run CMD as
//! `ticketing lock` does, with `TICKETING_TERM`) and
//! `ticketing elect NAME --observe` (print who leads, and every change).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use ticketing_tokio::TicketError;
use ticketing_tokio::client::Leader;
use ticketing_tokio::config::{ElectArgs, LockArgs, lock_exit};
use ticketing_tokio::terminal::terminal_safe;

use crate::cli_client::{
    CONNECT_WAIT_MIN, ClientOptions, client_broker, connect_failure, exit_code,
};

/// How long the first connection may take.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// The bounds of `--interval`.
const INTERVAL_MIN: Duration = Duration::from_millis(100);
const INTERVAL_MAX: Duration = Duration::from_secs(60);

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("ticketing elect: {message}");
    ExitCode::from(code)
}

pub fn run(args: ElectArgs) -> ExitCode {
    if args.observe {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => return fail(lock_exit::SOFTWARE, format_args!("cannot start: {e}")),
        };
        return runtime.block_on(observe(args));
    }
    // A candidate is `ticketing lock` that campaigns instead of trying
    // once, renews while it leads, and names the term.
    let label = args
        .label
        .unwrap_or_else(|| format!("ticketing-elect/{}", std::process::id()));
    crate::cli_lock::run(LockArgs {
        key: args.name,
        addrs: args.addrs,
        token: args.token,
        cluster_identity: None,
        // Only how long to keep trying to connect: a campaign waits for
        // leadership however long it takes.
        wait: CONNECT_WAIT.max(CONNECT_WAIT_MIN),
        lease: args.lease,
        // A campaign's grant comes with a third of its lease left at least.
        budget: Duration::from_secs(args.lease.as_secs() / 3),
        kill_after: args.kill_after,
        no_kill: false,
        renew: true,
        max_hold: None,
        semaphore: None,
        permits: None,
        shared: false,
        progress_timeout: None,
        label: Some(label),
        tls_ca: args.tls_ca,
        tls_system_roots: args.tls_system_roots,
        command: args.command,
        campaign: true,
    })
}

/// One line of `--observe`: who leads, as the server answered.
fn describe(leader: Option<&Leader>) -> String {
    let Some(leader) = leader else {
        return "no leader".to_owned();
    };
    let label = if leader.label.is_empty() {
        // A holder that negotiated no label (a published client, or one
        // that gave none), or a dead one whose label is no longer kept.
        "(no label)".to_owned()
    } else {
        terminal_safe(leader.label.as_bytes()).to_string()
    };
    if leader.connected {
        format!("leader {label} term {}", leader.term)
    } else {
        format!(
            "leader {label} term {} (its connection is gone; it leads until its lease ends, in {} ms at most)",
            leader.term,
            leader.lease_remaining.as_millis()
        )
    }
}

/// What a change is judged by: the lease left changes every poll and is
/// not news.
fn identity(leader: Option<&Leader>) -> Option<(u64, &str, bool)> {
    leader.map(|leader| (leader.term, leader.label.as_str(), leader.connected))
}

async fn observe(args: ElectArgs) -> ExitCode {
    if !(INTERVAL_MIN..=INTERVAL_MAX).contains(&args.interval) {
        return fail(lock_exit::USAGE, "--interval must be 100ms..=60s");
    }
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("ticketing-elect-observer/{}", std::process::id()));
    let options = ClientOptions {
        addrs: &args.addrs,
        token: args.token.as_deref(),
        tls_ca: args.tls_ca.as_deref(),
        tls_system_roots: args.tls_system_roots,
        cluster_identity: None,
        label: Some(&label),
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
    if !broker.wait_ready(CONNECT_WAIT).await {
        let (code, why) = connect_failure(&broker, &options, CONNECT_WAIT);
        broker.close().await;
        return fail(code, why);
    }
    let name = terminal_safe(args.name.as_bytes()).to_string();
    let mut shown: Option<Option<(u64, String, bool)>> = None;
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let code = loop {
        tokio::select! {
            _ = &mut interrupted => break ExitCode::SUCCESS,
            _ = tick.tick() => {}
        }
        match broker.observe(&args.name).await {
            Ok(leader) => {
                let now = identity(leader.as_ref())
                    .map(|(term, label, connected)| (term, label.to_owned(), connected));
                if shown.as_ref() != Some(&now) {
                    let mut stdout = std::io::stdout().lock();
                    let _ = writeln!(stdout, "{}", describe(leader.as_ref()));
                    let _ = stdout.flush();
                    shown = Some(now);
                }
            }
            Err(TicketError::Unsupported(_)) => {
                break fail(
                    lock_exit::USAGE,
                    format_args!(
                        "{name}: the server does not serve observing (it speaks only the published protocol, or predates it): upgrade the server"
                    ),
                );
            }
            // The broker reconnects: say so once per failed poll and ask
            // again at the next tick.
            Err(
                e @ (TicketError::Timeout | TicketError::NotConnected | TicketError::Indeterminate),
            ) => {
                eprintln!("ticketing elect: {name}: no answer this time ({e}); asking again");
            }
            Err(e) => break fail(exit_code(&e), format_args!("{name}: {e}")),
        }
    };
    broker.close().await;
    code
}
