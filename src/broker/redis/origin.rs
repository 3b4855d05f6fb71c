//! Failover honesty: the epoch stamp (`origin.lua`) that lets a Redis tell
//! whether a channel's history is still the one its seqs were handed out from,
//! what a node tells the scripts about its Redis (durable or not), and WAIT
//! for replicas after a publish (`--redis-wait-replicas`). It must not deliver
//! nor hold subscriptions.
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

use std::sync::atomic::Ordering;
use std::time::Duration;

use ::redis::ConnectionLike;

use super::{Shared, lock};

/// `origin.lua` and a script that uses it, as one text.
macro_rules! with_origin {
    ($script:literal) => {
        concat!(include_str!("origin.lua"), include_str!($script))
    };
}
pub(super) use with_origin;

/// Takes the 'w' off a stamp whose WAIT came back short.
pub(super) const UNWAITED_LUA: &str = include_str!("unwaited.lua");

/// How long a publish waits for its replicas (`WAIT`) before it is answered
/// anyway, its stamp then saying it was not replicated. Below the connection's
/// read timeout, so a short WAIT is an answer, not a failure.
pub(super) const WAIT_TIMEOUT: Duration = Duration::from_millis(500);

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

    /// After a publish with `--redis-wait-replicas N`: `WAIT` on the same
    /// connection. When fewer than N replicas have it in time, the channel's
    /// stamp is told (a failover then starts a new epoch rather than trust it).
    pub(super) fn wait_replicas(
        &self,
        con: &mut dyn ConnectionLike,
        channel_epoch_key: &str,
        stamp: &str,
    ) -> ::redis::RedisResult<()> {
        let replicas: u64 = ::redis::cmd("WAIT")
            .arg(self.wait_replicas)
            .arg(WAIT_TIMEOUT.as_millis() as u64)
            .query(con)?;
        if replicas < u64::from(self.wait_replicas) {
            self.short_waits.fetch_add(1, Ordering::Relaxed);
            self.unwaited
                .key(channel_epoch_key)
                .arg(stamp)
                .invoke::<i64>(con)?;
        }
        Ok(())
    }
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
