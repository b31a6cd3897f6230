//! What a line client reads: the hello (answered with the challenge and
//! followed at once by its requests), the replies matched to the calls in
//! flight, leader notices, and each call's outcome (a grant becomes a
//! holding like a v3 client's).

use ticketing_core::client::Grant;
use ticketing_core::line::{LineReply, line_answer};

use super::{HELLO_LINE_MAX, LineCall, LineCalls, show};
use crate::clients::{ClientEv, ClientWorld, Holdings, OpState};
use crate::clock::{instant, lease_min_us};
use crate::linear::LinOp;
use crate::run::Checker;

/// A line client's replies (a blanket extension of [`ClientWorld`]).
pub(crate) trait LineReplies<'t>: ClientWorld<'t> {
    /// Bytes from `conn` reach line client `client`.
    fn line_input(&mut self, client: usize, conn: u64, bytes: &[u8]) {
        let Some(rest) = self.line_hello(client, conn, bytes) else {
            return;
        };
        self.line_replies(client, conn, rest);
    }

    /// Reads `bytes` from `conn` as far as the hello goes, while it is
    /// unanswered: at its LF the answer goes out, and the calls waiting
    /// for a connection right behind it. The bytes after the hello, or
    /// `None` if nothing is left to read (not `client`'s connection, the
    /// hello goes on, or it was bad).
    fn line_hello<'b>(&mut self, client: usize, conn: u64, bytes: &'b [u8]) -> Option<&'b [u8]> {
        let proc = &mut self.parts().clients[client];
        let line = proc.line.as_mut()?;
        if line.conn.map(|(open, _)| open) != Some(conn) {
            return None;
        }
        let mut rest = bytes;
        if let Some(hello) = line.hello.as_mut() {
            let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
                hello.extend_from_slice(rest);
                if hello.len() > HELLO_LINE_MAX {
                    let detail = format!("client {client}: hello line without LF on {conn}");
                    self.violation(Checker::Client, detail);
                    self.line_drop_conn(client, conn, false);
                }
                return None;
            };
            hello.extend_from_slice(&rest[..lf]);
            rest = &rest[lf + 1..];
            // The nonce: the raw bytes after the first space (not at 0).
            let answer = hello.iter().skip(1).position(|&b| b == b' ').map(|space| {
                let mut answer = line_answer(b"", &hello[space + 2..]).to_vec();
                answer.push(b'\n');
                answer
            });
            line.hello = None;
            let Some(answer) = answer else {
                let detail = format!("client {client}: hello line without a space on {conn}");
                self.violation(Checker::Client, detail);
                self.line_drop_conn(client, conn, false);
                return None;
            };
            self.send_from_client(conn, answer);
            self.note(|| format!("client {client} line answers on {conn}"));
            // Pipelined right behind the answer: no verdict to wait for.
            let unsent: Vec<u64> = self.parts().clients[client]
                .ops
                .iter()
                .filter_map(|(&id, op)| match op {
                    OpState::Line(call) if call.sent.is_none() => Some(id),
                    _ => None,
                })
                .collect();
            for id in unsent {
                self.line_send(client, id);
            }
        }
        Some(rest)
    }

    /// Decodes the replies in `rest` (after what was buffered) and handles
    /// each; a partial one is kept while the connection stays.
    fn line_replies(&mut self, client: usize, conn: u64, rest: &[u8]) {
        let Some(line) = self.parts().clients[client].line.as_mut() else {
            return;
        };
        line.replies.extend_from_slice(rest);
        let buffered = std::mem::take(&mut line.replies);
        let mut used_total = 0;
        loop {
            match LineReply::decode(&buffered[used_total..]) {
                Ok(Some((reply, used))) => {
                    used_total += used;
                    if !self.line_reply(client, conn, reply) {
                        return; // the connection is gone
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    let detail = format!("client {client}: bad line reply on {conn}: {error}");
                    self.violation(Checker::Client, detail);
                    return self.line_drop_conn(client, conn, false);
                }
            }
        }
        if let Some(line) = self.parts().clients[client].line.as_mut()
            && line.conn.map(|(open, _)| open) == Some(conn)
        {
            line.replies = buffered[used_total..].to_vec();
        }
    }

    /// One reply on `conn`; false if the connection was closed for it.
    fn line_reply(&mut self, client: usize, conn: u64, reply: LineReply<'_>) -> bool {
        let text = show(&reply);
        self.note(|| format!("client {client} line {conn}: {text}"));
        let (acquire, key, echo) = match reply {
            LineReply::Acquired { owner, key, .. }
            | LineReply::TimedOut { owner, key }
            | LineReply::Busy { owner, key } => (true, key, owner),
            LineReply::Released { token, key } | LineReply::NotFound { token, key } => {
                (false, key, token)
            }
            LineReply::Moved { address } => {
                let slot = self.line_address_slot(address);
                return self.line_redirect(client, conn, slot);
            }
            LineReply::Leader { address } => {
                self.line_leader_notice(client, address, &text);
                return true;
            }
            LineReply::Error { reason } => return self.line_error(client, conn, reason, &text),
        };
        let parts = self.parts();
        let found = parts.clients[client]
            .ops
            .iter()
            .find_map(|(&id, op)| match op {
                OpState::Line(call)
                    if call.acquire == acquire
                        && call.echo == echo
                        && call.keys.keys()[0].as_bytes() == key
                        && call.sent.is_some_and(|(c, _)| c == conn) =>
                {
                    Some(id)
                }
                _ => None,
            });
        let Some(id) = found else {
            // The published clients drop it; ours never should get one.
            self.violation(
                Checker::Client,
                format!("client {client}: line reply {text} matches no call in flight"),
            );
            return true;
        };
        if let Some(line) = self.parts().clients[client].line.as_mut() {
            line.failures = 0;
        }
        self.line_outcome(client, id, reply);
        true
    }

    /// Call `id` got its reply.
    fn line_outcome(&mut self, client: usize, id: u64, reply: LineReply<'_>) {
        if let LineReply::Busy { .. } = reply
            && self.line_busy_retry(client, id)
        {
            return;
        }
        let Some(OpState::Line(call)) = self.parts().clients[client].ops.remove(&id) else {
            return;
        };
        self.note(|| format!("client {client} op {id}: line {}", show(&reply)));
        match reply {
            LineReply::Acquired { token, .. } if call.lease_s == 0 || call.lease_s > 250 => {
                let lease_s = call.lease_s;
                self.violation(
                    Checker::Client,
                    format!(
                        "client {client} op {id}: lease {lease_s} s granted ({token}), not refused"
                    ),
                );
            }
            LineReply::Acquired { token, .. } => self.line_granted(client, id, call, token),
            LineReply::TimedOut { .. } | LineReply::Busy { .. } => {
                if (call.lease_s == 0 || call.lease_s > 250) && !call.saw_bad_lease {
                    let lease_s = call.lease_s;
                    self.violation(
                        Checker::Client,
                        format!(
                            "client {client} op {id}: lease {lease_s} s ended without Ebad_lease"
                        ),
                    );
                }
                self.parts().history.forget(&call.hist);
            }
            LineReply::Released { token, .. } => {
                let parts = self.parts();
                parts
                    .history
                    .resolve(parts.now_us, &call.hist, |_| LinOp::Released { token });
            }
            LineReply::NotFound { token, .. } => {
                // Unless an earlier attempt may have released it.
                if !call.any_indeterminate {
                    let parts = self.parts();
                    parts
                        .history
                        .resolve(parts.now_us, &call.hist, |_| LinOp::NotFound { token });
                }
            }
            _ => unreachable!("only answers to calls"),
        }
    }

    /// A `B` for call `id`: retried (true) while inside its wait (0:
    /// without limit), with the same frame.
    fn line_busy_retry(&mut self, client: usize, id: u64) -> bool {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let local = proc.clock.local(now_us);
        let inc = proc.inc;
        let Some(OpState::Line(call)) = proc.ops.get_mut(&id) else {
            return false;
        };
        let within =
            call.wait_s == 0 || local < call.begun_local_us + u64::from(call.wait_s) * 1_000_000;
        if !within {
            return false;
        }
        call.sent = None;
        call.saw_bad_lease = false;
        let at = now_us + 20_000 + self.parts().work.below(100_000);
        self.schedule_client(at, client, inc, ClientEv::OpRetry(id));
        true
    }

    /// Call `id` (acquire `call`) was granted `token`: the grant becomes a
    /// holding like a v3 client's.
    fn line_granted(&mut self, client: usize, id: u64, call: LineCall, token: u64) {
        let parts = self.parts();
        let (drift, now_us) = (parts.config.drift_ppm_max, parts.now_us);
        let (_, sent_local) = call.sent.expect("answered on its connection");
        let lease_s = call.lease_s;
        self.parts().rec.report.grants += 1;
        self.parts().rec.report.line_grants += 1;
        self.on_grant(client, token, true);
        let lease_min = lease_min_us(u64::from(lease_s) * 1_000_000, drift);
        let parts = self.parts();
        parts
            .history
            .resolve(now_us, &call.hist, |_| LinOp::Granted {
                token,
                lease_min_us: lease_min,
            });
        let grant = Grant {
            keys: call.keys,
            token,
            // Counted from just before the frame went out.
            valid_before: instant(sent_local + u64::from(lease_s) * 1_000_000),
            permits: None,
        };
        let plan = call.plan.expect("an acquire has a plan");
        self.start_holding(client, id, grant, plan, lease_s as u8);
    }

    /// A leader notice (`L`) naming `address`: the leader to dial next.
    fn line_leader_notice(&mut self, client: usize, address: &[u8], text: &str) {
        let slot = self.line_address_slot(address);
        if slot.is_none() {
            self.violation(
                Checker::Client,
                format!("client {client}: leader notice {text} names no slot"),
            );
        } else {
            self.on_leader_notice(client);
        }
        if let Some(line) = self.parts().clients[client].line.as_mut() {
            line.leader = slot;
        }
    }

    /// An error reply on `conn`; false if the connection was closed for
    /// it.
    fn line_error(&mut self, client: usize, conn: u64, reason: &[u8], text: &str) -> bool {
        match reason {
            b"no_leader" | b"not_active" => self.line_redirect(client, conn, None),
            b"bad_lease" => {
                self.line_bad_lease(client, conn);
                true
            }
            _ => {
                self.violation(
                    Checker::Client,
                    format!("client {client}: a correct server sent {text}"),
                );
                true
            }
        }
    }

    /// `Ebad_lease` on `conn`: it must answer an acquire in flight there
    /// with a lease the server refuses, not yet answered so.
    fn line_bad_lease(&mut self, client: usize, conn: u64) {
        let mut expected = false;
        for op in self.parts().clients[client].ops.values_mut() {
            if let OpState::Line(call) = op
                && call.acquire
                && call.sent.is_some_and(|(c, _)| c == conn)
                && (call.lease_s == 0 || call.lease_s > 250)
                && !call.saw_bad_lease
            {
                call.saw_bad_lease = true;
                expected = true;
                break;
            }
        }
        if !expected {
            self.violation(
                Checker::Client,
                format!("client {client}: Ebad_lease for no bad lease"),
            );
        }
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> LineReplies<'t> for W {}
