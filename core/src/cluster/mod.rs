//! Cluster mode: the replicated lock state and the commands that change it.
//!
//! - [`command`]: `Init`/`Grant`/`Release`/`Expire`/`ForceRelease` and their byte encoding
//!   (the payload of Raft command entries), and [`ApplyResult`].
//! - [`state`]: [`ReplicatedLocks`], the state machine every node applies
//!   committed commands to, with its snapshot encoding.
//!
//! See `docs/cluster.md` for how a grant flows from a client through Raft.

pub(crate) mod bytes;
pub mod command;
pub mod node;
pub mod peer;
pub mod state;

pub use self::command::{ApplyResult, Command, MAX_COMMAND_LEN, MAX_FIRST_TOKEN};
pub use self::node::{
    ClusterConfig, ClusterNode, ClusterStats, KEEPALIVE_HEARTBEATS, LIVE_HEARTBEATS, PeerLiveness,
    default_peer_silence_timeout,
};
pub use self::state::{Holding, MAX_SNAPSHOT_NEXT_TOKEN, ReplicatedLocks, SnapshotError};
