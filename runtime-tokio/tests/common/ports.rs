//! Loopback ports for servers started as child processes.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// First port handed out; the span ends below Linux's ephemeral range.
const FIRST_PORT: u32 = 20_000;
/// Ports in the span (20000..32000).
const SPAN: u32 = 12_000;

/// A loopback address whose port is free now and lies below the kernel's
/// ephemeral range (32768 and up). A port found by binding port 0 is an
/// ephemeral one: any outbound connection (cluster nodes dial each other)
/// may take it before the child process binds it.
pub fn free_port() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Start where another process (another test binary, a parallel run)
    // is unlikely to; 7 is coprime with SPAN, so every port is visited.
    let start = std::process::id().wrapping_mul(61) % SPAN;
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
