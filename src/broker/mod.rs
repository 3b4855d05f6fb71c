//! The broker seam: a channel's life beyond one connection, on this node
//! ([`MemoryBroker`]) or on every node through Redis ([`RedisBroker`]).
//!
//! The server reaches channels only through [`Broker`]: publishing (the broker
//! chooses `seq`), subscribing and unsubscribing (so it learns of a node's first and
//! last local subscriber), presence (join/leave and the member count), history after
//! a `seq`, and what a channel looks like from outside. A broker hands every
//! delivery to the local [`Hub`](crate::hub::Hub), which fans it out to the event
//! loops. The in-memory broker is the whole story on one process; the Redis broker
//! shares seq, history, epoch and presence between nodes. This module holds the
//! trait and the types both share; it must not touch sockets, connections or wire
//! formats. `contract` (tests only) is the one suite every broker is run through.

use std::sync::Arc;

pub use crate::history::Stored;
use crate::hub::{Channel, ConnRef, DeliverError};
use crate::ids::SocketId;
pub(crate) use crate::ids::new_epoch;
use crate::protocol::DataKind;

pub mod asked;
#[cfg(test)]
mod contract;
pub mod idempotency;
mod memory;
mod redis;

pub use memory::MemoryBroker;
pub use redis::{RedisBroker, Subscribe};

/// Why the broker did not do what was asked; a refused publish delivered nothing
/// and used no `seq`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Overloaded(#[from] DeliverError),
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// A presence channel holds its most members, and this one would be new.
    #[error("presence channel is full: it has its {0} members")]
    PresenceFull(usize),
}

/// A message on its way to a channel.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub payload: &'a [u8],
    pub kind: DataKind,
    /// The chat client that sent it, shown to json subscribers as `from`.
    pub from: Option<&'a str>,
    /// Its event name (a Pusher event's, or `?event=` on the publish API): what
    /// Pusher clients bind to, shown to json subscribers as `name`.
    pub event: Option<&'a str>,
    /// A connection anywhere in the cluster that must not get it (a client
    /// event's sender, or the `socket_id` a Pusher API publish names). Not kept
    /// in history: a reader catching up later is not that live connection.
    pub skip: Option<crate::hub::SocketId>,
}

impl Outgoing<'_> {
    pub fn tags(&self) -> crate::history::Tags<'_> {
        crate::history::Tags {
            from: self.from,
            event: self.event,
        }
    }
}

/// A subscriber as the broker sees it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub conn: ConnRef,
    /// Its format shows channel events (join/leave).
    pub listens: bool,
    /// The name the channel announces it under (join/leave), if it is announced.
    pub announce: Option<&'a str>,
    /// Its user, when it joins a Pusher presence channel.
    pub presence: Option<PresenceMember<'a>>,
}

/// One connection of a user in a Pusher presence channel. A user is a member
/// while it has a connection there: `member_added` when its first comes,
/// `member_removed` when its last goes, once across the cluster.
#[derive(Debug, Clone, Copy)]
pub struct PresenceMember<'a> {
    pub user_id: &'a str,
    /// Its `user_info`, JSON text.
    pub user_info: &'a str,
    /// The connection, left out of its own `member_added`.
    pub socket: SocketId,
    /// Most users the channel may have: a new one beyond is refused.
    pub limit: usize,
}

/// A presence channel's members: user id and `user_info` (JSON text).
pub type Members = Vec<(String, String)>;

/// What the Redis broker counts for `/metrics` of failover honesty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailoverCounts {
    /// Channels whose history this node saw start afresh while it had
    /// subscribers (each announced to them as a gap).
    pub new_epochs: u64,
    /// Publishes whose `WAIT` came back with fewer replicas than asked.
    pub short_waits: u64,
}

/// Where a returning subscriber left off: the last `seq` it has, and the epoch
/// that seq belongs to when it knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    pub since: u64,
    pub epoch: Option<u64>,
}

/// Why a returning subscriber cannot be given everything it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapReason {
    /// What it missed is older than history keeps.
    TooOld,
    /// The channel's history started afresh since (another epoch): its seq means
    /// nothing here any more.
    NewEpoch,
}

impl GapReason {
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::TooOld => "too old",
            GapReason::NewEpoch => "new epoch",
        }
    }
}

/// Messages a returning subscriber missed and cannot be given: seqs `from..=to`
/// of the current epoch (`to < from` when none of this epoch is missing, only the
/// old epoch's unknown rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from: u64,
    pub to: u64,
    pub reason: GapReason,
}

/// A subscription the broker accepted.
#[derive(Debug)]
pub struct Subscribed {
    pub channel: Arc<Channel>,
    /// The channel's members, this one included.
    pub count: u64,
    /// For a returning subscriber: what history gives it, then the first live
    /// message is `replay.last_seq + 1`.
    pub replay: Option<Replay>,
    /// For a presence member: every member, itself included, as it joined.
    pub members: Option<Members>,
}

/// A channel seen from outside (`/api/channels/{channel}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelInfo {
    /// Members (presence).
    pub subscribers: u64,
    /// The last `seq` given out (0: none yet).
    pub last_seq: u64,
    /// Messages held in history.
    pub history_len: usize,
    /// The channel's history epoch (see [`Replay::epoch`]); `None` for a channel
    /// the broker does not know.
    pub epoch: Option<u64>,
}

/// What history holds after a `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replay {
    /// Every message held with a greater `seq`, oldest first.
    pub messages: Vec<Stored>,
    /// The channel's last `seq`.
    pub last_seq: u64,
    /// The oldest `seq` history still holds (`last_seq + 1` when it holds none):
    /// a reader who has seen up to `since` missed messages iff `since + 1 < oldest`.
    pub oldest: u64,
    /// Which life of the channel these seqs belong to. It changes whenever the
    /// channel's history starts afresh (this process restarted, or the channel was
    /// forgotten and its seq starts again at 1), so a reader holding a seq from
    /// another epoch knows it cannot be told it missed nothing.
    pub epoch: u64,
}

impl Replay {
    /// What a subscriber that left off at `resume` gets: the messages it should be
    /// given and the gap it must be told of, if any.
    pub fn for_resume(mut self, resume: Resume) -> (Replay, Option<Gap>) {
        let new_epoch =
            resume.epoch.is_some_and(|e| e != self.epoch) || resume.since > self.last_seq;
        let gap = if new_epoch {
            Some(Gap {
                from: 1,
                to: self.oldest - 1,
                reason: GapReason::NewEpoch,
            })
        } else if resume.since + 1 < self.oldest {
            Some(Gap {
                from: resume.since + 1,
                to: self.oldest - 1,
                reason: GapReason::TooOld,
            })
        } else {
            None
        };
        if !new_epoch {
            self.messages.retain(|m| m.seq > resume.since);
        }
        (self, gap)
    }
}

/// Who hears what a broker decides once for the whole cluster: a channel's first
/// subscriber anywhere and its last, a presence channel's users coming and
/// going (Pusher's webhooks). A broker calls it from whatever thread decided,
/// sometimes under a channel's lock: it must only note the fact and return.
pub trait ChannelWatch: Send + Sync + std::fmt::Debug {
    /// Whether `channel`'s occupancy is wanted: a broker on Redis pays a round
    /// trip per change only for these.
    fn watches_occupancy(&self, channel: &str) -> bool;
    /// The channel has its first subscriber in the cluster.
    fn occupied(&self, channel: &str);
    /// The channel's last subscriber in the cluster left.
    fn vacated(&self, channel: &str);
    /// A presence channel's user has its first connection there.
    fn member_added(&self, channel: &str, user_id: &str);
    /// A presence channel's user's last connection there left.
    fn member_removed(&self, channel: &str, user_id: &str);
}

pub trait Broker: Send + Sync + std::fmt::Debug {
    /// Publishes to every subscriber of `channel`; returns the `seq` it chose.
    fn publish(&self, channel: &str, message: Outgoing<'_>) -> Result<u64, BrokerError>;

    /// Publishes as [`Broker::publish`] does, unless a publish on `channel` with
    /// the same idempotency `key` came within [`crate::timing::IDEMPOTENCY_REMEMBERED_FOR`]:
    /// then nothing is published again and the first publish's seq comes back.
    fn publish_once(
        &self,
        channel: &str,
        message: Outgoing<'_>,
        key: &str,
    ) -> Result<idempotency::Published, BrokerError>;

    /// Publishes `ask`'s messages, in order, as [`Broker::publish`] and
    /// [`Broker::publish_once`] do, without the caller waiting on the broker:
    /// [`asked::Asked::Now`] with the outcome when it is known at once, or
    /// [`asked::Asked::Later`], and then the [`Hub`](crate::hub::Hub) posts the
    /// [`asked::Answer`] to `ask.to`'s loop. This broker answers at once.
    fn ask(&self, ask: asked::Ask) -> asked::Asked {
        asked::Asked::Now(ask.publish_each(|p| {
            match &p.key {
                Some(key) => self.publish_once(&p.channel, p.outgoing(), key),
                None => self
                    .publish(&p.channel, p.outgoing())
                    .map(|seq| idempotency::Published {
                        seq,
                        replayed: false,
                    }),
            }
        }))
    }

    /// Whether [`Broker::ask`] answers later (through the hub) rather than at
    /// once: then a caller hands its publishes over instead of publishing on
    /// its own thread.
    fn answers_later(&self) -> bool {
        false
    }

    /// Adds a local subscriber on `member.conn.loop_index`; announces it to the
    /// channel's listeners (itself excluded) when `member.announce` names it. A
    /// returning subscriber (`resume`) also gets the channel's history, taken in the
    /// same instant it starts to count, so that history and live deliveries meet
    /// with nothing lost and nothing twice.
    fn subscribe(
        &self,
        channel: &str,
        member: Member<'_>,
        resume: Option<Resume>,
    ) -> Result<Subscribed, BrokerError>;

    /// Removes a local subscriber; announces its leaving when it was announced.
    fn unsubscribe(&self, channel: &Arc<Channel>, member: Member<'_>);

    /// The channel's history after `since`.
    fn history(&self, channel: &str, since: u64) -> Result<Replay, BrokerError>;

    fn channel_info(&self, channel: &str) -> ChannelInfo;

    /// A presence channel's members, across the cluster.
    fn presence_members(&self, channel: &str) -> Result<Members, BrokerError>;

    /// Closes every subscriber of `channel`, on every node.
    fn close_subscribers(&self, channel: &str) -> Result<(), BrokerError>;

    /// The channels whose names start with `prefix` that have subscribers,
    /// across the cluster, with how many.
    fn occupied(&self, prefix: &str) -> Result<Vec<(String, u64)>, BrokerError>;

    /// Channels the broker knows (with subscribers, or used within the retention).
    fn channel_count(&self) -> usize;

    /// History bytes this process holds across its channels (see
    /// [`crate::history::Budget`]); None where history is kept elsewhere (Redis).
    fn history_bytes(&self) -> Option<u64> {
        None
    }

    /// Periodic housekeeping (forgetting unused channels); called every few seconds.
    fn maintain(&self);

    /// Tells `watch` from now on of what is decided once for the cluster; set
    /// once, before the first subscriber.
    fn set_watch(&self, watch: Arc<dyn ChannelWatch>);

    /// Short name for logs and stats (`memory`, `redis://…`).
    fn describe(&self) -> String;

    /// What a replicated broker counts of its failovers (none for the others).
    fn failover_counts(&self) -> Option<FailoverCounts> {
        None
    }

    /// Whether publishing works right now (for `/healthz`).
    fn healthy(&self) -> bool;

    /// Whether every message with a seq a `subscribe` counted in its replay is in
    /// the loop's inbox by the time `subscribe` returns (the publish hands it to
    /// the hub under the lock the subscribe takes). Then a loop may drop its
    /// returning subscribers' live filters after taking its inbox once more, at
    /// once, instead of waiting for the next message: a quiet channel's returning
    /// subscriber (every long-poll) keeps no filter. False when deliveries come
    /// later through another path (Redis's listener thread).
    fn delivers_before_subscribe_returns(&self) -> bool {
        false
    }
}
