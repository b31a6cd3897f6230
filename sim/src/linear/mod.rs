//! Linearizability of the client-observed history of one key against a
//! sequential model of the FIFO lock with leases and fencing tokens
//! (Wing & Gong search with memoisation, as in Porcupine).
//!
//! The model, per key: a holder (a known token, or an unknown one granted by
//! a request whose answer was lost), the lease start of that holder, and the
//! last token granted. Operations:
//! - a grant with token `t` is legal at point `p` if the key is free at `p`
//!   (no holder, or the holder's lease has run out by `p`, counted with the
//!   server's clock as fast as the drift bound allows) and `t` exceeds every
//!   earlier token;
//! - `R` for token `t` is legal if `t` is the holder (lazy expiry: an expired
//!   holder may still be released); `N` if it is not, or its lease has run
//!   out; `R` frees the key;
//! - an Indeterminate request may have had no effect, or its effect at any
//!   point after its invocation (also after the client gave up);
//! - a renewal answered "renewed" for token `t` is legal if `t` is the
//!   holder, and restarts its lease at that point; one answered `N` is a
//!   [`LinOp::NotFound`] (legal as for a release); one without a definite
//!   answer may have had no effect, or that of a renewal. The model's lease
//!   starts at the earliest point the history allows, so it cannot tell a
//!   renewal just before the server's expiry from one just after: a
//!   renewal of a grant that was handed on is what it catches;
//! - a server restart (fixed point) forgets the holder but not the tokens;
//! - an operator's force-release of `t` (fixed point) frees a key held by
//!   `t` (or by a holder whose token the clients never learned); it is not
//!   legal while the key is free or held by another known token.
//!
//! `T` and `B` replies constrain nothing here (the FIFO checker covers who
//! may be granted) and are left out.

use std::collections::HashSet;

/// What one operation of a key's history did, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinOp {
    /// Acquired with `token`; the server's lease is `lease_min_us` at least
    /// in true time.
    Granted {
        /// The token.
        token: u64,
        /// The shortest true duration the server's lease can have.
        lease_min_us: u64,
    },
    /// An acquire without a definite answer.
    AcquireIndeterminate {
        /// As for [`LinOp::Granted`].
        lease_min_us: u64,
    },
    /// `R`/`G` for `token`.
    Released {
        /// The token.
        token: u64,
    },
    /// `N` for `token`.
    NotFound {
        /// The token.
        token: u64,
    },
    /// A release without a definite answer.
    ReleaseIndeterminate {
        /// The token.
        token: u64,
    },
    /// A renewal of `token` answered "renewed" (or clipped at the hold
    /// cap): the lease runs `lease_min_us` at least from then.
    Extended {
        /// The token.
        token: u64,
        /// The shortest true duration of the renewed lease.
        lease_min_us: u64,
    },
    /// A renewal of `token` without a definite answer.
    ExtendIndeterminate {
        /// The token.
        token: u64,
        /// As for [`LinOp::Extended`].
        lease_min_us: u64,
    },
    /// The server restarted from nothing.
    Restart,
    /// The server's clock jumped forward: the current lease ends this much
    /// earlier in true time.
    LeaseCut {
        /// The jump.
        by_us: u64,
    },
    /// An operator force-released the grant of `token`: the key is free,
    /// and a later release of `token` must get `N`. Legal if `token` holds
    /// the key, or if the holder is one whose token no client learned (the
    /// operator read it from the server's state).
    ForceReleased {
        /// The revoked token.
        token: u64,
    },
    /// An operator's force-release of `token` without a definite answer
    /// (cluster: leadership was lost before it was seen applied): it may
    /// have freed the key at any point after its invocation, or not at all.
    ForceReleaseIndeterminate {
        /// The token named.
        token: u64,
    },
}

/// One operation with its real-time interval (true microseconds).
#[derive(Clone, Copy, Debug)]
pub struct LinEntry {
    /// When the client called (or the restart happened).
    pub invoke_us: u64,
    /// When the client saw the answer; `u64::MAX` if it never did or the
    /// answer was Indeterminate (the effect may come later).
    pub respond_us: u64,
    /// The operation and its answer.
    pub op: LinOp,
}

/// Result of checking one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinResult {
    /// A linearization exists.
    Ok,
    /// None exists.
    Violation,
    /// The search hit its state budget without an answer.
    Inconclusive,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Holder {
    Free,
    Known {
        token: u64,
        since_us: u64,
        lease_min_us: u64,
    },
    Unknown {
        since_us: u64,
        lease_min_us: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    holder: Holder,
    last_token: u64,
    /// The latest linearization point so far.
    at_us: u64,
}

impl Holder {
    /// The earliest point at which the key is free.
    fn free_from(&self) -> u64 {
        match *self {
            Holder::Free => 0,
            Holder::Known {
                since_us,
                lease_min_us,
                ..
            }
            | Holder::Unknown {
                since_us,
                lease_min_us,
            } => since_us.saturating_add(lease_min_us),
        }
    }

    /// Whether the holder is the known grant of `token`.
    fn is_known(&self, token: u64) -> bool {
        matches!(*self, Holder::Known { token: t, .. } if t == token)
    }

    /// The same holder with its lease `by_us` shorter (a server clock
    /// jump).
    fn cut_by(self, by_us: u64) -> Holder {
        match self {
            Holder::Known {
                token,
                since_us,
                lease_min_us,
            } => Holder::Known {
                token,
                since_us,
                lease_min_us: lease_min_us.saturating_sub(by_us),
            },
            Holder::Unknown {
                since_us,
                lease_min_us,
            } => Holder::Unknown {
                since_us,
                lease_min_us: lease_min_us.saturating_sub(by_us),
            },
            Holder::Free => Holder::Free,
        }
    }
}

/// Most histories need a few hundred states; this bounds a pathological one.
const STATE_BUDGET: usize = 200_000;

/// Longest history checked (the done-set is a `u128`).
pub const OPS_MAX: usize = 128;

/// Checks `history` (any order; at most [`OPS_MAX`] entries).
pub fn check(history: &[LinEntry]) -> LinResult {
    if history.len() > OPS_MAX {
        return LinResult::Inconclusive;
    }
    let mut ops: Vec<LinEntry> = history.to_vec();
    ops.sort_by_key(|entry| (entry.invoke_us, entry.respond_us));
    let mut search = Search {
        ops: &ops,
        seen: HashSet::new(),
        budget_hit: false,
    };
    let start = State {
        holder: Holder::Free,
        last_token: 0,
        at_us: 0,
    };
    if search.dfs(0, start) {
        LinResult::Ok
    } else if search.budget_hit {
        LinResult::Inconclusive
    } else {
        LinResult::Violation
    }
}

struct Search<'a> {
    ops: &'a [LinEntry],
    seen: HashSet<(u128, State)>,
    budget_hit: bool,
}

impl Search<'_> {
    fn dfs(&mut self, done: u128, state: State) -> bool {
        let all = if self.ops.len() == 128 {
            u128::MAX
        } else {
            (1u128 << self.ops.len()) - 1
        };
        if done == all {
            return true;
        }
        if self.seen.len() >= STATE_BUDGET {
            self.budget_hit = true;
            return false;
        }
        if !self.seen.insert((done, state)) {
            return false;
        }
        // Any pending op may go next if it was invoked before every pending
        // op's response (otherwise that op must come first).
        let mut horizon = u64::MAX;
        for (i, op) in self.ops.iter().enumerate() {
            if done & (1 << i) == 0 {
                horizon = horizon.min(op.respond_us);
            }
        }
        for i in 0..self.ops.len() {
            if done & (1 << i) != 0 {
                continue;
            }
            let op = self.ops[i];
            if op.invoke_us > horizon {
                break;
            }
            for next in apply(state, &op) {
                if self.dfs(done | (1 << i), next) {
                    return true;
                }
            }
            if self.budget_hit {
                return false;
            }
        }
        false
    }
}

/// The states `op` may lead to from `state` (none: illegal here).
fn apply(state: State, entry: &LinEntry) -> Vec<State> {
    let step = Step {
        state,
        earliest: state.at_us.max(entry.invoke_us),
        respond_us: entry.respond_us,
    };
    match entry.op {
        LinOp::Restart => step.restart(),
        LinOp::LeaseCut { by_us } => step.lease_cut(by_us),
        LinOp::Granted {
            token,
            lease_min_us,
        } => step.grant(token, lease_min_us),
        LinOp::AcquireIndeterminate { lease_min_us } => step.acquire_indeterminate(lease_min_us),
        LinOp::Released { token } => step.release(token),
        LinOp::NotFound { token } => step.not_found(token),
        LinOp::ForceReleased { token } => step.force_release(token, true),
        LinOp::ForceReleaseIndeterminate { token } => step.force_release(token, false),
        LinOp::Extended {
            token,
            lease_min_us,
        } => step.extend(token, lease_min_us, true),
        LinOp::ExtendIndeterminate {
            token,
            lease_min_us,
        } => step.extend(token, lease_min_us, false),
        LinOp::ReleaseIndeterminate { token } => step.release_indeterminate(token),
    }
}

/// One operation taking effect from `state`: no earlier than `earliest`
/// (the state's latest point, or the operation's invocation if later) and
/// no later than its response. Each method gives the states the operation
/// may lead to, in the order the search tries them.
struct Step {
    state: State,
    earliest: u64,
    respond_us: u64,
}

impl Step {
    /// `point`, if the operation may still take effect there (by its
    /// response).
    fn at(&self, point: u64) -> Option<u64> {
        (point <= self.respond_us).then_some(point)
    }

    /// The state with `holder` from point `p`, its other fields unchanged.
    fn with_holder(&self, holder: Holder, p: u64) -> State {
        State {
            holder,
            at_us: p,
            ..self.state
        }
    }

    /// A server restart forgets the holder (not the tokens).
    fn restart(&self) -> Vec<State> {
        self.at(self.earliest)
            .map(|p| self.with_holder(Holder::Free, p))
            .into_iter()
            .collect()
    }

    /// A clock jump on the server ends the current lease `by_us` earlier.
    fn lease_cut(&self, by_us: u64) -> Vec<State> {
        self.at(self.earliest)
            .map(|p| self.with_holder(self.state.holder.cut_by(by_us), p))
            .into_iter()
            .collect()
    }

    /// A grant of `token`: once the key is free, and above every earlier
    /// token.
    fn grant(&self, token: u64, lease_min_us: u64) -> Vec<State> {
        if token <= self.state.last_token {
            return Vec::new();
        }
        self.at(self.earliest.max(self.state.holder.free_from()))
            .map(|p| State {
                holder: Holder::Known {
                    token,
                    since_us: p,
                    lease_min_us,
                },
                last_token: token,
                at_us: p,
            })
            .into_iter()
            .collect()
    }

    /// An acquire without an answer: no effect, or a grant (once the key
    /// is free) whose token no client learned.
    fn acquire_indeterminate(&self, lease_min_us: u64) -> Vec<State> {
        let mut out = vec![self.state];
        if let Some(p) = self.at(self.earliest.max(self.state.holder.free_from())) {
            let holder = Holder::Unknown {
                since_us: p,
                lease_min_us,
            };
            out.push(self.with_holder(holder, p));
        }
        out
    }

    /// `R` for `token`: legal if it holds the key (lazy expiry: even past
    /// its lease); frees the key.
    fn release(&self, token: u64) -> Vec<State> {
        if !self.state.holder.is_known(token) {
            return Vec::new();
        }
        self.at(self.earliest)
            .map(|p| self.with_holder(Holder::Free, p))
            .into_iter()
            .collect()
    }

    /// `N` for `token`: legal where it does not hold the key, or once its
    /// lease ran out; changes nothing.
    fn not_found(&self, token: u64) -> Vec<State> {
        let point = if self.state.holder.is_known(token) {
            self.earliest.max(self.state.holder.free_from())
        } else {
            self.earliest
        };
        self.at(point)
            .map(|p| State {
                at_us: p,
                ..self.state
            })
            .into_iter()
            .collect()
    }

    /// An operator's force-release of `token` (answered if `definite`,
    /// else perhaps without effect): frees a key held by `token`, or by a
    /// holder whose token no client learned.
    fn force_release(&self, token: u64, definite: bool) -> Vec<State> {
        let named = match self.state.holder {
            Holder::Known { token: t, .. } => t == token,
            Holder::Unknown { .. } => true,
            Holder::Free => false,
        };
        let mut out = Vec::new();
        if !definite {
            out.push(self.state);
        }
        if named && let Some(p) = self.at(self.earliest) {
            out.push(self.with_holder(Holder::Free, p));
        }
        out
    }

    /// A renewal of `token` (answered "renewed" if `definite`, else perhaps
    /// without effect): legal if `token` holds the key, whose lease then
    /// restarts.
    fn extend(&self, token: u64, lease_min_us: u64, definite: bool) -> Vec<State> {
        let mut out = Vec::new();
        if !definite {
            out.push(self.state);
        }
        if self.state.holder.is_known(token)
            && let Some(p) = self.at(self.earliest)
        {
            let holder = Holder::Known {
                token,
                since_us: p,
                lease_min_us,
            };
            out.push(self.with_holder(holder, p));
        }
        out
    }

    /// A release of `token` without an answer: no effect, or it freed the
    /// key `token` holds (its effect may come after the client gave up, so
    /// its response bounds nothing).
    fn release_indeterminate(&self, token: u64) -> Vec<State> {
        let mut out = vec![self.state];
        if self.state.holder.is_known(token) {
            out.push(self.with_holder(Holder::Free, self.earliest));
        }
        out
    }
}

#[cfg(test)]
mod tests;
