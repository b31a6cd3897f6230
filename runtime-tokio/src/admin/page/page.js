// The admin listener's status page. Everything shown comes from the
// listener's own endpoints (/metrics, /readyz, /v1/locks…), which serve
// what the core decided; this script only asks and draws. Text from the
// server (keys, labels) is only ever set as textContent, never parsed as
// HTML: a key is any client's bytes.
"use strict";

// Polling: one round at a time (the next is scheduled after the last
// answer), every POLL_MS, and none while the tab is hidden. A round is
// /metrics, /readyz (and /v1/node in a cluster), then one key or up to
// PAGES_MAX listing pages, then /v1/events, one request after another:
// what one `ticketing status` and `ticketing locks ls` would ask, and one
// bounded read of the event ring. The chart is drawn from the /metrics
// read the round makes anyway.
const POLL_MS = 2000;
// Bounds on one round's listing: pages of PAGE_LIMIT locks, at most
// PAGES_MAX pages (each one bounded scan on the server).
const PAGE_LIMIT = 100;
const PAGES_MAX = 5;
// Countdowns tick this often between polls.
const TICK_MS = 250;
// The admin token lives in this tab's sessionStorage only (gone when the
// tab closes) and in memory; it is sent only as the Authorization header
// the API already accepts, and never written into the page.
const TOKEN_KEY = "ticketing-admin-token";

const $ = (id) => document.getElementById(id);

let token = null;
try { token = sessionStorage.getItem(TOKEN_KEY); } catch (_) { token = null; }
let prefix = "";
let pollTimer = null;
let polling = false;
// A request for a poll that came while one was under way (a search, a
// click): served as soon as that one ends.
let again = false;
// The lock currently shown in the key view, as last fetched.
let shownLock = null;

function headers() {
  return token ? { Authorization: "Bearer " + token } : {};
}

// A GET of the admin API: {status, body (JSON or text), redirected}.
// Redirects (a follower sends lock API requests to the leader) are not
// followed: the token must never go to another origin.
async function get(path, asJson) {
  const response = await fetch(path, { headers: headers(), redirect: "manual", cache: "no-store" });
  if (response.type === "opaqueredirect") return { status: 307, body: null, redirected: true };
  const text = await response.text();
  let body = text;
  if (asJson) { try { body = JSON.parse(text); } catch (_) { body = null; } }
  return { status: response.status, body: body, redirected: false };
}

// ---- formatting ----------------------------------------------------------

function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  ms = Math.max(0, Math.round(ms));
  if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
  return Math.floor(s / 3600) + " h " + String(Math.floor(s / 60) % 60).padStart(2, "0") + " min";
}

function keyText(text, encoding) {
  return encoding === "hex" ? "hex:" + text : text;
}

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (attrs) for (const name in attrs) node.setAttribute(name, attrs[name]);
  return node;
}

function connText(conn) {
  if (!conn) return "connection closed";
  let text = conn.label ? conn.label + " (conn " + conn.id + ")" : "conn " + conn.id;
  if (conn.source) text += " from " + conn.source;
  return text + " · " + conn.dialect;
}

// A live countdown (or count-up): its value at fetch time, ticked
// client-side from then on. data-ms is what it shows now, in ms.
function live(ms, direction) {
  const span = el("span", duration(ms), { "data-base-ms": String(ms), "data-dir": direction, "data-ms": String(ms) });
  span.className = "live";
  return span;
}

let fetchedAt = performance.now();

function tick() {
  const elapsed = performance.now() - fetchedAt;
  for (const span of document.querySelectorAll("span.live")) {
    const base = Number(span.getAttribute("data-base-ms"));
    const now = span.getAttribute("data-dir") === "down" ? Math.max(0, base - elapsed) : base + elapsed;
    span.setAttribute("data-ms", String(Math.round(now)));
    span.textContent = duration(now);
  }
}

// One fact of a <dl>; data-fact names it for scripts and tests.
function fact(list, name, value, cls) {
  const row = el("div", null, { "data-fact": name });
  row.append(el("dt", name));
  const dd = el("dd");
  if (value instanceof Node) dd.append(value); else dd.textContent = value;
  if (cls) dd.className = cls;
  row.append(dd);
  list.append(row);
}

// ---- the node overview (/metrics and /readyz) ----------------------------

// The samples of an OpenMetrics text: name{labels} -> value.
function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    if (space < 0) continue;
    samples.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return samples;
}

function sumOf(samples, name, labelFilter) {
  let total = 0, found = false;
  for (const [series, value] of samples) {
    if (series === name || series.startsWith(name + "{")) {
      if (labelFilter && !series.includes(labelFilter)) continue;
      total += value; found = true;
    }
  }
  return found ? total : null;
}

async function pollOverview() {
  const list = $("overview");
  const problem = $("overview-problem");
  const [metrics, ready] = await Promise.all([get("/metrics", false), get("/readyz", false)]);
  list.replaceChildren();
  if (metrics.status !== 200) {
    problem.hidden = false;
    problem.textContent = "/metrics answered " + metrics.status;
    return null;
  }
  problem.hidden = true;
  const m = parseMetrics(metrics.body);
  const cluster = m.has("ticketing_is_leader");
  fact(list, "Mode", cluster ? "cluster" : "single");
  const isReady = ready.status === 200;
  fact(list, "Readiness", isReady ? "ready" : String(ready.body || "not ready").trim(), isReady ? "good" : "bad");
  let role = "server";
  if (cluster) {
    role = m.get("ticketing_is_leader") === 1 ? "leader"
      : m.get("ticketing_has_leader") === 1 ? "follower" : "no leader known";
    role += m.get("ticketing_is_voter") === 1 ? ", voter" : ", not a voter";
    fact(list, "Role", role);
    fact(list, "Term", m.get("ticketing_raft_term"));
    fact(list, "Commit index", m.get("ticketing_raft_commit_index"));
    fact(list, "Applied index", m.get("ticketing_raft_applied_index"));
    fact(list, "Leader changes seen", m.get("ticketing_leader_changes_total"));
    const node = await get("/v1/node", true);
    if (node.status === 200 && node.body) {
      const n = node.body;
      fact(list, "This node", "slot " + n.slot);
      fact(list, "Leader", n.leader_slot === null ? "none known"
        : "slot " + n.leader_slot + (n.leader_slot === n.slot ? " (this node)" : ""));
      if (n.leader_admin && n.leader_slot !== n.slot) {
        fact(list, "Leader's page", pageLink(n.leader_admin));
      }
      showMembers(n.members || [], m.get("ticketing_is_leader") === 1);
    } else {
      showMembers([], false);
    }
    // Only a leader knows how far behind each peer is.
    const lags = [];
    for (const [series, value] of m) {
      const match = /^ticketing_peer_replication_lag_entries\{slot="(\d+)"\}$/.exec(series);
      if (match) lags.push("slot " + match[1] + ": " + value + (value === 1 ? " entry" : " entries"));
    }
    if (lags.length > 0) fact(list, "Peers behind", lags.join(", "));
  }
  fact(list, "Held keys", m.get("ticketing_held_keys"));
  fact(list, "Waiters", cluster && m.get("ticketing_is_leader") !== 1 ? "— (leader only)" : m.get("ticketing_waiters"));
  // Sessions by dialect: single mode's connections gauge, a cluster
  // node's sessions gauge.
  const family = cluster ? "ticketing_client_sessions_by_dialect" : "ticketing_connections";
  const sessions = cluster ? m.get("ticketing_client_sessions") : sumOf(m, family, 'state="session"');
  const v3 = sumOf(m, family, 'dialect="v3"');
  const line = sumOf(m, family, 'dialect="line"');
  fact(list, "Client connections", sessions +
    (v3 === null || line === null ? "" : " (v3 " + v3 + ", line " + line + ")"));
  if (!cluster) showMembers([], false);
  sample(m, cluster);
  return { cluster: cluster, leader: cluster && m.get("ticketing_is_leader") === 1 };
}

// A link to another node's page: a link, not a request (each node's page
// reads only its own listener, and the token never leaves this origin).
function pageLink(admin) {
  return el("a", admin, { href: "http://" + admin + "/" });
}

// ---- every node of the cluster (/v1/node's members) ------------------------

function showMembers(members, leading) {
  const area = $("members-area");
  area.hidden = members.length === 0;
  $("members-caption").textContent = leading
    ? "Every node of the cluster, as this node (the leader) sees them"
    : "Every node of the cluster, as this node sees them (lag and contact: on the leader's page)";
  $("members").tBodies[0].replaceChildren(...members.map((member) => {
    const row = el("tr", null, { "data-slot": String(member.slot), "data-role": member.role });
    row.append(el("th", "slot " + member.slot + (member.this_node ? " (this node)" : ""), { scope: "row" }));
    row.append(el("td", member.role));
    row.append(el("td", member.voter ? "voter" : "learner (does not vote)"));
    row.append(el("td", member.lag_entries === null ? "—"
      : member.lag_entries + (member.lag_entries === 1 ? " entry" : " entries"), { class: "num" }));
    row.append(el("td", member.heard_ms === null ? "—" : duration(member.heard_ms) + " ago"));
    const ready = el("td", member.ready === null ? "unknown here" : member.ready ? "ready" : "not ready");
    if (member.ready !== null) ready.className = member.ready ? "good" : "bad";
    row.append(ready);
    const page = el("td");
    if (member.admin && !member.this_node) page.append(pageLink(member.admin)); else page.textContent = member.this_node ? "this page" : "—";
    row.append(page);
    return row;
  }));
}

// ---- the activity chart (counters of /metrics, sampled each round) ---------

// Samples of the counters, one per poll round, for the last CHART_WINDOW_MS:
// the chart costs the server nothing beyond the /metrics read each round
// already makes.
const CHART_WINDOW_MS = 5 * 60 * 1000;
const CHART_SPAN_MIN_MS = 60 * 1000;
const SERIES = [
  { name: "grants", label: "grants/s" },
  { name: "releases", label: "releases/s" },
  { name: "expiries", label: "lease expiries/s" },
];
let samples = [];

function sample(m, cluster) {
  const point = {
    t: performance.now(),
    grants: sumOf(m, "ticketing_grants_total"),
    releases: m.get("ticketing_releases_total"),
    // A cluster node counts every applied expiry; single mode, by hand-over.
    expiries: cluster ? m.get("ticketing_lease_expiries_applied_total") : sumOf(m, "ticketing_lease_expiries_total"),
  };
  const last = samples[samples.length - 1];
  // A counter that went back is a restarted server: start over.
  if (last && SERIES.some((s) => point[s.name] < last[s.name])) samples = [];
  samples.push(point);
  while (samples.length > 0 && samples[0].t < point.t - CHART_WINDOW_MS) samples.shift();
  drawChart();
}

// Rates between consecutive samples: [{t, grants, releases, expiries}].
function rates() {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const seconds = (b.t - a.t) / 1000;
    if (seconds <= 0) continue;
    const rate = { t: b.t };
    for (const s of SERIES) rate[s.name] = Math.max(0, (b[s.name] - a[s.name]) / seconds);
    out.push(rate);
  }
  return out;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const name in attrs) node.setAttribute(name, attrs[name]);
  return node;
}

function rateText(value) {
  return value >= 10 ? value.toFixed(0) : value.toFixed(value >= 1 ? 1 : 2);
}

function drawChart() {
  const chart = $("chart");
  const points = rates();
  const [width, height, left, bottom, top] = [600, 150, 2, 22, 4];
  const now = samples.length > 0 ? samples[samples.length - 1].t : performance.now();
  // The time axis spans the samples there are (at least a minute, at most
  // the window), so a page just opened does not squeeze them to the edge.
  const span = Math.min(CHART_WINDOW_MS, Math.max(CHART_SPAN_MIN_MS, samples.length > 0 ? now - samples[0].t : 0));
  let peak = 0;
  for (const p of points) for (const s of SERIES) peak = Math.max(peak, p[s.name]);
  const scale = peak > 0 ? peak : 1;
  const x = (t) => left + (width - left) * (1 - (now - t) / span);
  const y = (v) => height - bottom - (height - bottom - top) * (v / scale);
  const parts = [
    svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }),
    svg("line", { x1: left, y1: top, x2: left, y2: height - bottom, class: "axis" }),
  ];
  // The scale's labels sit inside the plot, so no width clips them.
  const yLabel = svg("text", { x: left + 4, y: top + 12 });
  yLabel.textContent = rateText(scale) + "/s";
  const zero = svg("text", { x: left + 4, y: height - bottom - 4 });
  zero.textContent = "0/s";
  const since = svg("text", { x: left, y: height - 4 });
  since.textContent = duration(span) + " ago";
  const nowLabel = svg("text", { x: width, y: height - 4, "text-anchor": "end" });
  nowLabel.textContent = "now";
  parts.push(yLabel, zero, since, nowLabel);
  for (const s of SERIES) {
    const line = svg("polyline", {
      class: "series-" + s.name,
      "data-series": s.name,
      "data-max": String(points.reduce((max, p) => Math.max(max, p[s.name]), 0)),
      points: points.map((p) => x(p.t).toFixed(1) + "," + y(p[s.name]).toFixed(1)).join(" "),
    });
    parts.push(line);
  }
  chart.replaceChildren(...parts);
  chart.setAttribute("data-points", String(points.length));
  const latest = points[points.length - 1];
  $("chart-summary").textContent = latest
    ? "Latest: " + SERIES.map((s) => s.label + " " + rateText(latest[s.name])).join(", ") +
      "; peak over the last " + duration(now - samples[0].t) + ": " + rateText(peak) + "/s."
    : "Drawn from this node's counters at each refresh while the page is open (up to the last 5 minutes); the first rates show after two refreshes.";
}

// ---- recent events (/v1/events) ---------------------------------------------


function keysText(event) {
  return event.keys.map((k) => keyText(k, event.keys_encoding)).join(", ");
}

function eventText(event) {
  switch (event.kind) {
    case "leader_changed":
      return ["Leader change", event.leader_slot === null ? "no leader known (term " + event.term + ")"
        : "slot " + event.leader_slot + " leads (term " + event.term + ")"];
    // Tokens are null without the admin token: the sentence then says so.
    case "force_released":
      return ["Force-release", keysText(event) + ": " +
        (event.revoked === null ? "the grant was revoked (tokens hidden)" : "token " + event.revoked + " revoked") +
        (event.handed_to === null ? "" : "; handed to the front waiter under token " + event.handed_to)];
    case "expired_with_waiters":
      return ["Lease ran out with a waiter", keysText(event) + ": the lease" +
        (event.expired === null ? "" : " of token " + event.expired) + " ran out; the front waiter got the key" +
        (event.handed_to === null ? "" : " under token " + event.handed_to)];
    case "refused":
      return ["Refused connections", event.count + " × " + event.description +
        (event.span_ms > 0 ? " over " + duration(event.span_ms) : "")];
    default:
      return [event.kind, ""];
  }
}

async function pollEvents() {
  const answer = await get("/v1/events", true);
  const body = $("events").tBodies[0];
  if (answer.status !== 200 || !answer.body) {
    if (answer.status === 403) forgetToken(true);
    $("events-summary").textContent = answer.status === 401
      ? "This listener shows events only with the admin token." : refusal(answer);
    body.replaceChildren();
    return;
  }
  const events = answer.body.events;
  body.replaceChildren(...events.map((event) => {
    const row = el("tr", null, { "data-kind": event.kind, "data-seq": String(event.seq) });
    const when = el("td");
    when.append(el("time", duration(event.age_ms) + " ago", { datetime: event.at, title: event.at }));
    const [what, details] = eventText(event);
    row.append(when, el("th", what, { scope: "row" }), el("td", details));
    return row;
  }));
  $("events-summary").textContent = events.length === 0 ? "Nothing yet since this node started."
    : events.length + (events.length === 1 ? " event" : " events") + " (the latest " + answer.body.events_max + " are kept)" +
      (answer.body.redacted ? "; tokens hidden without the admin token." : ".");
}

// ---- answers of the lock API that are not locks -------------------------

// A sentence for an answer that is not a 200 (or null when it is).
function refusal(answer) {
  if (answer.status === 200) return null;
  if (answer.redirected) return "This node is not the leader: open the leader's admin page (ticketing status shows which node leads).";
  const code = answer.body && answer.body.error;
  if (answer.status === 401) return "This listener shows locks only with the admin token.";
  if (answer.status === 403) return "The admin token was refused (not one of this server's admin tokens).";
  if (answer.status === 503 && code === "busy") return "The server is busy with other readers; retrying.";
  if (code === "no_leader") return "No leader is known (an election, or this node is cut off); retrying.";
  if (code === "not_leader") return "This node is not the leader, and the leader's admin address is not configured.";
  return "The API answered " + answer.status + (code ? " " + code : "") + ".";
}

function showTokenState(rejected) {
  const state = $("auth-state");
  $("auth-forget").hidden = !token;
  if (rejected) {
    state.textContent = "The admin token was refused; it was forgotten.";
    state.className = "bad";
  } else if (token) {
    state.textContent = "Using an admin token (kept in this tab only): tokens and addresses are shown, force-release is on.";
    state.className = "good";
  } else {
    state.textContent = "No admin token: fencing tokens and client addresses are hidden, and nothing can be released.";
    state.className = "";
  }
}

function forgetToken(rejected) {
  token = null;
  try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* storage off: memory only */ }
  showTokenState(rejected);
}

// ---- the list ---------------------------------------------------------

async function pollList() {
  const locks = [];
  let cursor = null, pages = 0, truncated = false, redacted = true;
  do {
    let path = "/v1/locks?limit=" + PAGE_LIMIT;
    if (prefix) path += "&prefix=" + encodeURIComponent(prefix);
    if (cursor) path += "&cursor=" + encodeURIComponent(cursor);
    const answer = await get(path, true);
    const problem = refusal(answer);
    if (problem) {
      if (answer.status === 403) forgetToken(true);
      $("locks-summary").textContent = problem;
      $("locks").tBodies[0].replaceChildren();
      return;
    }
    locks.push(...answer.body.locks);
    redacted = answer.body.redacted;
    cursor = answer.body.next_cursor;
    pages += 1;
    truncated = cursor !== null && pages >= PAGES_MAX;
  } while (cursor !== null && pages < PAGES_MAX);
  // Busiest first; then by key, so that rows stay put between polls.
  locks.sort((a, b) => (b.waiters_total - a.waiters_total) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  fetchedAt = performance.now();
  const body = $("locks").tBodies[0];
  const rows = locks.map((lock) => {
    const row = el("tr");
    const keyCell = el("th", null, { scope: "row" });
    // A key that is not UTF-8 (none is today) has no view: its hex text
    // is not its name in a path.
    if (lock.key_encoding === "utf8") {
      keyCell.append(el("a", lock.key, { href: "#key=" + encodeURIComponent(lock.key) }));
    } else {
      keyCell.textContent = keyText(lock.key, lock.key_encoding);
    }
    row.append(keyCell);
    const h = lock.holder;
    row.append(el("td", h ? connText(h.conn) : "nobody (waiters only)"));
    row.append(el("td", h ? (h.token === null ? "hidden" : h.token) : "—"));
    const held = el("td"); if (h) held.append(live(h.held_ms, "up")); else held.textContent = "—";
    const left = el("td"); if (h) left.append(live(h.lease_remaining_ms, "down")); else left.textContent = "—";
    row.append(held, left, el("td", lock.waiters_total, { class: "num" }));
    row.setAttribute("data-key", lock.key);
    return row;
  });
  body.replaceChildren(...rows);
  let summary = locks.length + (locks.length === 1 ? " key" : " keys") + (prefix ? " starting with “" + prefix + "”" : "");
  if (truncated) summary += " (more not shown: narrow the prefix)";
  if (redacted) summary += "; tokens hidden without the admin token";
  $("locks-summary").textContent = summary + ".";
}

// ---- one key -------------------------------------------------------------

function selectedKey() {
  const hash = location.hash;
  if (!hash.startsWith("#key=")) return null;
  try { return decodeURIComponent(hash.slice(5)); } catch (_) { return null; }
}

async function pollKey(key) {
  const answer = await get("/v1/locks/" + encodeURIComponent(key), true);
  $("key-name").textContent = key;
  const problem = $("key-problem");
  const holder = $("holder");
  const waiters = $("waiters").tBodies[0];
  fetchedAt = performance.now();
  if (answer.status === 404 && answer.body && answer.body.error === "not_found") {
    shownLock = null;
    problem.hidden = false;
    problem.textContent = "Free: nobody holds or waits for this key.";
    holder.replaceChildren();
    waiters.replaceChildren();
    $("waiters-summary").textContent = "";
    showRelease();
    return;
  }
  const refused = refusal(answer);
  if (refused) {
    if (answer.status === 403) forgetToken(true);
    problem.hidden = false;
    problem.textContent = refused;
    return;
  }
  problem.hidden = true;
  const lock = answer.body;
  shownLock = lock;
  holder.replaceChildren();
  const h = lock.holder;
  if (h) {
    fact(holder, "Holder", connText(h.conn));
    fact(holder, "Token", h.token === null ? "hidden (admin token needed)" : String(h.token));
    fact(holder, "Held for", live(h.held_ms, "up"));
    fact(holder, "Lease left", live(h.lease_remaining_ms, "down"));
    fact(holder, "Granted at", h.granted_at);
    fact(holder, "Renewals", h.extensions);
    fact(holder, "Hold cap left", h.hold_remaining_ms === null ? "no cap" : live(h.hold_remaining_ms, "down"));
    if (h.keys.length > 1) fact(holder, "Keys of the grant", h.keys.map((k) => keyText(k, h.keys_encoding)).join(", "));
  } else {
    fact(holder, "Holder", "nobody (waiters only)");
  }
  waiters.replaceChildren(...lock.waiters.map((w) => {
    const row = el("tr", null, { "data-position": String(w.position), "data-conn": w.conn ? String(w.conn.id) : "" });
    row.append(el("th", w.position, { scope: "row", class: "num" }));
    row.append(el("td", connText(w.conn)));
    const waited = el("td"); waited.append(live(w.waited_ms, "up"));
    const left = el("td"); left.append(live(w.wait_remaining_ms, "down"));
    row.append(waited, left, el("td", w.keys.map((k) => keyText(k, w.keys_encoding)).join(", ")));
    return row;
  }));
  $("waiters-summary").textContent = lock.waiters_total > lock.waiters.length
    ? "Showing the first " + lock.waiters.length + " of " + lock.waiters_total + " waiters."
    : lock.waiters_total + (lock.waiters_total === 1 ? " waiter." : " waiters.");
  showRelease();
}

// ---- force-release ---------------------------------------------------------

function showRelease() {
  const canRelease = Boolean(token && shownLock && shownLock.holder && shownLock.holder.token !== null);
  $("release-start").hidden = !canRelease || !$("release-confirm").hidden;
  $("release-needs-token").hidden = Boolean(token) || !(shownLock && shownLock.holder);
  if (!canRelease) $("release-confirm").hidden = true;
}

function askRelease() {
  if (!shownLock || !shownLock.holder) return;
  const h = shownLock.holder;
  // The question names the grant looked at; the release carries its token
  // (?token=T), so a grant made since is never released by mistake.
  $("release-confirm").setAttribute("data-token", String(h.token));
  $("release-question").textContent = "Force-release “" + shownLock.key + "” from " + connText(h.conn) +
    " (token " + h.token + ")? The holder loses the lock at once and the front waiter, if any, gets it.";
  $("release-confirm").hidden = false;
  $("release-start").hidden = true;
  $("release-yes").focus();
}

function cancelRelease() {
  $("release-confirm").hidden = true;
  showRelease();
  $("release-start").focus();
}

async function confirmRelease() {
  const confirm = $("release-confirm");
  const grant = confirm.getAttribute("data-token");
  confirm.hidden = true;
  const result = $("release-result");
  result.className = "";
  result.textContent = "Releasing…";
  const key = shownLock.key;
  let response;
  try {
    response = await fetch("/v1/locks/" + encodeURIComponent(key) + "/release?token=" + encodeURIComponent(grant),
      { method: "POST", headers: headers(), redirect: "manual", cache: "no-store" });
  } catch (error) {
    result.className = "bad";
    result.textContent = "No answer from the admin listener (" + error.message + "): the release may or may not have happened; look at the key before trying again.";
    result.focus();
    await pollNow();
    return;
  }
  let body = null;
  if (response.type !== "opaqueredirect") { try { body = JSON.parse(await response.text()); } catch (_) { body = null; } }
  if (response.status === 200 && body) {
    result.className = "good";
    result.textContent = "Released: token " + body.revoked + " revoked on " +
      body.keys.map((k) => keyText(k, body.keys_encoding)).join(", ") + "; " +
      (body.handed_to === null ? "the key is free." : "handed to the front waiter under token " + body.handed_to + ".");
    result.setAttribute("data-revoked", String(body.revoked));
    result.setAttribute("data-handed-to", String(body.handed_to));
  } else {
    result.className = "bad";
    const code = body && body.error;
    result.textContent = code === "token_mismatch" ? "Not released: the key is now held by another grant; nothing changed."
      : code === "not_held" ? "Not released: nobody holds the key now."
      : code === "indeterminate" ? "Outcome unknown (leadership changed, or no answer in time): look at the key before trying again."
      : "Not released: " + (refusal({ status: response.status || 307, body: body, redirected: response.type === "opaqueredirect" }) || "unknown answer");
    if (response.status === 403) forgetToken(true);
  }
  // The confirmation is gone: the focus goes to the outcome.
  result.focus();
  await pollNow();
}

// ---- the loop ---------------------------------------------------------------

function route() {
  const key = selectedKey();
  $("list-view").hidden = key !== null;
  $("key-view").hidden = key === null;
  if (key === null) { shownLock = null; $("release-result").textContent = ""; }
  return key;
}

async function poll() {
  if (polling) return;
  polling = true;
  clearTimeout(pollTimer);
  try {
    await pollOverview();
    const key = route();
    if (key === null) await pollList(); else await pollKey(key);
    await pollEvents();
    $("updated").textContent = "Updated " + new Date().toLocaleTimeString() + "; refreshes every " + POLL_MS / 1000 + " s.";
  } catch (error) {
    $("updated").textContent = "Cannot reach the admin listener (" + error.message + "); retrying.";
  } finally {
    polling = false;
    if (again) { again = false; pollTimer = setTimeout(poll, 0); }
    else if (!document.hidden) pollTimer = setTimeout(poll, POLL_MS);
  }
}

async function pollNow() {
  // A poll under way ends and starts the next at once; otherwise start one.
  if (polling) again = true; else await poll();
}

document.addEventListener("DOMContentLoaded", () => {
  showTokenState(false);
  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("auth-token");
    const value = input.value.trim();
    input.value = "";
    if (!value) return;
    token = value;
    try { sessionStorage.setItem(TOKEN_KEY, value); } catch (_) { /* storage off: memory only */ }
    showTokenState(false);
    pollNow();
  });
  $("auth-forget").addEventListener("click", () => { forgetToken(false); pollNow(); });
  $("search").addEventListener("submit", (event) => {
    event.preventDefault();
    prefix = $("prefix").value;
    pollNow();
  });
  $("back").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; });
  $("release-start").addEventListener("click", askRelease);
  $("release-no").addEventListener("click", cancelRelease);
  $("release-yes").addEventListener("click", confirmRelease);
  // Escape backs out of the confirmation, as from a dialog.
  $("release-confirm").addEventListener("keydown", (event) => { if (event.key === "Escape") cancelRelease(); });
  window.addEventListener("hashchange", () => { $("release-confirm").hidden = true; pollNow(); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) pollNow(); });
  setInterval(tick, TICK_MS);
  poll();
});
