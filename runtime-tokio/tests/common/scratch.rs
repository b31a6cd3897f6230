//! Fresh folders for child processes' state directories.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A folder that does not exist yet, unique to this process and call
/// (tests run in parallel); the server creates it. [`Scratch`] removes it.
pub fn scratch_dir(name: &str) -> Scratch {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("ticketing-{name}-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    Scratch(path)
}

/// A scratch folder, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// The folder's path as a string, for command lines.
    pub fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
