//! The pubsub side: one thread per node reads what Redis publishes on the
//! channels this node has subscribers of (or on every channel, by pattern) and
//! hands it to the local hub; after a reconnect it fills in from history what was
//! missed. The broker's side (here too) asks it to change its subscriptions
//! through [`Subs`] and a PUBLISH on the node's wake channel. Besides that wake,
//! the fill-in's snapshot (which writes nothing) is the only command this file
//! runs on the pool; it must not write channel state to Redis.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::connection::{REDIS_TIMEOUT, unavailable};
use super::wire::{Decoded, Incoming, parse_incoming, parse_member};
use super::{BrokerError, Shared, Subscribe, lock};
use crate::history::Tags;
use crate::hub::{Audience, Body, Channel};
use crate::protocol::DataKind;
use crate::timing::{LISTENER_BACKOFF_FIRST, LISTENER_BACKOFF_MAX, LISTENER_TICK};

/// Per-channel subscriptions: what the listener should hold, and what it has not
/// done yet, in order.
#[derive(Debug, Default)]
pub(super) struct Subs {
    /// Channels with subscribers here, and whether Redis confirmed each.
    pub(super) wanted: HashMap<Box<str>, bool>,
    /// (channel, subscribe?) changes for the listener to make.
    pub(super) todo: Vec<(Box<str>, bool)>,
}

impl Shared {
    /// Per-channel mode: makes sure Redis sends this node the channel's messages
    /// before a new subscriber counts on them (waits for the listener's word).
    pub(super) fn ensure_subscribed(&self, channel: &str) -> Result<(), BrokerError> {
        if self.mode == Subscribe::Pattern {
            return Ok(());
        }
        let wake = {
            let mut subs = lock(&self.subs);
            if subs.wanted.contains_key(channel) {
                false
            } else {
                subs.wanted.insert(channel.into(), false);
                subs.todo.push((channel.into(), true));
                true
            }
        };
        if wake {
            self.wake_listener()?;
        }
        let subs = lock(&self.subs);
        let (subs, timeout) = self
            .confirmed
            .wait_timeout_while(subs, REDIS_TIMEOUT, |s| {
                s.wanted.get(channel).is_some_and(|confirmed| !confirmed)
            })
            .unwrap_or_else(|p| p.into_inner());
        if timeout.timed_out() && subs.wanted.get(channel) == Some(&false) {
            return Err(unavailable("the subscription was not confirmed in time"));
        }
        Ok(())
    }

    /// Per-channel mode: the channel's last local subscriber left.
    pub(super) fn release(&self, channel: &str) {
        if self.mode == Subscribe::Pattern {
            return;
        }
        {
            let mut subs = lock(&self.subs);
            // Someone subscribed again meanwhile: keep listening.
            if self.hub.find(channel).is_some() || subs.wanted.remove(channel).is_none() {
                return;
            }
            subs.todo.push((channel.into(), false));
        }
        // A failed wake leaves the subscription until the next one; harmless.
        let _ = self.wake_listener();
    }

    pub(super) fn wake_listener(&self) -> Result<(), BrokerError> {
        let wake = self.names.wake(&self.node);
        self.with_connection(|con| ::redis::cmd("PUBLISH").arg(&wake).arg("").query::<i64>(con))
            .map(drop)
    }
}

/// The pubsub side: one thread per node, subscribed to the channels with
/// subscribers here (or to every channel by pattern) and to its wake channel.
pub(super) struct Listener {
    pub(super) shared: Arc<Shared>,
    /// Per channel with local subscribers: the epoch and seq last handed out, so
    /// that after a reconnect what was missed can be filled in from history.
    pub(super) delivered: HashMap<Box<str>, (u64, u64)>,
}

impl Listener {
    /// Connects, subscribes and hands what comes to the hub until the connection
    /// is lost or the master changes (looked at after every message and every
    /// `timing::LISTENER_TICK`); then again, with back-off, and fills in what was missed.
    pub(super) fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let target = &shared.target;
        let mut backoff = LISTENER_BACKOFF_FIRST;
        let mut lost = false;
        loop {
            // Taken before connecting: a switch announced meanwhile is seen below.
            let generation = target.generation();
            let mut con = match self.shared.connect() {
                Ok(con) => con,
                Err(e) => {
                    if !lost {
                        tracing::warn!(error = %e, "redis unreachable; retrying");
                    }
                    lost = true;
                    target.pause(generation, backoff);
                    backoff = (backoff * 2).min(LISTENER_BACKOFF_MAX);
                    continue;
                }
            };
            // Messages come whenever they come: a timeout is only a tick.
            if con.set_read_timeout(Some(LISTENER_TICK)).is_err() {
                continue;
            }
            let mut pubsub = con.as_pubsub();
            if let Err(e) = self.subscribe_all(&mut pubsub) {
                tracing::warn!(error = %e, "redis subscribe failed; retrying");
                lost = true;
                target.pause(generation, backoff);
                continue;
            }
            self.shared.listening.store(true, Ordering::Relaxed);
            // Redis answered us: the event loops may try their commands again.
            self.shared.commands_ok.store(true, Ordering::Relaxed);
            backoff = LISTENER_BACKOFF_FIRST;
            if lost {
                tracing::info!("redis reachable again: resubscribed; filling in what was missed");
                self.fill_in();
            }
            loop {
                if target.generation() != generation {
                    tracing::info!("the redis master changed: resubscribing on the new one");
                    break;
                }
                let msg = match pubsub.get_message() {
                    Ok(msg) => msg,
                    Err(e) if e.is_timeout() => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "redis subscription lost; reconnecting");
                        break;
                    }
                };
                let channel = msg.get_channel_name();
                if let Some(name) = shared.names.channel_of_pubsub(channel) {
                    self.handle(name, msg.get_payload_bytes());
                } else if shared.names.is_wake(channel)
                    && let Err(e) = self.apply_todo(&mut pubsub)
                {
                    tracing::warn!(error = %e, "redis subscription change failed; reconnecting");
                    break;
                }
            }
            self.shared.listening.store(false, Ordering::Relaxed);
            lost = true;
        }
    }

    /// After (re)connecting: the wake channel and every wanted channel (or the
    /// pattern); every wanted channel is confirmed.
    fn subscribe_all(&self, pubsub: &mut ::redis::PubSub<'_>) -> ::redis::RedisResult<()> {
        if self.shared.mode == Subscribe::Pattern {
            return pubsub.psubscribe(self.shared.names.pubsub_pattern());
        }
        let mut subs = lock(&self.shared.subs);
        subs.todo.clear();
        let mut names = vec![self.shared.names.wake(&self.shared.node)];
        names.extend(subs.wanted.keys().map(|n| self.shared.names.pubsub(n)));
        // One SUBSCRIBE for all: Redis answers once every channel is subscribed.
        for batch in names.chunks(1024) {
            pubsub.subscribe(batch)?;
        }
        for confirmed in subs.wanted.values_mut() {
            *confirmed = true;
        }
        drop(subs);
        self.shared.confirmed.notify_all();
        Ok(())
    }

    /// Makes the subscription changes asked for, in order, and confirms them.
    fn apply_todo(&self, pubsub: &mut ::redis::PubSub<'_>) -> ::redis::RedisResult<()> {
        let todo = std::mem::take(&mut lock(&self.shared.subs).todo);
        let mut i = 0;
        while i < todo.len() {
            let subscribe = todo[i].1;
            let run: Vec<String> = todo[i..]
                .iter()
                .take_while(|(_, s)| *s == subscribe)
                .map(|(n, _)| self.shared.names.pubsub(n))
                .collect();
            i += run.len();
            for batch in run.chunks(1024) {
                if subscribe {
                    pubsub.subscribe(batch)?;
                } else {
                    pubsub.unsubscribe(batch)?;
                }
            }
        }
        let mut subs = lock(&self.shared.subs);
        for (name, subscribe) in &todo {
            if *subscribe && let Some(confirmed) = subs.wanted.get_mut(name) {
                *confirmed = true;
            }
        }
        drop(subs);
        self.shared.confirmed.notify_all();
        Ok(())
    }

    pub(super) fn handle(&mut self, name: &str, bytes: &[u8]) {
        let hub = &self.shared.hub;
        let Some(channel) = hub.find(name) else {
            self.delivered.remove(name);
            return;
        };
        match parse_incoming(bytes) {
            Some(Incoming::Data {
                seq,
                epoch,
                message,
            }) => {
                // After a reconnect the fill-in reads history, which already holds
                // what was published between the resubscribe and its read; those
                // messages come here too, and were handed out once.
                match self.delivered.get(name) {
                    Some(&(e, last)) if e == epoch && seq <= last => return,
                    // History started afresh (a failover, see `origin`): what came
                    // after `last` of the old epoch may be gone, and is named.
                    Some(&(e, _)) if e != epoch => self.announce_epoch(&channel, epoch, seq),
                    _ => {}
                }
                if self.deliver(&channel, seq, epoch, message) {
                    self.delivered.insert(name.into(), (epoch, seq));
                }
            }
            Some(Incoming::Event {
                node,
                exclude,
                event,
                client,
                count,
            }) => {
                let exclude = exclude.filter(|_| node == self.shared.node);
                // Presence is advisory: an event nobody can take now is dropped.
                let _ = hub.deliver(&channel, Audience::Listeners, exclude, || Body::Event {
                    event,
                    client: client.into(),
                    count,
                });
            }
            Some(Incoming::Presence {
                change,
                skip,
                member,
            }) => {
                let Some((user_id, user_info)) = parse_member(member) else {
                    tracing::warn!(channel = name, "a presence event with no user id: ignored");
                    return;
                };
                // Shown by protocols with presence; lost only to a loop far
                // behind, which is closing its slow subscribers anyway.
                let _ = hub.deliver(&channel, Audience::Everyone, None, || Body::Presence {
                    change,
                    user_id,
                    user_info,
                    skip,
                });
            }
            Some(Incoming::CloseAll) => {
                if let Err(e) = hub.deliver(&channel, Audience::Everyone, None, || Body::CloseAll) {
                    tracing::warn!(channel = name, error = %e, "closing a channel's subscribers failed here");
                }
            }
            Some(Incoming::Foreign(payload)) => {
                let kind = if std::str::from_utf8(payload).is_ok() {
                    DataKind::Text
                } else {
                    DataKind::Binary
                };
                self.deliver(&channel, 0, 0, Decoded::foreign(kind, payload));
            }
            None => tracing::debug!(channel = name, "unreadable message on redis; skipped"),
        }
    }

    fn deliver(&self, channel: &Arc<Channel>, seq: u64, epoch: u64, message: Decoded<'_>) -> bool {
        let Decoded {
            kind,
            tags,
            skip,
            payload,
        } = message;
        let result = self
            .shared
            .hub
            .deliver(channel, Audience::Everyone, None, || Body::Data {
                seq,
                epoch,
                payload: Bytes::copy_from_slice(payload),
                kind,
                from: tags.from.map(Box::from),
                event: tags.event.map(Box::from),
                skip,
            });
        match result {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(channel = channel.name(), seq, error = %e, "a message from redis was not delivered here");
                false
            }
        }
    }

    /// Tells the channel's subscribers here that its history started afresh at
    /// `epoch`, whose next message is `next_seq`.
    fn announce_epoch(&self, channel: &Arc<Channel>, epoch: u64, next_seq: u64) {
        self.shared.new_epochs.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            channel = channel.name(),
            epoch = format_args!("{epoch:016x}"),
            "the channel's history started afresh (a new epoch); subscribers are told of the gap"
        );
        let result = self
            .shared
            .hub
            .deliver(channel, Audience::Everyone, None, || Body::NewEpoch {
                epoch,
                next_seq,
            });
        if let Err(e) = result {
            tracing::warn!(channel = channel.name(), error = %e, "a new epoch was not announced here");
        }
    }

    /// After a reconnect: what local subscribers missed while the listener was
    /// away, from each channel's history, in order.
    pub(super) fn fill_in(&mut self) {
        let channels: Vec<(Box<str>, (u64, u64))> = self.delivered.drain().collect();
        for (name, (epoch, last)) in channels {
            let Some(channel) = self.shared.hub.find(&name) else {
                continue;
            };
            let snapshot = match self.shared.snapshot(&name, false) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(channel = &*name, error = %e, "cannot fill in after reconnect");
                    self.delivered.insert(name, (epoch, last));
                    continue;
                }
            };
            let Some(now_epoch) = snapshot.epoch else {
                // Redis forgot the channel (restarted empty): its next publish
                // starts an epoch, which is then announced.
                self.delivered.insert(name, (epoch, last));
                continue;
            };
            let mut newest = (epoch, last);
            if now_epoch != epoch {
                let next_seq = snapshot
                    .kept
                    .first()
                    .map_or(snapshot.last_seq + 1, |(m, _)| m.seq);
                self.announce_epoch(&channel, now_epoch, next_seq);
                newest = (now_epoch, 0);
            }
            for (stored, _) in snapshot.kept {
                if now_epoch == epoch && stored.seq <= last {
                    continue;
                }
                let tags = Tags {
                    from: stored.from.as_deref(),
                    event: stored.event.as_deref(),
                };
                let message = Decoded {
                    kind: stored.kind,
                    tags,
                    skip: stored.skip,
                    payload: &stored.payload[..],
                };
                if self.deliver(&channel, stored.seq, now_epoch, message) {
                    newest = (now_epoch, stored.seq);
                }
            }
            self.delivered.insert(name, newest);
        }
    }
}
