//! Redis Cluster's shape as a node needs it: the slot of a key (CRC16 of its hash
//! tag), which master serves each slot now (`CLUSTER SLOTS`, asked of the first
//! seed node that answers), and the seeds from a `redis-cluster://` URL. Commands
//! go through the redis crate's cluster client (which follows `MOVED`, `ASK` and
//! failovers); this file is what the sharded listener (`shards`) needs besides.
//! It must not know what channels, seqs or subscribers are.

use std::time::Duration;

use ::redis::{Client, Value};

/// The slots of a Redis Cluster.
pub(super) const SLOTS: u16 = 16384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (what is between the first
/// `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub(super) fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOTS
}

fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

/// The nodes named in `redis-cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seeds {
    /// `:PASSWORD@` (or `USER:PASSWORD@`), or empty: every node takes the same.
    auth: String,
    pub(super) hosts: Vec<String>,
}

impl Seeds {
    /// `None` when the URL is not of that form.
    pub(super) fn parse(url: &str) -> Option<Seeds> {
        let rest = url.strip_prefix("redis-cluster://")?;
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect();
        (!hosts.is_empty()).then_some(Seeds { auth, hosts })
    }

    /// The `redis://` URL of the node at `addr` (`host:port`).
    pub(super) fn url(&self, addr: &str) -> String {
        format!("redis://{}{addr}", self.auth)
    }

    /// Every seed's `redis://` URL.
    pub(super) fn urls(&self) -> Vec<String> {
        self.hosts.iter().map(|h| self.url(h)).collect()
    }
}

/// Which master serves each slot, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Topology {
    /// (first slot, last slot, the master's `host:port`), as `CLUSTER SLOTS` gave.
    ranges: Vec<(u16, u16, String)>,
}

impl Topology {
    /// Asks the seeds in order; the first that answers `CLUSTER SLOTS` says.
    pub(super) fn read(seeds: &Seeds, timeout: Duration) -> Result<Topology, String> {
        let mut last = String::from("no seed nodes");
        for seed in &seeds.urls() {
            let answer = Client::open(seed.as_str())
                .and_then(|c| c.get_connection_with_timeout(timeout))
                .and_then(|mut con| {
                    con.set_read_timeout(Some(timeout))?;
                    ::redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query::<Value>(&mut con)
                });
            match answer.map_err(|e| e.to_string()).and_then(Topology::parse) {
                Ok(t) if t.covers_every_slot() => return Ok(t),
                Ok(_) => last = format!("{seed}: not every slot has a master"),
                Err(e) => last = format!("{seed}: {e}"),
            }
        }
        Err(last)
    }

    fn parse(value: Value) -> Result<Topology, String> {
        let bad = || "unexpected CLUSTER SLOTS answer".to_string();
        let Value::Array(ranges) = value else {
            return Err(bad());
        };
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(parts) = range else {
                return Err(bad());
            };
            let mut parts = parts.into_iter();
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let mut master = master.into_iter();
            let host = match master.next() {
                Some(Value::BulkString(h)) => String::from_utf8(h).map_err(|_| bad())?,
                Some(Value::SimpleString(h)) => h,
                _ => return Err(bad()),
            };
            let Some(Value::Int(port)) = master.next() else {
                return Err(bad());
            };
            let slot = |n: i64| u16::try_from(n).ok().filter(|s| *s < SLOTS).ok_or_else(bad);
            out.push((slot(first)?, slot(last)?, format!("{host}:{port}")));
        }
        out.sort();
        Ok(Topology { ranges: out })
    }

    fn covers_every_slot(&self) -> bool {
        let mut next: u32 = 0;
        for (first, last, _) in &self.ranges {
            if u32::from(*first) != next {
                return false;
            }
            next = u32::from(*last) + 1;
        }
        next == u32::from(SLOTS)
    }

    /// The master serving `slot` (`host:port`).
    pub(super) fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.as_str())
    }

    /// Every master, once each, in a stable order.
    pub(super) fn masters(&self) -> Vec<String> {
        let mut masters: Vec<String> = self.ranges.iter().map(|(_, _, a)| a.clone()).collect();
        masters.sort();
        masters.dedup();
        masters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_hash_tags() {
        // Values from Redis' CLUSTER KEYSLOT.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"throng:{news}:seq"), slot_of(b"throng:ch:{news}"));
        // An empty tag is no tag: the whole key counts.
        assert_eq!(
            slot_of(b"{}x"),
            crc16::State::<crc16::XMODEM>::calculate(b"{}x") % SLOTS
        );
        assert_eq!(
            slot_of(b"a{b"),
            crc16::State::<crc16::XMODEM>::calculate(b"a{b") % SLOTS
        );
    }

    #[test]
    fn channel_names_spread_evenly_over_three_masters() {
        // `redis-cli --cluster create`'s split of the slots over 3 masters.
        let master = |slot: u16| match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        let mut counts = [0u32; 3];
        for i in 0..30_000 {
            let key = format!("throng:{{room:{i}}}:seq");
            counts[master(slot_of(key.as_bytes()))] += 1;
        }
        for n in counts {
            assert!((9_500..=10_500).contains(&n), "{counts:?}");
        }
    }

    #[test]
    fn cluster_urls_name_their_seeds() {
        let plain = Seeds::parse("redis-cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap();
        assert_eq!(
            plain.urls(),
            vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        let secret = Seeds::parse("redis-cluster://:pw@h:1,h:2/").unwrap();
        assert_eq!(secret.urls(), vec!["redis://:pw@h:1", "redis://:pw@h:2"]);
        assert_eq!(secret.url("10.0.0.9:7005"), "redis://:pw@10.0.0.9:7005");
        assert_eq!(Seeds::parse("redis-cluster://"), None);
        assert_eq!(Seeds::parse("redis://h:1"), None);
    }

    #[test]
    fn a_topology_is_read_from_cluster_slots() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node(7001),
                node(7004),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(7000)]),
        ]);
        let t = Topology::parse(answer).unwrap();
        assert!(t.covers_every_slot());
        assert_eq!(t.master_of(0), Some("127.0.0.1:7000"));
        assert_eq!(t.master_of(5461), Some("127.0.0.1:7001"));
        assert_eq!(t.masters(), vec!["127.0.0.1:7000", "127.0.0.1:7001"]);
        let partial = Topology::parse(Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(10),
            node(7000),
        ])]))
        .unwrap();
        assert!(!partial.covers_every_slot());
        assert!(Topology::parse(Value::Int(1)).is_err());
    }
}
