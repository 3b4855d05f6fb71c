//! HTTP/1.1 on the wire, without I/O: parsing a request head (with `httparse`) and
//! encoding every response the server writes (status line, headers, JSON errors).
//!
//! It owns the bytes, not the meaning: routes, keep-alive decisions and connection
//! handling belong to the server.

use smallvec::SmallVec;

/// Most headers a request may carry.
const MAX_HEADERS: usize = 64;
/// Headers a request keeps without touching the heap (browsers send ~15).
const INLINE_HEADERS: usize = 20;
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
    /// Held inline: a request's handful of headers costs no allocation.
    pub headers: SmallVec<[(&'a str, &'a [u8]); INLINE_HEADERS]>,
    /// The body's length as its one `Content-Length` declares it (0 without one).
    pub content_length: usize,
    /// The request declares `Transfer-Encoding`: a body no length frames here.
    pub transfer_encoding: bool,
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
///
/// A head whose framing two parties could read two ways is refused here, so no
/// request can hide inside another one's body (request smuggling): a line that
/// ends in a bare LF, an HTTP/1.1 request without `Host`, `Content-Length` given
/// twice or as anything but digits, `Content-Length` beside `Transfer-Encoding`.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, ParseError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        // The cap holds however the head arrived: in pieces or in one read.
        Ok(httparse::Status::Complete(len)) if len > MAX_REQUEST_HEAD => Err(ParseError::TooLarge),
        Ok(httparse::Status::Complete(len)) => {
            if has_bare_lf(&buf[..len]) {
                return Err(malformed("every line must end in CRLF, not a bare LF"));
            }
            let mut request = Request {
                method: req.method.unwrap_or(""),
                target: req.path.unwrap_or(""),
                minor_version: req.version.unwrap_or(1),
                headers: req.headers.iter().map(|h| (h.name, h.value)).collect(),
                content_length: 0,
                transfer_encoding: false,
            };
            frame(&mut request)?;
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

fn malformed(why: &str) -> ParseError {
    ParseError::Malformed(why.to_owned())
}

/// Whether a line of `head` ends in LF without the CR before it. (httparse takes
/// both; a proxy in front may not, and then the two split requests differently.)
fn has_bare_lf(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
}

/// Checks the head's framing headers and fills in what they declare.
fn frame(req: &mut Request<'_>) -> Result<(), ParseError> {
    let mut lengths = 0;
    let mut hosts = 0;
    for (name, value) in &req.headers {
        if name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
            // Digits only: no sign, no list, no spaces inside (httparse has
            // trimmed the ends).
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                return Err(malformed("Content-Length must be a number of digits"));
            }
            req.content_length = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| malformed("Content-Length is too large"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            req.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case("host") {
            hosts += 1;
        }
    }
    if lengths > 1 {
        return Err(malformed("Content-Length is given more than once"));
    }
    if lengths == 1 && req.transfer_encoding {
        return Err(malformed("Content-Length and Transfer-Encoding together"));
    }
    if hosts > 1 {
        return Err(malformed("Host is given more than once"));
    }
    if hosts == 0 && req.minor_version >= 1 {
        return Err(malformed("an HTTP/1.1 request needs a Host header"));
    }
    Ok(())
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

/// The headers every response carries.
pub const SECURITY_HEADERS: &[u8] =
    b"X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n";

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
    // Pieces appended one by one (no formatting machinery): every publish's
    // answer comes through here.
    let mut number = itoa::Buffer::new();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(number.format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\nContent-Length: ");
    out.extend_from_slice(number.format(body.len()).as_bytes());
    out.extend_from_slice(if keep_alive {
        b"\r\nConnection: keep-alive\r\n".as_slice()
    } else {
        b"\r\nConnection: close\r\n".as_slice()
    });
    // No answer is sniffed into another type (a JSON error as a page), and none
    // tells the next site where the reader came from.
    out.extend_from_slice(SECURITY_HEADERS);
    for (name, value) in extra_headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
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

    const GOOD: &str = "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

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
    fn heads_whose_framing_could_be_read_two_ways_are_refused() {
        let refused = [
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x10\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            "GET / HTTP/1.1\nHost: x\n\n",
            "GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",
        ];
        for raw in refused {
            assert!(
                matches!(parse_request(raw.as_bytes()), Err(ParseError::Malformed(_))),
                "{raw:?}"
            );
        }
        let (req, _) = parse_request(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((req.content_length, req.transfer_encoding), (12, false));
        let (req, _) =
            parse_request(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(req.transfer_encoding);
        // HTTP/1.0 names no host.
        assert!(parse_request(b"GET / HTTP/1.0\r\n\r\n").unwrap().is_some());
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
