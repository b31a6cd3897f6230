//! Small runtime helpers: a wake-one notification with a stored permit, and
//! the driver clock.

use std::sync::atomic::{AtomicBool, Ordering};

use event_listener::Event;
use ticketing_core::time::{Instant, StdOrigin};

/// Wakes one task; a notification with nobody waiting is kept as a permit
/// (the shape of tokio's `Notify::notify_one`), so a wake is never lost
/// between checking state and starting to wait.
#[derive(Debug, Default)]
pub(crate) struct Notify {
    permit: AtomicBool,
    event: Event,
}

impl Notify {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn notify_one(&self) {
        self.permit.store(true, Ordering::Release);
        self.event.notify(1);
    }

    pub(crate) async fn notified(&self) {
        loop {
            if self.permit.swap(false, Ordering::AcqRel) {
                return;
            }
            let listener = self.event.listen();
            // A notify between the check above and `listen` left a permit.
            if self.permit.swap(false, Ordering::AcqRel) {
                return;
            }
            listener.await;
        }
    }
}

/// A driver's monotonic clock: reads the std clock; the core's
/// [`StdOrigin`] converts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(StdOrigin);

impl Clock {
    pub(crate) fn start() -> Self {
        Clock(StdOrigin::new(std::time::Instant::now()))
    }

    pub(crate) fn now(&self) -> Instant {
        self.0.instant(std::time::Instant::now())
    }

    /// The std instant of a core instant (the origin if it cannot be
    /// represented, which only happens centuries out).
    pub(crate) fn to_std(self, at: Instant) -> std::time::Instant {
        self.0.to_std(at).unwrap_or(self.0.as_std())
    }

    pub(crate) async fn sleep_until(self, at: Instant) {
        async_io::Timer::at(self.to_std(at)).await;
    }
}

/// A duration, or `never` if `at` is `None` (a core without deadlines).
pub(crate) async fn sleep_until_opt(clock: Clock, at: Option<Instant>) {
    match at {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}
