//! WebSocket as a transport: the raw and json encodings of hub messages, what an open
//! WebSocket keeps between reads, and how its input is answered (echo, chat publish,
//! refusal, pongs, the close handshake), how it heartbeats (pings) and closes.
//!
//! Framing itself is `protocol`'s; what a client's message means is `rules`'. This
//! module turns both into bytes in the caller's output buffer. It must not own the
//! socket, keep time, or decide routes.

use bytes::{BufMut, Bytes, BytesMut};

use super::request::{Endpoint, Gate, Path, Refused, query_param, resume_param, truncate};
use super::{
    After, CloseReason, Ctx, Format, Handover, Opening, Subscribe, Subscription, Transport,
    json_data,
};
use crate::broker::{Outgoing, Replay, Resume};
use crate::history::Tags;
use crate::hub::{Body, Message};
use crate::protocol::handshake;
use crate::protocol::http::Request;
use crate::protocol::{
    DataKind, Decoder, Event, Flow, close_code, encode_close, encode_frame, encode_header, opcode,
};
use crate::rules::{self, Action, Role, validate_channel_name, validate_client_name};

/// An open WebSocket: a decoder only while a frame or message is half received,
/// and the channel it subscribes to, if any.
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

/// An echo WebSocket: a page from an allowed origin, a valid upgrade.
fn open_echo(req: &Request<'_>, _: &str, gate: &dyn Gate) -> Result<Opening, Refused> {
    gate.check_origin(req).map_err(Refused::Auth)?;
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
        handover: Handover::WebSocket { accept },
        subscribe,
    })
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

    fn write_replay(&mut self, out: &mut Vec<u8>, replay: Replay, resume: Resume) -> After {
        if let Some(sub) = &self.sub {
            write_replay(out, sub, replay, resume);
        }
        After::Nothing
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
pub fn write_opening(out: &mut Vec<u8>, accept: &[u8; 28]) {
    crate::protocol::handshake::write_switching_protocols(out, accept);
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
pub fn write_replay(out: &mut Vec<u8>, sub: &Subscription, replay: Replay, resume: Resume) {
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
    for m in &replay.messages {
        if json {
            let tags = Tags {
                from: m.from.as_deref(),
                event: m.event.as_deref(),
            };
            out.extend_from_slice(&json_message_frame(name, m.seq, &m.payload, m.kind, tags));
        } else {
            encode_frame(out, m.kind.opcode(), &m.payload);
        }
    }
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
        Body::Event { .. } if !json => None,
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
    let mut decoder = state.decoder.take().map(|b| *b).unwrap_or_default();
    let config = ctx.config;
    let prefix = config.echo_prefix.as_bytes();
    let role = state
        .sub
        .as_ref()
        .map_or(Role::Echo, |s| Role::Subscriber(s.rules));
    let out = &mut *ctx.out;
    let broker = ctx.broker;
    let chosen_name = ctx.chosen_name;
    let mut after = After::Nothing;
    let mut echoed = 0u64;
    let mut published = 0u64;
    let result = decoder.feed(data, config.max_message_size, |event| match event {
        Event::Message { kind, payload } => match rules::on_client_message(role) {
            Action::Echo => {
                let op = kind.opcode();
                if op == opcode::TEXT && !prefix.is_empty() {
                    encode_header(out, op, prefix.len() + payload.len());
                    out.extend_from_slice(prefix);
                    out.extend_from_slice(payload);
                } else {
                    encode_frame(out, op, payload);
                }
                echoed += 1;
                Flow::Continue
            }
            Action::Publish => {
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
                match broker.publish(channel, message) {
                    Ok(_) => {
                        published += 1;
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
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::broker::{Broker, Member, MemoryBroker};
    use crate::config::ServeConfig;
    use crate::hub::{ConnRef, Hub};
    use crate::protocol::encode_client_frame;
    use crate::rules::ChannelRules;
    use crate::stats::TurnCounts;

    /// A broker over a one-loop hub, and a member of `chat:r` listening on it.
    fn chat_room() -> (MemoryBroker, Arc<Hub>, mio::Poll) {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let hub = Arc::new(Hub::new(vec![waker]));
        let history = crate::history::Limits {
            size: 0,
            ttl: std::time::Duration::ZERO,
        };
        let broker = MemoryBroker::new(Arc::clone(&hub), history, Default::default());
        (broker, hub, poll)
    }

    /// Feeds client frames to a WebSocket in `state`; returns the answer bytes.
    fn feed_frames(
        state: &mut WsState,
        frames: &[(u8, &[u8])],
        broker: &dyn Broker,
        config: &ServeConfig,
    ) -> (Vec<u8>, After) {
        let mut input = Vec::new();
        for (op, payload) in frames {
            encode_client_frame(&mut input, *op, true, payload, [1, 2, 3, 4]);
        }
        let mut out = Vec::new();
        let mut counts = TurnCounts::default();
        let mut ctx = Ctx {
            out: &mut out,
            broker,
            config,
            webhooks: None,
            counts: &mut counts,
            chosen_name: None,
            changes: &mut Vec::new(),
        };
        let after = feed(state, &mut input, &mut ctx);
        (out, after)
    }

    fn subscriber(broker: &MemoryBroker, channel: &str) -> WsState {
        let member = Member {
            conn: ConnRef {
                loop_index: 0,
                key: 1,
            },
            listens: true,
            announce: None,
            presence: None,
        };
        let joined = broker.subscribe(channel, member, None).unwrap();
        WsState::new(Some(Subscription {
            channel: joined.channel,
            client: 7,
            expires: 0,
            index: 0,
            format: Format::WsJson,
            rules: ChannelRules::for_name(channel),
        }))
    }

    #[test]
    fn echo_answers_each_message_with_the_prefix_and_pings_with_pongs() {
        let (broker, _hub, _poll) = chat_room();
        let config = ServeConfig {
            echo_prefix: "> ".into(),
            ..ServeConfig::default()
        };
        let mut state = WsState::default();
        let frames: [(u8, &[u8]); 3] = [
            (opcode::TEXT, b"hi"),
            (opcode::PING, b"p"),
            (opcode::BINARY, &[0, 1]),
        ];
        let (out, after) = feed_frames(&mut state, &frames, &broker, &config);
        assert_eq!(after, After::Nothing);
        assert_eq!(out, b"\x81\x04> hi\x8a\x01p\x82\x02\x00\x01");
    }

    #[test]
    fn a_chat_member_publishes_in_its_name_and_a_push_subscriber_is_refused() {
        let (broker, hub, _poll) = chat_room();
        let config = ServeConfig::default();
        let mut member = subscriber(&broker, "chat:r");
        let (out, after) = feed_frames(&mut member, &[(opcode::TEXT, b"yo")], &broker, &config);
        assert_eq!((out.len(), after), (0, After::Nothing));
        let mut batch = Vec::new();
        hub.inbox(0).take(&mut batch);
        let frame = Format::WsJson.frame(&batch[0]).unwrap();
        let text = String::from_utf8_lossy(&frame[2..]).into_owned();
        assert!(
            text.contains(r#""seq":1"#) && text.contains(r#""from":"c7""#),
            "{text}"
        );

        let mut pushed = subscriber(&broker, "news");
        let (out, after) = feed_frames(&mut pushed, &[(opcode::TEXT, b"no")], &broker, &config);
        assert_eq!(after, After::Close);
        assert_eq!(&out[2..4], &close_code::POLICY_VIOLATION.to_be_bytes());
        assert!(String::from_utf8_lossy(&out).contains("push-only"));
        assert_eq!(broker.channel_info("news").last_seq, 0);
    }

    /// The payloads of the short server frames in `out`.
    fn frame_payloads(mut out: &[u8]) -> Vec<&[u8]> {
        let mut payloads = Vec::new();
        while out.len() >= 2 {
            let len = usize::from(out[1]);
            assert!(len < 126, "a short frame");
            payloads.push(&out[2..2 + len]);
            out = &out[2 + len..];
        }
        payloads
    }

    #[test]
    fn a_replayed_chat_message_says_who_sent_it_in_json_only() {
        let (broker, _hub, _poll) = chat_room();
        let stored = |seq, payload: &'static [u8], from: Option<&str>| crate::history::Stored {
            seq,
            payload: Bytes::from_static(payload),
            kind: DataKind::Text,
            from: from.map(Box::from),
            event: None,
            skip: None,
        };
        let replay = || Replay {
            messages: vec![stored(1, b"hi", Some("c3")), stored(2, b"ho", None)],
            last_seq: 2,
            oldest: 1,
            epoch: 1,
        };
        let resume = Resume {
            since: 0,
            epoch: Some(1),
        };
        let mut member = subscriber(&broker, "chat:r");
        let Some(sub) = member.sub.as_mut() else {
            panic!("a subscriber");
        };
        let mut out = Vec::new();
        write_replay(&mut out, sub, replay(), resume);
        let frames = frame_payloads(&out);
        assert_eq!(frames.len(), 3, "the epoch, then two messages");
        assert_eq!(
            frames[1],
            br#"{"channel":"chat:r","seq":1,"data":"hi","from":"c3"}"#
        );
        assert_eq!(frames[2], br#"{"channel":"chat:r","seq":2,"data":"ho"}"#);

        sub.format = Format::WsRaw;
        let mut out = Vec::new();
        write_replay(&mut out, sub, replay(), resume);
        assert_eq!(frame_payloads(&out), vec![&b"hi"[..], &b"ho"[..]]);
    }

    #[test]
    fn a_protocol_error_closes_with_its_code() {
        let (broker, _hub, _poll) = chat_room();
        let mut state = WsState::default();
        let mut input = vec![0x81, 0x02, b'h', b'i']; // unmasked client frame
        let mut out = Vec::new();
        let mut counts = TurnCounts::default();
        let config = ServeConfig::default();
        let mut ctx = Ctx {
            out: &mut out,
            broker: &broker,
            config: &config,
            webhooks: None,
            counts: &mut counts,
            chosen_name: None,
            changes: &mut Vec::new(),
        };
        assert_eq!(feed(&mut state, &mut input, &mut ctx), After::Close);
        assert_eq!(&out[2..4], &close_code::PROTOCOL_ERROR.to_be_bytes());
    }

    #[test]
    fn json_envelopes() {
        let f = json_message_frame(
            "news",
            7,
            b"he said \"hi\"",
            DataKind::Text,
            Tags::default(),
        );
        assert_eq!(
            &f[2..],
            br#"{"channel":"news","seq":7,"data":"he said \"hi\""}"#
        );
        let c9 = Tags {
            from: Some("c9"),
            event: None,
        };
        let f = json_message_frame("chat:r", 1, &[0, 255], DataKind::Binary, c9);
        assert_eq!(
            &f[2..],
            br#"{"channel":"chat:r","seq":1,"data":"AP8=","encoding":"base64","from":"c9"}"#
        );
        let f = json_event_frame("chat:r", "join", "c2", 3);
        assert_eq!(f[0], 0x81);
        let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
        assert_eq!(v["event"], "join");
        assert_eq!(v["count"], 3);
    }

    #[test]
    fn raw_frames_carry_the_payload_alone() {
        assert_eq!(&frame_bytes(opcode::TEXT, b"x")[..], b"\x81\x01x");
        assert_eq!(
            &frame_bytes(opcode::BINARY, &[1, 2])[..],
            b"\x82\x02\x01\x02"
        );
    }

    #[test]
    fn server_closes_say_why() {
        let mut out = Vec::new();
        write_close(&mut out, CloseReason::SlowConsumer);
        assert_eq!(&out[..4], &[0x88, 15, 0x03, 0xF0]);
        assert_eq!(&out[4..], b"slow consumer");
    }
}
