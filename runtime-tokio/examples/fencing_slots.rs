//! Fencing a semaphore's permits with SQLite: one high-water token per
//! slot.
//!
//! A semaphore lets several holders act at once, so one high-water token
//! for the whole semaphore would refuse a current holder whose token is
//! simply older than its neighbour's. Each slot has its own mark instead: a
//! write for slot `s` is accepted iff its token is at least `hw[s]` (a
//! holder may write many times under its token), raising `hw[s]`.
//!
//! Client A takes a permit of `exports` (capacity 2) with a 1 s lease and
//! stalls; client C holds the other slot. B queues and gets A's slot when
//! A's lease lapses. B writes to that slot, C (whose token is older than
//! B's) still writes to its own, and A, waking up, is refused.
//!
//! Run: `cargo run -p ticketing-tokio --example fencing_slots` (starts an
//! in-process server on a free loopback port).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use ticketing_tokio::client::TicketBroker;
use ticketing_tokio::{ServeSettings, spawn_server};

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotWrite {
    /// The token was at least the slot's high water: written.
    Committed,
    /// The token was below the slot's high water: nothing written.
    Stale {
        /// The slot's high-water token at the time.
        high_water: u64,
    },
}

/// Creates the per-slot fencing table and the business table.
pub fn create_schema(db: &Connection) -> rusqlite::Result<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS slot_fence (
             semaphore TEXT NOT NULL,
             slot INTEGER NOT NULL,
             high_water INTEGER NOT NULL,
             PRIMARY KEY (semaphore, slot)
         );
         CREATE TABLE IF NOT EXISTS work (
             id INTEGER PRIMARY KEY,
             semaphore TEXT NOT NULL,
             slot INTEGER NOT NULL,
             token INTEGER NOT NULL,
             entry TEXT NOT NULL
         );",
    )
}

/// Writes `entry` for `slot` of `semaphore` only if `token` is at least
/// the slot's high water, raising it in the same transaction.
pub fn fenced_slot_write(
    db: &mut Connection,
    (semaphore, slot): (&str, u16),
    token: u64,
    entry: &str,
) -> rusqlite::Result<SlotWrite> {
    let token_i64 =
        i64::try_from(token).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    let tx = db.transaction()?;
    let accepted = tx.execute(
        "INSERT INTO slot_fence (semaphore, slot, high_water) VALUES (?1, ?2, ?3)
         ON CONFLICT (semaphore, slot) DO UPDATE SET high_water = excluded.high_water
         WHERE excluded.high_water >= slot_fence.high_water",
        params![semaphore, slot, token_i64],
    )?;
    if accepted == 0 {
        let high_water: i64 = tx.query_row(
            "SELECT high_water FROM slot_fence WHERE semaphore = ?1 AND slot = ?2",
            params![semaphore, slot],
            |row| row.get(0),
        )?;
        return Ok(SlotWrite::Stale {
            high_water: u64::try_from(high_water).unwrap_or(0),
        });
    }
    tx.execute(
        "INSERT INTO work (semaphore, slot, token, entry) VALUES (?1, ?2, ?3, ?4)",
        params![semaphore, slot, token_i64, entry],
    )?;
    tx.commit()?;
    Ok(SlotWrite::Committed)
}

/// The slot's high-water token, if any write was accepted.
pub fn slot_high_water(
    db: &Connection,
    semaphore: &str,
    slot: u16,
) -> rusqlite::Result<Option<u64>> {
    db.query_row(
        "SELECT high_water FROM slot_fence WHERE semaphore = ?1 AND slot = ?2",
        params![semaphore, slot],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|value| value.and_then(|v| u64::try_from(v).ok()))
}

/// What the scenario observed.
#[derive(Debug)]
pub struct SlotScenario {
    /// A's slot and token (its lease lapsed).
    pub stale: (u16, u64),
    /// B's slot and token (it took A's slot over).
    pub taken_over: (u16, u64),
    /// C's slot and token (held all along, older than B's).
    pub neighbour: (u16, u64),
    /// B's write, C's two writes, A's write after waking.
    pub writes: [SlotWrite; 4],
}

/// Runs the scenario of the module docs against the server at `addr`.
pub async fn stale_permit_scenario(
    addr: &str,
    db: &mut Connection,
) -> Result<SlotScenario, Box<dyn std::error::Error>> {
    const NAME: &str = "exports";
    let [a, b, c] = [(); 3].map(|()| TicketBroker::connect_loopback([addr]));
    let ready = Duration::from_secs(5);
    for broker in [&a, &b, &c] {
        if !broker.wait_ready(ready).await {
            return Err("cannot connect".into());
        }
    }
    let long = Duration::from_secs(30);
    // A: a 1 s lease, then it stalls; C holds the other slot.
    let stale = a
        .acquire_permits(
            NAME,
            1,
            2,
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::ZERO,
        )
        .await?;
    let neighbour = c
        .acquire_permits(NAME, 1, 2, Duration::ZERO, long, Duration::ZERO)
        .await?;
    // B queues and gets A's slot when A's lease lapses: nothing sleeps.
    let taken_over = b
        .acquire_permits(
            NAME,
            1,
            2,
            Duration::from_secs(5),
            long,
            Duration::from_secs(1),
        )
        .await?;
    let slot = |set: &ticketing_tokio::TicketSet| set.slots()[0];
    let writes = [
        fenced_slot_write(
            db,
            (NAME, slot(&taken_over)),
            taken_over.token(),
            "B's export",
        )?,
        fenced_slot_write(
            db,
            (NAME, slot(&neighbour)),
            neighbour.token(),
            "C's export",
        )?,
        fenced_slot_write(db, (NAME, slot(&neighbour)), neighbour.token(), "C again")?,
        // A wakes up, unaware its lease ended, and writes to its slot.
        fenced_slot_write(db, (NAME, slot(&stale)), stale.token(), "A's export")?,
    ];
    let scenario = SlotScenario {
        stale: (slot(&stale), stale.token()),
        taken_over: (slot(&taken_over), taken_over.token()),
        neighbour: (slot(&neighbour), neighbour.token()),
        writes,
    };
    let _ = stale.release().await;
    taken_over.release().await?;
    neighbour.release().await?;
    for broker in [a, b, c] {
        broker.close().await;
    }
    Ok(scenario)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse()?)).await?;
    let mut db = Connection::open_in_memory()?;
    create_schema(&db)?;
    let scenario = stale_permit_scenario(&server.local_addr().to_string(), &mut db).await?;
    println!(
        "A held slot {} with token {} and stalled past its 1 s lease",
        scenario.stale.0, scenario.stale.1
    );
    println!(
        "B took slot {} with token {}; C holds slot {} with the older token {}",
        scenario.taken_over.0, scenario.taken_over.1, scenario.neighbour.0, scenario.neighbour.1
    );
    println!("writes (B, C, C again, A): {:?}", scenario.writes);
    server.shutdown().await;
    Ok(())
}
