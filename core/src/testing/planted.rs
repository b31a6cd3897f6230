//! Deliberate bugs for testing the simulator's checkers (`sim/`): each
//! checker must catch at least one of these, so none is a check that cannot
//! fail. Compiled only with the `planted-bugs` feature, and even then every
//! mutation stays off until switched on for the current thread.

use std::cell::Cell;

/// A mutation of the lock table or server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlantedBug {
    /// An acquire treats a held key without waiters as free: two live holders.
    GrantTwice,
    /// A token divisible by four is replaced by the previous token,
    /// which is thereby issued twice.
    ReuseToken,
    /// A handoff grants the second waiter of a key before the first.
    SkipWaiter,
    /// A closed connection's grants that were never flushed to it are
    /// not released.
    ForgetGhostGrant,
    /// A queued waiter whose wait ends gets no reply at all.
    LoseWaiter,
    /// Peer frames are decoded without checking their tag
    /// (`crate::cluster::peer::PeerDecoder`): a frame forged by someone without
    /// the peer token reaches Raft.
    SkipPeerFrameMac,
    /// An operator's force-release answers "released" but leaves the
    /// grant in place (the old holder's release still succeeds).
    ForceReleaseKeepsGrant,
    /// An extension of a held key is accepted whatever token it names: a
    /// holder whose grant was handed on (or force-released and granted
    /// again) hears "renewed" and acts next to the new holder.
    ExtendAnyToken,
    /// The client counts a renewed lease from when the answer arrived
    /// instead of from when the renewal was sent: its deadline runs past
    /// the server's expiry by the answer's trip.
    RenewalFromReply,
    /// A restart starts its tokens at the stored reserve instead of one
    /// above it ([`crate::reserve::start_token`]): the reserve is the highest
    /// token the previous run may have issued, so once that run used its
    /// reserve up, and the wall clock is behind, its last token is issued
    /// again.
    ReissueReservedToken,
    /// A Raft leader commits the entry a majority holds even when it is of
    /// an older term (the check of Raft §5.4.2 dropped): an entry so
    /// committed can still be overwritten by a leader elected without it
    /// (Figure 8 of the Raft paper), after some node applied it.
    CommitOlderTerm,
    /// A semaphore whose head asks for more permits than are free grants
    /// a later, smaller request that fits: FIFO broken, the head starves.
    BargePermits,
    /// A semaphore counts one slot past its capacity as free: a request
    /// that finds every slot held is granted the slot numbered `capacity`.
    SlotPastCapacity,
    /// A permit grant tells the client the lowest slots of the semaphore
    /// instead of the slots it was granted: the client believes it holds
    /// slots another client holds, and releases keys it does not hold.
    ReportLowestSlots,
    /// A hand-off to the next waiter of a key (a resign, a lease running
    /// out) grants the last token issued again instead of a new one: the
    /// next leader of an election gets its predecessor's term.
    HandoffReusesTerm,
    /// An `O` (observe) answers "no leader" for a key held by a connection
    /// that has closed, although the grant holds until its lease ends.
    ObserveDepartedAsNone,
    /// A shared request that finds its key held exclusive (and nobody
    /// waiting) is granted at once: a sharer beside the writer.
    ShareBesideWriter,
    /// A shared request that finds its key held shared joins the batch
    /// even when an exclusive request waits: the reader passes the writer
    /// queued before it.
    SharedJumpsWriter,
    /// The first two permit grants of one pass over a semaphore's queue
    /// get their tokens the wrong way round: the earlier waiter the later
    /// token. Each slot's tokens still rise (the two grants share no
    /// slot, and both tokens are above every earlier one), but the later
    /// grant holds the smaller token.
    PermitTokensReversed,
    /// [`crate::lock::TwoMarks`] checks an exclusive operation against the
    /// exclusive mark alone: a writer whose lease ran out is accepted after
    /// readers granted later acted.
    WriterChecksWritersOnly,
}

impl PlantedBug {
    /// Every planted bug.
    pub const ALL: [PlantedBug; 20] = [
        PlantedBug::GrantTwice,
        PlantedBug::ReuseToken,
        PlantedBug::SkipWaiter,
        PlantedBug::ForgetGhostGrant,
        PlantedBug::LoseWaiter,
        PlantedBug::SkipPeerFrameMac,
        PlantedBug::ForceReleaseKeepsGrant,
        PlantedBug::ExtendAnyToken,
        PlantedBug::RenewalFromReply,
        PlantedBug::ReissueReservedToken,
        PlantedBug::CommitOlderTerm,
        PlantedBug::BargePermits,
        PlantedBug::SlotPastCapacity,
        PlantedBug::ReportLowestSlots,
        PlantedBug::HandoffReusesTerm,
        PlantedBug::ObserveDepartedAsNone,
        PlantedBug::ShareBesideWriter,
        PlantedBug::SharedJumpsWriter,
        PlantedBug::PermitTokensReversed,
        PlantedBug::WriterChecksWritersOnly,
    ];

    /// The bug's name on the simulator's command line (`--planted NAME`).
    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::GrantTwice => "grant-twice",
            PlantedBug::ReuseToken => "reuse-token",
            PlantedBug::SkipWaiter => "skip-waiter",
            PlantedBug::ForgetGhostGrant => "forget-ghost-grant",
            PlantedBug::LoseWaiter => "lose-waiter",
            PlantedBug::SkipPeerFrameMac => "skip-peer-frame-mac",
            PlantedBug::ForceReleaseKeepsGrant => "force-release-keeps-grant",
            PlantedBug::ExtendAnyToken => "extend-any-token",
            PlantedBug::RenewalFromReply => "renewal-from-reply",
            PlantedBug::ReissueReservedToken => "reissue-reserved-token",
            PlantedBug::CommitOlderTerm => "commit-older-term",
            PlantedBug::BargePermits => "barge-permits",
            PlantedBug::SlotPastCapacity => "slot-past-capacity",
            PlantedBug::ReportLowestSlots => "report-lowest-slots",
            PlantedBug::HandoffReusesTerm => "handoff-reuses-term",
            PlantedBug::ObserveDepartedAsNone => "observe-departed-as-none",
            PlantedBug::ShareBesideWriter => "share-beside-writer",
            PlantedBug::SharedJumpsWriter => "shared-jumps-writer",
            PlantedBug::PermitTokensReversed => "permit-tokens-reversed",
            PlantedBug::WriterChecksWritersOnly => "writer-checks-writers-only",
        }
    }

    /// The bug named `name` on the command line.
    pub fn from_name(name: &str) -> Option<PlantedBug> {
        PlantedBug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

thread_local! {
    static ACTIVE: Cell<Option<PlantedBug>> = const { Cell::new(None) };
}

/// Switches `bug` on (or every bug off) for the current thread.
pub fn set(bug: Option<PlantedBug>) {
    ACTIVE.with(|active| active.set(bug));
}

/// Whether `bug` is switched on for the current thread.
pub fn active(bug: PlantedBug) -> bool {
    ACTIVE.with(|active| active.get() == Some(bug))
}
