//! `ticketing locks ls|show|release` and `ticketing status`: requests to a
//! node's admin listener ([`ticketing_tokio::admin_client`]), rendered as
//! tables, or the JSON answer as is with `--json`. Exit codes:
//! [`ticketing_tokio::config::admin_exit`].

use std::net::SocketAddr;
use std::process::ExitCode;

use serde_json::Value;
use ticketing_tokio::admin_client::AdminClientError;
use ticketing_tokio::admin_client::{self, AdminAnswer, encode_component};
use ticketing_tokio::config::{
    AdminArgs, ENV_ADMIN, ENV_ADMIN_TOKEN, ENV_ADMIN_TOKENS, LocksCommand, admin_exit,
};
use ticketing_tokio::terminal::{terminal_safe, terminal_safe_json};

/// The admin address the CLI uses when none is given.
const DEFAULT_ADMIN: &str = "127.0.0.1:9225";

struct Failure {
    code: u8,
    message: String,
}

fn failure(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

fn finish(what: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("ticketing {what}: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failure(admin_exit::SOFTWARE, format!("cannot start: {e}")))
}

/// `ticketing locks …`.
pub fn locks(command: LocksCommand) -> ExitCode {
    let result = runtime().and_then(|rt| rt.block_on(run_locks(command)));
    finish("locks", result)
}

/// `ticketing status`.
pub fn status(args: AdminArgs) -> ExitCode {
    let result = runtime().and_then(|rt| rt.block_on(run_status(args)));
    finish("status", result)
}

fn admin_addrs(args: &AdminArgs) -> Result<Vec<SocketAddr>, Failure> {
    let texts = if args.admins.is_empty() {
        vec![std::env::var(ENV_ADMIN).unwrap_or_else(|_| DEFAULT_ADMIN.to_owned())]
    } else {
        args.admins.clone()
    };
    texts
        .iter()
        .map(|text| {
            text.trim().parse().map_err(|_| {
                failure(
                    admin_exit::USAGE,
                    format!("--admin {text:?}: expected IP:PORT such as {DEFAULT_ADMIN}"),
                )
            })
        })
        .collect()
}

fn admin_token(args: &AdminArgs) -> Result<Option<String>, Failure> {
    if let Some(path) = &args.admin_token_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            failure(
                admin_exit::USAGE,
                format!("--admin-token-file {}: {e}", path.display()),
            )
        })?;
        let token = text
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty() && !line.starts_with('#'))
            .ok_or_else(|| {
                failure(
                    admin_exit::USAGE,
                    format!("--admin-token-file {}: holds no token", path.display()),
                )
            })?;
        return Ok(Some(token.to_owned()));
    }
    // The server's plural list works here too: its first token.
    let from_list = || {
        std::env::var(ENV_ADMIN_TOKENS)
            .ok()
            .and_then(|list| list.split(',').next().map(str::to_owned))
    };
    Ok(std::env::var(ENV_ADMIN_TOKEN)
        .ok()
        .or_else(from_list)
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty()))
}

async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<AdminAnswer, Failure> {
    let answer = call_once(addr, method, path, token).await?;
    // A cluster follower names the leader's admin address: ask there, once
    // (the same request; a second redirect is reported as it is).
    if answer.status == 307
        && let Some(leader) = redirect_target(&answer).await
    {
        return call_once(leader, method, path, token).await;
    }
    Ok(answer)
}

async fn call_once(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<AdminAnswer, Failure> {
    admin_client::request(addr, method, path, token)
        .await
        .map_err(|e| {
            let hint = match &e {
                AdminClientError::Connect(io)
                    if io.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    " (is the server's admin listener on? it is off unless the server runs with \
                     --admin-listen ADDR, or admin_listen in its config)"
                }
                _ => "",
            };
            failure(
                admin_exit::UNAVAILABLE,
                format!("admin listener {addr}: {e}{hint}"),
            )
        })
}

/// The leader's admin address a `307` names (`leader_admin`, `HOST:PORT`).
async fn redirect_target(answer: &AdminAnswer) -> Option<SocketAddr> {
    let body: Value = serde_json::from_str(&answer.body).ok()?;
    let leader = body.get("leader_admin")?.as_str()?;
    tokio::net::lookup_host(leader).await.ok()?.next()
}

/// A JSON answer, or the failure its status code means.
fn json_answer(addr: SocketAddr, answer: &AdminAnswer) -> Result<Value, Failure> {
    let body: Option<Value> = serde_json::from_str(&answer.body).ok();
    // The server's words may quote a key: shown escaped, like every key.
    let message = body
        .as_ref()
        .and_then(|b| b.get("message"))
        .and_then(Value::as_str)
        .map_or_else(
            || terminal_safe(answer.body.trim().as_bytes()),
            |message| terminal_safe(message.as_bytes()),
        );
    let code = match answer.status {
        200 => {
            return body.ok_or_else(|| {
                failure(
                    admin_exit::SOFTWARE,
                    format!("admin listener {addr}: the answer is not JSON"),
                )
            });
        }
        401 => {
            return Err(failure(
                admin_exit::AUTH,
                format!(
                    "401 unauthorized: {message} (give --admin-token-file or {ENV_ADMIN_TOKEN})"
                ),
            ));
        }
        403 => {
            return Err(failure(
                admin_exit::AUTH,
                format!("403 forbidden: {message}"),
            ));
        }
        400 => admin_exit::USAGE,
        404 | 409 => admin_exit::NO,
        503 => admin_exit::UNAVAILABLE,
        504 => admin_exit::INDETERMINATE,
        _ => admin_exit::SOFTWARE,
    };
    let mut text = format!("{} {message}", answer.status);
    if let Some(held) = body.as_ref().and_then(|b| b.get("held")) {
        text.push_str(&format!(" (held by token {held})"));
    }
    Err(failure(code, text))
}

/// `value` as pretty JSON, with no character a terminal would obey (keys
/// are any bytes a client chose; the JSON still decodes to them exactly).
fn print_json(value: &Value) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    println!("{}", terminal_safe_json(&text));
}

fn single_addr(args: &AdminArgs) -> Result<SocketAddr, Failure> {
    let addrs = admin_addrs(args)?;
    match addrs.as_slice() {
        [addr] => Ok(*addr),
        _ => Err(failure(
            admin_exit::USAGE,
            "give one --admin for this command",
        )),
    }
}

async fn run_locks(command: LocksCommand) -> Result<(), Failure> {
    match command {
        LocksCommand::Ls {
            prefix,
            limit,
            admin,
        } => {
            let addr = single_addr(&admin)?;
            let token = admin_token(&admin)?;
            let value = list_pages(addr, &prefix, limit, token.as_deref()).await?;
            if admin.json {
                print_json(&value);
            } else {
                print_listing(&value);
            }
            Ok(())
        }
        LocksCommand::Show { key, admin } => {
            let addr = single_addr(&admin)?;
            let token = admin_token(&admin)?;
            let path = format!("/v1/locks/{}", encode_component(&key));
            let answer = call(addr, "GET", &path, token.as_deref()).await?;
            let value = json_answer(addr, &answer)?;
            if admin.json {
                print_json(&value);
            } else {
                print_lock(&value);
            }
            Ok(())
        }
        LocksCommand::Release { key, token, admin } => {
            let addr = single_addr(&admin)?;
            let admin_token = admin_token(&admin)?;
            let mut path = format!("/v1/locks/{}/release", encode_component(&key));
            if let Some(token) = token {
                path.push_str(&format!("?token={token}"));
            }
            let answer = call(addr, "POST", &path, admin_token.as_deref()).await?;
            let value = json_answer(addr, &answer)?;
            if admin.json {
                print_json(&value);
            } else {
                let revoked = &value["revoked"];
                let keys = keys_text(&value);
                match value["handed_to"].as_u64() {
                    Some(next) => println!(
                        "released {keys}: token {revoked} revoked (fenced); handed to token {next}"
                    ),
                    None => println!("released {keys}: token {revoked} revoked (fenced); now free"),
                }
            }
            Ok(())
        }
    }
}

/// `1.5s`, `250ms`, `3m05s`: a duration in milliseconds for a table.
fn duration(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".to_owned();
    };
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}.{}s", ms / 1_000, ms % 1_000 / 100)
    } else {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1_000)
    }
}

fn conn_text(conn: &Value) -> String {
    if conn.is_null() {
        return "-".to_owned();
    }
    let label = match conn["label"].as_str() {
        Some(label) => format!(" {}", terminal_safe(label.as_bytes())),
        None => String::new(),
    };
    format!(
        "conn {} {} {}{label}",
        conn["id"],
        shown(&conn["source"]),
        shown(&conn["dialect"])
    )
}

/// A server's string, escaped for the terminal; `?` if it is none.
fn shown(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| "?".to_owned(), |text| terminal_safe(text.as_bytes()))
}

fn keys_text(value: &Value) -> String {
    let keys: Vec<String> = value["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(Value::as_str)
                .map(|key| terminal_safe(key.as_bytes()))
                .collect()
        })
        .unwrap_or_default();
    let text = keys.join(",");
    if value["keys_encoding"] == "hex" {
        format!("{text} (hex)")
    } else {
        text
    }
}

fn key_text(value: &Value) -> String {
    let key = shown(&value["key"]);
    if value["key_encoding"] == "hex" {
        format!("{key} (hex)")
    } else {
        key
    }
}

/// Rows as left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        println!("{}", line.trim_end());
    }
}

/// Most pages `locks ls` asks for: enough to scan a table of tens of
/// millions of keys (each page examines a bounded part of it).
const LISTING_PAGES_MAX: usize = 4_096;

/// Asks for pages of the listing (each one bounded work for the server)
/// until `limit` locks came or the scan ended, and returns them as one
/// answer: `locks` ascending by key, at most `limit`, with the
/// `next_cursor` to go on from if the scan did not end.
async fn list_pages(
    addr: SocketAddr,
    prefix: &str,
    limit: u64,
    token: Option<&str>,
) -> Result<Value, Failure> {
    let limit_max = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut locks: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut redacted = false;
    for _ in 0..LISTING_PAGES_MAX {
        let wanted = limit_max.saturating_sub(locks.len()).max(1);
        let mut path = format!(
            "/v1/locks?prefix={}&limit={wanted}",
            encode_component(prefix)
        );
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={}", encode_component(cursor)));
        }
        let answer = call(addr, "GET", &path, token).await?;
        let mut page = json_answer(addr, &answer)?;
        redacted |= page["redacted"] == true;
        if let Some(found) = page["locks"].as_array_mut() {
            locks.append(found);
        }
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() || locks.len() >= limit_max {
            break;
        }
    }
    locks.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
    locks.truncate(limit_max);
    Ok(serde_json::json!({
        "locks": locks,
        "next_cursor": cursor,
        "truncated": cursor.is_some(),
        "redacted": redacted,
    }))
}

fn print_listing(value: &Value) {
    let mut rows = vec![vec![
        "KEY".to_owned(),
        "TOKEN".to_owned(),
        "HELD".to_owned(),
        "LEASE LEFT".to_owned(),
        "WAITERS".to_owned(),
        "HOLDER".to_owned(),
    ]];
    for lock in value["locks"].as_array().into_iter().flatten() {
        let holder = &lock["holder"];
        rows.push(vec![
            key_text(lock),
            holder["token"]
                .as_u64()
                .map_or("-".to_owned(), |t| t.to_string()),
            duration(holder["held_ms"].as_u64()),
            duration(holder["lease_remaining_ms"].as_u64()),
            lock["waiters_total"].to_string(),
            conn_text(&holder["conn"]) + &sharers_note(lock),
        ]);
    }
    table(&rows);
    if value["truncated"] == true {
        println!("(more keys may match: raise --limit or narrow --prefix)");
    }
    if value["redacted"] == true {
        println!("(tokens and client addresses hidden: give an admin token to see them)");
    }
}

/// For a key held shared, how many share it (nothing otherwise).
fn sharers_note(lock: &Value) -> String {
    match lock["sharers"].as_array() {
        Some(sharers) if lock["mode"] == "shared" => {
            format!("  (shared by {})", sharers.len())
        }
        _ => String::new(),
    }
}

fn print_lock(value: &Value) {
    println!("key      {}", key_text(value));
    let holder = &value["holder"];
    if holder.is_null() {
        println!("holder   none");
    } else {
        println!(
            "holder   token {}  held {}  lease left {}  granted at {}  {}",
            holder["token"],
            duration(holder["held_ms"].as_u64()),
            duration(holder["lease_remaining_ms"].as_u64()),
            shown(&holder["granted_at"]),
            conn_text(&holder["conn"]),
        );
        if holder["keys"].as_array().is_some_and(|keys| keys.len() > 1) {
            println!("         set {}", keys_text(holder));
        }
        let renewed = holder["extensions"].as_u64().unwrap_or(0);
        if renewed > 0 || holder["hold_remaining_ms"].is_u64() {
            println!(
                "         renewed {renewed} times  hold cap in {}",
                duration(holder["hold_remaining_ms"].as_u64())
            );
        }
    }
    print_sharers(value);
    let waiters = value["waiters"].as_array().cloned().unwrap_or_default();
    println!("waiters  {}", value["waiters_total"]);
    if waiters.is_empty() {
        return;
    }
    let mut rows = vec![vec![
        "#".to_owned(),
        "WAITED".to_owned(),
        "WAIT LEFT".to_owned(),
        "CONNECTION".to_owned(),
        "KEYS".to_owned(),
    ]];
    for waiter in &waiters {
        rows.push(vec![
            waiter["position"].to_string(),
            duration(waiter["waited_ms"].as_u64()),
            duration(waiter["wait_remaining_ms"].as_u64()),
            conn_text(&waiter["conn"]),
            match waiter["mode"].as_str() {
                Some("shared") => format!("{} (shared)", keys_text(waiter)),
                _ => keys_text(waiter),
            },
        ]);
    }
    table(&rows);
    let total = value["waiters_total"].as_u64().unwrap_or(0);
    if total > waiters.len() as u64 {
        println!("({} more waiters not listed)", total - waiters.len() as u64);
    }
}

/// The sharer batch of a key held shared, one line per holder (nothing
/// for a key held exclusive).
fn print_sharers(value: &Value) {
    let sharers = value["sharers"].as_array().cloned().unwrap_or_default();
    if value["mode"] != "shared" {
        return;
    }
    println!("mode     shared by {}", sharers.len());
    for sharer in &sharers {
        println!(
            "sharer   token {}  held {}  lease left {}  {}",
            sharer["token"],
            duration(sharer["held_ms"].as_u64()),
            duration(sharer["lease_remaining_ms"].as_u64()),
            conn_text(&sharer["conn"]),
        );
    }
}

/// The sum of the samples of metric `name` whose labels include every one
/// of `labels` (OpenMetrics text; our own exposition, so simple lines).
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_text, value) = match rest.strip_prefix('{') {
            Some(after) => match after.split_once("} ") {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        if !labels.iter().all(|label| label_text.contains(label)) {
            continue;
        }
        if let Ok(value) = value.trim().parse::<f64>() {
            // Gauges here are counts: whole numbers.
            *found.get_or_insert(0) += value as u64;
        }
    }
    found
}

async fn run_status(args: AdminArgs) -> Result<(), Failure> {
    let addrs = admin_addrs(&args)?;
    let mut rows = vec![
        [
            "ADMIN",
            "READY",
            "ROLE",
            "TERM",
            "COMMIT",
            "APPLIED",
            "HELD KEYS",
            "WAITERS",
            "SESSIONS",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    let mut all_ready = true;
    let mut reached = 0;
    for addr in &addrs {
        let status = node_status(*addr).await;
        reached += usize::from(status.reached);
        all_ready &= status.ready;
        if args.json {
            // JSON Lines: one object per node, each on its own line as it
            // is known, for `jq` and line-based log shippers alike.
            let text = status.json.to_string();
            println!("{}", terminal_safe_json(&text));
        }
        rows.push(status.row);
    }
    if !args.json {
        table(&rows);
    }
    if reached == 0 {
        return Err(failure(
            admin_exit::UNAVAILABLE,
            "no admin listener could be reached",
        ));
    }
    if !all_ready {
        return Err(failure(admin_exit::NO, "not every node is ready"));
    }
    Ok(())
}

/// One node's line of `ticketing admin status`.
struct NodeStatus {
    /// Its `/readyz` and `/metrics` both answered.
    reached: bool,
    ready: bool,
    row: Vec<String>,
    json: Value,
}

/// Asks the admin listener at `addr` for its readiness and metrics.
async fn node_status(addr: SocketAddr) -> NodeStatus {
    let ready = admin_client::request(addr, "GET", "/readyz", None).await;
    let metrics = admin_client::request(addr, "GET", "/metrics", None).await;
    // What the table shows, and what the JSON says.
    let (shown, error) = match (ready, metrics) {
        (Ok(ready), Ok(metrics)) if metrics.status == 200 => {
            return status_from_metrics(addr, &ready, &metrics.body);
        }
        (Err(e), _) | (_, Err(e)) => (
            format!("unreachable: {}", terminal_safe(e.to_string().as_bytes())),
            e.to_string(),
        ),
        (_, Ok(metrics)) => {
            let text = format!("/metrics answered {}", metrics.status);
            (text.clone(), text)
        }
    };
    NodeStatus {
        reached: false,
        ready: false,
        row: vec![addr.to_string(), shown],
        json: serde_json::json!({ "admin": addr.to_string(), "error": error }),
    }
}

/// A reached node's line: readiness, role, Raft indexes and load, read
/// from its OpenMetrics text.
fn status_from_metrics(addr: SocketAddr, ready: &AdminAnswer, metrics: &str) -> NodeStatus {
    let is_ready = ready.status == 200;
    let m = |name: &str, labels: &[&str]| metric(metrics, name, labels);
    let role = match (
        m("ticketing_is_leader", &[]),
        m("ticketing_has_leader", &[]),
    ) {
        (Some(1), _) => "leader",
        (Some(_), Some(1)) => "follower",
        (Some(_), _) => "no leader",
        (None, _) => "single",
    };
    let held = m("ticketing_held_keys", &[]);
    let waiters = m("ticketing_waiters", &[]);
    let sessions = m("ticketing_connections", &["state=\"session\""])
        .or_else(|| m("ticketing_client_sessions", &[]));
    let term = m("ticketing_raft_term", &[]);
    let commit = m("ticketing_raft_commit_index", &[]);
    let applied = m("ticketing_raft_applied_index", &[]);
    let show = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let readiness = ready.body.trim().to_owned();
    let row = vec![
        addr.to_string(),
        if is_ready {
            "yes".to_owned()
        } else {
            format!("no ({})", terminal_safe(readiness.as_bytes()))
        },
        role.to_owned(),
        show(term),
        show(commit),
        show(applied),
        show(held),
        show(waiters),
        show(sessions),
    ];
    let json = serde_json::json!({
        "admin": addr.to_string(),
        "ready": is_ready,
        "readiness": readiness,
        "role": role,
        "term": term,
        "commit_index": commit,
        "applied_index": applied,
        "held_keys": held,
        "waiters": waiters,
        "sessions": sessions,
    });
    NodeStatus {
        reached: true,
        ready: is_ready,
        row,
        json,
    }
}
