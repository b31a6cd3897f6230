//! Bookkeeping of a served connection that the single-mode
//! [`crate::server::Server`] and the [`crate::cluster::ClusterNode`] share:
//! the outbound side ([`Outbound`]: bytes queued for the driver, how far the
//! driver has taken and written them, the grants they carry, closing after a
//! flush), the queue of connections with work for the driver
//! ([`WakeQueue`]) and handshake deadlines ([`HandshakeDeadlines`]).
//!
//! Both state machines follow one driver contract
//! ([`crate::machine::Machine`]: `poll_wake`, `poll_transmit`,
//! `handle_written`, `handle_flushed`, `wants_input`), so
//! the accounting behind it lives here once; in particular the rule that a
//! grant counts as delivered only once its whole reply frame was written.
//! What happens to a grant that never was differs (the server releases it
//! in its lock table, a cluster leader proposes a `Release`), so
//! [`Outbound::into_undelivered`] hands those back to the owner.
//!
//! The client front end ([`client`]) is shared the same way: the handshake
//! that tells wire v3 from the line dialect, the session decoder of the
//! dialect, and the encoding of a dialect-neutral answer back into bytes.
//! Peer handshakes stay with the cluster node.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::time::Instant;
use crate::wire::{KeyGroup, Reply};

pub(crate) mod admission;
pub(crate) mod client;
pub(crate) mod pushes;

/// A connection, as named by its owner (server or cluster node). Never
/// reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The protocol a client connection speaks, decided by its handshake
/// answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Wire v3 (clients 0.4.0): binary frames with request ids.
    V3,
    /// The line dialect (clients 0.3.0): newline-framed, replies echo the
    /// key and owner or token.
    Line,
}

/// What the driver should do with a connection after taking its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Keep it open.
    Open,
    /// Write what was taken, then close the connection.
    CloseAfterFlush,
    /// The owner no longer knows this connection.
    Gone,
}

/// A grant whose reply frame has not been written whole yet. Kept until it
/// is, so that a connection that dies first does not leave a ghost lock
/// behind.
#[derive(Debug)]
pub(crate) struct UndeliveredGrant {
    /// The fencing token granted.
    pub(crate) token: u64,
    /// The keys it holds.
    pub(crate) keys: KeyGroup,
    /// Offset just past the reply frame in the connection's output stream:
    /// once this many bytes are written the client may have the token.
    end_offset: u64,
}

/// One connection's outbound byte stream and its delivery accounting.
///
/// Offsets count bytes of the whole stream since the connection opened, so
/// they stay valid however the driver splits takes and writes.
#[derive(Debug)]
pub(crate) struct Outbound {
    /// Bytes queued and not yet taken by the driver.
    buffer: Vec<u8>,
    /// Replies queued as values, after `buffer`'s bytes, for a driver that
    /// hands its peer reply values rather than bytes (an in-process link,
    /// see [`Outbound::queue_reply`]). Each counts in the stream's offsets
    /// as the bytes of its frame, so the delivery accounting is the byte
    /// stream's.
    replies: Vec<Reply>,
    /// The frame bytes of `replies`.
    replies_len: usize,
    /// Bytes of the stream handed to the driver.
    taken_bytes: u64,
    /// Bytes of the stream the driver reported written.
    written_bytes: u64,
    /// Grants whose reply frame is not yet written whole, by `end_offset`.
    undelivered: VecDeque<UndeliveredGrant>,
    /// Whether this connection is in the owner's [`WakeQueue`]; keeps the
    /// queue no longer than the number of connections.
    in_wake_queue: bool,
    /// The owner decided to close: no more input is read; what is queued is
    /// flushed, then the driver closes.
    closing: bool,
}

impl Outbound {
    /// A stream whose first bytes are `first` (the handshake hello). The
    /// caller wakes it so the driver sends them.
    pub(crate) fn new(first: Vec<u8>) -> Self {
        Outbound {
            buffer: first,
            replies: Vec::new(),
            replies_len: 0,
            taken_bytes: 0,
            written_bytes: 0,
            undelivered: VecDeque::new(),
            in_wake_queue: false,
            closing: false,
        }
    }

    /// The queue to append bytes to; wake the connection afterwards
    /// ([`WakeQueue::wake`]) so the driver takes them.
    pub(crate) fn buffer_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buffer
    }

    /// Queues `reply` as a value, in the place its frame would take in the
    /// stream (the driver takes it with [`Outbound::take_with_replies`]);
    /// wake the connection afterwards. Only for replies after every byte
    /// queued so far has been taken: bytes queued after it would be taken
    /// first.
    pub(crate) fn queue_reply(&mut self, reply: Reply) {
        debug_assert!(self.buffer.is_empty(), "reply values follow the bytes");
        self.replies_len += reply.frame_len();
        self.replies.push(reply);
    }

    /// The bytes queued and not yet taken (reply values not included).
    pub(crate) fn pending(&self) -> &[u8] {
        &self.buffer
    }

    /// The stream's bytes queued and not yet taken, reply values counted as
    /// their frames.
    pub(crate) fn pending_len(&self) -> usize {
        self.buffer.len() + self.replies_len
    }

    /// True when nothing is queued and everything taken was reported
    /// written.
    pub(crate) fn is_drained(&self) -> bool {
        self.pending_len() == 0 && self.taken_bytes == self.written_bytes
    }

    /// Drops what is queued and not yet taken (a connection given up on
    /// whose bytes nobody will read).
    pub(crate) fn discard_pending(&mut self) {
        self.buffer.clear();
        self.replies.clear();
        self.replies_len = 0;
    }

    /// The grant of `token` on `keys` was just queued: its frame ends at the
    /// stream's current end, and it is undelivered until that is written.
    pub(crate) fn record_grant(&mut self, token: u64, keys: KeyGroup) {
        let end_offset = self.taken_bytes + self.pending_len() as u64;
        self.undelivered.push_back(UndeliveredGrant {
            token,
            keys,
            end_offset,
        });
    }

    /// True once the owner decided to close this connection.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing
    }

    /// [`Outbound::take`], and the reply values queued after the bytes to
    /// the end of `replies` (counted as taken like their frames).
    pub(crate) fn take_with_replies(
        &mut self,
        out: &mut Vec<u8>,
        replies: &mut Vec<Reply>,
    ) -> ConnState {
        // Only the handshake goes as bytes: usually there are none to move.
        let state = if self.buffer.is_empty() {
            self.state()
        } else {
            self.take(out)
        };
        if !self.replies.is_empty() {
            self.taken_bytes += self.replies_len as u64;
            self.replies_len = 0;
            if replies.is_empty() {
                std::mem::swap(replies, &mut self.replies);
            } else {
                replies.append(&mut self.replies);
            }
        }
        state
    }

    /// Moves the queued bytes to the end of `out` and says what the driver
    /// should do with the connection. Reply values stay queued (a driver
    /// that asks for them takes them with [`Outbound::take_with_replies`]).
    pub(crate) fn take(&mut self, out: &mut Vec<u8>) -> ConnState {
        self.taken_bytes += self.buffer.len() as u64;
        if out.is_empty() {
            // Hand over the buffer itself; the driver's empty one comes back.
            std::mem::swap(out, &mut self.buffer);
        } else {
            out.extend_from_slice(&self.buffer);
            self.buffer.clear();
        }
        self.state()
    }

    /// What the driver should do with the connection once it has taken
    /// what is queued.
    fn state(&self) -> ConnState {
        if self.closing {
            ConnState::CloseAfterFlush
        } else {
            ConnState::Open
        }
    }

    /// The next `bytes` of what [`Outbound::take`] gave were written (a
    /// short write reports its part). Grants whose frame is now written
    /// whole count as delivered and are forgotten: the client may have
    /// their token, so they must never be released as ghosts.
    pub(crate) fn handle_written(&mut self, bytes: usize) {
        // Never past what was taken: a driver over-reporting must not make
        // a grant it has not even taken count as delivered.
        self.written_bytes = self
            .written_bytes
            .saturating_add(bytes as u64)
            .min(self.taken_bytes);
        while self
            .undelivered
            .front()
            .is_some_and(|grant| grant.end_offset <= self.written_bytes)
        {
            self.undelivered.pop_front();
        }
    }

    /// Everything taken so far was written.
    pub(crate) fn handle_flushed(&mut self) {
        let unwritten = self.taken_bytes - self.written_bytes;
        self.handle_written(usize::try_from(unwritten).unwrap_or(usize::MAX));
    }

    /// False while closing or while at least `bytes_max` wait to be taken:
    /// the driver should stop reading until the peer catches up.
    pub(crate) fn wants_input(&self, bytes_max: usize) -> bool {
        !self.closing && self.pending_len() < bytes_max
    }

    /// The connection leaves the [`WakeQueue`] (see [`WakeQueue::poll`]):
    /// true if it still has bytes to send or must be closed.
    pub(crate) fn leave_wake_queue(&mut self) -> bool {
        self.in_wake_queue = false;
        self.pending_len() > 0 || self.closing
    }

    /// The grants never written whole, oldest first, for the owner to free
    /// once the connection is gone.
    pub(crate) fn into_undelivered(self) -> VecDeque<UndeliveredGrant> {
        self.undelivered
    }
}

/// Connections that have bytes to send or must be closed, in the order they
/// became so, each at most once.
#[derive(Debug, Default)]
pub(crate) struct WakeQueue {
    queue: VecDeque<ConnId>,
}

impl WakeQueue {
    /// Queues `conn_id` (whose stream is `out`) unless it is queued already.
    pub(crate) fn wake(&mut self, conn_id: ConnId, out: &mut Outbound) {
        if !out.in_wake_queue {
            out.in_wake_queue = true;
            self.queue.push_back(conn_id);
        }
    }

    /// Marks `conn_id` closing and wakes it so the driver flushes what is
    /// queued and then closes ([`ConnState::CloseAfterFlush`]).
    pub(crate) fn close_after_flush(&mut self, conn_id: ConnId, out: &mut Outbound) {
        out.closing = true;
        self.wake(conn_id, out);
    }

    /// The next woken connection that still has work for the driver.
    /// `leave_queue` finds the connection's stream and calls
    /// [`Outbound::leave_wake_queue`] on it (false for a connection that is
    /// gone). A connection whose bytes were already taken since it was
    /// queued is skipped, so each is reported once per batch of bytes.
    #[inline]
    pub(crate) fn poll(&mut self, mut leave_queue: impl FnMut(ConnId) -> bool) -> Option<ConnId> {
        while let Some(conn_id) = self.queue.pop_front() {
            if leave_queue(conn_id) {
                return Some(conn_id);
            }
        }
        None
    }
}

/// When each connection's handshake must have finished. Entries of
/// connections that finished or closed are left in place and skipped by the
/// owner when they come due: cheaper than removing them from the heap.
#[derive(Debug, Default)]
pub(crate) struct HandshakeDeadlines {
    /// Earliest first; ties by connection id, so the order is deterministic.
    heap: BinaryHeap<Reverse<(Instant, ConnId)>>,
}

impl HandshakeDeadlines {
    /// `conn_id`'s handshake must finish by `deadline`.
    pub(crate) fn push(&mut self, deadline: Instant, conn_id: ConnId) {
        self.heap.push(Reverse((deadline, conn_id)));
    }

    /// Removes and returns the next connection whose deadline is at or
    /// before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<ConnId> {
        let Reverse((deadline, conn_id)) = *self.heap.peek()?;
        if deadline > now {
            return None;
        }
        self.heap.pop();
        Some(conn_id)
    }

    /// The earliest deadline, if any.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((deadline, _))| *deadline)
    }
}
