//! HTTP/1.1 connections: a request that arrives in pieces is buffered, each whole
//! request is routed and answered, successful API answers keep the connection for
//! the next request (keep-alive), and requests sent back to back are answered in
//! order (pipelining). A request that asks for a transport (a WebSocket) is handed back
//! to the event loop with whatever bytes followed it.
//!
//! It owns the request buffering and the keep-alive rules' mechanics; `routes` owns
//! what each path means and `protocol::http` the bytes of each response. It must not
//! touch the socket: answers go into the caller's output buffer.

use std::net::IpAddr;

use super::routes::{self, Awaited, Outcome, RouteContext};
use super::shared::Shared;
use crate::broker::asked::Ticket;
use crate::protocol::http::{ParseError, parse_request, write_error};
use crate::proxy;
use crate::stats::{HandshakeFailure, TurnCounts};
use crate::transport::Opening;

/// What to do with the connection once its input is served.
#[derive(Debug)]
pub enum Next {
    /// Keep it open: wait for the rest of a request, or for the next one.
    /// `answered`: at least one request was answered (its timer starts again).
    KeepOpen { answered: bool },
    /// The last answer is in the output; close after sending it.
    Close,
    /// Hand the connection to a transport; `leftover` are the bytes the client sent
    /// after its request, `client` its address (behind a trusted proxy, the one
    /// the proxy forwards for).
    Open {
        opening: Opening,
        leftover: Vec<u8>,
        client: IpAddr,
    },
    /// A request waits on the broker's answer ([`routes::answer`] writes it);
    /// `rest` is what the client sent after it, served once it is answered.
    Wait { awaited: Awaited, rest: Vec<u8> },
}

/// Serves every whole request in `pending` followed by `input`, appending the
/// answers to `out`; whatever is left of an unfinished request stays in `pending`.
/// Refused transport requests (and unreadable ones) are counted in `counts`.
pub fn serve(
    pending: &mut Vec<u8>,
    input: &[u8],
    shared: &Shared,
    ticket: Ticket,
    peer: IpAddr,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Next {
    let joined;
    let data: &[u8] = if pending.is_empty() {
        input
    } else {
        pending.extend_from_slice(input);
        joined = std::mem::take(pending);
        &joined
    };
    let mut start = 0;
    let mut answered = false;
    loop {
        let rest = &data[start..];
        let (request, head_len) = match parse_request(rest) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => {
                *pending = rest.to_vec();
                return Next::KeepOpen { answered };
            }
            Err(e @ ParseError::TooLarge) => {
                counts.handshake_failed(HandshakeFailure::BadRequest);
                write_error(out, 431, &e.to_string(), &[]);
                return Next::Close;
            }
            Err(e @ ParseError::Malformed(_)) => {
                counts.handshake_failed(HandshakeFailure::BadRequest);
                write_error(out, 400, &e.to_string(), &[]);
                return Next::Close;
            }
        };
        if let Some((status, reason)) = unframeable(&request) {
            counts.handshake_failed(HandshakeFailure::BadRequest);
            write_error(out, status, reason, &[]);
            return Next::Close;
        }
        let client = proxy::client_address(peer, &request, &shared.config.trusted_proxies);
        let ctx = RouteContext {
            shared,
            ticket,
            peer: client.addr,
            local: client.is_local(),
            body: &rest[head_len..],
            head_len,
        };
        match routes::route(&request, ctx, out, counts) {
            Outcome::NeedBody => {
                *pending = rest.to_vec();
                return Next::KeepOpen { answered };
            }
            Outcome::Responded => return Next::Close,
            // Whatever a route read of it, a kept-alive request takes its whole
            // declared body with it: bytes it declared are never a next request.
            Outcome::KeepAlive { consumed } if consumed < head_len + request.content_length => {
                return Next::Close;
            }
            Outcome::KeepAlive { consumed } => {
                answered = true;
                start += consumed;
                if start >= data.len() {
                    return Next::KeepOpen { answered };
                }
            }
            // Whatever a route read of it, the wait takes its whole declared body.
            Outcome::Wait(awaited) if awaited.consumed < head_len + request.content_length => {
                return Next::Close;
            }
            Outcome::Wait(awaited) => {
                let rest = match awaited.keeps_alive() {
                    true => rest[awaited.consumed..].to_vec(),
                    false => Vec::new(),
                };
                return Next::Wait { awaited, rest };
            }
            Outcome::Open(opening) => {
                return Next::Open {
                    opening,
                    leftover: rest[head_len..].to_vec(),
                    client: client.addr,
                };
            }
        }
    }
}

/// Why a request whose head parsed cannot be served on a kept-alive connection:
/// its body's end would be a guess. Only `POST` carries a body here (with
/// `Content-Length`, never chunked), so a body on anything else, or a chunked one,
/// is refused and the connection closed. Otherwise a `GET /healthz` could carry a
/// second request in the body a proxy forwarded as part of the first.
fn unframeable(request: &crate::protocol::http::Request<'_>) -> Option<(u16, &'static str)> {
    let takes_body = request.method == "POST";
    if request.transfer_encoding {
        return Some(if takes_body {
            (
                411,
                "send the body with Content-Length, not Transfer-Encoding",
            )
        } else {
            (400, "Transfer-Encoding on a request that takes no body")
        });
    }
    if request.content_length > 0 && !takes_body {
        return Some((400, "a body on a request that takes none"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests_support::test_shared;

    const LOCAL: [u8; 4] = [127, 0, 0, 1];
    const TICKET: Ticket = Ticket {
        loop_index: 0,
        key: 0,
        serial: 0,
        asker: crate::broker::asked::Asker::Request,
    };

    /// Serves `raw` from loopback in one piece: the next step, and the answers.
    fn serve_once(raw: &[u8]) -> (Next, String) {
        let (shared, _polls) = test_shared(None);
        let mut out = Vec::new();
        let next = serve(
            &mut Vec::new(),
            raw,
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        (next, String::from_utf8_lossy(&out).into_owned())
    }

    /// Serving `raw` answers exactly once, with `status`, and closes.
    fn refused_once(raw: &[u8], status: u16) {
        let (next, out) = serve_once(raw);
        assert!(matches!(next, Next::Close), "{out}");
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status}")) && out.matches("HTTP/1.1").count() == 1,
            "{out}"
        );
    }

    #[test]
    fn a_request_hidden_in_a_body_is_never_served() {
        let hidden = "POST /api/publish/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        // A body on a GET: refused and closed, the body never read as a request.
        let smuggled = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{hidden}",
            hidden.len()
        );
        refused_once(smuggled.as_bytes(), 400);
        // A chunked GET: the same.
        let chunked = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{hidden}\r\n0\r\n\r\n",
            hidden.len()
        );
        refused_once(chunked.as_bytes(), 400);
        // A chunked POST: 411, closed.
        refused_once(
            b"POST /api/publish/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            411,
        );
        // Two lengths: 400, one answer.
        refused_once(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\nab",
            400,
        );
    }

    #[test]
    fn a_request_in_pieces_is_answered_once_whole() {
        let (shared, _polls) = test_shared(None);
        let mut pending = Vec::new();
        let mut out = Vec::new();
        let next = serve(
            &mut pending,
            b"GET /healthz HT",
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        assert!(matches!(next, Next::KeepOpen { answered: false }));
        assert!(out.is_empty() && !pending.is_empty());
        let next = serve(
            &mut pending,
            b"TP/1.1\r\nHost: x\r\n\r\n",
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        assert!(matches!(next, Next::KeepOpen { answered: true }));
        assert!(pending.is_empty());
        assert!(String::from_utf8_lossy(&out).ends_with("ok"));
    }

    #[test]
    fn pipelined_requests_are_answered_in_order() {
        let (shared, _polls) = test_shared(None);
        let mut pending = Vec::new();
        let mut out = Vec::new();
        let two = b"GET /api/channels/a HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let next = serve(
            &mut pending,
            two,
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        assert!(matches!(next, Next::Close));
        let text = String::from_utf8_lossy(&out);
        let first = text.find("\"channel\":\"a\"").unwrap();
        let second = text.rfind("\r\n\r\nok").unwrap();
        assert!(first < second, "{text}");
    }

    #[test]
    fn bytes_after_an_upgrade_request_are_kept_for_the_websocket() {
        let (shared, _polls) = test_shared(None);
        let mut pending = Vec::new();
        let mut out = Vec::new();
        let mut raw = b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".to_vec();
        raw.extend_from_slice(&[0x81, 0x80, 1, 2, 3, 4]);
        match serve(
            &mut pending,
            &raw,
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        ) {
            Next::Open { leftover, .. } => assert_eq!(leftover, [0x81, 0x80, 1, 2, 3, 4]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_gets_400_and_a_huge_head_431() {
        let (shared, _polls) = test_shared(None);
        let mut out = Vec::new();
        let mut counts = TurnCounts::default();
        let next = serve(
            &mut Vec::new(),
            b"\x16\x03\x01garbage\r\n\r\n",
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut counts,
        );
        assert!(matches!(next, Next::Close));
        assert!(out.starts_with(b"HTTP/1.1 400"));
        assert_eq!(
            counts.handshake_failures[HandshakeFailure::BadRequest as usize],
            1
        );
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(20_000, b'a');
        out.clear();
        let next = serve(
            &mut Vec::new(),
            &big,
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        assert!(matches!(next, Next::Close));
        assert!(out.starts_with(b"HTTP/1.1 431"));
        // A whole 100 KB head in one read is refused too, not only one in pieces.
        let mut whole = b"GET /healthz HTTP/1.1\r\nX: ".to_vec();
        whole.resize(100_000, b'a');
        whole.extend_from_slice(b"\r\n\r\n");
        out.clear();
        let next = serve(
            &mut Vec::new(),
            &whole,
            &shared,
            TICKET,
            LOCAL.into(),
            &mut out,
            &mut TurnCounts::default(),
        );
        assert!(matches!(next, Next::Close));
        assert!(
            out.starts_with(b"HTTP/1.1 431"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}
