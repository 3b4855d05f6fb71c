//! Presence, liveness and housekeeping: this node's member count of each
//! channel in the channel's members hash (`members.lua` sums the nodes'), join
//! and leave events to every node, which nodes are gone, and the keeper thread
//! that writes counts, beats the node's heartbeat, sweeps for gone nodes and
//! keeps the keys of channels with subscribers here alive. It must not deliver
//! to local connections (the listener does).
//!
//! Liveness: each beat (`heartbeat.lua`, every 5 s) records this node in the
//! nodes' set and brings back the gone nodes (last beat over the node TTL ago),
//! kept in `Shared::gone`. Scripts read only keys of their channel's Redis
//! Cluster slot, which the nodes' set is not in, so they are handed that list
//! and take out only the nodes on it. A node not on the list counts, however
//! new: a node that just started is never taken for gone. The price: a dead
//! node counts until the first beat after its TTL, 30-35 s after its last one.

use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::{ConnectionLike, RedisResult, Script};

use super::connection::query_pipeline;
use super::keys::key_life;
use super::wire::encode_event;
use super::{BrokerError, ConnRef, RedisBroker, Shared, lock};
use crate::timing::{keeper_tick, node_forget, node_ttl};

/// Adds to this node's members of a channel and returns the nodes' sum.
/// KEYS and ARGV are in the file's header.
pub(super) const MEMBERS_LUA: &str = include_str!("members.lua");

/// This node's beat, and the gone nodes. KEYS and ARGV are in the file's header.
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("heartbeat.lua")));

/// How many keeper ticks (`timing::KEEPER_TICK`) apart it beats (and sweeps
/// for gone nodes).
const BEAT_EVERY: u64 = 5;

impl Shared {
    /// Adds `delta` to this node's members of `channel`; the cluster-wide count.
    pub(super) fn members(&self, channel: &str, delta: i64) -> Result<u64, BrokerError> {
        let keys = self.names.keys(channel);
        let gone = self.gone();
        let total: i64 = self.with_connection(|con| {
            self.members
                .key(&keys.members)
                .arg(&self.node)
                .arg(delta)
                .arg(key_life(Duration::ZERO))
                .arg(&*gone)
                .invoke(con)
        })?;
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// The nodes gone at this node's last beat.
    pub(super) fn gone(&self) -> Arc<[String]> {
        Arc::clone(&lock(&self.gone))
    }

    /// Beats on `con`: this node is alive. Keeps the gone nodes it learns.
    pub(super) fn beat(&self, con: &mut dyn ConnectionLike) -> RedisResult<()> {
        let gone: Vec<String> = HEARTBEAT
            .key(self.names.nodes())
            .arg(&self.node)
            .arg(node_ttl().as_millis() as u64)
            .arg(node_forget().as_millis() as u64)
            .invoke(con)?;
        let mut kept = lock(&self.gone);
        for node in gone.iter().filter(|n| !kept.contains(n)) {
            tracing::info!(
                node,
                "redis: a node is gone (no heartbeat for {:?})",
                node_ttl()
            );
        }
        *kept = gone.into();
        Ok(())
    }

    /// Every keeper tick (a second): this node's member counts; every few: its
    /// heartbeat and the sweeps for gone nodes.
    pub(super) fn keep_house(&self) {
        let mut tick: u64 = 0;
        // Occupancy is written only after gone nodes' occupancy was swept once:
        // a node forgotten long ago still in a channel's occupants would keep
        // this node's arrival from saying the channel is occupied.
        let mut swept = false;
        // Read once: the tick is the test scale's (set before the broker starts).
        let tick_length = keeper_tick();
        loop {
            std::thread::sleep(tick_length);
            // Keys of channels with subscribers here are refreshed well within
            // their life (the retention, at least 5 minutes).
            let refresh = tick.is_multiple_of(60);
            let unhealthy = !self.commands_ok.load(Ordering::Relaxed);
            let result = if tick.is_multiple_of(BEAT_EVERY) || unhealthy {
                self.heartbeat()
                    .and_then(|()| self.sweep_occupiers())
                    .inspect(|()| swept = true)
                    .and_then(|()| self.write_occupancy())
                    .and_then(|()| self.write_members(refresh))
                    .and_then(|()| self.sweep_users(refresh))
            } else if swept {
                self.write_occupancy()
                    .and_then(|()| self.write_members(refresh))
            } else {
                self.write_members(refresh)
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis housekeeping failed");
            }
            tick += 1;
        }
    }

    /// Writes this node's member counts of channels that changed (of every
    /// channel with `refresh_keys`, which also keeps their keys alive); forgets
    /// the count of channels without local subscribers. Where it writes a
    /// count it takes out the gone nodes' (see `timing::NODE_FORGET`).
    pub(super) fn write_members(&self, refresh_keys: bool) -> Result<(), BrokerError> {
        let gone_nodes = self.gone();
        let mut written = lock(&self.written_members);
        let mut pipe = ::redis::pipe();
        let node = &self.node;
        let life = key_life(Duration::ZERO);
        let mut left = Vec::new();
        for (name, count) in written.iter_mut() {
            let keys = self.names.keys(name);
            match self.hub.find(name) {
                Some(channel) => {
                    let now = channel.subscribers();
                    if refresh_keys {
                        // A channel with subscribers here keeps its seq and history.
                        let life_here = key_life(self.limits(name).ttl);
                        pipe.cmd("EXPIRE").arg(&keys.seq).arg(life_here).ignore();
                        pipe.cmd("EXPIRE").arg(&keys.epoch).arg(life_here).ignore();
                        pipe.cmd("EXPIRE").arg(&keys.hist).arg(life_here).ignore();
                        if self.wait_replicas > 0 {
                            pipe.cmd("EXPIRE")
                                .arg(&keys.released)
                                .arg(life_here)
                                .ignore();
                        }
                    }
                    // Rewritten on refresh too: the hash lives only as long as
                    // someone writes it, and Redis may have lost it.
                    if now != *count || refresh_keys {
                        pipe.cmd("HSET")
                            .arg(&keys.members)
                            .arg(node)
                            .arg(now)
                            .ignore();
                        pipe.cmd("EXPIRE").arg(&keys.members).arg(life).ignore();
                        if !gone_nodes.is_empty() {
                            pipe.cmd("HDEL")
                                .arg(&keys.members)
                                .arg(&*gone_nodes)
                                .ignore();
                        }
                        *count = now;
                    }
                }
                None => {
                    pipe.cmd("HDEL").arg(&keys.members).arg(node).ignore();
                    left.push(name.clone());
                }
            }
        }
        for name in left {
            written.remove(&name);
        }
        drop(written);
        if pipe.cmd_iter().next().is_none() {
            return Ok(());
        }
        self.with_connection(|con| query_pipeline::<()>(&pipe, con))
    }
}

impl RedisBroker {
    /// Announces a join or leave to the channel's listeners on every node.
    pub(super) fn announce(
        &self,
        channel: &str,
        event: &str,
        client: &str,
        count: u64,
        exclude: Option<ConnRef>,
    ) {
        let message = encode_event(&self.shared.node, exclude, count, event, client);
        let pubsub = self.shared.pubsub_channel(channel);
        // Presence is advisory: a lost event is corrected by the next one's count.
        let _ = self.shared.with_connection(|con| {
            ::redis::cmd(self.shared.publish_command())
                .arg(&pubsub)
                .arg(&message)
                .query::<i64>(con)
        });
    }
}
