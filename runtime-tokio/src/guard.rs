//! The guarded command's process: its own process group (so a stop
//! reaches everything it started), ended by the kernel if this CLI dies
//! (Linux), and signalled as a group.

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
