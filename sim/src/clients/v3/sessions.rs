//! A v3 client's sessions ([`Sessions`]) and how they are driven: input,
//! timers, transport closes, clock kicks, the pump that hands their events
//! to the operations and their bytes to the world, pushes, and reconnect
//! backoff after a session ends.

use ticketing_core::client::{
    Backoff, ClientError, CloseReason, LossCause, Router, Session, SessionEvent,
};
use ticketing_core::time::Instant;

use super::{V3Ops, V3Outcomes};
use crate::clients::{ClientEv, ClientWorld, OpState};
use crate::clock::{duration_us, instant};
use crate::run::Checker;

/// A client's sessions, one per slot: one slot for the single server, one
/// per node in a cluster, where the core [`Router`] picks among them.
pub(crate) struct Sessions {
    /// Per slot: the session and its connection.
    pub(crate) sessions: Vec<Option<(Session, u64)>>,
    pub(crate) backoffs: Vec<Backoff>,
    pub(crate) router: Option<Router>,
    pub(crate) timer_generation: Vec<u64>,
    /// Per slot: the deadline the pending timer event stands for.
    pub(crate) armed: Vec<Option<Instant>>,
}

impl Sessions {
    /// One session to a single server.
    pub(crate) fn single() -> Self {
        Sessions::new(1, None)
    }

    /// One session per node of an `n`-node cluster, routed.
    pub(crate) fn routed(n: usize) -> Self {
        Sessions::new(n, Some(Router::new(n)))
    }

    fn new(n: usize, router: Option<Router>) -> Self {
        Sessions {
            sessions: (0..n).map(|_| None).collect(),
            backoffs: vec![Backoff::new(); n],
            router,
            timer_generation: vec![0; n],
            armed: vec![None; n],
        }
    }

    /// Slots, as the worlds number them.
    pub(crate) fn slots(&self) -> u8 {
        self.sessions.len() as u8
    }

    /// The router's count of leaders that became reachable (0 for a single
    /// server, which has no router).
    pub(super) fn leader_epoch(&self) -> u64 {
        self.router.as_ref().map_or(0, Router::leader_epoch)
    }

    /// The ready session an attempt goes out on now, with its connection
    /// and slot; or the error an attempt gets when there is none.
    pub(super) fn attempt_session(&mut self) -> Result<(&mut Session, u64, u8), ClientError> {
        let Some(router) = self.router.as_mut() else {
            return match self.sessions[0]
                .as_mut()
                .filter(|(session, _)| session.is_ready())
            {
                Some((session, conn)) => Ok((session, *conn, 0)),
                None => Err(ClientError::NotConnected),
            };
        };
        // Leader first, then runs over ready sessions (the runtimes' rule).
        let sessions = &self.sessions;
        let picked = router.pick_coalescing(|index| {
            sessions[index]
                .as_ref()
                .map_or(0, |(session, _)| session.unsent_len())
        });
        let error = router.no_connection_error();
        picked
            .and_then(|index| {
                self.sessions[index]
                    .as_mut()
                    .filter(|(session, _)| session.is_ready())
                    .map(|(session, conn)| (session, *conn, index as u8))
            })
            .ok_or(error)
    }

    /// Drops every session (a crash).
    pub(crate) fn clear(&mut self) {
        self.sessions.iter_mut().for_each(|session| *session = None);
        self.armed.iter_mut().for_each(|armed| *armed = None);
    }
}

/// Driving a v3 client's sessions (a blanket extension of
/// [`ClientWorld`]).
pub(crate) trait V3Sessions<'t>: ClientWorld<'t> {
    /// Bytes from connection `conn` reach `client`'s session on `slot`
    /// (if that is still its connection).
    fn session_input(&mut self, client: usize, slot: u8, conn: u64, bytes: &[u8]) {
        let local = self.local_now(client);
        if let Some((session, current)) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            && *current == conn
        {
            session.handle_input(instant(local), bytes);
        }
        self.client_pump(client, slot);
    }

    /// `client` learns that connection `conn` of its session on `slot` is
    /// gone.
    fn session_transport_closed(&mut self, client: usize, slot: u8, conn: u64) {
        let local = self.local_now(client);
        if let Some((session, open)) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            && *open == conn
        {
            session.handle_transport_closed(instant(local));
        }
        self.client_pump(client, slot);
    }

    /// `slot`'s session timer fires, if it is still the one armed.
    fn client_timer(&mut self, client: usize, slot: u8, generation: u64) {
        let s = usize::from(slot);
        let link = &mut self.parts().clients[client].link;
        if link.timer_generation[s] == generation {
            link.armed[s] = None;
            let local = self.local_now(client);
            if let Some((session, _)) = self.parts().clients[client].link.sessions[s].as_mut() {
                session.handle_timeout(instant(local));
            }
            self.client_pump(client, slot);
        }
    }

    /// A client clock jump (or other kick): every session looks at its
    /// deadlines now.
    fn client_timeouts(&mut self, client: usize) {
        let local = self.local_now(client);
        for slot in 0..self.parts().clients[client].link.slots() {
            if let Some((session, _)) =
                self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()
            {
                session.handle_timeout(instant(local));
            }
            self.client_pump(client, slot);
        }
    }

    /// After any input to `client`'s session on `slot`: handle its
    /// events, hand out its bytes, re-arm its timer.
    fn client_pump(&mut self, client: usize, slot: u8) {
        let s = usize::from(slot);
        loop {
            let local = self.local_now(client);
            let Some((session, conn)) = self.parts().clients[client].link.sessions[s].as_mut()
            else {
                return;
            };
            let conn = *conn;
            let mut events = Vec::new();
            while let Some(event) = session.poll_event() {
                events.push(event);
            }
            let mut out = Vec::new();
            if !session.is_closed() && session.poll_transmit(instant(local), &mut out) > 0 {
                // The simulated pipe takes every byte at once.
                session.handle_written(instant(local), true);
            }
            if events.is_empty() && out.is_empty() {
                break;
            }
            self.send_from_client(conn, out);
            for event in events {
                let epoch = self.parts().clients[client].link.leader_epoch();
                if let Some(router) = self.parts().clients[client].link.router.as_mut() {
                    router.handle_event(s, &event);
                }
                self.session_event(client, slot, conn, event);
                if self.parts().clients[client].link.leader_epoch() != epoch {
                    self.wake_retries(client);
                }
            }
        }
        let local = self.local_now(client);
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let link = &mut proc.link;
        let deadline = link.sessions[s]
            .as_ref()
            .and_then(|(session, _)| session.poll_timeout());
        if deadline == link.armed[s] {
            return;
        }
        link.armed[s] = deadline;
        if let Some(deadline) = deadline {
            link.timer_generation[s] += 1;
            let generation = link.timer_generation[s];
            let inc = proc.inc;
            let at = proc
                .clock
                .true_at(deadline.as_micros().max(local))
                .max(parts.now_us);
            self.schedule_client(at, client, inc, ClientEv::Timer { slot, generation });
        }
    }

    fn session_event(&mut self, client: usize, slot: u8, conn: u64, event: SessionEvent) {
        let name = Self::CONN;
        match event {
            SessionEvent::Ready => self.on_ready(client, slot, conn),
            SessionEvent::Outcome { rid, outcome } => {
                self.note(|| format!("client {client} {name} {conn} rid {rid}: {outcome:?}"));
                self.attempt_outcome(client, conn, rid, outcome);
            }
            SessionEvent::Compensate(compensation) => self.compensate(client, compensation),
            SessionEvent::Closed(reason) => self.session_closed(client, slot, conn, reason),
            SessionEvent::LeaderHint(_) | SessionEvent::NotLeader => self.on_leader_notice(client),
            SessionEvent::Push { token, kind, .. } => self.on_push(client, token, kind),
        }
    }

    /// A push about grant `token`: a loss stops its holder now (a push may
    /// only ever make a holder stop earlier); an "ending soon" changes
    /// nothing (the holder's own deadline already bounds it).
    fn on_push(&mut self, client: usize, token: u64, kind: ticketing_core::wire::PushKind) {
        self.note(|| format!("client {client} push {kind:?} for token {token}"));
        if LossCause::of_push(kind).is_none() {
            return;
        }
        let local = self.local_now(client);
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        let holder = proc.ops.iter_mut().find_map(|(&id, op)| match op {
            OpState::Holding {
                grant,
                act_before_local_us,
                ..
            } if grant.token == token => {
                *act_before_local_us = (*act_before_local_us).min(local);
                Some(id)
            }
            _ => None,
        });
        if let Some(id) = holder {
            self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
        }
    }

    /// `client`'s session on `slot` ended: it reconnects after its
    /// backoff, and drops the transport.
    fn session_closed(&mut self, client: usize, slot: u8, conn: u64, reason: CloseReason) {
        let name = Self::CONN;
        self.note(|| format!("client {client} {name} {conn} closed: {reason:?}"));
        let s = usize::from(slot);
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let link = &mut proc.link;
        let lived = link.sessions[s]
            .as_ref()
            .filter(|(_, current)| *current == conn)
            .and_then(|(session, _)| session.lived());
        if link.sessions[s].as_ref().is_some_and(|(_, c)| *c == conn) {
            link.sessions[s] = None;
            link.armed[s] = None;
        }
        let delay = link.backoffs[s].after_session(lived, Some(&reason));
        let inc = proc.inc;
        let at = parts.now_us + duration_us(delay);
        self.schedule_client(at, client, inc, ClientEv::Connect(slot));
        self.close_transport(conn);
        if !self.close_expected(&reason) {
            self.violation(
                Checker::Client,
                format!("client {client} {name} {conn} closed by the protocol: {reason:?}"),
            );
        }
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> V3Sessions<'t> for W {}
