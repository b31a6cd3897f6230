//! A tiny TCP echo, tokio on both sides: the loopback yardstick that the
//! throughput bench and `examples/echo_round_trip.rs` (for
//! `scripts/cluster-bench.sh`) put uncontended latency next to.

use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Starts the echo on its own thread and current-thread runtime (like the
/// server) and returns its address.
pub fn start_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("echo listener");
    let addr = listener.local_addr().expect("echo address");
    listener.set_nonblocking(true).expect("echo non-blocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("echo runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("echo listener");
            while let Ok((mut tcp, _)) = listener.accept().await {
                tcp.set_nodelay(true).expect("nodelay");
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = tcp.read(&mut buf).await {
                        if n == 0 || tcp.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    });
    addr
}

/// `warm_up` unmeasured, then `round_trips` measured round trips of 16
/// bytes through the echo at `addr`; latencies in nanoseconds.
pub async fn round_trips_ns(addr: SocketAddr, warm_up: u64, round_trips: u64) -> Histogram<u64> {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("echo connect");
    tcp.set_nodelay(true).expect("nodelay");
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut buf = [0u8; 16];
    for i in 0..warm_up + round_trips {
        let started = Instant::now();
        tcp.write_all(&[i as u8; 16]).await.expect("echo write");
        tcp.read_exact(&mut buf).await.expect("echo read");
        if i >= warm_up {
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let _ = hist.record(nanos.max(1));
        }
    }
    hist
}
