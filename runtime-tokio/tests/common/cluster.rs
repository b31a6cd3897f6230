//! `ticketing serve` cluster processes on loopback (fast Raft profile) and
//! the published and our clients for them. Leadership and membership are
//! read from each node's status address (one line per connection); where no
//! event exists (an election, a membership change) [`poll`] waits with a
//! deadline.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const PEER_TOKEN: &str = "peer-token-for-tests-0123456789abcdef";
pub const CLIENT_TOKEN: &str = "client-token-for-tests-0123";
pub const IDENTITY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
pub const LEASE: Duration = Duration::from_secs(10);
pub const BUDGET: Duration = Duration::from_millis(500);
/// Longest any awaited cluster change may take (elections take < 1 s in
/// the fast profile; a rejoin a few heartbeats more).
pub const CHANGE_DEADLINE: Duration = Duration::from_secs(15);

pub fn fingerprint() -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&IDENTITY[i * 2..i * 2 + 2], 16).unwrap();
    }
    out
}

use super::ports::free_port;
use super::scratch::{Scratch, scratch_dir};

#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub status: SocketAddr,
}

/// One node's status line, parsed.
#[derive(Debug, Default)]
pub struct Status {
    pub generation: u64,
    pub leader: bool,
    /// The leader this node knows of.
    pub knows_leader: bool,
    pub voter: bool,
    /// A bootstrap member still checking that the cluster is new.
    pub checking: bool,
    pub voters: Vec<(u8, u64)>,
    pub waiters: usize,
    pub peers: usize,
}

/// How each node is configured.
pub enum Setup {
    /// Command-line flags, no peer TLS.
    Flags,
    /// `--config FILE` per slot (written by the test).
    Files(Vec<PathBuf>),
}

pub struct Cluster {
    pub slots: Vec<Slot>,
    nodes: Vec<Option<Child>>,
    pub setup: Setup,
    /// Every node's state directory (their files are named by slot).
    pub state_dir: Scratch,
    /// A libfaketime offset (`-1h`) for nodes started from now on.
    pub faketime: Option<&'static str>,
}

impl Cluster {
    /// `n` slots on free ports, no node running yet, configured by flags.
    pub fn new(n: usize) -> Cluster {
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
            state_dir: scratch_dir("cluster-state"),
            faketime: None,
        }
    }

    /// `n` nodes configured by flags, every one started with `--bootstrap`.
    pub fn start(n: usize) -> Cluster {
        let mut cluster = Cluster::new(n);
        cluster.start_all();
        cluster
    }

    /// Every slot started with `--bootstrap`.
    pub fn start_all(&mut self) {
        for slot in 0..self.slots.len() {
            self.spawn(slot, true);
        }
    }

    pub fn spawn(&mut self, slot: usize, bootstrap: bool) {
        let extra: &[&str] = if bootstrap { &["--bootstrap"] } else { &[] };
        let mut cmd = self.command(slot, extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.nodes[slot] = Some(cmd.spawn().expect("spawn ticketing serve"));
    }

    /// Starts `slot` with `extra` flags (`--recover`), its stderr (at
    /// `warn`) collected in the returned log.
    pub fn spawn_logged(&mut self, slot: usize, extra: &[&str]) -> Arc<Mutex<Vec<String>>> {
        let mut cmd = self.command(slot, extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ticketing serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        self.nodes[slot] = Some(child);
        log
    }

    /// Runs `slot` with `extra` flags until it exits (it must, within
    /// [`CHANGE_DEADLINE`]); its exit code and stderr.
    pub async fn run_to_exit(&self, slot: usize, extra: &[&str]) -> (Option<i32>, String) {
        let mut cmd = self.command(slot, extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn ticketing serve");
        let id = child.id();
        let output = tokio::time::timeout(
            CHANGE_DEADLINE,
            tokio::task::spawn_blocking(move || child.wait_with_output()),
        )
        .await
        .unwrap_or_else(|_| {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            panic!("slot {slot} with {extra:?} did not exit within {CHANGE_DEADLINE:?}")
        })
        .unwrap()
        .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Whether `slot` runs a process started by this cluster.
    pub fn running(&self, slot: usize) -> bool {
        self.nodes[slot].is_some()
    }

    /// `slot`'s token floor file in the shared state directory.
    pub fn floor_file(&self, slot: usize) -> PathBuf {
        let id: String = fingerprint()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.state_dir
            .0
            .join(format!("cluster-{id}-slot{slot}.floor"))
    }

    fn command(&self, slot: usize, extra: &[&str]) -> Command {
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
        cmd.args(extra);
        cmd.args(["--state-dir", &self.state_dir.arg()]);
        if let Some(offset) = self.faketime {
            super::faketime::shift_clock(&mut cmd, offset);
        }
        cmd
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self, slot: usize) {
        if let Some(mut child) = self.nodes[slot].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.client.to_string()).collect()
    }

    /// The status line of `slot`, or `None` if it does not answer with one.
    pub fn status(&self, slot: usize) -> Option<Status> {
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
                "generation" => status.generation = value.parse().ok()?,
                "role" => {
                    seen_role = true;
                    status.leader = value == "leader";
                }
                "leader" => status.knows_leader = value != "none",
                "voter" => status.voter = value == "1",
                "checking" => status.checking = value == "1",
                "waiters" => status.waiters = value.parse().ok()?,
                "peers" => status.peers = value.parse().ok()?,
                "voters" => {
                    status.voters = value
                        .split(',')
                        .filter(|v| !v.is_empty())
                        .filter_map(|v| {
                            let (s, g) = v.split_once(':')?;
                            Some((s.parse().ok()?, g.parse().ok()?))
                        })
                        .collect();
                }
                _ => {}
            }
        }
        seen_role.then_some(status)
    }

    /// Polls until exactly one of `among` (live nodes) leads; returns it.
    pub async fn leader_among(&self, among: &[usize]) -> usize {
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

    /// Polls until `slot` runs under a generation above 1 and is a voter
    /// (not still checking a bootstrap) in `leader`'s three-voter
    /// configuration; asserts its generation 1 is gone from it. Returns the
    /// new generation.
    pub async fn await_replaced(&self, slot: usize, leader: usize) -> u64 {
        let generation = poll("the restarted slot as a voter", || {
            let status = self.status(slot)?;
            let leader_status = self.status(leader)?;
            (status.voter
                && !status.checking
                && status.generation > 1
                && leader_status
                    .voters
                    .contains(&(slot as u8, status.generation))
                && leader_status.voters.len() == 3)
                .then_some(status.generation)
        })
        .await;
        assert!(
            !self
                .status(leader)
                .unwrap()
                .voters
                .contains(&(slot as u8, 1)),
            "generation 1 of slot {slot} removed"
        );
        generation
    }

    /// Polls until exactly one live node leads; returns its slot.
    pub async fn leader(&self) -> usize {
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

/// Polls `check` every 20 ms until it yields a value; panics after
/// [`CHANGE_DEADLINE`].
pub async fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
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

/// The published client in cluster mode, for every slot of `cluster`.
pub fn published(cluster: &Cluster) -> ticketing::TicketBroker {
    ticketing::TicketBroker::builder()
        .addrs(cluster.addrs())
        .token(CLIENT_TOKEN)
        .mode(ticketing::BrokerMode::Cluster {
            identity_fingerprint: fingerprint(),
        })
        .connect()
        .unwrap()
}

/// Our client in cluster mode, for every slot of `cluster`.
pub fn ours(cluster: &Cluster) -> ticketing_tokio::TicketBroker {
    ticketing_tokio::TicketBroker::builder()
        .addrs(cluster.addrs())
        .token(CLIENT_TOKEN)
        .mode(ticketing_tokio::client::BrokerMode::Cluster {
            identity_fingerprint: fingerprint(),
        })
        .connect()
        .unwrap()
}

/// Acquires `key` with the published client, retrying the answers that
/// mean "no effect, try again" while a leader is being elected.
pub async fn acquire_published(broker: &ticketing::TicketBroker, key: &str) -> ticketing::Ticket {
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

/// With no majority alive: three one-second acquires of `key`, none
/// granted, each failing with an answer that means "no effect" (timeout,
/// indeterminate, not connected, busy).
pub async fn assert_no_grant_without_majority(broker: &ticketing::TicketBroker, key: &str) {
    for _ in 0..3 {
        match broker
            .acquire(key, Duration::from_secs(1), LEASE, BUDGET)
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
}
