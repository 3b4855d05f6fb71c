//! WebSocket as a transport: the raw and json encodings of hub messages, what an open
//! WebSocket keeps between reads, and how its input is answered (echo, chat publish,
//! refusal, pongs, the close handshake), how it heartbeats (pings) and closes.
//!
//! Framing itself is `protocol`'s; what a client's message means is `rules`'. This
//! module turns both into bytes in the caller's output buffer. It must not own the
//! socket, keep time, or decide routes.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::replay::ReplayFeed;
use super::request::{Endpoint, Gate, Path, Refused, query_param, resume_param, truncate};
use super::{
    After, CloseReason, Compression, Ctx, Deflater, Format, Handover, Opening, Subscribe,
    Subscription, Transport, json_data,
};
use crate::broker::asked::{Ask, Asked, Asker, Publish, Ticket};
use crate::broker::{GapReason, Outgoing, Replay, Resume, Stored};
use crate::history::Tags;
use crate::hub::{Body, Message};
use crate::protocol::deflate::{self, Agreement};
use crate::protocol::handshake;
use crate::protocol::http::Request;
use crate::protocol::{
    DataKind, Decoder, Event, Flow, close_code, encode_close, encode_compressed_header,
    encode_frame, encode_header, opcode,
};
use crate::rules::{self, Action, Role, validate_channel_name, validate_client_name};
use crate::stats::TurnCounts;

/// An open WebSocket: a decoder only while a frame or message is half received,
/// and the channel it subscribes to, if any. With permessage-deflate nothing more
/// is kept (the window negotiated is the connection's, `Ctx::deflate`): messages
/// are compressed and inflated without context takeover.
#[derive(Debug, Default)]
pub struct WsState {
    decoder: Option<Box<Decoder>>,
    pub sub: Option<Subscription>,
}

impl WsState {
    pub fn new(sub: Option<Subscription>) -> Self {
        WsState { decoder: None, sub }
    }

    /// Drops the decoder: after our close frame the peer's bytes are of no use.
    pub fn stop_reading(&mut self) {
        self.decoder = None;
    }
}

/// Echo (`/`, `/echo`) and channel subscriptions (`/ws/{channel}`).
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: Path::Exact("/"),
        open: open_echo,
    },
    Endpoint {
        path: Path::Exact("/echo"),
        open: open_echo,
    },
    Endpoint {
        path: Path::Prefix("/ws/"),
        open: open_channel,
    },
];

/// An echo WebSocket: a valid upgrade (the router has checked the origin).
fn open_echo(req: &Request<'_>, _: &str, _: &dyn Gate) -> Result<Opening, Refused> {
    upgrade(req, None)
}

/// `/ws/{channel}?format=raw|json&since=&epoch=&name=`: a channel subscription.
/// A plain GET of it is no handshake to count, and gets 426 whoever asks.
fn open_channel(req: &Request<'_>, channel: &str, gate: &dyn Gate) -> Result<Opening, Refused> {
    let counted = req.wants_upgrade();
    let bad = |reason: String| Refused::Bad { reason, counted };
    validate_channel_name(channel).map_err(|e| bad(e.to_string()))?;
    let grant = match counted.then(|| gate.admit(req, channel)) {
        None | Some(Ok(None)) => None,
        Some(Ok(grant)) => grant,
        Some(Err(e)) => return Err(Refused::Auth(e)),
    };
    let format = match query_param(req, "format") {
        None | Some("raw") => Format::WsRaw,
        Some("json") => Format::WsJson,
        Some(other) => {
            let reason = format!("format must be raw or json, not '{}'", truncate(other, 40));
            return Err(bad(reason));
        }
    };
    let resume = resume_param(req).map_err(bad)?;
    let name = match (query_param(req, "name"), &grant) {
        (Some(_), Some(_)) => {
            let reason =
                "name= is not taken with --token-secret: a member's name is its token's sub";
            return Err(bad(reason.into()));
        }
        (None, grant) => grant.as_ref().and_then(|g| g.name.clone()),
        (Some(name), None) => {
            validate_client_name(name).map_err(|e| bad(e.to_string()))?;
            Some(name.into())
        }
    };
    let subscribe = Subscribe {
        channel: channel.to_string(),
        format,
        resume,
        name,
        expires: grant.map(|g| g.expires),
        presence: None,
    };
    upgrade(req, Some(subscribe))
}

/// The upgrade itself: echo (`subscribe` is `None`) or a channel subscription.
fn upgrade(req: &Request<'_>, subscribe: Option<Subscribe>) -> Result<Opening, Refused> {
    if !req.wants_upgrade() {
        if req.method != "GET" {
            return Err(Refused::Method { counted: false });
        }
        return Err(Refused::NotUpgrade);
    }
    let accept = handshake::validate_upgrade(req).map_err(Refused::Handshake)?;
    Ok(Opening {
        handover: Handover::WebSocket {
            accept,
            deflate: deflate_offer(req),
        },
        subscribe,
    })
}

/// The permessage-deflate offer of an upgrade request the server can accept, from
/// every `Sec-WebSocket-Extensions` line it sent, in order.
pub fn deflate_offer(req: &Request<'_>) -> Option<Agreement> {
    let mut offers = String::new();
    for (name, value) in &req.headers {
        if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            if !offers.is_empty() {
                offers.push(',');
            }
            offers.push_str(std::str::from_utf8(value).ok()?);
        }
    }
    if offers.is_empty() {
        return None;
    }
    deflate::negotiate(&offers)
}

/// The decoder a read continues with: the one a half-received frame left, or a
/// new one that inflates when the connection negotiated permessage-deflate.
pub(super) fn decoder_for(kept: Option<Box<Decoder>>, deflate: u8) -> Decoder {
    match kept {
        Some(decoder) => *decoder,
        None if deflate != 0 => Decoder::inflating(),
        None => Decoder::default(),
    }
}

/// Appends a whole server frame holding `parts` joined, compressed with a
/// `window_bits` window when that is on (non-zero), the payload is at least
/// `--deflate-min-size` and compressing makes it smaller; otherwise plain. Counts
/// what compression saved in `counts`.
pub(super) fn write_message_frame(
    out: &mut Vec<u8>,
    op: u8,
    parts: &[&[u8]],
    deflater: &mut Deflater<'_>,
) {
    let (window_bits, compression) = (deflater.window_bits, deflater.compression);
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if window_bits != 0 && len >= compression.min_size {
        let compressed = SCRATCH.with(|cell| {
            let mut scratch = cell.take();
            scratch.clear();
            let joined: &[u8] = if let [one] = parts {
                one
            } else {
                for part in parts {
                    scratch.extend_from_slice(part);
                }
                &scratch
            };
            let mut packed = Vec::new();
            let ok = deflate::compress(joined, window_bits, compression.level, &mut packed).is_ok()
                && packed.len() < len;
            scratch.clear();
            cell.set(scratch);
            ok.then_some(packed)
        });
        if let Some(packed) = compressed {
            let start = out.len();
            encode_compressed_header(out, op, packed.len());
            out.extend_from_slice(&packed);
            deflater.counts.deflate_wire += (out.len() - start) as u64;
            deflater.counts.deflate_plain += (frame_header_len(len) + len) as u64;
            return;
        }
    }
    encode_header(out, op, len);
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// A plain frame's whole length before its payload.
fn frame_header_len(len: usize) -> usize {
    match len {
        0..126 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}

/// A shared frame compressed: the plain frame `plain`'s payload compressed with a
/// `window_bits` window, as a frame with RSV1 set; `None` when it is shorter than
/// `--deflate-min-size` or compressing would not make it smaller (it then goes
/// plain, which permessage-deflate allows message by message).
pub fn compress_frame(plain: &[u8], window_bits: u8, compression: Compression) -> Option<Bytes> {
    let (op, payload) = split_frame(plain)?;
    if payload.len() < compression.min_size {
        return None;
    }
    let mut packed = Vec::new();
    deflate::compress(payload, window_bits, compression.level, &mut packed).ok()?;
    if packed.len() >= payload.len() {
        return None;
    }
    let mut head = Vec::with_capacity(10);
    encode_compressed_header(&mut head, op, packed.len());
    let mut buf = BytesMut::with_capacity(head.len() + packed.len());
    buf.put_slice(&head);
    buf.put_slice(&packed);
    Some(buf.freeze())
}

/// A whole unmasked server frame's opcode and payload.
fn split_frame(frame: &[u8]) -> Option<(u8, &[u8])> {
    let op = frame.first()? & 0x0F;
    let (len, at): (usize, usize) = match *frame.get(1)? & 0x7F {
        126 => (
            usize::from(u16::from_be_bytes([*frame.get(2)?, *frame.get(3)?])),
            4,
        ),
        127 => {
            let bytes: [u8; 8] = frame.get(2..10)?.try_into().ok()?;
            (usize::try_from(u64::from_be_bytes(bytes)).ok()?, 10)
        }
        n => (usize::from(n), 2),
    };
    Some((op, frame.get(at..at.checked_add(len)?)?))
}

thread_local! {
    /// Where an echo with a prefix is joined before it is compressed.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Transport for WsState {
    super::one_subscription!();

    fn on_input(&mut self, input: &mut [u8], ctx: &mut Ctx<'_>) -> After {
        feed(self, input, ctx)
    }

    fn write_welcome(&self, out: &mut Vec<u8>, count: u64, chosen_name: Option<&str>) {
        if let Some(sub) = &self.sub {
            write_welcome(out, sub, count, chosen_name);
        }
    }

    fn write_replay(
        &mut self,
        out: &mut Vec<u8>,
        replay: Replay,
        resume: Resume,
        deflater: &mut Deflater<'_>,
    ) -> super::Replayed {
        match &self.sub {
            Some(sub) => write_replay(out, sub, replay, resume, deflater),
            None => super::Replayed::Written(After::Nothing),
        }
    }

    fn expects_input(&self) -> bool {
        true
    }

    fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        write_heartbeat(out);
        After::Nothing
    }

    fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason) {
        write_close(out, reason);
        self.stop_reading();
    }

    /// The 101 is out: the refusal is a close frame.
    fn write_unavailable(&mut self, out: &mut Vec<u8>, _head_at: usize) {
        Transport::write_close(self, out, CloseReason::Unavailable);
    }

    fn stop_reading(&mut self) {
        WsState::stop_reading(self);
    }
}

/// The 101 response that completes the handshake.
pub fn write_opening(out: &mut Vec<u8>, accept: &[u8; 28], deflate: Option<&Agreement>) {
    let extensions = deflate.map(Agreement::response);
    crate::protocol::handshake::write_switching_protocols(out, accept, extensions.as_deref());
}

/// A json subscriber's greeting in a channel that announces members.
pub fn write_welcome(out: &mut Vec<u8>, sub: &Subscription, count: u64, chosen: Option<&str>) {
    if sub.format.listens() && sub.rules.join_leave {
        let name = rules::client_name(sub.client, chosen);
        out.extend_from_slice(&json_event_frame(
            sub.channel.name(),
            "welcome",
            &name,
            count,
        ));
    }
}

/// A returning subscriber's catch-up: json subscribers first learn the channel's
/// epoch (`{"event":"epoch"}`) and any gap (`{"event":"gap","from","to","reason"}`,
/// the seqs of this epoch they cannot be given); then every message history holds
/// for them, raw or json (with `"from"` for a chat message, as live), in seq order.
/// The messages are compressed for a connection that negotiated permessage-deflate
/// (this once per subscriber: a replay is its own). Past the first slice they
/// are framed as the socket takes them ([`super::replay`]).
pub fn write_replay(
    out: &mut Vec<u8>,
    sub: &Subscription,
    replay: Replay,
    resume: Resume,
    deflater: &mut Deflater<'_>,
) -> super::Replayed {
    let (replay, gap) = replay.for_resume(resume);
    let name = sub.channel.name();
    let json = sub.format == Format::WsJson;
    if json {
        let epoch = format!("{:016x}", replay.epoch);
        let body = serde_json::json!({
            "channel": name,
            "event": "epoch",
            "epoch": epoch,
            "last_seq": replay.last_seq,
        });
        out.extend_from_slice(&frame_bytes(opcode::TEXT, body.to_string().as_bytes()));
        if let Some(gap) = gap {
            let body = serde_json::json!({
                "channel": name,
                "event": "gap",
                "from": gap.from,
                "to": gap.to,
                "reason": gap.reason.as_str(),
                "epoch": epoch,
            });
            out.extend_from_slice(&frame_bytes(opcode::TEXT, body.to_string().as_bytes()));
        }
    }
    let channel = Arc::clone(&sub.channel);
    let (window_bits, compression) = (deflater.window_bits, deflater.compression);
    let encode = move |out: &mut Vec<u8>, m: &Stored, counts: &mut TurnCounts| {
        let mut deflater = Deflater {
            window_bits,
            compression,
            counts,
            shared: None,
        };
        if json {
            let tags = Tags {
                from: m.from.as_deref(),
                event: m.event.as_deref(),
            };
            let frame = json_message_frame(channel.name(), m.seq, &m.payload, m.kind, tags);
            match split_frame(&frame) {
                Some((op, payload)) => write_message_frame(out, op, &[payload], &mut deflater),
                None => out.extend_from_slice(&frame),
            }
        } else {
            write_message_frame(out, m.kind.opcode(), &[&m.payload], &mut deflater);
        }
    };
    let shared = deflater.shared.cloned();
    ReplayFeed::new(replay.messages, shared, encode).start(out, deflater.counts)
}

/// A heartbeat: an empty ping.
pub fn write_heartbeat(out: &mut Vec<u8>) {
    encode_frame(out, opcode::PING, b"");
}

/// The close frame the server starts a close handshake with.
pub fn write_close(out: &mut Vec<u8>, reason: CloseReason) {
    let (code, text) = match reason {
        CloseReason::Shutdown => (close_code::GOING_AWAY, "server shutting down"),
        CloseReason::IdleTimeout => (close_code::GOING_AWAY, "idle timeout"),
        CloseReason::SlowConsumer => (close_code::POLICY_VIOLATION, "slow consumer"),
        CloseReason::TokenExpired => (close_code::TOKEN_EXPIRED, "token expired"),
        CloseReason::Terminated => (close_code::POLICY_VIOLATION, "terminated"),
        CloseReason::Unavailable => (
            close_code::TRY_AGAIN_LATER,
            "broker unavailable, retry later",
        ),
    };
    encode_close(out, code, text);
}

/// The message as one complete frame, json envelope or raw payload; `None` for
/// channel events in raw.
pub fn encode(json: bool, message: &Message) -> Option<Bytes> {
    let name = message.channel.name();
    match &message.body {
        Body::Data { payload, kind, .. } if !json => Some(frame_bytes(kind.opcode(), payload)),
        Body::Data {
            seq,
            payload,
            kind,
            from,
            event,
            ..
        } => Some(json_message_frame(
            name,
            *seq,
            payload,
            *kind,
            Tags {
                from: from.as_deref(),
                event: event.as_deref(),
            },
        )),
        // Pusher's presence: for Pusher subscribers only.
        Body::Presence { .. } | Body::CloseAll => None,
        Body::Event { .. } | Body::NewEpoch { .. } if !json => None,
        Body::NewEpoch { epoch, next_seq } => {
            let body = serde_json::json!({
                "channel": name,
                "event": "gap",
                "from": 1,
                "to": next_seq.saturating_sub(1),
                "reason": GapReason::NewEpoch.as_str(),
                "epoch": format!("{epoch:016x}"),
            });
            Some(frame_bytes(opcode::TEXT, body.to_string().as_bytes()))
        }
        Body::Event {
            event,
            client,
            count,
        } => Some(json_event_frame(name, event, client, *count)),
    }
}

/// A whole server frame around `payload`, as shareable bytes.
pub(super) fn frame_bytes(op: u8, payload: &[u8]) -> Bytes {
    let mut head = Vec::with_capacity(10);
    encode_header(&mut head, op, payload.len());
    let mut buf = BytesMut::with_capacity(head.len() + payload.len());
    buf.put_slice(&head);
    buf.put_slice(payload);
    buf.freeze()
}

/// `{"channel":…,"seq":…,"data":…[,"from":…][,"name":…]}` as a text frame
/// (`name`: the event name it was published with, a Pusher event's).
fn json_message_frame(
    channel: &str,
    seq: u64,
    payload: &[u8],
    kind: DataKind,
    tags: Tags<'_>,
) -> Bytes {
    let mut body = Vec::with_capacity(payload.len() + channel.len() + 48);
    body.extend_from_slice(b"{\"channel\":\"");
    // Channel names are validated to need no escaping.
    body.extend_from_slice(channel.as_bytes());
    body.push(b'"');
    // Seq 0: published straight into Redis by another program, never sequenced.
    if seq != 0 {
        body.extend_from_slice(b",\"seq\":");
        body.extend_from_slice(seq.to_string().as_bytes());
    }
    body.extend_from_slice(b",\"data\":");
    json_data(&mut body, payload, kind);
    if let Some(from) = tags.from {
        body.extend_from_slice(b",\"from\":");
        let _ = serde_json::to_writer(&mut body, from);
    }
    if let Some(event) = tags.event {
        body.extend_from_slice(b",\"name\":");
        let _ = serde_json::to_writer(&mut body, event);
    }
    body.push(b'}');
    frame_bytes(opcode::TEXT, &body)
}

/// `{"channel":…,"event":…,"client":…,"count":…}` as a text frame.
fn json_event_frame(channel: &str, event: &str, client: &str, count: u64) -> Bytes {
    let body = serde_json::json!({
        "channel": channel,
        "event": event,
        "client": client,
        "count": count,
    })
    .to_string();
    frame_bytes(opcode::TEXT, body.as_bytes())
}

/// Runs the decoder over `data` (unmasked in place), appending every answer
/// (echoes, pongs, a close frame) to `ctx.out`.
pub fn feed(state: &mut WsState, data: &mut [u8], ctx: &mut Ctx<'_>) -> After {
    let mut decoder = decoder_for(state.decoder.take(), ctx.deflate);
    let config = ctx.config;
    let compression = config.compression;
    let window_bits = ctx.deflate;
    let prefix = config.echo_prefix.as_bytes();
    let role = state
        .sub
        .as_ref()
        .map_or(Role::Echo, |s| Role::Subscriber(s.rules));
    let out = &mut *ctx.out;
    let counts = &mut *ctx.counts;
    let broker = ctx.broker;
    let ticket = ctx.ticket;
    let chosen_name = ctx.chosen_name;
    let chat = &mut *ctx.chat;
    let mut after = After::Nothing;
    let mut echoed = 0u64;
    let mut published = 0u64;
    let result = decoder.feed(data, config.max_message_size, |event| match event {
        Event::Message { kind, payload } => match rules::on_client_message(role) {
            Action::Echo => {
                let op = kind.opcode();
                let parts: &[&[u8]] = if op == opcode::TEXT && !prefix.is_empty() {
                    &[prefix, payload]
                } else {
                    &[payload]
                };
                let mut deflater = Deflater {
                    window_bits,
                    compression,
                    counts: &mut *counts,
                    shared: None,
                };
                write_message_frame(out, op, parts, &mut deflater);
                echoed += 1;
                Flow::Continue
            }
            Action::Publish => {
                let client = state.sub.as_ref().map_or(0, |s| s.client);
                let now = crate::rate::now_ns();
                if !chat.allow(client, now) {
                    // Refused as every other policy is on a WebSocket: said in
                    // the close, never published, never dropped unsaid.
                    let rate = chat.rate();
                    let reason = format!(
                        "chat rate limit: at most {}/s, {} at once",
                        rate.per_second, rate.burst
                    );
                    encode_close(out, close_code::POLICY_VIOLATION, &reason);
                    after = After::Close;
                    return Flow::Stop;
                }
                let (channel, from) = state.sub.as_ref().map_or(("", None), |s| {
                    (
                        s.channel.name(),
                        Some(rules::client_name(s.client, chosen_name)),
                    )
                });
                let message = Outgoing {
                    payload,
                    kind,
                    from: from.as_deref(),
                    event: None,
                    skip: None,
                };
                let outcome = if broker.answers_later() {
                    // Handed over: the loop goes on, and only a refusal comes
                    // back (it closes this connection then, as below).
                    let to = Ticket {
                        serial: client,
                        asker: Asker::Sender,
                        ..ticket
                    };
                    let publishes = vec![Publish::new(channel, message, None)];
                    match broker.ask(Ask::new(publishes, to)) {
                        Asked::Later => Ok(false),
                        Asked::Now(outcome) => outcome.map(|_| true),
                    }
                } else {
                    broker.publish(channel, message).map(|_| true)
                };
                match outcome {
                    Ok(now) => {
                        published += u64::from(now);
                        Flow::Continue
                    }
                    Err(e) => {
                        encode_close(out, close_code::TRY_AGAIN_LATER, &e.to_string());
                        after = After::Close;
                        Flow::Stop
                    }
                }
            }
            Action::Refuse(reason) => {
                encode_close(out, close_code::POLICY_VIOLATION, reason);
                after = After::Close;
                Flow::Stop
            }
        },
        control => answer_control(out, &control, &mut after),
    });
    ctx.counts.messages_out += echoed;
    ctx.counts.published += published;
    finish_feed(result, decoder, &mut state.decoder, after, ctx)
}

/// Answers a control frame: a ping's pong, the close handshake's close (then
/// `after` is `Close` and decoding stops). Data messages are the caller's.
pub(super) fn answer_control(out: &mut Vec<u8>, event: &Event<'_>, after: &mut After) -> Flow {
    match event {
        Event::Ping(payload) => {
            encode_frame(out, opcode::PONG, payload);
            Flow::Continue
        }
        Event::Close { code, .. } => {
            match code {
                Some(code) => encode_close(out, *code, ""),
                None => encode_frame(out, opcode::CLOSE, b""),
            }
            *after = After::Close;
            Flow::Stop
        }
        Event::Pong(_) | Event::Message { .. } => Flow::Continue,
    }
}

/// After a run of the decoder: counts what came, keeps the decoder in `slot`
/// only while a frame or message is half received, and answers a protocol error
/// with its close.
pub(super) fn finish_feed(
    result: Result<crate::protocol::FeedStats, crate::protocol::ProtocolError>,
    decoder: Decoder,
    slot: &mut Option<Box<Decoder>>,
    after: After,
    ctx: &mut Ctx<'_>,
) -> After {
    match result {
        Ok(stats) => {
            ctx.counts.frames_in += stats.frames;
            ctx.counts.messages_in += stats.messages;
            if after == After::Nothing && !decoder.is_idle() {
                *slot = Some(Box::new(decoder));
            }
            after
        }
        Err(error) => {
            tracing::debug!(%error, "protocol error");
            encode_close(ctx.out, error.close_code(), &error.to_string());
            After::Close
        }
    }
}

#[cfg(test)]
mod tests;
