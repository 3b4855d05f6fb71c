//! The Redis broker: every node that names the same Redis shares each channel's
//! `seq`, history, epoch and presence, and gets every message published on any
//! node. Redis is the whole distributed engine: no node talks to another.
//!
//! Keys of channel `NAME` (the braces keep them in one Redis Cluster slot):
//! `throng:{NAME}:seq`, `throng:{NAME}:epoch`, `throng:{NAME}:hist` (a stream, one
//! entry per kept message, id `SEQ-1`) and `throng:{NAME}:members` (a hash, node ->
//! its subscribers). A publish is one Lua script: next seq, keep, PUBLISH on
//! `throng:ch:NAME`, all atomic. Every node pattern-subscribes to `throng:ch:*`
//! on its own thread ([`Listener`]) and hands what comes to the local [`Hub`], as
//! the memory broker does. A message another program PUBLISHes on `throng:ch:NAME`
//! is delivered too, without a seq (seq 0) and without history.
//!
//! The event loops call this broker directly, so a publish or a resuming subscribe
//! waits for one Redis round trip; a plain subscribe waits for none. While Redis is
//! unreachable publishes fail (the API answers 503), `/healthz` says so, subscribers
//! stay connected, and once the listener is back it fills in from history what its
//! local subscribers missed. This module must not touch sockets of clients,
//! connections or wire formats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ::redis::{Client, Connection, Script, Value};
use bytes::Bytes;

use super::{
    Broker, BrokerError, CHANNEL_RETENTION, ChannelInfo, Member, Outgoing, Replay, Resume, Stored,
    Subscribed, new_epoch,
};
use crate::history::{self, Limits};
use crate::hub::{Audience, Body, Channel, ConnRef, Hub};
use crate::protocol::DataKind;
use crate::rules::Namespaces;

/// How long a Redis connect or command may take before it counts as a failure.
/// Event loops wait this long at most once: after a failure they fail fast while
/// the keeper thread probes (see [`Shared::with_connection`]).
const REDIS_TIMEOUT: Duration = Duration::from_secs(1);
/// The listener's reconnect backoff, doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A node whose heartbeat key is older than this is gone: its members do not count.
const NODE_TTL_SECS: u64 = 30;
/// What a node's own messages start with on the pubsub channel; anything else came
/// from another program.
const MAGIC: &[u8] = b"\x00throng1";
/// The pubsub channel of channel `NAME` is this prefix and the name.
const PUBSUB_PREFIX: &str = "throng:ch:";
/// A node's listener is woken on `throng:wake:NODE` to change its subscriptions.
const WAKE_PREFIX: &str = "throng:wake:";

/// How a node listens to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Subscribe {
    /// `SUBSCRIBE` to the channels this node has subscribers of: a node gets only
    /// what it delivers; the first subscriber of a channel on a node waits for
    /// Redis to confirm (one round trip, plus one to wake the listener).
    #[default]
    Channels,
    /// `PSUBSCRIBE throng:ch:*` once: nothing to wait for, but every node gets
    /// every message of every channel.
    Pattern,
}

/// Per-channel subscriptions: what the listener should hold, and what it has not
/// done yet, in order.
#[derive(Debug, Default)]
struct Subs {
    /// Channels with subscribers here, and whether Redis confirmed each.
    wanted: HashMap<Box<str>, bool>,
    /// (channel, subscribe?) changes for the listener to make.
    todo: Vec<(Box<str>, bool)>,
}

/// Next seq, keep, publish: atomic, so every node sees one order. KEYS and ARGV
/// are in the file's header. Scripts run by EVALSHA of this text (comments
/// included), loaded into Redis on its first NOSCRIPT.
const PUBLISH_LUA: &str = include_str!("publish.lua");

/// A channel's seq, epoch and kept messages in one instant.
const SNAPSHOT_LUA: &str = include_str!("snapshot.lua");

/// Adds to this node's members of a channel; every live node's sum.
const MEMBERS_LUA: &str = include_str!("members.lua");

/// The Redis keys of one channel.
struct Keys {
    seq: String,
    epoch: String,
    hist: String,
    members: String,
}

impl Keys {
    fn of(channel: &str) -> Keys {
        Keys {
            seq: format!("throng:{{{channel}}}:seq"),
            epoch: format!("throng:{{{channel}}}:epoch"),
            hist: format!("throng:{{{channel}}}:hist"),
            members: format!("throng:{{{channel}}}:members"),
        }
    }
}

fn node_key(node: &str) -> String {
    format!("throng:node:{node}")
}

/// A message as kept and published: kind, the sender's name, the payload.
fn encode_message(message: &Outgoing<'_>) -> Vec<u8> {
    let from = message.from.unwrap_or("").as_bytes();
    let from = &from[..from.len().min(255)];
    let mut out = Vec::with_capacity(2 + from.len() + message.payload.len());
    out.push(match message.kind {
        DataKind::Text => 0,
        DataKind::Binary => 1,
    });
    out.push(from.len() as u8);
    out.extend_from_slice(from);
    out.extend_from_slice(message.payload);
    out
}

/// A decoded message: kind, sender, payload.
type Decoded<'a> = (DataKind, Option<&'a str>, &'a [u8]);

fn decode_message(bytes: &[u8]) -> Option<Decoded<'_>> {
    let (&kind, rest) = bytes.split_first()?;
    let (&len, rest) = rest.split_first()?;
    let kind = match kind {
        0 => DataKind::Text,
        1 => DataKind::Binary,
        _ => return None,
    };
    let (from, payload) = rest.split_at_checked(usize::from(len))?;
    let from = (!from.is_empty())
        .then(|| std::str::from_utf8(from).ok())
        .flatten();
    Some((kind, from, payload))
}

fn epoch_of(text: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(text).ok()?, 16).ok()
}

/// What came on a pubsub channel.
#[derive(Debug, PartialEq, Eq)]
enum Incoming<'a> {
    /// A message published through a node.
    Data {
        seq: u64,
        epoch: u64,
        message: Decoded<'a>,
    },
    /// A member joined or left on `node` (`exclude`: its connection there).
    Event {
        node: &'a str,
        exclude: Option<ConnRef>,
        event: &'static str,
        client: &'a str,
        count: u64,
    },
    /// Something another program published: the payload alone.
    Foreign(&'a [u8]),
}

fn parse_incoming(bytes: &[u8]) -> Option<Incoming<'_>> {
    let Some(rest) = bytes.strip_prefix(MAGIC) else {
        return Some(Incoming::Foreign(bytes));
    };
    let (&tag, rest) = rest.split_first()?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&rest[..nl]).ok()?;
    let body = &rest[nl + 1..];
    match tag {
        b'D' => {
            let (seq, epoch) = head.split_once(' ')?;
            Some(Incoming::Data {
                seq: seq.parse().ok()?,
                epoch: epoch_of(epoch.as_bytes())?,
                message: decode_message(body)?,
            })
        }
        b'E' => {
            // node loop key|- count event, then the client's name as the body.
            let mut parts = head.split(' ');
            let node = parts.next()?;
            let loop_index = parts.next()?.parse().ok()?;
            let exclude = match parts.next()? {
                "-" => None,
                key => Some(ConnRef {
                    loop_index,
                    key: key.parse().ok()?,
                }),
            };
            let count = parts.next()?.parse().ok()?;
            let event = match parts.next()? {
                "join" => "join",
                "leave" => "leave",
                _ => return None,
            };
            Some(Incoming::Event {
                node,
                exclude,
                event,
                client: std::str::from_utf8(body).ok()?,
                count,
            })
        }
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a Redis command failed: on the wire (the connection is gone), or with an
/// error Redis answered.
enum Failure {
    Wire(BrokerError),
    Answer(BrokerError),
}

impl Failure {
    fn into_error(self) -> BrokerError {
        match self {
            Failure::Wire(e) | Failure::Answer(e) => e,
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

/// A channel's state in Redis at one instant.
struct Snapshot {
    last_seq: u64,
    epoch: Option<u64>,
    /// Kept messages, oldest first (expired ones included: the caller filters).
    kept: Vec<(Stored, u64)>,
}

impl Snapshot {
    /// The kept messages younger than `ttl`, oldest first.
    fn fresh(self, ttl: Duration) -> impl Iterator<Item = Stored> {
        let ttl = ttl.as_secs();
        let now = u64::from(history::now_secs());
        self.kept
            .into_iter()
            .filter(move |(_, t)| ttl > 0 && now.saturating_sub(*t) < ttl)
            .map(|(m, _)| m)
    }
}

fn parse_snapshot(value: Value) -> Result<Snapshot, BrokerError> {
    let bad = || unavailable("unexpected snapshot answer");
    let Value::Array(items) = value else {
        return Err(bad());
    };
    let mut items = items.into_iter();
    let last_seq = match items.next() {
        Some(Value::Int(n)) => u64::try_from(n).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let epoch = match items.next() {
        Some(Value::BulkString(b)) => Some(epoch_of(&b).ok_or_else(bad)?),
        Some(Value::Nil) | Some(Value::Boolean(false)) => None,
        _ => return Err(bad()),
    };
    let mut kept = Vec::new();
    if let Some(Value::Array(entries)) = items.next() {
        for entry in entries {
            if let Some(stored) = parse_entry(entry) {
                kept.push(stored);
            }
        }
    }
    Ok(Snapshot {
        last_seq,
        epoch,
        kept,
    })
}

/// One stream entry `[id, [m, message, t, secs]]` as a kept message and its time.
fn parse_entry(entry: Value) -> Option<(Stored, u64)> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let mut parts = parts.into_iter();
    let Some(Value::BulkString(id)) = parts.next() else {
        return None;
    };
    let Some(Value::Array(fields)) = parts.next() else {
        return None;
    };
    let id = std::str::from_utf8(&id).ok()?;
    let seq: u64 = id.split_once('-')?.0.parse().ok()?;
    let mut message = None;
    let mut time = 0;
    let mut fields = fields.into_iter();
    while let (Some(Value::BulkString(name)), Some(Value::BulkString(value))) =
        (fields.next(), fields.next())
    {
        match name.as_slice() {
            b"m" => message = Some(value),
            b"t" => time = std::str::from_utf8(&value).ok()?.parse().ok()?,
            _ => {}
        }
    }
    let message = message?;
    let (kind, from, payload) = decode_message(&message)?;
    Some((
        Stored {
            seq,
            payload: Bytes::copy_from_slice(payload),
            kind,
            from: from.map(Box::from),
        },
        time,
    ))
}

/// What the listener thread and the broker share.
struct Shared {
    hub: Arc<Hub>,
    client: Client,
    node: String,
    /// The listener is subscribed and reading.
    listening: AtomicBool,
    /// The last command on the pool's connections went through.
    commands_ok: AtomicBool,
    pool: Mutex<Vec<Connection>>,
    snapshot: Script,
    members: Script,
    history: Limits,
    namespaces: Namespaces,
    /// Local channels and the member count this node last wrote for each.
    written_members: Mutex<HashMap<Box<str>, u64>>,
    mode: Subscribe,
    subs: Mutex<Subs>,
    /// Signalled when the listener confirmed subscriptions.
    confirmed: Condvar,
}

impl Shared {
    /// Runs `f` on a pooled connection (a new one if none is idle); a connection
    /// that failed on the wire is dropped, not returned. A pooled connection found
    /// broken (Redis restarted since it was last used) empties the pool and `f`
    /// runs once more on a new one.
    ///
    /// While the last command failed, this answers at once without trying: the
    /// event loops that call it must not wait out a timeout per request while
    /// Redis is down or hung. The keeper thread probes every second
    /// ([`Shared::heartbeat`]) and the listener marks Redis reachable when it is
    /// back.
    fn with_connection<T>(
        &self,
        f: impl Fn(&mut Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, BrokerError> {
        if !self.commands_ok.load(Ordering::Relaxed) {
            return Err(unavailable("unreachable (retrying every second)"));
        }
        let pooled = lock(&self.pool).pop();
        let reused = pooled.is_some();
        match self.run_on(pooled, &f) {
            Err(Failure::Wire(_)) if reused => {
                lock(&self.pool).clear();
                self.run_on(None, &f).map_err(Failure::into_error)
            }
            result => result.map_err(Failure::into_error),
        }
    }

    fn run_on<T>(
        &self,
        pooled: Option<Connection>,
        f: &impl Fn(&mut Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        let mut con = match pooled {
            Some(con) => con,
            None => self.connect().map_err(|e| {
                self.commands_ok.store(false, Ordering::Relaxed);
                Failure::Wire(e)
            })?,
        };
        match f(&mut con) {
            Ok(v) => {
                self.commands_ok.store(true, Ordering::Relaxed);
                lock(&self.pool).push(con);
                Ok(v)
            }
            Err(e)
                if e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error() =>
            {
                self.commands_ok.store(false, Ordering::Relaxed);
                Err(Failure::Wire(unavailable(e)))
            }
            Err(e) => {
                // Redis answered with an error: the connection is fine.
                lock(&self.pool).push(con);
                Err(Failure::Answer(unavailable(e)))
            }
        }
    }

    fn connect(&self) -> Result<Connection, BrokerError> {
        let con = self
            .client
            .get_connection_with_timeout(REDIS_TIMEOUT)
            .map_err(unavailable)?;
        con.set_read_timeout(Some(REDIS_TIMEOUT))
            .map_err(unavailable)?;
        con.set_write_timeout(Some(REDIS_TIMEOUT))
            .map_err(unavailable)?;
        Ok(con)
    }

    /// The channel's seq, epoch and kept messages (starting the channel's epoch if
    /// it has none and `create`).
    fn snapshot(&self, channel: &str, create: bool) -> Result<Snapshot, BrokerError> {
        let keys = Keys::of(channel);
        let value: Value = self.with_connection(|con| {
            self.snapshot
                .key(&keys.seq)
                .key(&keys.epoch)
                .key(&keys.hist)
                .arg(format!("{:016x}", new_epoch()))
                .arg(key_life(Duration::ZERO))
                .arg(if create { "1" } else { "0" })
                .invoke(con)
        })?;
        parse_snapshot(value)
    }

    fn limits(&self, channel: &str) -> Limits {
        let (size, ttl) = self.namespaces.history(channel);
        Limits {
            size: size.unwrap_or(self.history.size),
            ttl: ttl.unwrap_or(self.history.ttl),
        }
    }

    /// This node is alive (its members count).
    /// This node is alive (its members count). It is also the probe that finds
    /// Redis back after a failure, so it always tries, on a fresh connection then.
    fn heartbeat(&self) -> Result<(), BrokerError> {
        let key = node_key(&self.node);
        let set = |con: &mut Connection| {
            ::redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("EX")
                .arg(NODE_TTL_SECS)
                .query::<()>(con)
        };
        if self.commands_ok.load(Ordering::Relaxed) {
            return self.with_connection(set);
        }
        lock(&self.pool).clear();
        self.run_on(None, &set).map_err(Failure::into_error)
    }

    /// Adds `delta` to this node's members of `channel`; the cluster-wide count.
    fn members(&self, channel: &str, delta: i64) -> Result<u64, BrokerError> {
        let keys = Keys::of(channel);
        let total: i64 = self.with_connection(|con| {
            self.members
                .key(&keys.members)
                .arg(&self.node)
                .arg(delta)
                .arg(key_life(Duration::ZERO))
                .arg("throng:node:")
                .invoke(con)
        })?;
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// Per-channel mode: makes sure Redis sends this node the channel's messages
    /// before a new subscriber counts on them (waits for the listener's word).
    fn ensure_subscribed(&self, channel: &str) -> Result<(), BrokerError> {
        if self.mode == Subscribe::Pattern {
            return Ok(());
        }
        let wake = {
            let mut subs = lock(&self.subs);
            if subs.wanted.contains_key(channel) {
                false
            } else {
                subs.wanted.insert(channel.into(), false);
                subs.todo.push((channel.into(), true));
                true
            }
        };
        if wake {
            self.wake_listener()?;
        }
        let subs = lock(&self.subs);
        let (subs, timeout) = self
            .confirmed
            .wait_timeout_while(subs, REDIS_TIMEOUT, |s| {
                s.wanted.get(channel).is_some_and(|confirmed| !confirmed)
            })
            .unwrap_or_else(|p| p.into_inner());
        if timeout.timed_out() && subs.wanted.get(channel) == Some(&false) {
            return Err(unavailable("the subscription was not confirmed in time"));
        }
        Ok(())
    }

    /// Per-channel mode: the channel's last local subscriber left.
    fn release(&self, channel: &str) {
        if self.mode == Subscribe::Pattern {
            return;
        }
        {
            let mut subs = lock(&self.subs);
            // Someone subscribed again meanwhile: keep listening.
            if self.hub.find(channel).is_some() || subs.wanted.remove(channel).is_none() {
                return;
            }
            subs.todo.push((channel.into(), false));
        }
        // A failed wake leaves the subscription until the next one; harmless.
        let _ = self.wake_listener();
    }

    fn wake_listener(&self) -> Result<(), BrokerError> {
        let wake = format!("{WAKE_PREFIX}{}", self.node);
        self.with_connection(|con| ::redis::cmd("PUBLISH").arg(&wake).arg("").query::<i64>(con))
            .map(drop)
    }

    /// Every second: this node's member counts; every few: its heartbeat.
    fn keep_house(&self) {
        let mut tick: u64 = 0;
        loop {
            std::thread::sleep(Duration::from_secs(1));
            // Keys of channels with subscribers here are refreshed well within
            // their life (the retention, at least 5 minutes).
            let refresh = tick.is_multiple_of(60);
            let unhealthy = !self.commands_ok.load(Ordering::Relaxed);
            let result = if tick.is_multiple_of(5) || unhealthy {
                self.heartbeat().and_then(|()| self.write_members(refresh))
            } else {
                self.write_members(refresh)
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis housekeeping failed");
            }
            tick += 1;
        }
    }

    /// Writes this node's member counts of channels that changed; forgets the
    /// count of channels without local subscribers.
    fn write_members(&self, refresh_keys: bool) -> Result<(), BrokerError> {
        let mut written = lock(&self.written_members);
        let mut pipe = ::redis::pipe();
        let node = &self.node;
        let life = key_life(Duration::ZERO);
        let mut gone = Vec::new();
        for (name, count) in written.iter_mut() {
            let keys = Keys::of(name);
            match self.hub.find(name) {
                Some(channel) => {
                    let now = channel.subscribers();
                    if refresh_keys {
                        // A channel with subscribers here keeps its seq and history.
                        let life_here = key_life(self.limits(name).ttl);
                        pipe.cmd("EXPIRE").arg(&keys.seq).arg(life_here).ignore();
                        pipe.cmd("EXPIRE").arg(&keys.epoch).arg(life_here).ignore();
                        pipe.cmd("EXPIRE").arg(&keys.hist).arg(life_here).ignore();
                    }
                    if now != *count {
                        pipe.cmd("HSET")
                            .arg(&keys.members)
                            .arg(node)
                            .arg(now)
                            .ignore();
                        pipe.cmd("EXPIRE").arg(&keys.members).arg(life).ignore();
                        *count = now;
                    }
                }
                None => {
                    pipe.cmd("HDEL").arg(&keys.members).arg(node).ignore();
                    gone.push(name.clone());
                }
            }
        }
        for name in gone {
            written.remove(&name);
        }
        drop(written);
        if pipe.cmd_iter().next().is_none() {
            return Ok(());
        }
        self.with_connection(|con| pipe.query::<()>(con))
    }
}

/// How long a channel's keys outlive its last publish (or the last time a node
/// with subscribers refreshed them): the retention, or the history's ttl if longer.
fn key_life(ttl: Duration) -> u64 {
    ttl.max(CHANNEL_RETENTION).as_secs().max(1)
}

/// The pubsub side: one thread per node, pattern-subscribed to every channel.
struct Listener {
    shared: Arc<Shared>,
    /// Per channel with local subscribers: the epoch and seq last handed out, so
    /// that after a reconnect what was missed can be filled in from history.
    delivered: HashMap<Box<str>, (u64, u64)>,
}

impl Listener {
    fn run(mut self) {
        let mut backoff = BACKOFF_FIRST;
        let mut lost = false;
        loop {
            let mut con = match self.shared.connect() {
                Ok(con) => con,
                Err(e) => {
                    if !lost {
                        tracing::warn!(error = %e, "redis unreachable; retrying");
                    }
                    lost = true;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            // Messages come whenever they come: no read timeout on this one.
            if con.set_read_timeout(None).is_err() {
                continue;
            }
            let mut pubsub = con.as_pubsub();
            if let Err(e) = self.subscribe_all(&mut pubsub) {
                tracing::warn!(error = %e, "redis subscribe failed; retrying");
                lost = true;
                std::thread::sleep(backoff);
                continue;
            }
            self.shared.listening.store(true, Ordering::Relaxed);
            // Redis answered us: the event loops may try their commands again.
            self.shared.commands_ok.store(true, Ordering::Relaxed);
            backoff = BACKOFF_FIRST;
            if lost {
                tracing::info!("redis reachable again: resubscribed; filling in what was missed");
                self.fill_in();
            }
            loop {
                let msg = match pubsub.get_message() {
                    Ok(msg) => msg,
                    Err(e) => {
                        tracing::warn!(error = %e, "redis subscription lost; reconnecting");
                        break;
                    }
                };
                let channel = msg.get_channel_name();
                if let Some(name) = channel.strip_prefix(PUBSUB_PREFIX) {
                    self.handle(name, msg.get_payload_bytes());
                } else if channel.starts_with(WAKE_PREFIX)
                    && let Err(e) = self.apply_todo(&mut pubsub)
                {
                    tracing::warn!(error = %e, "redis subscription change failed; reconnecting");
                    break;
                }
            }
            self.shared.listening.store(false, Ordering::Relaxed);
            lost = true;
        }
    }

    /// After (re)connecting: the wake channel and every wanted channel (or the
    /// pattern); every wanted channel is confirmed.
    fn subscribe_all(&self, pubsub: &mut ::redis::PubSub<'_>) -> ::redis::RedisResult<()> {
        if self.shared.mode == Subscribe::Pattern {
            return pubsub.psubscribe(format!("{PUBSUB_PREFIX}*"));
        }
        let mut subs = lock(&self.shared.subs);
        subs.todo.clear();
        let mut names = vec![format!("{WAKE_PREFIX}{}", self.shared.node)];
        names.extend(subs.wanted.keys().map(|n| format!("{PUBSUB_PREFIX}{n}")));
        // One SUBSCRIBE for all: Redis answers once every channel is subscribed.
        for batch in names.chunks(1024) {
            pubsub.subscribe(batch)?;
        }
        for confirmed in subs.wanted.values_mut() {
            *confirmed = true;
        }
        drop(subs);
        self.shared.confirmed.notify_all();
        Ok(())
    }

    /// Makes the subscription changes asked for, in order, and confirms them.
    fn apply_todo(&self, pubsub: &mut ::redis::PubSub<'_>) -> ::redis::RedisResult<()> {
        let todo = std::mem::take(&mut lock(&self.shared.subs).todo);
        let mut i = 0;
        while i < todo.len() {
            let subscribe = todo[i].1;
            let run: Vec<String> = todo[i..]
                .iter()
                .take_while(|(_, s)| *s == subscribe)
                .map(|(n, _)| format!("{PUBSUB_PREFIX}{n}"))
                .collect();
            i += run.len();
            for batch in run.chunks(1024) {
                if subscribe {
                    pubsub.subscribe(batch)?;
                } else {
                    pubsub.unsubscribe(batch)?;
                }
            }
        }
        let mut subs = lock(&self.shared.subs);
        for (name, subscribe) in &todo {
            if *subscribe && let Some(confirmed) = subs.wanted.get_mut(name) {
                *confirmed = true;
            }
        }
        drop(subs);
        self.shared.confirmed.notify_all();
        Ok(())
    }

    fn handle(&mut self, name: &str, bytes: &[u8]) {
        let hub = &self.shared.hub;
        let Some(channel) = hub.find(name) else {
            self.delivered.remove(name);
            return;
        };
        match parse_incoming(bytes) {
            Some(Incoming::Data {
                seq,
                epoch,
                message,
            }) => {
                if self.deliver(&channel, seq, epoch, message) {
                    self.delivered.insert(name.into(), (epoch, seq));
                }
            }
            Some(Incoming::Event {
                node,
                exclude,
                event,
                client,
                count,
            }) => {
                let exclude = exclude.filter(|_| node == self.shared.node);
                // Presence is advisory: an event nobody can take now is dropped.
                let _ = hub.deliver(&channel, Audience::Listeners, exclude, || Body::Event {
                    event,
                    client: client.into(),
                    count,
                });
            }
            Some(Incoming::Foreign(payload)) => {
                let kind = if std::str::from_utf8(payload).is_ok() {
                    DataKind::Text
                } else {
                    DataKind::Binary
                };
                self.deliver(&channel, 0, 0, (kind, None, payload));
            }
            None => tracing::debug!(channel = name, "unreadable message on redis; skipped"),
        }
    }

    fn deliver(&self, channel: &Arc<Channel>, seq: u64, epoch: u64, message: Decoded<'_>) -> bool {
        let (kind, from, payload) = message;
        let result = self
            .shared
            .hub
            .deliver(channel, Audience::Everyone, None, || Body::Data {
                seq,
                epoch,
                payload: Bytes::copy_from_slice(payload),
                kind,
                from: from.map(Box::from),
            });
        match result {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(channel = channel.name(), seq, error = %e, "a message from redis was not delivered here");
                false
            }
        }
    }

    /// After a reconnect: what local subscribers missed while the listener was
    /// away, from each channel's history, in order.
    fn fill_in(&mut self) {
        let channels: Vec<(Box<str>, (u64, u64))> = self.delivered.drain().collect();
        for (name, (epoch, last)) in channels {
            let Some(channel) = self.shared.hub.find(&name) else {
                continue;
            };
            let snapshot = match self.shared.snapshot(&name, false) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(channel = &*name, error = %e, "cannot fill in after reconnect");
                    self.delivered.insert(name, (epoch, last));
                    continue;
                }
            };
            let Some(now_epoch) = snapshot.epoch else {
                continue;
            };
            let mut newest = (epoch, last);
            for (stored, _) in snapshot.kept {
                if now_epoch == epoch && stored.seq <= last {
                    continue;
                }
                let message = (stored.kind, stored.from.as_deref(), &stored.payload[..]);
                if self.deliver(&channel, stored.seq, now_epoch, message) {
                    newest = (now_epoch, stored.seq);
                }
            }
            self.delivered.insert(name, newest);
        }
    }
}

/// Channels kept in Redis, shared by every node on it.
pub struct RedisBroker {
    shared: Arc<Shared>,
    url: String,
    publish: Script,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.url)
            .finish()
    }
}

impl RedisBroker {
    /// Connects to `url` (once, to say at start whether Redis is there) and starts
    /// the listener thread. A Redis that is down at start is not an error: the
    /// node runs, unhealthy, until Redis comes.
    pub fn start(
        hub: Arc<Hub>,
        url: &str,
        mode: Subscribe,
        history: Limits,
        namespaces: Namespaces,
    ) -> Result<RedisBroker, BrokerError> {
        let client = Client::open(url).map_err(unavailable)?;
        let node = format!("{:016x}", new_epoch());
        let shared = Arc::new(Shared {
            hub,
            client,
            node,
            listening: AtomicBool::new(false),
            commands_ok: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            snapshot: Script::new(SNAPSHOT_LUA),
            members: Script::new(MEMBERS_LUA),
            history,
            namespaces,
            written_members: Mutex::new(HashMap::new()),
            mode,
            subs: Mutex::new(Subs::default()),
            confirmed: Condvar::new(),
        });
        let listener = Listener {
            shared: Arc::clone(&shared),
            delivered: HashMap::new(),
        };
        std::thread::Builder::new()
            .name("throng-redis".into())
            .spawn(move || listener.run())
            .map_err(unavailable)?;
        if let Err(e) = shared.heartbeat() {
            tracing::warn!(error = %e, "redis not reachable at start; serving, and retrying");
        }
        let keeper = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("throng-redis-keeper".into())
            .spawn(move || keeper.keep_house())
            .map_err(unavailable)?;
        Ok(RedisBroker {
            shared,
            url: redact(url),
            publish: Script::new(PUBLISH_LUA),
        })
    }

    /// Announces a join or leave to the channel's listeners on every node.
    fn announce(
        &self,
        channel: &str,
        event: &str,
        client: &str,
        count: u64,
        exclude: Option<ConnRef>,
    ) {
        let (loop_index, key) = match exclude {
            Some(c) => (c.loop_index, c.key.to_string()),
            None => (0, "-".to_string()),
        };
        let mut message = MAGIC.to_vec();
        message.extend_from_slice(
            format!(
                "E{} {loop_index} {key} {count} {event}\n{client}",
                self.shared.node
            )
            .as_bytes(),
        );
        let pubsub = format!("{PUBSUB_PREFIX}{channel}");
        // Presence is advisory: a lost event is corrected by the next one's count.
        let _ = self.shared.with_connection(|con| {
            ::redis::cmd("PUBLISH")
                .arg(&pubsub)
                .arg(&message)
                .query::<i64>(con)
        });
    }

    /// Replay of the channel's history in Redis, without expired messages.
    fn replay(&self, channel: &str, since: u64) -> Result<Replay, BrokerError> {
        let snapshot = self.shared.snapshot(channel, true)?;
        let (last_seq, epoch) = (snapshot.last_seq, snapshot.epoch.unwrap_or(0));
        let mut messages: Vec<Stored> = snapshot.fresh(self.shared.limits(channel).ttl).collect();
        let oldest = messages.first().map_or(last_seq + 1, |m| m.seq);
        messages.retain(|m| m.seq > since);
        Ok(Replay {
            messages,
            last_seq,
            oldest,
            epoch,
        })
    }
}

/// The URL without a password, for logs and stats.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

impl Broker for RedisBroker {
    fn publish(&self, channel: &str, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        let keys = Keys::of(channel);
        let limits = self.shared.limits(channel);
        let size = if limits.enabled() { limits.size } else { 0 };
        let encoded = encode_message(&message);
        let answer: (u64, String) = self.shared.with_connection(|con| {
            self.publish
                .key(&keys.seq)
                .key(&keys.epoch)
                .key(&keys.hist)
                .arg(&encoded)
                .arg(history::now_secs())
                .arg(size)
                .arg(key_life(limits.ttl))
                .arg(format!("{:016x}", new_epoch()))
                .arg(format!("{PUBSUB_PREFIX}{channel}"))
                .arg(MAGIC)
                .invoke(con)
        })?;
        Ok(answer.0)
    }

    fn subscribe(
        &self,
        channel: &str,
        member: Member<'_>,
        resume: Option<Resume>,
    ) -> Result<Subscribed, BrokerError> {
        // Counted here first, so what is published after the snapshot below comes
        // through the listener; what came before is in the replay (and the loop
        // skips a live copy of a replayed seq).
        let (hub_channel, local) =
            self.shared
                .hub
                .subscribe(channel, member.conn.loop_index, member.listens);
        {
            // Known from its first subscriber on: no name copied for the others.
            let mut written = lock(&self.shared.written_members);
            if !written.contains_key(channel) {
                written.insert(channel.into(), 0);
            }
        }
        if let Err(e) = self.shared.ensure_subscribed(channel) {
            self.shared
                .hub
                .unsubscribe(&hub_channel, member.conn.loop_index, member.listens);
            self.shared.release(channel);
            return Err(e);
        }
        let replay = match resume {
            Some(_) => match self.replay(channel, 0) {
                Ok(r) => Some(r),
                Err(e) => {
                    self.shared.hub.unsubscribe(
                        &hub_channel,
                        member.conn.loop_index,
                        member.listens,
                    );
                    self.shared.release(channel);
                    return Err(e);
                }
            },
            None => None,
        };
        let count = match member.announce {
            Some(name) => {
                let count = self.shared.members(channel, 1).unwrap_or(local);
                self.announce(channel, "join", name, count, Some(member.conn));
                count
            }
            None => local,
        };
        Ok(Subscribed {
            channel: hub_channel,
            count,
            replay,
        })
    }

    fn unsubscribe(&self, channel: &Arc<Channel>, member: Member<'_>) {
        let left = self
            .shared
            .hub
            .unsubscribe(channel, member.conn.loop_index, member.listens);
        if left == 0 {
            self.shared.release(channel.name());
        }
        if let Some(name) = member.announce {
            let count = self.shared.members(channel.name(), -1).unwrap_or(left);
            if count > 0 {
                self.announce(channel.name(), "leave", name, count, None);
            }
        }
    }

    fn history(&self, channel: &str, since: u64) -> Result<Replay, BrokerError> {
        self.replay(channel, since)
    }

    fn channel_info(&self, channel: &str) -> ChannelInfo {
        let local = self.shared.hub.find(channel).map_or(0, |c| c.subscribers());
        let Ok(snapshot) = self.shared.snapshot(channel, false) else {
            return ChannelInfo {
                subscribers: local,
                ..ChannelInfo::default()
            };
        };
        let (last_seq, epoch) = (snapshot.last_seq, snapshot.epoch);
        let history_len = snapshot.fresh(self.shared.limits(channel).ttl).count();
        // Others' counts as they last wrote them, this node's as it is now.
        let others = self.shared.members(channel, 0).unwrap_or(0).saturating_sub(
            lock(&self.shared.written_members)
                .get(channel)
                .copied()
                .unwrap_or(0),
        );
        ChannelInfo {
            subscribers: others + local,
            last_seq,
            history_len,
            epoch,
        }
    }

    fn channel_count(&self) -> usize {
        lock(&self.shared.written_members).len()
    }

    fn maintain(&self) {
        // The keeper thread does this node's Redis housekeeping every second.
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    fn healthy(&self) -> bool {
        self.shared.listening.load(Ordering::Relaxed)
            && self.shared.commands_ok.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_encode_and_decode() {
        let m = Outgoing {
            payload: b"hi",
            kind: DataKind::Text,
            from: Some("c7"),
        };
        let bytes = encode_message(&m);
        assert_eq!(
            decode_message(&bytes),
            Some((DataKind::Text, Some("c7"), &b"hi"[..]))
        );
        let b = Outgoing {
            payload: &[0, 255],
            kind: DataKind::Binary,
            from: None,
        };
        assert_eq!(
            decode_message(&encode_message(&b)),
            Some((DataKind::Binary, None, &[0u8, 255][..]))
        );
        assert_eq!(decode_message(&[9, 0]), None);
        assert_eq!(decode_message(&[0, 5, b'a']), None);
    }

    #[test]
    fn incoming_messages_are_ours_or_foreign() {
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(b"D12 00000000000000ff\n");
        data.extend_from_slice(&encode_message(&Outgoing {
            payload: b"x",
            kind: DataKind::Text,
            from: None,
        }));
        assert_eq!(
            parse_incoming(&data),
            Some(Incoming::Data {
                seq: 12,
                epoch: 255,
                message: (DataKind::Text, None, &b"x"[..])
            })
        );
        let mut event = MAGIC.to_vec();
        event.extend_from_slice(b"Eabc 1 42 3 join\nc9");
        assert_eq!(
            parse_incoming(&event),
            Some(Incoming::Event {
                node: "abc",
                exclude: Some(ConnRef {
                    loop_index: 1,
                    key: 42
                }),
                event: "join",
                client: "c9",
                count: 3
            })
        );
        assert_eq!(parse_incoming(b"hello"), Some(Incoming::Foreign(b"hello")));
        let mut broken = MAGIC.to_vec();
        broken.extend_from_slice(b"Dnot a header");
        assert_eq!(parse_incoming(&broken), None);
    }

    #[test]
    fn after_a_failure_commands_fail_fast_until_a_probe_succeeds() {
        // A port that takes connections and never answers: a hung Redis.
        let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}", hung.local_addr().unwrap());
        let polls = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(polls.registry(), mio::Token(0)).unwrap());
        let shared = Shared {
            hub: Arc::new(Hub::new(vec![waker])),
            client: Client::open(url.as_str()).unwrap(),
            node: "n".into(),
            listening: AtomicBool::new(false),
            commands_ok: AtomicBool::new(true),
            pool: Mutex::new(Vec::new()),
            snapshot: Script::new(SNAPSHOT_LUA),
            members: Script::new(MEMBERS_LUA),
            history: Limits {
                size: 0,
                ttl: Duration::ZERO,
            },
            namespaces: Namespaces::default(),
            written_members: Mutex::new(HashMap::new()),
            mode: Subscribe::Pattern,
            subs: Mutex::new(Subs::default()),
            confirmed: Condvar::new(),
        };
        // The first command waits out the timeout and fails ...
        let first = shared.heartbeat().unwrap_err().to_string();
        assert!(!first.contains("retrying"), "{first}");
        // ... then every other caller is answered at once, without trying.
        let next = shared.members("c", 1).unwrap_err().to_string();
        assert!(next.contains("retrying every second"), "{next}");
        // The probe itself always tries (and fails again against the same port).
        let probe = shared.heartbeat().unwrap_err().to_string();
        assert!(!probe.contains("retrying"), "{probe}");
        drop(hung);
    }

    #[test]
    fn keys_share_a_cluster_slot_and_urls_hide_passwords() {
        let k = Keys::of("chat:room");
        assert_eq!(k.seq, "throng:{chat:room}:seq");
        assert_eq!(k.hist, "throng:{chat:room}:hist");
        assert_eq!(redact("redis://:secret@h:6379/0"), "redis://***@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }
}
