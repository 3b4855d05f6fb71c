//! The channel hub: which channels exist, who subscribes on which I/O thread, the
//! per-channel sequence numbers, and fan-out of each message as frames encoded once.
//!
//! Channels live in 64 shards keyed by a hash of the name, so threads rarely meet
//! on one lock. A channel records only how many subscribers each event loop has, by
//! format; the loops keep their own subscriber lists. Publishing assigns `seq`, wraps
//! the payload in one shared [`Message`] and hands it to the [`Inbox`] of every loop
//! with subscribers; each [`Format`] (the transport seam: WebSocket raw or json now,
//! SSE and long-poll later) is encoded once, by the first loop that needs it, and
//! every subscriber's queue holds a handle to those bytes. This module must not touch
//! sockets or connection state, and holds no lock while anything is written to a
//! client.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{BufMut, Bytes, BytesMut};
use mio::Waker;

use crate::protocol::{DataKind, encode_header, opcode};

const SHARDS: usize = 64;
/// Longest channel name in bytes.
pub const MAX_CHANNEL_NAME: usize = 128;
/// Deliveries waiting for one loop before publishers are told to back off (503):
/// a stalled loop must not let queues grow without bound.
const MAX_INBOX: usize = 1 << 16;

/// Why a channel name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name is longer than {MAX_CHANNEL_NAME} bytes")]
    TooLong,
    #[error("channel name has '{0}': allowed are A-Z a-z 0-9 _ - . : @")]
    BadChar(char),
}

/// Checks a channel name: 1–128 bytes of `A-Z a-z 0-9 _ - . : @`.
pub fn validate_channel_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_CHANNEL_NAME {
        return Err(NameError::TooLong);
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@')))
    {
        return Err(NameError::BadChar(c));
    }
    Ok(())
}

/// The part of a channel name before its first `:` (empty if there is none).
pub fn namespace(name: &str) -> &str {
    name.split_once(':').map_or("", |(ns, _)| ns)
}

/// How a channel behaves, decided by its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelKind {
    /// Subscribers' data frames are published to the channel (a chat room).
    pub client_publish: bool,
    /// json subscribers get welcome/join/leave events with the room's count.
    pub join_leave: bool,
}

impl ChannelKind {
    pub fn for_name(name: &str) -> Self {
        let chat = namespace(name) == "chat";
        ChannelKind {
            client_publish: chat,
            join_leave: chat,
        }
    }
}

/// Why a publish did not happen (nothing was delivered and no seq was used).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("server overloaded: subscribers' loops are {MAX_INBOX} deliveries behind; retry later")]
    Overloaded,
}

/// How a subscriber receives messages: the transport seam. Each format is one
/// encoding of a [`Message`], made once and shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// WebSocket, the payload alone (text or binary as published).
    WsRaw = 0,
    /// WebSocket, `{"channel","seq","data"}` envelopes and chat events.
    WsJson = 1,
}

const FORMATS: usize = 2;

impl Format {
    /// Whether this format shows chat events (welcome/join/leave).
    pub fn shows_events(self) -> bool {
        self == Format::WsJson
    }
}

/// Subscribers of one channel on one event loop, by format.
#[derive(Debug, Default, Clone, Copy)]
struct LoopShare {
    by_format: [u32; FORMATS],
}

impl LoopShare {
    fn total(&self) -> u32 {
        self.by_format.iter().sum()
    }

    fn events(&self) -> u32 {
        self.by_format[Format::WsJson as usize]
    }
}

#[derive(Debug)]
struct ChannelState {
    seq: u64,
    loops: Vec<LoopShare>,
    last_used: Instant,
}

/// One channel. Cheap to share: subscribers hold an `Arc` to it.
#[derive(Debug)]
pub struct Channel {
    name: Box<str>,
    kind: ChannelKind,
    state: Mutex<ChannelState>,
    /// Subscribers on every loop (presence), readable without the lock.
    subscribers: AtomicU64,
    last_seq: AtomicU64,
}

impl Channel {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> ChannelKind {
        self.kind
    }

    pub fn subscribers(&self) -> u64 {
        self.subscribers.load(Ordering::Relaxed)
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, ChannelState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Identifies one connection of one loop, to leave it out of its own join event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRef {
    pub loop_index: usize,
    pub key: usize,
}

/// What a [`Message`] carries.
#[derive(Debug)]
pub enum Body {
    /// A published message.
    Data {
        seq: u64,
        payload: Bytes,
        kind: DataKind,
        /// The chat client that sent it.
        from: Option<Box<str>>,
    },
    /// A chat room event (`join`, `leave`), shown only in formats with events.
    Event {
        event: &'static str,
        client: Box<str>,
        count: u64,
    },
}

/// One published message or chat event, shared by every loop that delivers it.
#[derive(Debug)]
pub struct Message {
    pub channel: Arc<Channel>,
    pub body: Body,
    /// A connection that must not get this (the joiner of its own join event).
    pub exclude: Option<ConnRef>,
    encoded: [OnceLock<Option<Bytes>>; FORMATS],
}

impl Message {
    fn new(channel: Arc<Channel>, body: Body, exclude: Option<ConnRef>) -> Self {
        Message {
            channel,
            body,
            exclude,
            encoded: Default::default(),
        }
    }

    /// The complete frame for `format`, encoded on first use and then shared;
    /// `None` when the format does not show this message (events in raw).
    pub fn encoded(&self, format: Format) -> Option<&Bytes> {
        self.encoded[format as usize]
            .get_or_init(|| self.encode(format))
            .as_ref()
    }

    fn encode(&self, format: Format) -> Option<Bytes> {
        let name = self.channel.name();
        match (&self.body, format) {
            (Body::Data { payload, kind, .. }, Format::WsRaw) => {
                Some(frame_bytes(kind.opcode(), payload))
            }
            (
                Body::Data {
                    seq,
                    payload,
                    kind,
                    from,
                },
                Format::WsJson,
            ) => Some(json_message_frame(
                name,
                *seq,
                payload,
                *kind,
                from.as_deref(),
            )),
            (Body::Event { .. }, Format::WsRaw) => None,
            (
                Body::Event {
                    event,
                    client,
                    count,
                },
                Format::WsJson,
            ) => Some(json_event_frame(name, event, client, *count)),
        }
    }
}

/// What a loop's inbox holds: a handle to a shared message.
pub type Delivery = Arc<Message>;

/// A loop's incoming deliveries. Publishers push; the loop swaps the batch out.
#[derive(Debug)]
pub struct Inbox {
    queue: Mutex<Vec<Delivery>>,
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

    /// Takes every pending delivery; `batch` is the loop's reusable vector.
    pub fn take(&self, batch: &mut Vec<Delivery>) {
        self.notified.store(false, Ordering::Release);
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *queue, batch);
    }
}

/// What a subscriber needs to know after joining.
#[derive(Debug)]
pub struct Joined {
    pub channel: Arc<Channel>,
    /// Subscribers after this one joined.
    pub count: u64,
}

/// Every channel of this process.
#[derive(Debug)]
pub struct Hub {
    shards: Vec<Mutex<HashMap<Box<str>, Arc<Channel>>>>,
    inboxes: Vec<Inbox>,
    hasher: std::collections::hash_map::RandomState,
    next_client: AtomicU64,
}

/// The text of a message as JSON: a string for text, base64 for binary.
fn json_data(out: &mut Vec<u8>, payload: &[u8], kind: DataKind) {
    match kind {
        DataKind::Text => {
            let text = String::from_utf8_lossy(payload);
            // Serializing a str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, text.as_ref());
        }
        DataKind::Binary => {
            out.push(b'"');
            out.extend_from_slice(BASE64.encode(payload).as_bytes());
            out.extend_from_slice(b"\",\"encoding\":\"base64");
            out.push(b'"');
        }
    }
}

/// A whole server frame around `payload`, as shareable bytes.
pub fn frame_bytes(op: u8, payload: &[u8]) -> Bytes {
    let mut head = Vec::with_capacity(10);
    encode_header(&mut head, op, payload.len());
    let mut buf = BytesMut::with_capacity(head.len() + payload.len());
    buf.put_slice(&head);
    buf.put_slice(payload);
    buf.freeze()
}

/// `{"channel":…,"seq":…,"data":…[,"from":…]}` as a text frame.
pub fn json_message_frame(
    channel: &str,
    seq: u64,
    payload: &[u8],
    kind: DataKind,
    from: Option<&str>,
) -> Bytes {
    let mut body = Vec::with_capacity(payload.len() + channel.len() + 48);
    body.extend_from_slice(b"{\"channel\":\"");
    // Channel names are validated to need no escaping.
    body.extend_from_slice(channel.as_bytes());
    body.extend_from_slice(b"\",\"seq\":");
    body.extend_from_slice(seq.to_string().as_bytes());
    body.extend_from_slice(b",\"data\":");
    json_data(&mut body, payload, kind);
    if let Some(from) = from {
        body.extend_from_slice(b",\"from\":");
        let _ = serde_json::to_writer(&mut body, from);
    }
    body.push(b'}');
    frame_bytes(opcode::TEXT, &body)
}

/// `{"channel":…,"event":…,"client":…,"count":…}` as a text frame.
pub fn json_event_frame(channel: &str, event: &str, client: &str, count: u64) -> Bytes {
    let body = serde_json::json!({
        "channel": channel,
        "event": event,
        "client": client,
        "count": count,
    })
    .to_string();
    frame_bytes(opcode::TEXT, body.as_bytes())
}

/// A client's name in chat events and envelopes.
pub fn client_name(id: u64) -> String {
    format!("c{id}")
}

impl Hub {
    /// One inbox per event loop, each waking its loop through `wakers[i]`.
    pub fn new(wakers: Vec<Arc<Waker>>) -> Self {
        Hub {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            inboxes: wakers
                .into_iter()
                .enumerate()
                .map(|(index, waker)| Inbox {
                    queue: Mutex::new(Vec::new()),
                    notified: AtomicBool::new(false),
                    waker,
                    index,
                })
                .collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            next_client: AtomicU64::new(1),
        }
    }

    pub fn inbox(&self, loop_index: usize) -> &Inbox {
        &self.inboxes[loop_index]
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }

    fn shard(&self, name: &str) -> MutexGuard<'_, HashMap<Box<str>, Arc<Channel>>> {
        let index = (self.hasher.hash_one(name) as usize) % SHARDS;
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The channel of that (already validated) name, created if new.
    pub fn channel(&self, name: &str) -> Arc<Channel> {
        let mut shard = self.shard(name);
        self.get_or_create(&mut shard, name)
    }

    fn get_or_create(
        &self,
        shard: &mut HashMap<Box<str>, Arc<Channel>>,
        name: &str,
    ) -> Arc<Channel> {
        if let Some(ch) = shard.get(name) {
            return Arc::clone(ch);
        }
        let ch = Arc::new(Channel {
            name: name.into(),
            kind: ChannelKind::for_name(name),
            state: Mutex::new(ChannelState {
                seq: 0,
                loops: vec![LoopShare::default(); self.inboxes.len()],
                last_used: Instant::now(),
            }),
            subscribers: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
        });
        shard.insert(name.into(), Arc::clone(&ch));
        ch
    }

    /// The channel if it exists (for stats), without creating it.
    pub fn find(&self, name: &str) -> Option<Arc<Channel>> {
        self.shard(name).get(name).cloned()
    }

    /// Number of channels known.
    pub fn channel_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }

    /// Registers a subscriber on `loop_index`. Chat rooms tell their json members
    /// who joined (except the joiner itself, who gets its welcome from the loop).
    pub fn subscribe(
        &self,
        name: &str,
        loop_index: usize,
        format: Format,
        joiner: Option<(ConnRef, &str)>,
    ) -> Joined {
        // The shard lock is held while counting in, so a concurrent sweep cannot
        // drop the channel between lookup and registration.
        let channel = {
            let mut shard = self.shard(name);
            let channel = self.get_or_create(&mut shard, name);
            let mut st = channel.lock();
            st.loops[loop_index].by_format[format as usize] += 1;
            st.last_used = Instant::now();
            channel.subscribers.fetch_add(1, Ordering::Relaxed);
            drop(st);
            channel
        };
        let count = channel.subscribers();
        if let Some((conn, client)) = joiner
            && channel.kind.join_leave
        {
            let body = Body::Event {
                event: "join",
                client: client.into(),
                count,
            };
            self.broadcast_event(&channel, body, Some(conn));
        }
        Joined { channel, count }
    }

    /// Removes a subscriber; chat rooms tell their json members who left.
    pub fn unsubscribe(
        &self,
        channel: &Arc<Channel>,
        loop_index: usize,
        format: Format,
        client: Option<&str>,
    ) {
        {
            let mut st = channel.lock();
            let count = &mut st.loops[loop_index].by_format[format as usize];
            *count = count.saturating_sub(1);
            st.last_used = Instant::now();
            channel.subscribers.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(client) = client
            && channel.kind.join_leave
        {
            let count = channel.subscribers();
            let body = Body::Event {
                event: "leave",
                client: client.into(),
                count,
            };
            self.broadcast_event(channel, body, None);
        }
    }

    fn broadcast_event(&self, channel: &Arc<Channel>, body: Body, exclude: Option<ConnRef>) {
        let st = channel.lock();
        let message = Arc::new(Message::new(Arc::clone(channel), body, exclude));
        for (index, share) in st.loops.iter().enumerate() {
            if share.events() > 0 {
                self.inboxes[index].push(Arc::clone(&message));
            }
        }
    }

    /// Gives the message the channel's next `seq` and hands it to every loop with
    /// subscribers. The payload is copied once; formats are encoded by the loops,
    /// once each.
    pub fn publish(
        &self,
        channel: &Arc<Channel>,
        payload: &[u8],
        kind: DataKind,
        from: Option<&str>,
    ) -> Result<u64, PublishError> {
        let mut st = channel.lock();
        let busy = st
            .loops
            .iter()
            .enumerate()
            .any(|(i, s)| s.total() > 0 && self.inboxes[i].len() >= MAX_INBOX);
        if busy {
            return Err(PublishError::Overloaded);
        }
        st.seq += 1;
        let seq = st.seq;
        st.last_used = Instant::now();
        channel.last_seq.store(seq, Ordering::Relaxed);
        if st.loops.iter().all(|s| s.total() == 0) {
            return Ok(seq);
        }
        let body = Body::Data {
            seq,
            payload: Bytes::copy_from_slice(payload),
            kind,
            from: from.map(Box::from),
        };
        let message = Arc::new(Message::new(Arc::clone(channel), body, None));
        for (index, share) in st.loops.iter().enumerate() {
            if share.total() > 0 {
                self.inboxes[index].push(Arc::clone(&message));
            }
        }
        Ok(seq)
    }

    /// Forgets channels nobody has subscribed to or published on for `retention`
    /// (their `seq` starts again at 1 if they come back).
    pub fn sweep(&self, retention: Duration) -> usize {
        let now = Instant::now();
        let mut removed = 0;
        for shard in &self.shards {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, ch| {
                let st = ch.lock();
                let keep = ch.subscribers() > 0 || now.duration_since(st.last_used) < retention;
                if !keep {
                    removed += 1;
                }
                keep
            });
        }
        removed
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

    #[test]
    fn channel_names() {
        assert!(validate_channel_name("news").is_ok());
        assert!(validate_channel_name("chat:lobby-1.x@y_z").is_ok());
        assert_eq!(validate_channel_name(""), Err(NameError::Empty));
        assert_eq!(
            validate_channel_name(&"a".repeat(129)),
            Err(NameError::TooLong)
        );
        assert!(validate_channel_name(&"a".repeat(128)).is_ok());
        assert_eq!(validate_channel_name("a b"), Err(NameError::BadChar(' ')));
        assert_eq!(validate_channel_name("a/b"), Err(NameError::BadChar('/')));
        assert_eq!(validate_channel_name("é"), Err(NameError::BadChar('é')));
        assert_eq!(namespace("chat:lobby"), "chat");
        assert_eq!(namespace("news"), "");
        assert!(ChannelKind::for_name("chat:x").client_publish);
        assert!(!ChannelKind::for_name("chatx").client_publish);
    }

    #[test]
    fn seq_counts_up_per_channel_and_fans_out_once_per_loop() {
        let (hub, _polls) = hub(2);
        let a = hub.subscribe("a", 0, Format::WsRaw, None).channel;
        hub.subscribe("a", 0, Format::WsJson, None);
        hub.subscribe("a", 1, Format::WsRaw, None);
        let b = hub.channel("b");
        assert_eq!(hub.publish(&a, b"x", DataKind::Text, None), Ok(1));
        assert_eq!(hub.publish(&a, b"y", DataKind::Text, None), Ok(2));
        assert_eq!(hub.publish(&b, b"z", DataKind::Text, None), Ok(1));
        let mut batch = Vec::new();
        hub.inbox(0).take(&mut batch);
        assert_eq!(batch.len(), 2);
        let raw = batch[0].encoded(Format::WsRaw).unwrap();
        assert_eq!(&raw[..], b"\x81\x01x");
        // Every loop shares one message, and each format is encoded once.
        let mut other = Vec::new();
        hub.inbox(1).take(&mut other);
        assert_eq!(other.len(), 2);
        assert!(Arc::ptr_eq(&other[0], &batch[0]));
        assert_eq!(
            other[0].encoded(Format::WsRaw).map(|b| b.as_ptr()),
            Some(raw.as_ptr())
        );
        assert_eq!(a.subscribers(), 3);
        assert_eq!(a.last_seq(), 2);
    }

    #[test]
    fn json_envelopes() {
        let f = json_message_frame("news", 7, b"he said \"hi\"", DataKind::Text, None);
        assert_eq!(
            &f[2..],
            br#"{"channel":"news","seq":7,"data":"he said \"hi\""}"#
        );
        let f = json_message_frame("chat:r", 1, &[0, 255], DataKind::Binary, Some("c9"));
        assert_eq!(
            &f[2..],
            br#"{"channel":"chat:r","seq":1,"data":"AP8=","encoding":"base64","from":"c9"}"#
        );
    }

    #[test]
    fn chat_join_and_leave_reach_other_json_members() {
        let (hub, _polls) = hub(1);
        let me = ConnRef {
            loop_index: 0,
            key: 1,
        };
        let first = hub.subscribe("chat:r", 0, Format::WsJson, Some((me, "c1")));
        assert_eq!(first.count, 1);
        let other = ConnRef {
            loop_index: 0,
            key: 2,
        };
        let second = hub.subscribe("chat:r", 0, Format::WsJson, Some((other, "c2")));
        assert_eq!(second.count, 2);
        hub.unsubscribe(&second.channel, 0, Format::WsJson, Some("c2"));
        let mut batch = Vec::new();
        hub.inbox(0).take(&mut batch);
        let texts: Vec<String> = batch
            .iter()
            .map(|d| String::from_utf8_lossy(&d.encoded(Format::WsJson).unwrap()[2..]).into_owned())
            .collect();
        assert!(texts[0].contains("\"join\"") && texts[0].contains("\"c1\""));
        assert_eq!(batch[0].exclude, Some(me));
        assert!(texts[2].contains("\"leave\"") && texts[2].contains("\"count\":1"));
        assert!(batch[0].encoded(Format::WsRaw).is_none());
    }

    #[test]
    fn sweep_keeps_channels_in_use() {
        let (hub, _polls) = hub(1);
        let sub = hub.subscribe("kept", 0, Format::WsRaw, None);
        hub.channel("idle");
        assert_eq!(hub.sweep(Duration::ZERO), 1);
        assert!(hub.find("kept").is_some());
        assert!(hub.find("idle").is_none());
        hub.unsubscribe(&sub.channel, 0, Format::WsRaw, None);
        assert_eq!(hub.sweep(Duration::from_secs(60)), 0);
    }

    #[test]
    fn many_subscribers_join_in_linear_time() {
        let (hub, _polls) = hub(2);
        let mut last = None;
        for i in 0..100_000 {
            last = Some(hub.subscribe("big", i % 2, Format::WsRaw, None));
        }
        let ch = last.unwrap().channel;
        assert_eq!(ch.subscribers(), 100_000);
        for i in 0..100_000 {
            hub.unsubscribe(&ch, i % 2, Format::WsRaw, None);
        }
        assert_eq!(ch.subscribers(), 0);
    }
}
