//! The Redis broker: every node that names the same Redis shares each channel's
//! `seq`, history, epoch and presence, and gets every message published on any
//! node. Redis is the whole distributed engine: no node talks to another. That
//! Redis is one (`redis://…`) or the master Redis Sentinel names
//! (`redis-sentinel://…`): every new connection then goes to the master Sentinel
//! names now, and a failover (`+switch-master`, or a `READONLY` answer from a
//! demoted master) empties the pool and moves the listener to the new master,
//! which fills in from history as after any reconnect. Or it is a Redis Cluster
//! (`redis-cluster://…`): commands go through the redis crate's cluster client,
//! messages are `SPUBLISH`ed on the shard channel `throng:ch:{NAME}` (in the
//! channel's slot) and heard by one thread per master (`shards`).
//!
//! Failover honesty (`origin`): a channel's epoch key is stamped with the
//! replication id of the Redis that wrote it; another Redis starts a new epoch
//! unless it provably has every acknowledged write, and the listener tells live
//! subscribers of an epoch change as a gap.
//!
//! Every name below starts with `--redis-prefix` (`throng` by default, as
//! shown), made in `keys` (`Names`): deployments under different prefixes
//! share a Redis and nothing else. Keys of channel `NAME` (the braces keep them
//! in one Redis Cluster slot):
//! `throng:{NAME}:seq`, `throng:{NAME}:epoch`, `throng:{NAME}:hist` (a stream, one
//! entry per kept message, id `SEQ-1`) and `throng:{NAME}:members` (a hash, node ->
//! its subscribers); the rest are in `keys`. Every Lua script touches only keys it
//! declares, all in one slot (its channel's; the nodes' set for `heartbeat.lua`),
//! so it runs on a Redis Cluster: the scripts are told which nodes are gone (see
//! `presence`). A publish is one Lua script (`publish.lua`): next seq, keep,
//! PUBLISH on `throng:ch:NAME`, all atomic. Every node listens on its own thread
//! ([`Listener`](listener::Listener)): `SUBSCRIBE`d to the channels it has
//! subscribers of, or `PSUBSCRIBE`d to `throng:ch:*` (see [`Subscribe`]); it
//! hands what comes to the local [`Hub`], as the memory broker does. A message
//! another program PUBLISHes on `throng:ch:NAME` is delivered too, without a seq
//! (seq 0) and without history.
//!
//! No event loop waits for a publish it hands over ([`Broker::ask`]: the HTTP
//! and Pusher APIs): it waits in a publish lane (`lanes`), and many go to Redis
//! in one round trip, their answers coming back to the loop through the hub. A
//! publish called on a thread's own time ([`Broker::publish`]: chat members, for
//! now) and a resuming subscribe still wait for one Redis round trip there; a
//! plain subscribe waits for none (for the listener's confirmation only when it
//! is a channel's first here). While Redis is
//! unreachable publishes fail (the API answers 503), `/healthz` says so, subscribers
//! stay connected, and once the listener is back it fills in from history what its
//! local subscribers missed.
//!
//! This file holds the broker ([`RedisBroker`] and its [`Broker`] impl), the state
//! it shares with its threads ([`Shared`]) and the start. The parts:
//! - `publish`: a publish's script run, one message or many (`publish.lua`,
//!   `publish_batch.lua`);
//! - `lanes`: the queues and threads publishes handed over wait in;
//! - `pipes`: a lane's connections to each master of a cluster, one write each;
//! - `wire`: the bytes kept and published, and reading back what pubsub brings;
//! - `keys`: the Redis names under the prefix (keys, pubsub and wake channels)
//!   and how long keys live;
//! - `connection`: the connection pool and the circuit breaker (fail fast while
//!   Redis is down; the heartbeat probes);
//! - `sentinel`: where connections go (the Redis, or the master Sentinel names),
//!   and the thread following Sentinel's failovers;
//! - `snapshot`: a channel's seq, epoch and history in one instant, and replays;
//! - `presence`: member counts, join/leave events, the keeper thread, which
//!   nodes are gone (`heartbeat.lua`);
//! - `users`: Pusher presence channels' users (`users_*.lua`);
//! - `occupancy`: watched channels' occupants across the cluster (`occupy.lua`,
//!   `vacate.lua`), for Pusher's webhooks;
//! - `listener`: the pubsub thread and the subscriptions it holds;
//! - `cluster`: a key's slot, the seeds of a cluster URL, which master serves
//!   each slot (`CLUSTER SLOTS`);
//! - `shards`: the pubsub side on a cluster: a supervisor following the topology
//!   and one `SSUBSCRIBE`d thread per master;
//! - `origin`: the epoch stamp (`origin.lua`, prepended to the publish and
//!   snapshot scripts), durability, `WAIT` (`--redis-wait-replicas`);
//! - `*.lua`: the scripts Redis runs, by EVALSHA of their text (the `redis` crate
//!   loads one on Redis' first NOSCRIPT); each one's header says its KEYS and ARGV.
//!
//! This module must not touch sockets of clients, connections or their wire
//! formats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use ::redis::Script;
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};

use super::asked::{Ask, Asked};
use super::idempotency::Published;
use super::{
    Broker, BrokerError, ChannelInfo, ChannelWatch, FailoverCounts, Member, Members, Outgoing,
    Replay, Resume, Stored, Subscribed, new_epoch,
};
use crate::history::Limits;
use crate::hub::{Channel, ConnRef, Hub};
use crate::rules::Namespaces;
use connection::{REDIS_TIMEOUT, unavailable};
use keys::{DEFAULT_PREFIX, Names};
use listener::{Listener, Subs};
use presence::MEMBERS_LUA;
use snapshot::SNAPSHOT_LUA;
use wire::MAGIC;

mod cluster;
mod connection;
mod keys;
mod lanes;
mod listener;
mod occupancy;
mod origin;
mod pipes;
mod presence;
mod publish;
mod sentinel;
mod shards;
mod snapshot;
mod users;
mod wire;

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

/// How often a cluster command is tried again after `MOVED`, `ASK`,
/// `TRYAGAIN` or a failover (each wait 10 to 200 ms, an event loop waiting).
const CLUSTER_RETRIES: u32 = 3;

/// A lock that a panicked holder left poisoned is still the lock.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the listener thread and the broker share.
struct Shared {
    hub: Arc<Hub>,
    /// Where new connections go: one Redis, or the master Sentinel names.
    target: sentinel::Target,
    node: String,
    /// Every key and pubsub channel name, under `--redis-prefix`.
    names: Names,
    /// The listener is subscribed and reading.
    listening: AtomicBool,
    /// The last command on the pool's connections went through.
    commands_ok: AtomicBool,
    pool: Mutex<Vec<connection::Link>>,
    /// On a Redis Cluster: the command client (the listener is `shards`).
    cluster: Option<ClusterClient>,
    /// On a Redis Cluster: the nodes it was named by.
    seeds: Option<cluster::Seeds>,
    /// On a Redis Cluster: the shard threads' state.
    shards: shards::ShardState,
    snapshot: Script,
    members: Script,
    users_join: Script,
    users_leave: Script,
    users_sweep: Script,
    /// Pusher presence channels with members here, and how many.
    presence_channels: Mutex<users::Local>,
    history: Limits,
    namespaces: Namespaces,
    /// Local channels and the member count this node last wrote for each.
    written_members: Mutex<HashMap<Box<str>, u64>>,
    mode: Subscribe,
    subs: Mutex<Subs>,
    /// Signalled when the listener confirmed subscriptions.
    confirmed: Condvar,
    /// Told of what this node decides for the cluster (webhooks).
    watch: OnceLock<Arc<dyn ChannelWatch>>,
    occupy: Script,
    vacate: Script,
    occupying: Mutex<occupancy::Occupying>,
    /// The replication id of the Redis last found durable (see `origin`).
    durable: Mutex<Option<String>>,
    /// `--redis-wait-replicas`.
    wait_replicas: u32,
    /// Publishes whose WAIT came back with fewer replicas than asked.
    short_waits: AtomicU64,
    /// Epoch changes announced to local subscribers.
    new_epochs: AtomicU64,
    release: Script,
    /// The nodes gone at this node's last heartbeat (see `presence`).
    gone: Mutex<Arc<[String]>>,
}

/// Channels kept in Redis, shared by every node on it.
pub struct RedisBroker {
    shared: Arc<Shared>,
    url: String,
    /// `publish.lua`, for publishes on the caller's thread.
    publish: Script,
    /// Where publishes handed over ([`Broker::ask`]) wait for Redis.
    lanes: Arc<lanes::Lanes>,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.url)
            .finish()
    }
}

/// How a node uses its Redis, from its flags.
pub(super) struct Scheme {
    pub(super) mode: Subscribe,
    pub(super) wait_replicas: u32,
    pub(super) history: Limits,
    pub(super) namespaces: Namespaces,
    /// `--redis-prefix`: what every Redis name starts with.
    pub(super) prefix: String,
}

impl Shared {
    pub(super) fn new(
        hub: Arc<Hub>,
        target: sentinel::Target,
        scheme: Scheme,
        cluster: Option<ClusterClient>,
        seeds: Option<cluster::Seeds>,
    ) -> Shared {
        Shared {
            hub,
            target,
            node: format!("{:016x}", new_epoch()),
            names: Names::new(&scheme.prefix),
            listening: AtomicBool::new(false),
            commands_ok: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            snapshot: Script::new(SNAPSHOT_LUA),
            members: Script::new(MEMBERS_LUA),
            users_join: Script::new(users::JOIN_LUA),
            users_leave: Script::new(users::LEAVE_LUA),
            users_sweep: Script::new(users::SWEEP_LUA),
            presence_channels: Mutex::new(HashMap::new()),
            history: scheme.history,
            namespaces: scheme.namespaces,
            written_members: Mutex::new(HashMap::new()),
            mode: scheme.mode,
            subs: Mutex::new(Subs::default()),
            confirmed: Condvar::new(),
            watch: OnceLock::new(),
            occupy: Script::new(occupancy::OCCUPY_LUA),
            vacate: Script::new(occupancy::VACATE_LUA),
            occupying: Mutex::new(Default::default()),
            durable: Mutex::new(None),
            wait_replicas: scheme.wait_replicas,
            short_waits: AtomicU64::new(0),
            new_epochs: AtomicU64::new(0),
            release: Script::new(origin::RELEASE_LUA),
            cluster,
            seeds,
            shards: shards::ShardState::new(),
            gone: Mutex::new(Arc::from([])),
        }
    }

    /// Every key matching `pattern`, by `SCAN`: on a cluster, of every master.
    fn scan(&self, pattern: &str) -> Result<Vec<String>, BrokerError> {
        let scan_on = |con: &mut dyn ::redis::ConnectionLike| {
            let mut keys = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = ::redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(con)?;
                keys.extend(batch);
                if next == 0 {
                    return Ok(keys);
                }
                cursor = next;
            }
        };
        let Some(seeds) = &self.seeds else {
            return self.with_connection(scan_on);
        };
        let topology = cluster::Topology::read(seeds, REDIS_TIMEOUT).map_err(unavailable)?;
        let mut keys = Vec::new();
        for master in topology.masters() {
            let mut con = ::redis::Client::open(seeds.url(&master))
                .and_then(|c| c.get_connection_with_timeout(REDIS_TIMEOUT))
                .map_err(unavailable)?;
            con.set_read_timeout(Some(REDIS_TIMEOUT))
                .map_err(unavailable)?;
            keys.extend(scan_on(&mut con).map_err(unavailable)?);
        }
        Ok(keys)
    }

    /// The pubsub channel of `channel`: a shard channel in its keys' slot on a
    /// cluster.
    pub(super) fn pubsub_channel(&self, channel: &str) -> String {
        match self.cluster {
            Some(_) => self.names.shard(channel),
            None => self.names.pubsub(channel),
        }
    }

    /// `SPUBLISH` on a cluster (only the slot's master carries it), `PUBLISH`
    /// otherwise.
    pub(super) fn publish_command(&self) -> &'static str {
        match self.cluster {
            Some(_) => "SPUBLISH",
            None => "PUBLISH",
        }
    }
}

impl RedisBroker {
    /// Whether `url` names a Redis (`redis://host[:port][/db]`) or a master behind
    /// Sentinel (`redis-sentinel://…`, see `sentinel`); says what is wrong if not.
    pub fn check_url(url: &str) -> Result<(), String> {
        if url.starts_with(sentinel::SCHEME) {
            return sentinel::SentinelUrl::parse(url).map(drop);
        }
        ::redis::Client::open(url)
            .map(drop)
            .map_err(|e| format!("'{}': {e}", redact(url)))
    }

    /// The `--redis-prefix` of the names throng always used.
    pub const DEFAULT_PREFIX: &str = DEFAULT_PREFIX;

    /// Whether `prefix` can start every Redis name (`--redis-prefix`); says
    /// what is wrong if not.
    pub fn check_prefix(prefix: &str) -> Result<(), String> {
        keys::check_prefix(prefix)
    }

    /// Connects to `url` (once, to say at start whether Redis is there) and starts
    /// the listener thread, and with Sentinel the thread following failovers. A
    /// Redis (or every Sentinel) down at start is not an error: the node runs,
    /// unhealthy, until it comes. Every name it uses on Redis starts with
    /// `prefix` ([`Self::DEFAULT_PREFIX`] for the names throng always used).
    pub fn start(
        hub: Arc<Hub>,
        url: &str,
        mode: Subscribe,
        wait_replicas: u32,
        history: Limits,
        namespaces: Namespaces,
        prefix: &str,
    ) -> Result<RedisBroker, BrokerError> {
        keys::check_prefix(prefix).map_err(unavailable)?;
        let seeds = cluster::Seeds::parse(url);
        let (target, cluster) = match &seeds {
            Some(seeds) => {
                if mode == Subscribe::Pattern {
                    return Err(unavailable(
                        "--redis-subscribe pattern needs one Redis: a cluster has no sharded pattern subscriptions",
                    ));
                }
                let cluster = ClusterClientBuilder::new(seeds.urls())
                    .connection_timeout(REDIS_TIMEOUT)
                    .response_timeout(REDIS_TIMEOUT)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(10)
                    .max_retry_wait(200)
                    .build()
                    .map_err(unavailable)?;
                // Plain connections (a shard's, a SCAN's) go to masters the
                // topology names; the first seed stands for "the Redis".
                let first = sentinel::Target::open(&seeds.url(&seeds.hosts[0]))?;
                (first, Some(cluster))
            }
            None => (sentinel::Target::open(url)?, None),
        };
        let shared = Arc::new(Shared::new(
            hub,
            target,
            Scheme {
                mode,
                wait_replicas,
                history,
                namespaces,
                prefix: prefix.to_string(),
            },
            cluster,
            seeds.clone(),
        ));
        let listen = Arc::clone(&shared);
        let listening = match seeds {
            Some(seeds) => std::thread::Builder::new()
                .name("throng-redis".into())
                .spawn(move || {
                    shards::Supervisor {
                        shared: listen,
                        seeds,
                    }
                    .run()
                }),
            None => std::thread::Builder::new()
                .name("throng-redis".into())
                .spawn(move || {
                    Listener {
                        shared: listen,
                        delivered: HashMap::new(),
                    }
                    .run()
                }),
        };
        listening.map_err(unavailable)?;
        if shared.target.is_sentinel() {
            let watcher = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("throng-redis-sentinel".into())
                .spawn(move || sentinel::watch(watcher))
                .map_err(unavailable)?;
        }
        if let Err(e) = shared.heartbeat() {
            tracing::warn!(error = %e, "redis not reachable at start; serving, and retrying");
        }
        let keeper = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("throng-redis-keeper".into())
            .spawn(move || keeper.keep_house())
            .map_err(unavailable)?;
        let url = match prefix {
            DEFAULT_PREFIX => redact(url),
            _ => format!("{} (prefix {prefix})", redact(url)),
        };
        let lanes = lanes::Lanes::start(&shared)?;
        Ok(RedisBroker {
            shared,
            url,
            publish: Script::new(publish::PUBLISH_LUA),
            lanes,
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
        Ok(self
            .shared
            .publish_keyed(&self.publish, channel, message, None)?
            .seq)
    }

    fn publish_once(
        &self,
        channel: &str,
        message: Outgoing<'_>,
        key: &str,
    ) -> Result<Published, BrokerError> {
        self.shared
            .publish_keyed(&self.publish, channel, message, Some(key))
    }

    /// Into a publish lane (see `lanes`): answered through the hub once Redis
    /// answers. While Redis is known down it is answered at once, as a
    /// publish on the caller's thread would be.
    fn answers_later(&self) -> bool {
        true
    }

    fn ask(&self, ask: Ask) -> Asked {
        if !self.shared.commands_ok.load(Ordering::Relaxed) {
            return Asked::Now(Err(unavailable("unreachable (retrying every second)")));
        }
        match self.lanes.push(ask) {
            Ok(()) => Asked::Later,
            Err(_) => Asked::Now(Err(unavailable(
                "this node's publish queues to Redis are full: try again",
            ))),
        }
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
        // What a refused subscription gives back before it says why.
        let undo = |e: BrokerError| {
            self.shared
                .hub
                .unsubscribe(&hub_channel, member.conn.loop_index, member.listens);
            self.shared.release(channel);
            e
        };
        self.shared.ensure_subscribed(channel).map_err(undo)?;
        let replay = match resume {
            Some(_) => Some(self.replay(channel, 0).map_err(undo)?),
            None => None,
        };
        let members = match member.presence {
            Some(user) => Some(self.shared.users_join(channel, user).map_err(undo)?),
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
            members,
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
        if let Some(user) = member.presence {
            self.shared.users_leave(channel.name(), user);
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

    fn presence_members(&self, channel: &str) -> Result<Members, BrokerError> {
        self.shared.users(channel)
    }

    fn close_subscribers(&self, channel: &str) -> Result<(), BrokerError> {
        let mut message = MAGIC.to_vec();
        message.extend_from_slice(b"K\n");
        self.shared.with_connection(|con| {
            ::redis::cmd(self.shared.publish_command())
                .arg(self.shared.pubsub_channel(channel))
                .arg(&message)
                .query::<i64>(con)
        })?;
        Ok(())
    }

    /// Channels with members' hashes (written by every node with subscribers)
    /// found by `SCAN`, each counted as `channel_info` counts. `name_start` is
    /// the start of a channel name, not the Redis prefix.
    fn occupied(&self, name_start: &str) -> Result<Vec<(String, u64)>, BrokerError> {
        let pattern = self.shared.names.members_pattern(name_start);
        let mut names: Vec<String> = self
            .shared
            .scan(&pattern)?
            .iter()
            .filter_map(|k| self.shared.names.channel_of_members(k).map(str::to_string))
            .collect();
        // Channels with subscribers here whose count is not written yet.
        for name in lock(&self.shared.written_members).keys() {
            if name.starts_with(name_start) && !names.iter().any(|n| **n == **name) {
                names.push(name.to_string());
            }
        }
        let mut found = Vec::new();
        for name in names {
            let subscribers = self.channel_info(&name).subscribers;
            if subscribers > 0 {
                found.push((name, subscribers));
            }
        }
        Ok(found)
    }

    fn channel_count(&self) -> usize {
        lock(&self.shared.written_members).len()
    }

    fn maintain(&self) {
        // The keeper thread does this node's Redis housekeeping every second.
    }

    fn set_watch(&self, watch: Arc<dyn ChannelWatch>) {
        let _ = self.shared.watch.set(watch);
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    fn failover_counts(&self) -> Option<FailoverCounts> {
        Some(FailoverCounts {
            new_epochs: self.shared.new_epochs.load(Ordering::Relaxed),
            short_waits: self.shared.short_waits.load(Ordering::Relaxed),
        })
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
    fn urls_hide_passwords() {
        assert_eq!(redact("redis://:secret@h:6379/0"), "redis://***@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            redact("redis-sentinel://:pw@a:1,b:2/m"),
            "redis-sentinel://***@a:1,b:2/m"
        );
    }
}
