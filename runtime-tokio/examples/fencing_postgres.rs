//! Fencing tokens with PostgreSQL: a stale holder's write refused, for a
//! lock (one high-water token per key) and for a semaphore (one per slot).
//!
//! The rules:
//! - a lock's write for `key` is accepted iff its token is **above** the
//!   key's high water (every grant of a key has a new, larger token);
//! - a permit's write for slot `s` is accepted iff its token is **at least**
//!   `hw[s]` (a holder may write many times under its token, and the
//!   semaphore's other slots have their own holders with older tokens).
//!
//! Each check is one statement that raises the mark only when the rule
//! holds, in the same transaction as the business write: the row lock the
//! `UPDATE` takes makes a concurrent writer of the same key or slot wait
//! for this transaction, so no two writers can both pass the check.
//!
//! Run: `TICKETING_PG='host=127.0.0.1 port=5432 user=postgres' cargo run
//! -p ticketing-tokio --example fencing_postgres` (starts an in-process
//! lock server on a free loopback port; the database must exist).

use std::time::Duration;

use ticketing_tokio::client::{ReleaseOutcome, TicketBroker};
use ticketing_tokio::{ServeSettings, spawn_server};
use tokio_postgres::{Client, NoTls};

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The token passed the rule: mark raised (or kept), row written.
    Committed,
    /// The token failed the rule: nothing written.
    Stale {
        /// The high-water token it was compared with.
        high_water: u64,
    },
}

/// Creates the marks (per key and per slot) and the business table.
pub async fn create_schema(db: &Client) -> Result<(), tokio_postgres::Error> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS fence (
             key TEXT PRIMARY KEY,
             high_water BIGINT NOT NULL
         );
         CREATE TABLE IF NOT EXISTS slot_fence (
             semaphore TEXT NOT NULL,
             slot INTEGER NOT NULL,
             high_water BIGINT NOT NULL,
             PRIMARY KEY (semaphore, slot)
         );
         CREATE TABLE IF NOT EXISTS ledger (
             id BIGSERIAL PRIMARY KEY,
             key TEXT NOT NULL,
             token BIGINT NOT NULL,
             entry TEXT NOT NULL
         );",
    )
    .await
}

/// PostgreSQL's `BIGINT` is signed: tokens (µs since the epoch, counting
/// up) stay far below its top, and one that did not is refused here
/// rather than wrapped into a negative mark.
fn as_bigint(token: u64) -> Result<i64, Box<dyn std::error::Error>> {
    i64::try_from(token).map_err(|_| format!("token {token} beyond BIGINT").into())
}

/// Writes `entry` for `key` only if `token` is above the key's high water,
/// raising the mark in the same transaction.
pub async fn fenced_write(
    db: &mut Client,
    key: &str,
    token: u64,
    entry: &str,
) -> Result<WriteOutcome, Box<dyn std::error::Error>> {
    let token = as_bigint(token)?;
    let tx = db.transaction().await?;
    // Insert the mark or raise it; the WHERE makes a stale token change
    // nothing, and RETURNING says which happened.
    let raised = tx
        .query_opt(
            "INSERT INTO fence (key, high_water) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET high_water = EXCLUDED.high_water
             WHERE fence.high_water < EXCLUDED.high_water
             RETURNING high_water",
            &[&key, &token],
        )
        .await?;
    if raised.is_none() {
        let high_water: i64 = tx
            .query_one("SELECT high_water FROM fence WHERE key = $1", &[&key])
            .await?
            .get(0);
        tx.rollback().await?;
        return Ok(WriteOutcome::Stale {
            high_water: high_water as u64,
        });
    }
    tx.execute(
        "INSERT INTO ledger (key, token, entry) VALUES ($1, $2, $3)",
        &[&key, &token, &entry],
    )
    .await?;
    tx.commit().await?;
    Ok(WriteOutcome::Committed)
}

/// Writes `entry` for slot `slot` of `semaphore` only if `token` is at
/// least the slot's high water, raising the mark in the same transaction.
pub async fn fenced_slot_write(
    db: &mut Client,
    semaphore: &str,
    slot: u16,
    token: u64,
    entry: &str,
) -> Result<WriteOutcome, Box<dyn std::error::Error>> {
    let token = as_bigint(token)?;
    let slot_number = i32::from(slot);
    let tx = db.transaction().await?;
    let passed = tx
        .query_opt(
            "INSERT INTO slot_fence (semaphore, slot, high_water) VALUES ($1, $2, $3)
             ON CONFLICT (semaphore, slot) DO UPDATE SET high_water = EXCLUDED.high_water
             WHERE slot_fence.high_water <= EXCLUDED.high_water
             RETURNING high_water",
            &[&semaphore, &slot_number, &token],
        )
        .await?;
    if passed.is_none() {
        let high_water: i64 = tx
            .query_one(
                "SELECT high_water FROM slot_fence WHERE semaphore = $1 AND slot = $2",
                &[&semaphore, &slot_number],
            )
            .await?
            .get(0);
        tx.rollback().await?;
        return Ok(WriteOutcome::Stale {
            high_water: high_water as u64,
        });
    }
    let key = format!("{semaphore}[{slot}]");
    tx.execute(
        "INSERT INTO ledger (key, token, entry) VALUES ($1, $2, $3)",
        &[&key, &token, &entry],
    )
    .await?;
    tx.commit().await?;
    Ok(WriteOutcome::Committed)
}

/// What a stale-holder scenario observed.
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

/// Two brokers on the server at `addr`, ready.
async fn brokers(addr: &str) -> Result<(TicketBroker, TicketBroker), Box<dyn std::error::Error>> {
    let a = TicketBroker::connect_loopback([addr]);
    let b = TicketBroker::connect_loopback([addr]);
    let ready = Duration::from_secs(5);
    if !a.wait_ready(ready).await || !b.wait_ready(ready).await {
        return Err("cannot connect to the lock server".into());
    }
    Ok((a, b))
}

/// A lock: A takes `account/7` with a 1 s lease and stalls; B queues and
/// is granted the key when A's lease lapses, and writes; A wakes and
/// writes with its old token, which the database refuses.
pub async fn stale_holder_scenario(
    addr: &str,
    db: &mut Client,
) -> Result<Scenario, Box<dyn std::error::Error>> {
    const KEY: &str = "account/7";
    let (a, b) = brokers(addr).await?;
    let stale = a
        .acquire(KEY, Duration::ZERO, Duration::from_secs(1), Duration::ZERO)
        .await?;
    // Nothing sleeps: B's wait ends when A's lease does.
    let current = b
        .acquire(
            KEY,
            Duration::from_secs(5),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await?;
    let current_write = fenced_write(db, KEY, current.token(), "written by B").await?;
    let stale_write = fenced_write(db, KEY, stale.token(), "written by A").await?;
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

/// A semaphore of one slot: A takes the permit with a 1 s lease and
/// stalls; B is granted the same slot when A's lease lapses and writes
/// twice under its token; A wakes and writes to the slot, refused.
pub async fn stale_permit_scenario(
    addr: &str,
    db: &mut Client,
) -> Result<Scenario, Box<dyn std::error::Error>> {
    const SEMAPHORE: &str = "exports";
    let (a, b) = brokers(addr).await?;
    let stale = a
        .acquire_permits(
            SEMAPHORE,
            1,
            1,
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::ZERO,
        )
        .await?;
    let current = b
        .acquire_permits(
            SEMAPHORE,
            1,
            1,
            Duration::from_secs(5),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await?;
    let (stale_slot, current_slot) = (stale.slots()[0], current.slots()[0]);
    assert_eq!(stale_slot, current_slot, "one slot: B takes A's");
    let current_write =
        fenced_slot_write(db, SEMAPHORE, current_slot, current.token(), "B, first").await?;
    // A holder writes as often as it likes under its token (≥, not >).
    let again = fenced_slot_write(db, SEMAPHORE, current_slot, current.token(), "B, again").await?;
    assert_eq!(again, WriteOutcome::Committed);
    let stale_write =
        fenced_slot_write(db, SEMAPHORE, stale_slot, stale.token(), "written by A").await?;
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

/// Connects to PostgreSQL with `config` (a libpq-style string), driving
/// the connection on a task of its own.
pub async fn connect(config: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("postgres connection ended: {error}");
        }
    });
    Ok(client)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = std::env::var("TICKETING_PG").map_err(|_| {
        "set TICKETING_PG to a PostgreSQL connection string, e.g. \
         'host=127.0.0.1 port=5432 user=postgres'"
    })?;
    let mut db = connect(&config).await?;
    create_schema(&db).await?;
    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse()?)).await?;
    let addr = server.local_addr().to_string();
    for (what, scenario) in [
        ("lock", stale_holder_scenario(&addr, &mut db).await?),
        ("semaphore", stale_permit_scenario(&addr, &mut db).await?),
    ] {
        println!(
            "{what}: A held token {} and stalled past its 1 s lease; B took over with token {}: {:?}; \
             A's late write: {:?}; A's release: {:?}",
            scenario.stale_token,
            scenario.current_token,
            scenario.current_write,
            scenario.stale_write,
            scenario.stale_release
        );
    }
    server.shutdown().await;
    Ok(())
}
