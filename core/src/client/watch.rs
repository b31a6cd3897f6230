//! What a holder knows of its grant while it holds it: the conservative end
//! of its lease and, once the grant is gone, why ([`HolderWatch`]). The
//! ticket moves the end with each renewal, and earlier with what the server
//! pushed about the grant (docs/protocol.md §8.3), which the broker keeps
//! by token until the ticket reads it ([`NewsBoard`]); [`Lost`](super::Lost)
//! futures wake on either. The board is written only when a push arrives,
//! so holding a ticket costs the broker nothing.
//!
//! A push is advisory: it may only ever move the end **earlier**. A push
//! that never arrives changes nothing, because the end already counts the
//! lease from the moment the request was sent.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::Waker;

use crate::time::{Duration, Instant};
use crate::wire::PushKind;

/// Why a holder must stop: its grant is gone, or its own clock says it may
/// be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The server says the lease ran out.
    Expired,
    /// The server says an operator force-released the grant.
    ForceReleased,
    /// The server says the lease ran out at the grant's hold cap.
    CapReached,
    /// A renewal was answered "not current": the grant was released,
    /// expired, force-released or handed over.
    NotCurrent,
    /// The holder's own conservative deadline (or the lead asked for
    /// before it) has come: the server may hand the key over from then on.
    Deadline,
}

impl LossCause {
    fn code(self) -> u8 {
        match self {
            LossCause::Expired => 1,
            LossCause::ForceReleased => 2,
            LossCause::CapReached => 3,
            LossCause::NotCurrent => 4,
            LossCause::Deadline => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => LossCause::Expired,
            2 => LossCause::ForceReleased,
            3 => LossCause::CapReached,
            4 => LossCause::NotCurrent,
            5 => LossCause::Deadline,
            _ => return None,
        })
    }

    /// The cause a lost-kind push names; `None` for a lease-ending warning.
    pub fn of_push(kind: PushKind) -> Option<Self> {
        match kind {
            PushKind::LeaseEnding => None,
            PushKind::Expired => Some(LossCause::Expired),
            PushKind::ForceReleased => Some(LossCause::ForceReleased),
            PushKind::CapReached => Some(LossCause::CapReached),
        }
    }
}

impl std::fmt::Display for LossCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossCause::Expired => "the server expired the lease",
            LossCause::ForceReleased => "an operator force-released the lock",
            LossCause::CapReached => "the lease ran out at its hold cap",
            LossCause::NotCurrent => "a renewal found the grant gone",
            LossCause::Deadline => "the lease is about to end and was not renewed",
        })
    }
}

/// The rate error between the client's and the server's clocks the
/// conservative deadline allows for: 1 part in 200 of the lease.
pub const DRIFT_PARTS: u64 = 200;

/// The shared state of one held grant (see the module docs). Atomics, so a
/// ticket shared by reference can be renewed while its work reads it; a
/// mutex only for the wakers of the futures waiting on it.
#[derive(Debug)]
pub struct HolderWatch {
    /// The conservative end of the lease, in microseconds of the broker's
    /// clock.
    valid_before_us: AtomicU64,
    /// The lease that end was counted with, in microseconds: the drift
    /// margin is a part of it.
    lease_us: AtomicU64,
    /// 0 while held; else a [`LossCause`] code. Set once.
    lost: AtomicU8,
    /// Futures to wake when the end moves or the grant is lost: one per
    /// waiting future, deduplicated, so bounded by the futures polling.
    wakers: Mutex<Vec<Waker>>,
}

impl HolderWatch {
    /// The watch of a grant valid before `valid_before`, counted with a
    /// lease of `lease`.
    pub fn new(valid_before: Instant, lease: Duration) -> Self {
        HolderWatch {
            valid_before_us: AtomicU64::new(valid_before.as_micros()),
            lease_us: AtomicU64::new(duration_us(lease)),
            lost: AtomicU8::new(0),
            wakers: Mutex::new(Vec::new()),
        }
    }

    /// The conservative end of the lease.
    pub fn valid_before(&self) -> Instant {
        Instant::from_micros(self.valid_before_us.load(Ordering::Acquire))
    }

    /// The end with the drift margin taken off: when the holder must be
    /// done, by its own clock, even if that clock runs slow against the
    /// server's by up to 1 part in [`DRIFT_PARTS`] of the lease.
    pub fn deadline(&self) -> Instant {
        let margin_us = self.lease_us.load(Ordering::Acquire) / DRIFT_PARTS;
        Instant::from_micros(
            self.valid_before_us
                .load(Ordering::Acquire)
                .saturating_sub(margin_us),
        )
    }

    /// Why the grant is gone, once it is.
    pub fn lost(&self) -> Option<LossCause> {
        LossCause::from_code(self.lost.load(Ordering::Acquire))
    }

    /// A renewal answered: the end is replaced (a renewal may also shorten
    /// the lease), counted with `lease`.
    pub fn renewed(&self, valid_before: Instant, lease: Duration) {
        if self.lost().is_some() {
            // Nothing brings a lost grant back.
            return;
        }
        self.lease_us.store(duration_us(lease), Ordering::Release);
        self.valid_before_us
            .store(valid_before.as_micros(), Ordering::Release);
        self.wake();
    }

    /// Moves the end no later than `at` (a push, an indeterminate renewal).
    pub fn clip(&self, at: Instant) {
        let before = self
            .valid_before_us
            .fetch_min(at.as_micros(), Ordering::AcqRel);
        if at.as_micros() < before {
            self.wake();
        }
    }

    /// The grant is gone, found at `now`: the end moves to `now` at the
    /// latest and the first cause is kept.
    pub fn lose(&self, now: Instant, cause: LossCause) {
        let _ = self
            .lost
            .compare_exchange(0, cause.code(), Ordering::AcqRel, Ordering::Acquire);
        self.valid_before_us
            .fetch_min(now.as_micros(), Ordering::AcqRel);
        self.wake();
    }

    /// Takes in what the server pushed about this grant: the end moves
    /// earlier, never later, and a loss is kept.
    pub fn apply(&self, news: PushNews) {
        if let Some(lost) = news.lost {
            let _ = self
                .lost
                .compare_exchange(0, lost.code(), Ordering::AcqRel, Ordering::Acquire);
        }
        if let Some(at) = news.valid_before {
            self.clip(at);
        }
        if news.lost.is_some() {
            self.wake();
        }
    }

    /// Registers `waker` to be woken by the next change.
    pub fn register(&self, waker: &Waker) {
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        if !wakers.iter().any(|known| known.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    fn wake(&self) {
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// What the server pushed about one grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushNews {
    /// The earliest end the pushes imply: a warning's receipt plus the
    /// lease it says is left, or a loss's receipt.
    pub valid_before: Option<Instant>,
    /// The first loss pushed.
    pub lost: Option<LossCause>,
}

/// Grants a [`NewsBoard`] keeps news of at most; the oldest goes first.
pub const NEWS_GRANTS_MAX: usize = 4_096;

/// Wakers kept per grant at most (one per future awaiting its loss); the
/// oldest goes first.
pub const NEWS_WAKERS_MAX: usize = 8;

/// The pushes received, by token, until the tickets read them: kept in
/// the broker, bounded by [`NEWS_GRANTS_MAX`] grants (a ticket whose news
/// was pushed out still has its own clock).
#[derive(Debug, Default)]
pub struct NewsBoard {
    grants: HashMap<u64, (PushNews, Vec<Waker>)>,
    /// Tokens in the order they were added, for the bound.
    order: VecDeque<u64>,
}

impl NewsBoard {
    /// A push about grant `token`, received at `now`: a loss ends it at
    /// `now`; a warning that `lease_ms` is left moves its end to
    /// `now + lease_ms` if that is earlier (never later: the server counted
    /// from before the push travelled, so it only ever narrows what the
    /// client knows). Wakes the futures awaiting the grant's loss.
    pub fn pushed(&mut self, now: Instant, token: u64, kind: PushKind, lease_ms: u32) {
        let (news, wakers) = self.entry(token);
        let end = match LossCause::of_push(kind) {
            Some(cause) => {
                news.lost.get_or_insert(cause);
                now
            }
            None => now.saturating_add(Duration::from_millis(u64::from(lease_ms))),
        };
        news.valid_before = Some(news.valid_before.map_or(end, |known| known.min(end)));
        wakers.drain(..).for_each(Waker::wake);
    }

    /// The news of grant `token`; with `waker`, it is also woken by the
    /// next push about the grant.
    pub fn read(&mut self, token: u64, waker: Option<&Waker>) -> PushNews {
        let Some(waker) = waker else {
            return self
                .grants
                .get(&token)
                .map_or_else(PushNews::default, |(news, _)| *news);
        };
        let (news, wakers) = self.entry(token);
        if !wakers.iter().any(|known| known.will_wake(waker)) {
            if wakers.len() == NEWS_WAKERS_MAX {
                wakers.remove(0);
            }
            wakers.push(waker.clone());
        }
        *news
    }

    /// Grants with news or a waiting future.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// True with no news at all.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    fn entry(&mut self, token: u64) -> &mut (PushNews, Vec<Waker>) {
        if !self.grants.contains_key(&token) {
            if self.grants.len() >= NEWS_GRANTS_MAX
                && let Some(oldest) = self.order.pop_front()
            {
                self.grants.remove(&oldest);
            }
            self.order.push_back(token);
        }
        self.grants.entry(token).or_default()
    }
}

fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn watch() -> HolderWatch {
        HolderWatch::new(at_ms(30_000), Duration::from_secs(30))
    }

    fn pushed(watch: &HolderWatch, now: Instant, kind: PushKind, lease_ms: u32) {
        let mut board = NewsBoard::default();
        board.pushed(now, 7, kind, lease_ms);
        watch.apply(board.read(7, None));
    }

    #[test]
    fn a_lease_ending_push_moves_the_end_earlier_and_never_later() {
        let watch = watch();
        pushed(&watch, at_ms(20_000), PushKind::LeaseEnding, 5_000);
        assert_eq!(watch.valid_before(), at_ms(25_000));
        pushed(&watch, at_ms(21_000), PushKind::LeaseEnding, 60_000);
        assert_eq!(watch.valid_before(), at_ms(25_000));
        assert_eq!(watch.lost(), None);
    }

    #[test]
    fn each_lost_push_names_its_cause_and_ends_the_lease_at_its_receipt() {
        for (kind, cause) in [
            (PushKind::Expired, LossCause::Expired),
            (PushKind::ForceReleased, LossCause::ForceReleased),
            (PushKind::CapReached, LossCause::CapReached),
        ] {
            let watch = watch();
            pushed(&watch, at_ms(10_000), kind, 0);
            assert_eq!(watch.lost(), Some(cause));
            assert_eq!(watch.valid_before(), at_ms(10_000));
        }
    }

    #[test]
    fn the_board_keeps_the_earliest_end_and_the_first_loss_of_each_grant() {
        let mut board = NewsBoard::default();
        board.pushed(at_ms(1_000), 7, PushKind::LeaseEnding, 9_000);
        board.pushed(at_ms(2_000), 7, PushKind::LeaseEnding, 30_000);
        assert_eq!(
            board.read(7, None),
            PushNews {
                valid_before: Some(at_ms(10_000)),
                lost: None
            }
        );
        board.pushed(at_ms(3_000), 7, PushKind::ForceReleased, 0);
        board.pushed(at_ms(4_000), 7, PushKind::Expired, 0);
        assert_eq!(
            board.read(7, None),
            PushNews {
                valid_before: Some(at_ms(3_000)),
                lost: Some(LossCause::ForceReleased)
            }
        );
        assert_eq!(board.read(8, None), PushNews::default());
    }

    #[test]
    fn the_board_is_bounded_and_forgets_the_oldest_grant_first() {
        let mut board = NewsBoard::default();
        let waker = Waker::noop();
        for token in 0..(NEWS_GRANTS_MAX as u64 + 10) {
            board.pushed(at_ms(1), token, PushKind::Expired, 0);
            board.read(token, Some(waker));
        }
        assert_eq!(board.len(), NEWS_GRANTS_MAX);
        assert_eq!(board.read(0, None), PushNews::default());
        assert!(board.read(NEWS_GRANTS_MAX as u64 + 9, None).lost.is_some());
    }

    #[test]
    fn the_first_cause_stays_and_a_renewal_never_revives_a_lost_grant() {
        let watch = watch();
        watch.lose(at_ms(5_000), LossCause::ForceReleased);
        watch.lose(at_ms(6_000), LossCause::Expired);
        watch.renewed(at_ms(90_000), Duration::from_secs(60));
        assert_eq!(watch.lost(), Some(LossCause::ForceReleased));
        assert_eq!(watch.valid_before(), at_ms(5_000));
    }

    #[test]
    fn the_deadline_takes_the_drift_margin_of_the_last_lease_off_the_end() {
        let watch = watch();
        // 30 s / 200 = 150 ms.
        assert_eq!(watch.deadline(), at_ms(29_850));
        watch.renewed(at_ms(70_000), Duration::from_secs(60));
        assert_eq!(watch.deadline(), at_ms(69_700));
    }

    #[test]
    fn a_change_wakes_the_registered_futures_once() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let watch = watch();
        watch.register(&waker);
        watch.register(&waker);
        // Later than the end: no change, no wake.
        watch.clip(at_ms(40_000));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        watch.clip(at_ms(20_000));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // Woken wakers are gone until registered again.
        watch.lose(at_ms(21_000), LossCause::Expired);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
