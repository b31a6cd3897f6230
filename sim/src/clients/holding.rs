//! Holding a grant, whichever dialect got it: the holder's work steps
//! (writes to the fenced resource, checked against its validity window,
//! pauses, stalls), the deadline checker, the fenced resource itself, the
//! validity windows, and the end of a holding (released the way its
//! dialect releases, or dropped).

use ticketing_core::client::{DRIFT_PARTS, Grant, HolderWatch, ReleaseOperation};
use ticketing_core::time::Duration;

use super::{
    ClientEv, ClientProcess, ClientWorld, DbKey, LineCalls, OpState, Plan, Renewal, V3Ops,
    V3Renewals,
};
use crate::checks::{Window, key_indices};
use crate::clock::{act_before_local_us, instant};
use crate::config::ALL_KEYS;
use crate::run::Checker;

/// Holding a grant (a blanket extension of [`ClientWorld`]).
pub(crate) trait Holdings<'t>: ClientWorld<'t> {
    fn start_holding(&mut self, client: usize, id: u64, grant: Grant, plan: Plan, lease_s: u8) {
        let (holding, era) = self.new_holding(grant.token);
        self.check_deadline(client, grant.token, grant.valid_before.as_micros(), lease_s);
        let local = self.local_now(client);
        let parts = self.parts();
        let act_before_local_us = act_before_local_us(
            grant.valid_before.as_micros(),
            lease_s,
            parts.config.drift_ppm_max,
        );
        let now_us = parts.now_us;
        let renewal = plan.renew.clone().map(|plan| Renewal {
            plan,
            progress_local_us: local,
            writes_done: 0,
            extending: None,
        });
        let renews = renewal.is_some();
        let valid_before_us = grant.valid_before.as_micros();
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        proc.ops.insert(
            id,
            OpState::Holding {
                writes_left: plan.writes,
                grant,
                holding,
                plan,
                act_before_local_us,
                start_us: now_us,
                era,
                write_after_pause: false,
                lease_s,
                renewal,
            },
        );
        self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
        if renews {
            self.schedule_renewal(client, id, valid_before_us, lease_s);
        }
    }

    /// Deadline checker: the core's conservative deadline of a grant of
    /// `token` valid before `valid_before_us` (local) with a lease of
    /// `lease_s`, taken to true time, is not after the grant's expiry on
    /// the server whose answer gave it. Only where the world's clocks keep
    /// the rate error the core allows for ([`DRIFT_PARTS`]), and within
    /// one lease era (a server clock jump or restart ends leases early).
    fn check_deadline(&mut self, client: usize, token: u64, valid_before_us: u64, lease_s: u8) {
        let Some((conn, rid)) = self.parts().clients[client].answered.take() else {
            return;
        };
        let Some((expiry_us, era)) = self.answered_expiry(conn, rid) else {
            return;
        };
        let parts = self.parts();
        // Two clocks, each off by up to the bound, in opposite directions.
        let rate_error_ppm = 2 * u64::from(parts.config.drift_ppm_max);
        if era != parts.lease_era || rate_error_ppm > 1_000_000 / DRIFT_PARTS {
            return;
        }
        let watch = HolderWatch::new(
            instant(valid_before_us),
            Duration::from_secs(u64::from(lease_s)),
        );
        let deadline_us = parts.clients[client]
            .clock
            .true_at(watch.deadline().as_micros());
        parts.rec.report.deadlines_checked += 1;
        if deadline_us > expiry_us {
            self.violation(
                Checker::Deadlines,
                format!(
                    "client {client}: the deadline of token {token} ({deadline_us}) is after its expiry on the server that answered ({expiry_us})"
                ),
            );
        }
    }

    /// A holder's next step: write (checked against its validity window,
    /// or unchecked right after a pause that came between check and
    /// write), pause before a write, or finish.
    fn work_step(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        let Some(step) = self.decide_work(client, id, local) else {
            return;
        };
        let parts = self.parts();
        let inc = parts.clients[client].inc;
        let pause_max_us = parts.config.faults.pause_max_us;
        let now_us = parts.now_us;
        let WorkStep {
            token,
            keys,
            gap,
            holding,
            era,
            ..
        } = step;
        match step.action {
            WorkAction::Finish => self.finish_holding(client, id),
            WorkAction::Pause => {
                let parts = self.parts();
                let pause = parts.fault_rng.range(1, pause_max_us.max(1));
                parts.rec.report.faults += 1;
                self.pause_client(client, pause);
                self.note(|| format!("FAULT client {client} pauses {pause} µs before a write"));
                self.schedule_client(now_us, client, inc, ClientEv::WorkStep(id));
            }
            WorkAction::Write { checked } => {
                for key in keys {
                    self.db_write(client, key, token, holding, checked, era);
                }
                self.schedule_client(now_us + gap, client, inc, ClientEv::WorkStep(id));
            }
            WorkAction::Hang { until_local_us } => {
                let parts = self.parts();
                let at = parts.clients[client]
                    .clock
                    .true_at(until_local_us)
                    .max(now_us + 1);
                self.schedule_client(at, client, inc, ClientEv::WorkStep(id));
            }
        }
    }

    /// Decides holder `id`'s next step at local time `local` (drawing a
    /// pause before a write from the fault stream) and counts a write as
    /// done; `None` if `id` holds nothing.
    fn decide_work(&mut self, client: usize, id: u64, local: u64) -> Option<WorkStep> {
        let parts = self.parts();
        let pause_chance = if parts.safety {
            parts.config.faults.pause_before_write_ppm
        } else {
            0
        };
        let Some(OpState::Holding {
            grant,
            holding,
            era,
            writes_left,
            act_before_local_us,
            write_after_pause,
            plan,
            renewal,
            ..
        }) = parts.clients[client].ops.get_mut(&id)
        else {
            return None;
        };
        let stalled = renewal.as_ref().is_some_and(Renewal::stalled);
        let action = if *write_after_pause {
            *write_after_pause = false;
            WorkAction::Write { checked: false }
        } else if stalled && local < *act_before_local_us {
            WorkAction::Hang {
                until_local_us: *act_before_local_us,
            }
        } else if *writes_left > 0 && local < *act_before_local_us {
            if pause_chance > 0 && parts.fault_rng.chance(pause_chance) {
                // Checked, then stopped before writing: the write lands
                // after the pause, perhaps long after the lease.
                *write_after_pause = true;
                WorkAction::Pause
            } else {
                WorkAction::Write { checked: true }
            }
        } else {
            WorkAction::Finish
        };
        if matches!(action, WorkAction::Write { .. }) {
            *writes_left = writes_left.saturating_sub(1);
            if let Some(renewal) = renewal.as_mut() {
                renewal.progress_local_us = local;
                renewal.writes_done = renewal.writes_done.saturating_add(1);
            }
        }
        Some(WorkStep {
            action,
            token: grant.token,
            keys: key_indices(&grant.keys),
            gap: plan.write_gap_us,
            holding: *holding,
            era: *era,
        })
    }

    /// The fenced resource: accepts a write iff its token is at least the
    /// key's high-water mark. A write the holder checked against its
    /// validity window (in the lease era of its grant) must not be fenced,
    /// and one token must not be accepted from two holdings.
    fn db_write(
        &mut self,
        client: usize,
        key: usize,
        token: u64,
        holding: u64,
        checked: bool,
        era: u64,
    ) {
        let parts = self.parts();
        let entry = parts.db[key];
        if token >= entry.high_water {
            parts.db[key] = DbKey {
                high_water: token,
                holding,
                client,
            };
            if token == entry.high_water && entry.holding != holding && entry.holding != 0 {
                self.violation(
                    Checker::Fencing,
                    format!(
                        "{}: token {token} accepted from two grants ({} and {holding})",
                        ALL_KEYS[key], entry.holding
                    ),
                );
            }
            self.note(|| {
                format!(
                    "db {}: write by client {client} token {token} accepted",
                    ALL_KEYS[key]
                )
            });
        } else {
            parts.rec.report.fenced_writes += 1;
            let lease_era = parts.lease_era;
            self.note(|| {
                format!(
                    "db {}: stale write by client {client} token {token} < {} fenced",
                    ALL_KEYS[key], entry.high_water
                )
            });
            if checked && lease_era == era {
                self.violation(
                    Checker::Fencing,
                    format!(
                        "{}: client {client} wrote inside its validity window with token {token}, but token {} (client {}) had already written",
                        ALL_KEYS[key], entry.high_water, entry.client
                    ),
                );
            }
        }
    }

    /// The holding ends: its window is recorded, and the grant released
    /// or dropped as planned.
    fn finish_holding(&mut self, client: usize, id: u64) {
        let parts = self.parts();
        let Some(OpState::Holding {
            grant,
            holding,
            plan,
            act_before_local_us,
            start_us,
            era,
            ..
        }) = parts.clients[client].ops.remove(&id)
        else {
            return;
        };
        let clock = parts.clients[client].clock;
        let end_us = parts.now_us.min(clock.true_at(act_before_local_us));
        self.record_window(&grant, holding, start_us, end_us, era);
        if plan.release && self.parts().clients[client].line.is_some() {
            self.line_start_release(client, grant);
        } else if plan.release {
            let local = self.local_now(client);
            let op = ReleaseOperation::new(instant(local), grant.keys, grant.token);
            self.start_release(client, op);
        } else {
            self.note(|| format!("client {client} drops ticket {}", grant.token));
        }
        self.after_op_step(client);
    }

    /// Validity-window checker: no two holdings of a key (in one lease
    /// era) have overlapping windows in true time.
    fn record_window(&mut self, grant: &Grant, holding: u64, start_us: u64, end_us: u64, era: u64) {
        let window = Window {
            start_us,
            end_us,
            holding,
            token: grant.token,
            era,
        };
        for detail in self.parts().windows.record(grant, window) {
            self.violation(Checker::Fencing, detail);
        }
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> Holdings<'t> for W {}

/// What a holder does at its next work step.
pub(crate) enum WorkAction {
    Finish,
    Pause,
    Write {
        checked: bool,
    },
    /// The work hangs: nothing happens until the deadline.
    Hang {
        until_local_us: u64,
    },
}

/// A holder's decided next step, with what acting on it needs of the
/// holding.
pub(crate) struct WorkStep {
    action: WorkAction,
    token: u64,
    /// The granted keys, as indices into `ALL_KEYS`.
    keys: Vec<usize>,
    /// The gap before the next write, µs.
    gap: u64,
    holding: u64,
    era: u64,
}
