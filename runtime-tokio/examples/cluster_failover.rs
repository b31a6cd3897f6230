//! Measures leader failover of a 3-node loopback cluster: starts three
//! `ticketing serve --cluster` processes, then N times kills the leader with
//! SIGKILL and times how long it takes until the next acquire is granted
//! (by our client in cluster mode), restarting the killed slot with empty
//! state (it rejoins under a new generation) before the next round.
//! Prints every sample (with when a survivor first reported itself leader
//! and in how many terms past the killed leader's: +1 is one election, +2
//! or more a split vote or a failed round) and p50/p99/max.
//!
//! Usage: cluster_failover BINARY PROFILE ROUNDS   (see
//! scripts/cluster-failover.sh)

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ticketing_tokio::TicketBroker;
use ticketing_tokio::client::BrokerMode;

const PEER_TOKEN: &str = "failover-peer-token-0123456789abcdef";
const CLIENT_TOKEN: &str = "failover-client-token-0123456789";

#[path = "../tests/common/ports.rs"]
mod ports;
use ports::free_port;

struct Node {
    client: SocketAddr,
    peer: SocketAddr,
    status: SocketAddr,
    child: Option<Child>,
}

struct Cluster {
    binary: String,
    profile: String,
    identity: String,
    nodes: Vec<Node>,
}

impl Cluster {
    fn spawn(&mut self, slot: usize, bootstrap: bool) {
        let mut cmd = Command::new(&self.binary);
        cmd.args(["serve", "--cluster-identity", &self.identity])
            .args(["--profile", &self.profile])
            .args(["--self-slot", &slot.to_string()])
            .args(["--peer-token", PEER_TOKEN, "--client-token", CLIENT_TOKEN])
            .args(["--status-listen", &self.nodes[slot].status.to_string()])
            .args(["--log-level", "warn"]);
        for node in &self.nodes {
            cmd.args(["--slot", &format!("{},{}", node.client, node.peer)]);
        }
        if bootstrap {
            cmd.arg("--bootstrap");
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        self.nodes[slot].child = Some(cmd.spawn().expect("spawn ticketing"));
    }

    fn kill(&mut self, slot: usize) {
        if let Some(mut child) = self.nodes[slot].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn status(&self, slot: usize) -> Option<String> {
        let mut tcp =
            TcpStream::connect_timeout(&self.nodes[slot].status, Duration::from_millis(500))
                .ok()?;
        tcp.set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut line = String::new();
        tcp.read_to_string(&mut line).ok()?;
        Some(line)
    }

    fn field(line: &str, name: &str) -> Option<String> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }

    /// The single live leader whose configuration has 3 voters, all live
    /// and voters themselves.
    fn settled_leader(&self) -> Option<usize> {
        let lines: Vec<Option<String>> = (0..self.nodes.len())
            .map(|s| self.nodes[s].child.as_ref().and_then(|_| self.status(s)))
            .collect();
        let leaders: Vec<usize> = (0..lines.len())
            .filter(|&s| {
                lines[s]
                    .as_deref()
                    .and_then(|l| Self::field(l, "role"))
                    .as_deref()
                    == Some("leader")
            })
            .collect();
        let [leader] = leaders[..] else { return None };
        let voters = Self::field(lines[leader].as_deref()?, "voters")?;
        let all_voters = lines.iter().all(|l| {
            l.as_deref()
                .and_then(|l| Self::field(l, "voter"))
                .as_deref()
                == Some("1")
        });
        (voters.split(',').count() == 3
            && all_voters
            && Self::field(lines[leader].as_deref()?, "learners")?.is_empty())
        .then_some(leader)
    }

    fn wait_settled(&self, deadline: Duration) -> usize {
        let until = Instant::now() + deadline;
        loop {
            if let Some(leader) = self.settled_leader() {
                return leader;
            }
            assert!(
                Instant::now() < until,
                "cluster did not settle within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for slot in 0..self.nodes.len() {
            self.kill(slot);
        }
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .expect("usage: cluster_failover BINARY PROFILE ROUNDS");
    let profile = args.next().unwrap_or_else(|| "default".to_owned());
    let rounds: usize = args.next().map_or(20, |r| r.parse().expect("ROUNDS"));
    let identity = String::from_utf8(
        Command::new(&binary)
            .arg("identity")
            .output()
            .expect("ticketing identity")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_owned();
    let mut fingerprint = [0u8; 32];
    for (i, b) in fingerprint.iter_mut().enumerate() {
        *b = u8::from_str_radix(&identity[i * 2..i * 2 + 2], 16).expect("hex");
    }
    let nodes = (0..3)
        .map(|_| Node {
            client: free_port(),
            peer: free_port(),
            status: free_port(),
            child: None,
        })
        .collect();
    let mut cluster = Cluster {
        binary,
        profile: profile.clone(),
        identity,
        nodes,
    };
    for slot in 0..3 {
        cluster.spawn(slot, true);
    }
    cluster.wait_settled(Duration::from_secs(30));
    let addrs: Vec<String> = cluster.nodes.iter().map(|n| n.client.to_string()).collect();
    let connect = || {
        TicketBroker::builder()
            .addrs(addrs.clone())
            .token(CLIENT_TOKEN)
            .mode(BrokerMode::Cluster {
                identity_fingerprint: fingerprint,
            })
            .connect()
            .expect("client")
    };
    let lease = Duration::from_secs(5);
    let budget = Duration::from_millis(100);
    let mut samples = Vec::with_capacity(rounds);
    let mut elections = Vec::with_capacity(rounds);
    let mut last_token = 0;
    for round in 0..rounds {
        let leader = cluster.wait_settled(Duration::from_secs(60));
        // A fresh client per round: connected to every node, no reconnect
        // backoff left over from the previous round's restart, so the
        // figure is the cluster's failover, not the client's backoff.
        let broker = connect();
        assert!(broker.wait_ready(Duration::from_secs(10)).await);
        let warm_until = Instant::now() + Duration::from_secs(10);
        loop {
            match broker
                .acquire("failover", Duration::from_secs(1), lease, budget)
                .await
            {
                Ok(ticket) => {
                    last_token = last_token.max(ticket.token());
                    let _ = ticket.release().await;
                    break;
                }
                Err(e) => assert!(Instant::now() < warm_until, "no warm-up grant: {e}"),
            }
        }
        // The leader's term before the kill: a new leader one term later
        // was elected in one round, two or more terms later after a split
        // vote (or a pre-vote round that failed).
        let term_before = cluster
            .status(leader)
            .and_then(|line| Cluster::field(&line, "term"))
            .and_then(|term| term.parse::<u64>().ok());
        let killed_at = Instant::now();
        cluster.kill(leader);
        // In parallel: when does a surviving node report itself leader?
        let statuses: Vec<SocketAddr> = (0..3)
            .filter(|&s| s != leader)
            .map(|s| cluster.nodes[s].status)
            .collect();
        let elected = std::thread::spawn(move || {
            loop {
                for addr in &statuses {
                    let line = TcpStream::connect_timeout(addr, Duration::from_millis(200))
                        .ok()
                        .and_then(|mut tcp| {
                            let mut line = String::new();
                            tcp.read_to_string(&mut line).ok().map(|_| line)
                        });
                    if let Some(line) = line.filter(|l| l.contains("role=leader")) {
                        let term =
                            Cluster::field(&line, "term").and_then(|t| t.parse::<u64>().ok());
                        return (killed_at.elapsed(), term);
                    }
                }
                if killed_at.elapsed() > Duration::from_secs(60) {
                    return (killed_at.elapsed(), None);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let ticket = loop {
            match broker
                .acquire("failover", Duration::from_secs(1), lease, budget)
                .await
            {
                Ok(ticket) => break ticket,
                Err(_) => assert!(
                    killed_at.elapsed() < Duration::from_secs(60),
                    "no grant after 60 s"
                ),
            }
        };
        let took = killed_at.elapsed();
        let (elected, term_after) = elected.join().expect("status poller");
        elections.push(elected);
        let rounds_taken = match (term_before, term_after) {
            (Some(before), Some(after)) => format!("term +{}", after.saturating_sub(before)),
            _ => "term ?".to_owned(),
        };
        assert!(ticket.token() > last_token, "token went back");
        last_token = ticket.token();
        let _ = ticket.release().await;
        broker.close().await;
        println!(
            "round {round:>2}: killed slot {leader}, a survivor leader after {:>7.1} ms ({rounds_taken}), next grant after {:>7.1} ms",
            elected.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
        samples.push(took);
        cluster.spawn(leader, false);
    }
    samples.sort();
    elections.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "profile {profile}: {} kills of the leader; failover (kill -9 → next grant) p50 {:.0} ms, p99 {:.0} ms, min {:.0} ms, max {:.0} ms",
        samples.len(),
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
    println!(
        "profile {profile}: kill -9 → a survivor reports itself leader: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(percentile(&elections, 0.5)),
        ms(percentile(&elections, 0.99)),
        ms(elections[elections.len() - 1]),
    );
}
