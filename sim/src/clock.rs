//! Time in the simulator: true time (the simulator's) against the drifting,
//! jumping clocks each process sees, and the lease arithmetic both worlds
//! do with the drift bound.

use ticketing_core::time::{Duration, Instant};

use crate::rng::Rng;

/// A server's (or node's) wall clock at true time 0, in microseconds since
/// the Unix epoch: first tokens are taken from it.
pub(crate) const WALL_EPOCH_US: u64 = 1_700_000_000_000_000;
pub(crate) const MILLION: i128 = 1_000_000;

/// A process clock: `local = base + t·(1 + rate) + jumps`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    pub(crate) base_us: u64,
    pub(crate) rate_ppm: i64,
    pub(crate) jump_us: u64,
}

impl Clock {
    /// A clock with a random base and a rate error within `drift_ppm_max`
    /// (two draws from `rng`, base first).
    pub(crate) fn draw(rng: &mut Rng, drift_ppm_max: u32) -> Clock {
        let drift = i64::from(drift_ppm_max);
        Clock {
            base_us: rng.range(1_000_000, 1_000_000_000),
            rate_ppm: rng.range(0, 2 * drift as u64) as i64 - drift,
            jump_us: 0,
        }
    }

    pub(crate) fn local(&self, true_us: u64) -> u64 {
        let scaled = i128::from(true_us) * (MILLION + i128::from(self.rate_ppm)) / MILLION;
        self.base_us + self.jump_us + u64::try_from(scaled).unwrap_or(0)
    }

    /// The first true instant at which this clock shows `local_us` or later
    /// (assuming no further jumps).
    pub(crate) fn true_at(&self, local_us: u64) -> u64 {
        let offset = self.base_us + self.jump_us;
        if local_us <= offset {
            return 0;
        }
        let x = i128::from(local_us - offset);
        let mut t = u64::try_from(x * MILLION / (MILLION + i128::from(self.rate_ppm))).unwrap_or(0);
        while self.local(t) < local_us {
            t += 1;
        }
        t
    }
}

pub(crate) fn instant(us: u64) -> Instant {
    Instant::from_micros(us)
}

/// Whole microseconds of `duration`.
pub(crate) fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The shortest true duration of a lease of `lease_us` timed on a clock
/// that may run fast by `drift_ppm_max`.
pub(crate) fn lease_min_us(lease_us: u64, drift_ppm_max: u32) -> u64 {
    let lease = i128::from(lease_us);
    u64::try_from(lease * MILLION / (MILLION + i128::from(drift_ppm_max))).unwrap_or(0)
}

/// The local instant after which a holder must not act on a grant valid
/// before `valid_before_us` (local) with a lease of `lease_s`: the
/// conservative end shrunk by the drift bound, so that even a slow client
/// clock against a fast server clock stays inside the server's lease.
pub(crate) fn act_before_local_us(valid_before_us: u64, lease_s: u8, drift_ppm_max: u32) -> u64 {
    let drift = i128::from(drift_ppm_max);
    let lease_us = i128::from(lease_s) * MILLION;
    let shrink = lease_us - lease_us * (MILLION - drift) / (MILLION + drift);
    valid_before_us.saturating_sub(u64::try_from(shrink).unwrap_or(u64::MAX))
}
