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
//!
//! The server often runs as root, so the folder must be one nobody else
//! can plant files in: before anything is opened, the folder (created
//! 0700 when missing) must belong to this user or root and not be
//! writable by group or others, and no folder above it may let another
//! user replace it ([`StateSettings::dir_insecure_ok`] opts out). Every
//! file is opened with `O_NOFOLLOW` besides, and the temporary file is
//! created exclusively, so a symbolic link in the folder is an error
//! rather than a write through it.

use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
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
    /// Start even when `dir` or a folder above it could be changed by
    /// another user (`state_dir_insecure_ok`). Off by default: such a user
    /// could plant links that make the server overwrite files it can
    /// write, or roll the token floor back.
    pub dir_insecure_ok: bool,
}

impl StateSettings {
    /// The state directory `dir` with the default reserve step.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateSettings {
            dir: dir.into(),
            reserve_step: DEFAULT_RESERVE_STEP,
            dir_insecure_ok: false,
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
    /// Creates the state folder if missing (0700), checks that no other
    /// user can change it (unless `settings.dir_insecure_ok`), takes the
    /// lock and reads the stored reserve (`None`: no file yet, a first
    /// start).
    pub(crate) fn open(
        settings: &StateSettings,
        name: &str,
    ) -> Result<(FloorFile, Option<u64>), StateError> {
        let dir = settings.dir.as_path();
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StateError::new(dir, format!("cannot create the folder: {e}")))?;
        if !settings.dir_insecure_ok {
            check_private_dir(dir)?;
        }
        let lock_path = dir.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| StateError::new(&lock_path, format!("cannot open: {}", open_error(&e))))?;
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
        let stored = match read_no_follow(&path) {
            Ok(bytes) => Some(reserve::decode_floor_file(&bytes).map_err(|e| {
                StateError::new(
                    &path,
                    format!("{e}; refusing to start (a reset could let fencing tokens go down)"),
                )
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(StateError::new(
                    &path,
                    format!("cannot read: {}", open_error(&e)),
                ));
            }
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
        // A temporary file left by a crash (or anything planted in its
        // place) goes first: unlink removes a link itself, never what it
        // points at. The exclusive create then refuses whatever appears
        // in between instead of writing through it.
        match fs::remove_file(&self.temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut temp = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.temp)?;
        temp.write_all(&reserve::encode_floor_file(value))?;
        temp.sync_all()?;
        drop(temp);
        // rename replaces the entry at `path` whatever it is (a link
        // included); it never writes through it.
        fs::rename(&self.temp, &self.path)?;
        // The rename itself is durable only once the folder is.
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&self.dir)?
            .sync_all()
    }
}

/// Reads the file at `path`, refusing a symbolic link.
fn read_no_follow(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `e` from an open with `O_NOFOLLOW`, which reports a symbolic link as
/// "too many levels of symbolic links": said plainly.
fn open_error(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ELOOP) {
        format!("it is a symbolic link, which the server never follows here ({e})")
    } else {
        e.to_string()
    }
}

/// The sticky bit of a folder's mode: only an entry's owner (or the
/// folder's, or root) may rename or remove it.
const STICKY: u32 = 0o1000;

/// How to opt out, for the messages of [`check_private_dir`].
const INSECURE_OK_HINT: &str =
    "set state_dir_insecure_ok = true (--state-dir-insecure-ok) to start anyway";

/// Refuses a state folder another user could change: `dir` must belong to
/// this user or root and not be writable by group or others (a sticky
/// 1777 folder included: anyone may still create names in it); each
/// folder above it must belong to this user or root and, if writable by
/// group or others, carry the sticky bit (so that nobody else can rename
/// or replace what lies below, as in `/tmp`).
fn check_private_dir(dir: &Path) -> Result<(), StateError> {
    let real = fs::canonicalize(dir)
        .map_err(|e| StateError::new(dir, format!("cannot resolve the folder: {e}")))?;
    let uid = effective_uid();
    let stat = |path: &Path| {
        fs::metadata(path).map_err(|e| StateError::new(path, format!("cannot stat: {e}")))
    };
    let owner_ok = |owner: u32| owner == 0 || uid.is_none_or(|uid| uid == owner);
    let meta = stat(&real)?;
    if !owner_ok(meta.uid()) {
        return Err(StateError::new(
            dir,
            format!(
                "the folder belongs to uid {}, not to this user or root; {INSECURE_OK_HINT}",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(StateError::new(
            dir,
            format!(
                "the folder's mode {:04o} lets group or others write in it (chmod 700); \
                 {INSECURE_OK_HINT}",
                meta.mode() & 0o7777
            ),
        ));
    }
    for parent in real.ancestors().skip(1) {
        let meta = stat(parent)?;
        if !owner_ok(meta.uid()) {
            return Err(StateError::new(
                parent,
                format!(
                    "a folder above the state folder belongs to uid {}, not to this user or \
                     root, who could replace it; {INSECURE_OK_HINT}",
                    meta.uid()
                ),
            ));
        }
        if meta.mode() & 0o022 != 0 && meta.mode() & STICKY == 0 {
            return Err(StateError::new(
                parent,
                format!(
                    "a folder above the state folder has mode {:04o}: group or others could \
                     replace it; {INSECURE_OK_HINT}",
                    meta.mode() & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// This process's effective uid: the owner of `/proc/self` (Linux; the
/// crate forbids the unsafe call to `geteuid`). `None` where there is no
/// `/proc`: then only the mode bits are checked.
fn effective_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|meta| meta.uid())
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
    let (file, stored) = FloorFile::open(settings, name)?;
    let first_token = server::first_token(wall_clock(), stored);
    start_floor(file, stored, first_token, settings, now)
}

/// Makes the reserve covering `first_token` durable in the `file` opened
/// by [`FloorFile::open`] (which read `stored`). `first_token` is at
/// least [`server::first_token`] of `stored`, never below: a recovery
/// passes a larger one.
pub(crate) fn start_floor(
    file: FloorFile,
    stored: Option<u64>,
    first_token: u64,
    settings: &StateSettings,
    now: Instant,
) -> Result<Floor, StateError> {
    let first_token = first_token.max(server::first_token(wall_clock(), stored));
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
        let err = FloorFile::open(&settings, "x.floor").unwrap_err();
        assert!(err.message.contains("another ticketing process"), "{err}");
        floor.file.write(first + 5 * DEFAULT_RESERVE_STEP).unwrap();
        drop(floor);
        let (_, stored) = FloorFile::open(&settings, "x.floor").unwrap();
        assert_eq!(stored, Some(first + 5 * DEFAULT_RESERVE_STEP));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it_not_a_reset() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("x.floor"), b"ticketing-token-floor v1 12 0000\n").unwrap();
        let err = FloorFile::open(&StateSettings::new(&dir), "x.floor").unwrap_err();
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
        let err = FloorFile::open(&StateSettings::new(file.join("state")), "x.floor").unwrap_err();
        assert_eq!(err.path, file.join("state"));
        assert!(err.message.contains("cannot create"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    use std::os::unix::fs::{PermissionsExt, symlink};

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A state folder `dir/state` and two victims beside it: one that
    /// exists (with its bytes) and one that does not.
    struct Planted {
        state: PathBuf,
        victim: PathBuf,
        missing: PathBuf,
    }

    const VICTIM_BYTES: &[u8] = b"root's precious file\n";

    fn planted(dir: &Path) -> Planted {
        let state = dir.join("state");
        fs::create_dir_all(&state).unwrap();
        let victim = dir.join("victim");
        fs::write(&victim, VICTIM_BYTES).unwrap();
        Planted {
            state,
            victim,
            missing: dir.join("missing"),
        }
    }

    impl Planted {
        fn assert_victims_untouched(&self) {
            assert_eq!(fs::read(&self.victim).unwrap(), VICTIM_BYTES);
            assert!(
                fs::symlink_metadata(&self.missing).is_err(),
                "created through a link"
            );
        }
    }

    /// The private folder as the server wants it, and a world-writable one
    /// opted out of the check: in neither is a link followed.
    fn both_kinds_of_folder(case: &str, test: impl Fn(&Planted, &StateSettings)) {
        for insecure in [false, true] {
            let dir = temp_dir(&format!("{case}-{insecure}"));
            let planted = planted(&dir);
            let mut settings = StateSettings::new(&planted.state);
            if insecure {
                chmod(&planted.state, 0o777);
                settings.dir_insecure_ok = true;
            }
            test(&planted, &settings);
            planted.assert_victims_untouched();
            let _ = fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn a_link_planted_at_the_lock_name_is_refused_and_nothing_is_created() {
        both_kinds_of_folder("locklink", |planted, settings| {
            for target in [&planted.victim, &planted.missing] {
                let lock = planted.state.join("x.floor.lock");
                symlink(target, &lock).unwrap();
                let err = FloorFile::open(settings, "x.floor").unwrap_err();
                assert_eq!(err.path, lock);
                assert!(err.message.contains("symbolic link"), "{err}");
                fs::remove_file(&lock).unwrap();
            }
        });
    }

    #[test]
    fn a_link_planted_at_the_temp_name_is_replaced_by_a_real_file() {
        both_kinds_of_folder("templink", |planted, settings| {
            for target in [&planted.victim, &planted.missing] {
                let temp = planted.state.join("x.floor.tmp");
                symlink(target, &temp).unwrap();
                let floor = open_floor(settings, "x.floor", Instant::ZERO).unwrap();
                let path = planted.state.join("x.floor");
                assert!(fs::symlink_metadata(&path).unwrap().is_file());
                let stored = reserve::decode_floor_file(&fs::read(&path).unwrap()).unwrap();
                assert_eq!(stored, floor.reserve.limit());
                assert!(fs::symlink_metadata(&temp).is_err(), "the temp was renamed");
            }
        });
    }

    #[test]
    fn a_link_planted_at_the_floor_name_is_refused() {
        both_kinds_of_folder("floorlink", |planted, settings| {
            let path = planted.state.join("x.floor");
            symlink(&planted.victim, &path).unwrap();
            let err = FloorFile::open(settings, "x.floor").unwrap_err();
            assert_eq!(err.path, path);
            assert!(err.message.contains("symbolic link"), "{err}");
        });
    }

    #[test]
    fn a_folder_others_can_write_is_refused_naming_it_unless_opted_out() {
        let dir = temp_dir("modes");
        let state = dir.join("state");
        fs::create_dir_all(&state).unwrap();
        for mode in [0o777, 0o1777, 0o770, 0o702] {
            chmod(&state, mode);
            let err = FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap_err();
            assert_eq!(err.path, state);
            assert!(err.message.contains(&format!("{mode:04o}")), "{err}");
            assert!(err.message.contains("state_dir_insecure_ok"), "{err}");
            let mut settings = StateSettings::new(&state);
            settings.dir_insecure_ok = true;
            FloorFile::open(&settings, "x.floor").unwrap();
        }
        chmod(&state, 0o755);
        FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_parent_others_can_replace_the_folder_in_is_refused_naming_it() {
        let dir = temp_dir("parent");
        let parent = dir.join("parent");
        let state = parent.join("state");
        fs::create_dir_all(&state).unwrap();
        chmod(&parent, 0o777);
        let err = FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap_err();
        assert_eq!(err.path, parent);
        assert!(err.message.contains("0777"), "{err}");
        // The sticky bit (as on /tmp) keeps others from renaming what is
        // ours inside it.
        chmod(&parent, 0o1777);
        FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_owned_by_another_user_is_refused_as_root() {
        if effective_uid() != Some(0) {
            // Only root can give a folder away; CI runs as root.
            eprintln!("skipped: needs root to chown");
            return;
        }
        let dir = temp_dir("owner");
        let parent = dir.join("parent");
        let state = parent.join("state");
        fs::create_dir_all(&state).unwrap();
        std::os::unix::fs::chown(&state, Some(4242), None).unwrap();
        let err = FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap_err();
        assert_eq!(err.path, state);
        assert!(err.message.contains("uid 4242"), "{err}");
        std::os::unix::fs::chown(&state, Some(0), None).unwrap();
        std::os::unix::fs::chown(&parent, Some(4242), None).unwrap();
        let err = FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap_err();
        assert_eq!(err.path, parent);
        assert!(err.message.contains("uid 4242"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_created_folder_is_private() {
        let dir = temp_dir("created");
        let state = dir.join("a/b");
        FloorFile::open(&StateSettings::new(&state), "x.floor").unwrap();
        for path in [&state, &dir.join("a")] {
            let mode = fs::metadata(path).unwrap().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{}: {mode:o}", path.display());
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
