//! The embedded server's shared state (the hub): one [`Server`] behind a
//! `std::sync::Mutex`, never held across an `.await`, and its peers. Both
//! sides of the crate reach the server through it: [`crate::embedded`]
//! drives its sockets, timer and state file; [`crate::client`] moves the
//! bytes of an in-process broker's in-memory links ([`Hub::exchange`]).
//! It knows neither of them.
//!
//! The bytes the server hands out for a memory peer wait in its inbox until
//! the broker feeds them to its session; only then does the server hear
//! [`Machine::handle_flushed`], so a broker that dies first leaves no ghost
//! grant, exactly as over TCP.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use event_listener::Event;
use futures_rustls::TlsAcceptor;

use ticketing_core::auth::NONCE_LEN;
use ticketing_core::client::Session;
use ticketing_core::hash::IdMap;
use ticketing_core::inspect::{AdminRequestId, ForceReleaseOutcome};
use ticketing_core::machine::{Machine, Output};
use ticketing_core::reserve::TokenAlert;
use ticketing_core::server::{ConnId, ConnState, Server};
use ticketing_core::time::Instant;
use ticketing_core::wire::{Reply, Request};

use crate::sync::{Clock, Notify};

/// The server state shared by every driver task and in-process broker.
pub(crate) struct Hub {
    pub(crate) inner: Mutex<HubInner>,
    pub(crate) clock: Clock,
    /// Wakes the timer task when its deadline may have moved earlier.
    pub(crate) timer: Notify,
    /// Asks the accept loop to stop.
    pub(crate) stop: Notify,
    /// A peer was removed (shutdown waits for none to be left).
    pub(crate) peers_changed: Event,
    /// TLS for the listener's connections.
    pub(crate) tls: Option<TlsAcceptor>,
    in_process_token: String,
    /// Names of in-process brokers ([`MemoryPeer::owner`]).
    pub(crate) next_owner: AtomicU64,
    /// Ids of force-releases ([`crate::EmbeddedServer::force_release`]).
    pub(crate) next_admin_id: AtomicU64,
    /// Set when shutdown begins.
    pub(crate) stopping: AtomicBool,
}

/// What the hub's mutex guards.
pub(crate) struct HubInner {
    pub(crate) server: Server,
    pub(crate) peers: IdMap<ConnId, Peer>,
    /// The deadline the timer task sleeps until, `u64::MAX` for none.
    pub(crate) timer_target_micros: u64,
    /// The buffers of [`Hub::exchange`], kept for their capacity.
    scratch: Scratch,
    clock: Clock,
    /// Wakes the persister (with a state file only).
    pub(crate) persist: Option<Arc<Notify>>,
    /// The core's outputs for the other tasks and the application.
    pub(crate) kept: Kept,
}

/// Token alerts kept for [`crate::EmbeddedServer::poll_token_alert`] at
/// most; an application that never asks loses the oldest.
const ALERTS_KEPT_MAX: usize = 64;

/// The core's outputs that wait for another task or the application:
/// everything [`Machine::poll_output`] gives besides wakes.
#[derive(Default)]
pub(crate) struct Kept {
    /// A reserve write the core asked for, not yet picked up.
    pub(crate) reserve_request: Option<u64>,
    /// Token alerts the application has not asked for yet.
    pub(crate) alerts: VecDeque<TokenAlert>,
    /// Answers to force-releases, taken by their callers under the lock.
    pub(crate) admin_answers: Vec<(AdminRequestId, ForceReleaseOutcome)>,
}

/// A connection of the server, as the hub drives it.
pub(crate) enum Peer {
    /// A socket task, woken to take its bytes itself.
    Socket(Arc<Notify>),
    /// An in-process link.
    Memory(MemoryPeer),
}

/// An in-process link's server side.
pub(crate) struct MemoryPeer {
    /// The broker owning the link: while it is exchanging it reads the inbox
    /// itself, so it is not woken for it.
    owner: u64,
    /// Bytes (the handshake's) and reply values taken from the server, not
    /// yet fed to the session. Bounded by the protocol: the server only
    /// writes replies to requests (the session bounds those in flight)
    /// plus the handshake.
    inbox: Vec<u8>,
    replies: Vec<Reply>,
    /// `Open`, or how the server wants the link ended once the inbox is read.
    state: ConnState,
    /// Wakes the broker's driver for this link.
    wake: Arc<Notify>,
}

impl HubInner {
    /// Drains the core's wakes after an input: socket peers are notified
    /// (`me` only reported), memory peers get their bytes in their inbox and
    /// are notified unless their broker (`owner`) is reading them right now.
    /// Then tells the timer if the next deadline moved earlier. True if
    /// `me`, or a link of `owner`, was woken: the caller has more to do.
    pub(crate) fn dispatch(
        &mut self,
        timer: &Notify,
        me: Option<ConnId>,
        owner: Option<u64>,
    ) -> bool {
        let now = self.clock.now();
        let mine = drain_outputs(
            &mut self.server,
            &mut self.peers,
            &mut self.kept,
            now,
            (me, owner),
            |_| {},
        );
        self.after_input(timer);
        mine
    }

    /// The rest of [`Self::dispatch`], once the outputs are drained: the
    /// persister if a reserve write waits, the timer's deadline.
    fn after_input(&mut self, timer: &Notify) {
        if let Some(persist) = &self.persist
            && self.kept.reserve_request.is_some()
        {
            persist.notify_one();
        }
        let deadline = self
            .server
            .poll_timeout()
            .map_or(u64::MAX, Instant::as_micros);
        if deadline < self.timer_target_micros {
            self.timer_target_micros = deadline;
            timer.notify_one();
        }
    }

    /// Forgets `conn` and tells the core it closed.
    pub(crate) fn remove_peer(&mut self, now: Instant, conn: ConnId, peers_changed: &Event) {
        remove_peer(&mut self.server, &mut self.peers, now, conn, peers_changed);
    }
}

/// Drains the core's outputs on the hub's fields (so that [`Hub::exchange`]
/// can hold its scratch buffers beside them): socket peers are notified
/// (`me` only reported), memory peers get their bytes in their inbox and
/// are notified unless their broker (`owner`) is reading them right now
/// (`owned` hears each woken link of `owner`); the rest is kept. True if
/// `me`, or a link of `owner`, was woken.
fn drain_outputs(
    server: &mut Server,
    peers: &mut IdMap<ConnId, Peer>,
    kept: &mut Kept,
    now: Instant,
    (me, owner): (Option<ConnId>, Option<u64>),
    mut owned: impl FnMut(ConnId),
) -> bool {
    let mut mine = false;
    while let Some(output) = server.poll_output(now) {
        match output {
            Output::Wake(conn) => match peers.get_mut(&conn) {
                Some(Peer::Socket(waker)) => {
                    if Some(conn) == me {
                        mine = true;
                    } else {
                        waker.notify_one();
                    }
                }
                Some(Peer::Memory(peer)) => {
                    let state =
                        server.poll_transmit_replies(conn, &mut peer.inbox, &mut peer.replies);
                    if state != ConnState::Open {
                        peer.state = state;
                    }
                    if Some(peer.owner) != owner {
                        peer.wake.notify_one();
                    } else {
                        mine = true;
                        owned(conn);
                    }
                }
                // A peer being closed right now; its closer tells the core.
                None => {}
            },
            Output::Reserve { value } => kept.reserve_request = Some(value),
            Output::Alert(alert) => {
                if kept.alerts.len() >= ALERTS_KEPT_MAX {
                    kept.alerts.pop_front();
                }
                kept.alerts.push_back(alert);
            }
            Output::AdminReply { id, outcome } => kept.admin_answers.push((id, outcome)),
            // The embedded server has no logger: the core's reports (failed
            // proofs, close reasons) are dropped; its counts stay in
            // `EmbeddedServer::stats`.
            Output::Log(_) => {}
            // A single-mode server neither dials nor has node events.
            Output::Dial { .. } | Output::Node(_) => {}
        }
    }
    mine
}

/// One step of [`Hub::exchange`] on `link`: the bytes and replies
/// waiting in its inbox go to the session (then
/// [`Machine::handle_flushed`]), a close either side wants is carried
/// out, and the session's unsent requests go to the server: as bytes
/// during the handshake, as values once the session is ready (no codec
/// between two state machines in one process; the server checks and
/// serves values exactly as decoded frames, see
/// [`Machine::handle_requests`]). `bufs` are the hub's scratch buffers,
/// swapped with the inbox (each keeps its capacity).
fn serve_link(
    server: &mut Server,
    peers: &mut IdMap<ConnId, Peer>,
    now: Instant,
    link: &mut MemoryLink<'_>,
    bufs: &mut Scratch,
    peers_changed: &Event,
) {
    let conn = link.conn;
    let state = match peers.get_mut(&conn) {
        Some(Peer::Memory(peer)) => {
            if !peer.inbox.is_empty() {
                std::mem::swap(&mut peer.inbox, &mut bufs.inbox);
            }
            if !peer.replies.is_empty() {
                std::mem::swap(&mut peer.replies, &mut bufs.replies);
            }
            peer.state
        }
        _ => ConnState::Gone,
    };
    if !bufs.inbox.is_empty() || !bufs.replies.is_empty() {
        link.touched = true;
        if !bufs.inbox.is_empty() {
            link.session.handle_input(now, &bufs.inbox);
            bufs.inbox.clear();
        }
        if !bufs.replies.is_empty() {
            link.session.handle_replies(now, &bufs.replies);
            bufs.replies.clear();
        }
        server.handle_flushed(now, conn);
    }
    if state != ConnState::Open {
        link.touched = true;
        link.session.handle_transport_closed(now);
    }
    if link.session.is_closed() {
        remove_peer(server, peers, now, conn, peers_changed);
        link.closed = true;
        link.touched = true;
        return;
    }
    // A ready session with nothing unsent has nothing to hand out (its
    // proof left before the server could answer it).
    let may_send = !link.session.is_ready() || link.session.unsent_len() > 0;
    if may_send && server.wants_input(conn) {
        link.touched = true;
        if link.session.is_ready() {
            if link.session.poll_transmit_requests(now, &mut bufs.requests) > 0 {
                server.handle_requests(now, conn, &mut bufs.requests);
            }
            bufs.requests.clear();
        } else {
            bufs.out.clear();
            if link.session.poll_transmit(now, &mut bufs.out) > 0 {
                server.handle_input(now, conn, &bufs.out);
                // The server took every byte, in this very call.
                link.session.handle_written(now, true);
            }
        }
    }
}

/// [`HubInner::remove_peer`] on the hub's fields.
fn remove_peer(
    server: &mut Server,
    peers: &mut IdMap<ConnId, Peer>,
    now: Instant,
    conn: ConnId,
    peers_changed: &Event,
) {
    peers.remove(&conn);
    server.handle_closed(now, conn);
    peers_changed.notify(usize::MAX);
}

/// The buffers [`Hub::exchange`] uses beside the server and the peers.
#[derive(Default)]
struct Scratch {
    /// Request bytes on their way in.
    out: Vec<u8>,
    /// Request values on their way in.
    requests: Vec<Request>,
    /// Swapped with a peer's inbox to read it.
    inbox: Vec<u8>,
    /// Swapped with a peer's reply values to read them.
    replies: Vec<Reply>,
}

/// One in-memory link as [`Hub::exchange`] sees it.
pub(crate) struct MemoryLink<'a> {
    /// The server's name for it.
    pub(crate) conn: ConnId,
    /// The broker's session on it.
    pub(crate) session: &'a mut Session,
    /// Set when the link ended (the session is closed and the server told).
    pub(crate) closed: bool,
    /// Set when the session was fed bytes, polled for bytes or closed: it
    /// may have events, and its deadline may have moved.
    pub(crate) touched: bool,
}

impl Hub {
    /// A hub around `server`, on `clock`; `persist` wakes the state-file
    /// writer (with a state file only); in-process brokers authenticate
    /// with `in_process_token`.
    pub(crate) fn new(
        server: Server,
        clock: Clock,
        persist: Option<Arc<Notify>>,
        tls: Option<TlsAcceptor>,
        in_process_token: String,
    ) -> Self {
        Hub {
            inner: Mutex::new(HubInner {
                server,
                peers: IdMap::default(),
                timer_target_micros: u64::MAX,
                scratch: Scratch::default(),
                clock,
                persist,
                kept: Kept::default(),
            }),
            clock,
            timer: Notify::new(),
            stop: Notify::new(),
            peers_changed: Event::new(),
            tls,
            in_process_token,
            next_owner: AtomicU64::new(1),
            next_admin_id: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, HubInner> {
        // A panic inside the core leaves its state unknown; serving on from
        // it could break mutual exclusion, so every user stops instead.
        self.inner
            .lock()
            .expect("server state poisoned by an earlier panic")
    }

    /// The server's clock, which in-process brokers share, so that the
    /// `now` of a submit also serves [`Hub::exchange`].
    pub(crate) fn clock(&self) -> Clock {
        self.clock
    }

    /// The token in-process brokers authenticate with.
    pub(crate) fn in_process_token(&self) -> &str {
        &self.in_process_token
    }

    /// Opens an in-memory link for broker `owner`; `None` if the server
    /// refuses it (connection limit, shutting down) or there is no nonce.
    pub(crate) fn connect_memory(&self, owner: u64, wake: Arc<Notify>) -> Option<ConnId> {
        let nonce = fresh_nonce()?;
        let mut inner = self.lock();
        let now = self.clock.now();
        // In-process links count as loopback for the handshake budget.
        let source = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let conn = inner.server.handle_connect(now, nonce, source)?;
        inner.peers.insert(
            conn,
            Peer::Memory(MemoryPeer {
                owner,
                inbox: Vec::new(),
                replies: Vec::new(),
                state: ConnState::Open,
                wake,
            }),
        );
        inner.dispatch(&self.timer, None, Some(owner));
        Some(conn)
    }

    /// Moves bytes both ways between broker `owner`'s sessions and their
    /// server connections until neither side has more: inbox → session
    /// (then [`Machine::handle_flushed`]), session → server while it wants
    /// input. A closed session or a link the server ended is closed on both
    /// sides and marked `closed`. `now` is read once by the broker, on the
    /// clock it shares with the server ([`Hub::clock`]). At most 64 links.
    ///
    /// The first pass looks at the links whose bit is set in `first`; the
    /// others are looked at only once the server hands them bytes or a
    /// close. A link left out of the first pass loses nothing: bytes or a
    /// close the server hands it while its broker is not exchanging wake
    /// its task (which exchanges every link), and its input is never held
    /// back for long, since the server stops wanting a memory peer's input
    /// only while replies wait untaken, and the hub takes them in the same
    /// drain that serves or wakes the link.
    pub(crate) fn exchange(
        &self,
        owner: u64,
        now: Instant,
        first: u64,
        links: &mut [Option<MemoryLink<'_>>],
    ) {
        debug_assert!(links.len() <= 64, "links are marked in a u64");
        let mut guard = self.lock();
        let HubInner {
            server,
            peers,
            scratch: bufs,
            kept,
            ..
        } = &mut *guard;
        // The links of `first` once (all of them: bytes may have come in,
        // or a close, while nobody was exchanging; after a submit, the one
        // submitted on); then only the links the server has just handed
        // bytes (or a close) to, until it hands out no more.
        let mut due = first;
        while due != 0 {
            for (index, slot) in links.iter_mut().enumerate() {
                if due & (1 << index) == 0 {
                    continue;
                }
                if let Some(link) = slot.as_mut().filter(|link| !link.closed) {
                    serve_link(server, peers, now, link, bufs, &self.peers_changed);
                }
            }
            due = 0;
            let links = &*links;
            drain_outputs(server, peers, kept, now, (None, Some(owner)), |conn| {
                if let Some(index) = links
                    .iter()
                    .position(|link| link.as_ref().is_some_and(|link| link.conn == conn))
                {
                    due |= 1 << index;
                }
            });
        }
        bufs.out.clear();
        guard.after_input(&self.timer);
    }
}

/// A fresh handshake nonce; `None` if the system has no randomness.
pub(crate) fn fresh_nonce() -> Option<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).ok()?;
    Some(nonce)
}
