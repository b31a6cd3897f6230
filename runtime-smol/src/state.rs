//! The embedded server's optional token-floor state file
//! ([`crate::EmbeddedServerBuilder::state_dir`]): the same format and steps
//! as the daemon's (`ticketing_tokio::state`). The core decides what to
//! store and when ([`ticketing_core::reserve`]); this only reads and writes.
//!
//! A sibling `.lock` file is held with an exclusive `flock` while the
//! server runs, so two servers never share one file. A write is:
//! temporary file, write, fsync, rename, fsync the folder.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ticketing_core::reserve;

/// An open, locked state file.
#[derive(Debug)]
pub(crate) struct FloorFile {
    dir: PathBuf,
    path: PathBuf,
    temp: PathBuf,
    /// Held while the server runs: the `flock` goes with it.
    _lock: File,
}

/// An error naming the field and the path, like the daemon's.
fn error(path: &Path, message: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("state_dir: {}: {message}", path.display()))
}

impl FloorFile {
    /// Creates `dir` if missing, takes the lock and reads the stored
    /// reserve (`None`: no file yet). A damaged file is an error, never a
    /// reset: a reset could let fencing tokens go down.
    pub(crate) fn open(dir: &Path, name: &str) -> io::Result<(FloorFile, Option<u64>)> {
        fs::create_dir_all(dir)
            .map_err(|e| error(dir, format!("cannot create the folder: {e}")))?;
        let lock_path = dir.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| error(&lock_path, format!("cannot open: {e}")))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(error(&lock_path, "another server holds this state file"));
            }
            Err(TryLockError::Error(e)) => {
                return Err(error(&lock_path, format!("cannot lock: {e}")));
            }
        }
        let path = dir.join(name);
        let stored = match fs::read(&path) {
            Ok(bytes) => Some(reserve::decode_floor_file(&bytes).map_err(|e| error(&path, e))?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(error(&path, format!("cannot read: {e}"))),
        };
        let file = FloorFile {
            dir: dir.to_owned(),
            temp: dir.join(format!("{name}.tmp")),
            path,
            _lock: lock,
        };
        Ok((file, stored))
    }

    /// Stores `value` durably (blocking).
    pub(crate) fn write(&self, value: u64) -> io::Result<()> {
        let mut temp = File::create(&self.temp)?;
        temp.write_all(&reserve::encode_floor_file(value))?;
        temp.sync_all()?;
        drop(temp);
        fs::rename(&self.temp, &self.path)?;
        File::open(&self.dir)?.sync_all()
    }
}
