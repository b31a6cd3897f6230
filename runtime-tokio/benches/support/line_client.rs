//! A minimal client of the line dialect (the one the published 0.3.0
//! clients speak), written from docs/protocol.md §7 for the throughput
//! bench: it answers the line challenge with
//! `base64url(SHA-256(token ‖ nonce))`, pipelines `A`/`R` frames on a few
//! connections and matches replies by op family, key and owner/token, as
//! those clients do. Single mode only (no `M`/`L` handling), no reconnects.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};

/// A line the server sends before it must end (the clients allow 192 and
/// 256 bytes for the challenge).
const CHALLENGE_LEN_MAX: usize = 256;

/// How an acquire ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// `A`: granted with this token.
    Token(u64),
    /// `T`: the wait ended.
    TimedOut,
    /// `B`: a server limit; retry.
    Busy,
}

type Waiters<T> = Mutex<HashMap<(Vec<u8>, u64), oneshot::Sender<T>>>;

struct Conn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    /// Keyed by (key, owner).
    acquires: Waiters<Acquired>,
    /// Keyed by (key, token); `true` for `R`, `false` for `N`.
    releases: Waiters<bool>,
}

/// Connections to one server, used in turn.
#[derive(Clone)]
pub struct LineBroker {
    conns: Arc<Vec<Arc<Conn>>>,
    next_conn: Arc<AtomicUsize>,
    next_owner: Arc<AtomicU64>,
}

/// `base64url` without padding, the encoding of the line answer.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// The answer to a line challenge whose nonce is `nonce`.
pub fn line_answer(token: &str, nonce: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(token.as_bytes())
        .chain_update(nonce)
        .finalize();
    base64url(&digest)
}

impl LineBroker {
    /// Opens `connections` line-dialect connections to `addr` with the
    /// client `token` (empty: loopback no-auth).
    pub async fn connect(addr: &str, token: &str, connections: usize) -> LineBroker {
        let mut conns = Vec::new();
        for _ in 0..connections {
            conns.push(Conn::open(addr, token).await);
        }
        LineBroker {
            conns: Arc::new(conns),
            next_conn: Arc::new(AtomicUsize::new(0)),
            // Owners only need to differ among this broker's calls.
            next_owner: Arc::new(AtomicU64::new(0x5eed_0000_0000_0000)),
        }
    }

    fn pick(&self) -> &Arc<Conn> {
        &self.conns[self.next_conn.fetch_add(1, Ordering::Relaxed) % self.conns.len()]
    }

    /// One `A` request: waits up to `wait_s` for `key`, lease `lease_s`.
    pub async fn acquire(&self, key: &str, wait_s: u16, lease_s: u16) -> Acquired {
        let owner = self.next_owner.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(14 + key.len());
        frame.push(b'A');
        frame.extend_from_slice(&wait_s.to_be_bytes());
        frame.extend_from_slice(&lease_s.to_be_bytes());
        frame.extend_from_slice(&owner.to_be_bytes());
        frame.extend_from_slice(key.as_bytes());
        frame.push(b'\n');
        let conn = self.pick();
        let (tx, rx) = oneshot::channel();
        conn.acquires
            .lock()
            .unwrap()
            .insert((key.as_bytes().to_vec(), owner), tx);
        conn.frames.send(frame).expect("line connection writer");
        rx.await
            .expect("line connection closed with an acquire pending")
    }

    /// One `R` request: whether `token` still held `key`.
    pub async fn release(&self, key: &str, token: u64) -> bool {
        let mut frame = Vec::with_capacity(10 + key.len());
        frame.push(b'R');
        frame.extend_from_slice(&token.to_be_bytes());
        frame.extend_from_slice(key.as_bytes());
        frame.push(b'\n');
        let conn = self.pick();
        let (tx, rx) = oneshot::channel();
        conn.releases
            .lock()
            .unwrap()
            .insert((key.as_bytes().to_vec(), token), tx);
        conn.frames.send(frame).expect("line connection writer");
        rx.await
            .expect("line connection closed with a release pending")
    }
}

impl Conn {
    async fn open(addr: &str, token: &str) -> Arc<Conn> {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (mut reader, mut writer) = stream.into_split();
        // The challenge: one line; the nonce is what follows its first space.
        let mut buf = Vec::new();
        let newline = loop {
            if let Some(at) = buf.iter().position(|&b| b == b'\n') {
                break at;
            }
            assert!(buf.len() <= CHALLENGE_LEN_MAX, "no line challenge");
            let mut chunk = [0u8; 256];
            let n = reader.read(&mut chunk).await.expect("read challenge");
            assert!(n > 0, "closed before the challenge");
            buf.extend_from_slice(&chunk[..n]);
        };
        let space = buf[..newline]
            .iter()
            .position(|&b| b == b' ')
            .filter(|&at| at > 0)
            .expect("a space in the challenge line");
        let mut answer = line_answer(token, &buf[space + 1..newline]).into_bytes();
        answer.push(b'\n');
        buf.drain(..=newline);
        writer.write_all(&answer).await.expect("send answer");

        let (frames, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Arc::new(Conn {
            frames,
            acquires: Mutex::default(),
            releases: Mutex::default(),
        });
        // Writer: everything queued so far in one write, as the clients do.
        tokio::spawn(async move {
            while let Some(mut batch) = queued.recv().await {
                while let Ok(more) = queued.try_recv() {
                    batch.extend_from_slice(&more);
                }
                if writer.write_all(&batch).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(Conn::read_replies(Arc::clone(&conn), reader, buf));
        conn
    }

    async fn read_replies(conn: Arc<Conn>, mut reader: OwnedReadHalf, mut buf: Vec<u8>) {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let mut start = 0;
            while let Some(used) = conn.handle_reply(&buf[start..]) {
                start += used;
            }
            buf.drain(..start);
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Handles the first whole reply in `buf`; the bytes it used, or `None`
    /// until one is whole.
    fn handle_reply(&self, buf: &[u8]) -> Option<usize> {
        let op = *buf.first()?;
        // The fixed binary part may hold 0x0A: skip it by count.
        let fixed = match op {
            b'\n' => return Some(1),
            b'A' => 16,
            b'T' | b'B' | b'R' | b'N' => 8,
            _ => 0,
        };
        let tail = buf.get(1 + fixed..)?;
        let end = 1 + fixed + tail.iter().position(|&b| b == b'\n')?;
        let word = |at: usize| u64::from_be_bytes(buf[at..at + 8].try_into().unwrap());
        let key = buf[1 + fixed..end].to_vec();
        let answer_acquire = |id: u64, outcome: Acquired| {
            let waiter = self.acquires.lock().unwrap().remove(&(key.clone(), id));
            let _ = waiter
                .expect("an acquire reply nobody asked for")
                .send(outcome);
        };
        let answer_release = |token: u64, released: bool| {
            let waiter = self.releases.lock().unwrap().remove(&(key.clone(), token));
            let _ = waiter
                .expect("a release reply nobody asked for")
                .send(released);
        };
        match op {
            b'A' => answer_acquire(word(9), Acquired::Token(word(1))),
            b'T' => answer_acquire(word(1), Acquired::TimedOut),
            b'B' => answer_acquire(word(1), Acquired::Busy),
            b'R' => answer_release(word(1), true),
            b'N' => answer_release(word(1), false),
            _ => panic!(
                "line reply {:?} in the bench",
                String::from_utf8_lossy(&buf[..end])
            ),
        }
        Some(end + 1)
    }
}
