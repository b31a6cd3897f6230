//! In-process links to the embedded server: the exchange that moves bytes
//! between this broker's sessions and the server, and the endpoint tasks
//! that keep each link up.

use std::sync::Arc;

use async_io::Timer;
use smol::future;

use ticketing_core::client::{Backoff, Session, SessionConfig};
use ticketing_core::time::Instant;

use super::inner::{Inner, State};
use crate::hub::MemoryLink;
use crate::sync::sleep_until_opt;

/// In-memory links per in-process broker: two, like a network broker's two
/// connections to one address, so that a link closed by a cancelled request
/// does not interrupt the other requests' service while it reconnects.
pub(super) const IN_PROCESS_LINKS: usize = 2;

impl Inner {
    /// In-process: moves bytes between every link of this broker and the
    /// server until both sides are idle, then handles what the sessions
    /// report. Links that ended are dropped (their tasks reconnect), and a
    /// task whose session now has an earlier deadline is woken.
    pub(super) fn exchange(&self, state: &mut State, now: Instant) {
        self.exchange_links(state, now, None);
    }

    /// [`Self::exchange`] right after a submit on endpoint `submitted`:
    /// only that session and those the exchange touched can have events or
    /// a new deadline, so the others are not looked at.
    pub(super) fn exchange_after_submit(&self, state: &mut State, now: Instant, submitted: usize) {
        self.exchange_links(state, now, Some(submitted));
    }

    fn exchange_links(&self, state: &mut State, now: Instant, submitted: Option<usize>) {
        let Some(memory) = &self.memory else {
            return;
        };
        // On the stack: an in-process broker has exactly IN_PROCESS_LINKS
        // endpoints, and this runs on every submit.
        let mut batch: [Option<MemoryLink<'_>>; IN_PROCESS_LINKS] = std::array::from_fn(|_| None);
        for ((link, session), conn) in batch
            .iter_mut()
            .zip(state.broker.sessions.iter_mut())
            .zip(&state.links)
        {
            if let (Some(session), Some(conn)) = (session.as_mut(), *conn) {
                *link = Some(MemoryLink {
                    conn,
                    session,
                    closed: false,
                    touched: false,
                });
            }
        }
        // After a submit only the submitted link has something new to
        // send; the server wakes the other's task for anything it hands it.
        let first = submitted.map_or(u64::MAX, |submitted| 1 << submitted);
        memory.hub.exchange(memory.owner, now, first, &mut batch);
        let linked: [Option<(bool, bool)>; IN_PROCESS_LINKS] = std::array::from_fn(|index| {
            batch[index]
                .as_ref()
                .map(|link| (link.closed, link.touched))
        });
        for (index, link) in linked.into_iter().enumerate() {
            let Some((closed, touched)) = link else {
                continue;
            };
            if submitted.is_some_and(|submitted| submitted != index) && !touched {
                continue;
            }
            if closed {
                state.links[index] = None;
                self.wakes[index].notify_one();
            }
            self.dispatch(state, index, now);
            let deadline = state.broker.sessions[index]
                .as_ref()
                .and_then(Session::poll_timeout)
                .map_or(u64::MAX, Instant::as_micros);
            if deadline < state.driver_targets_micros[index] {
                state.driver_targets_micros[index] = deadline;
                self.wakes[index].notify_one();
            }
        }
    }

    /// In-process: opens endpoint `index`'s link and runs its handshake
    /// (in memory, so it is ready when this returns). False if the server
    /// refused the link.
    pub(super) fn open_memory_link(&self, index: usize, config: &SessionConfig) -> bool {
        let Some(memory) = &self.memory else {
            return false;
        };
        let now = self.now();
        let mut state = self.lock();
        let Some(conn) = memory
            .hub
            .connect_memory(memory.owner, Arc::clone(&self.wakes[index]))
        else {
            return false;
        };
        state.broker.open_session(index, now, config);
        state.links[index] = Some(conn);
        self.exchange(&mut state, now);
        true
    }
}

/// Keeps endpoint `index`'s in-memory link up: serves its deadlines and the
/// bytes that arrive while no caller is moving them; reconnects (with the
/// core's backoff) when the session ends.
pub(super) async fn run_memory_endpoint(inner: Arc<Inner>, index: usize, config: SessionConfig) {
    let mut backoff = Backoff::new();
    while !inner.is_shut_down() {
        let linked = inner.lock().links[index].is_some() || inner.open_memory_link(index, &config);
        let delay = if linked {
            drive_memory(&inner, index).await;
            let session = inner.lock().broker.sessions[index].take();
            let Some(delay) = backoff.after_ended(session.as_ref()) else {
                // Authentication failed: reconnecting cannot fix it.
                return;
            };
            delay
        } else {
            backoff.after_connect_failure()
        };
        future::or(
            async {
                Timer::after(delay).await;
            },
            inner.wait_shutdown(),
        )
        .await;
    }
}

/// Runs one in-memory link until it ends.
async fn drive_memory(inner: &Inner, index: usize) {
    loop {
        let deadline = {
            let now = inner.now();
            let mut state = inner.lock();
            let shutdown = inner.is_shut_down();
            let Some(session) = state.broker.sessions[index].as_mut() else {
                return;
            };
            if shutdown {
                session.close_local(now);
            }
            session.handle_timeout(now);
            inner.exchange(&mut state, now);
            if state.links[index].is_none() {
                return;
            }
            let deadline = state.broker.sessions[index]
                .as_ref()
                .and_then(Session::poll_timeout);
            state.driver_targets_micros[index] = deadline.map_or(u64::MAX, Instant::as_micros);
            deadline
        };
        future::or(
            sleep_until_opt(inner.clock, deadline),
            inner.wakes[index].notified(),
        )
        .await;
    }
}
