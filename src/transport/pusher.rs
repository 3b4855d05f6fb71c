//! The Pusher Channels protocol (versions 5–7, as pusher-js 8 speaks it) as a
//! transport: `ws://HOST/app/KEY?protocol=7`, one WebSocket carrying any number
//! of channel subscriptions. It greets with `pusher:connection_established`
//! (a socket id and the activity timeout), answers `pusher:ping`, subscribes and
//! unsubscribes (public channels; `private-` and `private-encrypted-` with the
//! app's signature), and delivers each message as
//! `{"event","channel","data"}`, encoded once per message and shared by every
//! Pusher subscriber. Refusals are Pusher's: `pusher:error` with its codes (4001
//! unknown app, 4007 protocol, 4200–4299 reconnect) and
//! `pusher:subscription_error`.
//!
//! WebSocket framing is `protocol`'s and what a Pusher name means is
//! `crate::pusher`'s. This module asks the server for subscriptions through
//! [`Change`]s and must not own the socket, keep time or touch the hub.

use bytes::Bytes;
use serde_json::{Value, json};
use smallvec::SmallVec;

use super::request::{Endpoint, Gate, Path, Refused, query_param};
use super::websocket::{answer_control, finish_feed, frame_bytes, write_heartbeat};
use super::{
    After, Change, CloseReason, Ctx, Format, Handover, Opening, PresenceUser, Subscribe,
    Subscription, Transport, json_data,
};
use crate::broker::{BrokerError, Members, Outgoing, Replay, Resume};
use crate::hub::{Body, Channel, Message, PresenceChange, SocketId};
use crate::protocol::http::Request;
use crate::protocol::{DataKind, Event, Flow, encode_close, encode_frame, opcode};
use crate::pusher::{self, ChannelKind, sign};

/// Pusher's error codes this server sends.
pub mod code {
    /// The app key is unknown: do not reconnect.
    pub const UNKNOWN_APP: u16 = 4001;
    /// The protocol version is not spoken: do not reconnect.
    pub const PROTOCOL: u16 = 4007;
    /// Over capacity (a slow consumer, the broker away): reconnect after a pause.
    pub const OVER_CAPACITY: u16 = 4100;
    /// Reconnect now (the server is going away).
    pub const RECONNECT: u16 = 4200;
    /// Nothing heard within the activity timeout: reconnect now.
    pub const NO_PONG: u16 = 4201;
    /// A client event over the rate limit (dropped; the connection goes on).
    pub const RATE_LIMIT: u16 = 4301;
}

/// Client events one connection may send in a second (Pusher's limit).
pub const CLIENT_EVENTS_PER_SECOND: u8 = 10;

/// Why a Pusher connection is refused right after its upgrade (Pusher answers
/// the handshake, then says why in `pusher:error` and closes with that code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownApp,
    Protocol,
}

impl Refusal {
    pub fn code(self) -> u16 {
        match self {
            Refusal::UnknownApp => code::UNKNOWN_APP,
            Refusal::Protocol => code::PROTOCOL,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::UnknownApp => "App key not in this cluster",
            Refusal::Protocol => {
                "Unsupported protocol version: this server speaks protocols 5 to 7"
            }
        }
    }
}

/// Who a connection says it is: the user in each presence channel it joins
/// (throng channel, user id; its client events there carry `user_id`), and the
/// user it signed in as. Boxed: most connections never say.
#[derive(Debug, Default)]
struct Identity {
    presence: Vec<(Box<str>, Box<str>)>,
    signed_in: Option<Box<str>>,
}

/// An open Pusher connection: a decoder only while a frame is half received, its
/// subscriptions (one held inline), its app and its client id (its socket id's
/// second number). Boxed in its session, so a plain WebSocket's record does not
/// grow for it.
#[derive(Debug)]
pub struct PusherState {
    decoder: Option<Box<crate::protocol::Decoder>>,
    subs: SmallVec<[Subscription; 1]>,
    /// Its app's place among `--pusher-app`s.
    app: u16,
    client: u32,
    /// Said at the upgrade; the connection is closed once it is written.
    refusal: Option<Refusal>,
    /// Client events sent in second `events_second` (process seconds).
    events_second: u32,
    events_sent: u8,
    identity: Option<Box<Identity>>,
}

impl PusherState {
    pub fn new(app: Result<u16, Refusal>) -> Self {
        let (app, refusal) = match app {
            Ok(app) => (app, None),
            Err(refusal) => (0, Some(refusal)),
        };
        PusherState {
            decoder: None,
            subs: SmallVec::new(),
            app,
            client: 0,
            refusal,
            events_second: 0,
            events_sent: 0,
            identity: None,
        }
    }

    fn identity(&mut self) -> &mut Identity {
        self.identity.get_or_insert_with(Box::default)
    }

    /// The user it is in presence channel `channel`, if it joined it as one.
    fn presence_user(&self, channel: &str) -> Option<&str> {
        let identity = self.identity.as_deref()?;
        identity
            .presence
            .iter()
            .find(|(c, _)| &**c == channel)
            .map(|(_, user)| &**user)
    }

    fn forget_presence(&mut self, channel: &str) {
        if let Some(identity) = &mut self.identity {
            identity.presence.retain(|(c, _)| &**c != channel);
        }
    }

    fn signed_in(&self) -> Option<&str> {
        self.identity.as_deref()?.signed_in.as_deref()
    }

    fn socket_id(&self) -> String {
        pusher::socket_id(self.client)
    }
}

/// `/app/{key}?protocol=7&client=…&version=…`.
pub const ENDPOINTS: &[Endpoint] = &[Endpoint {
    path: Path::Prefix("/app/"),
    open,
}];

fn open(req: &Request<'_>, key: &str, gate: &dyn Gate) -> Result<Opening, Refused> {
    if !req.wants_upgrade() {
        if req.method != "GET" {
            return Err(Refused::Method { counted: false });
        }
        return Err(Refused::NotUpgrade);
    }
    let accept = crate::protocol::handshake::validate_upgrade(req).map_err(Refused::Handshake)?;
    let protocol = query_param(req, "protocol").and_then(|p| p.parse::<u32>().ok());
    let app = if !protocol.is_some_and(|p| pusher::PROTOCOLS.contains(&p)) {
        Err(Refusal::Protocol)
    } else {
        gate.app_by_key(key).ok_or(Refusal::UnknownApp)
    };
    Ok(Opening {
        handover: Handover::Pusher {
            accept,
            app,
            deflate: super::websocket::deflate_offer(req),
        },
        subscribe: None,
    })
}

impl Transport for Box<PusherState> {
    fn subscriptions(&self) -> &[Subscription] {
        &self.subs
    }

    fn subscriptions_mut(&mut self) -> &mut [Subscription] {
        &mut self.subs
    }

    fn add_subscription(&mut self, sub: Subscription) {
        self.subs.push(sub);
    }

    fn remove_subscription(&mut self, at: usize) -> Option<Subscription> {
        (at < self.subs.len()).then(|| self.subs.swap_remove(at))
    }

    fn write_opened(&mut self, out: &mut Vec<u8>, client: u32) -> After {
        self.client = client;
        if let Some(refusal) = self.refusal {
            write_error(out, Some(refusal.code()), refusal.message());
            encode_close(out, refusal.code(), refusal.message());
            return After::Close;
        }
        let data = json!({
            "socket_id": self.socket_id(),
            "activity_timeout": pusher::ACTIVITY_TIMEOUT,
        });
        write_event(
            out,
            "pusher:connection_established",
            None,
            &data.to_string(),
        );
        After::Nothing
    }

    fn on_input(&mut self, input: &mut [u8], ctx: &mut Ctx<'_>) -> After {
        feed(self, input, ctx)
    }

    /// `subscription_succeeded`; a presence member's carries the members
    /// (`{"presence":{"ids","hash","count"}}`).
    fn write_joined(&mut self, out: &mut Vec<u8>, channel: &Channel, members: Option<&Members>) {
        let name = pusher::pusher_name(channel.name());
        let data = match members {
            None => "{}".to_string(),
            Some(members) => presence_data(members),
        };
        write_event(
            out,
            "pusher_internal:subscription_succeeded",
            Some(&name),
            &data,
        );
    }

    fn write_join_refused(&mut self, out: &mut Vec<u8>, channel: &str, error: &BrokerError) {
        self.forget_presence(channel);
        let name = pusher::pusher_name(channel);
        let (kind, status) = match error {
            BrokerError::PresenceFull(_) => ("LimitReached", 403),
            _ => ("ServiceUnavailable", 503),
        };
        write_subscription_error(out, &name, kind, &error.to_string(), status);
    }

    /// Pusher subscriptions do not resume: nothing to replay.
    fn write_replay(
        &mut self,
        _out: &mut Vec<u8>,
        _replay: Replay,
        _resume: Resume,
        _: &mut super::Deflater<'_>,
    ) -> super::Replayed {
        super::Replayed::Written(After::Nothing)
    }

    fn expects_input(&self) -> bool {
        true
    }

    fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        write_heartbeat(out);
        After::Nothing
    }

    fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason) {
        let (code, message) = match reason {
            CloseReason::Shutdown => (code::RECONNECT, "server shutting down; reconnect"),
            CloseReason::IdleTimeout => (code::NO_PONG, "nothing heard in time; reconnect"),
            CloseReason::SlowConsumer => (code::OVER_CAPACITY, "slow consumer; reconnect later"),
            CloseReason::TokenExpired => (code::RECONNECT, "authorization expired; reconnect"),
            CloseReason::Unavailable => (code::OVER_CAPACITY, "broker unavailable, retry later"),
            CloseReason::Terminated => (UNAUTHORIZED, "connection terminated for its user"),
        };
        write_error(out, Some(code), message);
        encode_close(out, code, message);
        self.decoder = None;
    }

    /// The 101 is out: the refusal is Pusher's.
    fn write_unavailable(&mut self, out: &mut Vec<u8>, _head_at: usize) {
        Transport::write_close(self, out, CloseReason::Unavailable);
    }

    fn stop_reading(&mut self) {
        self.decoder = None;
    }
}

/// `{"presence":{"ids":[…],"hash":{id:info},"count":N}}` as JSON text.
fn presence_data(members: &Members) -> String {
    let mut ids = Vec::with_capacity(members.len());
    let mut hash = serde_json::Map::with_capacity(members.len());
    for (id, info) in members {
        ids.push(Value::from(id.as_str()));
        // Kept as the client's signed JSON text; checked when it joined.
        let info = serde_json::from_str(info).unwrap_or(Value::Null);
        hash.insert(id.clone(), info);
    }
    json!({ "presence": { "count": ids.len(), "ids": ids, "hash": hash } }).to_string()
}

/// `{"event":…,"channel":…,"data":…}` as a text frame; `data` is a JSON text
/// carried as a string, as Pusher sends it.
fn write_event(out: &mut Vec<u8>, event: &str, channel: Option<&str>, data: &str) {
    let mut body = json!({ "event": event, "data": data });
    if let Some(channel) = channel {
        body["channel"] = Value::from(channel);
    }
    encode_frame(out, opcode::TEXT, body.to_string().as_bytes());
}

/// `pusher:error` with Pusher's code (`None`: a refusal that keeps the connection).
fn write_error(out: &mut Vec<u8>, code: Option<u16>, message: &str) {
    let body = json!({
        "event": "pusher:error",
        "data": { "code": code, "message": message },
    });
    encode_frame(out, opcode::TEXT, body.to_string().as_bytes());
}

fn write_subscription_error(
    out: &mut Vec<u8>,
    channel: &str,
    kind: &str,
    error: &str,
    status: u16,
) {
    let body = json!({
        "event": "pusher:subscription_error",
        "channel": channel,
        "data": { "type": kind, "error": error, "status": status },
    });
    encode_frame(out, opcode::TEXT, body.to_string().as_bytes());
}

/// The `data` of Pusher's `member_added` (`{"user_id","user_info"}`) or, with
/// no `user_info`, `member_removed` (`{"user_id"}`).
fn member_data(user_id: &str, user_info: Option<&str>) -> String {
    let id = Value::from(user_id);
    match user_info {
        Some(info) => format!("{{\"user_id\":{id},\"user_info\":{info}}}"),
        None => format!("{{\"user_id\":{id}}}"),
    }
}

/// A message as Pusher subscribers get it: `{"event","channel","data"}` with the
/// payload as the data string (an event published without a name is
/// `"message"`); `None` for channel events, which Pusher clients do not see.
pub fn encode(message: &Message) -> Option<Bytes> {
    let channel = pusher::pusher_name(message.channel.name());
    let presence;
    let (payload, kind, event, user_id) = match &message.body {
        Body::Data {
            payload,
            kind,
            event,
            from,
            ..
        } => (
            payload,
            *kind,
            event.as_deref().unwrap_or("message"),
            from.as_deref(),
        ),
        Body::Presence {
            change,
            user_id,
            user_info,
            ..
        } => {
            presence = Bytes::from(member_data(user_id, user_info.as_deref()));
            let event = match change {
                PresenceChange::Joined => "pusher_internal:member_added",
                PresenceChange::Left => "pusher_internal:member_removed",
            };
            (&presence, DataKind::Text, event, None)
        }
        Body::Event { .. } | Body::CloseAll | Body::NewEpoch { .. } => return None,
    };
    let mut body = Vec::with_capacity(payload.len() + channel.len() + event.len() + 48);
    body.extend_from_slice(b"{\"event\":");
    let _ = serde_json::to_writer(&mut body, event);
    // Channel names are validated to need no escaping.
    body.extend_from_slice(b",\"channel\":\"");
    body.extend_from_slice(channel.as_bytes());
    body.extend_from_slice(b"\",\"data\":");
    json_data(&mut body, payload, kind);
    if let Some(user_id) = user_id {
        body.extend_from_slice(b",\"user_id\":");
        let _ = serde_json::to_writer(&mut body, user_id);
    }
    body.push(b'}');
    Some(frame_bytes(opcode::TEXT, &body))
}

/// Runs the decoder over `data`, handling each Pusher message; answers go to
/// `ctx.out`, subscriptions asked for to `ctx.changes`.
fn feed(state: &mut PusherState, data: &mut [u8], ctx: &mut Ctx<'_>) -> After {
    let mut decoder = super::websocket::decoder_for(state.decoder.take(), ctx.deflate);
    let max_message = ctx.config.max_message_size;
    let mut after = After::Nothing;
    let result = decoder.feed(data, max_message, |event| match event {
        Event::Message {
            kind: DataKind::Text,
            payload,
        } => {
            if on_message(state, payload, ctx) == After::Close {
                after = After::Close;
                Flow::Stop
            } else {
                Flow::Continue
            }
        }
        Event::Message { .. } => {
            write_error(ctx.out, None, "binary messages are not Pusher messages");
            Flow::Continue
        }
        control => answer_control(ctx.out, &control, &mut after),
    });
    finish_feed(result, decoder, &mut state.decoder, after, ctx)
}

/// One Pusher message from the client. A malformed one gets `pusher:error` and
/// the connection goes on; `Close` after a refused sign-in.
fn on_message(state: &mut PusherState, text: &[u8], ctx: &mut Ctx<'_>) -> After {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(text) else {
        write_error(ctx.out, None, "a Pusher message is a JSON object");
        return After::Nothing;
    };
    let Some(event) = message.get("event").and_then(Value::as_str) else {
        write_error(ctx.out, None, "a Pusher message has an \"event\" string");
        return After::Nothing;
    };
    // `data` comes as an object, or as JSON text in a string (older clients).
    let parsed;
    let data = match message.get("data") {
        Some(Value::String(text)) => {
            parsed = serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
            &parsed
        }
        Some(data) => data,
        None => &Value::Null,
    };
    match event {
        "pusher:ping" => write_event(ctx.out, "pusher:pong", None, "{}"),
        "pusher:pong" => {}
        "pusher:subscribe" => subscribe(state, data, ctx),
        "pusher:unsubscribe" => {
            if let Some(name) = data.get("channel").and_then(Value::as_str)
                && let Some(app) = ctx.config.pusher_apps.get(usize::from(state.app))
                && pusher::validate_channel_name(name).is_ok()
            {
                let channel = pusher::throng_channel(&app.id, name);
                state.forget_presence(&channel);
                ctx.changes.push(Change::Leave(channel));
            }
        }
        "pusher:signin" => return signin(state, data, ctx),
        client if client.starts_with("client-") => client_event(state, &message, client, ctx),
        other => {
            let shown: String = other.chars().take(64).collect();
            write_error(ctx.out, None, &format!("unknown event '{shown}'"));
        }
    }
    After::Nothing
}

/// `pusher:subscribe`: checks the channel's name and signature, then asks the
/// server to join it; the answer (`subscription_succeeded`) follows the join.
fn subscribe(state: &mut PusherState, data: &Value, ctx: &mut Ctx<'_>) {
    let Some(name) = data.get("channel").and_then(Value::as_str) else {
        write_error(ctx.out, None, "pusher:subscribe needs data.channel");
        return;
    };
    let refuse = |out: &mut Vec<u8>, kind: &str, error: &str, status: u16| {
        let shown: String = name.chars().take(pusher::MAX_CHANNEL_NAME).collect();
        write_subscription_error(out, &shown, kind, error, status);
    };
    if let Err(e) = pusher::validate_channel_name(name) {
        refuse(ctx.out, "InvalidChannel", &e.to_string(), 400);
        return;
    }
    let Some(app) = ctx.config.pusher_apps.get(usize::from(state.app)) else {
        refuse(ctx.out, "AppNotFound", "this connection's app is gone", 404);
        return;
    };
    let channel = pusher::throng_channel(&app.id, name);
    if state.subs.iter().any(|s| s.channel.name() == channel) {
        // Already subscribed: say so again rather than join twice.
        write_event(
            ctx.out,
            "pusher_internal:subscription_succeeded",
            Some(name),
            "{}",
        );
        return;
    }
    let pending = ctx
        .changes
        .iter()
        .filter(|c| matches!(c, Change::Join { .. }))
        .count();
    if state.subs.len() + pending >= pusher::MAX_SUBSCRIPTIONS {
        let error = format!(
            "a connection holds at most {} subscriptions",
            pusher::MAX_SUBSCRIPTIONS
        );
        refuse(ctx.out, "LimitReached", &error, 429);
        return;
    }
    let kind = ChannelKind::of(name);
    let channel_data = match kind {
        ChannelKind::Presence => match data.get("channel_data").and_then(Value::as_str) {
            Some(text) => Some(text),
            None => {
                let error = "a presence channel needs channel_data, signed with auth";
                refuse(ctx.out, "AuthError", error, 401);
                return;
            }
        },
        _ => None,
    };
    if kind == ChannelKind::User {
        let user = name.strip_prefix(pusher::USER_CHANNEL_PREFIX);
        if user.is_none() || state.signed_in() != user {
            let error = "a user's channel is for a connection signed in as that user";
            refuse(ctx.out, "AuthError", error, 403);
            return;
        }
    }
    if kind.signed() {
        let auth = data.get("auth").and_then(Value::as_str);
        let socket_id = state.socket_id();
        if let Err(e) = sign::check_channel_auth(app, &socket_id, name, channel_data, auth) {
            refuse(ctx.out, "AuthError", &e.to_string(), 401);
            return;
        }
    }
    let presence = match channel_data.map(|text| presence_user(text, app.max_presence_members)) {
        None => None,
        Some(Ok(user)) => Some(Box::new(user)),
        Some(Err(error)) => {
            refuse(ctx.out, "InvalidChannelData", &error, 400);
            return;
        }
    };
    if let Some(user) = &presence {
        let joined = &mut state.identity().presence;
        // Most connections join one presence channel: room for one, not the
        // four a first push would make.
        joined.reserve_exact(1);
        joined.push((channel.as_str().into(), user.user_id.clone()));
    }
    ctx.changes.push(join(channel, presence, state.client));
}

/// Asks the server to join `channel` for client `client`.
fn join(channel: String, presence: Option<Box<PresenceUser>>, client: u32) -> Change {
    Change::Join {
        subscribe: Subscribe {
            channel,
            format: Format::Pusher,
            resume: None,
            name: None,
            expires: None,
            presence,
        },
        client,
    }
}

/// Pusher's code for a connection whose sign-in is refused: it is closed.
const UNAUTHORIZED: u16 = 4009;

/// `pusher:signin`: checks `auth` over `user_data` (a JSON object with an `id`);
/// `pusher:signin_success`, after which the client may subscribe to its user's
/// channel. A refused sign-in closes the connection with 4009, as Pusher's does.
fn signin(state: &mut PusherState, data: &Value, ctx: &mut Ctx<'_>) -> After {
    let refuse = |out: &mut Vec<u8>, reason: &str| {
        write_error(out, Some(UNAUTHORIZED), reason);
        encode_close(out, UNAUTHORIZED, "sign-in refused");
        After::Close
    };
    let Some(app) = ctx.config.pusher_apps.get(usize::from(state.app)) else {
        return refuse(ctx.out, "this connection's app is gone");
    };
    let Some(user_data) = data.get("user_data").and_then(Value::as_str) else {
        return refuse(ctx.out, "pusher:signin needs user_data, a JSON string");
    };
    let auth = data.get("auth").and_then(Value::as_str);
    if let Err(e) = sign::check_signin(app, &state.socket_id(), user_data, auth) {
        return refuse(ctx.out, &e.to_string());
    }
    let id = match serde_json::from_str::<Value>(user_data) {
        Ok(Value::Object(user)) => match user.get("id") {
            Some(Value::String(id)) if pusher::validate_user_id(id).is_ok() => id.clone(),
            _ => {
                let reason = "user_data needs an id: 1-128 bytes of A-Z a-z 0-9 _ - = @ , . ;";
                return refuse(ctx.out, reason);
            }
        },
        _ => return refuse(ctx.out, "user_data is a JSON object"),
    };
    // Its user's channel: what `sendToUser` reaches and what ending the user's
    // connections closes. Joined here, so that holds whatever the client does.
    let user_channel =
        |id: &str| pusher::throng_channel(&app.id, &format!("{}{id}", pusher::USER_CHANNEL_PREFIX));
    if let Some(before) = state.signed_in()
        && before != id
    {
        // Signed in as someone else now: the old user's channel is not its own.
        ctx.changes.push(Change::Leave(user_channel(before)));
    }
    let channel = user_channel(&id);
    if !state.subs.iter().any(|s| s.channel.name() == channel) {
        ctx.changes.push(join(channel, None, state.client));
    }
    state.identity().signed_in = Some(id.into());
    let body = json!({ "user_data": user_data }).to_string();
    write_event(ctx.out, "pusher:signin_success", None, &body);
    After::Nothing
}

/// Longest presence user id (Pusher's limit).
const MAX_USER_ID: usize = 128;
/// Longest `user_info`, as JSON text (Pusher's limit).
const MAX_USER_INFO: usize = 1024;

/// A presence member's user from its signed `channel_data`
/// (`{"user_id": string or number, "user_info": any}`).
fn presence_user(text: &str, limit: usize) -> Result<PresenceUser, String> {
    let Ok(Value::Object(data)) = serde_json::from_str::<Value>(text) else {
        return Err("channel_data is a JSON object".into());
    };
    let user_id = match data.get("user_id") {
        Some(Value::String(id)) => id.clone(),
        Some(Value::Number(id)) => id.to_string(),
        _ => return Err("channel_data needs user_id, a string or a number".into()),
    };
    if user_id.is_empty() || user_id.len() > MAX_USER_ID || user_id.chars().any(char::is_control) {
        return Err(format!(
            "user_id is 1-{MAX_USER_ID} bytes without control characters"
        ));
    }
    let user_info = data.get("user_info").unwrap_or(&Value::Null).to_string();
    if user_info.len() > MAX_USER_INFO {
        return Err(format!(
            "user_info is at most {MAX_USER_INFO} bytes of JSON"
        ));
    }
    Ok(PresenceUser {
        user_id: user_id.into(),
        user_info: user_info.into(),
        limit,
    })
}

/// A client event (`client-*`): forwarded to the other subscribers of a private
/// or presence channel this connection is in, when the server allows them, at
/// most [`CLIENT_EVENTS_PER_SECOND`]; its data as the client sent it.
fn client_event(
    state: &mut PusherState,
    message: &serde_json::Map<String, Value>,
    event: &str,
    ctx: &mut Ctx<'_>,
) {
    let Some(app) = ctx.config.pusher_apps.get(usize::from(state.app)) else {
        return;
    };
    if !app.client_events {
        let reason = "client events are not enabled for this app (--pusher-client-events on, or client-events in its [[pusher-app]])";
        write_error(ctx.out, None, reason);
        return;
    }
    if let Err(e) = crate::rules::validate_event_name(event) {
        write_error(ctx.out, None, &e.to_string());
        return;
    }
    let Some(name) = message.get("channel").and_then(Value::as_str) else {
        write_error(ctx.out, None, "a client event needs \"channel\"");
        return;
    };
    if !ChannelKind::of(name).signed() {
        let reason = "client events are only for private and presence channels";
        write_error(ctx.out, None, reason);
        return;
    }
    let channel = pusher::throng_channel(&app.id, name);
    if !state.subs.iter().any(|s| s.channel.name() == channel) {
        let shown: String = name.chars().take(pusher::MAX_CHANNEL_NAME).collect();
        write_error(ctx.out, None, &format!("not subscribed to '{shown}'"));
        return;
    }
    let now = crate::history::now_secs();
    if state.events_second != now {
        state.events_second = now;
        state.events_sent = 0;
    }
    if state.events_sent >= CLIENT_EVENTS_PER_SECOND {
        let reason = format!("client event rejected: at most {CLIENT_EVENTS_PER_SECOND} a second");
        write_error(ctx.out, Some(code::RATE_LIMIT), &reason);
        return;
    }
    state.events_sent += 1;
    let data = message.get("data").unwrap_or(&Value::Null);
    let payload = data.to_string();
    if payload.len() > ctx.config.max_message_size {
        let reason = format!(
            "client event data is {} bytes; at most {}",
            payload.len(),
            ctx.config.max_message_size
        );
        write_error(ctx.out, None, &reason);
        return;
    }
    let user_id = state.presence_user(&channel);
    let outgoing = Outgoing {
        payload: payload.as_bytes(),
        kind: DataKind::Text,
        // Pusher names the sender of a client event on a presence channel.
        from: user_id,
        event: Some(event),
        skip: Some(SocketId::local(state.client)),
    };
    match ctx.broker.publish(&channel, outgoing) {
        Ok(_) => {
            ctx.counts.published += 1;
            if let Some(hooks) = ctx.hooks {
                let socket = pusher::socket_id(state.client);
                hooks.client_event(&channel, event, &payload, &socket, user_id);
            }
        }
        Err(e) => write_error(ctx.out, Some(code::OVER_CAPACITY), &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_pusher_connection_keeps_little() {
        // Boxed in its session: this is what a Pusher connection adds to a
        // WebSocket's record, one subscription held inline.
        let size = std::mem::size_of::<PusherState>();
        assert!(size <= 72, "PusherState is {size} bytes");
    }
}
