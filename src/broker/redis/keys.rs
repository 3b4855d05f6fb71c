//! The Redis names: a channel's keys (all in its Redis Cluster slot, `{NAME}`),
//! the nodes' heartbeats, the occupiers' lists, the pubsub and wake channels,
//! all under one prefix (`--redis-prefix`, `throng` by default), and how long
//! each key lives. It must not talk to Redis.

use std::time::Duration;

use crate::timing::channel_retention;

/// The prefix when `--redis-prefix` is not given: the names throng always used.
pub(super) const DEFAULT_PREFIX: &str = "throng";

/// The longest `--redis-prefix`: it is in every key and pubsub message.
const PREFIX_MAX_BYTES: usize = 64;

/// Whether `prefix` can start every Redis name: not empty, at most 64 bytes, only
/// `[A-Za-z0-9_.-]`, so no `{`/`}` (it would move a channel's Cluster slot), no
/// `:` (it would read as a name's parts), no glob character (SCAN and PSUBSCRIBE
/// patterns start with it) and no space.
pub(super) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("a Redis prefix cannot be empty".into());
    }
    if prefix.len() > PREFIX_MAX_BYTES {
        return Err(format!(
            "'{prefix}' is longer than {PREFIX_MAX_BYTES} bytes"
        ));
    }
    match prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some(bad) => Err(format!(
            "'{prefix}' has {bad:?}: a Redis prefix is only letters, digits, '_', '.' and '-'"
        )),
        None => Ok(()),
    }
}

/// Every name one deployment uses on its Redis, made from its prefix: two
/// deployments with different prefixes share no key and no pubsub channel.
pub(super) struct Names {
    prefix: Box<str>,
    /// `PREFIX:ch:`: the pubsub channel of channel `NAME` is this and the name
    /// (on a cluster, `{NAME}`).
    pubsub: Box<str>,
    /// `PREFIX:wake:`: a node's listener is woken on this and the node.
    wake: Box<str>,
}

impl Names {
    /// The names under `prefix` (checked by [`check_prefix`] at start).
    pub(super) fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.into(),
            pubsub: format!("{prefix}:ch:").into(),
            wake: format!("{prefix}:wake:").into(),
        }
    }

    /// The keys of `channel`.
    pub(super) fn keys(&self, channel: &str) -> Keys {
        let p = &self.prefix;
        Keys {
            seq: format!("{p}:{{{channel}}}:seq"),
            epoch: format!("{p}:{{{channel}}}:epoch"),
            hist: format!("{p}:{{{channel}}}:hist"),
            held: format!("{p}:{{{channel}}}:held"),
            released: format!("{p}:{{{channel}}}:released"),
            members: format!("{p}:{{{channel}}}:members"),
            users: format!("{p}:{{{channel}}}:users"),
            user_conns: format!("{p}:{{{channel}}}:userconns"),
            node_conns: format!("{p}:{{{channel}}}:nodeconns"),
            occupants: format!("{p}:{{{channel}}}:occupants"),
        }
    }

    /// The nodes' heartbeats: a sorted set, node -> its last beat (unix ms on the
    /// clock of the Redis holding it). Outside every channel's slot, so no channel
    /// script reads it: a node reads it when it beats and hands the scripts the
    /// gone nodes. How long a beat counts and when a gone node is forgotten are
    /// `timing::NODE_TTL` and `timing::NODE_FORGET`.
    pub(super) fn nodes(&self) -> String {
        format!("{}:nodes", self.prefix)
    }

    /// The nodes that hold watched channels (each node's list is
    /// [`occupied_by`](Names::occupied_by)): where the keeper looks for a gone
    /// node's channels.
    pub(super) fn occupiers(&self) -> String {
        format!("{}:occupiers", self.prefix)
    }

    /// The watched channels `node` holds.
    pub(super) fn occupied_by(&self, node: &str) -> String {
        format!("{}:occupied-by:{node}", self.prefix)
    }

    /// The pubsub channel of `channel` on one Redis (or Sentinel's master).
    pub(super) fn pubsub(&self, channel: &str) -> String {
        format!("{}{channel}", self.pubsub)
    }

    /// The pattern every pubsub channel matches (`--redis-subscribe pattern`).
    pub(super) fn pubsub_pattern(&self) -> String {
        format!("{}*", self.pubsub)
    }

    /// The channel a pubsub channel carries, if it is one of this prefix'.
    pub(super) fn channel_of_pubsub<'a>(&self, pubsub: &'a str) -> Option<&'a str> {
        pubsub.strip_prefix(&*self.pubsub)
    }

    /// The shard channel of `channel` on a cluster: in its keys' slot (the hash
    /// tag is the channel name alone; the prefix stays outside it).
    pub(super) fn shard(&self, channel: &str) -> String {
        format!("{}{{{channel}}}", self.pubsub)
    }

    /// The channel a shard channel carries, if it is one of this prefix'.
    pub(super) fn channel_of_shard<'a>(&self, shard: &'a str) -> Option<&'a str> {
        shard
            .strip_prefix(&*self.pubsub)?
            .strip_prefix('{')?
            .strip_suffix('}')
    }

    /// The wake channel of `node`'s listener.
    pub(super) fn wake(&self, node: &str) -> String {
        format!("{}{node}", self.wake)
    }

    /// Whether `pubsub` is a wake channel of this prefix'.
    pub(super) fn is_wake(&self, pubsub: &str) -> bool {
        pubsub.starts_with(&*self.wake)
    }

    /// The SCAN pattern of the members' hashes of the channels whose name starts
    /// with `name_start` (taken as a glob, as it always was).
    pub(super) fn members_pattern(&self, name_start: &str) -> String {
        format!("{}:{{{name_start}*}}:members", self.prefix)
    }

    /// The channel whose members' hash `key` is, if it is one of this prefix'.
    pub(super) fn channel_of_members<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(&*self.prefix)?
            .strip_prefix(":{")?
            .strip_suffix("}:members")
    }
}

/// The Redis keys of one channel ([`Names::keys`]).
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
    /// Where a publish's idempotency key is remembered: its channel's slot.
    pub(super) fn idempotency(&self, key: &str) -> String {
        let channel_tag = self.seq.trim_end_matches(":seq");
        format!("{channel_tag}:idem:{key}")
    }
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
        let k = Names::new(DEFAULT_PREFIX).keys("chat:room");
        assert_eq!(k.seq, "throng:{chat:room}:seq");
        assert_eq!(k.hist, "throng:{chat:room}:hist");
        assert_eq!(k.occupants, "throng:{chat:room}:occupants");
    }

    #[test]
    fn the_default_prefix_names_what_throng_always_named() {
        let names = Names::new(DEFAULT_PREFIX);
        assert_eq!(names.nodes(), "throng:nodes");
        assert_eq!(names.occupiers(), "throng:occupiers");
        assert_eq!(names.occupied_by("n1"), "throng:occupied-by:n1");
        assert_eq!(names.pubsub("news"), "throng:ch:news");
        assert_eq!(names.pubsub_pattern(), "throng:ch:*");
        assert_eq!(names.shard("news"), "throng:ch:{news}");
        assert_eq!(names.wake("n1"), "throng:wake:n1");
        assert_eq!(names.members_pattern("room:"), "throng:{room:*}:members");
    }

    #[test]
    fn another_prefix_names_only_its_own() {
        let names = Names::new("staging.2");
        let k = names.keys("chat:room");
        assert_eq!(k.seq, "staging.2:{chat:room}:seq");
        assert_eq!(k.idempotency("x"), "staging.2:{chat:room}:idem:x");
        assert_eq!(names.nodes(), "staging.2:nodes");
        assert_eq!(names.channel_of_pubsub("staging.2:ch:a:b"), Some("a:b"));
        assert_eq!(names.channel_of_pubsub("throng:ch:a"), None);
        assert_eq!(names.channel_of_shard("staging.2:ch:{a}"), Some("a"));
        assert_eq!(names.channel_of_shard("throng:ch:{a}"), None);
        assert!(names.is_wake("staging.2:wake:n") && !names.is_wake("throng:wake:n"));
        assert_eq!(
            names.channel_of_members("staging.2:{room:1}:members"),
            Some("room:1")
        );
        assert_eq!(names.channel_of_members("throng:{room:1}:members"), None);
        assert_eq!(
            names.channel_of_members("staging.20:{room:1}:members"),
            None
        );
    }

    #[test]
    fn prefixes_are_short_plain_words() {
        for good in ["throng", "a", "staging-2", "test_17.a", &"x".repeat(64)] {
            assert_eq!(check_prefix(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            (&"x".repeat(65) as &str, "longer than 64"),
            ("a{b}", "'{'"),
            ("a:b", "':'"),
            ("a*", "'*'"),
            ("a b", "' '"),
            ("ü", "'ü'"),
        ] {
            let refused = check_prefix(bad).unwrap_err();
            assert!(refused.contains(why), "{bad}: {refused}");
        }
    }
}
