//! A minimal wire-v3 client on a raw socket: for what the published client
//! never sends, and for a client that dies mid-way.

use std::io::ErrorKind;
use std::time::Duration;

use ticketing_core::auth::{
    ClientHandshake, ClientHandshakeStatus, SINGLE_FINGERPRINT, SINGLE_SELF_SLOT, WireMode,
};
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, ReleaseRequest, Reply, Request};
use ticketing_tokio::RunningServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bounds every read, so that a server that stays silent fails the test
/// instead of hanging it.
pub const IO_BOUND: Duration = Duration::from_secs(5);

pub struct Raw {
    pub stream: TcpStream,
    /// Received bytes not yet decoded.
    pub buf: Vec<u8>,
}

impl Raw {
    /// Connects and completes the handshake with `token`; panics unless
    /// accepted.
    pub async fn connect(server: &RunningServer, token: &[u8]) -> Raw {
        let (raw, status) = Raw::try_connect(server, token).await;
        assert_eq!(status, ClientHandshakeStatus::Accepted);
        raw
    }

    /// Connects and runs the handshake with `token`; returns the final status.
    pub async fn try_connect(server: &RunningServer, token: &[u8]) -> (Raw, ClientHandshakeStatus) {
        Raw::try_connect_to(server.local_addr(), token).await
    }

    /// Connects to `addr` and runs the handshake with `token`; returns the
    /// final status.
    pub async fn try_connect_to(
        addr: std::net::SocketAddr,
        token: &[u8],
    ) -> (Raw, ClientHandshakeStatus) {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut raw = Raw {
            stream,
            buf: Vec::new(),
        };
        let mut handshake = ClientHandshake::new(
            token,
            SINGLE_FINGERPRINT,
            WireMode::Single,
            SINGLE_SELF_SLOT,
        );
        loop {
            let (used, status) = handshake.handle_input(&raw.buf);
            raw.buf.drain(..used);
            match status {
                ClientHandshakeStatus::NeedMore => raw.fill().await,
                ClientHandshakeStatus::SendProof => {
                    let proof = handshake.proof().unwrap();
                    raw.stream.write_all(&proof).await.unwrap();
                }
                done => return (raw, done),
            }
        }
    }

    /// Reads more bytes into `buf`; panics on EOF or after [`IO_BOUND`].
    pub async fn fill(&mut self) {
        let mut chunk = [0u8; 512];
        let n = tokio::time::timeout(IO_BOUND, self.stream.read(&mut chunk))
            .await
            .expect("server sent nothing")
            .expect("read failed");
        assert!(n > 0, "server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    pub async fn send(&mut self, request: &Request) {
        self.stream.write_all(&request.to_frame()).await.unwrap();
    }

    pub async fn reply(&mut self) -> Reply {
        loop {
            if let Some((reply, used)) = Reply::decode(&self.buf).expect("malformed reply") {
                self.buf.drain(..used);
                return reply;
            }
            self.fill().await;
        }
    }

    /// Reads until the server closes and returns every byte not yet
    /// decoded. A reset counts as a close: it is what a peer sees when the
    /// server closes with our unread bytes in its buffer.
    pub async fn read_until_closed(mut self) -> Vec<u8> {
        tokio::time::timeout(IO_BOUND, async {
            let mut chunk = [0u8; 512];
            loop {
                match self.stream.read(&mut chunk).await {
                    Ok(0) => return,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                    Err(e) => panic!("read failed: {e}"),
                }
            }
        })
        .await
        .expect("server did not close the connection");
        self.buf
    }
}

pub fn key(name: &str) -> KeyGroup {
    KeyGroup::single(Key::new(name.as_bytes()).unwrap())
}

pub fn acquire(rid: u64, name: &str, wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: key(name),
        set: false,
    })
}

pub fn release(rid: u64, name: &str, token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: key(name),
        set: false,
    })
}
