//! Randomized worlds of semaphore clients against the single-mode server,
//! over bytes and with the clock jumped, checked after every step:
//! - **capacity**: never more slots of a semaphore held than it has, and
//!   never a slot at or past its capacity;
//! - **FIFO**: a permit grant never overtakes an earlier request for the
//!   same semaphore that is still waiting;
//! - **tokens**: every grant's token is above every token granted before
//!   (and, of the grants of one semaphore read in one step, which its
//!   queue made in arrival order, each above the earlier arrival's);
//! - **linearizability**: each slot key's history as the clients saw it
//!   (a permit grant is a grant of each of its slot keys under its token, a
//!   release answered `R` or `N` one of each) has a linearization in the
//!   sim's model of a FIFO lock with leases (`ticketing_sim::linear`).
//!
//! Each checker alone catches a planted bug: capacity `SlotPastCapacity`,
//! FIFO `BargePermits`, tokens `PermitTokensReversed` (and `ReuseToken`,
//! which linearizability sees too), linearizability `ReportLowestSlots`.

mod common;

use common::{Judged, Rng, firing};

use std::collections::{BTreeMap, HashMap};

use ticketing_core::server::ConnId;
use ticketing_core::testing::net::SingleNet;
use ticketing_core::testing::planted::PlantedBug;
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, ErrorCode, Key, KeyGroup, NegotiateRequest, PermitsRequest,
    ReleaseRequest, Reply, Request, slot_key,
};
use ticketing_sim::linear::{self, LinEntry, LinOp, LinResult};

/// The semaphores of every world: name and capacity.
const SEMAPHORES: [(&str, u16); 2] = [("alpha", 2), ("beta", 3)];
const CLIENTS: usize = 6;
const STEPS: usize = 300;

/// The checkers, in the order of [`Verdict::fired`].
const CHECKERS: [&str; 4] = ["capacity", "fifo", "tokens", "linearizability"];
const CAPACITY: usize = 0;
const FIFO: usize = 1;
const TOKENS: usize = 2;
const LINEAR: usize = 3;

/// What a client sent and has not had answered.
#[derive(Clone, Debug)]
enum Sent {
    /// A permit request for `semaphore`, the `arrival`-th of the world,
    /// sent at `sent_us` (true time) asking `lease_s`.
    Permits {
        semaphore: usize,
        arrival: u64,
        sent_us: u64,
        lease_s: u8,
    },
    /// A release of a grant.
    Release {
        semaphore: usize,
        token: u64,
        slots: Vec<u16>,
    },
}

struct Client {
    conn: ConnId,
    next_rid: u64,
    pending: HashMap<u64, Sent>,
    /// Grants received: semaphore, token, slots.
    held: Vec<(usize, u64, Vec<u16>)>,
}

fn connect(h: &mut SingleNet) -> Client {
    let conn = h.connect();
    let negotiate = Request::Negotiate(NegotiateRequest {
        rid: 1,
        version: EXTENSION_VERSION,
        wanted: Capabilities::KNOWN,
        label: String::new(),
    });
    let replies = h.call(conn, &negotiate);
    assert!(
        matches!(replies[..], [Reply::Negotiated { .. }]),
        "{replies:?}"
    );
    Client {
        conn,
        next_rid: 2,
        pending: HashMap::new(),
        held: Vec::new(),
    }
}

fn slot_keys(semaphore: usize, slots: &[u16]) -> KeyGroup {
    let name = Key::from_text(SEMAPHORES[semaphore].0).unwrap();
    KeyGroup::new(slots.iter().map(|&s| slot_key(&name, s).unwrap()).collect()).unwrap()
}

/// What a world did, and the first thing each checker saw (a world goes
/// on after a checker fired, so every checker judges every world).
#[derive(Debug, Default)]
struct Verdict {
    fired: [Option<String>; 4],
    granted: usize,
    /// Grants answered in a later step than sent (they waited in the
    /// queue).
    waited: usize,
    /// Slot-key histories found linearizable, and those the search gave
    /// up on (too long, or its state budget).
    linearizable: usize,
    inconclusive: usize,
    /// Releases refused as naming another key set than their grant's.
    refused: usize,
}

impl Judged<4> for Verdict {
    fn fired(&self) -> &[Option<String>; 4] {
        &self.fired
    }
}

impl Verdict {
    fn fire(&mut self, checker: usize, what: String) {
        self.fired[checker].get_or_insert(what);
    }
}

/// True microseconds since the world began.
fn micros(now: Instant, start: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(start).as_micros()).unwrap_or(u64::MAX)
}

/// Runs world `seed`.
fn run_world(seed: u64) -> Verdict {
    let mut rng = Rng::of_world(seed);
    let mut h = SingleNet::default();
    let start = h.now;
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| connect(&mut h)).collect();
    let mut arrivals = 0u64;
    let mut token_max = 0u64;
    let mut verdict = Verdict::default();
    let mut sent_at_step: HashMap<u64, usize> = HashMap::new();
    // Each slot key's history, by semaphore and slot.
    let mut histories: BTreeMap<(usize, u16), Vec<LinEntry>> = BTreeMap::new();
    for step in 0..STEPS {
        let who = rng.below(CLIENTS as u64) as usize;
        let now_us = micros(h.now, start);
        match rng.below(100) {
            0..45 => {
                let semaphore = rng.below(SEMAPHORES.len() as u64) as usize;
                let capacity = SEMAPHORES[semaphore].1;
                let client = &mut clients[who];
                let rid = client.next_rid;
                client.next_rid += 1;
                arrivals += 1;
                let lease_s = 1 + rng.below(3) as u8;
                client.pending.insert(
                    rid,
                    Sent::Permits {
                        semaphore,
                        arrival: arrivals,
                        sent_us: now_us,
                        lease_s,
                    },
                );
                sent_at_step.insert(arrivals, step);
                let request = Request::AcquirePermits(PermitsRequest {
                    rid,
                    wait_s: rng.below(4) as u8,
                    lease_s,
                    max_hold_s: 0,
                    permits: 1 + rng.below(u64::from(capacity.min(3))) as u8,
                    capacity,
                    name: Key::from_text(SEMAPHORES[semaphore].0).unwrap(),
                });
                h.send(client.conn, &request);
            }
            45..70 => {
                let client = &mut clients[who];
                if client.held.is_empty() {
                    continue;
                }
                let at = rng.below(client.held.len() as u64) as usize;
                let (semaphore, token, slots) = client.held.swap_remove(at);
                let rid = client.next_rid;
                client.next_rid += 1;
                let release = Request::Release(ReleaseRequest {
                    rid,
                    token,
                    keys: slot_keys(semaphore, &slots),
                    set: true,
                });
                client.pending.insert(
                    rid,
                    Sent::Release {
                        semaphore,
                        token,
                        slots,
                    },
                );
                h.send(client.conn, &release);
            }
            70..92 => h.advance(Duration::from_millis(rng.below(1_500))),
            _ => {
                // Every reply so far was read: what the client still
                // waits for is queued, and goes with the connection.
                let conn = clients[who].conn;
                h.server_handle_closed(conn);
                clients[who] = connect(&mut h);
            }
        }
        let now_us = micros(h.now, start);
        // Every reply of the step, before any is judged: grants and
        // timeouts of one step may be read in any connection order.
        let mut grants = Vec::new();
        for client in &mut clients {
            for reply in h.replies(client.conn) {
                let Some(rid) = reply.rid() else { continue };
                let Some(sent) = client.pending.remove(&rid) else {
                    continue;
                };
                match (sent, reply) {
                    (
                        Sent::Permits {
                            semaphore,
                            arrival,
                            sent_us,
                            lease_s,
                        },
                        Reply::Permits { token, slots, .. },
                    ) => {
                        let slots = slots.as_slice().to_vec();
                        grants.push((semaphore, arrival, token));
                        verdict.granted += 1;
                        if sent_at_step.get(&arrival) != Some(&step) {
                            verdict.waited += 1;
                        }
                        for &slot in &slots {
                            histories
                                .entry((semaphore, slot))
                                .or_default()
                                .push(LinEntry {
                                    invoke_us: sent_us,
                                    respond_us: now_us,
                                    op: LinOp::Granted {
                                        token,
                                        lease_min_us: u64::from(lease_s) * 1_000_000,
                                    },
                                });
                        }
                        client.held.push((semaphore, token, slots));
                    }
                    (Sent::Permits { .. }, Reply::TimedOut { .. } | Reply::Busy { .. }) => {}
                    (
                        Sent::Release {
                            semaphore,
                            token,
                            slots,
                        },
                        reply @ (Reply::ReleasedSet { .. } | Reply::NotFound { .. }),
                    ) => {
                        let op = match reply {
                            Reply::NotFound { .. } => LinOp::NotFound { token },
                            _ => LinOp::Released { token },
                        };
                        for slot in slots {
                            histories
                                .entry((semaphore, slot))
                                .or_default()
                                .push(LinEntry {
                                    invoke_us: now_us,
                                    respond_us: now_us,
                                    op,
                                });
                        }
                    }
                    // A release naming other keys than its grant's (only a
                    // client told the wrong slots sends one) is refused and
                    // changes nothing: no operation of any slot's history.
                    (
                        Sent::Release { .. },
                        Reply::Error {
                            code: ErrorCode::GroupMismatch,
                            ..
                        },
                    ) => verdict.refused += 1,
                    (sent, other) => panic!("step {step}: {sent:?} answered {other:?}"),
                }
            }
        }
        let step_max = grants.iter().map(|grant| grant.2).max();
        for &(semaphore, arrival, token) in &grants {
            if token <= token_max {
                verdict.fire(
                    TOKENS,
                    format!("step {step}: token {token} not above an earlier grant's {token_max}"),
                );
            }
            let overtaken = clients
                .iter()
                .flat_map(|c| c.pending.values())
                .filter_map(|sent| match *sent {
                    Sent::Permits {
                        semaphore: waiting_on,
                        arrival: waiting_since,
                        ..
                    } if waiting_on == semaphore && waiting_since < arrival => Some(waiting_since),
                    _ => None,
                })
                .min();
            if let Some(earlier) = overtaken {
                verdict.fire(
                    FIFO,
                    format!(
                        "step {step}: request {arrival} for {} granted while request {earlier} still waits",
                        SEMAPHORES[semaphore].0
                    ),
                );
            }
        }
        token_max = token_max.max(step_max.unwrap_or(0));
        check_step_order(&mut grants, step, &mut verdict);
        check_capacity(&h, step, &mut verdict);
    }
    check_histories(&histories, &mut verdict);
    verdict
}

/// The tokens checker on the grants of one step: a semaphore serves its
/// queue in arrival order (which the FIFO checker holds it to), so the
/// step's grants of one semaphore, taken by arrival, have rising tokens.
fn check_step_order(grants: &mut [(usize, u64, u64)], step: usize, verdict: &mut Verdict) {
    grants.sort_unstable();
    for pair in grants.windows(2) {
        let [(semaphore, earlier, first), (same, later, second)] = *pair else {
            continue;
        };
        if semaphore == same && second <= first {
            verdict.fire(
                TOKENS,
                format!(
                    "step {step}: request {later} for {} granted token {second}, not above request {earlier}'s {first} granted before it",
                    SEMAPHORES[semaphore].0
                ),
            );
        }
    }
}

/// The capacity checker, on the server's table at this instant.
fn check_capacity(h: &SingleNet, step: usize, verdict: &mut Verdict) {
    for &(name, capacity) in &SEMAPHORES {
        let key = Key::from_text(name).unwrap();
        let held: Vec<u16> = (0..capacity + 4)
            .filter(|&slot| {
                let key = slot_key(&key, slot).unwrap();
                h.server
                    .lock_table()
                    .holder(key.as_bytes())
                    .is_some_and(|(_, deadline)| deadline > h.now)
            })
            .collect();
        if held.len() > usize::from(capacity) || held.iter().any(|&slot| slot >= capacity) {
            verdict.fire(
                CAPACITY,
                format!("step {step}: {name} has slots {held:?} held, capacity {capacity}"),
            );
        }
    }
}

/// The linearizability checker, on each slot key's history.
fn check_histories(histories: &BTreeMap<(usize, u16), Vec<LinEntry>>, verdict: &mut Verdict) {
    for (&(semaphore, slot), history) in histories {
        match linear::check(history) {
            LinResult::Ok => verdict.linearizable += 1,
            LinResult::Inconclusive => verdict.inconclusive += 1,
            LinResult::Violation => verdict.fire(
                LINEAR,
                format!(
                    "slot {slot} of {}: no linearization of its {} operations",
                    SEMAPHORES[semaphore].0,
                    history.len()
                ),
            ),
        }
    }
}

/// What these tests need of the test network beyond its own calls.
trait Close {
    fn server_handle_closed(&mut self, conn: ConnId);
}

impl Close for SingleNet {
    fn server_handle_closed(&mut self, conn: ConnId) {
        use ticketing_core::machine::Machine;
        self.server.handle_closed(self.now, conn);
    }
}

#[test]
fn semaphore_worlds_keep_capacity_fifo_rising_tokens_and_linearizability() {
    let mut total = Verdict::default();
    for verdict in common::clean(CHECKERS, 200, run_world) {
        total.granted += verdict.granted;
        total.waited += verdict.waited;
        total.linearizable += verdict.linearizable;
        total.inconclusive += verdict.inconclusive;
    }
    // The worlds did what the checkers judge: grants, many after a wait,
    // and slot histories the search decided.
    println!(
        "{} permit grants, {} of them after waiting in the queue; {} slot histories linearizable, {} inconclusive",
        total.granted, total.waited, total.linearizable, total.inconclusive
    );
    assert!(total.waited > 1_000, "{total:?}");
    assert!(total.linearizable > 800, "{total:?}");
    assert!(total.inconclusive * 20 < total.linearizable, "{total:?}");
    assert_eq!(total.refused, 0, "{total:?}");
}

#[test]
fn the_capacity_checker_alone_catches_a_slot_past_capacity() {
    common::caught_alone(
        PlantedBug::SlotPastCapacity,
        CHECKERS,
        run_world,
        CAPACITY,
        80,
    );
}

#[test]
fn the_fifo_checker_alone_catches_permits_barging_past_the_head() {
    common::caught_alone(PlantedBug::BargePermits, CHECKERS, run_world, FIFO, 80);
}

/// A reused token is also a token not above its slot's earlier one
/// wherever the two grants shared a slot: the linearizability checker sees
/// it too (in fewer worlds), the capacity and FIFO checkers do not.
#[test]
fn the_token_checker_catches_a_reused_token() {
    let [capacity, fifo, tokens, linear] = firing(PlantedBug::ReuseToken, CHECKERS, run_world);
    assert_eq!((capacity, fifo), (0, 0));
    assert!(tokens >= 80, "caught in only {tokens} of 100 worlds");
    assert!(
        linear < tokens,
        "{linear} of 100 worlds for linearizability"
    );
}

#[test]
fn the_linearizability_checker_alone_catches_misreported_slots() {
    common::caught_alone(
        PlantedBug::ReportLowestSlots,
        CHECKERS,
        run_world,
        LINEAR,
        80,
    );
}

/// Two grants of one pass with their tokens swapped share no slot, and
/// both tokens are above every earlier one, so each slot's history is
/// still linearizable: only the token checker sees that the later grant
/// holds the smaller token.
#[test]
fn the_token_checker_alone_catches_permit_tokens_out_of_grant_order() {
    common::caught_alone(
        PlantedBug::PermitTokensReversed,
        CHECKERS,
        run_world,
        TOKENS,
        80,
    );
}
