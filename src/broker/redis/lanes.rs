//! The publish lanes: publishes the event loops hand over ([`Broker::ask`])
//! wait in one of a few queues, each with its own thread and Redis connection,
//! so that no loop waits on Redis. A lane takes everything queued (up to
//! [`MOST_PER_RUN`] messages) and publishes it in one round trip
//! (`publish_batch.lua`); while Redis works on one run the next queue fills, so
//! the slower Redis answers the more each round trip carries (on a Redis
//! Cluster, one run per slot, all of a lane's in one pipeline split by master;
//! with `--redis-wait-replicas`, one message at a time, each with its WAIT).
//! Every answer goes
//! to the loop that asked, through the hub. One channel's publishes always take
//! the same lane (its name's hash), so a sender's order is kept even for those it
//! does not wait for. It must not touch connections or what a request means.
//!
//! [`Broker::ask`]: crate::broker::Broker::ask

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use ::redis::Script;

use super::pipes::ClusterPipes;
use super::publish::{PUBLISH_BATCH_LUA, PUBLISH_LUA};
use super::{BrokerError, Shared, lock, unavailable};
use crate::broker::asked::{Answer, Ask, Outcome, Publish};
use crate::broker::idempotency::Published;
use crate::timing::BROKER_DEADLINE;

/// Lanes per node: each is a thread and one connection (on a Redis Cluster, one
/// per master), and as many round trips in flight. Two, measured (BENCHMARKS
/// §41): Redis runs one script at a time, so more lanes make smaller runs, and
/// each run costs Redis more than a message in it (on the 2-core bench box one
/// lane published 13.5k/s, two 14.0k/s, four 11.7k/s through a local Redis).
pub(super) const LANES: usize = 2;

/// Messages one run publishes at most: a run is one Lua script, and Redis does
/// nothing else while it runs (about 10 µs a message).
const MOST_PER_RUN: usize = 256;

/// Payload bytes one run takes at most (a run takes at least one request).
const MOST_BYTES_PER_RUN: usize = 1 << 20;

/// Requests one lane holds before it refuses more (503): with Redis gone
/// quiet, what waits is bounded, and each holds one request's copy.
const MOST_QUEUED: usize = 8192;

#[derive(Default)]
struct Lane {
    queue: Mutex<VecDeque<Ask>>,
    ready: Condvar,
}

pub(super) struct Lanes {
    lanes: Box<[Lane]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Lanes {
    /// Starts [`LANES`] lane threads publishing through `shared`.
    pub(super) fn start(shared: &Arc<Shared>) -> Result<Arc<Lanes>, BrokerError> {
        let lanes = Arc::new(Lanes {
            lanes: (0..LANES).map(|_| Lane::default()).collect(),
            hasher: Default::default(),
        });
        for index in 0..LANES {
            let worker = Worker {
                shared: Arc::clone(shared),
                lanes: Arc::clone(&lanes),
                index,
                single: Script::new(PUBLISH_LUA),
                batch: Script::new(PUBLISH_BATCH_LUA),
                cluster: None,
                pipes: ClusterPipes::default(),
            };
            std::thread::Builder::new()
                .name(format!("throng-redis-lane-{index}"))
                .spawn(move || worker.run())
                .map_err(unavailable)?;
        }
        Ok(lanes)
    }

    /// Queues `ask` on its first channel's lane; gives it back when that lane
    /// holds [`MOST_QUEUED`] already.
    pub(super) fn push(&self, ask: Ask) -> Result<(), Ask> {
        let channel = ask.publishes.first().map_or("", |p| p.channel.as_str());
        let lane = &self.lanes[(self.hasher.hash_one(channel) as usize) % self.lanes.len()];
        let mut queue = lock(&lane.queue);
        if queue.len() >= MOST_QUEUED {
            return Err(ask);
        }
        queue.push_back(ask);
        drop(queue);
        lane.ready.notify_one();
        Ok(())
    }
}

struct Worker {
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    index: usize,
    single: Script,
    batch: Script,
    /// On a Redis Cluster: this lane's connection (the cluster client's, one
    /// link per master).
    cluster: Option<::redis::cluster::ClusterConnection>,
    /// On a Redis Cluster: this lane's connections to each master.
    pipes: ClusterPipes,
}

impl Worker {
    fn run(mut self) {
        let mut run = Vec::new();
        loop {
            self.take(&mut run);
            self.publish(&mut run);
        }
    }

    /// Waits for requests, then takes what one run carries.
    fn take(&self, run: &mut Vec<Ask>) {
        let lane = &self.lanes.lanes[self.index];
        let mut queue = lock(&lane.queue);
        while queue.is_empty() {
            queue = lane.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        let (mut messages, mut bytes) = (0, 0);
        while let Some(next) = queue.front() {
            let size: usize = next.publishes.iter().map(|p| p.payload.len()).sum();
            if !run.is_empty()
                && (messages + next.publishes.len() > MOST_PER_RUN
                    || bytes + size > MOST_BYTES_PER_RUN)
            {
                break;
            }
            messages += next.publishes.len();
            bytes += size;
            run.extend(queue.pop_front());
        }
    }

    /// Publishes `run` and answers each of its requests.
    fn publish(&mut self, run: &mut Vec<Ask>) {
        // One whose requester was answered 503 already is not published now:
        // it was told to try again.
        let (late, live): (Vec<Ask>, Vec<Ask>) = run
            .drain(..)
            .partition(|ask| ask.asked_at.elapsed() >= BROKER_DEADLINE);
        for ask in late {
            let why = format!(
                "redis: not published: it waited {} ms for Redis, past the {} ms deadline",
                ask.asked_at.elapsed().as_millis(),
                BROKER_DEADLINE.as_millis()
            );
            self.answer(&ask, Err(BrokerError::Unavailable(why)));
        }
        if live.is_empty() {
            return;
        }
        if self.shared.wait_replicas > 0 {
            // Each message's WAIT is its own.
            for ask in &live {
                let outcome = ask.publish_each(|p| {
                    self.shared.publish_keyed(
                        &self.single,
                        &p.channel,
                        p.outgoing(),
                        p.key.as_deref(),
                    )
                });
                self.answer(ask, outcome);
            }
            return;
        }
        let publishes: Vec<&Publish> = live.iter().flat_map(|a| &a.publishes).collect();
        let shared = Arc::clone(&self.shared);
        let answers = match &shared.cluster {
            Some(client) => self.publish_on_cluster(client, &publishes),
            None => self.shared.publish_batch(&self.batch, &publishes),
        };
        match answers {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                for ask in &live {
                    // Each request's own answers, all taken even after a refusal,
                    // so the next request's start where they should.
                    let mine: Vec<_> = answers.by_ref().take(ask.publishes.len()).collect();
                    self.answer(ask, mine.into_iter().collect());
                }
            }
            Err(e) => {
                for ask in &live {
                    self.answer(ask, Err(e.clone()));
                }
            }
        }
    }

    /// A run on a Redis Cluster, through this lane's own connections to the
    /// masters; the cluster client's connection runs what must go again.
    fn publish_on_cluster(
        &mut self,
        client: &::redis::cluster::ClusterClient,
        publishes: &[&Publish],
    ) -> Result<Vec<Result<Published, BrokerError>>, BrokerError> {
        if !self.shared.commands_ok.load(Ordering::Relaxed) {
            return Err(unavailable("unreachable (retrying every second)"));
        }
        let mut con = match self.cluster.take() {
            Some(con) => con,
            None => client.get_connection().map_err(|e| {
                self.shared.commands_ok.store(false, Ordering::Relaxed);
                unavailable(e)
            })?,
        };
        let mut failed = false;
        let answers = self.shared.publish_batch_on_cluster(
            &mut self.pipes,
            &mut con,
            &mut failed,
            &self.batch,
            publishes,
        );
        if !failed {
            self.cluster = Some(con);
        }
        Ok(answers)
    }

    fn answer(&self, ask: &Ask, outcome: Outcome) {
        self.shared.hub.answer(Answer {
            to: ask.to,
            outcome,
        });
    }
}
