//! Shared locks on the leader (`Y` and `D`, docs/protocol.md §8.7): the
//! mode rules of the leader's queues, and the downgrade.
//!
//! A waiter carries a mode per key. The queues stay one FIFO per key for
//! both modes (the [`LeaderKeys`] of exclusive locks), and the rule of a
//! key is single mode's ([`mode_admits`]), asked twice: of the applied
//! state (who holds the key) and of the Grants in flight (what will hold
//! it once they apply, `reserved` for an exclusive one, `shared_reserved`
//! counting shared ones). So:
//!
//! - a newcomer is granted at once when nobody waits on its keys and both
//!   admit its modes (a shared one joins a batch held or in flight);
//! - a queue head is granted when both admit it; once a shared head's Grant
//!   is proposed its keys are looked at again, so the shared requests
//!   queued directly behind it are granted together with it (each its own
//!   Grant and token); an exclusive head stops that, and a shared request
//!   behind it waits;
//! - an applied `Downgrade` makes its keys held shared, so the shared heads
//!   behind it may join, while an exclusive head still waits: the
//!   downgrader holds the key.
//!
//! A key "releasing" (its only holder's Release is in flight, see
//! [`ClusterNode::mark_releasing`]) counts as free for its queue head,
//! whose Grant follows the Release in the log; a newcomer queues behind it.

use crate::cluster::command::Command;
use crate::cluster::state::ReplicatedLocks;
use crate::conn::ConnId;
use crate::conn::client::{Answer, ReplyTo};
use crate::queue_rule::{self, HeldMode, mode_admits};
use crate::time::Instant;
use crate::wire::{Key, KeyGroup};

use super::ClusterNode;
use super::apply::PendingKind;
use super::keys::{KeyQueue, LeaderKeys};
use super::leadership::{Waiter, leader_reply};

/// What the Grants in flight on a key will hold once they apply.
fn in_flight(queue: Option<&KeyQueue>) -> HeldMode {
    match queue {
        Some(queue) if queue.reserved => HeldMode::Exclusive,
        Some(queue) if queue.shared_reserved > 0 => HeldMode::Shared,
        _ => HeldMode::Free,
    }
}

/// Whether the head of `key`'s queue (`queue`, if the key has one) may
/// take it in the given mode now.
fn head_takes(state: &ReplicatedLocks, queue: Option<&KeyQueue>, key: &Key, shared: bool) -> bool {
    let held = match queue {
        // Its only holder's Release is ahead of this Grant in the log.
        Some(queue) if queue.releasing => HeldMode::Free,
        _ => state.held_mode(key),
    };
    mode_admits(held, shared) && mode_admits(in_flight(queue), shared)
}

/// Whether a newcomer wanting `keys` in `modes` is granted at once: nobody
/// waits on any of its keys (nobody is passed), none is releasing (its
/// queue head goes first) and each key takes it in its mode.
pub(super) fn newcomer_takes(
    state: &ReplicatedLocks,
    leader_keys: &LeaderKeys,
    keys: &KeyGroup,
    modes: u16,
) -> bool {
    keys.keys().iter().enumerate().all(|(index, key)| {
        let shared = is_shared(modes, index);
        // The applied state first: a key held against this mode (the
        // common contended case) needs no look at its queue.
        mode_admits(state.held_mode(key), shared) && {
            let queue = leader_keys.get(key);
            queue.is_none_or(|q| q.waiters.is_empty() && !q.releasing)
                && mode_admits(in_flight(queue), shared)
        }
    })
}

/// Whether the waiter `seq` (`waiter`), heading the queue of `key`, may be
/// granted: for a key set, it heads every key's queue and each key takes
/// it in its mode (the FIFO key-set rule of single mode).
pub(super) fn head_grantable(
    state: &ReplicatedLocks,
    leader_keys: &LeaderKeys,
    (seq, waiter): (u64, &Waiter),
    key: &Key,
) -> bool {
    if waiter.keys.len() == 1 {
        // It waits on this key alone, and heads its queue.
        return head_takes(state, leader_keys.get(key), key, waiter.wants_shared(0));
    }
    queue_rule::key_set_grantable(
        seq,
        waiter.keys.keys().iter().enumerate(),
        |(_, k)| leader_keys.get(k).and_then(KeyQueue::head),
        |(index, k)| head_takes(state, leader_keys.get(k), k, waiter.wants_shared(*index)),
    )
}

/// Whether bit `index` of `modes` asks for key `index` shared.
fn is_shared(modes: u16, index: usize) -> bool {
    crate::lock::KeyModes::from_bits(modes).is_shared(index)
}

impl Waiter {
    /// Whether it wants key `index` of its group shared.
    pub(super) fn wants_shared(&self, index: usize) -> bool {
        is_shared(self.options.shared_modes, index)
    }
}

impl ClusterNode {
    /// A Grant for `waiter` was proposed: its keys are reserved in their
    /// modes, and those it takes shared are looked at again, so that the
    /// shared requests queued directly behind it join it.
    pub(super) fn note_grant_proposed(&mut self, waiter: &Waiter) {
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        for (index, key) in waiter.keys.keys().iter().enumerate() {
            let shared = waiter.wants_shared(index);
            let queued = leadership.keys.update(key, |q| {
                q.reserve(shared);
                !q.waiters.is_empty()
            });
            if shared && queued {
                leadership.dirty.push(key.clone());
            }
        }
    }

    /// The Grant for `waiter` applied (`granted`, or refused): its keys
    /// are no longer reserved by it; refused, they may be free.
    pub(super) fn note_grant_applied(&mut self, waiter: &Waiter, granted: bool) {
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        for (index, key) in waiter.keys.keys().iter().enumerate() {
            let shared = waiter.wants_shared(index);
            leadership
                .keys
                .update_existing(key, |q| q.unreserve(shared));
            // Granted, the keys are held until a Release, Expire or
            // force-release applies (which dirties them).
            if !granted {
                leadership.dirty.push(key.clone());
            }
        }
    }

    /// A Release of grant `token` on exactly its `keys` is proposed: each
    /// key the grant holds alone (an exclusive hold or the last sharer,
    /// no shared Grant in flight to join it) is releasing, its queue head
    /// may be granted behind it; the others are looked at once it applies.
    pub(super) fn mark_releasing(&mut self, token: u64, keys: &KeyGroup) {
        let Some(leadership) = self.leadership.as_mut() else {
            return;
        };
        for key in keys.keys() {
            let sharers = self.state.sharers_of(key);
            let alone = sharers.is_empty() || sharers == [token];
            let joined = leadership
                .keys
                .get(key)
                .is_some_and(|q| q.shared_reserved > 0);
            if alone && !joined {
                leadership.keys.update(key, |q| q.releasing = true);
                leadership.dirty.push(key.clone());
            }
        }
    }

    /// A `D`: `N` at once when `token` is not a running grant in the
    /// applied state (a token never becomes current again) or its lease
    /// ended on this leader's clock (its `Expire` is or will be proposed);
    /// else a `Downgrade` is proposed and answered once applied, on every
    /// node alike.
    pub(super) fn handle_downgrade(
        &mut self,
        now: Instant,
        conn_id: ConnId,
        (token, keys): (u64, KeyGroup),
        reply_to: ReplyTo,
    ) {
        let running = self.state.grant(token).is_some_and(|h| h.deadline > now);
        let Some(leadership) = self.leadership.as_ref() else {
            self.answer(conn_id, &reply_to, leader_reply(self.raft.leader()));
            return;
        };
        if !running || leadership.expiring.contains(&token) {
            self.answer(conn_id, &reply_to, Answer::NotFound);
            return;
        }
        let command = Command::Downgrade { token, keys };
        self.propose_answered(now, &command, (conn_id, reply_to), |conn, reply_to| {
            PendingKind::Downgrade { conn, reply_to }
        });
    }
}
