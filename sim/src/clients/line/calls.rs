//! A line client's calls: the workload's acquires (key, wait, lease and
//! plan drawn in a fixed order), releases at the end of a holding,
//! sending a call once the connection is ready, and the connection
//! itself: dialing (the named leader, else round-robin), redirects, and
//! a close that makes what was outstanding indeterminate and resends it.

use ticketing_core::client::{Grant, KeySet};
use ticketing_core::line::{encode_line_acquire, encode_line_release};

use super::LineCall;
use crate::clients::{ClientEv, ClientWorld, OpState, Plan};
use crate::clock::lease_min_us;
use crate::config::{COLD_KEYS, HOT_KEYS};
use crate::linear::LinOp;
use crate::rng::Rng;

/// A line client's calls and connection (a blanket extension of
/// [`ClientWorld`]).
pub(crate) trait LineCalls<'t>: ClientWorld<'t> {
    /// Starts `client`'s next call (one at a time) and schedules the one
    /// after.
    fn line_start_op(&mut self, client: usize) {
        if !self.line_call_due(client) {
            return;
        }
        let parts = self.parts();
        let config = parts.config;
        let (wait_s_max, lease_s_max, drift) =
            (config.wait_s_max, config.lease_s_max, config.drift_ppm_max);
        let now_us = parts.now_us;
        let LineDraw {
            key,
            wait_s,
            lease_s,
            plan,
        } = draw_line_acquire(parts.work, wait_s_max, lease_s_max);
        let keys = KeySet::single(key).expect("sim keys are valid");
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

    /// Whether `client` starts a call now (in the safety phase, below its
    /// count of acquires, none in flight); the step after is scheduled
    /// either way while it may start more.
    fn line_call_due(&mut self, client: usize) -> bool {
        let parts = self.parts();
        if !parts.safety {
            return false;
        }
        let config = parts.config;
        let acquires_max = config.acquires_per_client_max;
        let proc = &parts.clients[client];
        let inc = proc.inc;
        if proc.acquires_started >= acquires_max {
            return false;
        }
        let busy = !proc.ops.is_empty();
        let think = parts.work.below(600_000);
        let now_us = parts.now_us;
        self.schedule_client(now_us + think, client, inc, ClientEv::StartOp);
        !busy
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
        self.line_reconnect_later(client, failures, at_once);
    }

    /// Schedules line client `client`'s reconnect after `failures`
    /// connections in a row ended unanswered (`at_once`: after a redirect).
    fn line_reconnect_later(&mut self, client: usize, failures: u32, at_once: bool) {
        // "At once" for `M` and the named `E` reasons, as the published
        // clients do, but doubling while nothing gets answered (an election
        // would otherwise be a reconnect storm).
        let delay = if at_once {
            1_000u64 << failures.min(6)
        } else {
            (5_000u64 << failures.min(8)).min(1_000_000)
        };
        let parts = self.parts();
        let (now_us, inc) = (parts.now_us, parts.clients[client].inc);
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

impl<'t, W: ClientWorld<'t> + ?Sized> LineCalls<'t> for W {}

/// A line acquire as the workload draws it.
struct LineDraw {
    key: &'static str,
    wait_s: u16,
    lease_s: u16,
    plan: Plan,
}

/// Draws a line acquire from the work stream, in the order the workload
/// always drew it: key, wait, lease, plan.
fn draw_line_acquire(work: &mut Rng, wait_s_max: u8, lease_s_max: u8) -> LineDraw {
    let key = if work.below(10) < 7 {
        HOT_KEYS[work.index(HOT_KEYS.len())]
    } else {
        COLD_KEYS[work.index(COLD_KEYS.len())]
    };
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
    LineDraw {
        key,
        wait_s,
        lease_s,
        plan,
    }
}
