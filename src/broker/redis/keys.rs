//! The Redis keys: a channel's keys (all in its Redis Cluster slot, `{NAME}`),
//! the nodes' heartbeats, the occupiers' lists, and how long each lives. It
//! must not talk to Redis.

use std::time::Duration;

use crate::timing::channel_retention;

/// The nodes' heartbeats: a sorted set, node -> its last beat (unix ms on the
/// clock of the Redis holding it). Outside every channel's slot, so no channel
/// script reads it: a node reads it when it beats and hands the scripts the
/// gone nodes. How long a beat counts and when a gone node is forgotten are
/// `timing::NODE_TTL` and `timing::NODE_FORGET`.
pub(super) const NODES: &str = "throng:nodes";

/// The Redis keys of one channel.
pub(super) struct Keys {
    pub(super) seq: String,
    pub(super) epoch: String,
    pub(super) hist: String,
    /// With `--redis-wait-replicas`: the messages held until replicas have them
    /// (seq -> message), and the last seq published (see `release.lua`).
    pub(super) held: String,
    pub(super) released: String,
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
            held: format!("throng:{{{channel}}}:held"),
            released: format!("throng:{{{channel}}}:released"),
            members: format!("throng:{{{channel}}}:members"),
            users: format!("throng:{{{channel}}}:users"),
            user_conns: format!("throng:{{{channel}}}:userconns"),
            node_conns: format!("throng:{{{channel}}}:nodeconns"),
            occupants: format!("throng:{{{channel}}}:occupants"),
        }
    }

    /// Where a publish's idempotency key is remembered: its channel's slot.
    pub(super) fn idempotency(&self, key: &str) -> String {
        let channel_tag = self.seq.trim_end_matches(":seq");
        format!("{channel_tag}:idem:{key}")
    }
}

/// The nodes that hold watched channels (each node's list is [`occupied_by`]):
/// where the keeper looks for a gone node's channels.
pub(super) const OCCUPIERS: &str = "throng:occupiers";

/// The watched channels `node` holds.
pub(super) fn occupied_by(node: &str) -> String {
    format!("throng:occupied-by:{node}")
}

/// How long a channel's keys outlive its last publish (or the last time a node
/// with subscribers refreshed them): the retention, or the history's ttl if longer.
pub(super) fn key_life(ttl: Duration) -> u64 {
    ttl.max(channel_retention()).as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_cluster_slot() {
        let k = Keys::of("chat:room");
        assert_eq!(k.seq, "throng:{chat:room}:seq");
        assert_eq!(k.hist, "throng:{chat:room}:hist");
        assert_eq!(k.occupants, "throng:{chat:room}:occupants");
    }
}
