//! The transport seam: how a connection is opened from a request, receives channel
//! messages, is kept alive and closed, one file per transport (WebSocket, SSE,
//! long-poll, and the Pusher Channels protocol over WebSocket), and [`replay`], the
//! shared way a stream transport's long replay is framed as the socket takes it.
//!
//! A transport contributes, in its own file: its endpoints (the request paths it
//! opens from and the parameters it reads, [`request`]), its [`Format`]s (each an
//! encoding of a hub message, made once per message and shared by every subscriber
//! that uses it), its per-connection state (only what an idle connection needs)
//! and that state's [`Transport`] behaviour: input, welcome and replay, heartbeat,
//! goodbye. Registering it is one line of the `transports!` table below, which
//! makes its [`Kind`] (what per-transport counts are indexed by), its [`Session`]
//! variant and its place among the server's [`ENDPOINTS`]; a new format also
//! takes its place in [`Format`]. The hub and the event loop never name a
//! transport. This module must not own sockets, keep time or write HTTP answers
//! other than a transport's own: the server hands a transport bytes and a place to
//! put its answers.

pub mod poll;
pub mod pusher;
pub mod replay;
pub mod request;
pub mod sse;
pub mod websocket;

use std::sync::Arc;

use bytes::Bytes;

use crate::broker::asked::Ticket;
use crate::broker::{Broker, BrokerError, Members, Replay, Resume};
use crate::config::ServeConfig;
use crate::hub::{Channel, Message};
pub use crate::protocol::deflate::Compression;
use crate::protocol::deflate::{self, Agreement};
use crate::rules::ChannelRules;
use crate::stats::OPEN_KINDS;
use crate::stats::{LoopCounters, TurnCounts};

pub use replay::Replayed;
pub use request::{Endpoint, Gate, Refused};

/// How a subscriber receives messages: one encoding of a [`Message`] each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// WebSocket, the payload alone (text or binary as published).
    WsRaw,
    /// WebSocket, `{"channel","seq","data"}` envelopes and channel events.
    WsJson,
    /// Server-Sent Events: `id: SEQ:EPOCH` and `data:` lines; channel events.
    Sse,
    /// A long-poll's whole answer carrying one message.
    Poll,
    /// Pusher's `{"event","channel","data"}` (data messages only).
    Pusher,
}

// Every format needs its slot in a message's encodings.
const _: () = assert!(Format::COUNT <= crate::hub::ENCODINGS);

impl Format {
    /// How many formats exist: the encodings a message can cache.
    pub const COUNT: usize = 5;
    /// Every format.
    pub const ALL: [Format; Format::COUNT] = [
        Format::WsRaw,
        Format::WsJson,
        Format::Sse,
        Format::Poll,
        Format::Pusher,
    ];

    /// Whether subscribers in this format see channel events (welcome/join/leave).
    pub fn listens(self) -> bool {
        match self {
            Format::WsRaw | Format::Poll | Format::Pusher => false,
            Format::WsJson | Format::Sse => true,
        }
    }

    /// Whether its subscribers are members the channel announces (join/leave). A
    /// long-poll comes and goes with every answer: it is not.
    pub fn announced(self) -> bool {
        !matches!(self, Format::Poll | Format::Pusher)
    }

    /// Whether one delivery ends the subscription (a long-poll's answer).
    pub fn one_shot(self) -> bool {
        self == Format::Poll
    }

    /// The message in this format, encoded by the first caller and then shared;
    /// `None` when the format does not show it.
    pub fn frame(self, message: &Message) -> Option<&Bytes> {
        message.encoded(self as usize, |m| match self {
            Format::WsRaw => websocket::encode(false, m),
            Format::WsJson => websocket::encode(true, m),
            Format::Sse => sse::encode(m),
            Format::Poll => poll::encode(m),
            Format::Pusher => pusher::encode(m),
        })
    }
}

impl Format {
    /// The message in this format for a subscriber whose WebSocket compresses with
    /// a `window_bits` window (0: it does not): compressed once per window and then
    /// shared, or the plain frame when it is too short to compress, or not a
    /// WebSocket frame.
    pub fn frame_for(
        self,
        message: &Message,
        window_bits: u8,
        compression: Compression,
    ) -> Option<&Bytes> {
        let plain = self.frame(message)?;
        let window = window_bits.wrapping_sub(deflate::MIN_COMPRESS_WINDOW_BITS);
        if window_bits == 0 || window > 6 || !self.is_websocket() {
            return Some(plain);
        }
        let slot = self as usize * 7 + usize::from(window);
        let compressed = message.deflated(slot, |_| {
            websocket::compress_frame(plain, window_bits, compression)
        });
        Some(compressed.unwrap_or(plain))
    }

    /// Whether its encodings are WebSocket frames (which permessage-deflate can
    /// compress; an event stream or a long-poll's answer is not).
    pub fn is_websocket(self) -> bool {
        matches!(self, Format::WsRaw | Format::WsJson | Format::Pusher)
    }
}

// Every compressed encoding needs its slot in a message.
const _: () = assert!(Format::COUNT * 7 <= crate::hub::DEFLATED);

/// A message's data as the JSON transports show it: a string for text; for binary,
/// base64 followed by `"encoding":"base64"` (so it ends inside the enclosing object).
pub(crate) fn json_data(out: &mut Vec<u8>, payload: &[u8], kind: crate::protocol::DataKind) {
    use base64::Engine;
    match kind {
        crate::protocol::DataKind::Text => {
            let text = String::from_utf8_lossy(payload);
            // Serializing a str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, text.as_ref());
        }
        crate::protocol::DataKind::Binary => {
            out.push(b'"');
            let encoded = base64::engine::general_purpose::STANDARD.encode(payload);
            out.extend_from_slice(encoded.as_bytes());
            out.extend_from_slice(b"\",\"encoding\":\"base64\"");
        }
    }
}

/// How one connection's messages may be compressed: the permessage-deflate window
/// it negotiated (0: none, everything goes plain), how, and where the saving is
/// counted.
pub struct Deflater<'a> {
    pub window_bits: u8,
    pub compression: Compression,
    pub counts: &'a mut TurnCounts,
    /// The loop's own counters, where a replay made later counts (none: such
    /// slices go uncounted, as in unit tests).
    pub shared: Option<&'a Arc<LoopCounters>>,
}

/// A connection a route hands to a transport.
#[derive(Debug)]
pub struct Opening {
    pub handover: Handover,
    /// The channel to subscribe to; `None`: echo.
    pub subscribe: Option<Subscribe>,
}

/// A subscription a route asked for.
#[derive(Debug)]
pub struct Subscribe {
    pub channel: String,
    pub format: Format,
    /// Where a returning subscriber left off (`since=`, `epoch=`).
    pub resume: Option<Resume>,
    /// The name a chat client chose (`name=`) or its token gave it (`sub`).
    pub name: Option<Box<str>>,
    /// When its token expires (Unix seconds), with `--token-secret`.
    pub expires: Option<u32>,
    /// Its user, for a Pusher presence channel.
    pub presence: Option<Box<PresenceUser>>,
}

/// A Pusher presence channel's user, as its signed `channel_data` says.
#[derive(Debug, Clone)]
pub struct PresenceUser {
    pub user_id: Box<str>,
    /// `user_info`, JSON text (`null` when none was given).
    pub user_info: Box<str>,
    /// Most users the channel may have.
    pub limit: usize,
}

/// What a transport needs to take a connection over from HTTP.
#[derive(Debug)]
pub enum Handover {
    /// A valid upgrade request; its `Sec-WebSocket-Accept` value and the
    /// permessage-deflate offer it made that the server can accept.
    WebSocket {
        accept: [u8; 28],
        deflate: Option<Agreement>,
    },
    /// A `GET /sse/{channel}`: the response becomes an event stream.
    Sse,
    /// A `GET /poll/{channel}`: answered once, at the latest after `timeout`.
    Poll { timeout: std::time::Duration },
    /// A valid upgrade to `/app/{key}`: its accept value, and its app's place
    /// among `--pusher-app`s or why the connection is refused once upgraded.
    Pusher {
        accept: [u8; 28],
        app: Result<u16, pusher::Refusal>,
        deflate: Option<Agreement>,
    },
}

impl Handover {
    /// Answers without permessage-deflate (`--permessage-deflate` is off).
    pub fn decline_deflate(&mut self) {
        match self {
            Handover::WebSocket { deflate, .. } | Handover::Pusher { deflate, .. } => {
                *deflate = None
            }
            Handover::Sse | Handover::Poll { .. } => {}
        }
    }

    /// The window the connection's messages are compressed with: 0 when it did
    /// not negotiate permessage-deflate.
    pub fn deflate_window(&self) -> u8 {
        match self {
            Handover::WebSocket { deflate, .. } | Handover::Pusher { deflate, .. } => {
                deflate.map_or(0, |a| a.server_window_bits)
            }
            Handover::Sse | Handover::Poll { .. } => 0,
        }
    }

    /// Appends the response that hands the connection over (the 101).
    pub fn write_head(&self, out: &mut Vec<u8>) {
        match self {
            Handover::WebSocket { accept, deflate }
            | Handover::Pusher {
                accept, deflate, ..
            } => websocket::write_opening(out, accept, deflate.as_ref()),
            Handover::Sse => sse::write_opening(out),
            // The answer is written whole, once there is one.
            Handover::Poll { .. } => {}
        }
    }

    /// The session the handed-over connection continues in.
    pub fn session(&self, sub: Option<Subscription>) -> Session {
        match self {
            Handover::WebSocket { .. } => Session::WebSocket(websocket::WsState::new(sub)),
            Handover::Sse => Session::Sse(sse::SseState { sub }),
            Handover::Poll { .. } => Session::Poll(Box::new(poll::PollState {
                sub,
                ..poll::PollState::default()
            })),
            Handover::Pusher { app, .. } => {
                Session::Pusher(Box::new(pusher::PusherState::new(*app)))
            }
        }
    }

    /// How long the connection may wait before it must be answered (a long-poll);
    /// its heartbeat is then that answer.
    pub fn answer_within(&self) -> Option<std::time::Duration> {
        match self {
            Handover::Poll { timeout } => Some(*timeout),
            Handover::WebSocket { .. } | Handover::Sse | Handover::Pusher { .. } => None,
        }
    }
}

/// A subscriber's place in its channel.
#[derive(Debug)]
pub struct Subscription {
    pub channel: Arc<Channel>,
    /// The client's id (its name in chat, `c<id>`, unless it chose one: chosen
    /// names are kept by the loop's subscriber lists, so that every idle
    /// subscription stays this small).
    pub client: u32,
    /// When its token expires (Unix seconds; 0: it has none): the loop closes it then.
    pub expires: u32,
    /// Position in its loop's subscriber list of the channel, for O(1) removal.
    pub index: u32,
    pub format: Format,
    pub rules: ChannelRules,
}

/// What a connection asked the server to do after its input was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Nothing,
    /// A final answer (a close frame, a last response) is in the output: flush it,
    /// then shut the connection down.
    Close,
}

/// Why the server ends a connection on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The server is draining (SIGTERM/SIGINT).
    Shutdown,
    /// Nothing heard from the client for `--idle-timeout`.
    IdleTimeout,
    /// More than `--max-queue` bytes waited for the client.
    SlowConsumer,
    /// The subscription's token expired: come back with a fresh one.
    TokenExpired,
    /// The broker could not take the subscription.
    Unavailable,
    /// Its channel's subscribers were told to go (a user's connections ended
    /// through the API).
    Terminated,
}

/// Told of what a client did that someone outside the server may want to hear
/// of; a transport calls it after the broker took what the client sent. The
/// server wires in the implementation (a Pusher app's webhooks): no transport
/// names it.
pub trait Hooks: Send + Sync {
    /// A client published `event` with `data` on `channel` itself (a Pusher
    /// client event): `socket` names its connection as its protocol does,
    /// `user_id` is its presence user, if any.
    fn client_event(
        &self,
        channel: &str,
        event: &str,
        data: &str,
        socket: &str,
        user_id: Option<&str>,
    );
}

/// What a transport may use while handling a connection's input.
pub struct Ctx<'a> {
    /// Answers to this connection, written out once the input is handled.
    pub out: &'a mut Vec<u8>,
    pub broker: &'a dyn Broker,
    /// Who the broker answers about a message handed to it (a chat member's,
    /// through Redis): this connection.
    pub ticket: Ticket,
    pub config: &'a ServeConfig,
    /// Who hears of what clients do besides its channel's subscribers (a
    /// Pusher app's webhooks), when anyone does.
    pub hooks: Option<&'a dyn Hooks>,
    pub counts: &'a mut TurnCounts,
    /// The name this chat client chose (`name=`), if it did.
    pub chosen_name: Option<&'a str>,
    /// Subscriptions a multiplexing transport asks for; the server carries them
    /// out once the input is handled.
    pub changes: &'a mut Vec<Change>,
    /// The permessage-deflate window the connection negotiated (0: none): its
    /// client may send compressed messages, and its answers may be compressed.
    pub deflate: u8,
    /// The loop's chat buckets: a chat message over its connection's rate is
    /// refused (`--chat-rate`).
    pub chat: &'a mut crate::rate::ChatLimiter,
}

/// A change of a connection's subscriptions that its transport asks the server
/// for (a Pusher `subscribe` or `unsubscribe`). After a join the server calls
/// [`Transport::write_joined`] or [`Transport::write_join_refused`].
#[derive(Debug)]
pub enum Change {
    Join {
        subscribe: Subscribe,
        client: u32,
    },
    /// Leave the channel of this name (nothing if not subscribed).
    Leave(String),
}

/// What a handed-over connection's transport does with it. Each transport's state
/// implements it in the transport's file; the server calls it through
/// [`Session`] and never names a transport.
pub trait Transport {
    /// The subscriptions this connection holds: at most one, but for a transport
    /// that multiplexes channels over one connection (Pusher's).
    fn subscriptions(&self) -> &[Subscription];
    fn subscriptions_mut(&mut self) -> &mut [Subscription];
    /// Keeps a subscription the server made for this connection.
    fn add_subscription(&mut self, sub: Subscription);
    /// Gives back the subscription at `at` in [`Transport::subscriptions`].
    fn remove_subscription(&mut self, at: usize) -> Option<Subscription>;

    /// The connection is handed over (its head is written) to client `client`:
    /// appends the transport's greeting, if it has one. `Close`: the greeting
    /// was a refusal.
    fn write_opened(&mut self, _out: &mut Vec<u8>, _client: u32) -> After {
        After::Nothing
    }

    /// A subscription asked for by a [`Change::Join`] was made; a presence
    /// member's comes with the members.
    fn write_joined(&mut self, _out: &mut Vec<u8>, _channel: &Channel, _members: Option<&Members>) {
    }

    /// A subscription asked for by a [`Change::Join`] was refused by the broker.
    fn write_join_refused(&mut self, _out: &mut Vec<u8>, _channel: &str, _error: &BrokerError) {}

    /// Handles what the client sent; answers go to `ctx.out`. Receive-only
    /// transports ignore whatever the client sends after its request.
    fn on_input(&mut self, _input: &mut [u8], _ctx: &mut Ctx<'_>) -> After {
        After::Nothing
    }

    /// Appends a new subscriber's greeting (a chat welcome), if the transport has one.
    fn write_welcome(&self, _out: &mut Vec<u8>, _count: u64, _chosen_name: Option<&str>) {}

    /// Appends what a returning subscriber missed (and, where the transport can say
    /// so, the epoch and any gap), ahead of every live message. `Written(Close)`:
    /// that was the whole answer (a long-poll's); `Fed`: the rest is made as the
    /// socket takes it. Its frames are compressed as `deflater` says, where the
    /// transport's frames can be.
    fn write_replay(
        &mut self,
        out: &mut Vec<u8>,
        replay: Replay,
        resume: Resume,
        deflater: &mut Deflater<'_>,
    ) -> Replayed;

    /// Whether the client is expected to send something now and then (a pong at
    /// least), so silence past `--idle-timeout` means it is gone. An event stream's
    /// client sends nothing; a dead one shows when a heartbeat cannot be written.
    fn expects_input(&self) -> bool {
        false
    }

    /// Appends a keep-alive for the client; `Close`: it was the last answer (a
    /// long-poll's empty one).
    fn write_heartbeat(&self, out: &mut Vec<u8>) -> After;

    /// Appends the transport's goodbye for `reason`, and stops reading: after it,
    /// input is of no use.
    fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason);

    /// The broker refused the subscription. The head written at `head_at` has not
    /// left yet: by default it becomes a 503 that says "come back" to EventSource,
    /// proxies and clients alike (an empty 200 or a bare EOF would not).
    fn write_unavailable(&mut self, out: &mut Vec<u8>, head_at: usize) {
        out.truncate(head_at);
        crate::protocol::http::write_error(
            out,
            503,
            "broker unavailable, retry later",
            &[("Retry-After", "1")],
        );
    }

    /// Drops any half-received input.
    fn stop_reading(&mut self) {}
}

/// The subscription methods of a transport whose state keeps at most one, in
/// `self.sub: Option<Subscription>`.
macro_rules! one_subscription {
    () => {
        fn subscriptions(&self) -> &[crate::transport::Subscription] {
            self.sub.as_slice()
        }

        fn subscriptions_mut(&mut self) -> &mut [crate::transport::Subscription] {
            self.sub.as_mut_slice()
        }

        fn add_subscription(&mut self, sub: crate::transport::Subscription) {
            self.sub = Some(sub);
        }

        fn remove_subscription(&mut self, at: usize) -> Option<crate::transport::Subscription> {
            if at == 0 { self.sub.take() } else { None }
        }
    };
}
pub(crate) use one_subscription;

/// Registers the transports: one line each, `Kind: State = "name", module`. Makes
/// [`Kind`], [`Session`] (one variant per transport, dispatching to its
/// [`Transport`] impl) and [`ENDPOINTS`] (the module's `ENDPOINTS`, in order).
macro_rules! transports {
    ($($kind:ident: $state:ty = $name:literal, $module:ident;)+) => {
        /// Which transport a connection speaks; per-transport counts are indexed by it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Kind {
            $($kind,)+
        }

        impl Kind {
            /// Every transport, in registration order.
            pub const ALL: &'static [Kind] = &[$(Kind::$kind,)+];

            /// Its name in metrics, `/api/stats` and the dashboard.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)+
                }
            }
        }

        /// A handed-over connection's transport state: one variant per transport,
        /// holding only what that transport needs between reads.
        #[derive(Debug)]
        pub enum Session {
            $($kind($state),)+
        }

        impl Session {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Session::$kind(_) => Kind::$kind,)+
                }
            }

            /// Its transport's behaviour.
            pub fn transport(&self) -> &dyn Transport {
                match self {
                    $(Session::$kind(state) => state,)+
                }
            }

            pub fn transport_mut(&mut self) -> &mut dyn Transport {
                match self {
                    $(Session::$kind(state) => state,)+
                }
            }
        }

        /// Every transport's endpoints, in the order routes try them.
        pub const ENDPOINTS: &[&[Endpoint]] = &[$($module::ENDPOINTS,)+];
    };
}

transports! {
    WebSocket: websocket::WsState = "websocket", websocket;
    Sse: sse::SseState = "sse", sse;
    Poll: Box<poll::PollState> = "poll", poll;
    Pusher: Box<pusher::PusherState> = "pusher", pusher;
}

// Every transport needs its slot among the per-transport counters.
const _: () = assert!(Kind::ALL.len() <= OPEN_KINDS);

impl Kind {
    /// Its slot in per-transport counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Per-transport counts (a `Snapshot`'s `open`) by name, in registration order.
    pub fn named(counts: &[u64; OPEN_KINDS]) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Kind::ALL.iter().map(|k| (k.name(), counts[k.index()]))
    }

    /// The same as a JSON object (`{"websocket":N,"sse":N,"poll":N}`).
    pub fn json(counts: &[u64; OPEN_KINDS]) -> serde_json::Value {
        Kind::named(counts)
            .map(|(name, n)| (name.to_string(), serde_json::Value::from(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl Session {
    pub fn subscriptions(&self) -> &[Subscription] {
        self.transport().subscriptions()
    }

    /// Its subscription of `channel` (compared by identity), if it has one.
    pub fn subscription_of(&self, channel: &Arc<Channel>) -> Option<&Subscription> {
        self.subscriptions()
            .iter()
            .find(|s| Arc::ptr_eq(&s.channel, channel))
    }

    pub fn subscription_of_mut(&mut self, channel: &Arc<Channel>) -> Option<&mut Subscription> {
        self.transport_mut()
            .subscriptions_mut()
            .iter_mut()
            .find(|s| Arc::ptr_eq(&s.channel, channel))
    }

    /// Takes one of its subscriptions out: of the channel named `channel`, or
    /// any when `None`.
    pub fn take_subscription(&mut self, channel: Option<&str>) -> Option<Subscription> {
        let transport = self.transport_mut();
        let at = match channel {
            None => 0,
            Some(name) => transport
                .subscriptions()
                .iter()
                .position(|s| s.channel.name() == name)?,
        };
        transport.remove_subscription(at)
    }
}
