//! Renewing a holder's lease (`W`, for clients that negotiated renewal):
//! when a renewal is due, whether the work still shows progress, and what
//! the renewal's answer does to the holder's deadline.

use ticketing_core::client::{
    ClientError, EXTEND_RETRY_WINDOW, ExtendOperation, ExtendStep, Extension,
};
use ticketing_core::time::Duration;
use ticketing_core::wire::ExtendStatus;

use super::{V3Ops, V3Outcomes};
use crate::checks::HistRefs;
use crate::clients::{ClientEv, ClientWorld, Holdings, OpState};
use crate::clock::{duration_us, instant, lease_min_us};
use crate::linear::LinOp;
use crate::run::Checker;

/// Lease renewals (a blanket extension of [`ClientWorld`]).
pub(crate) trait V3Renewals<'t>: ClientWorld<'t> {
    /// Schedules holder `id`'s next renewal a third of its lease after the
    /// last renewal (at the end of a lease valid before `valid_before_us`,
    /// less two thirds of it), as the CLI's `--renew` does.
    fn schedule_renewal(&mut self, client: usize, id: u64, valid_before_us: u64, lease_s: u8) {
        let lease_us = u64::from(lease_s) * 1_000_000;
        let due_local = valid_before_us.saturating_sub(lease_us * 2 / 3);
        let parts = self.parts();
        let proc = &parts.clients[client];
        let at = proc.clock.true_at(due_local).max(parts.now_us);
        let inc = proc.inc;
        self.schedule_client(at, client, inc, ClientEv::RenewStep(id));
    }

    /// Holder `id` renews its lease if its work showed life within its
    /// progress timeout and its deadline has not passed (a renewal never
    /// tries to win back a grant the holder already had to let go of).
    fn renew_step(&mut self, client: usize, id: u64) {
        let local = self.local_now(client);
        let parts = self.parts();
        let safety = parts.safety;
        let Some(OpState::Holding {
            grant,
            act_before_local_us,
            lease_s,
            renewal: Some(renewal),
            ..
        }) = parts.clients[client].ops.get_mut(&id)
        else {
            return;
        };
        let alive =
            local.saturating_sub(renewal.progress_local_us) <= renewal.plan.progress_timeout_us;
        if !safety || !alive || renewal.extending.is_some() || local >= *act_before_local_us {
            // No renewal: the lease runs out and the holder stops at its
            // deadline (the work step sees it).
            return;
        }
        let lease_s = *lease_s;
        let deadline = instant(
            local
                .saturating_add(duration_us(EXTEND_RETRY_WINDOW))
                .min(*act_before_local_us),
        );
        let Ok(op) = ExtendOperation::new(
            grant.keys.clone(),
            grant.token,
            Duration::from_secs(u64::from(lease_s)),
            deadline,
        ) else {
            return;
        };
        let ext_id = *parts.next_op;
        *parts.next_op += 1;
        renewal.extending = Some(ext_id);
        let lease_min_us = lease_min_us(u64::from(lease_s) * 1_000_000, parts.config.drift_ppm_max);
        let token = grant.token;
        let hist = parts.history.open(
            parts.now_us,
            op.keys(),
            LinOp::ExtendIndeterminate {
                token,
                lease_min_us,
            },
        );
        parts.clients[client].ops.insert(
            ext_id,
            OpState::Extending {
                op,
                attempt: None,
                holder: id,
                lease_s,
                any_indeterminate: false,
                hist,
            },
        );
        self.note(|| format!("client {client} op {ext_id}: renew token {token} of holder {id}"));
        self.v3_attempt(client, ext_id);
    }

    /// A renewal took a step: on an answer, its holder learns its new
    /// deadline (renewed), that its grant is gone (`N`: it stops now), or
    /// nothing (no definite answer: the old deadline stands, and the next
    /// renewal by the same token settles it).
    fn extend_step(&mut self, client: usize, id: u64, step: ExtendStep) {
        if let ExtendStep::RetryAt(at) = step {
            return self.schedule_retry(client, id, at.as_micros());
        }
        self.parts().clients[client].retries.remove(&id);
        let Some(OpState::Extending {
            op,
            holder,
            lease_s,
            any_indeterminate,
            hist,
            ..
        }) = self.parts().clients[client].ops.remove(&id)
        else {
            return;
        };
        self.note(|| format!("client {client} op {id}: {step:?}"));
        let token = op.token();
        let ExtendStep::Done(done) = step else {
            unreachable!("handled above")
        };
        let renewal = ExtendDone {
            id,
            token,
            lease_s,
            any_indeterminate,
        };
        let end = self.extend_done(client, &renewal, done, &hist);
        self.parts().clients[client].answered = None;
        self.renewal_ended(client, holder, &renewal, end);
    }

    /// What the history, the report and the deadline checker make of the
    /// end of renewal `renewal.id`, and what it tells its holder.
    fn extend_done(
        &mut self,
        client: usize,
        renewal: &ExtendDone,
        done: Result<Extension, ClientError>,
        hist: &HistRefs,
    ) -> RenewalEnd {
        let ExtendDone {
            id,
            token,
            lease_s,
            any_indeterminate,
        } = *renewal;
        let drift = self.parts().config.drift_ppm_max;
        match done {
            Ok(extension) => {
                self.parts().rec.report.extensions += 1;
                let lease_min_us = match extension.status {
                    ExtendStatus::Extended => lease_min_us(u64::from(lease_s) * 1_000_000, drift),
                    // Cut at the hold cap: the model learns nothing of how
                    // long the lease still runs.
                    _ => 0,
                };
                self.resolve_history(hist, |_| LinOp::Extended {
                    token,
                    lease_min_us,
                });
                self.check_deadline(client, token, extension.valid_before.as_micros(), lease_s);
                RenewalEnd::Renewed(extension.valid_before.as_micros())
            }
            Err(ClientError::Lost) => {
                self.parts().rec.report.extensions_refused += 1;
                if !any_indeterminate {
                    self.resolve_history(hist, |_| LinOp::NotFound { token });
                }
                RenewalEnd::Lost
            }
            Err(ClientError::Indeterminate) => RenewalEnd::Unknown,
            Err(ClientError::Timeout | ClientError::ClientCapacity) => {
                if !any_indeterminate {
                    self.forget_history(hist);
                }
                RenewalEnd::Unknown
            }
            Err(error) => {
                self.violation(
                    Checker::Client,
                    format!("client {client} op {id}: renewal failed with {error:?}"),
                );
                RenewalEnd::Unknown
            }
        }
    }

    /// Holder `holder` (if it still holds the renewed token) learns how
    /// its renewal ended: it stops now, moves its deadline, or keeps it;
    /// its next renewal is scheduled unless it stops.
    fn renewal_ended(&mut self, client: usize, holder: u64, renewal: &ExtendDone, end: RenewalEnd) {
        let (token, lease_s) = (renewal.token, renewal.lease_s);
        let local = self.local_now(client);
        let parts = self.parts();
        let drift = parts.config.drift_ppm_max;
        let Some(OpState::Holding {
            grant,
            act_before_local_us,
            renewal: Some(renewal),
            ..
        }) = parts.clients[client].ops.get_mut(&holder)
        else {
            return;
        };
        if grant.token != token {
            return;
        }
        renewal.extending = None;
        let mut next_from = grant.valid_before.as_micros();
        if let RenewalEnd::Lost = end {
            // The grant is gone: stop acting now.
            *act_before_local_us = (*act_before_local_us).min(local);
            let inc = parts.clients[client].inc;
            let now_us = parts.now_us;
            return self.schedule_client(now_us, client, inc, ClientEv::WorkStep(holder));
        }
        if let RenewalEnd::Renewed(valid_before_us) = end {
            *act_before_local_us =
                crate::clock::act_before_local_us(valid_before_us, lease_s, drift);
            grant.valid_before = instant(valid_before_us);
            next_from = valid_before_us;
        }
        // Without an answer the next renewal is due from the old end, or
        // at once if that is already past.
        self.schedule_renewal(client, holder, next_from.max(local), lease_s);
    }
}

impl<'t, W: ClientWorld<'t> + ?Sized> V3Renewals<'t> for W {}

/// The renewal that ended, as its end is judged.
pub(crate) struct ExtendDone {
    /// The renewal's op id.
    id: u64,
    token: u64,
    /// The lease asked for, seconds.
    lease_s: u8,
    /// An earlier attempt's answer was indeterminate.
    any_indeterminate: bool,
}

/// What the end of a renewal tells its holder.
pub(crate) enum RenewalEnd {
    /// Renewed: the grant's new end (local µs).
    Renewed(u64),
    /// `N`: the grant is gone.
    Lost,
    /// No definite answer: the old deadline stands.
    Unknown,
}
