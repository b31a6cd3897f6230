//! Line clients (a model of the published 0.3.0 clients, the line dialect)
//! beside v3 clients on the same keys, single and cluster: every checker
//! holds with both dialects in one history, runs stay pure functions of
//! their seeds, and a line client resends its request after a close.

use ticketing_sim::{Knobs, RunReport, SimConfig};

/// No violation in `report`, a run of the world `knobs` make of its seed
/// (named in full in the replay line).
fn assert_clean(report: &RunReport, knobs: &Knobs) {
    assert!(
        report.violations.is_empty(),
        "seed {} violated: {:#?}\nreplay: {}",
        report.seed,
        report.violations,
        knobs.replay_command(report.seed)
    );
}

/// Worlds whose only fault is a server crash (frequent), with one v3
/// client and two line clients.
fn crash_only() -> Knobs {
    Knobs {
        v3_clients: Some(1),
        line_clients: Some(2),
        server_crashes_only_ppm: Some(300_000),
        ..Knobs::default()
    }
}

/// 200 swarm worlds, each with one or two line clients beside its v3
/// clients: clean, deterministic, and the line clients really work.
#[test]
fn line_and_v3_clients_hold_every_invariant_single() {
    let (mut line_grants, mut grants, mut resends, mut lin_keys) = (0, 0, 0, 0);
    for seed in 0..200 {
        let knobs = Knobs {
            line_clients: Some(1 + (seed % 2) as usize),
            ..Knobs::default()
        };
        let report = knobs.run(seed, None);
        assert_clean(&report, &knobs);
        assert_eq!(
            knobs.run(seed, None).trace_hash,
            report.trace_hash,
            "seed {seed} is not deterministic"
        );
        line_grants += report.line_grants;
        grants += report.grants;
        resends += report.line_resends;
        lin_keys += report.lin_keys_checked;
    }
    assert!(line_grants > 500, "only {line_grants} line grants");
    assert!(
        grants > line_grants + 1_000,
        "v3 clients got only {} grants",
        grants - line_grants
    );
    assert!(resends > 10, "only {resends} line resends");
    assert!(lin_keys > 500, "only {lin_keys} key histories checked");
}

/// Three- and five-node swarm worlds with two line clients: clean and
/// deterministic; line clients are redirected (`M`, `Eno_leader`) and
/// resend after closes.
#[test]
fn line_and_v3_clients_hold_every_invariant_cluster() {
    let (mut line_grants, mut resends, mut redirects) = (0, 0, 0);
    for (nodes, seeds) in [(3u8, 0..30u64), (5, 0..8)] {
        for seed in seeds {
            let knobs = Knobs {
                cluster: Some(nodes),
                line_clients: Some(2),
                ..Knobs::default()
            };
            let report = knobs.run(seed, None);
            assert_clean(&report, &knobs);
            assert_eq!(
                knobs.run(seed, None).trace_hash,
                report.trace_hash,
                "seed {seed} ({nodes} nodes) is not deterministic"
            );
            line_grants += report.line_grants;
            resends += report.line_resends;
            redirects += report.line_redirects;
        }
    }
    assert!(line_grants > 100, "only {line_grants} line grants");
    assert!(resends > 0, "no line resend");
    assert!(redirects > 10, "only {redirects} line redirects");
}

/// With server crashes the only fault, every line resend follows a crash:
/// the resent requests are answered (the liveness checker requires every
/// call to end) and the histories of both dialects stay linearizable.
#[test]
fn a_line_client_resends_after_a_server_crash() {
    let (mut resends, mut line_grants) = (0, 0);
    let knobs = crash_only();
    for seed in 0..40 {
        let report = knobs.run(seed, None);
        assert_clean(&report, &knobs);
        assert!(report.faults > 0, "seed {seed}: no crash");
        resends += report.line_resends;
        line_grants += report.line_grants;
    }
    assert!(resends > 10, "only {resends} resends after server crashes");
    assert!(line_grants > 100, "only {line_grants} line grants");
}

/// In a trace: a server crash, then a line connection closing with an
/// acquire to resend, then that very owner answered (`A` or `T`) on a
/// later connection of the same client.
fn resend_after_crash_in(trace: &str) -> Option<String> {
    let lines: Vec<&str> = trace.lines().collect();
    let crash = lines
        .iter()
        .position(|line| line.contains("server epoch") && line.contains("crashes"))?;
    for (at, line) in lines.iter().enumerate().skip(crash) {
        let Some((head, owner)) = line.split_once("to resend: owner ") else {
            continue;
        };
        let owner = owner.split_whitespace().next()?;
        // "client 5 line 11 closed; …"
        let mut words = head.split_whitespace().skip_while(|word| *word != "client");
        let client = words.nth(1)?;
        let conn = words.nth(1)?;
        let answered = lines[at..].iter().find(|later| {
            later.contains(&format!("client {client} line "))
                && !later.contains(&format!("line {conn}:"))
                && (later.contains(": A token") || later.contains(": T owner"))
                && later.contains(&format!("owner {owner} "))
        });
        if let Some(answered) = answered {
            return Some(format!("{line}\n{answered}"));
        }
    }
    None
}

/// A traced world shows the resend itself: after a server crash, a line
/// client resends an acquire (same owner) on a new connection and gets its
/// answer there.
#[test]
fn a_resent_acquire_is_answered_on_the_new_connection() {
    let knobs = crash_only();
    let found = (0..40).find_map(|seed| {
        let mut out = Vec::new();
        let report = knobs.run(seed, Some(&mut out));
        assert_clean(&report, &knobs);
        resend_after_crash_in(&String::from_utf8_lossy(&out))
    });
    let shown = found.expect("no resend after a server crash answered in 40 seeds");
    assert!(shown.contains("to resend: owner 0x"), "{shown}");
}

/// Worlds without line clients are untouched by them: no line grant, no
/// resend, and the default configuration does include one.
#[test]
fn line_clients_are_a_knob() {
    let knobs = Knobs {
        line_clients: Some(0),
        ..Knobs::default()
    };
    let report = knobs.run(7, None);
    assert_clean(&report, &knobs);
    assert_eq!((report.line_grants, report.line_resends), (0, 0));
    assert_eq!(SimConfig::default().line_clients, 1);
    let with_line = (0..100)
        .filter(|&seed| SimConfig::swarm(seed).line_clients > 0)
        .count();
    assert!(
        (50..=95).contains(&with_line),
        "{with_line} of 100 swarm worlds have line clients"
    );
}
