//! Starting v3 operations and submitting their attempts: the workload's
//! acquires (keys, wait, lease, budget, plan and perhaps a cancel, drawn
//! in a fixed order), releases, cancels, and when a retry runs (its
//! fallback instant, or earlier on a leader notice).

use ticketing_core::client::{
    AcquireOperation, AcquireParams, CancelOutcome, KeySet, ReleaseOperation,
};
use ticketing_core::time::Duration;

use super::{V3Outcomes, V3Renewals, V3Sessions};
use crate::checks::HistRefs;
use crate::clients::{
    ClientEv, ClientWorld, OpState, Plan, RECENT_INDETERMINATE_MAX, RenewPlan, RetryWait,
};
use crate::clock::{instant, lease_min_us};
use crate::config::{ALL_KEYS, COLD_KEYS, HOT_KEYS};
use crate::linear::LinOp;
use crate::rng::Rng;

/// Starting v3 operations and their attempts (a blanket extension of
/// [`ClientWorld`]).
pub(crate) trait V3Ops<'t>: ClientWorld<'t> {
    /// Starts the next v3 acquire of `client` (if it may) and schedules
    /// the one after.
    fn v3_start_op(&mut self, client: usize) {
        let parts = self.parts();
        if !parts.safety {
            return;
        }
        let config = parts.config;
        let (acquires_max, concurrent_max, wait_s_max, lease_s_max, drift) = (
            config.acquires_per_client_max,
            config.concurrent_per_client_max,
            config.wait_s_max,
            config.lease_s_max,
            config.drift_ppm_max,
        );
        let proc = &parts.clients[client];
        let active = proc
            .ops
            .values()
            .filter(|op| !matches!(op, OpState::Releasing { .. }))
            .count();
        let inc = proc.inc;
        if proc.acquires_started >= acquires_max {
            return;
        }
        let work = parts.work;
        let think = work.below(600_000);
        let now_us = parts.now_us;
        self.schedule_client(now_us + think, client, inc, ClientEv::StartOp);
        if active >= concurrent_max {
            return;
        }
        let parts = self.parts();
        let renews = parts.clients[client].renews;
        let AcquireDraw {
            keys,
            lease_s,
            params,
            plan,
            cancel_after,
        } = draw_acquire(parts.work, wait_s_max, lease_s_max, renews);
        let local = parts.clients[client].clock.local(now_us);
        let op = AcquireOperation::new(instant(local), keys.clone(), params);
        let id = *parts.next_op;
        *parts.next_op += 1;
        let lease_min_us = lease_min_us(lease_s * 1_000_000, drift);
        let hist = parts
            .history
            .open(now_us, &keys, LinOp::AcquireIndeterminate { lease_min_us });
        let proc = &mut parts.clients[client];
        proc.acquires_started += 1;
        proc.ops.insert(
            id,
            OpState::Acquiring {
                op,
                attempt: None,
                plan,
                hist,
            },
        );
        self.note(|| format!("client {client} op {id}: acquire {keys:?} {params:?}"));
        if let Some(delay) = cancel_after {
            self.schedule_client(now_us + delay, client, inc, ClientEv::CancelOp(id));
        }
        self.v3_attempt(client, id);
    }

    /// Submits v3 operation `id`'s next attempt, or lets it see that it
    /// cannot.
    fn v3_attempt(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        self.start_retry_wait(client, id);
        let proc = &mut self.parts().clients[client];
        let session = proc.link.attempt_session();
        let slot;
        match (proc.ops.get_mut(&id), session) {
            (Some(OpState::Acquiring { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.acquire_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Acquiring { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.acquire_step(client, id, step);
            }
            (Some(OpState::Releasing { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.release_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Releasing { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.release_step(client, id, step);
            }
            (Some(OpState::Extending { op, attempt, .. }), Ok((session, conn, index))) => {
                match op.submit(instant(local), session) {
                    Ok(rid) => {
                        *attempt = Some((conn, rid));
                        slot = index;
                    }
                    Err(error) => {
                        let step = op.on_error(instant(local), error);
                        return self.extend_step(client, id, step);
                    }
                }
            }
            (Some(OpState::Extending { op, .. }), Err(error)) => {
                let step = op.on_error(instant(local), error);
                return self.extend_step(client, id, step);
            }
            _ => return,
        }
        self.client_pump(client, slot);
    }

    /// Operation `id` (if a v3 one) makes an attempt: a retry it needs
    /// waits from the router's leader epoch as of now.
    fn start_retry_wait(&mut self, client: usize, id: u64) {
        let proc = &mut self.parts().clients[client];
        if matches!(
            proc.ops.get(&id),
            Some(OpState::Acquiring { .. } | OpState::Releasing { .. } | OpState::Extending { .. })
        ) {
            let epoch = proc.link.leader_epoch();
            proc.retries.insert(
                id,
                RetryWait {
                    epoch,
                    fallback_us: None,
                },
            );
        }
    }

    fn start_release(&mut self, client: usize, op: ReleaseOperation) {
        let parts = self.parts();
        let id = *parts.next_op;
        *parts.next_op += 1;
        let hist = parts.history.open(
            parts.now_us,
            op.keys(),
            LinOp::ReleaseIndeterminate { token: op.token() },
        );
        self.note(|| {
            format!(
                "client {client} op {id}: release {:?} token {}",
                op.keys(),
                op.token()
            )
        });
        self.parts().clients[client].ops.insert(
            id,
            OpState::Releasing {
                op,
                attempt: None,
                any_indeterminate: false,
                hist,
            },
        );
        self.v3_attempt(client, id);
    }

    /// Cancels acquire `id` while its attempt is in flight.
    fn cancel_op(&mut self, client: usize, id: u64) {
        let Some(OpState::Acquiring {
            attempt: Some((conn, rid)),
            ..
        }) = self.parts().clients[client].ops.get(&id)
        else {
            return;
        };
        let (conn, rid) = (*conn, *rid);
        let Some((outcome, slot)) = self.cancel_in_session(client, conn, rid) else {
            return;
        };
        self.note(|| format!("client {client} cancels op {id} (rid {rid}): {outcome:?}"));
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Acquiring { hist, op, .. }) =
            self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        match outcome {
            CancelOutcome::Unsent => self.forget_history(&hist),
            CancelOutcome::PossiblySent | CancelOutcome::Withdrawn | CancelOutcome::Unknown => {
                self.remember_indeterminate(client, op.keys().clone(), hist);
            }
        }
        self.client_pump(client, slot);
    }

    /// Cancels `rid` in `client`'s session on connection `conn`, if that
    /// is still the session's connection: the outcome and the slot.
    fn cancel_in_session(
        &mut self,
        client: usize,
        conn: u64,
        rid: u64,
    ) -> Option<(CancelOutcome, u8)> {
        let local = self.local_now(client);
        let slot = self.slot_of(conn)?;
        let (session, current) =
            self.parts().clients[client].link.sessions[usize::from(slot)].as_mut()?;
        (*current == conn).then(|| (session.cancel(instant(local), rid), slot))
    }

    fn remember_indeterminate(&mut self, client: usize, keys: KeySet, hist: HistRefs) {
        let proc = &mut self.parts().clients[client];
        if proc.recent_indeterminate.len() >= RECENT_INDETERMINATE_MAX {
            proc.recent_indeterminate.remove(0);
        }
        proc.recent_indeterminate.push((keys, hist));
    }

    /// Schedules a retry of operation `id` at local instant `at_local_us`,
    /// or now if a leader became reachable since its attempt was made; a
    /// leader that becomes reachable before then brings it forward
    /// ([`V3Ops::wake_retries`]).
    fn schedule_retry(&mut self, client: usize, id: u64, at_local_us: u64) {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let inc = proc.inc;
        let fallback_us = proc.clock.true_at(at_local_us).max(now_us);
        let epoch = proc.link.leader_epoch();
        let wait = proc.retries.entry(id).or_insert(RetryWait {
            epoch,
            fallback_us: None,
        });
        wait.fallback_us = Some(fallback_us);
        let at = if wait.epoch == epoch {
            fallback_us
        } else {
            now_us
        };
        self.schedule_client(at, client, inc, ClientEv::OpRetry(id));
    }

    /// A leader became reachable for `client`: every v3 operation waiting
    /// to retry since an attempt made before it retries now.
    fn wake_retries(&mut self, client: usize) {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &parts.clients[client];
        let inc = proc.inc;
        let epoch = proc.link.leader_epoch();
        let due: Vec<u64> = proc
            .retries
            .iter()
            .filter(|(_, wait)| wait.fallback_us.is_some() && wait.epoch != epoch)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.note(|| format!("client {client} op {id}: retried on a leader notice"));
            self.schedule_client(now_us, client, inc, ClientEv::OpRetry(id));
        }
    }

    /// Whether an `OpRetry` of v3 operation `id` runs: only while it waits
    /// to retry and the wait is over (its fallback instant came, or a leader became reachable
    /// since its attempt). An early retry leaves its fallback event
    /// behind, which then finds nothing to do.
    fn v3_retry_due(&mut self, client: usize, id: u64) -> bool {
        let parts = self.parts();
        let now_us = parts.now_us;
        let proc = &mut parts.clients[client];
        let epoch = proc.link.leader_epoch();
        let Some(wait) = proc.retries.get(&id) else {
            return false;
        };
        match wait.fallback_us {
            Some(fallback_us) => now_us >= fallback_us || wait.epoch != epoch,
            None => false,
        }
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> V3Ops<'t> for W {}

/// A v3 acquire as the workload draws it.
struct AcquireDraw {
    keys: KeySet,
    lease_s: u64,
    params: AcquireParams,
    plan: Plan,
    /// Cancel the acquire this long after it starts (true µs).
    cancel_after: Option<u64>,
}

/// Draws a v3 acquire from the work stream, in the order the workload
/// always drew it: keys, wait, lease, budget, plan, cancel.
fn draw_acquire(work: &mut Rng, wait_s_max: u8, lease_s_max: u8, renews: bool) -> AcquireDraw {
    let keys = draw_keys(work);
    let keys = KeySet::new(&keys).expect("sim keys are valid");
    let wait_s = if work.chance(300_000) {
        0
    } else {
        work.range(1, u64::from(wait_s_max))
    };
    let lease_s = if work.chance(600_000) {
        work.range(1, 2)
    } else {
        work.range(1, u64::from(lease_s_max))
    };
    let budget_us = if work.chance(500_000) {
        0
    } else {
        work.below(lease_s * 1_000_000)
    };
    let params = AcquireParams::new(
        Duration::from_secs(wait_s),
        Duration::from_secs(lease_s),
        Duration::from_micros(budget_us),
    )
    .expect("sim parameters are valid");
    let plan = draw_plan(work, lease_s, renews);
    let cancel_after = (wait_s > 0 && work.chance(100_000)).then(|| work.below(wait_s * 1_000_000));
    AcquireDraw {
        keys,
        lease_s,
        params,
        plan,
        cancel_after,
    }
}

/// Keys: mostly one hot key; sometimes a cold one or a small set.
fn draw_keys(work: &mut Rng) -> Vec<&'static str> {
    match work.below(10) {
        0..=4 => vec![HOT_KEYS[work.index(HOT_KEYS.len())]],
        5..=6 => vec![COLD_KEYS[work.index(COLD_KEYS.len())]],
        _ => {
            let mut set = vec![HOT_KEYS[work.index(HOT_KEYS.len())]];
            for _ in 0..work.range(1, 2) {
                set.push(ALL_KEYS[work.index(ALL_KEYS.len())]);
            }
            set
        }
    }
}

/// What a holder of a lease of `lease_s` does with it; a client that
/// renews (`renews`) sometimes plans work that only renewing keeps alive.
fn draw_plan(work: &mut Rng, lease_s: u64, renews: bool) -> Plan {
    let mut plan = Plan {
        writes: work.range(1, 4) as u8,
        write_gap_us: work.range(1_000, lease_s * 400_000),
        release: work.chance(800_000),
        renew: None,
    };
    if renews && work.chance(600_000) {
        // Work that outlasts its lease several times over: it holds on
        // only by renewing, and a stall must cost it the key.
        plan.writes = work.range(3, 10) as u8;
        plan.write_gap_us = work.range(lease_s * 200_000, lease_s * 600_000);
        let stall_after = work
            .chance(300_000)
            .then(|| work.below(u64::from(plan.writes)) as u8);
        plan.renew = Some(RenewPlan {
            progress_timeout_us: lease_s * 700_000,
            stall_after,
        });
    }
    plan
}
