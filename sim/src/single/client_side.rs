//! The client side of the single world.

use super::*;

impl<'t> World<'t> {
    pub(super) fn client_connect(&mut self, client: usize) {
        let proc = &mut self.clients[client];
        if proc.link.sessions[0].is_some() || proc.crashed {
            return;
        }
        let local = proc.clock.local(self.now_us);
        let conn_id = self.next_conn;
        self.next_conn += 1;
        let mut config = SessionConfig::single(b"");
        if proc.renews {
            config.extensions = Capabilities::EXTEND.union(Capabilities::PUSH);
        }
        let session = Session::new(instant(local), config);
        proc.link.sessions[0] = Some((session, conn_id));
        self.open_conn(client, conn_id, StreamOracle::new());
        self.client_pump(client, 0);
    }

    /// A new connection from `client` to the server, read by `oracle`.
    pub(super) fn open_conn(&mut self, client: usize, conn_id: u64, oracle: StreamOracle) {
        let inc = self.clients[client].inc;
        self.conns.insert(
            conn_id,
            SimConn {
                client,
                inc,
                server_id: None,
                epoch: 0,
                tcp: Tcp::new(),
                client_open: true,
                server_open: false,
                stalled: false,
                writing: false,
                held_for_client: Vec::new(),
                close_held: false,
                oracle,
                takes: 0,
                observed: 0,
                untaken_grants: Vec::new(),
                unflushed_grants: Vec::new(),
                close_after_flush: false,
            },
        );
        self.note(|| format!("client {client} connects as conn {conn_id}"));
        let at = self.now_us + self.net_delay();
        self.schedule(at, Ev::ConnectArrive { conn: conn_id });
    }

    pub(super) fn deliver_to_client(&mut self, conn_id: u64, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.tcp.landed(1, bytes.len());
        if !conn.client_open {
            return;
        }
        let Some(bytes) = conn.tcp.keep(1, bytes) else {
            return;
        };
        let client = conn.client;
        let proc = &self.clients[client];
        if proc.inc != conn.inc || proc.crashed {
            return;
        }
        let paused = proc.paused_until_us > self.now_us;
        let conn = self.conns.get_mut(&conn_id).expect("checked above");
        if paused || !conn.held_for_client.is_empty() {
            // The kernel holds the bytes, in order, until the process runs.
            conn.held_for_client.extend_from_slice(&bytes);
            return;
        }
        self.client_input(client, 0, conn_id, &bytes);
    }

    /// A paused client runs again: what its kernel held is read first, in
    /// order, then any reset that came after it.
    pub(super) fn client_resume(&mut self, client: usize) {
        self.note(|| format!("client {client} resumes"));
        for conn_id in self.client_conns(client) {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                continue;
            };
            let bytes = std::mem::take(&mut conn.held_for_client);
            let close = std::mem::take(&mut conn.close_held);
            if !bytes.is_empty() {
                self.client_input(client, 0, conn_id, &bytes);
            }
            if close {
                self.client_sees_close(conn_id);
            }
        }
        self.client_pump(client, 0);
    }

    /// The connections `client` opened (any incarnation).
    pub(super) fn client_conns(&self, client: usize) -> Vec<u64> {
        self.conns
            .iter()
            .filter(|(_, conn)| conn.client == client)
            .map(|(&id, _)| id)
            .collect()
    }

    pub(super) fn client_sees_close(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let (client, inc) = (conn.client, conn.inc);
        let proc = &self.clients[client];
        let current = proc.inc == inc && !proc.crashed;
        if current && proc.paused_until_us > self.now_us {
            // Noticed after the held bytes, when the process runs again.
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.close_held = true;
            }
            return;
        }
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.client_open = false;
        }
        if current {
            self.transport_closed(client, 0, conn_id);
        }
        self.drop_conn_if_done(conn_id);
    }

    pub(super) fn client_restart(&mut self, client: usize) {
        let proc = &mut self.clients[client];
        proc.crashed = false;
        proc.inc += 1;
        let inc = proc.inc;
        self.note(|| format!("client {client} restarts as incarnation {inc}"));
        self.schedule_client(self.now_us, client, inc, ClientEv::Connect(0));
        self.schedule_client(self.now_us + 1, client, inc, ClientEv::StartOp);
    }
}
