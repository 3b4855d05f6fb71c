//! The local hub: which channels have subscribers on which event loop of this
//! process, and the hand-off of each message to those loops.
//!
//! Channels live in 64 shards keyed by a hash of the name, so threads rarely meet
//! on one lock; a channel is here only while it has local subscribers. A channel
//! records how many subscribers each event loop has (and how many of them see
//! channel events); the loops keep their own subscriber lists. A delivered message
//! is one shared [`Message`] pushed to the [`Inbox`] of every loop concerned; its
//! encodings (one per transport format) are made once, by the first loop that needs
//! one, and cached in the message. The inbox also carries the broker's answers to
//! the publishes a loop handed it ([`Hub::answer`]), woken by the same waker. This module is transport-neutral and local: it
//! must not know wire formats, assign `seq` (the broker does), or touch sockets, and
//! it holds no lock while anything is written to a client.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use mio::Waker;

use crate::broker::asked::Answer;
pub use crate::ids::{SocketId, this_node};
use crate::protocol::DataKind;

const SHARDS: usize = 64;
/// Deliveries waiting for one loop before publishers are told to back off (503):
/// a stalled loop must not let queues grow without bound.
const MAX_INBOX: usize = 1 << 16;
/// How many encodings a message can cache: one per transport format
/// (`transport::Format::COUNT`, checked there at compile time).
pub const ENCODINGS: usize = 5;

/// How many compressed encodings a message can cache: one per encoding and
/// permessage-deflate window size (9..=15 bits).
pub const DEFLATED: usize = ENCODINGS * 7;

/// Why a message was not handed to the loops (nothing was delivered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliverError {
    #[error("server overloaded: subscribers' loops are {MAX_INBOX} deliveries behind; retry later")]
    Overloaded,
}

/// Subscribers of one channel on one event loop.
#[derive(Debug, Default, Clone, Copy)]
struct LoopShare {
    subscribers: u32,
    /// Those of them whose format shows channel events.
    listeners: u32,
}

/// One channel with local subscribers. Cheap to share: subscribers hold an `Arc`.
#[derive(Debug)]
pub struct Channel {
    name: Box<str>,
    loops: Mutex<Vec<LoopShare>>,
    /// Local subscribers on every loop, readable without the lock.
    subscribers: AtomicU64,
    /// Messages handed to this process's loops since the channel got local
    /// subscribers (one count per message, not per subscriber): the dashboard's
    /// messages/s per channel.
    messages: AtomicU64,
}

impl Channel {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Subscribers on this process.
    pub fn subscribers(&self) -> u64 {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// Messages handed to this process's loops while it had local subscribers.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<LoopShare>> {
        self.loops.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Identifies one connection of one loop, to leave it out of its own join event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRef {
    pub loop_index: usize,
    pub key: usize,
}

/// Whether a presence channel's user came or went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceChange {
    Joined,
    Left,
}

/// What a [`Message`] carries.
#[derive(Debug)]
pub enum Body {
    /// A published message.
    Data {
        seq: u64,
        /// The channel's history epoch `seq` belongs to (opaque to the hub).
        epoch: u64,
        payload: Bytes,
        kind: DataKind,
        /// The chat client that sent it.
        from: Option<Box<str>>,
        /// Its event name (see `broker::Outgoing::event`).
        event: Option<Box<str>>,
        /// A connection that must not get it (see `broker::Outgoing::skip`).
        skip: Option<SocketId>,
    },
    /// A presence channel's user came (its first connection) or went (its
    /// last), as data each protocol with presence encodes its own way (the
    /// Pusher protocol's `member_added` and `member_removed`); the others do
    /// not show it.
    Presence {
        change: PresenceChange,
        user_id: Box<str>,
        /// What the user said of itself, JSON text (with a join; `None` with a
        /// leave).
        user_info: Option<Box<str>>,
        /// The joining connection, which learns the members otherwise.
        skip: Option<SocketId>,
    },
    /// Every subscriber of the channel is to be closed (its connection ended,
    /// with the transport's goodbye): a signed-in user's connections terminated.
    CloseAll,
    /// The channel's history started afresh (another epoch, after a Redis
    /// failover): what came after the last message delivered here may be lost,
    /// and the next message is `next_seq` of `epoch`. Shown as a gap in formats
    /// that show gaps.
    NewEpoch { epoch: u64, next_seq: u64 },
    /// A channel event (a member joined or left), shown only in formats with events.
    Event {
        event: &'static str,
        client: Box<str>,
        count: u64,
    },
}

/// One message or channel event, shared by every loop that delivers it.
#[derive(Debug)]
pub struct Message {
    pub channel: Arc<Channel>,
    pub body: Body,
    /// A connection that must not get this (the joiner of its own join event).
    pub exclude: Option<ConnRef>,
    /// When the broker handed it to the hub (the start of its delivery latency).
    pub handed: Instant,
    /// One slot per transport format, filled on first use.
    encoded: [OnceLock<Option<Bytes>>; ENCODINGS],
    /// Compressed encodings (permessage-deflate), one slot per format and window
    /// size, made only when a subscriber that negotiated compression needs one.
    deflated: OnceLock<Box<[OnceLock<Option<Bytes>>; DEFLATED]>>,
}

impl Message {
    /// The connection this message leaves out, if it names one.
    pub fn skip(&self) -> Option<SocketId> {
        match &self.body {
            Body::Data { skip, .. } | Body::Presence { skip, .. } => *skip,
            Body::Event { .. } | Body::CloseAll | Body::NewEpoch { .. } => None,
        }
    }

    /// The encoding in `slot`, made by `encode` on first use and then shared;
    /// `None` when that format does not show this message.
    pub fn encoded(
        &self,
        slot: usize,
        encode: impl FnOnce(&Message) -> Option<Bytes>,
    ) -> Option<&Bytes> {
        self.encoded
            .get(slot)?
            .get_or_init(|| encode(self))
            .as_ref()
    }

    /// The compressed encoding in `slot` (below [`DEFLATED`]), made by `compress`
    /// on first use and then shared; `None` when it goes uncompressed.
    pub fn deflated(
        &self,
        slot: usize,
        compress: impl FnOnce(&Message) -> Option<Bytes>,
    ) -> Option<&Bytes> {
        self.deflated
            .get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())))
            .get(slot)?
            .get_or_init(|| compress(self))
            .as_ref()
    }
}

/// What a loop's inbox holds: a handle to a shared message.
pub type Delivery = Arc<Message>;

/// A loop's incoming deliveries, and the broker's answers to its requests.
/// Publishers push; the loop swaps the batch out.
#[derive(Debug)]
pub struct Inbox {
    queue: Mutex<Vec<Delivery>>,
    /// Answers to publishes its connections handed to the broker.
    answers: Mutex<Vec<Answer>>,
    /// Set while answers wait (as `notified` is for deliveries).
    answered: AtomicBool,
    /// Set while deliveries wait to be taken, so a burst of publishes costs one
    /// wake-up and the loop can check for work without taking the lock.
    notified: AtomicBool,
    waker: Arc<Waker>,
    /// The event loop this inbox belongs to.
    index: usize,
}

thread_local! {
    /// The event loop running on this thread, if any: a publish from a loop to its
    /// own inbox needs no wake-up, since the loop looks at its inbox every turn.
    static CURRENT_LOOP: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Marks the calling thread as event loop `index` (see [`Inbox::has_work`]).
pub fn enter_loop(index: usize) {
    CURRENT_LOOP.with(|c| c.set(index));
}

impl Inbox {
    /// Whether deliveries are waiting (cheap: no lock).
    pub fn has_work(&self) -> bool {
        self.notified.load(Ordering::Acquire)
    }

    fn len(&self) -> usize {
        self.queue.lock().map_or(0, |q| q.len())
    }

    fn push(&self, delivery: Delivery) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(delivery);
        if !self.notified.swap(true, Ordering::AcqRel)
            && CURRENT_LOOP.with(|c| c.get()) != self.index
        {
            let _ = self.waker.wake();
        }
    }

    /// Whether broker answers are waiting (cheap: no lock).
    pub fn has_answers(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    fn push_answer(&self, answer: Answer) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(answer);
        if !self.answered.swap(true, Ordering::AcqRel)
            && CURRENT_LOOP.with(|c| c.get()) != self.index
        {
            let _ = self.waker.wake();
        }
    }

    /// Takes every waiting broker answer; `batch` is the loop's reusable vector.
    pub fn take_answers(&self, batch: &mut Vec<Answer>) {
        self.answered.store(false, Ordering::Release);
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *answers, batch);
    }

    /// Takes every pending delivery; `batch` is the loop's reusable vector.
    pub fn take(&self, batch: &mut Vec<Delivery>) {
        self.notified.store(false, Ordering::Release);
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *queue, batch);
    }
}

/// Who a delivery is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// Every subscriber (published messages).
    Everyone,
    /// Only subscribers whose format shows channel events.
    Listeners,
}

/// Every channel with subscribers on this process.
#[derive(Debug)]
pub struct Hub {
    shards: Vec<Mutex<HashMap<Box<str>, Arc<Channel>>>>,
    inboxes: Vec<Inbox>,
    hasher: std::collections::hash_map::RandomState,
}

impl Hub {
    /// One inbox per event loop, each waking its loop through `wakers[i]`; every
    /// message caches up to [`ENCODINGS`] encodings.
    pub fn new(wakers: Vec<Arc<Waker>>) -> Self {
        Hub {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            inboxes: wakers
                .into_iter()
                .enumerate()
                .map(|(index, waker)| Inbox {
                    queue: Mutex::new(Vec::new()),
                    answers: Mutex::new(Vec::new()),
                    answered: AtomicBool::new(false),
                    notified: AtomicBool::new(false),
                    waker,
                    index,
                })
                .collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    pub fn inbox(&self, loop_index: usize) -> &Inbox {
        &self.inboxes[loop_index]
    }

    /// Posts the broker's answer to the loop that asked, and wakes it; an
    /// answer for a loop this hub does not have is dropped (it cannot be asked).
    pub fn answer(&self, answer: Answer) {
        if let Some(inbox) = self.inboxes.get(answer.to.loop_index as usize) {
            inbox.push_answer(answer);
        }
    }

    fn shard(&self, name: &str) -> MutexGuard<'_, HashMap<Box<str>, Arc<Channel>>> {
        let index = (self.hasher.hash_one(name) as usize) % SHARDS;
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The channel if it has local subscribers.
    pub fn find(&self, name: &str) -> Option<Arc<Channel>> {
        self.shard(name).get(name).cloned()
    }

    /// Registers a subscriber on `loop_index`; returns its channel and how many
    /// local subscribers the channel has now.
    pub fn subscribe(&self, name: &str, loop_index: usize, listens: bool) -> (Arc<Channel>, u64) {
        // The shard lock is held while counting in, so a concurrent last
        // unsubscribe cannot drop the channel between lookup and registration.
        let mut shard = self.shard(name);
        let channel = match shard.get(name) {
            Some(channel) => Arc::clone(channel),
            None => {
                let channel = Arc::new(Channel {
                    name: name.into(),
                    loops: Mutex::new(vec![LoopShare::default(); self.inboxes.len()]),
                    subscribers: AtomicU64::new(0),
                    messages: AtomicU64::new(0),
                });
                shard.insert(name.into(), Arc::clone(&channel));
                channel
            }
        };
        let mut loops = channel.lock();
        loops[loop_index].subscribers += 1;
        loops[loop_index].listeners += u32::from(listens);
        let count = channel.subscribers.fetch_add(1, Ordering::Relaxed) + 1;
        drop(loops);
        (channel, count)
    }

    /// Removes a subscriber; returns how many local subscribers are left. The
    /// channel is forgotten with its last one.
    pub fn unsubscribe(&self, channel: &Arc<Channel>, loop_index: usize, listens: bool) -> u64 {
        let mut shard = self.shard(channel.name());
        let mut loops = channel.lock();
        let share = &mut loops[loop_index];
        share.subscribers = share.subscribers.saturating_sub(1);
        share.listeners = share.listeners.saturating_sub(u32::from(listens));
        let left = channel.subscribers.fetch_sub(1, Ordering::Relaxed) - 1;
        drop(loops);
        if left == 0
            && shard
                .get(channel.name())
                .is_some_and(|c| Arc::ptr_eq(c, channel))
        {
            shard.remove(channel.name());
        }
        left
    }

    /// Hands a message to every loop with subscribers of `channel` in `audience`.
    /// `body` is called only if someone will get it. Refuses (and delivers nothing)
    /// when one of those loops is too far behind. Returns whether anyone got it.
    pub fn deliver(
        &self,
        channel: &Arc<Channel>,
        audience: Audience,
        exclude: Option<ConnRef>,
        body: impl FnOnce() -> Body,
    ) -> Result<bool, DeliverError> {
        let loops = channel.lock();
        let wanted = |share: &LoopShare| match audience {
            Audience::Everyone => share.subscribers > 0,
            Audience::Listeners => share.listeners > 0,
        };
        let busy = loops
            .iter()
            .enumerate()
            .any(|(i, s)| wanted(s) && self.inboxes[i].len() >= MAX_INBOX);
        if busy {
            return Err(DeliverError::Overloaded);
        }
        if !loops.iter().any(wanted) {
            return Ok(false);
        }
        let message = Arc::new(Message {
            channel: Arc::clone(channel),
            body: body(),
            exclude,
            handed: Instant::now(),
            encoded: Default::default(),
            deflated: OnceLock::new(),
        });
        // Pushed under the channel's lock, so every loop sees one channel's
        // messages in the order they were delivered.
        for (index, share) in loops.iter().enumerate() {
            if wanted(share) {
                self.inboxes[index].push(Arc::clone(&message));
            }
        }
        if matches!(audience, Audience::Everyone) {
            channel.messages.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Up to `n` channels with the most local subscribers, most first, leaving out
    /// those `skip` names. It visits every channel (one shard lock at a time), so it
    /// is for a once-a-second view, never the message path.
    pub fn busiest(&self, n: usize, skip: impl Fn(&str) -> bool) -> Vec<Arc<Channel>> {
        let mut top: Vec<Arc<Channel>> = Vec::with_capacity(n + 1);
        if n == 0 {
            return top;
        }
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for channel in shard.values() {
                let count = channel.subscribers();
                if top.len() == n && top.last().is_some_and(|c| c.subscribers() >= count) {
                    continue;
                }
                if skip(channel.name()) {
                    continue;
                }
                let at = top.partition_point(|c| c.subscribers() >= count);
                top.insert(at, Arc::clone(channel));
                top.truncate(n);
            }
        }
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(loops: usize) -> (Hub, Vec<mio::Poll>) {
        let polls: Vec<mio::Poll> = (0..loops).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| Arc::new(Waker::new(p.registry(), mio::Token(0)).unwrap()))
            .collect();
        (Hub::new(wakers), polls)
    }

    fn data(seq: u64) -> Body {
        Body::Data {
            seq,
            epoch: 0,
            payload: Bytes::from_static(b"x"),
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        }
    }

    #[test]
    fn a_message_is_shared_by_every_loop_and_encoded_once_per_format() {
        let (hub, _polls) = hub(2);
        let (a, _) = hub.subscribe("a", 0, false);
        hub.subscribe("a", 0, true);
        hub.subscribe("a", 1, false);
        assert_eq!(
            hub.deliver(&a, Audience::Everyone, None, || data(1)),
            Ok(true)
        );
        let (b, _) = hub.subscribe("b", 0, false);
        hub.unsubscribe(&b, 0, false);
        let mut called = false;
        let nobody = hub.deliver(&b, Audience::Everyone, None, || {
            called = true;
            data(1)
        });
        assert_eq!((nobody, called), (Ok(false), false));
        let (mut zero, mut one) = (Vec::new(), Vec::new());
        hub.inbox(0).take(&mut zero);
        hub.inbox(1).take(&mut one);
        assert_eq!((zero.len(), one.len()), (1, 1));
        assert!(Arc::ptr_eq(&zero[0], &one[0]));
        let mut encodings = 0;
        let mut encode = |_: &Message| {
            encodings += 1;
            Some(Bytes::from_static(b"frame"))
        };
        let first = zero[0].encoded(1, &mut encode).map(|b| b.as_ptr());
        let again = one[0].encoded(1, &mut encode).map(|b| b.as_ptr());
        assert_eq!(first, again);
        assert_eq!(encodings, 1);
        assert_eq!(a.subscribers(), 3);
    }

    #[test]
    fn events_reach_only_loops_with_listeners() {
        let (hub, _polls) = hub(2);
        let (room, _) = hub.subscribe("chat:r", 0, true);
        hub.subscribe("chat:r", 1, false);
        let event = || Body::Event {
            event: "join",
            client: "c1".into(),
            count: 2,
        };
        assert_eq!(
            hub.deliver(&room, Audience::Listeners, None, event),
            Ok(true)
        );
        let (mut zero, mut one) = (Vec::new(), Vec::new());
        hub.inbox(0).take(&mut zero);
        hub.inbox(1).take(&mut one);
        assert_eq!((zero.len(), one.len()), (1, 0));
    }

    #[test]
    fn busiest_channels_come_by_local_subscribers_and_count_their_messages() {
        let (hub, _polls) = hub(2);
        let mut held = Vec::new();
        for (name, subscribers) in [("a", 3), ("b", 1), ("c", 5), ("throng:stats", 9), ("d", 2)] {
            for _ in 0..subscribers {
                held.push(hub.subscribe(name, 0, false).0);
            }
        }
        let top = hub.busiest(3, |name| name.starts_with("throng:"));
        let names: Vec<&str> = top.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["c", "a", "d"]);
        let c = hub.find("c").unwrap();
        for seq in 1..=4 {
            assert!(
                hub.deliver(&c, Audience::Everyone, None, || data(seq))
                    .unwrap()
            );
        }
        assert_eq!(c.messages(), 4);
        assert!(hub.busiest(0, |_| false).is_empty());
    }

    #[test]
    fn a_channel_is_forgotten_with_its_last_local_subscriber() {
        let (hub, _polls) = hub(1);
        let (channel, count) = hub.subscribe("kept", 0, false);
        assert_eq!(count, 1);
        assert_eq!(hub.subscribe("kept", 0, false).1, 2);
        assert_eq!(hub.unsubscribe(&channel, 0, false), 1);
        assert!(hub.find("kept").is_some());
        assert_eq!(hub.unsubscribe(&channel, 0, false), 0);
        assert!(hub.find("kept").is_none());
    }

    #[test]
    fn many_subscribers_join_in_linear_time() {
        let (hub, _polls) = hub(2);
        let mut last = None;
        for i in 0..100_000 {
            last = Some(hub.subscribe("big", i % 2, false).0);
        }
        let ch = last.unwrap();
        assert_eq!(ch.subscribers(), 100_000);
        for i in 0..100_000 {
            hub.unsubscribe(&ch, i % 2, false);
        }
        assert_eq!(ch.subscribers(), 0);
    }
}
