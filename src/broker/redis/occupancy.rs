//! Occupancy across the cluster, for the channels a [`ChannelWatch`] watches
//! (Pusher's `channel_occupied` and `channel_vacated`): each node adds itself
//! to a channel's occupants set when it has subscribers there and takes itself
//! out when it has none, and the node whose change fills or empties the set is
//! the one that tells the watch, so the cluster says each once. The keeper does
//! this once a second, off the event loops; a channel that fills and empties
//! within that second on one node says nothing (nobody outside saw it). A node
//! that dies without leaving is swept by the first keeper to find it gone: on
//! the list of gone nodes, or no longer in the nodes' set at all. It must not
//! deliver to local connections.

use std::collections::HashSet;
use std::sync::Arc;

use super::connection::query_pipeline;
use super::{BrokerError, ChannelWatch, Shared, lock};

pub(super) const OCCUPY_LUA: &str = include_str!("occupy.lua");
pub(super) const VACATE_LUA: &str = include_str!("vacate.lua");

/// The watched channels this node has written itself an occupant of.
pub(super) type Occupying = HashSet<Box<str>>;

impl Shared {
    /// Writes this node into the occupants of watched channels it now has
    /// subscribers of, and out of those it has none of.
    pub(super) fn write_occupancy(&self) -> Result<(), BrokerError> {
        let Some(watch) = self.watch.get() else {
            return Ok(());
        };
        let local: Vec<Box<str>> = lock(&self.written_members)
            .keys()
            .filter(|name| {
                self.hub.find(name).is_some_and(|c| c.subscribers() > 0)
                    && watch.watches_occupancy(name)
            })
            .cloned()
            .collect();
        let mut occupying = lock(&self.occupying);
        let came: Vec<Box<str>> = local
            .iter()
            .filter(|name| !occupying.contains(*name))
            .cloned()
            .collect();
        let local: HashSet<Box<str>> = local.into_iter().collect();
        let went: Vec<Box<str>> = occupying
            .iter()
            .filter(|name| !local.contains(*name))
            .cloned()
            .collect();
        if came.is_empty() && went.is_empty() {
            return Ok(());
        }
        let mine = self.names.occupied_by(&self.node);
        if !came.is_empty() {
            let mut pipe = ::redis::pipe();
            pipe.cmd("SADD")
                .arg(self.names.occupiers())
                .arg(&self.node)
                .ignore()
                .cmd("SADD")
                .arg(&mine)
                .arg(came.iter().map(|c| &**c).collect::<Vec<&str>>())
                .ignore();
            self.with_connection(|con| query_pipeline::<()>(&pipe, con))?;
        }
        let gone = self.gone();
        for name in came {
            let keys = self.names.keys(&name);
            let answer: i64 = self.with_connection(|con| {
                self.occupy
                    .key(&keys.occupants)
                    .arg(&self.node)
                    .arg(&*gone)
                    .invoke(con)
            })?;
            if answer == 2 {
                watch.vacated(&name);
            }
            if answer > 0 {
                watch.occupied(&name);
            }
            occupying.insert(name);
        }
        for name in went {
            self.vacate_for(&self.node, &name, watch)?;
            self.with_connection(|con| {
                ::redis::cmd("SREM").arg(&mine).arg(&*name).query::<()>(con)
            })?;
            occupying.remove(&name);
        }
        Ok(())
    }

    /// Takes `node` out of `channel`'s occupants; tells the watch if that
    /// emptied it.
    fn vacate_for(
        &self,
        node: &str,
        channel: &str,
        watch: &Arc<dyn ChannelWatch>,
    ) -> Result<(), BrokerError> {
        let keys = self.names.keys(channel);
        let emptied: i64 =
            self.with_connection(|con| self.vacate.key(&keys.occupants).arg(node).invoke(con))?;
        if emptied == 1 {
            watch.vacated(channel);
        }
        Ok(())
    }

    /// Sweeps for nodes that died holding watched channels: the keeper that
    /// takes a gone node off the occupiers list vacates its channels. A node
    /// not in the nodes' set is gone too, forgotten (it beat before it first
    /// wrote itself an occupier), maybe while no node watched: the occupiers
    /// list never expires, so it would hold the node for ever.
    pub(super) fn sweep_occupiers(&self) -> Result<(), BrokerError> {
        let Some(watch) = self.watch.get() else {
            return Ok(());
        };
        let nodes: Vec<String> = self.with_connection(|con| {
            ::redis::cmd("SMEMBERS")
                .arg(self.names.occupiers())
                .query(con)
        })?;
        let others: Vec<String> = nodes.into_iter().filter(|n| *n != self.node).collect();
        if others.is_empty() {
            return Ok(());
        }
        let beats: Vec<Option<String>> = self.with_connection(|con| {
            let mut pipe = ::redis::pipe();
            for node in &others {
                pipe.cmd("ZSCORE").arg(self.names.nodes()).arg(node);
            }
            query_pipeline(&pipe, con)
        })?;
        let gone = self.gone();
        for (node, beat) in others.into_iter().zip(beats) {
            if beat.is_some() && !gone.contains(&node) {
                continue;
            }
            let claimed: i64 = self.with_connection(|con| {
                ::redis::cmd("SREM")
                    .arg(self.names.occupiers())
                    .arg(&node)
                    .query(con)
            })?;
            if claimed == 0 {
                // Another node's keeper is sweeping it.
                continue;
            }
            let list = self.names.occupied_by(&node);
            let channels: Vec<String> =
                self.with_connection(|con| ::redis::cmd("SMEMBERS").arg(&list).query(con))?;
            for channel in &channels {
                self.vacate_for(&node, channel, watch)?;
            }
            self.with_connection(|con| ::redis::cmd("DEL").arg(&list).query::<()>(con))?;
            tracing::info!(
                node,
                channels = channels.len(),
                "occupancy of a gone node swept"
            );
        }
        Ok(())
    }
}
