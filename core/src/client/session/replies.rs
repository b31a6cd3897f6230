//! Replies: reading frames, matching each to the request it answers, and
//! resolving grants, releases, renewals and the negotiation.

use super::*;

impl Session {
    /// Bytes received from the server.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.last_input_at = self.last_input_at.max(now);
            self.heard = true;
        }
        let mut rest = bytes;
        if let Phase::Handshake(handshake) = &mut self.phase {
            // A hello, the proof's answer and the first frames may arrive in
            // any split; the bound only guards against a handshake that
            // reports progress without using bytes.
            let mut status = ClientHandshakeStatus::NeedMore;
            for _ in 0..4 {
                let (used, next) = handshake.handle_input(rest);
                rest = &rest[used.min(rest.len())..];
                status = next;
                if next == ClientHandshakeStatus::SendProof {
                    // The hello completes (using bytes) exactly once.
                    if used > 0
                        && let Some(proof) = handshake.proof()
                    {
                        self.proof.extend_from_slice(&proof);
                    }
                    if rest.is_empty() {
                        return;
                    }
                    continue;
                }
                break;
            }
            match status {
                ClientHandshakeStatus::NeedMore | ClientHandshakeStatus::SendProof => return,
                ClientHandshakeStatus::Accepted => {
                    self.phase = Phase::Ready;
                    self.ready_at = Some(now);
                    if self.config.extensions == Capabilities::NONE {
                        self.events.push_back(SessionEvent::Ready);
                    } else {
                        self.start_negotiation(now);
                    }
                }
                ClientHandshakeStatus::Rejected => {
                    return self.close(now, CloseReason::AuthRejected);
                }
                ClientHandshakeStatus::BadHello(error) => {
                    return self.close(now, CloseReason::BadHello(error));
                }
                ClientHandshakeStatus::UnexpectedServer => {
                    return self.close(now, CloseReason::UnexpectedServer);
                }
                ClientHandshakeStatus::BadResult(byte) => {
                    return self.close(now, CloseReason::BadResult(byte));
                }
            }
        }
        if !self.is_open() {
            return;
        }
        self.handle_frames(now, rest);
        self.prune_deadlines();
    }

    /// Replies received from the server as values rather than bytes (an
    /// in-process link, after [`Session::poll_transmit_requests`]): each is
    /// checked as its frame would be decoded ([`Reply::check`]) and then
    /// handled by the very code that handles a decoded frame, so matching,
    /// outcomes and every rule of [`Session::handle_input`] are the same.
    /// Values before the session is ready (the handshake goes as bytes)
    /// close it as a protocol error.
    pub fn handle_replies(&mut self, now: Instant, replies: &[Reply]) {
        let Some(first) = replies.first() else {
            return;
        };
        self.last_input_at = self.last_input_at.max(now);
        if matches!(self.phase, Phase::Handshake(_)) {
            let rid = first.rid().unwrap_or(0);
            return self.close(now, CloseReason::Protocol(ProtocolError::UnknownRid(rid)));
        }
        for reply in replies {
            if !self.is_open() {
                break;
            }
            if let Err(error) = reply.check() {
                return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
            }
            self.handle_reply(now, *reply);
        }
        self.prune_deadlines();
    }

    /// Decodes frames without copying whole inputs: only a frame split
    /// across inputs is buffered, and it is at most one frame long.
    pub(super) fn handle_frames(&mut self, now: Instant, mut input: &[u8]) {
        while !input.is_empty() && self.is_open() {
            if self.partial.is_empty() {
                match Reply::decode(input) {
                    Ok(Some((reply, used))) => {
                        input = &input[used..];
                        self.handle_reply(now, reply);
                    }
                    Ok(None) => {
                        // Reply::decode checked the op and exact length, so
                        // the rest is shorter than one frame.
                        self.partial.extend_from_slice(input);
                        self.partial_since = Some(now);
                        return;
                    }
                    Err(error) => {
                        return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
                    }
                }
            } else {
                let had = self.partial.len();
                let take = input.len().min(REPLY_FRAME_LEN_MAX - had);
                self.partial.extend_from_slice(&input[..take]);
                match Reply::decode(&self.partial) {
                    Ok(Some((reply, used))) => {
                        input = &input[used - had..];
                        self.partial.clear();
                        self.partial_since = None;
                        self.handle_reply(now, reply);
                    }
                    Ok(None) => {
                        // Everything taken and still short: wait for more.
                        input = &input[take..];
                    }
                    Err(error) => {
                        return self.close(now, CloseReason::Protocol(ProtocolError::Frame(error)));
                    }
                }
            }
        }
    }

    pub(super) fn handle_reply(&mut self, now: Instant, reply: Reply) {
        let rid = match reply {
            Reply::Leader { leader_slot } => {
                if !self.config.slot_valid(leader_slot) {
                    return self.close(
                        now,
                        CloseReason::Protocol(ProtocolError::BadSlot(leader_slot)),
                    );
                }
                return self.push_leader_hint(leader_slot);
            }
            // Advisory: a push changes no request's outcome. Only a
            // session granted PUSH passes it on; on any other it is noise
            // from a server that ignores what was negotiated, and dropped.
            Reply::Push {
                token,
                kind,
                lease_ms,
            } => {
                if self.capabilities.contains(Capabilities::PUSH) {
                    self.events.push_back(SessionEvent::Push {
                        token,
                        kind,
                        lease_ms,
                    });
                }
                return;
            }
            other => other.rid().unwrap_or(0),
        };
        let Some(entry) = self.take_answered(now, rid, &reply) else {
            return;
        };
        self.resolve(now, rid, entry, reply);
    }

    /// Takes the request `reply` answers, or closes the session when it
    /// may not answer it (no such request handed out, a kind that cannot
    /// answer it, an invalid leader slot) and returns `None`.
    pub(super) fn take_answered(
        &mut self,
        now: Instant,
        rid: u64,
        reply: &Reply,
    ) -> Option<Pending> {
        // One lookup: the entry is taken first and put back for the close
        // (which ends it with the others) when the reply may not answer it.
        let entry = self.pending.remove(&rid);
        let refused = match &entry {
            // Only a request whose bytes were handed out can be answered; a
            // second reply finds nothing (the first removed it).
            None => Some(ProtocolError::UnknownRid(rid)),
            Some(entry) if entry.sent_at.is_none() => Some(ProtocolError::UnknownRid(rid)),
            Some(entry) if !reply.answers(entry.request.kind()) => Some(ProtocolError::WrongKind {
                rid,
                op: reply.op(),
            }),
            Some(_) => match *reply {
                Reply::Moved { leader_slot, .. } if !self.config.slot_valid(leader_slot) => {
                    Some(ProtocolError::BadSlot(leader_slot))
                }
                _ => None,
            },
        };
        if let Some(error) = refused {
            if let Some(entry) = entry {
                self.pending.insert(rid, entry);
            }
            self.close(now, CloseReason::Protocol(error));
            return None;
        }
        let entry = entry?;
        self.count_taken(&entry);
        Some(entry)
    }

    /// Ends request `rid` (already taken) as `reply` says.
    pub(super) fn resolve(&mut self, now: Instant, rid: u64, entry: Pending, reply: Reply) {
        if self.negotiating == Some(rid) {
            return self.resolve_negotiation(now, rid, reply);
        }
        match reply {
            Reply::Acquired { token, .. } | Reply::AcquiredSet { token, .. } => {
                self.resolve_grant(now, rid, entry, token, None)
            }
            Reply::Permits {
                token, free, slots, ..
            } => {
                let permits = GrantedPermits {
                    slots: slots.as_slice().to_vec(),
                    free,
                };
                self.resolve_grant(now, rid, entry, token, Some(permits))
            }
            Reply::CapacityMismatch {
                asked, capacity, ..
            } => self.push_outcome(rid, Outcome::CapacityMismatch { asked, capacity }),
            Reply::Released { .. } | Reply::ReleasedSet { .. } => {
                self.push_outcome(rid, Outcome::Released)
            }
            Reply::NotFound { .. } => self.push_outcome(rid, Outcome::NotFound),
            Reply::Downgraded { .. } => self.push_outcome(rid, Outcome::Downgraded),
            Reply::TimedOut { .. } => self.push_outcome(rid, Outcome::Timeout),
            Reply::Busy { .. } => self.push_outcome(rid, Outcome::Busy),
            Reply::Indeterminate { .. } => self.push_outcome(rid, Outcome::Indeterminate),
            Reply::Moved { leader_slot, .. } => {
                // `M` answers this one request: it had no effect and may
                // run elsewhere. The server goes on serving the connection
                // (docs/protocol.md §5: `M` is a reply like any other, not a close),
                // so the other requests on it get their own replies, a
                // grant or an `M` of their own, rather than Indeterminate.
                self.push_outcome(rid, Outcome::Retry);
                self.push_leader_hint(leader_slot);
            }
            Reply::Error {
                code: ErrorCode::NoLeader,
                ..
            } => {
                // `E 4` answers this one request, like `M`: no effect, and
                // the server goes on serving the connection. During an
                // election every node answers so; the node that wins sends
                // `L` on this very connection, so the session stays up to
                // hear it and to carry the retry at once (docs/protocol.md
                // §5), instead of closing, reconnecting and handshaking.
                self.push_outcome(rid, Outcome::Retry);
                self.events.push_back(SessionEvent::NotLeader);
            }
            Reply::Error { code, .. } => {
                if code == ErrorCode::NotActive {
                    self.push_outcome(rid, Outcome::Retry);
                    self.events.push_back(SessionEvent::NotLeader);
                } else {
                    self.push_outcome(rid, Outcome::Error(code));
                }
                self.close(now, CloseReason::ServerError(code));
            }
            Reply::Extended {
                status, lease_ms, ..
            } => {
                // Counted from the send boundary: the server counts from its
                // receipt (later) and answers the lease left as it answers
                // (rounded down), so this end is never after its own.
                let sent_at = if renewal_from_reply_planted() {
                    now
                } else {
                    entry.sent_at.unwrap_or(now)
                };
                // Never more than the lease asked for: a server's number is
                // not trusted to lengthen what the client counts.
                let asked = match &entry.request {
                    Request::Extend(req) => Duration::from_secs(u64::from(req.lease_s)),
                    _ => Duration::ZERO,
                };
                let left = Duration::from_millis(u64::from(lease_ms)).min(asked);
                let valid_before = sent_at.saturating_add(left);
                self.push_outcome(
                    rid,
                    Outcome::Extended {
                        status,
                        valid_before,
                    },
                );
            }
            Reply::Observed { observed, .. } => {
                let leader = (observed.state != LeaderState::None).then(|| Leader {
                    label: observed.label.as_str().to_owned(),
                    term: observed.term,
                    connected: observed.state == LeaderState::Connected,
                    lease_remaining: Duration::from_millis(u64::from(observed.lease_ms)),
                });
                self.push_outcome(rid, Outcome::Observed(leader));
            }
            // `answers` admits `X` only to our negotiation (handled above),
            // and `L` and `P` (handled before matching) to nothing.
            Reply::Leader { .. } | Reply::Push { .. } | Reply::Negotiated { .. } => {}
        }
    }

    /// The answer to our `X` (`rid`): the granted bits, then the session is
    /// ready; an `E` closes it (and the driver stops negotiating with this
    /// server, see [`CloseReason::refuses_extensions`]); anything else
    /// breaks the protocol.
    pub(super) fn resolve_negotiation(&mut self, now: Instant, rid: u64, reply: Reply) {
        self.negotiating = None;
        match reply {
            Reply::Negotiated { granted, .. } => {
                // A bit we did not ask for is not ours to use.
                self.capabilities = granted.intersection(self.config.extensions);
                self.events.push_back(SessionEvent::Ready);
            }
            Reply::Error { code, .. } => self.close(now, CloseReason::ServerError(code)),
            other => self.close(
                now,
                CloseReason::Protocol(ProtocolError::WrongKind {
                    rid,
                    op: other.op(),
                }),
            ),
        }
    }

    /// Acquire `rid` was granted `token`: the grant goes to the caller, or
    /// back to the server if the caller's deadline has passed.
    pub(super) fn resolve_grant(
        &mut self,
        now: Instant,
        rid: u64,
        entry: Pending,
        token: u64,
        permits: Option<GrantedPermits>,
    ) {
        let (keys, lease_s) = match (entry.request, &permits) {
            (Request::Acquire(req), None) => (KeySet(req.keys), req.lease_s),
            (Request::AcquireCapped(req), None) => (KeySet(req.keys), req.lease_s),
            (Request::AcquireShared(req), None) => (KeySet(req.keys), req.lease_s),
            (Request::AcquirePermits(req), Some(permits)) => {
                // The grant is of the slots' keys: what a release and a
                // renewal name.
                let keys = permits
                    .slots
                    .iter()
                    .filter_map(|&slot| slot_key(&req.name, slot))
                    .collect();
                match KeyGroup::new(keys) {
                    Ok(keys) if keys.len() == usize::from(req.permits) => {
                        (KeySet(keys), req.lease_s)
                    }
                    _ => {
                        let error = ProtocolError::WrongKind { rid, op: b'Q' };
                        return self.close(now, CloseReason::Protocol(error));
                    }
                }
            }
            // `answers` admits grants only for acquires, permits only for
            // `Q`.
            _ => return,
        };
        if now >= entry.deadline {
            // The caller has given up at its deadline: it is told
            // Indeterminate and the lock is handed back.
            self.push_outcome(rid, Outcome::Indeterminate);
            self.events
                .push_back(SessionEvent::Compensate(Compensation { keys, token }));
        } else {
            let sent_at = entry.sent_at.unwrap_or(now);
            let lease = Duration::from_secs(u64::from(lease_s));
            let grant = Grant {
                keys,
                token,
                valid_before: sent_at.saturating_add(lease),
                permits,
            };
            self.push_outcome(rid, Outcome::Acquired(grant));
        }
    }
}
