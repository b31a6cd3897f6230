//! The outsider: a hostile peer that knows no secret.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Opens a connection to the leader (or any node) and one to another
    /// node, to relay the hellos between them.
    pub(super) fn adversary_relay(&mut self) {
        let n = self.n;
        let x = self
            .leader_slot()
            .unwrap_or_else(|| self.adversary.rng.below(u64::from(n)) as u8);
        let y = (x + 1 + self.adversary.rng.below(u64::from(n) - 1) as u8) % n;
        let (px, py) = (
            self.new_pipe(Opener::Adversary, x),
            self.new_pipe(Opener::Adversary, y),
        );
        self.adversary.relays += 1;
        self.rec.report.faults += 1;
        self.note(|| {
            format!("ADVERSARY dials node {x} (pipe {px}) and node {y} (pipe {py}) to relay")
        });
        for (pipe, partner) in [(px, py), (py, px)] {
            self.adversary.conns.insert(
                pipe,
                crate::adversary::AdversaryConn {
                    partner: Some(partner),
                    ..Default::default()
                },
            );
            let at = self.now_us + self.net_delay();
            self.schedule(at, Ev::AdversaryArrive { pipe });
            self.schedule(
                self.now_us + ADVERSARY_FINISH_US,
                Ev::AdversaryFinish { pipe },
            );
        }
    }

    pub(super) fn adversary_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        let slot = pipe.b_slot;
        let now = self.node_now(slot);
        let nonce = self.nonce();
        let inc = self.nodes[usize::from(slot)].inc;
        let accepted = self.nodes[usize::from(slot)]
            .node
            .as_mut()
            .and_then(|node| node.handle_peer_accept(now, nonce, adversary_source()));
        match accepted {
            Some(id) => {
                self.nodes[usize::from(slot)].conns.insert(id, pipe_id);
                let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                pipe.ids[1] = Some(id);
                pipe.b_inc = inc;
                pipe.open[1] = true;
                self.node_step(slot, None);
            }
            None => {
                self.adversary.conns.remove(&pipe_id);
                self.close_transport(pipe_id);
            }
        }
    }

    /// Bytes a node sent the outsider: its hello, and nothing else, ever
    /// (an acceptor proves only after the dialer did). Once both hellos of
    /// a relay are in, each node gets the other's, claiming to dial;
    /// anything more a node sends is shuttled to the other.
    pub(super) fn adversary_receive(&mut self, pipe_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.adversary.conns.get_mut(&pipe_id) else {
            return;
        };
        let before = conn.received.len();
        if conn.received.len() < 4_096 {
            conn.received.extend_from_slice(&bytes);
        }
        let (partner, hello_sent) = (conn.partner, conn.hello_sent);
        let from = before.max(PEER_HELLO_LEN).min(conn.received.len());
        let shuttle = conn.received[from..].to_vec();
        let sent = conn.received.len().saturating_sub(PEER_HELLO_LEN);
        if !shuttle.is_empty() {
            let slot = self.pipes.get(&pipe_id).map(|pipe| pipe.b_slot);
            self.violation(
                Checker::Raft,
                format!(
                    "node {slot:?} sent the outsider {sent} bytes after its hello on pipe {pipe_id}"
                ),
            );
            if let Some(partner) = partner {
                self.send(partner, 0, shuttle);
            }
        }
        if hello_sent {
            return;
        }
        let Some(partner) = partner else {
            return;
        };
        let own = self.adversary.conns.get(&pipe_id).and_then(|c| c.hello());
        let other = self.adversary.conns.get(&partner).and_then(|c| c.hello());
        if let (Some(own), Some(other)) = (own, other) {
            for (to, claim) in [(pipe_id, other), (partner, own)] {
                if let Some(conn) = self.adversary.conns.get_mut(&to) {
                    conn.hello_sent = true;
                }
                self.send(to, 0, Adversary::relay_hello(&claim));
            }
        }
    }

    /// The outsider writes a guessed proof and a forged frame claiming to
    /// be the other node of the relay.
    pub(super) fn adversary_finish(&mut self, pipe_id: u64) {
        if self.phase != Phase::Safety {
            return;
        }
        let Some(conn) = self.adversary.conns.get(&pipe_id) else {
            return;
        };
        let to = conn.hello().map(|hello| hello.from);
        let from = conn
            .partner
            .and_then(|partner| self.adversary.conns.get(&partner))
            .and_then(|partner| partner.hello())
            .map(|hello| hello.from);
        let mut bytes = self.adversary.guessed_proof();
        if let (Some(from), Some(to)) = (from, to) {
            let voters = self.adversary_known_ids();
            if let Some((frame, _)) = self.adversary.forge(from, to, voters) {
                bytes.extend_from_slice(&frame);
            }
        }
        self.send(pipe_id, 0, bytes);
    }
}
