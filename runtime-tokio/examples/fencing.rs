//! Fencing tokens with SQLite: why a lock alone is not enough.
//!
//! Client A takes `account/7` with a 1 s lease and then stalls (think GC
//! pause). Its lease lapses, client B gets the key and writes. When A wakes
//! it still believes it holds the lock and tries to write: the database
//! rejects it, because A's token is not above the key's high-water token.
//!
//! The check and the business write happen in ONE transaction: a fencing
//! row updated first and a business write done afterwards would not be safe.
//!
//! Run: `cargo run -p ticketing-tokio --example fencing` (starts an
//! in-process server on a free loopback port).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};
use ticketing_tokio::{ServeSettings, spawn_server};

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The token was above the high water: high water raised, row written.
    Committed,
    /// The token was not above the high water: nothing written.
    Stale {
        /// The key's high-water token at the time.
        high_water: u64,
    },
}

/// Creates the fencing table (one high-water token per key) and the
/// business table.
pub fn create_schema(db: &Connection) -> rusqlite::Result<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS fence (
             key TEXT PRIMARY KEY,
             high_water INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS ledger (
             id INTEGER PRIMARY KEY,
             key TEXT NOT NULL,
             token INTEGER NOT NULL,
             entry TEXT NOT NULL
         );",
    )
}

/// Writes `entry` for `key` only if `token` is above the key's high water,
/// raising the high water in the same transaction.
pub fn fenced_write(
    db: &mut Connection,
    key: &str,
    token: u64,
    entry: &str,
) -> rusqlite::Result<WriteOutcome> {
    // SQLite integers are i64; tokens (µs since the epoch, counting up)
    // stay far below that, and a token that did not would be refused here
    // rather than wrapped.
    let token_i64 =
        i64::try_from(token).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    let tx = db.transaction()?;
    // One conditional upsert: raises the high water only for a newer token.
    let raised = tx.execute(
        "INSERT INTO fence (key, high_water) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET high_water = excluded.high_water
         WHERE excluded.high_water > fence.high_water",
        params![key, token_i64],
    )?;
    if raised == 0 {
        let high_water: i64 = tx.query_row(
            "SELECT high_water FROM fence WHERE key = ?1",
            params![key],
            |row| row.get(0),
        )?;
        // Dropping `tx` rolls back (nothing was changed anyway).
        return Ok(WriteOutcome::Stale {
            high_water: u64::try_from(high_water).unwrap_or(0),
        });
    }
    tx.execute(
        "INSERT INTO ledger (key, token, entry) VALUES (?1, ?2, ?3)",
        params![key, token_i64, entry],
    )?;
    tx.commit()?;
    Ok(WriteOutcome::Committed)
}

/// The key's high-water token, if any write was accepted.
pub fn high_water(db: &Connection, key: &str) -> rusqlite::Result<Option<u64>> {
    db.query_row(
        "SELECT high_water FROM fence WHERE key = ?1",
        params![key],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|value| value.and_then(|v| u64::try_from(v).ok()))
}

/// What the stale-holder scenario observed.
#[derive(Debug)]
pub struct Scenario {
    /// Token of the holder whose lease lapsed.
    pub stale_token: u64,
    /// Token of the holder that took over.
    pub current_token: u64,
    /// The current holder's write.
    pub current_write: WriteOutcome,
    /// The stale holder's write after it woke up.
    pub stale_write: WriteOutcome,
    /// The stale holder's release.
    pub stale_release: ReleaseOutcome,
}

/// Runs the scenario of the module docs against the server at `addr`.
pub async fn stale_holder_scenario(
    addr: &str,
    db: &mut Connection,
) -> Result<Scenario, Box<dyn std::error::Error>> {
    const KEY: &str = "account/7";
    let a = TicketBroker::connect_loopback([addr]);
    let b = TicketBroker::connect_loopback([addr]);
    let ready = Duration::from_secs(5);
    if !a.wait_ready(ready).await || !b.wait_ready(ready).await {
        return Err("cannot connect".into());
    }

    // A: a 1 s lease, no work budget to cover (it is about to stall).
    let stale = a
        .acquire(KEY, Duration::ZERO, Duration::from_secs(1), Duration::ZERO)
        .await?;
    // A stalls. B queues on the key and is granted it when A's lease
    // lapses; nothing needs to sleep for that.
    let current = b
        .acquire(
            KEY,
            Duration::from_secs(5),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await?;
    let current_write = fenced_write(db, KEY, current.token(), "written by B")?;
    // A wakes up, unaware its lease ended, and writes.
    let stale_write = fenced_write(db, KEY, stale.token(), "written by A")?;
    let scenario = Scenario {
        stale_token: stale.token(),
        current_token: current.token(),
        current_write,
        stale_write,
        stale_release: stale.release().await?,
    };
    current.release().await?;
    a.close().await;
    b.close().await;
    Ok(scenario)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse()?)).await?;
    let mut db = Connection::open_in_memory()?;
    create_schema(&db)?;
    let scenario = stale_holder_scenario(&server.local_addr().to_string(), &mut db).await?;
    println!(
        "A held token {} and stalled past its 1 s lease",
        scenario.stale_token
    );
    println!(
        "B took over with token {}: write {:?}",
        scenario.current_token, scenario.current_write
    );
    println!(
        "A woke up and wrote with token {}: {:?}; its release: {:?}",
        scenario.stale_token, scenario.stale_write, scenario.stale_release
    );
    server.shutdown().await;
    Ok(())
}
