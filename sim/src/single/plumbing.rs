//! Plumbing: the event queue and the connections between clients and the server.

use super::*;

impl<'t> World<'t> {
    pub(super) fn schedule(&mut self, at_us: u64, ev: Ev) {
        self.queue.push(at_us, ev);
    }

    pub(super) fn net_delay(&mut self) -> u64 {
        net::delay(&self.config, &mut self.net)
    }

    pub(super) fn server_now(&self) -> u64 {
        self.server_clock.local(self.now_us)
    }

    /// Sends `bytes` on `conn` in `to_server` direction, split at random
    /// byte boundaries into chunks that arrive in order.
    pub(super) fn send(&mut self, conn_id: u64, to_server: bool, bytes: Vec<u8>) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.tcp.reset || bytes.is_empty() {
            return;
        }
        let dir = if to_server { 0 } else { 1 };
        assert!(
            conn.tcp.in_flight[dir] + bytes.len() <= IN_FLIGHT_BYTES_MAX,
            "unbounded bytes in flight"
        );
        let conn = self.conns.get_mut(&conn_id).expect("checked above");
        let timed = conn
            .tcp
            .transmit(dir, bytes, self.now_us, &self.config, &mut self.net);
        for (arrival, bytes) in timed {
            let ev = if to_server {
                Ev::DeliverToServer {
                    conn: conn_id,
                    bytes,
                }
            } else {
                Ev::DeliverToClient {
                    conn: conn_id,
                    bytes,
                }
            };
            self.schedule(arrival, ev);
        }
    }

    /// Kills `conn`'s transport: in-flight bytes are lost, both ends learn
    /// of it after a network delay.
    pub(super) fn reset_conn(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if conn.tcp.reset {
            return;
        }
        let open = [conn.client_open, conn.server_open];
        let [client_sees, server_sees] =
            conn.tcp
                .reset(open, self.now_us, &self.config, &mut self.net);
        if let Some(at) = client_sees {
            self.schedule(at, Ev::ClientSeesClose { conn: conn_id });
        }
        if let Some(at) = server_sees {
            self.schedule(at, Ev::ServerSeesClose { conn: conn_id });
        }
        self.drop_conn_if_done(conn_id);
    }

    pub(super) fn drop_conn_if_done(&mut self, conn_id: u64) {
        if let Some(conn) = self.conns.get(&conn_id)
            && conn.tcp.reset
            && !conn.client_open
            && !conn.server_open
        {
            self.conns.remove(&conn_id);
        }
    }
}
