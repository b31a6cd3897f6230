//! Test support, kept out of the production modules: nothing outside
//! tests, the simulator and the fuzz targets calls into it.
//!
//! - [`fuzzing`]: the entry points of the cargo-fuzz targets in `fuzz/`,
//!   which the stable corpus-replay tests call too.
//! - [`outputs`]: [`outputs::OutputQueues`], a machine's outputs sorted by
//!   kind for tests that look at one kind at a time.
//! - [`net`]: the test network: [`net::Link`] (a client session on one
//!   connection of a machine), [`net::SingleNet`] (one single-mode
//!   server with its clock, outputs, raw connections and client links) and
//!   [`net::ClusterNet`] (three cluster nodes, their peer links and
//!   clients, with cuts, stale links and kills).
//! - [`lock_model`]: a reference model of the lock table and the op-sequence
//!   harness shared by the proptest in `core/tests` and the simulator.
//! - `planted` (feature `planted-bugs`): deliberate mutations the
//!   simulator's checker tests switch on one at a time; the hooks that
//!   consult it stay at the mutated lines in the lock table, server and
//!   peer codec.
//!
//! Compiled only with the `testing` feature (the core's own tests, the
//! simulator and `fuzz/` turn it on); hidden from the docs and not part of
//! the stable API.

pub mod fuzzing;
pub mod lock_model;
pub mod net;
pub mod outputs;
#[cfg(feature = "planted-bugs")]
pub mod planted;
