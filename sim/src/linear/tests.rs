//! The linearizability checker's own tests: small hand-written histories
//! of one key, each legal or not by one rule of the model (grants, force
//! releases, renewals, restarts, indeterminate operations). Apart from the
//! checker so that its file stays about the model and the search.

use super::*;

fn entry(invoke_us: u64, respond_us: u64, op: LinOp) -> LinEntry {
    LinEntry {
        invoke_us,
        respond_us,
        op,
    }
}

const LEASE: u64 = 1_000;

#[test]
fn a_force_release_frees_the_key_and_fences_the_old_token() {
    let granted = |token| LinOp::Granted {
        token,
        lease_min_us: 10_000_000,
    };
    // Revoked at 20: the next grant may come before the lease ends, and
    // the old holder's release is `N`.
    let fenced = [
        entry(0, 10, granted(5)),
        entry(20, 20, LinOp::ForceReleased { token: 5 }),
        entry(30, 40, granted(6)),
        entry(50, 60, LinOp::NotFound { token: 5 }),
    ];
    assert_eq!(check(&fenced), LinResult::Ok);
    // Its release cannot succeed after the revocation.
    let released = [
        entry(0, 10, granted(5)),
        entry(20, 20, LinOp::ForceReleased { token: 5 }),
        entry(50, 60, LinOp::Released { token: 5 }),
    ];
    assert_eq!(check(&released), LinResult::Violation);
    // Nor can a key be force-released from a token that does not hold it.
    let wrong = [
        entry(0, 10, granted(5)),
        entry(20, 20, LinOp::ForceReleased { token: 4 }),
    ];
    assert_eq!(check(&wrong), LinResult::Violation);
    // Without the force-release the second grant overlaps the lease.
    let overlap = [entry(0, 10, granted(5)), entry(30, 40, granted(6))];
    assert_eq!(check(&overlap), LinResult::Violation);
}

#[test]
fn a_renewal_keeps_the_key_and_only_its_holder_may_renew() {
    let granted = |token| LinOp::Granted {
        token,
        lease_min_us: LEASE,
    };
    let extended = |token| LinOp::Extended {
        token,
        lease_min_us: LEASE,
    };
    // Renewed at 900: a grant to another at 1_500 overlaps the lease.
    let renewed = [
        entry(0, 10, granted(5)),
        entry(900, 910, extended(5)),
        entry(1_500, 1_510, granted(6)),
    ];
    assert_eq!(check(&renewed), LinResult::Violation);
    // After the renewed lease it is fine.
    let later = [
        entry(0, 10, granted(5)),
        entry(900, 910, extended(5)),
        entry(2_000, 2_010, granted(6)),
    ];
    assert_eq!(check(&later), LinResult::Ok);
    // A grant handed on cannot be renewed by its old token...
    let stale = [
        entry(0, 10, granted(5)),
        entry(1_500, 1_510, granted(6)),
        entry(1_600, 1_610, extended(5)),
    ];
    assert_eq!(check(&stale), LinResult::Violation);
    // ...nor a released one; `N` is its answer.
    let released = [
        entry(0, 10, granted(5)),
        entry(20, 30, LinOp::Released { token: 5 }),
        entry(40, 50, extended(5)),
    ];
    assert_eq!(check(&released), LinResult::Violation);
    let refused = [
        entry(0, 10, granted(5)),
        entry(20, 30, LinOp::Released { token: 5 }),
        entry(40, 50, LinOp::NotFound { token: 5 }),
    ];
    assert_eq!(check(&refused), LinResult::Ok);
    // An indeterminate renewal may have had no effect at all.
    let unknown = [
        entry(0, 10, granted(5)),
        entry(
            900,
            u64::MAX,
            LinOp::ExtendIndeterminate {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(1_500, 1_510, granted(6)),
    ];
    assert_eq!(check(&unknown), LinResult::Ok);
}

#[test]
fn sequential_grants_and_releases_are_linearizable() {
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(20, 30, LinOp::Released { token: 5 }),
        entry(
            40,
            50,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
        entry(60, 70, LinOp::NotFound { token: 5 }),
    ];
    assert_eq!(check(&history), LinResult::Ok);
}

#[test]
fn two_overlapping_live_grants_are_not() {
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(
            20,
            30,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Violation);
    // After the lease has run out the second grant is fine.
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(
            2_000,
            2_010,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Ok);
}

#[test]
fn tokens_must_rise_even_across_a_restart() {
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
        entry(20, 20, LinOp::Restart),
        entry(
            30,
            40,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Violation);
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(20, 20, LinOp::Restart),
        entry(
            30,
            40,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Ok);
}

#[test]
fn an_indeterminate_acquire_may_block_or_not() {
    // It may have taken effect and blocked until its lease ran out...
    let history = [
        entry(
            0,
            u64::MAX,
            LinOp::AcquireIndeterminate {
                lease_min_us: LEASE,
            },
        ),
        entry(
            5_000,
            5_010,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Ok);
    // ...but a release of a token nobody was granted is never `R`.
    let history = [
        entry(
            0,
            u64::MAX,
            LinOp::AcquireIndeterminate {
                lease_min_us: LEASE,
            },
        ),
        entry(50, 60, LinOp::Released { token: 9 }),
    ];
    assert_eq!(check(&history), LinResult::Violation);
}

#[test]
fn a_concurrent_release_orders_either_way() {
    // The release of 5 overlaps the grant of 6: it must go first.
    let history = [
        entry(
            0,
            10,
            LinOp::Granted {
                token: 5,
                lease_min_us: LEASE,
            },
        ),
        entry(20, 40, LinOp::Released { token: 5 }),
        entry(
            25,
            35,
            LinOp::Granted {
                token: 6,
                lease_min_us: LEASE,
            },
        ),
    ];
    assert_eq!(check(&history), LinResult::Ok);
}
