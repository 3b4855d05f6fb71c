//! A small blocking HTTP/1.1 client for throng's own API (`throng pub`, and the
//! load generator's publisher): one request per connection ([`request`]), or a
//! kept-alive connection reused for many requests ([`Session`]).
//!
//! It owns URL parsing for `http://host:port` and reading one response. It must not
//! grow into a general HTTP client: no TLS, redirects, chunked bodies or cookies.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("'{0}' is not an http://host:port URL")]
    BadUrl(String),
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("request to {addr} failed")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("malformed response from {addr}: {reason}")]
    BadResponse { addr: String, reason: String },
}

/// `http://host:port[/prefix]`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
}

impl HttpUrl {
    pub fn parse(url: &str) -> Result<Self, ClientError> {
        let bad = || ClientError::BadUrl(url.to_string());
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("ws://"))
            .ok_or_else(bad)?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| bad())?)
            }
            _ => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(HttpUrl {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            prefix: prefix.to_string(),
        })
    }

    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A kept-alive connection for many requests to one server. It reconnects when
/// the server closed the connection (after an error answer, say). Responses must
/// carry Content-Length (throng's always do).
#[derive(Debug)]
pub struct Session {
    url: HttpUrl,
    timeout: Duration,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// TCP connections opened so far (1 when keep-alive works).
    pub connects: u64,
}

impl Session {
    pub fn new(url: HttpUrl, timeout: Duration) -> Self {
        Session {
            url,
            timeout,
            stream: None,
            buf: Vec::new(),
            connects: 0,
        }
    }

    /// Sends one request; retries once on a fresh connection if a reused one turned
    /// out to be closed before any answer came.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ClientError> {
        let reused = self.stream.is_some();
        match self.try_request(method, path, headers, body) {
            Err(ClientError::Io { .. }) if reused => {
                self.stream = None;
                self.try_request(method, path, headers, body)
            }
            other => other,
        }
    }

    fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ClientError> {
        let addr = self.url.authority();
        if self.stream.is_none() {
            self.stream = Some(connect(&self.url, self.timeout)?);
            self.connects += 1;
        }
        let io = |source| ClientError::Io {
            addr: addr.clone(),
            source,
        };
        let message = encode_request(&self.url, method, path, headers, body, true);
        let Some(stream) = self.stream.as_mut() else {
            return Err(ClientError::BadUrl(addr));
        };
        if let Err(e) = stream.write_all(&message) {
            self.stream = None;
            return Err(io(e));
        }
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((response, keep)) = complete_response(&self.buf, Reading::KeepAliveSaid)
                .map_err(|reason| ClientError::BadResponse {
                    addr: addr.clone(),
                    reason,
                })?
            {
                if !keep {
                    self.stream = None;
                }
                return Ok(response);
            }
            match stream.read(&mut chunk) {
                Ok(0) => {
                    self.stream = None;
                    return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => {
                    self.stream = None;
                    return Err(io(e));
                }
            }
        }
    }
}

fn connect(url: &HttpUrl, timeout: Duration) -> Result<TcpStream, ClientError> {
    let addr = url.authority();
    let target = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|source| ClientError::Connect {
            addr: addr.clone(),
            source,
        })?
        .next()
        .ok_or_else(|| ClientError::BadUrl(addr.clone()))?;
    let stream =
        TcpStream::connect_timeout(&target, timeout).map_err(|source| ClientError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let io = |source| ClientError::Io {
        addr: addr.clone(),
        source,
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    Ok(stream)
}

/// A request's bytes: `url`'s prefix before `path`, and `Connection: close`
/// unless `keep_alive` (the HTTPS publisher's too).
pub fn encode_request(
    url: &HttpUrl,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut head = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nConnection: {connection}\r\nContent-Length: {}\r\n",
        url.prefix,
        url.authority(),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut message = head.into_bytes();
    message.extend_from_slice(body);
    message
}

/// How the end of a response, and whether its connection stays open, are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// This client's own requests: the server keeps the connection only when it
    /// says `Connection: keep-alive`, and every response must have a length.
    KeepAliveSaid,
    /// Any HTTP/1.1 server: kept unless it says `Connection: close` or sends no
    /// length; a body without a length ends where the connection does (`eof`:
    /// the server has closed).
    Http11 { eof: bool },
}

/// A whole response at the start of `raw`, if it has fully arrived, and whether the
/// server keeps the connection open after it, read as `reading` says.
pub(crate) fn complete_response(
    raw: &[u8],
    reading: Reading,
) -> Result<Option<(Response, bool)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let status = resp.code.ok_or("no status code")?;
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let length = match header("content-length") {
        Some(v) => Some(
            std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or("bad Content-Length")?,
        ),
        None => None,
    };
    let (body, keep) = match (reading, length) {
        (_, Some(length)) => {
            let Some(body) = raw.get(head_len..head_len.saturating_add(length)) else {
                return Ok(None);
            };
            let keep = match reading {
                Reading::KeepAliveSaid => {
                    header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"keep-alive"))
                }
                Reading::Http11 { .. } => {
                    resp.version == Some(1)
                        && !header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"))
                }
            };
            (body, keep)
        }
        (Reading::KeepAliveSaid, None) => {
            return Err("a kept-alive response needs Content-Length".into());
        }
        // No length: the body ends where the connection does.
        (Reading::Http11 { eof: true }, None) => (&raw[head_len..], false),
        (Reading::Http11 { eof: false }, None) => return Ok(None),
    };
    Ok(Some((
        Response {
            status,
            body: body.to_vec(),
        },
        keep,
    )))
}

/// Sends one request on a connection of its own and reads the whole response.
pub fn request(
    url: &HttpUrl,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, ClientError> {
    Session::new(url.clone(), timeout).request(method, path, headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = HttpUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("127.0.0.1", 8080, "")
        );
        let u = HttpUrl::parse("http://example:9/base/").unwrap();
        assert_eq!((u.port, u.prefix.as_str()), (9, "/base"));
        let u = HttpUrl::parse("http://[::1]:7").unwrap();
        assert_eq!(
            (u.host.as_str(), u.authority()),
            ("::1", "[::1]:7".to_string())
        );
        assert!(HttpUrl::parse("ftp://x").is_err());
        assert!(HttpUrl::parse("http://:80").is_err());
        assert!(HttpUrl::parse("http://x:port").is_err());
    }

    #[test]
    fn kept_alive_responses_end_at_content_length() {
        let two =
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nokHTTP/1.1";
        let (r, keep) = complete_response(two, Reading::KeepAliveSaid)
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice(), keep), (200, &b"ok"[..], true));
        assert!(
            complete_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok",
                Reading::KeepAliveSaid
            )
            .unwrap()
            .is_none()
        );
        let closing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        assert!(
            !complete_response(closing, Reading::KeepAliveSaid)
                .unwrap()
                .unwrap()
                .1
        );
    }

    #[test]
    fn malformed_responses_are_errors() {
        assert!(complete_response(b"garbage\r\n\r\n", Reading::KeepAliveSaid).is_err());
        assert!(
            complete_response(b"HTTP/1.1 200 OK\r\n\r\nno length", Reading::KeepAliveSaid).is_err()
        );
    }
}
