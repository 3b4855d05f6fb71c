//! The in-memory broker: every channel's `seq`, history, epoch and presence in
//! this process, handed to the local [`Hub`]. The whole story on one process; it
//! must not touch sockets, connections or wire formats. Every channel's history
//! counts against one [`Budget`] (`--history-max-bytes`): a push over it trims its
//! own channel (see [`crate::history`]), and housekeeping cuts the largest
//! channels down to a common level until the process holds at most 7/8 of it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::idempotency::{Published, Remembered};
use super::{
    Broker, BrokerError, ChannelInfo, ChannelWatch, Member, Members, Outgoing, PresenceMember,
    Replay, Resume, Subscribed, new_epoch,
};
use crate::history::{self, Budget, History, Limits};
use crate::hub::{Audience, Body, Channel, ConnRef, Hub, PresenceChange, SocketId};
use crate::rules::Namespaces;
use crate::timing::channel_retention;

const SHARDS: usize = 64;

/// One channel's life in the memory broker.
#[derive(Debug)]
struct Log {
    seq: u64,
    last_used: Instant,
    history: History,
    /// What this channel's history keeps (its namespace's, or the server's).
    limits: Limits,
    epoch: u64,
    /// The hub's channel while this process has subscribers: set by the first
    /// subscribe and cleared by the last unsubscribe, both under this log's lock,
    /// so a publish reaches the hub without a second lookup by name.
    local: Option<Arc<Channel>>,
    /// A Pusher presence channel's users, while it has any.
    presence: Option<HashMap<Box<str>, User>>,
    /// The idempotency keys of recent publishes, once one came with a key.
    keys: Option<Box<Remembered>>,
}

/// A presence channel's user: its `user_info` and how many connections it has
/// there.
#[derive(Debug)]
struct User {
    info: Box<str>,
    conns: u32,
}

/// A shard of channel logs, by name.
type LogShard = Mutex<HashMap<Box<str>, Arc<Mutex<Log>>>>;

/// Everything in this process: `seq`, history and presence live here and in the hub.
#[derive(Debug)]
pub struct MemoryBroker {
    hub: Arc<Hub>,
    shards: Vec<LogShard>,
    hasher: std::collections::hash_map::RandomState,
    /// How much history each channel keeps, unless its namespace says otherwise.
    history: Limits,
    /// What all channels' histories may hold together.
    budget: Arc<Budget>,
    namespaces: Namespaces,
    /// Told of first and last subscribers and of presence users (webhooks).
    watch: OnceLock<Arc<dyn ChannelWatch>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryBroker {
    pub fn new(hub: Arc<Hub>, history: Limits, namespaces: Namespaces) -> Self {
        MemoryBroker {
            hub,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            history,
            budget: Arc::new(Budget::new(history::DEFAULT_MAX_BYTES)),
            namespaces,
            watch: OnceLock::new(),
        }
    }

    /// Its channels' histories hold at most about `max_bytes` together (see
    /// [`crate::history::Budget`]). Before the first publish.
    pub fn with_history_budget(mut self, max_bytes: usize) -> Self {
        self.budget = Arc::new(Budget::new(max_bytes));
        self
    }

    /// History bytes held across every channel (as the budget counts them).
    pub fn history_held(&self) -> usize {
        self.budget.held()
    }

    fn shard(&self, name: &str) -> MutexGuard<'_, HashMap<Box<str>, Arc<Mutex<Log>>>> {
        lock(&self.shards[(self.hasher.hash_one(name) as usize) % SHARDS])
    }

    /// The channel's log, created if new. Whoever uses it marks it used.
    fn log(&self, name: &str) -> Arc<Mutex<Log>> {
        let mut shard = self.shard(name);
        if let Some(log) = shard.get(name) {
            return Arc::clone(log);
        }
        let log = Arc::new(Mutex::new(Log {
            seq: 0,
            last_used: Instant::now(),
            history: History::with_budget(Arc::clone(&self.budget)),
            limits: {
                let (size, ttl) = self.namespaces.history(name);
                Limits {
                    size: size.unwrap_or(self.history.size),
                    ttl: ttl.unwrap_or(self.history.ttl),
                }
            },
            epoch: new_epoch(),
            local: None,
            presence: None,
            keys: None,
        }));
        shard.insert(name.into(), Arc::clone(&log));
        log
    }

    fn find(&self, name: &str) -> Option<Arc<Mutex<Log>>> {
        self.shard(name).get(name).cloned()
    }

    fn announce(
        &self,
        channel: &Arc<Channel>,
        event: &'static str,
        client: &str,
        count: u64,
        exclude: Option<ConnRef>,
    ) {
        // An event nobody can take right now is dropped: presence is advisory and
        // the count in the next event is exact again.
        let _ = self
            .hub
            .deliver(channel, Audience::Listeners, exclude, || Body::Event {
                event,
                client: client.into(),
                count,
            });
    }

    /// Adds `member`'s connection to the channel's users (in `log`, locked);
    /// the members before it came, or `PresenceFull`.
    fn presence_join(
        log: &mut Log,
        member: PresenceMember<'_>,
    ) -> Result<(Members, bool), BrokerError> {
        let users = log.presence.get_or_insert_with(Default::default);
        let members = users
            .iter()
            .map(|(id, u)| (id.to_string(), u.info.to_string()))
            .collect();
        if let Some(user) = users.get_mut(member.user_id) {
            user.conns += 1;
            return Ok((members, false));
        }
        if users.len() >= member.limit {
            return Err(BrokerError::PresenceFull(member.limit));
        }
        users.insert(
            member.user_id.into(),
            User {
                info: member.user_info.into(),
                conns: 1,
            },
        );
        Ok((members, true))
    }

    /// Tells the channel's Pusher subscribers that a user came or went.
    fn presence_event(
        &self,
        channel: &Arc<Channel>,
        change: PresenceChange,
        user_id: &str,
        user_info: Option<&str>,
        skip: Option<SocketId>,
    ) {
        // Delivered under the channel's lock, in order with its messages; one
        // nobody can take now is lost to a loop far behind (its inbox full),
        // which is then closing its slow subscribers anyway.
        let _ = self
            .hub
            .deliver(channel, Audience::Everyone, None, || Body::Presence {
                change,
                user_id: user_id.into(),
                user_info: user_info.map(Box::from),
                skip,
            });
    }

    /// Forgets channels nobody subscribed to or published on for `retention`
    /// (their `seq` starts again at 1 if they come back).
    fn sweep(&self, retention: Duration) -> usize {
        let now = Instant::now();
        let mut removed = 0;
        for shard in &self.shards {
            let secs = history::now_secs();
            lock(shard).retain(|_, log| {
                let mut guard = lock(log);
                let ttl = guard.limits.ttl;
                guard.history.expire(secs, ttl);
                // A log someone holds right now (a publish under way) is in use;
                // one that remembers idempotency keys keeps its seqs for them.
                let idle = Arc::strong_count(log) == 1
                    && guard.local.is_none()
                    && now.duration_since(guard.last_used) >= retention
                    && guard.keys.as_mut().is_none_or(|keys| keys.is_empty(now));
                drop(guard);
                removed += usize::from(idle);
                !idle
            });
        }
        self.trim_to_budget();
        removed
    }

    /// Past 7/8 of the budget: cuts the channels holding the most down to one
    /// level, so that together they hold at most 7/8 of it (room for pushes to
    /// come before they must trim themselves). Sizes are taken, then each channel
    /// trimmed under its own lock: one that grew in between is cut to the level too.
    fn trim_to_budget(&self) {
        let target = self.budget.max() / 8 * 7;
        if self.budget.held() <= target {
            return;
        }
        let mut held: Vec<(usize, Arc<Mutex<Log>>)> = Vec::new();
        for shard in &self.shards {
            for log in lock(shard).values() {
                let bytes = lock(log).history.held_bytes();
                if bytes > 0 {
                    held.push((bytes, Arc::clone(log)));
                }
            }
        }
        let mut sizes: Vec<usize> = held.iter().map(|(bytes, _)| *bytes).collect();
        let Some(level) = history::trim_level(&mut sizes, target) else {
            return;
        };
        for (bytes, log) in &held {
            if *bytes > level {
                lock(log).history.trim_to(level);
            }
        }
    }

    /// Publishes `message` on the channel whose log is `log` (locked by the caller
    /// for the whole publish).
    fn publish_in(&self, log: &mut Log, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        log.last_used = Instant::now();
        let seq = log.seq + 1;
        // The payload's one copy: shared by the hub's message and history.
        let mut buffer = None;
        if let Some(local) = &log.local {
            self.hub
                .deliver(local, Audience::Everyone, None, || Body::Data {
                    seq,
                    epoch: log.epoch,
                    payload: buffer
                        .insert(bytes::Bytes::copy_from_slice(message.payload))
                        .clone(),
                    kind: message.kind,
                    from: message.from.map(Box::from),
                    event: message.event.map(Box::from),
                    skip: message.skip,
                })?;
        }
        log.seq = seq;
        let limits = log.limits;
        if limits.enabled() {
            let now = history::now_secs();
            let tags = message.tags();
            match &buffer {
                Some(payload) => {
                    let kind = message.kind;
                    log.history
                        .push_bytes(seq, payload, kind, tags, now, limits);
                }
                None => {
                    let payload = message.payload;
                    log.history
                        .push(seq, payload, message.kind, tags, now, limits);
                }
            }
        }
        Ok(seq)
    }
}

impl Broker for MemoryBroker {
    fn publish(&self, channel: &str, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        let log = self.log(channel);
        // The log stays locked while the hub hands the message out, so every
        // subscriber sees one channel's messages in `seq` order.
        let mut log = lock(&log);
        self.publish_in(&mut log, message)
    }

    fn publish_once(
        &self,
        channel: &str,
        message: Outgoing<'_>,
        key: &str,
    ) -> Result<Published, BrokerError> {
        let log = self.log(channel);
        // Locked from the lookup to the record: two retries racing publish once.
        let mut log = lock(&log);
        let now = Instant::now();
        if let Some(seq) = log.keys.as_mut().and_then(|keys| keys.seq_of(key, now)) {
            log.last_used = now;
            return Ok(Published {
                seq,
                replayed: true,
            });
        }
        let seq = self.publish_in(&mut log, message)?;
        log.keys
            .get_or_insert_with(Default::default)
            .remember(key, seq, now);
        Ok(Published {
            seq,
            replayed: false,
        })
    }

    fn subscribe(
        &self,
        channel: &str,
        member: Member<'_>,
        resume: Option<Resume>,
    ) -> Result<Subscribed, BrokerError> {
        let log = self.log(channel);
        let mut log = lock(&log);
        log.last_used = Instant::now();
        let replay = resume.map(|_| {
            let ttl = log.limits.ttl;
            log.history.expire(history::now_secs(), ttl);
            Replay {
                messages: log.history.after(0),
                last_seq: log.seq,
                oldest: log.history.oldest_seq().unwrap_or(log.seq + 1),
                epoch: log.epoch,
            }
        });
        // A presence member is counted under the same lock as its registration:
        // every user is in its member list or comes as `member_added`, once.
        let presence = match member.presence {
            Some(user) => Some((user, Self::presence_join(&mut log, user)?)),
            None => None,
        };
        // Registered under the log's lock: a publish is delivered either before
        // this subscriber counts (and history has it) or to it, never neither.
        let (hub_channel, count) =
            self.hub
                .subscribe(channel, member.conn.loop_index, member.listens);
        let first = log.local.is_none();
        log.local = Some(Arc::clone(&hub_channel));
        let watch = self.watch.get();
        if first && let Some(watch) = watch {
            watch.occupied(channel);
        }
        let members = presence.map(|(user, (mut members, added))| {
            if added {
                self.presence_event(
                    &hub_channel,
                    PresenceChange::Joined,
                    user.user_id,
                    Some(user.user_info),
                    Some(user.socket),
                );
                if let Some(watch) = watch {
                    watch.member_added(channel, user.user_id);
                }
                members.push((user.user_id.to_string(), user.user_info.to_string()));
            }
            members
        });
        drop(log);
        if let Some(name) = member.announce {
            self.announce(&hub_channel, "join", name, count, Some(member.conn));
        }
        Ok(Subscribed {
            channel: hub_channel,
            count,
            replay,
            members,
        })
    }

    fn unsubscribe(&self, channel: &Arc<Channel>, member: Member<'_>) {
        let log = self.find(channel.name());
        let mut log = log.as_deref().map(lock);
        let left = self
            .hub
            .unsubscribe(channel, member.conn.loop_index, member.listens);
        if let Some(log) = log.as_mut() {
            log.last_used = Instant::now();
            if let Some(user) = member.presence
                && let Some(users) = log.presence.as_mut()
                && let Some(entry) = users.get_mut(user.user_id)
            {
                entry.conns -= 1;
                if entry.conns == 0 {
                    users.remove(user.user_id);
                    let (id, left) = (user.user_id, PresenceChange::Left);
                    self.presence_event(channel, left, id, None, None);
                    if let Some(watch) = self.watch.get() {
                        watch.member_removed(channel.name(), user.user_id);
                    }
                }
                if users.is_empty() {
                    log.presence = None;
                }
            }
            if left == 0
                && log.local.take().is_some()
                && let Some(watch) = self.watch.get()
            {
                watch.vacated(channel.name());
            }
        }
        drop(log);
        if let Some(name) = member.announce
            && left > 0
        {
            self.announce(channel, "leave", name, left, None);
        }
    }

    fn history(&self, channel: &str, since: u64) -> Result<Replay, BrokerError> {
        let log = self.log(channel);
        let mut log = lock(&log);
        let ttl = log.limits.ttl;
        log.history.expire(history::now_secs(), ttl);
        Ok(Replay {
            messages: log.history.after(since),
            last_seq: log.seq,
            oldest: log.history.oldest_seq().unwrap_or(log.seq + 1),
            epoch: log.epoch,
        })
    }

    fn channel_info(&self, channel: &str) -> ChannelInfo {
        let Some(log) = self.find(channel) else {
            return ChannelInfo::default();
        };
        let mut log = lock(&log);
        let ttl = log.limits.ttl;
        log.history.expire(history::now_secs(), ttl);
        ChannelInfo {
            subscribers: log.local.as_ref().map_or(0, |c| c.subscribers()),
            last_seq: log.seq,
            history_len: log.history.len(),
            epoch: Some(log.epoch),
        }
    }

    fn presence_members(&self, channel: &str) -> Result<Members, BrokerError> {
        let Some(log) = self.find(channel) else {
            return Ok(Vec::new());
        };
        let log = lock(&log);
        Ok(log.presence.as_ref().map_or_else(Vec::new, |users| {
            users
                .iter()
                .map(|(id, u)| (id.to_string(), u.info.to_string()))
                .collect()
        }))
    }

    fn close_subscribers(&self, channel: &str) -> Result<(), BrokerError> {
        let Some(log) = self.find(channel) else {
            return Ok(());
        };
        let log = lock(&log);
        if let Some(local) = &log.local {
            self.hub
                .deliver(local, Audience::Everyone, None, || Body::CloseAll)?;
        }
        Ok(())
    }

    fn occupied(&self, prefix: &str) -> Result<Vec<(String, u64)>, BrokerError> {
        let mut found = Vec::new();
        for shard in &self.shards {
            for (name, log) in lock(shard).iter() {
                if !name.starts_with(prefix) {
                    continue;
                }
                let subscribers = lock(log).local.as_ref().map_or(0, |c| c.subscribers());
                if subscribers > 0 {
                    found.push((name.to_string(), subscribers));
                }
            }
        }
        Ok(found)
    }

    fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    fn history_bytes(&self) -> Option<u64> {
        Some(self.budget.held() as u64)
    }

    fn maintain(&self) {
        self.sweep(channel_retention());
    }

    fn set_watch(&self, watch: Arc<dyn ChannelWatch>) {
        let _ = self.watch.set(watch);
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn healthy(&self) -> bool {
        true
    }

    /// A publish hands its message to the hub while it holds the channel's lock,
    /// which `subscribe` takes to count the subscriber and snapshot the history.
    fn delivers_before_subscribe_returns(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
