//! The filters of just-joined subscribers with a broker whose deliveries come
//! later (as Redis's listener's do), over real sockets: a returning subscriber's
//! late live copies, a chat member's events from before its own join.

use std::net::TcpListener;
use std::sync::Arc;

use slab::Slab;

use crate::broker::{Broker, BrokerError, MemoryBroker, Outgoing, Replay, Resume};
use crate::hub::{Audience, Body, Hub};
use crate::protocol::DataKind;
use crate::rules::Namespaces;
use crate::server::conn::Conn;
use crate::server::subscribers::LocalSubscribers;
use crate::server::subscribers::tests::{
    broker, connect, deliver_once, received, text, websocket, ws_subscribe,
};
use crate::stats::TurnCounts;
use crate::transport::{Format, Subscribe};

/// A memory broker that says its deliveries come later, through another
/// thread (as Redis's listener does), so returning subscribers keep their
/// filters until a newer message comes. Given the hub, it also delivers a
/// member's join announcement as that listener may: after a join announced
/// elsewhere just before, still on its way when the member subscribed.
#[derive(Debug)]
struct LaterBroker(MemoryBroker, Option<Arc<Hub>>);

impl LaterBroker {
    fn lagging_join(
        &self,
        hub: &Hub,
        channel: &str,
        member: crate::broker::Member<'_>,
        name: &str,
    ) -> Result<crate::broker::Subscribed, BrokerError> {
        let conn = member.conn;
        let quiet = crate::broker::Member {
            announce: None,
            ..member
        };
        let joined = self.0.subscribe(channel, quiet, None)?;
        let count = joined.count + 1;
        let join = |client: &str, count: u64| Body::Event {
            event: "join",
            client: client.into(),
            count,
        };
        let earlier = hub.deliver(&joined.channel, Audience::Listeners, None, || {
            join("earlier", count - 1)
        });
        let own = hub.deliver(&joined.channel, Audience::Listeners, Some(conn), || {
            join(name, count)
        });
        assert!(earlier.unwrap() && own.unwrap());
        Ok(crate::broker::Subscribed { count, ..joined })
    }
}

impl Broker for LaterBroker {
    fn publish(&self, channel: &str, message: Outgoing<'_>) -> Result<u64, BrokerError> {
        self.0.publish(channel, message)
    }
    fn publish_once(
        &self,
        channel: &str,
        message: Outgoing<'_>,
        key: &str,
    ) -> Result<crate::broker::idempotency::Published, BrokerError> {
        self.0.publish_once(channel, message, key)
    }
    fn subscribe(
        &self,
        channel: &str,
        member: crate::broker::Member<'_>,
        resume: Option<Resume>,
    ) -> Result<crate::broker::Subscribed, BrokerError> {
        match (&self.1, member.announce) {
            (Some(hub), Some(name)) => self.lagging_join(hub, channel, member, name),
            _ => self.0.subscribe(channel, member, resume),
        }
    }
    fn unsubscribe(&self, channel: &Arc<crate::hub::Channel>, member: crate::broker::Member<'_>) {
        self.0.unsubscribe(channel, member)
    }
    fn history(&self, channel: &str, since: u64) -> Result<Replay, BrokerError> {
        self.0.history(channel, since)
    }
    fn channel_info(&self, channel: &str) -> crate::broker::ChannelInfo {
        self.0.channel_info(channel)
    }
    fn presence_members(&self, channel: &str) -> Result<crate::broker::Members, BrokerError> {
        self.0.presence_members(channel)
    }
    fn close_subscribers(&self, channel: &str) -> Result<(), BrokerError> {
        self.0.close_subscribers(channel)
    }
    fn occupied(&self, prefix: &str) -> Result<Vec<(String, u64)>, BrokerError> {
        self.0.occupied(prefix)
    }
    fn channel_count(&self) -> usize {
        self.0.channel_count()
    }
    fn maintain(&self) {}
    fn set_watch(&self, watch: Arc<dyn crate::broker::ChannelWatch>) {
        self.0.set_watch(watch)
    }
    fn describe(&self) -> String {
        "later".into()
    }
    fn healthy(&self) -> bool {
        true
    }
}

#[test]
fn a_live_copy_of_a_replayed_message_that_comes_late_is_still_filtered() {
    let (_poll, hub, memory) = broker(10);
    let broker = LaterBroker(memory, None);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    broker.publish("c", text("one")).unwrap();
    let (key, mut client) = connect(&listener, &mut conns);
    let resume = Some(Resume {
        since: 0,
        epoch: None,
    });
    let replay = ws_subscribe(&mut subscribers, &broker, &mut conns, key, "c", resume);
    assert_eq!(replay.unwrap().last_seq, 1);
    let mut counts = TurnCounts::default();
    let mut failed = Vec::new();
    // The inbox is taken once with nothing in it ...
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(subscribers.has_fresh(), "kept until a newer message comes");
    // ... and then the live copy of seq 1 arrives, as Redis's listener may
    // deliver a message published between the count and the history snapshot.
    let channel = hub.find("c").unwrap();
    hub.deliver(&channel, crate::hub::Audience::Everyone, None, || {
        Body::Data {
            seq: 1,
            epoch: 0,
            payload: bytes::Bytes::from_static(b"one"),
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        }
    })
    .unwrap();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    broker.publish("c", text("two")).unwrap();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(failed.is_empty());
    assert_eq!(
        received(&mut client),
        b"\x81\x03two",
        "seq 1 came from history only"
    );
    assert!(!subscribers.has_fresh(), "a newer message ends the filter");
}

#[test]
fn a_chat_member_gets_no_event_announced_before_its_own_join_when_deliveries_come_later() {
    let (_poll, hub, memory) = broker(10);
    let broker = LaterBroker(memory, Some(Arc::clone(&hub)));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    let (key, mut client) = connect(&listener, &mut conns);
    let subscribe = Subscribe {
        channel: "chat:room".into(),
        format: Format::WsJson,
        resume: None,
        name: Some("ann".into()),
        expires: None,
        presence: None,
    };
    let joined = subscribers
        .join(&broker, &Namespaces::default(), key, &subscribe, key as u32)
        .unwrap();
    assert_eq!(joined.count, 2, "welcomed with the count after its join");
    conns[key].mode = websocket(joined.sub);
    let mut counts = TurnCounts::default();
    let mut failed = Vec::new();
    // The earlier join and its own announcement wait in the inbox, in that
    // order; a leave announced after its own join follows.
    let channel = hub.find("chat:room").unwrap();
    let leave = hub.deliver(&channel, Audience::Listeners, None, || Body::Event {
        event: "leave",
        client: "earlier".into(),
        count: 1,
    });
    assert!(leave.unwrap());
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(failed.is_empty());
    let got = received(&mut client);
    let text = String::from_utf8_lossy(&got);
    assert!(
        !text.contains("join"),
        "an event older than its welcome: {text}"
    );
    assert!(
        text.contains(r#""event":"leave""#) && text.contains(r#""count":1"#),
        "what came after its own join: {text}"
    );
    assert!(
        subscribers.joiners.is_empty(),
        "its own announcement ends the wait"
    );
}
