//! The dashboard's feed: once a second it samples this server's counters and keeps
//! the last five minutes of samples (`GET /api/stats/history`, so a chart is full
//! the moment a dashboard opens); while anyone subscribes to [`FEED_CHANNEL`] it
//! also hands the sample, with the busiest channels and the broker's and this
//! node's state, to the hub as one unsequenced message (seq 0: not kept in history,
//! never resumed, not counted as published). Watching costs one small message a
//! second; nobody watching costs one counter read a second.
//!
//! It reads the counters, the hub and the broker through a [`View`] the server
//! hands it. It must not touch connections, publish through the broker (the feed
//! is this node's own view) or assign seqs.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::broker::Broker;
use crate::config::ServeConfig;
use crate::hub::{Audience, Body, Hub};
use crate::protocol::DataKind;
use crate::rules;
use crate::stats::{OPEN_KINDS, ServerStats, Snapshot};
use crate::timing::FEED_INTERVAL;
use crate::transport::Kind;

/// What the feed reads: this node's parts, lent by the server.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub feed: &'a Feed,
    pub stats: &'a ServerStats,
    pub hub: &'a Hub,
    pub broker: &'a dyn Broker,
    pub config: &'a ServeConfig,
}

/// The channel the dashboard subscribes to.
pub const FEED_CHANNEL: &str = "throng:stats";
/// Samples kept: five minutes.
const KEEP: usize = 300;
/// Channels listed as the busiest.
const BUSIEST: usize = 10;

/// One second's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    time_ms: u64,
    /// Open connections by transport (`transport::Kind`).
    open: [u64; OPEN_KINDS],
    published: u64,
    delivered: u64,
    messages_in: u64,
    bytes_sent: u64,
    deflate_plain: u64,
    deflate_wire: u64,
    accepted: u64,
    slow_consumers: u64,
}

impl Sample {
    fn of(snap: &Snapshot, time_ms: u64) -> Self {
        Sample {
            time_ms,
            open: snap.open,
            published: snap.published,
            delivered: snap.delivered,
            messages_in: snap.messages_in,
            bytes_sent: snap.bytes_sent,
            deflate_plain: snap.deflate_plain,
            deflate_wire: snap.deflate_wire,
            accepted: snap.accepted,
            slow_consumers: snap.slow_consumers,
        }
    }

    fn connections(&self) -> Value {
        Kind::json(&self.open)
    }

    fn totals(&self) -> Value {
        json!({
            "published": self.published,
            "delivered": self.delivered,
            "messages_in": self.messages_in,
            "bytes_sent": self.bytes_sent,
            "deflate_plain_bytes": self.deflate_plain,
            "deflate_wire_bytes": self.deflate_wire,
            "accepted": self.accepted,
            "slow_consumer_disconnects": self.slow_consumers,
        })
    }
}

/// The samples of the last five minutes, oldest first.
#[derive(Debug, Default)]
pub struct Feed {
    samples: Mutex<VecDeque<Sample>>,
}

impl Feed {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keep(&self, sample: Sample) {
        let mut samples = self.lock();
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// `GET /api/stats/history`: `{"interval_ms", "samples":[{"time_ms",
    /// "connections", "totals"}]}`, oldest first.
    pub fn history_json(&self) -> Value {
        let samples: Vec<Value> = self
            .lock()
            .iter()
            .map(|s| {
                json!({"time_ms": s.time_ms, "connections": s.connections(), "totals": s.totals()})
            })
            .collect();
        json!({"interval_ms": FEED_INTERVAL.as_millis() as u64, "samples": samples})
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Takes one sample, keeps it, and sends it to the feed's subscribers if any.
pub fn tick(view: View<'_>) {
    let snap = view.stats.snapshot();
    let sample = Sample::of(&snap, unix_ms());
    view.feed.keep(sample);
    let Some(channel) = view.hub.find(FEED_CHANNEL) else {
        return;
    };
    let payload = Bytes::from(message(view, &sample).to_string());
    // A loop too far behind to take it skips one second of the dashboard.
    let _ = view
        .hub
        .deliver(&channel, Audience::Everyone, None, || Body::Data {
            seq: 0,
            epoch: 0,
            payload,
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        });
}

/// What the dashboard gets each second.
fn message(view: View<'_>, sample: &Sample) -> Value {
    let busiest: Vec<Value> = view
        .hub
        // An app's channels are the Pusher protocol's: their names (a user's id,
        // a private channel's) are not the anonymous dashboard's to show.
        .busiest(BUSIEST, |name| {
            rules::is_reserved(name)
                || crate::pusher::app_channel(&view.config.pusher_apps, name).is_some()
        })
        .iter()
        .map(|c| json!({"channel": c.name(), "subscribers": c.subscribers(), "messages": c.messages()}))
        .collect();
    let config = view.config;
    let listen: Vec<String> = config.listen.iter().map(|a| a.to_string()).collect();
    json!({
        "time_ms": sample.time_ms,
        "node": {
            "pid": std::process::id(),
            "uptime_seconds": view.stats.started.elapsed().as_secs_f64(),
            "threads": config.threads,
            "version": env!("CARGO_PKG_VERSION"),
            "listen": listen,
            "worker": std::env::var(crate::workers::WORKER_ENV).ok(),
        },
        "broker": {"url": view.broker.describe(), "healthy": view.broker.healthy()},
        "connections": sample.connections(),
        "channels": view.broker.channel_count(),
        "totals": sample.totals(),
        "busiest": busiest,
    })
}

/// Ticks once an interval until `stop` is set (run on a thread of its own).
pub fn run(stop: &AtomicBool, view: View<'_>) {
    // Short naps, so shutdown is never held up by a whole interval.
    let nap = Duration::from_millis(100);
    let mut next = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = std::time::Instant::now();
        if now >= next {
            tick(view);
            next += FEED_INTERVAL;
            if next < now {
                next = now + FEED_INTERVAL;
            }
        }
        std::thread::sleep(nap.min(next.saturating_duration_since(now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests_support::test_shared;

    #[test]
    fn history_keeps_five_minutes_oldest_first() {
        let feed = Feed::default();
        let mut sample = Sample::of(&Snapshot::default(), 0);
        for t in 0..(KEEP as u64 + 5) {
            sample.time_ms = t;
            sample.published = t * 2;
            feed.keep(sample);
        }
        let history = feed.history_json();
        let samples = history["samples"].as_array().unwrap();
        assert_eq!(samples.len(), KEEP);
        assert_eq!(samples[0]["time_ms"], 5);
        assert_eq!(
            samples[KEEP - 1]["totals"]["published"],
            (KEEP as u64 + 4) * 2
        );
        assert_eq!(history["interval_ms"], 1000);
    }

    #[test]
    fn a_tick_reaches_the_feed_subscribers_as_an_unsequenced_text_message() {
        let (shared, _polls) = test_shared(None);
        // Nobody watching: a sample is kept, nothing is delivered.
        tick(shared.feed_view());
        assert!(!shared.hub.inbox(1).has_work());
        let _watching = shared.hub.subscribe(FEED_CHANNEL, 1, true);
        let _news = shared.hub.subscribe("news", 0, false);
        tick(shared.feed_view());
        let mut batch = Vec::new();
        shared.hub.inbox(1).take(&mut batch);
        assert_eq!(batch.len(), 1);
        let Body::Data {
            seq, payload, kind, ..
        } = &batch[0].body
        else {
            panic!("not data");
        };
        assert_eq!((*seq, *kind), (0, DataKind::Text));
        let value: Value = serde_json::from_slice(payload).unwrap();
        assert_eq!(value["broker"]["url"], "memory");
        assert_eq!(value["node"]["pid"], std::process::id());
        assert_eq!(value["busiest"][0]["channel"], "news");
        assert_eq!(value["busiest"].as_array().unwrap().len(), 1);
        assert_eq!(
            shared.feed.history_json()["samples"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
}
