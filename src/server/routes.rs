//! What each request path does: which requests become WebSockets (echo or a
//! channel subscription), SSE streams or long-polls, the HTTP API (publish, channel
//! info, stats, health, Prometheus metrics) and the JSON errors for everything else.
//! Refused transport requests are counted by reason for `/metrics`.
//!
//! It owns the URL space and the API's access rules. It must not do socket I/O or
//! hold connection state: it reads a parsed request (and its body, once complete)
//! and either writes a whole response into `out` or says which WebSocket to open;
//! the event loop applies admission limits and does the writing.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use super::shared::Shared;
use crate::auth::{self, AuthError, Grant};
use crate::broker::Outgoing;
use crate::broker::Resume;
use crate::metrics;
use crate::protocol::DataKind;
use crate::protocol::handshake::{self, HandshakeError};
use crate::protocol::http::{self, Request};
use crate::rules::{is_reserved, validate_channel_name, validate_client_name};
use crate::stats::{HandshakeFailure, TURN_OVER_1S, TURN_OVER_100MS, TurnCounts};
use crate::transport::{Format, Handover, Opening, Subscribe, sse};
use crate::web;

/// What the router decided.
#[derive(Debug)]
pub enum Outcome {
    /// A complete response is in `out`; close after sending it.
    Responded,
    /// Hand the connection to a transport (a WebSocket upgrade).
    Open(Opening),
    /// The request announced a body that has not fully arrived: read more.
    NeedBody,
    /// A complete response is in `out` and the connection stays open (HTTP/1.1
    /// keep-alive); the request took the first `consumed` bytes of the input.
    KeepAlive { consumed: usize },
}

/// What the router needs to know about the request's connection and the server.
#[derive(Clone, Copy)]
pub struct RouteContext<'a> {
    pub shared: &'a Shared,
    pub peer: IpAddr,
    /// Bytes received after the request head (the body, possibly incomplete).
    pub body: &'a [u8],
    /// Length of the request head, so a kept-alive connection knows where the next
    /// request starts.
    pub head_len: usize,
}

impl RouteContext<'_> {
    /// Whether a successful answer may keep the connection open: HTTP/1.1 without
    /// `Connection: close`, and the server not draining.
    fn keep_alive(&self, req: &Request<'_>) -> bool {
        req.minor_version >= 1
            && !req.header_has_token("connection", "close")
            && !self.shared.shutdown.load(Ordering::Relaxed)
    }
}

/// Routes one request; a refused transport request is counted in `counts`.
pub fn route(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let path = req.path();
    if path == "/" && !req.wants_upgrade() {
        return page(req, path, ctx, out);
    }
    let stays_open = path == "/"
        || path == "/echo"
        || ["/ws/", "/sse/", "/poll/"]
            .iter()
            .any(|p| path.starts_with(p));
    if stays_open && ctx.shared.shutdown.load(Ordering::Relaxed) {
        // A draining server takes no new subscriber: 503 says "come back" (to
        // another node, through a proxy) to browsers, throng.js and the bench.
        http::write_error(
            out,
            503,
            "draining: the server is shutting down",
            &[("Retry-After", "1")],
        );
        return Outcome::Responded;
    }
    if path == "/" || path == "/echo" {
        if let Err(e) = check_origin(req, ctx.shared) {
            return refuse_auth(out, counts, &e);
        }
        return websocket_endpoint(req, None, out, counts);
    }
    if web::is_page(path) {
        return page(req, path, ctx, out);
    }
    if let Some(channel) = path.strip_prefix("/ws/") {
        return subscribe_endpoint(req, channel, ctx.shared, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/sse/") {
        return sse_endpoint(req, channel, ctx.shared, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/poll/") {
        return poll_endpoint(req, channel, ctx.shared, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/api/publish/") {
        return publish(req, channel, ctx, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/api/channels/") {
        if only_get(req, out) {
            return channel_info(req, channel, ctx, out);
        }
        return Outcome::Responded;
    }
    match path {
        "/api/stats" => {
            if only_get(req, out) {
                return stats(req, ctx, out);
            }
        }
        "/api/stats/history" => {
            if only_get(req, out) {
                return ok_json(req, ctx, out, &ctx.shared.feed.history_json(), 0);
            }
        }
        "/metrics" => {
            if only_get(req, out) {
                return prometheus(req, ctx, out);
            }
        }
        "/healthz" => {
            if only_get(req, out) {
                if ctx.shared.shutdown.load(Ordering::Relaxed) {
                    http::write_error(out, 503, "draining: the server is shutting down", &[]);
                } else if !ctx.shared.broker.healthy() {
                    http::write_error(out, 503, "broker unreachable", &[]);
                } else {
                    return ok(req, ctx, out, "text/plain", b"ok", 0);
                }
            }
        }
        _ => {
            let reason = format!("no route for {}", truncate(path, 200));
            http::write_error(out, 404, &reason, &[]);
        }
    }
    Outcome::Responded
}

/// `GET` of one of the browser pages (the dashboard, the chat room, throng.js).
fn page(req: &Request<'_>, path: &str, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    if !only_get(req, out) {
        return Outcome::Responded;
    }
    match web::serve(path) {
        Some(Ok(served)) => ok(req, ctx, out, served.content_type, &served.body, 0),
        Some(Err(reason)) => {
            http::write_error(out, 500, &reason, &[]);
            Outcome::Responded
        }
        None => {
            http::write_error(out, 404, "no such page", &[]);
            Outcome::Responded
        }
    }
}

/// Answers 405 unless the method is GET; true when the caller should answer.
fn only_get(req: &Request<'_>, out: &mut Vec<u8>) -> bool {
    if req.method == "GET" {
        return true;
    }
    http::write_error(out, 405, "method not allowed: use GET", &[("Allow", "GET")]);
    false
}

/// Writes a 200 answer, keeping the connection open when the client may send more.
/// `body_len`: bytes of request body the request used.
fn ok(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    content_type: &str,
    body: &[u8],
    body_len: usize,
) -> Outcome {
    let keep_alive = ctx.keep_alive(req);
    http::write_response_conn(out, 200, content_type, &[], body, keep_alive);
    if keep_alive {
        Outcome::KeepAlive {
            consumed: ctx.head_len + body_len,
        }
    } else {
        Outcome::Responded
    }
}

fn ok_json(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    value: &serde_json::Value,
    body_len: usize,
) -> Outcome {
    let text = value.to_string();
    ok(req, ctx, out, "application/json", text.as_bytes(), body_len)
}

/// A WebSocket request: echo (`subscribe` is `None`) or a channel subscription.
fn websocket_endpoint(
    req: &Request<'_>,
    subscribe: Option<Subscribe>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    if !req.wants_upgrade() {
        if req.method != "GET" {
            http::write_error(out, 405, "method not allowed: use GET", &[("Allow", "GET")]);
        } else {
            http::write_error(
                out,
                426,
                "this is a WebSocket endpoint: send an Upgrade: websocket request",
                &[("Upgrade", "websocket")],
            );
        }
        return Outcome::Responded;
    }
    match handshake::validate_upgrade(req) {
        Ok(accept) => Outcome::Open(Opening {
            handover: Handover::WebSocket { accept },
            subscribe,
        }),
        Err(err) => {
            counts.handshake_failed(match err {
                HandshakeError::UnsupportedVersion => HandshakeFailure::UnsupportedVersion,
                _ => HandshakeFailure::BadRequest,
            });
            let extra: &[(&str, &str)] = match err {
                HandshakeError::UnsupportedVersion => &[("Sec-WebSocket-Version", "13")],
                HandshakeError::NotGet => &[("Allow", "GET")],
                _ => &[],
            };
            http::write_error(out, err.status(), &err.to_string(), extra);
            Outcome::Responded
        }
    }
}

/// The value of one `key=value` pair of a query string.
fn query_param<'a>(req: &Request<'a>, key: &str) -> Option<&'a str> {
    req.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// A browser page's `Origin` must be one `--allowed-origin` lists (when any is).
fn check_origin(req: &Request<'_>, shared: &Shared) -> Result<(), AuthError> {
    if auth::origin_allowed(&shared.config.allowed_origins, req.header("origin")) {
        Ok(())
    } else {
        Err(AuthError::Origin)
    }
}

/// Who may subscribe to `channel`: a page from an allowed origin and, with
/// `--token-secret`, the holder of a token granting the channel (`?token=` or
/// `Authorization: Bearer`). `Ok(None)`: no tokens are asked for.
fn admit_subscriber(
    req: &Request<'_>,
    channel: &str,
    shared: &Shared,
) -> Result<Option<Grant>, AuthError> {
    check_origin(req, shared)?;
    let Some(verifier) = &shared.verifier else {
        return Ok(None);
    };
    let header = req
        .header("authorization")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let token = query_param(req, "token").or(header).ok_or_else(|| {
        AuthError::Unauthorized("a token is needed: ?token=JWT or Authorization: Bearer JWT".into())
    })?;
    verifier.check(token, channel, auth::now_secs()).map(Some)
}

/// Answers 401 or 403 with the reason, counted as a refused handshake.
fn refuse_auth(out: &mut Vec<u8>, counts: &mut TurnCounts, e: &AuthError) -> Outcome {
    counts.handshake_failed(match e {
        AuthError::Origin => HandshakeFailure::Origin,
        _ => HandshakeFailure::Unauthorized,
    });
    let extra: &[(&str, &str)] = match e {
        AuthError::Unauthorized(_) => &[("WWW-Authenticate", "Bearer")],
        _ => &[],
    };
    http::write_error(out, e.status(), &e.to_string(), extra);
    Outcome::Responded
}

/// Answers 400 with `reason`; `counts`: the request asked for a transport, so it
/// is a failed handshake.
fn refuse(out: &mut Vec<u8>, counts: Option<&mut TurnCounts>, reason: &str) -> Outcome {
    if let Some(counts) = counts {
        counts.handshake_failed(HandshakeFailure::BadRequest);
    }
    http::write_error(out, 400, reason, &[]);
    Outcome::Responded
}

fn subscribe_endpoint(
    req: &Request<'_>,
    channel: &str,
    shared: &Shared,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    // A plain GET of a WebSocket path is no handshake to count.
    let upgrade = req.wants_upgrade();
    if let Err(e) = validate_channel_name(channel) {
        return refuse(out, upgrade.then_some(counts), &e.to_string());
    }
    // A plain GET of it gets 426 below, whoever asks.
    let grant = match upgrade.then(|| admit_subscriber(req, channel, shared)) {
        None | Some(Ok(None)) => None,
        Some(Ok(grant)) => grant,
        Some(Err(e)) => return refuse_auth(out, counts, &e),
    };
    let format = match query_param(req, "format") {
        None | Some("raw") => Format::WsRaw,
        Some("json") => Format::WsJson,
        Some(other) => {
            let reason = format!("format must be raw or json, not '{}'", truncate(other, 40));
            return refuse(out, upgrade.then_some(counts), &reason);
        }
    };
    let resume = match resume_param(req) {
        Ok(resume) => resume,
        Err(reason) => return refuse(out, upgrade.then_some(counts), &reason),
    };
    let name = match (query_param(req, "name"), &grant) {
        (Some(_), Some(_)) => {
            let reason =
                "name= is not taken with --token-secret: a member's name is its token's sub";
            return refuse(out, upgrade.then_some(counts), reason);
        }
        (None, grant) => grant.as_ref().and_then(|g| g.name.clone()),
        (Some(name), None) => match validate_client_name(name) {
            Ok(()) => Some(name.into()),
            Err(e) => return refuse(out, upgrade.then_some(counts), &e.to_string()),
        },
    };
    let subscribe = Subscribe {
        channel: channel.to_string(),
        format,
        resume,
        name,
        expires: grant.map(|g| g.expires),
    };
    websocket_endpoint(req, Some(subscribe), out, counts)
}

/// What an SSE stream and a long-poll check before they open: a GET, a valid
/// channel name, and the origin and token rules. `Err`: the refusal, written and
/// counted.
fn admit_http_subscriber(
    req: &Request<'_>,
    channel: &str,
    shared: &Shared,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Result<Option<Grant>, Outcome> {
    if !only_get(req, out) {
        counts.handshake_failed(HandshakeFailure::BadRequest);
        return Err(Outcome::Responded);
    }
    if let Err(e) = validate_channel_name(channel) {
        return Err(refuse(out, Some(counts), &e.to_string()));
    }
    admit_subscriber(req, channel, shared).map_err(|e| refuse_auth(out, counts, &e))
}

/// `GET /sse/{channel}`: an event stream of the channel. A browser coming back
/// sends `Last-Event-ID`, which wins over a `since=` still in its URL.
fn sse_endpoint(
    req: &Request<'_>,
    channel: &str,
    shared: &Shared,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let grant = match admit_http_subscriber(req, channel, shared, out, counts) {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    let last_event_id = req
        .header("last-event-id")
        .map(|v| std::str::from_utf8(v).ok().and_then(sse::parse_event_id));
    let resume = match last_event_id {
        Some(Some(resume)) => Some(resume),
        Some(None) => {
            let reason =
                "Last-Event-ID must be SEQ or SEQ:EPOCH (16 hex digits), as the server sent it";
            return refuse(out, Some(counts), reason);
        }
        None => match resume_param(req) {
            Ok(resume) => resume,
            Err(reason) => return refuse(out, Some(counts), &reason),
        },
    };
    Outcome::Open(Opening {
        handover: Handover::Sse,
        subscribe: Some(Subscribe {
            channel: channel.to_string(),
            format: Format::Sse,
            resume,
            name: None,
            expires: grant.map(|g| g.expires),
        }),
    })
}

/// Longest a long-poll may wait, in seconds.
const MAX_POLL_TIMEOUT: u64 = 60;
/// How long a long-poll waits when it does not say.
const DEFAULT_POLL_TIMEOUT: u64 = 30;

/// `GET /poll/{channel}?since=SEQ[&epoch=E]&timeout=S`: answered at once if anything
/// is newer than SEQ (0 when absent: everything history holds), else within S
/// seconds (default 30, at most 60).
fn poll_endpoint(
    req: &Request<'_>,
    channel: &str,
    shared: &Shared,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let grant = match admit_http_subscriber(req, channel, shared, out, counts) {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    let timeout = match query_param(req, "timeout") {
        None => DEFAULT_POLL_TIMEOUT,
        Some(v) => match v.parse::<u64>() {
            Ok(s) if s <= MAX_POLL_TIMEOUT => s,
            _ => {
                let reason = format!(
                    "timeout must be whole seconds from 0 to {MAX_POLL_TIMEOUT}, not '{}'",
                    truncate(v, 40)
                );
                return refuse(out, Some(counts), &reason);
            }
        },
    };
    let resume = match resume_param(req) {
        Ok(resume) => resume.unwrap_or(Resume {
            since: 0,
            epoch: None,
        }),
        Err(reason) => return refuse(out, Some(counts), &reason),
    };
    Outcome::Open(Opening {
        handover: Handover::Poll {
            timeout: std::time::Duration::from_secs(timeout),
        },
        subscribe: Some(Subscribe {
            channel: channel.to_string(),
            format: Format::Poll,
            resume: Some(resume),
            name: None,
            expires: grant.map(|g| g.expires),
        }),
    })
}

/// `since=SEQ[&epoch=E]`: where a returning subscriber left off.
fn resume_param(req: &Request<'_>) -> Result<Option<Resume>, String> {
    let since = match query_param(req, "since") {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            format!(
                "since must be a seq (a whole number from 0), not '{}'",
                truncate(v, 40)
            )
        })?),
    };
    let epoch = match query_param(req, "epoch") {
        None => None,
        Some(v) if v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(v, 16).ok()
        }
        Some(v) => {
            return Err(format!(
                "epoch must be 16 hex digits as the server gave it, not '{}'",
                truncate(v, 40)
            ));
        }
    };
    match (since, epoch) {
        (Some(since), epoch) => Ok(Some(Resume { since, epoch })),
        (None, Some(_)) => Err("epoch goes with since=SEQ".into()),
        (None, None) => Ok(None),
    }
}

/// Compares secrets in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks the publish API's access rule; writes the refusal if there is one.
fn authorized(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> bool {
    match &ctx.shared.config.api_key {
        Some(key) => {
            let given = req
                .header("authorization")
                .and_then(|v| v.strip_prefix(b"Bearer "))
                .map(<[u8]>::trim_ascii);
            match given {
                Some(given) if constant_time_eq(given, key.as_bytes()) => true,
                _ => {
                    http::write_error(
                        out,
                        401,
                        "missing or wrong API key: send Authorization: Bearer KEY",
                        &[("WWW-Authenticate", "Bearer")],
                    );
                    false
                }
            }
        }
        None if ctx.peer.is_loopback() => true,
        None => {
            http::write_error(
                out,
                403,
                "publishing without --api-key is allowed from loopback peers only",
                &[],
            );
            false
        }
    }
}

fn publish(
    req: &Request<'_>,
    channel: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    if req.method != "POST" {
        http::write_error(
            out,
            405,
            "method not allowed: use POST",
            &[("Allow", "POST")],
        );
        return Outcome::Responded;
    }
    if !authorized(req, ctx, out) {
        return Outcome::Responded;
    }
    if let Err(e) = validate_channel_name(channel) {
        http::write_error(out, 400, &e.to_string(), &[]);
        return Outcome::Responded;
    }
    if is_reserved(channel) {
        let reason = "the throng: namespace is the server's own (the dashboard's feed): nobody publishes to it";
        http::write_error(out, 403, reason, &[]);
        return Outcome::Responded;
    }
    if req.header("transfer-encoding").is_some() {
        http::write_error(out, 411, "send the body with Content-Length", &[]);
        return Outcome::Responded;
    }
    let length = match req.header("content-length") {
        None => 0,
        Some(v) => match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
        {
            Some(n) => n,
            None => {
                http::write_error(out, 400, "Content-Length is not a number", &[]);
                return Outcome::Responded;
            }
        },
    };
    let max = ctx.shared.config.max_message_size;
    if length > max {
        let reason = format!("message is {length} bytes; --max-message-size is {max}");
        http::write_error(out, 413, &reason, &[]);
        return Outcome::Responded;
    }
    if ctx.body.len() < length {
        return Outcome::NeedBody;
    }
    let body = &ctx.body[..length];
    let is_text = req
        .header("content-type")
        .is_some_and(|v| v.len() >= 5 && v[..5].eq_ignore_ascii_case(b"text/"));
    let kind = if is_text {
        if std::str::from_utf8(body).is_err() {
            http::write_error(out, 400, "text/* body is not valid UTF-8", &[]);
            return Outcome::Responded;
        }
        DataKind::Text
    } else {
        DataKind::Binary
    };
    let message = Outgoing {
        payload: body,
        kind,
        from: None,
    };
    match ctx.shared.broker.publish(channel, message) {
        Ok(seq) => {
            counts.published += 1;
            // `{"seq":N}` without a JSON value: this answer is on every publish's path.
            const OPEN: &[u8] = b"{\"seq\":";
            let mut number = itoa::Buffer::new();
            let digits = number.format(seq).as_bytes();
            // 7 + at most 20 digits + 1.
            let mut body = [0u8; 28];
            let len = OPEN.len() + digits.len() + 1;
            body[..OPEN.len()].copy_from_slice(OPEN);
            body[OPEN.len()..len - 1].copy_from_slice(digits);
            body[len - 1] = b'}';
            ok(req, ctx, out, "application/json", &body[..len], length)
        }
        Err(e) => {
            http::write_error(out, 503, &e.to_string(), &[("Retry-After", "1")]);
            Outcome::Responded
        }
    }
}

fn channel_info(
    req: &Request<'_>,
    channel: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
) -> Outcome {
    if let Err(e) = validate_channel_name(channel) {
        http::write_error(out, 400, &e.to_string(), &[]);
        return Outcome::Responded;
    }
    if !ctx.shared.broker.healthy() {
        // Without the broker the channel's place is unknown; zeros would mislead
        // a client that resumes from them (throng.js's `since: "now"`).
        http::write_error(
            out,
            503,
            "broker unavailable, retry later",
            &[("Retry-After", "1")],
        );
        return Outcome::Responded;
    }
    let info = ctx.shared.broker.channel_info(channel);
    let value = serde_json::json!({
        "channel": channel,
        "subscribers": info.subscribers,
        "last_seq": info.last_seq,
        "history_len": info.history_len,
        "epoch": info.epoch.map(|e| format!("{e:016x}")),
    });
    ok_json(req, ctx, out, &value, 0)
}

fn stats(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    let snap = ctx.shared.stats.snapshot();
    let uptime = ctx.shared.stats.started.elapsed().as_secs_f64();
    ok_json(
        req,
        ctx,
        out,
        &serde_json::json!({
            "connections": {
                "websocket": snap.websockets(),
                "sse": snap.sse,
                "poll": snap.poll,
            },
            // Busy connections whose bytes come through io_uring (--io-uring).
            "io_uring_receivers": snap.ring_receivers,
            "channels": ctx.shared.broker.channel_count(),
            "frames_in": snap.frames_in,
            "messages_in": snap.messages_in,
            "messages_out": snap.messages_out,
            "accepted": snap.accepted,
            // How long this process's event loops take per turn: a slow turn is a
            // late answer for every connection of its loop.
            "loop_turns": {
                "count": snap.turns.iter().sum::<u64>(),
                "over_100ms": snap.turns[TURN_OVER_100MS..].iter().sum::<u64>(),
                "over_1s": snap.turns[TURN_OVER_1S..].iter().sum::<u64>(),
                "slowest_ms": snap.slowest_turn_ns as f64 / 1e6,
            },
            "uptime_seconds": uptime,
            "broker": ctx.shared.broker.describe(),
            "broker_healthy": ctx.shared.broker.healthy(),
            // Which process answered (with --workers, each counts its own).
            "pid": std::process::id(),
        }),
        0,
    )
}

/// `GET /metrics`: every loop's counters summed, the broker's channel count and
/// health, and the process figures, in the Prometheus text format. Nothing here
/// looks at a connection.
fn prometheus(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    let shared = ctx.shared;
    let scrape = metrics::Scrape {
        snapshot: shared.stats.snapshot(),
        channels: shared.broker.channel_count() as u64,
        broker_up: shared.broker.healthy(),
        uptime: shared.stats.started.elapsed(),
        process: metrics::Process::read(),
    };
    let body = metrics::render(&scrape);
    ok(req, ctx, out, metrics::CONTENT_TYPE, body.as_bytes(), 0)
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
    use crate::protocol::http::parse_request;
    use crate::server::tests_support::test_shared;

    fn answer_from(raw: &str, peer: IpAddr, shared: &Shared) -> (Outcome, String) {
        let bytes = raw.as_bytes();
        let (req, head) = parse_request(bytes).unwrap().unwrap();
        let mut out = Vec::new();
        let ctx = RouteContext {
            shared,
            peer,
            body: &bytes[head..],
            head_len: head,
        };
        let outcome = route(&req, ctx, &mut out, &mut TurnCounts::default());
        (outcome, String::from_utf8(out).unwrap())
    }

    fn answer(raw: &str) -> (Outcome, String) {
        let (shared, _polls) = test_shared(None);
        answer_from(raw, [127, 0, 0, 1].into(), &shared)
    }

    #[test]
    fn plain_requests_get_the_documented_statuses() {
        let (_, r) = answer("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("ok"));
        let (_, r) = answer("POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405"));
        let (_, r) = answer("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("no route for /nope"));
        let (_, r) = answer("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 426") && r.contains("Upgrade: websocket"));
        let (_, r) = answer("GET /ws/news HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 426"));
        let (_, r) = answer("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("text/html"));
        let (_, r) = answer("GET /throng.js HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("text/javascript"));
        let (_, r) = answer("POST /chat HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405"));
    }

    const UPGRADE: &str = "HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn upgrades_route_to_echo_and_channels() {
        let (outcome, out) = answer(&format!("GET /echo?x=1 {UPGRADE}"));
        assert!(matches!(
            outcome,
            Outcome::Open(Opening {
                handover: Handover::WebSocket { .. },
                subscribe: None,
            })
        ));
        assert!(out.is_empty());
        let (outcome, _) = answer(&format!("GET /ws/chat:lobby?format=json {UPGRADE}"));
        match outcome {
            Outcome::Open(Opening {
                subscribe: Some(sub),
                ..
            }) => {
                assert_eq!(sub.channel, "chat:lobby");
                assert_eq!(sub.format, Format::WsJson);
                assert_eq!(sub.resume, None);
            }
            other => panic!("{other:?}"),
        }
        let (_, out) = answer(&format!(
            "GET /echo {}",
            UPGRADE.replace("Version: 13", "Version: 7")
        ));
        assert!(out.starts_with("HTTP/1.1 426") && out.contains("Sec-WebSocket-Version: 13"));
    }

    #[test]
    fn bad_channel_names_and_formats_get_400_with_the_reason() {
        let (_, out) = answer(&format!("GET /ws/a%20b {UPGRADE}"));
        assert!(out.starts_with("HTTP/1.1 400") && out.contains("channel name has '%'"));
        let long = "a".repeat(129);
        let (_, out) = answer(&format!("GET /ws/{long} {UPGRADE}"));
        assert!(out.starts_with("HTTP/1.1 400") && out.contains("longer than 128"));
        let (_, out) = answer(&format!("GET /ws/ {UPGRADE}"));
        assert!(out.starts_with("HTTP/1.1 400") && out.contains("empty"));
        let (_, out) = answer(&format!("GET /ws/x?format=xml {UPGRADE}"));
        assert!(out.starts_with("HTTP/1.1 400") && out.contains("format must be raw or json"));
        let (_, out) = answer("POST /api/publish/a*b HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 400"));
    }

    #[test]
    fn since_and_epoch_are_checked() {
        let (outcome, _) = answer(&format!(
            "GET /ws/news?since=7&epoch=00000000000000ff {UPGRADE}"
        ));
        match outcome {
            Outcome::Open(Opening {
                subscribe: Some(sub),
                ..
            }) => assert_eq!(
                sub.resume,
                Some(Resume {
                    since: 7,
                    epoch: Some(255)
                })
            ),
            other => panic!("{other:?}"),
        }
        for (query, reason) in [
            ("since=abc", "since must be a seq"),
            ("since=-1", "since must be a seq"),
            ("since=", "since must be a seq"),
            ("since=1&epoch=xyz", "epoch must be 16 hex digits"),
            ("since=1&epoch=123", "epoch must be 16 hex digits"),
            ("epoch=00000000000000ff", "epoch goes with since"),
        ] {
            let (_, out) = answer(&format!("GET /ws/news?{query} {UPGRADE}"));
            assert!(
                out.starts_with("HTTP/1.1 400") && out.contains(reason),
                "{query}: {out}"
            );
        }
    }

    #[test]
    fn publish_assigns_seq_and_waits_for_the_whole_body() {
        let (shared, _polls) = test_shared(None);
        let local: IpAddr = [127, 0, 0, 1].into();
        let partial = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhel";
        let (outcome, _) = answer_from(partial, local, &shared);
        assert!(matches!(outcome, Outcome::NeedBody));
        let whole = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
        let (_, out) = answer_from(whole, local, &shared);
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with(r#"{"seq":1}"#),
            "{out}"
        );
        let (_, out) = answer_from(whole, local, &shared);
        assert!(out.ends_with(r#"{"seq":2}"#));
        let (_, out) = answer_from(
            "GET /api/channels/news HTTP/1.1\r\nHost: x\r\n\r\n",
            local,
            &shared,
        );
        assert!(out.contains(r#""last_seq":2"#) && out.contains(r#""subscribers":0"#));
    }

    #[test]
    fn publish_limits_and_access_rules() {
        let (shared, _polls) = test_shared(None);
        let remote: IpAddr = [192, 0, 2, 7].into();
        let local: IpAddr = [127, 0, 0, 1].into();
        let req = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
        let (_, out) = answer_from(req, remote, &shared);
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("loopback"),
            "{out}"
        );
        let (_, out) = answer_from(req, local, &shared);
        assert!(out.starts_with("HTTP/1.1 200"));
        let big = format!(
            "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            shared.config.max_message_size + 1
        );
        let (_, out) = answer_from(&big, local, &shared);
        assert!(out.starts_with("HTTP/1.1 413"));

        let (keyed, _polls) = test_shared(Some("s3cret"));
        let (_, out) = answer_from(req, remote, &keyed);
        assert!(out.starts_with("HTTP/1.1 401"));
        let wrong = req.replace("Host: x", "Host: x\r\nAuthorization: Bearer nope");
        let (_, out) = answer_from(&wrong, local, &keyed);
        assert!(out.starts_with("HTTP/1.1 401"));
        let right = req.replace("Host: x", "Host: x\r\nAuthorization: Bearer s3cret");
        let (_, out) = answer_from(&right, remote, &keyed);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        let (_, out) = answer_from(
            "GET /api/publish/news HTTP/1.1\r\nHost: x\r\n\r\n",
            local,
            &shared,
        );
        assert!(out.starts_with("HTTP/1.1 405"));
    }

    #[test]
    fn successful_api_answers_keep_http11_connections_open() {
        let (shared, _polls) = test_shared(None);
        let local: IpAddr = [127, 0, 0, 1].into();
        let req =
            "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /next";
        let (outcome, out) = answer_from(req, local, &shared);
        assert!(out.contains("Connection: keep-alive"), "{out}");
        match outcome {
            Outcome::KeepAlive { consumed } => assert_eq!(&req[consumed..], "GET /next"),
            other => panic!("{other:?}"),
        }
        let close = "GET /api/channels/news HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let (outcome, out) = answer_from(close, local, &shared);
        assert!(matches!(outcome, Outcome::Responded) && out.contains("Connection: close"));
        let old = "GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n";
        assert!(matches!(
            answer_from(old, local, &shared).0,
            Outcome::Responded
        ));
        // Errors always close.
        let (outcome, _) = answer_from("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", local, &shared);
        assert!(matches!(outcome, Outcome::Responded));
    }

    /// The reasons counted while routing `raw` (from loopback).
    fn failures_of(raw: &str) -> Vec<&'static str> {
        let (shared, _polls) = test_shared(None);
        let bytes = raw.as_bytes();
        let (req, head) = parse_request(bytes).unwrap().unwrap();
        let ctx = RouteContext {
            shared: &shared,
            peer: [127, 0, 0, 1].into(),
            body: &bytes[head..],
            head_len: head,
        };
        let mut counts = TurnCounts::default();
        route(&req, ctx, &mut Vec::new(), &mut counts);
        HandshakeFailure::ALL
            .into_iter()
            .filter(|&why| counts.handshake_failures[why as usize] > 0)
            .map(HandshakeFailure::as_str)
            .collect()
    }

    #[test]
    fn refused_transport_requests_are_counted_by_reason() {
        let v8 = UPGRADE.replace("Version: 13", "Version: 8");
        let no_key = UPGRADE.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "");
        for (raw, want) in [
            (format!("GET /echo {v8}"), vec!["unsupported_version"]),
            (format!("GET /ws/news {no_key}"), vec!["bad_request"]),
            (format!("GET /ws/a%20b {UPGRADE}"), vec!["bad_request"]),
            (format!("GET /ws/x?since=no {UPGRADE}"), vec!["bad_request"]),
            (
                "GET /sse/a*b HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                vec!["bad_request"],
            ),
            (
                "POST /sse/a HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                vec!["bad_request"],
            ),
            (
                "GET /poll/a?timeout=99 HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                vec!["bad_request"],
            ),
            // Not handshakes: a good one, plain GETs, the API.
            (format!("GET /ws/news {UPGRADE}"), vec![]),
            ("GET /ws/a%20b HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
            ("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
            ("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
            (
                "POST /api/publish/a*b HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                vec![],
            ),
        ] {
            assert_eq!(failures_of(&raw), want, "{raw}");
        }
    }

    #[test]
    fn metrics_are_prometheus_text_and_kept_alive() {
        let (outcome, out) = answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(
            out.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{out}"
        );
        assert!(matches!(outcome, Outcome::KeepAlive { .. }));
        let body = &out[out.find("\r\n\r\n").unwrap() + 4..];
        assert!(body.contains("\nthrong_broker_up 1\n"), "{body}");
        assert!(body.contains("\nthrong_channels 0\n"), "{body}");
        let (_, out) = answer("POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 405"));
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
