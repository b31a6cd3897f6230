//! An outsider without the peer token against a three-node `ticketing
//! serve` cluster on loopback, over real sockets, while our client keeps
//! acquiring: the relay attack on the peer handshake (dial the leader's peer port claiming
//! to be a follower, dial that follower's claiming to be the leader,
//! shuttle hellos and whatever proofs appear), then a forged InstallSnapshot
//! frame. Nobody ever sends it a proof (acceptors wait for the dialer's),
//! both connections are closed, the cluster keeps granting, and after the
//! leader is killed the next tokens are above every token issued before.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{BUDGET, CHANGE_DEADLINE, Cluster, LEASE, ours, poll};
use ticketing_core::cluster::peer::{PEER_HELLO_LEN, PeerHello, PeerRole, PeerSealer};
use ticketing_core::raft::{Configuration, Message, MessageBody, NodeId, SnapshotMeta};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads what arrives on `tcp` until `window` passes without the peer
/// closing; returns the bytes and whether the peer closed (EOF or reset).
async fn read_for(tcp: &mut TcpStream, window: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

async fn hello_of(tcp: &mut TcpStream) -> PeerHello {
    let mut bytes = [0u8; PEER_HELLO_LEN];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut bytes))
        .await
        .expect("a node sends its hello at once")
        .unwrap();
    PeerHello::parse(&bytes).expect("a peer hello")
}

/// A frame the outsider makes up: an InstallSnapshot that would set
/// next_token low and drop every lock, sealed under a key of its choosing
/// (it has no token to derive the connection's).
fn forged_snapshot(from: NodeId, to: NodeId) -> Vec<u8> {
    let msg = Message {
        from,
        to,
        term: u64::MAX / 2,
        body: MessageBody::InstallSnapshot {
            meta: SnapshotMeta {
                index: 1_000_000,
                term: u64::MAX / 2,
                config: Configuration {
                    voters: [from].into_iter().collect(),
                    learners: Default::default(),
                },
            },
            offset: 0,
            data: 1_000u64.to_be_bytes().to_vec(),
            done: true,
        },
    };
    let mut out = Vec::new();
    PeerSealer::from_key(&[0xEE; 32])
        .seal(&msg, &mut out)
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outsider_relaying_peer_handshakes_is_never_accepted() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let broker = ours(&cluster);
    assert!(broker.wait_ready(Duration::from_secs(10)).await);

    // Load: four tasks acquire and release their own keys in a loop.
    let stop = Arc::new(AtomicBool::new(false));
    let token_max = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..4 {
        let (broker, stop, token_max, grants) = (
            broker.clone(),
            stop.clone(),
            token_max.clone(),
            grants.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let key = format!("relay-{task}");
            let mut last = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(ticket) = broker
                    .acquire(&key, Duration::from_secs(1), LEASE, BUDGET)
                    .await
                {
                    // One task's grants come one after another.
                    let token = ticket.token();
                    assert!(token > last, "token {token} not above {last}");
                    last = token;
                    token_max.fetch_max(token, Ordering::SeqCst);
                    grants.fetch_add(1, Ordering::SeqCst);
                    let _ = ticket.release().await;
                }
            }
        }));
    }
    poll("grants under load", || {
        (grants.load(Ordering::SeqCst) >= 20).then_some(())
    })
    .await;

    // The relay: to the leader "I am the follower, dialing"; to the
    // follower "I am the leader, dialing", each with the other's nonce.
    let mut to_leader = TcpStream::connect(cluster.slots[leader].peer)
        .await
        .unwrap();
    let mut to_follower = TcpStream::connect(cluster.slots[follower].peer)
        .await
        .unwrap();
    let leader_hello = hello_of(&mut to_leader).await;
    let follower_hello = hello_of(&mut to_follower).await;
    assert_eq!(leader_hello.role, PeerRole::Acceptor);
    assert_eq!(follower_hello.role, PeerRole::Acceptor);
    let as_follower = PeerHello {
        role: PeerRole::Dialer,
        ..follower_hello
    };
    let as_leader = PeerHello {
        role: PeerRole::Dialer,
        ..leader_hello
    };
    to_leader.write_all(&as_follower.encode()).await.unwrap();
    to_follower.write_all(&as_leader.encode()).await.unwrap();
    // Shuttle whatever appears, for a while: nothing does.
    let (from_leader, leader_closed) = read_for(&mut to_leader, Duration::from_secs(1)).await;
    let (from_follower, follower_closed) = read_for(&mut to_follower, Duration::from_secs(1)).await;
    assert!(
        from_leader.is_empty(),
        "the leader sent {} bytes after its hello",
        from_leader.len()
    );
    assert!(
        from_follower.is_empty(),
        "the follower sent {} bytes after its hello",
        from_follower.len()
    );
    assert!(
        !leader_closed && !follower_closed,
        "both still wait for a dialer's proof"
    );
    // The forged frame (its first 32 bytes stand where the proof belongs).
    let leader_id = NodeId::new(leader_hello.from.slot, leader_hello.from.generation);
    let follower_id = NodeId::new(follower_hello.from.slot, follower_hello.from.generation);
    let _ = to_leader
        .write_all(&forged_snapshot(follower_id, leader_id))
        .await;
    let _ = to_follower
        .write_all(&forged_snapshot(leader_id, follower_id))
        .await;
    let (from_leader, leader_closed) = read_for(&mut to_leader, Duration::from_secs(5)).await;
    let (from_follower, follower_closed) = read_for(&mut to_follower, Duration::from_secs(5)).await;
    assert!(
        from_leader.is_empty() && from_follower.is_empty(),
        "no proof, ever"
    );
    assert!(leader_closed, "the leader closed the outsider's connection");
    assert!(
        follower_closed,
        "the follower closed the outsider's connection"
    );

    // The cluster keeps granting.
    let after_attack = grants.load(Ordering::SeqCst);
    poll("grants after the attack", || {
        (grants.load(Ordering::SeqCst) >= after_attack + 20).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let issued_max = token_max.load(Ordering::SeqCst);

    // Failover: the next tokens are above every token issued before.
    cluster.kill(leader);
    let deadline = Instant::now() + CHANGE_DEADLINE;
    let ticket = loop {
        match broker
            .acquire("relay-after", Duration::from_secs(2), LEASE, BUDGET)
            .await
        {
            Ok(ticket) => break ticket,
            Err(e) => assert!(Instant::now() < deadline, "no grant after failover: {e:?}"),
        }
    };
    assert!(
        ticket.token() > issued_max,
        "token {} after failover not above {issued_max}",
        ticket.token()
    );
    ticket.release().await.unwrap();
    broker.close().await;
}
