//! The Redis keys: a channel's four keys (in one Redis Cluster slot), a node's
//! heartbeat key, and how long each lives. It must not talk to Redis.

use std::time::Duration;

use super::CHANNEL_RETENTION;

/// A node whose heartbeat key is older than this is gone: its members do not count.
pub(super) const NODE_TTL_SECS: u64 = 30;
/// A node's heartbeat key is this prefix and the node's name.
pub(super) const NODE_PREFIX: &str = "throng:node:";

/// The Redis keys of one channel.
pub(super) struct Keys {
    pub(super) seq: String,
    pub(super) epoch: String,
    pub(super) hist: String,
    pub(super) members: String,
    /// A Pusher presence channel's users (user -> user_info), their connections
    /// (user -> count) and each node's share (node "\n" user -> count).
    pub(super) users: String,
    pub(super) user_conns: String,
    pub(super) node_conns: String,
    /// The nodes with subscribers of a channel whose occupancy is watched.
    pub(super) occupants: String,
}

impl Keys {
    pub(super) fn of(channel: &str) -> Keys {
        Keys {
            seq: format!("throng:{{{channel}}}:seq"),
            epoch: format!("throng:{{{channel}}}:epoch"),
            hist: format!("throng:{{{channel}}}:hist"),
            members: format!("throng:{{{channel}}}:members"),
            users: format!("throng:{{{channel}}}:users"),
            user_conns: format!("throng:{{{channel}}}:userconns"),
            node_conns: format!("throng:{{{channel}}}:nodeconns"),
            occupants: format!("throng:{{{channel}}}:occupants"),
        }
    }
}

/// The nodes that hold watched channels (each node's list is [`occupied_by`]):
/// where the keeper looks for a gone node's channels.
pub(super) const OCCUPIERS: &str = "throng:occupiers";

/// The watched channels `node` holds.
pub(super) fn occupied_by(node: &str) -> String {
    format!("throng:occupied-by:{node}")
}

pub(super) fn node_key(node: &str) -> String {
    format!("{NODE_PREFIX}{node}")
}

/// How long a channel's keys outlive its last publish (or the last time a node
/// with subscribers refreshed them): the retention, or the history's ttl if longer.
pub(super) fn key_life(ttl: Duration) -> u64 {
    ttl.max(CHANNEL_RETENTION).as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_cluster_slot() {
        let k = Keys::of("chat:room");
        assert_eq!(k.seq, "throng:{chat:room}:seq");
        assert_eq!(k.hist, "throng:{chat:room}:hist");
        assert_eq!(node_key("n1"), "throng:node:n1");
    }
}
