//! Connections: dialing, accepting, delivering, flushing and closing pipes.

use super::*;

impl<'t> ClusterWorld<'t> {
    pub(super) fn dial_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        let Opener::Node { slot: from, inc } = pipe.opener else {
            return;
        };
        let to = pipe.b_slot;
        let to_inc = self.nodes[usize::from(to)].inc;
        let cut = self.cut[usize::from(from)][usize::from(to)] > 0
            || self.cut[usize::from(to)][usize::from(from)] > 0;
        let up = self.nodes[usize::from(to)].node.is_some() && !pipe.tcp.reset;
        if !self.node_alive(from, inc) {
            self.pipes.remove(&pipe_id);
            return;
        }
        if cut || !up {
            let at = if cut {
                self.now_us + DIAL_TIMEOUT_US
            } else {
                self.now_us + self.net_delay()
            };
            return self.dial_fails(pipe_id, at);
        }
        let now = self.node_now(to);
        let nonce = self.nonce();
        let accepted = self.nodes[usize::from(to)]
            .node
            .as_mut()
            .and_then(|node| node.handle_peer_accept(now, nonce, node_source(from)));
        let Some(id) = accepted else {
            let at = self.now_us + self.net_delay();
            return self.dial_fails(pipe_id, at);
        };
        let answer_at = self.now_us + self.net_delay();
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.b_inc = to_inc;
        pipe.ids[1] = Some(id);
        pipe.open[1] = true;
        // The acceptor's bytes travel behind its SYN-ACK.
        pipe.tcp.last_us[1] = answer_at;
        self.nodes[usize::from(to)].conns.insert(id, pipe_id);
        self.schedule(
            answer_at,
            Ev::DialAnswer {
                pipe: pipe_id,
                ok: true,
            },
        );
        self.node_step(to, None);
    }

    /// The dialer of `pipe_id` learns at `at` that its dial failed.
    pub(super) fn dial_fails(&mut self, pipe_id: u64, at: u64) {
        self.schedule(
            at,
            Ev::DialAnswer {
                pipe: pipe_id,
                ok: false,
            },
        );
    }

    pub(super) fn dial_answer(&mut self, pipe_id: u64, ok: bool) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        let Opener::Node { slot: from, inc } = pipe.opener else {
            return;
        };
        let to = pipe.b_slot;
        let reset = pipe.tcp.reset;
        self.pipes.get_mut(&pipe_id).expect("checked above").dialing = false;
        if !self.node_alive(from, inc) {
            // The dialer is gone: the acceptor's side dies with it.
            self.reset_pipe(pipe_id);
            return;
        }
        let now = self.node_now(from);
        if !ok || reset {
            // A reset after the accept: the acceptor learns by SeesClose.
            self.drop_pipe_if_done(pipe_id);
            if !ok {
                self.pipes.remove(&pipe_id);
            }
            if let Some(node) = self.nodes[usize::from(from)].node.as_mut() {
                node.handle_dial_failed(now, to);
            }
            self.node_step(from, None);
            return;
        }
        let nonce = self.nonce();
        let node = self.nodes[usize::from(from)]
            .node
            .as_mut()
            .expect("alive checked");
        let id = node
            .handle_dialed(now, to, nonce)
            .expect("a dialed connection is taken");
        self.nodes[usize::from(from)].conns.insert(id, pipe_id);
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.ids[0] = Some(id);
        pipe.open[0] = true;
        self.node_step(from, None);
    }

    pub(super) fn client_connect_arrive(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        let slot = pipe.b_slot;
        let now = self.node_now(slot);
        let source = match pipe.opener {
            Opener::Client { client, .. } => client_source(client),
            Opener::Node { slot, .. } => node_source(slot),
            Opener::Adversary => adversary_source(),
        };
        let nonce = self.nonce();
        let inc = self.nodes[usize::from(slot)].inc;
        let accepted = self.nodes[usize::from(slot)]
            .node
            .as_mut()
            .and_then(|node| node.handle_connect(now, nonce, source));
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
                self.note(|| format!("pipe {pipe_id} refused by node {slot}"));
                self.reset_pipe(pipe_id);
            }
        }
    }

    /// The node connection id of `side` of a pipe, if that node still runs
    /// the incarnation that owns it.
    pub(super) fn node_conn(&self, pipe_id: u64, side: u8) -> Option<(u8, ConnId)> {
        let pipe = self.pipes.get(&pipe_id)?;
        let (slot, inc) = pipe.node_at(side)?;
        let id = pipe.ids[usize::from(side)]?;
        (pipe.open[usize::from(side)] && self.node_alive(slot, inc)).then_some((slot, id))
    }

    pub(super) fn deliver(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        let d = usize::from(dir);
        pipe.tcp.landed(d, bytes.len());
        let Some(bytes) = pipe.tcp.keep(d, bytes) else {
            return;
        };
        let to_side = if dir == 0 { 1 } else { 0 };
        if to_side == 0
            && let Opener::Client { client, inc } = pipe.opener
        {
            return self.deliver_to_client(pipe_id, client, inc, bytes);
        }
        if to_side == 0 && pipe.opener == Opener::Adversary {
            return self.adversary_receive(pipe_id, bytes);
        }
        let Some((slot, id)) = self.node_conn(pipe_id, to_side) else {
            return;
        };
        if self.pipes[&pipe_id].client() {
            self.observe_requests(pipe_id, &bytes);
        }
        let now = self.node_now(slot);
        if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
            node.handle_input(now, id, &bytes);
        }
        self.node_step(slot, None);
    }

    pub(super) fn flush(
        &mut self,
        pipe_id: u64,
        side: u8,
        bytes: Vec<u8>,
        done: bool,
        close: bool,
    ) {
        let Some((slot, id)) = self.node_conn(pipe_id, side) else {
            return;
        };
        let pipe = &self.pipes[&pipe_id];
        if pipe.tcp.reset {
            return;
        }
        let dir = if side == 1 { 1 } else { 0 };
        let written = bytes.len();
        self.send(pipe_id, dir, bytes);
        // Each part is reported as it goes out, as the drivers do: a grant
        // whose frame is written whole is delivered even if the rest is lost.
        let now = self.node_now(slot);
        let report = self.config.plant != Some(ClusterPlant::NeverReportFlushed);
        if report {
            if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
                node.handle_written(now, id, written);
            }
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.oracle.written_total += written as u64;
            let written_total = pipe.oracle.written_total;
            pipe.unflushed_grants
                .retain(|(_, end_offset)| *end_offset > written_total);
        }
        if !done {
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        pipe.writing[usize::from(side)] = false;
        if close {
            // Closed after flushing: FIN after the bytes.
            self.node_closes(pipe_id, side);
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.tcp.reset = true;
            let other = 1 - side;
            if pipe.stale[usize::from(dir)] {
                pipe.fin_stale[usize::from(dir)] = true;
            } else if pipe.open[usize::from(other)] {
                let at = pipe.tcp.last_us[usize::from(dir)].max(self.now_us) + 1;
                pipe.tcp.allow = [usize::MAX, usize::MAX];
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side: other,
                    },
                );
            }
            self.drop_pipe_if_done(pipe_id);
        } else {
            self.node_step(slot, Some(id));
        }
    }

    /// The node at `side` learns its connection is gone.
    pub(super) fn node_closes(&mut self, pipe_id: u64, side: u8) {
        let Some((slot, id)) = self.node_conn(pipe_id, side) else {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[usize::from(side)] = false;
            }
            return;
        };
        let now = self.node_now(slot);
        if let Some(node) = self.nodes[usize::from(slot)].node.as_mut() {
            node.handle_closed(now, id);
        }
        self.nodes[usize::from(slot)].conns.remove(&id);
        let pipe = self.pipes.get_mut(&pipe_id).expect("node_conn found it");
        pipe.open[usize::from(side)] = false;
        let ghosts = std::mem::take(&mut pipe.unflushed_grants);
        for (token, _) in ghosts {
            // Released at once by the node as never delivered.
            if self.received.contains(&token) {
                self.violation(
                    Checker::Replies,
                    format!(
                        "pipe {pipe_id} closed before grant {token} was reported flushed, so node {slot} releases it, yet a client received it"
                    ),
                );
            }
            self.ghosts.insert(token);
        }
        self.pending.retain(|(p, _), _| *p != pipe_id);
        self.node_step(slot, None);
    }

    pub(super) fn sees_close(&mut self, pipe_id: u64, side: u8) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if side == 0
            && let Opener::Client { client, inc } = pipe.opener
        {
            self.client_sees_close(pipe_id, client, inc);
        } else if side == 0 && pipe.opener == Opener::Adversary {
            self.adversary.conns.remove(&pipe_id);
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[0] = false;
            }
        } else {
            self.node_closes(pipe_id, side);
        }
        self.drop_pipe_if_done(pipe_id);
    }
}
