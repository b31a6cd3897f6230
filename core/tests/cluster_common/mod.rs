//! What the `cluster_node*` test files share: request builders and the
//! starting points most of their tests begin from, on
//! `ticketing_core::testing::net::ClusterNet`.
#![allow(dead_code)]

use ticketing_core::machine::Machine;
use ticketing_core::metrics::RaftCounters;
use ticketing_core::server::ConnId;
use ticketing_core::testing::net::{ClusterNet, Endpoint};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    AcquireRequest, Capabilities, EXTENSION_VERSION, Key, KeyGroup, NegotiateRequest,
    ReleaseRequest, Reply, Request,
};

pub fn keys(key: &str) -> KeyGroup {
    KeyGroup::single(Key::new(key.as_bytes()).unwrap())
}

pub fn acquire(rid: u64, key: &str, wait_s: u8, lease_s: u8) -> Request {
    Request::Acquire(AcquireRequest {
        rid,
        wait_s,
        lease_s,
        keys: keys(key),
        set: false,
    })
}

pub fn release(rid: u64, key: &str, token: u64) -> Request {
    Request::Release(ReleaseRequest {
        rid,
        token,
        keys: keys(key),
        set: false,
    })
}

/// A cluster whose leader's client `c1` holds "k" (token `first`, 60 s)
/// and whose client `c2` queues for it (wait 10 s): `(net, leader, c1, c2,
/// first)`.
/// An elected cluster, settled, with one client connected to the leader:
/// `(net, leader, client)`.
pub fn leader_with_a_client() -> (ClusterNet, usize, usize) {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c = net.connect(leader);
    net.run_for(Duration::from_millis(300));
    (net, leader, c)
}

/// Acquires of keys `j` (rid 1) and `k` (rid 2) in one read: a commit of
/// two entries.
pub fn two_acquires_in_one_input() -> Vec<u8> {
    let mut bytes = acquire(1, "j", 0, 10).to_frame();
    bytes.extend(acquire(2, "k", 0, 10).to_frame());
    bytes
}

pub fn holder_and_waiter() -> (ClusterNet, usize, usize, usize, u64) {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let c1 = net.connect(leader);
    let c2 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 60)));
    net.send_only(c2, acquire(1, "k", 10, 60));
    net.run_for(Duration::from_millis(100));
    assert!(net.answers(c2).is_empty(), "c2 queues behind c1");
    (net, leader, c1, c2, first)
}

/// The appends the leader sent since `before`, and the entries they
/// carried.
pub fn appends_since(net: &mut ClusterNet, leader: usize, before: RaftCounters) -> (u64, u64) {
    let after = net.node(leader).raft().counters();
    (
        after.appends_sent - before.appends_sent,
        after.append_entries_sent - before.append_entries_sent,
    )
}

pub fn token_of(reply: Reply) -> u64 {
    match reply {
        Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => token,
        other => panic!("not a grant: {other:?}"),
    }
}

/// A `X` asking for `wanted`.
pub fn negotiate(rid: u64, wanted: Capabilities) -> Request {
    Request::Negotiate(NegotiateRequest {
        rid,
        version: EXTENSION_VERSION,
        wanted,
        label: "cluster-test".to_owned(),
    })
}

/// A client of `node` that negotiated `wanted` (all of it granted).
pub fn connect_negotiated(net: &mut ClusterNet, node: usize, wanted: Capabilities) -> usize {
    let c = net.connect(node);
    assert_eq!(
        net.request(c, negotiate(1, wanted)),
        Reply::Negotiated {
            rid: 1,
            granted: wanted
        }
    );
    c
}

/// Every live node holds the same replicated state (token counter,
/// grants, their keys and leases).
pub fn assert_every_node_agrees(net: &mut ClusterNet) {
    let views: Vec<_> = net
        .nodes
        .iter()
        .flatten()
        .map(|node| node.lock_state().replicated_view())
        .collect();
    assert!(
        views.windows(2).all(|w| w[0] == w[1]),
        "replicas differ: {views:?}"
    );
}

/// Takes what node `from` has for its peer links without delivering it
/// (the other ends hear nothing yet, but the TCP streams stay whole:
/// [`deliver`] hands the bytes over later, in order); wakes of client
/// connections are left for the net.
pub fn take_peer_bytes(net: &mut ClusterNet, from: usize) -> Vec<(ConnId, Vec<u8>)> {
    let woken: Vec<ConnId> = net.outputs(from).wakes.drain(..).collect();
    let now = net.now;
    let mut taken = Vec::new();
    for conn in woken {
        if let Some(Endpoint::Peer(..)) = net.links.get(&(from, conn)) {
            let mut out = Vec::new();
            net.node(from).poll_transmit(conn, &mut out);
            net.node(from).handle_flushed(now, conn);
            if !out.is_empty() {
                taken.push((conn, out));
            }
        } else {
            net.outputs[from].wakes.push_back(conn);
        }
    }
    taken
}

/// Hands the bytes [`take_peer_bytes`] took from node `from` to the other
/// ends, in the order they were written.
pub fn deliver(net: &mut ClusterNet, from: usize, taken: Vec<(ConnId, Vec<u8>)>) {
    let now = net.now;
    for (conn, bytes) in taken {
        if let Some(Endpoint::Peer(j, other)) = net.links.get(&(from, conn)).copied() {
            net.node(j).handle_input(now, other, &bytes);
        }
    }
}

/// Moves the leader's clock on by `by` in 1 ms steps, serving only its
/// timers; what it writes to its peers is kept back and returned.
pub fn leader_alone_for(
    net: &mut ClusterNet,
    leader: usize,
    by: Duration,
) -> Vec<(ConnId, Vec<u8>)> {
    let end = net.now.saturating_add(by);
    let mut held = take_peer_bytes(net, leader);
    while net.now < end {
        net.now = net.now.saturating_add(Duration::from_millis(1)).min(end);
        let now = net.now;
        net.node(leader).handle_timeout(now);
        held.extend(take_peer_bytes(net, leader));
    }
    held
}
