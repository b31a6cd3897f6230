//! The clients' side of the world: what a client process sees and does.

use super::*;

impl<'t> ClientWorld<'t> for ClusterWorld<'t> {
    const CONN: &'static str = "pipe";

    fn parts(&mut self) -> Parts<'_, 't> {
        Parts {
            now_us: self.now_us,
            config: &self.config.base,
            safety: self.phase == Phase::Safety,
            clients: &mut self.clients,
            next_op: &mut self.next_op,
            history: &mut self.history,
            windows: &mut self.windows,
            db: &mut self.db,
            lease_era: self.lease_era,
            work: &mut self.work,
            fault_rng: &mut self.fault_rng,
            rec: &mut self.rec,
        }
    }

    fn schedule_client(&mut self, at_us: u64, client: usize, inc: u64, ev: ClientEv) {
        self.schedule(at_us, Ev::Client(ClientCall { client, inc, ev }));
    }

    fn send_from_client(&mut self, pipe: u64, bytes: Vec<u8>) {
        self.send(pipe, 0, bytes);
    }

    fn close_transport(&mut self, pipe_id: u64) {
        if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
            pipe.open[0] = false;
        }
        self.reset_pipe(pipe_id);
    }

    fn close_expected(&self, reason: &CloseReason) -> bool {
        // Besides what any server may cause: a node that is not (or no
        // longer) active. (`M` and `E 4` do not close a session.)
        close_expected_of_any(reason)
            || matches!(reason, CloseReason::ServerError(ErrorCode::NotActive))
    }

    fn on_ready(&mut self, client: usize, slot: u8, pipe_id: u64) {
        self.note(|| format!("client {client} ready on node {slot} (pipe {pipe_id})"));
    }

    /// The router (fed by the shared pump) follows leader notices.
    fn on_leader_notice(&mut self, _client: usize) {}

    fn resume(&mut self, client: usize) {
        self.client_resume(client);
    }

    fn connect(&mut self, client: usize, slot: u8) {
        if self.clients[client].line.is_some() {
            self.line_connect(client, slot);
        } else {
            self.client_connect(client, slot);
        }
    }

    fn restart(&mut self, client: usize) {
        self.client_restart(client);
    }

    fn crash_client(&mut self, client: usize) {
        self.note(|| format!("FAULT client {client} crashes"));
        self.crash_ops(client);
        self.clients[client].link.clear();
        for pipe_id in self.client_pipes(client) {
            if let Some(pipe) = self.pipes.get_mut(&pipe_id) {
                pipe.open[0] = false;
            }
            self.reset_pipe(pipe_id);
        }
        let at = self.now_us + self.fault_rng.range(100_000, 3_000_000);
        let inc = self.clients[client].inc;
        self.schedule_client(at, client, inc, ClientEv::Restart);
    }

    fn after_op_step(&mut self, _client: usize) {}

    fn on_grant(&mut self, client: usize, token: u64, caller: bool) {
        self.received.insert(token);
        if caller && self.ghosts.contains(&token) {
            self.violation(
                Checker::Replies,
                format!(
                    "client {client} holds grant {token} that a node released as never delivered"
                ),
            );
        }
    }

    fn new_holding(&mut self, token: u64) -> (u64, u64) {
        // A holding is named by its token here: one grant, one holding.
        let era = self
            .grants
            .get(&token)
            .map_or(self.lease_era, |info| info.era);
        (token, era)
    }

    fn release_failure(&self, error: ClientError) -> ReleaseFailure {
        match error {
            // No final reply within the release window; an attempt may
            // have taken effect (the history entry stays open).
            ClientError::Indeterminate | ClientError::NotConnected | ClientError::Timeout => {
                ReleaseFailure::LeaveOpen
            }
            ClientError::ClientCapacity => ReleaseFailure::Forget,
            // `E 6` cannot happen: the sim always releases a grant's exact
            // key group.
            ClientError::Protocol(message) if message.contains("GroupMismatch") => {
                ReleaseFailure::Unexpected(format!("release got {message}"))
            }
            error => ReleaseFailure::Unexpected(format!("release failed with {error:?}")),
        }
    }

    fn slot_of(&self, pipe: u64) -> Option<u8> {
        self.pipes.get(&pipe).map(|pipe| pipe.b_slot)
    }

    fn open_line_conn(&mut self, client: usize, slot: u8) -> Option<u64> {
        let inc = self.clients[client].inc;
        let pipe = self.new_pipe(Opener::Client { client, inc }, slot);
        let addresses = (0..self.n).map(|slot| line_address(slot).into()).collect();
        if let Some(sim_pipe) = self.pipes.get_mut(&pipe) {
            sim_pipe.oracle = StreamOracle::line(addresses);
        }
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ClientConnectArrive { pipe });
        Some(pipe)
    }

    fn line_slots(&self) -> u8 {
        self.n
    }

    fn line_address_slot(&self, address: &[u8]) -> Option<u8> {
        (0..self.n).find(|&slot| line_address(slot).as_bytes() == address)
    }

    fn answered_expiry(&mut self, conn: u64, rid: u64) -> Option<(u64, u64)> {
        self.answered.remove(&(conn, rid))
    }
}
