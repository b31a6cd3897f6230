//! Fencing shared (read) and exclusive (write) holders with SQLite: two
//! marks per resource (docs/protocol.md §8.7).
//!
//! Readers hold a key at the same time under different tokens, so one
//! high-water mark would refuse the older of two current readers. The
//! storage keeps two marks instead: `hw_x`, the largest token of a writer
//! that acted, and `hw_all`, the largest token of anyone that acted.
//!
//! - a read with token `t` is accepted iff `t >= hw_x` (equal only for the
//!   same grant: a writer that downgraded), raising `hw_all`;
//! - a write with token `t` is accepted iff `t >= hw_all`, raising both.
//!
//! Writer W1 takes `report` exclusive with a 1 s lease, writes, and stalls.
//! Readers R1 and R2 queue shared and are granted together when W1's lease
//! lapses; both read. W1 wakes and writes: refused. Then writer W2 queues;
//! R2 lets go and R1 (a 2 s lease) stalls until its lease lapses, so W2 is
//! granted and writes. R1 wakes and reads: refused.
//!
//! Run: `cargo run -p ticketing-tokio --example fencing_shared` (starts an
//! in-process server on a free loopback port).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use ticketing_tokio::client::TicketBroker;
use ticketing_tokio::{ServeSettings, spawn_server};

/// What a fenced operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// A read was accepted: the entries written so far, oldest first.
    Read(Vec<String>),
    /// A write was accepted and committed.
    Written,
    /// Refused: the token is stale for this operation; nothing changed.
    Stale {
        /// The mark it failed: `hw_x` for a read, `hw_all` for a write.
        mark: u64,
    },
}

/// Creates the two-mark fencing table and the business table.
pub fn create_schema(db: &Connection) -> rusqlite::Result<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS fence (
             resource TEXT PRIMARY KEY,
             hw_x INTEGER NOT NULL,
             hw_all INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS report (
             id INTEGER PRIMARY KEY,
             resource TEXT NOT NULL,
             token INTEGER NOT NULL,
             entry TEXT NOT NULL
         );",
    )
}

fn sql_token(token: u64) -> rusqlite::Result<i64> {
    i64::try_from(token).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// The marks of `resource`: (`hw_x`, `hw_all`), zero before anyone acted.
pub fn marks(db: &Connection, resource: &str) -> rusqlite::Result<(u64, u64)> {
    let marks = db
        .query_row(
            "SELECT hw_x, hw_all FROM fence WHERE resource = ?1",
            params![resource],
            |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
        )
        .optional()?
        .unwrap_or((0, 0));
    Ok((
        u64::try_from(marks.0).unwrap_or(0),
        u64::try_from(marks.1).unwrap_or(0),
    ))
}

/// A shared operation: reads `resource` if `token` is at least the last
/// writer's, raising `hw_all`, in one transaction.
pub fn fenced_read(db: &mut Connection, resource: &str, token: u64) -> rusqlite::Result<Fenced> {
    let t = sql_token(token)?;
    let tx = db.transaction()?;
    let accepted = tx.execute(
        "INSERT INTO fence (resource, hw_x, hw_all) VALUES (?1, 0, ?2)
         ON CONFLICT (resource) DO UPDATE SET hw_all = max(fence.hw_all, excluded.hw_all)
         WHERE excluded.hw_all >= fence.hw_x",
        params![resource, t],
    )?;
    if accepted == 0 {
        let (hw_x, _) = marks(&tx, resource)?;
        return Ok(Fenced::Stale { mark: hw_x });
    }
    let entries = {
        let mut query = tx.prepare("SELECT entry FROM report WHERE resource = ?1 ORDER BY id")?;
        query
            .query_map(params![resource], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?
    };
    tx.commit()?;
    Ok(Fenced::Read(entries))
}

/// An exclusive operation: writes `entry` to `resource` if `token` is at
/// least every token that acted on it, raising both marks, in one
/// transaction.
pub fn fenced_write(
    db: &mut Connection,
    resource: &str,
    token: u64,
    entry: &str,
) -> rusqlite::Result<Fenced> {
    let t = sql_token(token)?;
    let tx = db.transaction()?;
    let accepted = tx.execute(
        "INSERT INTO fence (resource, hw_x, hw_all) VALUES (?1, ?2, ?2)
         ON CONFLICT (resource) DO UPDATE SET hw_x = excluded.hw_x, hw_all = excluded.hw_all
         WHERE excluded.hw_all >= fence.hw_all",
        params![resource, t],
    )?;
    if accepted == 0 {
        let (_, hw_all) = marks(&tx, resource)?;
        return Ok(Fenced::Stale { mark: hw_all });
    }
    tx.execute(
        "INSERT INTO report (resource, token, entry) VALUES (?1, ?2, ?3)",
        params![resource, t, entry],
    )?;
    tx.commit()?;
    Ok(Fenced::Written)
}

/// What the scenario observed.
#[derive(Debug)]
pub struct SharedScenario {
    /// The tokens of W1, R1, R2, W2, in the order they were granted.
    pub tokens: [u64; 4],
    /// W1's write, R1's and R2's reads, W1's late write, W2's write, R1's
    /// late read.
    pub operations: [Fenced; 6],
}

/// Runs the scenario of the module docs against the server at `addr`.
pub async fn stale_holders_scenario(
    addr: &str,
    db: &mut Connection,
) -> Result<SharedScenario, Box<dyn std::error::Error>> {
    const KEY: &str = "report";
    let brokers = [(); 4].map(|()| TicketBroker::connect_loopback([addr]));
    for broker in &brokers {
        if !broker.wait_ready(Duration::from_secs(5)).await {
            return Err("cannot connect".into());
        }
    }
    let [w1_broker, r1_broker, r2_broker, w2_broker] = &brokers;
    let (long, wait, none) = (
        Duration::from_secs(30),
        Duration::from_secs(5),
        Duration::ZERO,
    );
    let w1 = w1_broker
        .acquire(KEY, none, Duration::from_secs(1), none)
        .await?;
    let w1_write = fenced_write(db, KEY, w1.token(), "W1's figures")?;
    // Both readers queue and are granted together once W1's lease lapses
    // (W1 stalls: it neither renews nor releases). Nothing sleeps.
    let (r1, r2) = tokio::try_join!(
        r1_broker.acquire_shared(KEY, wait, Duration::from_secs(2), none),
        r2_broker.acquire_shared(KEY, wait, long, none),
    )?;
    let r1_read = fenced_read(db, KEY, r1.token())?;
    let r2_read = fenced_read(db, KEY, r2.token())?;
    // W1 wakes up, unaware its lease ended, and writes.
    let w1_late = fenced_write(db, KEY, w1.token(), "W1's late figures")?;
    // W2 queues; R2 lets go, R1 stalls until its lease lapses.
    let w2_acquire = w2_broker.acquire(KEY, wait, long, none);
    let r2_token = r2.token();
    let (w2, released) = tokio::join!(w2_acquire, r2.release());
    released?;
    let w2 = w2?;
    let w2_write = fenced_write(db, KEY, w2.token(), "W2's figures")?;
    // R1 wakes up and reads.
    let r1_late = fenced_read(db, KEY, r1.token())?;
    let scenario = SharedScenario {
        tokens: [w1.token(), r1.token(), r2_token, w2.token()],
        operations: [w1_write, r1_read, r2_read, w1_late, w2_write, r1_late],
    };
    drop((w1, r1));
    w2.release().await?;
    for broker in brokers {
        broker.close().await;
    }
    Ok(scenario)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse()?)).await?;
    let mut db = Connection::open_in_memory()?;
    create_schema(&db)?;
    let scenario = stale_holders_scenario(&server.local_addr().to_string(), &mut db).await?;
    let [w1, r1, r2, w2] = scenario.tokens;
    println!("tokens: W1 {w1}, R1 {r1}, R2 {r2} (shared, together), W2 {w2}");
    let names = [
        "W1 writes",
        "R1 reads",
        "R2 reads",
        "W1 writes late",
        "W2 writes",
        "R1 reads late",
    ];
    for (name, operation) in names.iter().zip(&scenario.operations) {
        println!("{name}: {operation:?}");
    }
    server.shutdown().await;
    Ok(())
}
