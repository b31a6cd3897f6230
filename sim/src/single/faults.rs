//! Faults: restarts, resets, pauses and clock jumps.

use super::*;

impl<'t> World<'t> {
    /// An operator force-releases a key held now, with its holder's token
    /// (three times in four), none, or a stale one. The outcome is checked
    /// against the lock table; a release ends the grant for every checker
    /// (the key is free in the history model, leases ended early: a new
    /// lease era), and the old holder's later release must get `N`.
    pub(super) fn fault_force_release(&mut self) {
        let local = self.server_now();
        let held: Vec<(usize, u64)> = (0..ALL_KEYS.len())
            .filter_map(|key| {
                self.holder(key)
                    .filter(|&(_, deadline)| deadline > local)
                    .map(|(token, _)| (key, token))
            })
            .collect();
        if held.is_empty() {
            return;
        }
        let (key, token) = held[self.fault_rng.index(held.len())];
        let asked = match self.fault_rng.below(4) {
            0 => None,
            1 => Some(token - 1),
            _ => Some(token),
        };
        let Some(proc) = self.server.as_mut() else {
            return;
        };
        let id = AdminRequestId(self.rec.report.faults);
        let req = ForceRelease {
            key: Key::new(ALL_KEYS[key].as_bytes()).expect("the sim's keys are keys"),
            token: asked,
        };
        proc.server.handle_force_release(instant(local), id, req);
        proc.outputs.drain(&mut proc.server, instant(local));
        let answer = proc.outputs.admin_replies.pop_front();
        self.rec.report.faults += 1;
        let group = self
            .token_groups
            .get(&token)
            .cloned()
            .unwrap_or_else(|| vec![key]);
        let names: Vec<Key> = group
            .iter()
            .map(|&k| Key::new(ALL_KEYS[k].as_bytes()).expect("a key"))
            .collect();
        let releases = asked.is_none_or(|t| t == token);
        match answer {
            Some((
                answered,
                ForceReleaseOutcome::Released {
                    revoked,
                    keys,
                    handed_to,
                },
            )) if answered == id && releases => {
                self.note(|| {
                    format!(
                        "FAULT operator force-releases {} ({asked:?}): token {revoked} revoked, handed to {handed_to:?}",
                        ALL_KEYS[key]
                    )
                });
                if revoked != token || keys != names {
                    self.violation(
                        Checker::Replies,
                        format!(
                            "force-release of {} revoked {revoked} on {keys:?}, but {token} held {names:?}",
                            ALL_KEYS[key]
                        ),
                    );
                }
                self.rec.report.force_releases += 1;
                self.released_tokens.insert(revoked);
                // The grant ends now, before its lease: windows and fenced
                // writes are judged within a new era.
                self.lease_era += 1;
                self.history
                    .mark(self.now_us, &group, LinOp::ForceReleased { token: revoked });
            }
            Some((answered, ForceReleaseOutcome::TokenMismatch { held }))
                if answered == id && !releases =>
            {
                self.note(|| {
                    format!(
                        "FAULT operator force-releases {} with stale token {asked:?}: held by {held}",
                        ALL_KEYS[key]
                    )
                });
                self.rec.report.force_releases_refused += 1;
                if held != token {
                    self.violation(
                        Checker::Replies,
                        format!(
                            "force-release of {} with stale {asked:?} says {held} holds it, but {token} does",
                            ALL_KEYS[key]
                        ),
                    );
                }
            }
            answer => self.violation(
                Checker::Replies,
                format!(
                    "force-release of {} held by {token} with {asked:?} answered {answer:?}",
                    ALL_KEYS[key]
                ),
            ),
        }
        self.server_step(Vec::new());
    }

    pub(super) fn crash_server(&mut self) {
        let epoch = self.server.as_ref().map_or(0, |proc| proc.epoch);
        self.note(|| format!("FAULT server epoch {epoch} crashes; restarts from nothing"));
        self.server = None;
        self.lease_era += 1;
        self.pending.clear();
        self.shadow.iter_mut().for_each(|slot| *slot = None);
        self.history.mark_all(self.now_us, LinOp::Restart);
        let conns: Vec<u64> = self.conns.keys().copied().collect();
        for conn_id in conns {
            if let Some(conn) = self.conns.get_mut(&conn_id) {
                conn.server_open = false;
                conn.unflushed_grants.clear();
                conn.untaken_grants.clear();
            }
            self.reset_conn(conn_id);
        }
        let at = self.now_us + self.fault_rng.range(50_000, 2_000_000);
        self.schedule(at, Ev::ServerStart);
    }
}
