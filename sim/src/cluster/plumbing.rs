//! Plumbing: the event queue, pipes between processes, and bytes in flight.

use super::*;

impl<'t> ClusterWorld<'t> {
    pub(super) fn schedule(&mut self, at_us: u64, ev: Ev) {
        self.queue.push(at_us, ev);
    }

    pub(super) fn net_delay(&mut self) -> u64 {
        net::delay(&self.config.base, &mut self.net)
    }

    pub(super) fn node_now(&self, slot: u8) -> ticketing_core::time::Instant {
        instant(self.nodes[usize::from(slot)].clock.local(self.now_us))
    }

    pub(super) fn nonce(&mut self) -> [u8; 16] {
        net::nonce(&mut self.net, 2)
    }

    /// Whether a peer pipe's direction `dir` is cut now.
    pub(super) fn is_cut(&self, pipe: &Pipe, dir: u8) -> bool {
        let Opener::Node { slot: a, .. } = pipe.opener else {
            return false;
        };
        let (from, to) = if dir == 0 {
            (a, pipe.b_slot)
        } else {
            (pipe.b_slot, a)
        };
        self.cut[usize::from(from)][usize::from(to)] > 0
    }

    /// Sends `bytes` on `pipe` in direction `dir`, split at random byte
    /// boundaries into chunks that arrive in order.
    pub(super) fn send(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset || bytes.is_empty() {
            return;
        }
        if pipe.peer() && self.adversary.rates.active() {
            self.tap(pipe_id, dir, &bytes);
        }
        self.transmit(pipe_id, dir, bytes);
    }

    /// The outsider on an honest peer link: maybe writes a forged or
    /// replayed frame before `bytes` (at a frame boundary), then follows
    /// them.
    pub(super) fn tap(&mut self, pipe_id: u64, dir: u8, bytes: &[u8]) {
        let tap = self.adversary.taps.entry((pipe_id, dir)).or_default();
        let boundary = tap.at_boundary();
        let from = tap.hello().map(|hello| hello.from);
        let inject_ppm = self.adversary.rates.inject_ppm;
        if self.phase == Phase::Safety
            && boundary
            && inject_ppm > 0
            && self.adversary.rng.chance(inject_ppm)
        {
            let to = self
                .adversary
                .taps
                .get(&(pipe_id, 1 - dir))
                .and_then(|tap| tap.hello())
                .map(|hello| hello.from);
            if let (Some(from), Some(to)) = (from, to) {
                let voters = self.adversary_known_ids();
                if let Some((frame, what)) = self.adversary.forge(from, to, voters) {
                    self.adversary.injected += 1;
                    self.rec.report.faults += 1;
                    self.note(|| format!("ADVERSARY writes {what} on pipe {pipe_id} dir {dir}"));
                    self.transmit(pipe_id, dir, frame);
                }
            }
        }
        let tap = self.adversary.taps.entry((pipe_id, dir)).or_default();
        let frames = tap.feed(bytes);
        self.adversary.capture(frames);
    }

    /// The newest identity per slot the outsider saw in a hello.
    pub(super) fn adversary_known_ids(&self) -> Vec<NodeId> {
        let mut ids: BTreeMap<u8, NodeId> = BTreeMap::new();
        for tap in self.adversary.taps.values() {
            if let Some(hello) = tap.hello() {
                let id = ids.entry(hello.from.slot).or_insert(hello.from);
                *id = (*id).max(hello.from);
            }
        }
        ids.into_values().collect()
    }

    /// Puts `bytes` on the wire of `pipe` in direction `dir`.
    pub(super) fn transmit(&mut self, pipe_id: u64, dir: u8, bytes: Vec<u8>) {
        let Some(pipe) = self.pipes.get(&pipe_id) else {
            return;
        };
        if self.is_cut(pipe, dir)
            || pipe.stale[usize::from(dir)]
            || !pipe.held[usize::from(dir)].is_empty()
        {
            // The link drops everything; TCP retransmits after it heals.
            let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
            pipe.held[usize::from(dir)].push(bytes);
            return;
        }
        let pipe = self.pipes.get_mut(&pipe_id).expect("checked above");
        let timed = pipe.tcp.transmit(
            usize::from(dir),
            bytes,
            self.now_us,
            &self.config.base,
            &mut self.net,
        );
        for (arrival, bytes) in timed {
            let pipe = pipe_id;
            self.schedule(arrival, Ev::Deliver { pipe, dir, bytes });
        }
    }

    /// Kills a pipe's transport: in-flight bytes after a random boundary
    /// are lost; each open end learns after the bytes that still reach it.
    pub(super) fn reset_pipe(&mut self, pipe_id: u64) {
        let Some(pipe) = self.pipes.get_mut(&pipe_id) else {
            return;
        };
        if pipe.tcp.reset {
            return;
        }
        pipe.held = [Vec::new(), Vec::new()];
        let open = pipe.open;
        let seen = pipe
            .tcp
            .reset(open, self.now_us, &self.config.base, &mut self.net);
        for side in 0..2u8 {
            if let Some(at) = seen[usize::from(side)] {
                self.schedule(
                    at,
                    Ev::SeesClose {
                        pipe: pipe_id,
                        side,
                    },
                );
            }
        }
        self.drop_pipe_if_done(pipe_id);
    }

    pub(super) fn drop_pipe_if_done(&mut self, pipe_id: u64) {
        if let Some(pipe) = self.pipes.get(&pipe_id)
            && pipe.tcp.reset
            && !pipe.dialing
            && !pipe.open[0]
            && !pipe.open[1]
        {
            self.pipes.remove(&pipe_id);
        }
    }

    pub(super) fn new_pipe(&mut self, opener: Opener, b_slot: u8) -> u64 {
        let id = self.next_pipe;
        self.next_pipe += 1;
        let b_inc = self.nodes[usize::from(b_slot)].inc;
        self.pipes.insert(
            id,
            Pipe {
                opener,
                b_slot,
                b_inc,
                ids: [None, None],
                tcp: Tcp::new(),
                open: [!matches!(opener, Opener::Node { .. }), false],
                held: [Vec::new(), Vec::new()],
                stale: [false; 2],
                fin_stale: [false; 2],
                held_for_client: Vec::new(),
                close_held: false,
                writing: [false, false],
                dialing: matches!(opener, Opener::Node { .. }),
                oracle: StreamOracle::new(),
                unflushed_grants: Vec::new(),
            },
        );
        id
    }
}
