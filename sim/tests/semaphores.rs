//! Randomized worlds of semaphore clients against the single-mode server,
//! over bytes and with the clock jumped, checked after every step:
//! - **capacity**: never more slots of a semaphore held than it has, and
//!   never a slot at or past its capacity;
//! - **FIFO**: a permit grant never overtakes an earlier request for the
//!   same semaphore that is still waiting;
//! - **tokens**: every grant's token is above every token granted before.
//!
//! The FIFO checker catches the planted `BargePermits` on its own.

use std::collections::HashMap;

use ticketing_core::server::ConnId;
use ticketing_core::testing::net::SingleNet;
use ticketing_core::testing::planted::{self, PlantedBug};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, Key, KeyGroup, NegotiateRequest, PermitsRequest,
    ReleaseRequest, Reply, Request, slot_key,
};

/// The semaphores of every world: name and capacity.
const SEMAPHORES: [(&str, u16); 2] = [("alpha", 2), ("beta", 3)];
const CLIENTS: usize = 6;
const STEPS: usize = 300;

/// A small deterministic generator (xorshift64*), so a seed is a world.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Client {
    conn: ConnId,
    next_rid: u64,
    /// Requests sent and not answered: rid → (semaphore, arrival order).
    pending: HashMap<u64, (usize, u64)>,
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

/// Runs world `seed`; the first checker that fires, with what it saw.
/// The grants, and of them the ones that waited in the queue (answered
/// in a later step than sent), of a world that held every invariant.
fn run_world(seed: u64) -> Result<(usize, usize), String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut h = SingleNet::default();
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| connect(&mut h)).collect();
    let mut arrivals = 0u64;
    let mut token_max = 0u64;
    let (mut granted, mut waited) = (0, 0);
    let mut sent_at_step: HashMap<u64, usize> = HashMap::new();
    for step in 0..STEPS {
        let who = rng.below(CLIENTS as u64) as usize;
        match rng.below(100) {
            0..45 => {
                let semaphore = rng.below(SEMAPHORES.len() as u64) as usize;
                let capacity = SEMAPHORES[semaphore].1;
                let client = &mut clients[who];
                let rid = client.next_rid;
                client.next_rid += 1;
                arrivals += 1;
                client.pending.insert(rid, (semaphore, arrivals));
                sent_at_step.insert(arrivals, step);
                let request = Request::AcquirePermits(PermitsRequest {
                    rid,
                    wait_s: rng.below(4) as u8,
                    lease_s: 1 + rng.below(3) as u8,
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
                h.send(client.conn, &release);
            }
            70..92 => h.advance(Duration::from_millis(rng.below(1_500))),
            _ => {
                let conn = clients[who].conn;
                h.server_handle_closed(conn);
                clients[who] = connect(&mut h);
            }
        }
        // Every reply of the step, before any is judged: grants and
        // timeouts of one step may be read in any connection order.
        let mut grants = Vec::new();
        for client in &mut clients {
            for reply in h.replies(client.conn) {
                let Some(rid) = reply.rid() else { continue };
                let Some((semaphore, arrival)) = client.pending.remove(&rid) else {
                    continue;
                };
                match reply {
                    Reply::Permits { token, slots, .. } => {
                        let slots = slots.as_slice().to_vec();
                        grants.push((semaphore, arrival, token));
                        granted += 1;
                        if sent_at_step.get(&arrival) != Some(&step) {
                            waited += 1;
                        }
                        client.held.push((semaphore, token, slots));
                    }
                    Reply::TimedOut { .. } | Reply::Busy { .. } => {}
                    other => return Err(format!("step {step}: unexpected {other:?}")),
                }
            }
        }
        let step_max = grants.iter().map(|grant| grant.2).max();
        for &(semaphore, arrival, token) in &grants {
            if token <= token_max {
                return Err(format!(
                    "step {step}: token {token} not above an earlier grant's {token_max}"
                ));
            }
            let overtaken = clients.iter().flat_map(|c| c.pending.values()).find(
                |&&(waiting_on, waiting_since)| waiting_on == semaphore && waiting_since < arrival,
            );
            if let Some((_, earlier)) = overtaken {
                return Err(format!(
                    "step {step}: request {arrival} for {} granted while request {earlier} still waits",
                    SEMAPHORES[semaphore].0
                ));
            }
        }
        token_max = token_max.max(step_max.unwrap_or(0));
        for (semaphore, &(name, capacity)) in SEMAPHORES.iter().enumerate() {
            let name = Key::from_text(name).unwrap();
            let held: Vec<u16> = (0..capacity + 4)
                .filter(|&slot| {
                    let key = slot_key(&name, slot).unwrap();
                    h.server
                        .lock_table()
                        .holder(key.as_bytes())
                        .is_some_and(|(_, deadline)| deadline > h.now)
                })
                .collect();
            if held.len() > usize::from(capacity) || held.iter().any(|&slot| slot >= capacity) {
                return Err(format!(
                    "step {step}: {} has slots {held:?} held, capacity {capacity}",
                    SEMAPHORES[semaphore].0
                ));
            }
        }
    }
    Ok((granted, waited))
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
fn semaphore_worlds_keep_capacity_fifo_and_rising_tokens() {
    let (mut granted, mut waited) = (0, 0);
    for seed in 0..200 {
        match run_world(seed) {
            Ok((g, w)) => (granted, waited) = (granted + g, waited + w),
            Err(violation) => panic!("seed {seed}: {violation}"),
        }
    }
    // The worlds did what the checkers judge: grants, many after a wait.
    println!("{granted} permit grants, {waited} of them after waiting in the queue");
    assert!(waited > 1_000, "{granted} grants, {waited} after a wait");
}

#[test]
fn the_fifo_checker_alone_catches_permits_barging_past_the_head() {
    planted::set(Some(PlantedBug::BargePermits));
    let verdicts: Vec<Result<(usize, usize), String>> = (0..100).map(run_world).collect();
    planted::set(None);
    let fifo = verdicts
        .iter()
        .filter(|verdict| verdict.as_ref().is_err_and(|v| v.contains("still waits")))
        .count();
    let other = verdicts
        .iter()
        .filter(|verdict| verdict.as_ref().is_err_and(|v| !v.contains("still waits")))
        .count();
    println!("BargePermits: the FIFO checker fired in {fifo} of 100 worlds");
    assert_eq!(other, 0, "{verdicts:?}");
    assert!(fifo >= 20, "caught in only {fifo} of 100 worlds");
}
