//! Recovery after losing a majority, with real `ticketing serve` processes
//! (fast profile) sharing one state directory (files named by slot): two
//! of three nodes killed (their lock state is in memory, so it is gone;
//! their state files stay), then `serve --recover` under the same
//! identity. The published 0.4.0 client keeps its configuration
//! throughout. What is refused: a recovery while the old cluster still
//! runs (a quorum of it, or a minority), and one from a slot whose state
//! file is lost. See docs/cluster.md, "Losing the majority".

mod common;

use std::time::Duration;

use common::cluster::{
    Cluster, acquire_published, assert_no_grant_without_majority, poll, published,
};
use ticketing_core::cluster::recovery::RECOVERY_GENERATION;

/// Grants and releases five keys, then holds `held`; the largest token.
async fn tokens_before_the_loss(broker: &ticketing::TicketBroker) -> (u64, ticketing::Ticket) {
    let mut largest = 0;
    for i in 0..5 {
        let ticket = acquire_published(broker, &format!("k{i}")).await;
        largest = largest.max(ticket.token());
        ticket.release().await.unwrap();
    }
    let held = acquire_published(broker, "held").await;
    (largest.max(held.token()), held)
}

/// Polls until every slot in `slots` runs in the recovery generation as a
/// voter (its genesis check done); then the leader among them.
async fn recovered(cluster: &Cluster, slots: &[usize]) -> usize {
    poll("every recovering node a voter", || {
        slots
            .iter()
            .all(|&slot| {
                cluster
                    .status(slot)
                    .is_some_and(|s| s.generation == RECOVERY_GENERATION && s.voter && !s.checking)
            })
            .then_some(())
    })
    .await;
    cluster.leader_among(slots).await
}

/// Kill the leader and one follower; the survivor refuses to be overwritten
/// (a recovery next to it is refused and names it); stopped, it recovers
/// with the others from the three state files, and the published client,
/// configured as before, gets tokens above every earlier one.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_under_the_same_identity_issues_tokens_above_every_earlier_one() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let (before, held) = tokens_before_the_loss(&broker).await;

    let (survivor, other) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.kill(leader);
    cluster.kill(other);
    // The survivor still runs the old cluster: refused, nothing written.
    let file_before = std::fs::read(cluster.floor_file(leader)).unwrap();
    let (code, stderr) = cluster.run_to_exit(leader, &["--recover"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("the old cluster still runs on slot {survivor}")),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(cluster.floor_file(leader)).unwrap(),
        file_before,
        "a refused recovery writes no state file"
    );

    // Stopped, the survivor's state file is its evidence too.
    cluster.kill(survivor);
    let logs: Vec<_> = (0..3)
        .map(|slot| cluster.spawn_logged(slot, &["--recover"]))
        .collect();
    recovered(&cluster, &[0, 1, 2]).await;
    for log in &logs {
        let log = log.lock().unwrap();
        assert!(
            log.iter()
                .any(|l| l.contains("recovering the fencing domain under the same identity")),
            "{log:?}"
        );
    }
    // The lock held at the loss is gone; every grant now is above every
    // token issued before.
    let after = acquire_published(&broker, "held").await;
    assert!(
        after.token() > before,
        "token {} not above {before}",
        after.token()
    );
    let next = acquire_published(&broker, "k0").await;
    assert!(next.token() > after.token());
    drop(held);
}

/// The old leader's state file is lost too, and every recovered clock is
/// an hour behind (libfaketime): that slot's recovery is refused (it
/// cannot vouch for the tokens issued before); the two others recover from
/// their files, which dominate the clock; the lost slot then joins without
/// flags and replaces its recovery generation.
#[tokio::test(flavor = "multi_thread")]
async fn with_one_state_file_lost_and_the_clock_an_hour_behind_the_others_recover_above() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let (before, held) = tokens_before_the_loss(&broker).await;

    for slot in 0..3 {
        cluster.kill(slot);
    }
    std::fs::remove_file(cluster.floor_file(leader)).unwrap();
    cluster.faketime = Some("-1h");

    // Not enough evidence on that slot: refused, naming it and the ways out.
    let (code, stderr) = cluster.run_to_exit(leader, &["--recover"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("slot {leader} has no token floor file")),
        "{stderr}"
    );
    assert!(stderr.contains("--token-floor"), "{stderr}");
    assert!(
        !cluster.floor_file(leader).exists(),
        "a refused recovery creates no state file"
    );

    let others = [(leader + 1) % 3, (leader + 2) % 3];
    let logs: Vec<_> = others
        .iter()
        .map(|&slot| cluster.spawn_logged(slot, &["--recover"]))
        .collect();
    let new_leader = recovered(&cluster, &others).await;
    // With the clock an hour behind, the state files set the floor.
    for log in &logs {
        let log = log.lock().unwrap();
        assert!(
            log.iter().any(
                |l| l.contains("recovering the fencing domain") && l.contains("from=StateFile")
            ),
            "{log:?}"
        );
    }
    let after = acquire_published(&broker, "held").await;
    assert!(
        after.token() > before,
        "token {} not above {before} under a clock an hour behind",
        after.token()
    );
    drop(after);

    // The lost slot joins by itself and replaces its recovery generation.
    cluster.spawn(leader, false);
    let generation = cluster.await_replaced(leader, new_leader).await;
    assert!(generation > RECOVERY_GENERATION);
    let last = acquire_published(&broker, "k1").await;
    assert!(last.token() > before);
    drop(held);
}

/// With one node down the cluster still has its quorum: a recovery is
/// refused, touches nothing, and the cluster goes on granting.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_while_a_quorum_is_alive_is_refused() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let first = acquire_published(&broker, "k").await;
    let token = first.token();
    first.release().await.unwrap();

    let slot = (leader + 1) % 3;
    cluster.kill(slot);
    let file_before = std::fs::read(cluster.floor_file(slot)).unwrap();
    let (code, stderr) = cluster.run_to_exit(slot, &["--recover"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("a quorum of the cluster is still running"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(cluster.floor_file(slot)).unwrap(),
        file_before
    );
    assert!(!cluster.running(slot));
    let second = acquire_published(&broker, "k").await;
    assert!(second.token() > token);
}

/// Five slots need the floors of four: three recovering nodes elect a
/// leader, but it starts no counter and grants nothing until a fourth
/// recovering slot is heard; then its tokens are above every earlier one.
#[tokio::test(flavor = "multi_thread")]
async fn five_slots_recover_only_with_the_floors_of_four() {
    let mut cluster = Cluster::start(5);
    cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let (before, held) = tokens_before_the_loss(&broker).await;
    for slot in 0..5 {
        cluster.kill(slot);
    }
    let logs: Vec<_> = (0..3)
        .map(|slot| cluster.spawn_logged(slot, &["--recover"]))
        .collect();
    let leader = recovered(&cluster, &[0, 1, 2]).await;
    // A leader, but only three floors: nothing is granted, and it says
    // what it waits for.
    assert_no_grant_without_majority(&broker, "waiting").await;
    let log = logs[leader].lock().unwrap().clone();
    assert!(
        log.iter().any(|l| l.contains("recovering leader waits")
            && l.contains("heard=3")
            && l.contains("needed=4")),
        "{log:?}"
    );

    cluster.spawn_logged(3, &["--recover"]);
    let after = acquire_published(&broker, "held").await;
    assert!(
        after.token() > before,
        "token {} not above {before}",
        after.token()
    );
    drop(held);
}
