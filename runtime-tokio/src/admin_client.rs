//! A minimal client of the admin listener, for the `ticketing locks` and
//! `ticketing status` commands: one HTTP/1.1 request per connection over
//! hyper, with a bearer token when given.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::net::TcpStream;

/// How long one admin request may take, connecting included.
pub const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest answer body read (a full listing is well under it).
pub const ANSWER_BYTES_MAX: usize = 16 << 20;

/// What is left as is in a key or query value: RFC 3986 unreserved.
const KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` percent-encoded for a path segment or query value (`/` too).
pub fn encode_component(text: &str) -> String {
    utf8_percent_encode(text, KEEP).to_string()
}

/// An answer: status code and body text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminAnswer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// Why no answer came.
#[derive(Debug)]
pub enum AdminClientError {
    /// The TCP connection failed (refused, unreachable).
    Connect(std::io::Error),
    /// The request or its answer took longer than [`ADMIN_REQUEST_TIMEOUT`].
    Timeout,
    /// The HTTP exchange failed, or the answer was too large or not text.
    Http(String),
}

impl std::fmt::Display for AdminClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminClientError::Connect(e) => write!(f, "cannot connect: {e}"),
            AdminClientError::Timeout => write!(f, "no answer within {ADMIN_REQUEST_TIMEOUT:?}"),
            AdminClientError::Http(e) => write!(f, "HTTP error: {e}"),
        }
    }
}

impl std::error::Error for AdminClientError {}

/// Sends `method path_and_query` to `addr` (with `Authorization: Bearer
/// token` when given) and reads the answer.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<AdminAnswer, AdminClientError> {
    tokio::time::timeout(
        ADMIN_REQUEST_TIMEOUT,
        exchange(addr, method, path_and_query, token),
    )
    .await
    .unwrap_or(Err(AdminClientError::Timeout))
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<AdminAnswer, AdminClientError> {
    let http = |e: &dyn std::fmt::Display| AdminClientError::Http(e.to_string());
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(AdminClientError::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| http(&e))?;
    let driver = tokio::spawn(connection);
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(hyper::header::HOST, addr.to_string());
    if let Some(token) = token {
        builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder.body(Empty::<Bytes>::new()).map_err(|e| http(&e))?;
    let response = sender.send_request(request).await.map_err(|e| http(&e))?;
    let status = response.status().as_u16();
    let limited = http_body_util::Limited::new(response.into_body(), ANSWER_BYTES_MAX);
    let body = limited.collect().await.map_err(|e| http(&*e))?.to_bytes();
    driver.abort();
    let body = String::from_utf8(body.to_vec()).map_err(|e| http(&e))?;
    Ok(AdminAnswer { status, body })
}
