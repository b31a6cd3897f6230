//! Checkers on the server's side: replies against the lock table, and the table's own invariants.

use ticketing_core::wire::ExtendStatus;

use super::*;

impl<'t> World<'t> {
    /// Deadline checker's record: when grant `token` of `keys`, just
    /// granted or renewed in the answer to `rid` on `conn`, expires on the
    /// server (its earliest key), in true time.
    pub(super) fn remember_expiry(&mut self, conn_id: u64, rid: u64, token: u64, keys: &[usize]) {
        let expiry_local_us = keys
            .iter()
            .filter_map(|&key| self.holder(key))
            .filter(|&(held, _)| held == token)
            .map(|(_, deadline)| deadline)
            .min();
        let Some(expiry_local_us) = expiry_local_us else {
            return;
        };
        if self.answered.len() >= ANSWERED_MAX {
            self.answered.pop_first();
        }
        let expiry_us = self.server_clock.true_at(expiry_local_us);
        self.answered
            .insert((conn_id, rid), (expiry_us, self.lease_era));
    }

    pub(super) fn holder(&self, key: usize) -> Option<(u64, u64)> {
        let proc = self.server.as_ref()?;
        proc.server
            .lock_table()
            .holder(ALL_KEYS[key].as_bytes())
            .map(|(token, deadline)| (token, deadline.as_micros()))
    }

    /// Replies checker, token checker and FIFO checker, fed with every reply
    /// the server produced in one step.
    pub(super) fn check_replies(
        &mut self,
        replies: Vec<(u64, Reply, u64)>,
        fresh: Vec<(u64, u64)>,
    ) {
        let mut grants = Vec::new();
        for (conn_id, reply, end_offset) in replies {
            if let Some(grant) = self.match_reply(conn_id, reply, end_offset) {
                grants.push(grant);
            }
        }
        // Checked in token order, as the server issued them.
        grants.sort();
        for grant in grants {
            self.check_grant(grant);
        }
        self.check_unanswered(fresh);
    }

    /// Matches one reply on `conn_id` to the request in flight it answers:
    /// it must fit that request, which it ends; a grant is returned for
    /// [`World::check_grant`], its request still pending.
    fn match_reply(&mut self, conn_id: u64, reply: Reply, end_offset: u64) -> Option<StepGrant> {
        let Some(rid) = reply.rid() else {
            // Pushes go to connections that negotiated them (the
            // session drops any other as a protocol error).
            if !matches!(reply, Reply::Push { .. }) {
                self.violation(Checker::Replies, format!("single server sent {reply:?}"));
            }
            return None;
        };
        let Some(req) = self.pending.get(&(conn_id, rid)) else {
            self.violation(
                Checker::Replies,
                format!("reply {reply:?} on conn {conn_id} answers no request in flight"),
            );
            return None;
        };
        match reply {
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } if req.acquire => {
                return Some(StepGrant {
                    token,
                    conn_id,
                    rid,
                    end_offset,
                });
            }
            Reply::TimedOut { .. } | Reply::Busy { .. } if req.acquire => {
                self.pending.remove(&(conn_id, rid));
            }
            Reply::Released { .. } | Reply::ReleasedSet { .. }
                if !req.acquire && req.other == Other::Lock =>
            {
                self.released_tokens.insert(req.token);
                self.pending.remove(&(conn_id, rid));
            }
            Reply::Negotiated { .. } if req.other == Other::Negotiate => {
                self.pending.remove(&(conn_id, rid));
            }
            Reply::Extended { status, .. } if matches!(req.other, Other::Extend { .. }) => {
                self.check_renewal_reply(conn_id, rid, status);
            }
            Reply::NotFound { .. } if !req.acquire && req.other != Other::Negotiate => {
                self.pending.remove(&(conn_id, rid));
            }
            other => {
                self.violation(
                    Checker::Replies,
                    format!("reply {other:?} does not fit request {req:?}"),
                );
                self.pending.remove(&(conn_id, rid));
            }
        }
        None
    }

    /// A renewal answered `status` (renewed or clipped): its token must
    /// have been the current grant of its keys when it arrived; the
    /// deadline checker records the new expiry.
    fn check_renewal_reply(&mut self, conn_id: u64, rid: u64, status: ExtendStatus) {
        let req = self.pending.remove(&(conn_id, rid)).expect("found above");
        if req.other == (Other::Extend { current: false }) {
            let detail = format!(
                "renewal of token {} on conn {conn_id} rid {rid} answered {status:?}, but it was not the current grant of {:?} when it arrived",
                req.token,
                req.keys.iter().map(|&k| ALL_KEYS[k]).collect::<Vec<_>>()
            );
            self.violation(Checker::Extensions, detail);
        }
        self.remember_expiry(conn_id, rid, req.token, &req.keys);
    }

    /// One grant of a step, which ends its request: its token is above
    /// every earlier one, and nobody still waiting on its keys arrived
    /// earlier (FIFO). Records it for the deadline and lock checks and as
    /// not yet taken by the driver.
    fn check_grant(&mut self, grant: StepGrant) {
        let StepGrant {
            token,
            conn_id,
            rid,
            end_offset,
        } = grant;
        let req = self.pending.remove(&(conn_id, rid)).expect("found above");
        if token <= self.token_seen_max || !self.tokens_seen.insert(token) {
            self.violation(
                Checker::Tokens,
                format!(
                    "grant {token} to conn {conn_id} rid {rid} is not above every earlier token (max {})",
                    self.token_seen_max
                ),
            );
        }
        self.token_seen_max = self.token_seen_max.max(token);
        // FIFO: nobody still waiting on these keys arrived earlier.
        let earlier = self.pending.iter().find(|(_, other)| {
            other.acquire
                && other.wait_s > 0
                && other.seq < req.seq
                && other.keys.iter().any(|key| req.keys.contains(key))
        });
        if let Some((&(other_conn, other_rid), other)) = earlier {
            let detail = format!(
                "grant {token} of {:?} to conn {conn_id} rid {rid} (arrival {}) while conn {other_conn} rid {other_rid} (arrival {}) still waits",
                req.keys.iter().map(|&k| ALL_KEYS[k]).collect::<Vec<_>>(),
                req.seq,
                other.seq
            );
            self.violation(Checker::Fifo, detail);
        }
        self.remember_expiry(conn_id, rid, token, &req.keys);
        self.token_groups.insert(token, req.keys.clone());
        self.token_eras.insert(token, self.lease_era);
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.untaken_grants.push((token, req.keys, end_offset));
        }
    }

    /// Requests that should have had their answer by now: a release or an
    /// immediate acquire among this step's `fresh` ones, or any waiter past
    /// its wait.
    fn check_unanswered(&mut self, fresh: Vec<(u64, u64)>) {
        // A release or an immediate acquire is answered in the same step.
        for key in fresh {
            if let Some(req) = self.pending.get(&key)
                && (!req.acquire || req.wait_s == 0)
            {
                let detail = format!("request {key:?} {req:?} got no immediate reply");
                self.violation(Checker::Replies, detail);
            }
        }
        // A queued waiter is answered by its wait's end.
        let local = self.server_now();
        let lost = self.pending.iter().find(|(_, req)| {
            req.acquire && local > req.arrival_local_us + u64::from(req.wait_s) * 1_000_000 + 1_000
        });
        if let Some((key, req)) = lost {
            let detail = format!("waiter {key:?} {req:?} outlived its wait without a reply");
            self.violation(Checker::Replies, detail);
        }
    }

    /// Server-state checker: at most one live holder per key (a key only
    /// changes hands once its client-visible holder released it, lost it as a
    /// ghost, or ran out of lease), and every key of a live set grant is held
    /// by that grant.
    pub(super) fn check_server_state(&mut self) {
        let local = self.server_now();
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let holder = self.holder(key);
            let previous = self.shadow[key];
            if let (Some((old, old_deadline)), Some((new, _))) = (previous, holder)
                && old != new
            {
                let free = old_deadline <= local
                    || self.released_tokens.contains(&old)
                    || self.ghost_tokens.contains(&old)
                    || !self.tokens_seen.contains(&old);
                if !free {
                    self.violation(
                        Checker::ServerState,
                        format!(
                            "{name} passed from {old} (lease to {old_deadline}, now {local}) to {new}: two live holders"
                        ),
                    );
                }
            }
            self.shadow[key] = holder;
            if let Some((token, deadline)) = holder
                && deadline > local
                && let Some(group) = self.token_groups.get(&token)
            {
                let split = group
                    .iter()
                    .find(|&&other| self.holder(other).is_none_or(|(t, _)| t != token));
                if let Some(&other) = split {
                    self.violation(
                        Checker::ServerState,
                        format!(
                            "live set grant {token} holds {name} but not {}",
                            ALL_KEYS[other]
                        ),
                    );
                }
            }
        }
    }
}

/// A grant among the replies of one server step: its token, the
/// connection and rid it answers, and the stream offset just past its frame.
/// Ordered by token first: grants are checked in the order they were issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct StepGrant {
    token: u64,
    conn_id: u64,
    rid: u64,
    end_offset: u64,
}
