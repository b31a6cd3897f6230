//! More `ticketing serve` cluster processes on loopback (fast Raft
//! profile), driven by the published client: peer links over TLS (and a
//! node with a foreign CA kept out), and a five-node cluster that survives
//! two `kill -9`s but not a third.
//!
//! Leadership and links are read from each node's status address (one line
//! per connection). Where no event exists (an election) the tests poll it
//! with a deadline; the one negative check (a foreign node never links) is
//! an observation over a bounded window.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PEER_TOKEN: &str = "peer-token-for-tests-0123";
const CLIENT_TOKEN: &str = "client-token-for-tests-0123";
const IDENTITY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const LEASE: Duration = Duration::from_secs(10);
const BUDGET: Duration = Duration::from_millis(500);
/// Longest any awaited cluster change may take (elections take < 1 s in
/// the fast profile).
const CHANGE_DEADLINE: Duration = Duration::from_secs(15);
/// The DNS name on every peer certificate.
const PEER_NAME: &str = "ticketing-peer";

fn fingerprint() -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&IDENTITY[i * 2..i * 2 + 2], 16).unwrap();
    }
    out
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    client: SocketAddr,
    peer: SocketAddr,
    status: SocketAddr,
}

/// One node's status line, parsed.
#[derive(Debug, Default)]
struct Status {
    leader: bool,
    /// The leader this node knows of.
    knows_leader: bool,
    peers: usize,
}

/// How each node is configured.
enum Setup {
    /// Command-line flags, no peer TLS.
    Flags,
    /// `--config FILE` per slot (written by the test).
    Files(Vec<PathBuf>),
}

struct Cluster {
    slots: Vec<Slot>,
    nodes: Vec<Option<Child>>,
    setup: Setup,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        Cluster {
            slots: (0..n)
                .map(|_| Slot {
                    client: free_port(),
                    peer: free_port(),
                    status: free_port(),
                })
                .collect(),
            nodes: (0..n).map(|_| None).collect(),
            setup: Setup::Flags,
        }
    }

    /// Every slot started with `--bootstrap`.
    fn start_all(&mut self) {
        for slot in 0..self.slots.len() {
            self.spawn(slot);
        }
    }

    fn spawn(&mut self, slot: usize) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticketing"));
        cmd.arg("serve");
        match &self.setup {
            Setup::Flags => {
                cmd.args(["--cluster-identity", IDENTITY, "--profile", "fast"])
                    .args(["--self-slot", &slot.to_string()])
                    .args(["--peer-token", PEER_TOKEN, "--client-token", CLIENT_TOKEN])
                    .args(["--status-listen", &self.slots[slot].status.to_string()])
                    .args(["--log-level", "warn"]);
                for s in &self.slots {
                    cmd.args(["--slot", &format!("{},{}", s.client, s.peer)]);
                }
            }
            Setup::Files(files) => {
                cmd.arg("--config").arg(&files[slot]);
            }
        }
        cmd.arg("--bootstrap");
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.nodes[slot] = Some(cmd.spawn().expect("spawn ticketing serve"));
    }

    /// SIGKILL, then reap.
    fn kill(&mut self, slot: usize) {
        if let Some(mut child) = self.nodes[slot].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn addrs(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.client.to_string()).collect()
    }

    fn status(&self, slot: usize) -> Option<Status> {
        let mut tcp =
            TcpStream::connect_timeout(&self.slots[slot].status, Duration::from_secs(1)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut line = String::new();
        tcp.read_to_string(&mut line).ok()?;
        let mut status = Status::default();
        let mut seen_role = false;
        for field in line.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            match name {
                "role" => {
                    seen_role = true;
                    status.leader = value == "leader";
                }
                "leader" => status.knows_leader = value != "none",
                "peers" => status.peers = value.parse().ok()?,
                _ => {}
            }
        }
        seen_role.then_some(status)
    }

    /// Polls until exactly one of `among` (live nodes) leads; returns it.
    async fn leader_among(&self, among: &[usize]) -> usize {
        poll("a leader", || {
            let leaders: Vec<usize> = among
                .iter()
                .copied()
                .filter(|&s| self.nodes[s].is_some())
                .filter(|&s| self.status(s).is_some_and(|st| st.leader))
                .collect();
            (leaders.len() == 1).then(|| leaders[0])
        })
        .await
    }

    async fn leader(&self) -> usize {
        let all: Vec<usize> = (0..self.slots.len()).collect();
        self.leader_among(&all).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for slot in 0..self.nodes.len() {
            self.kill(slot);
        }
    }
}

async fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {CHANGE_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn published(cluster: &Cluster) -> ticketing::TicketBroker {
    ticketing::TicketBroker::builder()
        .addrs(cluster.addrs())
        .token(CLIENT_TOKEN)
        .mode(ticketing::BrokerMode::Cluster {
            identity_fingerprint: fingerprint(),
        })
        .connect()
        .unwrap()
}

/// Acquires `key` with the published client, retrying the answers that
/// mean "no effect, try again" while a leader is being elected.
async fn acquire_published(broker: &ticketing::TicketBroker, key: &str) -> ticketing::Ticket {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        match broker
            .acquire(key, Duration::from_secs(5), LEASE, BUDGET)
            .await
        {
            Ok(ticket) => return ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant of {key}: {e:?}"),
        }
    }
}

/// A CA and one leaf for [`PEER_NAME`] signed by it, as PEM files in `dir`
/// named `{prefix}-ca.pem`, `{prefix}-peer.pem`, `{prefix}-peer.key`.
struct PeerPki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path, prefix: &str) -> PeerPki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![PEER_NAME.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let pki = PeerPki {
        ca: dir.join(format!("{prefix}-ca.pem")),
        cert: dir.join(format!("{prefix}-peer.pem")),
        key: dir.join(format!("{prefix}-peer.key")),
    };
    std::fs::write(&pki.ca, ca.pem()).unwrap();
    std::fs::write(&pki.cert, leaf.pem()).unwrap();
    std::fs::write(&pki.key, leaf_key.serialize_pem()).unwrap();
    pki
}

/// Writes one config file per slot of `cluster` (client side plain TCP,
/// peers over TLS with `pki[slot]`) and switches the cluster to them.
fn write_tls_configs(cluster: &mut Cluster, dir: &Path, name: &str, pki: &[&PeerPki]) {
    let slots: Vec<String> = cluster
        .slots
        .iter()
        .map(|s| format!("{{ client = \"{}\", peer = \"{}\" }}", s.client, s.peer))
        .collect();
    let mut files = Vec::new();
    for (slot, s) in cluster.slots.iter().enumerate() {
        let p = pki[slot];
        let text = format!(
            "client_tokens = [\"{CLIENT_TOKEN}\"]\n\
             log_level = \"warn\"\n\
             \n\
             [cluster]\n\
             identity = \"{IDENTITY}\"\n\
             self_slot = {slot}\n\
             slots = [{}]\n\
             peer_tokens = [\"{PEER_TOKEN}\"]\n\
             profile = \"fast\"\n\
             status_listen = \"{}\"\n\
             \n\
             [cluster.peer_tls]\n\
             cert = {:?}\n\
             key = {:?}\n\
             ca = {:?}\n\
             server_name = \"{PEER_NAME}\"\n",
            slots.join(", "),
            s.status,
            p.cert.display().to_string(),
            p.key.display().to_string(),
            p.ca.display().to_string(),
        );
        let path = dir.join(format!("{name}-{slot}.toml"));
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }
    cluster.setup = Setup::Files(files);
}

/// Removes the directory when the test ends, pass or fail.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn peer_tls_cluster_elects_and_grants() {
    let dir = TempDir(
        std::env::temp_dir().join(format!("ticketing-cluster-more-tls-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let good = make_pki(&dir.0, "good");
    let foreign = make_pki(&dir.0, "foreign");

    // Two clusters at once: every slot of `tls` on the good CA; slot 2 of
    // `mixed` on its own CA (certificate and trusted CA both foreign).
    let mut tls = Cluster::new(3);
    write_tls_configs(&mut tls, &dir.0, "tls", &[&good, &good, &good]);
    tls.start_all();
    let mut mixed = Cluster::new(3);
    write_tls_configs(&mut mixed, &dir.0, "mixed", &[&good, &good, &foreign]);
    mixed.start_all();

    // All three link over TLS, elect and grant.
    tls.leader().await;
    poll("every TLS node linked to both others", || {
        (0..3)
            .all(|s| {
                tls.status(s)
                    .is_some_and(|st| st.peers >= 2 && st.knows_leader)
            })
            .then_some(())
    })
    .await;
    let broker = published(&tls);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let first = acquire_published(&broker, "tls").await;
    let t1 = first.token();
    assert_eq!(
        first.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    let second = acquire_published(&broker, "tls").await;
    assert!(second.token() > t1, "tokens strictly increase");
    assert_eq!(
        second.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    broker.close().await;

    // The foreign node cannot join: the other two elect and serve without
    // it, and it never establishes a peer link nor learns of a leader.
    let leader = mixed.leader_among(&[0, 1]).await;
    let mixed_broker = published(&mixed);
    assert!(mixed_broker.wait_ready(Duration::from_secs(10)).await);
    let ticket = acquire_published(&mixed_broker, "mixed").await;
    assert_eq!(
        ticket.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    mixed_broker.close().await;
    // No event says "a link will never come up": observe for a bounded
    // window of many heartbeats and election timeouts of the fast profile.
    let window = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < window {
        let outsider = mixed.status(2).expect("foreign node status");
        assert_eq!(outsider.peers, 0, "foreign-CA node linked to a peer");
        assert!(!outsider.leader && !outsider.knows_leader, "{outsider:?}");
        let inside = mixed.status(leader).expect("leader status");
        assert!(inside.leader, "leadership of the good pair changed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn five_node_cluster_survives_two_failures() {
    let mut cluster = Cluster::new(5);
    cluster.start_all();
    let first_leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let before = acquire_published(&broker, "five").await;
    let t0 = before.token();
    before.release().await.unwrap();

    // kill -9 the leader and one follower: three of five remain, a majority.
    let other = (first_leader + 1) % 5;
    cluster.kill(first_leader);
    cluster.kill(other);
    let alive: Vec<usize> = (0..5)
        .filter(|&s| s != first_leader && s != other)
        .collect();
    let second_leader = cluster.leader_among(&alive).await;
    let mut last = t0;
    for _ in 0..3 {
        let ticket = acquire_published(&broker, "five").await;
        assert!(
            ticket.token() > last,
            "token {} not above {last}",
            ticket.token()
        );
        last = ticket.token();
        assert_eq!(
            ticket.release().await.unwrap(),
            ticketing::ReleaseOutcome::Released
        );
    }

    // A third failure (the new leader): two of five, no majority, no grant.
    cluster.kill(second_leader);
    for _ in 0..3 {
        match broker
            .acquire("five", Duration::from_secs(1), LEASE, BUDGET)
            .await
        {
            Ok(ticket) => panic!("granted without a majority: token {}", ticket.token()),
            Err(e) => assert!(
                matches!(
                    e,
                    ticketing::TicketError::Timeout
                        | ticketing::TicketError::Indeterminate
                        | ticketing::TicketError::NotConnected
                        | ticketing::TicketError::Busy
                ),
                "unexpected error without a majority: {e:?}"
            ),
        }
    }
    broker.close().await;
}
