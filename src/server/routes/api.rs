//! The HTTP API: `POST /api/publish/{channel}` (with its access rule),
//! `GET /api/channels/{channel}`, `GET /api/stats` and `GET /metrics`. It must not
//! open transports or touch connections: it reads the request and the shared
//! state, and writes one whole answer (a publish handed to the broker, once the
//! broker's answer comes).

use super::subscribe::pusher_only;
use super::{AwaitedAnswer, Outcome, RouteContext, hand_over, ok, ok_json, refused, request_body};
use crate::broker::Outgoing;
use crate::broker::asked::{self, Ask, Publish};
use crate::broker::idempotency::{self, Published};
use crate::metrics;
use crate::protocol::DataKind;
use crate::protocol::http::{self, Request};
use crate::rules::{is_reserved, validate_channel_name, validate_event_name};
use crate::stats::{TURN_OVER_1S, TURN_OVER_100MS, TurnCounts};
use crate::transport::request::query_param;

/// Compares secrets in time that does not depend on where they differ.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a request may not publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Denied {
    /// `--api-key` is set and the request does not carry it.
    Key,
    /// No key is set, the request is local, but a browser page of another site
    /// sent it.
    ForeignPage,
    /// No key is set and the request is not local (or came through a proxy).
    Remote,
}

/// The publish API's access rule: the key when one is set, else a local request
/// that no foreign page sent.
fn publisher(req: &Request<'_>, ctx: RouteContext<'_>) -> Result<(), Denied> {
    match &ctx.shared.config.api_key {
        Some(key) => {
            let given = req
                .header("authorization")
                .and_then(|v| v.strip_prefix(b"Bearer "))
                .map(<[u8]>::trim_ascii);
            match given {
                Some(given) if constant_time_eq(given, key.as_bytes()) => Ok(()),
                _ => Err(Denied::Key),
            }
        }
        // A page in a browser on this machine is local too: only the server's own
        // pages (or an --allowed-origin one) publish without a key.
        None if ctx.local && own_site(req, ctx) => Ok(()),
        None if ctx.local => Err(Denied::ForeignPage),
        None => Err(Denied::Remote),
    }
}

/// Checks the publish API's access rule; writes the refusal if there is one.
fn authorized(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> bool {
    let (status, reason, headers): (u16, &str, &[(&str, &str)]) = match publisher(req, ctx) {
        Ok(()) => return true,
        Err(Denied::Key) => (
            401,
            "missing or wrong API key: send Authorization: Bearer KEY",
            &[("WWW-Authenticate", "Bearer")],
        ),
        Err(Denied::ForeignPage) => (
            403,
            "a browser page of another site may not publish without --api-key",
            &[],
        ),
        Err(Denied::Remote) => (
            403,
            "publishing without --api-key is allowed from loopback peers only (and never through a proxy)",
            &[],
        ),
    };
    http::write_error(out, status, reason, headers);
    false
}

/// Whether a request with no key comes from no browser page, or from one of the
/// server's own pages (or a listed `--allowed-origin`).
fn own_site(req: &Request<'_>, ctx: RouteContext<'_>) -> bool {
    match req.header("origin") {
        None => req
            .header("sec-fetch-site")
            .is_none_or(|site| site == b"same-origin" || site == b"none"),
        Some(origin) => {
            crate::site::same_site(origin, req.header("host"))
                || crate::auth::origin_listed(&ctx.shared.config.allowed_origins, origin)
        }
    }
}

pub(super) fn publish(
    req: &Request<'_>,
    channel: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    if req.method != "POST" {
        return refused(
            out,
            405,
            "method not allowed: use POST",
            &[("Allow", "POST")],
        );
    }
    if !authorized(req, ctx, out) {
        return Outcome::Responded;
    }
    if let Err(e) = validate_channel_name(channel) {
        return refused(out, 400, &e.to_string(), &[]);
    }
    if is_reserved(channel) {
        let reason = "the throng: namespace is the server's own (the dashboard's feed): nobody publishes to it";
        return refused(out, 403, reason, &[]);
    }
    let body = match request_body(req, ctx, out, ctx.shared.config.max_message_size) {
        Ok(body) => body,
        Err(no) => return no.into(),
    };
    let length = body.len();
    let is_text = req
        .header("content-type")
        .is_some_and(|v| v.len() >= 5 && v[..5].eq_ignore_ascii_case(b"text/"));
    let kind = if is_text {
        if std::str::from_utf8(body).is_err() {
            return refused(out, 400, "text/* body is not valid UTF-8", &[]);
        }
        DataKind::Text
    } else {
        DataKind::Binary
    };
    let idempotency_key = match req
        .header("idempotency-key")
        .map(|key| idempotency::validate_key(key.trim_ascii()))
    {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(e)) => {
            return refused(out, 400, &format!("Idempotency-Key: {e}"), &[]);
        }
    };
    let event = query_param(req, "event");
    if let Some(Err(e)) = event.map(validate_event_name) {
        return refused(out, 400, &e.to_string(), &[]);
    }
    let message = Outgoing {
        payload: body,
        kind,
        from: None,
        event,
        skip: None,
    };
    let consumed = ctx.head_len + length;
    let broker = &ctx.shared.broker;
    if broker.answers_later() {
        let publishes = vec![Publish::new(channel, message, idempotency_key)];
        let ask = broker.ask(Ask::new(publishes, ctx.ticket));
        return hand_over(ask, ctx, req, consumed, AwaitedAnswer::Publish, out, counts);
    }
    // A broker that answers at once is asked on this thread, without copies.
    let published = match idempotency_key {
        Some(key) => broker.publish_once(channel, message, key),
        None => broker.publish(channel, message).map(|seq| Published {
            seq,
            replayed: false,
        }),
    };
    let keep_alive = ctx.keep_alive(req);
    if answer_publish(published.map(|p| vec![p]), keep_alive, out, counts) && keep_alive {
        Outcome::KeepAlive { consumed }
    } else {
        Outcome::Responded
    }
}

/// Writes a publish's answer: `{"seq":N}` (with `Idempotent-Replayed: true` for
/// a key seen before), or 503 with why; whether it was a success.
pub(super) fn answer_publish(
    outcome: asked::Outcome,
    keep_alive: bool,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> bool {
    let published = match outcome {
        Ok(published) => published.first().copied(),
        Err(e) => {
            http::write_error(out, 503, &e.to_string(), &[("Retry-After", "1")]);
            return false;
        }
    };
    let Some(Published { seq, replayed }) = published else {
        http::write_error(out, 500, "the broker answered no publish", &[]);
        return false;
    };
    if !replayed {
        counts.published += 1;
    }
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
    let replayed: &[(&str, &str)] = if replayed {
        &[("Idempotent-Replayed", "true")]
    } else {
        &[]
    };
    http::write_response_conn(
        out,
        200,
        "application/json",
        replayed,
        &body[..len],
        keep_alive,
    );
    true
}

pub(super) fn channel_info(
    req: &Request<'_>,
    channel: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
) -> Outcome {
    if let Err(e) = validate_channel_name(channel) {
        return refused(out, 400, &e.to_string(), &[]);
    }
    // What an app's private channels hold is the Pusher API's to tell, signed
    // (`/apps/ID/channels/NAME`), or this API's to a publisher (the app's server
    // publishes here too), never to anyone.
    if let Some((app, kind)) = crate::pusher::app_channel(&ctx.shared.config.pusher_apps, channel)
        && kind != crate::pusher::ChannelKind::Public
        && publisher(req, ctx).is_err()
    {
        let reason = format!(
            "{}; its numbers are told to a publisher only (the API key, or from this machine)",
            pusher_only(channel, &app.id, kind)
        );
        return refused(out, 403, &reason, &[]);
    }
    if !ctx.shared.broker.healthy() {
        // Without the broker the channel's place is unknown; zeros would mislead
        // a client that resumes from them (throng.js's `since: "now"`).
        return refused(
            out,
            503,
            "broker unavailable, retry later",
            &[("Retry-After", "1")],
        );
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

pub(super) fn stats(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    let snap = ctx.shared.stats.snapshot();
    let uptime = ctx.shared.stats.started.elapsed().as_secs_f64();
    ok_json(
        req,
        ctx,
        out,
        &serde_json::json!({
            "connections": crate::transport::Kind::json(&snap.open),
            // Busy connections whose bytes come through io_uring (--io-uring).
            "io_uring_receivers": snap.ring_receivers,
            "io_uring_sends": snap.ring_sends,
            "io_uring_send_calls": snap.ring_send_calls,
            "channels": ctx.shared.broker.channel_count(),
            // History bytes held across channels (null: kept in Redis).
            "history_bytes": ctx.shared.broker.history_bytes(),
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
            // Pusher webhook events by outcome (null: no app has webhooks).
            "pusher_webhooks": ctx.shared.webhooks.as_ref().map(|h| h.counts().tally()),
            // Which process answered (with --workers, each counts its own).
            "pid": std::process::id(),
        }),
        0,
    )
}

/// `GET /metrics`: every loop's counters summed, the broker's channel count and
/// health, and the process figures, in the Prometheus text format. Nothing here
/// looks at a connection.
pub(super) fn prometheus(req: &Request<'_>, ctx: RouteContext<'_>, out: &mut Vec<u8>) -> Outcome {
    let shared = ctx.shared;
    let scrape = metrics::Scrape {
        snapshot: shared.stats.snapshot(),
        channels: shared.broker.channel_count() as u64,
        history_bytes: shared.broker.history_bytes(),
        broker_up: shared.broker.healthy(),
        uptime: shared.stats.started.elapsed(),
        process: metrics::Process::read(),
        webhooks: shared.webhooks.as_ref().map(|h| h.counts().tally()),
        failover: shared.broker.failover_counts(),
    };
    let body = metrics::render(&scrape);
    ok(req, ctx, out, metrics::CONTENT_TYPE, body.as_bytes(), 0)
}
