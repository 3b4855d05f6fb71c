//! The transport seam: how a connection receives channel messages and is kept alive
//! and closed, one file per transport (WebSocket today; SSE and long-poll later).
//!
//! A transport contributes its [`Format`]s (each an encoding of a hub message, made
//! once per message and shared by every subscriber that uses it), its per-connection
//! state (kept in the server's connection record; only what an idle connection needs),
//! and how it heartbeats and closes. Registering a transport means adding its
//! formats to [`Format`] and its state to the server's session enum; the hub and the
//! event loop's core stay untouched. This module must not own sockets or decide
//! routes: the server hands a transport bytes and a place to put its answers.

pub mod poll;
pub mod sse;
pub mod websocket;

use std::sync::Arc;

use bytes::Bytes;

use crate::broker::{Broker, Resume};
use crate::config::ServeConfig;
use crate::hub::{Channel, Message};
use crate::rules::ChannelRules;
use crate::stats::TurnCounts;

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
}

// Every format needs its slot in a message's encodings.
const _: () = assert!(Format::COUNT <= crate::hub::ENCODINGS);

impl Format {
    /// How many formats exist: the encodings a message can cache.
    pub const COUNT: usize = 4;

    /// Whether subscribers in this format see channel events (welcome/join/leave).
    pub fn listens(self) -> bool {
        match self {
            Format::WsRaw | Format::Poll => false,
            Format::WsJson | Format::Sse => true,
        }
    }

    /// Whether its subscribers are members the channel announces (join/leave). A
    /// long-poll comes and goes with every answer: it is not.
    pub fn announced(self) -> bool {
        self != Format::Poll
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
        })
    }
}

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
}

/// What a transport needs to take a connection over from HTTP.
#[derive(Debug)]
pub enum Handover {
    /// A valid upgrade request; its `Sec-WebSocket-Accept` value.
    WebSocket { accept: [u8; 28] },
    /// A `GET /sse/{channel}`: the response becomes an event stream.
    Sse,
    /// A `GET /poll/{channel}`: answered once, at the latest after `timeout`.
    Poll { timeout: std::time::Duration },
}

impl Handover {
    /// Appends the response that hands the connection over (the 101).
    pub fn write_head(&self, out: &mut Vec<u8>) {
        match self {
            Handover::WebSocket { accept } => websocket::write_opening(out, accept),
            Handover::Sse => sse::write_opening(out),
            // The answer is written whole, once there is one.
            Handover::Poll { .. } => {}
        }
    }

    /// How long the connection may wait before it must be answered (a long-poll);
    /// its heartbeat is then that answer.
    pub fn answer_within(&self) -> Option<std::time::Duration> {
        match self {
            Handover::Poll { timeout } => Some(*timeout),
            Handover::WebSocket { .. } | Handover::Sse => None,
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
}

/// What a transport may use while handling a connection's input.
pub struct Ctx<'a> {
    /// Answers to this connection, written out once the input is handled.
    pub out: &'a mut Vec<u8>,
    pub broker: &'a dyn Broker,
    pub config: &'a ServeConfig,
    pub counts: &'a mut TurnCounts,
    /// The name this chat client chose (`name=`), if it did.
    pub chosen_name: Option<&'a str>,
}
