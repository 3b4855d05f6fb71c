//! The memory broker's behaviour: seqs, announcements, history and its budget,
//! presence.

use super::*;
use crate::broker::{Gap, GapReason};
use crate::hub::Delivery;
use crate::hub::SocketId;
use crate::protocol::DataKind;

fn broker(loops: usize, history_size: usize) -> (MemoryBroker, Arc<Hub>, Vec<mio::Poll>) {
    let limits = Limits {
        size: history_size,
        ttl: Duration::from_secs(300),
    };
    let polls: Vec<mio::Poll> = (0..loops).map(|_| mio::Poll::new().unwrap()).collect();
    let wakers = polls
        .iter()
        .map(|p| Arc::new(mio::Waker::new(p.registry(), mio::Token(0)).unwrap()))
        .collect();
    let hub = Arc::new(Hub::new(wakers));
    let broker = MemoryBroker::new(Arc::clone(&hub), limits, Namespaces::default());
    (broker, hub, polls)
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

fn member(key: usize, announce: Option<&str>) -> Member<'_> {
    Member {
        conn: ConnRef { loop_index: 0, key },
        listens: true,
        announce,
        presence: None,
    }
}

fn taken(hub: &Hub) -> Vec<Delivery> {
    let mut batch = Vec::new();
    hub.inbox(0).take(&mut batch);
    batch
}

#[test]
fn seq_counts_up_per_channel_with_or_without_subscribers() {
    let (broker, hub, _polls) = broker(1, 0);
    assert_eq!(broker.publish("a", text("x")), Ok(1));
    broker.subscribe("a", member(1, None), None).unwrap();
    assert_eq!(broker.publish("a", text("y")), Ok(2));
    assert_eq!(broker.publish("b", text("z")), Ok(1));
    let batch = taken(&hub);
    assert_eq!(batch.len(), 1);
    assert!(matches!(batch[0].body, Body::Data { seq: 2, .. }));
    let info = broker.channel_info("a");
    assert_eq!((info.subscribers, info.last_seq), (1, 2));
    assert_eq!(broker.channel_count(), 2);
}

#[test]
fn members_are_announced_to_others_on_joining_and_leaving() {
    let (broker, hub, _polls) = broker(1, 0);
    broker
        .subscribe("chat:r", member(1, Some("c1")), None)
        .unwrap();
    let second = broker
        .subscribe("chat:r", member(2, Some("c2")), None)
        .unwrap();
    assert_eq!(second.count, 2);
    broker.unsubscribe(&second.channel, member(2, Some("c2")));
    let batch = taken(&hub);
    let events: Vec<(&str, &str, u64, Option<ConnRef>)> = batch
        .iter()
        .filter_map(|m| match &m.body {
            Body::Event {
                event,
                client,
                count,
            } => Some((*event, &**client, *count, m.exclude)),
            Body::Data { .. } | Body::Presence { .. } | Body::CloseAll | Body::NewEpoch { .. } => {
                None
            }
        })
        .collect();
    assert_eq!(
        events,
        vec![
            ("join", "c1", 1, Some(member(1, None).conn)),
            ("join", "c2", 2, Some(member(2, None).conn)),
            ("leave", "c2", 1, None),
        ]
    );
}

#[test]
fn history_keeps_the_last_messages_after_a_seq() {
    let (broker, _hub, _polls) = broker(1, 3);
    for word in ["a", "b", "c", "d", "e"] {
        broker.publish("h", text(word)).unwrap();
    }
    let replay = broker.history("h", 3).unwrap();
    let seqs: Vec<u64> = replay.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![4, 5]);
    assert_eq!((replay.last_seq, replay.oldest), (5, 3));
    assert_eq!(replay.messages[0].payload, bytes::Bytes::from_static(b"d"));
    // Up to seq 1 seen: seq 2 is gone, which the reader can tell.
    assert!(broker.history("h", 1).unwrap().oldest > 2);
    assert_eq!(broker.channel_info("h").history_len, 3);
    let none = broker.history("never", 0).unwrap();
    assert!(none.messages.is_empty() && none.oldest == 1);
}

#[test]
fn history_keeps_who_sent_a_chat_message() {
    let (broker, _hub, _polls) = broker(1, 10);
    let said = Outgoing {
        payload: b"hi",
        kind: DataKind::Text,
        from: Some("c42"),
        event: None,
        skip: None,
    };
    broker.publish("chat:r", said).unwrap();
    broker.publish("chat:r", text("pushed")).unwrap();
    let replay = broker.history("chat:r", 0).unwrap();
    let from: Vec<Option<&str>> = replay.messages.iter().map(|m| m.from.as_deref()).collect();
    assert_eq!(from, vec![Some("c42"), None]);
}

#[test]
fn a_returning_subscriber_gets_what_it_missed_or_is_told_of_the_gap() {
    let (broker, _hub, _polls) = broker(1, 3);
    for word in ["a", "b", "c", "d", "e"] {
        broker.publish("r", text(word)).unwrap();
    }
    let resume = |since, epoch| Some(Resume { since, epoch });
    let seqs = |s: &Subscribed| -> Vec<u64> {
        s.replay
            .as_ref()
            .unwrap()
            .messages
            .iter()
            .map(|m| m.seq)
            .collect()
    };
    let joined = broker
        .subscribe("r", member(1, None), resume(3, None))
        .unwrap();
    let replay = joined.replay.clone().unwrap();
    let epoch = replay.epoch;
    let (given, gap) = replay.for_resume(Resume {
        since: 3,
        epoch: Some(epoch),
    });
    assert_eq!(
        given.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(gap, None);
    assert_eq!(seqs(&joined), vec![3, 4, 5]);
    // seq 2 fell out of history (size 3 keeps 3..=5).
    let (given, gap) = joined.replay.clone().unwrap().for_resume(Resume {
        since: 1,
        epoch: None,
    });
    assert_eq!(given.messages.len(), 3);
    assert_eq!(
        gap,
        Some(Gap {
            from: 2,
            to: 2,
            reason: GapReason::TooOld
        })
    );
    // Another epoch, or a seq this epoch never reached: everything kept, and the gap.
    for (since, epoch) in [(3, Some(epoch ^ 1)), (9, None)] {
        let (given, gap) = joined
            .replay
            .clone()
            .unwrap()
            .for_resume(Resume { since, epoch });
        assert_eq!(given.messages.len(), 3);
        assert_eq!(
            gap,
            Some(Gap {
                from: 1,
                to: 2,
                reason: GapReason::NewEpoch
            })
        );
    }
}

#[test]
fn a_forgotten_channel_comes_back_in_a_new_epoch() {
    let (broker, _hub, _polls) = broker(1, 10);
    broker.publish("e", text("x")).unwrap();
    let first = broker.history("e", 0).unwrap();
    assert_eq!(first.messages.len(), 1);
    assert_eq!(broker.channel_info("e").epoch, Some(first.epoch));
    assert_eq!(broker.sweep(Duration::ZERO), 1);
    assert_eq!(broker.channel_info("e").epoch, None);
    assert_eq!(broker.publish("e", text("y")), Ok(1));
    let second = broker.history("e", 0).unwrap();
    assert_ne!(first.epoch, second.epoch);
    assert_eq!(second.messages[0].payload, bytes::Bytes::from_static(b"y"));
}

#[test]
fn unused_channels_are_forgotten_and_their_seq_starts_again() {
    let (broker, _hub, _polls) = broker(1, 0);
    let kept = broker.subscribe("kept", member(1, None), None).unwrap();
    broker.publish("idle", text("x")).unwrap();
    assert_eq!(broker.sweep(Duration::ZERO), 1);
    assert_eq!(broker.channel_info("kept").subscribers, 1);
    assert_eq!(broker.publish("idle", text("x")), Ok(1));
    broker.unsubscribe(&kept.channel, member(1, None));
    assert_eq!(broker.sweep(Duration::from_secs(60)), 0);
}

fn presence_member(key: usize, user_id: &str) -> Member<'_> {
    Member {
        presence: Some(PresenceMember {
            user_id,
            user_info: r#"{"n":1}"#,
            socket: SocketId::local(key as u32),
            limit: 2,
        }),
        ..member(key, None)
    }
}

/// A presence event as taken from the inbox.
type Presence = (PresenceChange, String, Option<String>, Option<SocketId>);

/// The presence events taken from the inbox.
fn presence_events(hub: &Hub) -> Vec<Presence> {
    taken(hub)
        .iter()
        .filter_map(|m| match &m.body {
            Body::Presence {
                change,
                user_id,
                user_info,
                skip,
            } => Some((
                *change,
                user_id.to_string(),
                user_info.as_deref().map(str::to_string),
                *skip,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn presence_users_come_with_their_first_connection_and_go_with_their_last() {
    let (broker, hub, _polls) = broker(1, 0);
    let ann1 = broker
        .subscribe("p", presence_member(1, "ann"), None)
        .unwrap();
    assert_eq!(
        ann1.members,
        Some(vec![("ann".to_string(), r#"{"n":1}"#.to_string())])
    );
    assert_eq!(
        presence_events(&hub),
        vec![(
            PresenceChange::Joined,
            "ann".to_string(),
            Some(r#"{"n":1}"#.to_string()),
            Some(SocketId::local(1))
        )]
    );
    let ann2 = broker
        .subscribe("p", presence_member(2, "ann"), None)
        .unwrap();
    assert_eq!(ann2.members.map(|m| m.len()), Some(1));
    broker
        .subscribe("p", presence_member(3, "ben"), None)
        .unwrap();
    assert_eq!(presence_events(&hub).len(), 1, "ben only");
    assert_eq!(
        broker
            .subscribe("p", presence_member(4, "cat"), None)
            .unwrap_err(),
        BrokerError::PresenceFull(2)
    );
    assert_eq!(broker.channel_info("p").subscribers, 3, "cat not counted");
    broker.unsubscribe(&ann1.channel, presence_member(1, "ann"));
    assert!(
        presence_events(&hub).is_empty(),
        "ann still has a connection"
    );
    broker.unsubscribe(&ann1.channel, presence_member(2, "ann"));
    assert_eq!(
        presence_events(&hub),
        vec![(PresenceChange::Left, "ann".to_string(), None, None)]
    );
    assert_eq!(broker.presence_members("p").unwrap().len(), 1);
}

#[test]
fn channels_over_the_history_budget_lose_their_oldest_and_say_so() {
    let (broker, _hub, _polls) = broker(1, 100);
    let broker = broker.with_history_budget(10_000);
    let big = "x".repeat(992);
    // One channel fills the budget and trims itself as it grows past it.
    for _ in 0..20 {
        broker.publish("big", text(&big)).unwrap();
    }
    assert!(broker.history_held() <= 10_000, "{}", broker.history_held());
    let replay = broker.history("big", 0).unwrap();
    assert_eq!((replay.last_seq, replay.oldest), (20, 11));
    let (given, gap) = replay.for_resume(Resume {
        since: 0,
        epoch: Some(replay_epoch(&broker, "big")),
    });
    assert_eq!(given.messages.first().map(|m| m.seq), Some(11));
    assert_eq!(
        gap,
        Some(Gap {
            from: 1,
            to: 10,
            reason: GapReason::TooOld
        })
    );
    // Another channel pushes past the full budget: it pays, and keeps nothing
    // (what it missed is told as a gap) until the housekeeping cuts the largest
    // ("big") so that all fits in 7/8 of the budget.
    for _ in 0..4 {
        broker.publish("small", text(&big)).unwrap();
    }
    let small = broker.history("small", 0).unwrap();
    assert_eq!((small.messages.len(), small.oldest), (0, 5));
    assert_eq!(broker.history_held(), 10_000);
    broker.maintain();
    assert!(broker.history_held() <= 8_750, "{}", broker.history_held());
    let big_left = broker.history("big", 0).unwrap();
    assert_eq!((big_left.oldest, big_left.last_seq), (13, 20));
    for _ in 0..2 {
        broker.publish("small", text(&big)).unwrap();
    }
    let small = broker.history("small", 0).unwrap();
    assert_eq!((small.messages.len(), small.oldest), (2, 5));
    assert_eq!(broker.history_bytes(), Some(broker.history_held() as u64));
}

fn replay_epoch(broker: &MemoryBroker, channel: &str) -> u64 {
    broker.history(channel, 0).unwrap().epoch
}
