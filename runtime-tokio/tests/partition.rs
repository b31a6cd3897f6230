//! Real network partitions between real `ticketing serve` processes.
//!
//! Each node of a loopback cluster (fast Raft profile) runs under its own
//! uid, so that nftables can tell which node opened a peer connection: an
//! `output` rule marks the connection (conntrack mark) by the uid of the
//! socket sending its SYN and the peer port it goes to, and an `input` rule
//! drops every packet of a connection whose pair of nodes is cut, in both
//! directions. Client links are cut by client port, also on input. Drops
//! are on the input hook because that is how a real network loses packets:
//! a drop on output is reported to the sending socket, and the kernel keeps
//! probing, which hides silent links.
//!
//! The test creates an nftables table of its own
//! (`ticketing_partition_<pid>_<n>`) and always deletes it (a drop guard,
//! also on panic); it never touches any other table. It needs root and
//! `nft`: without them it fails when `CI` is set (CI runs as root and
//! installs nftables) and otherwise prints a skip line and passes.
//!
//! Concurrent lock loops of our tokio client record tokens and
//! critical-section intervals. Checked: per key, tokens strictly increase
//! in grant order and critical sections never overlap; no request started
//! while the client could reach only a minority is granted before the
//! heal; a new leader is elected within [`NEW_LEADER_BOUND`]; after every
//! heal (a 30 s cut in the first scenario, shorter ones after it) every
//! node follows the current leader within [`HEAL_BOUND`], read from the
//! status lines (`role=`, `leader=`, `term=`, `live=`). Conditions are
//! polled with a deadline, never slept for.
//!
//! `scripts/partition-soak.sh` runs the ignored soak here, which measures
//! the heal time after 5, 30 and 60 s leader isolations.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{CLIENT_TOKEN, IDENTITY, PEER_TOKEN, fingerprint};
use common::ports::free_port;
use ticketing_tokio::TicketBroker;
use ticketing_tokio::client::BrokerMode;

/// Every node follows the current leader this soon after a heal.
const HEAL_BOUND: Duration = Duration::from_secs(3);
/// A majority without the old leader elects a new one this soon (fast
/// profile: election timeout 300-450 ms, plus pre-vote and slack for a
/// shared machine).
const NEW_LEADER_BOUND: Duration = Duration::from_secs(5);
/// Bound on anything else awaited (startup, the first grant after a heal).
const SETTLE: Duration = Duration::from_secs(20);
/// The lock loops' acquire parameters.
const WAIT: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(5);
const BUDGET: Duration = Duration::from_secs(1);
/// How long a loop holds its lock (the critical section).
const HOLD: Duration = Duration::from_millis(5);
/// Pause between a loop's attempts, to keep the CPU for the nodes.
const PACE: Duration = Duration::from_millis(20);

/// One partition test at a time: they share the machine's two cores and
/// measure seconds.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

/// True when the test can run (root and `nft`); false after printing a
/// skip line; panics instead of skipping when `CI` is set.
fn environment_ready(test: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .map(|uids| uids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let nft = Command::new("nft")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if root && nft {
        return true;
    }
    let missing = match (root, nft) {
        (false, false) => "root and nft",
        (false, true) => "root",
        _ => "nft (nftables)",
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: needs {missing}, and CI is set: failing instead of skipping"
    );
    eprintln!("SKIPPED {test}: needs {missing} (runs in CI as root with nftables)");
    false
}

/// Runs `nft` with `args`, or with `script` on stdin; panics on failure.
fn nft(args: &[&str], script: Option<&str>) {
    let mut command = Command::new("nft");
    command.args(args).stderr(Stdio::piped());
    if script.is_some() {
        command.stdin(Stdio::piped());
    }
    let mut child = command.spawn().expect("run nft");
    if let Some(script) = script {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "nft {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The test's own nftables table, deleted on drop.
struct Firewall {
    table: String,
}

/// The conntrack mark of the connections between nodes `a` and `b`.
fn pair_mark(a: usize, b: usize) -> u32 {
    let (low, high) = (a.min(b), a.max(b));
    (1 + low * 8 + high) as u32
}

impl Firewall {
    /// Creates the table: marks peer connections by the pair of nodes
    /// (`uids[i]` is node i's uid, `peer_ports[i]` its peer port), drops
    /// nothing yet.
    fn create(uids: &[u32], peer_ports: &[u16]) -> Firewall {
        static TABLES: AtomicUsize = AtomicUsize::new(0);
        let table = format!(
            "ticketing_partition_{}_{}",
            std::process::id(),
            TABLES.fetch_add(1, Ordering::Relaxed)
        );
        let mut marks = String::new();
        for (dialer, uid) in uids.iter().enumerate() {
            for (acceptor, port) in peer_ports.iter().enumerate() {
                if dialer != acceptor {
                    marks.push_str(&format!(
                        "    meta skuid {uid} tcp dport {port} ct state new ct mark set {}\n",
                        pair_mark(dialer, acceptor)
                    ));
                }
            }
        }
        let script = format!(
            "table inet {table} {{
  set cut_pairs {{ type mark; }}
  set cut_ports {{ type inet_service; }}
  chain mark_peers {{
    type filter hook output priority 0; policy accept;
{marks}  }}
  chain drop_cut {{
    type filter hook input priority 0; policy accept;
    ct mark @cut_pairs drop
    tcp dport @cut_ports drop
    tcp sport @cut_ports drop
  }}
}}
"
        );
        // The guard exists before the table, so a failure half-way still
        // deletes whatever was created.
        let firewall = Firewall { table };
        nft(&["-f", "-"], Some(&script));
        firewall
    }

    fn set(&self, verb: &str, set: &str, elements: &[String]) {
        if elements.is_empty() {
            return;
        }
        let elements = format!("{{ {} }}", elements.join(", "));
        nft(
            &[verb, "element", "inet", &self.table, set, &elements],
            None,
        );
    }

    /// Cuts every link between a node of `side` and a node not in it.
    fn cut_nodes(&self, nodes: usize, side: &[usize]) {
        let pairs: Vec<String> = (0..nodes)
            .flat_map(|a| (0..nodes).map(move |b| (a, b)))
            .filter(|&(a, b)| a < b && side.contains(&a) != side.contains(&b))
            .map(|(a, b)| pair_mark(a, b).to_string())
            .collect();
        self.set("add", "cut_pairs", &pairs);
    }

    /// Cuts the link between nodes `a` and `b` only.
    fn cut_pair(&self, a: usize, b: usize) {
        self.set("add", "cut_pairs", &[pair_mark(a, b).to_string()]);
    }

    /// Cuts clients from these client ports (both directions).
    fn cut_clients(&self, ports: &[u16]) {
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        self.set("add", "cut_ports", &ports);
    }

    /// Removes every cut.
    fn heal(&self) {
        for set in ["cut_pairs", "cut_ports"] {
            nft(&["flush", "set", "inet", &self.table, set], None);
        }
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Slot {
    client: SocketAddr,
    peer: SocketAddr,
    status: SocketAddr,
    /// The admin HTTP listener (`/readyz`).
    admin: SocketAddr,
}

/// One node's status line, the fields this test reads.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Status {
    leader_role: bool,
    /// The leader this node follows, if it knows one.
    leader: Option<usize>,
    term: u64,
    commit: u64,
    /// Peer slots the node counts live.
    live: usize,
}

/// A cluster of `ticketing serve` processes, node i under uid `uids[i]`,
/// killed on drop; its binary copy and state directories are removed.
struct Nodes {
    slots: Vec<Slot>,
    uids: Vec<u32>,
    /// The Raft profile (`fast` or `default`).
    profile: &'static str,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Nodes {
    /// Slots on free ports and the binary copied where the uids can run
    /// it; no node running yet.
    fn new(uids: &[u32], profile: &'static str) -> Nodes {
        let slots: Vec<Slot> = uids
            .iter()
            .map(|_| Slot {
                client: free_port(),
                peer: free_port(),
                status: free_port(),
                admin: free_port(),
            })
            .collect();
        let dir = std::env::temp_dir().join(format!(
            "ticketing-partition-{}-{}",
            std::process::id(),
            uids[0]
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The build's binary may sit below folders the node uids cannot
        // enter.
        let binary = dir.join("ticketing");
        std::fs::copy(env!("CARGO_BIN_EXE_ticketing"), &binary).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        Nodes {
            slots,
            uids: uids.to_vec(),
            profile,
            children: Vec::new(),
            dir,
        }
    }

    /// Starts every node (`--bootstrap`).
    fn start_all(&mut self) {
        let binary = self.dir.join("ticketing");
        for slot in 0..self.uids.len() {
            let child = self.spawn(&binary, slot);
            self.children.push(child);
        }
    }

    fn spawn(&self, binary: &Path, slot: usize) -> Child {
        let uid = self.uids[slot];
        let state = self.dir.join(format!("state-{slot}"));
        std::fs::create_dir_all(&state).unwrap();
        std::os::unix::fs::chown(&state, Some(uid), Some(uid)).unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg("serve")
            .args(["--cluster-identity", IDENTITY, "--profile", self.profile])
            .args(["--self-slot", &slot.to_string()])
            .args(["--peer-token", PEER_TOKEN, "--client-token", CLIENT_TOKEN])
            .args(["--status-listen", &self.slots[slot].status.to_string()])
            .args(["--admin-listen", &self.slots[slot].admin.to_string()])
            .args(["--log-level", "warn", "--bootstrap"])
            .arg("--state-dir")
            .arg(&state);
        for s in &self.slots {
            cmd.args(["--slot", &format!("{},{}", s.client, s.peer)]);
        }
        cmd.uid(uid).gid(uid);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd.spawn().expect("spawn ticketing serve")
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn peer_ports(&self) -> Vec<u16> {
        self.slots.iter().map(|s| s.peer.port()).collect()
    }

    fn client_ports(&self, nodes: &[usize]) -> Vec<u16> {
        nodes.iter().map(|&n| self.slots[n].client.port()).collect()
    }

    fn broker(&self) -> TicketBroker {
        TicketBroker::builder()
            .addrs(self.slots.iter().map(|s| s.client.to_string()))
            .token(CLIENT_TOKEN)
            .mode(BrokerMode::Cluster {
                identity_fingerprint: fingerprint(),
            })
            .connect()
            .unwrap()
    }

    /// The status line of `slot`, or `None` if it does not answer with one.
    fn status(&self, slot: usize) -> Option<Status> {
        let addr = self.slots[slot].status;
        let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut line = String::new();
        tcp.read_to_string(&mut line).ok()?;
        let mut status = Status {
            leader_role: false,
            leader: None,
            term: 0,
            commit: 0,
            live: 0,
        };
        let mut seen_role = false;
        for field in line.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            match name {
                "role" => {
                    seen_role = true;
                    status.leader_role = value == "leader";
                }
                "leader" => status.leader = value.parse().ok(),
                "term" => status.term = value.parse().ok()?,
                "commit" => status.commit = value.parse().ok()?,
                "live" => status.live = value.parse().ok()?,
                _ => {}
            }
        }
        seen_role.then_some(status)
    }

    /// The status code and body of `GET /readyz` on `slot`'s admin
    /// listener, or `None` if it does not answer.
    fn readyz(&self, slot: usize) -> Option<(u16, String)> {
        use std::io::Write;
        let addr = self.slots[slot].admin;
        let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            tcp,
            "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        tcp.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    /// The leader every node follows, in one term, with every peer live at
    /// the leader: the cluster is whole.
    fn converged(&self) -> Option<usize> {
        let statuses: Vec<Status> = (0..self.len())
            .map(|slot| self.status(slot))
            .collect::<Option<_>>()?;
        let leader = statuses.iter().position(|s| s.leader_role)?;
        let term = statuses[leader].term;
        let whole = statuses[leader].live == self.len() - 1
            && statuses.iter().enumerate().all(|(slot, s)| {
                s.leader == Some(leader) && s.term == term && s.leader_role == (slot == leader)
            });
        whole.then_some(leader)
    }

    /// A node of `among` that leads in a term above `above`.
    fn leader_among(&self, among: &[usize], above: u64) -> Option<(usize, u64)> {
        among.iter().find_map(|&slot| {
            let status = self.status(slot)?;
            (status.leader_role && status.term > above).then_some((slot, status.term))
        })
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` every 20 ms until it yields a value; `None` once
/// `bound` has passed (then the caller fails with what it waited for).
async fn poll_within<T>(bound: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// Lock loops and the checks on what they saw
// ---------------------------------------------------------------------------

/// One granted critical section, as the client saw it.
#[derive(Clone, Copy, Debug)]
struct Grant {
    key: usize,
    token: u64,
    requested_at: Instant,
    granted_at: Instant,
    /// When the critical section ended (before the release was sent).
    left_at: Instant,
}

/// Concurrent lock loops over a few keys, recording every grant.
struct Loops {
    grants: Arc<Mutex<Vec<Grant>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const KEYS: usize = 2;
const LOOPS: usize = 4;

impl Loops {
    fn start(broker: &TicketBroker) -> Loops {
        let grants = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..LOOPS)
            .map(|n| {
                let (broker, grants, stop) = (broker.clone(), grants.clone(), stop.clone());
                tokio::spawn(async move {
                    let key = n % KEYS;
                    let name = format!("partition-key-{key}");
                    while !stop.load(Ordering::Relaxed) {
                        let requested_at = Instant::now();
                        if let Ok(ticket) = broker.acquire(&name, WAIT, LEASE, BUDGET).await {
                            let granted_at = Instant::now();
                            // The critical section: work, not a wait.
                            tokio::time::sleep(HOLD).await;
                            let left_at = Instant::now();
                            grants.lock().unwrap().push(Grant {
                                key,
                                token: ticket.token(),
                                requested_at,
                                granted_at,
                                left_at,
                            });
                            // Lost releases are left to the lease.
                            let _ = ticket.release().await;
                        }
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        Loops {
            grants,
            stop,
            tasks,
        }
    }

    fn grants(&self) -> Vec<Grant> {
        self.grants.lock().unwrap().clone()
    }

    /// Waits for a grant requested after `after`.
    async fn await_grant_after(&self, after: Instant, what: &str) {
        self.await_grants_after(after, 1, what).await;
    }

    /// Waits for `count` grants requested after `after`.
    async fn await_grants_after(&self, after: Instant, count: usize, what: &str) {
        poll_within(SETTLE, || {
            let seen = self
                .grants()
                .iter()
                .filter(|g| g.requested_at > after)
                .count();
            (seen >= count).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("not {count} grants requested after {what} within {SETTLE:?}"));
    }

    async fn stop(self) -> Vec<Grant> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(self.grants)
            .map(|grants| grants.into_inner().unwrap())
            .unwrap_or_else(|grants| grants.lock().unwrap().clone())
    }
}

/// Per key, in grant order: tokens strictly increase and no critical
/// section starts before the previous one ended.
fn assert_safe(grants: &[Grant]) {
    for key in 0..KEYS {
        let mut of_key: Vec<&Grant> = grants.iter().filter(|g| g.key == key).collect();
        of_key.sort_by_key(|g| g.granted_at);
        for pair in of_key.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(
                after.token > before.token,
                "key {key}: token {} granted after {}",
                after.token,
                before.token
            );
            assert!(
                after.granted_at >= before.left_at,
                "key {key}: tokens {} and {} overlap",
                before.token,
                after.token
            );
        }
    }
}

/// No grant of a request started in `[from, to)` arrived before `to`: the
/// client could reach only nodes that cannot commit.
fn assert_no_grant_between(grants: &[Grant], from: Instant, to: Instant, what: &str) {
    if let Some(grant) = grants
        .iter()
        .find(|g| g.requested_at >= from && g.requested_at < to && g.granted_at < to)
    {
        panic!("{what}: token {} granted during the cut", grant.token);
    }
}

/// Some request started in `[from, to)` was granted before `to`.
fn assert_some_grant_between(grants: &[Grant], from: Instant, to: Instant, what: &str) {
    assert!(
        grants
            .iter()
            .any(|g| g.requested_at >= from && g.granted_at < to),
        "{what}: no grant during the cut"
    );
}

/// Heals and returns how long until every node follows the current leader,
/// failing past [`HEAL_BOUND`].
async fn heal_and_measure(nodes: &Nodes, firewall: &Firewall, what: &str) -> (Instant, Duration) {
    firewall.heal();
    let healed_at = Instant::now();
    poll_within(HEAL_BOUND, || nodes.converged())
        .await
        .unwrap_or_else(|| {
            let statuses: Vec<_> = (0..nodes.len()).map(|s| nodes.status(s)).collect();
            panic!("{what}: not every node follows one leader {HEAL_BOUND:?} after the heal: {statuses:?}")
        });
    let took = healed_at.elapsed();
    eprintln!("{what}: every node follows the leader {took:?} after the heal");
    (healed_at, took)
}

/// A started cluster whose nodes all follow one leader; its firewall was
/// created before the nodes, so every peer connection is marked.
async fn whole_cluster(uids: &[u32], profile: &'static str) -> (Firewall, Nodes, usize) {
    let mut nodes = Nodes::new(uids, profile);
    // Before any node dials: a connection opened before the table exists
    // would carry no mark and could not be cut.
    let firewall = Firewall::create(uids, &nodes.peer_ports());
    nodes.start_all();
    let leader = poll_within(SETTLE, || nodes.converged())
        .await
        .expect("the cluster did not come up whole");
    (firewall, nodes, leader)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_survive_and_heal_real_partitions() {
    if !environment_ready("three_nodes_survive_and_heal_real_partitions") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let (firewall, nodes, leader) = whole_cluster(&[64001, 64002, 64003], "fast").await;
    let broker = nodes.broker();
    assert!(broker.wait_ready(SETTLE).await);
    let loops = Loops::start(&broker);
    loops.await_grant_after(Instant::now(), "the start").await;

    // 1. The leader isolated for 30 s: the two others elect a new leader
    // and keep granting; after the heal the old leader follows within the
    // bound.
    let term = nodes.status(leader).unwrap().term;
    let others: Vec<usize> = (0..3).filter(|&n| n != leader).collect();
    firewall.cut_nodes(3, &[leader]);
    let cut_at = Instant::now();
    let (new_leader, _) = poll_within(NEW_LEADER_BOUND, || nodes.leader_among(&others, term))
        .await
        .expect("no new leader among the majority");
    eprintln!(
        "leader {leader} isolated: {new_leader} leads {:?} after the cut",
        cut_at.elapsed()
    );
    poll_within(NEW_LEADER_BOUND, || {
        (!nodes.status(leader)?.leader_role).then_some(())
    })
    .await
    .expect("the isolated leader did not step down");
    // From its step-down on, the isolated node commits nothing: no grant
    // can come from it.
    let isolated_commit = nodes.status(leader).unwrap().commit;
    loops
        .await_grant_after(cut_at, "the leader's isolation")
        .await;
    let hold_until = cut_at + Duration::from_secs(30);
    tokio::time::sleep_until(hold_until.into()).await;
    let isolated = nodes.status(leader).unwrap();
    assert_eq!(
        isolated.commit, isolated_commit,
        "the isolated node committed"
    );
    assert!(!isolated.leader_role, "the isolated node leads again");
    heal_and_measure(&nodes, &firewall, "leader isolated 30 s").await;

    // 2. A partial partition: the leader and one follower lose each other,
    // both still reach the third. The leader keeps its majority.
    let leader = nodes.converged().expect("whole before the partial cut");
    let follower = (leader + 1) % 3;
    firewall.cut_pair(leader, follower);
    let cut_at = Instant::now();
    loops
        .await_grant_after(cut_at, "the partial partition")
        .await;
    tokio::time::sleep_until((cut_at + Duration::from_secs(5)).into()).await;
    let healed = heal_and_measure(&nodes, &firewall, "leader-follower link cut 5 s").await;
    assert_some_grant_between(&loops.grants(), cut_at, healed.0, "partial partition");

    // 3. A follower isolated: the other two go on.
    let leader = nodes.converged().expect("whole before the follower cut");
    let follower = (leader + 2) % 3;
    firewall.cut_nodes(3, &[follower]);
    let cut_at = Instant::now();
    loops
        .await_grant_after(cut_at, "the follower's isolation")
        .await;
    tokio::time::sleep_until((cut_at + Duration::from_secs(5)).into()).await;
    let healed = heal_and_measure(&nodes, &firewall, "follower isolated 5 s").await;
    assert_some_grant_between(&loops.grants(), cut_at, healed.0, "follower isolated");

    // 4. The clients cut from the majority (the leader and one follower):
    // the one node they reach cannot grant; after the heal they are served
    // again.
    let leader = nodes.converged().expect("whole before the client cut");
    let reachable = (leader + 1) % 3;
    let majority: Vec<usize> = (0..3).filter(|&n| n != reachable).collect();
    firewall.cut_clients(&nodes.client_ports(&majority));
    let cut_at = Instant::now();
    tokio::time::sleep_until((cut_at + Duration::from_secs(5)).into()).await;
    let (healed_at, _) =
        heal_and_measure(&nodes, &firewall, "clients cut from the majority 5 s").await;
    loops
        .await_grant_after(healed_at, "the clients' heal")
        .await;
    let grants = loops.stop().await;
    assert_no_grant_between(&grants, cut_at, healed_at, "clients cut from the majority");
    assert_safe(&grants);
    eprintln!("three nodes: {} grants checked", grants.len());
    broker.close().await;
}

/// `/readyz` follows the partition: 200 on every node of a whole cluster,
/// 503 ("no known leader") on a node cut off from its majority, leader or
/// follower, while the majority's nodes turn (or stay) 200 under the
/// leader they elect; 200 everywhere again after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_drops_to_503_on_a_node_cut_off_from_its_majority() {
    if !environment_ready("readyz_drops_to_503_on_a_node_cut_off_from_its_majority") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let (firewall, nodes, leader) = whole_cluster(&[64021, 64022, 64023], "fast").await;
    let ready = |slot: usize| nodes.readyz(slot).is_some_and(|(status, _)| status == 200);
    poll_within(SETTLE, || (0..3).all(ready).then_some(()))
        .await
        .expect("a whole cluster is ready on every node");

    for (what, cut) in [("the leader", leader), ("a follower", (leader + 1) % 3)] {
        let others: Vec<usize> = (0..3).filter(|&n| n != cut).collect();
        firewall.cut_nodes(3, &[cut]);
        let body = poll_within(NEW_LEADER_BOUND, || {
            nodes
                .readyz(cut)
                .and_then(|(status, body)| (status == 503).then_some(body))
        })
        .await
        .unwrap_or_else(|| panic!("{what} cut off stays ready: {:?}", nodes.readyz(cut)));
        assert_eq!(body, "not ready: no known leader\n", "{what}");
        poll_within(NEW_LEADER_BOUND, || {
            others.iter().all(|&n| ready(n)).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("the majority without {what} is not ready"));
        // Still cut: the isolated node stays out.
        assert_eq!(nodes.readyz(cut).map(|(status, _)| status), Some(503));
        heal_and_measure(&nodes, &firewall, &format!("{what} cut off")).await;
        poll_within(HEAL_BOUND, || (0..3).all(ready).then_some(()))
            .await
            .unwrap_or_else(|| panic!("not every node ready after healing {what}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_split_two_three_with_the_leader_in_the_minority() {
    if !environment_ready("five_nodes_split_two_three_with_the_leader_in_the_minority") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let (firewall, nodes, leader) =
        whole_cluster(&[64011, 64012, 64013, 64014, 64015], "fast").await;
    let broker = nodes.broker();
    assert!(broker.wait_ready(SETTLE).await);
    let loops = Loops::start(&broker);
    loops.await_grant_after(Instant::now(), "the start").await;

    // The leader and one follower on one side, three nodes on the other;
    // the clients reach only the minority.
    let minority = [leader, (leader + 1) % 5];
    let majority: Vec<usize> = (0..5).filter(|n| !minority.contains(n)).collect();
    let term = nodes.status(leader).unwrap().term;
    firewall.cut_nodes(5, &minority);
    firewall.cut_clients(&nodes.client_ports(&majority));
    let cut_at = Instant::now();
    let (new_leader, _) = poll_within(NEW_LEADER_BOUND, || nodes.leader_among(&majority, term))
        .await
        .expect("no new leader among the majority");
    eprintln!(
        "2/3 split: {new_leader} leads the majority {:?} after the cut",
        cut_at.elapsed()
    );
    // The old leader steps down; from then on the minority commits
    // nothing.
    poll_within(NEW_LEADER_BOUND, || {
        (!nodes.status(leader)?.leader_role).then_some(())
    })
    .await
    .expect("the minority's leader did not step down");
    let commits: Vec<u64> = minority
        .iter()
        .map(|&n| nodes.status(n).unwrap().commit)
        .collect();
    tokio::time::sleep_until((cut_at + Duration::from_secs(10)).into()).await;
    for (&node, &commit) in minority.iter().zip(&commits) {
        let now = nodes.status(node).unwrap();
        assert_eq!(
            now.commit, commit,
            "minority node {node} committed during the cut"
        );
        assert!(
            !now.leader_role,
            "minority node {node} leads during the cut"
        );
    }
    let (healed_at, _) = heal_and_measure(
        &nodes,
        &firewall,
        "2/3 split with the leader in the minority 10 s",
    )
    .await;
    loops.await_grants_after(healed_at, 200, "the heal").await;
    let grants = loops.stop().await;
    assert_no_grant_between(&grants, cut_at, healed_at, "clients on the minority side");
    assert_safe(&grants);
    eprintln!("five nodes: {} grants checked", grants.len());
    broker.close().await;
}

/// The soak behind `scripts/partition-soak.sh`: a 3-node cluster under the
/// lock loops, its leader isolated for each of `PARTITION_SOAK_CUTS_S`
/// seconds in turn (default `5,30,60`), `PARTITION_SOAK_ROUNDS` times each
/// (default 1), with the Raft profile `PARTITION_SOAK_PROFILE` (default
/// `fast`). Prints one `soak` line per cut: when the majority had a new
/// leader, and how long after the heal every node followed the current
/// leader. Fails, after printing every figure, if a heal took longer than
/// [`HEAL_BOUND`] or the loops saw anything unsafe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of several minutes; run by scripts/partition-soak.sh"]
async fn soak_heal_after_leader_isolation() {
    if !environment_ready("soak_heal_after_leader_isolation") {
        return;
    }
    let cuts_s: Vec<u64> = std::env::var("PARTITION_SOAK_CUTS_S")
        .unwrap_or_else(|_| "5,30,60".to_owned())
        .split(',')
        .map(|cut| {
            cut.trim()
                .parse()
                .expect("PARTITION_SOAK_CUTS_S: seconds, comma-separated")
        })
        .collect();
    let rounds: usize = std::env::var("PARTITION_SOAK_ROUNDS").map_or(1, |rounds| {
        rounds.parse().expect("PARTITION_SOAK_ROUNDS: a count")
    });
    let profile = match std::env::var("PARTITION_SOAK_PROFILE").as_deref() {
        Ok("default") => "default",
        Ok("fast") | Err(_) => "fast",
        Ok(other) => panic!("PARTITION_SOAK_PROFILE: {other:?} is not fast or default"),
    };
    let _serial = SERIAL.lock().await;
    let (firewall, nodes, _) = whole_cluster(&[64021, 64022, 64023], profile).await;
    let broker = nodes.broker();
    assert!(broker.wait_ready(SETTLE).await);
    let loops = Loops::start(&broker);
    loops.await_grant_after(Instant::now(), "the start").await;
    let mut slowest = Duration::ZERO;
    for &cut_s in cuts_s
        .iter()
        .flat_map(|cut| std::iter::repeat_n(cut, rounds))
    {
        let leader = poll_within(SETTLE, || nodes.converged())
            .await
            .expect("whole before the cut");
        let term = nodes.status(leader).unwrap().term;
        let others: Vec<usize> = (0..3).filter(|&n| n != leader).collect();
        firewall.cut_nodes(3, &[leader]);
        let cut_at = Instant::now();
        let elected = poll_within(SETTLE, || nodes.leader_among(&others, term))
            .await
            .map(|_| cut_at.elapsed());
        tokio::time::sleep_until((cut_at + Duration::from_secs(cut_s)).into()).await;
        firewall.heal();
        let healed_at = Instant::now();
        // Measured, not bounded here: a regression shows as a figure.
        let converged = poll_within(Duration::from_secs(180), || nodes.converged()).await;
        let took = healed_at.elapsed();
        slowest = slowest.max(took);
        println!(
            "soak profile={profile} cut_s={cut_s} new_leader_ms={} heal_to_all_following_ms={}{}",
            elected.map_or_else(|| "none".to_owned(), |at| at.as_millis().to_string()),
            took.as_millis(),
            if converged.is_some() {
                ""
            } else {
                " (never converged)"
            },
        );
        loops.await_grant_after(healed_at, "the heal").await;
    }
    let grants = loops.stop().await;
    assert_safe(&grants);
    println!("soak grants_checked={}", grants.len());
    broker.close().await;
    assert!(slowest <= HEAL_BOUND, "slowest heal {slowest:?}");
}
