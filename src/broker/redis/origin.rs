//! Failover honesty: the epoch stamp (`origin.lua`) that lets a Redis tell
//! whether a channel's history is still the one its seqs were handed out from,
//! what a node tells the scripts about its Redis (durable or not), and WAIT
//! for replicas before a publish is released (`--redis-wait-replicas`). It
//! must not hold subscriptions.
//!
//! Redis replicates asynchronously: a replica promoted by Sentinel or Redis
//! Cluster, or a Redis restarted from a disk image older than its last answer,
//! may lack the last acknowledged publishes and would hand their seqs out again
//! for other messages. So every channel's epoch key is stamped with the
//! replication id of the Redis that wrote it; a script run by another Redis
//! starts the channel's next epoch instead (its subscribers are told of the gap)
//! unless that Redis provably has every acknowledged write: a promoted replica
//! of the writer when the writer WAITed for replicas, or a restart of a Redis
//! that appends every write to disk before answering.
//!
//! With `--redis-wait-replicas N` a message is held in Redis, unseen, until
//! `WAIT` says N replicas have it, and only then published and kept in history
//! (`release.lua`): so a master that dies before its replicas have a message
//! takes nothing anyone saw with it, and the promoted replica hands that seq
//! out again without a lie.

use std::sync::atomic::Ordering;

use ::redis::ConnectionLike;

use super::{Shared, lock};
use crate::timing::REDIS_WAIT_TIMEOUT;

/// `origin.lua` and a script that uses it, as one text.
macro_rules! with_origin {
    ($script:literal) => {
        concat!(include_str!("origin.lua"), include_str!($script))
    };
}
pub(super) use with_origin;

/// Publishes held messages once replicas have them.
pub(super) const RELEASE_LUA: &str = include_str!("release.lua");

impl Shared {
    /// Called on every new connection: whether this Redis keeps every
    /// acknowledged write on disk (`appendonly yes`, `appendfsync always`), noted
    /// with its replication id, which a restart changes, so that what was found
    /// here never speaks for the Redis after a restart. A Redis that cannot be
    /// asked (`CONFIG` renamed away, as on some managed Redis) counts as not
    /// durable.
    pub(super) fn probe_durability(&self, con: &mut dyn ConnectionLike) {
        let durable = (|| -> ::redis::RedisResult<Option<String>> {
            let info: String = ::redis::cmd("INFO").arg("replication").query(con)?;
            let pairs: Vec<String> = ::redis::cmd("CONFIG")
                .arg("GET")
                .arg("append*")
                .query(con)?;
            let get = |name: &str| {
                pairs
                    .chunks(2)
                    .find(|p| p[0] == name)
                    .and_then(|p| p.get(1))
                    .map(String::as_str)
            };
            let durable = get("appendonly") == Some("yes") && get("appendfsync") == Some("always");
            Ok(durable.then(|| replication_id(&info)).flatten())
        })()
        .unwrap_or(None);
        *lock(&self.durable) = durable;
    }

    /// The scripts' durable argument: the id of the Redis found durable, or ''.
    pub(super) fn durable_arg(&self) -> String {
        lock(&self.durable).clone().unwrap_or_default()
    }

    /// After a publish with `--redis-wait-replicas N`, on the same connection:
    /// `WAIT` until N replicas have it, then publish it (and what was held
    /// before it). A short WAIT leaves it held, and the publisher is told it
    /// was not published; a later publish whose WAIT succeeds releases it (its
    /// write came first), so a retry delivers the message twice unless it
    /// carries the same idempotency key.
    pub(super) fn wait_and_release(
        &self,
        con: &mut dyn ConnectionLike,
        held: &Held<'_>,
    ) -> ::redis::RedisResult<()> {
        let replicas: u64 = ::redis::cmd("WAIT")
            .arg(self.wait_replicas)
            .arg(REDIS_WAIT_TIMEOUT.as_millis() as u64)
            .query(con)?;
        if replicas < u64::from(self.wait_replicas) {
            self.short_waits.fetch_add(1, Ordering::Relaxed);
            return Err(not_published(format!(
                "{replicas} of the {} replicas asked for (--redis-wait-replicas) had seq {} \
                 within {} ms; it is held, and published once they confirm a later publish \
                 on this channel",
                self.wait_replicas,
                held.seq,
                REDIS_WAIT_TIMEOUT.as_millis()
            )));
        }
        let published: i64 = self
            .release
            .key(&held.keys.epoch)
            .key(&held.keys.hist)
            .key(&held.keys.held)
            .key(&held.keys.released)
            .arg(held.seq)
            .arg(held.epoch)
            .arg(held.history_size)
            .arg(held.life)
            .arg(self.pubsub_channel(held.channel))
            .arg(super::MAGIC)
            .invoke(con)?;
        if published < 0 {
            return Err(not_published(format!(
                "the channel started a new epoch (a failover) before seq {} was released",
                held.seq
            )));
        }
        Ok(())
    }
}

/// A message held by `publish.lua` until replicas have it.
pub(super) struct Held<'a> {
    pub(super) channel: &'a str,
    pub(super) keys: &'a super::keys::Keys,
    pub(super) seq: u64,
    pub(super) epoch: &'a str,
    pub(super) history_size: usize,
    pub(super) life: u64,
}

/// An answer to the publisher that its message was not published (yet); not a
/// connection failure.
fn not_published(detail: String) -> ::redis::RedisError {
    ::redis::make_extension_error("NOTPUBLISHED".into(), Some(detail))
}

/// `master_replid` of an `INFO replication` answer.
fn replication_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim_end().strip_prefix("master_replid:"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_id_is_read_from_info() {
        let info = "# Replication\r\nrole:master\r\nmaster_replid:ab12\r\nmaster_replid2:0000\r\n";
        assert_eq!(replication_id(info).as_deref(), Some("ab12"));
        assert_eq!(replication_id("role:master\r\n"), None);
    }
}
