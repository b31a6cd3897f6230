//! Recovering a fencing domain after a majority of its nodes lost their
//! state: the evidence rule, the first token, and the refusals. Pure
//! decisions; the driver reads the state file and probes the peers, and
//! passes what it found in ([`RecoveryFacts`]).
//!
//! # Why the evidence bounds every earlier token
//!
//! Three rules of the running cluster make a slot's durable token floor
//! (its state file) evidence:
//!
//! 1. **A leader proposes no Grant its own durable floor does not cover**
//!    (counter plus proposals in flight, see [`crate::reserve`]).
//! 2. **A node appends no entry its own durable floor does not cover**:
//!    before an `Append` is stepped into Raft, the node checks that its
//!    floor is at least [`log_token_bound`] of the entries it carries (the
//!    counter, or an `Init` among them, plus one per entry); if not, the
//!    message is dropped (Raft sends it again) and the floor is asked for.
//!    So every entry in any node's log, and so every entry it ever
//!    acknowledged, is covered by that node's floor.
//! 3. **No configuration has fewer than two voters**: the leader's
//!    replacement driver never removes a voter from a two-voter set.
//!
//! A token `t` was issued only after its Grant committed, that is after a
//! majority of the voters of the configuration then in effect held it in
//! their logs: at least two slots (rule 3) whose floors covered `t` when
//! they held it (rules 1 and 2). A slot's state file only ever grows
//! (every write is the reserve asked for, above the last; a restarted
//! process starts above it), so those two files still cover `t`. Hence
//! **the floors of every slot but one** ([`evidence_slots_needed`]) include
//! one of the two and bound every token the domain ever issued, whatever
//! the clocks did: the wall clock only ever raises the first token.
//!
//! # How a recovered cluster uses it
//!
//! Every slot whose state file survived starts with `--recover`: its
//! generation is [`RECOVERY_GENERATION`], its voters that generation of
//! every slot, and its token floor `max(wall clock, stored + 1,
//! explicit + 1)` ([`decide_recovery`]). A slot without a state file
//! refuses to recover unless the operator names a floor above every token
//! of the domain. The first leader proposes `Init` only once it has heard
//! (in authenticated peer hellos, which carry each node's floor) from
//! [`evidence_slots_needed`] recovering slots, itself included
//! ([`init_evidence_complete`]), and starts the counter at the largest
//! floor it heard. So the first token of the recovered domain is above
//! every token of the old one.
//!
//! Recovery refuses while the old cluster still runs: a quorum of old
//! nodes alive needs no recovery, and a minority still alive must be
//! stopped first (its state file, which covers everything in its log,
//! is then its contribution to the evidence), so that no intact state is
//! overwritten behind its back.

use core::fmt;

use crate::cluster::command::FIRST_TOKEN_MAX;
use crate::cluster::peer::{PEER_HELLO_LEN, PeerHello, PeerRole};
use crate::raft::{Entry, EntryKind};
use crate::time::Duration;

/// The generation of every member of a recovered cluster: above a
/// bootstrap member's 1 and far below any joining generation (wall-clock
/// microseconds), so a probe tells a recovering peer from an old node.
pub const RECOVERY_GENERATION: u64 = 2;

/// Slots whose floors prove a bound on every token of a domain of
/// `slot_count` slots: every slot but one (see the module documentation).
pub fn evidence_slots_needed(slot_count: u8) -> u8 {
    slot_count.saturating_sub(1).max(1)
}

/// Whether a recovering leader may propose `Init`: it heard the floors of
/// enough recovering slots (`heard`, peers only; it counts itself).
pub fn init_evidence_complete(slot_count: u8, heard: usize) -> bool {
    heard.saturating_add(1) >= usize::from(evidence_slots_needed(slot_count))
}

/// An upper bound on every token that the entries of an `Append`, once in
/// the log, may allocate: each entry allocates at most one token, from the
/// counter (`next_token`, the next token to allocate in the applied state)
/// or from an `Init` among them. `applied_index` is the last applied
/// entry; `None` when no entry is past it (nothing new to cover).
pub fn log_token_bound(next_token: u64, applied_index: u64, entries: &[Entry]) -> Option<u64> {
    let last = entries.last()?.index;
    if last <= applied_index {
        return None;
    }
    let init_max = entries
        .iter()
        .filter_map(|entry| match &entry.kind {
            EntryKind::Command(bytes) => init_first_token(bytes),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    Some(
        next_token
            .max(init_max)
            .saturating_add(last - applied_index),
    )
}

/// The first token of an `Init` command's bytes (tag `0x01`, then the
/// token as a big-endian u64), without decoding any other command.
fn init_first_token(bytes: &[u8]) -> Option<u64> {
    match bytes {
        [0x01, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

/// What a probe of one peer slot's peer address found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerProbe {
    /// Nothing answered (refused, timed out, closed without a hello).
    Unreachable,
    /// A node of this cluster in that slot answered as an old node (any
    /// generation but [`RECOVERY_GENERATION`]).
    Running {
        /// Its generation.
        generation: u64,
    },
    /// A node of this slot that is recovering too.
    Recovering,
    /// Something else answered (another cluster, another slot, bytes that
    /// are no hello): not counted.
    Foreign,
}

/// What the hello bytes a slot's peer address sent (`None`: none came)
/// say about `slot` of the cluster `fingerprint`. Unauthenticated: good
/// enough to refuse, never used as evidence of a floor.
pub fn classify_probe(
    fingerprint: &[u8; 32],
    slot: u8,
    hello: Option<&[u8; PEER_HELLO_LEN]>,
) -> PeerProbe {
    let Some(bytes) = hello else {
        return PeerProbe::Unreachable;
    };
    match PeerHello::parse(bytes) {
        Some(hello)
            if hello.fingerprint == *fingerprint
                && hello.role == PeerRole::Acceptor
                && hello.from.slot == slot =>
        {
            if hello.from.generation == RECOVERY_GENERATION {
                PeerProbe::Recovering
            } else {
                PeerProbe::Running {
                    generation: hello.from.generation,
                }
            }
        }
        _ => PeerProbe::Foreign,
    }
}

/// What the driver found before a recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryFacts {
    /// Slots in the cluster.
    pub slot_count: u8,
    /// This node's slot.
    pub self_slot: u8,
    /// The reserve this slot's state file holds (`None`: no file).
    pub stored_floor: Option<u64>,
    /// A floor the operator vouches for: no token of the domain was above
    /// it (`--token-floor`).
    pub explicit_floor: Option<u64>,
    /// What each other slot's peer address answered, in slot order.
    pub peers: Vec<(u8, PeerProbe)>,
    /// The wall clock since the Unix epoch.
    pub wall_clock: Duration,
}

/// Where the recovered node's first token comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorSource {
    /// The wall clock was above the evidence.
    WallClock,
    /// This slot's state file.
    StateFile,
    /// The operator's explicit floor.
    Explicit,
}

/// A recovery that may go ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// This node's token floor: above its stored floor, the explicit one
    /// and the wall clock. The domain's first token is at least the
    /// largest such floor among the slots its first leader heard.
    pub token_floor: u64,
    /// Which of them decided it.
    pub source: FloorSource,
    /// Peer slots already recovering.
    pub recovering_peers: Vec<u8>,
}

/// Why a recovery is refused. Each names what is missing and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryRefusal {
    /// A majority of the slots still runs the old cluster.
    QuorumAlive {
        /// `(slot, generation)` of every old node that answered.
        running: Vec<(u8, u64)>,
    },
    /// Some old nodes still run, fewer than a majority.
    OldNodesRunning {
        /// `(slot, generation)` of every old node that answered.
        running: Vec<(u8, u64)>,
    },
    /// This slot has no state file and the operator named no floor.
    NoFloor {
        /// This slot.
        slot: u8,
    },
    /// The explicit or stored floor leaves no room for tokens above it
    /// (the domain's first token must stay below
    /// [`FIRST_TOKEN_MAX`]).
    FloorTooLarge {
        /// The floor.
        floor: u64,
    },
}

impl fmt::Display for RecoveryRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |running: &[(u8, u64)]| {
            running
                .iter()
                .map(|(slot, generation)| format!("slot {slot} (generation {generation})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            RecoveryRefusal::QuorumAlive { running } => write!(
                f,
                "a quorum of the cluster is still running ({}): it needs no recovery; \
                 start this node without --recover and it rejoins",
                list(running)
            ),
            RecoveryRefusal::OldNodesRunning { running } => write!(
                f,
                "the old cluster still runs on {}: stop it first (its state file then \
                 counts as evidence: start it with --recover too), or bring back a \
                 majority instead",
                list(running)
            ),
            RecoveryRefusal::NoFloor { slot } => write!(
                f,
                "slot {slot} has no token floor file in its state directory, so it \
                 cannot vouch for the tokens issued before: recover the slots whose \
                 state files survived (every slot but one is needed) and start this \
                 one without flags afterwards, or pass --token-floor N with N at or \
                 above every token the domain ever issued"
            ),
            RecoveryRefusal::FloorTooLarge { floor } => write!(
                f,
                "the token floor {floor} leaves no room for tokens above it (the largest \
                 usable is {})",
                FIRST_TOKEN_MAX - 3
            ),
        }
    }
}

impl std::error::Error for RecoveryRefusal {}

/// Decides whether this node may recover and with what token floor. See
/// the module documentation.
pub fn decide_recovery(facts: &RecoveryFacts) -> Result<RecoveryPlan, RecoveryRefusal> {
    let running: Vec<(u8, u64)> = facts
        .peers
        .iter()
        .filter_map(|&(slot, probe)| match probe {
            PeerProbe::Running { generation } => Some((slot, generation)),
            _ => None,
        })
        .collect();
    // This node does not run the old cluster any more: a majority of the
    // slots must be among the others.
    if 2 * running.len() > usize::from(facts.slot_count) {
        return Err(RecoveryRefusal::QuorumAlive { running });
    }
    if !running.is_empty() {
        return Err(RecoveryRefusal::OldNodesRunning { running });
    }
    // No clipping: a floor clipped below the evidence would prove nothing.
    if let Some(floor) = [facts.explicit_floor, facts.stored_floor]
        .into_iter()
        .flatten()
        .find(|&floor| floor >= FIRST_TOKEN_MAX - 2)
    {
        return Err(RecoveryRefusal::FloorTooLarge { floor });
    }
    if facts.stored_floor.is_none() && facts.explicit_floor.is_none() {
        return Err(RecoveryRefusal::NoFloor {
            slot: facts.self_slot,
        });
    }
    let wall = crate::time::duration_micros(facts.wall_clock).max(1);
    let mut token_floor = wall;
    let mut source = FloorSource::WallClock;
    for (candidate, from) in [
        (facts.stored_floor, FloorSource::StateFile),
        (facts.explicit_floor, FloorSource::Explicit),
    ] {
        if let Some(value) = candidate
            && value.saturating_add(1) > token_floor
        {
            token_floor = value.saturating_add(1);
            source = from;
        }
    }
    Ok(RecoveryPlan {
        token_floor,
        source,
        recovering_peers: facts
            .peers
            .iter()
            .filter(|(_, probe)| *probe == PeerProbe::Recovering)
            .map(|(slot, _)| *slot)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::command::Command;
    use crate::raft::NodeId;
    use std::sync::Arc;

    const HOUR_US: u64 = 3_600_000_000;
    const FP: [u8; 32] = [7; 32];

    fn facts(stored: Option<u64>, peers: &[(u8, PeerProbe)]) -> RecoveryFacts {
        RecoveryFacts {
            slot_count: 3,
            self_slot: 0,
            stored_floor: stored,
            explicit_floor: None,
            peers: peers.to_vec(),
            wall_clock: Duration::from_micros(10 * HOUR_US),
        }
    }

    #[test]
    fn evidence_is_every_slot_but_one() {
        assert_eq!(evidence_slots_needed(3), 2);
        assert_eq!(evidence_slots_needed(5), 4);
        // Three slots: the leader and one peer; five: itself and three.
        assert!(!init_evidence_complete(3, 0));
        assert!(init_evidence_complete(3, 1));
        assert!(!init_evidence_complete(5, 2));
        assert!(init_evidence_complete(5, 3));
    }

    #[test]
    fn the_stored_floor_wins_over_a_clock_set_back() {
        // The old domain issued up to about 10 h; the state file holds a
        // reserve above that; the clock now says 9 h (set back an hour).
        let stored = 10 * HOUR_US + 1_000_000;
        let mut f = facts(Some(stored), &[]);
        f.wall_clock = Duration::from_micros(9 * HOUR_US);
        let plan = decide_recovery(&f).unwrap();
        assert_eq!(plan.token_floor, stored + 1);
        assert_eq!(plan.source, FloorSource::StateFile);
        // A clock ahead of the evidence only raises it.
        f.wall_clock = Duration::from_micros(11 * HOUR_US);
        let plan = decide_recovery(&f).unwrap();
        assert_eq!(plan.token_floor, 11 * HOUR_US);
        assert_eq!(plan.source, FloorSource::WallClock);
    }

    #[test]
    fn an_explicit_floor_stands_in_for_a_lost_file() {
        let mut f = facts(None, &[(1, PeerProbe::Unreachable)]);
        assert_eq!(
            decide_recovery(&f),
            Err(RecoveryRefusal::NoFloor { slot: 0 })
        );
        f.explicit_floor = Some(20 * HOUR_US);
        let plan = decide_recovery(&f).unwrap();
        assert_eq!(plan.token_floor, 20 * HOUR_US + 1);
        assert_eq!(plan.source, FloorSource::Explicit);
        // With a file too, the larger wins.
        f.stored_floor = Some(30 * HOUR_US);
        assert_eq!(decide_recovery(&f).unwrap().token_floor, 30 * HOUR_US + 1);
        f.explicit_floor = Some(FIRST_TOKEN_MAX);
        assert_eq!(
            decide_recovery(&f),
            Err(RecoveryRefusal::FloorTooLarge {
                floor: FIRST_TOKEN_MAX
            })
        );
        // A stored floor that high is refused too, never clipped.
        f.explicit_floor = None;
        f.stored_floor = Some(FIRST_TOKEN_MAX - 2);
        assert!(matches!(
            decide_recovery(&f),
            Err(RecoveryRefusal::FloorTooLarge { .. })
        ));
        f.stored_floor = Some(FIRST_TOKEN_MAX - 3);
        assert_eq!(
            decide_recovery(&f).unwrap().token_floor,
            FIRST_TOKEN_MAX - 2
        );
    }

    #[test]
    fn a_running_old_node_refuses_and_a_quorum_of_them_says_so() {
        let old = PeerProbe::Running { generation: 1 };
        let f = facts(Some(5), &[(1, old), (2, PeerProbe::Unreachable)]);
        let refusal = decide_recovery(&f).unwrap_err();
        assert_eq!(
            refusal,
            RecoveryRefusal::OldNodesRunning {
                running: vec![(1, 1)]
            }
        );
        assert!(refusal.to_string().contains("slot 1 (generation 1)"));
        let f = facts(
            Some(5),
            &[(1, old), (2, PeerProbe::Running { generation: 99 })],
        );
        let refusal = decide_recovery(&f).unwrap_err();
        assert_eq!(
            refusal,
            RecoveryRefusal::QuorumAlive {
                running: vec![(1, 1), (2, 99)]
            }
        );
        assert!(refusal.to_string().contains("needs no recovery"));
        // Peers that recover too, or foreign answers, are no reason to
        // refuse.
        let f = facts(
            Some(5),
            &[(1, PeerProbe::Recovering), (2, PeerProbe::Foreign)],
        );
        assert_eq!(decide_recovery(&f).unwrap().recovering_peers, vec![1]);
    }

    #[test]
    fn the_no_floor_refusal_names_the_slot_and_both_ways_out() {
        let text = RecoveryRefusal::NoFloor { slot: 2 }.to_string();
        assert!(text.contains("slot 2"), "{text}");
        assert!(text.contains("--token-floor"), "{text}");
        assert!(text.contains("without flags"), "{text}");
    }

    fn hello(fingerprint: [u8; 32], role: PeerRole, slot: u8, generation: u64) -> [u8; 76] {
        PeerHello {
            fingerprint,
            role,
            from: NodeId::new(slot, generation),
            token_floor: 5,
            nonce: [0; 16],
        }
        .encode()
    }

    #[test]
    fn probes_tell_old_nodes_from_recovering_ones() {
        let h = hello(FP, PeerRole::Acceptor, 1, 1);
        assert_eq!(
            classify_probe(&FP, 1, Some(&h)),
            PeerProbe::Running { generation: 1 }
        );
        let h = hello(FP, PeerRole::Acceptor, 1, RECOVERY_GENERATION);
        assert_eq!(classify_probe(&FP, 1, Some(&h)), PeerProbe::Recovering);
        // Another cluster, another slot, a dialer's hello, or garbage.
        for h in [
            hello([8; 32], PeerRole::Acceptor, 1, 1),
            hello(FP, PeerRole::Acceptor, 2, 1),
            hello(FP, PeerRole::Dialer, 1, 1),
            [0; 76],
        ] {
            assert_eq!(classify_probe(&FP, 1, Some(&h)), PeerProbe::Foreign);
        }
        assert_eq!(classify_probe(&FP, 1, None), PeerProbe::Unreachable);
    }

    fn entry(index: u64, kind: EntryKind) -> Entry {
        Entry {
            index,
            term: 1,
            kind,
        }
    }

    fn command(command: &Command) -> EntryKind {
        EntryKind::Command(Arc::from(command.to_bytes()))
    }

    #[test]
    fn the_log_bound_counts_one_token_per_new_entry_and_any_init() {
        let noop = |i| entry(i, EntryKind::Noop);
        // Applied up to 10, next token 1,000: entries 11..=13 may allocate
        // 1,000, 1,001, 1,002, so 1,003 covers them.
        assert_eq!(
            log_token_bound(1_000, 10, &[noop(11), noop(12), noop(13)]),
            Some(1_003)
        );
        // Nothing past the applied index: nothing to cover.
        assert_eq!(log_token_bound(1_000, 13, &[noop(12), noop(13)]), None);
        assert_eq!(log_token_bound(1_000, 13, &[]), None);
        // An Init sets the counter: its first token counts.
        let init = entry(
            2,
            command(&Command::Init {
                first_token: 5_000_000,
            }),
        );
        assert_eq!(log_token_bound(0, 1, &[init, noop(3)]), Some(5_000_002));
    }
}
