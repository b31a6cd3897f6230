//! The state file of a fencing domain: the durable token reserve (see
//! [`ticketing_core::reserve`]). The core decides what to store and when;
//! this module only reads and writes the file.
//!
//! One small file per fencing domain in the state directory (single mode:
//! named after the listen address; cluster mode: after the identity and
//! the slot), so two servers on one machine never share one. A sibling
//! `.lock` file is held with an exclusive `flock` while the process runs,
//! so a second process of the same domain refuses to start instead of
//! racing the first. A write is: temporary file, write, fsync, rename over
//! the file, fsync the folder — so after a crash the file holds either the
//! old or the new value, never a torn one.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ticketing_core::reserve::{self, DEFAULT_RESERVE_STEP, TokenReserve};
use ticketing_core::server;
use ticketing_core::time::Instant;

/// Where a server keeps its state file, and how far ahead it reserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSettings {
    /// The state directory (created if missing).
    pub dir: PathBuf,
    /// Tokens reserved per write ([`DEFAULT_RESERVE_STEP`]: one fsync per
    /// 500,000 grants).
    pub reserve_step: u64,
}

impl StateSettings {
    /// The state directory `dir` with the default reserve step.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateSettings {
            dir: dir.into(),
            reserve_step: DEFAULT_RESERVE_STEP,
        }
    }
}

/// The state directory or file cannot be used: the server does not start.
#[derive(Debug)]
pub struct StateError {
    /// The file or folder at fault.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "state_dir: {}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for StateError {}

impl StateError {
    fn new(path: &Path, message: impl Into<String>) -> Self {
        StateError {
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// As an [`io::Error`] (the spawn functions return those); the
    /// [`StateError`] stays inside for [`StateError::find`].
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::other(self)
    }

    /// The state error inside `error`, if it is one.
    pub fn find(error: &io::Error) -> Option<&StateError> {
        error.get_ref()?.downcast_ref::<StateError>()
    }
}

/// The file name of a single-mode server listening on `listen`.
pub fn single_file_name(listen: SocketAddr) -> String {
    let host: String = listen
        .ip()
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("single-{host}-{}.floor", listen.port())
}

/// The file name of cluster slot `slot` of the cluster `fingerprint`.
pub fn cluster_file_name(fingerprint: &[u8; 32], slot: u8) -> String {
    let id: String = fingerprint[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("cluster-{id}-slot{slot}.floor")
}

/// An open state file, locked against other processes.
#[derive(Debug)]
pub(crate) struct FloorFile {
    dir: PathBuf,
    path: PathBuf,
    temp: PathBuf,
    /// Held for the process's lifetime: the `flock` goes with it.
    _lock: File,
}

impl FloorFile {
    /// Creates `dir` if missing, takes the lock and reads the stored
    /// reserve (`None`: no file yet, a first start).
    pub(crate) fn open(dir: &Path, name: &str) -> Result<(FloorFile, Option<u64>), StateError> {
        fs::create_dir_all(dir)
            .map_err(|e| StateError::new(dir, format!("cannot create the folder: {e}")))?;
        let lock_path = dir.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StateError::new(&lock_path, format!("cannot open: {e}")))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StateError::new(
                    &lock_path,
                    "another ticketing process of this fencing domain holds it",
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(StateError::new(&lock_path, format!("cannot lock: {e}")));
            }
        }
        let path = dir.join(name);
        let stored = match fs::read(&path) {
            Ok(bytes) => Some(reserve::decode_floor_file(&bytes).map_err(|e| {
                StateError::new(
                    &path,
                    format!("{e}; refusing to start (a reset could let fencing tokens go down)"),
                )
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StateError::new(&path, format!("cannot read: {e}"))),
        };
        let file = FloorFile {
            dir: dir.to_owned(),
            temp: dir.join(format!("{name}.tmp")),
            path,
            _lock: lock,
        };
        Ok((file, stored))
    }

    /// The state file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stores `value` durably (blocking: call off the serving thread).
    pub(crate) fn write(&self, value: u64) -> io::Result<()> {
        let mut temp = File::create(&self.temp)?;
        temp.write_all(&reserve::encode_floor_file(value))?;
        temp.sync_all()?;
        drop(temp);
        fs::rename(&self.temp, &self.path)?;
        // The rename itself is durable only once the folder is.
        File::open(&self.dir)?.sync_all()
    }
}

/// What a server starts with when it has a state file.
#[derive(Debug)]
pub(crate) struct Floor {
    pub(crate) file: Arc<FloorFile>,
    /// The first token: above the clock and above the stored reserve.
    pub(crate) first_token: u64,
    /// The reserve, with its first value already durable.
    pub(crate) reserve: TokenReserve,
}

/// Opens the state file `name` in `settings.dir` and makes the first
/// reserve durable before anything is served.
pub(crate) fn open_floor(
    settings: &StateSettings,
    name: &str,
    now: Instant,
) -> Result<Floor, StateError> {
    let (file, stored) = FloorFile::open(&settings.dir, name)?;
    let first_token = server::first_token(wall_clock(), stored);
    let mut reserve = TokenReserve::new(settings.reserve_step, stored);
    if let Some(value) = reserve.poll_persist(now, first_token) {
        file.write(value)
            .map_err(|e| StateError::new(file.path(), format!("cannot write: {e}")))?;
        reserve.handle_persisted(value);
    }
    Ok(Floor {
        file: Arc::new(file),
        first_token,
        reserve,
    })
}

/// The wall-clock time since the Unix epoch (zero before it).
pub(crate) fn wall_clock() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ticketing-state-{name}-{}-{:?}",
            std::process::id(),
            SystemTime::now()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn file_names_differ_per_domain() {
        assert_eq!(
            single_file_name("127.0.0.1:5225".parse().unwrap()),
            "single-127_0_0_1-5225.floor"
        );
        assert_eq!(
            single_file_name("[::1]:5225".parse().unwrap()),
            "single-__1-5225.floor"
        );
        assert_ne!(
            cluster_file_name(&[1; 32], 0),
            cluster_file_name(&[1; 32], 1)
        );
        assert_eq!(
            cluster_file_name(&[0xab; 32], 2),
            "cluster-abababababababab-slot2.floor"
        );
    }

    #[test]
    fn a_written_value_is_read_back_and_a_second_process_is_locked_out() {
        let dir = temp_dir("roundtrip");
        let settings = StateSettings::new(dir.join("nested"));
        let floor = open_floor(&settings, "x.floor", Instant::ZERO).unwrap();
        let first = floor.first_token;
        assert_eq!(floor.reserve.limit(), first + DEFAULT_RESERVE_STEP);
        // The lock is held: a second open of the same domain is refused.
        let err = FloorFile::open(&settings.dir, "x.floor").unwrap_err();
        assert!(err.message.contains("another ticketing process"), "{err}");
        floor.file.write(first + 5 * DEFAULT_RESERVE_STEP).unwrap();
        drop(floor);
        let (_, stored) = FloorFile::open(&settings.dir, "x.floor").unwrap();
        assert_eq!(stored, Some(first + 5 * DEFAULT_RESERVE_STEP));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it_not_a_reset() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("x.floor"), b"ticketing-token-floor v1 12 0000\n").unwrap();
        let err = FloorFile::open(&dir, "x.floor").unwrap_err();
        assert_eq!(err.path, dir.join("x.floor"));
        assert!(err.to_string().starts_with("state_dir: "), "{err}");
        assert!(err.message.contains("checksum"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_under_a_regular_file_is_an_error_naming_it() {
        let dir = temp_dir("underfile");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plain");
        fs::write(&file, b"").unwrap();
        let err = FloorFile::open(&file.join("state"), "x.floor").unwrap_err();
        assert_eq!(err.path, file.join("state"));
        assert!(err.message.contains("cannot create"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
