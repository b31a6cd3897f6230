//! Server memory per held key.
//!
//! `cargo bench -p ticketing-tokio --bench memory`. Drives the core
//! [`Server`] in-process (no sockets: the table is what is measured, and
//! TCP would only make the run slower) through one authenticated
//! connection, granting `TICKETING_BENCH_KEYS` (default 1 000 000) distinct
//! 16-byte keys with lease 250 s, and reports the growth of the resident set
//! per key, minus the key bytes themselves, against the memory goal
//! ([`GOAL_BYTES_PER_KEY`], docs/performance.md). A benchmark, not a test:
//! it exits non-zero only when the run itself fails (a request not granted,
//! a count wrong); the figure is for the reader. The lock table's unit tests pin the sizes
//! of the per-key structs instead.
//!
//! The hash tables double at 7/8 load, so a million keys sit just past a
//! doubling (about 2.1 buckets per key, the worst case); at
//! `TICKETING_BENCH_KEYS=900000` they are nearly full (about 1.2).
//!
//! Then, with every key held, times what a `/metrics` scrape costs the
//! server: the core's snapshot (taken under the driver's mutex, a scan of
//! the table for the held-key gauge) and its OpenMetrics rendering; the
//! target is under 10 ms (no series is per key).
//!
//! RSS comes from `/proc/self/statm` (Linux only). It includes allocator
//! slack and the hash table's spare capacity, which is the point: that is
//! what an operator pays.

use std::time::Instant as StdInstant;

use ticketing_core::auth::{
    ClientHandshake, ClientHandshakeStatus, RESULT_ACCEPTED, SINGLE_FINGERPRINT, SINGLE_SELF_SLOT,
    WireMode,
};
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnState, Server, ServerConfig};
use ticketing_core::time::Instant;
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, Request};

const KEY_LEN: usize = 16;
/// Requests fed to the server per `handle_input` call.
const BATCH: usize = 4_096;
/// An `A` reply: op, body_len, rid, token.
const ACQUIRED_REPLY_LEN: usize = 3 + 8 + 8;
/// The memory goal (docs/performance.md): bytes per held key beyond the
/// key bytes (a million held keys: about 120 MB besides the keys).
const GOAL_BYTES_PER_KEY: f64 = 120.0;
/// `/proc/self/statm` counts pages; this is the page size on every Linux
/// target we run on (x86-64, and aarch64 with 4 KiB pages).
const PAGE_BYTES: u64 = 4_096;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("resident field of statm");
    pages * PAGE_BYTES
}

fn main() {
    let keys: usize = std::env::var("TICKETING_BENCH_KEYS")
        .ok()
        .map(|v| v.parse().expect("TICKETING_BENCH_KEYS"))
        .unwrap_or(1_000_000);
    let now = Instant::from_micros(1_000_000);
    let mut config = ServerConfig::default();
    config.lock.limits.keys_max = config.lock.limits.keys_max.max(keys);
    // One connection holds every key.
    config.budget.held_per_connection_max = config.budget.held_per_connection_max.max(keys);
    let mut server = Server::new(config, 1, now);

    // One authenticated connection (no tokens: the empty token).
    let conn = server
        .handle_connect(now, [0x5a; 16], std::net::Ipv4Addr::LOCALHOST.into())
        .expect("connection");
    let mut out = Vec::new();
    assert_eq!(server.poll_transmit(conn, &mut out), ConnState::Open);
    let mut handshake =
        ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, SINGLE_SELF_SLOT);
    let (_, status) = handshake.handle_input(&out);
    assert_eq!(status, ClientHandshakeStatus::SendProof);
    server.handle_input(now, conn, &handshake.proof().unwrap());
    out.clear();
    server.poll_transmit(conn, &mut out);
    assert_eq!(out, [RESULT_ACCEPTED]);
    server.handle_flushed(now, conn);

    let mut frames = Vec::with_capacity(BATCH * 32);
    let before = resident_bytes();
    let started = StdInstant::now();
    let mut rid = 0u64;
    while (rid as usize) < keys {
        frames.clear();
        let batch = BATCH.min(keys - rid as usize);
        for _ in 0..batch {
            rid += 1;
            let key = format!("{:016x}", rid);
            debug_assert_eq!(key.len(), KEY_LEN);
            Request::Acquire(AcquireRequest {
                rid,
                wait_s: 0,
                lease_s: 250,
                keys: KeyGroup::single(Key::new(key.as_bytes()).unwrap()),
                set: false,
            })
            .encode(&mut frames);
        }
        server.handle_input(now, conn, &frames);
        out.clear();
        assert_eq!(server.poll_transmit(conn, &mut out), ConnState::Open);
        // Every request granted: all replies are `A`, none `B` or `T`.
        assert_eq!(out.len(), batch * ACQUIRED_REPLY_LEN);
        assert!(
            out.chunks(ACQUIRED_REPLY_LEN).all(|reply| reply[0] == b'A'),
            "a request was not granted"
        );
        // Delivered: the grants leave the connection's undelivered list.
        server.handle_flushed(now, conn);
    }
    let elapsed = started.elapsed();
    let after = resident_bytes();
    let stats = server.stats();
    assert_eq!(stats.lock.held_keys, keys);

    let delta = after.saturating_sub(before);
    let per_key = delta as f64 / keys as f64;
    let beyond = per_key - KEY_LEN as f64;
    println!("memory: {keys} keys held ({KEY_LEN}-byte keys, lease 250 s)");
    println!(
        "  RSS before {:.1} MiB, after {:.1} MiB, delta {:.1} MiB",
        before as f64 / 1_048_576.0,
        after as f64 / 1_048_576.0,
        delta as f64 / 1_048_576.0
    );
    println!("  {per_key:.1} bytes/key in total, {beyond:.1} bytes/key beyond the key bytes");
    println!(
        "  goal <= {GOAL_BYTES_PER_KEY} bytes/key beyond the key bytes: {:.2} x the goal ({})",
        beyond / GOAL_BYTES_PER_KEY,
        if beyond <= GOAL_BYTES_PER_KEY {
            "OK"
        } else {
            "OVER"
        }
    );
    println!(
        "  granted in {:.2} s ({:.0} grants/s, in-process)",
        elapsed.as_secs_f64(),
        keys as f64 / elapsed.as_secs_f64()
    );
    let scrape_started = StdInstant::now();
    let snapshot = server.metrics();
    let snapshot_elapsed = scrape_started.elapsed();
    let text =
        ticketing_tokio::admin::render(&ticketing_tokio::admin::NodeMetrics::Single(snapshot))
            .expect("render");
    let scrape_elapsed = scrape_started.elapsed();
    println!(
        "  /metrics with {keys} held keys: snapshot {:.2} ms, snapshot + render {:.2} ms, {} bytes (target < 10 ms: {})",
        snapshot_elapsed.as_secs_f64() * 1e3,
        scrape_elapsed.as_secs_f64() * 1e3,
        text.len(),
        if scrape_elapsed.as_secs_f64() < 0.010 {
            "OK"
        } else {
            "OVER"
        }
    );
}
