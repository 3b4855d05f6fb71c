//! The in-memory broker: every channel's `seq`, history, epoch and presence in
//! this process, handed to the local [`Hub`]. The whole story on one process; it
//! must not touch sockets, connections or wire formats.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::idempotency::{Published, Remembered};
use super::{
    Broker, BrokerError, CHANNEL_RETENTION, ChannelInfo, ChannelWatch, Member, Members, Outgoing,
    PresenceMember, Replay, Resume, Subscribed, new_epoch,
};
use crate::history::{self, History, Limits};
use crate::hub::{Audience, Body, Channel, ConnRef, Hub, SocketId};
use crate::rules::Namespaces;

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
            namespaces,
            watch: OnceLock::new(),
        }
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
            history: History::default(),
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
        event: &'static str,
        data: String,
        skip: Option<SocketId>,
    ) {
        // Delivered under the channel's lock, in order with its messages; one
        // nobody can take now is lost to a loop far behind (its inbox full),
        // which is then closing its slow subscribers anyway.
        let _ = self
            .hub
            .deliver(channel, Audience::Everyone, None, || Body::Presence {
                event,
                data: data.into(),
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
        removed
    }

    /// Publishes `message` on the channel whose log is `log` (locked by the caller
    /// for the whole publish).
    fn publish_in(&self, log: &mut Log, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        log.last_used = Instant::now();
        let seq = log.seq + 1;
        if let Some(local) = &log.local {
            self.hub
                .deliver(local, Audience::Everyone, None, || Body::Data {
                    seq,
                    epoch: log.epoch,
                    payload: bytes::Bytes::copy_from_slice(message.payload),
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
            log.history.push(
                seq,
                message.payload,
                message.kind,
                message.tags(),
                now,
                limits,
            );
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
                let data = super::member_added_data(user.user_id, user.user_info);
                self.presence_event(
                    &hub_channel,
                    "pusher_internal:member_added",
                    data,
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
                    let data = super::member_removed_data(user.user_id);
                    self.presence_event(channel, "pusher_internal:member_removed", data, None);
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

    fn maintain(&self) {
        self.sweep(CHANNEL_RETENTION);
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
mod tests {
    use super::*;
    use crate::broker::{Gap, GapReason};
    use crate::hub::Delivery;
    use crate::hub::SocketId;
    use crate::protocol::DataKind;

    fn broker(loops: usize, history_size: usize) -> (MemoryBroker, Arc<Hub>, Vec<mio::Poll>) {
        let limits = Limits {
            size: history_size,
            ttl: Duration::from_secs(300),
        };
        let polls: Vec<mio::Poll> = (0..loops).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| Arc::new(mio::Waker::new(p.registry(), mio::Token(0)).unwrap()))
            .collect();
        let hub = Arc::new(Hub::new(wakers));
        let broker = MemoryBroker::new(Arc::clone(&hub), limits, Namespaces::default());
        (broker, hub, polls)
    }

    fn text(payload: &str) -> Outgoing<'_> {
        Outgoing {
            payload: payload.as_bytes(),
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        }
    }

    fn member(key: usize, announce: Option<&str>) -> Member<'_> {
        Member {
            conn: ConnRef { loop_index: 0, key },
            listens: true,
            announce,
            presence: None,
        }
    }

    fn taken(hub: &Hub) -> Vec<Delivery> {
        let mut batch = Vec::new();
        hub.inbox(0).take(&mut batch);
        batch
    }

    #[test]
    fn seq_counts_up_per_channel_with_or_without_subscribers() {
        let (broker, hub, _polls) = broker(1, 0);
        assert_eq!(broker.publish("a", text("x")), Ok(1));
        broker.subscribe("a", member(1, None), None).unwrap();
        assert_eq!(broker.publish("a", text("y")), Ok(2));
        assert_eq!(broker.publish("b", text("z")), Ok(1));
        let batch = taken(&hub);
        assert_eq!(batch.len(), 1);
        assert!(matches!(batch[0].body, Body::Data { seq: 2, .. }));
        let info = broker.channel_info("a");
        assert_eq!((info.subscribers, info.last_seq), (1, 2));
        assert_eq!(broker.channel_count(), 2);
    }

    #[test]
    fn members_are_announced_to_others_on_joining_and_leaving() {
        let (broker, hub, _polls) = broker(1, 0);
        broker
            .subscribe("chat:r", member(1, Some("c1")), None)
            .unwrap();
        let second = broker
            .subscribe("chat:r", member(2, Some("c2")), None)
            .unwrap();
        assert_eq!(second.count, 2);
        broker.unsubscribe(&second.channel, member(2, Some("c2")));
        let batch = taken(&hub);
        let events: Vec<(&str, &str, u64, Option<ConnRef>)> = batch
            .iter()
            .filter_map(|m| match &m.body {
                Body::Event {
                    event,
                    client,
                    count,
                } => Some((*event, &**client, *count, m.exclude)),
                Body::Data { .. }
                | Body::Presence { .. }
                | Body::CloseAll
                | Body::NewEpoch { .. } => None,
            })
            .collect();
        assert_eq!(
            events,
            vec![
                ("join", "c1", 1, Some(member(1, None).conn)),
                ("join", "c2", 2, Some(member(2, None).conn)),
                ("leave", "c2", 1, None),
            ]
        );
    }

    #[test]
    fn history_keeps_the_last_messages_after_a_seq() {
        let (broker, _hub, _polls) = broker(1, 3);
        for word in ["a", "b", "c", "d", "e"] {
            broker.publish("h", text(word)).unwrap();
        }
        let replay = broker.history("h", 3).unwrap();
        let seqs: Vec<u64> = replay.messages.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, vec![4, 5]);
        assert_eq!((replay.last_seq, replay.oldest), (5, 3));
        assert_eq!(replay.messages[0].payload, bytes::Bytes::from_static(b"d"));
        // Up to seq 1 seen: seq 2 is gone, which the reader can tell.
        assert!(broker.history("h", 1).unwrap().oldest > 2);
        assert_eq!(broker.channel_info("h").history_len, 3);
        let none = broker.history("never", 0).unwrap();
        assert!(none.messages.is_empty() && none.oldest == 1);
    }

    #[test]
    fn history_keeps_who_sent_a_chat_message() {
        let (broker, _hub, _polls) = broker(1, 10);
        let said = Outgoing {
            payload: b"hi",
            kind: DataKind::Text,
            from: Some("c42"),
            event: None,
            skip: None,
        };
        broker.publish("chat:r", said).unwrap();
        broker.publish("chat:r", text("pushed")).unwrap();
        let replay = broker.history("chat:r", 0).unwrap();
        let from: Vec<Option<&str>> = replay.messages.iter().map(|m| m.from.as_deref()).collect();
        assert_eq!(from, vec![Some("c42"), None]);
    }

    #[test]
    fn a_returning_subscriber_gets_what_it_missed_or_is_told_of_the_gap() {
        let (broker, _hub, _polls) = broker(1, 3);
        for word in ["a", "b", "c", "d", "e"] {
            broker.publish("r", text(word)).unwrap();
        }
        let resume = |since, epoch| Some(Resume { since, epoch });
        let seqs = |s: &Subscribed| -> Vec<u64> {
            s.replay
                .as_ref()
                .unwrap()
                .messages
                .iter()
                .map(|m| m.seq)
                .collect()
        };
        let joined = broker
            .subscribe("r", member(1, None), resume(3, None))
            .unwrap();
        let replay = joined.replay.clone().unwrap();
        let epoch = replay.epoch;
        let (given, gap) = replay.for_resume(Resume {
            since: 3,
            epoch: Some(epoch),
        });
        assert_eq!(
            given.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert_eq!(gap, None);
        assert_eq!(seqs(&joined), vec![3, 4, 5]);
        // seq 2 fell out of history (size 3 keeps 3..=5).
        let (given, gap) = joined.replay.clone().unwrap().for_resume(Resume {
            since: 1,
            epoch: None,
        });
        assert_eq!(given.messages.len(), 3);
        assert_eq!(
            gap,
            Some(Gap {
                from: 2,
                to: 2,
                reason: GapReason::TooOld
            })
        );
        // Another epoch, or a seq this epoch never reached: everything kept, and the gap.
        for (since, epoch) in [(3, Some(epoch ^ 1)), (9, None)] {
            let (given, gap) = joined
                .replay
                .clone()
                .unwrap()
                .for_resume(Resume { since, epoch });
            assert_eq!(given.messages.len(), 3);
            assert_eq!(
                gap,
                Some(Gap {
                    from: 1,
                    to: 2,
                    reason: GapReason::NewEpoch
                })
            );
        }
    }

    #[test]
    fn a_forgotten_channel_comes_back_in_a_new_epoch() {
        let (broker, _hub, _polls) = broker(1, 10);
        broker.publish("e", text("x")).unwrap();
        let first = broker.history("e", 0).unwrap();
        assert_eq!(first.messages.len(), 1);
        assert_eq!(broker.channel_info("e").epoch, Some(first.epoch));
        assert_eq!(broker.sweep(Duration::ZERO), 1);
        assert_eq!(broker.channel_info("e").epoch, None);
        assert_eq!(broker.publish("e", text("y")), Ok(1));
        let second = broker.history("e", 0).unwrap();
        assert_ne!(first.epoch, second.epoch);
        assert_eq!(second.messages[0].payload, bytes::Bytes::from_static(b"y"));
    }

    #[test]
    fn unused_channels_are_forgotten_and_their_seq_starts_again() {
        let (broker, _hub, _polls) = broker(1, 0);
        let kept = broker.subscribe("kept", member(1, None), None).unwrap();
        broker.publish("idle", text("x")).unwrap();
        assert_eq!(broker.sweep(Duration::ZERO), 1);
        assert_eq!(broker.channel_info("kept").subscribers, 1);
        assert_eq!(broker.publish("idle", text("x")), Ok(1));
        broker.unsubscribe(&kept.channel, member(1, None));
        assert_eq!(broker.sweep(Duration::from_secs(60)), 0);
    }

    fn presence_member(key: usize, user_id: &str) -> Member<'_> {
        Member {
            presence: Some(PresenceMember {
                user_id,
                user_info: r#"{"n":1}"#,
                socket: SocketId::local(key as u32),
                limit: 2,
            }),
            ..member(key, None)
        }
    }

    /// The presence events taken from the inbox: (event, data, skip).
    fn presence_events(hub: &Hub) -> Vec<(&'static str, String, Option<SocketId>)> {
        taken(hub)
            .iter()
            .filter_map(|m| match &m.body {
                Body::Presence { event, data, skip } => {
                    Some((*event, String::from_utf8_lossy(data).into_owned(), *skip))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn presence_users_come_with_their_first_connection_and_go_with_their_last() {
        let (broker, hub, _polls) = broker(1, 0);
        let ann1 = broker
            .subscribe("p", presence_member(1, "ann"), None)
            .unwrap();
        assert_eq!(
            ann1.members,
            Some(vec![("ann".to_string(), r#"{"n":1}"#.to_string())])
        );
        assert_eq!(
            presence_events(&hub),
            vec![(
                "pusher_internal:member_added",
                r#"{"user_id":"ann","user_info":{"n":1}}"#.to_string(),
                Some(SocketId::local(1))
            )]
        );
        let ann2 = broker
            .subscribe("p", presence_member(2, "ann"), None)
            .unwrap();
        assert_eq!(ann2.members.map(|m| m.len()), Some(1));
        broker
            .subscribe("p", presence_member(3, "ben"), None)
            .unwrap();
        assert_eq!(presence_events(&hub).len(), 1, "ben only");
        assert_eq!(
            broker
                .subscribe("p", presence_member(4, "cat"), None)
                .unwrap_err(),
            BrokerError::PresenceFull(2)
        );
        assert_eq!(broker.channel_info("p").subscribers, 3, "cat not counted");
        broker.unsubscribe(&ann1.channel, presence_member(1, "ann"));
        assert!(
            presence_events(&hub).is_empty(),
            "ann still has a connection"
        );
        broker.unsubscribe(&ann1.channel, presence_member(2, "ann"));
        assert_eq!(
            presence_events(&hub),
            vec![(
                "pusher_internal:member_removed",
                r#"{"user_id":"ann"}"#.to_string(),
                None
            )]
        );
        assert_eq!(broker.presence_members("p").unwrap().len(), 1);
    }
}
