//! The PostgreSQL fencing example (`examples/fencing_postgres.rs`) against
//! a real, private PostgreSQL: `initdb` into a scratch directory, started
//! on a free loopback port (no other address), stopped when the test ends.
//! Needs Debian's `postgresql` (CI installs it); without it the test fails
//! when `CI` is set and says it skipped otherwise.

mod common;
#[allow(dead_code)] // the example's `main` is not used here
#[path = "../examples/fencing_postgres.rs"]
mod fencing_postgres;

use std::path::PathBuf;
use std::process::Command;

use fencing_postgres::{
    WriteOutcome, connect, create_schema, fenced_slot_write, fenced_write, stale_holder_scenario,
    stale_permit_scenario,
};
use ticketing_tokio::client::ReleaseOutcome;
use ticketing_tokio::{ServeSettings, spawn_server};

/// The directory of PostgreSQL's server programs, if installed.
fn postgres_bin() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// True when this process runs as root (PostgreSQL refuses to).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// A private PostgreSQL server; stopped (immediately) and its directory
/// removed when dropped.
struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Removes the folder when the server is stopped.
    _scratch: common::scratch::Scratch,
}

impl Postgres {
    /// A command running PostgreSQL program `program`, as the `postgres`
    /// user when this process is root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        }
    }

    /// Runs PostgreSQL program `program` with `args` (as [`Self::command`]),
    /// panicking with its output if it fails.
    fn run(&self, program: &str, args: &[&str]) -> std::process::Output {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn start(bin: PathBuf) -> Postgres {
        let scratch = common::scratch::scratch_dir("postgres");
        std::fs::create_dir_all(&scratch.0).expect("create the scratch folder");
        let dir = scratch.0.clone();
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown of {}", dir.display());
        }
        let port = common::ports::free_port().port();
        let pg = Postgres {
            bin,
            dir,
            port,
            _scratch: scratch,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        // Loopback only, the socket in the scratch directory, and `-w`:
        // pg_ctl returns once the server accepts connections.
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off",
            pg.dir.display()
        );
        pg.run(
            "pg_ctl",
            &["-D", &data, "-o", &options, "-l", &pg.log(), "-w", "start"],
        );
        pg
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn log(&self) -> String {
        self.dir.join("server.log").display().to_string()
    }

    fn config(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// A private PostgreSQL, or `None` (after saying so) where it is not
/// installed and `CI` is not set.
fn postgres(test: &str) -> Option<Postgres> {
    match postgres_bin() {
        Some(bin) => Some(Postgres::start(bin)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: needs PostgreSQL (Debian's postgresql), and CI is set: failing instead of skipping"
            );
            eprintln!(
                "SKIPPED {test}: needs PostgreSQL (Debian's postgresql; .ci/run installs it)"
            );
            None
        }
    }
}

/// Against a real PostgreSQL: the rules themselves (a lock's mark needs a
/// larger token; a slot's mark takes the same token again), then both
/// stale-holder scenarios, each with the stale write refused and nothing
/// of it in the ledger.
#[tokio::test]
async fn postgres_refuses_the_stale_holders_write_for_a_lock_and_a_permit() {
    let Some(pg) = postgres("postgres_refuses_the_stale_holders_write") else {
        return;
    };
    let mut db = connect(&pg.config())
        .await
        .expect("connect to the private PostgreSQL");
    create_schema(&db).await.unwrap();

    // The rules, with tokens chosen here.
    assert_eq!(
        fenced_write(&mut db, "k", 10, "first").await.unwrap(),
        WriteOutcome::Committed
    );
    for stale in [10, 9] {
        assert_eq!(
            fenced_write(&mut db, "k", stale, "stale").await.unwrap(),
            WriteOutcome::Stale { high_water: 10 }
        );
    }
    assert_eq!(
        fenced_write(&mut db, "k", 11, "second").await.unwrap(),
        WriteOutcome::Committed
    );
    assert_eq!(
        fenced_slot_write(&mut db, "s", 0, 20, "slot 0")
            .await
            .unwrap(),
        WriteOutcome::Committed
    );
    assert_eq!(
        fenced_slot_write(&mut db, "s", 0, 20, "slot 0 again")
            .await
            .unwrap(),
        WriteOutcome::Committed
    );
    assert_eq!(
        fenced_slot_write(&mut db, "s", 0, 19, "slot 0 stale")
            .await
            .unwrap(),
        WriteOutcome::Stale { high_water: 20 }
    );
    // Another slot has its own mark: an older token writes there.
    assert_eq!(
        fenced_slot_write(&mut db, "s", 1, 5, "slot 1")
            .await
            .unwrap(),
        WriteOutcome::Committed
    );
    assert!(
        fenced_write(&mut db, "k", u64::MAX, "beyond")
            .await
            .is_err(),
        "a token beyond BIGINT is refused, not wrapped"
    );

    let server = spawn_server(ServeSettings::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let lock = stale_holder_scenario(&addr, &mut db).await.unwrap();
    let permit = stale_permit_scenario(&addr, &mut db).await.unwrap();
    for scenario in [&lock, &permit] {
        assert!(
            scenario.current_token > scenario.stale_token,
            "{scenario:?}"
        );
        assert_eq!(
            scenario.current_write,
            WriteOutcome::Committed,
            "{scenario:?}"
        );
        assert_eq!(
            scenario.stale_write,
            WriteOutcome::Stale {
                high_water: scenario.current_token
            },
            "{scenario:?}"
        );
        // The server agrees the stale holder no longer held anything.
        assert_ne!(
            scenario.stale_release,
            ReleaseOutcome::Released,
            "{scenario:?}"
        );
    }
    let stale_rows: i64 = db
        .query_one(
            "SELECT count(*) FROM ledger WHERE entry LIKE '%stale%' OR entry = 'written by A' OR entry = 'beyond'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale_rows, 0, "refused writes left no business rows");
    let rows: i64 = db
        .query_one("SELECT count(*) FROM ledger", &[])
        .await
        .unwrap()
        .get(0);
    // k×2, slot 0×2, slot 1, B's lock write, B's two permit writes.
    assert_eq!(rows, 8);
    server.shutdown().await;
}
