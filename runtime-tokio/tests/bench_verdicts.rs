//! The benchmark scripts' verdicts (`scripts/bench-lib.sh`): a goal is
//! "met" only by a figure that meets it; a missing or unparsable figure is
//! "no figure" and fails the script at its end.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Numbers each call's work directory (the tests run in parallel).
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Runs `body` in bash with `scripts/bench-lib.sh` sourced and `$work` a
/// fresh directory, as the bench scripts have it.
fn bash(body: &str) -> Output {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench-lib.sh");
    let work = std::env::temp_dir().join(format!(
        "ticketing-verdicts-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&work).expect("work dir");
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!("set -u; source \"$1\"; work=\"$2\"; {body}"))
        .arg("bash")
        .arg(&lib)
        .arg(&work)
        .output()
        .expect("bash runs");
    let _ = std::fs::remove_dir_all(&work);
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn figures_meet_or_miss_their_goals() {
    let output = bash(
        r#"verdict 1.9 '<=' 2.0; verdict 2.1 '<=' 2.0; verdict 250001 '>=' 250000;
           verdict 9999 '<' 10000; verdict 10000 '<' 10000; verdict 1.00000e+06 '<' 10000;
           verdict 2.5e+05 '>=' 250000; verdicts_complete"#,
    );
    assert_eq!(
        stdout(&output),
        "met\nNOT met\nmet\nmet\nNOT met\nNOT met\nmet\n"
    );
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn a_missing_figure_is_no_figure_and_fails_the_script() {
    for figure in ["", "abc", "1.2.3", "-nan", "inf", " ", "1e", "e5"] {
        let output = bash(&format!(
            r#"echo "$(verdict '{figure}' '<=' 2.0)"; echo "$(verdict 1.0 '<=' 2.0)"; verdicts_complete || exit 1; echo unreachable"#
        ));
        assert_eq!(
            stdout(&output),
            "no figure\nmet\n",
            "figure {figure:?}: {output:?}"
        );
        assert_eq!(output.status.code(), Some(1), "figure {figure:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("1 goal(s) had no figure"),
            "{output:?}"
        );
    }
}
