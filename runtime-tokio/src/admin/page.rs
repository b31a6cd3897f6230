//! The status page: `GET /` (HTML), `/page.css` and `/page.js`, compiled
//! into the binary from the files under `admin/page/`.
//!
//! The page holds no data of its own: its script reads `/metrics`,
//! `/readyz`, `/v1/node`, `/v1/events` and the lock API with the
//! visitor's credentials (the admin token only if one was entered), so it
//! shows exactly what the access rule lets that visitor read. Without
//! JavaScript it shows what `/metrics` and `/readyz` would (open to
//! everyone, like them), rendered into its `<noscript>` part, and reloads
//! itself. Serving it is open, like `/livez`, and
//! behind the same `Host` check as every route. Its headers keep it from
//! loading anything from elsewhere or being framed by another site (a
//! frame could trick a clicking operator into a force-release).

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::{AppState, NodeMetrics};

const INDEX_HTML: &str = include_str!("page/index.html");
const PAGE_CSS: &str = include_str!("page/page.css");
const PAGE_JS: &str = include_str!("page/page.js");

/// Only this listener's own files and API; no inline script, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    page(body.to_owned(), content_type)
}

fn page(body: String, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary may serve a new page: never keep an old one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Where the summary for a browser without JavaScript goes.
const SUMMARY_PLACE: &str = "<!-- SUMMARY -->";

/// The page, with this node's summary (what `/metrics` and `/readyz` say,
/// open like them) rendered into its `<noscript>` part: without
/// JavaScript the page still shows it, and reloads itself.
pub(crate) async fn index(State(app): State<AppState>) -> Response {
    // One snapshot, as a scrape of /metrics takes.
    let metrics = app.node.metrics();
    page(render_index(&metrics), "text/html; charset=utf-8")
}

/// The page's HTML with the summary of `metrics` in place.
fn render_index(metrics: &NodeMetrics) -> String {
    let mut facts = Vec::new();
    let readiness = match metrics.readiness() {
        Ok(()) => "ready".to_owned(),
        Err(reason) => format!("not ready: {reason}"),
    };
    match metrics {
        NodeMetrics::Single(m) => {
            facts.push(("Mode", "single".to_owned()));
            facts.push(("Readiness", readiness));
            facts.push(("Held keys", m.held_keys.to_string()));
            facts.push(("Waiters", m.waiters.to_string()));
            let v3 = m.sessions.saturating_sub(m.line_sessions);
            facts.push((
                "Client connections",
                format!("{} (v3 {v3}, line {})", m.sessions, m.line_sessions),
            ));
        }
        NodeMetrics::Cluster(m) => {
            facts.push(("Mode", "cluster".to_owned()));
            facts.push(("Readiness", readiness));
            let role = if m.is_leader {
                "leader"
            } else if m.has_leader {
                "follower"
            } else {
                "no leader known"
            };
            let voter = if m.is_voter { "voter" } else { "not a voter" };
            facts.push(("Role", format!("{role}, {voter}")));
            facts.push(("This node", format!("slot {}", m.slot)));
            facts.push(("Term", m.term.to_string()));
            facts.push(("Commit index", m.commit_index.to_string()));
            facts.push(("Held keys", m.held_keys.to_string()));
            let v3 = m.sessions.saturating_sub(m.line_sessions);
            facts.push((
                "Client connections",
                format!("{} (v3 {v3}, line {})", m.sessions, m.line_sessions),
            ));
        }
    }
    let mut summary = String::new();
    for (name, value) in facts {
        summary.push_str(&format!(
            "<div data-summary=\"{name}\"><dt>{name}</dt><dd>{}</dd></div>",
            escape(&value)
        ));
    }
    INDEX_HTML.replacen(SUMMARY_PLACE, &summary, 1)
}

/// `text` safe as HTML element content.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) async fn css() -> Response {
    asset(PAGE_CSS, "text/css; charset=utf-8")
}

pub(crate) async fn js() -> Response {
    asset(PAGE_JS, "text/javascript; charset=utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_page_loads_only_its_own_files_and_cannot_be_framed() {
        let index = page(
            render_index(&NodeMetrics::Single(Default::default())),
            "text/html; charset=utf-8",
        );
        for (response, content_type) in [
            (index, "text/html; charset=utf-8"),
            (css().await, "text/css; charset=utf-8"),
            (js().await, "text/javascript; charset=utf-8"),
        ] {
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type);
            let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.starts_with("default-src 'none'; script-src 'self';"));
            assert!(csp.contains("frame-ancestors 'none'"));
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        // The HTML names only the two files served next to it, and no
        // inline script (the policy would block it).
        assert!(INDEX_HTML.contains(r#"<script src="/page.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"<link rel="stylesheet" href="/page.css">"#));
        assert_eq!(INDEX_HTML.matches("<script").count(), 1);
        // Without JavaScript: a refresh, and the summary in its place.
        assert!(
            INDEX_HTML.contains(r#"<noscript><meta http-equiv="refresh" content="10"></noscript>"#)
        );
        assert_eq!(INDEX_HTML.matches(SUMMARY_PLACE).count(), 1);
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(!PAGE_CSS.contains("url(") && !PAGE_CSS.contains("@import"));
        // Text from the server is only ever set as text, never as markup;
        // the absolute URLs are the link to another node's page and the
        // SVG namespace (a name, never fetched).
        assert!(!PAGE_JS.contains("innerHTML") && !PAGE_JS.contains("https://"));
        assert_eq!(PAGE_JS.matches("http://").count(), 2);
        assert_eq!(PAGE_JS.matches(r#""http://" + admin + "/""#).count(), 1);
        assert_eq!(
            PAGE_JS.matches(r#""http://www.w3.org/2000/svg""#).count(),
            1
        );
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use ticketing_core::metrics::{ClusterMetrics, ServerMetrics};

    #[test]
    fn the_summary_without_javascript_says_what_metrics_and_readyz_say() {
        let single = ServerMetrics {
            held_keys: 3,
            waiters: 2,
            sessions: 5,
            line_sessions: 1,
            ..ServerMetrics::default()
        };
        let html = render_index(&NodeMetrics::Single(single));
        assert!(!html.contains(SUMMARY_PLACE));
        for fact in [
            r#"<div data-summary="Mode"><dt>Mode</dt><dd>single</dd></div>"#,
            r#"<div data-summary="Readiness"><dt>Readiness</dt><dd>ready</dd></div>"#,
            r#"<div data-summary="Held keys"><dt>Held keys</dt><dd>3</dd></div>"#,
            r#"<div data-summary="Waiters"><dt>Waiters</dt><dd>2</dd></div>"#,
            r#"<dd>5 (v3 4, line 1)</dd>"#,
        ] {
            assert!(html.contains(fact), "{fact}");
        }
        let cluster = ClusterMetrics {
            slot: 2,
            has_leader: true,
            is_voter: true,
            term: 9,
            ..ClusterMetrics::default()
        };
        let html = render_index(&NodeMetrics::Cluster(cluster));
        assert!(html.contains(r#"<dd>follower, voter</dd>"#));
        assert!(html.contains(r#"<dd>slot 2</dd>"#));
        assert!(html.contains(r#"<div data-summary="Term"><dt>Term</dt><dd>9</dd></div>"#));
        let stopping = ClusterMetrics {
            shutting_down: true,
            ..ClusterMetrics::default()
        };
        let html = render_index(&NodeMetrics::Cluster(stopping));
        assert!(html.contains("<dd>not ready: shutting down</dd>"));
        assert_eq!(
            escape(r#"<a href="x">&"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;"
        );
    }
}
