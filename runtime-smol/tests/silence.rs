//! The smol client's silence rule, against a scripted server on loopback
//! that completes the handshake and then never answers (a hung server):
//! an immediate acquire ends Indeterminate after the silence timeout, not
//! after its 5 s transport deadline.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use ticketing_core::auth::{Hello, PROOF_LEN, WireMode};
use ticketing_core::wire::{Capabilities, FRAME_HEADER_LEN, NO_LEADER_SLOT, Reply};
use ticketing_smol::client::{TicketBroker, TicketError};

const SILENCE: Duration = Duration::from_secs(1);

/// Accepts every connection, sends a single-mode hello and the accepting
/// result byte, answers the client's negotiation (`X`, granting nothing),
/// then reads and discards whatever comes, answering nothing.
fn spawn_mute_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let hello = Hello {
                    mode: WireMode::Single,
                    self_slot: NO_LEADER_SLOT,
                    nonce: [7; 16],
                };
                let _ = stream.write_all(&hello.encode());
                let _ = stream.write_all(&[1]);
                // The proof, then our client's `X` without a label.
                let mut head = [0u8; PROOF_LEN + FRAME_HEADER_LEN + 14];
                if stream.read_exact(&mut head).is_err() {
                    return;
                }
                let rid_at = PROOF_LEN + FRAME_HEADER_LEN;
                let rid = u64::from_be_bytes(head[rid_at..rid_at + 8].try_into().unwrap());
                let mut answer = Vec::new();
                Reply::Negotiated {
                    rid,
                    granted: Capabilities::NONE,
                }
                .encode(&mut answer);
                let _ = stream.write_all(&answer);
                let mut sink = [0u8; 1024];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[test]
fn an_immediate_acquire_on_a_mute_server_ends_after_the_silence_timeout() {
    let addr = spawn_mute_server();
    smol::block_on(async {
        let broker = TicketBroker::builder()
            .addrs([addr.to_string()])
            .allow_loopback_no_auth()
            .silence_timeout(SILENCE)
            .connect()
            .unwrap();
        assert!(broker.wait_ready(Duration::from_secs(5)).await);
        let started = Instant::now();
        let result = broker
            .acquire(
                "k",
                Duration::ZERO,
                Duration::from_secs(10),
                Duration::from_secs(1),
            )
            .await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(TicketError::Indeterminate)),
            "{result:?}"
        );
        assert!(took >= SILENCE, "ended before the bound: {took:?}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
        broker.close().await;
    });
}
