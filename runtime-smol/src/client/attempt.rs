//! One submitted request ([`Attempt`]): submitting it under the broker
//! lock, awaiting its outcome, cancelling it when dropped; and the core's
//! [`Broker`] trait on top of that.

use std::future::Future;
use std::sync::Arc;

use smol::future;

use ticketing_core::client::{Broker, Grant, Outcome, PushNews, Session, Submitted};
use ticketing_core::time::Instant;

use super::inner::Inner;
use super::slot::{OutcomeTx, ReplySlot};
use ticketing_core::client::ClientError as TicketError;

impl Inner {
    /// Submits one attempt at `now` on the connection the router picks and
    /// registers its waiter, all under one lock. In-process, the bytes are
    /// moved now.
    fn attempt(
        &self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Submitted<Attempt<'_>>, TicketError> {
        if self.is_shut_down() || (acquire && self.is_closing()) {
            return Err(TicketError::Closed);
        }
        let mut state = self.lock();
        let (index, rid, reply) = if self.memory.is_some() {
            let (index, rid) = state.broker.submit_direct(now, acquire, submit)?;
            self.exchange_after_submit(&mut state, now, index);
            // The embedded server usually answers within the exchange: the
            // outcome is then handed over here, with no slot, wake or wait.
            let mut waiting = None;
            let ready = state.broker.finish_direct(|| {
                let slot = Arc::new(ReplySlot::default());
                waiting = Some(Arc::clone(&slot));
                OutcomeTx(Some(slot))
            });
            match (ready, waiting) {
                // No attempt to keep: nothing is left to cancel or wait for.
                (Some(outcome), _) => return Ok(Submitted::Ready(outcome)),
                (None, Some(slot)) => (index, rid, slot),
                (None, None) => {
                    unreachable!("finish_direct registers a sender when it has no outcome")
                }
            }
        } else {
            let slot = Arc::new(ReplySlot::default());
            let tx = OutcomeTx(Some(Arc::clone(&slot)));
            // On an error the dropped sender marks the slot abandoned, and
            // the slot is not reused.
            let (index, rid) = state.broker.submit(now, acquire, submit, tx)?;
            drop(state);
            self.wakes[index].notify_one();
            (index, rid, slot)
        };
        Ok(Submitted::Waiting(Attempt {
            inner: self,
            index,
            rid,
            reply: Reply::Waiting(reply),
        }))
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
        let attempt = match self.attempt(self.now(), acquire, submit)? {
            // Kept in an attempt until awaited, so that a grant whose future
            // is dropped unpolled is still released. Its endpoint and rid
            // are never used: a delivered outcome has nothing to cancel.
            Submitted::Ready(outcome) => Attempt {
                inner: self,
                index: 0,
                rid: 0,
                reply: Reply::Ready(outcome),
            },
            Submitted::Waiting(attempt) => attempt,
        };
        Ok(attempt.outcome())
    }
    fn submit_at(
        &self,
        now: Instant,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, TicketError>,
    ) -> Result<Submitted<impl Future<Output = Outcome> + Send + '_>, TicketError> {
        Ok(match self.attempt(now, acquire, submit)? {
            Submitted::Ready(outcome) => Submitted::Ready(outcome),
            Submitted::Waiting(attempt) => Submitted::Waiting(attempt.outcome()),
        })
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_ {
        self.clock.sleep_until(at)
    }
    fn release_in_background(&self, grant: Grant) {
        let now = self.now();
        let mut state = self.lock();
        self.enqueue_release(&mut state, now, grant.keys, grant.token);
    }
    fn news(&self, token: u64, waker: Option<&std::task::Waker>) -> PushNews {
        self.lock().broker.news(token, waker)
    }
    fn leader_epoch(&self, waker: Option<&std::task::Waker>) -> u64 {
        self.lock().broker.leader_epoch(waker)
    }
}
