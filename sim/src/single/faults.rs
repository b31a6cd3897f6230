//! Faults: restarts, resets, pauses and clock jumps.

use super::*;

impl<'t> World<'t> {
    /// An operator force-releases a key held now, with its holder's token
    /// (three times in four), none, or a stale one. The outcome is checked
    /// against the lock table; a release ends the grant for every checker
    /// (the key is free in the history model, leases ended early: a new
    /// lease era), and the old holder's later release must get `N`.
    pub(super) fn fault_force_release(&mut self) {
        let held = self.live_holders();
        if held.is_empty() {
            return;
        }
        let (key, token) = held[self.fault_rng.index(held.len())];
        let asked = match self.fault_rng.below(4) {
            0 => None,
            1 => Some(token - 1),
            _ => Some(token),
        };
        let id = AdminRequestId(self.rec.report.faults);
        let Some(answer) = self.ask_force_release(id, key, asked) else {
            return;
        };
        self.rec.report.faults += 1;
        let order = ForceReleaseOrder {
            id,
            key,
            token,
            asked,
        };
        self.check_force_release_answer(&order, answer);
        self.server_step(Vec::new());
    }

    /// Every key whose lease runs now on the server's clock, with its
    /// holder's token, in key order.
    fn live_holders(&self) -> Vec<(usize, u64)> {
        let local = self.server_now();
        (0..ALL_KEYS.len())
            .filter_map(|key| {
                self.holder(key)
                    .filter(|&(_, deadline)| deadline > local)
                    .map(|(token, _)| (key, token))
            })
            .collect()
    }

    /// Hands the server force-release `id` of `key` naming `asked`, and
    /// takes what it answered; none if the server is down.
    fn ask_force_release(
        &mut self,
        id: AdminRequestId,
        key: usize,
        asked: Option<u64>,
    ) -> Option<AdminAnswer> {
        let local = self.server_now();
        let proc = self.server.as_mut()?;
        let req = ForceRelease {
            key: Key::new(ALL_KEYS[key].as_bytes()).expect("the sim's keys are keys"),
            token: asked,
        };
        proc.server.handle_force_release(instant(local), id, req);
        proc.outputs.drain(&mut proc.server, instant(local));
        Some(proc.outputs.admin_replies.pop_front())
    }

    /// Checks the server's `answer` to `order`: with the holder's token or
    /// none, the grant is revoked on every key of its group; with a stale
    /// token, it is refused naming the holder; anything else is wrong.
    fn check_force_release_answer(&mut self, order: &ForceReleaseOrder, answer: AdminAnswer) {
        let ForceReleaseOrder {
            id,
            key,
            token,
            asked,
        } = *order;
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
                self.force_released(order, revoked, keys, handed_to);
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
    }

    /// The server revoked grant `revoked` on `keys` for `order`, and
    /// handed the key to `handed_to`: it must be the holder's grant on its
    /// whole group, which ends now for every checker.
    fn force_released(
        &mut self,
        order: &ForceReleaseOrder,
        revoked: u64,
        keys: Vec<Key>,
        handed_to: Option<u64>,
    ) {
        let ForceReleaseOrder {
            key, token, asked, ..
        } = *order;
        let group = self
            .token_groups
            .get(&token)
            .cloned()
            .unwrap_or_else(|| vec![key]);
        let names: Vec<Key> = group
            .iter()
            .map(|&k| Key::new(ALL_KEYS[k].as_bytes()).expect("a key"))
            .collect();
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

/// An operator's force-release as drawn: its request id, the key, the
/// token holding it, and the token named (`None`: any holder).
#[derive(Clone, Copy)]
struct ForceReleaseOrder {
    id: AdminRequestId,
    key: usize,
    token: u64,
    asked: Option<u64>,
}

/// The server's answer to a force-release, if it gave one at once.
type AdminAnswer = Option<(AdminRequestId, ForceReleaseOutcome)>;
