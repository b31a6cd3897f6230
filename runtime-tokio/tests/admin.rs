//! The admin HTTP listener of real `ticketing serve` processes: `/metrics`
//! parsed by a strict OpenMetrics text parser (below) after lock traffic,
//! with the counts asserted; `/livez`; `/readyz` in single mode and on a
//! cluster, where it turns 200 only once the node knows a leader and drops
//! to 503 on a node cut off from its majority.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::admin::{Single, dechunk, http_get, http_request};
use common::cluster::{CLIENT_TOKEN, Cluster, IDENTITY, PEER_TOKEN, Setup, poll};
use common::ports::free_port;
use common::raw::{Raw, acquire, release};
use common::scratch::{Scratch, scratch_dir};
use ticketing_core::auth::{
    ClientHandshake, ClientHandshakeStatus, SINGLE_FINGERPRINT, SINGLE_SELF_SLOT, WireMode,
};
use ticketing_core::wire::Reply;
use ticketing_tokio::client::ReleaseOutcome;
use tokio::io::AsyncWriteExt;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

/// A strict parser of the OpenMetrics text format, for what our exposition
/// uses (counters, gauges, histograms, units): every sample belongs to a
/// family declared by `# TYPE` (and `# HELP`) before it, with a suffix its
/// type allows; labels are well formed and unique per sample; values are
/// numbers; counters are not negative; histogram buckets are ascending and
/// cumulative and end with `+Inf` equal to `_count`; the text ends with
/// exactly one `# EOF`. Anything else is an error.
mod openmetrics {
    use std::collections::{BTreeMap, BTreeSet};

    pub type Labels = BTreeMap<String, String>;

    #[derive(Debug, Default)]
    pub struct Family {
        pub kind: String,
        pub unit: Option<String>,
        pub help: Option<String>,
        /// (sample name, labels, value), in order.
        pub samples: Vec<(String, Labels, f64)>,
    }

    #[derive(Debug)]
    pub struct Exposition {
        pub families: BTreeMap<String, Family>,
    }

    fn is_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn parse_labels(text: &str) -> Result<(Labels, &str), String> {
        let mut labels = Labels::new();
        let mut rest = text;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                return Ok((labels, after));
            }
            let eq = rest.find('=').ok_or("label without =")?;
            let name = &rest[..eq];
            if !is_name(name) {
                return Err(format!("bad label name {name:?}"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        'n' => value.push('\n'),
                        '"' => value.push('"'),
                        '\\' => value.push('\\'),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (_, c) => value.push(c),
                }
            };
            if labels.insert(name.to_owned(), value).is_some() {
                return Err(format!("label {name} twice"));
            }
            rest = &rest[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }

    fn parse_value(text: &str) -> Result<f64, String> {
        match text {
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            "NaN" => Ok(f64::NAN),
            _ => text.parse().map_err(|_| format!("bad value {text:?}")),
        }
    }

    /// The family a sample named `name` belongs to, given the declared
    /// families and their types.
    fn family_of(
        name: &str,
        families: &BTreeMap<String, Family>,
    ) -> Result<(String, &'static str), String> {
        for (family, f) in families {
            let Some(suffix) = name.strip_prefix(family.as_str()) else {
                continue;
            };
            let allowed: &[&str] = match f.kind.as_str() {
                "counter" => &["_total", "_created"],
                "gauge" => &[""],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                other => return Err(format!("unsupported type {other}")),
            };
            if allowed.contains(&suffix) {
                return Ok((family.clone(), suffix_static(suffix)));
            }
        }
        Err(format!("sample {name} belongs to no declared family"))
    }

    fn suffix_static(suffix: &str) -> &'static str {
        match suffix {
            "_total" => "_total",
            "_created" => "_created",
            "_bucket" => "_bucket",
            "_sum" => "_sum",
            "_count" => "_count",
            _ => "",
        }
    }

    pub fn parse(text: &str) -> Result<Exposition, String> {
        let body = text
            .strip_suffix("# EOF\n")
            .ok_or("does not end with # EOF")?;
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        let mut current: Option<String> = None;
        let mut closed: BTreeSet<String> = BTreeSet::new();
        for line in body.lines() {
            if line.is_empty() {
                return Err("empty line".into());
            }
            if let Some(meta) = line.strip_prefix("# ") {
                if meta == "EOF" {
                    return Err("# EOF before the end".into());
                }
                let mut parts = meta.splitn(3, ' ');
                let (what, name, rest) = (
                    parts.next().unwrap_or(""),
                    parts.next().ok_or("metadata without a name")?,
                    parts.next().unwrap_or(""),
                );
                if !is_name(name) {
                    return Err(format!("bad family name {name:?}"));
                }
                if current.as_deref() != Some(name) {
                    if families.contains_key(name) {
                        return Err(format!("family {name} declared twice"));
                    }
                    if let Some(previous) = current.take() {
                        closed.insert(previous);
                    }
                    families.insert(name.to_owned(), Family::default());
                    current = Some(name.to_owned());
                }
                let family = families.get_mut(name).unwrap();
                match what {
                    "TYPE" => family.kind = rest.to_owned(),
                    "HELP" => family.help = Some(rest.to_owned()),
                    "UNIT" => {
                        if !name.ends_with(&format!("_{rest}")) {
                            return Err(format!("{name} does not end with its unit {rest}"));
                        }
                        family.unit = Some(rest.to_owned());
                    }
                    other => return Err(format!("unknown metadata {other}")),
                }
                continue;
            }
            if line.starts_with('#') {
                return Err(format!("bad comment {line:?}"));
            }
            let name_end = line.find(['{', ' ']).ok_or("sample without a value")?;
            let name = &line[..name_end];
            let (labels, rest) = if line[name_end..].starts_with('{') {
                parse_labels(&line[name_end + 1..])?
            } else {
                (Labels::new(), &line[name_end..])
            };
            let value_text = rest.strip_prefix(' ').ok_or("no space before the value")?;
            if value_text.contains(' ') {
                return Err(format!("timestamps or exemplars not expected: {line:?}"));
            }
            let value = parse_value(value_text)?;
            let (family, suffix) = family_of(name, &families)?;
            if current.as_deref() != Some(family.as_str()) || closed.contains(&family) {
                return Err(format!("sample {name} outside its family's block"));
            }
            let f = families.get_mut(&family).unwrap();
            if f.kind.is_empty() {
                return Err(format!("{family} has no # TYPE"));
            }
            if f.kind == "counter" && (value.is_nan() || value < 0.0) {
                return Err(format!("counter {name} is {value}"));
            }
            if suffix == "_bucket" && !labels.contains_key("le") {
                return Err(format!("{name} without le"));
            }
            if f.samples.iter().any(|(n, l, _)| n == name && *l == labels) {
                return Err(format!("{name}{labels:?} twice"));
            }
            f.samples.push((name.to_owned(), labels, value));
        }
        for (name, f) in &families {
            if f.help.is_none() {
                return Err(format!("{name} has no # HELP"));
            }
            if f.kind == "histogram" {
                check_histogram(name, f)?;
            }
        }
        Ok(Exposition { families })
    }

    fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
        let buckets: Vec<(f64, f64)> = f
            .samples
            .iter()
            .filter(|(n, _, _)| n.ends_with("_bucket"))
            .map(|(_, l, v)| Ok((super::openmetrics::parse_value(&l["le"])?, *v)))
            .collect::<Result<_, String>>()?;
        let count = f
            .samples
            .iter()
            .find(|(n, _, _)| *n == format!("{name}_count"))
            .ok_or(format!("{name} has no _count"))?
            .2;
        if !f
            .samples
            .iter()
            .any(|(n, _, _)| *n == format!("{name}_sum"))
        {
            return Err(format!("{name} has no _sum"));
        }
        for pair in buckets.windows(2) {
            if pair[0].0 >= pair[1].0 || pair[0].1 > pair[1].1 {
                return Err(format!("{name} buckets not ascending and cumulative"));
            }
        }
        match buckets.last() {
            Some(&(le, n)) if le == f64::INFINITY && n == count => Ok(()),
            _ => Err(format!("{name}: the last bucket is not +Inf = _count")),
        }
    }

    impl Exposition {
        /// The value of sample `name` with exactly `labels`.
        pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
            let want: Labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.families
                .values()
                .flat_map(|f| f.samples.iter())
                .find(|(n, l, _)| n == name && *l == want)
                .map(|(_, _, v)| *v)
        }

        /// Every label set of sample `name`.
        pub fn series(&self, name: &str) -> usize {
            self.families
                .values()
                .flat_map(|f| f.samples.iter())
                .filter(|(n, _, _)| n == name)
                .count()
        }
    }
}

fn scrape(addr: SocketAddr) -> openmetrics::Exposition {
    let (status, content_type, body) = http_get(addr, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    openmetrics::parse(&body).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{body}"))
}

/// Connects to `addr` and completes a no-auth handshake.
async fn raw_connect(addr: SocketAddr) -> Raw {
    let stream = poll("the client port", || {
        std::net::TcpStream::connect(addr).ok()
    })
    .await;
    stream.set_nonblocking(true).unwrap();
    let mut raw = Raw {
        stream: tokio::net::TcpStream::from_std(stream).unwrap(),
        buf: Vec::new(),
    };
    let mut handshake =
        ClientHandshake::new(b"", SINGLE_FINGERPRINT, WireMode::Single, SINGLE_SELF_SLOT);
    loop {
        let (used, status) = handshake.handle_input(&raw.buf);
        raw.buf.drain(..used);
        match status {
            ClientHandshakeStatus::NeedMore => raw.fill().await,
            ClientHandshakeStatus::SendProof => {
                let proof = handshake.proof().unwrap();
                raw.stream.write_all(&proof).await.unwrap();
            }
            ClientHandshakeStatus::Accepted => return raw,
            other => panic!("handshake ended {other:?}"),
        }
    }
}

fn token_of(reply: Reply) -> u64 {
    match reply {
        Reply::Acquired { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn single_mode_metrics_count_the_lock_traffic() {
    let server = Single::start();
    let a = raw_connect(server.client).await;
    let mut a = a;
    let mut b = raw_connect(server.client).await;

    // Before any traffic: a valid exposition with zero counts.
    let before = scrape(server.admin);
    assert_eq!(
        before.value("ticketing_grants_total", &[("wait", "none")]),
        Some(0.0)
    );

    // Three immediate grants, one hand-over on release, a T, an N.
    let mut tokens = Vec::new();
    for (rid, key) in [(1, "k1"), (2, "k2"), (3, "k3")] {
        a.send(&acquire(rid, key, 5, 30)).await;
        tokens.push(token_of(a.reply().await));
    }
    b.send(&acquire(10, "k1", 5, 30)).await;
    b.send(&acquire(11, "k2", 0, 30)).await;
    assert_eq!(b.reply().await, Reply::TimedOut { rid: 11 });
    // b's acquire of k1 is queued behind a's grant.
    let queued = poll("a queued waiter", || {
        let m = scrape(server.admin);
        (m.value("ticketing_waiters", &[]) == Some(1.0)).then_some(())
    });
    queued.await;
    a.send(&release(4, "k1", tokens[0])).await;
    assert_eq!(a.reply().await, Reply::Released { rid: 4 });
    token_of(b.reply().await);
    a.send(&release(5, "k1", tokens[0])).await;
    assert_eq!(a.reply().await, Reply::NotFound { rid: 5 });

    let m = scrape(server.admin);
    let v = |name: &str, labels: &[(&str, &str)]| {
        m.value(name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels:?}"))
    };
    assert_eq!(v("ticketing_grants_total", &[("wait", "none")]), 3.0);
    assert_eq!(v("ticketing_grants_total", &[("wait", "queued")]), 1.0);
    assert_eq!(v("ticketing_releases_total", &[]), 1.0);
    assert_eq!(v("ticketing_release_handovers_total", &[]), 1.0);
    assert_eq!(
        v(
            "ticketing_lease_expiries_total",
            &[("handed_over", "false")]
        ),
        0.0
    );
    assert_eq!(
        v("ticketing_timeouts_total", &[("reason", "wait_zero")]),
        1.0
    );
    assert_eq!(v("ticketing_replies_total", &[("kind", "A")]), 4.0);
    assert_eq!(v("ticketing_replies_total", &[("kind", "T")]), 1.0);
    assert_eq!(v("ticketing_replies_total", &[("kind", "N")]), 1.0);
    assert_eq!(v("ticketing_replies_total", &[("kind", "R")]), 1.0);
    assert_eq!(v("ticketing_replies_total", &[("kind", "B")]), 0.0);
    assert_eq!(v("ticketing_error_replies_total", &[("code", "6")]), 0.0);
    assert_eq!(v("ticketing_held_keys", &[]), 3.0);
    assert_eq!(v("ticketing_waiters", &[]), 0.0);
    assert_eq!(
        v(
            "ticketing_connections",
            &[("state", "session"), ("dialect", "v3")]
        ),
        2.0
    );
    assert_eq!(
        v(
            "ticketing_connections",
            &[("state", "session"), ("dialect", "line")]
        ),
        0.0
    );
    // Histograms in seconds: one wait per grant, one hold per release.
    let wait = &m.families["ticketing_lock_wait_seconds"];
    assert_eq!(wait.kind, "histogram");
    assert_eq!(wait.unit.as_deref(), Some("seconds"));
    assert_eq!(v("ticketing_lock_wait_seconds_count", &[]), 4.0);
    assert_eq!(v("ticketing_lock_hold_seconds_count", &[]), 1.0);
    // No per-key series: the keys appear nowhere.
    assert!(m.families.values().all(|f| {
        f.samples
            .iter()
            .all(|(_, labels, _)| labels.values().all(|v| !v.starts_with('k')))
    }));
    assert_eq!(m.series("ticketing_held_keys"), 1);

    let (status, _, body) = http_get(server.admin, "/livez").unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, _) = http_get(server.admin, "/readyz").unwrap();
    assert_eq!(status, 200, "a listening single server is ready");
    let (status, _, _) = http_get(server.admin, "/nothing").unwrap();
    assert_eq!(status, 404);
}

/// Config files for a 3-node cluster whose every node has an admin port,
/// knows every slot's (`slots[].admin`) and accepts [`ADMIN_TOKEN`].
fn cluster_files(dir: &Scratch, cluster: &Cluster, admin: &[SocketAddr]) -> Vec<PathBuf> {
    std::fs::create_dir_all(&dir.0).unwrap();
    let slots: Vec<String> = cluster
        .slots
        .iter()
        .zip(admin)
        .map(|(s, admin)| {
            format!(
                "{{ client = \"{}\", peer = \"{}\", admin = \"{admin}\" }}",
                s.client, s.peer
            )
        })
        .collect();
    (0..cluster.slots.len())
        .map(|slot| {
            let path = dir.0.join(format!("node{slot}.toml"));
            let text = format!(
                "client_tokens = [\"{CLIENT_TOKEN}\"]\n\
                 admin_listen = \"{}\"\n\
                 admin_tokens = [\"{ADMIN_TOKEN}\"]\n\
                 log_level = \"warn\"\n\
                 [cluster]\n\
                 identity = \"{IDENTITY}\"\n\
                 self_slot = {slot}\n\
                 profile = \"fast\"\n\
                 peer_tokens = [\"{PEER_TOKEN}\"]\n\
                 status_listen = \"{}\"\n\
                 slots = [{}]\n",
                admin[slot],
                cluster.slots[slot].status,
                slots.join(", ")
            );
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

/// A 3-node cluster configured by [`cluster_files`] in a scratch folder
/// named `name` (kept while the third value lives), no node started yet,
/// with every slot's admin address.
fn admin_cluster(name: &str) -> (Cluster, Vec<SocketAddr>, Scratch) {
    let mut cluster = Cluster::new(3);
    let admin: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
    let config_dir = scratch_dir(name);
    cluster.setup = Setup::Files(cluster_files(&config_dir, &cluster, &admin));
    (cluster, admin, config_dir)
}

#[tokio::test]
async fn cluster_readyz_follows_the_leader_and_metrics_parse() {
    let (mut cluster, admin, _config_dir) = admin_cluster("admin-cluster-config");

    // One bootstrap member alone cannot learn of a leader: not ready.
    cluster.spawn(0, true);
    let (status, _, body) =
        poll("/readyz of the lone node", || http_get(admin[0], "/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: "), "{body}");
    let m = scrape(admin[0]);
    assert_eq!(m.value("ticketing_has_leader", &[]), Some(0.0));
    assert_eq!(m.value("ticketing_is_leader", &[]), Some(0.0));
    assert_eq!(cluster.status(0).map(|s| s.knows_leader), Some(false));

    cluster.spawn(1, true);
    cluster.spawn(2, true);
    for &addr in &admin {
        poll("/readyz 200", || {
            http_get(addr, "/readyz").and_then(|(status, _, _)| (status == 200).then_some(()))
        })
        .await;
        let m = scrape(addr);
        assert_eq!(m.value("ticketing_has_leader", &[]), Some(1.0));
        assert_eq!(m.value("ticketing_is_voter", &[]), Some(1.0));
        assert!(m.value("ticketing_leader_changes_total", &[]).unwrap() >= 1.0);
    }
    let leader = cluster.leader().await;

    // A grant through the leader is counted where it was applied.
    let broker = common::cluster::published(&cluster);
    let _ticket = common::cluster::acquire_published(&broker, "orders/42").await;
    let m = poll("the applied grant", || {
        let m = scrape(admin[leader]);
        (m.value("ticketing_grants_total", &[]) >= Some(1.0)).then_some(m)
    })
    .await;
    assert_eq!(m.value("ticketing_is_leader", &[]), Some(1.0));
    assert!(
        m.value("ticketing_replies_total", &[("kind", "A")])
            .unwrap()
            >= 1.0
    );
    assert!(m.value("ticketing_raft_commit_index", &[]).unwrap() >= 1.0);
    // Served on every node; a leader drops no appends of its own.
    assert_eq!(
        m.value("ticketing_raft_appends_uncovered_total", &[]),
        Some(0.0)
    );
    // Sessions by dialect add up to the sessions (the published client
    // speaks v3).
    let sessions = m.value("ticketing_client_sessions", &[]).unwrap();
    let v3 = m
        .value("ticketing_client_sessions_by_dialect", &[("dialect", "v3")])
        .unwrap();
    let line = m
        .value(
            "ticketing_client_sessions_by_dialect",
            &[("dialect", "line")],
        )
        .unwrap();
    assert!(v3 >= 1.0, "{v3}");
    assert_eq!((v3 + line, line), (sessions, 0.0));
    // The leader reports each peer's lag, and only the peers'.
    assert_eq!(m.series("ticketing_peer_replication_lag_entries"), 2);
    let leaders: f64 = (0..3)
        .map(|slot| {
            scrape(admin[slot])
                .value("ticketing_is_leader", &[])
                .unwrap()
        })
        .sum();
    assert_eq!(leaders, 1.0);

    // Cut off from its majority (the two others killed), a node no longer
    // knows a leader and is not ready, whether it led or followed.
    let survivor = (leader + 1) % 3;
    for slot in (0..3).filter(|&s| s != survivor) {
        cluster.kill(slot);
    }
    let body = poll("/readyz 503 on the node cut off", || {
        http_get(admin[survivor], "/readyz")
            .and_then(|(status, _, body)| (status == 503).then_some(body))
    })
    .await;
    assert_eq!(body, "not ready: no known leader\n");
    let m = scrape(admin[survivor]);
    assert_eq!(m.value("ticketing_has_leader", &[]), Some(0.0));
}

/// The parser above is strict: what it refuses, so that the scrapes it
/// accepts mean something.
#[test]
fn the_exposition_parser_refuses_invalid_text() {
    let good = "# HELP x_seconds h\n# TYPE x_seconds histogram\n# UNIT x_seconds seconds\n\
                x_seconds_sum 1.5\nx_seconds_count 2\n\
                x_seconds_bucket{le=\"1.0\"} 1\nx_seconds_bucket{le=\"+Inf\"} 2\n\
                # HELP c h\n# TYPE c counter\nc_total{a=\"1\"} 3\n# EOF\n";
    let parsed = openmetrics::parse(good).unwrap();
    assert_eq!(parsed.value("c_total", &[("a", "1")]), Some(3.0));
    let bad = [
        ("no EOF", good.trim_end_matches("# EOF\n").to_owned()),
        ("counter without _total", good.replace("c_total{", "c{")),
        ("no TYPE", good.replace("# TYPE c counter\n", "")),
        ("no HELP", good.replace("# HELP c h\n", "")),
        (
            "+Inf bucket differs from count",
            good.replace("x_seconds_count 2", "x_seconds_count 3"),
        ),
        (
            "buckets not cumulative",
            good.replace("{le=\"1.0\"} 1", "{le=\"1.0\"} 5"),
        ),
        ("negative counter", good.replace("} 3\n", "} -3\n")),
        ("bad value", good.replace("} 3\n", "} three\n")),
        ("unquoted label", good.replace("a=\"1\"", "a=1")),
        (
            "unit not in the name",
            good.replace("# UNIT x_seconds seconds", "# UNIT x_seconds bytes"),
        ),
        (
            "duplicate sample",
            good.replace("# EOF", "c_total{a=\"1\"} 4\n# EOF"),
        ),
    ];
    for (what, text) in bad {
        assert!(openmetrics::parse(&text).is_err(), "accepted: {what}");
    }
}

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// A single server whose admin listener accepts [`ADMIN_TOKEN`] (given in
/// a token file, as operators do), and the file.
fn single_with_admin_token() -> (Single, Scratch, PathBuf) {
    let dir = scratch_dir("admin-token");
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("admin-tokens");
    std::fs::write(&file, format!("# rotated monthly\n{ADMIN_TOKEN}\n")).unwrap();
    let server = Single::start_with(&["--admin-token-file", file.to_str().unwrap()]);
    (server, dir, file)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Waits until the admin API shows `waiters` waiters on `key`.
async fn until_waiters(admin: SocketAddr, key: &str, waiters: u64) -> serde_json::Value {
    poll("the waiters to queue", || {
        let (status, _, body) = http_get(admin, &format!("/v1/locks/{key}"))?;
        let view = (status == 200).then(|| json(&body))?;
        (view["waiters_total"] == waiters).then_some(view)
    })
    .await
}

/// `ticketing ARGS…` with a clean environment: (exit code, stdout, stderr).
fn ticketing(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_remove("TICKETING_ADMIN")
        .env_remove("TICKETING_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run ticketing");
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn force_release_over_http_needs_the_admin_token_and_fences_the_holder() {
    let (server, _dir, _file) = single_with_admin_token();
    let mut holder = raw_connect(server.client).await;
    let mut waiter = raw_connect(server.client).await;
    holder.send(&acquire(1, "orders/42", 0, 60)).await;
    let token = token_of(holder.reply().await);
    waiter.send(&acquire(2, "orders/42", 30, 30)).await;
    until_waiters(server.admin, "orders%2F42", 1).await;

    let path = "/v1/locks/orders%2F42/release";
    let (status, content_type, body) = http_request(server.admin, "POST", path, None).unwrap();
    assert_eq!(status, 401, "{body}");
    assert_eq!(content_type, "application/json");
    assert_eq!(json(&body)["error"], "unauthorized");
    let (status, _, body) =
        http_request(server.admin, "POST", path, Some("Basic YWRtaW46eA==")).unwrap();
    assert_eq!(status, 401, "a malformed credential: {body}");
    let wrong = "Bearer not-the-admin-token-0123456789";
    let (status, _, body) = http_request(server.admin, "POST", path, Some(wrong)).unwrap();
    assert_eq!(status, 403, "{body}");
    assert_eq!(json(&body)["error"], "forbidden");
    // Refused requests changed nothing. Without the admin token a
    // loopback reader sees the lock but neither its fencing token (one `R`
    // with it would free the lock) nor the holder's address.
    let view = until_waiters(server.admin, "orders%2F42", 1).await;
    assert_eq!(view["redacted"], true);
    assert!(view["holder"]["token"].is_null(), "{view}");
    assert!(view["holder"]["conn"]["source"].is_null(), "{view}");
    assert!(view["waiters"][0]["conn"]["source"].is_null(), "{view}");
    let right = format!("Bearer {ADMIN_TOKEN}");
    let (status, _, body) =
        http_request(server.admin, "GET", "/v1/locks/orders%2F42", Some(&right)).unwrap();
    assert_eq!(status, 200, "{body}");
    let view = json(&body);
    assert_eq!(view["redacted"], false);
    assert_eq!(view["holder"]["token"], token);
    assert_eq!(view["holder"]["conn"]["source"], "127.0.0.1");

    let mismatch = format!("{path}?token={}", token + 1);
    let (status, _, body) = http_request(server.admin, "POST", &mismatch, Some(&right)).unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["held"], token);

    let with_token = format!("{path}?token={token}");
    let (status, _, body) = http_request(server.admin, "POST", &with_token, Some(&right)).unwrap();
    assert_eq!(status, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["revoked"], token);
    assert_eq!(answer["keys"], serde_json::json!(["orders/42"]));
    assert_eq!(answer["keys_encoding"], "utf8");

    // The front waiter is granted under a larger token; the old holder's
    // release is `N`.
    let new_token = token_of(waiter.reply().await);
    assert!(new_token > token, "{new_token} must exceed {token}");
    assert_eq!(answer["handed_to"], new_token);
    holder.send(&release(3, "orders/42", token)).await;
    assert_eq!(holder.reply().await, Reply::NotFound { rid: 3 });
    let (status, _, body) =
        http_request(server.admin, "GET", "/v1/locks/orders%2F42", Some(&right)).unwrap();
    assert_eq!(status, 200);
    assert_eq!(json(&body)["holder"]["token"], new_token);

    // A second force-release of the old token finds it gone.
    let (status, _, body) = http_request(server.admin, "POST", &with_token, Some(&right)).unwrap();
    assert_eq!(status, 409, "{body}");
    waiter.send(&release(4, "orders/42", new_token)).await;
    assert_eq!(waiter.reply().await, Reply::Released { rid: 4 });
    let (status, _, body) = http_request(server.admin, "POST", path, Some(&right)).unwrap();
    assert_eq!(status, 404, "{body}");
    assert_eq!(json(&body)["error"], "not_held");

    let m = scrape(server.admin);
    assert_eq!(m.value("ticketing_force_releases_total", &[]), Some(1.0));

    // The release is among the events; they follow the read access rule.
    let (status, _, body) = http_request(server.admin, "GET", "/v1/events", Some(&right)).unwrap();
    assert_eq!(status, 200, "{body}");
    let events = json(&body);
    assert_eq!(events["events"][0]["kind"], "force_released", "{events}");
    assert_eq!(events["events"][0]["revoked"], token);
    assert_eq!(events["events"][0]["handed_to"], new_token);
    let (status, _, body) = http_request(server.admin, "GET", "/v1/events", Some(wrong)).unwrap();
    assert_eq!(
        status, 403,
        "a wrong token is refused where none is needed: {body}"
    );
    let (status, _, body) =
        http_request(server.admin, "GET", "/v1/events?limit=5", Some(&right)).unwrap();
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn locks_show_lists_the_holder_and_three_waiters_in_queue_order() {
    let (server, _dir, token_file) = single_with_admin_token();
    let token_file = token_file.to_str().unwrap().to_owned();
    let mut holder = raw_connect(server.client).await;
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(raw_connect(server.client).await);
    }
    holder.send(&acquire(1, "jobs/7", 0, 60)).await;
    let token = token_of(holder.reply().await);
    // Queued in another order than they connected (ids follow connects):
    // the third connection first, then the first, then the second.
    for (queued, index) in [2usize, 0, 1].into_iter().enumerate() {
        waiters[index].send(&acquire(1, "jobs/7", 60, 30)).await;
        until_waiters(server.admin, "jobs%2F7", queued as u64 + 1).await;
    }
    let admin = server.admin.to_string();

    // Without the admin token: the queue, but no token and no addresses.
    let (code, stdout, stderr) =
        ticketing(&["locks", "show", "jobs/7", "--admin", &admin, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let view = json(&stdout);
    assert!(view["holder"]["token"].is_null(), "{view}");
    assert!(view["holder"]["conn"]["source"].is_null(), "{view}");
    assert_eq!(view["waiters_total"], 3);
    let (code, table, stderr) = ticketing(&["locks", "ls", "--prefix", "jobs/", "--admin", &admin]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!table.contains(&token.to_string()), "{table}");
    assert!(table.contains("hidden"), "{table}");

    let (code, stdout, stderr) = ticketing(&[
        "locks",
        "show",
        "jobs/7",
        "--admin",
        &admin,
        "--admin-token-file",
        &token_file,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let view = json(&stdout);
    assert_eq!(view["key"], "jobs/7");
    assert_eq!(view["holder"]["token"], token);
    assert_eq!(view["holder"]["conn"]["source"], "127.0.0.1");
    assert_eq!(view["holder"]["conn"]["dialect"], "v3");
    assert!(
        view["holder"]["granted_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    assert_eq!(view["waiters_total"], 3);
    let listed = view["waiters"].as_array().unwrap();
    let ids: Vec<u64> = listed
        .iter()
        .map(|w| w["conn"]["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    // Queue order: the last to connect (largest id), then the first, then
    // the second.
    assert!(ids[0] > ids[2] && ids[2] > ids[1], "queue order {ids:?}");
    let positions: Vec<u64> = listed
        .iter()
        .map(|w| w["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, vec![1, 2, 3]);
    let waited: Vec<u64> = listed
        .iter()
        .map(|w| w["waited_ms"].as_u64().unwrap())
        .collect();
    assert!(
        waited[0] >= waited[1] && waited[1] >= waited[2],
        "{waited:?}"
    );

    // The table names the same connections, in the same order.
    let (code, table, stderr) = ticketing(&[
        "locks",
        "show",
        "jobs/7",
        "--admin",
        &admin,
        "--admin-token-file",
        &token_file,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(table.contains(&format!("token {token}")), "{table}");
    let rows: Vec<&str> = table
        .lines()
        .skip_while(|line| !line.starts_with('#'))
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    for (row, (position, id)) in rows.iter().zip([(1, ids[0]), (2, ids[1]), (3, ids[2])]) {
        assert!(row.starts_with(&position.to_string()), "{row}");
        assert!(row.contains(&format!("conn {id} 127.0.0.1 v3")), "{row}");
    }

    let (code, listing, _) = ticketing(&["locks", "ls", "--prefix", "jobs/", "--admin", &admin]);
    assert_eq!(code, Some(0));
    assert!(
        listing.lines().nth(1).unwrap().starts_with("jobs/7"),
        "{listing}"
    );

    let (code, _, stderr) = ticketing(&["locks", "show", "jobs/8", "--admin", &admin]);
    assert_eq!(code, Some(1), "404 exits 1: {stderr}");
    assert!(stderr.contains("404"), "{stderr}");
}

#[tokio::test]
async fn locks_release_fences_the_holder_and_needs_the_admin_token() {
    let (server, _dir, token_file) = single_with_admin_token();
    let mut holder = raw_connect(server.client).await;
    let mut waiter = raw_connect(server.client).await;
    holder.send(&acquire(1, "db", 0, 60)).await;
    let token = token_of(holder.reply().await);
    waiter.send(&acquire(2, "db", 30, 30)).await;
    until_waiters(server.admin, "db", 1).await;
    let admin = server.admin.to_string();
    let token_file = token_file.to_str().unwrap();

    let (code, _, stderr) = ticketing(&["locks", "release", "db", "--admin", &admin]);
    assert_eq!(code, Some(77), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let wrong = scratch_dir("admin-wrong-token");
    std::fs::create_dir_all(&wrong.0).unwrap();
    let wrong_file = wrong.0.join("token");
    std::fs::write(&wrong_file, "not-the-admin-token-0123456789\n").unwrap();
    let wrong_file = wrong_file.to_str().unwrap();
    let (code, _, stderr) = ticketing(&[
        "locks",
        "release",
        "db",
        "--admin",
        &admin,
        "--admin-token-file",
        wrong_file,
    ]);
    assert_eq!(code, Some(77), "{stderr}");
    assert!(stderr.contains("403"), "{stderr}");
    let stale = (token + 1).to_string();
    let (code, _, stderr) = ticketing(&[
        "locks",
        "release",
        "db",
        "--token",
        &stale,
        "--admin",
        &admin,
        "--admin-token-file",
        token_file,
    ]);
    assert_eq!(code, Some(1), "409 exits 1: {stderr}");
    assert!(stderr.contains("409"), "{stderr}");

    let (code, stdout, stderr) = ticketing(&[
        "locks",
        "release",
        "db",
        "--admin",
        &admin,
        "--admin-token-file",
        token_file,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let answer = json(&stdout);
    assert_eq!(answer["revoked"], token);
    let new_token = token_of(waiter.reply().await);
    assert!(new_token > token);
    assert_eq!(answer["handed_to"], new_token);
    holder.send(&release(3, "db", token)).await;
    assert_eq!(holder.reply().await, Reply::NotFound { rid: 3 });

    let (code, _, stderr) = ticketing(&["status", "--admin", &admin]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, _) = ticketing(&["status", "--admin", &admin, "--json"]);
    assert_eq!(code, Some(0));
    let status = json(&stdout);
    assert_eq!(status["admin"], admin.as_str());
    assert_eq!(status["ready"], true);
    assert_eq!(status["held_keys"], 1);
    assert_eq!(status["sessions"], 2);

    // Nothing listens on a fresh port: a clear error, exit 69.
    let nobody = free_port().to_string();
    // `status --json`: one object per node, one line each (JSON Lines), in
    // the order given, an unreachable node's with its error.
    let (code, stdout, _) = ticketing(&["status", "--admin", &admin, "--admin", &nobody, "--json"]);
    assert_eq!(code, Some(1), "not every node is ready: {stdout}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(json).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["admin"], admin.as_str());
    assert_eq!(lines[0]["ready"], true);
    assert_eq!(lines[1]["admin"], nobody.as_str());
    assert!(lines[1]["error"].is_string(), "{stdout}");
    let (code, _, stderr) = ticketing(&["locks", "ls", "--admin", &nobody]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

/// `method path` with a response header too: (status, `Location`, body).
fn http_location(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Option<(u16, Option<String>, String)> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = authorization.map_or(String::new(), |value| format!("Authorization: {value}\r\n"));
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    tcp.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let location = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("location")
            .then(|| value.trim().to_owned())
    });
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, location, body))
}

/// A 3-node cluster: inspection and force-release on the leader's admin
/// listener (the command is applied before the answer: the waiter is
/// granted under a larger token, the old holder's release is `N`), and a
/// follower's `/v1` endpoints redirect to the leader's admin address.
#[tokio::test]
async fn cluster_force_release_over_http_on_the_leader_and_redirects_from_followers() {
    let (mut cluster, admin, _config_dir) = admin_cluster("admin-cluster-release");
    for slot in 0..3 {
        cluster.spawn(slot, true);
    }
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let broker = common::cluster::ours(&cluster);
    let lease = Duration::from_secs(60);
    // The client may still be finding the leader: a few attempts.
    let mut attempts = 0;
    let ticket = loop {
        attempts += 1;
        match broker
            .acquire(
                "orders/42",
                Duration::from_secs(5),
                lease,
                Duration::from_secs(10),
            )
            .await
        {
            Ok(ticket) => break ticket,
            Err(e) => assert!(attempts < 5, "no first grant: {e:?}"),
        }
    };
    let token = ticket.token();
    let waiter = {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .acquire(
                    "orders/42",
                    Duration::from_secs(30),
                    lease,
                    Duration::from_secs(40),
                )
                .await
        })
    };
    until_waiters(admin[leader], "orders%2F42", 1).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let (status, _, body) =
        http_request(admin[leader], "GET", "/v1/locks/orders%2F42", Some(&bearer)).unwrap();
    assert_eq!(status, 200, "{body}");
    let view = json(&body);
    assert_eq!(view["holder"]["token"], token);
    assert!(view["holder"]["lease_remaining_ms"].as_u64().unwrap() <= 60_000);
    assert_eq!(view["waiters"][0]["position"], 1);

    // A follower points at the leader's admin address, GET and POST alike
    // (the POST still needs the admin token first).
    let path = "/v1/locks/orders%2F42";
    let (status, location, body) = http_location(admin[follower], "GET", path, None).unwrap();
    assert_eq!(status, 307, "{body}");
    assert_eq!(
        location.as_deref(),
        Some(format!("http://{}{path}", admin[leader]).as_str())
    );
    let answer = json(&body);
    assert_eq!(answer["error"], "not_leader");
    assert_eq!(answer["leader_slot"], leader);
    assert_eq!(answer["leader_admin"], admin[leader].to_string());
    let (status, location, _) =
        http_location(admin[follower], "GET", "/v1/locks?prefix=orders", None).unwrap();
    assert_eq!(status, 307);
    assert_eq!(
        location,
        Some(format!("http://{}/v1/locks?prefix=orders", admin[leader]))
    );
    let release = format!("{path}/release?token={token}");
    let (status, _, _) = http_location(admin[follower], "POST", &release, None).unwrap();
    assert_eq!(status, 401, "no token: refused before anything else");
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let (status, location, body) =
        http_location(admin[follower], "POST", &release, Some(&bearer)).unwrap();
    assert_eq!(status, 307, "{body}");
    assert_eq!(location, Some(format!("http://{}{release}", admin[leader])));
    // The redirect did nothing: still held, still waited for.
    until_waiters(admin[leader], "orders%2F42", 1).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let (status, _, body) =
        http_request(admin[leader], "GET", "/v1/locks/orders%2F42", Some(&bearer)).unwrap();
    assert_eq!(status, 200, "{body}");
    let view = json(&body);
    assert_eq!(view["holder"]["token"], token);
    // The CLI pointed at a follower follows the redirect to the leader.
    let follower_admin = admin[follower].to_string();
    let (code, stdout, stderr) = ticketing(&[
        "locks",
        "show",
        "orders/42",
        "--admin",
        &follower_admin,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let shown = json(&stdout);
    assert_eq!(shown["key"], "orders/42");
    assert_eq!(shown["waiters_total"], 1);
    assert!(
        shown["holder"]["token"].is_null(),
        "no admin token: {shown}"
    );

    // On the leader: answered once the command is applied.
    let (status, _, body) = http_location(admin[leader], "POST", &release, Some(&bearer)).unwrap();
    assert_eq!(status, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["revoked"], token);
    assert_eq!(answer["keys"], serde_json::json!(["orders/42"]));
    let next = waiter.await.unwrap().expect("the waiter is granted");
    assert!(next.token() > token, "{} must exceed {token}", next.token());
    assert_eq!(
        answer["handed_to"],
        next.token(),
        "answered after the hand-over"
    );
    assert_eq!(
        ticket.release().await.unwrap(),
        ReleaseOutcome::AlreadyGoneOrNotCurrent,
        "the old holder is fenced"
    );
    let (status, _, body) = http_request(admin[leader], "GET", path, Some(&bearer)).unwrap();
    assert_eq!(status, 200);
    assert_eq!(json(&body)["holder"]["token"], next.token());
    // Every node applied it and counts it.
    for &addr in &admin {
        poll("the applied force-release", || {
            (scrape(addr).value("ticketing_force_releases_total", &[]) == Some(1.0)).then_some(())
        })
        .await;
    }
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);

    // Without a known leader a follower cannot point anywhere: 503.
    for slot in (0..3).filter(|&s| s != follower) {
        cluster.kill(slot);
    }
    let body = poll("503 without a leader", || {
        http_location(admin[follower], "GET", path, None)
            .and_then(|(status, _, body)| (status == 503).then_some(body))
    })
    .await;
    assert_eq!(json(&body)["error"], "no_leader");
}

/// No byte or character of `text` would be obeyed by a terminal: no C0
/// control but LF, no DEL, no C1 control.
fn assert_terminal_safe(what: &str, text: &str) {
    let raw = text.chars().find(|&c| c != '\n' && c.is_control());
    assert_eq!(raw, None, "{what} printed a raw control: {text:?}");
    assert!(!text.as_bytes().contains(&0x1b) && !text.as_bytes().contains(&0x07));
}

#[tokio::test]
async fn locks_commands_print_a_key_with_terminal_controls_escaped() {
    let (server, _dir, token_file) = single_with_admin_token();
    // ESC ] 0 ; … BEL sets a terminal's title, ESC [ 2 J clears the screen,
    // U+009B is the one-character CSI; a client may lock any such key.
    let key = "evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\\x1b";
    let shown = "evil\\x1b]0;pwned\\x07\\x1b[2J\\u{009b}31m\\\\x1b";
    let mut holder = raw_connect(server.client).await;
    holder.send(&acquire(1, key, 0, 60)).await;
    token_of(holder.reply().await);
    let admin = server.admin.to_string();
    let token_file = token_file.to_str().unwrap();

    let (code, listing, stderr) = ticketing(&["locks", "ls", "--admin", &admin]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_terminal_safe("locks ls", &listing);
    assert!(
        listing.lines().nth(1).unwrap().starts_with(shown),
        "{listing}"
    );

    let (code, view, stderr) = ticketing(&["locks", "show", key, "--admin", &admin]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_terminal_safe("locks show", &view);
    assert!(view.starts_with(&format!("key      {shown}\n")), "{view}");

    // --json keeps the exact key, in JSON escapes only.
    let (code, text, stderr) = ticketing(&["locks", "show", key, "--admin", &admin, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_terminal_safe("locks show --json", &text);
    assert_eq!(json(&text)["key"], key);
    let (code, text, stderr) = ticketing(&["locks", "ls", "--admin", &admin, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_terminal_safe("locks ls --json", &text);
    assert_eq!(json(&text)["locks"][0]["key"], key);

    // An error about such a key is escaped too.
    let absent = "gone\u{1b}[2J";
    let (code, _, stderr) = ticketing(&["locks", "show", absent, "--admin", &admin]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_terminal_safe("locks show (404)", &stderr);

    let (code, released, stderr) = ticketing(&[
        "locks",
        "release",
        key,
        "--admin",
        &admin,
        "--admin-token-file",
        token_file,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_terminal_safe("locks release", &released);
    assert!(
        released.starts_with(&format!("released {shown}: token ")),
        "{released}"
    );
}

#[tokio::test]
async fn a_listing_flood_without_a_token_keeps_the_cluster_leader_and_its_lock_traffic() {
    let (mut cluster, admin, _config_dir) = admin_cluster("admin-cluster-flood");
    for slot in 0..3 {
        cluster.spawn(slot, true);
    }
    let leader = cluster.leader().await;
    let broker = common::cluster::ours(&cluster);
    let lease = Duration::from_secs(120);
    let acquire = |key: String| {
        let broker = broker.clone();
        async move {
            broker
                .acquire(&key, Duration::from_secs(5), lease, Duration::from_secs(10))
                .await
        }
    };
    // The client may still be finding the leader: a few attempts.
    let mut attempts = 0;
    while let Err(e) = acquire("first".to_owned()).await {
        attempts += 1;
        assert!(attempts < 5, "no first grant: {e:?}");
    }
    let mut held = Vec::new();
    for n in 0..500 {
        held.push(acquire(format!("held/{n}")).await.expect("a free key"));
    }
    let changes = |addr| scrape(addr).value("ticketing_leader_changes_total", &[]);
    let before: Vec<Option<f64>> = admin.iter().map(|&addr| changes(addr)).collect();

    // Two loops of listings without a token, each following the cursors,
    // against the lock traffic below.
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let addr = admin[leader];
            std::thread::spawn(move || {
                let mut answered = 0;
                for _ in 0..100 {
                    let (status, _, body) =
                        http_get(addr, "/v1/locks?limit=1000").expect("an answer");
                    assert!(status == 200 || status == 503, "{status}: {body}");
                    answered += usize::from(status == 200);
                }
                answered
            })
        })
        .collect();
    for n in 0..100 {
        let ticket = acquire(format!("traffic/{n}"))
            .await
            .expect("lock traffic goes on");
        assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let answered: usize = flood.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(answered > 0, "the flood was served");
    let after: Vec<Option<f64>> = admin.iter().map(|&addr| changes(addr)).collect();
    assert_eq!(before, after, "no node saw a new leader");
    assert_eq!(
        scrape(admin[leader]).value("ticketing_is_leader", &[]),
        Some(1.0)
    );
    drop(held);
}

#[tokio::test]
async fn locks_show_names_the_mode_and_every_sharer() {
    let (server, _dir, token_file) = single_with_admin_token();
    let token_file = token_file.to_str().unwrap().to_owned();
    let client = server.client.to_string();
    let brokers = [(); 3].map(|()| ticketing_tokio::TicketBroker::connect_loopback([&*client]));
    for broker in &brokers {
        assert!(broker.wait_ready(Duration::from_secs(5)).await);
    }
    let (lease, budget) = (Duration::from_secs(60), Duration::ZERO);
    let first = brokers[0]
        .acquire_shared("catalog", Duration::ZERO, lease, budget)
        .await
        .unwrap();
    let second = brokers[1]
        .acquire_shared("catalog", Duration::ZERO, lease, budget)
        .await
        .unwrap();
    let writer = {
        let broker = brokers[2].clone();
        tokio::spawn(async move {
            broker
                .acquire("catalog", Duration::from_secs(30), lease, budget)
                .await
        })
    };
    until_waiters(server.admin, "catalog", 1).await;
    let admin = server.admin.to_string();
    let show = |json_out: bool| {
        let mut args = vec!["locks", "show", "catalog", "--admin", &admin];
        args.extend(["--admin-token-file", &token_file]);
        if json_out {
            args.push("--json");
        }
        ticketing(&args)
    };
    let (code, stdout, stderr) = show(true);
    assert_eq!(code, Some(0), "{stderr}");
    let view = json(&stdout);
    assert_eq!(view["mode"], "shared", "{view}");
    let sharers: Vec<u64> = view["sharers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["token"].as_u64().unwrap())
        .collect();
    assert_eq!(sharers, [first.token(), second.token()]);
    assert_eq!(view["holder"]["token"], first.token(), "the oldest");
    assert_eq!(view["waiters"][0]["mode"], "exclusive");
    let (code, table, stderr) = show(false);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(table.contains("mode     shared by 2"), "{table}");
    assert!(
        table.contains(&format!("sharer   token {}", second.token())),
        "{table}"
    );
    let (code, listing, _) = ticketing(&["locks", "ls", "--admin", &admin]);
    assert_eq!(code, Some(0));
    assert!(listing.contains("(shared by 2)"), "{listing}");
    // Both let go: the writer holds it alone.
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let ticket = writer.await.unwrap().unwrap();
    let (_, stdout, _) = show(true);
    let view = json(&stdout);
    assert_eq!(view["mode"], "exclusive", "{view}");
    assert!(view["sharers"].as_array().unwrap().is_empty());
    assert_eq!(ticket.release().await.unwrap(), ReleaseOutcome::Released);
    for broker in brokers {
        broker.close().await;
    }
}
