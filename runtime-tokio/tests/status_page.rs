//! The admin listener's status page (`GET /`) in a real headless Chromium,
//! against the real `ticketing serve` binary: what a visitor without the
//! admin token sees (the queue, never a live fencing token), the lease
//! counting down, a screenshot at 1280×800, and a force-release driven
//! through the page's own controls over the DevTools protocol (a minimal
//! WebSocket client below: no such crate is in the tree).
//!
//! Chromium comes from Debian's `chromium` package, which `.ci/run`
//! installs. Without it the test fails when `CI` is set and is skipped,
//! saying why, otherwise.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::admin::{http_get, http_request, http_request_as};
use common::cluster::{CLIENT_TOKEN, Cluster, IDENTITY, PEER_TOKEN, Setup};
use common::ports::free_port;
use common::scratch::{Scratch, scratch_dir};
use serde_json::{Value, json};
use ticketing_tokio::TicketBroker;

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
const KEY: &str = "jobs/7";
/// The key in a URL path or fragment.
const KEY_IN_URL: &str = "jobs%2F7";
/// Bound on every wait for a process, a line or a condition.
const DEADLINE: Duration = Duration::from_secs(30);

/// The `chromium` on `PATH`; `None` (after saying why) when there is none
/// and `CI` is not set; a failure when it is.
fn chromium(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("chromium"))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: needs chromium (Debian's package, installed by .ci/run), and CI is set: \
             failing instead of skipping"
        );
        eprintln!("SKIPPED {test}: needs chromium on PATH (apt-get install chromium)");
    }
    found
}

/// Polls `check` until it answers, failing after [`DEADLINE`].
fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "no {what} within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads `stream`'s lines on a thread of their own (so the pipe never
/// fills) and sends them on; the receiver may stop listening at any time.
fn lines_of(stream: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            // Nobody listening any more: keep draining.
            let _ = sender.send(line);
        }
    });
    receiver
}

/// The first line of `lines` that `pick` takes, within [`DEADLINE`].
fn await_line<T>(
    lines: &mpsc::Receiver<String>,
    what: &str,
    mut pick: impl FnMut(&str) -> Option<T>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if let Some(value) = pick(&line) {
                    return value;
                }
            }
            Err(e) => panic!("no {what} within {DEADLINE:?} ({e})"),
        }
    }
}

/// A single-mode `ticketing serve` with the admin listener on loopback and
/// an admin token, killed when dropped.
struct Server {
    child: Child,
    client: SocketAddr,
    admin: SocketAddr,
    _dir: Scratch,
}

impl Server {
    fn start() -> Server {
        let dir = scratch_dir("status-page");
        std::fs::create_dir_all(&dir.0).unwrap();
        let tokens = dir.0.join("admin-tokens");
        std::fs::write(&tokens, format!("{ADMIN_TOKEN}\n")).unwrap();
        let (client, admin) = (free_port(), free_port());
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", &client.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--admin-token-file", tokens.to_str().unwrap()])
            .args(["--state-dir", dir.0.join("state").to_str().unwrap()])
            .args(["--log-level", "info"])
            .env_remove("TICKETING_CLIENT_TOKENS")
            .env_remove("TICKETING_ADMIN_TOKENS")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ticketing serve");
        let lines = lines_of(child.stderr.take().unwrap());
        // The admin listener is bound before this line is logged.
        await_line(&lines, "startup line", |line| {
            line.contains("ticketing server listening").then_some(())
        });
        Server {
            child,
            client,
            admin,
            _dir: dir,
        }
    }

    /// The lock API's view of [`KEY`], with the admin token.
    fn lock(&self) -> Value {
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        let path = format!("/v1/locks/{KEY_IN_URL}");
        let (status, _, body) =
            http_request(self.admin, "GET", &path, Some(&bearer)).expect("the admin API answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Our client with `label`, once ready.
async fn broker(server: &Server, label: &str) -> TicketBroker {
    let broker = TicketBroker::builder()
        .addrs([server.client.to_string()])
        .allow_loopback_no_auth()
        .label(label)
        .connect()
        .expect("client");
    assert!(broker.wait_ready(DEADLINE).await, "client not ready");
    broker
}

/// Runs Chromium headless with `args` then `url` until it exits (within
/// [`DEADLINE`]), with a profile of its own; returns its stdout.
fn chromium_run(chromium: &Path, args: &[&str], url: &str) -> String {
    let profile = scratch_dir("status-page-chromium");
    let out = profile.0.with_extension("out");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-background-networking",
        ])
        .args(["--disable-gpu", "--virtual-time-budget=3000"])
        .arg(format!("--user-data-dir={}", profile.arg()))
        .args(args)
        .arg(url)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn chromium");
    let status = poll("chromium exit", || child.try_wait().unwrap());
    assert!(status.success(), "chromium {args:?} {url}: {status}");
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    text
}

/// The DOM after the page's scripts ran.
fn dump_dom(chromium: &Path, url: &str) -> String {
    chromium_run(chromium, &["--dump-dom"], url)
}

/// Every value of attribute `name` in `html`, in document order.
fn attributes<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let needle = format!(" {name}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.split_once('"').map(|(value, _)| value)
        })
        .collect()
}

/// The live countdown of the holder's lease in the key view: the ms it
/// showed when the DOM was taken.
fn lease_left_ms(dom: &str) -> u64 {
    let at = dom
        .find("data-fact=\"Lease left\"")
        .expect("a Lease left fact");
    let ms = attributes(&dom[at..], "data-ms")[0];
    ms.parse().unwrap()
}

/// A PNG's (width, height) from its IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.len() > 24, "a PNG of {} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR", "no IHDR first");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    (width, height)
}

/// Where test artifacts go: under the build's target directory.
fn artifact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let dir = target.join("status-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// A plain test with a runtime of its own for the clients: the browser is
// driven by blocking calls on the test's thread, which must never hold up
// the clients' tasks.
#[test]
fn the_page_shows_the_queue_counts_down_and_force_releases_with_the_token() {
    let test = "the_page_shows_the_queue_counts_down_and_force_releases_with_the_token";
    let Some(chromium) = chromium(test) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Timers and the clients' drops need the runtime's context.
    let _context = runtime.enter();
    let server = Server::start();
    let holder = runtime.block_on(broker(&server, "builder"));
    let ticket = runtime
        .block_on(holder.acquire(KEY, Duration::ZERO, Duration::from_secs(60), Duration::ZERO))
        .expect("the key is free");
    let token = ticket.token();
    // Three waiters, queued one after another so their order is known.
    let mut waiting = Vec::new();
    for n in 1..=3 {
        let waiter = runtime.block_on(broker(&server, &format!("waiter-{n}")));
        waiting.push(runtime.spawn(async move {
            let granted = waiter
                .acquire(
                    KEY,
                    Duration::from_secs(120),
                    Duration::from_secs(30),
                    Duration::ZERO,
                )
                .await;
            (waiter, granted)
        }));
        poll("the waiter to queue", || {
            (server.lock()["waiters_total"] == n).then_some(())
        });
    }
    let view = server.lock();
    let holder_conn = view["holder"]["conn"]["id"].as_u64().unwrap();
    let queue: Vec<String> = view["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["conn"]["id"].as_u64().unwrap().to_string())
        .collect();
    let labels: Vec<&str> = view["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["conn"]["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["waiter-1", "waiter-2", "waiter-3"], "{view}");

    let base = format!("http://{}", server.admin);
    let (status, content_type, page) = http_get(server.admin, "/").unwrap();
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/html; charset=utf-8");
    assert!(page.contains("<noscript>"), "a note without JavaScript");
    let (status, _, body) = http_get(server.admin, "/v1/node").unwrap();
    assert_eq!(
        (status, body.trim()),
        (
            200,
            r#"{"leader_admin":null,"leader_slot":null,"mode":"single","slot":null}"#
        )
    );
    // The page is behind the same Host check as the API.
    let (status, _, _) =
        http_request_as("rebound.example:80", server.admin, "GET", "/", None).unwrap();
    assert_eq!(status, 421);

    // Without the admin token: the key, its holder's connection, and never
    // the live fencing token.
    let list = dump_dom(&chromium, &format!("{base}/"));
    assert!(list.contains(&format!("data-key=\"{KEY}\"")), "{list}");
    assert!(list.contains(&format!("conn {holder_conn} · v3")), "{list}");
    assert!(!list.contains(&token.to_string()), "a live token shown");
    assert!(list.contains("tokens hidden without the admin token"));

    // The key's view: the whole queue, front first, with positions.
    let first = dump_dom(&chromium, &format!("{base}/#key={KEY_IN_URL}"));
    assert!(!first.contains(&token.to_string()), "a live token shown");
    assert!(
        first.contains("hidden (admin token needed)"),
        "the token's place says why it is empty"
    );
    assert_eq!(attributes(&first, "data-position"), ["1", "2", "3"]);
    assert_eq!(attributes(&first, "data-conn"), queue);
    assert!(first.contains(">1</th>") && first.contains(">3</th>"));
    // The lease counts down: a later load shows less left.
    let second = dump_dom(&chromium, &format!("{base}/#key={KEY_IN_URL}"));
    let (before, after) = (lease_left_ms(&first), lease_left_ms(&second));
    assert!(
        after < before && before <= 60_000,
        "lease left {before} ms, then {after} ms"
    );

    // A screenshot at 1280×800, kept under target/ as an artifact.
    let shot = artifact_dir().join("status-page-1280x800.png");
    let _ = std::fs::remove_file(&shot);
    chromium_run(
        &chromium,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,800",
            "--hide-scrollbars",
        ],
        &format!("{base}/#key={KEY_IN_URL}"),
    );
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert_eq!(png_size(&png), (1280, 800), "{}", shot.display());
    eprintln!("status page screenshot: {}", shot.display());

    // With the admin token, entered in the page, through its controls.
    let mut browser = Browser::start(&chromium);
    let mut page = browser.page();
    page.navigate(&format!("{base}/#key={KEY_IN_URL}"));
    page.until(
        "the queue",
        "document.querySelectorAll('#waiters tbody tr').length === 3",
    );
    // The countdown ticks between polls, client-side.
    let shown =
        page.eval_u64("+document.querySelector('[data-fact=\"Lease left\"] .live').dataset.ms");
    page.until(
        "the countdown to tick",
        &format!(
            "+document.querySelector('[data-fact=\"Lease left\"] .live').dataset.ms < {shown}"
        ),
    );
    // No release control without the token.
    assert!(page.eval_bool("document.getElementById('release-start').hidden"));
    assert!(!page.eval_bool("document.getElementById('release-needs-token').hidden"));
    // Type the token and press Enter, as a keyboard user would.
    page.eval("document.getElementById('auth-token').focus()");
    page.call("Input.insertText", json!({ "text": ADMIN_TOKEN }));
    page.press_enter();
    page.until(
        "the token in use",
        &format!("document.querySelector('[data-fact=\"Token\"] dd').textContent === '{token}'"),
    );
    let shown_labels = page.eval(
        "[...document.querySelectorAll('#waiters tbody tr td:nth-child(2)')].map(td => td.textContent)",
    );
    let shown_labels: Vec<String> = serde_json::from_value(shown_labels).unwrap();
    for (shown, label) in shown_labels
        .iter()
        .zip(["waiter-1", "waiter-2", "waiter-3"])
    {
        assert!(
            shown.starts_with(&format!("{label} (conn ")),
            "{shown_labels:?}"
        );
    }
    assert!(
        page.eval_bool("document.getElementById('auth-token').value === ''"),
        "the token is not left in the field"
    );
    assert!(
        !page
            .eval_string("document.documentElement.outerHTML")
            .contains(ADMIN_TOKEN),
        "the admin token is never written into the page"
    );

    // Force-release: the button asks first; nothing happens until the
    // operator confirms.
    page.eval("document.getElementById('release-start').click()");
    assert!(!page.eval_bool("document.getElementById('release-confirm').hidden"));
    assert_eq!(
        page.eval_string("document.activeElement.id"),
        "release-yes",
        "the confirmation takes the focus"
    );
    let question = page.eval_string("document.getElementById('release-question').textContent");
    assert!(
        question.contains(KEY) && question.contains(&token.to_string()),
        "{question}"
    );
    assert_eq!(
        server.lock()["holder"]["token"],
        token,
        "released before confirming"
    );
    page.press_enter();
    let revoked = page.until_value(
        "the release's answer",
        "document.getElementById('release-result').dataset.revoked || null",
    );
    assert_eq!(
        page.eval_string("document.activeElement.id"),
        "release-result",
        "the focus moves to the outcome"
    );
    let handed_to = page.eval_string("document.getElementById('release-result').dataset.handedTo");
    let result = page.eval_string("document.getElementById('release-result').textContent");
    assert_eq!(revoked, json!(token.to_string()), "{result}");
    // The front waiter got the key under the token the answer named.
    let (_waiter, granted) = runtime
        .block_on(tokio::time::timeout(DEADLINE, waiting.remove(0)))
        .expect("the front waiter is granted")
        .unwrap();
    // Kept until the end: dropping it would hand the key on to waiter-2.
    let next_ticket = granted.expect("the front waiter is granted");
    let next = next_ticket.token();
    assert_eq!(handed_to, next.to_string(), "{result}");
    assert!(next > token);
    assert!(
        result.contains(&format!("handed to the front waiter under token {next}")),
        "{result}"
    );
    // The page shows the new holder and the two still waiting.
    page.until(
        "the new holder",
        &format!("document.querySelector('[data-fact=\"Token\"] dd').textContent === '{next}'"),
    );
    // The release is among the recent events, with both tokens (the
    // admin token is in use), recorded by the core.
    let event = page.until_value(
        "the force-release among the events",
        "(document.querySelector('#events tbody tr[data-kind=\"force_released\"]') || {}).textContent || null",
    );
    let event = event.as_str().unwrap().to_owned();
    assert!(
        event.contains(KEY)
            && event.contains(&format!("token {token} revoked"))
            && event.contains(&format!("under token {next}")),
        "{event}"
    );
    // The chart has drawn rates, and the hand-over's grant shows in them.
    page.until(
        "a grant on the chart",
        "+document.getElementById('chart').dataset.points >= 2 && \
         +document.querySelector('#chart polyline[data-series=\"grants\"]').dataset.max > 0",
    );
    let points = page.eval_string(
        "document.querySelector('#chart polyline[data-series=\"grants\"]').getAttribute('points')",
    );
    assert!(points.split(' ').count() >= 2, "{points}");
    assert!(
        page.eval_string("document.getElementById('chart-summary').textContent")
            .starts_with("Latest: grants/s "),
    );
    page.until(
        "two waiters",
        "document.querySelectorAll('#waiters tbody tr').length === 2",
    );
    // Back to the list, now with tokens; then the search by prefix.
    page.eval("document.getElementById('back').click()");
    page.until(
        "the list with the token",
        &format!(
            "[...document.querySelectorAll('#locks tbody tr[data-key] td')].some(td => td.textContent === '{next}')"
        ),
    );
    // By keyboard alone: Tab from the search box reaches the key's link,
    // Enter opens its view, and the way back is a link too.
    page.eval("document.getElementById('prefix').focus()");
    let mut tabs = 0;
    while page.eval_string("document.activeElement.getAttribute('href') || ''")
        != format!("#key={KEY_IN_URL}")
    {
        tabs += 1;
        assert!(
            tabs <= 5,
            "the key's link is not within 5 tabs of the search box"
        );
        page.press_key("Tab", 9);
    }
    page.press_enter();
    page.until(
        "the key's view opened by keyboard",
        "!document.getElementById('key-view').hidden",
    );
    page.eval("document.getElementById('back').focus()");
    page.press_enter();
    page.until(
        "the list again",
        "!document.getElementById('list-view').hidden",
    );
    page.eval("document.getElementById('prefix').focus()");
    page.call("Input.insertText", json!({ "text": "other/" }));
    page.press_enter();
    page.until(
        "no key under other/",
        "document.getElementById('locks-summary').textContent.startsWith('0 keys starting with')",
    );
    assert_eq!(
        page.eval_u64("document.querySelectorAll('#locks tbody tr').length"),
        0
    );
    // On a phone's width the page does not overflow sideways (wide tables
    // scroll inside their own box) and the chart fits.
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true }),
    );
    page.navigate(&format!("{base}/"));
    page.until(
        "the list on a phone",
        &format!("document.querySelector('#locks tbody tr[data-key=\"{KEY}\"]') !== null"),
    );
    assert_eq!(page.eval_u64("window.innerWidth"), 390);
    assert!(
        page.eval_bool("document.documentElement.scrollWidth <= window.innerWidth"),
        "the page is {} px wide on a 390 px screen",
        page.eval_u64("document.documentElement.scrollWidth")
    );
    assert!(page.eval_bool(
        "document.getElementById('chart').getBoundingClientRect().right <= window.innerWidth"
    ));
    page.call("Emulation.clearDeviceMetricsOverride", json!({}));

    // Without JavaScript: the server's summary shows, and the page asks
    // to be reloaded.
    page.call(
        "Emulation.setScriptExecutionDisabled",
        json!({ "value": true }),
    );
    page.navigate(&format!("{base}/"));
    let mode = page.until_value(
        "the summary without JavaScript",
        "(document.querySelector('#summary-without-script [data-summary=\"Mode\"] dd') || {}).textContent || null",
    );
    assert_eq!(mode, json!("single"));
    assert_eq!(
        page.eval_string(
            "document.querySelector('#summary-without-script [data-summary=\"Waiters\"] dd').textContent"
        ),
        "2"
    );
    assert!(
        page.eval_bool(
            "document.querySelector('head meta[http-equiv=\"refresh\"]').content === '10'"
        )
    );
    assert_eq!(
        page.eval_u64("document.getElementById('overview').children.length"),
        0,
        "the script did not run"
    );
    drop(page);
    browser.stop();

    // A visitor without the token sees the release among the events, but
    // neither token (the new holder's is live).
    let dom = dump_dom(&chromium, &format!("{base}/"));
    let row = &dom[dom
        .find("data-kind=\"force_released\"")
        .unwrap_or_else(|| panic!("{dom}"))..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("revoked (tokens hidden)"), "{row}");
    assert!(
        !dom.contains(&token.to_string()) && !dom.contains(&next.to_string()),
        "a token shown without the admin token"
    );

    // The events over HTTP: without the admin token (a loopback
    // listener), the release with its tokens hidden; with it, shown.
    let (status, _, body) = http_get(server.admin, "/v1/events").unwrap();
    assert_eq!(status, 200, "{body}");
    let events: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(events["redacted"], true);
    let released = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "force_released")
        .unwrap_or_else(|| panic!("{events}"));
    assert_eq!(released["keys"], json!([KEY]));
    assert_eq!(
        (&released["revoked"], &released["handed_to"]),
        (&Value::Null, &Value::Null)
    );
    assert!(!body.contains(&token.to_string()), "{body}");
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let (status, _, body) = http_request(server.admin, "GET", "/v1/events", Some(&bearer)).unwrap();
    assert_eq!(status, 200, "{body}");
    let events: Value = serde_json::from_str(&body).unwrap();
    let released = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "force_released")
        .unwrap_or_else(|| panic!("{events}"));
    assert_eq!(
        (&released["revoked"], &released["handed_to"]),
        (&json!(token), &json!(next))
    );
    // Without JavaScript: a refresh, and the summary /metrics would give
    // (the sessions by dialect: our brokers speak v3).
    let (_, _, metrics) = http_get(server.admin, "/metrics").unwrap();
    let v3 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(r#"ticketing_connections{state="session",dialect="v3"} "#)
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    let (_, _, html) = http_get(server.admin, "/").unwrap();
    assert!(html.contains(r#"<meta http-equiv="refresh" content="10">"#));
    assert!(
        html.contains(&format!(
            r#"<div data-summary="Client connections"><dt>Client connections</dt><dd>{v3} (v3 {v3}, line 0)</dd></div>"#
        )),
        "{html}"
    );
    assert!(html.contains(r#"<div data-summary="Waiters"><dt>Waiters</dt><dd>2</dd></div>"#));
    drop((ticket, next_ticket));
}

/// The text of the fact `name` (a `<dd>`) in a dumped page.
fn fact_text(dom: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("data-fact=\"{name}\""))?;
    let rest = &dom[at..];
    let dd = rest.find("<dd")?;
    let rest = &rest[dd..];
    let start = rest.find('>')? + 1;
    let end = rest.find("</dd>")?;
    Some(rest[start..end].to_owned())
}

/// Config files for a 3-node cluster whose every node has a loopback
/// admin listener, knows every slot's, and accepts [`ADMIN_TOKEN`].
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

/// The row of `slot` in a page's table of every node.
fn member_row(dom: &str, slot: usize) -> Option<&str> {
    let at = dom.find(&format!("<tr data-slot=\"{slot}\""))?;
    let row = &dom[at..];
    Some(&row[..row.find("</tr>")?])
}

/// The readiness a member's row shows.
fn readiness_of(row: &str) -> &str {
    ["not ready", "ready", "unknown here"]
        .into_iter()
        .find(|state| row.contains(&format!(">{state}</td>")))
        .unwrap_or("none")
}

/// What a node's page says of it, once the page shows it: (role, term).
fn try_page_role(chromium: &Path, admin: SocketAddr) -> Option<(String, u64)> {
    let dom = dump_dom(chromium, &format!("http://{admin}/"));
    let role = fact_text(&dom, "Role")?;
    let term = fact_text(&dom, "Term")?.parse().ok()?;
    Some((role, term))
}

/// What a node's page says of it: (role, term).
fn page_role(chromium: &Path, admin: SocketAddr) -> (String, u64) {
    let dom = dump_dom(chromium, &format!("http://{admin}/"));
    let role = fact_text(&dom, "Role").unwrap_or_else(|| panic!("no role on the page: {dom}"));
    let term = fact_text(&dom, "Term")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no term on the page: {dom}"));
    (role, term)
}

#[test]
fn cluster_pages_show_each_role_and_a_new_leader_after_the_leader_is_killed() {
    let test = "cluster_pages_show_each_role_and_a_new_leader_after_the_leader_is_killed";
    let Some(chromium) = chromium(test) else {
        return;
    };
    let mut cluster = Cluster::new(3);
    let admin: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
    let config_dir = scratch_dir("status-page-cluster");
    cluster.setup = Setup::Files(cluster_files(&config_dir, &cluster, &admin));
    cluster.start_all();
    // Every node ready: each knows the leader.
    for &addr in &admin {
        poll("/readyz 200", || {
            http_get(addr, "/readyz").and_then(|(status, _, _)| (status == 200).then_some(()))
        });
    }
    // The three pages are read one after another, and on a loaded machine
    // a node's first poll may still be out or an election may fall between
    // two reads: they are read again until they agree on one term, and
    // then must show exactly one leader and two followers.
    // The leader's and a follower's pages are read again after that, and
    // an election may fall in between too: the whole reading is taken
    // again until the two pages are still in the term the three agreed on.
    let mut seen = Vec::new();
    let (roles, leader, leader_dom, follower_dom) =
        poll("the pages agreeing on a term and its leader", || {
            let roles: Option<Vec<(String, u64)>> = (0..3)
                .map(|slot| try_page_role(&chromium, admin[slot]))
                .collect();
            seen = roles.clone().unwrap_or_default();
            let roles = roles.filter(|roles| roles.iter().all(|(_, term)| *term == roles[0].1))?;
            let leaders: Vec<usize> = (0..3)
                .filter(|&slot| roles[slot].0 == "leader, voter")
                .collect();
            // One term, so never two leaders; none yet is an election.
            assert!(leaders.len() <= 1, "two leaders in one term: {roles:?}");
            let leader = *leaders.first()?;
            let term = roles[0].1;
            let leader_dom = dump_dom(&chromium, &format!("http://{}/", admin[leader]));
            let follower = (leader + 1) % 3;
            let follower_dom = dump_dom(&chromium, &format!("http://{}/", admin[follower]));
            let still =
                |dom: &str| fact_text(dom, "Term").and_then(|t| t.parse().ok()) == Some(term);
            (still(&leader_dom) && still(&follower_dom)).then_some((
                roles,
                leader,
                leader_dom,
                follower_dom,
            ))
        });
    for (slot, (role, _)) in roles.iter().enumerate().filter(|&(s, _)| s != leader) {
        assert_eq!(
            role, "follower, voter",
            "slot {slot}: {roles:?} (last read {seen:?})"
        );
    }
    // The leader's page shows how far behind each peer is; a follower's
    // lock table sends the operator to the leader.
    let behind = fact_text(&leader_dom, "Peers behind").expect("the peers' lag on the leader");
    assert_eq!(behind.matches("slot ").count(), 2, "{behind}");
    // Every node in one view, from the leader's: by slot, its role, and
    // (the leader hears them all) each one ready.
    let roles_by_slot = |dom: &str| -> Vec<String> {
        attributes(dom, "data-role")
            .iter()
            .map(|role| role.to_string())
            .collect()
    };
    let expected: Vec<String> = (0..3)
        .map(|slot| if slot == leader { "leader" } else { "follower" }.to_owned())
        .collect();
    assert_eq!(
        attributes(&leader_dom, "data-slot"),
        ["0", "1", "2"],
        "{leader_dom}"
    );
    assert_eq!(roles_by_slot(&leader_dom), expected, "{leader_dom}");
    let members_table = &leader_dom[leader_dom.find("id=\"members\"").unwrap()..];
    let members_table = &members_table[..members_table.find("</table>").unwrap()];
    assert_eq!(
        members_table.matches(">ready</td>").count(),
        3,
        "{members_table}"
    );
    assert_eq!(
        members_table.matches(">voter</td>").count(),
        3,
        "{members_table}"
    );
    assert!(members_table.contains(&format!("slot {leader} (this node)")));
    // The leader change that made it is among the leader's events.
    assert!(
        leader_dom.contains("data-kind=\"leader_changed\""),
        "{leader_dom}"
    );
    assert_eq!(
        fact_text(&leader_dom, "Leader").as_deref(),
        Some(format!("slot {leader} (this node)").as_str())
    );
    assert_eq!(
        fact_text(&follower_dom, "Leader").as_deref(),
        Some(format!("slot {leader}").as_str()),
        "{follower_dom}"
    );
    assert!(
        follower_dom.contains(&format!("href=\"http://{}/\"", admin[leader])),
        "a link to the leader's page"
    );
    assert!(
        follower_dom.contains("This node is not the leader"),
        "{follower_dom}"
    );
    // A follower lists every node too, naming the leader.
    assert_eq!(roles_by_slot(&follower_dom), expected, "{follower_dom}");

    // Kill the leader: a survivor's page shows it leading, in a later term.
    let old_term = roles[leader].1;
    cluster.kill(leader);
    let survivors: Vec<usize> = (0..3).filter(|&s| s != leader).collect();
    let (new_leader, new_term) = poll("a new leader on a survivor's page", || {
        survivors.iter().find_map(|&slot| {
            let (role, term) = page_role(&chromium, admin[slot]);
            (role == "leader, voter").then_some((slot, term))
        })
    });
    assert!(new_term > old_term, "term {old_term}, then {new_term}");
    let dom = dump_dom(&chromium, &format!("http://{}/", admin[new_leader]));
    assert_eq!(
        fact_text(&dom, "Leader"),
        Some(format!("slot {new_leader} (this node)"))
    );
    // Its events show it taking over.
    assert!(
        dom.contains(&format!("slot {new_leader} leads (term ")),
        "{dom}"
    );
    // The new leader's table: the killed node is still a member, and not
    // ready (unheard); the survivors are ready.
    poll("the killed node not ready on the new leader's page", || {
        let dom = dump_dom(&chromium, &format!("http://{}/", admin[new_leader]));
        let readiness: Vec<Option<&str>> = (0..3)
            .map(|slot| member_row(&dom, slot).map(readiness_of))
            .collect();
        let expected: Vec<Option<&str>> = (0..3)
            .map(|slot| Some(if slot == leader { "not ready" } else { "ready" }))
            .collect();
        (readiness == expected).then_some(())
    });
    let other = survivors
        .iter()
        .copied()
        .find(|&s| s != new_leader)
        .unwrap();
    // The other survivor's page names the new leader.
    poll("the other survivor following the new leader", || {
        let dom = dump_dom(&chromium, &format!("http://{}/", admin[other]));
        let following = fact_text(&dom, "Role").as_deref() == Some("follower, voter")
            && fact_text(&dom, "Leader") == Some(format!("slot {new_leader}"));
        following.then_some(())
    });
    drop(config_dir);
}

// ---------------------------------------------------------------------------
// Chromium over the DevTools protocol
// ---------------------------------------------------------------------------

/// A headless Chromium with its DevTools endpoint on a loopback port,
/// killed when stopped or dropped.
struct Browser {
    child: Child,
    devtools: SocketAddr,
    _profile: Scratch,
}

impl Browser {
    fn start(chromium: &Path) -> Browser {
        let profile = scratch_dir("status-page-cdp");
        let mut child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-background-networking",
            ])
            .args(["--disable-gpu", "--remote-debugging-port=0"])
            .args([
                "--remote-debugging-address=127.0.0.1",
                "--window-size=1280,800",
            ])
            .arg(format!("--user-data-dir={}", profile.arg()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn chromium");
        let lines = lines_of(child.stderr.take().unwrap());
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/…"
        let devtools = await_line(&lines, "DevTools address", |line| {
            let rest = line.split_once("DevTools listening on ws://")?.1;
            rest.split_once('/')?.0.parse().ok()
        });
        Browser {
            child,
            devtools,
            _profile: profile,
        }
    }

    /// The first page target, connected.
    fn page(&mut self) -> Page {
        let path = poll("a page target", || {
            let targets: Value =
                serde_json::from_str(&devtools_get(self.devtools, "/json/list")?).ok()?;
            let page = targets.as_array()?.iter().find(|t| t["type"] == "page")?;
            let url = page["webSocketDebuggerUrl"].as_str()?;
            let path = url.strip_prefix("ws://")?.split_once('/')?.1;
            Some(format!("/{path}"))
        });
        Page {
            socket: WebSocket::connect(self.devtools, &path),
            next_id: 0,
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET path` of the DevTools HTTP endpoint: the body of a `200`. Read by
/// its `Content-Length`, as the endpoint keeps the connection open.
fn devtools_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut tcp = TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(DEADLINE)).ok()?;
    write!(tcp, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut reader = BufReader::new(tcp);
    let mut status = String::new();
    reader.read_line(&mut status).ok()?;
    if !status.starts_with("HTTP/1.1 200") {
        return None;
    }
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let length = length.filter(|&n| n <= MESSAGE_BYTES_MAX)?;
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
}

/// One page target's DevTools session.
struct Page {
    socket: WebSocket,
    next_id: u64,
}

impl Page {
    /// Calls `method` and returns its `result` (events in between are
    /// skipped); a protocol error fails the test.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "id": id, "method": method, "params": params });
        self.socket.send(&message.to_string());
        let deadline = Instant::now() + DEADLINE;
        loop {
            assert!(Instant::now() < deadline, "no answer to {method}");
            let answer: Value = serde_json::from_str(&self.socket.receive()).unwrap();
            if answer["id"] == id {
                assert!(answer["error"].is_null(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
    }

    /// The value of `expression` in the page (promises awaited); an
    /// exception fails the test.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    fn eval_bool(&mut self, expression: &str) -> bool {
        self.eval(expression).as_bool().unwrap_or(false)
    }

    fn eval_u64(&mut self, expression: &str) -> u64 {
        let value = self.eval(expression);
        value
            .as_u64()
            .unwrap_or_else(|| panic!("{expression}: {value}"))
    }

    fn eval_string(&mut self, expression: &str) -> String {
        let value = self.eval(expression);
        value
            .as_str()
            .unwrap_or_else(|| panic!("{expression}: {value}"))
            .to_owned()
    }

    /// Polls until `expression` is true.
    fn until(&mut self, what: &str, expression: &str) {
        self.until_value(what, &format!("({expression}) || null"));
    }

    /// Polls until `expression` is not null; returns it. A failure shows
    /// what the page says.
    fn until_value(&mut self, what: &str, expression: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let value = self.eval(expression);
            if !value.is_null() {
                return value;
            }
            if Instant::now() >= deadline {
                let shown = self.eval("document.querySelector('main').innerText");
                panic!("no {what} within {DEADLINE:?}; the page shows: {shown}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Presses and releases Enter on the focused element.
    fn press_enter(&mut self) {
        for kind in ["keyDown", "keyUp"] {
            let mut event = json!({
                "type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13,
            });
            if kind == "keyDown" {
                event["text"] = json!("\r");
            }
            self.call("Input.dispatchKeyEvent", event);
        }
    }

    /// Presses and releases a key that types nothing (`Tab`).
    fn press_key(&mut self, key: &str, code: u32) {
        for kind in ["rawKeyDown", "keyUp"] {
            let event = json!({
                "type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code,
            });
            self.call("Input.dispatchKeyEvent", event);
        }
    }
}

/// The client side of a WebSocket (RFC 6455), as much as DevTools needs:
/// text messages, masked on the way out.
struct WebSocket {
    tcp: TcpStream,
}

/// The longest message accepted from the browser.
const MESSAGE_BYTES_MAX: usize = 16 << 20;

impl WebSocket {
    fn connect(addr: SocketAddr, path: &str) -> WebSocket {
        let mut tcp = TcpStream::connect(addr).expect("DevTools port");
        tcp.set_read_timeout(Some(DEADLINE)).unwrap();
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        // The head ends at the first blank line; read it byte by byte so
        // that no frame after it is swallowed.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            assert!(head.len() < 16 * 1024, "an endless handshake answer");
            let mut byte = [0u8];
            tcp.read_exact(&mut byte).expect("the handshake's answer");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        WebSocket { tcp }
    }

    fn send(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            len @ 0..=125 => frame.push(0x80 | len as u8),
            len @ 126..=0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(len as u16).to_be_bytes());
            }
            len => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        // The mask only keeps proxies from reading frames as requests; a
        // fixed one is enough against a local browser.
        let mask = [0x5a, 0x13, 0xc7, 0x2e];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.tcp.write_all(&frame).expect("send to DevTools");
    }

    /// The next text message (fragments joined; pings answered).
    fn receive(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.tcp
                .read_exact(&mut head)
                .expect("a frame from DevTools");
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let len = match head[1] & 0x7f {
                126 => {
                    let mut ext = [0u8; 2];
                    self.tcp.read_exact(&mut ext).unwrap();
                    usize::from(u16::from_be_bytes(ext))
                }
                127 => {
                    let mut ext = [0u8; 8];
                    self.tcp.read_exact(&mut ext).unwrap();
                    usize::try_from(u64::from_be_bytes(ext)).unwrap_or(usize::MAX)
                }
                len => usize::from(len),
            };
            assert!(
                message.len() + len <= MESSAGE_BYTES_MAX,
                "a message over {MESSAGE_BYTES_MAX} bytes"
            );
            let mut payload = vec![0u8; len];
            self.tcp.read_exact(&mut payload).unwrap();
            match opcode {
                0x0..=0x2 => message.extend_from_slice(&payload),
                0x8 => panic!("DevTools closed the connection"),
                // A ping: answer with a pong of the same payload (masked,
                // short: DevTools pings carry none).
                0x9 => {
                    let mut pong = vec![0x8a, 0x80 | (len.min(125) as u8), 0, 0, 0, 0];
                    pong.extend_from_slice(&payload[..len.min(125)]);
                    self.tcp.write_all(&pong).unwrap();
                    continue;
                }
                _ => continue,
            }
            if fin {
                return String::from_utf8(message).expect("a text message");
            }
        }
    }
}
