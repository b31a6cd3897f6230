//! Partitions: peer links cut one way or both, an isolated leader, healing.

use super::*;

impl<'t> ClusterWorld<'t> {
    pub(super) fn partition(&mut self, links: Vec<(u8, u8)>, what: String) {
        let id = self.next_partition;
        self.next_partition += 1;
        for &(from, to) in &links {
            self.cut[usize::from(from)][usize::from(to)] += 1;
        }
        self.note(|| format!("FAULT partition {id}: {what}"));
        self.partitions.insert(id, links);
        let max = self.config.faults.partition_max_us.max(300_000);
        let at = self.now_us + self.fault_rng.range(100_000, max);
        self.schedule(at, Ev::Heal { id });
        // Some connections over a cut link time out (TCP user timeout).
        let affected: Vec<u64> = self
            .pipes
            .iter()
            .filter(|(_, pipe)| pipe.peer() && !pipe.tcp.reset)
            .filter(|(_, pipe)| self.is_cut(pipe, 0) || self.is_cut(pipe, 1))
            .map(|(&id, _)| id)
            .collect();
        for pipe_id in affected {
            if self.fault_rng.chance(300_000) {
                self.reset_pipe(pipe_id);
            }
        }
    }

    /// Cuts `slot` off from every other node, both ways (`what` names it in
    /// the notes).
    pub(super) fn isolate(&mut self, slot: u8, what: String) {
        let links = (0..self.n)
            .filter(|&other| other != slot)
            .flat_map(|other| [(slot, other), (other, slot)])
            .collect();
        self.partition(links, what);
    }

    pub(super) fn heal(&mut self, id: u64) {
        let Some(links) = self.partitions.remove(&id) else {
            return;
        };
        self.note(|| format!("partition {id} heals"));
        for (from, to) in links {
            self.cut[usize::from(from)][usize::from(to)] -= 1;
        }
        let pipes: Vec<u64> = self.pipes.keys().copied().collect();
        for pipe_id in pipes {
            for dir in 0..2u8 {
                let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
                    continue;
                };
                if pipe.held[usize::from(dir)].is_empty() || self.is_cut(&self.pipes[&pipe_id], dir)
                {
                    continue;
                }
                let (peer, stale) = {
                    let pipe = &self.pipes[&pipe_id];
                    (pipe.peer(), pipe.stale[usize::from(dir)])
                };
                if peer && !stale && self.fault_rng.chance(STALE_PPM) {
                    let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                    pipe.stale[usize::from(dir)] = true;
                    self.rec.report.faults += 1;
                    self.note(|| {
                        format!("FAULT pipe {pipe_id} dir {dir} stays stale after the heal")
                    });
                    let at = self.now_us + STALE_US;
                    self.schedule(at, Ev::Retransmit { pipe: pipe_id, dir });
                    continue;
                }
                if self.pipes[&pipe_id].stale[usize::from(dir)] {
                    continue;
                }
                let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
                let held = std::mem::take(&mut pipe.held[usize::from(dir)]);
                for chunk in held {
                    self.send(pipe_id, dir, chunk);
                }
            }
        }
    }

    /// A stale direction's retransmission gets through: its held bytes
    /// arrive, then a close that waited behind them.
    pub(super) fn retransmit(&mut self, pipe_id: u64, dir: u8) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        pipe.stale[usize::from(dir)] = false;
        let fin = std::mem::take(&mut pipe.fin_stale[usize::from(dir)]);
        if fin {
            let other = if dir == 0 { 1 } else { 0 };
            if pipe.open[usize::from(other)] {
                let at = self.now_us + 1;
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side: other,
                    },
                );
            }
            return;
        }
        if self.is_cut(&self.pipes[&pipe_id], dir) {
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        let held = std::mem::take(&mut pipe.held[usize::from(dir)]);
        for chunk in held {
            self.send(pipe_id, dir, chunk);
        }
    }
}
