//! Line clients: a model of the published 0.3.0 clients (the line dialect,
//! `ticketing_core::line`) beside the v3 clients, against the same keys.
//!
//! A line client is a small state machine of its own, not the core client
//! `Session`: it reads the shared hello up to its first LF, answers the
//! challenge after the first space with `line_answer` and sends its
//! requests right behind the answer (it never waits for a verdict). Each
//! call has its own owner (a random base XOR a counter). Replies are
//! matched by op family, key and owner or token. When the connection
//! closes with a request outstanding — a server crash, a reset, a
//! partition, `M`, `Eno_leader`, `Enot_active`, or the close of a
//! cluster node that cannot know an outcome — it reconnects (to the leader
//! named by `M`/`L`, else round-robin) and resends the identical frame.
//!
//! In the history the first attempt stays indeterminate (it may have taken
//! effect: a grant the server wrote but the client never read stays held
//! for its lease; one never written is released by the server), and the
//! resend is a new attempt. A release outstanding at a close stays
//! indeterminate too and is resent; `N` then settles nothing. Grants become
//! holdings exactly like the v3 clients' (validity windows, fenced writes),
//! so every checker sees both dialects together.

use ticketing_core::client::{Grant, KeySet};
use ticketing_core::line::{LineReply, encode_line_acquire, encode_line_release, line_answer};

use super::{ClientEv, ClientWorld, OpState, Plan};
use crate::checks::HistRefs;
use crate::clock::{instant, lease_min_us};
use crate::config::{COLD_KEYS, HOT_KEYS};
use crate::linear::LinOp;
use crate::run::Checker;

/// The Rust 0.3.0 client gives up on a hello line longer than this.
const HELLO_LINE_MAX: usize = 192;

/// A line client's connection and call counter.
pub(crate) struct LineLink {
    /// The open connection, if any, and its slot.
    pub(crate) conn: Option<(u64, u8)>,
    /// The hello line read so far; `None` once answered.
    hello: Option<Vec<u8>>,
    /// Reply bytes not yet decoded.
    replies: Vec<u8>,
    /// The random base of this process's owners.
    owner_base: u64,
    /// Calls made (XORed into the owner).
    calls: u64,
    /// The leader a cluster named last (`M`/`L`).
    leader: Option<u8>,
    /// The next slot of the round-robin.
    next_slot: u8,
    /// Connections that ended without a reply since the last one did.
    failures: u32,
    /// A reconnect is scheduled.
    reconnecting: bool,
}

impl LineLink {
    pub(crate) fn new(owner_base: u64) -> Self {
        LineLink {
            conn: None,
            hello: None,
            replies: Vec::new(),
            owner_base,
            calls: 0,
            leader: None,
            next_slot: 0,
            failures: 0,
            reconnecting: false,
        }
    }

    /// A crash: the connection and what was read on it are gone.
    pub(crate) fn reset(&mut self) {
        self.conn = None;
        self.hello = None;
        self.replies.clear();
        self.leader = None;
        self.failures = 0;
        self.reconnecting = false;
    }

    fn ready(&self) -> Option<u64> {
        match (self.conn, &self.hello) {
            (Some((conn, _)), None) => Some(conn),
            _ => None,
        }
    }
}

/// One line call in flight.
pub(crate) struct LineCall {
    /// The exact frame; every resend is this.
    frame: Vec<u8>,
    keys: KeySet,
    /// Owner (acquire) or token (release).
    echo: u64,
    acquire: bool,
    lease_s: u16,
    wait_s: u16,
    plan: Option<Plan>,
    /// The current attempt's history entries.
    pub(crate) hist: HistRefs,
    /// The connection the current attempt went out on, and the local time
    /// just before it did.
    sent: Option<(u64, u64)>,
    /// Local time the call began (for its wait while retrying `B`).
    begun_local_us: u64,
    /// An earlier release attempt may have taken effect.
    any_indeterminate: bool,
    /// `Ebad_lease` came for this attempt (a bad lease must get it
    /// before its `T`).
    saw_bad_lease: bool,
}

/// The line client code both worlds run (a blanket extension of
/// [`ClientWorld`]).
pub(crate) trait LineClientWorld<'t>: ClientWorld<'t> {
    /// Starts `client`'s next call (one at a time) and schedules the one
    /// after.
    fn line_start_op(&mut self, client: usize) {
        let parts = self.parts();
        if !parts.safety {
            return;
        }
        let config = parts.config;
        let (acquires_max, wait_s_max, lease_s_max, drift) = (
            config.acquires_per_client_max,
            config.wait_s_max,
            config.lease_s_max,
            config.drift_ppm_max,
        );
        let proc = &parts.clients[client];
        let inc = proc.inc;
        if proc.acquires_started >= acquires_max {
            return;
        }
        let busy = !proc.ops.is_empty();
        let think = parts.work.below(600_000);
        let now_us = parts.now_us;
        self.schedule_client(now_us + think, client, inc, ClientEv::StartOp);
        if busy {
            return;
        }
        let parts = self.parts();
        let work = parts.work;
        let key = if work.below(10) < 7 {
            HOT_KEYS[work.index(HOT_KEYS.len())]
        } else {
            COLD_KEYS[work.index(COLD_KEYS.len())]
        };
        let keys = KeySet::single(key).expect("sim keys are valid");
        // Wait 0 is "without limit" to a line client: the server's 255 s.
        let wait_s = match work.below(100) {
            0..=24 => 0,
            25..=27 => 300,
            _ => work.range(1, u64::from(wait_s_max)) as u16,
        };
        // Now and then a lease the server refuses (`Ebad_lease`, then `T`).
        let lease_s = match work.below(100) {
            0..=1 => 0,
            2..=3 => 251 + work.below(1_000) as u16,
            4..=60 => work.range(1, 2) as u16,
            _ => work.range(1, u64::from(lease_s_max)) as u16,
        };
        let gap_lease_s = u64::from(lease_s.clamp(1, 8));
        let plan = Plan {
            writes: work.range(1, 4) as u8,
            write_gap_us: work.range(1_000, gap_lease_s * 400_000),
            release: work.chance(800_000),
            renew: None,
        };
        let proc = &mut parts.clients[client];
        let line = proc.line.as_mut().expect("a line client");
        let owner = line.owner_base ^ line.calls;
        line.calls += 1;
        proc.acquires_started += 1;
        let local = proc.clock.local(now_us);
        let mut frame = Vec::new();
        encode_line_acquire(&mut frame, wait_s, lease_s, owner, key.as_bytes());
        let lease_min = lease_min_us(u64::from(lease_s) * 1_000_000, drift);
        let hist = parts.history.open(
            now_us,
            &keys,
            LinOp::AcquireIndeterminate {
                lease_min_us: lease_min,
            },
        );
        let id = *parts.next_op;
        *parts.next_op += 1;
        parts.clients[client].ops.insert(
            id,
            OpState::Line(LineCall {
                frame,
                keys,
                echo: owner,
                acquire: true,
                lease_s,
                wait_s,
                plan: Some(plan),
                hist,
                sent: None,
                begun_local_us: local,
                any_indeterminate: false,
                saw_bad_lease: false,
            }),
        );
        self.note(|| {
            format!("client {client} op {id}: line acquire {key} wait {wait_s} s lease {lease_s} s owner {owner:#x}")
        });
        self.line_send(client, id);
    }

    /// A line holder releases its grant.
    fn line_start_release(&mut self, client: usize, grant: Grant) {
        let parts = self.parts();
        let id = *parts.next_op;
        *parts.next_op += 1;
        let key = grant.keys.keys()[0].as_bytes().to_vec();
        let mut frame = Vec::new();
        encode_line_release(&mut frame, grant.token, &key);
        let hist = parts.history.open(
            parts.now_us,
            &grant.keys,
            LinOp::ReleaseIndeterminate { token: grant.token },
        );
        let local = parts.clients[client].clock.local(parts.now_us);
        parts.clients[client].ops.insert(
            id,
            OpState::Line(LineCall {
                frame,
                keys: grant.keys,
                echo: grant.token,
                acquire: false,
                lease_s: 0,
                wait_s: 0,
                plan: None,
                hist,
                sent: None,
                begun_local_us: local,
                any_indeterminate: false,
                saw_bad_lease: false,
            }),
        );
        let token = grant.token;
        self.note(|| format!("client {client} op {id}: line release token {token}"));
        self.line_send(client, id);
    }

    /// Sends call `id` if the connection is ready, else makes sure one is
    /// coming (the call goes out once it is).
    fn line_send(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        let proc = &mut self.parts().clients[client];
        let Some(line) = proc.line.as_ref() else {
            return;
        };
        let ready = line.ready();
        let connecting = line.conn.is_some() || line.reconnecting;
        let Some(OpState::Line(call)) = proc.ops.get_mut(&id) else {
            return;
        };
        if call.sent.is_some() {
            return;
        }
        match ready {
            Some(conn) => {
                call.sent = Some((conn, local));
                let frame = call.frame.clone();
                self.send_from_client(conn, frame);
            }
            None if !connecting => {
                let slot = self.line_next_slot(client);
                self.line_connect(client, slot);
            }
            None => {}
        }
    }

    /// The slot to dial: the leader if one was named, else round-robin.
    fn line_next_slot(&mut self, client: usize) -> u8 {
        let slots = self.line_slots();
        let proc = &mut self.parts().clients[client];
        let line = proc.line.as_mut().expect("a line client");
        if let Some(leader) = line.leader.filter(|&leader| leader < slots) {
            return leader;
        }
        let slot = line.next_slot % slots;
        line.next_slot = (slot + 1) % slots;
        slot
    }

    /// Opens a line connection to `slot` unless one is open.
    fn line_connect(&mut self, client: usize, slot: u8) {
        let proc = &mut self.parts().clients[client];
        if proc.crashed {
            return;
        }
        let Some(line) = proc.line.as_mut() else {
            return;
        };
        line.reconnecting = false;
        if line.conn.is_some() {
            return;
        }
        let Some(conn) = self.open_line_conn(client, slot) else {
            return;
        };
        let line = self.parts().clients[client]
            .line
            .as_mut()
            .expect("a line client");
        line.conn = Some((conn, slot));
        line.hello = Some(Vec::new());
        line.replies.clear();
        self.note(|| format!("client {client} line connects to slot {slot} as {conn}"));
    }

    /// Bytes from `conn` reach line client `client`.
    fn line_input(&mut self, client: usize, conn: u64, bytes: &[u8]) {
        let proc = &mut self.parts().clients[client];
        let Some(line) = proc.line.as_mut() else {
            return;
        };
        if line.conn.map(|(open, _)| open) != Some(conn) {
            return;
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
                return;
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
                return self.line_drop_conn(client, conn, false);
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
                return true;
            }
            LineReply::Error { reason } => {
                return match reason {
                    b"no_leader" | b"not_active" => self.line_redirect(client, conn, None),
                    b"bad_lease" => {
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
                        true
                    }
                    _ => {
                        self.violation(
                            Checker::Client,
                            format!("client {client}: a correct server sent {text}"),
                        );
                        true
                    }
                };
            }
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
        let parts = self.parts();
        let drift = parts.config.drift_ppm_max;
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let local = proc.clock.local(now_us);
        let inc = proc.inc;
        let Some(OpState::Line(call)) = proc.ops.get_mut(&id) else {
            return;
        };
        if let LineReply::Busy { .. } = reply {
            // Retried inside its wait (0: without limit), the same frame.
            let within = call.wait_s == 0
                || local < call.begun_local_us + u64::from(call.wait_s) * 1_000_000;
            if within {
                call.sent = None;
                call.saw_bad_lease = false;
                let at = now_us + 20_000 + self.parts().work.below(100_000);
                self.schedule_client(at, client, inc, ClientEv::OpRetry(id));
                return;
            }
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
            LineReply::Acquired { token, .. } => {
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
                    .resolve(now_us, &call.hist, |_| LinOp::Released { token });
            }
            LineReply::NotFound { token, .. } => {
                // Unless an earlier attempt may have released it.
                if !call.any_indeterminate {
                    let parts = self.parts();
                    parts
                        .history
                        .resolve(now_us, &call.hist, |_| LinOp::NotFound { token });
                }
            }
            _ => unreachable!("only answers to calls"),
        }
    }

    /// `M`, `Eno_leader`, `Enot_active`: no effect; close and reconnect at
    /// once (to `leader` if named).
    fn line_redirect(&mut self, client: usize, conn: u64, leader: Option<u8>) -> bool {
        let parts = self.parts();
        parts.rec.report.line_redirects += 1;
        let proc = &mut parts.clients[client];
        if let Some(line) = proc.line.as_mut() {
            line.leader = leader;
        }
        for op in proc.ops.values_mut() {
            if let OpState::Line(call) = op
                && call.sent.is_some_and(|(c, _)| c == conn)
            {
                call.sent = None;
                call.saw_bad_lease = false;
            }
        }
        self.line_drop_conn(client, conn, true);
        false
    }

    /// The client closes `conn` and reconnects (`at_once`: without
    /// backoff).
    fn line_drop_conn(&mut self, client: usize, conn: u64, at_once: bool) {
        self.close_transport(conn);
        self.line_closed(client, conn, at_once);
    }

    /// Line client `client` learns `conn` is gone: what was outstanding on
    /// it is indeterminate and is resent on a new connection.
    fn line_closed(&mut self, client: usize, conn: u64, at_once: bool) {
        let parts = self.parts();
        let now_us = parts.now_us;
        let drift = parts.config.drift_ppm_max;
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        let Some(line) = proc.line.as_mut() else {
            return;
        };
        if line.conn.map(|(open, _)| open) != Some(conn) {
            return;
        }
        line.conn = None;
        line.hello = None;
        line.replies.clear();
        line.failures = line.failures.saturating_add(1);
        let failures = line.failures;
        let mut resends = 0;
        let mut resent = Vec::new();
        for call in proc.ops.values_mut() {
            let OpState::Line(call) = call else {
                continue;
            };
            if call.sent.is_none_or(|(c, _)| c != conn) {
                continue;
            }
            call.sent = None;
            call.saw_bad_lease = false;
            resends += 1;
            resent.push(if call.acquire {
                format!(" owner {:#x}", call.echo)
            } else {
                format!(" token {}", call.echo)
            });
            if call.acquire {
                // The attempt stays open (indeterminate); the resend is a
                // new one.
                let lease_min = lease_min_us(u64::from(call.lease_s) * 1_000_000, drift);
                call.hist = parts.history.open(
                    now_us,
                    &call.keys,
                    LinOp::AcquireIndeterminate {
                        lease_min_us: lease_min,
                    },
                );
            } else {
                call.any_indeterminate = true;
            }
        }
        let pending = proc.ops.values().any(|op| matches!(op, OpState::Line(_)));
        parts.rec.report.line_resends += resends;
        self.note(|| {
            format!(
                "client {client} line {conn} closed; {resends} to resend:{}",
                resent.concat()
            )
        });
        if !pending {
            return;
        }
        // "At once" for `M` and the named `E` reasons, as the published
        // clients do, but doubling while nothing gets answered (an election
        // would otherwise be a reconnect storm).
        let delay = if at_once {
            1_000u64 << failures.min(6)
        } else {
            (5_000u64 << failures.min(8)).min(1_000_000)
        };
        let parts = self.parts();
        let at = now_us + delay + parts.work.below(delay);
        if let Some(line) = parts.clients[client].line.as_mut() {
            line.reconnecting = true;
        }
        let slot = self.line_next_slot(client);
        self.schedule_client(at, client, inc, ClientEv::Connect(slot));
    }

    /// `OpRetry` of a line call (after `B`).
    fn line_retry(&mut self, client: usize, id: u64) {
        self.line_send(client, id);
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> LineClientWorld<'t> for W {}

/// A line reply as a trace shows it: op, numbers, text as text.
fn show(reply: &LineReply<'_>) -> String {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match *reply {
        LineReply::Acquired { token, owner, key } => {
            format!("A token {token} owner {owner:#x} {}", text(key))
        }
        LineReply::TimedOut { owner, key } => format!("T owner {owner:#x} {}", text(key)),
        LineReply::Busy { owner, key } => format!("B owner {owner:#x} {}", text(key)),
        LineReply::Released { token, key } => format!("R token {token} {}", text(key)),
        LineReply::NotFound { token, key } => format!("N token {token} {}", text(key)),
        LineReply::Moved { address } => format!("M {}", text(address)),
        LineReply::Leader { address } => format!("L {}", text(address)),
        LineReply::Error { reason } => format!("E{}", text(reason)),
    }
}
