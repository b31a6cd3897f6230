//! The v3 client: the real core `AcquireOperation`, `ReleaseOperation`
//! and `ExtendOperation` driven to their ends over the core `Session`s of
//! a client ([`Sessions`]: one for a single server, one per node slot with
//! the core `Router` choosing among them in a cluster).
//!
//! Split by concern: [`ops`] starts operations and submits their attempts
//! and retries, [`outcomes`] takes their answers to the next step,
//! [`renewals`] renews a holder's lease, [`sessions`] drives the sessions
//! themselves. Only the shared client module is used, never the line
//! client.

mod ops;
mod outcomes;
mod renewals;
mod sessions;

pub(crate) use ops::V3Ops;
pub(crate) use outcomes::V3Outcomes;
pub(crate) use renewals::V3Renewals;
pub(crate) use sessions::{Sessions, V3Sessions};
