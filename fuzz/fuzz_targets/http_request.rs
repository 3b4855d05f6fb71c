//! HTTP request heads, the WebSocket handshake and the router.
//!
//! Input: `flags, split_seed, request bytes`.
//! - flags bit 0: the peer is remote (not loopback); bit 1: the server has an API
//!   key ("k3y"); bit 2: the server is draining; bit 3: subscribers need an HS256
//!   token (`--token-secret fuzz-secret`); bit 4: `--allowed-origin
//!   https://ok.example`.
//! - split_seed: where the bytes are cut when they are served in pieces.
//!
//! Checks:
//! - `parse_request`: a parsed head is no longer than the input or the cap, parses
//!   the same on its own, and every prefix of it is "incomplete" (a head that
//!   arrives in pieces is never refused early); "incomplete" only under the cap.
//! - `routes::route` on a parsed head (a fresh memory-broker server each run): the
//!   output is exactly one well-formed `HTTP/1.1` response with a known status and
//!   a matching Content-Length (errors as JSON and closing), or nothing with a
//!   transport opening (whose upgrade `validate_upgrade` accepts with the same key,
//!   whose channel and client name are valid), or a publish waiting for its body;
//!   keep-alive only for HTTP/1.1 without `Connection: close` on a server not
//!   draining. A draining server opens nothing: every `/`, `/echo`, `/ws/`, `/sse/`
//!   and `/poll/` request gets 503. Otherwise, on `/` and `/echo` upgrades the
//!   answer is what `validate_upgrade` says.
//!   With `--token-secret`, nothing subscribes without a token (`?token=` or
//!   `Authorization: Bearer`) and every subscription carries its expiry; with
//!   `--allowed-origin`, nothing opens for a page from another `Origin` (403).
//! - `server::http::serve` (buffering, keep-alive, pipelining): the same bytes served
//!   whole or in pieces give the same responses (statuses and Connection) and end
//!   the same way (kept open with the same pending bytes, closed, or handed to a
//!   transport with the same bytes after the request); and never more answers
//!   than the requests a strict reader frames in the input (each head followed by
//!   exactly its `Content-Length` body; nothing counted after a chunked body or a
//!   body on a request that takes none), so no request is smuggled in a body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use throng::protocol::handshake::validate_upgrade;
use throng::protocol::http::{MAX_REQUEST_HEAD, Request, parse_request};
use throng::rules::{validate_channel_name, validate_client_name};
use throng::server::http::{Next, serve};
use throng::server::routes::{Outcome, RouteContext, route};
use throng::stats::TurnCounts;
use throng::transport::{Format, Handover, Opening};
use throng_fuzz::{ALLOWED_ORIGIN, Options, Response, TICKET, fresh_shared, peer, single_response};

struct Setup {
    remote: bool,
    options: Options,
}

fn same_request(a: &Request<'_>, b: &Request<'_>) {
    assert_eq!(a.method, b.method);
    assert_eq!(a.target, b.target);
    assert_eq!(a.minor_version, b.minor_version);
    assert_eq!(&a.headers[..], &b.headers[..]);
}

/// Cut points derived from the seed: pieces of 1 to 64 bytes.
fn cuts(len: usize, seed: u8) -> Vec<usize> {
    let mut state = u32::from(seed).wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut at = 0;
    let mut cuts = Vec::new();
    loop {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        at += 1 + (state >> 16) as usize % 64;
        if at >= len {
            return cuts;
        }
        cuts.push(at);
    }
}

fn check_parse(raw: &[u8], seed: u8) {
    match parse_request(raw) {
        Ok(Some((req, head_len))) => {
            assert!(head_len <= raw.len() && head_len <= MAX_REQUEST_HEAD);
            let (again, len) = parse_request(&raw[..head_len])
                .expect("a head parses on its own")
                .expect("a head is complete on its own");
            assert_eq!(len, head_len);
            same_request(&req, &again);
            for cut in cuts(head_len, seed).into_iter().chain([head_len - 1]) {
                assert!(
                    matches!(parse_request(&raw[..cut]), Ok(None)),
                    "a prefix of {cut} bytes of a {head_len}-byte head is not 'incomplete'"
                );
            }
        }
        Ok(None) => assert!(raw.len() <= MAX_REQUEST_HEAD),
        Err(_) => {}
    }
}

/// The value of a query parameter, as the router reads it.
fn query_param<'a>(req: &Request<'a>, key: &str) -> Option<&'a str> {
    req.query()?
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some((k, v)) => (k == key).then_some(v),
            None => (pair == key).then_some(""),
        })
}

fn check_opening(req: &Request<'_>, opening: &Opening, options: Options) {
    let path = req.path();
    assert_eq!(req.method, "GET");
    assert!(!options.draining, "a draining server opened a connection");
    assert!(
        origin_allowed(req, options),
        "opened for a page from another origin"
    );
    match &opening.handover {
        Handover::WebSocket { accept, deflate } => {
            assert_eq!(validate_upgrade(req).as_ref(), Ok(accept));
            // An agreement is only made from an offer, and its window is one zlib
            // can compress with.
            if let Some(agreement) = deflate {
                assert!(req.header("sec-websocket-extensions").is_some());
                assert!((9..=15).contains(&agreement.server_window_bits));
            }
            match &opening.subscribe {
                None => assert!(path == "/" || path == "/echo", "{path}"),
                Some(sub) => {
                    assert_eq!(path.strip_prefix("/ws/"), Some(sub.channel.as_str()));
                    assert!(matches!(sub.format, Format::WsRaw | Format::WsJson));
                }
            }
        }
        Handover::Sse => {
            let sub = opening.subscribe.as_ref().expect("SSE subscribes");
            assert_eq!(path.strip_prefix("/sse/"), Some(sub.channel.as_str()));
            assert_eq!(sub.format, Format::Sse);
        }
        Handover::Poll { timeout } => {
            let sub = opening.subscribe.as_ref().expect("a poll subscribes");
            assert_eq!(path.strip_prefix("/poll/"), Some(sub.channel.as_str()));
            assert_eq!(sub.format, Format::Poll);
            assert!(timeout.as_secs() <= 60 && timeout.subsec_nanos() == 0);
            assert!(sub.resume.is_some());
        }
        Handover::Pusher { accept, .. } => {
            assert_eq!(validate_upgrade(req).as_ref(), Ok(accept));
            assert!(path.starts_with("/app/"), "{path}");
            // Channels come later, over the socket.
            assert!(opening.subscribe.is_none());
        }
    }
    if let Some(sub) = &opening.subscribe {
        if options.tokens {
            let bearer = req
                .header("authorization")
                .is_some_and(|v| v.starts_with(b"Bearer "));
            assert!(
                bearer || query_param(req, "token").is_some(),
                "a subscription without a token"
            );
            assert!(sub.expires.is_some(), "a token's expiry is kept");
        } else {
            assert_eq!(sub.expires, None);
        }
        assert!(validate_channel_name(&sub.channel).is_ok());
        if let Some(name) = &sub.name {
            assert!(validate_client_name(name).is_ok());
        }
    }
}

fn check_route(raw: &[u8], setup: &Setup) {
    let Ok(Some((req, head_len))) = parse_request(raw) else {
        return;
    };
    let shared = fresh_shared(setup.options);
    let ctx = RouteContext {
        shared: &shared,
        ticket: TICKET,
        peer: peer(setup.remote),
        local: !setup.remote,
        body: &raw[head_len..],
        head_len,
    };
    let mut out = Vec::new();
    let outcome = route(&req, ctx, &mut out, &mut TurnCounts::default());
    let may_keep_alive = req.minor_version >= 1
        && !req.header_has_token("connection", "close")
        && !setup.options.draining;
    let mut response: Option<Response<'_>> = None;
    match &outcome {
        Outcome::Responded => {
            let r = single_response(&out);
            if r.status == 200 {
                assert!(
                    !may_keep_alive,
                    "a 200 that could keep the connection closes it"
                );
                assert!(!r.keep_alive());
            } else {
                r.assert_json_error();
            }
            response = Some(r);
        }
        Outcome::KeepAlive { consumed } => {
            let r = single_response(&out);
            assert_eq!(r.status, 200);
            assert!(r.keep_alive() && may_keep_alive);
            assert!(*consumed >= head_len && *consumed <= raw.len());
            if req.path().starts_with("/api/publish/") {
                assert_eq!(req.method, "POST");
            } else {
                assert_eq!(*consumed, head_len);
            }
            response = Some(r);
        }
        Outcome::Open(opening) => {
            assert!(out.is_empty(), "an opening writes nothing yet");
            check_opening(&req, opening, setup.options);
        }
        Outcome::Wait(_) => panic!("the memory broker answers a publish at once"),
        Outcome::NeedBody => {
            assert!(out.is_empty());
            assert_eq!(req.method, "POST");
            assert!(req.path().starts_with("/api/publish/"));
            let length: usize = std::str::from_utf8(req.header("content-length").unwrap())
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!(raw.len() - head_len < length);
        }
    }
    // The handshake: on `/` and `/echo`, an upgrade opens exactly when it is valid,
    // and is refused with the status of its defect otherwise.
    let path = req.path();
    // While draining every upgrade gets 503 (come back elsewhere); otherwise a page
    // from an origin `--allowed-origin` does not list is refused (403) first.
    if req.wants_upgrade() && (path == "/" || path == "/echo") {
        let status = response.map(|r| r.status);
        if setup.options.draining {
            // A draining server takes no new connection, whatever its defects.
            assert_eq!(status, Some(503));
        } else if !origin_allowed(&req, setup.options) || host_refused(&req, setup) {
            assert_eq!(status, Some(403));
        } else {
            match validate_upgrade(&req) {
                Ok(_) => assert!(matches!(outcome, Outcome::Open(_)), "{outcome:?}"),
                Err(e) => assert_eq!(status, Some(e.status())),
            }
        }
    }
}

/// Whether the request's `Host` is refused: a browser's (`Sec-Fetch-Site`) on a
/// loopback connection naming the server by a DNS name other than localhost.
fn host_refused(req: &Request<'_>, setup: &Setup) -> bool {
    let browser = req.header("sec-fetch-site").is_some();
    throng::site::host_allowed(&[], req.header("host"), browser, !setup.remote).is_err()
}

/// Whether the request's `Origin` (if any) is one the server allows.
fn origin_allowed(req: &Request<'_>, options: Options) -> bool {
    match req.header("origin") {
        Some(origin) if options.origins => origin.eq_ignore_ascii_case(ALLOWED_ORIGIN.as_bytes()),
        _ => true,
    }
}

/// How a served connection ends.
#[derive(Debug, PartialEq, Eq)]
enum End {
    KeepOpen { pending: Vec<u8> },
    Close,
    Open { leftover: Vec<u8>, handover: String },
}

/// Serves `raw` cut at `cuts` on one connection; returns each response's status
/// and Connection, and how it ends.
fn serve_pieces(raw: &[u8], cuts: &[usize], setup: &Setup) -> (Vec<(u16, bool)>, End) {
    let shared = fresh_shared(setup.options);
    let mut pending = Vec::new();
    let mut out = Vec::new();
    let mut start = 0;
    let ends: Vec<usize> = cuts.iter().copied().chain([raw.len()]).collect();
    let mut end = End::KeepOpen {
        pending: Vec::new(),
    };
    for &stop in &ends {
        let input = &raw[start..stop];
        start = stop;
        let next = serve(
            &mut pending,
            input,
            &shared,
            TICKET,
            peer(setup.remote),
            &mut out,
            &mut TurnCounts::default(),
        );
        match next {
            Next::KeepOpen { .. } => {
                end = End::KeepOpen {
                    pending: pending.clone(),
                }
            }
            Next::Close => {
                end = End::Close;
                break;
            }
            Next::Wait { .. } => panic!("the memory broker answers a publish at once"),
            Next::Open {
                opening,
                mut leftover,
                client,
            } => {
                // Without --trusted-proxy nothing a request says changes who the
                // client is.
                assert_eq!(client, peer(setup.remote).to_canonical());
                // What follows belongs to the transport.
                leftover.extend_from_slice(&raw[stop..]);
                end = End::Open {
                    leftover,
                    handover: format!("{:?}", opening.handover),
                };
                break;
            }
        }
    }
    let responses = throng_fuzz::read_responses(&out);
    if let End::Close = end {
        assert!(!responses.is_empty(), "closed without an answer");
        assert!(!responses.last().unwrap().keep_alive());
    }
    for r in &responses[..responses.len().saturating_sub(1)] {
        assert!(r.keep_alive(), "an answer before the last one closed");
    }
    let statuses = responses
        .iter()
        .map(|r| (r.status, r.keep_alive()))
        .collect();
    (statuses, end)
}

/// How many requests a strict reader finds in `raw`: heads one after another,
/// each followed by exactly its declared body; a head that does not parse is one
/// more (its refusal), and a body whose end is a guess (chunked, or on anything
/// but a POST) ends the count, since nothing after it can be told apart from it.
fn framed_requests(raw: &[u8]) -> usize {
    let mut count = 0;
    let mut at = 0;
    while at < raw.len() {
        match parse_request(&raw[at..]) {
            Err(_) => return count + 1,
            Ok(None) => return count,
            Ok(Some((req, head_len))) => {
                count += 1;
                if req.transfer_encoding || (req.content_length > 0 && req.method != "POST") {
                    return count;
                }
                at += head_len + req.content_length;
            }
        }
    }
    count
}

fn check_serve(raw: &[u8], seed: u8, setup: &Setup) {
    let whole = serve_pieces(raw, &[], setup);
    let pieces = serve_pieces(raw, &cuts(raw.len(), seed), setup);
    assert_eq!(whole, pieces, "serving in pieces changed the answers");
    // No request hides in another's body: never more answers than framed requests.
    assert!(
        whole.0.len() <= framed_requests(raw),
        "{} answers to {} framed requests",
        whole.0.len(),
        framed_requests(raw)
    );
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let flags = input[0];
    let seed = input[1];
    let raw = &input[2..];
    let setup = Setup {
        remote: flags & 1 != 0,
        options: Options {
            api_key: flags & 2 != 0,
            draining: flags & 4 != 0,
            tokens: flags & 8 != 0,
            origins: flags & 16 != 0,
        },
    };
    check_parse(raw, seed);
    check_route(raw, &setup);
    check_serve(raw, seed, &setup);
});
