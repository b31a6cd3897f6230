//! The smol client against a three-node cluster (tokio nodes in this
//! process, on loopback): shared holds, a downgrade, permits and an
//! election behave on a cluster as on a single server, through the same
//! client API the tokio client has.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ticketing_core::auth::ClientTokens;
use ticketing_core::cluster::ClusterConfig;
use ticketing_core::cluster::peer::PeerTokens;
use ticketing_core::raft::{NodeId, RaftConfig};
use ticketing_smol::client::{BrokerMode, TicketError};
use ticketing_smol::{Ticket, TicketBroker};
use ticketing_tokio::{ClusterSettings, RunningCluster, spawn_cluster};

#[path = "../../runtime-tokio/tests/common/ports.rs"]
mod ports;

const FINGERPRINT: [u8; 32] = [0x5a; 32];
const PEER_TOKEN: &str = "peer-token-for-smol-cluster-tests-0123";
const CLIENT_TOKEN: &str = "client-token-for-smol-cluster-tests";
const READY: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(10);
const BUDGET: Duration = Duration::from_millis(500);
/// Longest an election may take (the fast profile elects in well under a
/// second).
const ELECTION_DEADLINE: Duration = Duration::from_secs(15);

/// Three bootstrap nodes on `runtime`, with the fast election profile.
fn start_cluster(runtime: &tokio::runtime::Runtime) -> (Vec<RunningCluster>, Vec<SocketAddr>) {
    let slots: Vec<(SocketAddr, SocketAddr)> = (0..3)
        .map(|_| (ports::free_port(), ports::free_port()))
        .collect();
    let peers: Vec<SocketAddr> = slots.iter().map(|&(_, peer)| peer).collect();
    let nodes = slots
        .iter()
        .enumerate()
        .map(|(slot, &(client, peer))| {
            let mut node = ClusterConfig::new(
                FINGERPRINT,
                NodeId::new(slot as u8, 0),
                3,
                PeerTokens::new([PEER_TOKEN.as_bytes()]).unwrap(),
                0,
            );
            node.raft = RaftConfig::fast();
            node.peer_silence_timeout =
                ticketing_core::cluster::default_peer_silence_timeout(&node.raft);
            node.client_tokens = ClientTokens::new([CLIENT_TOKEN.as_bytes()]).unwrap();
            let mut settings = ClusterSettings::new(client, peer, peers.clone(), node);
            settings.bootstrap = true;
            runtime
                .block_on(spawn_cluster(settings))
                .expect("a cluster node starts")
        })
        .collect();
    let clients = slots.iter().map(|&(client, _)| client).collect();
    (nodes, clients)
}

/// Waits (polling the nodes' status) until one of them leads.
fn await_leader(runtime: &tokio::runtime::Runtime, nodes: &[RunningCluster]) {
    let deadline = Instant::now() + ELECTION_DEADLINE;
    while !nodes.iter().any(|node| node.status().is_leader) {
        assert!(Instant::now() < deadline, "no leader elected");
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(10)).await });
    }
}

/// A smol broker to the cluster, labelled `label` (observers see it).
fn broker(clients: &[SocketAddr], label: &str) -> TicketBroker {
    TicketBroker::builder()
        .addrs(clients.iter().map(ToString::to_string))
        .token(CLIENT_TOKEN)
        .mode(BrokerMode::Cluster {
            identity_fingerprint: FINGERPRINT,
        })
        .label(label)
        .connect()
        .expect("a valid broker configuration")
}

/// The first shared grant, retrying the "no effect, try again" answers a
/// client may get while the new leader catches up.
async fn first_shared(broker: &TicketBroker, key: &str) -> Ticket {
    let deadline = Instant::now() + ELECTION_DEADLINE;
    loop {
        match broker.acquire_shared(key, WAIT, LEASE, BUDGET).await {
            Ok(ticket) => return ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant: {e:?}"),
        }
    }
}

#[test]
fn smol_client_shares_downgrades_takes_permits_and_elects_on_a_cluster() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (nodes, clients) = start_cluster(&runtime);
    await_leader(&runtime, &nodes);
    let a = broker(&clients, "smol-a");
    let b = broker(&clients, "smol-b");
    smol::block_on(async {
        assert!(a.wait_ready(READY).await && b.wait_ready(READY).await);

        // Two readers share; a writer asking without waiting is refused.
        let first = first_shared(&a, "catalog").await;
        let second = b
            .acquire_shared("catalog", Duration::ZERO, LEASE, BUDGET)
            .await
            .expect("a second reader joins at once");
        assert!(second.token() > first.token());
        let refused = a.acquire("catalog", Duration::ZERO, LEASE, BUDGET).await;
        assert!(matches!(refused, Err(TicketError::Timeout)), "{refused:?}");
        let last_reader = second.token();
        first.release().await.unwrap();
        second.release().await.unwrap();

        // A writer downgrades in place: same token, and a reader joins it
        // at once, where before the downgrade it was refused.
        let writer = a
            .acquire("catalog", WAIT, LEASE, BUDGET)
            .await
            .expect("the writer, once both readers left");
        let term = writer.token();
        assert!(term > last_reader);
        let refused = b
            .acquire_shared("catalog", Duration::ZERO, LEASE, BUDGET)
            .await;
        assert!(matches!(refused, Err(TicketError::Timeout)), "{refused:?}");
        writer.downgrade().await.expect("a committed downgrade");
        assert_eq!(writer.token(), term);
        let reader = b
            .acquire_shared("catalog", Duration::ZERO, LEASE, BUDGET)
            .await
            .expect("a reader joins the downgraded holder");
        assert!(reader.token() > term);
        writer.release().await.unwrap();
        reader.release().await.unwrap();

        // Permits: the lowest free slots under one token; a full semaphore
        // refuses, another capacity is named, a freed slot is reused.
        let both = a
            .acquire_permits("jobs", 2, 2, WAIT, LEASE, BUDGET)
            .await
            .expect("two permits of two");
        assert_eq!(both.slots(), &[0, 1]);
        let full = b
            .acquire_permits("jobs", 1, 2, Duration::ZERO, LEASE, BUDGET)
            .await;
        assert!(matches!(full, Err(TicketError::Timeout)), "{full:?}");
        let mismatch = b
            .acquire_permits("jobs", 1, 3, Duration::ZERO, LEASE, BUDGET)
            .await;
        assert!(
            matches!(
                mismatch,
                Err(TicketError::CapacityMismatch {
                    asked: 3,
                    capacity: 2
                })
            ),
            "{mismatch:?}"
        );
        let both_token = both.token();
        both.release().await.unwrap();
        let one = b
            .acquire_permits("jobs", 1, 2, Duration::ZERO, LEASE, BUDGET)
            .await
            .expect("a freed slot");
        assert_eq!(one.slots(), &[0]);
        assert!(one.token() > both_token);
        one.release().await.unwrap();

        // Election: the observer names the leader's label and term (its
        // token); after a resign, nobody leads.
        let leader = a.campaign("scheduler", LEASE).await.expect("leadership");
        let seen = b
            .observe("scheduler")
            .await
            .unwrap()
            .expect("a leader to observe");
        assert_eq!(seen.label, "smol-a");
        assert_eq!(seen.term, leader.token());
        leader.release().await.unwrap();
        assert_eq!(b.observe("scheduler").await.unwrap(), None);

        a.close().await;
        b.close().await;
    });
    for node in nodes {
        runtime.block_on(node.shutdown());
    }
}
