//! `O` on `ClusterNode`s over the test network (time injected, nothing
//! sleeping): the leader answers who holds a key from the applied state,
//! naming the label the holder's Grant carried, so a new leader names the
//! same holder and term after a change of leader; a grant whose lease
//! ended is nobody's.

mod cluster_common;

use cluster_common::*;
use ticketing_core::testing::net::{ClusterNet, Endpoint};
use ticketing_core::time::Duration;
use ticketing_core::wire::{
    Capabilities, EXTENSION_VERSION, ExtendRequest, ExtendStatus, LeaderLabel, LeaderState,
    NegotiateRequest, ObserveRequest, Observed, Reply, Request,
};

/// A client of `node` that negotiated OBSERVE under `label`.
fn observer(net: &mut ClusterNet, node: usize, label: &str) -> usize {
    let c = net.connect(node);
    let reply = net.request(
        c,
        Request::Negotiate(NegotiateRequest {
            rid: 1,
            version: EXTENSION_VERSION,
            wanted: Capabilities::OBSERVE,
            label: label.to_owned(),
        }),
    );
    assert_eq!(
        reply,
        Reply::Negotiated {
            rid: 1,
            granted: Capabilities::OBSERVE
        },
        "a cluster node serves OBSERVE"
    );
    c
}

fn observe(net: &mut ClusterNet, c: usize, rid: u64, name: &str) -> Observed {
    let request = Request::Observe(ObserveRequest {
        rid,
        name: keys(name).keys()[0].clone(),
    });
    match net.request(c, request) {
        Reply::Observed { observed, .. } => observed,
        other => panic!("not an observation: {other:?}"),
    }
}

#[test]
fn the_leader_names_the_holder_by_its_label_and_term() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let candidate = observer(&mut net, leader, "worker-a");
    let watcher = observer(&mut net, leader, "watcher");
    assert_eq!(
        observe(&mut net, watcher, 2, "election"),
        Observed::NO_LEADER
    );
    let term = token_of(net.request(candidate, acquire(2, "election", 0, 30)));
    let seen = observe(&mut net, watcher, 3, "election");
    assert_eq!(seen.state, LeaderState::Connected);
    assert_eq!(seen.term, term);
    assert_eq!(seen.label.as_str(), "worker-a");
    assert!(
        seen.lease_ms > 29_000 && seen.lease_ms <= 30_000,
        "{seen:?}"
    );
    // Every node recorded the label with the grant.
    for i in 0..3 {
        let holding = net.node(i).lock_state().grant(term).cloned().unwrap();
        assert_eq!(holding.options.label, LeaderLabel::new("worker-a"));
    }
}

/// `worker-a` leads the election `election` (20 s lease) through a leader
/// that then dies; another is elected and a `watcher` observes on it. The
/// net, the new leader, the watcher and the election's term.
fn leader_elected_then_a_new_leader() -> (ClusterNet, usize, usize, u64) {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let candidate = observer(&mut net, leader, "worker-a");
    let term = token_of(net.request(candidate, acquire(2, "election", 0, 20)));
    net.kill(leader);
    let next = net.elect();
    assert_ne!(next, leader);
    let watcher = observer(&mut net, next, "watcher");
    (net, next, watcher, term)
}

#[test]
fn a_new_leader_names_the_same_holder_and_term_until_its_lease_ends() {
    let (mut net, next, watcher, term) = leader_elected_then_a_new_leader();
    let seen = observe(&mut net, watcher, 2, "election");
    // This leader never saw the holder's connection: departed, but still
    // the holder, under the label its Grant carried.
    assert_eq!(seen.state, LeaderState::Departed);
    assert_eq!(seen.term, term);
    assert_eq!(seen.label.as_str(), "worker-a");
    net.run_for(Duration::from_secs(20));
    assert_eq!(
        observe(&mut net, watcher, 3, "election"),
        Observed::NO_LEADER
    );
    // The next candidate's term is higher than any before it.
    let next_candidate = observer(&mut net, next, "worker-b");
    let next_term = token_of(net.request(next_candidate, acquire(2, "election", 0, 20)));
    assert!(next_term > term);
    let seen = observe(&mut net, watcher, 4, "election");
    assert_eq!((seen.term, seen.label.as_str()), (next_term, "worker-b"));
}

/// Closes client `c`'s connection at the node it is connected to.
fn close_client(net: &mut ClusterNet, c: usize) {
    let (node, conn) = net
        .links
        .iter()
        .find(|(_, end)| matches!(end, Endpoint::Client(client) if *client == c))
        .map(|(&link, _)| link)
        .expect("the client is connected");
    net.close_link(node, conn);
}

/// A grant an earlier leader delivered is departed on the new leader
/// until a connection renews it there by token: from then on it is named
/// connected, and departed again once that connection closes (still the
/// holder, under the same term and label, until its lease ends).
#[test]
fn a_holder_that_renews_on_a_new_leader_is_named_connected_there() {
    let (mut net, next, watcher, term) = leader_elected_then_a_new_leader();
    assert_eq!(
        observe(&mut net, watcher, 2, "election").state,
        LeaderState::Departed
    );

    let renewer = connect_negotiated(&mut net, next, Capabilities::EXTEND);
    let renewal = Request::Extend(ExtendRequest {
        rid: 2,
        token: term,
        lease_s: 20,
        keys: keys("election"),
    });
    let reply = net.request(renewer, renewal);
    assert!(
        matches!(
            reply,
            Reply::Extended {
                status: ExtendStatus::Extended,
                ..
            }
        ),
        "{reply:?}"
    );
    let seen = observe(&mut net, watcher, 3, "election");
    assert_eq!(
        (seen.state, seen.term, seen.label.as_str()),
        (LeaderState::Connected, term, "worker-a")
    );

    close_client(&mut net, renewer);
    let seen = observe(&mut net, watcher, 4, "election");
    assert_eq!(
        (seen.state, seen.term, seen.label.as_str()),
        (LeaderState::Departed, term, "worker-a")
    );
}
