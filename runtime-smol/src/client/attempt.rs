//! One submitted request ([`Attempt`]): submitting it under the broker
//! lock, awaiting its outcome, cancelling it when dropped; and the core's
//! [`Broker`] trait on top of that.

use std::future::Future;
use std::sync::Arc;

use smol::future;

use ticketing_core::client::{Broker, Grant, Outcome, Session};
use ticketing_core::time::Instant;

use super::inner::Inner;
use super::slot::{OutcomeTx, ReplySlot};
use ticketing_core::client::ClientError as TicketError;

impl Inner {
    /// Submits one attempt on the connection the router picks and registers
    /// its waiter, all under one lock. In-process, the bytes are moved now.
    fn attempt(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Attempt<'_>, TicketError> {
        if self.is_shut_down() || (acquire && self.is_closing()) {
            return Err(TicketError::Closed);
        }
        let now = self.now();
        let mut state = self.lock();
        let slot = state.take_slot();
        let tx = OutcomeTx(Some(Arc::clone(&slot)));
        // On an error the dropped sender marks the slot abandoned, and the
        // slot is not reused.
        let (index, rid) = state.broker.submit(now, acquire, submit, tx)?;
        let reply = if self.memory.is_some() {
            self.exchange_after_submit(&mut state, now, index);
            // The embedded server usually answers within the exchange: the
            // outcome is then handed over here, with no wake and no wait.
            match slot.try_take() {
                Some(outcome) => {
                    state.give_back_slot(slot);
                    Reply::Ready(outcome)
                }
                None => Reply::Waiting(slot),
            }
        } else {
            drop(state);
            self.wakes[index].notify_one();
            Reply::Waiting(slot)
        };
        Ok(Attempt {
            inner: self,
            index,
            rid,
            reply,
        })
    }
}

/// Where an attempt's outcome is.
enum Reply {
    /// Delivered while it was submitted.
    Ready(Outcome),
    /// Still to come, in this slot.
    Waiting(Arc<ReplySlot>),
    /// Handed to the caller.
    Taken,
}

/// One submitted request. Dropping it before its outcome arrives cancels
/// the request in the core: unsent → gone; possibly sent → the session is
/// closed (Indeterminate); a grant that already arrived → released.
struct Attempt<'a> {
    inner: &'a Inner,
    index: usize,
    rid: u64,
    reply: Reply,
}

impl Attempt<'_> {
    async fn outcome(mut self) -> Outcome {
        let outcome = match &self.reply {
            Reply::Ready(_) => None,
            Reply::Waiting(slot) => Some(future::poll_fn(|cx| slot.poll_take(cx)).await),
            Reply::Taken => panic!("outcome awaited once"),
        };
        match std::mem::replace(&mut self.reply, Reply::Taken) {
            Reply::Ready(ready) => ready,
            // Slot reuse only happens under the broker lock; a slot that
            // has waited is simply freed.
            _ => outcome.expect("a waiting reply was awaited"),
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let delivered = match std::mem::replace(&mut self.reply, Reply::Taken) {
            Reply::Taken => return,
            Reply::Ready(outcome) => Some(outcome),
            Reply::Waiting(slot) => {
                let now = self.inner.now();
                let mut state = self.inner.lock();
                if state.broker.cancel(now, self.index, self.rid) {
                    self.inner.dispatch(&mut state, self.index, now);
                    // A cancel may close the session: the link must hear it.
                    self.inner.exchange(&mut state, now);
                    drop(state);
                    self.inner.wakes[self.index].notify_one();
                    return;
                }
                slot.try_take()
            }
        };
        if let Some(Outcome::Acquired(grant)) = delivered {
            // Delivered but never seen by the caller.
            let now = self.inner.now();
            let mut state = self.inner.lock();
            self.inner
                .enqueue_release(&mut state, now, grant.keys, grant.token);
        }
    }
}

impl Broker for Inner {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn to_std(&self, at: Instant) -> std::time::Instant {
        self.clock.to_std(at)
    }
    fn submit(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<impl Future<Output = Outcome> + Send + '_, TicketError> {
        Ok(self.attempt(acquire, submit)?.outcome())
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_ {
        self.clock.sleep_until(at)
    }
    fn release_in_background(&self, grant: Grant) {
        let now = self.now();
        let mut state = self.lock();
        self.enqueue_release(&mut state, now, grant.keys, grant.token);
    }
}
