//! Line clients: a model of the published 0.3.0 clients (the line dialect,
//! `ticketing_core::line`) beside the v3 clients, against the same keys.
//!
//! A line client is a small state machine of its own, not the core client
//! `Session`: it reads the shared hello up to its first LF, answers the
//! challenge after the first space with `line_answer` and sends its
//! requests right behind the answer (it never waits for a verdict). Each
//! call has its own owner (a random base XOR a counter). Replies are
//! matched by op family, key and owner or token. When the connection
//! closes with a request outstanding — a server crash, a reset, a
//! partition, `M`, `Eno_leader`, `Enot_active`, or the close of a
//! cluster node that cannot know an outcome — it reconnects (to the leader
//! named by `M`/`L`, else round-robin) and resends the identical frame.
//!
//! In the history the first attempt stays indeterminate (it may have taken
//! effect: a grant the server wrote but the client never read stays held
//! for its lease; one never written is released by the server), and the
//! resend is a new attempt. A release outstanding at a close stays
//! indeterminate too and is resent; `N` then settles nothing. Grants become
//! holdings exactly like the v3 clients' (validity windows, fenced writes),
//! so every checker sees both dialects together.
//!
//! Here are the line client's state ([`LineLink`], [`LineCall`]);
//! [`calls`] starts, sends and resends its calls and keeps its
//! connection, [`replies`] reads the hello and the replies. Only the
//! shared client module is used, never the v3 client.

mod calls;
mod replies;

use ticketing_core::client::KeySet;
use ticketing_core::line::LineReply;

use crate::checks::HistRefs;
use crate::clients::Plan;

pub(crate) use calls::LineCalls;
pub(crate) use replies::LineReplies;

/// The Rust 0.3.0 client gives up on a hello line longer than this.
const HELLO_LINE_MAX: usize = 192;

/// A line client's connection and call counter.
pub(crate) struct LineLink {
    /// The open connection, if any, and its slot.
    pub(crate) conn: Option<(u64, u8)>,
    /// The hello line read so far; `None` once answered.
    hello: Option<Vec<u8>>,
    /// Reply bytes not yet decoded.
    replies: Vec<u8>,
    /// The random base of this process's owners.
    owner_base: u64,
    /// Calls made (XORed into the owner).
    calls: u64,
    /// The leader a cluster named last (`M`/`L`).
    leader: Option<u8>,
    /// The next slot of the round-robin.
    next_slot: u8,
    /// Connections that ended without a reply since the last one did.
    failures: u32,
    /// A reconnect is scheduled.
    reconnecting: bool,
}

impl LineLink {
    pub(crate) fn new(owner_base: u64) -> Self {
        LineLink {
            conn: None,
            hello: None,
            replies: Vec::new(),
            owner_base,
            calls: 0,
            leader: None,
            next_slot: 0,
            failures: 0,
            reconnecting: false,
        }
    }

    /// A crash: the connection and what was read on it are gone.
    pub(crate) fn reset(&mut self) {
        self.conn = None;
        self.hello = None;
        self.replies.clear();
        self.leader = None;
        self.failures = 0;
        self.reconnecting = false;
    }

    fn ready(&self) -> Option<u64> {
        match (self.conn, &self.hello) {
            (Some((conn, _)), None) => Some(conn),
            _ => None,
        }
    }
}

/// One line call in flight.
pub(crate) struct LineCall {
    /// The exact frame; every resend is this.
    frame: Vec<u8>,
    keys: KeySet,
    /// Owner (acquire) or token (release).
    echo: u64,
    acquire: bool,
    lease_s: u16,
    wait_s: u16,
    plan: Option<Plan>,
    /// The current attempt's history entries.
    pub(crate) hist: HistRefs,
    /// The connection the current attempt went out on, and the local time
    /// just before it did.
    sent: Option<(u64, u64)>,
    /// Local time the call began (for its wait while retrying `B`).
    begun_local_us: u64,
    /// An earlier release attempt may have taken effect.
    any_indeterminate: bool,
    /// `Ebad_lease` came for this attempt (a bad lease must get it
    /// before its `T`).
    saw_bad_lease: bool,
}

/// A line reply as a trace shows it: op, numbers, text as text.
fn show(reply: &LineReply<'_>) -> String {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match *reply {
        LineReply::Acquired { token, owner, key } => {
            format!("A token {token} owner {owner:#x} {}", text(key))
        }
        LineReply::TimedOut { owner, key } => format!("T owner {owner:#x} {}", text(key)),
        LineReply::Busy { owner, key } => format!("B owner {owner:#x} {}", text(key)),
        LineReply::Released { token, key } => format!("R token {token} {}", text(key)),
        LineReply::NotFound { token, key } => format!("N token {token} {}", text(key)),
        LineReply::Moved { address } => format!("M {}", text(address)),
        LineReply::Leader { address } => format!("L {}", text(address)),
        LineReply::Error { reason } => format!("E{}", text(reason)),
    }
}
