//! [`ClusterConfig`]: what one node is told at start (identities, secrets,
//! limits, timing), its defaults and the checks the node's constructors
//! rely on, and the heartbeat multiples that peer links are watched with.

use crate::auth::ClientTokens;
use crate::budget::BudgetConfig;
use crate::cluster::command::FIRST_TOKEN_MAX;
use crate::cluster::peer::{FRAME_LEN_MAX, PeerTokens};
use crate::line::LINE_TEXT_LEN_MAX;
use crate::lock::{HoldCaps, Limits};
use crate::raft::{NodeId, RaftConfig};
use crate::time::Duration;

/// Configuration of one cluster node.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The cluster's 32-byte identity (one fencing domain).
    pub fingerprint: [u8; 32],
    /// This node's Raft identity: its slot and a generation that is new on
    /// every start with empty state.
    pub id: NodeId,
    /// Slots in the cluster (3 or 5); peers are dialed in `0..slot_count`.
    pub slot_count: u8,
    /// Raft timing and limits.
    pub raft: RaftConfig,
    /// Limits of the leader's waiter table.
    pub limits: Limits,
    /// A queued request gets `T` this long before `wait` seconds after
    /// receipt.
    pub wait_margin: Duration,
    /// Client connections past their handshake (sessions) at most;
    /// unfinished handshakes have their own budget
    /// ([`BudgetConfig::handshakes_max`]).
    pub connections_max: usize,
    /// Requests awaiting a reply on one client connection at most; an
    /// acquire over it is answered `B`.
    pub in_flight_per_connection_max: usize,
    /// Bytes buffered for one connection before the node stops reading
    /// from it (clients) or drops Raft messages to it (peers).
    pub outbound_bytes_per_connection_max: usize,
    /// An unfinished handshake (client or peer) is closed after this long.
    pub handshake_timeout: Duration,
    /// Accepted client tokens.
    pub client_tokens: ClientTokens,
    /// Peer tokens (the first one is this node's own).
    pub peer_tokens: PeerTokens,
    /// Handshake budgets (client and peer), held-key cap, release-miss
    /// limit, report interval.
    pub budget: BudgetConfig,
    /// The token floor at this process's start: the larger of the
    /// wall-clock microseconds since the Unix epoch and the token reserve
    /// this slot stored before plus one
    /// ([`crate::reserve::start_token`]); the first token of the domain if
    /// this node's leadership initialises it.
    pub bootstrap_wall_clock_us: u64,
    /// First redial delay after a failed or lost peer connection.
    pub dial_backoff_min: Duration,
    /// Largest redial delay (the delay doubles up to it).
    pub dial_backoff_max: Duration,
    /// An established peer connection that received no frame for this
    /// long, or whose queued output was not written for this long, is
    /// closed ([`CloseReason::PeerSilent`](crate::budget::CloseReason::PeerSilent)) and its slot redialed. Every
    /// live connection carries a frame each way at least every
    /// [`KEEPALIVE_HEARTBEATS`] heartbeat intervals (Raft traffic or a
    /// keepalive), so only a dead or stuck link stays silent this long.
    /// Default: twice the largest election timeout.
    pub peer_silence_timeout: Duration,
    /// Each slot's client address as clients spell it, in slot order (empty:
    /// none known). Line-dialect clients are routed by it (`M` and `L` carry
    /// the address as text, compared as an exact string with the client's
    /// own list); v3 clients route by slot and do not need it. At most
    /// 190 bytes each, no CR or LF.
    pub client_addresses: Vec<Box<str>>,
    /// Each slot's admin listener address (`host:port`), in slot order
    /// (empty: none known). A follower names the leader's with
    /// [`NotLeader`](crate::inspect::NotLeader) so that the admin HTTP layer can redirect an operator
    /// there. At most 190 bytes each, no CR or LF.
    pub admin_addresses: Vec<Box<str>>,
    /// The caps on total hold of our clients' grants (connections that
    /// negotiated renewal; other clients' grants have none).
    pub hold_caps: HoldCaps,
    /// A recovering member ([`crate::cluster::recovery`]): as leader it
    /// proposes the domain's `Init` only once it heard the token floors of
    /// every slot but one (itself included) among the members of its own
    /// generation.
    pub recovering: bool,
}

/// A peer connection on which nothing was sent for this many heartbeat
/// intervals gets a keepalive frame, so that links no Raft message uses
/// (follower to follower, or the second connection of a pair) are not
/// silent while alive.
pub const KEEPALIVE_HEARTBEATS: u32 = 2;

/// A slot whose connection received a frame within this many heartbeat
/// intervals counts as live ([`PeerLiveness::Live`](super::PeerLiveness::Live)).
pub const LIVE_HEARTBEATS: u32 = 5;

impl ClusterConfig {
    /// Defaults for everything but identities and secrets.
    pub fn new(
        fingerprint: [u8; 32],
        id: NodeId,
        slot_count: u8,
        peer_tokens: PeerTokens,
        bootstrap_wall_clock_us: u64,
    ) -> Self {
        ClusterConfig {
            fingerprint,
            id,
            slot_count,
            raft: RaftConfig::default(),
            limits: Limits::default(),
            wait_margin: Duration::from_millis(100),
            connections_max: 10_000,
            in_flight_per_connection_max: 32_768,
            outbound_bytes_per_connection_max: 16 << 20,
            handshake_timeout: Duration::from_secs(3),
            client_tokens: ClientTokens::no_auth(),
            peer_tokens,
            budget: BudgetConfig::for_connections_max(10_000),
            bootstrap_wall_clock_us,
            dial_backoff_min: Duration::from_millis(100),
            // Bounds how long a healed partition waits for the next dial:
            // a failed dial a second per unreachable peer costs nothing.
            dial_backoff_max: Duration::from_millis(1_000),
            peer_silence_timeout: default_peer_silence_timeout(&RaftConfig::default()),
            client_addresses: Vec::new(),
            admin_addresses: Vec::new(),
            hold_caps: HoldCaps::default(),
            recovering: false,
        }
    }

    /// Checks what the node relies on.
    pub fn validate(&self) -> Result<(), &'static str> {
        self.raft.validate()?;
        let live_window = self.live_window();
        if self.peer_silence_timeout <= live_window {
            return Err(
                "peer_silence_timeout must exceed the live window of 5 heartbeat intervals",
            );
        }
        if self.slot_count != 3 && self.slot_count != 5 {
            return Err("a cluster has 3 or 5 slots");
        }
        if self.id.slot >= self.slot_count {
            return Err("this node's slot is outside the cluster");
        }
        if !self.client_addresses.is_empty()
            && self.client_addresses.len() != usize::from(self.slot_count)
        {
            return Err("client_addresses must name every slot, or none");
        }
        let unfit =
            |a: &str| a.is_empty() || a.len() > LINE_TEXT_LEN_MAX || a.contains(['\r', '\n']);
        if self.client_addresses.iter().any(|a| unfit(a)) {
            return Err("a client address must be 1..=190 bytes without CR or LF");
        }
        if !self.admin_addresses.is_empty()
            && self.admin_addresses.len() != usize::from(self.slot_count)
        {
            return Err("admin_addresses must name every slot, or none");
        }
        if self.admin_addresses.iter().any(|a| unfit(a)) {
            return Err("an admin address must be 1..=190 bytes without CR or LF");
        }
        if self.bootstrap_wall_clock_us >= FIRST_TOKEN_MAX {
            // Its Init command would not decode on any node.
            return Err("bootstrap_wall_clock_us is beyond the first-token bound");
        }
        // Every Raft message must fit one peer frame: an append carries at
        // most append_bytes_max plus one entry, a snapshot one chunk.
        let append = self.raft.append_bytes_max + self.raft.entry_bytes_max + 1_024;
        if append > FRAME_LEN_MAX || self.raft.snapshot_chunk_bytes + 1_024 > FRAME_LEN_MAX {
            return Err("raft batch or snapshot chunk exceeds the peer frame limit");
        }
        Ok(())
    }
}

/// Twice the largest election timeout of `raft`: the default
/// [`ClusterConfig::peer_silence_timeout`] (set it again with this after
/// changing the Raft timing).
pub fn default_peer_silence_timeout(raft: &RaftConfig) -> Duration {
    let max = raft
        .election_timeout_min
        .saturating_add(raft.election_timeout_jitter);
    max.saturating_mul(2)
}

impl ClusterConfig {
    fn heartbeat_interval(&self) -> Duration {
        self.raft.heartbeat_interval
    }

    pub(super) fn keepalive_interval(&self) -> Duration {
        self.heartbeat_interval() * KEEPALIVE_HEARTBEATS
    }

    pub(super) fn live_window(&self) -> Duration {
        self.heartbeat_interval() * LIVE_HEARTBEATS
    }
}
