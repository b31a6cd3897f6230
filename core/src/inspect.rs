//! What an operator may ask the core about its locks, and the force-release
//! an operator may order: the vocabulary shared by the single-mode server,
//! the cluster node and the embedded lock.
//!
//! Inspection is a query on core state at the `now` the driver passes, so
//! ages and remaining times are computed here, deterministically; the
//! driver only renders them (JSON over the admin listener, or Rust values
//! from the embedded server). A force-release is a core input, answered
//! through the same core that decides every other release: in single mode
//! at once, in cluster mode once its replicated command is applied.

use std::net::IpAddr;

use crate::conn::{ConnId, Dialect};
use crate::wire::Key;

/// Most locks one listing returns, whatever the caller asks for: a listing
/// is built under the core's lock, so its cost must stay bounded.
pub const LISTING_LIMIT_MAX: usize = 1_000;

/// Most waiters one [`LockView`] lists; the rest are only counted
/// ([`LockView::waiters_total`]).
pub const LISTED_WAITERS_MAX: usize = 1_000;

/// Most waiters each lock of a [`LockListing`] lists (the front of its
/// queue; the rest are counted), so a listing stays small however long
/// the queues are: ask for one key to see more.
pub const WAITERS_PER_LISTED_LOCK_MAX: usize = 10;

/// The client connection a grant or a wait belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnView {
    /// The core's id of the connection.
    pub conn: ConnId,
    /// The address the connection came from.
    pub source: IpAddr,
    /// The dialect it speaks.
    pub dialect: Dialect,
}

/// The current grant on a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    /// The grant's fencing token.
    pub token: u64,
    /// Every key of the grant, ascending (one key unless it is a set).
    pub keys: Vec<Key>,
    /// How long ago the grant was made, in milliseconds.
    pub held_ms: u64,
    /// How long until the lease runs out, in milliseconds (0 once it has).
    pub lease_remaining_ms: u64,
    /// The connection it was granted to; `None` when the core no longer
    /// knows it (a cluster grant made by another leader, or a connection
    /// that has gone while the lease runs on).
    pub conn: Option<ConnView>,
}

/// One queued waiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterView {
    /// Every key the waiter asked for, ascending.
    pub keys: Vec<Key>,
    /// How long it has waited, in milliseconds.
    pub waited_ms: u64,
    /// How long until its wait bound answers it `T`, in milliseconds.
    pub wait_remaining_ms: u64,
    /// The connection waiting.
    pub conn: Option<ConnView>,
}

/// One key as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    /// The key.
    pub key: Key,
    /// Its holder, if any.
    pub holder: Option<HolderView>,
    /// Its waiters in queue order (the front first), at most
    /// [`LISTED_WAITERS_MAX`].
    pub waiters: Vec<WaiterView>,
    /// How many waiters are queued in all.
    pub waiters_total: usize,
}

/// An answer to a listing by prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockListing {
    /// Locks whose key starts with the prefix, in ascending key order.
    pub locks: Vec<LockView>,
    /// True when more locks matched than the limit let through.
    pub truncated: bool,
}

/// An operator's request to release a key whatever its holder does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForceRelease {
    /// Any key of the grant; a set is released whole.
    pub key: Key,
    /// Release only if this token still holds the key.
    pub token: Option<u64>,
}

/// Names one force-release so its answer can find its way back (the
/// driver picks the ids; the core only echoes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdminRequestId(pub u64);

/// What a force-release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceReleaseOutcome {
    /// The grant `revoked` is gone, exactly as if its holder had released
    /// it: the key was handed to its front waiter under a new, larger token
    /// (`handed_to`), or left free. The old holder's later release gets `N`.
    Released {
        /// The token that no longer holds.
        revoked: u64,
        /// Every key the revoked grant held.
        keys: Vec<Key>,
        /// The token of the grant made by the hand-over, if any.
        handed_to: Option<u64>,
    },
    /// Nobody holds the key.
    NotHeld,
    /// The key is held, by another token than the one named.
    TokenMismatch {
        /// The token that holds it.
        held: u64,
    },
    /// This node cannot order it (cluster mode: not the leader); ask the
    /// leader, whose slot is given when known.
    NotLeader {
        /// The leader's slot, if one is known.
        leader_slot: Option<u8>,
    },
    /// Nothing was done: the node cannot take more work now (cluster
    /// mode: Raft holds as many uncommitted entries as allowed). Retry.
    Busy,
    /// The outcome is unknown (cluster mode: the command was proposed but
    /// leadership was lost before it was seen applied). Inspect the key.
    Indeterminate,
}

/// A cluster node that is not the leader (or a leader still catching up
/// with its predecessor's log) answers inspection with this instead: only
/// the leader knows the waiters, and only a caught-up one is sure of the
/// holders. The admin layer redirects to the leader's admin address, or
/// answers "unavailable" when none is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    /// The leader's slot, if one is known (and is not this node).
    pub leader_slot: Option<u8>,
    /// The leader's admin address (`host:port`), if configured.
    pub leader_admin: Option<Box<str>>,
}
