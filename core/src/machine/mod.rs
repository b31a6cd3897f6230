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
//! - **Outputs** are one queue, [`Machine::poll_output`], drained by the
//!   driver after every input with one exhaustive `match` over [`Output`]:
//!   connections to serve (each then with [`Machine::poll_transmit`]),
//!   peers to dial, reserve values to store, answers to force-releases,
//!   and what to log (reports, token alerts, node events). An output kind a
//!   driver does not act on is a visible arm of that `match`, never a queue
//!   nobody drains. The driver logs what it is given; it decides nothing
//!   about it. Beside the queue, [`Machine::poll_timeout`] gives the next
//!   deadline.
//! - **Queries** read the core without changing it: flow control
//!   ([`Machine::wants_input`]), shutdown progress, lock inspection, the
//!   recent events and (cluster) the members.
//!
//! An in-process driver (the embedded server) may hand requests over as
//! values and take replies as values ([`Machine::handle_requests`],
//! [`Machine::poll_transmit_replies`]); a core without that path serves
//! them as the bytes they stand for.
//!
//! `now` is always the driver's monotonic clock; an input never moves time
//! backwards. Verbs that only one mode has (peers, dials) have defaults that
//! say "nothing", so the single-mode server implements the trait without
//! them.
//!
//! `Send + 'static`: a core owns all its state, so a driver may keep it
//! behind a mutex shared by tasks on any thread.

use std::net::IpAddr;

mod node;
mod output;

pub use node::{NodeEvent, NodeId, PeerError};
pub use output::Output;

use crate::auth::NONCE_LEN;
use crate::conn::{ConnId, ConnState};
use crate::events::EventView;
use crate::inspect::{
    AdminRequestId, ForceRelease, ListingCursor, LockListing, LockView, MemberView, NotLeader,
};
use crate::time::Instant;
use crate::wire::{Key, Reply, Request};

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

    /// Requests received on `conn` as values rather than bytes (an
    /// in-process link, whose client session hands over the requests it
    /// would encode). Served exactly as their frames would be; replies come
    /// from [`Machine::poll_transmit_replies`]. A core without a value path
    /// serves the frames they stand for. `requests` is left empty.
    fn handle_requests(&mut self, now: Instant, conn: ConnId, requests: &mut Vec<Request>) {
        let mut bytes = Vec::new();
        for request in requests.drain(..) {
            bytes.extend_from_slice(&request.to_frame());
        }
        self.handle_input(now, conn, &bytes);
    }

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

    /// The dial of peer `slot` asked for by [`Output::Dial`]
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

    /// The dial of peer `slot` asked for by [`Output::Dial`] failed
    /// or timed out: the core retries after its backoff.
    fn handle_dial_failed(&mut self, _now: Instant, _slot: u8) {}

    /// The value of [`Output::Reserve`] is durable.
    fn handle_reserve_persisted(&mut self, now: Instant, value: u64);

    /// The write asked for by [`Output::Reserve`] failed; the core
    /// asks again later.
    fn handle_reserve_failed(&mut self, now: Instant);

    /// An operator's force-release, under an `id` the driver picks; its
    /// answer comes from [`Output::AdminReply`] under that id (at
    /// once in single mode, once applied in a cluster).
    fn handle_force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease);

    /// Stop serving: queued waiters are answered, connections are flushed
    /// and closed, new ones refused. The driver stops accepting, keeps
    /// draining the outputs, and waits for [`Machine::quiesced`] or for its
    /// connections to end (or its grace period).
    fn begin_shutdown(&mut self, now: Instant);

    // -- outputs ----------------------------------------------------------

    /// The next thing the core asks of its driver (see [`Output`]);
    /// `None`: nothing more until the next input. The driver drains it
    /// after every input (and after [`Machine::handle_timeout`]) with one
    /// exhaustive `match`. `now` is the driver's clock: some outputs (a
    /// dial's backoff, a reserve write's retry) are due only from a time.
    fn poll_output(&mut self, now: Instant) -> Option<Output>;

    /// Moves `conn`'s pending bytes to the end of `out` and says what to do
    /// with the connection: keep it, close it once `out` is written, or
    /// forget it (gone). The driver calls it for each [`Output::Wake`],
    /// writes `out` and reports [`Machine::handle_written`] (or
    /// [`Machine::handle_flushed`]). A cluster node also wakes peer links
    /// whose bytes the take itself builds (Raft's messages, held so that
    /// the inputs of one wake-up share them): the take may give nothing.
    fn poll_transmit(&mut self, conn: ConnId, out: &mut Vec<u8>) -> ConnState;

    /// [`Machine::poll_transmit`] for a connection whose requests come as
    /// values ([`Machine::handle_requests`]): its pending bytes to the end
    /// of `out`, then its reply values to the end of `replies`, in stream
    /// order. A core without a value path gives everything as bytes in
    /// `out` (the driver decodes them as a socket's reader would).
    fn poll_transmit_replies(
        &mut self,
        conn: ConnId,
        out: &mut Vec<u8>,
        _replies: &mut Vec<Reply>,
    ) -> ConnState {
        self.poll_transmit(conn, out)
    }

    /// The earliest instant at which [`Machine::handle_timeout`] has work;
    /// `None`: no deadline. The driver re-reads it after every input and
    /// sleeps until it.
    fn poll_timeout(&self) -> Option<Instant>;

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

    /// The recent events this core recorded (see [`crate::events`]), the
    /// most recent first, aged at `now`: at most
    /// [`crate::events::EVENTS_MAX`]. Every node answers with its own.
    fn recent_events(&self, now: Instant) -> Vec<EventView>;

    /// Every member of the cluster as this node sees it (see
    /// [`crate::inspect::MemberView`]); empty in single mode.
    fn members(&self, _now: Instant) -> Vec<MemberView> {
        Vec::new()
    }
}
