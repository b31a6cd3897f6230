//! Three `ticketing serve` cluster processes on loopback (fast Raft
//! profile), driven by the published client and by ours: grants, mutual
//! exclusion and FIFO under contention, failover after `kill -9` of the
//! leader, a killed slot rejoining by itself under a new generation, and no
//! grant without a majority.
//!
//! Leadership and membership are read from each node's status address (one
//! line per connection). Where no event exists (an election, a membership
//! change) the tests poll it with a deadline.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{
    BUDGET, CHANGE_DEADLINE, CLIENT_TOKEN, Cluster, IDENTITY, LEASE, acquire_published,
    assert_no_grant_without_majority, ours, poll, published,
};

#[tokio::test(flavor = "multi_thread")]
async fn published_client_grants_with_mutual_exclusion_and_fifo() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);

    let first = acquire_published(&broker, "k").await;
    let t1 = first.token();
    assert_eq!(
        first.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    let second = acquire_published(&broker, "k").await;
    assert!(second.token() > t1, "tokens strictly increase");
    second.release().await.unwrap();

    // Contention: 8 tasks × 15 rounds on one key; never two holders, and
    // tokens in grant order strictly increase.
    let held = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (broker, held, last) = (broker.clone(), held.clone(), last.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let ticket = acquire_published(&broker, "hot").await;
                assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                let prev = last.swap(ticket.token(), Ordering::SeqCst);
                assert!(ticket.token() > prev, "token went back");
                tokio::task::yield_now().await;
                held.store(false, Ordering::SeqCst);
                assert_eq!(
                    ticket.release().await.unwrap(),
                    ticketing::ReleaseOutcome::Released
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // FIFO: A holds; B queues, then C; releasing A grants B, and C only
    // after B's release.
    let a = acquire_published(&broker, "fifo").await;
    let a_token = a.token();
    let queued = |n: usize| {
        let cluster = &cluster;
        move || {
            cluster
                .status(leader)
                .is_some_and(|s| s.waiters == n)
                .then_some(())
        }
    };
    let spawn_acquire = || {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .acquire("fifo", Duration::from_secs(10), LEASE, BUDGET)
                .await
        })
    };
    let b = spawn_acquire();
    poll("B queued", queued(1)).await;
    let c = spawn_acquire();
    poll("C queued", queued(2)).await;
    assert_eq!(
        a.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    let b = b.await.unwrap().expect("B granted first");
    assert!(b.token() > a_token);
    assert!(!c.is_finished(), "C is granted only after B releases");
    assert_eq!(cluster.status(leader).unwrap().waiters, 1, "C still queued");
    let b_token = b.token();
    assert_eq!(
        b.release().await.unwrap(),
        ticketing::ReleaseOutcome::Released
    );
    let c = c.await.unwrap().expect("C granted after B");
    assert!(c.token() > b_token);
    c.release().await.unwrap();
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_rejoin_and_majority_loss() {
    let mut cluster = Cluster::start(3);
    let first_leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let before = acquire_published(&broker, "f").await;
    let t0 = before.token();
    before.release().await.unwrap();

    // kill -9 the leader: another node leads and grants a larger token.
    cluster.kill(first_leader);
    let second_leader = cluster.leader().await;
    assert_ne!(second_leader, first_leader);
    let after = acquire_published(&broker, "f").await;
    assert!(
        after.token() > t0,
        "a new leader continues the token counter"
    );
    let t1 = after.token();
    after.release().await.unwrap();

    // Restart the killed slot with empty state (no --bootstrap): it joins
    // under a new generation and replaces its old self as a voter.
    cluster.spawn(first_leader, false);
    let generation = cluster.await_replaced(first_leader, second_leader).await;
    assert!(generation > 1);

    // The cluster survives losing another node (the current leader).
    cluster.kill(second_leader);
    let third_leader = cluster.leader().await;
    let survived = acquire_published(&broker, "f").await;
    assert!(survived.token() > t1);
    survived.release().await.unwrap();

    // Kill one more: no majority, no grant.
    cluster.kill(third_leader);
    assert_no_grant_without_majority(&broker, "f").await;
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn our_client_in_cluster_mode_survives_failover() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = ours(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let acquire = |broker: ticketing_tokio::TicketBroker| async move {
        let deadline = Instant::now() + CHANGE_DEADLINE;
        loop {
            match broker
                .acquire("ours", Duration::from_secs(5), LEASE, BUDGET)
                .await
            {
                Ok(ticket) => return ticket,
                Err(e) => assert!(Instant::now() < deadline, "no grant: {e:?}"),
            }
        }
    };
    let ticket = acquire(broker.clone()).await;
    let t0 = ticket.token();
    assert_eq!(
        ticket.release().await.unwrap(),
        ticketing_tokio::ReleaseOutcome::Released
    );
    cluster.kill(leader);
    let ticket = acquire(broker.clone()).await;
    assert!(ticket.token() > t0);
    ticket.release().await.unwrap();
    broker.close().await;
}

/// `ticketing lock` in cluster mode: the node addresses in slot order and the
/// identity; the command runs under the lock with its fencing token, and the
/// key is free again afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn ticketing_lock_runs_a_command_under_a_cluster_lock() {
    let cluster = Cluster::start(3);
    cluster.leader().await;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ticketing"));
    command.args([
        "lock",
        "cli-key",
        "--token",
        CLIENT_TOKEN,
        "--cluster-identity",
        IDENTITY,
    ]);
    for addr in cluster.addrs() {
        command.args(["--addr", &addr]);
    }
    command.args(["--", "sh", "-c", "echo \"$TICKETING_KEY $TICKETING_TOKEN\""]);
    let output = command.output().await.expect("run ticketing lock");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (key, token) = stdout.trim().split_once(' ').expect("key and token");
    assert_eq!(key, "cli-key");
    let token: u64 = token.parse().expect("a fencing token");
    // Released on exit: the key is granted again, with a larger token.
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let ticket = acquire_published(&broker, "cli-key").await;
    assert!(ticket.token() > token);
    ticket.release().await.unwrap();
}

/// `--bootstrap` passed to a restart by mistake: the node must not act as
/// generation 1 again (it forgot what that identity voted and acknowledged);
/// it finds the cluster running, joins as a new generation and replaces
/// its old self, and nothing granted is lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_with_bootstrap_by_mistake_joins_as_a_new_generation() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let broker = published(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let held = acquire_published(&broker, "b").await;

    let victim = (leader + 1) % 3;
    cluster.kill(victim);
    cluster.spawn(victim, true);
    let generation = cluster.await_replaced(victim, leader).await;
    assert!(generation > 1);
    assert!(!cluster.status(victim).unwrap().checking);

    // The grant from before is still held, and its release still works.
    match broker
        .acquire(
            "b",
            Duration::from_secs(1),
            Duration::from_secs(10),
            Duration::ZERO,
        )
        .await
    {
        Err(ticketing::TicketError::Timeout) => {}
        other => panic!("the held key was granted again or failed: {other:?}"),
    }
    held.release().await.unwrap();
    broker.close().await;
}

/// Renewal through the leader: the `W` is a committed command, and the
/// renewed lease outlives the first one on the nodes.
#[tokio::test(flavor = "multi_thread")]
async fn our_client_renews_a_cluster_lock_through_the_leader() {
    let cluster = Cluster::start(3);
    cluster.leader().await;
    let broker = ours(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);
    let deadline = Instant::now() + CHANGE_DEADLINE;
    let ticket = loop {
        match broker
            .acquire(
                "renewed",
                Duration::from_secs(5),
                Duration::from_secs(2),
                Duration::ZERO,
            )
            .await
        {
            Ok(ticket) => break ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant: {e:?}"),
        }
    };
    let extended = ticket.extend(Duration::from_secs(10)).await.unwrap();
    assert!(extended.deadline() <= Instant::now() + Duration::from_secs(10));
    assert!(ticket.remaining() > Duration::from_secs(8));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rival = published(&cluster);
    assert!(rival.wait_ready(Duration::from_secs(10)).await);
    let refused = rival
        .acquire("renewed", Duration::ZERO, LEASE, BUDGET)
        .await;
    assert!(
        matches!(refused, Err(ticketing::TicketError::Timeout)),
        "{refused:?}"
    );
    assert_eq!(
        ticket.release().await.unwrap(),
        ticketing_tokio::ReleaseOutcome::Released
    );
    rival.close().await;
    broker.close().await;
}

/// `ticketing lock --renew` against the cluster while its leader is
/// killed: every holder writes when it starts and stops to one log, and no
/// two holders' spans overlap, whether the first holder's renewal rides
/// through the election or it is stopped before its lease could lapse.
#[tokio::test(flavor = "multi_thread")]
async fn renewing_holders_never_overlap_across_a_leader_kill() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let scratch = common::scratch::scratch_dir("renew-failover");
    std::fs::create_dir_all(&scratch.0).unwrap();
    let log = scratch.0.join("spans");
    let addrs = cluster.addrs();
    let spawn = |work_s: u32, wait: &str, lease: &str| {
        // A span starts and ends in the log; a stop ends it through the
        // trap (SIGKILL leaves it open, and the CLI's exit bounds it).
        let script = format!(
            r#"trap 'echo "end $(date +%s%N) $TICKETING_TOKEN" >> {log}; exit 143' TERM
echo "start $(date +%s%N) $TICKETING_TOKEN" >> {log}
sleep {work_s} & wait
echo "end $(date +%s%N) $TICKETING_TOKEN" >> {log}"#,
            log = log.display()
        );
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ticketing"));
        command.args(["lock", "door"]);
        for addr in &addrs {
            command.args(["--addr", addr]);
        }
        command
            .args(["--cluster-identity", IDENTITY, "--token", CLIENT_TOKEN])
            .args(["--lease", lease, "--renew", "--kill-after", "1s"])
            .args(["--wait", wait])
            .args(["--", "sh", "-c", &script])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn(8, "10s", "3s");
    poll("the first holder to start", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|spans| spans.contains("start"))
    })
    .await;
    // Its lease counts from its request, so it must outlast the wait.
    let rival = spawn(1, "30s", "60s");
    cluster.kill(leader);
    let first = first.wait_with_output().await.unwrap();
    let rival = rival.wait_with_output().await.unwrap();
    let ended = wall_ns();
    eprintln!(
        "first holder: {:?}, {}",
        first.status.code(),
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        matches!(first.status.code(), Some(0 | 76)),
        "the first holder ran to its end or was stopped: {first:?}"
    );
    assert_eq!(rival.status.code(), Some(0), "{rival:?}");

    let spans = std::fs::read_to_string(&log).unwrap();
    let mut open: std::collections::HashMap<u64, u128> = std::collections::HashMap::new();
    let mut closed: Vec<(u128, u128, u64)> = Vec::new();
    for line in spans.lines() {
        let mut words = line.split(' ');
        let (what, at, token) = (words.next(), words.next(), words.next());
        let at: u128 = at.unwrap().parse().unwrap();
        let token: u64 = token.unwrap().parse().unwrap();
        match what {
            Some("start") => assert!(open.insert(token, at).is_none(), "{spans}"),
            _ => closed.push((open.remove(&token).expect("end after start"), at, token)),
        }
    }
    closed.extend(open.into_iter().map(|(token, start)| (start, ended, token)));
    closed.sort();
    assert_eq!(closed.len(), 2, "{spans}");
    let (a, b) = (closed[0], closed[1]);
    assert!(a.1 <= b.0, "two holders overlapped: {spans}");
    assert!(b.2 > a.2, "the later holder has the larger token: {spans}");
}

fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
