//! Webhook delivery, the server's side of Pusher's webhooks: every app's URLs,
//! a thread and a bounded queue for each, the batching, the HTTP POSTs, their
//! retries, and what became of the events ([`Counts`], [`Tally`] for `/metrics`
//! and `/api/stats`). What an event, a target and a signed body are is the
//! protocol's (`pusher::webhook_events`, which does no I/O).
//!
//! Each URL has a thread of its own and a bounded queue: noting an event is a
//! `try_send` and never waits, so no event loop or broker lock is held up by a
//! slow receiver; a URL that is down is retried with back-off while its queue
//! fills, and what no longer fits is counted and logged as dropped, never lost
//! in silence. What is decided once for the cluster (occupancy, users) comes
//! from the broker through [`ChannelWatch`]; client events come from the
//! transports through `transport::Hooks` (wired in `server/shared.rs`). It must
//! not touch connections or the broker.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Instant, SystemTime};

use serde::Serialize;

use crate::broker::ChannelWatch;
use crate::pusher::App;
use crate::pusher::webhook_events::{self, Event, Kind, Kinds};
use crate::timing::{
    WEBHOOK_BATCH_WINDOW, WEBHOOK_REQUEST_TIMEOUT, WEBHOOK_RETRY_DELAYS, webhook_retry_delay,
};

/// Events waiting for one URL; what comes while it is full is dropped and
/// counted.
pub const QUEUE: usize = 10_000;
/// Most events in one request.
pub const MAX_BATCH: usize = 100;

/// What the webhooks did, across every URL (`/metrics`, `/api/stats`).
#[derive(Debug, Default)]
pub struct Counts {
    /// Events in requests a URL answered with 2xx.
    pub delivered: AtomicU64,
    /// Events in batches given up after every retry.
    pub failed: AtomicU64,
    /// Events that found their URL's queue full.
    pub dropped: AtomicU64,
    /// Requests that failed and were tried again.
    pub retries: AtomicU64,
}

/// A moment's copy of [`Counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub delivered: u64,
    pub failed: u64,
    pub dropped: u64,
    pub retries: u64,
}

impl Counts {
    pub fn tally(&self) -> Tally {
        Tally {
            delivered: self.delivered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

/// A URL's queue, and what it is sent.
#[derive(Debug)]
struct Queue {
    kinds: Kinds,
    url: Box<str>,
    tx: SyncSender<Event>,
}

/// Every app's webhooks: where events are noted.
#[derive(Debug)]
pub struct Webhooks {
    /// By app id: its URLs' queues.
    apps: HashMap<Box<str>, Vec<Queue>>,
    counts: Arc<Counts>,
}

impl Webhooks {
    /// Starts a sender thread for every webhook URL of `apps`; `None` when no
    /// app has one.
    pub fn start(apps: &[App]) -> std::io::Result<Option<Webhooks>> {
        let counts = Arc::new(Counts::default());
        let mut by_app = HashMap::new();
        for app in apps.iter().filter(|a| !a.webhooks.is_empty()) {
            let mut queues = Vec::new();
            for target in &app.webhooks {
                let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
                let sender = Sender {
                    url: target.url.clone(),
                    key: app.key.clone(),
                    secret: app.secret.clone(),
                    counts: Arc::clone(&counts),
                };
                std::thread::Builder::new()
                    .name("throng-webhook".into())
                    .spawn(move || sender.run(rx))?;
                queues.push(Queue {
                    kinds: target.kinds,
                    url: target.url.clone(),
                    tx,
                });
            }
            by_app.insert(app.id.clone(), queues);
        }
        if by_app.is_empty() {
            return Ok(None);
        }
        Ok(Some(Webhooks {
            apps: by_app,
            counts,
        }))
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The queues of the app `channel` (a throng channel, `ID:NAME`) belongs to
    /// that are sent `kind`.
    fn queues<'a>(&'a self, channel: &'a str, kind: Kind) -> impl Iterator<Item = &'a Queue> + 'a {
        let app = channel.split_once(':').map(|(app, _)| app);
        app.and_then(|app| self.apps.get(app))
            .into_iter()
            .flatten()
            .filter(move |q| q.kinds.has(kind))
    }

    /// Notes an event for every URL of `channel`'s app that is sent `kind`;
    /// `make` is called only when one is.
    fn note(&self, channel: &str, kind: Kind, make: impl FnOnce(String) -> Event) {
        let mut queues = self.queues(channel, kind).peekable();
        if queues.peek().is_none() {
            return;
        }
        let event = make(crate::pusher::pusher_name(channel).into_owned());
        for queue in queues {
            match queue.tx.try_send(event.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    let dropped = self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    // The first of a run and then every thousandth: a URL that is
                    // down must not also flood the log.
                    if dropped.is_multiple_of(1000) {
                        tracing::warn!(
                            url = &*queue.url,
                            event = kind.name(),
                            dropped = dropped + 1,
                            "webhook queue full (its URL is slow or down): event dropped"
                        );
                    }
                }
            }
        }
    }

    /// A client event on a private or presence channel (`client_event`).
    pub fn client_event(
        &self,
        channel: &str,
        event: &str,
        data: &str,
        socket_id: &str,
        user_id: Option<&str>,
    ) {
        self.note(channel, Kind::ClientEvent, |name| {
            Event::client_event(name, event, data, socket_id, user_id)
        });
    }

    fn channel_event(&self, channel: &str, kind: Kind, user_id: Option<&str>) {
        self.note(channel, kind, |name| Event::of_channel(kind, name, user_id));
    }
}

impl ChannelWatch for Webhooks {
    fn watches_occupancy(&self, channel: &str) -> bool {
        self.queues(channel, Kind::ChannelOccupied).next().is_some()
            || self.queues(channel, Kind::ChannelVacated).next().is_some()
    }

    fn occupied(&self, channel: &str) {
        self.channel_event(channel, Kind::ChannelOccupied, None);
    }

    fn vacated(&self, channel: &str) {
        self.channel_event(channel, Kind::ChannelVacated, None);
    }

    fn member_added(&self, channel: &str, user_id: &str) {
        self.channel_event(channel, Kind::MemberAdded, Some(user_id));
    }

    fn member_removed(&self, channel: &str, user_id: &str) {
        self.channel_event(channel, Kind::MemberRemoved, Some(user_id));
    }
}

/// What one URL's thread needs.
struct Sender {
    url: Box<str>,
    key: Box<str>,
    secret: Box<str>,
    counts: Arc<Counts>,
}

impl Sender {
    /// Takes batches off the queue and posts them until every noting side is gone.
    fn run(self, rx: Receiver<Event>) {
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(WEBHOOK_REQUEST_TIMEOUT))
                .http_status_as_error(false)
                .max_redirects(0)
                .build(),
        );
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            let until = Instant::now() + WEBHOOK_BATCH_WINDOW;
            while batch.len() < MAX_BATCH {
                match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(event) => batch.push(event),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
            self.deliver(&agent, &batch);
        }
    }

    /// Posts one batch, retrying with back-off; counts how it ended.
    fn deliver(&self, agent: &ureq::Agent, batch: &[Event]) {
        let n = batch.len() as u64;
        let signed = match webhook_events::signed_body(&self.secret, now_ms(), batch) {
            Ok(signed) => signed,
            Err(e) => {
                tracing::error!(error = %e, "webhook body not encoded");
                self.counts.failed.fetch_add(n, Ordering::Relaxed);
                return;
            }
        };
        let mut delays = (0..).map_while(webhook_retry_delay);
        loop {
            let outcome = agent
                .post(&*self.url)
                .header(webhook_events::KEY_HEADER, &*self.key)
                .header(webhook_events::SIGNATURE_HEADER, &signed.signature)
                .content_type("application/json")
                .send(&signed.body[..]);
            let why = match outcome {
                Ok(answer) if answer.status().is_success() => {
                    self.counts.delivered.fetch_add(n, Ordering::Relaxed);
                    return;
                }
                Ok(answer) => format!("answered {}", answer.status()),
                Err(e) => e.to_string(),
            };
            let Some(delay) = delays.next() else {
                self.counts.failed.fetch_add(n, Ordering::Relaxed);
                tracing::error!(
                    url = &*self.url,
                    events = n,
                    tries = WEBHOOK_RETRY_DELAYS.len() + 1,
                    reason = why,
                    "webhook given up"
                );
                return;
            };
            self.counts.retries.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(url = &*self.url, reason = why, retry_in = ?delay, "webhook failed; retrying");
            std::thread::sleep(delay);
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noting_for_an_app_without_webhooks_does_nothing_and_a_full_queue_counts() {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let mut apps = HashMap::new();
        apps.insert(
            Box::from("1"),
            vec![Queue {
                kinds: Kinds::parse(["channel_occupied"]).unwrap(),
                url: "http://127.0.0.1:9/".into(),
                tx,
            }],
        );
        let hooks = Webhooks {
            apps,
            counts: Arc::default(),
        };
        hooks.occupied("2:news");
        hooks.vacated("1:news");
        assert!(rx.try_recv().is_err(), "not for app 2, and not vacated");
        assert!(hooks.watches_occupancy("1:x") && !hooks.watches_occupancy("2:x"));
        hooks.occupied("1:news");
        hooks.occupied("1:sport");
        assert_eq!(rx.try_recv().unwrap().channel, "news");
        assert_eq!(hooks.counts().dropped.load(Ordering::Relaxed), 1);
    }
}
