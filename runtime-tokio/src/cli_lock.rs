//! `ticketing lock KEY -- CMD...`.

use std::process::ExitCode;

use ticketing_core::client::holder::StopPlan;

use crate::guard;
use crate::holder_files::HolderFiles;
use ticketing_core::client::{AcquireParams, campaign_params};
use ticketing_tokio::ReleaseOutcome;
use ticketing_tokio::client::Lost;
use ticketing_tokio::client::{LossCause, RenewEnd, RenewPolicy};
use ticketing_tokio::config::{LockArgs, lock_exit};
use ticketing_tokio::terminal::terminal_safe;
use ticketing_tokio::{Ticket, TicketError, TicketSet};

use crate::cli_client::{
    CONNECT_WAIT_MIN, ClientOptions, client_broker, connect_failure, exit_code,
};

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("ticketing lock: {message}");
    ExitCode::from(code)
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
    // Times that can never be served are a usage error, found before
    // connecting.
    if args.campaign
        && let Err(e) = campaign_params(args.lease)
    {
        return fail(lock_exit::USAGE, format_args!("--lease: {e}"));
    }
    let params = AcquireParams::new(args.wait, args.lease, args.budget)
        .and_then(|params| {
            args.max_hold
                .map_or(Ok(params), |max_hold| params.with_max_hold(max_hold))
        })
        .and_then(|params| match args.semaphore {
            Some(capacity) => params.with_permits(args.permits.unwrap_or(1), capacity),
            None => Ok(params),
        });
    if let Err(e) = params {
        let why = match e {
            TicketError::InsufficientLease => "--budget must not be longer than --lease".to_owned(),
            other => other.to_string(),
        };
        return fail(lock_exit::USAGE, why);
    }
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("ticketing-lock/{}", std::process::id()));
    let options = ClientOptions {
        addrs: &args.addrs,
        token: args.token.as_deref(),
        tls_ca: args.tls_ca.as_deref(),
        tls_system_roots: args.tls_system_roots,
        cluster_identity: args.cluster_identity,
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
    // Connecting counts against --wait: a user who would wait a second for
    // the lock would not wait five for a connection that may never work.
    let connect_wait = args.wait.max(CONNECT_WAIT_MIN);
    if !broker.wait_ready(connect_wait).await {
        let (code, why) = connect_failure(&broker, &options, connect_wait);
        broker.close().await;
        return fail(code, why);
    }
    let acquiring = async {
        match (args.semaphore, args.max_hold) {
            // An election: queue until leader, however long it takes.
            _ if args.campaign => broker
                .campaign(&args.key, args.lease)
                .await
                .map(Holding::Lock),
            (_, None) if args.shared => broker
                .acquire_shared(&args.key, args.wait, args.lease, args.budget)
                .await
                .map(Holding::Lock),
            (_, Some(max_hold)) if args.shared => broker
                .acquire_shared_capped(&args.key, args.wait, args.lease, args.budget, max_hold)
                .await
                .map(Holding::Lock),
            (Some(capacity), _) => {
                let permits = args.permits.unwrap_or(1);
                broker
                    .acquire_permits(
                        &args.key,
                        permits,
                        capacity,
                        args.wait,
                        args.lease,
                        args.budget,
                    )
                    .await
                    .map(Holding::Permits)
            }
            (None, None) => broker
                .acquire(&args.key, args.wait, args.lease, args.budget)
                .await
                .map(Holding::Lock),
            (None, Some(max_hold)) => broker
                .acquire_capped(&args.key, args.wait, args.lease, args.budget, max_hold)
                .await
                .map(Holding::Lock),
        }
    };
    let acquired = waiting_shown(&args.key, acquiring).await;
    let ticket = match acquired {
        Ok(ticket) => ticket,
        Err(e) => {
            broker.close().await;
            let key = terminal_safe(args.key.as_bytes());
            if let (TicketError::Unsupported(_), Some(_)) = (&e, args.semaphore) {
                return fail(
                    lock_exit::USAGE,
                    format_args!(
                        "{key}: the server does not serve semaphores (it speaks only the published protocol, or predates them): drop --semaphore, or upgrade the server"
                    ),
                );
            }
            if let (TicketError::Unsupported(_), true) = (&e, args.shared) {
                return fail(
                    lock_exit::USAGE,
                    format_args!(
                        "{key}: the server does not serve shared locks (it speaks only the published protocol, or predates them): drop --shared, or upgrade the server"
                    ),
                );
            }
            if let TicketError::Unsupported(_) = e {
                return fail(
                    lock_exit::USAGE,
                    format_args!(
                        "{key}: the server does not take --max-hold (it speaks only the published protocol): drop --max-hold, or upgrade the server"
                    ),
                );
            }
            if let TicketError::InsufficientLease = e {
                return fail(
                    exit_code(&e),
                    format_args!(
                        "{key}: granted with less than --budget of its lease left (the lease counts from the request, and the wait used it up): give a --lease longer than the --wait, or a smaller --budget"
                    ),
                );
            }
            return fail(exit_code(&e), format_args!("{key}: {e}"));
        }
    };
    let status = match HolderFiles::create() {
        Ok(files) => {
            let status = run_command(&args, &ticket, &files).await;
            files.remove();
            status
        }
        Err(e) => {
            eprintln!("ticketing lock: cannot create the deadline and notify files: {e}");
            Err(lock_exit::CANNOT_RUN)
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

/// What `ticketing lock` holds while the command runs: a lock, or permits
/// of a semaphore. Both are renewed, watched and released alike.
enum Holding {
    Lock(Ticket),
    Permits(TicketSet),
}

impl Holding {
    fn token(&self) -> u64 {
        match self {
            Holding::Lock(ticket) => ticket.token(),
            Holding::Permits(set) => set.token(),
        }
    }
    fn deadline(&self) -> std::time::Instant {
        match self {
            Holding::Lock(ticket) => ticket.deadline(),
            Holding::Permits(set) => set.deadline(),
        }
    }
    fn remaining(&self) -> std::time::Duration {
        match self {
            Holding::Lock(ticket) => ticket.remaining(),
            Holding::Permits(set) => set.remaining(),
        }
    }
    fn lost_within(&self, lead: std::time::Duration) -> Lost<'_> {
        match self {
            Holding::Lock(ticket) => ticket.lost_within(lead),
            Holding::Permits(set) => set.lost_within(lead),
        }
    }
    fn lost(&self) -> Lost<'_> {
        self.lost_within(std::time::Duration::ZERO)
    }
    async fn keep_alive(&self, policy: RenewPolicy, progress: impl FnMut() -> bool) -> RenewEnd {
        match self {
            Holding::Lock(ticket) => ticket.keep_alive(policy, progress).await,
            Holding::Permits(set) => set.keep_alive(policy, progress).await,
        }
    }
    async fn release(self) -> Result<ReleaseOutcome, TicketError> {
        match self {
            Holding::Lock(ticket) => ticket.release().await,
            Holding::Permits(set) => set.release().await,
        }
    }
    /// The slots held, comma-separated, for a semaphore's permits.
    fn slots(&self) -> Option<String> {
        match self {
            Holding::Lock(_) => None,
            Holding::Permits(set) => Some(
                set.slots()
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        }
    }
}

/// Runs `acquiring`, showing on a terminal's stderr, once a second has
/// passed, which key it waits for and for how long; the line is cleared
/// when the wait ends. Nothing is shown when stderr is not a terminal.
async fn waiting_shown<T>(key: &str, acquiring: impl std::future::Future<Output = T>) -> T {
    use std::io::{IsTerminal, Write};
    if !std::io::stderr().is_terminal() {
        return acquiring.await;
    }
    let key = terminal_safe(key.as_bytes());
    let started = tokio::time::Instant::now();
    let second = std::time::Duration::from_secs(1);
    let mut tick = tokio::time::interval_at(started + second, second);
    let mut shown = false;
    tokio::pin!(acquiring);
    let result = loop {
        tokio::select! {
            result = &mut acquiring => break result,
            _ = tick.tick() => {
                shown = true;
                let mut stderr = std::io::stderr().lock();
                let _ = write!(stderr, "\rticketing lock: waiting for {key}: {}s", started.elapsed().as_secs());
                let _ = stderr.flush();
            }
        }
    };
    if shown {
        // Erase the line: after the wait nothing of it stays.
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K");
        let _ = stderr.flush();
    }
    result
}

/// Spawns the command under `ticket` and waits for it.
async fn run_command(
    args: &LockArgs,
    ticket: &Holding,
    files: &HolderFiles,
) -> Result<std::process::ExitStatus, u8> {
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let deadline = ticket.deadline();
    files.write_deadline(unix_ms(deadline));
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("TICKETING_KEY", &args.key)
        .env("TICKETING_TOKEN", ticket.token().to_string())
        .env(
            "TICKETING_MODE",
            if args.shared { "shared" } else { "exclusive" },
        )
        .env("TICKETING_DEADLINE_UNIX_MS", unix_ms(deadline).to_string())
        .env("TICKETING_DEADLINE_FILE", files.deadline_path())
        .env("TICKETING_NOTIFY", files.notify_path())
        .env("TICKETING_PROGRESS_FILE", files.progress_path());
    if let Some(slots) = ticket.slots() {
        command.env("TICKETING_SLOTS", slots);
    }
    if args.campaign {
        // An election's term is its leader's fencing token.
        command.env("TICKETING_TERM", ticket.token().to_string());
    }
    if !args.no_kill {
        // Today's behaviour with --no-kill: the command stays in this
        // process group, where it may read the terminal.
        guard::own_group_ended_with_us(&mut command);
    }
    match command.spawn() {
        Ok(mut child) => wait_child(&mut child, args, ticket, files).await,
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

/// How long a command whose lock is already gone (pushed, or a renewal
/// found it gone) gets between SIGTERM and SIGKILL at most: the key may
/// be someone else's already.
const LOST_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the deadline file is brought up to date with renewals.
const DEADLINE_FILE_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits for the command. Unless `--no-kill`, its process group is
/// stopped before the lease could lapse (by the core's [`StopPlan`]), at
/// once when the lock is lost, and the exit is [`lock_exit::LOST`]; with
/// `--no-kill` it only warns once when the lock is lost. With `--renew` the
/// ticket renews itself meanwhile. SIGINT and SIGTERM received are passed
/// on to the command's group, and this waits for it to exit.
async fn wait_child(
    child: &mut tokio::process::Child,
    args: &LockArgs,
    ticket: &Holding,
    files: &HolderFiles,
) -> Result<std::process::ExitStatus, u8> {
    let stop = !args.no_kill;
    let left = ticket.remaining();
    let plan = StopPlan::for_deadline(left, args.kill_after);
    // The leads before the deadline at which the command is asked, and
    // made, to stop: the plan's, kept as renewals move the deadline.
    let ask = ticket.lost_within(left.saturating_sub(plan.ask_in));
    let force = ticket.lost_within(left.saturating_sub(plan.force_in));
    let lost = ticket.lost();
    let progress = files.progress(args.progress_timeout);
    let renewal = async {
        if args.renew {
            ticket
                .keep_alive(RenewPolicy::thirds(args.lease), || progress.shows_life())
                .await
        } else {
            std::future::pending().await
        }
    };
    let far = std::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3_600);
    let mut lost_grace_end = std::pin::pin!(tokio::time::sleep_until(far.into()));
    tokio::pin!(ask, force, lost, renewal);
    let (mut asked, mut forced, mut warned, mut renewing) = (false, false, false, args.renew);
    let mut deadline_tick = tokio::time::interval(DEADLINE_FILE_PERIOD);
    let mut written = ticket.deadline();
    let group = child.id();
    let mut signals = Signals::new();
    let mut notify = files.notify_socket();
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| {
                    eprintln!("ticketing lock: waiting for the command failed: {e}");
                    lock_exit::SOFTWARE
                })?;
                if stop {
                    // Whatever else of its group still runs goes too:
                    // the lock is about to be released.
                    guard::signal_group(group, guard::Stop::Kill);
                }
                return if asked { Err(lock_exit::LOST) } else { Ok(status) };
            }
            end = &mut renewal, if renewing => {
                renewing = false;
                report_renewal_end(end, args);
            }
            cause = &mut ask, if stop && !asked => {
                asked = true;
                if cause == LossCause::Deadline {
                    eprintln!(
                        "ticketing lock: the lease ends in {} ms: stopping the command (SIGTERM)",
                        ticket.deadline().saturating_duration_since(std::time::Instant::now()).as_millis()
                    );
                } else {
                    eprintln!("ticketing lock: lock lost ({cause}): stopping the command (SIGTERM)");
                    lost_grace_end.as_mut().reset((std::time::Instant::now() + LOST_GRACE.min(args.kill_after)).into());
                }
                guard::signal_group(group, guard::Stop::Ask);
            }
            cause = &mut force, if asked && !forced => {
                forced = true;
                eprintln!("ticketing lock: the command did not stop: SIGKILL before the lease ends ({cause})");
                guard::signal_group(group, guard::Stop::Kill);
            }
            () = &mut lost_grace_end, if asked && !forced => {
                forced = true;
                eprintln!("ticketing lock: the command did not stop: SIGKILL (the lock is lost)");
                guard::signal_group(group, guard::Stop::Kill);
            }
            cause = &mut lost, if !stop && !warned => {
                warned = true;
                if cause == LossCause::Deadline {
                    eprintln!("ticketing lock: warning: the lease has lapsed while the command runs; the lock no longer excludes others");
                } else {
                    eprintln!("ticketing lock: warning: lock lost ({cause}) while the command runs; the lock no longer excludes others");
                }
            }
            _ = deadline_tick.tick() => {
                let deadline = ticket.deadline();
                if deadline != written {
                    written = deadline;
                    files.write_deadline(unix_ms(deadline));
                }
            }
            () = notified(&mut notify) => progress.beat(),
            terminate = signals.recv() => {
                if stop {
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

/// Says why renewal stopped (the stop itself follows from the deadline).
fn report_renewal_end(end: RenewEnd, args: &LockArgs) {
    match end {
        // The stop follows from the loss itself.
        RenewEnd::Lost(_) | RenewEnd::Closed => {}
        RenewEnd::NoProgress => eprintln!(
            "ticketing lock: the command showed no life for {:?}: renewal stopped; it is stopped before the lease ends",
            args.progress_timeout.unwrap_or_default()
        ),
        RenewEnd::AtCap => eprintln!(
            "ticketing lock: the hold cap is reached: renewal stopped; the command is stopped before the lease ends"
        ),
        RenewEnd::Unsupported(_) => eprintln!(
            "ticketing lock: the server does not renew leases (it speaks only the published protocol): the command is stopped before the lease ends; drop --renew or upgrade the server"
        ),
    }
}

/// Resolves when a datagram arrives on the notify socket (never without
/// one).
async fn notified(socket: &mut Option<tokio::net::UnixDatagram>) {
    let Some(receiver) = socket.as_ref() else {
        return std::future::pending().await;
    };
    let mut buffer = [0u8; 64];
    if receiver.recv(&mut buffer).await.is_err() {
        // A broken socket shows no life from then on.
        *socket = None;
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
