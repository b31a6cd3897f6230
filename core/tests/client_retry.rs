//! The retry of an attempt that had no effect in cluster mode (`E 4`,
//! `M`): the session stays up over `E 4`, the router counts leaders that
//! become reachable, and `run_acquire` retries as soon as one does, or at
//! its fallback instant when none does. A broker over real sessions whose
//! nodes the test plays; the clock is injected and jumped, the futures
//! are polled by hand, nothing sleeps.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use ticketing_core::auth::{Hello, WireMode, client_proof};
use ticketing_core::client::{
    AcquireParams, Broker, BrokerState, ClientError, CloseReason, Grant, KeySet, LEADER_WAKERS_MAX,
    Outcome, OutcomeSender, ProtocolError, ROUTE_RUN_REQUESTS, Router, Session, SessionConfig,
    SessionEvent, run_acquire,
};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Decoded, ErrorCode, NO_LEADER_SLOT, Reply, Request, RequestDecoder};

const CLUSTER_ID: [u8; 32] = [7; 32];
const NODES: usize = 3;

fn key(name: &str) -> KeySet {
    KeySet::single(name).unwrap()
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn drain(session: &mut Session) -> Vec<SessionEvent> {
    std::iter::from_fn(|| session.poll_event()).collect()
}

fn bytes_of(reply: Reply) -> Vec<u8> {
    let mut bytes = Vec::new();
    reply.encode(&mut bytes);
    bytes
}

/// A session to node `slot` of a 3-node cluster, through its handshake.
fn ready_session(now: Instant, slot: u8) -> Session {
    let mut session = Session::new(now, SessionConfig::cluster(b"", CLUSTER_ID, slot, NODES));
    let hello = Hello {
        mode: WireMode::Cluster,
        self_slot: slot,
        nonce: [0x42; 16],
    };
    session.handle_input(now, &hello.encode());
    let mut proof = Vec::new();
    session.poll_transmit(now, &mut proof);
    session.handle_written(now, true);
    assert_eq!(proof, client_proof(b"", &CLUSTER_ID, &hello));
    session.handle_input(now, &[1]);
    session
}

/// Receives one outcome (the broker's one-shot channel).
struct OutcomeSlot(Arc<Mutex<Option<Outcome>>>);

impl OutcomeSender for OutcomeSlot {
    fn send(self, outcome: Outcome) -> Result<(), Outcome> {
        let mut slot = self.0.lock().unwrap();
        assert!(slot.is_none(), "one outcome per attempt");
        *slot = Some(outcome);
        Ok(())
    }
}

/// A broker over real sessions whose bytes the test carries: its clock
/// is the test's, a sleep ends when the test has moved the clock past it.
struct PlayedBroker {
    now_us: AtomicU64,
    state: Mutex<BrokerState<OutcomeSlot>>,
}

impl PlayedBroker {
    /// Nodes 1 and 2 connected; node 0 (the leader that was killed) is
    /// not.
    fn after_the_leader_died() -> Self {
        let now = Instant::from_millis(1_000);
        let mut state = BrokerState::new(NODES, 16);
        for slot in [1, 2] {
            state.sessions[slot] = Some(ready_session(now, slot as u8));
            state.dispatch(slot, now, &mut |_| {});
        }
        assert!(state.router.is_ready(1) && state.router.is_ready(2));
        assert_eq!(state.router.leader(), None);
        PlayedBroker {
            now_us: AtomicU64::new(1_000_000),
            state: Mutex::new(state),
        }
    }

    fn set_now(&self, at: Instant) {
        self.now_us.store(at.as_micros(), Ordering::Relaxed);
    }

    /// The requests node `slot`'s session hands out now.
    fn sent_to(&self, slot: usize) -> Vec<Request> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let mut out = Vec::new();
        if let Some(session) = state.sessions[slot].as_mut() {
            session.poll_transmit(now, &mut out);
            session.handle_written(now, true);
        }
        let mut decoder = RequestDecoder::new();
        decoder.push(&out);
        let mut requests = Vec::new();
        while let Some(decoded) = decoder.next().expect("valid frames") {
            match decoded {
                Decoded::Request(request) => requests.push(request),
                Decoded::Rejected { code, .. } => panic!("rejected with {code:?}"),
            }
        }
        requests
    }

    /// Node `slot` answers with `reply`; its session's events are
    /// dispatched.
    fn answer_from(&self, slot: usize, reply: Reply) {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.sessions[slot]
            .as_mut()
            .expect("connected")
            .handle_input(now, &bytes_of(reply));
        state.dispatch(slot, now, &mut |_| {});
    }

    /// Requests waiting to be handed out, on every session.
    fn unsent(&self) -> usize {
        let state = self.state.lock().unwrap();
        state
            .sessions
            .iter()
            .flatten()
            .map(Session::unsent_len)
            .sum()
    }

    fn session_is_ready(&self, slot: usize) -> bool {
        let state = self.state.lock().unwrap();
        state.sessions[slot].as_ref().is_some_and(Session::is_ready)
    }
}

impl Broker for PlayedBroker {
    fn now(&self) -> Instant {
        Instant::from_micros(self.now_us.load(Ordering::Relaxed))
    }
    fn to_std(&self, _at: Instant) -> std::time::Instant {
        std::time::Instant::now()
    }
    fn submit(
        &self,
        acquire: bool,
        submit: impl FnOnce(Instant, &mut Session) -> Result<u64, ClientError>,
    ) -> Result<impl Future<Output = Outcome> + Send + '_, ClientError> {
        let cell = Arc::new(Mutex::new(None));
        let now = self.now();
        self.state
            .lock()
            .unwrap()
            .submit(now, acquire, submit, OutcomeSlot(Arc::clone(&cell)))?;
        // Polled again by the test after each step it plays.
        Ok(poll_fn(move |_| match cell.lock().unwrap().take() {
            Some(outcome) => Poll::Ready(outcome),
            None => Poll::Pending,
        }))
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + '_ {
        poll_fn(move |_| {
            if self.now() >= at {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
    fn release_in_background(&self, grant: Grant) {
        panic!("nothing is released in the background here: {grant:?}");
    }
    fn leader_epoch(&self, waker: Option<&Waker>) -> u64 {
        self.state.lock().unwrap().leader_epoch(waker)
    }
}

/// Counts its wakes.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// An acquire in flight through `run_acquire`, polled by hand.
struct Acquiring<'a> {
    future: Pin<Box<dyn Future<Output = Result<Grant, ClientError>> + 'a>>,
    wakes: Arc<WakeCount>,
}

impl<'a> Acquiring<'a> {
    fn start(broker: &'a PlayedBroker, wait: Duration) -> Self {
        let params = AcquireParams::new(wait, Duration::from_secs(30), Duration::ZERO).unwrap();
        let mut acquiring = Acquiring {
            future: Box::pin(run_acquire(broker, key("k"), params)),
            wakes: Arc::default(),
        };
        assert!(acquiring.poll().is_none(), "nothing answers yet");
        acquiring
    }
    fn poll(&mut self) -> Option<Result<Grant, ClientError>> {
        let waker = Waker::from(Arc::clone(&self.wakes));
        match self.future.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        }
    }
    fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::Relaxed)
    }
}

/// The one request handed out now, and the slot it went to.
fn one_sent(broker: &PlayedBroker) -> (usize, Request) {
    let mut sent: Vec<(usize, Request)> = (0..NODES)
        .flat_map(|slot| broker.sent_to(slot).into_iter().map(move |r| (slot, r)))
        .collect();
    assert_eq!(sent.len(), 1, "exactly one request out: {sent:?}");
    sent.remove(0)
}

fn no_leader(rid: u64) -> Reply {
    Reply::Error {
        rid,
        code: ErrorCode::NoLeader,
    }
}

#[test]
fn no_leader_answers_that_request_only_and_the_session_goes_on() {
    let now = Instant::from_millis(1_000);
    let mut session = ready_session(now, 1);
    assert_eq!(drain(&mut session), [SessionEvent::Ready]);
    let params = AcquireParams::new(
        Duration::from_secs(5),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .unwrap();
    let first = session
        .submit_acquire(now, key("a"), &params, params.operation_deadline(now))
        .unwrap();
    let second = session
        .submit_acquire(now, key("b"), &params, params.operation_deadline(now))
        .unwrap();
    session.poll_transmit(now, &mut Vec::new());
    session.handle_input(now, &bytes_of(no_leader(first)));
    assert_eq!(
        drain(&mut session),
        [
            SessionEvent::Outcome {
                rid: first,
                outcome: Outcome::Retry
            },
            SessionEvent::NotLeader,
        ]
    );
    assert!(session.is_ready(), "E 4 does not end the session");
    // The node elected itself meanwhile: its notice, then the other
    // request's own reply, each reported once.
    session.handle_input(now, &bytes_of(Reply::Leader { leader_slot: 1 }));
    session.handle_input(
        now,
        &bytes_of(Reply::Acquired {
            rid: second,
            token: 77,
        }),
    );
    let events = drain(&mut session);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], SessionEvent::LeaderHint(Some(1)));
    assert!(matches!(
        &events[1],
        SessionEvent::Outcome { rid, outcome: Outcome::Acquired(grant) }
            if *rid == second && grant.token == 77
    ));
    assert_eq!(session.pending_len(), 0);
    // A second answer to the request `E 4` answered is not taken as its
    // outcome: the rid is unknown now, and the session ends on it.
    session.handle_input(
        now,
        &bytes_of(Reply::Acquired {
            rid: first,
            token: 78,
        }),
    );
    assert_eq!(
        drain(&mut session),
        [SessionEvent::Closed(CloseReason::Protocol(
            ProtocolError::UnknownRid(first)
        ))]
    );
}

#[test]
fn the_leader_epoch_counts_leaders_that_become_reachable_and_nothing_else() {
    let mut router = Router::new(3);
    router.set_ready(1, true);
    assert_eq!(router.leader_epoch(), 0);
    // A leader whose connection is down is nowhere to retry.
    router.handle_event(1, &SessionEvent::LeaderHint(Some(0)));
    assert_eq!((router.leader(), router.leader_epoch()), (Some(0), 0));
    // A notice naming a ready node counts, once.
    router.handle_event(1, &SessionEvent::LeaderHint(Some(1)));
    assert_eq!(router.leader_epoch(), 1);
    router.handle_event(2, &SessionEvent::LeaderHint(Some(1)));
    assert_eq!(router.leader_epoch(), 1, "the same leader again");
    // Forgetting it does not count; the same node named again does.
    router.handle_event(1, &SessionEvent::LeaderHint(None));
    assert_eq!(router.leader_epoch(), 1);
    router.handle_event(1, &SessionEvent::LeaderHint(Some(1)));
    assert_eq!(router.leader_epoch(), 2);
    // The named leader's session coming up counts.
    router.handle_event(1, &SessionEvent::LeaderHint(Some(2)));
    assert_eq!(router.leader_epoch(), 2, "node 2 is not connected");
    router.handle_event(2, &SessionEvent::Ready);
    assert_eq!(router.leader_epoch(), 3);
    router.handle_event(2, &SessionEvent::Closed(CloseReason::TransportClosed));
    assert_eq!((router.leader(), router.leader_epoch()), (None, 3));
}

#[test]
fn no_leader_moves_the_run_to_the_next_ready_connection() {
    let mut router = Router::new(3);
    for index in 0..3 {
        router.set_ready(index, true);
    }
    let first = router.pick_coalescing(|_| 0).unwrap();
    assert_eq!(router.pick_coalescing(|_| 0), Some(first));
    // A node cut off from the others answers E 4 for as long as the cut
    // lasts: the next request goes elsewhere, though its session is up.
    router.handle_event(first, &SessionEvent::NotLeader);
    assert!(router.is_ready(first));
    let next = router.pick_coalescing(|_| 0).unwrap();
    assert_ne!(next, first);
    for _ in 1..ROUTE_RUN_REQUESTS {
        assert_eq!(router.pick_coalescing(|_| 0), Some(next));
    }
}

#[test]
fn an_acquire_answered_no_leader_is_retried_on_the_leader_notice_at_once_on_the_same_session() {
    let broker = PlayedBroker::after_the_leader_died();
    let mut acquiring = Acquiring::start(&broker, Duration::from_secs(5));
    let (slot, request) = one_sent(&broker);
    let Request::Acquire(first) = request else {
        panic!("an acquire: {request:?}")
    };
    // The election is under way: no leader.
    broker.answer_from(slot, no_leader(first.rid));
    assert!(acquiring.poll().is_none());
    assert!(broker.session_is_ready(slot), "the session stays up");
    assert!(
        (0..NODES).all(|s| broker.sent_to(s).is_empty()),
        "nothing is retried before the fallback or a notice"
    );
    // The same node wins and says so on the same connection, with the
    // clock standing still: the retry goes at once, to it.
    broker.answer_from(
        slot,
        Reply::Leader {
            leader_slot: slot as u8,
        },
    );
    assert_eq!(acquiring.wakes(), 1, "the notice wakes the waiting retry");
    assert!(acquiring.poll().is_none());
    let (again_slot, request) = one_sent(&broker);
    let Request::Acquire(retried) = request else {
        panic!("an acquire: {request:?}")
    };
    assert_eq!(again_slot, slot);
    assert_eq!(
        retried.rid,
        first.rid + 1,
        "the next rid of the same session, not a new session's first"
    );
    assert_eq!(retried.keys, first.keys);
    broker.answer_from(
        slot,
        Reply::Acquired {
            rid: retried.rid,
            token: 500,
        },
    );
    let grant = acquiring.poll().expect("granted").expect("a grant");
    assert_eq!(grant.token, 500);
    assert_eq!(grant.keys, key("k"));
    assert_eq!(broker.state.lock().unwrap().leader_wakers_len(), 0);
}

#[test]
fn a_leader_notice_on_another_connection_takes_the_retry_there_at_once() {
    let broker = PlayedBroker::after_the_leader_died();
    let mut acquiring = Acquiring::start(&broker, Duration::from_secs(5));
    let (slot, request) = one_sent(&broker);
    let other = 3 - slot;
    broker.answer_from(slot, no_leader(request.rid()));
    assert!(acquiring.poll().is_none());
    // An `L` from the node that lost names nobody: nothing to retry on.
    broker.answer_from(
        slot,
        Reply::Leader {
            leader_slot: NO_LEADER_SLOT,
        },
    );
    assert!(acquiring.poll().is_none());
    assert!((0..NODES).all(|s| broker.sent_to(s).is_empty()));
    broker.answer_from(
        other,
        Reply::Leader {
            leader_slot: other as u8,
        },
    );
    assert!(acquiring.poll().is_none());
    let (sent_slot, retried) = one_sent(&broker);
    assert_eq!(sent_slot, other);
    broker.answer_from(
        other,
        Reply::Acquired {
            rid: retried.rid(),
            token: 9,
        },
    );
    assert_eq!(
        acquiring.poll().expect("granted").expect("a grant").token,
        9
    );
}

#[test]
fn without_a_leader_notice_the_retry_runs_at_its_fallback_instant_until_the_deadline() {
    let broker = PlayedBroker::after_the_leader_died();
    let started = broker.now();
    let mut acquiring = Acquiring::start(&broker, Duration::from_secs(1));
    let deadline = started.saturating_add(Duration::from_secs(1));
    let mut fallbacks = Vec::new();
    let mut attempts = 0;
    let result = 'attempts: loop {
        let (slot, request) = one_sent(&broker);
        attempts += 1;
        let answered_at = broker.now();
        broker.answer_from(slot, no_leader(request.rid()));
        if let Some(result) = acquiring.poll() {
            break result;
        }
        // No notice comes: nothing goes out until the fallback instant,
        // which the test finds by moving the clock a millisecond at a time.
        let mut at = answered_at;
        loop {
            at = at.saturating_add(ms(1));
            assert!(at <= deadline, "still waiting past the deadline");
            broker.set_now(at);
            if let Some(result) = acquiring.poll() {
                break 'attempts result;
            }
            if broker.unsent() > 0 {
                break;
            }
        }
        fallbacks.push(at.saturating_duration_since(answered_at).as_millis());
    };
    // 10, 20, 40, 80 ms, then every 100 ms, within the acquire's deadline;
    // at the deadline it ends as a wait that ran out.
    assert_eq!(&fallbacks[..5], [10, 20, 40, 80, 100], "{fallbacks:?}");
    assert!(
        fallbacks[4..].iter().all(|&gap| gap <= 100),
        "{fallbacks:?}"
    );
    assert_eq!(result, Err(ClientError::Timeout));
    assert!(attempts >= 12, "{attempts} attempts in 1 s");
    assert!(broker.now() <= deadline);
}

#[test]
fn the_retries_waiting_for_a_leader_notice_are_bounded() {
    let mut state = BrokerState::<OutcomeSlot>::new(NODES, 16);
    let wakers: Vec<Arc<WakeCount>> = (0..LEADER_WAKERS_MAX + 5).map(|_| Arc::default()).collect();
    for count in &wakers {
        state.leader_epoch(Some(&Waker::from(Arc::clone(count))));
    }
    assert_eq!(state.leader_wakers_len(), LEADER_WAKERS_MAX);
    // The notice wakes those kept; the oldest, dropped, run at their
    // fallback instants instead.
    let now = Instant::from_millis(1_000);
    state.sessions[1] = Some(ready_session(now, 1));
    state.dispatch(1, now, &mut |_| {});
    state.sessions[1]
        .as_mut()
        .unwrap()
        .handle_input(now, &bytes_of(Reply::Leader { leader_slot: 1 }));
    state.dispatch(1, now, &mut |_| {});
    assert_eq!(state.leader_wakers_len(), 0);
    let woken: Vec<usize> = wakers.iter().map(|c| c.0.load(Ordering::Relaxed)).collect();
    assert!(woken[..5].iter().all(|&n| n == 0));
    assert!(woken[5..].iter().all(|&n| n == 1));
}
