//! What each request path does: the transports' endpoints (WebSocket, SSE,
//! long-poll: [`subscribe`] opens them through the transport table), the HTTP API
//! ([`api`]: publish, channel info, stats, Prometheus metrics), health, the browser
//! pages, and the JSON errors for everything else.
//!
//! It owns the URL space and the API's access rules. It must not do socket I/O or
//! hold connection state: it reads a parsed request (and its body, once complete)
//! and either writes a whole response into `out` or says which transport to open;
//! the event loop applies admission limits and does the writing.

mod api;
mod pusher_api;
mod subscribe;

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use super::shared::Shared;
use crate::auth::{self, AuthError};
use crate::broker::asked::{self, Ticket};
use crate::protocol::http::{self, Request};
use crate::site;
use crate::stats::{HandshakeFailure, TurnCounts};
use crate::transport::Opening;
use crate::transport::request::truncate;
use crate::web;

/// What the router decided.
#[derive(Debug)]
pub enum Outcome {
    /// A complete response is in `out`; close after sending it.
    Responded,
    /// Hand the connection to a transport (a WebSocket upgrade, an event stream, a
    /// long-poll).
    Open(Opening),
    /// The request announced a body that has not fully arrived: read more.
    NeedBody,
    /// A complete response is in `out` and the connection stays open (HTTP/1.1
    /// keep-alive); the request took the first `consumed` bytes of the input.
    KeepAlive { consumed: usize },
    /// The request was handed to the broker (a publish through Redis): its
    /// answer is written by [`answer`] once the broker's comes.
    Wait(Awaited),
}

/// A request whose answer waits on the broker: what that answer needs once
/// the broker's comes (the request's bytes are gone by then).
#[derive(Debug)]
pub struct Awaited {
    answer: AwaitedAnswer,
    keep_alive: bool,
    /// Bytes of the connection's input the request took (its head and body).
    pub consumed: usize,
    /// The connection's request it answers (its [`Ticket`]'s serial).
    pub serial: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum AwaitedAnswer {
    /// `POST /api/publish/{channel}`: `{"seq":N}`.
    Publish,
    /// Pusher's `POST /apps/ID/events` (`{}`), or `batch_events` of this many
    /// events (`{"batch":[{}, …]}`).
    PusherEvents { batch: Option<usize> },
}

impl Awaited {
    /// Whether the connection stays open after the answer (then the client's
    /// next request is served).
    pub fn keeps_alive(&self) -> bool {
        self.keep_alive
    }

    /// The connection closes after the answer (the server began to drain while
    /// the request waited).
    pub fn close_after(&mut self) {
        self.keep_alive = false;
    }
}

/// Writes the answer to an awaited request from the broker's `outcome`;
/// whether the connection stays open for the next request.
pub fn answer(
    awaited: &Awaited,
    outcome: asked::Outcome,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> bool {
    let written = match awaited.answer {
        AwaitedAnswer::Publish => api::answer_publish(outcome, awaited.keep_alive, out, counts),
        AwaitedAnswer::PusherEvents { batch } => {
            pusher_api::answer_events(outcome, batch, awaited.keep_alive, out, counts)
        }
    };
    written && awaited.keep_alive
}

/// What the router needs to know about the request's connection and the server.
#[derive(Clone, Copy)]
pub struct RouteContext<'a> {
    pub shared: &'a Shared,
    /// Who the broker answers when a request is handed to it.
    pub ticket: Ticket,
    /// The client's address (behind a trusted proxy, the one it forwards for).
    pub peer: IpAddr,
    /// The request comes from this machine: a loopback peer, not forwarded.
    pub local: bool,
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
    let root_page = path == "/" && !req.wants_upgrade();
    let endpoint = subscribe::endpoint(path).filter(|_| !root_page);
    if endpoint.is_some() && ctx.shared.shutdown.load(Ordering::Relaxed) {
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
    // The one place the site rules are kept, for transports and the API alike.
    if let Err(refusal) = site_allowed(req, ctx) {
        if endpoint.is_some() {
            counts.handshake_failed(match refusal {
                AuthError::Origin => HandshakeFailure::Origin,
                _ => HandshakeFailure::BadRequest,
            });
        }
        http::write_error(out, refusal.status(), &refusal.to_string(), &[]);
        return Outcome::Responded;
    }
    if root_page {
        return page(req, path, ctx, out);
    }
    if let Some((endpoint, rest)) = endpoint {
        return subscribe::open(req, endpoint, rest, ctx.shared, out, counts);
    }
    if web::is_page(path) {
        return page(req, path, ctx, out);
    }
    if let Some(rest) = path.strip_prefix("/apps/") {
        return pusher_api::route(req, rest, ctx, out, counts);
    }
    if path.starts_with("/users/") && path.ends_with("/terminate_connections") {
        return pusher_api::route_users(req, path, ctx, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/api/publish/") {
        return api::publish(req, channel, ctx, out, counts);
    }
    if let Some(channel) = path.strip_prefix("/api/channels/") {
        if only_get(req, out) {
            return api::channel_info(req, channel, ctx, out);
        }
        return Outcome::Responded;
    }
    match path {
        "/api/stats" => {
            if only_get(req, out) {
                return api::stats(req, ctx, out);
            }
        }
        "/api/stats/history" => {
            if only_get(req, out) {
                return ok_json(req, ctx, out, &ctx.shared.feed.history_json(), 0);
            }
        }
        "/metrics" => {
            if only_get(req, out) {
                return api::prometheus(req, ctx, out);
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

/// The site rules every endpoint keeps: an `Origin` `--allowed-origin` does not
/// list is refused (publishes included, not only transports), and so is a `Host`
/// the server must not answer to ([`site::host_allowed`]).
fn site_allowed(req: &Request<'_>, ctx: RouteContext<'_>) -> Result<(), AuthError> {
    let config = &ctx.shared.config;
    if !auth::origin_allowed(&config.allowed_origins, req.header("origin")) {
        return Err(AuthError::Origin);
    }
    let browser = req.header("sec-fetch-site").is_some();
    site::host_allowed(
        &config.allowed_hosts,
        req.header("host"),
        browser,
        ctx.local,
    )
    .map_err(|e| AuthError::Forbidden(e.to_string()))
}

/// `GET` of one of the browser pages (the dashboard, the chat room, throng.js).
fn page(req: &Request<'_>, path: &str, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    if !only_get(req, out) {
        return Outcome::Responded;
    }
    match web::serve(path) {
        Some(Ok(served)) => {
            // What every page adds: it runs only its own scripts, and is framed by
            // no other site.
            let policy = served.content_security_policy();
            let headers = [
                ("Content-Security-Policy", policy.as_str()),
                ("X-Frame-Options", "DENY"),
            ];
            ok_with(
                req,
                ctx,
                out,
                served.content_type,
                &headers,
                &served.body,
                0,
            )
        }
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

/// Writes an error answer (a JSON reason; the connection closes after it): the
/// step every refusal of the API routes ends in.
pub(super) fn refused(
    out: &mut Vec<u8>,
    status: u16,
    reason: &str,
    headers: &[(&str, &str)],
) -> Outcome {
    http::write_error(out, status, reason, headers);
    Outcome::Responded
}

/// Answers 405 unless the method is GET; true when the caller should answer.
pub(super) fn only_get(req: &Request<'_>, out: &mut Vec<u8>) -> bool {
    if req.method == "GET" {
        return true;
    }
    http::write_error(out, 405, "method not allowed: use GET", &[("Allow", "GET")]);
    false
}

/// What a route that hands its publishes to the broker returns: the answer at
/// once (written by `write` from the outcome, `consumed` bytes taken), or the
/// wait for it.
pub(super) fn hand_over(
    asked: asked::Asked,
    ctx: RouteContext<'_>,
    req: &Request<'_>,
    consumed: usize,
    kind: AwaitedAnswer,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let awaited = Awaited {
        answer: kind,
        keep_alive: ctx.keep_alive(req),
        consumed,
        serial: ctx.ticket.serial,
    };
    match asked {
        asked::Asked::Later => Outcome::Wait(awaited),
        asked::Asked::Now(outcome) => {
            if answer(&awaited, outcome, out, counts) {
                Outcome::KeepAlive { consumed }
            } else {
                Outcome::Responded
            }
        }
    }
}

/// Writes a 200 answer, keeping the connection open when the client may send more.
/// `body_len`: bytes of request body the request used.
pub(super) fn ok(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    content_type: &str,
    body: &[u8],
    body_len: usize,
) -> Outcome {
    ok_with(req, ctx, out, content_type, &[], body, body_len)
}

/// [`ok`] with more headers.
pub(super) fn ok_with(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    body_len: usize,
) -> Outcome {
    let keep_alive = ctx.keep_alive(req);
    http::write_response_conn(out, 200, content_type, headers, body, keep_alive);
    if keep_alive {
        Outcome::KeepAlive {
            consumed: ctx.head_len + body_len,
        }
    } else {
        Outcome::Responded
    }
}

/// Why a request's body is not there to read.
#[derive(Debug, Clone, Copy)]
pub(super) enum NoBody {
    /// A refusal is written.
    Refused,
    /// More of it is to come.
    Incomplete,
}

impl From<NoBody> for Outcome {
    fn from(no: NoBody) -> Outcome {
        match no {
            NoBody::Refused => Outcome::Responded,
            NoBody::Incomplete => Outcome::NeedBody,
        }
    }
}

/// The request's body once it has all arrived (`Content-Length` bytes, at most
/// `max`); otherwise a refusal written to `out`, or more to read.
pub(super) fn request_body<'a>(
    req: &Request<'_>,
    ctx: RouteContext<'a>,
    out: &mut Vec<u8>,
    max: usize,
) -> Result<&'a [u8], NoBody> {
    // The head's framing is checked where it is parsed: one Content-Length of
    // digits, no Transfer-Encoding.
    let length = req.content_length;
    if length > max {
        let reason = format!("the body is {length} bytes; at most {max} are taken here");
        http::write_error(out, 413, &reason, &[]);
        return Err(NoBody::Refused);
    }
    if ctx.body.len() < length {
        return Err(NoBody::Incomplete);
    }
    Ok(&ctx.body[..length])
}

pub(super) fn ok_json(
    req: &Request<'_>,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    value: &serde_json::Value,
    body_len: usize,
) -> Outcome {
    let text = value.to_string();
    ok(req, ctx, out, "application/json", text.as_bytes(), body_len)
}

#[cfg(test)]
mod tests;
