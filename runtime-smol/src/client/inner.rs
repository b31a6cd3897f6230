//! The broker-wide state ([`State`]) behind one lock, and what every
//! endpoint task and attempt shares ([`Inner`]): clock, wakes, close flags.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use event_listener::Event;

use ticketing_core::client::{BrokerNotice, BrokerState, KeySet};
use ticketing_core::server::ConnId;
use ticketing_core::time::Instant;

use super::slot::OutcomeTx;
use crate::hub::Hub;
use crate::sync::{Clock, Notify};

pub(super) struct State {
    /// Sessions, router, waiters and the release queue.
    pub(super) broker: BrokerState<OutcomeTx>,
    /// In-process: the server connection of each endpoint's link.
    pub(super) links: Vec<Option<ConnId>>,
    /// In-process: the deadline each endpoint task sleeps until
    /// (`u64::MAX` for none), so a submit wakes it only when it must.
    pub(super) driver_targets_micros: Vec<u64>,
}

/// The embedded server an in-process broker is linked to.
pub(super) struct Memory {
    pub(super) hub: Arc<Hub>,
    /// This broker's name at the hub.
    pub(super) owner: u64,
}

pub(crate) struct Inner {
    pub(super) clock: Clock,
    pub(super) state: Mutex<State>,
    pub(super) memory: Option<Memory>,
    /// Per endpoint: wakes its task (bytes to send, deadline moved, close).
    pub(super) wakes: Vec<Arc<Notify>>,
    /// Some endpoint became ready, authentication failed, or closing.
    pub(super) ready_changed: Event,
    /// The release queue has work, a release finished, or closing.
    pub(super) release_wake: Notify,
    pub(super) closing: AtomicBool,
    /// Set once background releases are drained after a close: sessions
    /// close and endpoint tasks end.
    pub(super) shut_down: AtomicBool,
    pub(super) shut_down_changed: Event,
    /// Live [`TicketBroker`] handles; the last one dropped starts a close.
    pub(super) handles: AtomicUsize,
    pub(super) closed: AtomicBool,
    pub(super) closed_changed: Event,
}

/// A broker known to the embedded server without keeping it alive.
pub(crate) struct Weak(pub(super) std::sync::Weak<Inner>);

impl Weak {
    pub(crate) fn upgrade(&self) -> Option<Arc<Inner>> {
        self.0.upgrade()
    }
    pub(crate) fn strong_count(&self) -> usize {
        self.0.strong_count()
    }
}

/// Waits until `done` holds, re-checking after each notification of `event`.
pub(super) async fn wait_for(event: &Event, done: impl Fn() -> bool) {
    loop {
        if done() {
            return;
        }
        let listener = event.listen();
        if done() {
            return;
        }
        listener.await;
    }
}

impl Inner {
    pub(super) fn new(endpoints: usize, pending_max: usize, memory: Option<Memory>) -> Self {
        // In-process, the broker reads the embedded server's clock: one read
        // serves the session and the server alike.
        let clock = memory
            .as_ref()
            .map_or_else(Clock::start, |memory| memory.hub.clock());
        Inner {
            clock,
            state: Mutex::new(State {
                broker: BrokerState::new(endpoints, pending_max),
                links: vec![None; endpoints],
                driver_targets_micros: vec![u64::MAX; endpoints],
            }),
            memory,
            wakes: (0..endpoints).map(|_| Arc::new(Notify::new())).collect(),
            ready_changed: Event::new(),
            release_wake: Notify::new(),
            closing: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            shut_down_changed: Event::new(),
            handles: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
            closed_changed: Event::new(),
        }
    }

    pub(super) fn now(&self) -> Instant {
        self.clock.now()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves sessions in an unknown state;
        // continuing could hand out a lock twice, so poisoning propagates.
        self.state.lock().expect("client state poisoned")
    }

    /// No new acquires; background releases still run.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Connections are closing or closed.
    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(super) fn start_close(&self) {
        if !self.closing.swap(true, Ordering::AcqRel) {
            self.release_wake.notify_one();
            self.ready_changed.notify(usize::MAX);
        }
    }

    pub(super) fn shut_down_now(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.shut_down_changed.notify(usize::MAX);
        for wake in &self.wakes {
            wake.notify_one();
        }
    }

    /// The embedded server shut down: nothing can be acquired or released
    /// any more, so the broker closes at once (calls fail with `Closed`)
    /// instead of retrying until each call's deadline.
    pub(crate) fn server_gone(&self) {
        self.start_close();
        self.shut_down_now();
    }

    pub(super) async fn wait_shutdown(&self) {
        wait_for(&self.shut_down_changed, || self.is_shut_down()).await;
    }

    /// Queues a background release (dropped ticket or compensation). Full
    /// or expired means dropped: the lease is the safety net.
    pub(super) fn enqueue_release(
        &self,
        state: &mut State,
        now: Instant,
        keys: KeySet,
        token: u64,
    ) {
        state
            .broker
            .enqueue_release(now, keys, token, &mut |notice| self.notice(notice));
    }

    /// Drains `index`'s session events into the router, the waiters and the
    /// release queue.
    pub(super) fn dispatch(&self, state: &mut State, index: usize, now: Instant) {
        state
            .broker
            .dispatch(index, now, &mut |notice| self.notice(notice));
    }

    /// Endpoint `index`'s transport is gone: its session and waiters hear
    /// it.
    pub(super) fn transport_closed(&self, state: &mut State, index: usize, now: Instant) {
        state
            .broker
            .transport_closed(index, now, &mut |notice| self.notice(notice));
    }

    /// Wakes what the broker state reports.
    pub(super) fn notice(&self, notice: BrokerNotice<'_>) {
        match notice {
            BrokerNotice::ReadyChanged => {
                self.ready_changed.notify(usize::MAX);
            }
            BrokerNotice::SessionClosed { .. } => {}
            BrokerNotice::Release { .. } => self.release_wake.notify_one(),
        }
    }
}
