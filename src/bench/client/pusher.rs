//! The client side of Pusher Channels protocol 7 (`--protocol pusher`), on top of
//! the WebSocket client: reading a Pusher server's JSON messages ([`parse`], pure,
//! fed by unit tests), the messages a subscriber writes (`pusher:subscribe`,
//! signed for `private-` and `presence-` channels with the app's secret, a
//! presence member as user `u<index>`, and `pusher:pong`), and
//! what one message does to its connection: `connection_established` sends the
//! subscription, `subscription_succeeded` makes the connection open, an event on
//! its channel is a delivery whose data carries the publisher's count and time.
//!
//! It holds nothing per connection (the socket id is used once, when it comes)
//! and must not touch sockets or the loop's pacing: `websocket.rs` decodes the
//! frames, hands each text message here and acts on the [`Step`] it gets back.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::conn::{Conn, State};
use super::delivery::{observe_delivery, unix_nanos};
use super::{Plan, Tally, next_mask};
use crate::bench::{Mode, SeqFrom};
use crate::protocol::{encode_client_frame, opcode};
use crate::pusher::ChannelKind;
use crate::pusher::sign::channel_auth;

/// The longest server-given text kept in a failure reason (the report's key).
const MAX_REASON: usize = 120;

/// One message from a Pusher server, as far as the bench needs it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Incoming<'a> {
    /// `pusher:connection_established`, with the socket id to sign with.
    Established { socket_id: String },
    /// `pusher_internal:subscription_succeeded` on `channel`.
    Subscribed { channel: Cow<'a, str> },
    /// `pusher:subscription_error`: its HTTP-like status and why.
    SubscriptionError {
        status: Option<u16>,
        message: String,
    },
    /// `pusher:error`: Pusher's code (4000-4099 final, 4100-4299 come back) and why.
    Error { code: Option<u16>, message: String },
    /// `pusher:ping`: answered with `pusher:pong`.
    Ping,
    /// An event on a channel, with its data as the publisher gave it.
    Event {
        channel: Cow<'a, str>,
        data: Cow<'a, str>,
    },
    /// Anything else: `pusher:pong`, member events, an event without text data.
    Other,
}

/// A Pusher message's envelope. `data` is kept only when it is a JSON string
/// (an event's, borrowed from the frame when it has no escapes); an object is
/// skipped without being built.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    event: Cow<'a, str>,
    #[serde(borrow, default)]
    channel: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text_or_skip")]
    data: Option<Cow<'a, str>>,
}

/// `data` as text if it is a JSON string; `None` (consumed, not built) otherwise.
fn text_or_skip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct Text;
    impl<'de> Visitor<'de> for Text {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Text)
}

/// A control message's `data` as JSON: a string holding JSON (Pusher's way) is
/// parsed, an object taken as it is. For the rare messages only (one per
/// connection, or an error): it builds a value.
fn data_json(frame: &[u8]) -> Option<serde_json::Value> {
    let mut whole: serde_json::Value = serde_json::from_slice(frame).ok()?;
    match whole.get_mut("data")?.take() {
        serde_json::Value::String(s) => serde_json::from_str(&s).ok(),
        other => Some(other),
    }
}

/// Text for a failure reason: what the server said, cut short, each run of
/// digits written `N` (a socket id or a channel's number in it would make every
/// connection's reason a key of its own in the report).
fn said(v: Option<&serde_json::Value>, key: &str) -> String {
    let text = match v.and_then(|d| d.get(key)) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let mut out = String::new();
    for c in text.chars().take(MAX_REASON) {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('N') {
            out.push('N');
        }
    }
    out
}

fn number(v: Option<&serde_json::Value>, key: &str) -> Option<u16> {
    v?.get(key)?.as_u64().and_then(|n| u16::try_from(n).ok())
}

/// Reads one text message from a Pusher server; `None` if it is not one.
pub(super) fn parse(frame: &[u8]) -> Option<Incoming<'_>> {
    let env: Envelope<'_> = serde_json::from_slice(frame).ok()?;
    let event = env.event.as_ref();
    Some(match event {
        "pusher:connection_established" => {
            let data = data_json(frame)?;
            let socket_id = data.get("socket_id")?.as_str()?.to_owned();
            Incoming::Established { socket_id }
        }
        "pusher_internal:subscription_succeeded" => Incoming::Subscribed {
            channel: env.channel?,
        },
        "pusher:subscription_error" => {
            let data = data_json(frame);
            let mut message = said(data.as_ref(), "error");
            if message.is_empty() {
                message = said(data.as_ref(), "type");
            }
            Incoming::SubscriptionError {
                status: number(data.as_ref(), "status"),
                message,
            }
        }
        "pusher:error" => {
            let data = data_json(frame);
            Incoming::Error {
                code: number(data.as_ref(), "code"),
                message: said(data.as_ref(), "message"),
            }
        }
        "pusher:ping" => Incoming::Ping,
        _ if event.starts_with("pusher:") || event.starts_with("pusher_internal:") => {
            Incoming::Other
        }
        _ => match (env.channel, env.data) {
            (Some(channel), Some(data)) => Incoming::Event { channel, data },
            _ => Incoming::Other,
        },
    })
}

/// The `pusher:subscribe` message for `channel`, with `auth` for a private one
/// and `channel_data` (what `auth` signed) for a presence one.
pub(super) fn subscribe_message(
    channel: &str,
    auth: Option<&str>,
    channel_data: Option<&str>,
) -> String {
    let mut data = serde_json::json!({ "channel": channel });
    if let Some(auth) = auth {
        data["auth"] = auth.into();
    }
    if let Some(channel_data) = channel_data {
        data["channel_data"] = channel_data.into();
    }
    serde_json::json!({ "event": "pusher:subscribe", "data": data }).to_string()
}

/// A presence member's `channel_data`: one user per connection, named by its
/// index (`u<index>`).
pub(super) fn presence_data(index: u64) -> String {
    format!(r#"{{"user_id":"u{index}","user_info":{{}}}}"#)
}

/// What `pusher:pong` is, answering a server's `pusher:ping`.
pub(super) const PONG: &[u8] = br#"{"event":"pusher:pong","data":{}}"#;

/// What one Pusher message asks of its connection, done by the loop once the
/// frames at hand are read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Nothing,
    /// Subscribed: the connection is open.
    Subscribed,
    /// Refused for good (bad key or auth, unknown app): dropped with this reason.
    Refused(String),
    /// Let go with a "come back" signal (Pusher's 4100-4299, a 5xx).
    ComeBack(String),
}

/// Whether a Pusher close or error code says "come back": 4100-4199 (over
/// capacity, later) and 4200-4299 (reconnect now).
pub(super) fn code_says_come_back(code: Option<u16>) -> bool {
    matches!(code, Some(4100..=4299))
}

/// Handles one text message `payload` of a Pusher connection: frames to send
/// go to `out` (masked with `rng`); deliveries are counted in `tally`.
/// `now_unix` is read from the clock once, at the first delivery of a read.
pub(super) fn on_message(
    payload: &[u8],
    conn: &mut Conn,
    plan: &Plan,
    tally: &mut Tally,
    out: &mut Vec<u8>,
    rng: &mut u64,
    now_unix: &mut u64,
) -> Step {
    let Some(message) = parse(payload) else {
        return Step::Nothing;
    };
    let index = u64::from(conn.index);
    match message {
        Incoming::Established { socket_id } => {
            if conn.state != State::Subscribing {
                return Step::Nothing;
            }
            let channel = plan.channel_name(index);
            let kind = ChannelKind::of(&channel);
            let channel_data = (kind == ChannelKind::Presence).then(|| presence_data(index));
            let auth = match &plan.pusher {
                Some(app) if kind.signed() => Some(channel_auth(
                    app,
                    &socket_id,
                    &channel,
                    channel_data.as_deref(),
                )),
                _ => None,
            };
            let text = subscribe_message(&channel, auth.as_deref(), channel_data.as_deref());
            encode_client_frame(out, opcode::TEXT, true, text.as_bytes(), next_mask(rng));
            tally.c.messages_out += 1;
            Step::Nothing
        }
        Incoming::Subscribed { channel } => {
            if conn.state == State::Subscribing && plan.is_channel_of(index, &channel) {
                Step::Subscribed
            } else {
                Step::Nothing
            }
        }
        Incoming::SubscriptionError { status, message } => {
            let reason = format!(
                "pusher:subscription_error {}: {message}",
                status.map_or("(no status)".into(), |s| s.to_string())
            );
            if status.is_some_and(|s| s >= 500) {
                Step::ComeBack(reason)
            } else {
                Step::Refused(reason)
            }
        }
        Incoming::Error { code, message } => {
            let reason = format!(
                "pusher:error {}: {message}",
                code.map_or("(no code)".into(), |c| c.to_string())
            );
            if code_says_come_back(code) {
                Step::ComeBack(reason)
            } else {
                Step::Refused(reason)
            }
        }
        Incoming::Ping => {
            tally.c.pings += 1;
            encode_client_frame(out, opcode::TEXT, true, PONG, next_mask(rng));
            Step::Nothing
        }
        Incoming::Event { channel, data } => {
            tally.c.messages_in += 1;
            if plan.mode == Mode::Push && plan.is_channel_of(index, &channel) {
                if *now_unix == 0 {
                    *now_unix = unix_nanos();
                }
                observe_delivery(
                    tally,
                    &mut conn.track,
                    SeqFrom::Payload,
                    None,
                    &data,
                    *now_unix,
                );
            }
            Step::Nothing
        }
        Incoming::Other => Step::Nothing,
    }
}
