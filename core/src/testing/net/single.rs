//! One single-mode server, its clock, outputs and connections.

use super::*;

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
