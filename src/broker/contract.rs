//! The broker contract: one suite of cases, run against every broker through a
//! factory, so what the server relies on is checked the same way for each: the
//! memory broker always, the Redis broker on one Redis and on a one-node Redis
//! Cluster when `redis-server` is on PATH (each case starts its own on a free
//! port and stops it by pid; with `THRONG_REQUIRE_REDIS=1` a missing
//! `redis-server` fails the case instead of skipping it).
//!
//! The cases: seqs start at 1 and go up by one per channel; a channel's order is
//! kept; a replay after `since` gives exactly what came after; a `since` older
//! than history is told as a gap; a presence user is said once (joined with its
//! first connection, left with its last, to subscribers and to the
//! [`ChannelWatch`]); a publish with an idempotency key seen before stores
//! nothing again; publishes handed over ([`Broker::ask`]) are answered each
//! to its ticket, in the order asked, keys kept. On one Redis, brokers with different `--redis-prefix`es share
//! nothing (messages, seqs, member counts, presence users, channel lists, the
//! nodes' set) and brokers with the same one share all of it. A Redis broker delivers through its listener thread, so a case
//! waits for deliveries, and "nothing else came" is known by publishing a marker
//! after and waiting for it: one channel's deliveries keep their order.
//!
//! Tests only; it must not hold behaviour of its own.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::asked::{Ask, Asked, Asker, Publish, Ticket};
use super::idempotency::Published;
use super::{
    Broker, BrokerError, ChannelWatch, Gap, GapReason, Member, Outgoing, PresenceMember, Resume,
};
use super::{MemoryBroker, RedisBroker, Subscribe};
use crate::history::Limits;
use crate::hub::{Body, ConnRef, Delivery, Hub, PresenceChange};
use crate::ids::SocketId;
use crate::protocol::DataKind;
use crate::rules::Namespaces;

/// Messages every broker under test keeps per channel: small, so a gap is
/// three publishes away.
const HISTORY: usize = 3;
/// Longest a case waits for a delivery or a server.
const PATIENCE: Duration = Duration::from_secs(10);
/// Makes a missing `redis-server` a failure rather than a skip.
const REQUIRE_REDIS: &str = "THRONG_REQUIRE_REDIS";

/// What the [`ChannelWatch`] was told, in order.
#[derive(Debug, Default)]
struct Heard(Mutex<Vec<String>>);

impl Heard {
    fn note(&self, what: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ChannelWatch for Heard {
    fn watches_occupancy(&self, _channel: &str) -> bool {
        false
    }

    fn occupied(&self, channel: &str) {
        self.note(format!("occupied {channel}"));
    }

    fn vacated(&self, channel: &str) {
        self.note(format!("vacated {channel}"));
    }

    fn member_added(&self, channel: &str, user_id: &str) {
        self.note(format!("member_added {channel} {user_id}"));
    }

    fn member_removed(&self, channel: &str, user_id: &str) {
        self.note(format!("member_removed {channel} {user_id}"));
    }
}

/// A `redis-server` of a case's own, stopped (by its pid) when dropped.
struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts one on a free port (with `cluster`, as a one-node Redis Cluster
    /// holding every slot); `None` when `redis-server` is not on PATH.
    fn start(cluster: bool) -> Option<RedisServer> {
        let on_path = std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
        });
        if !on_path {
            let required = std::env::var(REQUIRE_REDIS).is_ok_and(|v| v == "1");
            assert!(
                !required,
                "redis-server is not on PATH and {REQUIRE_REDIS}=1"
            );
            eprintln!("skipped: redis-server is not on PATH");
            return None;
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "throng-broker-contract-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if cluster {
            // The bus port named: the default (port + 10000) may be taken or
            // past 65535. The address announced: alone in its cluster, a node
            // names itself "" in `CLUSTER SLOTS`.
            let bus = free_port().to_string();
            command
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-port", &bus])
                .args(["--cluster-announce-ip", "127.0.0.1"]);
        }
        let child = command.spawn().expect("redis-server starts");
        let mut server = RedisServer { child, port, dir };
        let client = ::redis::Client::open(server.url("redis")).expect("a redis URL");
        let mut con = server.wait_for_connection(&client);
        if cluster {
            ::redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(0)
                .arg(16383)
                .query::<()>(&mut con)
                .expect("the node takes every slot");
            wait_until("the one-node cluster is ok", || {
                ::redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query::<String>(&mut con)
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
        }
        Some(server)
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn wait_for_connection(&mut self, client: &::redis::Client) -> ::redis::Connection {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("redis-server on port {} ended: {status}", self.port);
            }
            let ping = client.get_connection().and_then(|mut con| {
                ::redis::cmd("PING").query::<String>(&mut con)?;
                Ok(con)
            });
            match ping {
                Ok(con) => return con,
                Err(e) if Instant::now() > deadline => panic!("redis-server never answered: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until `done`, or fails the case saying what never came.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A broker under test, on one event loop's inbox, with what it delivered.
struct Under {
    broker: Box<dyn Broker>,
    hub: Arc<Hub>,
    heard: Arc<Heard>,
    /// Every delivery taken from loop 0's inbox so far, in order.
    seen: Vec<Delivery>,
    markers: u32,
    _polls: Vec<mio::Poll>,
    /// Dropped after the broker: its threads see Redis go only once the case
    /// is over.
    _redis: Option<RedisServer>,
}

fn limits() -> Limits {
    Limits {
        size: HISTORY,
        ttl: Duration::from_secs(300),
    }
}

fn one_loop_hub() -> (Arc<Hub>, Vec<mio::Poll>) {
    let polls = vec![mio::Poll::new().expect("a poll")];
    let wakers = polls
        .iter()
        .map(|p| Arc::new(mio::Waker::new(p.registry(), mio::Token(0)).expect("a waker")))
        .collect();
    (Arc::new(Hub::new(wakers)), polls)
}

impl Under {
    fn memory() -> Option<Under> {
        let (hub, polls) = one_loop_hub();
        let broker = MemoryBroker::new(Arc::clone(&hub), limits(), Namespaces::default());
        Some(Under::with(Box::new(broker), hub, polls, None))
    }

    fn redis() -> Option<Under> {
        Under::on_redis(false)
    }

    fn redis_cluster() -> Option<Under> {
        Under::on_redis(true)
    }

    fn on_redis(cluster: bool) -> Option<Under> {
        let server = RedisServer::start(cluster)?;
        let url = server.url(if cluster { "redis-cluster" } else { "redis" });
        Some(Under::on(&url, RedisBroker::DEFAULT_PREFIX, Some(server)))
    }

    /// A Redis broker on `url` whose names start with `prefix`; `server` is
    /// kept until it is dropped.
    fn on(url: &str, prefix: &str, server: Option<RedisServer>) -> Under {
        let (hub, polls) = one_loop_hub();
        let broker = RedisBroker::start(
            Arc::clone(&hub),
            url,
            Subscribe::Channels,
            0,
            limits(),
            Namespaces::default(),
            prefix,
        )
        .expect("the redis broker starts");
        let under = Under::with(Box::new(broker), hub, polls, server);
        wait_until("the redis broker is healthy", || under.broker.healthy());
        under
    }

    fn with(
        broker: Box<dyn Broker>,
        hub: Arc<Hub>,
        polls: Vec<mio::Poll>,
        redis: Option<RedisServer>,
    ) -> Under {
        let heard = Arc::new(Heard::default());
        broker.set_watch(Arc::clone(&heard) as Arc<dyn ChannelWatch>);
        Under {
            broker,
            hub,
            heard,
            seen: Vec::new(),
            markers: 0,
            _polls: polls,
            _redis: redis,
        }
    }

    /// What the watch heard of presence users (occupancy is told as the
    /// broker decides it, which this suite does not pin down).
    fn heard_of_members(&self) -> Vec<String> {
        let mut heard = self.heard.all();
        heard.retain(|h| h.starts_with("member_"));
        heard
    }

    fn take(&mut self) {
        let mut batch = Vec::new();
        self.hub.inbox(0).take(&mut batch);
        self.seen.append(&mut batch);
    }

    /// Seq and payload of every message of `channel` delivered so far.
    fn data(&mut self, channel: &str) -> Vec<(u64, Vec<u8>)> {
        self.take();
        self.seen
            .iter()
            .filter(|m| m.channel.name() == channel)
            .filter_map(|m| match &m.body {
                Body::Data { seq, payload, .. } => Some((*seq, payload.to_vec())),
                _ => None,
            })
            .collect()
    }

    /// Every presence change of `channel` delivered so far, with its user.
    fn presence(&mut self, channel: &str) -> Vec<(PresenceChange, String)> {
        self.take();
        self.seen
            .iter()
            .filter(|m| m.channel.name() == channel)
            .filter_map(|m| match &m.body {
                Body::Presence {
                    change, user_id, ..
                } => Some((*change, user_id.to_string())),
                _ => None,
            })
            .collect()
    }

    /// Waits until `n` messages of `channel` were delivered.
    fn wait_for_data(&mut self, channel: &str, n: usize) -> Vec<(u64, Vec<u8>)> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let data = self.data(channel);
            if data.len() >= n {
                return data;
            }
            assert!(
                Instant::now() < deadline,
                "{channel}: {} of {n} messages delivered",
                data.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Publishes a marker to `channel` (which has a subscriber here) and waits
    /// for it: whatever the broker delivers to the channel before is in by then.
    fn sync(&mut self, channel: &str) {
        self.markers += 1;
        let marker = format!("marker {}", self.markers);
        self.broker
            .publish(channel, text(&marker))
            .expect("the marker is published");
        wait_until(&format!("{channel}: {marker} delivered"), || {
            self.data(channel)
                .iter()
                .any(|(_, p)| *p == marker.as_bytes())
        });
    }
}

/// Subscribes as a returning subscriber with `resume`: the seqs it is given
/// from history and the gap it is told of.
fn returning(u: &mut Under, channel: &str, resume: Resume) -> (Vec<u64>, Option<Gap>) {
    let subscribed = u
        .broker
        .subscribe(channel, plain(1), Some(resume))
        .expect("subscribed");
    let (given, gap) = subscribed
        .replay
        .expect("a returning subscriber gets a replay")
        .for_resume(resume);
    (given.messages.iter().map(|m| m.seq).collect(), gap)
}

fn text(payload: &str) -> Outgoing<'_> {
    Outgoing {
        payload: payload.as_bytes(),
        kind: DataKind::Text,
        from: None,
        event: None,
        skip: None,
    }
}

fn plain(key: usize) -> Member<'static> {
    Member {
        conn: ConnRef { loop_index: 0, key },
        listens: true,
        announce: None,
        presence: None,
    }
}

fn presence_member(key: usize, user_id: &str) -> Member<'_> {
    Member {
        presence: Some(PresenceMember {
            user_id,
            user_info: r#"{"name":"x"}"#,
            socket: SocketId::local(key as u32),
            limit: 10,
        }),
        ..plain(key)
    }
}

fn seqs_start_at_one_and_go_up_by_one_per_channel(u: &mut Under) {
    let published: Vec<u64> = (0..3)
        .map(|_| u.broker.publish("count-a", text("x")).expect("published"))
        .collect();
    assert_eq!(published, vec![1, 2, 3]);
    assert_eq!(u.broker.publish("count-b", text("x")), Ok(1));
    assert_eq!(u.broker.publish("count-a", text("x")), Ok(4));
    assert_eq!(u.broker.channel_info("count-a").last_seq, 4);
    assert_eq!(u.broker.channel_info("count-b").last_seq, 1);
}

fn a_channels_order_is_kept(u: &mut Under) {
    let channel = "order";
    u.broker
        .subscribe(channel, plain(1), None)
        .expect("subscribed");
    let words: Vec<String> = (1..=40).map(|i| format!("m{i}")).collect();
    for word in &words {
        u.broker.publish(channel, text(word)).expect("published");
    }
    let data = u.wait_for_data(channel, words.len());
    let expected: Vec<(u64, Vec<u8>)> = (1..)
        .zip(&words)
        .map(|(seq, w)| (seq, w.as_bytes().to_vec()))
        .collect();
    assert_eq!(data, expected);
}

fn a_replay_gives_exactly_what_came_after_since(u: &mut Under) {
    let channel = "replay";
    for word in ["a", "b", "c", "d", "e"] {
        u.broker.publish(channel, text(word)).expect("published");
    }
    let history = u.broker.history(channel, 2).expect("history");
    let got: Vec<(u64, &[u8])> = history
        .messages
        .iter()
        .map(|m| (m.seq, &m.payload[..]))
        .collect();
    assert_eq!(got, vec![(3, &b"c"[..]), (4, b"d"), (5, b"e")]);
    assert_eq!((history.last_seq, history.oldest), (5, 3));
    let resume = Resume {
        since: 4,
        epoch: Some(history.epoch),
    };
    let (given, gap) = returning(u, channel, resume);
    assert_eq!(given, vec![5]);
    assert_eq!(gap, None);
}

fn a_since_older_than_history_is_told_as_a_gap(u: &mut Under) {
    let channel = "gap";
    for word in ["a", "b", "c", "d", "e"] {
        u.broker.publish(channel, text(word)).expect("published");
    }
    let epoch = u.broker.history(channel, 0).expect("history").epoch;
    let resume = Resume {
        since: 1,
        epoch: Some(epoch),
    };
    let (given, gap) = returning(u, channel, resume);
    assert_eq!(given, vec![3, 4, 5]);
    assert_eq!(
        gap,
        Some(Gap {
            from: 2,
            to: 2,
            reason: GapReason::TooOld
        })
    );
}

fn a_presence_user_is_said_once(u: &mut Under) {
    let channel = "presence-room";
    // Keeps the channel subscribed here after the user's last connection left.
    u.broker
        .subscribe(channel, plain(9), None)
        .expect("subscribed");
    let first = u
        .broker
        .subscribe(channel, presence_member(1, "ann"), None)
        .expect("ann's first connection");
    let second = u
        .broker
        .subscribe(channel, presence_member(2, "ann"), None)
        .expect("ann's second connection");
    assert_eq!(
        second.members,
        Some(vec![("ann".to_string(), r#"{"name":"x"}"#.to_string())])
    );
    u.sync(channel);
    let joined = vec![(PresenceChange::Joined, "ann".to_string())];
    assert_eq!(u.presence(channel), joined);
    assert_eq!(u.heard_of_members(), vec!["member_added presence-room ann"]);

    u.broker
        .unsubscribe(&first.channel, presence_member(1, "ann"));
    u.sync(channel);
    assert_eq!(u.presence(channel), joined, "ann still has a connection");
    assert_eq!(u.broker.presence_members(channel).map(|m| m.len()), Ok(1));

    u.broker
        .unsubscribe(&second.channel, presence_member(2, "ann"));
    u.sync(channel);
    assert_eq!(
        u.presence(channel),
        vec![
            (PresenceChange::Joined, "ann".to_string()),
            (PresenceChange::Left, "ann".to_string())
        ]
    );
    assert_eq!(
        u.heard_of_members(),
        vec![
            "member_added presence-room ann",
            "member_removed presence-room ann"
        ]
    );
    assert_eq!(u.broker.presence_members(channel), Ok(Vec::new()));
}

fn a_key_seen_before_publishes_nothing_again(u: &mut Under) {
    let channel = "once";
    u.broker
        .subscribe(channel, plain(1), None)
        .expect("subscribed");
    let first = u
        .broker
        .publish_once(channel, text("pay"), "key-1")
        .expect("published");
    let again = u
        .broker
        .publish_once(channel, text("pay"), "key-1")
        .expect("answered");
    assert_eq!((first.seq, first.replayed), (1, false));
    assert_eq!((again.seq, again.replayed), (1, true));
    let other = u
        .broker
        .publish_once(channel, text("pay"), "key-2")
        .expect("published");
    assert_eq!((other.seq, other.replayed), (2, false));
    u.sync(channel);
    let seqs: Vec<u64> = u.data(channel).iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, vec![1, 2, 3], "each key once, then the marker");
    let kept = u.broker.history(channel, 0).expect("history");
    assert_eq!(
        kept.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

/// The answers to `asks`, handed over in turn, by ticket serial: at once from
/// a broker that answers so, else through the hub as a loop takes them.
fn ask_all(u: &Under, asks: Vec<Vec<Publish>>) -> Vec<Vec<(u64, bool)>> {
    let mut answers: Vec<Option<Vec<(u64, bool)>>> = vec![None; asks.len()];
    let read = |outcome: Result<Vec<Published>, BrokerError>| -> Vec<(u64, bool)> {
        outcome
            .expect("published")
            .iter()
            .map(|p| (p.seq, p.replayed))
            .collect()
    };
    for (serial, publishes) in asks.into_iter().enumerate() {
        let to = Ticket {
            loop_index: 0,
            key: 7,
            serial: serial as u32,
            asker: Asker::Request,
        };
        if let Asked::Now(outcome) = u.broker.ask(Ask::new(publishes, to)) {
            answers[serial] = Some(read(outcome));
        }
    }
    let mut batch = Vec::new();
    wait_until("every handed-over publish is answered", || {
        u.hub.inbox(0).take_answers(&mut batch);
        for answer in batch.drain(..) {
            assert_eq!((answer.to.loop_index, answer.to.key), (0, 7));
            answers[answer.to.serial as usize] = Some(read(answer.outcome));
        }
        answers.iter().all(Option::is_some)
    });
    answers.into_iter().flatten().collect()
}

fn handed_over_publishes_keep_order_and_keys(u: &mut Under) {
    let channel = "asked";
    u.broker
        .subscribe(channel, plain(1), None)
        .expect("subscribed");
    let one = |payload: &str, key: Option<&str>| Publish::new(channel, text(payload), key);
    // Two in one request, a keyed one, its retry, then many more at once: on
    // Redis they meet in the lanes and go many to a round trip.
    let mut asks = vec![
        vec![one("a", None), one("b", None)],
        vec![one("c", Some("k"))],
        vec![one("c", Some("k"))],
    ];
    asks.extend((0..200).map(|i| vec![one(&format!("m{i}"), None)]));
    let answers = ask_all(u, asks);
    assert_eq!(answers[0], vec![(1, false), (2, false)]);
    assert_eq!(answers[1], vec![(3, false)]);
    assert_eq!(
        answers[2],
        vec![(3, true)],
        "the key's retry names the first"
    );
    let later: Vec<u64> = answers[3..].iter().map(|a| a[0].0).collect();
    assert_eq!(later, (4..204).collect::<Vec<u64>>(), "in the order asked");
    let delivered = u.wait_for_data(channel, 203);
    let seqs: Vec<u64> = delivered.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..204).collect::<Vec<u64>>());
    assert_eq!(delivered[2].1, b"c");
    assert_eq!(delivered[202].1, b"m199");
}

/// One test per case and broker, named `broker::contract::BROKER::CASE`.
macro_rules! contract {
    (brokers: [$($broker:ident),*], cases: $cases:tt) => {
        $(contract!(@broker $broker $cases);)*
    };
    (@broker $broker:ident [$($case:ident),* $(,)?]) => {
        mod $broker {
            $(
                #[test]
                fn $case() {
                    if let Some(mut under) = super::Under::$broker() {
                        super::$case(&mut under);
                    }
                }
            )*
        }
    };
}

contract!(
    brokers: [memory, redis, redis_cluster],
    cases: [
        seqs_start_at_one_and_go_up_by_one_per_channel,
        a_channels_order_is_kept,
        a_replay_gives_exactly_what_came_after_since,
        a_since_older_than_history_is_told_as_a_gap,
        a_presence_user_is_said_once,
        a_key_seen_before_publishes_nothing_again,
        handed_over_publishes_keep_order_and_keys,
    ]
);

/// Two brokers with prefix `a` and one with `b` on one Redis (or one-node
/// cluster): `a`'s see each other's messages, members and channels, `b` sees
/// none of theirs nor they its, and every key is under one of the prefixes.
fn prefixes_part_deployments_on_one_redis(cluster: bool) {
    let Some(server) = RedisServer::start(cluster) else {
        return;
    };
    let url = server.url(if cluster { "redis-cluster" } else { "redis" });
    let plain_url = server.url("redis");
    // Declared first, dropped last: it holds the Redis.
    let a1 = Under::on(&url, "a", Some(server));
    let mut a2 = Under::on(&url, "a", None);
    let mut b = Under::on(&url, "b", None);
    for u in [&a1, &a2, &b] {
        u.broker
            .subscribe("news", plain(1), None)
            .expect("subscribed");
    }
    b.broker
        .subscribe("b-only", plain(2), None)
        .expect("subscribed");
    assert_eq!(a1.broker.publish("news", text("from a")), Ok(1));
    assert_eq!(
        b.broker.publish("news", text("from b")),
        Ok(1),
        "b's own seq"
    );
    assert_eq!(a2.wait_for_data("news", 1), vec![(1, b"from a".to_vec())]);
    a2.sync("news");
    b.sync("news");
    let payloads =
        |u: &mut Under| -> Vec<Vec<u8>> { u.data("news").into_iter().map(|(_, p)| p).collect() };
    assert_eq!(payloads(&mut a2), [&b"from a"[..], b"marker 1"]);
    assert_eq!(payloads(&mut b), [&b"from b"[..], b"marker 1"]);

    let ann = a1
        .broker
        .subscribe("presence-x", presence_member(3, "ann"), None)
        .expect("ann joins");
    assert_eq!(
        a2.broker.presence_members("presence-x").map(|m| m.len()),
        Ok(1)
    );
    assert_eq!(b.broker.presence_members("presence-x"), Ok(Vec::new()));
    // Member counts are written by each node's keeper, once a second.
    wait_until("a's nodes count each other's subscribers", || {
        a2.broker.channel_info("news").subscribers == 2
    });
    assert_eq!(b.broker.channel_info("news").subscribers, 1);
    let names = |u: &Under| -> Vec<String> {
        let mut found: Vec<String> = u
            .broker
            .occupied("")
            .expect("the channel list")
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        found.sort();
        found
    };
    wait_until("a's channel list has ann's channel", || {
        names(&a2) == ["news", "presence-x"]
    });
    assert_eq!(names(&b), ["b-only", "news"]);

    let mut con = ::redis::Client::open(plain_url)
        .and_then(|c| c.get_connection())
        .expect("a connection to the Redis");
    let nodes = |prefix: &str, con: &mut ::redis::Connection| {
        ::redis::cmd("ZCARD")
            .arg(format!("{prefix}:nodes"))
            .query::<u64>(con)
            .expect("ZCARD")
    };
    assert_eq!((nodes("a", &mut con), nodes("b", &mut con)), (2, 1));
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    assert!(
        keys.iter().any(|k| k.starts_with("a:")) && keys.iter().any(|k| k.starts_with("b:")),
        "{keys:?}"
    );
    let stray: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("a:") && !k.starts_with("b:"))
        .collect();
    assert!(stray.is_empty(), "keys under neither prefix: {stray:?}");
    a1.broker
        .unsubscribe(&ann.channel, presence_member(3, "ann"));
}

mod prefixes {
    #[test]
    fn redis() {
        super::prefixes_part_deployments_on_one_redis(false);
    }

    #[test]
    fn redis_cluster() {
        super::prefixes_part_deployments_on_one_redis(true);
    }
}
