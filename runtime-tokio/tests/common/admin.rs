//! The admin listener from outside: plain HTTP/1.1 requests on a socket
//! (so that a test controls every header, `Host` included) and a
//! single-mode `ticketing serve` with the admin listener on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ports::free_port;
use super::scratch::{Scratch, scratch_dir};

const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

/// `GET path` over HTTP/1.1: (status code, content type, body).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String, String)> {
    http_request(addr, "GET", path, None)
}

/// `method path` over HTTP/1.1, with `Authorization: <authorization>` when
/// given: (status code, content type, body).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Option<(u16, String, String)> {
    http_request_as(&addr.to_string(), addr, method, path, authorization)
}

/// [`http_request`] naming `host` in the `Host` header.
pub fn http_request_as(
    host: &str,
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Option<(u16, String, String)> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = authorization.map_or(String::new(), |value| format!("Authorization: {value}\r\n"));
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    tcp.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, content_type, body))
}

/// A chunked body, joined.
pub fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

/// A single-mode `ticketing serve` with the admin listener, killed when
/// dropped.
pub struct Single {
    pub child: Child,
    pub client: SocketAddr,
    pub admin: SocketAddr,
    _state: Scratch,
}

impl Single {
    pub fn start() -> Single {
        Single::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Single {
        Single::spawn(Command::new(BIN), extra)
    }

    /// Run under `prlimit` with at most `nofile` file descriptors.
    pub fn start_limited(nofile: u32) -> Single {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg("--")
            .arg(BIN);
        Single::spawn(command, &[])
    }

    fn spawn(mut command: Command, extra: &[&str]) -> Single {
        let (client, admin) = (free_port(), free_port());
        let state = scratch_dir("admin-single");
        let child = command
            .args(["serve", "--listen", &client.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(extra)
            .args(["--state-dir", &state.arg(), "--log-level", "warn"])
            .env_remove("TICKETING_CLIENT_TOKENS")
            .env_remove("TICKETING_ADMIN_TOKENS")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ticketing serve (under prlimit: util-linux's)");
        Single {
            child,
            client,
            admin,
            _state: state,
        }
    }

    /// The server's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server runs");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
