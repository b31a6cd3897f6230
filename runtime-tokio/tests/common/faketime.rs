//! libfaketime for child processes: their wall clock shifted, to test that
//! fencing tokens survive a clock stepped back.

use std::path::PathBuf;
use std::process::Command;

/// libfaketime's preload library (Debian's `faketime` package).
pub fn libfaketime() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("libfaketime not found: install the `faketime` package (.ci/run does)")
}

/// Runs `command` with its clocks shifted by `offset` (`-1h`). Preloaded
/// directly rather than through the `faketime` wrapper, so that the child
/// is the server itself and SIGKILL reaches it.
pub fn shift_clock(command: &mut Command, offset: &str) {
    command
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", offset);
}
