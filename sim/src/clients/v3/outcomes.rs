//! What the answers to v3 attempts lead to: an acquire granted (a
//! holding starts), compensated, failed or indeterminate; a release done
//! or not; a late grant's compensation; and what the history records of
//! each.

use ticketing_core::client::{
    AcquireStep, ClientError, Compensation, Outcome, ReleaseOperation, ReleaseOutcome, ReleaseStep,
};

use super::{V3Ops, V3Renewals};
use crate::clients::{ClientWorld, Holdings, OpState, ReleaseFailure};
use crate::clock::{duration_us, instant, lease_min_us};
use crate::linear::LinOp;
use crate::run::Checker;

/// The outcomes of v3 attempts (a blanket extension of [`ClientWorld`]).
pub(crate) trait V3Outcomes<'t>: ClientWorld<'t> {
    /// A session reported the outcome of `rid` on `conn`: the operation
    /// whose attempt it was takes its next step.
    fn attempt_outcome(&mut self, client: usize, conn: u64, rid: u64, outcome: Outcome) {
        let parts = self.parts();
        let found = parts.clients[client]
            .ops
            .iter()
            .find_map(|(&id, op)| match op {
                OpState::Acquiring { attempt, .. }
                | OpState::Releasing { attempt, .. }
                | OpState::Extending { attempt, .. }
                    if *attempt == Some((conn, rid)) =>
                {
                    Some(id)
                }
                _ => None,
            });
        if let Some(op) = found {
            self.op_outcome(client, op, outcome);
        }
    }

    fn op_outcome(&mut self, client: usize, id: u64, outcome: Outcome) {
        let local = self.local_now(client);
        match self.parts().clients[client].ops.get_mut(&id) {
            Some(OpState::Acquiring { op, attempt, .. }) => {
                let answered = attempt.take();
                let step = op.on_outcome(instant(local), outcome);
                self.parts().clients[client].answered = answered;
                self.acquire_step(client, id, step);
            }
            Some(OpState::Extending {
                op,
                attempt,
                any_indeterminate,
                ..
            }) => {
                let answered = attempt.take();
                if outcome == Outcome::Indeterminate {
                    *any_indeterminate = true;
                }
                let step = op.on_outcome(instant(local), outcome);
                self.parts().clients[client].answered = answered;
                self.extend_step(client, id, step);
            }
            Some(OpState::Releasing {
                op,
                attempt,
                any_indeterminate,
                ..
            }) => {
                *attempt = None;
                if outcome == Outcome::Indeterminate {
                    *any_indeterminate = true;
                }
                let step = op.on_outcome(instant(local), outcome);
                self.release_step(client, id, step);
            }
            _ => {}
        }
    }

    /// A session asks to release a grant that arrived after its acquire
    /// ended Indeterminate: that acquire was granted after all.
    fn compensate(&mut self, client: usize, compensation: Compensation) {
        self.note(|| format!("client {client} compensates {compensation:?}"));
        let parts = self.parts();
        let proc = &mut parts.clients[client];
        let position = proc
            .recent_indeterminate
            .iter()
            // The newest: a late grant's Indeterminate outcome comes right
            // before its compensation.
            .rposition(|(keys, _)| *keys == compensation.keys);
        if let Some(position) = position {
            let (_, hist) = proc.recent_indeterminate.remove(position);
            parts.history.resolve(parts.now_us, &hist, |op| match op {
                LinOp::AcquireIndeterminate { lease_min_us } => LinOp::Granted {
                    token: compensation.token,
                    lease_min_us,
                },
                other => other,
            });
        } else {
            self.violation(
                Checker::Client,
                format!("client {client}: compensation {compensation:?} for no known acquire"),
            );
        }
        let local = self.local_now(client);
        let op = ReleaseOperation::new(instant(local), compensation.keys, compensation.token);
        self.start_release(client, op);
    }

    fn acquire_step(&mut self, client: usize, id: u64, step: AcquireStep) {
        if let AcquireStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let parts = self.parts();
        let drift = parts.config.drift_ppm_max;
        let Some(OpState::Acquiring { op, plan, hist, .. }) = parts.clients[client].ops.remove(&id)
        else {
            return;
        };
        let lease_min_us = lease_min_us(duration_us(op.params().lease()), drift);
        self.note(|| format!("client {client} op {id}: {step:?}"));
        match step {
            AcquireStep::Granted(grant) => {
                self.parts().rec.report.grants += 1;
                self.on_grant(client, grant.token, true);
                let token = grant.token;
                self.resolve_history(&hist, |_| LinOp::Granted {
                    token,
                    lease_min_us,
                });
                self.start_holding(client, id, grant, plan, op.params().lease_s());
            }
            AcquireStep::Compensate { grant, .. } => {
                let token = grant.token;
                self.on_grant(client, token, false);
                self.resolve_history(&hist, |_| LinOp::Granted {
                    token,
                    lease_min_us,
                });
                let local = self.local_now(client);
                let release = ReleaseOperation::new(instant(local), grant.keys, grant.token);
                self.start_release(client, release);
            }
            AcquireStep::Failed(ClientError::Timeout | ClientError::Busy) => {
                self.forget_history(&hist);
            }
            AcquireStep::Failed(ClientError::Indeterminate) => {
                self.remember_indeterminate(client, op.keys().clone(), hist);
            }
            AcquireStep::Failed(ClientError::ClientCapacity) => self.forget_history(&hist),
            AcquireStep::Failed(error) => {
                self.violation(
                    Checker::Client,
                    format!("client {client} op {id}: acquire failed with {error:?}"),
                );
            }
            AcquireStep::RetryAt(_) => unreachable!("handled above"),
        }
        self.after_op_step(client);
    }

    fn release_step(&mut self, client: usize, id: u64, step: ReleaseStep) {
        if let ReleaseStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Releasing {
            op,
            any_indeterminate,
            hist,
            ..
        }) = self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        self.note(|| format!("client {client} op {id}: {step:?}"));
        let token = op.token();
        match step {
            ReleaseStep::Done(Ok(ReleaseOutcome::Released)) => {
                self.resolve_history(&hist, |_| LinOp::Released { token });
            }
            ReleaseStep::Done(Ok(ReleaseOutcome::AlreadyGoneOrNotCurrent)) => {
                // Unless an earlier attempt may have released it.
                if !any_indeterminate {
                    self.resolve_history(&hist, |_| LinOp::NotFound { token });
                }
            }
            ReleaseStep::Done(Err(error)) => match self.release_failure(error) {
                ReleaseFailure::LeaveOpen => {}
                ReleaseFailure::Forget => {
                    if !any_indeterminate {
                        self.forget_history(&hist);
                    }
                }
                ReleaseFailure::Unexpected(what) => {
                    self.violation(Checker::Client, format!("client {client} op {id}: {what}"));
                }
            },
            ReleaseStep::RetryAt(_) => unreachable!("handled above"),
        }
    }

    fn resolve_history(&mut self, hist: &[(usize, usize)], map: impl Fn(LinOp) -> LinOp) {
        let parts = self.parts();
        parts.history.resolve(parts.now_us, hist, map);
    }

    fn forget_history(&mut self, hist: &[(usize, usize)]) {
        self.parts().history.forget(hist);
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> V3Outcomes<'t> for W {}
