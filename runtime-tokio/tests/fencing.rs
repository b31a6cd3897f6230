//! The fencing example (`examples/fencing.rs`): a stale holder's write is
//! rejected by the database, and the fenced write is atomic.

#[allow(dead_code)] // the example's `main` is not used here
#[path = "../examples/fencing.rs"]
mod fencing;

use fencing::{WriteOutcome, create_schema, fenced_write, high_water, stale_holder_scenario};
use rusqlite::Connection;
use ticketing_tokio::client::ReleaseOutcome;
use ticketing_tokio::{ServeSettings, spawn_server};

fn store() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    create_schema(&db).unwrap();
    db
}

fn ledger(db: &Connection) -> Vec<(String, i64, String)> {
    let mut query = db
        .prepare("SELECT key, token, entry FROM ledger ORDER BY id")
        .unwrap();
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn only_a_token_above_the_high_water_writes() {
    let mut db = store();
    assert_eq!(
        fenced_write(&mut db, "k", 10, "first").unwrap(),
        WriteOutcome::Committed
    );
    for stale in [10, 9] {
        assert_eq!(
            fenced_write(&mut db, "k", stale, "stale").unwrap(),
            WriteOutcome::Stale { high_water: 10 }
        );
    }
    assert_eq!(
        fenced_write(&mut db, "other", 5, "other key").unwrap(),
        WriteOutcome::Committed
    );
    assert_eq!(
        fenced_write(&mut db, "k", 11, "second").unwrap(),
        WriteOutcome::Committed
    );
    assert_eq!(high_water(&db, "k").unwrap(), Some(11));
    // Rejected writes left no business rows behind.
    let entries: Vec<String> = ledger(&db).into_iter().map(|(_, _, e)| e).collect();
    assert_eq!(entries, ["first", "other key", "second"]);
}

#[test]
fn a_token_beyond_the_sqlite_range_is_refused_not_wrapped() {
    let mut db = store();
    assert!(fenced_write(&mut db, "k", u64::MAX, "x").is_err());
    assert!(ledger(&db).is_empty());
    assert_eq!(high_water(&db, "k").unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stalled_past_its_lease_cannot_write() {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mut db = store();

    let scenario = stale_holder_scenario(&server.local_addr().to_string(), &mut db)
        .await
        .unwrap();
    assert!(scenario.current_token > scenario.stale_token);
    assert_eq!(scenario.current_write, WriteOutcome::Committed);
    assert_eq!(
        scenario.stale_write,
        WriteOutcome::Stale {
            high_water: scenario.current_token
        }
    );
    // The server agrees: A's token is no longer current.
    assert_eq!(
        scenario.stale_release,
        ReleaseOutcome::AlreadyGoneOrNotCurrent
    );
    let rows = ledger(&db);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, "written by B");
    assert_eq!(
        high_water(&db, "account/7").unwrap(),
        Some(scenario.current_token)
    );

    server.shutdown().await;
}
