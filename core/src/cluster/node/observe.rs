//! `O` on the cluster leader: who holds a key (an election's leader and
//! term), read from the applied replicated state.
//!
//! The label is the one the Grant carried ([`GrantOptions::label`]), so a
//! new leader names the holder as the old one did. Whether the holder is
//! connected is this leader's own knowledge: a grant this leader delivered
//! to a connection still open, or that a connection still open renewed by
//! token here, is reported connected; any other grant (its connection
//! closed, or an earlier leader delivered it and it has not renewed here
//! yet) is reported departed until its lease ends or it renews, with its
//! label. Departed says only that this leader does not see its
//! connection: the grant still holds, and is still the leader of its
//! election.
//!
//! [`GrantOptions::label`]: crate::cluster::GrantOptions::label

use crate::conn::ConnId;
use crate::time::Instant;
use crate::wire::{Key, LeaderLabel, LeaderState, Observed};

use super::ClusterNode;

impl ClusterNode {
    /// Who holds `key` at `now` on this leader's clock: nobody (free, or
    /// its lease ended here while its `Expire` is not yet applied), or the
    /// grant's token (an election's term), its lease left and the label
    /// its Grant carried. Changes nothing.
    pub(super) fn observe(&self, now: Instant, key: &Key) -> Observed {
        let Some((token, holding)) = self
            .state
            .holder(key)
            .filter(|(_, holding)| holding.deadline > now)
        else {
            return Observed::NO_LEADER;
        };
        let lease_ms = holding.deadline.saturating_duration_since(now).as_millis();
        Observed {
            state: self.holder_state(token),
            term: token,
            lease_ms: u32::try_from(lease_ms).unwrap_or(u32::MAX),
            label: holding.options.label.unwrap_or(LeaderLabel::EMPTY),
        }
    }

    /// Connected when grant `token`'s connection on this leader (the one
    /// it delivered the grant to, or the one that renewed it here) is open
    /// and not closing; departed otherwise.
    fn holder_state(&self, token: u64) -> LeaderState {
        let conn: Option<ConnId> = self
            .leadership
            .as_ref()
            .and_then(|leadership| leadership.held_keys.conn_of(token));
        if conn.is_some_and(|conn| self.is_open_client(conn)) {
            LeaderState::Connected
        } else {
            LeaderState::Departed
        }
    }

    /// Whether `conn` is a connection of this node that is open and not
    /// closing.
    pub(super) fn is_open_client(&self, conn: ConnId) -> bool {
        self.conns
            .by_id
            .get(&conn)
            .is_some_and(|conn| conn.close_reason.is_none() && !conn.out.is_closing())
    }
}
