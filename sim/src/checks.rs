//! Client-side records both worlds keep and check the same way: the
//! per-key history of what clients observed (checked for linearizability
//! at the end of a run) and the validity windows of grants (no two of a key
//! may overlap in true time within one lease era).

use std::fmt::Write as _;

use ticketing_core::client::{Grant, KeySet};

use crate::config::ALL_KEYS;
use crate::linear::{self, LinEntry, LinOp, LinResult};
use crate::run::RunReport;

/// Answers to grants and renewals a world remembers for the deadline
/// checker, at most (clients take theirs at once; a crashed one never does).
pub(crate) const ANSWERED_MAX: usize = 4_096;

/// Where one operation's entries stand: (key, index in that key's history).
pub(crate) type HistRefs = Vec<(usize, usize)>;

pub(crate) fn key_index(bytes: &[u8]) -> usize {
    ALL_KEYS
        .iter()
        .position(|name| name.as_bytes() == bytes)
        .expect("the sim only uses its own keys")
}

pub(crate) fn key_indices(keys: &KeySet) -> Vec<usize> {
    keys.keys()
        .iter()
        .map(|key| key_index(key.as_bytes()))
        .collect()
}

/// What clients observed, per key, in invocation order.
pub(crate) struct History {
    keys: Vec<Vec<LinEntry>>,
}

impl History {
    pub(crate) fn new() -> Self {
        History {
            keys: vec![Vec::new(); ALL_KEYS.len()],
        }
    }

    /// Opens an entry per key at `now_us` (answer unknown for now).
    pub(crate) fn open(&mut self, now_us: u64, keys: &KeySet, op: LinOp) -> HistRefs {
        key_indices(keys)
            .into_iter()
            .map(|key| {
                self.keys[key].push(LinEntry {
                    invoke_us: now_us,
                    respond_us: u64::MAX,
                    op,
                });
                (key, self.keys[key].len() - 1)
            })
            .collect()
    }

    /// Sets the answer of entries; responded at `now_us` unless the answer
    /// is indeterminate.
    pub(crate) fn resolve(
        &mut self,
        now_us: u64,
        hist: &[(usize, usize)],
        map: impl Fn(LinOp) -> LinOp,
    ) {
        for &(key, index) in hist {
            let entry = &mut self.keys[key][index];
            entry.op = map(entry.op);
            entry.respond_us = match entry.op {
                LinOp::AcquireIndeterminate { .. }
                | LinOp::ReleaseIndeterminate { .. }
                | LinOp::ExtendIndeterminate { .. }
                | LinOp::ForceReleaseIndeterminate { .. } => u64::MAX,
                _ => now_us,
            };
        }
    }

    /// Marks entries as certainly without effect: a release of token 0 that
    /// matches nothing and constrains nothing (dropped before checking).
    pub(crate) fn forget(&mut self, hist: &[(usize, usize)]) {
        for &(key, index) in hist {
            let entry = &mut self.keys[key][index];
            entry.op = LinOp::ReleaseIndeterminate { token: 0 };
            entry.respond_us = u64::MAX;
        }
    }

    /// Puts an instantaneous world event (a force-release) into the
    /// history of each of `keys` (indices).
    pub(crate) fn mark(&mut self, now_us: u64, keys: &[usize], op: LinOp) {
        for &key in keys {
            self.keys[key].push(LinEntry {
                invoke_us: now_us,
                respond_us: now_us,
                op,
            });
        }
    }

    /// Puts an instantaneous world event (a restart, a lease cut) into
    /// every key's history.
    pub(crate) fn mark_all(&mut self, now_us: u64, op: LinOp) {
        for history in &mut self.keys {
            history.push(LinEntry {
                invoke_us: now_us,
                respond_us: now_us,
                op,
            });
        }
    }

    /// Checks every key's history against the sequential model, counting
    /// into `report`; keys whose entries all satisfy `trivial` are skipped.
    /// Returns the details of the histories without a linearization.
    pub(crate) fn check(
        &self,
        trivial: impl Fn(&LinOp) -> bool,
        report: &mut RunReport,
    ) -> Vec<String> {
        let mut found = Vec::new();
        for (key, name) in ALL_KEYS.iter().enumerate() {
            let history: Vec<LinEntry> = self.keys[key]
                .iter()
                .copied()
                .filter(|entry| !matches!(entry.op, LinOp::ReleaseIndeterminate { token: 0 }))
                .collect();
            if history.iter().all(|entry| trivial(&entry.op)) {
                continue;
            }
            report.lin_keys_checked += 1;
            match linear::check(&history) {
                LinResult::Ok => {}
                LinResult::Inconclusive => report.lin_inconclusive += 1,
                LinResult::Violation => {
                    let mut detail = format!("history of {name} has no linearization:");
                    for entry in &history {
                        let _ = write!(
                            detail,
                            "\n    [{}, {}] {:?}",
                            entry.invoke_us,
                            if entry.respond_us == u64::MAX {
                                "-".to_string()
                            } else {
                                entry.respond_us.to_string()
                            },
                            entry.op
                        );
                    }
                    found.push(detail);
                }
            }
        }
        found
    }
}

/// A finished validity window: when a client could act on a grant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    pub(crate) start_us: u64,
    pub(crate) end_us: u64,
    /// Which holding this was (windows of one holding never clash).
    pub(crate) holding: u64,
    pub(crate) token: u64,
    /// Lease era: windows are only compared within one.
    pub(crate) era: u64,
}

/// Validity windows per key.
pub(crate) struct Windows {
    keys: Vec<Vec<Window>>,
}

impl Windows {
    pub(crate) fn new() -> Self {
        Windows {
            keys: vec![Vec::new(); ALL_KEYS.len()],
        }
    }

    /// Records `window` for every key of `grant`; returns the details of
    /// every overlap with another holding's window in the same era.
    pub(crate) fn record(&mut self, grant: &Grant, window: Window) -> Vec<String> {
        let mut found = Vec::new();
        for key in key_indices(&grant.keys) {
            let clash = self.keys[key].iter().copied().find(|other| {
                other.era == window.era
                    && other.holding != window.holding
                    && other.start_us < window.end_us
                    && window.start_us < other.end_us
            });
            if let Some(other) = clash {
                found.push(format!(
                    "{}: validity windows overlap: token {} [{}, {}] and token {} [{}, {}]",
                    ALL_KEYS[key],
                    other.token,
                    other.start_us,
                    other.end_us,
                    window.token,
                    window.start_us,
                    window.end_us
                ));
            }
            self.keys[key].push(window);
        }
        found
    }
}
