//! A whole 3-node cluster killed with SIGKILL and bootstrapped again with
//! the same identity and state directories, every clock an hour behind
//! (libfaketime): the new counter starts above the stored token floor, so
//! its tokens are above those issued before.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, acquire_published, published};

/// One hour in microseconds.
const HOUR_US: u64 = 3_600_000_000;

/// One grant from `cluster` (waiting for a leader first); its token.
async fn one_token(cluster: &Cluster, key: &str) -> u64 {
    cluster.leader().await;
    let broker = published(cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let ticket = acquire_published(&broker, key).await;
    let token = ticket.token();
    ticket.release().await.unwrap();
    token
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_bootstrapped_again_an_hour_behind_issues_higher_tokens() {
    let mut cluster = Cluster::start(3);
    let before = one_token(&cluster, "k").await;
    for slot in 0..3 {
        cluster.kill(slot);
    }
    cluster.faketime = Some("-1h");
    cluster.start_all();
    let after = one_token(&cluster, "k").await;
    assert!(after > before, "tokens went down: {before} then {after}");

    // The control: a cluster with fresh state directories under the same
    // faked clock starts about an hour lower, so the clock was faked and
    // the state files are what kept the tokens above.
    let mut control = Cluster::new(3);
    control.faketime = Some("-1h");
    control.start_all();
    let fresh = one_token(&control, "k").await;
    assert!(
        fresh < before - HOUR_US / 2,
        "faketime had no effect: {fresh} vs {before}"
    );
}

/// A node restarted with its clock an hour behind still joins under a
/// generation newer than its last one (the leader only adds a newer
/// generation of a slot): its generation is its token floor, not the bare
/// clock.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_restarted_an_hour_behind_rejoins_under_a_newer_generation() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let slot = (leader + 1) % 3;
    cluster.kill(slot);
    cluster.spawn(slot, false);
    let first = cluster.await_replaced(slot, leader).await;
    cluster.kill(slot);
    cluster.faketime = Some("-1h");
    cluster.spawn(slot, false);
    let second = cluster.await_replaced(slot, leader).await;
    assert!(second > first, "generation {second} not above {first}");
}
