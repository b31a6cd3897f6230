//! The v3 dialect's side of the front end: a decoded frame read into a
//! dialect-neutral request (or answered here when a field is out of
//! range).

use super::*;

/// A decoded v3 frame as the owner's request, or `None` when it is
/// answered here: a field out of range gets its `E`, counted in `counts`
/// and handed to `queue` (encoded by the byte path, queued as a value by
/// the value path). Both paths of a v3 session run this.
pub(super) fn v3_request(
    decoded: Decoded,
    caps: Capabilities,
    counts: &mut ReplyCounts,
    queue: impl FnOnce(Reply),
) -> Option<ClientRequest> {
    match decoded {
        Decoded::Rejected { rid, code, .. } => {
            let reply = Reply::Error { rid, code };
            counts.count(&reply);
            queue(reply);
            None
        }
        Decoded::Request(Request::Acquire(acquire)) => Some(ClientRequest::Acquire {
            wait_s: acquire.wait_s,
            lease_s: acquire.lease_s,
            keys: acquire.keys,
            // A client that can renew holds under a cap even when it
            // names none.
            hold: if caps.contains(Capabilities::EXTEND) {
                HoldAsk::Default
            } else {
                HoldAsk::Uncapped
            },
            reply_to: ReplyTo::V3 {
                rid: acquire.rid,
                set: acquire.set,
            },
        }),
        Decoded::Request(Request::AcquireCapped(acquire)) => Some(ClientRequest::Acquire {
            wait_s: acquire.wait_s,
            lease_s: acquire.lease_s,
            keys: acquire.keys,
            hold: HoldAsk::Asked(acquire.max_hold_s),
            // Answered like `S`, one key or many.
            reply_to: ReplyTo::V3 {
                rid: acquire.rid,
                set: true,
            },
        }),
        Decoded::Request(Request::Release(release)) => Some(ClientRequest::Release {
            token: release.token,
            keys: release.keys,
            reply_to: ReplyTo::V3 {
                rid: release.rid,
                set: release.set,
            },
        }),
        Decoded::Request(Request::Extend(extend)) => Some(ClientRequest::Extend {
            token: extend.token,
            lease_s: extend.lease_s,
            keys: extend.keys,
            reply_to: ReplyTo::V3 {
                rid: extend.rid,
                set: false,
            },
        }),
        Decoded::Request(Request::AcquirePermits(request)) => Some(ClientRequest::AcquirePermits {
            hold: hold_ask(request.max_hold_s, caps),
            reply_to: ReplyTo::V3 {
                rid: request.rid,
                set: false,
            },
            request,
        }),
        Decoded::Request(Request::Observe(request)) => Some(ClientRequest::Observe {
            name: request.name,
            reply_to: ReplyTo::V3 {
                rid: request.rid,
                set: false,
            },
        }),
        Decoded::Request(Request::AcquireShared(request)) => Some(ClientRequest::AcquireShared {
            wait_s: request.wait_s,
            lease_s: request.lease_s,
            modes: request.modes,
            keys: request.keys,
            hold: hold_ask(request.max_hold_s, caps),
            // Answered like `S`, one key or many.
            reply_to: ReplyTo::V3 {
                rid: request.rid,
                set: true,
            },
        }),
        Decoded::Request(Request::Downgrade(request)) => Some(ClientRequest::Downgrade {
            token: request.token,
            keys: request.keys,
            reply_to: ReplyTo::V3 {
                rid: request.rid,
                set: false,
            },
        }),
        // Answered by the front end itself before it gets here.
        Decoded::Request(Request::Negotiate(negotiate)) => {
            let reply = Reply::Error {
                rid: negotiate.rid,
                code: ErrorCode::BadExtension,
            };
            counts.count(&reply);
            queue(reply);
            None
        }
    }
}

/// The cap a `Q` or `Y` asks for: `max_hold_s` 0 is the server's default
/// on a connection that can renew, and no cap on any other.
fn hold_ask(max_hold_s: u32, caps: Capabilities) -> HoldAsk {
    match max_hold_s {
        0 if caps.contains(Capabilities::EXTEND) => HoldAsk::Default,
        0 => HoldAsk::Uncapped,
        s => HoldAsk::Asked(s),
    }
}
