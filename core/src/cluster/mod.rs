//! Cluster mode: the replicated lock state and the commands that change it.
//!
//! - [`command`]: `Init`/`Grant`/`Release`/`Expire`/`ForceRelease` and their byte encoding
//!   (the payload of Raft command entries), and [`ApplyResult`].
//! - [`state`]: [`ReplicatedLocks`], the state machine every node applies
//!   committed commands to, with its snapshot encoding.
//! - [`node`]: [`ClusterNode`], one node as a sans-IO state machine: client
//!   connections (through the shared connection front), peer sessions, and
//!   the Raft group ([`crate::raft`]) that orders the commands.
//! - [`events`]: [`NodeEvent`], the leader/voter/generation changes a node
//!   queues for its driver.
//! - [`peer`]: the peer protocol between nodes: handshake, authenticated
//!   frames, and the encoding of Raft messages.
//!
//! The connection types a driver names ([`ConnId`], [`ConnState`],
//! [`Dialect`]) are the shared ones of the connection layer, re-exported
//! here so a cluster driver needs nothing from [`crate::server`].
//!
//! See `docs/cluster.md` for how a grant flows from a client through Raft.

pub(crate) mod bytes;
pub mod command;
pub mod events;
mod metrics;
pub mod node;
pub mod peer;
pub mod recovery;
pub mod state;

pub use crate::conn::{ConnId, ConnState, Dialect};

pub use self::command::{ApplyResult, COMMAND_LEN_MAX, Command, FIRST_TOKEN_MAX, GrantOptions};
pub use self::events::{NODE_EVENTS_MAX, NodeEvent};
pub use self::node::{
    BOOTSTRAP_GENERATION, ClusterConfig, ClusterNode, ClusterStats, KEEPALIVE_HEARTBEATS,
    LIVE_HEARTBEATS, PeerLiveness, StartFacts, StartMode, default_peer_silence_timeout,
};
pub use self::state::{Holding, ReplicatedLocks, SNAPSHOT_NEXT_TOKEN_MAX, SnapshotError};
