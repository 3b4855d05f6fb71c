//! The broker seam: how a published message reaches every subscriber, on this node
//! or (later) on every node through Redis.
//!
//! The server publishes only through [`Broker`]; the broker decides the message's
//! `seq` and hands it to the local [`Hub`] for fan-out. The in-memory broker is the
//! whole story on one process; a Redis broker will take `seq` from Redis and feed
//! the hub from its subscription instead. This module must not touch sockets.

use std::sync::Arc;

use crate::hub::{Channel, Hub, PublishError};
use crate::protocol::DataKind;

/// Why a publish was refused; the message was not delivered and used no `seq`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

/// A message on its way to a channel.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub payload: &'a [u8],
    pub kind: DataKind,
    /// The chat client that sent it, shown to json subscribers as `from`.
    pub from: Option<&'a str>,
}

pub trait Broker: Send + Sync + std::fmt::Debug {
    /// Publishes to every subscriber of `channel`; returns the message's `seq`.
    fn publish(&self, channel: &Arc<Channel>, message: Outgoing<'_>) -> Result<u64, BrokerError>;

    /// Short name for logs and stats (`memory`, `redis://…`).
    fn describe(&self) -> String;

    /// Whether publishing works right now (for `/healthz`).
    fn healthy(&self) -> bool;
}

/// Everything in this process: `seq` comes from the hub's channel.
#[derive(Debug)]
pub struct MemoryBroker {
    hub: Arc<Hub>,
}

impl MemoryBroker {
    pub fn new(hub: Arc<Hub>) -> Self {
        MemoryBroker { hub }
    }
}

impl Broker for MemoryBroker {
    fn publish(&self, channel: &Arc<Channel>, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        Ok(self
            .hub
            .publish(channel, message.payload, message.kind, message.from)?)
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn healthy(&self) -> bool {
        true
    }
}
