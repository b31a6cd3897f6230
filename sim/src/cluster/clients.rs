//! Client processes: one core session per node, routed by the core router.

use super::*;

impl<'t> ClusterWorld<'t> {
    pub(super) fn client_connect(&mut self, client: usize, slot: u8) {
        let proc = &self.clients[client];
        if proc.link.sessions[usize::from(slot)].is_some() || proc.crashed {
            return;
        }
        let local = proc.clock.local(self.now_us);
        let inc = proc.inc;
        let pipe = self.new_pipe(Opener::Client { client, inc }, slot);
        let mut config = SessionConfig::cluster(b"", FINGERPRINT, slot, usize::from(self.n));
        if self.clients[client].renews {
            config.extensions = Capabilities::EXTEND.union(Capabilities::PUSH);
        }
        let session = Session::new(instant(local), config);
        self.clients[client].link.sessions[usize::from(slot)] = Some((session, pipe));
        self.note(|| format!("client {client} connects to node {slot} as pipe {pipe}"));
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ClientConnectArrive { pipe });
        self.client_pump(client, slot);
    }

    pub(super) fn deliver_to_client(
        &mut self,
        pipe_id: u64,
        client: usize,
        inc: u64,
        bytes: Vec<u8>,
    ) {
        let proc = &self.clients[client];
        if proc.inc != inc || proc.crashed || !self.pipes[&pipe_id].open[0] {
            return;
        }
        let paused = proc.paused_until_us > self.now_us;
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        if paused || !pipe.held_for_client.is_empty() {
            pipe.held_for_client.extend_from_slice(&bytes);
            return;
        }
        let slot = pipe.b_slot;
        self.client_input(client, slot, pipe_id, &bytes);
    }

    pub(super) fn client_resume(&mut self, client: usize) {
        self.note(|| format!("client {client} resumes"));
        for pipe_id in self.client_pipes(client) {
            let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                continue;
            };
            let bytes = std::mem::take(&mut pipe.held_for_client);
            let close = std::mem::take(&mut pipe.close_held);
            let slot = pipe.b_slot;
            if !bytes.is_empty() {
                self.client_input(client, slot, pipe_id, &bytes);
            }
            if close {
                let inc = self.clients[client].inc;
                self.client_sees_close(pipe_id, client, inc);
                self.drop_pipe_if_done(pipe_id);
            }
        }
        for slot in 0..self.n {
            self.client_pump(client, slot);
        }
    }

    /// The pipes `client` opened (any incarnation).
    pub(super) fn client_pipes(&self, client: usize) -> Vec<u64> {
        self.pipes
            .iter()
            .filter(
                |(_, pipe)| matches!(pipe.opener, Opener::Client { client: c, .. } if c == client),
            )
            .map(|(&id, _)| id)
            .collect()
    }

    pub(super) fn client_sees_close(&mut self, pipe_id: u64, client: usize, inc: u64) {
        let proc = &self.clients[client];
        let current = proc.inc == inc && !proc.crashed;
        if current && proc.paused_until_us > self.now_us {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.close_held = true;
            }
            return;
        }
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        pipe.open[0] = false;
        let slot = pipe.b_slot;
        if current {
            self.transport_closed(client, slot, pipe_id);
        }
    }

    pub(super) fn client_restart(&mut self, client: usize) {
        let n = usize::from(self.n);
        let proc = &mut self.clients[client];
        proc.crashed = false;
        proc.inc += 1;
        proc.link.router = Some(Router::new(n));
        proc.link.backoffs = vec![Backoff::new(); n];
        let inc = proc.inc;
        self.note(|| format!("client {client} restarts as incarnation {inc}"));
        for slot in 0..self.n {
            self.schedule_client(self.now_us, client, inc, ClientEv::Connect(slot));
        }
        self.schedule_client(self.now_us + 1, client, inc, ClientEv::StartOp);
    }
}
