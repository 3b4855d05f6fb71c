//! One event loop's subscribers: which of its connections listen to which channel,
//! joining and leaving through the broker, and writing each inbox batch to them.
//!
//! Fan-out is the hot path: a run of one channel's deliveries reaches each
//! subscriber as one gathered write of shared frames, each format encoded once per
//! message (by the transport, cached in the message), nothing allocated per
//! subscriber; a fan-out goes out [`FAN_OUT_SLICE`] subscribers at a time, the
//! loop's other events between slices. Joining and leaving are O(1): a subscriber knows its
//! position in its channel's list, and leaving swaps the last one into its place.
//! This module must not decide what messages mean or how connections close; it
//! reports the subscribers it could not write to, and the loop deals with them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use slab::Slab;
use smallvec::SmallVec;

use super::conn::{Conn, Phase};
use crate::broker::{Broker, BrokerError, Member, Replay};
use crate::hub::Body;
use crate::hub::{Channel, ConnRef, Delivery, Inbox};
use crate::rules::{self, Namespaces};
use crate::stats::{Counted, TurnCounts};
use crate::transport::{Format, Subscribe, Subscription};

/// Deliveries of one channel gathered into one write per subscriber.
const MAX_FRAMES_PER_WRITE: usize = 64;

/// Subscribers one delivery pass writes to at most (a loop turn makes one, or two
/// when its waker rang too); a larger fan-out goes on in the next turns, so the
/// loop's other connections (a publisher waiting for its answer, a handshake)
/// wait for a slice, not for the whole fan-out.
const FAN_OUT_SLICE: usize = 1024;

/// One subscriber's frames of a group: held inline for the usual short runs, so a
/// lone message reaches its subscribers without an allocation.
type Frames<'a> = SmallVec<[&'a bytes::Bytes; 4]>;

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
        .and_then(|c| c.session.subscription())
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
}

/// A returning subscriber that joined since the last inbox batch was taken:
/// history gave it every message up to `live_after`, so older deliveries still
/// waiting in the inbox (or in the batch being delivered) must not reach it a
/// second time.
#[derive(Debug, Clone, Copy)]
struct Fresh {
    key: usize,
    channel: usize,
    live_after: u64,
    /// Kept until batch number `until` (the next one taken after the join) is
    /// delivered: everything published before the join is in it or before it.
    until: u64,
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

pub struct LocalSubscribers {
    /// The loop these subscribers belong to.
    loop_index: usize,
    lists: HashMap<usize, LocalChannel>,
    /// Returning subscribers until the next inbox batch has been delivered.
    fresh: Vec<Fresh>,
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
    /// When subscriptions' tokens expire, soonest first: (Unix seconds, connection).
    /// Entries of subscriptions that ended are dropped when due, or all at once when
    /// they outnumber the live ones.
    expiring: BinaryHeap<Reverse<(u32, u32)>>,
    /// Entries in `expiring` whose subscription has ended.
    stale_expiries: usize,
}

impl LocalSubscribers {
    pub fn new(loop_index: usize) -> Self {
        LocalSubscribers {
            loop_index,
            lists: HashMap::new(),
            fresh: Vec::new(),
            batch: Vec::new(),
            start: 0,
            cursor: None,
            taken: 0,
            names: HashMap::new(),
            expiring: BinaryHeap::new(),
            stale_expiries: 0,
        }
    }

    fn member<'a>(&self, key: usize, format: Format, announce: Option<&'a str>) -> Member<'a> {
        Member {
            conn: ConnRef {
                loop_index: self.loop_index,
                key,
            },
            listens: format.listens(),
            announce,
        }
    }

    /// Subscribes connection `key` through the broker; returns its subscription,
    /// the channel's member count, and for a returning subscriber its history.
    pub fn join(
        &mut self,
        broker: &dyn Broker,
        namespaces: &Namespaces,
        key: usize,
        subscribe: &Subscribe,
        client: u32,
    ) -> Result<(Subscription, u64, Option<Replay>), BrokerError> {
        let (channel, format) = (subscribe.channel.as_str(), subscribe.format);
        let rules = namespaces.rules(channel);
        let name = (rules.join_leave && format.announced())
            .then(|| rules::client_name(client, subscribe.name.as_deref()));
        let member = self.member(key, format, name.as_deref());
        let joined = broker.subscribe(channel, member, subscribe.resume)?;
        if let Some(replay) = &joined.replay {
            self.fresh.push(Fresh {
                key,
                channel: channel_key(&joined.channel),
                live_after: replay.last_seq,
                until: self.taken + 1,
            });
        }
        if let Some(cursor) = &mut self.cursor {
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
        Ok((sub, joined.count, joined.replay))
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

    /// Takes connection `key` out of its channel, if it has one.
    pub fn leave(&mut self, broker: &dyn Broker, key: usize, conns: &mut Slab<Conn>) {
        let Some(sub) = conns
            .get_mut(key)
            .and_then(|c| c.session.take_subscription())
        else {
            return;
        };
        let ckey = channel_key(&sub.channel);
        self.fresh.retain(|f| f.key != key);
        let chosen = self.names.remove(&key);
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
                        .and_then(|c| c.session.subscription_mut())
                {
                    other.index = index as u32;
                }
            }
            if list.conns.is_empty() {
                self.lists.remove(&ckey);
            }
        }
        let name = (sub.rules.join_leave && sub.format.announced())
            .then(|| rules::client_name(sub.client, chosen.as_deref()));
        broker.unsubscribe(&sub.channel, self.member(key, sub.format, name.as_deref()));
    }

    /// Whether a batch is part delivered: the loop must come back to it before it
    /// waits for anything.
    pub fn has_pending(&self) -> bool {
        self.start < self.batch.len()
    }

    /// Writes the deliveries waiting in `inbox` to this loop's subscribers, at
    /// most [`FAN_OUT_SLICE`] subscribers a call (the rest on the next calls,
    /// before anything newer), and lists in `failed` those that could not take them.
    pub fn deliver(
        &mut self,
        inbox: &Inbox,
        conns: &mut Slab<Conn>,
        max_queue: usize,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
    ) {
        if !self.has_pending() {
            self.batch.clear();
            self.start = 0;
            inbox.take(&mut self.batch);
            self.taken += 1;
        }
        let batch = std::mem::take(&mut self.batch);
        let mut budget = FAN_OUT_SLICE;
        while self.start < batch.len() && budget > 0 {
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
            self.fresh.retain(|f| f.until > done);
        }
    }

    /// Sends a run of deliveries of one channel (ending at `end` in the batch) to
    /// this loop's subscribers: each subscriber gets all of them in one write, by
    /// reference to the shared frames. Spends one of `budget` per subscriber; when
    /// it runs out first, keeps its place in `self.cursor` and returns `None`.
    /// Otherwise returns whether any subscriber was written to.
    #[allow(clippy::too_many_arguments)]
    fn fan_out(
        &mut self,
        ckey: usize,
        group: &[Delivery],
        end: usize,
        conns: &mut Slab<Conn>,
        max_queue: usize,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
        budget: &mut usize,
    ) -> Option<bool> {
        let mut cursor = self.cursor.take();
        let Some(list) = self.lists.get(&ckey) else {
            // Everyone here left meanwhile.
            return Some(cursor.is_some_and(|c| c.wrote));
        };
        if cursor.is_none() && list.conns.len() > *budget {
            // Too many for this turn: fan out to the subscribers it has now, over
            // as many turns as it takes (who joins meanwhile starts at the next).
            cursor = Some(Cursor {
                end,
                keys: list.conns.clone(),
                next: 0,
                wrote: false,
                joined: Vec::new(),
            });
        }
        // Only a snapshot can hold a key that has left the channel since.
        let snapshot = cursor.is_some();
        let (keys, from, joined) = match &cursor {
            Some(c) => (&c.keys[..], c.next, &c.joined[..]),
            None => (&list.conns[..], 0, &[][..]),
        };
        let until = keys.len().min(from + *budget);
        let mut wrote = false;
        // Each format's frames are gathered (and encoded) only if a subscriber here
        // uses it.
        let mut by_format: [Option<Frames<'_>>; Format::COUNT] = Default::default();
        let exclude = group
            .first()
            .and_then(|d| d.exclude)
            .filter(|e| e.loop_index == self.loop_index)
            .map(|e| e.key);
        for &key in &keys[from..until] {
            if joined.contains(&key) {
                continue;
            }
            let key = key as usize;
            if Some(key) == exclude {
                continue;
            }
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            // A subscriber snapshot is older than this turn: the key may have
            // left, or be someone else's by now.
            let Some(format) = conn
                .session
                .subscription()
                .filter(|s| !snapshot || channel_key(&s.channel) == ckey)
                .map(|s| s.format)
            else {
                continue;
            };
            let fresh = self
                .fresh
                .iter()
                .find(|f| f.key == key && f.channel == ckey)
                .map(|f| f.live_after);
            let only_new: Frames<'_>;
            let frames = match fresh {
                // History already gave it these: only what is newer goes out.
                Some(after) => {
                    only_new = group
                        .iter()
                        .filter(|m| {
                            // Seq 0 was never sequenced, so never replayed.
                            !matches!(m.body, Body::Data { seq, .. } if seq != 0 && seq <= after)
                        })
                        .filter_map(|m| format.frame(m))
                        .collect();
                    &only_new
                }
                None => by_format[format as usize]
                    .get_or_insert_with(|| group.iter().filter_map(|m| format.frame(m)).collect()),
            };
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
            wrote = true;
            let socket = Counted::new(&mut conn.socket, &mut counts.bytes_sent);
            if conn.out.send_shared(socket, frames).is_err() {
                failed.push(Follow::Dead(key));
            } else if conn.out.counted_bytes() > max_queue {
                failed.push(Follow::Slow(key));
            } else if format.one_shot() {
                // Answered: no later group of this batch may write to it again.
                conn.phase = Phase::Closing;
                failed.push(Follow::Answered(key));
            }
        }
        *budget -= until - from;
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
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;
    use crate::broker::{MemoryBroker, Outgoing, Resume};
    use crate::history::Limits;
    use crate::hub::Hub;
    use crate::protocol::DataKind;
    use crate::server::conn::Session;
    use crate::transport::websocket::WsState;

    fn text(payload: &str) -> Outgoing<'_> {
        Outgoing {
            payload: payload.as_bytes(),
            kind: DataKind::Text,
            from: None,
        }
    }

    /// What the client end of a subscriber's socket has received so far.
    fn received(client: &mut TcpStream) -> Vec<u8> {
        client
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut all = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = client.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        all
    }

    /// A one-loop hub and a memory broker keeping `history_size` messages.
    fn broker(history_size: usize) -> (mio::Poll, Arc<Hub>, MemoryBroker) {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let hub = Arc::new(Hub::new(vec![waker]));
        let limits = Limits {
            size: history_size,
            ttl: Duration::from_secs(300),
        };
        let broker = MemoryBroker::new(Arc::clone(&hub), limits, Default::default());
        (poll, hub, broker)
    }

    /// A real loopback connection: the server end in `conns`, the client end returned.
    fn connect(listener: &TcpListener, conns: &mut Slab<Conn>) -> (usize, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let socket = mio::net::TcpStream::from_std(server);
        (
            conns.insert(Conn::new(socket, [127, 0, 0, 1].into(), 0)),
            client,
        )
    }

    /// Reads exactly `want.len()` bytes (waiting up to a second for them), then
    /// checks nothing more is there.
    fn assert_got(client: &mut TcpStream, want: &[u8], who: &str) {
        client
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut got = vec![0u8; want.len()];
        client
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("{who}: {e}"));
        assert_eq!(got, want, "{who}");
        client.set_nonblocking(true).unwrap();
        let mut more = [0u8; 64];
        assert!(
            matches!(client.read(&mut more), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "{who}: more than {want:?}"
        );
        client.set_nonblocking(false).unwrap();
    }

    fn ws_subscribe(
        subscribers: &mut LocalSubscribers,
        broker: &MemoryBroker,
        conns: &mut Slab<Conn>,
        key: usize,
        channel: &str,
        resume: Option<Resume>,
    ) -> Option<Replay> {
        let subscribe = Subscribe {
            channel: channel.into(),
            format: Format::WsRaw,
            resume,
            name: None,
            expires: None,
        };
        let (sub, _, replay) = subscribers
            .join(broker, &Namespaces::default(), key, &subscribe, key as u32)
            .unwrap();
        conns[key].session = Session::WebSocket(WsState::new(Some(sub)));
        replay
    }

    #[test]
    fn a_fan_out_larger_than_a_turn_goes_on_over_turns_exactly_once() {
        let (_poll, hub, broker) = broker(10);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let mut subscribers = LocalSubscribers::new(0);
        let n = FAN_OUT_SLICE + FAN_OUT_SLICE / 2;
        let mut clients = Vec::new();
        for _ in 0..n {
            let (key, client) = connect(&listener, &mut conns);
            ws_subscribe(&mut subscribers, &broker, &mut conns, key, "big", None);
            clients.push((key, client));
        }
        broker.publish("big", text("m1")).unwrap();
        broker.publish("big", text("m2")).unwrap();
        let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
        subscribers.deliver(hub.inbox(0), &mut conns, 1 << 20, &mut counts, &mut failed);
        // One turn's share written (both messages in one write each), the rest left.
        assert!(subscribers.has_pending());
        assert_eq!(counts.delivered, 2 * FAN_OUT_SLICE as u64);
        assert_eq!(
            counts.latency.count(),
            0,
            "not every subscriber has them yet"
        );

        // Between turns: one not yet written to leaves (the last one takes its
        // place in the channel's list), a newcomer joins, and one comes back with
        // history (which gives it m1 and m2).
        let (gone, _) = clients.remove(FAN_OUT_SLICE + 3);
        subscribers.leave(&broker, gone, &mut conns);
        conns.remove(gone);
        let (newcomer, newcomer_client) = connect(&listener, &mut conns);
        assert_eq!(
            newcomer, gone,
            "the slab hands the newcomer the key that left"
        );
        ws_subscribe(&mut subscribers, &broker, &mut conns, newcomer, "big", None);
        let (back, back_client) = connect(&listener, &mut conns);
        let replay = ws_subscribe(
            &mut subscribers,
            &broker,
            &mut conns,
            back,
            "big",
            Some(Resume {
                since: 0,
                epoch: None,
            }),
        );
        let seqs: Vec<u64> = replay.unwrap().messages.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, vec![1, 2]);
        // Published after they joined: everyone gets it, once the fan-out is done.
        broker.publish("big", text("m3")).unwrap();
        while subscribers.has_pending() || hub.inbox(0).has_work() {
            subscribers.deliver(hub.inbox(0), &mut conns, 1 << 20, &mut counts, &mut failed);
        }
        assert!(failed.is_empty(), "{failed:?}");
        for (key, client) in &mut clients {
            assert_got(
                client,
                b"\x81\x02m1\x81\x02m2\x81\x02m3",
                &format!("subscriber {key}"),
            );
        }
        // The newcomer joined while m1 and m2 were being fanned out (under the key
        // of the one that left): it starts at the next message, as a subscriber
        // does; the one that came back got m1 and m2 from history only.
        let mut newcomer_client = newcomer_client;
        let mut back_client = back_client;
        assert_got(&mut back_client, b"\x81\x02m3", "returning subscriber");
        assert_got(&mut newcomer_client, b"\x81\x02m3", "newcomer");
        assert_eq!(counts.delivered, 2 * (n as u64 - 1) + (n as u64 - 1) + 2);
        assert_eq!(counts.latency.count(), 3);
    }

    #[test]
    fn a_long_poll_gets_one_answer_however_many_messages_wait() {
        let (_poll, hub, broker) = broker(0);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let (key, mut client) = connect(&listener, &mut conns);
        let mut subscribers = LocalSubscribers::new(0);
        let subscribe = Subscribe {
            channel: "p".into(),
            format: Format::Poll,
            resume: None,
            name: None,
            expires: None,
        };
        let (sub, _, _) = subscribers
            .join(&broker, &Namespaces::default(), key, &subscribe, 1)
            .unwrap();
        conns[key].session = Session::Poll(Box::new(crate::transport::poll::PollState {
            sub: Some(sub),
            ..Default::default()
        }));
        // More than one fan-out group's worth, all in one inbox batch.
        for i in 0..(MAX_FRAMES_PER_WRITE + 10) {
            broker.publish("p", text(&format!("m{i}"))).unwrap();
        }
        let mut counts = TurnCounts::default();
        let mut follow = Vec::new();
        subscribers.deliver(hub.inbox(0), &mut conns, 1 << 20, &mut counts, &mut follow);
        assert_eq!(follow, vec![Follow::Answered(key)]);
        let answer = String::from_utf8(received(&mut client)).unwrap();
        assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 1, "{answer}");
        assert!(
            answer.contains(r#"{"messages":[{"seq":1,"data":"m0"}],"next":1,"#),
            "{answer}"
        );
    }

    #[test]
    fn a_returning_subscriber_gets_no_live_copy_of_what_history_gave_it() {
        let (_poll, hub, broker) = broker(10);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let mut subscribers = LocalSubscribers::new(0);
        let mut clients = Vec::new();
        for resume in [
            None,
            Some(Resume {
                since: 0,
                epoch: None,
            }),
        ] {
            let (key, client) = connect(&listener, &mut conns);
            let replay = ws_subscribe(&mut subscribers, &broker, &mut conns, key, "c", resume);
            clients.push(client);
            if resume.is_none() {
                // Published while only the first subscriber counts: it waits in the
                // inbox when the second one comes back and history hands it over.
                broker.publish("c", text("one")).unwrap();
            } else {
                let seqs: Vec<u64> = replay.unwrap().messages.iter().map(|m| m.seq).collect();
                assert_eq!(seqs, vec![1]);
            }
        }
        let mut counts = TurnCounts::default();
        let mut failed = Vec::new();
        subscribers.deliver(hub.inbox(0), &mut conns, 1 << 20, &mut counts, &mut failed);
        broker.publish("c", text("two")).unwrap();
        subscribers.deliver(hub.inbox(0), &mut conns, 1 << 20, &mut counts, &mut failed);
        assert!(failed.is_empty());
        assert_eq!(received(&mut clients[0]), b"\x81\x03one\x81\x03two");
        assert_eq!(received(&mut clients[1]), b"\x81\x03two");
    }

    #[test]
    fn tokens_expire_in_order_and_ended_subscriptions_are_forgotten() {
        let (_poll, _hub, broker) = broker(0);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let mut subscribers = LocalSubscribers::new(0);
        let mut keys = Vec::new();
        let mut clients = Vec::new();
        for expires in [Some(30), None, Some(10), Some(20)] {
            let (key, client) = connect(&listener, &mut conns);
            let subscribe = Subscribe {
                channel: "t".into(),
                format: Format::WsRaw,
                resume: None,
                name: None,
                expires,
            };
            let (sub, _, _) = subscribers
                .join(&broker, &Namespaces::default(), key, &subscribe, key as u32)
                .unwrap();
            conns[key].session = Session::WebSocket(WsState::new(Some(sub)));
            keys.push(key);
            clients.push(client);
        }
        // The one expiring at 20 leaves first: it is not reported.
        subscribers.leave(&broker, keys[3], &mut conns);
        let mut expired = Vec::new();
        subscribers.take_expired(9, &conns, &mut expired);
        assert!(expired.is_empty());
        subscribers.take_expired(25, &conns, &mut expired);
        assert_eq!(expired, vec![keys[2]]);
        expired.clear();
        subscribers.take_expired(u64::MAX, &conns, &mut expired);
        assert_eq!(expired, vec![keys[0]]);
        assert!(!subscribers.has_expiring());
    }

    #[test]
    fn a_replay_waiting_for_the_socket_does_not_make_a_slow_consumer() {
        let (_poll, hub, broker) = broker(10);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let mut subscribers = LocalSubscribers::new(0);
        // The client never reads.
        let (key, _client) = connect(&listener, &mut conns);
        let subscribe = Subscribe {
            channel: "big".into(),
            format: Format::WsRaw,
            resume: Some(Resume {
                since: 0,
                epoch: None,
            }),
            name: None,
            expires: None,
        };
        let (sub, _, _) = subscribers
            .join(&broker, &Namespaces::default(), key, &subscribe, 1)
            .unwrap();
        let conn = &mut conns[key];
        conn.session = Session::WebSocket(WsState::new(Some(sub)));
        // A catch-up far larger than the queue limit and than the socket's buffers.
        let max_queue = 4096;
        let replay = vec![b'r'; 16 << 20];
        conn.send_catch_up(&replay, replay.len(), &mut 0).unwrap();
        assert!(conn.out.queued_bytes() > max_queue);
        let (mut counts, mut follow) = (TurnCounts::default(), Vec::new());
        broker.publish("big", text(&"a".repeat(3000))).unwrap();
        subscribers.deliver(
            hub.inbox(0),
            &mut conns,
            max_queue,
            &mut counts,
            &mut follow,
        );
        assert_eq!(
            follow,
            vec![],
            "live bytes within --max-queue on top of a replay"
        );
        broker.publish("big", text(&"b".repeat(3000))).unwrap();
        subscribers.deliver(
            hub.inbox(0),
            &mut conns,
            max_queue,
            &mut counts,
            &mut follow,
        );
        assert_eq!(
            follow,
            vec![Follow::Slow(key)],
            "live bytes past --max-queue"
        );
    }
}
