//! Lock inspection and the operator's force-release on the single-mode
//! server, with injected time (`ticketing_core::inspect`), and the admin
//! API's access rule (`ticketing_core::admin`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use ticketing_core::testing::net::{Nonces, SingleNet, acquire, release};

use ticketing_core::admin::{
    AdminAccess, AdminEndpoint, AdminRefusal, AdminRefusals, AdminTokens, admin_access,
    host_allowed,
};
use ticketing_core::budget::LogEvent;
use ticketing_core::inspect::{
    ConnView, ForceReleaseOutcome, LISTING_LIMIT_MAX, LISTING_SLOTS_PER_CALL_MAX, ListingCursor,
    LockView, WAITERS_PER_LISTED_LOCK_MAX,
};
use ticketing_core::machine::Machine;
use ticketing_core::server::{ConnId, Dialect, Server};
use ticketing_core::time::{Duration, Instant};
use ticketing_core::wire::{Key, Reply};

fn source(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn key(name: &str) -> Key {
    Key::new(name.as_bytes()).unwrap()
}

/// The net of these tests: every connection gets the nonce `[7; 16]`.
fn net() -> SingleNet {
    SingleNet::default().with_nonces(Nonces::Fixed([7; 16]))
}

fn v3(conn: ConnId, from: IpAddr) -> Option<ConnView> {
    Some(ConnView {
        conn,
        source: from,
        dialect: Dialect::V3,
        label: None,
    })
}

#[test]
fn inspection_lists_the_holder_and_waiters_in_fifo_order_with_ages_after_a_clock_jump() {
    let mut h = net();
    let (holder, token) = h.holder(source(1), &["orders/42"], 30);
    h.advance(Duration::from_millis(1_000));
    let first = h.waiter(source(2), &["orders/42"], 20);
    h.advance(Duration::from_millis(2_000));
    let second = h.waiter(source(3), &["orders/42"], 10);
    h.advance(Duration::from_millis(500));
    let third = h.waiter(source(4), &["orders/42"], 60);
    // Jump the clock without feeding the server anything: ages are
    // computed at the `now` the inspection is asked for.
    h.now = Instant::from_micros(h.now.as_micros() + 4_000_000);

    let view = h.show("orders/42");
    assert_eq!(view.key, key("orders/42"));
    let held = view.holder.as_ref().unwrap();
    assert_eq!(held.token, token);
    assert_eq!(held.keys, vec![key("orders/42")]);
    assert_eq!(held.held_ms, 7_500);
    assert_eq!(held.lease_remaining_ms, 22_500);
    assert_eq!(held.conn, v3(holder, source(1)));

    assert_eq!(view.waiters_total, 3);
    let order: Vec<_> = view.waiters.iter().map(|w| w.conn.clone()).collect();
    assert_eq!(
        order,
        vec![
            v3(first, source(2)),
            v3(second, source(3)),
            v3(third, source(4))
        ]
    );
    let ages: Vec<(u64, u64)> = view
        .waiters
        .iter()
        .map(|w| (w.waited_ms, w.wait_remaining_ms))
        .collect();
    // Each wait ends `wait_s` minus the 100 ms margin after it was queued.
    assert_eq!(ages, vec![(6_500, 13_400), (4_500, 5_400), (4_000, 55_900)]);
    assert!(
        view.waiters
            .iter()
            .all(|w| w.keys == vec![key("orders/42")])
    );

    // A key nobody holds or waits on is not there; nor is one whose lease
    // ran out (even before the table noticed).
    assert_eq!(h.server.inspect_lock(h.now, &key("orders/43")), None);
    let (_, _) = h.holder(source(5), &["short"], 1);
    let later = Instant::from_micros(h.now.as_micros() + 1_000_000);
    assert_eq!(h.server.inspect_lock(later, &key("short")), None);
}

#[test]
fn a_set_shows_its_whole_group_on_every_key_and_in_a_listing() {
    let mut h = net();
    let (holder, token) = h.holder(source(1), &["a", "b", "c"], 20);
    let waiter = h.waiter(source(2), &["b", "d"], 10);
    for name in ["a", "b", "c"] {
        let view = h.show(name);
        let held = view.holder.unwrap();
        assert_eq!(held.token, token);
        assert_eq!(held.keys, vec![key("a"), key("b"), key("c")], "on {name}");
        assert_eq!(held.conn, v3(holder, source(1)));
    }
    let b = h.show("b");
    assert_eq!(b.waiters.len(), 1);
    assert_eq!(b.waiters[0].keys, vec![key("b"), key("d")]);
    assert_eq!(b.waiters[0].conn, v3(waiter, source(2)));
    // "d" is free but waited on by the set waiter, which is blocked on "b".
    let d = h.show("d");
    assert_eq!(d.holder, None);
    assert_eq!(d.waiters[0].keys, vec![key("b"), key("d")]);

    let listing = h.server.inspect_locks(h.now, b"", 10, ListingCursor::START);
    let listed: Vec<&Key> = listing.locks.iter().map(|l| &l.key).collect();
    assert_eq!(listed, vec![&key("a"), &key("b"), &key("c"), &key("d")]);
    for view in &listing.locks[..3] {
        assert_eq!(
            view.holder.as_ref().unwrap().keys,
            vec![key("a"), key("b"), key("c")]
        );
    }
}

/// Every page of a listing from the start, with the number of calls.
fn list_all(server: &Server, now: Instant, prefix: &[u8], limit: usize) -> (Vec<LockView>, usize) {
    let mut all = Vec::new();
    let mut cursor = Some(ListingCursor::START);
    let mut calls = 0;
    while let Some(at) = cursor {
        let page = server.inspect_locks(now, prefix, limit, at);
        assert!(page.locks.len() <= limit.min(LISTING_LIMIT_MAX));
        assert!(
            page.locks.windows(2).all(|w| w[0].key < w[1].key),
            "a page is ascending"
        );
        all.extend(page.locks);
        cursor = page.next;
        calls += 1;
    }
    (all, calls)
}

fn sorted_names(locks: &[LockView]) -> Vec<String> {
    let mut names: Vec<String> = locks.iter().map(|l| l.key.as_str().to_owned()).collect();
    names.sort();
    names
}

#[test]
fn listing_by_prefix_pages_through_every_matching_key_once_each_page_ascending() {
    let mut h = net();
    let conn = h.connect_from(source(1));
    // Acquired out of order, so hash order cannot pass for sorted order.
    for (rid, n) in [7u64, 3, 9, 1, 5, 2, 8, 4, 6, 0].into_iter().enumerate() {
        h.send(
            conn,
            &acquire(rid as u64 + 1, &[&format!("jobs/{n}")], 0, 30),
        );
    }
    h.send(conn, &acquire(100, &["other/1"], 0, 30));
    assert_eq!(h.replies(conn).len(), 11);
    let expected: Vec<String> = (0..10).map(|n| format!("jobs/{n}")).collect();

    // A small table fits one call: one page, ascending, and the end.
    let all = h
        .server
        .inspect_locks(h.now, b"jobs/", 100, ListingCursor::START);
    let names: Vec<&str> = all.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, expected);
    assert_eq!(all.next, None);

    // A limit of 3 pages through the same keys, each exactly once.
    let first_three = h
        .server
        .inspect_locks(h.now, b"jobs/", 3, ListingCursor::START);
    assert_eq!(first_three.locks.len(), 3);
    assert!(first_three.next.is_some(), "more to come");
    let (paged, calls) = list_all(&h.server, h.now, b"jobs/", 3);
    assert_eq!(sorted_names(&paged), expected);
    assert!(calls >= 4);

    let (everything, _) = list_all(&h.server, h.now, b"", usize::MAX);
    assert_eq!(everything.len(), 11, "the limit is clamped, not refused");
    assert!(
        h.server
            .inspect_locks(h.now, b"nothing/", 10, ListingCursor::START)
            .locks
            .is_empty()
    );

    // Past LISTING_LIMIT_MAX matches a page stops at the limit.
    for n in 0..=LISTING_LIMIT_MAX {
        h.send(
            conn,
            &acquire(1_000 + n as u64, &[&format!("many/{n:05}")], 0, 30),
        );
    }
    assert_eq!(h.replies(conn).len(), LISTING_LIMIT_MAX + 1);
    let clamped = h
        .server
        .inspect_locks(h.now, b"many/", usize::MAX, ListingCursor::START);
    assert_eq!(clamped.locks.len(), LISTING_LIMIT_MAX);
    assert!(clamped.next.is_some());
    let (many, _) = list_all(&h.server, h.now, b"many/", usize::MAX);
    assert_eq!(many.len(), LISTING_LIMIT_MAX + 1);
}

#[test]
fn a_prefix_that_matches_nothing_in_a_large_table_costs_many_bounded_calls_not_one_walk() {
    let mut h = net();
    // Spread over connections: each may hold 16,384 keys.
    let held = 100_000u64;
    let conns: Vec<ConnId> = (0..8).map(|_| h.connect_from(source(1))).collect();
    for n in 0..held {
        let conn = conns[(n % 8) as usize];
        h.send(conn, &acquire(n + 1, &[&format!("k/{n}")], 0, 250));
        h.granted_token(conn);
    }
    let first = h
        .server
        .inspect_locks(h.now, b"absent/", 10, ListingCursor::START);
    assert!(first.locks.is_empty());
    let next = first
        .next
        .expect("a miss does not scan the whole table in one call");
    // The cursor moved exactly one call's budget of slots.
    let text = next.to_text();
    let budget = LISTING_SLOTS_PER_CALL_MAX.to_string();
    assert_eq!(text.split('.').nth(2), Some(budget.as_str()), "{text}");
    let (found, calls) = list_all(&h.server, h.now, b"absent/", 10);
    assert!(found.is_empty());
    // At least the table's size over the per-call budget: no call examined
    // more than LISTING_SLOTS_PER_CALL_MAX slots.
    assert!(
        calls as u64 >= held.div_ceil(LISTING_SLOTS_PER_CALL_MAX as u64),
        "{calls} calls"
    );
    // And the same scan with a matching prefix lists every key once.
    let (every, _) = list_all(&h.server, h.now, b"k/", LISTING_LIMIT_MAX);
    assert_eq!(every.len() as u64, held);
    let names = sorted_names(&every);
    assert!(names.windows(2).all(|w| w[0] != w[1]), "no key twice");
}

#[test]
fn listing_cursors_parse_only_what_they_print() {
    let page = net()
        .server
        .inspect_locks(Instant::ZERO, b"", 1, ListingCursor::START);
    assert_eq!(page.next, None, "an empty table ends at once");
    let cursor = ListingCursor::parse("c1.1.20.64").unwrap();
    assert_eq!(cursor.to_text(), "c1.1.20.64");
    for bad in [
        "",
        "c1",
        "c1.0.0",
        "c1.0.1.0",
        "c1.0.-1.4",
        "c1.0.+1.4",
        "c1.256.0.0",
        "c2.0.0.0",
        "c1.0.0.0.0",
        "c1.0. 1.4",
        "c1.0.1.99999999999999999999",
    ] {
        assert_eq!(ListingCursor::parse(bad), None, "{bad:?}");
    }
    assert_eq!(ListingCursor::parse(&"9".repeat(100)), None);
}

#[test]
fn force_release_of_a_held_key_with_waiters_hands_over_with_a_larger_token_and_fences_the_old_one()
{
    let mut h = net();
    let (holder, token) = h.holder(source(1), &["orders/42"], 30);
    let front = h.waiter(source(2), &["orders/42"], 20);
    let behind = h.waiter(source(3), &["orders/42"], 20);
    h.advance(Duration::from_millis(250));

    let outcome = h.force_release("orders/42", None);
    let ForceReleaseOutcome::Released {
        revoked,
        keys: released,
        handed_to,
    } = outcome
    else {
        panic!("expected a release, got {outcome:?}");
    };
    assert_eq!(revoked, token);
    assert_eq!(released, vec![key("orders/42")]);
    let new_token = h.granted_token(front);
    assert_eq!(handed_to, Some(new_token));
    assert!(new_token > token, "{new_token} must exceed {token}");
    assert_eq!(h.replies(behind), vec![], "the second waiter still waits");
    let view = h.show("orders/42");
    assert_eq!(view.holder.unwrap().conn, v3(front, source(2)));
    assert_eq!(view.waiters_total, 1);

    // The old holder's release is `N`, and changes nothing.
    h.send(holder, &release(2, &["orders/42"], token));
    assert_eq!(h.replies(holder), vec![Reply::NotFound { rid: 2 }]);
    assert_eq!(h.show("orders/42").holder.unwrap().token, new_token);

    // The new holder releases normally; the next waiter gets a larger token.
    h.send(front, &release(2, &["orders/42"], new_token));
    assert_eq!(h.replies(front), vec![Reply::Released { rid: 2 }]);
    assert!(h.granted_token(behind) > new_token);
}

#[test]
fn a_listing_lists_only_the_front_of_long_queues_and_counts_the_rest() {
    let mut h = net();
    let (_, _) = h.holder(source(1), &["busy"], 30);
    let mut queued = Vec::new();
    for n in 0..WAITERS_PER_LISTED_LOCK_MAX + 5 {
        queued.push(h.waiter(source(2), &["busy"], 20));
        h.advance(Duration::from_millis(n as u64 + 1));
    }
    let listing = h.server.inspect_locks(h.now, b"", 10, ListingCursor::START);
    let lock = &listing.locks[0];
    assert_eq!(lock.waiters_total, WAITERS_PER_LISTED_LOCK_MAX + 5);
    let front: Vec<_> = lock.waiters.iter().map(|w| w.conn.clone()).collect();
    let expected: Vec<_> = queued[..WAITERS_PER_LISTED_LOCK_MAX]
        .iter()
        .map(|&conn| v3(conn, source(2)))
        .collect();
    assert_eq!(front, expected);
    // One key shows them all.
    assert_eq!(
        h.show("busy").waiters.len(),
        WAITERS_PER_LISTED_LOCK_MAX + 5
    );
}

#[test]
fn force_release_with_the_right_token_releases_and_with_another_is_a_mismatch() {
    let mut h = net();
    let (_, token) = h.holder(source(1), &["k"], 30);
    assert_eq!(
        h.force_release("k", Some(token + 1)),
        ForceReleaseOutcome::TokenMismatch { held: token }
    );
    assert_eq!(h.show("k").holder.unwrap().token, token, "nothing changed");
    assert_eq!(h.server.metrics().lock.force_releases, 0);
    assert_eq!(
        h.force_release("k", Some(token)),
        ForceReleaseOutcome::Released {
            revoked: token,
            keys: vec![key("k")],
            handed_to: None,
        }
    );
    assert_eq!(
        h.server.inspect_lock(h.now, &key("k")),
        None,
        "the key is free"
    );
    assert_eq!(h.force_release("k", None), ForceReleaseOutcome::NotHeld);
    assert_eq!(
        h.force_release("never", Some(1)),
        ForceReleaseOutcome::NotHeld
    );
}

#[test]
fn force_release_of_a_set_releases_it_whole() {
    let mut h = net();
    let (holder, token) = h.holder(source(1), &["x", "y"], 30);
    let waiter = h.waiter(source(2), &["y"], 10);
    assert_eq!(h.server.held_keys(holder), 2);
    let outcome = h.force_release("x", None);
    let new_token = h.granted_token(waiter);
    // The revoked grant no longer counts against its holder's cap; the
    // handed-over key counts for the waiter.
    assert_eq!(h.server.held_keys(holder), 0);
    assert_eq!(h.server.held_keys(waiter), 1);
    assert_eq!(
        outcome,
        ForceReleaseOutcome::Released {
            revoked: token,
            keys: vec![key("x"), key("y")],
            handed_to: None,
        },
        "x itself went free; y went to its waiter"
    );
    assert!(new_token > token);
    assert_eq!(h.server.inspect_lock(h.now, &key("x")), None);
    assert_eq!(h.show("y").holder.unwrap().token, new_token);
    h.send(holder, &release(2, &["x", "y"], token));
    assert_eq!(h.replies(holder), vec![Reply::NotFound { rid: 2 }]);
}

#[test]
fn force_release_is_counted_and_reported_as_a_log_event() {
    let mut h = net();
    let (_, token) = h.holder(source(1), &["k"], 30);
    let waiter = h.waiter(source(2), &["k"], 10);
    h.outputs.logs(&mut h.server, h.now);
    let before = h.server.metrics().lock;
    h.force_release("k", None);
    let new_token = h.granted_token(waiter);
    let after = h.server.metrics().lock;
    assert_eq!(after.force_releases, before.force_releases + 1);
    assert_eq!(after.releases, before.releases + 1, "it is a release");
    assert_eq!(after.handovers_on_release, before.handovers_on_release + 1);
    let logs: Vec<LogEvent> = h.outputs.logs(&mut h.server, h.now);
    assert_eq!(
        logs,
        vec![LogEvent::ForceReleased {
            keys: vec![key("k")],
            revoked: token,
            handed_to: Some(new_token),
        }]
    );
    // Refusals are neither counted nor logged.
    h.force_release("k", Some(token));
    h.force_release("free", None);
    assert_eq!(h.server.metrics().lock.force_releases, after.force_releases);
    assert_eq!(h.outputs.logs(&mut h.server, h.now), vec![]);
}

#[test]
fn the_access_rule_table() {
    use AdminAccess::{Allow, Forbidden, Redacted, Unauthorized};
    let right = "admin-token-0123456789";
    let tokens = AdminTokens::new(["other-admin-token-xyz", right]).unwrap();
    let right_header = format!("Bearer {right}");
    let cases: [(&str, Option<&[u8]>); 6] = [
        ("none", None),
        ("malformed: no scheme", Some(right.as_bytes())),
        ("malformed: basic", Some(b"Basic YWRtaW46eA==")),
        ("malformed: empty bearer", Some(b"Bearer ")),
        ("wrong", Some(b"Bearer not-the-admin-token-at-all")),
        ("right", Some(right_header.as_bytes())),
    ];
    // (loopback, endpoint) → the expected verdict of each case above.
    let table = [
        (
            true,
            AdminEndpoint::Read,
            [
                Redacted,
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Forbidden,
                Allow,
            ],
        ),
        (
            false,
            AdminEndpoint::Read,
            [
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Forbidden,
                Allow,
            ],
        ),
        (
            true,
            AdminEndpoint::Write,
            [
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Forbidden,
                Allow,
            ],
        ),
        (
            false,
            AdminEndpoint::Write,
            [
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Unauthorized,
                Forbidden,
                Allow,
            ],
        ),
        (true, AdminEndpoint::Health, [Allow; 6]),
        (false, AdminEndpoint::Health, [Allow; 6]),
    ];
    for (loopback, endpoint, expected) in table {
        for ((name, header), want) in cases.iter().zip(expected) {
            assert_eq!(
                admin_access(loopback, &tokens, *header, endpoint),
                want,
                "loopback={loopback} {endpoint:?} token {name}"
            );
        }
    }
    // The scheme is case-insensitive; without configured tokens no token
    // is right.
    let lower = format!("bearer {right}");
    assert_eq!(
        admin_access(false, &tokens, Some(lower.as_bytes()), AdminEndpoint::Write),
        Allow
    );
    let none = AdminTokens::default();
    assert_eq!(
        admin_access(
            true,
            &none,
            Some(right_header.as_bytes()),
            AdminEndpoint::Write
        ),
        Forbidden
    );
}

#[test]
fn a_host_is_served_only_when_it_names_the_listener_itself_or_an_allowed_name() {
    let loopback: SocketAddr = "127.0.0.1:9225".parse().unwrap();
    let public: SocketAddr = "10.1.2.3:9225".parse().unwrap();
    let v6: SocketAddr = "[::1]:9225".parse().unwrap();
    let allowed: Vec<Box<str>> = vec!["admin.example:9225".into()];
    let yes = |host: &str, local| host_allowed(Some(host.as_bytes()), local, &allowed);
    for (host, local) in [
        ("127.0.0.1:9225", loopback),
        ("localhost:9225", loopback),
        ("LocalHost:9225", loopback),
        ("[::1]:9225", v6),
        ("localhost:9225", v6),
        ("10.1.2.3:9225", public),
        ("Admin.Example:9225", public),
    ] {
        assert!(yes(host, local), "{host} on {local}");
    }
    for (host, local) in [
        // DNS rebinding: the attacker's page names its own host.
        ("evil.example:9225", loopback),
        ("evil.example", loopback),
        ("127.0.0.1:80", loopback),
        ("127.0.0.1", loopback),
        ("localhost:9225", public),
        ("10.1.2.4:9225", public),
        ("admin.example:80", public),
        ("", loopback),
    ] {
        assert!(!yes(host, local), "{host:?} on {local}");
    }
    assert!(!host_allowed(None, loopback, &allowed), "no Host at all");
    assert!(!host_allowed(Some(b"\xff:9225"), loopback, &allowed));
}

#[test]
fn refusals_are_all_counted_and_logged_at_most_once_a_second_with_the_count_left_out() {
    let refusals = AdminRefusals::default();
    assert_eq!(refusals.note(AdminRefusal::Forbidden, 5_000), Some(0));
    for ms in 5_001..5_999 {
        assert_eq!(refusals.note(AdminRefusal::Forbidden, ms), None);
    }
    assert_eq!(refusals.note(AdminRefusal::BadHost, 5_999), None);
    assert_eq!(
        refusals.note(AdminRefusal::Unauthorized, 6_000),
        Some(999),
        "a second later: one line naming the 999 not logged"
    );
    assert_eq!(refusals.count(AdminRefusal::Forbidden), 999);
    assert_eq!(refusals.count(AdminRefusal::BadHost), 1);
    assert_eq!(refusals.count(AdminRefusal::Unauthorized), 1);
    assert_eq!(refusals.count(AdminRefusal::TimedOut), 0);
    // A clock that reads 0 still logs the first refusal.
    assert_eq!(
        AdminRefusals::default().note(AdminRefusal::TimedOut, 0),
        Some(0)
    );
}

#[test]
fn admin_tokens_shorter_than_sixteen_bytes_are_refused_by_position() {
    let err = AdminTokens::new(["long-enough-admin-token", "short"]).unwrap_err();
    assert_eq!((err.index, err.len), (1, 5));
    assert!(AdminTokens::new(["exactly-16-bytes"]).is_ok());
}

#[test]
fn a_set_that_ended_leaves_no_group_behind_for_the_next_grants_on_its_keys() {
    let mut h = net();
    let (holder, token) = h.holder(source(1), &["a", "b"], 1);
    h.send(holder, &release(2, &["a", "b"], token));
    assert_eq!(h.replies(holder).len(), 1);
    let (_, set) = h.holder(source(1), &["b", "c"], 1);
    assert_eq!(h.show("c").holder.unwrap().keys, vec![key("b"), key("c")]);
    // The set's lease runs out; the keys are granted again, one alone and
    // one in a new set.
    h.advance(Duration::from_millis(1_500));
    let (_, alone) = h.holder(source(2), &["b"], 30);
    let (_, pair) = h.holder(source(2), &["c", "d"], 30);
    assert!(alone > set && pair > alone);
    assert_eq!(h.show("b").holder.unwrap().keys, vec![key("b")]);
    for name in ["c", "d"] {
        let shown = h.show(name).holder.unwrap();
        assert_eq!((shown.token, shown.keys), (pair, vec![key("c"), key("d")]));
    }
    assert_eq!(
        h.force_release("d", None),
        ForceReleaseOutcome::Released {
            revoked: pair,
            keys: vec![key("c"), key("d")],
            handed_to: None,
        }
    );
}
