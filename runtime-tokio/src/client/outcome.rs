//! One request's outcome on its way to the caller awaiting it: a one-shot
//! slot whose sender is called under the broker's lock (the core's
//! dispatch) and whose wake-up waits until that lock is released.
//!
//! Waking the caller while the lock is held would let it run on another
//! thread and block on the lock at once (its next step takes it), which
//! costs two futex calls and a context switch per outcome. So the first
//! send of a lock hold parks the caller's waker in a per-thread cell, and
//! the broker's lock guard ([`super::Locked`]) wakes it once it has
//! unlocked (see [`defer_wake`] for the outcomes after the first).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use ticketing_core::client::{Outcome, OutcomeSender};

/// What the outcomes sent under the lock this thread holds left to wake.
#[derive(Default)]
struct Deferred {
    /// The caller of the first one, until the lock is released.
    waker: Option<Waker>,
    /// Outcomes sent under this hold of the lock.
    sent: usize,
}

thread_local! {
    static DEFERRED: RefCell<Deferred> = RefCell::new(Deferred::default());
}

/// Wakes `waker`, the caller of an outcome just sent under the lock: once
/// the lock is released if it is the first outcome of this lock hold,
/// else at once, with the first. The uncontended path ends one request per
/// dispatch, and its caller must not wake while the lock is still held
/// (it would block on it at once); under load a dispatch ends many, and
/// waking them only after the unlock makes the runtime's workers park and
/// wake each other more (measured: more context switches and smaller
/// writes), so they are woken as they end.
fn defer_wake(waker: Waker) {
    let first = DEFERRED.with(|deferred| {
        let mut deferred = deferred.borrow_mut();
        deferred.sent += 1;
        if deferred.sent == 1 {
            deferred.waker = Some(waker);
            return None;
        }
        Some((deferred.waker.take(), waker))
    });
    if let Some((first, waker)) = first {
        first.into_iter().for_each(Waker::wake);
        waker.wake();
    }
}

/// Wakes the caller whose outcome was deferred; the broker's lock guard
/// calls it right after unlocking.
pub(super) fn wake_deferred() {
    let waker = DEFERRED.with(|deferred| {
        let mut deferred = deferred.borrow_mut();
        deferred.sent = 0;
        deferred.waker.take()
    });
    if let Some(waker) = waker {
        waker.wake();
    }
}

#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    /// The sender was dropped without sending.
    sender_gone: bool,
}

type Shared = Arc<Mutex<Slot>>;

fn lock(slot: &Shared) -> MutexGuard<'_, Slot> {
    // The slot holds plain data and no code runs under its lock that can
    // panic half-way: a poisoned slot is still consistent.
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A slot for one outcome: its sender and its receiver.
pub(super) fn channel() -> (OutcomeTx, OutcomeRx) {
    let slot = Shared::default();
    (OutcomeTx(Some(Arc::clone(&slot))), OutcomeRx(slot))
}

/// Where one request's outcome goes.
pub(super) struct OutcomeTx(Option<Shared>);

impl OutcomeSender for OutcomeTx {
    fn send(mut self, outcome: Outcome) -> Result<(), Outcome> {
        let Some(shared) = self.0.take() else {
            return Err(outcome);
        };
        let mut slot = lock(&shared);
        if Arc::strong_count(&shared) == 1 {
            // The receiver is gone: the outcome is the core's to handle.
            return Err(outcome);
        }
        slot.outcome = Some(outcome);
        if let Some(waker) = slot.waker.take() {
            drop(slot);
            defer_wake(waker);
        }
        Ok(())
    }
}

impl Drop for OutcomeTx {
    fn drop(&mut self) {
        // Not sent: the broker state is being torn down. Rare, so woken at
        // once rather than deferred.
        if let Some(shared) = self.0.take() {
            let waker = {
                let mut slot = lock(&shared);
                slot.sender_gone = true;
                slot.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// Awaits one request's outcome.
pub(super) struct OutcomeRx(Shared);

impl OutcomeRx {
    /// The outcome, if it was sent and not yet taken.
    pub(super) fn try_take(&self) -> Option<Outcome> {
        lock(&self.0).outcome.take()
    }
}

impl Future for OutcomeRx {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut slot = lock(&self.0);
        if let Some(outcome) = slot.outcome.take() {
            return Poll::Ready(outcome);
        }
        if slot.sender_gone {
            // Nothing definite is known.
            return Poll::Ready(Outcome::Indeterminate);
        }
        match &mut slot.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
