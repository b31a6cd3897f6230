//! The per-slot fencing example (`examples/fencing_slots.rs`): a
//! semaphore's holders write side by side, each fenced by its own slot's
//! high water, and a holder whose slot was handed on is refused.

#[allow(dead_code)] // the example's `main` is not used here
#[path = "../examples/fencing_slots.rs"]
mod fencing_slots;

use fencing_slots::{
    SlotWrite, create_schema, fenced_slot_write, slot_high_water, stale_permit_scenario,
};
use rusqlite::Connection;
use ticketing_tokio::{ServeSettings, spawn_server};

fn store() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    create_schema(&db).unwrap();
    db
}

#[test]
fn a_slot_takes_its_current_token_again_and_refuses_an_older_one() {
    let mut db = store();
    let write = |db: &mut Connection, slot, token| fenced_slot_write(db, ("s", slot), token, "x");
    assert_eq!(write(&mut db, 0, 10).unwrap(), SlotWrite::Committed);
    assert_eq!(write(&mut db, 0, 10).unwrap(), SlotWrite::Committed);
    assert_eq!(
        write(&mut db, 0, 9).unwrap(),
        SlotWrite::Stale { high_water: 10 }
    );
    // Another slot has its own mark: an older token is fine there.
    assert_eq!(write(&mut db, 1, 5).unwrap(), SlotWrite::Committed);
    assert_eq!(slot_high_water(&db, "s", 0).unwrap(), Some(10));
    assert_eq!(slot_high_water(&db, "s", 1).unwrap(), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_that_stalled_past_its_lease_cannot_write_to_its_slot() {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mut db = store();
    let scenario = stale_permit_scenario(&server.local_addr().to_string(), &mut db)
        .await
        .unwrap();
    // B got A's slot, under a larger token than both others.
    assert_eq!(scenario.taken_over.0, scenario.stale.0);
    assert_ne!(scenario.neighbour.0, scenario.stale.0);
    assert!(scenario.taken_over.1 > scenario.stale.1);
    assert!(scenario.taken_over.1 > scenario.neighbour.1);
    assert_eq!(
        scenario.writes,
        [
            SlotWrite::Committed,
            // C's token is older than B's, yet C still holds its slot.
            SlotWrite::Committed,
            SlotWrite::Committed,
            SlotWrite::Stale {
                high_water: scenario.taken_over.1
            },
        ]
    );
    server.shutdown().await;
}
