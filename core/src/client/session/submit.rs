//! Requests: submitting them, the extension negotiation, and handing them out
//! to the transport.

use super::*;
use crate::lock::KeyModes;
use crate::wire::{AcquireSharedRequest, DowngradeRequest, SET_KEYS_MAX};

impl Session {
    /// Queues an acquire of `keys` with `params`, giving up at `deadline`
    /// (normally [`AcquireParams::operation_deadline`] of the logical
    /// acquire, so a retry keeps only the wait that remains). Returns its rid.
    pub fn submit_acquire(
        &mut self,
        now: Instant,
        keys: KeySet,
        params: &AcquireParams,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if let Some((permits, capacity)) = params.permits() {
            return self.submit_permits(now, keys, params, (permits, capacity), deadline);
        }
        if params.modes() != KeyModes::EXCLUSIVE {
            return self.submit_shared(now, keys, params, deadline);
        }
        let request = match params.max_hold_s() {
            None => Request::Acquire(AcquireRequest {
                rid: 0,
                wait_s: params.wait_s(),
                lease_s: params.lease_s(),
                set: keys.is_set(),
                keys: keys.0,
            }),
            Some(max_hold_s) => {
                self.check_granted(
                    Capabilities::EXTEND,
                    "a hold cap (the server did not grant EXTEND)",
                )?;
                Request::AcquireCapped(AcquireCappedRequest {
                    rid: 0,
                    wait_s: params.wait_s(),
                    lease_s: params.lease_s(),
                    max_hold_s,
                    keys: keys.0,
                })
            }
        };
        self.submit(now, request, deadline, params.wait_s())
    }

    /// A semaphore acquire: `keys` is the semaphore's name.
    pub(super) fn submit_permits(
        &mut self,
        now: Instant,
        keys: KeySet,
        params: &AcquireParams,
        (permits, capacity): (u8, u16),
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let [name] = keys.0.keys() else {
            return Err(ClientError::InvalidInput("a semaphore is named by one key"));
        };
        if name.as_bytes().len() > SEMAPHORE_NAME_LEN_MAX {
            return Err(ClientError::InvalidInput(
                "a semaphore name must be at most 122 bytes",
            ));
        }
        self.check_granted(
            Capabilities::PERMITS,
            "semaphores (the server did not grant PERMITS)",
        )?;
        let request = Request::AcquirePermits(PermitsRequest {
            rid: 0,
            wait_s: params.wait_s(),
            lease_s: params.lease_s(),
            max_hold_s: params.max_hold_s().unwrap_or(0),
            permits,
            capacity,
            name: name.clone(),
        });
        self.submit(now, request, deadline, params.wait_s())
    }

    /// An acquire with a mode per key (`Y`).
    fn submit_shared(
        &mut self,
        now: Instant,
        keys: KeySet,
        params: &AcquireParams,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let modes = params.modes().bits();
        if keys.0.len() < SET_KEYS_MAX && modes >> keys.0.len() != 0 {
            return Err(ClientError::InvalidInput(
                "a mode names a key past the last",
            ));
        }
        self.check_granted(
            Capabilities::SHARED,
            "shared locks (the server did not grant SHARED)",
        )?;
        let request = Request::AcquireShared(AcquireSharedRequest {
            rid: 0,
            wait_s: params.wait_s(),
            lease_s: params.lease_s(),
            max_hold_s: params.max_hold_s().unwrap_or(0),
            modes,
            keys: keys.0,
        });
        self.submit(now, request, deadline, params.wait_s())
    }

    /// Queues a downgrade (`D`) of the grant `token` of `keys` (every key
    /// of the grant) from exclusive to shared, giving up at `deadline`;
    /// like a release it counts against
    /// [`SessionConfig::pending_releases_max`]. Returns its rid. Fails with
    /// [`ClientError::Unsupported`], sending nothing, unless the server
    /// granted [`Capabilities::SHARED`] on this session.
    pub fn submit_downgrade(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        self.check_ready_with(
            Capabilities::SHARED,
            "downgrading (the server did not grant SHARED)",
        )?;
        let request = Request::Downgrade(DowngradeRequest {
            rid: 0,
            token,
            keys: keys.0,
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues an exact-token release of `keys`, giving up at `deadline`
    /// (normally [`ReleaseOperation::attempt_deadline`](crate::client::ReleaseOperation::attempt_deadline)). Returns its rid.
    pub fn submit_release(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        let request = Request::Release(ReleaseRequest {
            rid: 0,
            token,
            set: keys.is_set(),
            keys: keys.0,
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues a renewal (`W`) of the grant `token` of `keys` (every key of
    /// the grant) to `lease` from the server's receipt (1..=250 s, rounded
    /// up), giving up at `deadline`; it counts against
    /// [`SessionConfig::pending_releases_max`]. Returns its rid. Fails with
    /// [`ClientError::Unsupported`], sending nothing, unless the server
    /// granted [`Capabilities::EXTEND`] on this session.
    pub fn submit_extend(
        &mut self,
        now: Instant,
        keys: KeySet,
        token: u64,
        lease: Duration,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        if token == 0 {
            return Err(ClientError::InvalidInput("token must not be zero"));
        }
        let lease_s = lease_s(lease)?;
        self.check_ready_with(
            Capabilities::EXTEND,
            "lease renewal (the server did not grant EXTEND)",
        )?;
        let request = Request::Extend(ExtendRequest {
            rid: 0,
            token,
            lease_s,
            keys: keys.0,
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues an observe (`O`) of who holds `name`, giving up at
    /// `deadline`; like a release it counts against
    /// [`SessionConfig::pending_releases_max`]. Returns its rid. Fails with
    /// [`ClientError::Unsupported`], sending nothing, unless the server
    /// granted [`Capabilities::OBSERVE`] on this session.
    pub fn submit_observe(
        &mut self,
        now: Instant,
        name: KeySet,
        deadline: Instant,
    ) -> Result<u64, ClientError> {
        let [name] = name.0.keys() else {
            return Err(ClientError::InvalidInput("an election is named by one key"));
        };
        self.check_ready_with(
            Capabilities::OBSERVE,
            "observing an election (the server did not grant OBSERVE)",
        )?;
        let request = Request::Observe(ObserveRequest {
            rid: 0,
            name: name.clone(),
        });
        self.submit(now, request, deadline, 0)
    }

    /// Queues our `X` as the first request after the handshake. Nothing
    /// else is taken until it is answered: a request pipelined behind it
    /// to a server that closes on `X` (published protocol only) would end
    /// Indeterminate, where waiting leaves it unsent and retryable. The
    /// negotiation gets a handshake's allowance.
    pub(super) fn start_negotiation(&mut self, now: Instant) {
        let Some(rid) = self.next_rid else {
            return self.close(now, CloseReason::RidsExhausted);
        };
        self.next_rid = rid.checked_add(1);
        let request = Request::Negotiate(NegotiateRequest {
            rid,
            version: EXTENSION_VERSION,
            wanted: self.config.extensions,
            label: self.config.label.clone(),
        });
        let deadline = now.saturating_add(self.config.handshake_timeout);
        self.pending_releases += 1;
        self.unsent += 1;
        self.pending.insert(
            rid,
            Pending {
                request,
                deadline,
                wait_s_max: 0,
                sent_at: None,
            },
        );
        self.deadlines.push(Reverse((deadline, rid)));
        self.negotiating = Some(rid);
    }

    pub(super) fn submit(
        &mut self,
        now: Instant,
        mut request: Request,
        deadline: Instant,
        wait_s_max: u8,
    ) -> Result<u64, ClientError> {
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        let acquire = is_acquire(&request);
        let full = if acquire {
            self.pending_acquires >= self.config.pending_acquires_max
        } else {
            self.pending_releases >= self.config.pending_releases_max
        };
        if full {
            return Err(ClientError::ClientCapacity);
        }
        if now >= deadline {
            return Err(ClientError::Timeout);
        }
        let Some(rid) = self.next_rid else {
            self.close(now, CloseReason::RidsExhausted);
            return Err(ClientError::NotConnected);
        };
        self.next_rid = rid.checked_add(1);
        match &mut request {
            Request::Acquire(req) => req.rid = rid,
            Request::Release(req) => req.rid = rid,
            Request::Negotiate(req) => req.rid = rid,
            Request::Extend(req) => req.rid = rid,
            Request::AcquireCapped(req) => req.rid = rid,
            Request::AcquirePermits(req) => req.rid = rid,
            Request::Observe(req) => req.rid = rid,
            Request::AcquireShared(req) => req.rid = rid,
            Request::Downgrade(req) => req.rid = rid,
        }
        if acquire {
            self.pending_acquires += 1;
        } else {
            self.pending_releases += 1;
        }
        self.unsent += 1;
        self.pending.insert(
            rid,
            Pending {
                request,
                deadline,
                wait_s_max,
                sent_at: None,
            },
        );
        self.deadlines.push(Reverse((deadline, rid)));
        if self.deadlines.len() > 2 * self.pending.len() + 64 {
            self.deadlines = self
                .pending
                .iter()
                .map(|(&rid, entry)| Reverse((entry.deadline, rid)))
                .collect();
        }
        Ok(rid)
    }

    /// Appends bytes to send to `out` and returns how many. Call when the
    /// transport can take more; every request whose bytes are handed out
    /// here counts as *possibly sent* from `now` on (the send boundary): it
    /// is never resent, and a missing reply makes it Indeterminate. The
    /// runtime then reports the writes that take them
    /// ([`Session::handle_written`]).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.append(&mut self.proof);
        let handed = if self.is_open() {
            let proof_len = out.len() - start;
            self.transmit(now, proof_len, |request| {
                request.encode(out);
                request.frame_len()
            })
        } else {
            out.len() - start
        };
        if handed > 0 && self.unwritten_since.is_none() {
            self.unwritten_since = Some(now);
        }
        handed
    }

    /// [`Session::poll_transmit`] handing out request values instead of
    /// their frames, for a driver that passes them to the server as they
    /// are (an in-process link: the server's
    /// [`crate::machine::Machine::handle_requests`]). The very same requests,
    /// in the same order and under the same send boundary and batch bound
    /// (each counted as the bytes of its frame), leave as they would as
    /// bytes; returns the bytes their frames would take. Only once the
    /// session is ready: the handshake goes as bytes
    /// ([`Session::poll_transmit`]), and nothing is handed out before.
    pub fn poll_transmit_requests(&mut self, now: Instant, out: &mut Vec<Request>) -> usize {
        if !self.is_open() {
            return 0;
        }
        self.transmit(now, 0, |request| {
            out.push(request.clone());
            request.frame_len()
        })
    }

    /// Hands out the unsent requests in rid order through `hand_out`
    /// (which returns the bytes of the request's frame) while fewer than
    /// [`TRANSMIT_BATCH_BYTES`] are handed out, `handed` counting what this
    /// call gave before (the proof); returns the total.
    pub(super) fn transmit(
        &mut self,
        now: Instant,
        mut handed: usize,
        mut hand_out: impl FnMut(&Request) -> usize,
    ) -> usize {
        // The unsent requests are the rids from the cursor on, less those
        // cancelled or timed out before they left: `unsent` says when the
        // last one has been seen.
        while self.unsent > 0 && handed < TRANSMIT_BATCH_BYTES {
            let rid = self.send_cursor;
            self.send_cursor = rid.saturating_add(1);
            let Some(entry) = self.pending.get_mut(&rid) else {
                if rid == u64::MAX {
                    break;
                }
                continue;
            };
            if entry.sent_at.is_some() {
                // Only reachable at rid u64::MAX, where the cursor saturates.
                break;
            }
            if now >= entry.deadline {
                self.take(rid);
                if self.negotiating == Some(rid) {
                    self.close(now, CloseReason::HandshakeTimeout);
                    return handed;
                }
                self.push_outcome(rid, Outcome::Timeout);
                continue;
            }
            if let Some(wait_s) = wait_s_mut(&mut entry.request) {
                // The server may wait only what remains of the caller's
                // wait, so that its `T` comes before our own deadline.
                *wait_s = if entry.wait_s_max == 0 {
                    0
                } else {
                    let remaining_s = ceil_secs(entry.deadline.saturating_duration_since(now));
                    u8::try_from(remaining_s)
                        .unwrap_or(u8::MAX)
                        .min(entry.wait_s_max)
                };
            }
            handed += hand_out(&entry.request);
            entry.sent_at = Some(now);
            self.unsent -= 1;
            if let Some(at) = entry.overdue_at(self.config.silence_timeout) {
                self.overdue.push(Reverse((at, rid)));
            }
        }
        if self.overdue.len() > 2 * self.pending.len() + 64 {
            let silence_timeout = self.config.silence_timeout;
            self.overdue = self
                .pending
                .iter()
                .filter_map(|(&rid, entry)| {
                    Some(Reverse((entry.overdue_at(silence_timeout)?, rid)))
                })
                .collect();
        }
        handed
    }

    /// Refuses, sending nothing, a request that needs `capability` once
    /// the handshake is done and the server did not grant it (`what`
    /// names the feature for [`ClientError::Unsupported`]). Before then
    /// the grant is not known, and the request is queued.
    fn check_granted(
        &self,
        capability: Capabilities,
        what: &'static str,
    ) -> Result<(), ClientError> {
        if self.is_ready() && !self.capabilities.contains(capability) {
            return Err(ClientError::Unsupported(what));
        }
        Ok(())
    }

    /// As [`Session::check_granted`], for a request that is only made on
    /// a ready session ([`ClientError::NotConnected`] before).
    fn check_ready_with(
        &self,
        capability: Capabilities,
        what: &'static str,
    ) -> Result<(), ClientError> {
        if !self.is_ready() {
            return Err(ClientError::NotConnected);
        }
        self.check_granted(capability, what)
    }
}
