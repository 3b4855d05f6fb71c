//! The pubsub side on a Redis Cluster: sharded pub/sub. A channel's messages are
//! `SPUBLISH`ed on `throng:ch:{NAME}`, in the slot of the channel's keys, so only
//! the master of that slot carries them. A node holds one connection per master
//! (a thread each), `SSUBSCRIBE`d there to the channels it has subscribers of
//! whose slots that master serves, and classically `SUBSCRIBE`d to its wake
//! channel (a plain `PUBLISH` reaches every cluster node, so one wake reaches
//! every shard thread).
//!
//! A supervisor thread keeps the cluster's topology (`CLUSTER SLOTS`, read again
//! every few seconds, when a shard connection fails, or when Redis moves a slot
//! away and says so with a `sunsubscribe`). When it changes (a failover, a
//! resharding) the supervisor stops every shard thread, starts one per master of
//! the new topology, and each fills in from history what its channels missed
//! meanwhile, as the single-Redis listener does after a reconnect.
//!
//! It hands what comes to the same [`Listener`] code as a single Redis
//! (`listener.rs`), and must not write channel state to Redis.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use ::redis::{Client, Connection, Value};

use super::cluster::{Seeds, Topology, slot_of};
use super::connection::REDIS_TIMEOUT;
use super::listener::Listener;
use super::{Shared, lock};
use crate::timing::{SHARD_SILENCE, SHARDS_CHECK_EVERY, SHARDS_RETRY_FIRST, SHARDS_RETRY_MAX};

/// The slot of `channel`'s shard channel (and of its keys): its name's alone,
/// whatever the prefix.
fn slot_of_channel(channel: &str) -> u16 {
    slot_of(format!("{{{channel}}}").as_bytes())
}

/// What the shard threads and the supervisor share.
pub(super) struct ShardState {
    /// Bumped whenever the shard threads are replaced; a thread that sees
    /// another number than its own stops.
    generation: AtomicU64,
    /// Shard threads of the current generation subscribed and reading.
    ready: AtomicUsize,
    /// Masters of the current generation.
    expected: AtomicUsize,
}

impl ShardState {
    pub(super) fn new() -> ShardState {
        ShardState {
            generation: AtomicU64::new(0),
            ready: AtomicUsize::new(0),
            expected: AtomicUsize::new(usize::MAX),
        }
    }
}

/// Why a shard thread stopped.
enum Stop {
    /// The supervisor asked (a new generation).
    Replaced,
    /// Its connection failed, or Redis moved one of its slots away.
    Trouble(String),
}

/// The supervisor: the topology and one thread per master.
pub(super) struct Supervisor {
    pub(super) shared: Arc<Shared>,
    pub(super) seeds: Seeds,
}

impl Supervisor {
    pub(super) fn run(self) {
        let mut delivered: HashMap<Box<str>, (u64, u64)> = HashMap::new();
        let mut retry = SHARDS_RETRY_FIRST;
        let mut first = true;
        loop {
            let topology = match Topology::read(&self.seeds, REDIS_TIMEOUT) {
                Ok(t) => t,
                Err(e) => {
                    self.shared.listening.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, "redis cluster topology unreadable; retrying");
                    std::thread::sleep(retry);
                    retry = (retry * 2).min(SHARDS_RETRY_MAX);
                    continue;
                }
            };
            let shards = &self.shared.shards;
            let generation = shards.generation.fetch_add(1, Ordering::AcqRel) + 1;
            let masters = topology.masters();
            shards.ready.store(0, Ordering::Relaxed);
            shards.expected.store(masters.len(), Ordering::Relaxed);
            let (trouble_tx, trouble) = mpsc::channel();
            let mut threads = Vec::with_capacity(masters.len());
            for addr in &masters {
                let mine: HashMap<Box<str>, (u64, u64)> = delivered
                    .iter()
                    .filter(|(name, _)| {
                        topology.master_of(slot_of_channel(name)) == Some(addr.as_str())
                    })
                    .map(|(n, d)| (n.clone(), *d))
                    .collect();
                let shard = Shard {
                    listener: Listener {
                        shared: Arc::clone(&self.shared),
                        delivered: mine,
                    },
                    url: self.seeds.url(addr),
                    addr: addr.clone(),
                    topology: topology.clone(),
                    generation,
                    fill_in: !first,
                    leaving: HashSet::new(),
                };
                let tx = trouble_tx.clone();
                let spawned = std::thread::Builder::new()
                    .name("throng-redis-shard".into())
                    .spawn(move || shard.run(tx));
                match spawned {
                    Ok(handle) => threads.push(handle),
                    Err(e) => tracing::error!(error = %e, "cannot start a redis shard thread"),
                }
            }
            drop(trouble_tx);
            first = false;
            tracing::info!(
                masters = masters.len(),
                "redis cluster: listening to every master"
            );
            let began = Instant::now();
            self.watch(&topology, &trouble);
            // Stop this generation; what each thread handed out goes to the next.
            shards.generation.fetch_add(1, Ordering::AcqRel);
            self.shared.listening.store(false, Ordering::Relaxed);
            self.wake_shards(&topology);
            delivered = join_all(threads);
            // A master that is down but not yet replaced is still in the topology:
            // back off instead of reconnecting to it in a loop.
            if began.elapsed() < SHARDS_CHECK_EVERY {
                std::thread::sleep(retry);
                retry = (retry * 2).min(SHARDS_RETRY_MAX);
            } else {
                retry = SHARDS_RETRY_FIRST;
            }
        }
    }

    /// Wakes every shard thread (each then sees its generation is over): a plain
    /// `PUBLISH` on the wake channel, on a direct connection to the first master
    /// that answers (the cluster passes it to every node). Not through the
    /// command pool, which fails fast exactly when this is needed (a master
    /// down).
    fn wake_shards(&self, topology: &Topology) {
        let wake = self.shared.names.wake(&self.shared.node);
        for master in topology.masters() {
            let published = Client::open(self.seeds.url(&master))
                .and_then(|c| c.get_connection_with_timeout(REDIS_TIMEOUT))
                .and_then(|mut con| {
                    con.set_read_timeout(Some(REDIS_TIMEOUT))?;
                    ::redis::cmd("PUBLISH")
                        .arg(&wake)
                        .arg("")
                        .query::<i64>(&mut con)
                });
            if published.is_ok() {
                return;
            }
        }
        tracing::warn!(
            "redis cluster: no master took the wake; shard threads stop on their read timeout"
        );
    }

    /// Returns when the topology changed or a shard thread is in trouble.
    fn watch(&self, topology: &Topology, trouble: &Receiver<String>) {
        let mut next_check = Instant::now() + SHARDS_CHECK_EVERY;
        loop {
            let wait = next_check.saturating_duration_since(Instant::now());
            match trouble.recv_timeout(wait) {
                Ok(why) => {
                    tracing::warn!(why, "redis cluster: a shard needs the topology again");
                    return;
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            next_check = Instant::now() + SHARDS_CHECK_EVERY;
            // Keeps quiet shard connections talking (see SHARD_SILENCE).
            let _ = self.shared.wake_listener();
            match Topology::read(&self.seeds, REDIS_TIMEOUT) {
                Ok(now) if now != *topology => {
                    tracing::info!("redis cluster: the topology changed");
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "redis cluster: topology unreadable");
                    return;
                }
            }
        }
    }
}

/// Waits for every shard thread to stop; their delivered seqs, merged.
fn join_all(threads: Vec<JoinHandle<Listener>>) -> HashMap<Box<str>, (u64, u64)> {
    let mut delivered = HashMap::new();
    for handle in threads {
        if let Ok(listener) = handle.join() {
            delivered.extend(listener.delivered);
        }
    }
    delivered
}

/// One master's connection and what it subscribed there.
struct Shard {
    listener: Listener,
    url: String,
    addr: String,
    topology: Topology,
    generation: u64,
    /// Whether to fill in from history once subscribed (not on the first start).
    fill_in: bool,
    /// Channels this thread asked to leave, whose `sunsubscribe` is expected.
    leaving: HashSet<Box<str>>,
}

impl Shard {
    fn run(mut self, trouble: Sender<String>) -> Listener {
        match self.serve() {
            Ok(Stop::Replaced) => {}
            Ok(Stop::Trouble(why)) | Err(why) => {
                let _ = trouble.send(format!("{}: {why}", self.addr));
            }
        }
        self.listener
    }

    fn shared(&self) -> &Shared {
        &self.listener.shared
    }

    fn mine(&self, channel: &str) -> bool {
        self.topology.master_of(slot_of_channel(channel)) == Some(self.addr.as_str())
    }

    fn current(&self) -> bool {
        self.shared().shards.generation.load(Ordering::Acquire) == self.generation
    }

    fn serve(&mut self) -> Result<Stop, String> {
        let mut con = Client::open(self.url.as_str())
            .and_then(|c| c.get_connection_with_timeout(REDIS_TIMEOUT))
            .map_err(|e| e.to_string())?;
        con.set_read_timeout(Some(SHARD_SILENCE))
            .map_err(|e| e.to_string())?;
        con.set_write_timeout(Some(REDIS_TIMEOUT))
            .map_err(|e| e.to_string())?;
        // Its own handle on the names: a channel read back is handed to the
        // listener, which this borrows mutably.
        let shared = Arc::clone(&self.listener.shared);
        let channel_of = |shard: &[u8]| {
            let shard = std::str::from_utf8(shard).ok()?;
            shared.names.channel_of_shard(shard).map(str::to_string)
        };
        let wake = shared.names.wake(&shared.node);
        let mut out = ::redis::cmd("SUBSCRIBE").arg(&wake).get_packed_command();
        // Every wanted channel of this master's slots; what was asked for before
        // now is in `wanted` too, so the asks are done.
        let wanted: Vec<Box<str>> = {
            let mut subs = lock(&self.shared().subs);
            let todo = std::mem::take(&mut subs.todo);
            subs.todo = todo.into_iter().filter(|(n, _)| !self.mine(n)).collect();
            subs.wanted
                .keys()
                .filter(|n| self.mine(n))
                .cloned()
                .collect()
        };
        for name in &wanted {
            ssubscribe(&mut out, &shared.names.shard(name));
        }
        con.send_packed_command(&out).map_err(|e| e.to_string())?;
        let mut pending: usize = wanted.len();
        let mut ready = false;
        loop {
            if !self.current() {
                return Ok(Stop::Replaced);
            }
            let value = match con.recv_response() {
                Ok(v) => v,
                Err(e) => return Err(e.to_string()),
            };
            let Some((kind, channel, payload)) = push_parts(value) else {
                continue;
            };
            match kind.as_slice() {
                b"smessage" => {
                    if let Some(name) = channel_of(&channel) {
                        self.listener.handle(&name, &payload);
                    }
                }
                b"ssubscribe" => {
                    if let Some(name) = channel_of(&channel) {
                        self.confirm(&name);
                    }
                    pending = pending.saturating_sub(1);
                    if !ready && pending == 0 {
                        ready = self.ready();
                    }
                }
                b"sunsubscribe" => {
                    let Some(name) = channel_of(&channel) else {
                        continue;
                    };
                    if !self.leaving.remove(name.as_str()) {
                        // Redis moved the slot away: the new owner must take it.
                        self.unconfirm(&name);
                        return Ok(Stop::Trouble(format!("{name}'s slot moved")));
                    }
                }
                b"subscribe" if pending == 0 && !ready => ready = self.ready(),
                b"message" => {
                    if !self.current() {
                        return Ok(Stop::Replaced);
                    }
                    pending += self.apply_todo(&mut con)?;
                }
                _ => {}
            }
        }
    }

    /// Subscribed to everything it was given: counted ready, and what was missed
    /// while no thread listened to this master is filled in.
    fn ready(&mut self) -> bool {
        let shards = &self.shared().shards;
        if shards.ready.fetch_add(1, Ordering::AcqRel) + 1
            == shards.expected.load(Ordering::Relaxed)
        {
            self.shared().listening.store(true, Ordering::Relaxed);
            self.shared().commands_ok.store(true, Ordering::Relaxed);
        }
        if self.fill_in {
            self.listener.fill_in();
        }
        true
    }

    fn confirm(&self, name: &str) {
        let mut subs = lock(&self.shared().subs);
        if let Some(confirmed) = subs.wanted.get_mut(name) {
            *confirmed = true;
        }
        drop(subs);
        self.shared().confirmed.notify_all();
    }

    fn unconfirm(&self, name: &str) {
        if let Some(confirmed) = lock(&self.shared().subs).wanted.get_mut(name) {
            *confirmed = false;
        }
    }

    /// The asked subscription changes of this master's channels, in order; the
    /// number of confirmations to expect.
    fn apply_todo(&mut self, con: &mut Connection) -> Result<usize, String> {
        let mine: Vec<(Box<str>, bool)> = {
            let mut subs = lock(&self.shared().subs);
            let todo = std::mem::take(&mut subs.todo);
            let (mine, others): (Vec<_>, Vec<_>) =
                todo.into_iter().partition(|(n, _)| self.mine(n));
            subs.todo = others;
            mine
        };
        if mine.is_empty() {
            return Ok(0);
        }
        let mut out = Vec::new();
        let mut subscribes = 0;
        for (name, subscribe) in mine {
            if subscribe {
                self.leaving.remove(&name);
                ssubscribe(&mut out, &self.shared().names.shard(&name));
                subscribes += 1;
            } else {
                out.extend_from_slice(
                    &::redis::cmd("SUNSUBSCRIBE")
                        .arg(self.shared().names.shard(&name))
                        .get_packed_command(),
                );
                self.leaving.insert(name);
            }
        }
        con.send_packed_command(&out).map_err(|e| e.to_string())?;
        Ok(subscribes)
    }
}

/// Appends one `SSUBSCRIBE` (one channel: a command's channels must share a slot).
fn ssubscribe(out: &mut Vec<u8>, shard_channel: &str) {
    out.extend_from_slice(
        &::redis::cmd("SSUBSCRIBE")
            .arg(shard_channel)
            .get_packed_command(),
    );
}

/// A pubsub push (RESP2 array, or RESP3 push) as (kind, channel, payload or count).
fn push_parts(value: Value) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let items = match value {
        Value::Array(items) => items,
        Value::Push { kind, data } => {
            let mut items = vec![Value::BulkString(kind.to_string().into_bytes())];
            items.extend(data);
            items
        }
        _ => return None,
    };
    let mut items = items.into_iter();
    let bytes = |v: Option<Value>| match v {
        Some(Value::BulkString(b)) => Some(b),
        Some(Value::SimpleString(s)) => Some(s.into_bytes()),
        Some(Value::Int(n)) => Some(n.to_string().into_bytes()),
        _ => None,
    };
    Some((
        bytes(items.next())?,
        bytes(items.next())?,
        bytes(items.next())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_channels_share_their_keys_slot() {
        let names = super::super::keys::Names::new("throng");
        assert_eq!(names.shard("news"), "throng:ch:{news}");
        assert_eq!(names.channel_of_shard("throng:ch:{news}"), Some("news"));
        assert_eq!(names.channel_of_shard("throng:ch:news"), None);
        let other = super::super::keys::Names::new("other");
        for channel in ["room:7", "news"] {
            let slot = slot_of_channel(channel);
            assert_eq!(slot, slot_of(names.shard(channel).as_bytes()));
            assert_eq!(slot, slot_of(names.keys(channel).seq.as_bytes()));
            assert_eq!(slot, slot_of(other.shard(channel).as_bytes()));
            assert_eq!(slot, slot_of(other.keys(channel).seq.as_bytes()));
        }
    }

    #[test]
    fn pushes_are_read_in_both_protocols() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"smessage".to_vec()),
            Value::BulkString(b"throng:ch:{a}".to_vec()),
            Value::BulkString(b"hi".to_vec()),
        ]);
        assert_eq!(
            push_parts(resp2),
            Some((
                b"smessage".to_vec(),
                b"throng:ch:{a}".to_vec(),
                b"hi".to_vec()
            ))
        );
        let count = Value::Array(vec![
            Value::BulkString(b"ssubscribe".to_vec()),
            Value::BulkString(b"throng:ch:{a}".to_vec()),
            Value::Int(1),
        ]);
        assert_eq!(push_parts(count).map(|p| p.2), Some(b"1".to_vec()));
        assert_eq!(push_parts(Value::Okay), None);
    }
}
