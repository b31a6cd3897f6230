//! What an operator may ask the core about its locks, and the force-release
//! an operator may order: the vocabulary shared by the single-mode server,
//! the cluster node and the embedded lock.
//!
//! Inspection is a query on core state at the `now` the driver passes, so
//! ages and remaining times are computed here, deterministically; the
//! driver only renders them (JSON over the admin listener, or Rust values
//! from the embedded server). A force-release is a core input, answered
//! through the same core that decides every other release: in single mode
//! at once, in cluster mode once its replicated command is applied.

use std::net::IpAddr;

use crate::conn::{ConnId, Dialect};
use crate::wire::Key;

/// Most locks one listing returns, whatever the caller asks for: a listing
/// is built under the core's lock, so its cost must stay bounded.
pub const LISTING_LIMIT_MAX: usize = 1_000;

/// Most table slots one listing call examines. A listing is a paged scan
/// of the lock table in its own slot order: each call goes on from the
/// previous call's [`ListingCursor`], so a prefix that matches nothing in
/// a table of a million keys costs many short calls, never one long one
/// (about 0.1–0.3 ms of the state machine's time per call here; see
/// `docs/admin-api.md`), and no query delays lock work or heartbeats by
/// more than that.
pub const LISTING_SLOTS_PER_CALL_MAX: usize = 16_384;

/// Where a paged listing goes on. Opaque to operators: its text form
/// ([`ListingCursor::to_text`], [`ListingCursor::parse`]) is what the
/// admin API hands out and takes back.
///
/// A scan is not a snapshot: a key that is held or waited on for the
/// whole scan is listed exactly once while the table's entries stay in
/// their slots. They move when the table is resized (the position is then
/// carried over in proportion) or rehashed in place to clear the slots of
/// removed keys, and a key may then be listed twice or missed; keys that
/// come and go during the scan may or may not appear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListingCursor {
    /// Which of the core's maps the scan is in (a cluster leader scans its
    /// held keys, then its keys with waiters).
    pub(crate) phase: u8,
    /// The next slot to examine.
    pub(crate) slot: u64,
    /// The map's slot count when the cursor was made.
    pub(crate) slots: u64,
}

/// Most bytes a cursor's text may have; longer text is not a cursor.
const CURSOR_TEXT_MAX: usize = 64;

impl ListingCursor {
    /// The cursor of a scan's start.
    pub const START: ListingCursor = ListingCursor {
        phase: 0,
        slot: 0,
        slots: 0,
    };

    pub(crate) fn at(phase: u8, slot: usize, slots: usize) -> Self {
        ListingCursor {
            phase,
            slot: u64::try_from(slot).unwrap_or(u64::MAX),
            slots: u64::try_from(slots).unwrap_or(u64::MAX),
        }
    }

    /// The slot to go on from in a map of `slots` slots: the cursor's own
    /// when the map kept its size, else carried over in proportion.
    pub(crate) fn slot_in(&self, slots: usize) -> usize {
        let now = u64::try_from(slots).unwrap_or(u64::MAX);
        let slot = if self.slots == 0 || self.slots == now {
            self.slot
        } else {
            let scaled = u128::from(self.slot) * u128::from(now) / u128::from(self.slots);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        usize::try_from(slot).unwrap_or(usize::MAX).min(slots)
    }

    /// The cursor as text: `c1.PHASE.SLOT.SLOTS`, decimal.
    pub fn to_text(&self) -> String {
        format!("c1.{}.{}.{}", self.phase, self.slot, self.slots)
    }

    /// A cursor from its text; `None` for anything [`ListingCursor::to_text`]
    /// would not have produced.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > CURSOR_TEXT_MAX {
            return None;
        }
        let mut parts = text.strip_prefix("c1.")?.split('.');
        let mut number = || -> Option<u64> {
            let part = parts.next()?;
            // Digits only: no sign, no blank, no leading `+`.
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        };
        let phase = u8::try_from(number()?).ok()?;
        let slot = number()?;
        let slots = number()?;
        if parts.next().is_some() || slot > slots {
            return None;
        }
        Some(ListingCursor { phase, slot, slots })
    }
}

/// Most waiters one [`LockView`] lists; the rest are only counted
/// ([`LockView::waiters_total`]).
pub const LISTED_WAITERS_MAX: usize = 1_000;

/// Most waiters each lock of a [`LockListing`] lists (the front of its
/// queue; the rest are counted), so a listing stays small however long
/// the queues are: ask for one key to see more.
pub const WAITERS_PER_LISTED_LOCK_MAX: usize = 10;

/// The client connection a grant or a wait belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnView {
    /// The core's id of the connection.
    pub conn: ConnId,
    /// The address the connection came from.
    pub source: IpAddr,
    /// The dialect it speaks.
    pub dialect: Dialect,
    /// The label the client named itself with when it negotiated
    /// extensions (our clients: host, pid, job); `None` for every other
    /// client.
    pub label: Option<Box<str>>,
}

/// The current grant on a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    /// The grant's fencing token.
    pub token: u64,
    /// Every key of the grant, ascending (one key unless it is a set).
    pub keys: Vec<Key>,
    /// How long ago the grant was made, in milliseconds.
    pub held_ms: u64,
    /// How long until the lease runs out, in milliseconds (0 once it has).
    pub lease_remaining_ms: u64,
    /// How many extensions (renewals by token) moved the lease.
    pub extensions: u32,
    /// Milliseconds until the grant's cap on total hold: the latest it can
    /// end, however often renewed (`None`: no cap).
    pub hold_remaining_ms: Option<u64>,
    /// The connection it was granted to; `None` when the core no longer
    /// knows it (a cluster grant made by another leader, or a connection
    /// that has gone while the lease runs on).
    pub conn: Option<ConnView>,
}

/// One queued waiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterView {
    /// Every key the waiter asked for, ascending.
    pub keys: Vec<Key>,
    /// How long it has waited, in milliseconds.
    pub waited_ms: u64,
    /// How long until its wait bound answers it `T`, in milliseconds.
    pub wait_remaining_ms: u64,
    /// It wants the key shared (docs/protocol.md §8.7); exclusive if not.
    pub shared: bool,
    /// The connection waiting.
    pub conn: Option<ConnView>,
}

/// One key as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    /// The key.
    pub key: Key,
    /// Its holder, if any; for a key held shared, the oldest sharer.
    pub holder: Option<HolderView>,
    /// The sharer batch: every shared holder, oldest first (the holder
    /// among them); empty unless the key is held shared (docs/protocol.md
    /// §8.7).
    pub sharers: Vec<HolderView>,
    /// Its waiters in queue order (the front first), at most
    /// [`LISTED_WAITERS_MAX`].
    pub waiters: Vec<WaiterView>,
    /// How many waiters are queued in all.
    pub waiters_total: usize,
}

/// One page of a listing by prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockListing {
    /// Locks whose key starts with the prefix, found in this call's part
    /// of the scan, in ascending key order within the page.
    pub locks: Vec<LockView>,
    /// Where the next call goes on; `None` once the scan reached the end
    /// of the table (nothing more to list).
    pub next: Option<ListingCursor>,
}

impl LockListing {
    /// A listing with nothing in it and nothing after it.
    pub fn empty() -> Self {
        LockListing {
            locks: Vec::new(),
            next: None,
        }
    }
}

/// An operator's request to release a key whatever its holder does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForceRelease {
    /// Any key of the grant; a set is released whole.
    pub key: Key,
    /// Release only if this token still holds the key.
    pub token: Option<u64>,
}

/// Names one force-release so its answer can find its way back (the
/// driver picks the ids; the core only echoes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdminRequestId(pub u64);

/// What a force-release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceReleaseOutcome {
    /// The grant `revoked` is gone, exactly as if its holder had released
    /// it: the key was handed to its front waiter under a new, larger token
    /// (`handed_to`), or left free. The old holder's later release gets `N`.
    Released {
        /// The token that no longer holds.
        revoked: u64,
        /// Every key the revoked grant held.
        keys: Vec<Key>,
        /// The token of the grant made by the hand-over, if any.
        handed_to: Option<u64>,
    },
    /// Nobody holds the key.
    NotHeld,
    /// The key is held, by another token than the one named.
    TokenMismatch {
        /// The token that holds it.
        held: u64,
    },
    /// This node cannot order it (cluster mode: not the leader); ask the
    /// leader, whose slot is given when known.
    NotLeader {
        /// The leader's slot, if one is known.
        leader_slot: Option<u8>,
    },
    /// Nothing was done: the node cannot take more work now (cluster
    /// mode: Raft holds as many uncommitted entries as allowed). Retry.
    Busy,
    /// The outcome is unknown (cluster mode: the command was proposed but
    /// leadership was lost before it was seen applied). Inspect the key.
    Indeterminate,
}

/// A cluster node that is not the leader (or a leader still catching up
/// with its predecessor's log) answers inspection with this instead: only
/// the leader knows the waiters, and only a caught-up one is sure of the
/// holders. The admin layer redirects to the leader's admin address, or
/// answers "unavailable" when none is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    /// The leader's slot, if one is known (and is not this node).
    pub leader_slot: Option<u8>,
    /// The leader's admin address (`host:port`), if configured.
    pub leader_admin: Option<Box<str>>,
}

/// One member of a cluster as a node sees it: the leader sees every
/// member's replication; another node knows only the configuration and
/// the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// The member's slot.
    pub slot: u8,
    /// Its generation.
    pub generation: u64,
    /// A voter (else a learner: it receives the log, does not vote).
    pub voter: bool,
    /// It is the leader this node knows.
    pub leader: bool,
    /// It is the node answering.
    pub this_node: bool,
    /// Leader's view: log entries the member is known to lack (`None`
    /// on another node, which does not know).
    pub lag_entries: Option<u64>,
    /// Leader's view: milliseconds since the leader last heard from it
    /// (`None` for the leader itself and on another node).
    pub heard_ms: Option<u64>,
    /// Whether it should get client traffic, as far as the answering node
    /// can tell: for itself, its own readiness; on the leader, for another
    /// member, a voter heard from within the minimum election timeout;
    /// `None` when the answering node cannot tell.
    pub ready: Option<bool>,
    /// Its admin address (`host:port`), if configured.
    pub admin: Option<Box<str>>,
}
