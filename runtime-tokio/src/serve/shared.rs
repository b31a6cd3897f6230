//! The clock, the state every task shares (the core behind its mutex and
//! the notifications between tasks), the drain of the core's outputs after
//! an input, and the timer task.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use ticketing_core::hash::IdMap;
use ticketing_core::machine::{Machine, Output};
use ticketing_core::server::ConnId;
use ticketing_core::time::{Instant, StdOrigin};

use super::log::{log_event, log_node_event, log_token_alert};
use crate::admin;

/// The driver's monotonic clock: reads the std clock; the core's
/// [`StdOrigin`] converts.
#[derive(Debug)]
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
    pub(crate) fn to_std(&self, at: Instant) -> std::time::Instant {
        self.0.to_std(at).unwrap_or(self.0.as_std())
    }

    /// The tokio instant of a core instant; `None` if it is beyond what the
    /// platform clock can represent (never, in practice).
    fn to_tokio(&self, at: Instant) -> Option<tokio::time::Instant> {
        self.0.to_std(at).map(tokio::time::Instant::from_std)
    }
}

pub(crate) struct Shared<M> {
    inner: Mutex<Inner<M>>,
    pub(crate) clock: Clock,
    /// Wakes the timer task when its deadline may have moved earlier.
    timer: Notify,
    /// Asks the supervisor to shut down.
    pub(crate) stop: Notify,
    /// Tells the supervisor that the core asked for dials.
    pub(super) dial: Notify,
    /// During shutdown: something changed, the supervisor re-checks
    /// [`Machine::quiesced`].
    pub(super) progress: Notify,
    /// Tells the persister that the core asked for a reserve write.
    pub(super) persist: Notify,
}

impl<M> std::fmt::Debug for Shared<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<M: Machine> Shared<M> {
    pub(crate) fn new(core: M, clock: Clock) -> Arc<Self> {
        Arc::new(Shared {
            inner: Mutex::new(Inner {
                core,
                wakers: IdMap::default(),
                timer_target_micros: u64::MAX,
                dials: Vec::new(),
                reserve_request: None,
                admin: admin::PendingAdmin::default(),
            }),
            clock,
            timer: Notify::new(),
            stop: Notify::new(),
            dial: Notify::new(),
            progress: Notify::new(),
            persist: Notify::new(),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<M>> {
        // A panic inside the core leaves its state unknown; serving on from
        // it could break mutual exclusion, so every task stops instead.
        self.inner
            .lock()
            .expect("server state poisoned by an earlier panic")
    }

    /// The lock for a `Drop`: `None` instead of a second panic (which would
    /// abort) if an earlier panic poisoned it.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, Inner<M>>> {
        self.inner.lock().ok()
    }
}

pub(crate) struct Inner<M> {
    pub(crate) core: M,
    /// The task to notify for each open connection.
    pub(super) wakers: IdMap<ConnId, Arc<Notify>>,
    /// The deadline the timer task sleeps until, `u64::MAX` for none.
    timer_target_micros: u64,
    /// Slots the core asked to dial, not yet picked up by the supervisor.
    pub(super) dials: Vec<u8>,
    /// A reserve write the core asked for, not yet picked up by the
    /// persister (the core asks for one at a time).
    pub(super) reserve_request: Option<u64>,
    /// Force-releases waiting for the core's answer.
    pub(crate) admin: admin::PendingAdmin,
}

impl<M: Machine> Inner<M> {
    /// Drains the core's outputs after an input: notifies every woken
    /// connection but `me` and says whether `me` was woken; hands dials to
    /// the supervisor, the reserve write to the persister and admin answers
    /// to their waiters; logs the reports. Then tells the timer if the
    /// input made the next deadline earlier, and (during shutdown) the
    /// supervisor.
    pub(crate) fn dispatch(&mut self, shared: &Shared<M>, me: Option<ConnId>) -> bool {
        let now = shared.clock.now();
        let mut mine = false;
        let dials_before = self.dials.len();
        while let Some(output) = self.core.poll_output(now) {
            match output {
                Output::Wake(conn) => {
                    if Some(conn) == me {
                        mine = true;
                    } else if let Some(waker) = self.wakers.get(&conn) {
                        waker.notify_one();
                    }
                    // A wake for a connection without a waker is for one
                    // that is being closed right now; its task is already
                    // finishing.
                }
                Output::Dial { slot } => self.dials.push(slot),
                Output::Reserve { value } => {
                    self.reserve_request = Some(value);
                    shared.persist.notify_one();
                }
                Output::AdminReply { id, outcome } => self.admin.answer(id, outcome),
                Output::Log(event) => log_event(event),
                Output::Alert(alert) => log_token_alert(alert),
                Output::Node(event) => log_node_event(self.core.node_id(), event),
            }
        }
        if self.dials.len() > dials_before {
            shared.dial.notify_one();
        }
        let deadline = self
            .core
            .poll_timeout()
            .map_or(u64::MAX, Instant::as_micros);
        if deadline < self.timer_target_micros {
            self.timer_target_micros = deadline;
            shared.timer.notify_one();
        }
        if self.core.is_shutting_down() {
            shared.progress.notify_one();
        }
        mine
    }
}

/// Sleeps until the core's next deadline, then hands it the time.
pub(super) async fn run_timer<M: Machine>(shared: Arc<Shared<M>>) {
    loop {
        let deadline = {
            let mut inner = shared.lock();
            let deadline = inner.core.poll_timeout();
            inner.timer_target_micros = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        match deadline.and_then(|at| shared.clock.to_tokio(at)) {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        let mut inner = shared.lock();
                        let now = shared.clock.now();
                        inner.core.handle_timeout(now);
                        inner.dispatch(&shared, None);
                    }
                    () = shared.timer.notified() => {}
                }
            }
            None => shared.timer.notified().await,
        }
    }
}
