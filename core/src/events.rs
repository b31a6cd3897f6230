//! The recent events an operator sees on the status page: leader changes,
//! force-releases, lease expiries that handed keys to a waiter, and
//! refused connections. Recorded by the core where it decides them (both
//! modes), kept in a bounded ring ([`EVENTS_MAX`]), and read with
//! [`crate::machine::Machine::recent_events`], whose ages are computed at
//! the `now` the driver passes, like every inspection.
//!
//! A flood must not wash the ring: refusals are never one entry each.
//! Each refusal reason has at most one open entry, counting every refusal
//! of that reason until the entry is one report interval old
//! ([`crate::budget::BudgetConfig::report_interval`]); the
//! next refusal after that opens a new entry. A flood of any size therefore
//! adds at most one entry per reason per interval, and the other events of
//! the same minutes stay.

use std::collections::VecDeque;

use crate::budget::AbuseKind;
use crate::time::{Duration, Instant};
use crate::wire::Key;

/// Most events kept; the oldest goes first.
pub const EVENTS_MAX: usize = 256;

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The leader this cluster node knows changed (`None`: none known).
    LeaderChanged {
        /// The new leader's slot.
        leader_slot: Option<u8>,
        /// The Raft term when it changed.
        term: u64,
    },
    /// An operator force-released the grant `revoked`.
    ForceReleased {
        /// Every key of the revoked grant.
        keys: Vec<Key>,
        /// The revoked token.
        revoked: u64,
        /// The token of the grant the hand-over made, when the core knows
        /// it at once (single mode; a cluster grants the front waiter by a
        /// later command).
        handed_to: Option<u64>,
    },
    /// A lease ran out while somebody waited for its keys, who got them
    /// next: a holder that stopped renewing held others up until then.
    ExpiredWithWaiters {
        /// The keys whose expiry was noticed with a waiter (single mode:
        /// the key the hand-over happened on; cluster: the grant's keys).
        keys: Vec<Key>,
        /// The token whose lease ran out.
        expired: u64,
        /// The token of the waiter's grant, when the core knows it at
        /// once (single mode).
        handed_to: Option<u64>,
    },
    /// Connections refused or closed for one reason, counted: `count`
    /// of them between the entry's first and last time.
    Refused {
        /// Why.
        reason: AbuseKind,
        /// How many.
        count: u64,
    },
}

/// One event as an operator sees it at the `now` of the query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    /// The event's number: every recorded event gets the next one, so a
    /// reader can tell new ones from those it has seen.
    pub seq: u64,
    /// Milliseconds since it last happened (for a count of refusals: the
    /// latest one counted).
    pub age_ms: u64,
    /// Milliseconds from its first to its last occurrence (0 but for a
    /// count of refusals).
    pub span_ms: u64,
    /// What happened.
    pub event: Event,
}

#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    first_at: Instant,
    last_at: Instant,
    event: Event,
}

/// The open refusal entry of each reason: its number and when it opened.
#[derive(Clone, Debug)]
struct RefusalCounts {
    /// How long one entry counts refusals of its reason.
    interval: Duration,
    open: [Option<(u64, Instant)>; AbuseKind::ALL.len()],
}

/// The ring of recent events.
#[derive(Clone, Debug)]
pub(crate) struct EventRing {
    entries: VecDeque<Entry>,
    next_seq: u64,
    refusals: RefusalCounts,
}

fn reason_index(reason: AbuseKind) -> usize {
    AbuseKind::ALL
        .iter()
        .position(|&kind| kind == reason)
        .unwrap_or(0)
}

impl EventRing {
    /// An empty ring whose refusal entries count for `interval` each (at
    /// least a millisecond).
    pub(crate) fn new(interval: Duration) -> Self {
        EventRing {
            entries: VecDeque::new(),
            next_seq: 1,
            refusals: RefusalCounts {
                interval: interval.max(Duration::from_millis(1)),
                open: [None; AbuseKind::ALL.len()],
            },
        }
    }

    /// Records `event` at `now`, dropping the oldest past [`EVENTS_MAX`].
    pub(crate) fn record(&mut self, now: Instant, event: Event) -> u64 {
        if self.entries.len() >= EVENTS_MAX {
            self.entries.pop_front();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Entry {
            seq,
            first_at: now,
            last_at: now,
            event,
        });
        seq
    }

    /// One refusal for `reason` at `now`: counted in the reason's open
    /// entry while it is younger than the interval (and still in the
    /// ring), else in a new one.
    pub(crate) fn refused(&mut self, now: Instant, reason: AbuseKind) {
        let slot = reason_index(reason);
        if let Some((seq, opened)) = self.refusals.open[slot]
            && now.saturating_duration_since(opened) < self.refusals.interval
            && let Some(entry) = self.entry_mut(seq)
            && let Event::Refused { count, .. } = &mut entry.event
        {
            *count += 1;
            entry.last_at = entry.last_at.max(now);
            return;
        }
        let seq = self.record(now, Event::Refused { reason, count: 1 });
        self.refusals.open[slot] = Some((seq, now));
    }

    fn entry_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        // Numbers are consecutive from the front: the place is arithmetic.
        let front = self.entries.front()?.seq;
        let index = usize::try_from(seq.checked_sub(front)?).ok()?;
        self.entries.get_mut(index).filter(|entry| entry.seq == seq)
    }

    /// Every event kept, the most recent first (by when it last
    /// happened, then by number), aged at `now`.
    pub(crate) fn view(&self, now: Instant) -> Vec<EventView> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| b.last_at.cmp(&a.last_at).then(b.seq.cmp(&a.seq)));
        entries
            .into_iter()
            .map(|entry| EventView {
                seq: entry.seq,
                age_ms: millis(now.saturating_duration_since(entry.last_at)),
                span_ms: millis(entry.last_at.saturating_duration_since(entry.first_at)),
                event: entry.event.clone(),
            })
            .collect()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn key(text: &str) -> Key {
        Key::new(text.as_bytes()).unwrap()
    }

    #[test]
    fn the_ring_keeps_the_newest_events_up_to_its_bound() {
        let mut ring = EventRing::new(Duration::from_secs(10));
        let total = EVENTS_MAX as u64 + 44;
        for term in 1..=total {
            ring.record(
                at_ms(term),
                Event::LeaderChanged {
                    leader_slot: Some(1),
                    term,
                },
            );
        }
        let view = ring.view(at_ms(total + 5));
        assert_eq!(view.len(), EVENTS_MAX);
        // The most recent first, aged at the query's time.
        assert_eq!(view[0].seq, total);
        assert_eq!(view[0].age_ms, 5);
        assert_eq!(
            view[0].event,
            Event::LeaderChanged {
                leader_slot: Some(1),
                term: total
            }
        );
        assert_eq!(view.last().unwrap().seq, 45, "the oldest 44 went first");
    }

    #[test]
    fn a_flood_of_refusals_is_one_entry_per_reason_per_interval() {
        let mut ring = EventRing::new(Duration::from_secs(10));
        ring.record(
            at_ms(0),
            Event::ForceReleased {
                keys: vec![key("jobs/1")],
                revoked: 7,
                handed_to: Some(8),
            },
        );
        // 100,000 refusals within one interval, two reasons interleaved.
        for n in 0..100_000u64 {
            let reason = if n % 2 == 0 {
                AbuseKind::Refused
            } else {
                AbuseKind::FailedProof
            };
            ring.refused(at_ms(1 + n / 20), reason);
        }
        let view = ring.view(at_ms(6_000));
        assert_eq!(view.len(), 3, "{view:?}");
        let counts: Vec<(AbuseKind, u64, u64)> = view
            .iter()
            .filter_map(|v| match v.event {
                Event::Refused { reason, count } => Some((reason, count, v.span_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(
            counts,
            [
                (AbuseKind::FailedProof, 50_000, 4_999),
                (AbuseKind::Refused, 50_000, 4_999)
            ]
        );
        assert!(matches!(
            view.last().unwrap().event,
            Event::ForceReleased { revoked: 7, .. }
        ));
        // Past the interval a new entry opens; the old one keeps its count.
        ring.refused(at_ms(10_001), AbuseKind::Refused);
        ring.refused(at_ms(10_002), AbuseKind::Refused);
        let view = ring.view(at_ms(10_002));
        assert_eq!(view.len(), 4);
        assert_eq!(
            view[0].event,
            Event::Refused {
                reason: AbuseKind::Refused,
                count: 2
            }
        );
        assert_eq!((view[0].age_ms, view[0].span_ms), (0, 1));
    }

    #[test]
    fn a_refusal_entry_pushed_out_of_the_ring_is_not_counted_into() {
        let mut ring = EventRing::new(Duration::from_secs(10));
        ring.refused(at_ms(0), AbuseKind::HandshakeTimedOut);
        for term in 0..EVENTS_MAX as u64 {
            ring.record(
                at_ms(1),
                Event::LeaderChanged {
                    leader_slot: None,
                    term,
                },
            );
        }
        ring.refused(at_ms(2), AbuseKind::HandshakeTimedOut);
        let view = ring.view(at_ms(2));
        assert_eq!(view.len(), EVENTS_MAX);
        assert_eq!(
            view[0].event,
            Event::Refused {
                reason: AbuseKind::HandshakeTimedOut,
                count: 1
            }
        );
    }
}
