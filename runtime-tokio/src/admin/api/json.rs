//! The JSON the admin API answers with: locks, connections, events,
//! members and force-release outcomes, and RFC 3339 times.

use super::*;

/// A cluster member as JSON: its role is the leader it is known as, else
/// a voter (follower) or a learner.
pub(super) fn member_json(member: &MemberView) -> Value {
    let role = if member.leader {
        "leader"
    } else if member.voter {
        "follower"
    } else {
        "learner"
    };
    json!({
        "slot": member.slot,
        "generation": member.generation,
        "role": role,
        "voter": member.voter,
        "this_node": member.this_node,
        "lag_entries": member.lag_entries,
        "heard_ms": member.heard_ms,
        "ready": member.ready,
        "admin": member.admin.as_deref(),
    })
}

/// The name of a refusal reason in `/v1/events`.
pub(super) fn refusal_reason(reason: AbuseKind) -> &'static str {
    match reason {
        AbuseKind::FailedProof => "client_proof",
        AbuseKind::FailedPeerHandshake => "peer_handshake",
        AbuseKind::HandshakeEvicted => "handshake_evicted",
        AbuseKind::HandshakeTimedOut => "handshake_timed_out",
        AbuseKind::Refused => "no_session_slot",
        AbuseKind::ReleaseSweep => "release_misses",
        AbuseKind::TokenFromTheFuture => "unissued_token",
    }
}

/// One event as JSON; its tokens only when `served` in full.
pub(super) fn event_json(view: &EventView, now: SystemTime, served: Served) -> Value {
    let shown = |token: u64| (served == Served::Full).then_some(token);
    let at = now
        .checked_sub(Duration::from_millis(view.age_ms))
        .unwrap_or(UNIX_EPOCH);
    let mut body = match &view.event {
        Event::LeaderChanged { leader_slot, term } => json!({
            "kind": "leader_changed",
            "leader_slot": leader_slot,
            "term": term,
        }),
        Event::ForceReleased {
            keys,
            revoked,
            handed_to,
        } => {
            let (keys, keys_encoding) = keys_json(keys);
            json!({
                "kind": "force_released",
                "keys": keys,
                "keys_encoding": keys_encoding,
                "revoked": shown(*revoked),
                "handed_to": handed_to.and_then(shown),
            })
        }
        Event::ExpiredWithWaiters {
            keys,
            expired,
            handed_to,
        } => {
            let (keys, keys_encoding) = keys_json(keys);
            json!({
                "kind": "expired_with_waiters",
                "keys": keys,
                "keys_encoding": keys_encoding,
                "expired": shown(*expired),
                "handed_to": handed_to.and_then(shown),
            })
        }
        Event::Refused { reason, count } => json!({
            "kind": "refused",
            "reason": refusal_reason(*reason),
            "description": reason.describe(),
            "count": count,
        }),
    };
    body["seq"] = json!(view.seq);
    body["at"] = json!(rfc3339(at));
    body["age_ms"] = json!(view.age_ms);
    body["span_ms"] = json!(view.span_ms);
    body
}

pub(super) fn outcome_response(outcome: &ForceReleaseOutcome) -> Response {
    match outcome {
        ForceReleaseOutcome::Released {
            revoked,
            keys,
            handed_to,
        } => {
            let (keys, encoding) = keys_json(keys);
            ok_json(
                StatusCode::OK,
                &json!({
                    "revoked": revoked,
                    "keys": keys,
                    "keys_encoding": encoding,
                    "handed_to": handed_to,
                }),
            )
        }
        ForceReleaseOutcome::NotHeld => {
            error(StatusCode::NOT_FOUND, "not_held", "nobody holds the key")
        }
        ForceReleaseOutcome::TokenMismatch { held } => {
            let body = json!({
                "error": "token_mismatch",
                "message": "the key is held by another token",
                "held": held,
            });
            ok_json(StatusCode::CONFLICT, &body)
        }
        ForceReleaseOutcome::NotLeader { leader_slot } => {
            let body = json!({
                "error": "not_leader",
                "message": "this node is not the leader; ask the leader",
                "leader_slot": leader_slot,
            });
            ok_json(StatusCode::SERVICE_UNAVAILABLE, &body)
        }
        ForceReleaseOutcome::Busy => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "the node cannot take more work now (nothing was done); retry",
        ),
        ForceReleaseOutcome::Indeterminate => error(
            StatusCode::GATEWAY_TIMEOUT,
            "indeterminate",
            "the outcome is unknown (leadership changed); inspect the key",
        ),
    }
}

/// A key as JSON: the string if it is UTF-8, lowercase hex otherwise.
pub(super) fn key_text(bytes: &[u8]) -> (String, bool) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), true),
        Err(_) => (bytes.iter().map(|b| format!("{b:02x}")).collect(), false),
    }
}

pub(super) fn encoding(utf8: bool) -> &'static str {
    if utf8 { "utf8" } else { "hex" }
}

pub(super) fn keys_json(keys: &[Key]) -> (Vec<String>, &'static str) {
    let rendered: Vec<(String, bool)> = keys.iter().map(|k| key_text(k.as_bytes())).collect();
    if rendered.iter().all(|(_, utf8)| *utf8) {
        (rendered.into_iter().map(|(text, _)| text).collect(), "utf8")
    } else {
        // One encoding for the whole list, so a reader never guesses.
        let hex = keys
            .iter()
            .map(|k| k.as_bytes().iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        (hex, "hex")
    }
}

/// A connection as JSON; its source address and the client's label only
/// when `served` in full (both say who holds the lock).
pub(super) fn conn_json(conn: Option<&ConnView>, served: Served) -> Value {
    match conn {
        None => Value::Null,
        Some(conn) => json!({
            "id": conn.conn.0,
            "source": (served == Served::Full).then(|| conn.source.to_string()),
            "label": conn.label.as_deref().filter(|_| served == Served::Full),
            "dialect": match conn.dialect {
                Dialect::V3 => "v3",
                Dialect::Line => "line",
            },
        }),
    }
}

/// A lock as JSON; without a fencing token or client addresses unless
/// `served` in full (see [`ticketing_core::admin`]).
pub(super) fn lock_json(view: &LockView, now: SystemTime, served: Served) -> Value {
    let (key, utf8) = key_text(view.key.as_bytes());
    let holder_json = |holder: &HolderView| {
        let (keys, keys_encoding) = keys_json(&holder.keys);
        let granted_at = now
            .checked_sub(Duration::from_millis(holder.held_ms))
            .unwrap_or(UNIX_EPOCH);
        json!({
            "token": (served == Served::Full).then_some(holder.token),
            "keys": keys,
            "keys_encoding": keys_encoding,
            "held_ms": holder.held_ms,
            "lease_remaining_ms": holder.lease_remaining_ms,
            "extensions": holder.extensions,
            "hold_remaining_ms": holder.hold_remaining_ms,
            "granted_at": rfc3339(granted_at),
            "conn": conn_json(holder.conn.as_ref(), served),
        })
    };
    let holder = view.holder.as_ref().map(holder_json);
    // Held shared: every sharer, oldest first (the holder is the oldest).
    let sharers: Vec<Value> = view.sharers.iter().map(holder_json).collect();
    let mode = match (&view.holder, view.sharers.is_empty()) {
        (None, _) => None,
        (Some(_), true) => Some("exclusive"),
        (Some(_), false) => Some("shared"),
    };
    let waiters: Vec<Value> = view
        .waiters
        .iter()
        .enumerate()
        .map(|(index, waiter)| {
            let (keys, keys_encoding) = keys_json(&waiter.keys);
            json!({
                "position": index + 1,
                "keys": keys,
                "keys_encoding": keys_encoding,
                "mode": if waiter.shared { "shared" } else { "exclusive" },
                "waited_ms": waiter.waited_ms,
                "wait_remaining_ms": waiter.wait_remaining_ms,
                "conn": conn_json(waiter.conn.as_ref(), served),
            })
        })
        .collect();
    json!({
        "key": key,
        "key_encoding": encoding(utf8),
        "holder": holder,
        "mode": mode,
        "sharers": sharers,
        "waiters": waiters,
        "waiters_total": view.waiters_total,
        "redacted": served == Served::Redacted,
    })
}

/// `at` as RFC 3339 in UTC with milliseconds (`2026-12-01T15:04:05.123Z`).
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to a (year, month, day) of the proleptic
/// Gregorian calendar (Howard Hinnant's `civil_from_days`).
pub(super) fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_renders_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap_day = UNIX_EPOCH + Duration::from_millis(951_782_400_123);
        assert_eq!(rfc3339(leap_day), "2000-02-29T00:00:00.123Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_796_137_445);
        assert_eq!(rfc3339(later), "2026-12-01T15:04:05.000Z");
    }

    #[test]
    fn keys_render_as_text_or_hex() {
        assert_eq!(key_text(b"orders/42"), ("orders/42".to_owned(), true));
        assert_eq!(key_text(&[0xff, 0x00]), ("ff00".to_owned(), false));
    }
}
