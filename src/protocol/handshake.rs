//! The HTTP/1.1 side of the protocol: request parsing, the RFC 6455 opening
//! handshake, and response encoding, without I/O.
//!
//! It owns what makes a request a valid WebSocket upgrade (§4.2.1) and the exact
//! bytes of every response the server writes. It must not decide routes or limits:
//! the server module maps paths to behaviour and calls in here for the wire format.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha1::{Digest, Sha1};

/// The GUID every accept key is derived with (§1.3).
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Most headers a request may carry.
const MAX_HEADERS: usize = 64;
/// Largest request head the server buffers before answering 431.
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// A parsed request head; header values borrow from the read buffer.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The request target as sent: path plus optional `?query`.
    pub target: &'a str,
    /// HTTP minor version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub minor_version: u8,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

impl<'a> Request<'a> {
    pub fn path(&self) -> &'a str {
        self.target.split('?').next().unwrap_or("")
    }

    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// The first value of a header, matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Whether any value of a comma-separated header holds `token` (case-insensitive).
    pub fn header_has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .any(|(_, v)| {
                v.split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
            })
    }

    /// True when the client asks for a WebSocket at all (so defects get a 400 with
    /// the reason rather than a plain-HTTP answer).
    pub fn wants_upgrade(&self) -> bool {
        self.header("upgrade").is_some()
            || self.header("sec-websocket-key").is_some()
            || self.header("sec-websocket-version").is_some()
    }
}

/// Why a request head could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("malformed HTTP request: {0}")]
    Malformed(String),
    #[error("request head is larger than {MAX_REQUEST_HEAD} bytes")]
    TooLarge,
}

/// Parses a request head. `Ok(None)`: incomplete, read more. On success also
/// returns the head's length, so bytes after it (a pipelined frame) are kept.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, ParseError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let request = Request {
                method: req.method.unwrap_or(""),
                target: req.path.unwrap_or(""),
                minor_version: req.version.unwrap_or(1),
                headers: req.headers.iter().map(|h| (h.name, h.value)).collect(),
            };
            Ok(Some((request, len)))
        }
        Ok(httparse::Status::Partial) => {
            if buf.len() > MAX_REQUEST_HEAD {
                Err(ParseError::TooLarge)
            } else {
                Ok(None)
            }
        }
        Err(httparse::Error::TooManyHeaders) => Err(ParseError::TooLarge),
        Err(e) => Err(ParseError::Malformed(e.to_string())),
    }
}

/// A defect that makes a request not a valid WebSocket upgrade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("WebSocket upgrade needs HTTP/1.1")]
    NotHttp11,
    #[error("WebSocket upgrade needs method GET")]
    NotGet,
    #[error("missing Host header")]
    MissingHost,
    #[error("Upgrade header must be 'websocket'")]
    BadUpgrade,
    #[error("Connection header must contain the 'upgrade' token")]
    BadConnection,
    #[error("missing Sec-WebSocket-Version header")]
    MissingVersion,
    #[error("unsupported Sec-WebSocket-Version (only 13 is supported)")]
    UnsupportedVersion,
    #[error("missing Sec-WebSocket-Key header")]
    MissingKey,
    #[error("Sec-WebSocket-Key must be base64 of 16 bytes")]
    BadKey,
}

impl HandshakeError {
    /// The HTTP status to refuse with: 426 tells the client which version we speak
    /// (§4.2.2), 405 names the method, everything else is a 400.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::UnsupportedVersion => 426,
            HandshakeError::NotGet => 405,
            _ => 400,
        }
    }
}

/// Validates an upgrade request (§4.2.1) and returns the `Sec-WebSocket-Accept` value.
/// Extensions (permessage-deflate) and subprotocols are declined by not echoing them.
pub fn validate_upgrade(req: &Request<'_>) -> Result<[u8; 28], HandshakeError> {
    if req.minor_version < 1 {
        return Err(HandshakeError::NotHttp11);
    }
    if req.method != "GET" {
        return Err(HandshakeError::NotGet);
    }
    if req.header("host").is_none() {
        return Err(HandshakeError::MissingHost);
    }
    if !req.header_has_token("upgrade", "websocket") {
        return Err(HandshakeError::BadUpgrade);
    }
    if !req.header_has_token("connection", "upgrade") {
        return Err(HandshakeError::BadConnection);
    }
    match req.header("sec-websocket-version") {
        None => return Err(HandshakeError::MissingVersion),
        Some(v) if v.trim_ascii() != b"13" => return Err(HandshakeError::UnsupportedVersion),
        Some(_) => {}
    }
    let key = req
        .header("sec-websocket-key")
        .ok_or(HandshakeError::MissingKey)?
        .trim_ascii();
    match BASE64.decode(key) {
        Ok(raw) if raw.len() == 16 => {}
        _ => return Err(HandshakeError::BadKey),
    }
    Ok(accept_key(key))
}

/// `base64(sha1(key + GUID))` (§4.2.2).
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    let digest = sha.finalize();
    let mut out = [0u8; 28];
    // 20 bytes always encode to exactly 28 base64 characters.
    let written = BASE64
        .encode_slice(digest.as_slice(), &mut out)
        .unwrap_or_default();
    debug_assert_eq!(written, 28);
    out
}

/// Appends the 101 response that completes the handshake.
pub fn write_switching_protocols(out: &mut Vec<u8>, accept: &[u8; 28]) {
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept);
    out.extend_from_slice(b"\r\n\r\n");
}

pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Appends a complete response that closes the connection after it.
pub fn write_response(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra_headers: &[(&str, &str)],
    body: &[u8],
) {
    write_response_conn(out, status, content_type, extra_headers, body, false);
}

/// Appends a complete response; `keep_alive` leaves the connection open for the
/// client's next request.
pub fn write_response_conn(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra_headers: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) {
    use std::io::Write;
    let connection = if keep_alive { "keep-alive" } else { "close" };
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {connection}\r\n",
        reason_phrase(status),
        body.len()
    );
    for (name, value) in extra_headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// Appends a JSON error response: `{"error": reason, "status": status}`.
pub fn write_error(out: &mut Vec<u8>, status: u16, reason: &str, extra_headers: &[(&str, &str)]) {
    let body = serde_json::json!({ "error": reason, "status": status }).to_string();
    write_response(
        out,
        status,
        "application/json",
        extra_headers,
        body.as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(raw: &str) -> Result<[u8; 28], HandshakeError> {
        let (req, _) = parse_request(raw.as_bytes()).unwrap().unwrap();
        validate_upgrade(&req)
    }

    const GOOD: &str = "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn accept_key_matches_rfc_example() {
        assert_eq!(
            &accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn valid_upgrade_is_accepted() {
        assert_eq!(&request(GOOD).unwrap(), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn headers_are_case_insensitive_and_connection_is_a_list() {
        let raw = "GET / HTTP/1.1\r\nhost: x\r\nupgrade: WebSocket\r\nconnection: keep-alive, UPGRADE\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n";
        assert!(request(raw).is_ok());
    }

    #[test]
    fn each_defect_has_its_own_error() {
        let cases = [
            (
                GOOD.replace("HTTP/1.1", "HTTP/1.0"),
                HandshakeError::NotHttp11,
            ),
            (GOOD.replace("GET", "POST"), HandshakeError::NotGet),
            (GOOD.replace("Host: x\r\n", ""), HandshakeError::MissingHost),
            (
                GOOD.replace("Upgrade: websocket", "Upgrade: h2c"),
                HandshakeError::BadUpgrade,
            ),
            (
                GOOD.replace("Connection: Upgrade", "Connection: keep-alive"),
                HandshakeError::BadConnection,
            ),
            (
                GOOD.replace("Sec-WebSocket-Version: 13\r\n", ""),
                HandshakeError::MissingVersion,
            ),
            (
                GOOD.replace("Version: 13", "Version: 8"),
                HandshakeError::UnsupportedVersion,
            ),
            (
                GOOD.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
                HandshakeError::MissingKey,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "c2hvcnQ="),
                HandshakeError::BadKey,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "not base64!!"),
                HandshakeError::BadKey,
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(request(&raw), Err(expected.clone()), "{raw}");
        }
        assert_eq!(HandshakeError::UnsupportedVersion.status(), 426);
        assert_eq!(HandshakeError::BadKey.status(), 400);
    }

    #[test]
    fn partial_garbage_and_oversized_heads() {
        assert!(
            parse_request(b"GET / HTTP/1.1\r\nHost: x\r\n")
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            parse_request(b"\x16\x03\x01\x00garbage\r\n\r\n"),
            Err(ParseError::Malformed(_))
        ));
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_REQUEST_HEAD + 10, b'a');
        assert_eq!(parse_request(&big).unwrap_err(), ParseError::TooLarge);
    }

    #[test]
    fn pipelined_bytes_after_the_head_are_not_consumed() {
        let mut raw = GOOD.as_bytes().to_vec();
        raw.extend_from_slice(&[0x81, 0x80, 1, 2, 3, 4]);
        let (_, len) = parse_request(&raw).unwrap().unwrap();
        assert_eq!(len, GOOD.len());
    }

    #[test]
    fn path_and_query_split() {
        let raw = "GET /ws/news?format=json&since=3 HTTP/1.1\r\nHost: x\r\n\r\n";
        let (req, _) = parse_request(raw.as_bytes()).unwrap().unwrap();
        assert_eq!(req.path(), "/ws/news");
        assert_eq!(req.query(), Some("format=json&since=3"));
        assert!(!req.wants_upgrade());
    }

    #[test]
    fn error_responses_are_json_and_close() {
        let mut out = Vec::new();
        write_error(&mut out, 404, "no route for /x", &[]);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(text.contains("Connection: close\r\n"));
        assert!(text.ends_with(r#"{"error":"no route for /x","status":404}"#));
    }
}
