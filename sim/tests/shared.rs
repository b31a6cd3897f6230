//! Randomized worlds of clients holding keys shared and exclusive
//! (docs/protocol.md §8.7, SHARED: `Y` with a mode per key, `D`) against
//! the single-mode server, over bytes and with the clock jumped: shared,
//! exclusive and mixed acquires (some keys shared, some exclusive, one
//! token), plain exclusive `A` acquires beside them, downgrades, releases,
//! renewals, crashes (a request sent just before the crash may be granted
//! and never read: a ghost grant the server releases), leases running out,
//! and holders acting on a fenced resource per key. Four checkers judge
//! every step:
//! - **exclusion**: never an exclusive holder of a key beside any other
//!   holder of it;
//! - **FIFO**: a grant never overtakes an earlier request on one of its
//!   keys that is still waiting (sharers join a batch only from the head of
//!   the queue, so even a sharer never passes a waiter);
//! - **tokens**: every grant's token is above every token granted before;
//! - **fencing**: the resource of each key keeps the two marks of §8.7;
//!   a write it accepts never follows a conflicting write (one of the two
//!   exclusive) of another grant with a token at least as large, and an
//!   accepted write of a live holder never sits beside a conflicting write
//!   of another holder that is live too.
//!
//! Exclusion has its planted bug `ShareBesideWriter`, FIFO
//! `SharedJumpsWriter` (and `SkipWaiter`), tokens `ReuseToken`; fencing
//! catches `ReuseToken` and `ShareBesideWriter` beside their checkers, and
//! alone `WriterChecksWritersOnly`, a resource (the core's
//! [`TwoMarks`]) that checks a writer against the writers' mark only. No
//! bug of the lock table can be the fencing checker's alone here: under
//! the two marks a write is accepted after a conflicting write of a token
//! as large only if the two grants have one token (which the token checker
//! sees), and beside a live conflicting holder only where the exclusion
//! checker sees the two holders.
//!
//! Who holds what comes from what the clients were told (grants,
//! downgrades, renewals, releases they sent, their own crashes and their
//! own lease deadlines), never from the server's state. Every request of a
//! step is served at the step's instant and every reply is read in that
//! step, so a client's deadline is the server's: a lease counts from the
//! step its grant (or renewal) is read in, and a holder stops counting at
//! that deadline exactly, as the server does (a grant made at the instant
//! another lease ends is judged beside the ended one as gone).

mod common;

use common::{Judged, Rng, firing};

use std::collections::HashMap;

use ticketing_core::lock::TwoMarks;
use ticketing_core::machine::Machine;
use ticketing_core::server::ConnId;
use ticketing_core::testing::net::SingleNet;
use ticketing_core::testing::planted::PlantedBug;
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{
    AcquireRequest, AcquireSharedRequest, Capabilities, DowngradeRequest, EXTENSION_VERSION,
    ErrorCode, ExtendRequest, Key, KeyGroup, NegotiateRequest, ReleaseRequest, Reply, Request,
};

/// The keys of every world, in ascending order (as a key set names them).
const KEYS: [&str; 3] = ["a", "b", "c"];
const CLIENTS: usize = 6;
const STEPS: usize = 300;

/// The checkers, in the order of [`Verdict::fired`].
const CHECKERS: [&str; 4] = ["exclusion", "fifo", "tokens", "fencing"];
const EXCLUSION: usize = 0;
const FIFO: usize = 1;
const TOKENS: usize = 2;
const FENCING: usize = 3;

/// A grant as its client knows it.
#[derive(Clone, Debug)]
struct Grant {
    /// Unique in the world (tokens need not be, under a planted bug).
    id: u64,
    token: u64,
    /// Indices into [`KEYS`], ascending.
    keys: Vec<usize>,
    /// Bit `i` set: key `keys[i]` is held shared.
    shared: u16,
    /// Granted by `Y` (released with `G`), or by `A` (released with `R`).
    set: bool,
    /// The client's own lease deadline.
    until: Instant,
}

impl Grant {
    /// Whether the grant holds `key`, and if so whether exclusive.
    fn exclusive_on(&self, key: usize) -> Option<bool> {
        let at = self.keys.iter().position(|&k| k == key)?;
        Some(self.shared & (1 << at) == 0)
    }

    fn group(&self) -> KeyGroup {
        group(&self.keys)
    }
}

fn group(keys: &[usize]) -> KeyGroup {
    KeyGroup::new(
        keys.iter()
            .map(|&k| Key::from_text(KEYS[k]).unwrap())
            .collect(),
    )
    .unwrap()
}

/// What an acquire asked for.
#[derive(Clone, Debug)]
struct Asked {
    keys: Vec<usize>,
    shared: u16,
    /// A `Y` (else an `A`).
    set: bool,
    lease_s: u8,
}

/// What a client's request was.
#[derive(Clone, Debug)]
enum Sent {
    /// An acquire, the `arrival`-th of the world (0: sent just before a
    /// crash, never read).
    Acquire { arrival: u64, asked: Asked },
    /// A renewal of grant `id`.
    Renew { id: u64 },
    /// A downgrade of grant `id`.
    Downgrade { id: u64 },
    /// A release (the client stopped counting the grant when it sent it).
    Release,
}

struct Client {
    conn: ConnId,
    next_rid: u64,
    pending: HashMap<u64, Sent>,
    /// An acquire sent and not answered.
    acquiring: bool,
    /// The step its last acquire was sent in.
    sent_at_step: usize,
    held: Vec<Grant>,
    /// Grants whose lease ran out (or whose renewal was refused): a paused
    /// process may still act on them.
    stale: Vec<Grant>,
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
        matches!(replies[..], [Reply::Negotiated { granted, .. }] if granted.contains(Capabilities::SHARED)),
        "{replies:?}"
    );
    Client {
        conn,
        next_rid: 2,
        pending: HashMap::new(),
        acquiring: false,
        sent_at_step: 0,
        held: Vec::new(),
        stale: Vec::new(),
    }
}

impl Client {
    fn send(&mut self, h: &mut SingleNet, sent: Sent, request: impl FnOnce(u64) -> Request) {
        let rid = self.next_rid;
        self.next_rid += 1;
        self.pending.insert(rid, sent);
        h.send(self.conn, &request(rid));
    }
}

/// A request waiting in the server's queues, as the clients know it.
struct Waiting {
    who: usize,
    keys: Vec<usize>,
}

/// The fenced resource of one key: the two marks of §8.7 (kept by the
/// core's rule), and the grants whose writes it accepted.
#[derive(Default)]
struct Resource {
    marks: TwoMarks,
    /// Accepted writes: grant id, token, exclusive.
    acted: Vec<(u64, u64, bool)>,
}

/// What a world did, and the first thing each checker saw (a world goes
/// on after a checker fired, so every checker judges every world).
#[derive(Debug, Default)]
struct Verdict {
    fired: [Option<String>; 4],
    grants: usize,
    /// Grants read in a later step than sent (they waited in the queue).
    handovers: usize,
    /// Grants holding some key shared, and those mixing the modes.
    shared_grants: usize,
    mixed_grants: usize,
    downgrades: usize,
    renewals: usize,
    releases: usize,
    /// Steps that ended with some key held by two sharers or more.
    overlaps: usize,
    accepted: usize,
    fenced_off: usize,
    crashes: usize,
    /// Releases, renewals and downgrades refused as naming another key
    /// group than their grant's.
    refused: usize,
}

impl Judged<4> for Verdict {
    fn fired(&self) -> &[Option<String>; 4] {
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
    clients: Vec<Client>,
    arrivals: u64,
    next_grant: u64,
    /// Requests waiting, by arrival.
    waiting: HashMap<u64, Waiting>,
    /// Grants of crashed clients: they hold until their lease ends.
    departed: Vec<Grant>,
    token_max: u64,
    resources: [Resource; KEYS.len()],
    verdict: Verdict,
}

impl World {
    fn new(seed: u64) -> World {
        let mut h = SingleNet::default();
        let clients = (0..CLIENTS).map(|_| connect(&mut h)).collect();
        World {
            h,
            rng: Rng::of_world(seed),
            clients,
            arrivals: 0,
            next_grant: 0,
            waiting: HashMap::new(),
            departed: Vec::new(),
            token_max: 0,
            resources: Default::default(),
            verdict: Verdict::default(),
        }
    }

    fn run(mut self) -> Verdict {
        for step in 0..STEPS {
            let now = self.h.now;
            for client in &mut self.clients {
                let (ended, live): (Vec<Grant>, Vec<Grant>) =
                    client.held.drain(..).partition(|grant| grant.until <= now);
                client.held = live;
                client.stale.extend(ended);
                // A paused process remembers its last few grants only.
                let excess = client.stale.len().saturating_sub(3);
                client.stale.drain(..excess);
            }
            self.departed.retain(|grant| grant.until > now);
            let who = self.rng.below(CLIENTS as u64) as usize;
            match self.rng.below(100) {
                0..30 => self.acquire(who, step),
                30..40 => self.release(who),
                40..48 => self.renew(who),
                48..56 => self.downgrade(who),
                56..70 => self.act(who, step),
                70..93 => {
                    let by = Duration::from_millis(self.rng.below(1_500));
                    self.h.advance(by);
                }
                _ => self.crash(who),
            }
            self.read_replies(step);
            self.check_exclusion(step);
        }
        self.verdict
    }

    /// Keys (one to three, ascending) and a shared mask for them.
    fn pick_keys(&mut self) -> (Vec<usize>, u16) {
        let mask = 1 + self.rng.below((1 << KEYS.len()) - 1);
        let keys: Vec<usize> = (0..KEYS.len()).filter(|k| mask & (1 << k) != 0).collect();
        let shared = (self.rng.next() & ((1 << keys.len()) - 1)) as u16;
        (keys, shared)
    }

    fn acquire(&mut self, who: usize, step: usize) {
        if self.clients[who].acquiring {
            return;
        }
        let (mut keys, mut shared) = self.pick_keys();
        // A fifth of the acquires are plain exclusive `A`s of one key.
        let set = self.rng.below(5) != 0;
        if !set {
            keys.truncate(1);
            shared = 0;
        }
        self.arrivals += 1;
        let arrival = self.arrivals;
        let lease_s = 1 + self.rng.below(3) as u8;
        let wait_s = self.rng.below(5) as u8;
        let group = group(&keys);
        self.waiting.insert(
            arrival,
            Waiting {
                who,
                keys: keys.clone(),
            },
        );
        let client = &mut self.clients[who];
        client.acquiring = true;
        client.sent_at_step = step;
        let sent = Sent::Acquire {
            arrival,
            asked: Asked {
                keys,
                shared,
                set,
                lease_s,
            },
        };
        client.send(&mut self.h, sent, |rid| {
            if set {
                Request::AcquireShared(AcquireSharedRequest {
                    rid,
                    wait_s,
                    lease_s,
                    max_hold_s: 0,
                    modes: shared,
                    keys: group,
                })
            } else {
                Request::Acquire(AcquireRequest {
                    rid,
                    wait_s,
                    lease_s,
                    keys: group,
                    set: false,
                })
            }
        });
    }

    fn pick_held(&mut self, who: usize) -> Option<usize> {
        let held = self.clients[who].held.len();
        (held > 0).then(|| self.rng.below(held as u64) as usize)
    }

    fn release(&mut self, who: usize) {
        let Some(at) = self.pick_held(who) else {
            return;
        };
        let grant = self.clients[who].held.swap_remove(at);
        self.verdict.releases += 1;
        self.clients[who].send(&mut self.h, Sent::Release, |rid| {
            Request::Release(ReleaseRequest {
                rid,
                token: grant.token,
                keys: grant.group(),
                set: grant.set,
            })
        });
    }

    fn renew(&mut self, who: usize) {
        let Some(at) = self.pick_held(who) else {
            return;
        };
        let lease_s = 1 + self.rng.below(3) as u8;
        let grant = &self.clients[who].held[at];
        let (id, token, keys) = (grant.id, grant.token, grant.group());
        self.clients[who].send(&mut self.h, Sent::Renew { id }, |rid| {
            Request::Extend(ExtendRequest {
                rid,
                token,
                lease_s,
                keys,
            })
        });
    }

    fn downgrade(&mut self, who: usize) {
        let Some(at) = self.pick_held(who) else {
            return;
        };
        let grant = &self.clients[who].held[at];
        if grant.shared == (1 << grant.keys.len()) - 1 {
            return;
        }
        let (id, token, keys) = (grant.id, grant.token, grant.group());
        self.clients[who].send(&mut self.h, Sent::Downgrade { id }, |rid| {
            Request::Downgrade(DowngradeRequest { rid, token, keys })
        });
    }

    /// A holder writes on one of its keys in its mode there; a holder whose
    /// lease ran out (a paused process that has not noticed) sometimes does
    /// too.
    fn act(&mut self, who: usize, step: usize) {
        let client = &self.clients[who];
        let grant = if !client.stale.is_empty() && self.rng.below(3) == 0 {
            let at = self.rng.below(client.stale.len() as u64) as usize;
            client.stale[at].clone()
        } else if !client.held.is_empty() {
            let at = self.rng.below(client.held.len() as u64) as usize;
            client.held[at].clone()
        } else {
            return;
        };
        let key = grant.keys[self.rng.below(grant.keys.len() as u64) as usize];
        self.write(&grant, key, step);
    }

    /// Every grant still counted as holding (its deadline not reached):
    /// the clients' and the crashed clients'.
    fn holders(&self) -> impl Iterator<Item = &Grant> {
        let now = self.h.now;
        self.clients
            .iter()
            .flat_map(|client| &client.held)
            .chain(&self.departed)
            .filter(move |grant| grant.until > now)
    }

    /// The resource's two-mark rule, then the fencing checker on what it
    /// accepted.
    fn write(&mut self, grant: &Grant, key: usize, step: usize) {
        let exclusive = grant.exclusive_on(key).expect("a key of the grant");
        let t = grant.token;
        // The marks as they were: the checker judges the write against the
        // writes before it.
        let mut marks = self.resources[key].marks;
        if !marks.admit(t, exclusive) {
            self.verdict.fenced_off += 1;
            return;
        }
        let resource = &self.resources[key];
        self.verdict.accepted += 1;
        let mode = |exclusive: bool| if exclusive { "exclusive" } else { "shared" };
        let overtaken = resource
            .acted
            .iter()
            .find(|&&(id, u, x)| id != grant.id && u >= t && (x || exclusive))
            .copied();
        if let Some((_, u, x)) = overtaken {
            self.verdict.fire(
                FENCING,
                step,
                format!(
                    "a {} write of token {t} on {} accepted after a {} write of another grant's token {u}",
                    mode(exclusive),
                    KEYS[key],
                    mode(x)
                ),
            );
        }
        let live = self.holders().any(|held| held.id == grant.id);
        if live {
            let beside = self
                .holders()
                .filter(|held| held.id != grant.id)
                .filter(|held| resource.acted.iter().any(|&(id, ..)| id == held.id))
                .find_map(|held| {
                    let theirs = held.exclusive_on(key)?;
                    (theirs || exclusive).then_some((held.token, theirs))
                });
            if let Some((u, x)) = beside {
                self.verdict.fire(
                    FENCING,
                    step,
                    format!(
                        "a {} write of token {t} on {} accepted beside live {} holder {u}, which wrote",
                        mode(exclusive),
                        KEYS[key],
                        mode(x)
                    ),
                );
            }
        }
        let resource = &mut self.resources[key];
        resource.marks = marks;
        resource.acted.push((grant.id, t, exclusive));
    }

    /// The client's process dies. Half the time it sends an acquire just
    /// before: granted at once if its keys take it, the grant is never
    /// read, and the server must release it with the connection. Its
    /// grants hold until their leases end; its waits end with it.
    fn crash(&mut self, who: usize) {
        self.verdict.crashes += 1;
        if self.rng.below(2) == 0 {
            let (keys, shared) = self.pick_keys();
            let group = group(&keys);
            let sent = Sent::Acquire {
                arrival: 0,
                asked: Asked {
                    keys,
                    shared,
                    set: true,
                    lease_s: 3,
                },
            };
            self.clients[who].send(&mut self.h, sent, |rid| {
                Request::AcquireShared(AcquireSharedRequest {
                    rid,
                    wait_s: 0,
                    lease_s: 3,
                    max_hold_s: 0,
                    modes: shared,
                    keys: group,
                })
            });
        }
        let now = self.h.now;
        self.h.server.handle_closed(now, self.clients[who].conn);
        self.waiting.retain(|_, waiting| waiting.who != who);
        let held = std::mem::take(&mut self.clients[who].held);
        self.departed.extend(held);
        self.clients[who] = connect(&mut self.h);
    }

    fn read_replies(&mut self, step: usize) {
        // Every reply of the step first: a timeout read after a grant of
        // the same step still ended before it.
        let mut grants = Vec::new();
        for who in 0..CLIENTS {
            let conn = self.clients[who].conn;
            for reply in self.h.replies(conn) {
                let Some(rid) = reply.rid() else { continue };
                let Some(sent) = self.clients[who].pending.remove(&rid) else {
                    continue;
                };
                let now = self.h.now;
                let client = &mut self.clients[who];
                match (sent, reply) {
                    (
                        Sent::Acquire { arrival, asked },
                        Reply::AcquiredSet { token, .. } | Reply::Acquired { token, .. },
                    ) => grants.push((token, who, arrival, asked)),
                    (
                        Sent::Acquire { arrival, .. },
                        Reply::TimedOut { .. } | Reply::Busy { .. },
                    ) => {
                        self.waiting.remove(&arrival);
                        client.acquiring = false;
                    }
                    (Sent::Renew { id }, Reply::Extended { lease_ms, .. }) => {
                        self.verdict.renewals += 1;
                        let until = now.saturating_add(Duration::from_millis(u64::from(lease_ms)));
                        if let Some(grant) = client.held.iter_mut().find(|g| g.id == id) {
                            grant.until = until;
                        }
                    }
                    (Sent::Downgrade { id }, Reply::Downgraded { .. }) => {
                        self.verdict.downgrades += 1;
                        if let Some(grant) = client.held.iter_mut().find(|g| g.id == id) {
                            grant.shared = (1 << grant.keys.len()) - 1;
                        }
                    }
                    (Sent::Renew { id } | Sent::Downgrade { id }, Reply::NotFound { .. }) => {
                        if let Some(at) = client.held.iter().position(|g| g.id == id) {
                            let grant = client.held.swap_remove(at);
                            client.stale.push(grant);
                        }
                    }
                    (
                        Sent::Release,
                        Reply::Released { .. } | Reply::ReleasedSet { .. } | Reply::NotFound { .. },
                    ) => {}
                    // Only a client told wrong holds (a planted bug) names
                    // another key group than its grant's: refused, and
                    // nothing changed.
                    (
                        Sent::Release | Sent::Renew { .. } | Sent::Downgrade { .. },
                        Reply::Error {
                            code: ErrorCode::GroupMismatch,
                            ..
                        },
                    ) => self.verdict.refused += 1,
                    (sent, reply) => panic!("step {step}: {sent:?} answered {reply:?}"),
                }
            }
        }
        // Tokens rise in the order the server granted, so the step's grants
        // are judged in token order, each against the requests still
        // waiting then (two grants under one token, which only a planted
        // bug makes, in their order of arrival).
        grants.sort_unstable_by_key(|grant| (grant.0, grant.2));
        for (token, who, arrival, asked) in grants {
            self.waiting.remove(&arrival);
            self.take(step, token, who, arrival, asked);
        }
    }

    /// A client was told it holds: the tokens and FIFO checkers judge the
    /// grant, and the holder writes on each of its keys at once (so that
    /// the resource fences off every earlier conflicting holder from now
    /// on).
    fn take(&mut self, step: usize, token: u64, who: usize, arrival: u64, asked: Asked) {
        let Asked {
            keys,
            shared,
            set,
            lease_s,
        } = asked;
        let verdict = &mut self.verdict;
        verdict.grants += 1;
        if shared != 0 {
            verdict.shared_grants += 1;
        }
        if shared != 0 && shared != (1 << keys.len()) - 1 {
            verdict.mixed_grants += 1;
        }
        if self.clients[who].sent_at_step != step {
            verdict.handovers += 1;
        }
        if token <= self.token_max {
            verdict.fire(
                TOKENS,
                step,
                format!("a grant got token {token}, not above {}", self.token_max),
            );
        }
        self.token_max = self.token_max.max(token);
        let overtaken = self
            .waiting
            .iter()
            .filter(|&(&earlier, waiting)| {
                earlier < arrival && waiting.keys.iter().any(|k| keys.contains(k))
            })
            .map(|(&earlier, _)| earlier)
            .min();
        if let Some(earlier) = overtaken {
            verdict.fire(
                FIFO,
                step,
                format!(
                    "request {arrival} granted while request {earlier} on a key of it still waits"
                ),
            );
        }
        self.next_grant += 1;
        let grant = Grant {
            id: self.next_grant,
            token,
            keys,
            shared,
            set,
            until: self
                .h
                .now
                .saturating_add(Duration::from_secs(u64::from(lease_s))),
        };
        let client = &mut self.clients[who];
        client.acquiring = false;
        client.held.push(grant.clone());
        for &key in &grant.keys {
            self.write(&grant, key, step);
        }
    }

    /// The exclusion checker, on who the clients believe holds what.
    fn check_exclusion(&mut self, step: usize) {
        let mut overlapped = false;
        for (key, name) in KEYS.iter().enumerate() {
            let on_key: Vec<(u64, bool)> = self
                .holders()
                .filter_map(|grant| Some((grant.token, grant.exclusive_on(key)?)))
                .collect();
            if on_key.len() > 1 && on_key.iter().any(|&(_, exclusive)| exclusive) {
                self.verdict.fire(
                    EXCLUSION,
                    step,
                    format!("{name} held by {on_key:?} (token, exclusive)"),
                );
            }
            overlapped |= on_key.iter().filter(|&&(_, exclusive)| !exclusive).count() > 1;
        }
        self.verdict.overlaps += usize::from(overlapped);
    }
}

fn run_world(seed: u64) -> Verdict {
    World::new(seed).run()
}

#[test]
fn shared_worlds_keep_exclusion_fifo_rising_tokens_and_fencing() {
    let mut total = Verdict::default();
    for verdict in common::clean(CHECKERS, 200, run_world) {
        total.grants += verdict.grants;
        total.handovers += verdict.handovers;
        total.shared_grants += verdict.shared_grants;
        total.mixed_grants += verdict.mixed_grants;
        total.downgrades += verdict.downgrades;
        total.renewals += verdict.renewals;
        total.releases += verdict.releases;
        total.overlaps += verdict.overlaps;
        total.accepted += verdict.accepted;
        total.fenced_off += verdict.fenced_off;
        total.crashes += verdict.crashes;
    }
    println!("{total:?}");
    // The worlds did what the checkers judge: grants of every mode, many
    // after a wait, sharers side by side, downgrades, renewals, releases,
    // crashes, and stale holders fenced off.
    assert!(total.grants > 5_000, "{total:?}");
    assert!(total.handovers > 2_500, "{total:?}");
    assert!(total.shared_grants > 2_500, "{total:?}");
    assert!(total.mixed_grants > 1_000, "{total:?}");
    assert!(total.overlaps > 5_000, "{total:?}");
    assert!(total.downgrades > 400, "{total:?}");
    assert!(total.renewals > 700, "{total:?}");
    assert!(total.releases > 900, "{total:?}");
    assert!(total.crashes > 2_000, "{total:?}");
    assert!(total.accepted > 8_000, "{total:?}");
    assert!(total.fenced_off > 500, "{total:?}");
    assert_eq!(total.refused, 0, "{total:?}");
}

/// A sharer beside a writer is also, once both wrote, a write accepted
/// beside a live conflicting writer: the fencing checker sees it too (the
/// two marks cannot fence off a holder the lock wrongly let in); the FIFO
/// and token checkers do not.
#[test]
fn the_exclusion_checker_catches_a_sharer_beside_a_writer() {
    let [exclusion, fifo, tokens, fencing] =
        firing(PlantedBug::ShareBesideWriter, CHECKERS, run_world);
    assert_eq!((fifo, tokens), (0, 0));
    assert!(exclusion >= 80, "caught in only {exclusion} of 100 worlds");
    assert!(fencing <= exclusion, "{fencing} of 100 worlds for fencing");
}

#[test]
fn the_fifo_checker_alone_catches_a_sharer_jumping_a_queued_writer() {
    common::caught_alone(PlantedBug::SharedJumpsWriter, CHECKERS, run_world, FIFO, 80);
}

/// Two grants under one token are also, once both wrote, a write the two
/// marks accept after a conflicting write of the same token by another
/// grant: the fencing checker catches it as well. The server's table finds
/// grants by token, so it confuses the two: where both are sharers of a
/// key, the release of one takes both off it, and a writer is let in beside
/// the other, which the exclusion checker sees in a few worlds. The FIFO
/// checker never speaks.
#[test]
fn the_token_and_fencing_checkers_catch_a_reused_token() {
    let [exclusion, fifo, tokens, fencing] = firing(PlantedBug::ReuseToken, CHECKERS, run_world);
    assert_eq!(fifo, 0);
    assert!(tokens >= 80, "caught in only {tokens} of 100 worlds");
    assert!(
        fencing >= 80,
        "fencing caught it in only {fencing} of 100 worlds"
    );
    assert!(
        exclusion * 5 < tokens,
        "{exclusion} of 100 worlds for exclusion"
    );
}

/// A hand-off that serves a queue's second waiter before its first,
/// whatever their modes, passes a waiter too.
#[test]
fn the_fifo_checker_alone_catches_a_skipped_waiter_across_modes() {
    common::caught_alone(PlantedBug::SkipWaiter, CHECKERS, run_world, FIFO, 80);
}

/// A resource that checks a writer against the writers' mark only accepts
/// a writer whose lease ran out after readers granted later acted: the
/// lock table is right, so only the fencing checker can see it. It needs
/// a stale writer to act after a later reader did, before any later
/// writer: about a third of the worlds.
#[test]
fn the_fencing_checker_alone_catches_a_writer_checked_against_writers_only() {
    common::caught_alone(
        PlantedBug::WriterChecksWritersOnly,
        CHECKERS,
        run_world,
        FENCING,
        25,
    );
}
