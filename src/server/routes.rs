//! What each request path does: which requests become WebSockets (and of what
//! kind), and the plain-HTTP answers (health, info, JSON errors).
//!
//! It owns the URL space. It must not do I/O or hold connection state: it reads a
//! parsed request and either writes a complete response into `out` or says which
//! WebSocket to open; the event loop applies admission limits and writes.

use crate::protocol::handshake::{self, HandshakeError, Request};

/// What an upgraded connection does with its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsRoute {
    Echo,
}

/// A request the loop should upgrade.
#[derive(Debug)]
pub struct Upgrade {
    pub accept: [u8; 28],
    pub route: WsRoute,
}

/// What the router needs to know about the server.
#[derive(Debug, Clone, Copy)]
pub struct RouteContext {
    pub draining: bool,
}

const INFO_PAGE: &str = "throng: a real-time connection server\n\n\
WebSocket echo:  ws://HOST/echo  (or ws://HOST/)\n\
Health:          GET /healthz\n";

/// Routes one request: `Some` to upgrade, `None` when a response was written to `out`.
pub fn route(req: &Request<'_>, ctx: RouteContext, out: &mut Vec<u8>) -> Option<Upgrade> {
    let path = req.path();
    match path {
        "/" | "/echo" => websocket_endpoint(req, WsRoute::Echo, out),
        "/healthz" => {
            if req.method != "GET" {
                handshake::write_error(
                    out,
                    405,
                    "method not allowed: use GET",
                    &[("Allow", "GET")],
                );
            } else if ctx.draining {
                handshake::write_error(out, 503, "draining: the server is shutting down", &[]);
            } else {
                handshake::write_response(out, 200, "text/plain", &[], b"ok");
            }
            None
        }
        _ => {
            let reason = format!("no route for {}", truncate(path, 200));
            handshake::write_error(out, 404, &reason, &[]);
            None
        }
    }
}

fn websocket_endpoint(req: &Request<'_>, route: WsRoute, out: &mut Vec<u8>) -> Option<Upgrade> {
    if !req.wants_upgrade() {
        if req.method != "GET" {
            handshake::write_error(out, 405, "method not allowed: use GET", &[("Allow", "GET")]);
        } else if req.path() == "/" {
            handshake::write_response(
                out,
                200,
                "text/plain; charset=utf-8",
                &[],
                INFO_PAGE.as_bytes(),
            );
        } else {
            handshake::write_error(
                out,
                426,
                "this is a WebSocket endpoint: send an Upgrade: websocket request",
                &[("Upgrade", "websocket")],
            );
        }
        return None;
    }
    match handshake::validate_upgrade(req) {
        Ok(accept) => Some(Upgrade { accept, route }),
        Err(err) => {
            let extra: &[(&str, &str)] = match err {
                HandshakeError::UnsupportedVersion => &[("Sec-WebSocket-Version", "13")],
                HandshakeError::NotGet => &[("Allow", "GET")],
                _ => &[],
            };
            handshake::write_error(out, err.status(), &err.to_string(), extra);
            None
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::handshake::parse_request;

    fn answer(raw: &str, draining: bool) -> (Option<Upgrade>, String) {
        let (req, _) = parse_request(raw.as_bytes()).unwrap().unwrap();
        let mut out = Vec::new();
        let up = route(&req, RouteContext { draining }, &mut out);
        (up, String::from_utf8(out).unwrap())
    }

    #[test]
    fn plain_requests_get_the_documented_statuses() {
        let (_, r) = answer("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("ok"));
        let (_, r) = answer("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", true);
        assert!(r.starts_with("HTTP/1.1 503"));
        let (_, r) = answer("POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
        assert!(r.starts_with("HTTP/1.1 405"));
        let (_, r) = answer("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", false);
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("no route for /nope"));
        let (_, r) = answer("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", false);
        assert!(r.starts_with("HTTP/1.1 426") && r.contains("Upgrade: websocket"));
        let (_, r) = answer("GET / HTTP/1.1\r\nHost: x\r\n\r\n", false);
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("ws://HOST/echo"));
    }

    #[test]
    fn upgrades_route_to_echo() {
        let raw = "GET /echo?x=1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
        let (up, out) = answer(raw, false);
        assert_eq!(up.map(|u| u.route), Some(WsRoute::Echo));
        assert!(out.is_empty());
        let (up, out) = answer(&raw.replace("Version: 13", "Version: 7"), false);
        assert!(up.is_none());
        assert!(out.starts_with("HTTP/1.1 426") && out.contains("Sec-WebSocket-Version: 13"));
    }
}
