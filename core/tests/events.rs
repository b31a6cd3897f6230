//! The recent events operators see (`ticketing_core::events`), recorded by
//! the cores where they decide them, with injected time: a force-release,
//! an expiry that handed keys to a waiter, refused connections counted per
//! reason per interval, and (cluster) leader changes and the members view.

mod cluster_common;

use std::net::{IpAddr, Ipv4Addr};

use cluster_common::*;
use ticketing_core::budget::{AbuseKind, BudgetConfig};
use ticketing_core::events::{Event, EventView};
use ticketing_core::inspect::ForceRelease;
use ticketing_core::machine::Machine;
use ticketing_core::server::ServerConfig;
use ticketing_core::testing::net::{ClusterNet, Nonces, SingleNet};
use ticketing_core::time::Duration;
use ticketing_core::wire::Key;

fn source(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn key(name: &str) -> Key {
    Key::new(name.as_bytes()).unwrap()
}

fn single_events(h: &SingleNet) -> Vec<EventView> {
    h.server.recent_events(h.now)
}

fn kinds(events: &[EventView]) -> Vec<Event> {
    events.iter().map(|view| view.event.clone()).collect()
}

#[test]
fn a_force_release_is_an_event_naming_the_revoked_and_the_new_token_aged_at_the_query() {
    let mut h = SingleNet::default().with_nonces(Nonces::Fixed([7; 16]));
    let (_, token) = h.holder(source(1), &["jobs/7"], 30);
    let waiter = h.waiter(source(2), &["jobs/7"], 20);
    assert_eq!(
        single_events(&h),
        vec![],
        "a grant and a wait are no events"
    );
    h.force_release("jobs/7", None);
    let new_token = h.granted_token(waiter);
    h.advance(Duration::from_millis(1_500));
    let events = single_events(&h);
    assert_eq!(
        kinds(&events),
        vec![Event::ForceReleased {
            keys: vec![key("jobs/7")],
            revoked: token,
            handed_to: Some(new_token),
        }]
    );
    assert_eq!((events[0].age_ms, events[0].span_ms), (1_500, 0));
    // A refused force-release changed nothing and is no event.
    h.force_release("jobs/7", Some(token));
    assert_eq!(single_events(&h).len(), 1);
}

#[test]
fn an_expiry_is_an_event_only_when_somebody_waited_for_the_key() {
    let mut h = SingleNet::default().with_nonces(Nonces::Fixed([7; 16]));
    let (_, lonely) = h.holder(source(1), &["alone"], 1);
    let (_, token) = h.holder(source(1), &["busy"], 1);
    let waiter = h.waiter(source(2), &["busy"], 20);
    h.advance(Duration::from_millis(1_200));
    let next = h.granted_token(waiter);
    // The lonely key's expiry is noticed by the sweep (or the next
    // acquire); it is counted, but nobody was held up by it.
    h.advance(Duration::from_secs(6));
    assert_eq!(h.server.metrics().lock.expiries_not_handed_over, 1);
    let events = single_events(&h);
    assert_eq!(
        kinds(&events),
        vec![Event::ExpiredWithWaiters {
            keys: vec![key("busy")],
            expired: token,
            handed_to: Some(next),
        }],
        "not {lonely}"
    );
    assert_eq!(events[0].age_ms, 6_000);
}

#[test]
fn a_flood_of_refused_connections_is_one_counted_event_per_interval() {
    let config = ServerConfig {
        connections_max: 1,
        budget: BudgetConfig::for_connections_max(1),
        ..ServerConfig::default()
    };
    let interval = config.budget.report_interval;
    let mut h = SingleNet::new(config).with_nonces(Nonces::Fixed([7; 16]));
    let (_, token) = h.holder(source(1), &["k"], 30);
    for n in 0..10_000u32 {
        let from = source(u8::try_from(3 + n % 200).unwrap());
        assert_eq!(h.server.handle_connect(h.now, [1; 16], from), None);
        if n == 4_999 {
            h.advance(Duration::from_millis(400));
        }
    }
    let events = single_events(&h);
    assert_eq!(
        kinds(&events),
        vec![Event::Refused {
            reason: AbuseKind::Refused,
            count: 10_000
        }]
    );
    assert_eq!((events[0].age_ms, events[0].span_ms), (0, 400));
    // A force-release after the flood is not washed out by it.
    h.force_release("k", None);
    // After the interval, a new count opens; the old one keeps its own.
    h.advance(interval);
    assert_eq!(h.server.handle_connect(h.now, [1; 16], source(9)), None);
    let events = single_events(&h);
    assert_eq!(
        kinds(&events),
        vec![
            Event::Refused {
                reason: AbuseKind::Refused,
                count: 1
            },
            Event::ForceReleased {
                keys: vec![key("k")],
                revoked: token,
                handed_to: None,
            },
            Event::Refused {
                reason: AbuseKind::Refused,
                count: 10_000
            },
        ]
    );
}

fn cluster_events(net: &mut ClusterNet, i: usize) -> Vec<Event> {
    let now = net.now;
    kinds(&net.node(i).recent_events(now))
}

#[test]
fn every_cluster_node_records_the_leader_it_learns_and_the_force_releases_it_applies() {
    let (mut net, leader, _c1, c2, first) = holder_and_waiter();
    let leader_slot = net.node(leader).id().slot;
    for i in 0..3 {
        let term = net.node(i).raft().term();
        assert_eq!(
            cluster_events(&mut net, i),
            vec![Event::LeaderChanged {
                leader_slot: Some(leader_slot),
                term
            }],
            "node {i}"
        );
    }
    net.force_release(
        leader,
        7,
        ForceRelease {
            key: key("k"),
            token: None,
        },
    );
    net.run_for(Duration::from_millis(100));
    let second = token_of(net.answers(c2)[0]);
    assert!(second > first);
    for i in 0..3 {
        let events = cluster_events(&mut net, i);
        assert_eq!(
            events.first(),
            Some(&Event::ForceReleased {
                keys: vec![key("k")],
                revoked: first,
                handed_to: None,
            }),
            "node {i}: {events:?}"
        );
    }
}

#[test]
fn the_leader_records_an_expiry_that_handed_keys_to_a_waiter() {
    let (mut net, leader, c1) = leader_with_a_client();
    let c2 = net.connect(leader);
    let first = token_of(net.request(c1, acquire(1, "k", 0, 1)));
    net.send_only(c2, acquire(1, "k", 10, 60));
    net.run_for(Duration::from_millis(1_500));
    let second = token_of(net.answers(c2)[0]);
    let events = cluster_events(&mut net, leader);
    assert_eq!(
        events.first(),
        Some(&Event::ExpiredWithWaiters {
            keys: vec![key("k")],
            expired: first,
            handed_to: None,
        }),
        "{events:?} (then {second})"
    );
    // A follower applied the same expiry but knew of no waiter.
    let follower = (leader + 1) % 3;
    assert!(
        !cluster_events(&mut net, follower)
            .iter()
            .any(|event| matches!(event, Event::ExpiredWithWaiters { .. }))
    );
}

#[test]
fn a_killed_leader_leaves_a_leader_change_on_every_survivor() {
    let mut net = ClusterNet::new();
    let old = net.elect();
    net.kill(old);
    net.run_for(Duration::from_secs(3));
    let new = net.leader().expect("the survivors elect a leader");
    let new_slot = net.node(new).id().slot;
    let new_term = net.node(new).raft().term();
    for i in (0..3).filter(|&i| i != old) {
        let events = cluster_events(&mut net, i);
        assert_eq!(
            events.first(),
            Some(&Event::LeaderChanged {
                leader_slot: Some(new_slot),
                term: new_term
            }),
            "node {i}: {events:?}"
        );
        assert!(events.len() >= 2, "the first leader too: {events:?}");
    }
}

#[test]
fn the_leader_sees_every_member_with_lag_and_contact_and_a_follower_sees_the_configuration() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    net.run_for(Duration::from_millis(500));
    let now = net.now;
    let members = net.node(leader).members(now);
    assert_eq!(members.len(), 3);
    let slots: Vec<u8> = members.iter().map(|m| m.slot).collect();
    assert_eq!(slots, [0, 1, 2]);
    for member in &members {
        assert!(member.voter, "{member:?}");
        assert_eq!(member.lag_entries, Some(0), "{member:?}");
        assert_eq!(member.ready, Some(true), "{member:?}");
        let is_leader = usize::from(member.slot) == leader;
        assert_eq!((member.leader, member.this_node), (is_leader, is_leader));
        assert_eq!(member.heard_ms.is_none(), is_leader, "{member:?}");
    }
    // A follower cut off from the leader: the leader stops hearing it.
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    net.partition(follower);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    let members = net.node(leader).members(now);
    let cut = &members[follower];
    assert_eq!(cut.ready, Some(false), "{cut:?}");
    assert!(cut.heard_ms.unwrap() >= 1_000, "{cut:?}");
    assert_eq!(members[other].ready, Some(true));
    // The other follower knows the configuration and the leader, not lags.
    let seen = net.node(other).members(now);
    assert_eq!(seen.len(), 3);
    assert!(seen[leader].leader && seen[other].this_node);
    assert!(seen.iter().all(|m| m.lag_entries.is_none()));
    assert_eq!(seen[other].ready, Some(true));
    assert_eq!(seen[follower].ready, None);
}

#[test]
fn a_cluster_node_counts_refused_connections_in_one_event() {
    let mut net = ClusterNet::new();
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let now = net.now;
    // A node shutting down refuses every client connection.
    net.node(follower).begin_shutdown(now);
    for n in 0..500u32 {
        let from = source(u8::try_from(n % 250).unwrap());
        assert_eq!(net.node(follower).handle_connect(now, [3; 16], from), None);
    }
    let events = net.node(follower).recent_events(now);
    assert_eq!(
        events.first().map(|view| &view.event),
        Some(&Event::Refused {
            reason: AbuseKind::Refused,
            count: 500
        }),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|view| matches!(view.event, Event::Refused { .. }))
            .count(),
        1
    );
}
