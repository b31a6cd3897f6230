//! Helpers for the mixed-dialect tests: a real `ticketing serve` child
//! process on a free loopback port.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// First port handed out; the span ends below Linux's ephemeral range, so a
/// port we probed cannot be taken by an outbound connection before the
/// server binds it (as in runtime-tokio/tests/common/ports.rs).
const FIRST_PORT: u32 = 20_000;
/// Ports in the span.
const SPAN: u32 = 12_000;

/// A loopback address whose port is free now.
pub fn free_port() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(61).wrapping_add(7_001) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port in {FIRST_PORT}..");
        let port = FIRST_PORT + (start + n * 7) % SPAN;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

/// A `ticketing serve` child process; killed, and its state folder removed,
/// when dropped.
pub struct Server {
    child: Child,
    state_dir: PathBuf,
    /// Where it listens for clients.
    pub addr: SocketAddr,
}

impl Server {
    /// Starts `$TICKETING_BIN serve` on a free loopback port with `args`
    /// added, and returns once it accepts connections.
    pub fn start(args: &[&str]) -> Server {
        let bin = std::env::var("TICKETING_BIN")
            .expect("TICKETING_BIN must name the ticketing binary to test");
        let addr = free_port();
        let state_dir = std::env::temp_dir().join(format!(
            "ticketing-interop-{}-{}",
            std::process::id(),
            addr.port()
        ));
        let child = Command::new(bin)
            .args([
                "serve",
                "--listen",
                &addr.to_string(),
                "--log-level",
                "warn",
            ])
            .arg("--state-dir")
            .arg(&state_dir)
            .args(args)
            .env_remove("TICKETING_CLIENT_TOKENS")
            .stdin(Stdio::null())
            .spawn()
            .expect("start ticketing serve");
        let server = Server {
            child,
            state_dir,
            addr,
        };
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// SIGTERM, then the exit status; fails the test if it does not stop
    /// within 10 s or stops with an error.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "server exited with {status}");
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}
