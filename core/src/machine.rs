//! The driver contract: what every runtime does with a sans-IO core, the
//! single-mode [`crate::server::Server`] or a cluster node
//! ([`crate::cluster::ClusterNode`]).
//!
//! The shape is str0m's and quinn-proto's: the driver owns sockets, the
//! clock and the timer; the core owns every decision.
//!
//! - **Inputs** are `handle_*(now, …)`: a connection opened, bytes read,
//!   bytes written, a transport closed, a deadline due, a dial that
//!   succeeded or failed, a reserve write that succeeded or failed, an
//!   operator's force-release; [`Machine::begin_shutdown`] to stop.
//! - **Outputs** are `poll_*`, drained by the driver after every input:
//!   connections to serve ([`Machine::poll_wake`], then
//!   [`Machine::poll_transmit`] for each), the next deadline
//!   ([`Machine::poll_timeout`]), peers to dial, reserve values to store,
//!   answers to force-releases, and what to log (reports, token alerts,
//!   node events). The driver logs them; it decides nothing about them.
//! - **Queries** read the core without changing it: flow control
//!   ([`Machine::wants_input`]), shutdown progress, lock inspection.
//!
//! `now` is always the driver's monotonic clock; an input never moves time
//! backwards. Verbs that only one mode has (peers, dials, node events) have
//! defaults that say "nothing", so the single-mode server implements the
//! trait without them.
//!
//! `Send + 'static`: a core owns all its state, so a driver may keep it
//! behind a mutex shared by tasks on any thread.

use std::net::IpAddr;

use crate::auth::NONCE_LEN;
use crate::budget::LogEvent;
use crate::cluster::NodeEvent;
use crate::conn::{ConnId, ConnState};
use crate::inspect::{
    AdminRequestId, ForceRelease, ForceReleaseOutcome, ListingCursor, LockListing, LockView,
    NotLeader,
};
use crate::raft::NodeId;
use crate::reserve::TokenAlert;
use crate::time::Instant;
use crate::wire::Key;

/// A sans-IO core as its driver sees it. See the module documentation for
/// the loop every driver runs.
pub trait Machine: Send + 'static {
    // -- inputs -----------------------------------------------------------

    /// A client connection from `source` was accepted. The driver passes
    /// fresh CSPRNG bytes as `nonce`. `None`: the core refuses it (every
    /// session slot taken, or shutting down); the driver closes it at once.
    /// Otherwise the hello is queued (a wake follows).
    fn handle_connect(
        &mut self,
        now: Instant,
        nonce: [u8; NONCE_LEN],
        source: IpAddr,
    ) -> Option<ConnId>;

    /// A connection from `source` was accepted on the peer listener (a
    /// cluster node's). Like [`Machine::handle_connect`]; a core without
    /// peers refuses it.
    fn handle_peer_accept(
        &mut self,
        _now: Instant,
        _nonce: [u8; NONCE_LEN],
        _source: IpAddr,
    ) -> Option<ConnId> {
        None
    }

    /// `bytes` were read from `conn`. The driver reads from a connection
    /// only while [`Machine::wants_input`] says so.
    fn handle_input(&mut self, now: Instant, conn: ConnId, bytes: &[u8]);

    /// The next `bytes` of what [`Machine::poll_transmit`] gave for `conn`
    /// were accepted by the transport. The driver reports a short or failed
    /// write's part too: a grant whose frame left whole may be in the
    /// client's hands.
    fn handle_written(&mut self, now: Instant, conn: ConnId, bytes: usize);

    /// Everything [`Machine::poll_transmit`] gave for `conn` so far was
    /// handed on (an in-memory link fed it to its reader): grants in it
    /// count as delivered.
    fn handle_flushed(&mut self, now: Instant, conn: ConnId);

    /// The transport of `conn` is gone (EOF, error, or after
    /// [`ConnState::CloseAfterFlush`] was written). The driver calls it
    /// exactly once per connection the core opened, however its task ends.
    fn handle_closed(&mut self, now: Instant, conn: ConnId);

    /// The deadline of [`Machine::poll_timeout`] (or anything earlier) is
    /// due: the core serves every deadline at or before `now`.
    fn handle_timeout(&mut self, now: Instant);

    /// The dial of peer `slot` asked for by [`Machine::poll_dial`]
    /// succeeded: the transport is up and is a new connection of the core.
    /// `nonce` is fresh CSPRNG bytes. `None`: the core takes no dialed
    /// connections (it never asks to dial); the driver drops it.
    fn handle_dialed(
        &mut self,
        _now: Instant,
        _slot: u8,
        _nonce: [u8; NONCE_LEN],
    ) -> Option<ConnId> {
        None
    }

    /// The dial of peer `slot` asked for by [`Machine::poll_dial`] failed
    /// or timed out: the core retries after its backoff.
    fn handle_dial_failed(&mut self, _now: Instant, _slot: u8) {}

    /// The value of [`Machine::poll_reserve`] is durable.
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64);

    /// The write asked for by [`Machine::poll_reserve`] failed; the core
    /// asks again later.
    fn handle_reserve_failed(&mut self, now: Instant);

    /// An operator's force-release, under an `id` the driver picks; its
    /// answer comes from [`Machine::poll_admin_reply`] under that id (at
    /// once in single mode, once applied in a cluster).
    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease);

    /// Stop serving: queued waiters are answered, connections are flushed
    /// and closed, new ones refused. The driver stops accepting, keeps
    /// draining the outputs, and waits for [`Machine::quiesced`] or for its
    /// connections to end (or its grace period).
    fn begin_shutdown(&mut self, now: Instant);

    // -- outputs ----------------------------------------------------------

    /// A connection with bytes to send or to be closed; `None`: no more.
    /// The driver drains it after every input and serves each connection
    /// with [`Machine::poll_transmit`]. A cluster node also names peer links
    /// whose bytes the take itself builds (Raft's messages, held so that
    /// the inputs of one wake-up share them): the take may give nothing.
    fn poll_wake(&mut self) -> Option<ConnId>;

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection: keep it, close it once `out` is written, or
    /// forget it (gone). The driver writes `out` and reports
    /// [`Machine::handle_written`] (or [`Machine::handle_flushed`]).
    fn poll_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState;

    /// The earliest instant at which [`Machine::handle_timeout`] has work;
    /// `None`: no deadline. The driver re-reads it after every input and
    /// sleeps until it.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next peer slot to dial (at its configured peer address); the
    /// driver answers with [`Machine::handle_dialed`] or
    /// [`Machine::handle_dial_failed`].
    fn poll_dial(&mut self, _now: Instant) -> Option<u8> {
        None
    }

    /// A token reserve value to store durably (see [`crate::reserve`]);
    /// the driver writes one at a time and answers with
    /// [`Machine::handle_reserve_persisted`] or
    /// [`Machine::handle_reserve_failed`].
    fn poll_reserve(&mut self, now: Instant) -> Option<u64>;

    /// The next answer to a [`Machine::handle_force_release`]; the driver
    /// hands it to whoever waits under its id.
    fn poll_admin_reply(&mut self) -> Option<(AdminRequestId, ForceReleaseOutcome)>;

    /// The next report to log: aggregated abuse (`warn`), force-releases
    /// (`warn`), close reasons (`debug`). The queue is bounded; a driver
    /// without a logger drains and drops them.
    fn poll_log(&mut self) -> Option<LogEvent>;

    /// The next token alert for the operator; the driver logs it at
    /// `error`.
    fn poll_alert(&mut self) -> Option<TokenAlert>;

    /// The next change a cluster node reports about itself (leader, voter,
    /// generation, refused peer input); the driver logs it, naming
    /// [`Machine::node_id`] where the event is about this node.
    fn poll_node_event(&mut self) -> Option<NodeEvent> {
        None
    }

    // -- queries ----------------------------------------------------------

    /// False while the core wants no more input from `conn` (too many reply
    /// bytes waiting, or a closing connection): the driver stops reading
    /// from it until this turns true again after a write.
    fn wants_input(&self, conn: ConnId) -> bool;

    /// True once [`Machine::begin_shutdown`] was called.
    fn is_shutting_down(&self) -> bool;

    /// During shutdown: true when the connections left may be dropped
    /// without waiting for them to close (a cluster node's clients are
    /// answered and its leadership handed over; its peer links may go).
    /// A core whose every connection must close says false.
    fn quiesced(&self) -> bool {
        false
    }

    /// This cluster node's current id (it changes if the node rejoins
    /// under a new generation); `None` in single mode.
    fn node_id(&self) -> Option<NodeId> {
        None
    }

    /// `key` as an operator sees it at `now` (see [`crate::inspect`]);
    /// `None` when it is neither held nor waited on, or when this core
    /// does not serve inspection ([`Machine::not_leader`] says where to go).
    fn inspect_lock(&self, now: Instant, key: &Key) -> Option<LockView>;

    /// One page of the keys starting with `prefix` that are held or waited
    /// on at `now`, going on from `cursor`: at most `limit` (clamped to
    /// [`crate::inspect::LISTING_LIMIT_MAX`]) keys, ascending within the
    /// page, from a bounded part of the scan
    /// ([`crate::inspect::LISTING_SLOTS_PER_CALL_MAX`] slots), so a call
    /// never stalls the state machine. Empty when this core does not serve
    /// inspection.
    fn inspect_locks(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
        cursor: ListingCursor,
    ) -> LockListing;

    /// Where to send an operator instead (a cluster node that is not the
    /// leader); `None`: this core serves inspection and force-release.
    fn not_leader(&self) -> Option<NotLeader> {
        None
    }
}
