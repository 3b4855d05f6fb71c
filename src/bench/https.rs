//! Blocking HTTPS for the bench's requests outside the event loop: push mode's
//! publisher over an `https://` publish URL ([`HttpsSession`], kept alive as
//! `crate::client::Session` keeps an `http://` one), and `handshakes` mode's
//! one-request connections ([`connect`], [`exchange`]). It is rustls's
//! `StreamOwned` over a std `TcpStream` with read and write timeouts.
//!
//! It owns the TLS stream, writing a request and reading its response; its errors
//! are `crate::client`'s [`ClientError`], so a failed publish reads alike over
//! http and https. It must not touch the event loop's connections, and is no
//! general client: no redirects, no chunked bodies.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConnection, StreamOwned};

use super::tls::{TlsTarget, reason};
use crate::client::{ClientError, HttpUrl, Reading, Response, complete_response};

/// The largest response read (head and body).
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// A TLS connection whose handshake is done.
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// Connects to `url` and completes the TLS handshake, within `timeout` for the
/// TCP connect and for each read and write. A refused certificate is a
/// [`ClientError::Connect`] whose source says why.
pub fn connect(
    url: &HttpUrl,
    tls: &TlsTarget,
    timeout: Duration,
) -> Result<TlsStream, ClientError> {
    handshake(tcp(url, timeout)?, &url.authority(), tls)
}

/// The TCP connection to `url`, with `timeout` on each read and write.
pub fn tcp(url: &HttpUrl, timeout: Duration) -> Result<TcpStream, ClientError> {
    let addr = url.authority();
    let failed = |source| ClientError::Connect {
        addr: addr.clone(),
        source,
    };
    let target = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(failed)?
        .next()
        .ok_or_else(|| ClientError::BadUrl(addr.clone()))?;
    let socket = TcpStream::connect_timeout(&target, timeout).map_err(failed)?;
    socket.set_read_timeout(Some(timeout)).map_err(failed)?;
    socket.set_write_timeout(Some(timeout)).map_err(failed)?;
    socket.set_nodelay(true).map_err(failed)?;
    Ok(socket)
}

/// The TLS handshake over `socket` (to `addr`, for the error's text).
pub fn handshake(socket: TcpStream, addr: &str, tls: &TlsTarget) -> Result<TlsStream, ClientError> {
    let failed = |e: io::Error| {
        // rustls's refusal in the words (and with the hints) of the event loop's.
        let source = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(refused) => io::Error::new(e.kind(), reason(refused)),
            None => e,
        };
        ClientError::Connect {
            addr: addr.to_string(),
            source,
        }
    };
    let session = ClientConnection::new(Arc::clone(&tls.config), tls.name.clone())
        .map_err(|e| failed(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    let mut stream = StreamOwned::new(session, socket);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock).map_err(failed)?;
    }
    Ok(stream)
}

/// Writes `request` and reads the whole response (into `buf`, reused); also
/// whether the server keeps the connection open after it.
pub fn exchange(
    stream: &mut TlsStream,
    addr: &str,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Result<(Response, bool), ClientError> {
    let failed = |source| ClientError::Io {
        addr: addr.to_string(),
        source,
    };
    stream.write_all(request).map_err(failed)?;
    stream.flush().map_err(failed)?;
    buf.clear();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let eof = match stream.read(&mut chunk) {
            Ok(0) => true,
            // Closed without close_notify: many servers end a response so.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => true,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(e)),
        };
        let bad = |reason: String| ClientError::BadResponse {
            addr: addr.to_string(),
            reason,
        };
        if let Some(done) = complete_response(buf, Reading::Http11 { eof }).map_err(bad)? {
            return Ok(done);
        }
        if eof {
            return Err(failed(io::ErrorKind::UnexpectedEof.into()));
        }
        if buf.len() > MAX_RESPONSE {
            return Err(bad("response too large".into()));
        }
    }
}

/// A kept-alive HTTPS connection for many requests to one server (the
/// publisher's, one per thread). It reconnects when the server closed it, and
/// retries once when a reused connection turns out closed before any answer.
pub struct HttpsSession {
    url: HttpUrl,
    tls: TlsTarget,
    timeout: Duration,
    stream: Option<TlsStream>,
    buf: Vec<u8>,
}

impl HttpsSession {
    pub fn new(url: HttpUrl, tls: TlsTarget, timeout: Duration) -> Self {
        HttpsSession {
            url,
            tls,
            timeout,
            stream: None,
            buf: Vec::new(),
        }
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ClientError> {
        let reused = self.stream.is_some();
        match self.try_request(method, path, headers, body) {
            Err(ClientError::Io { .. }) if reused => self.try_request(method, path, headers, body),
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
        let mut stream = match self.stream.take() {
            Some(s) => s,
            None => connect(&self.url, &self.tls, self.timeout)?,
        };
        let request = crate::client::encode_request(&self.url, method, path, headers, body, true);
        let (response, keep) =
            exchange(&mut stream, &self.url.authority(), &request, &mut self.buf)?;
        if keep {
            self.stream = Some(stream);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_end_at_their_length_or_at_the_close() {
        let two = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1";
        let (r, keep) = complete_response(two, Reading::Http11 { eof: false })
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice(), keep), (200, &b"ok"[..], true));
        let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok";
        assert!(
            complete_response(partial, Reading::Http11 { eof: false })
                .unwrap()
                .is_none()
        );
        let unsized_body = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it";
        assert!(
            complete_response(unsized_body, Reading::Http11 { eof: false })
                .unwrap()
                .is_none()
        );
        let (r, keep) = complete_response(unsized_body, Reading::Http11 { eof: true })
            .unwrap()
            .unwrap();
        assert_eq!((r.body.as_slice(), keep), (&b"all of it"[..], false));
        let closing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        assert!(
            !complete_response(closing, Reading::Http11 { eof: false })
                .unwrap()
                .unwrap()
                .1
        );
        assert!(complete_response(b"garbage\r\n\r\n", Reading::Http11 { eof: false }).is_err());
    }

    #[test]
    fn requests_carry_the_prefix_host_and_length() {
        let url = HttpUrl::parse("http://h:9/pre").unwrap();
        let r = crate::client::encode_request(&url, "POST", "/x", &[("A", "b")], b"hi", false);
        let text = String::from_utf8(r).unwrap();
        assert!(
            text.starts_with(
                "POST /pre/x HTTP/1.1\r\nHost: h:9\r\nConnection: close\r\nContent-Length: 2\r\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("A: b\r\n\r\nhi"), "{text}");
    }
}
