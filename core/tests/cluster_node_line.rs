//! Cluster nodes on the test network: the line dialect in cluster mode
//! (leader notices, `M`, no leader, not active, hand-overs to v3).

mod cluster_common;

use cluster_common::*;
use ticketing_core::cluster::{ClusterConfig, ClusterNode};
use ticketing_core::line::{encode_line_acquire, encode_line_release};
use ticketing_core::machine::Machine;
use ticketing_core::raft::NodeId;
use ticketing_core::testing::net::{
    BOOT_US, ClusterNet, REJOIN_GENERATION, cluster_config as config,
};
use ticketing_core::time::Duration;
use ticketing_core::wire::Reply;

// ---------------------------------------------------------------------
// The line dialect in cluster mode
// ---------------------------------------------------------------------

const ADDRESSES: [&str; 3] = ["10.0.0.1:5225", "10.0.0.2:5225", "10.0.0.3:5225"];

fn with_addresses(config: &mut ClusterConfig) {
    config.client_addresses = ADDRESSES.iter().map(|a| Box::from(*a)).collect();
}

fn line_acquire(wait_s: u16, lease_s: u16, owner: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_acquire(&mut out, wait_s, lease_s, owner, key.as_bytes());
    out
}

fn line_release(token: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_line_release(&mut out, token, key.as_bytes());
    out
}

fn leader_line(slot: usize) -> (u8, u64, Vec<u8>) {
    (b'L', 0, ADDRESSES[slot].as_bytes().to_vec())
}

fn e_line(reason: &str) -> (u8, u64, Vec<u8>) {
    (b'E', 0, reason.as_bytes().to_vec())
}

#[test]
fn a_line_client_is_told_the_leader_address_at_once_and_on_every_change() {
    let mut net = ClusterNet::with_config(with_addresses);
    // No leader yet: nothing is announced.
    let early = net.connect_line(0);
    assert!(net.clients[early].lines.is_empty());
    let leader = net.elect();
    assert_eq!(net.clients[early].lines, vec![leader_line(leader)]);
    let follower = (leader + 1) % 3;
    let c = net.connect_line(follower);
    assert_eq!(net.clients[c].lines, vec![leader_line(leader)]);
    net.kill(leader);
    net.run_for(Duration::from_secs(3));
    let new_leader = net.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    // The leader change shows as L lines only (no M without a request),
    // the last one naming the new leader.
    let lines = &net.clients[c].lines;
    assert!(lines.iter().all(|l| l.0 == b'L'), "{lines:?}");
    assert_eq!(lines.last(), Some(&leader_line(new_leader)));
}

#[test]
fn a_follower_answers_a_line_request_with_m_and_the_leader_address_and_no_effect() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let c = net.connect_line(follower);
    net.clients[c].lines.clear();
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(
        net.clients[c].lines,
        vec![(b'M', 0, ADDRESSES[leader].as_bytes().to_vec())]
    );
    assert_eq!(net.node(leader).lock_state().held_keys(), 0, "no effect");
}

#[test]
fn without_a_leader_a_line_request_gets_no_leader() {
    let mut net = ClusterNet::with_config(with_addresses);
    let c = net.connect_line(1);
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.settle();
    assert_eq!(net.clients[c].lines, vec![e_line("no_leader")]);
}

#[test]
fn a_cluster_without_client_addresses_answers_no_leader_instead_of_m() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect_line((leader + 1) % 3);
    assert!(net.clients[c].lines.is_empty(), "no address, no L");
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(net.clients[c].lines, vec![e_line("no_leader")]);
}

#[test]
fn the_leader_grants_a_line_client_after_commit_and_hands_over_to_v3() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let line = net.connect_line(leader);
    let v3 = net.connect(leader);
    net.clients[line].lines.clear();
    net.send_bytes(line, &line_acquire(5, 30, 0x0A0A, "shared"));
    net.run_for(Duration::from_millis(200));
    let token = match &net.clients[line].lines[..] {
        [(b'A', token, key)] if key == b"shared" => *token,
        other => panic!("{other:?}"),
    };
    assert!(token >= BOOT_US);
    net.send_only(v3, acquire(1, "shared", 10, 30));
    net.run_for(Duration::from_millis(200));
    assert!(net.answers(v3).is_empty(), "queued behind the line holder");
    net.send_bytes(line, &line_release(token, "shared"));
    net.run_for(Duration::from_millis(200));
    assert_eq!(
        net.clients[line].lines[1],
        (b'R', token, b"shared".to_vec())
    );
    match net.answers(v3)[..] {
        [Reply::Acquired { rid: 1, token: t }] => assert!(t > token),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn lost_leadership_closes_a_line_connection_whose_outcome_is_unknown() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let c1 = net.connect_line(leader);
    let c2 = net.connect_line(leader);
    net.send_bytes(c1, &line_acquire(0, 60, 1, "held"));
    net.run_for(Duration::from_millis(200));
    net.send_bytes(c2, &line_acquire(30, 60, 2, "held"));
    net.settle();
    for i in 0..3 {
        if i != leader {
            net.kill(i);
        }
    }
    // Proposed, never committed: the line dialect cannot say "unknown".
    net.send_bytes(c1, &line_acquire(0, 60, 3, "new"));
    net.run_for(Duration::from_secs(2));
    assert!(!net.node(leader).is_leader(), "check-quorum stepped down");
    assert!(net.clients[c1].closed, "closed: the client resends");
    let new_replies: Vec<_> = net.clients[c1]
        .lines
        .iter()
        .filter(|l| l.0 != b'L')
        .collect();
    assert_eq!(
        new_replies.len(),
        1,
        "only the first grant: {new_replies:?}"
    );
    // The queued request had no effect: told so, in the line's words.
    assert!(
        net.clients[c2].lines.contains(&e_line("no_leader")),
        "{:?}",
        net.clients[c2].lines
    );
}

#[test]
fn a_new_generation_answers_a_line_request_not_active() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let id = NodeId::new(victim as u8, 2);
    let mut config = config(id);
    with_addresses(&mut config);
    net.nodes[victim] = Some(ClusterNode::join(config, 99, net.now));
    let c = net.connect_line(victim);
    net.clients[c].lines.clear();
    net.send_bytes(c, &line_acquire(5, 10, 7, "k"));
    net.settle();
    assert_eq!(net.clients[c].lines, vec![e_line("not_active")]);
}

#[test]
fn shutdown_tells_line_clients_not_active() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let holder = net.connect(leader);
    let waiter = net.connect_line(leader);
    token_of(net.request(holder, acquire(1, "k", 0, 60)));
    net.clients[waiter].lines.clear();
    net.send_bytes(waiter, &line_acquire(30, 60, 2, "k"));
    net.run_for(Duration::from_millis(200));
    let now = net.now;
    net.node(leader).begin_shutdown(now);
    net.settle();
    let lines = &net.clients[waiter].lines;
    assert!(
        lines.iter().all(|l| *l == e_line("not_active")),
        "{lines:?}"
    );
    assert!(!lines.is_empty());
    assert!(net.clients[waiter].closed);
}

#[test]
fn a_shutting_down_leader_is_quiesced_once_its_clients_are_closed_and_it_no_longer_leads() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let client = net.connect(leader);
    token_of(net.request(client, acquire(1, "k", 0, 60)));
    assert!(!net.node(leader).quiesced(), "it leads and has a client");
    let now = net.now;
    net.node(leader).begin_shutdown(now);
    net.settle();
    assert!(net.clients[client].closed);
    net.run_for(Duration::from_secs(2));
    let node = net.node(leader);
    assert!(!node.is_leader(), "leadership was handed over");
    assert!(node.quiesced());
    assert_eq!(Machine::node_id(node), Some(node.id()));
}

#[test]
fn client_addresses_are_validated() {
    let mut config = config(NodeId::new(0, 1));
    config.client_addresses = vec![Box::from("a:1"), Box::from("b:1")];
    assert!(config.validate().is_err(), "every slot or none");
    config.client_addresses = vec![Box::from("a:1"), Box::from("b\n:1"), Box::from("c:1")];
    assert!(config.validate().is_err(), "no LF");
    with_addresses(&mut config);
    assert!(config.validate().is_ok());
}

#[test]
fn line_sessions_survive_a_rejoin_and_are_counted_down_once() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let victim = (leader + 1) % 3;
    net.kill(victim);
    let voters: Vec<NodeId> = (0..3).map(|slot| NodeId::new(slot, 1)).collect();
    let mut config = config(NodeId::new(victim as u8, 1));
    with_addresses(&mut config);
    net.nodes[victim] = Some(ClusterNode::bootstrap(
        config,
        voters,
        REJOIN_GENERATION,
        42,
        net.now,
    ));
    let line = net.connect_line(victim);
    let v3 = net.connect(victim);
    assert_eq!(net.node(victim).metrics().line_sessions, 1);
    // The leader's heartbeats show a running cluster: a new generation.
    net.run_for(Duration::from_millis(500));
    assert_eq!(
        net.node(victim).id(),
        NodeId::new(victim as u8, REJOIN_GENERATION)
    );
    let metrics = net.node(victim).metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (2, 1));
    let now = net.now;
    for c in [line, v3] {
        let conn = net.clients[c].conn;
        net.node(victim).handle_closed(now, conn);
    }
    let metrics = net.node(victim).metrics();
    assert_eq!((metrics.sessions, metrics.line_sessions), (0, 0));
}

#[test]
fn a_failed_line_handshake_is_read_no_further_until_its_late_refusal_goes_out() {
    let mut net = ClusterNet::with_config(with_addresses);
    let leader = net.elect();
    let now = net.now;
    let nonce = net.nonce();
    let loopback = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let conn = net
        .node(leader)
        .handle_connect(now, nonce, loopback)
        .expect("accepted");
    assert!(net.node(leader).wants_input(conn));
    // A well-shaped line answer that no token produces.
    let mut answer = vec![b'A'; 43];
    answer.push(b'\n');
    net.node(leader).handle_input(now, conn, &answer);
    assert!(
        !net.node(leader).wants_input(conn),
        "a refused handshake's later bytes are not read"
    );
    let before = net.node(leader).metrics();
    net.run_for(Duration::from_millis(1_000));
    assert_eq!(before.sessions, 0);
    assert_eq!(net.node(leader).metrics().sessions, 0);
}
