//! The reply slot one attempt's outcome arrives in, and the sender the core's
//! broker state fills it through.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use ticketing_core::client::{Outcome, OutcomeSender};

/// One attempt's outcome on its way to the caller: filled by
/// [`BrokerState::dispatch`] under the broker lock, taken by the attempt.
/// Only an attempt that has to wait gets one: an in-process outcome
/// delivered while submitting is handed over directly
/// ([`BrokerState::submit_direct`]).
#[derive(Default)]
pub(super) struct ReplySlot(Mutex<SlotState>);

#[derive(Default)]
enum SlotState {
    #[default]
    Empty,
    /// The attempt's future is parked on it.
    Waiting(Waker),
    Filled(Outcome),
    /// The sender went away without an outcome (the broker state was torn
    /// down): nothing definite is known.
    Abandoned,
}

impl ReplySlot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // The slot holds no invariant a panic could break half way.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores `state` and wakes a parked attempt.
    fn put(&self, state: SlotState) {
        let previous = std::mem::replace(&mut *self.lock(), state);
        if let SlotState::Waiting(waker) = previous {
            waker.wake();
        }
    }

    /// The outcome, if it arrived (`Abandoned` reads as Indeterminate).
    pub(super) fn try_take(&self) -> Option<Outcome> {
        let mut state = self.lock();
        match std::mem::take(&mut *state) {
            SlotState::Filled(outcome) => Some(outcome),
            SlotState::Abandoned => Some(Outcome::Indeterminate),
            other => {
                *state = other;
                None
            }
        }
    }

    pub(super) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut state = self.lock();
        match std::mem::take(&mut *state) {
            SlotState::Filled(outcome) => Poll::Ready(outcome),
            SlotState::Abandoned => Poll::Ready(Outcome::Indeterminate),
            SlotState::Waiting(waker) if waker.will_wake(cx.waker()) => {
                *state = SlotState::Waiting(waker);
                Poll::Pending
            }
            SlotState::Waiting(_) | SlotState::Empty => {
                *state = SlotState::Waiting(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Where one request's outcome goes: its attempt's [`ReplySlot`].
pub(super) struct OutcomeTx(pub(super) Option<Arc<ReplySlot>>);

impl OutcomeSender for OutcomeTx {
    fn send(mut self, outcome: Outcome) -> Result<(), Outcome> {
        // The attempt keeps its slot until it took the outcome or cancelled
        // under the broker lock (after which nothing is sent): never refused.
        if let Some(slot) = self.0.take() {
            slot.put(SlotState::Filled(outcome));
        }
        Ok(())
    }
}

impl Drop for OutcomeTx {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.put(SlotState::Abandoned);
        }
    }
}
