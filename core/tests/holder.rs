//! A holder's life after the grant, on a broker whose clock the test
//! moves: when [`Ticket::lost`] resolves and why, how renewals and pushes
//! move it, and what [`Ticket::keep_alive`] renews and when it stops.
//! Futures are polled by hand after each jump of the clock; nothing sleeps.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use ticketing_core::client::{
    Broker, ClientError, Grant, KeySet, LossCause, NewsBoard, Outcome, PushNews, RenewEnd,
    RenewPolicy, Session, Ticket,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{ExtendStatus, PushKind};

/// A broker whose clock moves only when the test says, answering each
/// renewal with the next scripted outcome (at once).
struct ClockBroker {
    now_us: AtomicU64,
    answers: Mutex<VecDeque<Outcome>>,
    renewals: AtomicUsize,
    news: Mutex<NewsBoard>,
}

impl ClockBroker {
    fn new() -> Arc<Self> {
        Arc::new(ClockBroker {
            now_us: AtomicU64::new(0),
            answers: Mutex::new(VecDeque::new()),
            renewals: AtomicUsize::new(0),
            news: Mutex::new(NewsBoard::default()),
        })
    }
    fn at(&self, s: f64) {
        self.now_us
            .store((s * 1_000_000.0) as u64, Ordering::SeqCst);
    }
    fn answer(&self, outcome: Outcome) {
        self.answers.lock().unwrap().push_back(outcome);
    }
    /// A renewal to `lease_s` from now, answered `status`.
    fn answer_renewed(&self, lease_s: u64, status: ExtendStatus) {
        let valid_before = Instant::from_micros(self.now_us.load(Ordering::SeqCst))
            .saturating_add(Duration::from_secs(lease_s));
        self.answer(Outcome::Extended {
            status,
            valid_before,
        });
    }
    fn renewals(&self) -> usize {
        self.renewals.load(Ordering::SeqCst)
    }
    /// The server pushes `kind` about `token` to whoever follows it.
    fn push(&self, token: u64, kind: PushKind, lease_ms: u32) {
        let now = Broker::now(self);
        self.news.lock().unwrap().pushed(now, token, kind, lease_ms);
    }
}

/// Ready once the broker's clock reaches `at`.
struct Sleep<'a> {
    broker: &'a ClockBroker,
    at: Instant,
}

impl Future for Sleep<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if Broker::now(self.broker) >= self.at {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Broker for ClockBroker {
    fn now(&self) -> Instant {
        Instant::from_micros(self.now_us.load(Ordering::SeqCst))
    }
    fn to_std(&self, _at: Instant) -> std::time::Instant {
        std::time::Instant::now()
    }
    fn submit(
        &self,
        acquire: bool,
        _submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<impl Future<Output = Outcome> + Send + '_, ClientError> {
        assert!(!acquire, "only renewals are submitted here");
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let outcome = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("a renewal the test did not script");
        Ok(std::future::ready(outcome))
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_ {
        Sleep { broker: self, at }
    }
    fn release_in_background(&self, _grant: Grant) {}
    fn news(&self, token: u64, waker: Option<&Waker>) -> PushNews {
        self.news.lock().unwrap().read(token, waker)
    }
}

const TOKEN: u64 = 7;

/// A ticket granted at 0 s with a 30 s lease.
fn ticket(broker: &Arc<ClockBroker>) -> Ticket {
    Ticket::new(
        Arc::clone(broker),
        Grant {
            keys: KeySet::single("k").unwrap(),
            token: TOKEN,
            valid_before: Instant::from_millis(30_000),
            permits: None,
        },
    )
}

fn poll<F: Future>(future: &mut Pin<&mut F>) -> Poll<F::Output> {
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn lost_resolves_at_the_deadline_less_its_lead_and_not_before() {
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    // The deadline is the lease end less 1/200 of the lease: 29.85 s.
    let mut lost = std::pin::pin!(ticket.lost());
    let mut early = std::pin::pin!(ticket.lost_within(Duration::from_secs(5)));
    broker.at(24.84);
    assert_eq!(poll(&mut lost), Poll::Pending);
    assert_eq!(poll(&mut early), Poll::Pending);
    broker.at(24.85);
    assert_eq!(poll(&mut early), Poll::Ready(LossCause::Deadline));
    broker.at(29.849);
    assert_eq!(poll(&mut lost), Poll::Pending);
    broker.at(29.85);
    assert_eq!(poll(&mut lost), Poll::Ready(LossCause::Deadline));
    assert!(
        !ticket.is_lost(),
        "the deadline passing is not a known loss"
    );
}

#[test]
fn a_renewal_moves_lost_later_and_an_indeterminate_one_only_earlier() {
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    let mut lost = std::pin::pin!(ticket.lost());
    broker.at(10.0);
    assert_eq!(poll(&mut lost), Poll::Pending);
    broker.answer_renewed(60, ExtendStatus::Extended);
    let mut renewal = std::pin::pin!(ticket.extend(Duration::from_secs(60)));
    assert!(matches!(poll(&mut renewal), Poll::Ready(Ok(_))));
    // Past the old deadline, before the new one (70 s less 300 ms).
    broker.at(35.0);
    assert_eq!(poll(&mut lost), Poll::Pending);
    broker.at(69.69);
    assert_eq!(poll(&mut lost), Poll::Pending);

    // An indeterminate renewal of 5 s at 40 s may have cut the lease to
    // 45 s: the end is the earlier of the two.
    broker.at(40.0);
    broker.answer(Outcome::Indeterminate);
    let mut unsure = std::pin::pin!(ticket.extend(Duration::from_secs(5)));
    assert!(matches!(
        poll(&mut unsure),
        Poll::Ready(Err(ClientError::Indeterminate))
    ));
    assert_eq!(ticket.remaining(), Duration::from_secs(5));
    broker.at(45.0);
    assert_eq!(poll(&mut lost), Poll::Ready(LossCause::Deadline));
}

#[test]
fn a_lost_push_ends_lost_with_its_cause_and_refuses_renewal_without_asking() {
    for (kind, cause) in [
        (PushKind::Expired, LossCause::Expired),
        (PushKind::ForceReleased, LossCause::ForceReleased),
        (PushKind::CapReached, LossCause::CapReached),
    ] {
        let broker = ClockBroker::new();
        let ticket = ticket(&broker);
        let mut lost = std::pin::pin!(ticket.lost());
        broker.at(3.0);
        assert_eq!(poll(&mut lost), Poll::Pending);
        // Another grant's push is not this ticket's.
        broker.push(TOKEN + 1, kind, 0);
        assert_eq!(poll(&mut lost), Poll::Pending);
        broker.push(TOKEN, kind, 0);
        assert_eq!(poll(&mut lost), Poll::Ready(cause));
        assert!(ticket.is_lost());
        assert_eq!(ticket.remaining(), Duration::ZERO);
        let mut renewal = std::pin::pin!(ticket.extend(Duration::from_secs(30)));
        assert!(matches!(
            poll(&mut renewal),
            Poll::Ready(Err(ClientError::Lost))
        ));
        assert_eq!(broker.renewals(), 0, "a lost grant is never renewed");
    }
}

#[test]
fn a_lease_ending_push_only_ever_moves_the_deadline_earlier() {
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    broker.at(20.0);
    // 60 s left by the server's count: later than our own end, ignored.
    broker.push(TOKEN, PushKind::LeaseEnding, 60_000);
    assert_eq!(ticket.remaining(), Duration::from_secs(10));
    // 2 s left: our end moves to 22 s.
    broker.push(TOKEN, PushKind::LeaseEnding, 2_000);
    assert_eq!(ticket.remaining(), Duration::from_secs(2));
    assert!(!ticket.is_lost());
}

#[test]
fn keep_alive_renews_every_third_while_the_work_shows_life() {
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    let alive = std::cell::Cell::new(true);
    let checks = std::cell::Cell::new(0);
    let mut renewing = std::pin::pin!(ticket.keep_alive(
        RenewPolicy::thirds(Duration::from_secs(30)),
        || {
            checks.set(checks.get() + 1);
            alive.get()
        }
    ));
    broker.at(9.99);
    assert_eq!(poll(&mut renewing), Poll::Pending);
    assert_eq!(broker.renewals(), 0);
    for (n, at) in [(1, 10.0), (2, 20.0), (3, 30.0)] {
        broker.at(at);
        broker.answer_renewed(30, ExtendStatus::Extended);
        assert_eq!(poll(&mut renewing), Poll::Pending);
        assert_eq!(broker.renewals(), n);
        assert_eq!(checks.get(), n);
    }
    // Held well past the first lease.
    assert_eq!(ticket.remaining(), Duration::from_secs(30));
    alive.set(false);
    broker.at(40.0);
    assert_eq!(poll(&mut renewing), Poll::Ready(RenewEnd::NoProgress));
    assert_eq!(broker.renewals(), 3, "no renewal without life");
}

#[test]
fn keep_alive_stops_when_the_grant_is_gone_at_the_cap_or_not_renewable() {
    let run = |answer: Outcome| {
        let broker = ClockBroker::new();
        let ticket = ticket(&broker);
        broker.answer(answer);
        let mut renewing = std::pin::pin!(
            ticket.keep_alive(RenewPolicy::thirds(Duration::from_secs(30)), || true)
        );
        broker.at(10.0);
        let end = poll(&mut renewing);
        (end, ticket.is_lost())
    };
    assert_eq!(
        run(Outcome::NotFound),
        (Poll::Ready(RenewEnd::Lost(LossCause::NotCurrent)), true)
    );
    assert_eq!(
        run(Outcome::Extended {
            status: ExtendStatus::AtCap,
            valid_before: Instant::from_millis(30_000),
        }),
        (Poll::Ready(RenewEnd::AtCap), false)
    );
    // A push that the grant is gone ends renewal at its next turn without
    // a renewal.
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    let mut renewing =
        std::pin::pin!(ticket.keep_alive(RenewPolicy::thirds(Duration::from_secs(30)), || true));
    broker.at(5.0);
    assert_eq!(poll(&mut renewing), Poll::Pending);
    broker.push(TOKEN, PushKind::ForceReleased, 0);
    broker.at(10.0);
    assert_eq!(
        poll(&mut renewing),
        Poll::Ready(RenewEnd::Lost(LossCause::ForceReleased))
    );
    assert_eq!(broker.renewals(), 0);
}

#[test]
fn a_failed_renewal_is_tried_again_at_the_next_turn_while_the_deadline_bounds_the_work() {
    let broker = ClockBroker::new();
    let ticket = ticket(&broker);
    let mut renewing =
        std::pin::pin!(ticket.keep_alive(RenewPolicy::thirds(Duration::from_secs(30)), || true));
    broker.at(10.0);
    broker.answer(Outcome::Indeterminate);
    assert_eq!(poll(&mut renewing), Poll::Pending);
    assert_eq!(broker.renewals(), 1);
    // The end became the earlier of 30 s and 10 s + 30 s.
    assert_eq!(ticket.remaining(), Duration::from_secs(20));
    broker.at(20.0);
    broker.answer_renewed(30, ExtendStatus::Extended);
    assert_eq!(poll(&mut renewing), Poll::Pending);
    assert_eq!(broker.renewals(), 2);
    assert_eq!(ticket.remaining(), Duration::from_secs(30));
}
