//! More `ticketing serve` cluster processes on loopback (fast Raft
//! profile), driven by the published client: peer links over TLS (and a
//! node with a foreign CA kept out), and a five-node cluster that survives
//! two `kill -9`s but not a third.
//!
//! Leadership and links are read from each node's status address (one line
//! per connection). Our client takes shared locks from a cluster.
//! Where no event exists (an election) the tests poll it
//! with a deadline; the one negative check (a foreign node never links) is
//! an observation over a bounded window.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::certs::{Pki, make_pki};
use common::cluster::{
    BUDGET, CHANGE_DEADLINE, CLIENT_TOKEN, Cluster, IDENTITY, LEASE, PEER_TOKEN, Setup,
    acquire_published, assert_no_grant_without_majority, ours, poll, published,
};

/// The DNS name on every peer certificate.
const PEER_NAME: &str = "ticketing-peer";

/// Writes one config file per slot of `cluster` (client side plain TCP,
/// peers over TLS with `pki[slot]`) and switches the cluster to them.
fn write_tls_configs(cluster: &mut Cluster, dir: &Path, name: &str, pki: &[&Pki]) {
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
    let good = make_pki(&dir.0, "good", &[PEER_NAME]);
    let foreign = make_pki(&dir.0, "foreign", &[PEER_NAME]);

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
    let mut cluster = Cluster::start(5);
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
    assert_no_grant_without_majority(&broker, "five").await;
    broker.close().await;
}

/// Our client's `acquire_shared` against a cluster (which grants SHARED):
/// two readers hold one key at once, a writer that may not wait is
/// refused meanwhile, and once both released it is granted with a token
/// above both.
#[tokio::test(flavor = "multi_thread")]
async fn our_client_holds_a_cluster_key_shared_with_another_reader() {
    let cluster = Cluster::start(3);
    cluster.leader().await;
    let broker = ours(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let wait = Duration::from_secs(5);
    let deadline = Instant::now() + CHANGE_DEADLINE;
    let first = loop {
        match broker.acquire_shared("doc", wait, LEASE, BUDGET).await {
            Ok(ticket) => break ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant: {e:?}"),
        }
    };
    let second = broker
        .acquire_shared("doc", Duration::ZERO, LEASE, BUDGET)
        .await
        .expect("a second reader joins at once");
    assert!(second.token() > first.token());
    let refused = broker.acquire("doc", Duration::ZERO, LEASE, BUDGET).await;
    assert!(
        matches!(refused, Err(ticketing_tokio::TicketError::Timeout)),
        "{refused:?}"
    );
    let last = second.token();
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = broker
        .acquire("doc", wait, LEASE, BUDGET)
        .await
        .expect("the writer, once both readers left");
    assert!(writer.token() > last);
    writer.release().await.unwrap();
    broker.close().await;
}
