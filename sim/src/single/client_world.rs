//! What a client process of the single world sees and does.

use super::*;

impl<'t> ClientWorld<'t> for World<'t> {
    const CONN: &'static str = "conn";

    fn parts(&mut self) -> Parts<'_, 't> {
        Parts {
            now_us: self.now_us,
            config: &self.config,
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

    fn send_from_client(&mut self, conn: u64, bytes: Vec<u8>) {
        self.send(conn, true, bytes);
    }

    fn close_transport(&mut self, conn_id: u64) {
        // Our side drops the transport too.
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.client_open = false;
        }
        self.reset_conn(conn_id);
    }

    fn close_expected(&self, reason: &CloseReason) -> bool {
        close_expected_of_any(reason)
    }

    fn on_ready(&mut self, client: usize, _slot: u8, conn_id: u64) {
        self.note(|| format!("client {client} ready on conn {conn_id}"));
    }

    fn on_leader_notice(&mut self, client: usize) {
        self.violation(
            Checker::Client,
            format!("client {client}: a single server sent a leader notice"),
        );
    }

    fn resume(&mut self, client: usize) {
        self.client_resume(client);
    }

    fn connect(&mut self, client: usize, slot: u8) {
        if self.clients[client].line.is_some() {
            self.line_connect(client, slot);
        } else {
            self.client_connect(client);
        }
    }

    fn restart(&mut self, client: usize) {
        self.client_restart(client);
    }

    fn crash_client(&mut self, client: usize) {
        self.note(|| format!("FAULT client {client} crashes"));
        self.crash_ops(client);
        let link = &mut self.clients[client].link;
        link.clear();
        link.backoffs[0] = Backoff::new();
        for conn_id in self.client_conns(client) {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.client_open = false;
            }
            self.reset_conn(conn_id);
        }
        let at = self.now_us + self.fault_rng.range(100_000, 3_000_000);
        let inc = self.clients[client].inc;
        self.schedule_client(at, client, inc, ClientEv::Restart);
    }

    fn after_op_step(&mut self, client: usize) {
        self.client_pump(client, 0);
    }

    fn on_grant(&mut self, client: usize, token: u64, caller: bool) {
        if !caller {
            return;
        }
        self.handed_tokens.insert(token, client);
        if self.ghost_tokens.contains(&token) {
            // Its bytes were written (else the client could not have it),
            // yet the server counted it undelivered.
            self.violation(
                Checker::Replies,
                format!(
                    "client {client} holds grant {token} that the server released as never delivered"
                ),
            );
        }
    }

    fn new_holding(&mut self, token: u64) -> (u64, u64) {
        let grant_id = self.next_grant_id;
        self.next_grant_id += 1;
        // Leases are cut by what happens after the grant at the server, not
        // after the client heard of it.
        let era = self
            .token_eras
            .get(&token)
            .copied()
            .unwrap_or(self.lease_era);
        (grant_id, era)
    }

    fn release_failure(&self, error: ClientError) -> ReleaseFailure {
        match error {
            ClientError::Indeterminate => ReleaseFailure::LeaveOpen,
            ClientError::NotConnected | ClientError::ClientCapacity => ReleaseFailure::Forget,
            error => ReleaseFailure::Unexpected(format!("release failed with {error:?}")),
        }
    }

    fn slot_of(&self, _conn: u64) -> Option<u8> {
        Some(0)
    }

    fn open_line_conn(&mut self, client: usize, _slot: u8) -> Option<u64> {
        let conn_id = self.next_conn;
        self.next_conn += 1;
        self.open_conn(client, conn_id, StreamOracle::line(Vec::new()));
        Some(conn_id)
    }

    fn line_slots(&self) -> u8 {
        1
    }

    fn line_address_slot(&self, _address: &[u8]) -> Option<u8> {
        None
    }

    fn answered_expiry(&mut self, conn: u64, rid: u64) -> Option<(u64, u64)> {
        self.answered.remove(&(conn, rid))
    }
}
