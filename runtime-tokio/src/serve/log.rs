//! Logging what the core reports. The core decides what is worth telling
//! (and aggregates it); the driver drains its report outputs after every
//! input (`Inner::dispatch`) and turns them into `tracing` events here.

use tracing::{debug, error, info, warn};

use ticketing_core::budget::LogEvent;
use ticketing_core::cluster::NodeEvent;
use ticketing_core::raft::NodeId;
use ticketing_core::reserve::TokenAlert;
use ticketing_core::wire::Key;

/// Logs what the core reported: abuse at `warn`, close reasons at `debug`.
pub(crate) fn log_event(event: LogEvent) {
    match event {
        LogEvent::Abuse {
            source,
            kind,
            count,
        } => match source {
            Some(source) => warn!(%source, count, "{}", kind.describe()),
            None => warn!(source = "other sources", count, "{}", kind.describe()),
        },
        LogEvent::ForceReleased {
            keys,
            revoked,
            handed_to,
        } => {
            let keys: Vec<&str> = keys.iter().map(Key::as_str).collect();
            match handed_to {
                Some(token) => warn!(
                    ?keys,
                    revoked,
                    handed_to = token,
                    "force-released by an operator: the revoked token is fenced"
                ),
                None => warn!(
                    ?keys,
                    revoked, "force-released by an operator: the revoked token is fenced"
                ),
            }
        }
        LogEvent::Closed {
            conn,
            source,
            reason,
        } => match source {
            Some(source) => {
                debug!(conn = conn.0, %source, reason = reason.describe(), "connection closed")
            }
            None => debug!(
                conn = conn.0,
                reason = reason.describe(),
                "connection closed"
            ),
        },
    }
}

/// Logs what the core reports about the token counter.
pub(crate) fn log_token_alert(alert: TokenAlert) {
    error!("{alert}");
}

/// Logs what a cluster node reported about itself; `own_id` (the node's
/// current id) names a leader change to this node as such.
pub(crate) fn log_node_event(own_id: Option<NodeId>, event: NodeEvent) {
    match event {
        NodeEvent::GenerationChanged { generation } => warn!(
            generation,
            "--bootstrap found this cluster already running: joined as a new generation \
             instead (never pass --bootstrap to a restart)"
        ),
        NodeEvent::PeerFramesRefused {
            slot,
            error,
            refused,
        } => warn!(
            slot,
            refused, "refused a peer frame ({error}); closed that connection"
        ),
        NodeEvent::RaftMessagesRefused { refused } => warn!(
            refused,
            "dropped a peer message carrying an out-of-bounds term or index"
        ),
        NodeEvent::LeaderChanged {
            leader: Some(leader),
            term,
        } if Some(leader) == own_id => info!(term, "this node leads"),
        NodeEvent::LeaderChanged {
            leader: Some(leader),
            term,
        } => info!(
            leader_slot = leader.slot,
            leader_generation = leader.generation,
            term,
            "leader changed"
        ),
        NodeEvent::LeaderChanged { leader: None, term } => info!(term, "no leader known"),
        NodeEvent::VoterChanged { is_voter: true } => info!("this node is a voter"),
        NodeEvent::VoterChanged { is_voter: false } => {
            info!("this node is not a voter (learner or removed)");
        }
        NodeEvent::RecoveryEvidence { heard, needed } => warn!(
            heard,
            needed,
            "recovering leader waits for the token floors of more slots before it grants \
             anything: start the other slots whose state files survived with --recover, or \
             one without its file with --recover --token-floor N"
        ),
    }
}
