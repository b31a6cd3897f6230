//! Client-connection admission, the same in both modes: accepting a
//! connection (the session limit, shutdown, the unfinished-handshake
//! budget), its handshake up to a dialect (the session limit again, the
//! session counts), closing it, and whether its input is wanted.
//!
//! The single-mode [`crate::server::Server`] and the
//! [`crate::cluster::ClusterNode`] keep different connection maps (a node
//! keeps its peers beside its clients), so this table holds what they
//! share about clients and answers what each asks; each owner keeps the
//! connection itself and acts on the answer (logs, closes, notices).

use std::net::IpAddr;

use crate::auth::{ClientTokens, Hello};
use crate::budget::HandshakeBudget;
use crate::conn::client::{ClientFront, FrontInput};
use crate::conn::{ConnId, Dialect, Outbound};
use crate::time::{Duration, Instant};
use crate::wire::Capabilities;

/// What a client connection's owner does after [`ClientAdmission::accept`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accept {
    /// Refuse it: every session slot is taken, or the owner takes no new
    /// connections (shutting down, ids used up).
    Refused,
    /// Open it; close `evicted`, the unfinished handshake it displaced.
    Admitted {
        /// The handshake dropped to make room (never the new one).
        evicted: Option<ConnId>,
    },
}

/// Where a client connection stands after bytes of its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handshake {
    /// More bytes are needed (or the connection failed and waits to close).
    Pending,
    /// It was already in session: read its requests.
    Session,
    /// Its proof was accepted now and a session slot taken: what the
    /// dialect sends on success is queued; read its requests.
    Started(Dialect),
    /// Its proof was accepted but every session slot is taken: close it.
    SessionLimit,
    /// Its proof was refused. A line connection is answered late, at
    /// `answer_at`; a v3 one is closed now (its refusal is queued).
    Rejected {
        /// When the line dialect's late refusal is due.
        answer_at: Option<Instant>,
    },
}

/// The client-connection counts and budget a server or node keeps.
#[derive(Debug)]
pub(crate) struct ClientAdmission {
    /// Sessions (connections past their handshake) at most.
    sessions_max: usize,
    /// Unfinished handshakes and their sources.
    handshakes: HandshakeBudget,
    /// Connections past their handshake.
    sessions: usize,
    /// Of those, the ones that speak the line dialect.
    line_sessions: usize,
    /// How long a handshake may take.
    handshake_timeout: Duration,
}

impl ClientAdmission {
    /// At most `sessions_max` sessions; unfinished handshakes within
    /// `handshakes_max` (and `per_source_max` from one source), each
    /// allowed `handshake_timeout`.
    pub(crate) fn new(
        sessions_max: usize,
        handshakes_max: usize,
        per_source_max: usize,
        handshake_timeout: Duration,
    ) -> Self {
        ClientAdmission {
            sessions_max,
            handshakes: HandshakeBudget::new(handshakes_max, per_source_max),
            sessions: 0,
            line_sessions: 0,
            handshake_timeout,
        }
    }

    /// A connection `conn_id` from `source` arrived. `closed_to_new`: the
    /// owner takes none now (shutting down, or out of ids).
    pub(crate) fn accept(
        &mut self,
        closed_to_new: bool,
        conn_id: ConnId,
        source: IpAddr,
    ) -> Accept {
        if closed_to_new || self.sessions >= self.sessions_max {
            return Accept::Refused;
        }
        Accept::Admitted {
            evicted: self.handshakes.admit(conn_id, source),
        }
    }

    /// The front end of an admitted connection that greets with `hello`,
    /// serving the `served` capabilities, and the instant its handshake
    /// times out.
    pub(crate) fn front(
        &self,
        now: Instant,
        hello: Hello,
        fingerprint: [u8; 32],
        served: Capabilities,
    ) -> (ClientFront, Instant) {
        let deadline = now.saturating_add(self.handshake_timeout);
        let front = ClientFront::new(hello, fingerprint, deadline).serving(served);
        (front, deadline)
    }

    /// Feeds `bytes` to `conn_id`'s `front`; a proof accepted now takes a
    /// session slot if one is left.
    pub(crate) fn handshake_input(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        front: &mut ClientFront,
        tokens: &ClientTokens,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> Handshake {
        match front.handle_input(now, tokens, bytes, out) {
            FrontInput::Pending => Handshake::Pending,
            FrontInput::Session => Handshake::Session,
            FrontInput::Accepted(dialect) => {
                self.handshakes.finish(conn_id);
                if self.sessions >= self.sessions_max {
                    return Handshake::SessionLimit;
                }
                self.sessions += 1;
                if dialect == Dialect::Line {
                    self.line_sessions += 1;
                }
                front.begin_session(out);
                Handshake::Started(dialect)
            }
            FrontInput::Rejected(_) => Handshake::Rejected {
                answer_at: front.auth_failed_at(),
            },
        }
    }

    /// The owner decided to close `conn_id`: an unfinished handshake no
    /// longer counts against the budget.
    pub(crate) fn closing(&mut self, conn_id: ConnId) {
        self.handshakes.finish(conn_id);
    }

    /// The connection whose front end is `front` is gone: its session slot
    /// is free again.
    pub(crate) fn closed(&mut self, conn_id: ConnId, front: &ClientFront) {
        self.handshakes.finish(conn_id);
        if front.in_session() {
            self.sessions -= 1;
            if front.dialect() == Some(Dialect::Line) {
                self.line_sessions -= 1;
            }
        }
    }

    /// Whether a client connection's input should be read: not while more
    /// than `bytes_max` of its replies wait to be written, nor once its
    /// handshake failed (a line refusal waits for its late answer).
    pub(crate) fn wants_input(front: &ClientFront, out: &Outbound, bytes_max: usize) -> bool {
        out.wants_input(bytes_max) && front.wants_input()
    }

    /// Sessions and, of those, line-dialect ones.
    pub(crate) fn sessions(&self) -> (usize, usize) {
        (self.sessions, self.line_sessions)
    }

    /// Unfinished handshakes counted.
    pub(crate) fn handshakes(&self) -> usize {
        self.handshakes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::WireMode;
    use std::net::Ipv4Addr;

    fn source(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    fn hello() -> Hello {
        Hello {
            mode: WireMode::Single,
            self_slot: crate::wire::NO_LEADER_SLOT,
            nonce: [9; 16],
        }
    }

    #[test]
    fn a_full_session_table_or_a_closed_owner_refuses_and_a_full_budget_evicts_the_oldest() {
        let mut table = ClientAdmission::new(1, 2, 2, Duration::from_secs(5));
        assert_eq!(table.accept(true, ConnId(1), source(1)), Accept::Refused);
        let admitted = |evicted| Accept::Admitted { evicted };
        assert_eq!(table.accept(false, ConnId(1), source(1)), admitted(None));
        assert_eq!(table.accept(false, ConnId(2), source(2)), admitted(None));
        assert_eq!(
            table.accept(false, ConnId(3), source(3)),
            admitted(Some(ConnId(1)))
        );
        assert_eq!(table.handshakes(), 2);
        // A v3 proof of the empty token: accepted, takes the one session.
        let tokens = ClientTokens::no_auth();
        let (mut front, _) = table.front(
            Instant::ZERO,
            hello(),
            crate::auth::SINGLE_FINGERPRINT,
            Capabilities::KNOWN,
        );
        // The proof answers the hello as sent (its nonce shaped).
        let sent = Hello::parse(&front.hello_bytes()).expect("a hello");
        let proof = crate::auth::client_proof(b"", &crate::auth::SINGLE_FINGERPRINT, &sent);
        let mut out = Vec::new();
        let step = table.handshake_input(
            Instant::ZERO,
            ConnId(2),
            &mut front,
            &tokens,
            &proof,
            &mut out,
        );
        assert_eq!(step, Handshake::Started(Dialect::V3));
        assert_eq!((table.sessions(), table.handshakes()), ((1, 0), 1));
        // Every session slot taken: new connections are refused.
        assert_eq!(table.accept(false, ConnId(4), source(4)), Accept::Refused);
        table.closed(ConnId(2), &front);
        assert_eq!(table.sessions(), (0, 0));
        assert_eq!(table.accept(false, ConnId(5), source(5)), admitted(None));
    }
}
