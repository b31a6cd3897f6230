//! The background release worker: dropped tickets and compensations.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use smol::Task;

use ticketing_core::client::run_release;

use super::inner::Inner;

/// Releases the background worker runs at once.
const RELEASE_WORKERS_MAX: usize = 64;

/// Runs queued background releases; on close, drains the queue (each
/// release keeps its own 5 s bound), then closes every session.
pub(super) async fn run_release_worker(inner: Arc<Inner>, endpoints: Vec<Task<()>>) {
    let mut running: Vec<Task<()>> = Vec::new();
    loop {
        running.retain(|task| !task.is_finished());
        let now = inner.now();
        let job = if running.len() < RELEASE_WORKERS_MAX {
            inner.lock().broker.releases.pop(now)
        } else {
            None
        };
        if let Some(job) = job {
            let worker = Arc::clone(&inner);
            running.push(smol::spawn(async move {
                // An error leaves the lock to its lease: nothing to do here.
                let _ = run_release(&*worker, job).await;
                worker.release_wake.notify_one();
            }));
            continue;
        }
        let idle = inner.lock().broker.releases.is_empty() && running.is_empty();
        if inner.is_closing() && idle {
            break;
        }
        inner.release_wake.notified().await;
    }
    // Sessions see the shutdown in their task and close locally: pending
    // requests end (unsent → Retry, possibly sent → Indeterminate).
    inner.shut_down_now();
    for endpoint in endpoints {
        endpoint.await;
    }
    inner.closed.store(true, Ordering::Release);
    inner.closed_changed.notify(usize::MAX);
}
