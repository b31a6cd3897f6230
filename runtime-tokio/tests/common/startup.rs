//! Waiting for a `ticketing serve` child to listen by its own word: its
//! startup line ("ticketing server listening", at `info`), not by polling
//! its port, which would both sleep and race with the bind.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a child may take to print its startup line.
pub const STARTUP: Duration = Duration::from_secs(10);

/// A child's startup line, its log so far and from now on, and the thread
/// that keeps its stderr drained into that log (it ends when the child
/// does).
pub struct Started {
    /// The startup line.
    pub line: String,
    /// Every stderr line, the startup line included.
    pub log: Arc<Log>,
    /// The reader of the child's stderr.
    pub reader: JoinHandle<()>,
}

/// A child's stderr lines as they arrive, with a signal for each new one,
/// so that a test waits for a line rather than polling for it.
#[derive(Default)]
pub struct Log {
    lines: Mutex<Vec<String>>,
    arrived: Condvar,
}

#[allow(dead_code)] // Not every test file that shares this module waits on lines.
impl Log {
    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
        self.arrived.notify_all();
    }

    /// Every line so far.
    pub fn lines(&self) -> MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap()
    }

    /// Waits, up to `timeout`, until `found` answers `Some` for the lines
    /// so far, checking again each time a line arrives; `None` if it never
    /// does in time.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        mut found: impl FnMut(&[String]) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut lines = self.lines.lock().unwrap();
        loop {
            if let Some(answer) = found(&lines) {
                return Some(answer);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            lines = self.arrived.wait_timeout(lines, left).unwrap().0;
        }
    }
}

/// Reads the child's stderr (it must be piped, with `info` logging) until
/// its startup line; every line, that one included and the later ones, is
/// collected into the log by a thread that keeps the pipe drained. Panics
/// if the child prints no startup line within [`STARTUP`].
pub fn await_listening(child: &mut Child) -> Started {
    let stderr = child.stderr.take().expect("stderr piped");
    let log = Arc::new(Log::default());
    let sink = Arc::clone(&log);
    let (started_tx, started_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("ticketing server listening") {
                let _ = started_tx.send(line.clone());
            }
            sink.push(line);
        }
    });
    let line = started_rx.recv_timeout(STARTUP).unwrap_or_else(|_| {
        panic!(
            "no startup line within {STARTUP:?} (exited: {:?}); log: {:?}",
            child.try_wait().ok().flatten(),
            log.lines()
        )
    });
    Started { line, log, reader }
}
