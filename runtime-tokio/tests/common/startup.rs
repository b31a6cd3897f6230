//! Waiting for a `ticketing serve` child to listen by its own word: its
//! startup line ("ticketing server listening", at `info`), not by polling
//! its port, which would both sleep and race with the bind.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a child may take to print its startup line.
pub const STARTUP: Duration = Duration::from_secs(10);

/// A child's startup line, its log so far and from now on, and the thread
/// that keeps its stderr drained into that log (it ends when the child
/// does).
pub struct Started {
    /// The startup line.
    pub line: String,
    /// Every stderr line, the startup line included.
    pub log: Arc<Mutex<Vec<String>>>,
    /// The reader of the child's stderr.
    pub reader: JoinHandle<()>,
}

/// Reads the child's stderr (it must be piped, with `info` logging) until
/// its startup line; every line, that one included and the later ones, is
/// collected into the log by a thread that keeps the pipe drained. Panics
/// if the child prints no startup line within [`STARTUP`].
pub fn await_listening(child: &mut Child) -> Started {
    let stderr = child.stderr.take().expect("stderr piped");
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    let (started_tx, started_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("ticketing server listening") {
                let _ = started_tx.send(line.clone());
            }
            sink.lock().unwrap().push(line);
        }
    });
    let line = started_rx.recv_timeout(STARTUP).unwrap_or_else(|_| {
        panic!(
            "no startup line within {STARTUP:?} (exited: {:?}); log: {:?}",
            child.try_wait().ok().flatten(),
            log.lock().unwrap()
        )
    });
    Started { line, log, reader }
}
