//! The loopback round trip of a tiny TCP echo, tokio on both sides, as
//! the yardstick for uncontended latency (`scripts/cluster-bench.sh`
//! prints an acquire+release p50 over two of these). The same echo as the
//! throughput bench's: 16 bytes, the echo on a current-thread runtime in
//! its own thread, the client on another.
//!
//! ```sh
//! cargo run --release -p ticketing-tokio --example echo_round_trip [ROUND_TRIPS]
//! ```
//!
//! Prints one line: `echo round trip: p50 N µs p99 N µs (R round trips)`.

use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Round trips measured unless the first argument says otherwise.
const DEFAULT_ROUND_TRIPS: u64 = 5_000;
/// Round trips first made and not measured (connection and caches warm).
const WARM_UP_ROUND_TRIPS: u64 = 200;
/// Most round trips the first argument may ask for.
const MAX_ROUND_TRIPS: u64 = 10_000_000;

fn main() {
    let round_trips = match std::env::args().nth(1).map(|arg| arg.parse::<u64>()) {
        None => DEFAULT_ROUND_TRIPS,
        Some(Ok(n)) if (1..=MAX_ROUND_TRIPS).contains(&n) => n,
        Some(_) => {
            eprintln!("echo_round_trip: ROUND_TRIPS must be 1..={MAX_ROUND_TRIPS}");
            std::process::exit(2);
        }
    };
    let addr = start_echo();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let hist = runtime.block_on(measure(addr, round_trips));
    println!(
        "echo round trip: p50 {} µs p99 {} µs ({round_trips} round trips)",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
    );
}

/// Starts the echo on its own thread and current-thread runtime.
fn start_echo() -> SocketAddr {
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

/// The round trips' latencies, in µs.
async fn measure(addr: SocketAddr, round_trips: u64) -> Histogram<u64> {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("echo connect");
    tcp.set_nodelay(true).expect("nodelay");
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut buf = [0u8; 16];
    for i in 0..WARM_UP_ROUND_TRIPS + round_trips {
        let started = Instant::now();
        tcp.write_all(&[i as u8; 16]).await.expect("echo write");
        tcp.read_exact(&mut buf).await.expect("echo read");
        if i >= WARM_UP_ROUND_TRIPS {
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            let _ = hist.record(micros.max(1));
        }
    }
    hist
}
