//! Publishes handed to the broker to be answered later, so that no event loop
//! waits on Redis: who asked (a [`Ticket`]: the loop, its connection, and which
//! of that connection's requests), what was asked (an [`Ask`]: owned copies of
//! the messages, since the request's bytes go on without them) and the answer's
//! way back (an [`Answer`], which the hub posts to the asking loop's inbox and
//! wakes it for). A broker that answers at once (the memory broker, whose
//! publish is a few hundred nanoseconds in this process) says so with
//! [`Asked::Now`]. It must not touch sockets, connections or wire formats.

use std::time::Instant;

use super::idempotency::Published;
use super::{BrokerError, Outgoing};
use crate::hub::SocketId;
use crate::protocol::DataKind;

/// Who waits for an answer: connection `key` of event loop `loop_index`, for its
/// request numbered `serial` by that loop, or (a chat member's message) as its
/// client numbered `serial`. A slab key is used again once its connection is
/// gone: the serial tells a late answer from the next connection's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub loop_index: u32,
    pub key: u32,
    pub serial: u32,
    pub asker: Asker,
}

/// What kind of sender an answer goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// An HTTP request, waiting for its answer.
    Request,
    /// A chat member that goes on sending: only a refusal is told (its
    /// connection closes, as a refused publish on its own thread closed it).
    Sender,
}

/// One message of an [`Ask`], owned.
#[derive(Debug, Clone)]
pub struct Publish {
    pub channel: String,
    pub payload: Vec<u8>,
    pub kind: DataKind,
    pub from: Option<String>,
    pub event: Option<String>,
    pub skip: Option<SocketId>,
    /// Its idempotency key (published once per channel while the key is kept).
    pub key: Option<String>,
}

impl Publish {
    /// A copy of `message` for `channel`, with its idempotency key.
    pub fn new(channel: &str, message: Outgoing<'_>, key: Option<&str>) -> Publish {
        Publish {
            channel: channel.to_string(),
            payload: message.payload.to_vec(),
            kind: message.kind,
            from: message.from.map(str::to_string),
            event: message.event.map(str::to_string),
            skip: message.skip,
            key: key.map(str::to_string),
        }
    }

    /// The message as the broker takes it.
    pub fn outgoing(&self) -> Outgoing<'_> {
        Outgoing {
            payload: &self.payload,
            kind: self.kind,
            from: self.from.as_deref(),
            event: self.event.as_deref(),
            skip: self.skip,
        }
    }
}

/// Messages one request publishes, in order, and who waits for the answer.
#[derive(Debug)]
pub struct Ask {
    pub publishes: Vec<Publish>,
    pub to: Ticket,
    /// When it was asked: one still queued past its deadline is answered
    /// unpublished, since its requester was told 503 already.
    pub asked_at: Instant,
}

/// What the broker did with an [`Ask`]: every message published (in order), or
/// why the first that failed did not go (the ones before it went).
pub type Outcome = Result<Vec<Published>, BrokerError>;

/// The answer to an [`Ask`], on its way to the loop that asked.
#[derive(Debug)]
pub struct Answer {
    pub to: Ticket,
    pub outcome: Outcome,
}

/// Whether an [`Ask`] was answered at once, or will be through the hub.
#[derive(Debug)]
pub enum Asked {
    Now(Outcome),
    Later,
}

impl Ask {
    pub fn new(publishes: Vec<Publish>, to: Ticket) -> Ask {
        Ask {
            publishes,
            to,
            asked_at: Instant::now(),
        }
    }

    /// Publishes each message with `publish` (a broker's own, on the calling
    /// thread), stopping at the first refusal.
    pub fn publish_each(
        &self,
        mut publish: impl FnMut(&Publish) -> Result<Published, BrokerError>,
    ) -> Outcome {
        self.publishes.iter().map(&mut publish).collect()
    }
}
