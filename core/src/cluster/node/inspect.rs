//! Inspection and force-release for the admin layer (see [`crate::inspect`]):
//! only a caught-up leader answers, from the applied state and its
//! leader-local waiter queues; a force-release is proposed and answered
//! once applied.

use std::collections::VecDeque;

use crate::cluster::command::Command;
use crate::conn::ConnId;
use crate::inspect::{
    AdminRequestId, ConnView, ForceRelease, ForceReleaseOutcome, HolderView, LISTED_WAITERS_MAX,
    LISTING_LIMIT_MAX, LISTING_SLOTS_PER_CALL_MAX, ListingCursor, LockListing, LockView,
    MemberView, NotLeader, WAITERS_PER_LISTED_LOCK_MAX, WaiterView,
};
use crate::machine::Machine;
use crate::raft::{NodeId, ProposeError};
use crate::time::{Duration, Instant};
use crate::wire::Key;

use super::ClusterNode;
use super::apply::{Pending, PendingKind};
use super::connections::ConnKind;

/// Most answers to force-releases queued for the driver; it drains them
/// after every input, so the bound is only reached by a driver that does
/// not (answers beyond it are dropped and counted).
pub const ADMIN_REPLIES_MAX: usize = 1_024;

impl ClusterNode {
    /// Every member of the configuration (and this node, if it is not one
    /// yet), by slot, as this node sees it at `now`: the leader knows each
    /// one's lag and when it last heard from it; another node knows the
    /// configuration and the leader.
    pub(super) fn member_views(&self, now: Instant) -> Vec<MemberView> {
        let config = self.raft.config();
        let id = self.config.id;
        let leader = self.raft.leader();
        let leading = self.raft.is_leader();
        let last_index = self.raft.last_index();
        let contact_window = self.config.raft.election_timeout_min;
        let mut ids: Vec<NodeId> = config.members().collect();
        if !ids.contains(&id) {
            ids.push(id);
        }
        ids.sort_unstable();
        ids.into_iter()
            .map(|member| {
                let this_node = member == id;
                let voter = config.is_voter(member);
                let heard = (leading && !this_node)
                    .then(|| self.raft.last_heard(member))
                    .flatten()
                    .map(|at| now.saturating_duration_since(at));
                let ready = if this_node {
                    Some(
                        !self.shutting_down
                            && !self.checking_genesis()
                            && self.raft.is_voter()
                            && leader.is_some(),
                    )
                } else if leading {
                    Some(voter && heard.is_some_and(|heard| heard < contact_window))
                } else {
                    None
                };
                MemberView {
                    slot: member.slot,
                    generation: member.generation,
                    voter,
                    leader: leader == Some(member),
                    this_node,
                    lag_entries: leading
                        .then(|| self.raft.match_index(member))
                        .flatten()
                        .map(|matched| last_index.saturating_sub(matched)),
                    heard_ms: heard
                        .map(|heard| u64::try_from(heard.as_millis()).unwrap_or(u64::MAX)),
                    ready,
                    admin: self.admin_address(member.slot).map(Box::from),
                }
            })
            .collect()
    }

    /// The admin address configured for `slot`
    /// ([`ClusterConfig::admin_addresses`](super::ClusterConfig::admin_addresses)).
    pub fn admin_address(&self, slot: u8) -> Option<&str> {
        self.config
            .admin_addresses
            .get(usize::from(slot))
            .map(|a| &**a)
    }

    /// Why this node does not answer inspection or order force-releases
    /// itself (`None`: it does): it is not the leader (the answer names the
    /// leader's slot and admin address when known, so the admin layer can
    /// redirect), or it leads but has not applied its own term's no-op yet
    /// (its view may miss grants its predecessor committed; it answers like
    /// a node with no known leader until then).
    pub(super) fn leader_elsewhere(&self) -> Option<NotLeader> {
        match &self.leadership {
            Some(leadership) if leadership.caught_up && self.raft.is_leader() => None,
            Some(_) => Some(NotLeader {
                leader_slot: None,
                leader_admin: None,
            }),
            None => {
                let leader_slot = self
                    .raft
                    .leader()
                    .map(|l| l.slot)
                    .filter(|&slot| slot != self.config.id.slot);
                Some(NotLeader {
                    leader_slot,
                    leader_admin: leader_slot
                        .and_then(|slot| self.admin_address(slot))
                        .map(Box::from),
                })
            }
        }
    }

    /// `conn` as an operator sees it, while it is an open client
    /// connection.
    fn conn_view(&self, conn_id: ConnId) -> Option<ConnView> {
        let conn = self.conns.by_id.get(&conn_id)?;
        let ConnKind::Client(client) = &conn.kind else {
            return None;
        };
        if conn.out.is_closing() {
            return None;
        }
        Some(ConnView {
            conn: conn_id,
            source: conn.source?,
            dialect: client.front.dialect()?,
            label: client.front.label().map(Box::from),
        })
    }

    /// `key` as the leader sees it at `now`: the holder from the applied
    /// state (ages on this node's clock, which started the lease when it
    /// applied the grant; the connection when this leader delivered the
    /// grant to one it still has), and the waiters of its leader-local
    /// queue in FIFO order. `Ok(None)` when nobody holds or waits for it;
    /// `Err` on a node that is not a caught-up leader.
    pub fn lock(&self, now: Instant, key: &Key) -> Result<Option<LockView>, NotLeader> {
        if let Some(not_leader) = self.leader_elsewhere() {
            return Err(not_leader);
        }
        Ok(self.lock_view(now, key, LISTED_WAITERS_MAX))
    }

    /// `key` with at most `waiters_max` of its waiters listed.
    fn lock_view(&self, now: Instant, key: &Key, waiters_max: usize) -> Option<LockView> {
        let leadership = self.leadership.as_ref()?;
        let ms = |d: Duration| crate::time::duration_micros(d) / 1_000;
        let view = |token: u64, holding: &crate::cluster::state::Holding| HolderView {
            token,
            keys: holding.keys.keys().to_vec(),
            held_ms: ms(now.saturating_duration_since(holding.granted_at)),
            lease_remaining_ms: ms(holding.deadline.saturating_duration_since(now)),
            extensions: holding.extensions,
            hold_remaining_ms: holding
                .cap_at
                .map(|cap_at| ms(cap_at.saturating_duration_since(now))),
            conn: leadership
                .held_keys
                .conn_of(token)
                .and_then(|conn| self.conn_view(conn)),
        };
        // For a key held shared, the holder is the oldest sharer.
        let holder = self
            .state
            .holder(key)
            .map(|(token, holding)| view(token, holding));
        let sharers: Vec<HolderView> = self
            .state
            .sharers_of(key)
            .iter()
            .filter_map(|&token| Some(view(token, self.state.grant(token)?)))
            .collect();
        let queue = leadership.keys.get(key).map(|q| &q.waiters);
        let waiters: Vec<WaiterView> = queue
            .into_iter()
            .flatten()
            .filter_map(|seq| leadership.waiters.get(seq))
            .take(waiters_max)
            .map(|waiter| WaiterView {
                keys: waiter.keys.keys().to_vec(),
                waited_ms: ms(now.saturating_duration_since(waiter.received)),
                wait_remaining_ms: ms(waiter.deadline.saturating_duration_since(now)),
                shared: waiter
                    .keys
                    .keys()
                    .binary_search(key)
                    .is_ok_and(|index| waiter.wants_shared(index)),
                conn: self.conn_view(waiter.conn),
            })
            .collect();
        if holder.is_none() && waiters.is_empty() {
            return None;
        }
        Some(LockView {
            key: key.clone(),
            holder,
            sharers,
            waiters,
            waiters_total: queue.map_or(0, VecDeque::len),
        })
    }

    /// One page of the keys starting with `prefix` that are held or waited
    /// for (see [`ClusterNode::lock`]), going on from `cursor`: the scan
    /// walks the applied state's held keys (phase 0), then the leader's
    /// keys with waiters that nobody holds (phase 1), examining at most
    /// [`LISTING_SLOTS_PER_CALL_MAX`] slots in all and stopping after
    /// `limit` (capped at [`LISTING_LIMIT_MAX`]) keys, each listed with the
    /// front [`WAITERS_PER_LISTED_LOCK_MAX`] of its waiters, ascending
    /// within the page. A call is bounded work, so a listing flood cannot
    /// delay heartbeats and cost the leader its leadership.
    pub fn locks(
        &self,
        now: Instant,
        prefix: &[u8],
        limit: usize,
        cursor: ListingCursor,
    ) -> Result<LockListing, NotLeader> {
        if let Some(not_leader) = self.leader_elsewhere() {
            return Err(not_leader);
        }
        let Some(leadership) = self.leadership.as_ref().filter(|_| cursor.phase <= 1) else {
            return Ok(LockListing::empty());
        };
        let limit = limit.clamp(1, LISTING_LIMIT_MAX);
        let mut slots_left = LISTING_SLOTS_PER_CALL_MAX;
        let mut keys = Vec::new();
        let mut next = None;
        if cursor.phase == 0 {
            let held = self.state.held_key_map();
            let from = cursor.slot_in(held.slots());
            let (found, after) = held.scan(from, slots_left, limit, |key, _| {
                key.as_bytes().starts_with(prefix)
            });
            slots_left -= after.unwrap_or(held.slots()) - from.min(held.slots());
            keys = found;
            next = after.map(|slot| ListingCursor::at(0, slot, held.slots()));
        }
        if next.is_none() && keys.len() < limit && slots_left > 0 {
            let waited = leadership.keys.map();
            let from = if cursor.phase == 1 {
                cursor.slot_in(waited.slots())
            } else {
                0
            };
            let (found, after) = waited.scan(from, slots_left, limit - keys.len(), |key, q| {
                !q.waiters.is_empty()
                    && key.as_bytes().starts_with(prefix)
                    && self.state.holder(key).is_none()
            });
            keys.extend(found);
            next = after.map(|slot| ListingCursor::at(1, slot, waited.slots()));
        } else if next.is_none() {
            // Phase 0 ended exactly as this call's budget or limit did.
            next = Some(ListingCursor::at(1, 0, leadership.keys.map().slots()));
        }
        keys.sort_unstable();
        let locks = keys
            .into_iter()
            .filter_map(|key| self.lock_view(now, key, WAITERS_PER_LISTED_LOCK_MAX))
            .collect();
        Ok(LockListing { locks, next })
    }

    /// An operator's force-release, named `id` by the driver. Only a leader
    /// orders it: it proposes [`Command::ForceRelease`], and the answer
    /// ([`ClusterNode::poll_admin_reply`]) comes once the entry is applied,
    /// so nothing takes effect before a majority has it. At apply the
    /// grant holding the key is removed whole, exactly as its holder's
    /// release would remove it, and its keys go to their front waiters
    /// under new, larger tokens; the old holder's later release gets `N`.
    /// A non-leader answers [`ForceReleaseOutcome::NotLeader`] at once; a
    /// leader that loses its leadership before it saw the entry applied
    /// answers [`ForceReleaseOutcome::Indeterminate`].
    pub(super) fn force_release(&mut self, now: Instant, id: AdminRequestId, req: ForceRelease) {
        self.handle_timeout(now);
        if self.shutting_down || self.leadership.is_none() || !self.raft.is_leader() {
            let leader_slot = self
                .raft
                .leader()
                .map(|l| l.slot)
                .filter(|&slot| slot != self.config.id.slot);
            self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            return;
        }
        let keys = self
            .state
            .holder(&req.key)
            .map_or_else(|| vec![req.key.clone()], |(_, h)| h.keys.keys().to_vec());
        let command = Command::ForceRelease {
            key: req.key,
            token: req.token,
        };
        match self.propose_command(now, &command) {
            Ok((index, term)) => {
                self.pending.insert(
                    index,
                    Pending {
                        term,
                        proposed_at: now,
                        kind: PendingKind::ForceRelease { id, keys },
                    },
                );
            }
            Err(ProposeError::Backpressure) => {
                self.admin_reply(id, ForceReleaseOutcome::Busy);
            }
            Err(ProposeError::NotLeader { leader_hint }) => {
                let leader_slot = leader_hint.map(|l| l.slot);
                self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot });
            }
            Err(_) => self.admin_reply(id, ForceReleaseOutcome::NotLeader { leader_slot: None }),
        }
        self.pump(now);
    }

    /// Queues the answer to force-release `id` for the driver.
    pub(super) fn admin_reply(&mut self, id: AdminRequestId, outcome: ForceReleaseOutcome) {
        if self.admin_replies.len() >= ADMIN_REPLIES_MAX {
            self.counts.dropped_admin_replies += 1;
        } else {
            self.admin_replies.push_back((id, outcome));
        }
    }
}
