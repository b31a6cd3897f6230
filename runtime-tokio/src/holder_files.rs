//! The files `ticketing lock` shares with its command, in a private
//! directory made for the one run (mode 0700, a fresh name, never an
//! existing path, so no link planted beforehand is followed): the current
//! deadline, the socket the command reports life on, and the file it may
//! touch instead.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The run's directory and what it holds.
pub(crate) struct HolderFiles {
    dir: PathBuf,
}

impl HolderFiles {
    /// Makes the directory under the system's temporary directory.
    pub(crate) fn create() -> std::io::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("ticketing-lock-{}-{nanos:09}", std::process::id()));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        // Not `create_all`: an existing path, a planted link included, is
        // an error rather than something to write through.
        builder.create(&dir)?;
        let files = HolderFiles { dir };
        // Created now, so its age counts from the start.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(files.progress_path())?;
        Ok(files)
    }

    /// `TICKETING_DEADLINE_FILE`: the deadline in Unix milliseconds.
    pub(crate) fn deadline_path(&self) -> PathBuf {
        self.dir.join("deadline")
    }

    /// `TICKETING_NOTIFY`: a datagram socket; any datagram is a sign of
    /// life.
    pub(crate) fn notify_path(&self) -> PathBuf {
        self.dir.join("notify.sock")
    }

    /// `TICKETING_PROGRESS_FILE`: touching it is a sign of life.
    pub(crate) fn progress_path(&self) -> PathBuf {
        self.dir.join("progress")
    }

    /// Replaces the deadline file whole (a reader never sees half a
    /// number). A failure is reported and the old value stays: the
    /// environment's first deadline is still a safe bound.
    pub(crate) fn write_deadline(&self, unix_ms: u128) {
        let next = self.dir.join("deadline.next");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&next)
            .and_then(|mut file| {
                std::io::Write::write_all(&mut file, format!("{unix_ms}\n").as_bytes())
            })
            .and_then(|()| std::fs::rename(&next, self.deadline_path()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&next);
            eprintln!("ticketing lock: cannot update the deadline file: {e}");
        }
    }

    /// The notify socket, bound; `None` (reported) if it cannot be.
    pub(crate) fn notify_socket(&self) -> Option<tokio::net::UnixDatagram> {
        match tokio::net::UnixDatagram::bind(self.notify_path()) {
            Ok(socket) => Some(socket),
            Err(e) => {
                eprintln!("ticketing lock: cannot open the notify socket: {e}");
                None
            }
        }
    }

    /// The progress check of `--progress-timeout` (always alive without).
    pub(crate) fn progress(&self, timeout: Option<Duration>) -> Progress {
        Progress {
            timeout,
            last_beat: Cell::new(Instant::now()),
            file: self.progress_path(),
        }
    }

    /// Removes the directory and what is in it.
    pub(crate) fn remove(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("ticketing lock: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// When the command last showed life.
pub(crate) struct Progress {
    timeout: Option<Duration>,
    last_beat: Cell<Instant>,
    file: PathBuf,
}

impl Progress {
    /// A datagram arrived.
    pub(crate) fn beat(&self) {
        self.last_beat.set(Instant::now());
    }

    /// True if the command showed life within the timeout (a datagram, or
    /// the file touched).
    pub(crate) fn shows_life(&self) -> bool {
        let Some(timeout) = self.timeout else {
            return true;
        };
        let since_beat = self.last_beat.get().elapsed();
        since_beat <= timeout || touched_within(&self.file, timeout)
    }
}

/// True if `file` (never followed if a link) was modified within `within`.
fn touched_within(file: &Path, within: Duration) -> bool {
    std::fs::symlink_metadata(file)
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok())
        .is_some_and(|age| age <= within)
}
