//! The token floor: opening the state file before serving, and the
//! persister task that writes the reserve values the core asks for.

use std::io;
use std::sync::Arc;

use tracing::{error, info};

use ticketing_core::machine::Machine;
use ticketing_core::server;

use super::shared::{Clock, Shared};
use crate::state::{self, FloorFile, StateSettings};

/// The core's [`server::first_token`] at the wall-clock time now, with no
/// state file.
pub(crate) fn first_token_from_clock() -> u64 {
    server::first_token(state::wall_clock(), None)
}

/// Opens the state file (blocking IO, off the runtime's thread) and makes
/// the first reserve durable.
pub(crate) async fn open_floor(
    settings: &StateSettings,
    name: &str,
    clock: &Clock,
) -> io::Result<state::Floor> {
    let (settings, name, now) = (settings.clone(), name.to_owned(), clock.now());
    let floor = tokio::task::spawn_blocking(move || state::open_floor(&settings, &name, now))
        .await
        .map_err(io::Error::other)?
        .map_err(state::StateError::into_io)?;
    info!(
        path = %floor.file.path().display(),
        first_token = floor.first_token,
        reserve = floor.reserve.limit(),
        "token floor loaded"
    );
    Ok(floor)
}

/// Opens and locks the state file and reads it (blocking IO, off the
/// runtime's thread), writing nothing yet: a recovery decides first.
pub(crate) async fn read_floor(
    settings: &StateSettings,
    name: &str,
) -> io::Result<(FloorFile, Option<u64>)> {
    let (settings, name) = (settings.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || FloorFile::open(&settings, &name))
        .await
        .map_err(io::Error::other)?
        .map_err(state::StateError::into_io)
}

/// Makes the first reserve above `first_token` durable in a file opened by
/// [`read_floor`].
pub(crate) async fn start_floor(
    settings: &StateSettings,
    file: FloorFile,
    stored: Option<u64>,
    first_token: u64,
    clock: &Clock,
) -> io::Result<state::Floor> {
    let (settings, now) = (settings.clone(), clock.now());
    let floor = tokio::task::spawn_blocking(move || {
        state::start_floor(file, stored, first_token, &settings, now)
    })
    .await
    .map_err(io::Error::other)?
    .map_err(state::StateError::into_io)?;
    info!(
        path = %floor.file.path().display(),
        first_token = floor.first_token,
        reserve = floor.reserve.limit(),
        "token floor loaded"
    );
    Ok(floor)
}

/// Writes the reserve values the core asks for, one at a time, and tells
/// the core how each write went.
pub(crate) async fn run_persister<M: Machine>(shared: Arc<Shared<M>>, file: Arc<FloorFile>) {
    loop {
        shared.persist.notified().await;
        let Some(value) = shared.lock().reserve_request.take() else {
            continue;
        };
        let writer = Arc::clone(&file);
        let result = tokio::task::spawn_blocking(move || writer.write(value))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
        let mut inner = shared.lock();
        let now = shared.clock.now();
        match result {
            Ok(()) => inner.core.handle_reserve_persisted(now, value),
            Err(e) => {
                error!(path = %file.path().display(), value, "cannot write the token reserve: {e}");
                inner.core.handle_reserve_failed(now);
            }
        }
        inner.dispatch(&shared, None);
    }
}
