//! What the `cluster_node*` test files share: request builders and the
//! starting points most of their tests begin from, on
//! `ticketing_core::testing::net::ClusterNet`.
#![allow(dead_code)]

use ticketing_core::metrics::RaftCounters;
use ticketing_core::testing::net::ClusterNet;
use ticketing_core::time::Duration;
use ticketing_core::wire::{AcquireRequest, Key, KeyGroup, ReleaseRequest, Reply, Request};

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
