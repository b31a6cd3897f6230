//! Helpers for the mixed-dialect tests: real `ticketing serve` child
//! processes on free loopback ports, single or a 3-node cluster.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// First port handed out; the span ends below Linux's ephemeral range, so a
/// port we probed cannot be taken by an outbound connection before the
/// server binds it (as in runtime-tokio/tests/common/ports.rs).
const FIRST_PORT: u32 = 20_000;
/// Ports in the span.
const SPAN: u32 = 12_000;

/// A loopback address whose port is free now.
pub fn free_port() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(61).wrapping_add(7_001) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port in {FIRST_PORT}..");
        let port = FIRST_PORT + (start + n * 7) % SPAN;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

/// A `ticketing serve` child process; killed, and its state folder removed,
/// when dropped.
pub struct Server {
    child: Child,
    state_dir: PathBuf,
    /// The address it was waited for on: clients' for a single server,
    /// the status port for a cluster node.
    pub addr: SocketAddr,
}

fn ticketing_bin() -> String {
    std::env::var("TICKETING_BIN").expect("TICKETING_BIN must name the ticketing binary to test")
}

/// Polls until `addr` accepts a connection (10 s at most).
fn wait_listening(addr: SocketAddr) {
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing listens on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// Starts `$TICKETING_BIN serve` on a free loopback port with `args`
    /// added, and returns once it accepts connections.
    pub fn start(args: &[&str]) -> Server {
        let addr = free_port();
        Server::spawn(addr, &["--listen", &addr.to_string()], args, &[])
    }

    /// `ticketing serve` with `fixed` and `args`, and `env` added to an
    /// environment without our variables; `addr` is where clients go.
    fn spawn(addr: SocketAddr, fixed: &[&str], args: &[&str], env: &[(&str, &str)]) -> Server {
        let state_dir = std::env::temp_dir().join(format!(
            "ticketing-interop-{}-{}",
            std::process::id(),
            addr.port()
        ));
        let child = Command::new(ticketing_bin())
            .args(["serve", "--log-level", "warn"])
            .args(fixed)
            .arg("--state-dir")
            .arg(&state_dir)
            .args(args)
            .env_remove("TICKETING_CLIENT_TOKENS")
            .env_remove("TICKETING_PEER_TOKENS")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .expect("start ticketing serve");
        let server = Server {
            child,
            state_dir,
            addr,
        };
        wait_listening(addr);
        server
    }

    /// SIGTERM, then the exit status; fails the test if it does not stop
    /// within 10 s or stops with an error.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "server exited with {status}");
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// A 3-node loopback cluster (fast Raft profile) with a status port per
/// node.
pub struct Cluster {
    /// The nodes by slot; `None` once killed.
    nodes: Vec<Option<Server>>,
    /// Each slot's client address.
    clients: Vec<SocketAddr>,
    /// Each slot's status address.
    status: Vec<SocketAddr>,
    /// The cluster identity, as the v3 client wants it.
    pub identity: [u8; 32],
}

impl Cluster {
    /// Bootstraps 3 nodes that accept `client_token`, and returns once they
    /// agree on a leader.
    pub fn start(client_token: &str) -> Cluster {
        let output = Command::new(ticketing_bin())
            .arg("identity")
            .output()
            .expect("ticketing identity");
        let hex = String::from_utf8(output.stdout).expect("identity text");
        let hex = hex.trim().to_owned();
        assert_eq!(hex.len(), 64, "identity {hex:?}");
        let mut identity = [0u8; 32];
        for (i, byte) in identity.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("identity hex");
        }
        let clients: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
        let peers: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
        let status: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
        let mut slots = Vec::new();
        for (client, peer) in clients.iter().zip(&peers) {
            slots.push("--slot".to_owned());
            slots.push(format!("{client},{peer}"));
        }
        let peer_token = format!("interop-peer-{}", &hex[..24]);
        let env = [
            ("TICKETING_PEER_TOKENS", peer_token.as_str()),
            ("TICKETING_CLIENT_TOKENS", client_token),
        ];
        let nodes = (0..3)
            .map(|slot| {
                let slot_text = slot.to_string();
                let status_text = status[slot].to_string();
                let mut args = vec![
                    "--cluster-identity",
                    &hex,
                    "--self-slot",
                    &slot_text,
                    "--status-listen",
                    &status_text,
                    "--profile",
                    "fast",
                    "--bootstrap",
                ];
                args.extend(slots.iter().map(String::as_str));
                // Up once its status port answers; clients may come later.
                Some(Server::spawn(status[slot], &[], &args, &env))
            })
            .collect();
        let cluster = Cluster {
            nodes,
            clients,
            status,
            identity,
        };
        cluster.wait_for_leader(None);
        cluster
    }

    /// Client addresses in slot order, as configured.
    pub fn addrs(&self) -> Vec<String> {
        self.clients.iter().map(SocketAddr::to_string).collect()
    }

    fn status_line(&self, slot: usize) -> Option<String> {
        self.nodes[slot].as_ref()?;
        let mut stream =
            TcpStream::connect_timeout(&self.status[slot], Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut line = String::new();
        stream.read_to_string(&mut line).ok()?;
        Some(line)
    }

    /// The slot every live node names as leader, once they agree and that
    /// node is alive.
    pub fn leader(&self) -> Option<usize> {
        let mut named = None;
        for slot in 0..3 {
            if self.nodes[slot].is_none() {
                continue;
            }
            let leader = self
                .status_line(slot)?
                .split_whitespace()
                .find_map(|field| field.strip_prefix("leader="))?
                .parse::<usize>()
                .ok()?;
            if named.is_some_and(|n| n != leader) {
                return None;
            }
            named = Some(leader);
        }
        named.filter(|&l| self.nodes.get(l).is_some_and(Option::is_some))
    }

    /// Polls until the live nodes agree on a leader other than `not` (20 s
    /// at most), and returns it.
    pub fn wait_for_leader(&self, not: Option<usize>) -> usize {
        let started = Instant::now();
        loop {
            if let Some(leader) = self.leader().filter(|&l| Some(l) != not) {
                return leader;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no cluster leader (other than {not:?})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9 one node.
    pub fn kill(&mut self, slot: usize) {
        drop(self.nodes[slot].take());
    }

    /// SIGTERM every live node; each must exit cleanly.
    pub fn stop(mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            node.stop();
        }
    }
}
