//! The uncontended in-process path does not allocate per operation: an
//! acquire answered at once is handed over without a channel or reply slot,
//! and a release answered at once needs no boxed future. Counted with a
//! global allocator that counts only on the thread that asks it to, so the
//! executor's own threads do not disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use ticketing_smol::{EmbeddedServer, ReleaseOutcome};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call goes straight to `System`; the count only reads and
// writes const-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|count| count.set(count.get() + 1));
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `body` on this thread.
async fn allocations_in(body: impl AsyncFnOnce()) -> u64 {
    COUNTING.with(|counting| counting.set(true));
    let before = ALLOCATIONS.with(Cell::get);
    body().await;
    COUNTING.with(|counting| counting.set(false));
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn uncontended_in_process_acquire_and_release_do_not_allocate_per_operation() {
    const ROUNDS: u64 = 2_000;
    let wait = Duration::from_secs(5);
    let lease = Duration::from_secs(30);
    smol::block_on(async {
        let server = EmbeddedServer::builder().start().unwrap();
        let broker = server.broker();
        // Warm up: buffers and tables reach their working size.
        for _ in 0..100 {
            let ticket = broker
                .acquire("k", wait, lease, Duration::ZERO)
                .await
                .unwrap();
            ticket.release().await.unwrap();
        }
        let allocations = allocations_in(async || {
            for _ in 0..ROUNDS {
                let ticket = broker
                    .acquire("k", wait, lease, Duration::ZERO)
                    .await
                    .unwrap();
                assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
            }
        })
        .await;
        // The server's lock table still allocates now and then (a node of
        // its ordered expiry index); one allocation per round, as a boxed
        // release future was, is far above this.
        assert!(
            allocations < ROUNDS / 4,
            "{allocations} allocations in {ROUNDS} acquire+release rounds"
        );
        broker.close().await;
        server.shutdown().await;
    });
}
