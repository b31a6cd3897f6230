//! Monotonic time as the driver sees it.
//!
//! The core never reads a clock: every input carries `now`, an [`Instant`]
//! counted in microseconds from an origin the driver picks (process start,
//! simulation start). Durations are plain [`core::time::Duration`]s.

pub use core::time::Duration;

/// A point on the driver's monotonic clock, in microseconds since the
/// driver's origin.
///
/// Exactly a `u64` in memory (`repr(transparent)`), so the packed per-key
/// structures that store one (the lock table's entry, the held-count heap)
/// cost no more than the raw number did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct Instant(u64);

impl Instant {
    /// The driver's origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `micros` microseconds after the origin.
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros)
    }

    /// The instant `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1000))
    }

    /// Microseconds since the origin.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// `self + duration`, saturating at the end of time instead of wrapping.
    pub fn saturating_add(self, duration: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_micros(duration)))
    }

    /// `self - duration`, saturating at the origin.
    pub fn saturating_sub(self, duration: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_micros(duration)))
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

/// A driver's origin on the std monotonic clock: converts between
/// `std::time::Instant`s and [`Instant`]s (microseconds since the origin).
/// It reads no clock itself; the driver passes the std instants in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StdOrigin(std::time::Instant);

impl StdOrigin {
    /// An origin at `origin` (usually when the driver started).
    pub fn new(origin: std::time::Instant) -> Self {
        StdOrigin(origin)
    }

    /// The origin as a std instant.
    pub fn as_std(self) -> std::time::Instant {
        self.0
    }

    /// `at` as an [`Instant`]: the origin if `at` is earlier, the end of time
    /// if it is beyond `u64::MAX` microseconds.
    pub fn instant(self, at: std::time::Instant) -> Instant {
        Instant::ZERO.saturating_add(at.saturating_duration_since(self.0))
    }

    /// The std instant of `at`; `None` if the platform clock cannot
    /// represent it (centuries out).
    pub fn to_std(self, at: Instant) -> Option<std::time::Instant> {
        self.0.checked_add(Duration::from_micros(at.as_micros()))
    }
}

/// A duration in whole microseconds, saturating at `u64::MAX`.
pub fn duration_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A duration in whole milliseconds (rounded down), saturating at
/// `u64::MAX`.
pub fn duration_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_origin_round_trips_and_saturates() {
        let start = std::time::Instant::now();
        let origin = StdOrigin::new(start);
        let later = start + Duration::from_micros(1500);
        assert_eq!(origin.instant(later), Instant::from_micros(1500));
        assert_eq!(origin.to_std(Instant::from_micros(1500)), Some(later));
        assert_eq!(origin.instant(start), Instant::ZERO);
        let before = StdOrigin::new(later);
        assert_eq!(before.instant(start), Instant::ZERO);
    }

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let late = Instant::from_micros(u64::MAX - 1);
        assert_eq!(
            late.saturating_add(Duration::from_secs(1)).as_micros(),
            u64::MAX
        );
        assert_eq!(
            Instant::ZERO.saturating_sub(Duration::from_secs(1)),
            Instant::ZERO
        );
        assert_eq!(
            Instant::from_millis(5).saturating_duration_since(Instant::from_millis(7)),
            Duration::ZERO
        );
        assert_eq!(
            Instant::from_millis(7).saturating_duration_since(Instant::from_millis(5)),
            Duration::from_millis(2)
        );
    }
}
