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

#[path = "../benches/support/echo.rs"]
mod echo;

/// Round trips measured unless the first argument says otherwise.
const DEFAULT_ROUND_TRIPS: u64 = 5_000;
/// Round trips first made and not measured (connection and caches warm).
const WARM_UP_ROUND_TRIPS: u64 = 200;
/// Most round trips the first argument may ask for.
const ROUND_TRIPS_MAX: u64 = 10_000_000;

fn main() {
    let round_trips = match std::env::args().nth(1).map(|arg| arg.parse::<u64>()) {
        None => DEFAULT_ROUND_TRIPS,
        Some(Ok(n)) if (1..=ROUND_TRIPS_MAX).contains(&n) => n,
        Some(_) => {
            eprintln!("echo_round_trip: ROUND_TRIPS must be 1..={ROUND_TRIPS_MAX}");
            std::process::exit(2);
        }
    };
    let addr = echo::start_echo();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let hist = runtime.block_on(echo::round_trips_ns(addr, WARM_UP_ROUND_TRIPS, round_trips));
    println!(
        "echo round trip: p50 {} µs p99 {} µs ({round_trips} round trips)",
        (hist.value_at_quantile(0.5) / 1_000).max(1),
        (hist.value_at_quantile(0.99) / 1_000).max(1),
    );
}
