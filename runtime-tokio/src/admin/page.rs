//! The status page: `GET /` (HTML), `/page.css` and `/page.js`, compiled
//! into the binary from the files under `admin/page/`.
//!
//! The page holds no data of its own: its script reads `/metrics`,
//! `/readyz` and the lock API with the visitor's credentials (the admin
//! token only if one was entered), so it shows exactly what the access
//! rule lets that visitor read. Serving it is open, like `/livez`, and
//! behind the same `Host` check as every route. Its headers keep it from
//! loading anything from elsewhere or being framed by another site (a
//! frame could trick a clicking operator into a force-release).

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("page/index.html");
const PAGE_CSS: &str = include_str!("page/page.css");
const PAGE_JS: &str = include_str!("page/page.js");

/// Only this listener's own files and API; no inline script, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
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

pub(crate) async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
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
        for (response, content_type) in [
            (index().await, "text/html; charset=utf-8"),
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
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(!PAGE_CSS.contains("url(") && !PAGE_CSS.contains("@import"));
        // Text from the server is only ever set as text, never as markup;
        // the one absolute URL is the link to a cluster leader's page.
        assert!(!PAGE_JS.contains("innerHTML") && !PAGE_JS.contains("https://"));
        assert_eq!(PAGE_JS.matches("http://").count(), 1);
    }
}
