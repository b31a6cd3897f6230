//! An election on a three-node `ticketing serve` cluster (loopback, fast
//! Raft profile), driven by our client: a campaign's Grant carries the
//! candidate's label, so an observer names the leader by it, and after
//! the node that granted it is killed the new leader names the same
//! leader and term; the next leader's term is larger.
//!
//! Where no event exists (a new Raft leader, an observer reconnecting) the
//! test polls with a deadline.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{CHANGE_DEADLINE, CLIENT_TOKEN, Cluster, fingerprint, ours};
use ticketing_tokio::client::{BrokerMode, Leader};

/// Our client in cluster mode under `label`.
fn candidate(cluster: &Cluster, label: &str) -> ticketing_tokio::TicketBroker {
    ticketing_tokio::TicketBroker::builder()
        .addrs(cluster.addrs())
        .token(CLIENT_TOKEN)
        .label(label)
        .mode(BrokerMode::Cluster {
            identity_fingerprint: fingerprint(),
        })
        .connect()
        .unwrap()
}

/// Observes `name` until `wanted` holds of the answer (errors while a
/// leader is elected are retried); panics after [`CHANGE_DEADLINE`].
async fn observe_until(
    broker: &ticketing_tokio::TicketBroker,
    name: &str,
    wanted: impl Fn(&Option<Leader>) -> bool,
) -> Option<Leader> {
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        let seen = broker.observe(name).await;
        if let Ok(seen) = &seen
            && wanted(seen)
        {
            return seen.clone();
        }
        assert!(Instant::now() < deadline, "last observation: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn observers_name_the_cluster_leader_by_label_across_a_node_kill() {
    let mut cluster = Cluster::start(3);
    let first_node = cluster.leader().await;
    let alpha = candidate(&cluster, "alpha");
    let watcher = ours(&cluster);
    assert!(alpha.wait_ready(Duration::from_secs(10)).await);
    let lease = Duration::from_secs(5);
    let term = alpha.campaign("election", lease).await.unwrap();
    let seen = observe_until(&watcher, "election", |seen| seen.is_some())
        .await
        .unwrap();
    assert_eq!((seen.label.as_str(), seen.term), ("alpha", term.token()));

    // The node that granted it dies; the new leader names the same leader
    // and term, from the replicated Grant.
    cluster.kill(first_node);
    let alive: Vec<usize> = (0..3).filter(|&s| s != first_node).collect();
    cluster.leader_among(&alive).await;
    let seen = observe_until(&watcher, "election", |seen| seen.is_some())
        .await
        .unwrap();
    assert_eq!((seen.label.as_str(), seen.term), ("alpha", term.token()));

    // Alpha resigns: the next candidate leads under a larger term.
    let beta = candidate(&cluster, "beta");
    term.release().await.unwrap();
    let next = beta.campaign("election", lease).await.unwrap();
    assert!(next.token() > seen.term);
    let seen = observe_until(&watcher, "election", |seen| {
        seen.as_ref().is_some_and(|l| l.label == "beta")
    })
    .await
    .unwrap();
    assert_eq!(seen.term, next.token());
    assert!(seen.connected, "beta's grant came from this leader");
    next.release().await.unwrap();
    for broker in [alpha, beta, watcher] {
        broker.close().await;
    }
}
