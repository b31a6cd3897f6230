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

// ---------------------------------------------------------------------------
// One single-mode server
// ---------------------------------------------------------------------------

/// The nonce bytes a [`SingleNet`] hands the server for each new
/// connection (a driver passes fresh CSPRNG bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nonces {
    /// The same bytes for every connection.
    Fixed([u8; NONCE_LEN]),
    /// The n-th connection's bytes all n (wrapping), so connections differ.
    Counting,
    /// As [`Nonces::Counting`] with an LF at byte 5: a line-end byte among
    /// the CSPRNG bytes, which must not reach a line client's view of the
    /// shared hello.
    CountingWithLineEnd,
}

/// How a [`SingleNet`] decodes the bytes it takes for a connection into
/// replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyDecoding {
    /// Every byte must belong to a whole, valid reply frame
    /// ([`decode_replies`]).
    Strict,
    /// The replies up to the first invalid or cut-short frame
    /// ([`decode_replies_leniently`]).
    Lenient,
}

/// One single-mode [`Server`] driven by a test: its injected clock, what
/// it emitted and the test has not looked at yet, raw connections the test
/// writes bytes to and takes bytes from, and client sessions on [`Link`]s.
///
/// The fields are public: a test drives the server's other inputs
/// (`handle_closed`, `begin_shutdown`, …) and reads its queries directly,
/// at the net's `now`.
#[derive(Debug)]
pub struct SingleNet {
    /// The server under test.
    pub server: Server,
    /// The clock every input is given; moved only by [`SingleNet::advance`]
    /// (or by the test).
    pub now: Instant,
    /// What the server emitted and the test has not looked at yet.
    pub outputs: OutputQueues,
    nonces: Nonces,
    connections_opened: u8,
    decoding: ReplyDecoding,
    next_admin_id: u64,
    links: Vec<Link>,
}

impl Default for SingleNet {
    /// A server with the default configuration (see [`SingleNet::new`]).
    fn default() -> Self {
        SingleNet::new(ServerConfig::default())
    }
}

impl SingleNet {
    /// A server with `config` whose first token is [`FIRST_TOKEN`], the
    /// clock at [`START`], every connection given the nonce `[0x5a; 16]`,
    /// replies decoded strictly.
    pub fn new(config: ServerConfig) -> Self {
        SingleNet::with_first_token(config, FIRST_TOKEN)
    }

    /// [`SingleNet::new`] with `first_token` as the server's first token.
    pub fn with_first_token(config: ServerConfig, first_token: u64) -> Self {
        SingleNet {
            server: Server::new(config, first_token, START),
            now: START,
            outputs: OutputQueues::default(),
            nonces: Nonces::Fixed([0x5a; NONCE_LEN]),
            connections_opened: 0,
            decoding: ReplyDecoding::Strict,
            next_admin_id: 0,
            links: Vec::new(),
        }
    }

    /// The net with new connections given `nonces`.
    pub fn with_nonces(mut self, nonces: Nonces) -> Self {
        self.nonces = nonces;
        self
    }

    /// The net with replies decoded as `decoding` says.
    pub fn with_reply_decoding(mut self, decoding: ReplyDecoding) -> Self {
        self.decoding = decoding;
        self
    }

    // -- the clock --------------------------------------------------------

    /// Moves the clock on by `by` and serves what is due: the server's
    /// deadlines, then the sessions' (if any), then the links are pumped.
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
        self.server.handle_timeout(self.now);
        if self.links.is_empty() {
            return;
        }
        for link in &mut self.links {
            link.session.handle_timeout(self.now);
        }
        self.pump();
    }

    // -- raw connections --------------------------------------------------

    fn next_nonce(&mut self) -> [u8; NONCE_LEN] {
        match self.nonces {
            Nonces::Fixed(nonce) => nonce,
            Nonces::Counting | Nonces::CountingWithLineEnd => {
                self.connections_opened = self.connections_opened.wrapping_add(1);
                let mut nonce = [self.connections_opened; NONCE_LEN];
                if self.nonces == Nonces::CountingWithLineEnd {
                    nonce[5] = b'\n';
                }
                nonce
            }
        }
    }

    /// Opens a connection from [`LOOPBACK`]; see [`SingleNet::open_from`].
    pub fn open(&mut self) -> (ConnId, Vec<u8>) {
        self.open_from(LOOPBACK)
    }

    /// Opens a connection from `source`, which the server must accept, and
    /// takes its hello (the shared hello, 28 bytes).
    pub fn open_from(&mut self, source: IpAddr) -> (ConnId, Vec<u8>) {
        let nonce = self.next_nonce();
        let conn = self
            .server
            .handle_connect(self.now, nonce, source)
            .expect("connection accepted");
        let (hello, state) = self.take(conn);
        assert_eq!(state, ConnState::Open);
        assert_eq!(hello.len(), 28);
        (conn, hello)
    }

    /// Sends the v3 proof for `token` on a connection just opened (whose
    /// hello was `hello`) and takes what comes back: the result byte(s)
    /// and the connection's state.
    pub fn prove(&mut self, conn: ConnId, hello: &[u8], token: &[u8]) -> (Vec<u8>, ConnState) {
        let mut client =
            ClientHandshake::new(token, SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
        assert_eq!(
            client.handle_input(hello),
            (hello.len(), ClientHandshakeStatus::SendProof)
        );
        self.server
            .handle_input(self.now, conn, &client.proof().expect("a proof to send"));
        self.take(conn)
    }

    /// Opens a connection from [`LOOPBACK`] and runs the v3 handshake with
    /// `token` without judging it: the connection and whether the client
    /// saw it accepted.
    pub fn try_connect_with(&mut self, token: &[u8]) -> (ConnId, bool) {
        let nonce = self.next_nonce();
        let conn = self
            .server
            .handle_connect(self.now, nonce, LOOPBACK)
            .expect("connection accepted");
        let (hello, _) = self.take(conn);
        let mut client =
            ClientHandshake::new(token, SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
        client.handle_input(&hello);
        self.server
            .handle_input(self.now, conn, &client.proof().expect("a proof to send"));
        let (result, _) = self.take(conn);
        let accepted = client.handle_input(&result).1 == ClientHandshakeStatus::Accepted;
        (conn, accepted)
    }

    /// A v3 session from `source` with `token`, the handshake done: the
    /// server answers the proof with the one result byte 1, keeps the
    /// connection open and serves it as v3.
    pub fn connect_from_with(&mut self, source: IpAddr, token: &[u8]) -> ConnId {
        let (conn, hello) = self.open_from(source);
        let mut client =
            ClientHandshake::new(token, SINGLE_FINGERPRINT, WireMode::Single, NO_LEADER_SLOT);
        assert_eq!(
            client.handle_input(&hello),
            (hello.len(), ClientHandshakeStatus::SendProof)
        );
        self.server
            .handle_input(self.now, conn, &client.proof().expect("a proof to send"));
        let (result, state) = self.take(conn);
        assert_eq!((&result[..], state), (&[1][..], ConnState::Open));
        assert_eq!(
            client.handle_input(&result),
            (1, ClientHandshakeStatus::Accepted)
        );
        assert_eq!(self.server.dialect(conn), Some(Dialect::V3));
        conn
    }

    /// A v3 session from [`LOOPBACK`] with `token`, the handshake done.
    pub fn connect_with(&mut self, token: &[u8]) -> ConnId {
        self.connect_from_with(LOOPBACK, token)
    }

    /// A v3 session from `source` with the empty token, the handshake done.
    pub fn connect_from(&mut self, source: IpAddr) -> ConnId {
        self.connect_from_with(source, b"")
    }

    /// A v3 session from [`LOOPBACK`] with the empty token, the handshake
    /// done.
    pub fn connect(&mut self) -> ConnId {
        self.connect_with(b"")
    }

    /// `N` v3 sessions with the empty token, handshakes done.
    pub fn connections<const N: usize>(&mut self) -> [ConnId; N] {
        std::array::from_fn(|_| self.connect())
    }

    /// A line session (the published 0.3.0 dialect) with `token`, the
    /// handshake done: the line answer gets no reply at all.
    pub fn connect_line_with(&mut self, token: &[u8]) -> ConnId {
        let (conn, hello) = self.open();
        self.server
            .handle_input(self.now, conn, &line_answer_for(&hello, token));
        let (bytes, state) = self.take(conn);
        assert_eq!(state, ConnState::Open);
        assert!(bytes.is_empty(), "no result byte for a line client");
        assert_eq!(self.server.dialect(conn), Some(Dialect::Line));
        conn
    }

    /// A line session with the empty token, the handshake done.
    pub fn connect_line(&mut self) -> ConnId {
        self.connect_line_with(b"")
    }

    // -- bytes and requests -------------------------------------------------

    /// Hands `bytes` to the server as read from `conn`.
    pub fn send_bytes(&mut self, conn: ConnId, bytes: &[u8]) {
        self.server.handle_input(self.now, conn, bytes);
    }

    /// Hands `request`'s frame to the server as read from `conn`.
    pub fn send(&mut self, conn: ConnId, request: &Request) {
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        self.send_bytes(conn, &bytes);
    }

    /// Takes what the server has for `conn` without reporting it flushed
    /// (a write that has not finished, or never will): the bytes and the
    /// connection's state.
    pub fn take_unflushed(&mut self, conn: ConnId) -> (Vec<u8>, ConnState) {
        let mut out = Vec::new();
        let state = self.server.poll_transmit(conn, &mut out);
        (out, state)
    }

    /// Takes what the server has for `conn` and reports it flushed (the
    /// client has it): the bytes and the connection's state.
    pub fn take(&mut self, conn: ConnId) -> (Vec<u8>, ConnState) {
        let taken = self.take_unflushed(conn);
        self.server.handle_flushed(self.now, conn);
        taken
    }

    /// The state of `conn` once what the server has for it is taken (and
    /// dropped).
    pub fn state(&mut self, conn: ConnId) -> ConnState {
        self.take(conn).1
    }

    fn decode(&self, bytes: &[u8]) -> Vec<Reply> {
        match self.decoding {
            ReplyDecoding::Strict => decode_replies(bytes),
            ReplyDecoding::Lenient => decode_replies_leniently(bytes),
        }
    }

    /// Takes what the server has for `conn` (flushed) and decodes it: the
    /// replies and the connection's state.
    pub fn replies_and_state(&mut self, conn: ConnId) -> (Vec<Reply>, ConnState) {
        let (bytes, state) = self.take(conn);
        (self.decode(&bytes), state)
    }

    /// Takes what the server has for `conn` (flushed) and decodes the
    /// replies.
    pub fn replies(&mut self, conn: ConnId) -> Vec<Reply> {
        self.replies_and_state(conn).0
    }

    /// Sends `request` on `conn` and takes the replies.
    pub fn call(&mut self, conn: ConnId, request: &Request) -> Vec<Reply> {
        self.send(conn, request);
        self.replies(conn)
    }

    /// Sends `bytes` on `conn` and takes the replies and the connection's
    /// state.
    pub fn call_bytes(&mut self, conn: ConnId, bytes: &[u8]) -> (Vec<Reply>, ConnState) {
        self.send_bytes(conn, bytes);
        self.replies_and_state(conn)
    }

    /// Sends `bytes` on `conn`, which must answer exactly one reply and
    /// stay open; the reply.
    pub fn one_reply(&mut self, conn: ConnId, bytes: &[u8]) -> Reply {
        let (replies, state) = self.call_bytes(conn, bytes);
        assert_eq!(state, ConnState::Open);
        assert_eq!(replies.len(), 1, "{replies:?}");
        replies[0]
    }

    /// Takes the replies of `conn`, which must be one grant (of a key or a
    /// set); its token.
    pub fn granted_token(&mut self, conn: ConnId) -> u64 {
        match self.replies(conn).as_slice() {
            [Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. }] => *token,
            other => panic!("expected one grant, got {other:?}"),
        }
    }

    /// A new v3 session from `source` that holds `names` (lease `lease_s`):
    /// the connection and the grant's token.
    pub fn holder(&mut self, source: IpAddr, names: &[&str], lease_s: u8) -> (ConnId, u64) {
        let conn = self.connect_from(source);
        self.send(conn, &acquire(1, names, 0, lease_s));
        let token = self.granted_token(conn);
        (conn, token)
    }

    /// A new v3 session from `source` queued on `names` (wait `wait_s`,
    /// lease 30 s), not yet answered.
    pub fn waiter(&mut self, source: IpAddr, names: &[&str], wait_s: u8) -> ConnId {
        let conn = self.connect_from(source);
        self.send(conn, &acquire(1, names, wait_s, 30));
        assert_eq!(self.replies(conn), vec![], "queued, no reply yet");
        conn
    }

    // -- outputs and queries ------------------------------------------------

    /// The connections the server asked to serve, in order.
    pub fn woken(&mut self) -> Vec<ConnId> {
        self.outputs.drain(&mut self.server, self.now);
        self.outputs.wakes.drain(..).collect()
    }

    /// Every report the server asked to log.
    pub fn logs(&mut self) -> Vec<LogEvent> {
        self.outputs.logs(&mut self.server, self.now)
    }

    /// The abuse reports among the logs: source, kind and count each.
    pub fn abuse(&mut self) -> Vec<(Option<IpAddr>, AbuseKind, u64)> {
        self.logs()
            .into_iter()
            .filter_map(|event| match event {
                LogEvent::Abuse {
                    source,
                    kind,
                    count,
                } => Some((source, kind, count)),
                LogEvent::Closed { .. } | LogEvent::ForceReleased { .. } => None,
            })
            .collect()
    }

    /// An operator's force-release of `name` (of any holder, or only of
    /// `token`), under a fresh admin id; single mode answers it at once,
    /// and only once.
    pub fn force_release(&mut self, name: &str, token: Option<u64>) -> ForceReleaseOutcome {
        self.next_admin_id += 1;
        let id = AdminRequestId(self.next_admin_id);
        let req = ForceRelease {
            key: Key::new(name.as_bytes()).expect("valid key"),
            token,
        };
        self.server.handle_force_release(self.now, id, req);
        let (answered, outcome) = self
            .outputs
            .admin_reply(&mut self.server, self.now)
            .expect("answered at once");
        assert_eq!(answered, id);
        assert_eq!(self.outputs.admin_reply(&mut self.server, self.now), None);
        outcome
    }

    /// What inspection shows for `name`, which must be held or waited on.
    pub fn show(&self, name: &str) -> LockView {
        self.server
            .inspect_lock(self.now, &Key::new(name.as_bytes()).expect("valid key"))
            .expect("visible")
    }

    /// The server's counters now.
    pub fn metrics(&self) -> ServerMetrics {
        self.server.metrics()
    }

    // -- client sessions ----------------------------------------------------

    /// Opens a connection from [`LOOPBACK`] for a client [`Session`] with
    /// `config` and pumps until its handshake is over; the link's index.
    pub fn connect_session(&mut self, config: SessionConfig) -> usize {
        let nonce = self.next_nonce();
        let conn = self
            .server
            .handle_connect(self.now, nonce, LOOPBACK)
            .expect("connection accepted");
        self.links
            .push(Link::new(conn, Session::new(self.now, config)));
        self.pump();
        self.links.len() - 1
    }

    /// The client session of link `index`.
    pub fn session(&mut self, index: usize) -> &mut Session {
        self.links[index].session()
    }

    /// Moves bytes both ways on every link until none has anything to say
    /// (see [`pump`]).
    pub fn pump(&mut self) {
        pump(
            &mut self.server,
            &mut self.outputs,
            &mut self.links,
            self.now,
        );
    }

    /// Link `index`'s session submits an acquire of `keys` (wait and lease
    /// in seconds, no budget) and the links are pumped; its rid.
    pub fn acquire_on(&mut self, index: usize, keys: KeySet, wait_s: u64, lease_s: u64) -> u64 {
        let now = self.now;
        let params = AcquireParams::new(
            Duration::from_secs(wait_s),
            Duration::from_secs(lease_s),
            Duration::ZERO,
        )
        .expect("valid acquire parameters");
        let deadline = params.operation_deadline(now);
        let rid = self
            .session(index)
            .submit_acquire(now, keys, &params, deadline)
            .expect("acquire submitted");
        self.pump();
        rid
    }

    /// Link `index`'s session submits a release of `keys` under `token`
    /// and the links are pumped; its rid.
    pub fn release_on(&mut self, index: usize, keys: KeySet, token: u64) -> u64 {
        let now = self.now;
        let deadline = ReleaseOperation::new(now, keys.clone(), token).attempt_deadline(now);
        let rid = self
            .session(index)
            .submit_release(now, keys, token, deadline)
            .expect("release submitted");
        self.pump();
        rid
    }
}

// ---------------------------------------------------------------------------
// A cluster of three nodes
// ---------------------------------------------------------------------------

/// The cluster fingerprint of a [`ClusterNet`]'s nodes.
pub const CLUSTER_FINGERPRINT: [u8; 32] = [3; 32];

/// The wall clock of a [`ClusterNet`]'s nodes at start, in microseconds:
/// also where their tokens start.
pub const BOOT_US: u64 = 1_700_000_000_000_000;

/// The generation a bootstrap member of a [`ClusterNet`] joins under if it
/// finds the cluster already running.
pub const REJOIN_GENERATION: u64 = 7;

/// The peer token every node of a [`ClusterNet`] shares.
pub const PEER_TOKEN: &[u8] = b"peer-secret-0123456789-abcdefghijk";

/// The configuration of node `id` of a three-node [`ClusterNet`]: fast
/// Raft timing, the default silence rule, clock at [`BOOT_US`].
pub fn cluster_config(id: NodeId) -> ClusterConfig {
    cluster_config_with_clock(id, BOOT_US)
}

/// [`cluster_config`] with the node's wall clock reading
/// `bootstrap_wall_clock_us` at start.
pub fn cluster_config_with_clock(id: NodeId, bootstrap_wall_clock_us: u64) -> ClusterConfig {
    let tokens = PeerTokens::new([PEER_TOKEN]).expect("a valid peer token");
    let mut config =
        ClusterConfig::new(CLUSTER_FINGERPRINT, id, 3, tokens, bootstrap_wall_clock_us);
    config.raft = RaftConfig::fast();
    config.peer_silence_timeout = default_peer_silence_timeout(&config.raft);
    config
}

/// A client of a [`ClusterNet`]: a v3 or line connection to one node whose
/// replies the net decodes as they arrive.
#[derive(Debug)]
pub struct ClusterClient {
    /// The node it is connected to.
    pub node: usize,
    /// Its connection on that node.
    pub conn: ConnId,
    /// The v3 client's side of the handshake.
    pub handshake: ClientHandshake,
    /// The handshake is done.
    pub established: bool,
    /// Bytes received and not yet decoded.
    pub buf: Vec<u8>,
    /// Every v3 reply received, in order.
    pub replies: Vec<Reply>,
    /// The node closed the connection (or is gone).
    pub closed: bool,
    /// The "socket" to this client is stuck: its bytes stay in the node.
    pub stalled: bool,
    /// A line-dialect client: `replies` stays empty, `lines` has its
    /// replies as (op, token or owner, tail).
    pub line: bool,
    /// Every line reply received, in order.
    pub lines: Vec<(u8, u64, Vec<u8>)>,
}

/// Where bytes written on a node's connection go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A peer connection: the other node and its end of the link.
    Peer(usize, ConnId),
    /// A client: its index in [`ClusterNet::clients`].
    Client(usize),
}

/// Three [`ClusterNode`]s over an in-memory network with injected time:
/// bytes are moved between their connections exactly as a driver would,
/// and clients speak the real wire protocol. Peer dials connect at once
/// unless a node is cut off; links can go stale (bytes lost) and closes
/// can get stuck, as on a partitioned TCP network.
///
/// The fields are public: a test reads the nodes and clients, replaces a
/// node, or changes the network's faults directly.
#[derive(Debug)]
pub struct ClusterNet {
    /// The clock every input is given.
    pub now: Instant,
    /// The nodes by slot; `None`: killed (or not started again yet).
    pub nodes: Vec<Option<ClusterNode>>,
    /// Where the bytes written on each (node, connection) go.
    pub links: BTreeMap<(usize, ConnId), Endpoint>,
    /// Every client ever connected, by index.
    pub clients: Vec<ClusterClient>,
    /// The last nonce byte handed out (see [`ClusterNet::nonce`]).
    pub nonce: u8,
    /// Token reserve writes: the last value made durable per node.
    pub durable: Vec<Option<u64>>,
    /// Writes asked for stay unanswered while set (a stalled disk).
    pub hold_reserve_writes: bool,
    /// With `hold_reserve_writes`: only this node's writes are held
    /// (`None`: every node's). A follower appends no entry its durable
    /// reserve does not cover, so holding every node's stops commits.
    pub hold_reserve_writes_of: Option<usize>,
    /// A node cut off from the others: dials to or from it fail.
    pub cut: Option<usize>,
    /// Connection ends whose bytes never arrive (a cut link, and after the
    /// heal a socket whose retransmission timer backed off): only the local
    /// end learns of a close.
    pub stale: BTreeSet<(usize, ConnId)>,
    /// Stale ends whose close the transport never reports (a write stuck
    /// on a silent link).
    pub stuck: BTreeSet<(usize, ConnId)>,
    /// What each node emitted and the test has not looked at yet.
    pub outputs: Vec<OutputQueues>,
    /// Peer dials that connected.
    pub dials_connected: usize,
    /// `dials_connected` when the latest partition began.
    pub dials_at_cut: usize,
}

impl Default for ClusterNet {
    /// [`ClusterNet::new`].
    fn default() -> Self {
        ClusterNet::new()
    }
}

impl ClusterNet {
    /// Three bootstrap members of generation 1, clocks at [`BOOT_US`].
    pub fn new() -> Self {
        ClusterNet::with_boot_clocks([BOOT_US; 3])
    }

    /// Three bootstrap members whose configuration `adjust` changes.
    pub fn with_config(adjust: fn(&mut ClusterConfig)) -> Self {
        ClusterNet::build([BOOT_US; 3], adjust)
    }

    /// Three bootstrap members whose wall clocks read `clocks_us` at start.
    pub fn with_boot_clocks(clocks_us: [u64; 3]) -> Self {
        ClusterNet::build(clocks_us, |_| {})
    }

    fn build(clocks_us: [u64; 3], adjust: fn(&mut ClusterConfig)) -> Self {
        let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
        let nodes = voters
            .iter()
            .map(|id| {
                let mut config = cluster_config_with_clock(*id, clocks_us[usize::from(id.slot)]);
                adjust(&mut config);
                Some(ClusterNode::bootstrap(
                    config,
                    voters.clone(),
                    REJOIN_GENERATION,
                    u64::from(id.slot) + 11,
                    Instant::ZERO,
                ))
            })
            .collect();
        ClusterNet {
            now: Instant::ZERO,
            nodes,
            links: BTreeMap::new(),
            clients: Vec::new(),
            nonce: 0,
            durable: vec![None; 3],
            hold_reserve_writes: false,
            hold_reserve_writes_of: None,
            cut: None,
            stale: BTreeSet::new(),
            stuck: BTreeSet::new(),
            outputs: Vec::new(),
            dials_connected: 0,
            dials_at_cut: 0,
        }
    }

    /// Every node with a token reserve of `step` and nothing stored.
    pub fn with_reserves(step: u64) -> Self {
        let mut net = ClusterNet::new();
        for node in &mut net.nodes {
            *node = node
                .take()
                .map(|node| node.with_token_reserve(TokenReserve::new(step, None)));
        }
        net
    }

    /// Fresh nonce bytes: all the next byte value (wrapping).
    pub fn nonce(&mut self) -> [u8; 16] {
        self.nonce = self.nonce.wrapping_add(1);
        [self.nonce; 16]
    }

    /// Node `i`, which must be alive.
    pub fn node(&mut self, i: usize) -> &mut ClusterNode {
        self.nodes[i].as_mut().expect("node alive")
    }

    /// Node `i`'s outputs not looked at yet, with everything it emits now.
    pub fn outputs(&mut self, i: usize) -> &mut OutputQueues {
        let now = self.now;
        self.outputs
            .resize_with(self.nodes.len(), OutputQueues::default);
        let node = self.nodes[i].as_mut().expect("node alive");
        self.outputs[i].drain(node, now);
        &mut self.outputs[i]
    }

    /// Moves every byte until nothing moves.
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            self.outputs
                .resize_with(self.nodes.len(), OutputQueues::default);
            for i in 0..self.nodes.len() {
                let now = self.now;
                match self.nodes[i].as_mut() {
                    Some(node) => self.outputs[i].drain(node, now),
                    None => self.outputs[i] = OutputQueues::default(),
                }
                // Dials.
                while let Some(slot) = self.outputs[i].dials.pop_front() {
                    moved = true;
                    let target = usize::from(slot);
                    let across_cut = self.cut.is_some_and(|c| c == i || c == target);
                    if !across_cut && self.nodes.get(target).is_some_and(Option::is_some) {
                        self.dials_connected += 1;
                        let (n1, n2) = (self.nonce(), self.nonce());
                        let a = self
                            .node(i)
                            .handle_dialed(now, slot, n1)
                            .expect("a dialed connection is taken");
                        let b = self
                            .node(target)
                            .handle_peer_accept(now, n2, LOOPBACK)
                            .unwrap();
                        self.links.insert((i, a), Endpoint::Peer(target, b));
                        self.links.insert((target, b), Endpoint::Peer(i, a));
                    } else {
                        self.node(i).handle_dial_failed(now, slot);
                    }
                }
                // Token reserve writes, durable at once unless held back
                // (a write asked for then waits in the queue).
                let held = self.hold_reserve_writes
                    && self.hold_reserve_writes_of.is_none_or(|only| only == i);
                if !held && let Some(value) = self.outputs[i].reserves.pop_front() {
                    moved = true;
                    self.durable[i] = Some(value);
                    self.node(i).handle_reserve_persisted(now, value);
                }
                // Transmits.
                let mut deliveries = VecDeque::new();
                if let Some(node) = self.nodes[i].as_mut() {
                    while let Some(conn) = self.outputs[i].wakes.pop_front() {
                        if let Some(Endpoint::Client(c)) = self.links.get(&(i, conn))
                            && self.clients[*c].stalled
                        {
                            continue;
                        }
                        let mut out = Vec::new();
                        let state = node.poll_transmit(conn, &mut out);
                        node.handle_flushed(self.now, conn);
                        deliveries.push_back((conn, out, state));
                    }
                }
                for (conn, bytes, state) in deliveries {
                    moved = true;
                    let endpoint = self.links.get(&(i, conn)).copied();
                    if self.stale.contains(&(i, conn)) {
                        // Bytes are lost; a close reaches only this end.
                        if state != ConnState::Open && !self.stuck.contains(&(i, conn)) {
                            self.stale.remove(&(i, conn));
                            self.links.remove(&(i, conn));
                            let now = self.now;
                            self.node(i).handle_closed(now, conn);
                        }
                        continue;
                    }
                    match endpoint {
                        Some(Endpoint::Peer(j, other)) => {
                            if !bytes.is_empty()
                                && let Some(node) = self.nodes[j].as_mut()
                            {
                                node.handle_input(self.now, other, &bytes);
                            }
                            if state != ConnState::Open {
                                self.close_link(i, conn);
                            }
                        }
                        Some(Endpoint::Client(c)) => {
                            self.client_receive(c, &bytes);
                            if state != ConnState::Open {
                                self.clients[c].closed = true;
                                self.links.remove(&(i, conn));
                                let now = self.now;
                                self.node(i).handle_closed(now, conn);
                            }
                        }
                        // A socket nobody reads (an idle attacker's): the
                        // driver closes it when the node says so.
                        None => {
                            if state != ConnState::Open {
                                let now = self.now;
                                self.node(i).handle_closed(now, conn);
                            }
                        }
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("network did not settle");
    }

    /// Closes the link of node `i`'s `conn` at both ends.
    pub fn close_link(&mut self, i: usize, conn: ConnId) {
        if let Some(Endpoint::Peer(j, other)) = self.links.remove(&(i, conn)) {
            self.links.remove(&(j, other));
            if let Some(node) = self.nodes[j].as_mut() {
                node.handle_closed(self.now, other);
            }
        }
        if let Some(node) = self.nodes[i].as_mut() {
            node.handle_closed(self.now, conn);
        }
    }

    fn client_receive(&mut self, c: usize, mut bytes: &[u8]) {
        if self.clients[c].line {
            self.line_client_receive(c, bytes);
            return;
        }
        if !self.clients[c].established {
            loop {
                let client = &mut self.clients[c];
                let (used, status) = client.handshake.handle_input(bytes);
                bytes = &bytes[used..];
                match status {
                    ClientHandshakeStatus::NeedMore => return,
                    ClientHandshakeStatus::SendProof => {
                        let proof = client.handshake.proof().unwrap();
                        let (node, conn) = (client.node, client.conn);
                        let now = self.now;
                        self.node(node).handle_input(now, conn, &proof);
                        if bytes.is_empty() {
                            return;
                        }
                    }
                    ClientHandshakeStatus::Accepted => {
                        self.clients[c].established = true;
                        break;
                    }
                    other => panic!("client handshake failed: {other:?}"),
                }
            }
        }
        let client = &mut self.clients[c];
        client.buf.extend_from_slice(bytes);
        while let Ok(Some((reply, used))) = Reply::decode(&client.buf) {
            client.replies.push(reply);
            client.buf.drain(..used);
        }
    }

    /// Runs for `duration` of injected time, jumping between deadlines.
    pub fn run_for(&mut self, duration: Duration) {
        let end = self.now.saturating_add(duration);
        loop {
            self.settle();
            let next = self
                .nodes
                .iter()
                .flatten()
                .filter_map(Machine::poll_timeout)
                .min()
                .unwrap_or(end)
                .max(self.now.saturating_add(Duration::from_micros(1)));
            if next > end {
                self.now = end;
                break;
            }
            self.now = next;
            for node in self.nodes.iter_mut().flatten() {
                node.handle_timeout(next);
            }
        }
        for node in self.nodes.iter_mut().flatten() {
            node.handle_timeout(end);
        }
        self.settle();
    }

    /// Cuts node `i` off: its existing peer links go stale for good (in
    /// both directions, also after the heal) and dials across fail.
    pub fn partition(&mut self, i: usize) {
        self.cut = Some(i);
        for (&(n, conn), endpoint) in &self.links {
            if let Endpoint::Peer(j, other) = *endpoint
                && (n == i || j == i)
            {
                self.stale.insert((n, conn));
                self.stale.insert((j, other));
            }
        }
    }

    /// Ends the cut: new connections work, stale ones stay stale.
    pub fn heal(&mut self) {
        self.cut = None;
    }

    /// Whether every node follows the same leader (the leader itself too).
    pub fn all_follow_the_leader(&self) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let id = self.nodes[leader].as_ref().map(ClusterNode::id);
        self.nodes.iter().flatten().all(|node| node.leader() == id)
    }

    /// The node that believes it leads, if any (the first).
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.as_ref().is_some_and(ClusterNode::is_leader))
    }

    /// Kills node `i`: its outputs are dropped, its peer links close at
    /// the other end and its clients see their connection go.
    pub fn kill(&mut self, i: usize) {
        let links: Vec<(usize, ConnId)> = self
            .links
            .keys()
            .filter(|(n, _)| *n == i)
            .copied()
            .collect();
        self.nodes[i] = None;
        if let Some(outputs) = self.outputs.get_mut(i) {
            *outputs = OutputQueues::default();
        }
        for (n, conn) in links {
            match self.links.remove(&(n, conn)) {
                Some(Endpoint::Peer(j, other)) => {
                    self.links.remove(&(j, other));
                    if let Some(node) = self.nodes[j].as_mut() {
                        node.handle_closed(self.now, other);
                    }
                }
                Some(Endpoint::Client(c)) => self.clients[c].closed = true,
                None => {}
            }
        }
    }

    fn line_client_receive(&mut self, c: usize, bytes: &[u8]) {
        let client = &mut self.clients[c];
        client.buf.extend_from_slice(bytes);
        if !client.established {
            if client.buf.len() < 28 {
                return;
            }
            // The challenge: what follows the first space, up to the LF.
            let hello: Vec<u8> = client.buf.drain(..28).collect();
            let mut answer = line_answer(b"", &hello[13..27]).to_vec();
            answer.push(b'\n');
            client.established = true;
            let (node, conn) = (client.node, client.conn);
            let now = self.now;
            self.node(node).handle_input(now, conn, &answer);
        }
        let client = &mut self.clients[c];
        while let Ok(Some((reply, used))) = LineReply::decode(&client.buf) {
            let entry = match reply {
                LineReply::Acquired { token, key, .. } => (b'A', token, key.to_vec()),
                LineReply::TimedOut { owner, key } | LineReply::Busy { owner, key } => {
                    (reply.op(), owner, key.to_vec())
                }
                LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                    (reply.op(), token, key.to_vec())
                }
                LineReply::Moved { address } | LineReply::Leader { address } => {
                    (reply.op(), 0, address.to_vec())
                }
                LineReply::Error { reason } => (b'E', 0, reason.to_vec()),
            };
            client.lines.push(entry);
            client.buf.drain(..used);
        }
    }

    /// A line-dialect client connected to `node` (handshake done).
    pub fn connect_line(&mut self, node: usize) -> usize {
        let c = self.open_client(node, true);
        self.settle();
        assert!(self.clients[c].established && !self.clients[c].closed);
        c
    }

    fn open_client(&mut self, node: usize, line: bool) -> usize {
        let nonce = self.nonce();
        let now = self.now;
        let conn = self
            .node(node)
            .handle_connect(now, nonce, LOOPBACK)
            .unwrap();
        let c = self.clients.len();
        self.clients.push(ClusterClient {
            node,
            conn,
            handshake: ClientHandshake::new(
                b"",
                CLUSTER_FINGERPRINT,
                WireMode::Cluster,
                node as u8,
            ),
            established: false,
            buf: Vec::new(),
            replies: Vec::new(),
            closed: false,
            stalled: false,
            line,
            lines: Vec::new(),
        });
        self.links.insert((node, conn), Endpoint::Client(c));
        c
    }

    /// Sends raw bytes on client `c` without moving any other byte.
    pub fn send_bytes(&mut self, c: usize, bytes: &[u8]) {
        let (node, conn) = (self.clients[c].node, self.clients[c].conn);
        let now = self.now;
        self.node(node).handle_input(now, conn, bytes);
    }

    /// A v3 client connected to `node` (handshake done).
    pub fn connect(&mut self, node: usize) -> usize {
        let c = self.open_client(node, false);
        self.settle();
        assert!(self.clients[c].established);
        c
    }

    /// Sends `request` without moving any other byte.
    pub fn send_only(&mut self, c: usize, request: Request) {
        self.send_bytes(c, &request.to_frame());
    }

    /// Sends `request` on client `c`, runs 200 ms and returns the one
    /// answer it got (replies without a rid, such as leader notices, aside).
    pub fn request(&mut self, c: usize, request: Request) -> Reply {
        let before = self.clients[c].replies.len();
        self.send_only(c, request);
        self.run_for(Duration::from_millis(200));
        let replies = &self.clients[c].replies[before..];
        let answers: Vec<Reply> = replies
            .iter()
            .copied()
            .filter(|r| r.rid().is_some())
            .collect();
        assert_eq!(answers.len(), 1, "replies: {replies:?}");
        answers[0]
    }

    /// Every answer client `c` got so far (replies with a rid).
    pub fn answers(&self, c: usize) -> Vec<Reply> {
        self.clients[c]
            .replies
            .iter()
            .copied()
            .filter(|r| r.rid().is_some())
            .collect()
    }

    /// Runs 2 s and returns the leader, which there must be.
    pub fn elect(&mut self) -> usize {
        self.run_for(Duration::from_secs(2));
        self.leader().expect("a leader is elected")
    }

    /// Opens a connection to node `to` and completes the real peer
    /// handshake on it as node `from` would (same identity, same token):
    /// the connection and the frame sealer of that authenticated session.
    pub fn authenticated_peer(&mut self, from: usize, to: usize) -> (ConnId, PeerSealer) {
        let identity = PeerIdentity {
            fingerprint: CLUSTER_FINGERPRINT,
            id: self.node(from).id(),
            slot_count: 3,
            token_floor: 0,
        };
        let tokens = PeerTokens::new([PEER_TOKEN]).expect("a valid peer token");
        let (now, nonce) = (self.now, self.nonce());
        let mut dialer = PeerHandshake::new(
            identity,
            nonce,
            Some(to as u8),
            Instant::from_micros(u64::MAX),
        );
        let nonce = self.nonce();
        let conn = self
            .node(to)
            .handle_peer_accept(now, nonce, LOOPBACK)
            .expect("accepted");
        for _ in 0..8 {
            let bytes = dialer.take_outbound();
            if !bytes.is_empty() {
                self.node(to).handle_input(now, conn, &bytes);
            }
            let mut answer = Vec::new();
            self.node(to).poll_transmit(conn, &mut answer);
            let (_, status) = dialer.handle_input(&tokens, &answer);
            if let PeerHandshakeStatus::Established(_) = status {
                let bytes = dialer.take_outbound();
                if !bytes.is_empty() {
                    self.node(to).handle_input(now, conn, &bytes);
                }
                let session = dialer.take_session().expect("a session once established");
                return (conn, session.sealer);
            }
        }
        panic!("the peer handshake did not complete");
    }

    /// Every force-release answer node `i` gave and the test has not
    /// looked at yet.
    pub fn admin_replies(&mut self, i: usize) -> Vec<(AdminRequestId, ForceReleaseOutcome)> {
        self.outputs(i).admin_replies.drain(..).collect()
    }

    /// An operator's force-release on node `i` under admin id `id`.
    pub fn force_release(&mut self, i: usize, id: u64, req: ForceRelease) {
        let now = self.now;
        self.node(i)
            .handle_force_release(now, AdminRequestId(id), req);
    }

    /// The token that holds `k` in node `i`'s replicated state, if any.
    pub fn holder_token(&mut self, i: usize, k: &str) -> Option<u64> {
        self.node(i)
            .lock_state()
            .holder(&Key::new(k.as_bytes()).expect("valid key"))
            .map(|(t, _)| t)
    }
}
