//! What the checkers see of the bytes between clients and nodes: replies, requests and lease expiry.

use super::*;

impl<'t> ClusterWorld<'t> {
    /// Oracle: the replies in bytes a node took for a client pipe.
    pub(super) fn observe_replies(&mut self, slot: u8, pipe_id: u64, out: &[u8]) {
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        let (replies, bad) = pipe.oracle.replies(out);
        if let Some(error) = bad {
            self.violation(
                Checker::Replies,
                format!("node wrote a bad frame on pipe {pipe_id}: {error:?}"),
            );
        }
        for (reply, end_offset) in replies {
            let Some(rid) = reply.rid() else {
                continue; // `L` notices
            };
            let renewal = self.renewals.remove(&(pipe_id, rid));
            let Some(acquire) = self.pending.remove(&(pipe_id, rid)) else {
                self.violation(
                    Checker::Replies,
                    format!("reply {reply:?} on pipe {pipe_id} answers no request in flight"),
                );
                continue;
            };
            if !reply_fits_request(&reply, acquire, renewal) {
                self.violation(
                    Checker::Replies,
                    format!("reply {reply:?} on pipe {pipe_id} does not fit its request"),
                );
            }
            let answered = match (&reply, renewal) {
                (Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. }, _) => {
                    Some(*token)
                }
                (Reply::Extended { .. }, renewed) => renewed,
                _ => None,
            };
            if let Some(token) = answered {
                self.remember_expiry(slot, pipe_id, rid, token);
            }
            if let Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } = reply {
                if !self.replied.insert(token) {
                    self.violation(
                        Checker::Tokens,
                        format!("token {token} granted in two replies"),
                    );
                }
                let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
                pipe.unflushed_grants.push((token, end_offset));
            }
        }
    }

    /// Deadline checker's record: when grant `token`, just granted or
    /// renewed in the answer to `rid` on `pipe_id`, expires on the node in
    /// `slot` that answered (its own apply time plus the lease), in true
    /// time.
    pub(super) fn remember_expiry(&mut self, slot: u8, pipe_id: u64, rid: u64, token: u64) {
        let proc = &self.nodes[usize::from(slot)];
        let Some(node) = proc.node.as_ref() else {
            return;
        };
        let Some(holding) = node.lock_state().grant(token) else {
            return;
        };
        let expiry_us = proc.clock.true_at(holding.deadline.as_micros());
        if self.answered.len() >= ANSWERED_MAX {
            self.answered.pop_first();
        }
        self.answered
            .insert((pipe_id, rid), (expiry_us, self.lease_era));
    }

    /// Oracle: requests a node receives on a client pipe.
    pub(super) fn observe_requests(&mut self, pipe_id: u64, bytes: &[u8]) {
        let pipe = self.pipes.get_mut(&pipe_id).expect("caller checked");
        for request in pipe.oracle.requests(bytes) {
            self.rec.report.requests += 1;
            let (rid, acquire) = match &request {
                Request::Acquire(acquire) => (acquire.rid, true),
                Request::Release(release) => {
                    self.release_requested.insert(release.token);
                    (release.rid, false)
                }
                Request::Negotiate(req) => (req.rid, false),
                Request::Extend(req) => {
                    self.renewals.insert((pipe_id, req.rid), req.token);
                    (req.rid, false)
                }
                Request::AcquireCapped(req) => (req.rid, true),
                Request::AcquirePermits(req) => (req.rid, true),
                Request::Observe(req) => (req.rid, false),
                Request::AcquireShared(req) => (req.rid, true),
                Request::Downgrade(req) => (req.rid, false),
            };
            if self.pending.insert((pipe_id, rid), acquire).is_some() {
                self.violation(
                    Checker::Client,
                    format!("pipe {pipe_id} reused rid {rid} while in flight"),
                );
            }
        }
    }
}

/// Whether `reply` may answer the request it names: an acquire (`acquire`)
/// or not, a renewal of a token (`renewal`) or not. Cluster nodes serve
/// neither semaphores nor observing, and `P` has no rid.
fn reply_fits_request(reply: &Reply, acquire: bool, renewal: Option<u64>) -> bool {
    match reply {
        Reply::Acquired { .. }
        | Reply::AcquiredSet { .. }
        | Reply::TimedOut { .. }
        | Reply::Busy { .. } => acquire,
        Reply::Released { .. } | Reply::ReleasedSet { .. } | Reply::NotFound { .. } => !acquire,
        Reply::Indeterminate { .. } | Reply::Moved { .. } => true,
        Reply::Error { code, .. } => {
            matches!(code, ErrorCode::NotActive | ErrorCode::NoLeader)
                || (!acquire && *code == ErrorCode::GroupMismatch)
        }
        Reply::Negotiated { .. } => !acquire && renewal.is_none(),
        Reply::Extended { .. } => renewal.is_some(),
        // Cluster nodes do not serve semaphores, nor observing.
        Reply::Permits { .. } | Reply::CapacityMismatch { .. } => false,
        Reply::Observed { .. } => false,
        // Nor shared locks.
        Reply::Downgraded { .. } => false,
        // `P` has no rid and never gets here.
        Reply::Push { .. } => false,
        Reply::Leader { .. } => false,
    }
}
