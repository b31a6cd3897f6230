//! An application that embeds the lock: 32 tasks sell seats from one shared
//! inventory, taking turns through an in-process Ticketing lock, while a
//! "second process" (here a thread running the published `ticketing` 0.4.0
//! client on tokio) reaches the same lock over TCP.
//!
//! Every write to the inventory is fenced: it is rejected unless its token is
//! above the highest token seen so far, as a database would do in the same
//! transaction.
//!
//! `cargo run -p ticketing-smol --example embedded`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ticketing_smol::{EmbeddedServer, ReleaseOutcome};

const KEY: &str = "inventory/block-a";
const WAIT: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(30);
const BUDGET: Duration = Duration::from_secs(1);
const TASKS: usize = 32;
const SALES_PER_TASK: usize = 10;
const REMOTE_SALES: usize = 10;

/// The protected resource, standing in for a database row.
#[derive(Debug, Default)]
struct Inventory {
    sold: usize,
    /// The highest fencing token that wrote here.
    high_water: u64,
    rejected_writes: usize,
}

impl Inventory {
    /// One fenced write: only a token above every earlier one may write.
    fn sell(&mut self, token: u64) -> bool {
        if token <= self.high_water {
            self.rejected_writes += 1;
            return false;
        }
        self.high_water = token;
        self.sold += 1;
        true
    }
}

fn main() {
    // In-process lock, also exposed on a loopback port for other processes.
    let server = EmbeddedServer::builder()
        .listen("127.0.0.1:0".parse().expect("address"))
        .start()
        .expect("embedded server starts");
    let addr = server.local_addr().expect("listening").to_string();
    println!("embedded Ticketing listening on {addr}");

    let inventory = Arc::new(Mutex::new(Inventory::default()));

    // The "second process": the published client, over TCP.
    let remote = {
        let inventory = Arc::clone(&inventory);
        let addr = addr.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async move {
                let broker = ticketing::TicketBroker::connect_loopback([addr]);
                assert!(
                    broker.wait_ready(Duration::from_secs(5)).await,
                    "remote connects"
                );
                for _ in 0..REMOTE_SALES {
                    let ticket = broker
                        .acquire(KEY, WAIT, LEASE, BUDGET)
                        .await
                        .expect("remote acquires");
                    assert!(inventory.lock().unwrap().sell(ticket.token()));
                    ticket.release().await.expect("remote releases");
                }
                broker.close().await;
            });
        })
    };

    // The application itself: many tasks, one in-process broker.
    let broker = server.broker();
    smol::block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let broker = broker.clone();
                let inventory = Arc::clone(&inventory);
                smol::spawn(async move {
                    for _ in 0..SALES_PER_TASK {
                        let ticket = broker
                            .acquire(KEY, WAIT, LEASE, BUDGET)
                            .await
                            .expect("acquired");
                        // Critical section: the fenced write.
                        assert!(inventory.lock().unwrap().sell(ticket.token()));
                        assert_eq!(
                            ticket.release().await.expect("released"),
                            ReleaseOutcome::Released
                        );
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await;
        }
        broker.close().await;
    });
    remote.join().expect("remote thread");

    let inventory = inventory.lock().unwrap();
    println!(
        "sold {} seats ({} in-process, {} remote), {} fenced writes rejected, last token {}",
        inventory.sold,
        TASKS * SALES_PER_TASK,
        REMOTE_SALES,
        inventory.rejected_writes,
        inventory.high_water
    );
    assert_eq!(inventory.sold, TASKS * SALES_PER_TASK + REMOTE_SALES);
    assert_eq!(inventory.rejected_writes, 0);
    drop(inventory);
    smol::block_on(server.shutdown());
}
