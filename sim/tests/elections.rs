//! Randomized worlds of an election (docs/protocol.md §8.6) against the
//! single-mode server, over bytes and with the clock jumped: campaigners
//! campaign with their label (a FIFO acquire of the election key), take
//! office, act on a fenced resource with their term, renew, resign, crash
//! (a campaign sent just before the crash may be granted and never read: a
//! ghost grant the server releases), and observers ask who leads (`O`).
//! Three checkers judge every step, and each has a planted bug that it
//! alone catches:
//! - **terms** (`HandoffReusesTerm`): every new leader's term is above
//!   every earlier one, and the resource never accepts writes of one term
//!   from two campaigners, nor a write of a term older than the newest
//!   granted;
//! - **FIFO** (`SkipWaiter`): leadership passes in campaign order;
//! - **observe** (`ObserveDepartedAsNone`): an observe answers the leader
//!   (label, term, and whether its connection is still open) at the instant
//!   it is served, or "no leader" only when nobody holds the key.
//!
//! The checkers' view of who leads comes from what the campaigners were
//! told (grants, renewals, resignations, their own crashes), never from the
//! server's state. In this network every request of a step is served at the
//! step's instant and every reply is read in the step it is sent, so a
//! grant's lease runs from the step it is read in.

mod common;

use common::{Judged, Rng};

use std::collections::HashMap;

use ticketing_core::machine::Machine;
use ticketing_core::server::ConnId;
use ticketing_core::testing::net::SingleNet;
use ticketing_core::testing::planted::PlantedBug;
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    AcquireRequest, Capabilities, EXTENSION_VERSION, ExtendRequest, Key, KeyGroup, LeaderState,
    NegotiateRequest, ObserveRequest, Observed, ReleaseRequest, Reply, Request,
};

const ELECTION: &str = "leader";
const CAMPAIGNERS: usize = 5;
const OBSERVERS: usize = 2;
const STEPS: usize = 400;

/// The checkers, in the order of [`Verdict::fired`].
const CHECKERS: [&str; 3] = ["terms", "fifo", "observe"];
const TERMS: usize = 0;
const FIFO: usize = 1;
const OBSERVE: usize = 2;

/// What a campaigner's request was.
#[derive(Clone, Copy, Debug)]
enum Sent {
    /// A campaign, the `arrival`-th of the world, asking `lease_s`.
    Campaign { arrival: u64, lease_s: u8 },
    /// A renewal of `term`.
    Renew { term: u64, lease_s: u8 },
    /// A resignation of `term`.
    Resign,
    /// An observe.
    Observe,
}

struct Campaigner {
    conn: ConnId,
    label: String,
    next_rid: u64,
    pending: HashMap<u64, Sent>,
    /// A campaign sent and not answered.
    campaigning: bool,
    /// In office: the term, and until when the campaigner believes so.
    leading: Option<(u64, Instant)>,
    /// The term of an office lost (lease run out, renewal refused): a
    /// paused process may still act on it.
    stale: Option<u64>,
    /// The step its last campaign was sent in.
    sent_at_step: usize,
}

fn connect(h: &mut SingleNet, label: String) -> Campaigner {
    let conn = h.connect();
    let negotiate = Request::Negotiate(NegotiateRequest {
        rid: 1,
        version: EXTENSION_VERSION,
        wanted: Capabilities::KNOWN,
        label: label.clone(),
    });
    let replies = h.call(conn, &negotiate);
    assert!(
        matches!(replies[..], [Reply::Negotiated { granted, .. }] if granted.contains(Capabilities::OBSERVE)),
        "{replies:?}"
    );
    Campaigner {
        conn,
        label,
        next_rid: 2,
        pending: HashMap::new(),
        campaigning: false,
        leading: None,
        stale: None,
        sent_at_step: 0,
    }
}

impl Campaigner {
    fn send(&mut self, h: &mut SingleNet, sent: Sent, request: impl FnOnce(u64) -> Request) {
        let rid = self.next_rid;
        self.next_rid += 1;
        self.pending.insert(rid, sent);
        h.send(self.conn, &request(rid));
    }
}

/// The leader as the campaigners' replies tell it.
#[derive(Clone, Debug)]
struct Leader {
    term: u64,
    label: String,
    lease_deadline: Instant,
    /// Its campaigner crashed: the grant outlives the connection.
    departed: bool,
    /// Its campaigner, while it runs.
    who: Option<usize>,
}

/// The fenced resource leaders act on: it accepts a write whose term is
/// at least the highest it has seen.
#[derive(Default)]
struct Resource {
    high_water: u64,
    /// Who wrote under each term accepted.
    writers: HashMap<u64, String>,
}

/// What a world did, and the first thing each checker saw.
#[derive(Debug, Default)]
struct Verdict {
    fired: [Option<String>; 3],
    grants: usize,
    handovers: usize,
    observed_leader: usize,
    observed_departed: usize,
    observed_none: usize,
    accepted: usize,
    fenced_off: usize,
}

impl Judged<3> for Verdict {
    fn fired(&self) -> &[Option<String>; 3] {
        &self.fired
    }
}

impl Verdict {
    fn fire(&mut self, checker: usize, step: usize, what: String) {
        self.fired[checker].get_or_insert(format!("step {step}: {what}"));
    }
}

struct World {
    h: SingleNet,
    rng: Rng,
    key: Key,
    campaigners: Vec<Campaigner>,
    observers: Vec<Campaigner>,
    generation: usize,
    arrivals: u64,
    /// Campaigns waiting: arrival → campaigner.
    waiting: HashMap<u64, usize>,
    leader: Option<Leader>,
    term_max: u64,
    resource: Resource,
    verdict: Verdict,
}

impl World {
    fn new(seed: u64) -> World {
        let mut h = SingleNet::default();
        let campaigners = (0..CAMPAIGNERS)
            .map(|i| connect(&mut h, format!("c{i}.0")))
            .collect();
        let observers = (0..OBSERVERS)
            .map(|i| connect(&mut h, format!("o{i}")))
            .collect();
        World {
            h,
            rng: Rng::of_world(seed),
            key: Key::from_text(ELECTION).unwrap(),
            campaigners,
            observers,
            generation: 0,
            arrivals: 0,
            waiting: HashMap::new(),
            leader: None,
            term_max: 0,
            resource: Resource::default(),
            verdict: Verdict::default(),
        }
    }

    fn keys(&self) -> KeyGroup {
        KeyGroup::single(self.key.clone())
    }

    fn run(mut self) -> Verdict {
        for step in 0..STEPS {
            let now = self.h.now;
            for campaigner in &mut self.campaigners {
                if let Some((term, until)) = campaigner.leading
                    && now >= until
                {
                    campaigner.leading = None;
                    campaigner.stale = Some(term);
                }
            }
            let who = self.rng.below(CAMPAIGNERS as u64) as usize;
            match self.rng.below(100) {
                0..30 => self.campaign(who, step),
                30..42 => self.renew(who),
                42..50 => self.resign(who),
                50..62 => self.act(who, step),
                62..78 => self.observe(step),
                78..95 => {
                    let by = Duration::from_millis(self.rng.below(1_500));
                    self.h.advance(by);
                }
                _ => self.crash(who),
            }
            self.read_replies(step);
        }
        self.verdict
    }

    fn campaign(&mut self, who: usize, step: usize) {
        let campaigner = &self.campaigners[who];
        if campaigner.campaigning || campaigner.leading.is_some() {
            return;
        }
        self.arrivals += 1;
        let arrival = self.arrivals;
        let lease_s = 1 + self.rng.below(3) as u8;
        let wait_s = self.rng.below(5) as u8;
        let keys = self.keys();
        let campaigner = &mut self.campaigners[who];
        campaigner.campaigning = true;
        campaigner.sent_at_step = step;
        self.waiting.insert(arrival, who);
        campaigner.send(&mut self.h, Sent::Campaign { arrival, lease_s }, |rid| {
            Request::Acquire(AcquireRequest {
                rid,
                wait_s,
                lease_s,
                keys,
                set: false,
            })
        });
    }

    fn renew(&mut self, who: usize) {
        let Some((term, _)) = self.campaigners[who].leading else {
            return;
        };
        let lease_s = 1 + self.rng.below(3) as u8;
        let keys = self.keys();
        self.campaigners[who].send(&mut self.h, Sent::Renew { term, lease_s }, |rid| {
            Request::Extend(ExtendRequest {
                rid,
                token: term,
                lease_s,
                keys,
            })
        });
    }

    /// A resignation: the campaigner stops acting at once, and the next
    /// candidate in line takes office at this instant.
    fn resign(&mut self, who: usize) {
        let Some((term, _)) = self.campaigners[who].leading.take() else {
            return;
        };
        if self
            .leader
            .as_ref()
            .is_some_and(|leader| leader.term == term)
        {
            self.leader = None;
        }
        let keys = self.keys();
        self.campaigners[who].send(&mut self.h, Sent::Resign, |rid| {
            Request::Release(ReleaseRequest {
                rid,
                token: term,
                keys,
                set: false,
            })
        });
    }

    /// A leader writes with its term; a deposed one (a paused process
    /// that has not noticed) sometimes does too.
    fn act(&mut self, who: usize, step: usize) {
        let campaigner = &self.campaigners[who];
        let term = match (campaigner.leading, campaigner.stale) {
            (Some((term, _)), _) => term,
            (None, Some(term)) if self.rng.below(2) == 0 => term,
            _ => return,
        };
        let label = campaigner.label.clone();
        self.write(term, label, step);
    }

    /// The resource's rule, then the terms checker on what it accepted.
    fn write(&mut self, term: u64, writer: String, step: usize) {
        if term < self.resource.high_water {
            self.verdict.fenced_off += 1;
            return;
        }
        self.resource.high_water = term;
        self.verdict.accepted += 1;
        if term < self.term_max {
            self.verdict.fire(
                TERMS,
                step,
                format!(
                    "a write of term {term} accepted after term {} was granted",
                    self.term_max
                ),
            );
        }
        let first = self.resource.writers.entry(term).or_insert(writer.clone());
        if *first != writer {
            let first = first.clone();
            self.verdict.fire(
                TERMS,
                step,
                format!("{first} and {writer} both acted on term {term}"),
            );
        }
    }

    fn observe(&mut self, step: usize) {
        let at = self.rng.below(OBSERVERS as u64) as usize;
        let name = self.key.clone();
        let observer = &mut self.observers[at];
        observer.send(&mut self.h, Sent::Observe, |rid| {
            Request::Observe(ObserveRequest { rid, name })
        });
        let conn = observer.conn;
        for reply in self.h.replies(conn) {
            let Reply::Observed { rid, observed } = reply else {
                self.verdict
                    .fire(OBSERVE, step, format!("unexpected {reply:?}"));
                continue;
            };
            self.observers[at].pending.remove(&rid);
            self.judge_observed(observed, step);
        }
    }

    /// The observe checker: the answer is the leader at this instant.
    fn judge_observed(&mut self, observed: Observed, step: usize) {
        let now = self.h.now;
        let leader = self
            .leader
            .as_ref()
            .filter(|leader| leader.lease_deadline > now);
        let honest = match leader {
            None => observed == Observed::NO_LEADER,
            Some(leader) => {
                let state = if leader.departed {
                    LeaderState::Departed
                } else {
                    LeaderState::Connected
                };
                observed.state == state
                    && observed.term == leader.term
                    && observed.label.as_str() == leader.label
            }
        };
        match (leader, observed.state) {
            (None, _) => self.verdict.observed_none += 1,
            (Some(_), LeaderState::Departed) => self.verdict.observed_departed += 1,
            (Some(_), _) => self.verdict.observed_leader += 1,
        }
        if !honest {
            self.verdict.fire(
                OBSERVE,
                step,
                format!("observe answered {observed:?}, the leader is {leader:?}"),
            );
        }
    }

    /// The campaigner's process dies. Half the time it sends a campaign
    /// just before: granted at once if the key is free, the grant is never
    /// read, and the server must release it with the connection.
    fn crash(&mut self, who: usize) {
        if self.rng.below(2) == 0 {
            let keys = self.keys();
            self.campaigners[who].send(
                &mut self.h,
                Sent::Campaign {
                    arrival: 0,
                    lease_s: 3,
                },
                |rid| {
                    Request::Acquire(AcquireRequest {
                        rid,
                        wait_s: 0,
                        lease_s: 3,
                        keys,
                        set: false,
                    })
                },
            );
        }
        let now = self.h.now;
        self.h.server.handle_closed(now, self.campaigners[who].conn);
        self.waiting.retain(|_, &mut waiter| waiter != who);
        if let Some(leader) = &mut self.leader
            && leader.who == Some(who)
        {
            leader.departed = true;
            leader.who = None;
        }
        self.generation += 1;
        let label = format!("c{who}.{}", self.generation);
        self.campaigners[who] = connect(&mut self.h, label);
    }

    fn read_replies(&mut self, step: usize) {
        // Every reply of the step first: a timeout read after a grant of
        // the same step still ended before it.
        let mut grants = Vec::new();
        for who in 0..CAMPAIGNERS {
            let conn = self.campaigners[who].conn;
            for reply in self.h.replies(conn) {
                let Some(rid) = reply.rid() else { continue };
                let Some(sent) = self.campaigners[who].pending.remove(&rid) else {
                    continue;
                };
                match (sent, reply) {
                    (Sent::Campaign { arrival, lease_s }, Reply::Acquired { token, .. }) => {
                        grants.push((token, who, arrival, lease_s));
                    }
                    (Sent::Campaign { arrival, .. }, Reply::TimedOut { .. }) => {
                        self.waiting.remove(&arrival);
                        self.campaigners[who].campaigning = false;
                    }
                    (Sent::Renew { term, lease_s }, Reply::Extended { .. }) => {
                        let until = self
                            .h
                            .now
                            .saturating_add(Duration::from_secs(u64::from(lease_s)));
                        let campaigner = &mut self.campaigners[who];
                        if campaigner.leading.is_some_and(|(held, _)| held == term) {
                            campaigner.leading = Some((term, until));
                        }
                        if let Some(leader) = &mut self.leader
                            && leader.term == term
                        {
                            leader.lease_deadline = until;
                        }
                    }
                    (Sent::Renew { term, .. }, Reply::NotFound { .. }) => {
                        let campaigner = &mut self.campaigners[who];
                        if campaigner.leading.is_some_and(|(held, _)| held == term) {
                            campaigner.leading = None;
                            campaigner.stale = Some(term);
                        }
                    }
                    (Sent::Resign, Reply::Released { .. } | Reply::NotFound { .. }) => {}
                    (sent, reply) => {
                        panic!("step {step}: {sent:?} answered {reply:?}")
                    }
                }
            }
        }
        grants.sort_unstable();
        for (term, who, arrival, lease_s) in grants {
            self.take_office(step, term, who, arrival, lease_s);
        }
    }

    /// A campaigner was told it leads: the terms and FIFO checkers judge
    /// the grant, and the new leader acts at once (so that the resource
    /// fences off every earlier term from now on).
    fn take_office(&mut self, step: usize, term: u64, who: usize, arrival: u64, lease_s: u8) {
        self.waiting.remove(&arrival);
        self.verdict.grants += 1;
        let campaigner = &mut self.campaigners[who];
        if campaigner.sent_at_step != step {
            self.verdict.handovers += 1;
        }
        if term <= self.term_max {
            self.verdict.fire(
                TERMS,
                step,
                format!("a new leader got term {term}, not above {}", self.term_max),
            );
        }
        self.term_max = self.term_max.max(term);
        if let Some(earlier) = self.waiting.keys().filter(|&&a| a < arrival).min() {
            self.verdict.fire(
                FIFO,
                step,
                format!("campaign {arrival} took office while campaign {earlier} still waits"),
            );
        }
        let until = self
            .h
            .now
            .saturating_add(Duration::from_secs(u64::from(lease_s)));
        campaigner.campaigning = false;
        campaigner.leading = Some((term, until));
        campaigner.stale = None;
        let label = campaigner.label.clone();
        self.leader = Some(Leader {
            term,
            label: label.clone(),
            lease_deadline: until,
            departed: false,
            who: Some(who),
        });
        self.write(term, label, step);
    }
}

fn run_world(seed: u64) -> Verdict {
    World::new(seed).run()
}

#[test]
fn election_worlds_keep_terms_fifo_and_honest_observes() {
    let mut total = Verdict::default();
    for verdict in common::clean(CHECKERS, 200, run_world) {
        total.grants += verdict.grants;
        total.handovers += verdict.handovers;
        total.observed_leader += verdict.observed_leader;
        total.observed_departed += verdict.observed_departed;
        total.observed_none += verdict.observed_none;
        total.accepted += verdict.accepted;
        total.fenced_off += verdict.fenced_off;
    }
    println!("{total:?}");
    // The worlds did what the checkers judge.
    assert!(total.grants > 2_000, "{total:?}");
    assert!(total.handovers > 1_000, "{total:?}");
    assert!(total.observed_leader > 1_000, "{total:?}");
    assert!(total.observed_departed > 50, "{total:?}");
    assert!(total.observed_none > 300, "{total:?}");
    assert!(total.fenced_off > 100, "{total:?}");
}

#[test]
fn the_terms_checker_alone_catches_a_handoff_that_reuses_the_term() {
    common::caught_alone(
        PlantedBug::HandoffReusesTerm,
        CHECKERS,
        run_world,
        TERMS,
        80,
    );
}

#[test]
fn the_fifo_checker_alone_catches_a_skipped_candidate() {
    common::caught_alone(PlantedBug::SkipWaiter, CHECKERS, run_world, FIFO, 80);
}

#[test]
fn the_observe_checker_alone_catches_a_departed_leader_reported_as_none() {
    common::caught_alone(
        PlantedBug::ObserveDepartedAsNone,
        CHECKERS,
        run_world,
        OBSERVE,
        70,
    );
}
