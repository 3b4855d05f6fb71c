//! Pusher presence on Redis: a presence channel's users (user id and
//! `user_info`), how many connections each has across the cluster and each
//! node's share, changed by Lua scripts that also publish `member_added` when a
//! user's first connection comes and `member_removed` when its last goes, so
//! each is said once for the cluster, in order with the channel's messages. The
//! keeper keeps the keys of presence channels with members here alive and takes
//! out the connections of gone nodes (nodes that died without leaving). It must
//! not deliver to local connections (the listener does).

use std::collections::HashMap;

use super::connection::query_pipeline;
use super::keys::key_life;
use super::wire::{encode_presence, member_json, presence_head};
use super::{BrokerError, Shared, lock};
use crate::broker::{Members, PresenceMember};

pub(super) const JOIN_LUA: &str = include_str!("users_join.lua");
pub(super) const LEAVE_LUA: &str = include_str!("users_leave.lua");
pub(super) const SWEEP_LUA: &str = include_str!("users_sweep.lua");

/// Local presence members by channel: the channels the keeper sweeps. A
/// channel whose last member here left stays, at 0, until the keeper's next
/// sweep: each join keeps the channel's keys alive, and what keeps them alive
/// must take gone nodes out of them (see `timing::NODE_FORGET`).
pub(super) type Local = HashMap<Box<str>, u32>;

impl Shared {
    /// Adds `member`'s connection; the members, itself included, or
    /// `PresenceFull` (nothing changed).
    pub(super) fn users_join(
        &self,
        channel: &str,
        member: PresenceMember<'_>,
    ) -> Result<Members, BrokerError> {
        let keys = self.names.keys(channel);
        let added = encode_presence(
            true,
            Some(member.socket),
            &member_json(member.user_id, Some(member.user_info)),
        );
        let (result, before): (i64, Vec<String>) = self.with_connection(|con| {
            self.users_join
                .key(&keys.users)
                .key(&keys.user_conns)
                .key(&keys.node_conns)
                .arg(&self.node)
                .arg(member.user_id)
                .arg(member.user_info)
                .arg(member.limit)
                .arg(key_life(std::time::Duration::ZERO))
                .arg(self.pubsub_channel(channel))
                .arg(&added)
                .invoke(con)
        })?;
        if result < 0 {
            return Err(BrokerError::PresenceFull(member.limit));
        }
        *lock(&self.presence_channels)
            .entry(channel.into())
            .or_insert(0) += 1;
        let mut members: Members = before
            .chunks_exact(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        if result == 1 {
            if let Some(watch) = self.watch.get() {
                watch.member_added(channel, member.user_id);
            }
            members.push((member.user_id.to_string(), member.user_info.to_string()));
        }
        Ok(members)
    }

    /// Takes `member`'s connection out.
    pub(super) fn users_leave(&self, channel: &str, member: PresenceMember<'_>) {
        {
            if let Some(n) = lock(&self.presence_channels).get_mut(channel) {
                *n = n.saturating_sub(1);
            }
        }
        let keys = self.names.keys(channel);
        let removed = encode_presence(false, None, &member_json(member.user_id, None));
        let result = self.with_connection(|con| {
            self.users_leave
                .key(&keys.users)
                .key(&keys.user_conns)
                .key(&keys.node_conns)
                .arg(&self.node)
                .arg(member.user_id)
                .arg(self.pubsub_channel(channel))
                .arg(&removed)
                .invoke::<i64>(con)
        });
        if let (Ok(1), Some(watch)) = (&result, self.watch.get()) {
            watch.member_removed(channel, member.user_id);
        }
        if let Err(e) = result {
            // Another node's keeper takes it out once this node is gone; until
            // then the user stays listed.
            tracing::warn!(channel, error = %e, "presence leave not written to redis");
        }
    }

    /// Every member of `channel`.
    pub(super) fn users(&self, channel: &str) -> Result<Members, BrokerError> {
        let keys = self.names.keys(channel);
        let all: Vec<String> =
            self.with_connection(|con| ::redis::cmd("HGETALL").arg(&keys.users).query(con))?;
        Ok(all
            .chunks_exact(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect())
    }

    /// Takes gone nodes' connections out of the presence channels this node
    /// has (or just had) members in; with `refresh`, keeps the keys of those
    /// with members here alive.
    pub(super) fn sweep_users(&self, refresh: bool) -> Result<(), BrokerError> {
        let local: Vec<(Box<str>, u32)> = lock(&self.presence_channels)
            .iter()
            .map(|(name, n)| (name.clone(), *n))
            .collect();
        if refresh {
            let life = key_life(std::time::Duration::ZERO);
            let mut pipe = ::redis::pipe();
            for (channel, _) in local.iter().filter(|(_, n)| *n > 0) {
                let keys = self.names.keys(channel);
                for key in [&keys.users, &keys.user_conns, &keys.node_conns] {
                    pipe.cmd("EXPIRE").arg(key).arg(life).ignore();
                }
            }
            if pipe.cmd_iter().next().is_some() {
                self.with_connection(|con| query_pipeline::<()>(&pipe, con))?;
            }
        }
        let gone = self.gone();
        if !gone.is_empty() {
            let head = presence_head(false, None);
            for (channel, _) in &local {
                self.sweep_channel_users(channel, &head, &gone)?;
            }
        }
        let mut kept = lock(&self.presence_channels);
        for (channel, _) in local.iter().filter(|(_, n)| *n == 0) {
            // Unless a member came back meanwhile.
            if kept.get(channel) == Some(&0) {
                kept.remove(channel);
            }
        }
        Ok(())
    }

    fn sweep_channel_users(
        &self,
        channel: &str,
        head: &[u8],
        gone: &[String],
    ) -> Result<(), BrokerError> {
        let keys = self.names.keys(channel);
        let removed: Vec<String> = self.with_connection(|con| {
            self.users_sweep
                .key(&keys.users)
                .key(&keys.user_conns)
                .key(&keys.node_conns)
                .arg(self.pubsub_channel(channel))
                .arg(head)
                .arg(gone)
                .invoke(con)
        })?;
        if let Some(watch) = self.watch.get() {
            for user in &removed {
                watch.member_removed(channel, user);
            }
        }
        if !removed.is_empty() {
            tracing::info!(
                channel,
                removed = removed.len(),
                "presence users of a gone node removed"
            );
        }
        Ok(())
    }
}
