//! The single-mode server: connections (handshake + framing + session)
//! composed with the lock table.
//!
//! The driver owns sockets and the clock; this type owns every decision.
//! Contract (str0m / quinn-proto shape):
//! - inputs: [`Server::handle_connect`], [`Server::handle_input`],
//!   [`Server::handle_flushed`], [`Server::handle_closed`],
//!   [`Server::handle_timeout`], [`Server::begin_shutdown`];
//! - outputs: drain [`Server::poll_wake`] after every input; for each woken
//!   connection call [`Server::take_transmit`] and write what it gives;
//! - time: [`Server::poll_timeout`].
//!
//! SKELETON: bodies marked `todo!` are being written; signatures are fixed.

use crate::auth::ClientTokens;
use crate::lock::{LockConfig, LockStats};
use crate::time::{Duration, Instant};

/// Server configuration (already validated by the caller's config layer).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Lock table settings (limits, `T` margin, sweep interval).
    pub lock: LockConfig,
    /// Open connections at most; more are refused at once.
    pub max_connections: usize,
    /// Requests awaiting a reply on one connection at most; an acquire over
    /// it is answered `B`.
    pub max_in_flight_per_connection: usize,
    /// Reply bytes buffered for one connection before the server stops
    /// reading from it (see [`Server::wants_input`]).
    pub max_outbound_bytes_per_connection: usize,
    /// An unfinished handshake is closed after this long.
    pub handshake_timeout: Duration,
    /// Accepted client tokens.
    pub client_tokens: ClientTokens,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            lock: LockConfig::default(),
            max_connections: 10_000,
            max_in_flight_per_connection: 16_384,
            max_outbound_bytes_per_connection: 1 << 20,
            handshake_timeout: Duration::from_secs(10),
            client_tokens: ClientTokens::no_auth(),
        }
    }
}

/// A connection, as named by the server. Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// What the driver should do with a connection after taking its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Keep it open.
    Open,
    /// Write what was taken, then close the connection.
    CloseAfterFlush,
    /// The server no longer knows this connection.
    Gone,
}

/// Server-wide counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Open connections.
    pub connections: usize,
    /// Lock table counts.
    pub lock: LockStats,
}

/// The single-mode server state machine.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
}

impl Server {
    /// A server whose first grant gets `first_token` (by our rule the
    /// bootstrap wall-clock time in microseconds since the Unix epoch).
    pub fn new(config: ServerConfig, first_token: u64, now: Instant) -> Self {
        let _ = (first_token, now);
        Server { config }
    }

    /// A transport connection opened. `nonce` must be fresh CSPRNG bytes.
    /// Returns `None` if the connection limit is reached (close it at once).
    /// The hello is queued for sending (a wake follows).
    pub fn handle_connect(&mut self, now: Instant, nonce: [u8; 16]) -> Option<ConnId> {
        let _ = (now, nonce, &self.config);
        todo!()
    }

    /// Bytes received on `conn`.
    pub fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]) {
        let _ = (now, conn, bytes);
        todo!()
    }

    /// Everything taken from `conn` by [`Server::take_transmit`] so far has
    /// been written to the transport: grants in it count as delivered.
    pub fn handle_flushed(&mut self, now: Instant, conn: ConnId) {
        let _ = (now, conn);
        todo!()
    }

    /// The transport of `conn` is gone (EOF, error, or after
    /// [`ConnState::CloseAfterFlush`]). Its queued waiters are dropped and
    /// grants not yet flushed to it are released at once.
    pub fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        let _ = (now, conn);
        todo!()
    }

    /// Processes every deadline at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// The earliest instant at which [`Server::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }

    /// A connection that has bytes to send or must be closed. Each connection
    /// is reported at most once until its bytes are taken.
    pub fn poll_wake(&mut self) -> Option<ConnId> {
        todo!()
    }

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection.
    pub fn take_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState {
        let _ = (conn, out);
        todo!()
    }

    /// False while `conn` has too many reply bytes waiting to be written: the
    /// driver should stop reading from it until it has written them.
    pub fn wants_input(&self, conn: ConnId) -> bool {
        let _ = conn;
        todo!()
    }

    /// Stop serving: every queued waiter gets `T`, later requests get
    /// `E 3` (no effect). The driver then flushes and closes every connection.
    pub fn begin_shutdown(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// Current counts.
    pub fn stats(&self) -> ServerStats {
        todo!()
    }
}
