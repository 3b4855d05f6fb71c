//! One event loop's subscribers: which of its connections listen to which channel,
//! joining and leaving through the broker, and writing each inbox batch to them.
//!
//! Fan-out is the hot path: a run of one channel's deliveries reaches each
//! subscriber as one gathered write of shared frames, each format encoded once per
//! message (by the transport, cached in the message), nothing allocated per
//! subscriber; a fan-out goes out in slices of at most [`FAN_OUT_SLICE`]
//! subscribers and of the turn's time (the loop's deadline), the loop's other
//! events between slices. Joining and leaving are O(1): a subscriber knows its
//! position in its channel's list, and leaving swaps the last one into its place.
//! This module must not decide what messages mean or how connections close; it
//! reports the subscribers it could not write to, and the loop deals with them.

mod batch;
mod gathered;
mod joining;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use super::conn::{Conn, Phase, TlsConns};
use super::uring::send_ring::SendRing;
use crate::broker::{Broker, BrokerError, Member, Members, PresenceMember, Replay};
use crate::hub::Body;
use crate::hub::{Channel, ConnRef, Delivery, Inbox, SocketId};
use crate::os;
use crate::rules::{self, Namespaces};
use crate::stats::TurnCounts;
use crate::timing::{FRESH_LIFE, JOIN_ECHO_LIFE};
use crate::transport::{Compression, Format, Subscribe, Subscription};
use batch::Batch;
use gathered::{Gathered, WINDOWS, gathered_slot};
use joining::{Fresh, Joiner, UNTIL_NEWER};

/// Deliveries of one channel gathered into one write per subscriber.
const MAX_FRAMES_PER_WRITE: usize = 64;

/// Subscribers one delivery pass writes to at most (a loop turn makes one, or two
/// when its waker rang too); a larger fan-out goes on in the next turns, so the
/// loop's other connections (a publisher waiting for its answer, a handshake)
/// wait for a slice, not for the whole fan-out.
const FAN_OUT_SLICE: usize = 1024;

/// A slice also ends at the loop's deadline (this thread's CPU time, see
/// `os::thread_cpu_time`), looked at every this many subscribers: on a box where
/// a hundred processes share two cores, 1024 sends took seconds of wall time (a
/// loop preempted between them), and a publisher waiting on that loop timed out.
const DEADLINE_CHECK_EVERY: usize = 16;

/// A loop's subscribers of one channel.
struct LocalChannel {
    /// Keeps the channel alive while this loop has subscribers.
    _channel: Arc<Channel>,
    conns: Vec<u32>,
}

/// Channels are keyed by the address of their shared state: unique while alive.
/// When the token of connection `key`'s subscription expires, if it has one.
fn expires_at(conns: &Slab<Conn>, key: usize) -> Option<u32> {
    conns
        .get(key)
        .and_then(|c| c.mode.subscriptions().first())
        .map(|s| s.expires)
        .filter(|&e| e != 0)
}

fn channel_key(channel: &Arc<Channel>) -> usize {
    Arc::as_ptr(channel) as usize
}

/// What a fan-out leaves the loop to do for a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Its socket failed.
    Dead(usize),
    /// More than `--max-queue` bytes wait for it (what is left of its replay of
    /// history not counted).
    Slow(usize),
    /// A one-shot subscriber (a long-poll) got its answer: close it.
    Answered(usize),
    /// Its channel's subscribers are to be closed (`Body::CloseAll`).
    Terminated(usize),
}

/// A fan-out larger than one turn's share, part done: the subscribers it had
/// when it began, and the next one to write to.
struct Cursor {
    /// The end of the group (in the batch) being fanned out.
    end: usize,
    keys: Vec<u32>,
    next: usize,
    wrote: bool,
    /// Connections that subscribed since it began (perhaps under the key of one
    /// that left): they start at the next message, as they would have before.
    joined: Vec<u32>,
}

/// What one delivery pass may still spend: subscribers, and the thread's CPU time
/// up to `deadline`.
struct Budget {
    left: usize,
    deadline: Duration,
}

impl Cursor {
    /// A fan-out of the group ending at `end` to `keys`, from the first.
    fn over(end: usize, keys: &[u32]) -> Self {
        Cursor {
            end,
            keys: keys.to_vec(),
            next: 0,
            wrote: false,
            joined: Vec::new(),
        }
    }
}

/// A subscription made, with what the transport greets it with.
#[derive(Debug)]
pub struct Joined {
    pub sub: Subscription,
    /// The channel's member count.
    pub count: u64,
    /// For a returning subscriber: its history.
    pub replay: Option<Replay>,
    /// For a presence member: every member, itself included.
    pub members: Option<Members>,
}

pub struct LocalSubscribers {
    /// The loop these subscribers belong to.
    loop_index: usize,
    lists: HashMap<usize, LocalChannel>,
    /// Returning subscribers until the next inbox batch has been delivered.
    fresh: Vec<Fresh>,
    /// Chat members waiting for their own join's announcement (see [`Joiner`]).
    joiners: Vec<Joiner>,
    /// The inbox batch being delivered (a reused buffer): from `start` on, the
    /// groups not yet delivered; `cursor` is the fan-out of the first of them, if
    /// it is part done.
    batch: Vec<Delivery>,
    start: usize,
    cursor: Option<Cursor>,
    /// Inbox batches taken so far.
    taken: u64,
    /// The names chat clients chose (`name=`), by connection: kept here rather than
    /// in every subscription, which stays as small as an unnamed one.
    names: HashMap<usize, Box<str>>,
    /// The users of presence subscriptions, by connection and channel (likewise).
    users: HashMap<(usize, usize), Box<str>>,
    /// When subscriptions' tokens expire, soonest first: (Unix seconds, connection).
    /// Entries of subscriptions that ended are dropped when due, or all at once when
    /// they outnumber the live ones.
    expiring: BinaryHeap<Reverse<(u32, u32)>>,
    /// Entries in `expiring` whose subscription has ended.
    stale_expiries: usize,
    /// How frames are compressed for subscribers that negotiated permessage-deflate.
    compression: Compression,
    /// Subscribers of a slice written together through the loop's send ring.
    sends: Batch,
}

impl LocalSubscribers {
    pub fn new(loop_index: usize) -> Self {
        LocalSubscribers {
            loop_index,
            lists: HashMap::new(),
            fresh: Vec::new(),
            joiners: Vec::new(),
            batch: Vec::new(),
            start: 0,
            cursor: None,
            taken: 0,
            names: HashMap::new(),
            users: HashMap::new(),
            expiring: BinaryHeap::new(),
            stale_expiries: 0,
            compression: crate::config::ServeConfig::default().compression,
            sends: Batch::default(),
        }
    }

    /// Fans out through `ring`: the subscribers of a slice that take the same
    /// frames get them with one system call.
    pub fn send_through(&mut self, ring: SendRing) {
        self.sends = Batch::with_ring(ring);
    }

    /// Sends made through the send ring, and the system calls they took.
    pub fn ring_sends(&self) -> (u64, u64) {
        self.sends.ring_counts()
    }

    /// The loop's send ring (held replies go through it too), if it has one.
    pub fn send_ring(&mut self) -> Option<&mut SendRing> {
        self.sends.ring_mut()
    }

    /// Compresses for permessage-deflate subscribers as `compression` says.
    pub fn compressing(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    fn member<'a>(&self, key: usize, format: Format, announce: Option<&'a str>) -> Member<'a> {
        Member {
            conn: ConnRef {
                loop_index: self.loop_index,
                key,
            },
            listens: format.listens(),
            announce,
            presence: None,
        }
    }

    /// Subscribes connection `key` through the broker; returns its subscription,
    /// the channel's member count, for a returning subscriber its history, for a
    /// presence member the members.
    pub fn join(
        &mut self,
        broker: &dyn Broker,
        namespaces: &Namespaces,
        key: usize,
        subscribe: &Subscribe,
        client: u32,
    ) -> Result<Joined, BrokerError> {
        let (channel, format) = (subscribe.channel.as_str(), subscribe.format);
        let rules = namespaces.rules(channel);
        let name = (rules.join_leave && format.announced())
            .then(|| rules::client_name(client, subscribe.name.as_deref()));
        let mut member = self.member(key, format, name.as_deref());
        member.presence = subscribe.presence.as_deref().map(|user| PresenceMember {
            user_id: &user.user_id,
            user_info: &user.user_info,
            socket: SocketId::local(client),
            limit: user.limit,
        });
        let joined = broker.subscribe(channel, member, subscribe.resume)?;
        if let Some(user) = &subscribe.presence {
            self.users
                .insert((key, channel_key(&joined.channel)), user.user_id.clone());
        }
        if let Some(replay) = &joined.replay {
            // A live copy of a replayed message may still be on its way when
            // the broker delivers through another thread: the filter then stays
            // until the channel's first newer message, not one batch.
            let until = if broker.delivers_before_subscribe_returns() {
                self.taken + 1
            } else {
                UNTIL_NEWER
            };
            self.fresh.push(Fresh {
                key,
                channel: channel_key(&joined.channel),
                live_after: replay.last_seq,
                until,
                expires: Instant::now() + FRESH_LIFE,
            });
        }
        if name.is_some() && format.listens() && !broker.delivers_before_subscribe_returns() {
            self.joiners.push(Joiner {
                key,
                channel: channel_key(&joined.channel),
                expires: Instant::now() + JOIN_ECHO_LIFE,
            });
        }
        // A fan-out part done started before this subscriber: it starts at the
        // next message of that channel.
        let fanning_out = self.batch.get(self.start).map(|d| &d.channel);
        if let Some(cursor) = &mut self.cursor
            && fanning_out.is_some_and(|c| Arc::ptr_eq(c, &joined.channel))
        {
            cursor.joined.push(key as u32);
        }
        if let Some(name) = &subscribe.name {
            self.names.insert(key, name.clone());
        }
        if let Some(expires) = subscribe.expires {
            self.expiring.push(Reverse((expires, key as u32)));
        }
        let list = self
            .lists
            .entry(channel_key(&joined.channel))
            .or_insert_with(|| LocalChannel {
                _channel: Arc::clone(&joined.channel),
                conns: Vec::new(),
            });
        let index = list.conns.len() as u32;
        list.conns.push(key as u32);
        let sub = Subscription {
            channel: joined.channel,
            client,
            expires: subscribe.expires.unwrap_or(0),
            index,
            format,
            rules,
        };
        Ok(Joined {
            sub,
            count: joined.count,
            replay: joined.replay,
            members: joined.members,
        })
    }

    /// The name connection `key` chose, if it is a subscriber that did.
    pub fn chosen_name(&self, key: usize) -> Option<&str> {
        if self.names.is_empty() {
            return None;
        }
        self.names.get(&key).map(|n| &**n)
    }

    /// Lists in `expired` the connections whose token expired by `now` (Unix
    /// seconds); the caller closes them.
    pub fn take_expired(&mut self, now: u64, conns: &Slab<Conn>, expired: &mut Vec<usize>) {
        while let Some(&Reverse((expires, key))) = self.expiring.peek() {
            if u64::from(expires) > now {
                break;
            }
            self.expiring.pop();
            if expires_at(conns, key as usize) == Some(expires) {
                expired.push(key as usize);
            } else {
                self.stale_expiries = self.stale_expiries.saturating_sub(1);
            }
        }
    }

    /// Whether any subscription here has a token that will expire.
    pub fn has_expiring(&self) -> bool {
        !self.expiring.is_empty()
    }

    /// Takes connection `key` out of every channel it is in.
    pub fn leave(&mut self, broker: &dyn Broker, key: usize, conns: &mut Slab<Conn>) {
        self.fresh.retain(|f| f.key != key);
        self.joiners.retain(|j| j.key != key);
        let chosen = self.names.remove(&key);
        while let Some(sub) = conns
            .get_mut(key)
            .and_then(|c| c.mode.take_subscription(None))
        {
            self.end(broker, key, sub, chosen.as_deref(), conns);
        }
    }

    /// Takes connection `key` out of channel `channel` only (a multiplexing
    /// transport's unsubscribe); false when it was not in it.
    pub fn leave_channel(
        &mut self,
        broker: &dyn Broker,
        key: usize,
        channel: &str,
        conns: &mut Slab<Conn>,
    ) -> bool {
        let taken = conns
            .get_mut(key)
            .and_then(|c| c.mode.take_subscription(Some(channel)));
        let Some(sub) = taken else {
            return false;
        };
        let ckey = channel_key(&sub.channel);
        self.fresh.retain(|f| !(f.key == key && f.channel == ckey));
        self.joiners
            .retain(|j| !(j.key == key && j.channel == ckey));
        let chosen = self.names.get(&key).cloned();
        self.end(broker, key, sub, chosen.as_deref(), conns);
        true
    }

    /// Ends subscription `sub` of connection `key`, already taken out of it.
    fn end(
        &mut self,
        broker: &dyn Broker,
        key: usize,
        sub: Subscription,
        chosen: Option<&str>,
        conns: &mut Slab<Conn>,
    ) {
        let ckey = channel_key(&sub.channel);
        if sub.expires != 0 {
            self.stale_expiries += 1;
            if self.stale_expiries > 1024 && self.stale_expiries * 2 > self.expiring.len() {
                self.expiring.retain(|&Reverse((expires, key))| {
                    expires_at(conns, key as usize) == Some(expires)
                });
                self.stale_expiries = 0;
            }
        }
        if let Some(list) = self.lists.get_mut(&ckey) {
            let index = sub.index as usize;
            if list.conns.get(index).is_some_and(|&k| k as usize == key) {
                list.conns.swap_remove(index);
                if let Some(&moved) = list.conns.get(index)
                    && let Some(other) = conns
                        .get_mut(moved as usize)
                        .and_then(|c| c.mode.subscription_of_mut(&sub.channel))
                {
                    other.index = index as u32;
                }
            }
            if list.conns.is_empty() {
                self.lists.remove(&ckey);
            }
        }
        let name = (sub.rules.join_leave && sub.format.announced())
            .then(|| rules::client_name(sub.client, chosen));
        let user = self.users.remove(&(key, ckey));
        let mut member = self.member(key, sub.format, name.as_deref());
        member.presence = user.as_deref().map(|user_id| PresenceMember {
            user_id,
            user_info: "",
            socket: SocketId::local(sub.client),
            limit: 0,
        });
        broker.unsubscribe(&sub.channel, member);
    }

    /// Whether a batch is part delivered: the loop must come back to it before it
    /// waits for anything.
    pub fn has_pending(&self) -> bool {
        self.start < self.batch.len()
    }

    /// Whether returning subscribers keep live filters until the inbox is taken
    /// once more (see `Broker::delivers_before_subscribe_returns`).
    pub fn has_fresh(&self) -> bool {
        !self.fresh.is_empty()
    }

    /// Writes the deliveries waiting in `inbox` to this loop's subscribers, at
    /// most [`FAN_OUT_SLICE`] subscribers a call and none once this thread's CPU
    /// time has reached `deadline` (the rest on the next calls, before anything
    /// newer), and lists in `failed` those that could not take them.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &mut self,
        inbox: &Inbox,
        conns: &mut Slab<Conn>,
        tls: &mut TlsConns,
        max_queue: usize,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
        deadline: Duration,
    ) {
        if !self.has_pending() {
            self.batch.clear();
            self.start = 0;
            inbox.take(&mut self.batch);
            self.taken += 1;
        }
        let batch = std::mem::take(&mut self.batch);
        let mut budget = Budget {
            left: FAN_OUT_SLICE,
            deadline,
        };
        while self.start < batch.len() && budget.left > 0 {
            let start = self.start;
            let ckey = channel_key(&batch[start].channel);
            let end = match &self.cursor {
                Some(cursor) => cursor.end,
                None => {
                    let mut end = start + 1;
                    while end < batch.len()
                        && end - start < MAX_FRAMES_PER_WRITE
                        && channel_key(&batch[end].channel) == ckey
                        && batch[end].exclude.is_none()
                        && batch[start].exclude.is_none()
                        && batch[end].skip().is_none()
                        && batch[start].skip().is_none()
                        && !matches!(batch[start].body, Body::CloseAll)
                        && !matches!(batch[end].body, Body::CloseAll)
                    {
                        end += 1;
                    }
                    end
                }
            };
            let group = &batch[start..end];
            let Some(wrote) = self.fan_out(
                ckey,
                group,
                end,
                conns,
                tls,
                max_queue,
                counts,
                failed,
                &mut budget,
            ) else {
                break;
            };
            if wrote {
                // Delivery latency: once per message on this loop, when every
                // subscriber here has been written to.
                let now = Instant::now();
                for message in group {
                    counts
                        .latency
                        .observe(now.saturating_duration_since(message.handed));
                }
            }
            self.start = end;
        }
        self.batch = batch;
        if !self.has_pending() {
            let done = self.taken;
            self.batch.clear();
            self.start = 0;
            // Everything published before these subscribers joined was in it.
            let now = Instant::now();
            self.fresh.retain(|f| f.until > done && f.expires > now);
            self.joiners.retain(|j| j.expires > now);
        }
    }

    /// Sends a run of deliveries of one channel (ending at `end` in the batch) to
    /// this loop's subscribers: each subscriber gets all of them in one write, by
    /// reference to the shared frames. Spends one of `budget` per subscriber; when
    /// it runs out first (or its deadline passes), keeps its place in
    /// `self.cursor` and returns `None`. Otherwise returns whether any subscriber
    /// was written to.
    #[allow(clippy::too_many_arguments)]
    fn fan_out(
        &mut self,
        ckey: usize,
        group: &[Delivery],
        end: usize,
        conns: &mut Slab<Conn>,
        tls: &mut TlsConns,
        max_queue: usize,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
        budget: &mut Budget,
    ) -> Option<bool> {
        let mut cursor = self.cursor.take();
        let Some(list) = self.lists.get(&ckey) else {
            // Everyone here left meanwhile.
            return Some(cursor.is_some_and(|c| c.wrote));
        };
        if cursor.is_none() && list.conns.len() > budget.left {
            // Too many for this turn: fan out to the subscribers it has now, over
            // as many turns as it takes (who joins meanwhile starts at the next).
            cursor = Some(Cursor::over(end, &list.conns));
        }
        // A snapshot's keys may have left the channel since, or be someone else's
        // by now: each is looked up by its subscription of this channel.
        let channel = &group[0].channel;
        let (keys, from, joined) = match &cursor {
            Some(c) => (&c.keys[..], c.next, &c.joined[..]),
            None => (&list.conns[..], 0, &[][..]),
        };
        let mut until = keys.len().min(from + budget.left);
        let mut wrote = false;
        // Each format's frames are gathered (and encoded) only if a subscriber here
        // uses it.
        let mut by_format: [Option<Gathered<'_>>; Format::COUNT * WINDOWS] =
            std::array::from_fn(|_| None);
        let compression = self.compression;
        let exclude = group
            .first()
            .and_then(|d| d.exclude)
            .filter(|e| e.loop_index == self.loop_index)
            .map(|e| e.key);
        // A message that names a connection to leave out is grouped alone.
        let skip = group
            .first()
            .and_then(|d| d.skip())
            .filter(|s| s.node == crate::hub::this_node())
            .map(|s| s.client);
        // A close-all message is grouped alone too: it ends every subscriber here.
        let close_all = matches!(group[0].body, Body::CloseAll);
        // Returning subscribers whose filters this group makes needless.
        let mut passed: Vec<(usize, usize)> = Vec::new();
        for (done, &key) in keys[from..until].iter().enumerate() {
            if done > 0
                && done % DEADLINE_CHECK_EVERY == 0
                && os::thread_cpu_time() >= budget.deadline
            {
                until = from + done;
                break;
            }
            if joined.contains(&key) {
                continue;
            }
            let key = key as usize;
            if Some(key) == exclude {
                // Its own join's announcement (the only kind that names one to
                // leave out): what comes after it is newer than its welcome.
                if !self.joiners.is_empty() {
                    self.joiners
                        .retain(|j| !(j.key == key && j.channel == ckey));
                }
                continue;
            }
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            // A subscriber snapshot is older than this turn: the key may have
            // left, or be someone else's by now.
            let Some((format, client)) = conn
                .mode
                .subscription_of(channel)
                .map(|s| (s.format, s.client))
            else {
                continue;
            };
            let window_bits = conn.deflate;
            if skip == Some(client) {
                continue;
            }
            if close_all {
                failed.push(Follow::Terminated(key));
                continue;
            }
            let fresh = self
                .fresh
                .iter()
                .find(|f| f.key == key && f.channel == ckey)
                .map(|f| f.live_after);
            let joining = !self.joiners.is_empty()
                && self
                    .joiners
                    .iter()
                    .any(|j| j.key == key && j.channel == ckey);
            let filtered = fresh.is_some() || joining;
            if !filtered
                && self.sends.has_ring()
                && !format.one_shot()
                && conn.phase == Phase::Active
                && conn.out.is_empty()
                && tls.get(key).is_none()
            {
                // Written with the others that take these frames, below.
                conn.beat.mark_delivered();
                let fd = conn.socket.as_raw_fd();
                let slot = gathered_slot(format, window_bits);
                let gathered = by_format[slot].get_or_insert_with(|| {
                    Gathered::of(group.iter(), format, window_bits, compression)
                });
                let n = gathered.frames.len() as u64;
                if n == 0 {
                    continue;
                }
                counts.messages_out += n;
                counts.delivered += n;
                counts.deflate_plain += gathered.deflate_plain;
                counts.deflate_wire += gathered.deflate_wire;
                wrote = true;
                if slot != self.sends.slot
                    && let Some(other) = &by_format[self.sends.slot]
                {
                    self.sends
                        .write(&other.frames, conns, max_queue, counts, failed);
                }
                self.sends.slot = slot;
                if self.sends.push(key, fd)
                    && let Some(gathered) = &by_format[slot]
                {
                    self.sends
                        .write(&gathered.frames, conns, max_queue, counts, failed);
                }
                continue;
            }
            if !filtered
                && self.sends.has_ring()
                && !format.one_shot()
                && conn.phase == Phase::Active
                && conn.out.is_empty()
                && let Some(sealer) = tls.get_mut(key)
            {
                // Sealed for it into the batch, written with the others below.
                let gathered =
                    by_format[gathered_slot(format, window_bits)].get_or_insert_with(|| {
                        Gathered::of(group.iter(), format, window_bits, compression)
                    });
                if gathered.frames.is_empty() {
                    continue;
                }
                let fd = conn.socket.as_raw_fd();
                if gathered.bytes <= batch::SEAL_AT_MOST {
                    match self.sends.seal(key, fd, sealer, &gathered.frames) {
                        // Ciphertext owed goes first: its own writer, below.
                        Ok(None) => {}
                        Ok(Some(full)) => {
                            conn.beat.mark_delivered();
                            counts.messages_out += gathered.frames.len() as u64;
                            counts.delivered += gathered.frames.len() as u64;
                            counts.deflate_plain += gathered.deflate_plain;
                            counts.deflate_wire += gathered.deflate_wire;
                            wrote = true;
                            if full {
                                self.sends.write_sealed(conns, tls, counts, failed);
                            }
                            continue;
                        }
                        Err(_) => {
                            failed.push(Follow::Dead(key));
                            continue;
                        }
                    }
                }
            }
            let only_new: Gathered<'_>;
            let gathered = if filtered {
                if let Some(after) = fresh
                    && group.iter().any(|m| joining::newer_than(&m.body, after))
                {
                    passed.push((key, ckey));
                }
                let unseen = group
                    .iter()
                    .filter(|m| joining::passes(&m.body, fresh, joining));
                only_new = Gathered::of(unseen, format, window_bits, compression);
                &only_new
            } else {
                by_format[gathered_slot(format, window_bits)].get_or_insert_with(|| {
                    Gathered::of(group.iter(), format, window_bits, compression)
                })
            };
            let frames = &gathered.frames;
            if frames.is_empty() || conn.phase != Phase::Active {
                continue;
            }
            // A one-shot subscriber takes one message and is done.
            let frames = if format.one_shot() {
                &frames[..1]
            } else {
                &frames[..]
            };
            counts.messages_out += frames.len() as u64;
            counts.delivered += frames.len() as u64;
            counts.deflate_plain += gathered.deflate_plain;
            counts.deflate_wire += gathered.deflate_wire;
            wrote = true;
            conn.beat.mark_delivered();
            if conn
                .send_shared(frames, tls.get_mut(key), &mut counts.bytes_sent)
                .is_err()
            {
                failed.push(Follow::Dead(key));
            } else if conn.out.counted_bytes() > max_queue {
                failed.push(Follow::Slow(key));
            } else if format.one_shot() {
                // Answered: no later group of this batch may write to it again.
                conn.phase = Phase::Closing;
                failed.push(Follow::Answered(key));
            }
        }
        if !self.sends.is_empty()
            && let Some(gathered) = &by_format[self.sends.slot]
        {
            self.sends
                .write(&gathered.frames, conns, max_queue, counts, failed);
        }
        if self.sends.has_sealed() {
            self.sends.write_sealed(conns, tls, counts, failed);
        }
        budget.left -= until - from;
        if until < keys.len() {
            // The deadline cut a fan-out that fit the count: keep its place too.
            budget.left = 0;
            if cursor.is_none() {
                cursor = Some(Cursor::over(end, &list.conns));
            }
        }
        if !passed.is_empty() {
            self.fresh.retain(|f| !passed.contains(&(f.key, f.channel)));
        }
        match cursor {
            Some(mut c) if until < c.keys.len() => {
                c.next = until;
                c.wrote |= wrote;
                self.cursor = Some(c);
                None
            }
            Some(c) => Some(c.wrote || wrote),
            None => Some(wrote),
        }
    }
}

#[cfg(test)]
mod tests;
