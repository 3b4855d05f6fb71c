//! Helpers shared by the fuzz targets: a server's shared state without threads or
//! listeners, and a strict reader of the HTTP responses the router writes.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use mio::{Poll, Waker};
use throng::broker::MemoryBroker;
use throng::config::ServeConfig;
use throng::history::Limits;
use throng::hub::Hub;
use throng::protocol::http::reason_phrase;
use throng::server::event_loop::WAKER;
use throng::server::shared::Shared;

pub const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
pub const REMOTE: [u8; 4] = [192, 0, 2, 7];
/// The API key of a server built with `api_key`.
pub const API_KEY: &str = "k3y";
/// The `--token-secret` of a server built with `tokens` (HS256 JWTs).
pub const TOKEN_SECRET: &str = "fuzz-secret";
/// The one `--allowed-origin` of a server built with `origins`.
pub const ALLOWED_ORIGIN: &str = "https://ok.example";

/// How the server under test is configured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub api_key: bool,
    pub draining: bool,
    pub tokens: bool,
    pub origins: bool,
}

/// One hub for every run, over two mio Polls kept for the life of the process
/// (routing never subscribes, so nothing is ever delivered to it).
fn hub() -> Arc<Hub> {
    static HUB: OnceLock<(Vec<Poll>, Arc<Hub>)> = OnceLock::new();
    let (_polls, hub) = HUB.get_or_init(|| {
        let polls: Vec<Poll> = (0..2).map(|_| Poll::new().expect("mio poll")).collect();
        let wakers = polls
            .iter()
            .map(|p| Arc::new(Waker::new(p.registry(), WAKER).expect("mio waker")))
            .collect();
        let hub = Arc::new(Hub::new(wakers));
        (polls, hub)
    });
    Arc::clone(hub)
}

fn config_template() -> &'static ServeConfig {
    static CONFIG: OnceLock<ServeConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let mut config = ServeConfig::default();
        config.threads = 2;
        config
    })
}

/// The ticket routes are given: never asked for here, since the memory broker
/// answers a publish at once.
pub const TICKET: throng::broker::asked::Ticket = throng::broker::asked::Ticket {
    loop_index: 0,
    key: 0,
    serial: 0,
    asker: throng::broker::asked::Asker::Request,
};

/// A fresh server state (an empty memory broker), so every run starts alike.
pub fn fresh_shared(options: Options) -> Shared {
    let mut config = config_template().clone();
    config.api_key = options.api_key.then(|| API_KEY.to_string());
    config.token_secret = options.tokens.then(|| TOKEN_SECRET.to_string());
    if options.origins {
        config.allowed_origins = vec![ALLOWED_ORIGIN.to_string()];
    }
    let history = Limits {
        size: 100,
        ttl: std::time::Duration::from_secs(300),
    };
    let hub = hub();
    let broker = Arc::new(MemoryBroker::new(
        Arc::clone(&hub),
        history,
        config.namespaces.clone(),
    ));
    let shared = Shared::new(config, hub, broker);
    shared.shutdown.store(options.draining, Ordering::Relaxed);
    shared
}

pub fn peer(remote: bool) -> IpAddr {
    if remote {
        REMOTE.into()
    } else {
        LOOPBACK.into()
    }
}

/// One response as written by `protocol::http`.
#[derive(Debug)]
pub struct Response<'a> {
    pub status: u16,
    pub headers: Vec<(&'a str, &'a str)>,
    pub body: &'a [u8],
}

impl Response<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    pub fn keep_alive(&self) -> bool {
        match self.header("connection") {
            Some("keep-alive") => true,
            Some("close") => false,
            other => panic!("Connection header is {other:?}"),
        }
    }

    /// Every refusal is `{"error": reason, "status": status}` in JSON.
    pub fn assert_json_error(&self) {
        assert_ne!(self.status, 200);
        assert_eq!(self.header("content-type"), Some("application/json"));
        let value: serde_json::Value =
            serde_json::from_slice(self.body).expect("error body is JSON");
        assert_eq!(value["status"].as_u64(), Some(u64::from(self.status)));
        let reason = value["error"].as_str().expect("error reason is a string");
        assert!(!reason.is_empty());
        assert!(!self.keep_alive(), "errors close the connection");
    }
}

/// Reads one response at the start of `out`; returns it and its length. Panics
/// unless it is a well-formed `HTTP/1.1` response with a known status, a
/// Content-Type, a Content-Length that matches and a Connection header.
pub fn read_response(out: &[u8]) -> (Response<'_>, usize) {
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head ends with CRLF CRLF");
    let head = std::str::from_utf8(&out[..head_end]).expect("response head is UTF-8");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let rest = status_line
        .strip_prefix("HTTP/1.1 ")
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let (code, reason) = rest.split_once(' ').expect("status line has a reason");
    assert_eq!(code.len(), 3, "{status_line:?}");
    let status: u16 = code.parse().expect("numeric status");
    assert_ne!(reason_phrase(status), "Unknown", "status {status} unknown");
    assert_eq!(reason, reason_phrase(status));
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("bad header line {line:?}"));
        assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()));
        assert!(!value.contains('\r') && !value.contains('\n'));
        headers.push((name, value));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .expect("Content-Length")
        .1
        .parse()
        .expect("numeric Content-Length");
    let body_start = head_end + 4;
    assert!(
        out.len() >= body_start + length,
        "body shorter than Content-Length"
    );
    let response = Response {
        status,
        headers,
        body: &out[body_start..body_start + length],
    };
    assert!(response.header("content-type").is_some());
    response.keep_alive();
    (response, body_start + length)
}

/// Reads every response in `out`, back to back, and nothing else.
pub fn read_responses(mut out: &[u8]) -> Vec<Response<'_>> {
    let mut all = Vec::new();
    while !out.is_empty() {
        let (response, len) = read_response(out);
        all.push(response);
        out = &out[len..];
    }
    all
}

/// Reads exactly one response.
pub fn single_response(out: &[u8]) -> Response<'_> {
    let (response, len) = read_response(out);
    assert_eq!(len, out.len(), "bytes after the response");
    response
}
