//! What a holder does when its lease is about to lapse: when to ask the
//! guarded work to stop, and when to make it stop, so that it is gone
//! before anyone else could be granted the key. The CLI's `ticketing lock`
//! runs its command under this plan; the rule lives here so that every
//! runtime stops its work by the same clock.

use std::time::Duration;

/// How long before the conservative deadline the hard stop lands: the
/// kill is a signal, and the process takes a moment to die.
pub const STOP_MARGIN: Duration = Duration::from_millis(250);

/// When to stop guarded work, counted from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopPlan {
    /// Ask the work to stop (SIGTERM) after this long.
    pub ask_in: Duration,
    /// Make it stop (SIGKILL) after this long: [`STOP_MARGIN`] before the
    /// deadline, or at once when less is left.
    pub force_in: Duration,
}

impl StopPlan {
    /// The plan for work whose lock may be lost `left` from now, with
    /// `grace` wanted between asking and forcing. The grace is shortened to
    /// at most half of the time before the forced stop, so a short lease
    /// still gives the work time to run and the forced stop always lands
    /// before the deadline.
    pub fn for_deadline(left: Duration, grace: Duration) -> StopPlan {
        let force_in = left.saturating_sub(STOP_MARGIN);
        let grace = grace.min(force_in / 2);
        StopPlan {
            ask_in: force_in - grace,
            force_in,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_long_lease_asks_grace_before_and_forces_the_margin_before_the_deadline() {
        let plan = StopPlan::for_deadline(secs(30.0), secs(3.0));
        assert_eq!(plan.force_in, secs(29.75));
        assert_eq!(plan.ask_in, secs(26.75));
    }

    #[test]
    fn a_short_lease_shortens_the_grace_to_half_the_time_left() {
        let plan = StopPlan::for_deadline(secs(2.25), secs(3.0));
        assert_eq!(plan.force_in, secs(2.0));
        assert_eq!(plan.ask_in, secs(1.0));
    }

    #[test]
    fn with_no_time_left_both_are_at_once() {
        for left in [Duration::ZERO, STOP_MARGIN, STOP_MARGIN / 2] {
            let plan = StopPlan::for_deadline(left, secs(3.0));
            assert_eq!(
                plan,
                StopPlan {
                    ask_in: Duration::ZERO,
                    force_in: Duration::ZERO
                }
            );
        }
    }

    #[test]
    fn the_forced_stop_is_never_after_the_deadline_nor_before_the_ask() {
        for left_ms in (0..5_000).step_by(37) {
            for grace_ms in [0, 1, 500, 3_000, 60_000] {
                let left = Duration::from_millis(left_ms);
                let plan = StopPlan::for_deadline(left, Duration::from_millis(grace_ms));
                assert!(plan.force_in <= left);
                assert!(plan.ask_in <= plan.force_in);
                if left > STOP_MARGIN {
                    assert_eq!(plan.force_in + STOP_MARGIN, left);
                }
            }
        }
    }
}
