//! The two-mark fencing example (`examples/fencing_shared.rs`): readers
//! act side by side under different tokens, a writer whose lease lapsed
//! under readers is refused, and so is a reader whose lease lapsed under
//! a writer.

#[allow(dead_code)] // the example's `main` is not used here
#[path = "../examples/fencing_shared.rs"]
mod fencing_shared;

use fencing_shared::{
    Fenced, create_schema, fenced_read, fenced_write, marks, stale_holders_scenario,
};
use rusqlite::Connection;
use ticketing_tokio::{ServeSettings, spawn_server};

fn store() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    create_schema(&db).unwrap();
    db
}

#[test]
fn readers_pass_each_other_and_the_marks_fence_both_modes() {
    let mut db = store();
    assert_eq!(
        fenced_write(&mut db, "r", 10, "a").unwrap(),
        Fenced::Written
    );
    // Two readers with different tokens, both above the writer's.
    let read = |db: &mut Connection, t| fenced_read(db, "r", t).unwrap();
    assert_eq!(read(&mut db, 12), Fenced::Read(vec!["a".into()]));
    assert_eq!(read(&mut db, 11), Fenced::Read(vec!["a".into()]));
    assert_eq!(marks(&db, "r").unwrap(), (10, 12));
    // The writer itself downgraded: its token equals the writer mark.
    assert_eq!(read(&mut db, 10), Fenced::Read(vec!["a".into()]));
    // A writer older than a reader that acted is refused.
    assert_eq!(
        fenced_write(&mut db, "r", 11, "b").unwrap(),
        Fenced::Stale { mark: 12 }
    );
    assert_eq!(
        fenced_write(&mut db, "r", 13, "c").unwrap(),
        Fenced::Written
    );
    // A reader older than the last writer is refused.
    assert_eq!(read(&mut db, 12), Fenced::Stale { mark: 13 });
    assert_eq!(marks(&db, "r").unwrap(), (13, 13));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_and_a_stale_reader_are_refused() {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mut db = store();
    let scenario = stale_holders_scenario(&server.local_addr().to_string(), &mut db)
        .await
        .unwrap();
    let [w1, r1, r2, w2] = scenario.tokens;
    assert!(w1 < r1.min(r2) && r1.max(r2) < w2, "{:?}", scenario.tokens);
    let figures = vec!["W1's figures".to_owned()];
    assert_eq!(
        scenario.operations,
        [
            Fenced::Written,
            Fenced::Read(figures.clone()),
            Fenced::Read(figures),
            Fenced::Stale { mark: r1.max(r2) },
            Fenced::Written,
            Fenced::Stale { mark: w2 },
        ]
    );
    server.shutdown().await;
}
