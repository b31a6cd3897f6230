//! Everything a core asks of its driver, as one type: the driver drains
//! [`super::Machine::poll_output`] with one exhaustive `match`, so an
//! output it ignores is a line someone wrote, not a queue nobody drains.

use crate::budget::LogEvent;
use crate::conn::ConnId;
use crate::inspect::{AdminRequestId, ForceReleaseOutcome};
use crate::reserve::TokenAlert;

use super::NodeEvent;

/// One output of a core. See [`super::Machine`] for the loop every driver
/// runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// `conn` has bytes to send or is to be closed: serve it with
    /// [`super::Machine::poll_transmit`]. The hot output: most inputs end
    /// in one.
    Wake(ConnId),
    /// Dial peer `slot` at its configured peer address, and answer with
    /// [`super::Machine::handle_dialed`] or
    /// [`super::Machine::handle_dial_failed`].
    Dial {
        /// The peer's slot.
        slot: u8,
    },
    /// Store this token reserve value durably (see [`crate::reserve`]) and
    /// answer with [`super::Machine::handle_reserve_persisted`] or
    /// [`super::Machine::handle_reserve_failed`]. One is asked for at a
    /// time.
    Reserve {
        /// The value to store.
        value: u64,
    },
    /// The answer to a [`super::Machine::handle_force_release`]: hand it to
    /// whoever waits under `id`.
    AdminReply {
        /// The id the driver picked for the request.
        id: AdminRequestId,
        /// What the force-release did.
        outcome: ForceReleaseOutcome,
    },
    /// A report to log: aggregated abuse (`warn`), force-releases (`warn`),
    /// close reasons (`debug`). The core's queue of them is bounded.
    Log(LogEvent),
    /// A token alert for the operator (log it at `error`).
    Alert(TokenAlert),
    /// A change a cluster node reports about itself (leader, voter,
    /// generation, refused peer input); log it, naming
    /// [`super::Machine::node_id`] where the event is about this node.
    Node(NodeEvent),
}
