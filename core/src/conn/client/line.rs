//! The line dialect's side of the front end: its requests read into
//! dialect-neutral ones, and answers written back as its replies.

use super::*;

pub(super) fn line_answer(
    echo: u64,
    key: &[u8],
    answer: Answer,
    addresses: &[Box<str>],
    out: &mut Vec<u8>,
) -> Delivery {
    let reply = match answer {
        Answer::Granted { token } => LineReply::Acquired {
            token,
            owner: echo,
            key,
        },
        Answer::TimedOut => LineReply::TimedOut { owner: echo, key },
        Answer::Busy => LineReply::Busy { owner: echo, key },
        Answer::Released => LineReply::Released { token: echo, key },
        // A group mismatch is a token that is not current for this key.
        Answer::NotFound | Answer::GroupMismatch => LineReply::NotFound { token: echo, key },
        Answer::Indeterminate => return Delivery::Close,
        Answer::NotLeader(slot) => match slot.and_then(|slot| address_of(addresses, slot)) {
            Some(address) => LineReply::Moved { address },
            None => line_error(LineError::NoLeader),
        },
        Answer::NotActive => line_error(LineError::NotActive),
        // The line dialect has no extensions, so no line request is
        // answered so; were one, closing is the only honest reply.
        Answer::Extended { .. }
        | Answer::PermitsGranted { .. }
        | Answer::CapacityMismatch { .. }
        | Answer::Observed(_)
        | Answer::Downgraded => return Delivery::Close,
    };
    reply.encode(out);
    Delivery::Queued
}

pub(super) fn line_error(error: LineError) -> LineReply<'static> {
    LineReply::Error {
        reason: error.reason().as_bytes(),
    }
}

pub(super) fn next_line(
    decoder: &mut LineDecoder,
    out: &mut Vec<u8>,
    counts: &mut ReplyCounts,
) -> Result<Option<ClientRequest>, CloseReason> {
    loop {
        match decoder.next() {
            Ok(None) => return Ok(None),
            Ok(Some(LineDecoded::BadKey)) => {
                count_line_error(counts, ErrorCode::BadKey);
                line_error(LineError::BadKey).encode(out);
            }
            Ok(Some(LineDecoded::Request(LineRequest::Acquire {
                wait_s,
                lease_s,
                owner,
                key,
            }))) => {
                if let Some(request) = line_acquire(wait_s, lease_s, owner, key, out, counts) {
                    return Ok(Some(request));
                }
            }
            Ok(Some(LineDecoded::Request(LineRequest::Release { token, key }))) => {
                if let Some(request) = line_release(token, key, out, counts) {
                    return Ok(Some(request));
                }
            }
            Err(LineFrameError::UnknownOp(_)) => {
                line_error(LineError::BadOp).encode(out);
                return Err(CloseReason::BadFrame);
            }
            Err(LineFrameError::TooLong) => {
                line_error(LineError::TooLong).encode(out);
                return Err(CloseReason::BadFrame);
            }
        }
    }
}

/// A line-dialect answer, counted as the v3 reply that says the same, like
/// every answer.
fn count_line_answer(counts: &mut ReplyCounts, answer: Answer) {
    counts.count(&v3_reply(1, false, answer));
}

/// A line-dialect error, counted as the v3 `E` reply of `code`.
fn count_line_error(counts: &mut ReplyCounts, code: ErrorCode) {
    counts.count(&Reply::Error { rid: 1, code });
}

/// A line `A` as the server's acquire; `None` if it was answered here
/// (a lease out of range).
fn line_acquire(
    wait_s: u16,
    lease_s: u16,
    owner: u64,
    key: Key,
    out: &mut Vec<u8>,
    counts: &mut ReplyCounts,
) -> Option<ClientRequest> {
    if lease_s == 0 || lease_s > u16::from(LEASE_S_MAX) {
        // Silence would hang the call, `B` would make it retry
        // forever and a clamp would promise a lease not kept:
        // say why, then end the call with a definite "no".
        count_line_error(counts, ErrorCode::BadLease);
        count_line_answer(counts, Answer::TimedOut);
        line_error(LineError::BadLease).encode(out);
        LineReply::TimedOut {
            owner,
            key: key.as_bytes(),
        }
        .encode(out);
        return None;
    }
    // Wait 0 means "without limit" to a line client; there is
    // no infinite wait, so both it and anything longer get the
    // longest one.
    let wait_s = match u8::try_from(wait_s) {
        Ok(0) | Err(_) => LINE_MAX_WAIT_S,
        Ok(wait_s) => wait_s,
    };
    Some(ClientRequest::Acquire {
        wait_s,
        lease_s: lease_s as u8,
        hold: HoldAsk::Uncapped,
        reply_to: ReplyTo::Line {
            echo: owner,
            key: EchoKey::of(&key),
        },
        keys: KeyGroup::single(key),
    })
}

/// A line `R` as the server's release; `None` if it was answered here
/// (token 0 was never granted).
fn line_release(
    token: u64,
    key: Key,
    out: &mut Vec<u8>,
    counts: &mut ReplyCounts,
) -> Option<ClientRequest> {
    if token == 0 {
        count_line_answer(counts, Answer::NotFound);
        LineReply::NotFound {
            token,
            key: key.as_bytes(),
        }
        .encode(out);
        return None;
    }
    Some(ClientRequest::Release {
        token,
        reply_to: ReplyTo::Line {
            echo: token,
            key: EchoKey::of(&key),
        },
        keys: KeyGroup::single(key),
    })
}
