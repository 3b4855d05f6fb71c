//! Presence and housekeeping: this node's member count of each channel in the
//! channel's members hash (`members.lua` sums the live nodes'), join and leave
//! events to every node, and the keeper thread that writes counts, beats the
//! node's heartbeat and keeps the keys of channels with subscribers here alive.
//! It must not deliver to local connections (the listener does).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::keys::{Keys, NODE_PREFIX, key_life};
use super::wire::encode_event;
use super::{BrokerError, ConnRef, RedisBroker, Shared, lock};

/// Adds to this node's members of a channel and returns every live node's sum.
/// KEYS and ARGV are in the file's header.
pub(super) const MEMBERS_LUA: &str = include_str!("members.lua");

impl Shared {
    /// Adds `delta` to this node's members of `channel`; the cluster-wide count.
    pub(super) fn members(&self, channel: &str, delta: i64) -> Result<u64, BrokerError> {
        let keys = Keys::of(channel);
        let total: i64 = self.with_connection(|con| {
            self.members
                .key(&keys.members)
                .arg(&self.node)
                .arg(delta)
                .arg(key_life(Duration::ZERO))
                .arg(NODE_PREFIX)
                .invoke(con)
        })?;
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// Every second: this node's member counts; every few: its heartbeat.
    pub(super) fn keep_house(&self) {
        let mut tick: u64 = 0;
        loop {
            std::thread::sleep(Duration::from_secs(1));
            // Keys of channels with subscribers here are refreshed well within
            // their life (the retention, at least 5 minutes).
            let refresh = tick.is_multiple_of(60);
            let unhealthy = !self.commands_ok.load(Ordering::Relaxed);
            let result = if tick.is_multiple_of(5) || unhealthy {
                self.heartbeat()
                    .and_then(|()| self.write_occupancy())
                    .and_then(|()| self.write_members(refresh))
                    .and_then(|()| self.sweep_users())
                    .and_then(|()| self.sweep_occupiers())
            } else {
                self.write_occupancy()
                    .and_then(|()| self.write_members(refresh))
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis housekeeping failed");
            }
            tick += 1;
        }
    }

    /// Writes this node's member counts of channels that changed; forgets the
    /// count of channels without local subscribers.
    pub(super) fn write_members(&self, refresh_keys: bool) -> Result<(), BrokerError> {
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
