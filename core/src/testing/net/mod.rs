//! The core's test network: machines and their clients wired together in
//! memory, time injected, nothing sleeping.
//!
//! One way to wire a machine to its clients instead of one per test file
//! (the model is quinn-proto's single `Pair` and etcd's raft `network`):
//!
//! - [`Link`]: one client [`Session`] on one connection of a [`Machine`],
//!   bytes pumped both ways until neither side has anything to say.
//! - [`SingleNet`]: one single-mode [`Server`], its clock, its
//!   [`OutputQueues`], raw v3 and line connections with the handshake done
//!   (the test writes the bytes and reads the replies itself) and client
//!   sessions on [`Link`]s.
//! - [`ClusterNet`]: three [`ClusterNode`]s whose peer links, clients
//!   (v3 and line), dials and reserve writes the net serves, with the
//!   faults of a real network: a node cut off, links gone stale, closes
//!   that never complete, nodes killed and started again.
//!
//! Where tests need the server set up differently (the first token, the
//! nonces handed to new connections, how strictly replies are decoded),
//! [`SingleNet`] takes it as an option rather than each file keeping its
//! own copy of the wiring.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use crate::auth::{
    ClientHandshake, ClientHandshakeStatus, NONCE_LEN, SINGLE_FINGERPRINT, WireMode,
};
use crate::budget::{AbuseKind, LogEvent};
use crate::client::{AcquireParams, KeySet, ReleaseOperation, Session, SessionConfig};
use crate::cluster::peer::{
    PeerHandshake, PeerHandshakeStatus, PeerIdentity, PeerSealer, PeerTokens,
};
use crate::cluster::{ClusterConfig, ClusterNode, default_peer_silence_timeout};
use crate::conn::{ConnId, ConnState, Dialect};
use crate::inspect::{AdminRequestId, ForceRelease, ForceReleaseOutcome, LockView};
use crate::line::{LineReply, line_answer};
use crate::machine::{Machine, NodeId};
use crate::metrics::ServerMetrics;
use crate::raft::RaftConfig;
use crate::reserve::TokenReserve;
use crate::server::{Server, ServerConfig};
use crate::time::{Duration, Instant};
use crate::wire::{AcquireRequest, Key, KeyGroup, NO_LEADER_SLOT, ReleaseRequest, Reply, Request};

use super::outputs::OutputQueues;

mod cluster;
mod single;

pub use cluster::*;
pub use single::*;

/// The source address of connections opened without one.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The first fencing token of a [`SingleNet::new`] server: far from zero,
/// so a token that was never issued does not pass for one by accident.
pub const FIRST_TOKEN: u64 = 1_700_000_000_000_000;

/// Where a net's clock starts: not at zero, so "no time" and "the start"
/// differ.
pub const START: Instant = Instant::from_millis(1_000);

/// The key group of `names` (valid key names, deduplicated by the group).
pub fn key_group(names: &[&str]) -> KeyGroup {
    let keys = names
        .iter()
        .map(|name| Key::new(name.as_bytes()).expect("valid key"))
        .collect();
    KeyGroup::new(keys).expect("valid key group")
}

/// An acquire of `names`: a set (`S`) when there is more than one name.
pub fn acquire(rid: u64, names: &[&str], wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: key_group(names),
        set: names.len() > 1,
    })
}

/// A release of `names` under `token`: a set's (`G`) when there is more
/// than one name.
pub fn release(rid: u64, names: &[&str], token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: key_group(names),
        set: names.len() > 1,
    })
}

/// Every reply in `bytes`, which must be whole, valid reply frames.
pub fn decode_replies(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    while !bytes.is_empty() {
        let (reply, used) = Reply::decode(bytes)
            .expect("valid reply")
            .expect("complete reply");
        replies.push(reply);
        bytes = &bytes[used..];
    }
    replies
}

/// The replies at the start of `bytes`, up to the first frame that is
/// invalid or cut short (the rest is ignored).
pub fn decode_replies_leniently(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    while let Ok(Some((reply, used))) = Reply::decode(bytes) {
        replies.push(reply);
        bytes = &bytes[used..];
    }
    replies
}

/// The answer a line client sends for the shared `hello` and `token`: it
/// reads to the first LF and takes what follows the first space, exactly
/// what the published clients do with the hello.
pub fn line_answer_for(hello: &[u8], token: &[u8]) -> Vec<u8> {
    let lf = hello
        .iter()
        .position(|&b| b == b'\n')
        .expect("the hello has an LF");
    let space = hello[..lf]
        .iter()
        .position(|&b| b == b' ')
        .expect("the hello has a space before its LF");
    assert!(space > 0);
    let mut answer = line_answer(token, &hello[space + 1..lf]).to_vec();
    answer.push(b'\n');
    answer
}

// ---------------------------------------------------------------------------
// One client session on one connection
// ---------------------------------------------------------------------------

/// One client [`Session`] on one connection of a [`Machine`]: what the
/// session writes is read by the machine and what the machine writes is
/// read by the session, whole and at once (an in-memory socket that never
/// splits a write and never fails one).
#[derive(Debug)]
pub struct Link {
    conn: ConnId,
    session: Session,
}

impl Link {
    /// A link from `session` to the machine's connection `conn` (already
    /// opened, e.g. by [`Machine::handle_connect`]).
    pub fn new(conn: ConnId, session: Session) -> Self {
        Link { conn, session }
    }

    /// The machine's side of the link.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// The client's side of the link.
    pub fn session(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Hands what the session has to send to the machine; true if there
    /// was anything.
    pub fn send_up<M: Machine>(&mut self, machine: &mut M, now: Instant) -> bool {
        let mut up = Vec::new();
        self.session.poll_transmit(now, &mut up);
        if up.is_empty() {
            return false;
        }
        machine.handle_input(now, self.conn, &up);
        // The machine took every byte, in this very call.
        self.session.handle_written(now, true);
        true
    }

    /// Hands what the machine has for the connection to the session and
    /// reports it flushed; when the machine closes the connection, both
    /// ends see the transport go. True if any bytes moved.
    pub fn send_down<M: Machine>(&mut self, machine: &mut M, now: Instant) -> bool {
        let mut down = Vec::new();
        let state = machine.poll_transmit(self.conn, &mut down);
        machine.handle_flushed(now, self.conn);
        let moved = !down.is_empty();
        if moved {
            self.session.handle_input(now, &down);
        }
        if state == ConnState::CloseAfterFlush {
            self.session.handle_transport_closed(now);
            machine.handle_closed(now, self.conn);
        }
        moved
    }

    /// Moves bytes both ways until neither side has anything to say.
    /// What else the machine emits goes to `outputs`, except the wakes of
    /// this link's connection: the pump serves it anyway.
    pub fn pump<M: Machine>(&mut self, machine: &mut M, outputs: &mut OutputQueues, now: Instant) {
        pump(machine, outputs, std::slice::from_mut(self), now);
    }
}

/// Moves bytes both ways on every link until none has anything to say.
/// Each round hands every session's bytes to the machine first, then every
/// connection's bytes to its session, so requests that arrive together are
/// served together. The machine's outputs go to `outputs`, except the wakes
/// of the links' connections: every link is served after each round.
pub fn pump<M: Machine>(
    machine: &mut M,
    outputs: &mut OutputQueues,
    links: &mut [Link],
    now: Instant,
) {
    loop {
        let mut moved = false;
        for link in links.iter_mut() {
            moved |= link.send_up(machine, now);
        }
        outputs.drain(machine, now);
        outputs
            .wakes
            .retain(|conn| !links.iter().any(|link| link.conn == *conn));
        for link in links.iter_mut() {
            moved |= link.send_down(machine, now);
        }
        if !moved {
            return;
        }
    }
}
