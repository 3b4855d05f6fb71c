//! A loop's subscribers over real sockets: fan-out slices, long-poll answers,
//! returning subscribers, token expiry and slow consumers.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::*;
use crate::broker::{Broker, MemoryBroker, Outgoing, Resume};
use crate::history::Limits;
use crate::hub::Hub;
use crate::os;
use crate::protocol::DataKind;
use crate::server::conn::Mode;
use crate::transport::Handover;

/// A WebSocket subscriber's session.
pub(super) fn websocket(sub: Subscription) -> Mode {
    Mode::Open(
        Handover::WebSocket {
            accept: [b'a'; 28],
            deflate: None,
        }
        .session(Some(sub)),
    )
}

pub(super) fn text(payload: &str) -> Outgoing<'_> {
    Outgoing {
        payload: payload.as_bytes(),
        kind: DataKind::Text,
        from: None,
        event: None,
        skip: None,
    }
}

/// What the client end of a subscriber's socket has received so far.
pub(super) fn received(client: &mut TcpStream) -> Vec<u8> {
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
pub(super) fn broker(history_size: usize) -> (mio::Poll, Arc<Hub>, MemoryBroker) {
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
pub(super) fn connect(listener: &TcpListener, conns: &mut Slab<Conn>) -> (usize, TcpStream) {
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    let socket = mio::net::TcpStream::from_std(server);
    (
        conns.insert(Conn::new(socket, [127, 0, 0, 1].into(), 0)),
        client,
    )
}

/// `n` real loopback connections, each a WebSocket subscriber of `channel`: their
/// keys in `conns` and their client ends.
pub(super) fn subscribed(
    listener: &TcpListener,
    subscribers: &mut LocalSubscribers,
    broker: &dyn Broker,
    conns: &mut Slab<Conn>,
    n: usize,
    channel: &str,
) -> Vec<(usize, TcpStream)> {
    (0..n)
        .map(|_| {
            let (key, client) = connect(listener, conns);
            ws_subscribe(subscribers, broker, conns, key, channel, None);
            (key, client)
        })
        .collect()
}

/// Reads exactly `want.len()` bytes (waiting up to a second for them), then
/// checks nothing more is there.
pub(super) fn assert_got(client: &mut TcpStream, want: &[u8], who: &str) {
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

pub(super) fn ws_subscribe(
    subscribers: &mut LocalSubscribers,
    broker: &dyn Broker,
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
        presence: None,
    };
    let joined = subscribers
        .join(broker, &Namespaces::default(), key, &subscribe, key as u32)
        .unwrap();
    conns[key].mode = websocket(joined.sub);
    joined.replay
}

/// A deadline no test reaches: slices end by their count only.
pub(super) fn far() -> Duration {
    os::thread_cpu_time() + Duration::from_secs(3600)
}

/// One `deliver` call with room for a whole slice: what a loop does in one turn.
pub(super) fn deliver_once(
    subscribers: &mut LocalSubscribers,
    hub: &Hub,
    conns: &mut Slab<Conn>,
    counts: &mut TurnCounts,
    failed: &mut Vec<Follow>,
) {
    deliver_once_within(subscribers, hub, conns, 1 << 20, counts, failed);
}

/// [`deliver_once`] with `max_queue` bytes allowed behind each socket.
fn deliver_once_within(
    subscribers: &mut LocalSubscribers,
    hub: &Hub,
    conns: &mut Slab<Conn>,
    max_queue: usize,
    counts: &mut TurnCounts,
    failed: &mut Vec<Follow>,
) {
    subscribers.deliver(
        hub.inbox(0),
        conns,
        &mut TlsConns::default(),
        max_queue,
        counts,
        failed,
        far(),
    );
}

/// Every one of `clients` has read exactly `want`.
pub(super) fn assert_all_got(clients: &mut [(usize, TcpStream)], want: &[u8]) {
    for (key, client) in clients {
        assert_got(client, want, &format!("subscriber {key}"));
    }
}

/// Delivers until nothing waits in `inbox` and no fan-out is part done, each
/// call with the deadline `deadline()` gives.
pub(super) fn deliver_all(
    subscribers: &mut LocalSubscribers,
    inbox: &Inbox,
    conns: &mut Slab<Conn>,
    max_queue: usize,
    counts: &mut TurnCounts,
    failed: &mut Vec<Follow>,
    deadline: fn() -> Duration,
) {
    while subscribers.has_pending() || inbox.has_work() {
        subscribers.deliver(
            inbox,
            conns,
            &mut TlsConns::default(),
            max_queue,
            counts,
            failed,
            deadline(),
        );
    }
}

#[test]
fn a_fan_out_whose_deadline_passed_writes_a_few_and_keeps_its_place() {
    let (_poll, hub, broker) = broker(10);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    // Fewer than a slice's count: only the deadline cuts it.
    let n: usize = 100;
    let mut clients = subscribed(&listener, &mut subscribers, &broker, &mut conns, n, "timed");
    broker.publish("timed", text("m1")).unwrap();
    let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
    let mut calls = 0;
    loop {
        subscribers.deliver(
            hub.inbox(0),
            &mut conns,
            &mut TlsConns::default(),
            1 << 20,
            &mut counts,
            &mut failed,
            os::thread_cpu_time(),
        );
        calls += 1;
        if calls == 1 {
            // Past its deadline from the start: the first look at the clock
            // (after DEADLINE_CHECK_EVERY subscribers) ends the slice.
            assert_eq!(counts.delivered, DEADLINE_CHECK_EVERY as u64);
            assert!(subscribers.has_pending());
            assert_eq!(counts.latency.count(), 0);
        }
        if !subscribers.has_pending() {
            break;
        }
        // A message published meanwhile waits for the cut fan-out to finish.
        if calls == 2 {
            broker.publish("timed", text("m2")).unwrap();
        }
    }
    deliver_all(
        &mut subscribers,
        hub.inbox(0),
        &mut conns,
        1 << 20,
        &mut counts,
        &mut failed,
        os::thread_cpu_time,
    );
    assert_eq!(calls, n.div_ceil(DEADLINE_CHECK_EVERY));
    assert!(failed.is_empty(), "{failed:?}");
    assert_all_got(&mut clients, b"\x81\x02m1\x81\x02m2");
    assert_eq!(counts.delivered, 2 * n as u64);
    assert_eq!(counts.latency.count(), 2);
}

#[test]
fn a_fan_out_deadline_is_spent_by_work_not_by_waiting() {
    // On a crowded box a loop is preempted for most of a turn's wall time; its
    // fan-out budget is CPU time, so time spent waiting for a core (here: asleep)
    // leaves the budget whole and the slice ends by its count.
    let (_poll, hub, broker) = broker(10);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    let n: usize = 100;
    let mut clients = subscribed(
        &listener,
        &mut subscribers,
        &broker,
        &mut conns,
        n,
        "waited",
    );
    broker.publish("waited", text("m1")).unwrap();
    let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
    let deadline = os::thread_cpu_time() + Duration::from_millis(20);
    std::thread::sleep(Duration::from_millis(50));
    subscribers.deliver(
        hub.inbox(0),
        &mut conns,
        &mut TlsConns::default(),
        1 << 20,
        &mut counts,
        &mut failed,
        deadline,
    );
    assert_eq!(
        counts.delivered, n as u64,
        "the slice was cut by time spent asleep"
    );
    assert!(!subscribers.has_pending());
    assert_all_got(&mut clients, b"\x81\x02m1");
}

#[test]
fn a_fan_out_larger_than_a_turn_goes_on_over_turns_exactly_once() {
    let (_poll, hub, broker) = broker(10);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    let n = FAN_OUT_SLICE + FAN_OUT_SLICE / 2;
    let mut clients = subscribed(&listener, &mut subscribers, &broker, &mut conns, n, "big");
    broker.publish("big", text("m1")).unwrap();
    broker.publish("big", text("m2")).unwrap();
    let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
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
    deliver_all(
        &mut subscribers,
        hub.inbox(0),
        &mut conns,
        1 << 20,
        &mut counts,
        &mut failed,
        far,
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert_all_got(&mut clients, b"\x81\x02m1\x81\x02m2\x81\x02m3");
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
        format: Format::ALL.into_iter().find(|f| f.one_shot()).unwrap(),
        resume: None,
        name: None,
        expires: None,
        presence: None,
    };
    let sub = subscribers
        .join(&broker, &Namespaces::default(), key, &subscribe, 1)
        .unwrap()
        .sub;
    let poll = Handover::Poll {
        timeout: std::time::Duration::from_secs(30),
    };
    conns[key].mode = Mode::Open(poll.session(Some(sub)));
    // More than one fan-out group's worth, all in one inbox batch.
    for i in 0..(MAX_FRAMES_PER_WRITE + 10) {
        broker.publish("p", text(&format!("m{i}"))).unwrap();
    }
    let mut counts = TurnCounts::default();
    let mut follow = Vec::new();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut follow);
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
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    broker.publish("c", text("two")).unwrap();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(failed.is_empty());
    assert_eq!(received(&mut clients[0]), b"\x81\x03one\x81\x03two");
    assert_eq!(received(&mut clients[1]), b"\x81\x03two");
}

#[test]
fn a_quiet_channels_returning_subscriber_keeps_no_filter_once_the_inbox_is_taken() {
    use crate::broker::Broker;
    let (_poll, hub, broker) = broker(10);
    assert!(broker.delivers_before_subscribe_returns());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0);
    let (key, mut client) = connect(&listener, &mut conns);
    let resume = Some(Resume {
        since: 0,
        epoch: None,
    });
    ws_subscribe(&mut subscribers, &broker, &mut conns, key, "q", resume);
    assert!(
        subscribers.has_fresh(),
        "a returning subscriber is filtered until the inbox is taken"
    );
    // Nothing was published: taking the (empty) inbox is enough to drop the filter.
    let mut counts = TurnCounts::default();
    let mut failed = Vec::new();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(!subscribers.has_fresh());
    // And what comes next is delivered once.
    broker.publish("q", text("after")).unwrap();
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(failed.is_empty());
    assert_eq!(received(&mut client), b"\x81\x05after");
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
            presence: None,
        };
        let sub = subscribers
            .join(&broker, &Namespaces::default(), key, &subscribe, key as u32)
            .unwrap()
            .sub;
        conns[key].mode = websocket(sub);
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
        presence: None,
    };
    let sub = subscribers
        .join(&broker, &Namespaces::default(), key, &subscribe, 1)
        .unwrap()
        .sub;
    let conn = &mut conns[key];
    conn.mode = websocket(sub);
    // A catch-up far larger than the queue limit and than the socket's buffers.
    let max_queue = 4096;
    let replay = vec![b'r'; 16 << 20];
    conn.send_catch_up(&replay, replay.len(), None, None, &mut 0)
        .unwrap();
    assert!(conn.out.queued_bytes() > max_queue);
    let (mut counts, mut follow) = (TurnCounts::default(), Vec::new());
    broker.publish("big", text(&"a".repeat(3000))).unwrap();
    deliver_once_within(
        &mut subscribers,
        &hub,
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
    deliver_once_within(
        &mut subscribers,
        &hub,
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

#[test]
fn compressed_subscribers_share_one_frame_per_window_and_plain_ones_get_it_plain() {
    let (_poll, hub, broker) = broker(10);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns: Slab<Conn> = Slab::new();
    let mut subscribers = LocalSubscribers::new(0).compressing(Compression {
        min_size: 64,
        level: 6,
    });
    // Two with a 15-bit window, one with a 10-bit one, one without compression.
    let mut clients = Vec::new();
    for window in [15u8, 15, 10, 0] {
        let (key, client) = connect(&listener, &mut conns);
        ws_subscribe(&mut subscribers, &broker, &mut conns, key, "z", None);
        conns[key].deflate = window;
        clients.push(client);
    }
    let long = "{\"symbol\":\"EURUSD\",\"bid\":1.0842,\"ask\":1.0843}".repeat(20);
    broker.publish("z", text(&long)).unwrap();
    broker.publish("z", text("short")).unwrap();
    let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
    deliver_once(&mut subscribers, &hub, &mut conns, &mut counts, &mut failed);
    assert!(failed.is_empty());
    let got: Vec<Vec<u8>> = clients.iter_mut().map(received).collect();
    let short_frame = [0x81, 5, b's', b'h', b'o', b'r', b't'];
    for (i, bytes) in got.iter().enumerate() {
        assert!(
            bytes.ends_with(&short_frame),
            "subscriber {i}: the short one is plain"
        );
        let first = &bytes[..bytes.len() - short_frame.len()];
        if i == 3 {
            assert_eq!(first[0], 0x81, "no compression negotiated: plain");
            assert!(first.ends_with(long.as_bytes()));
            continue;
        }
        assert_eq!(first[0], 0xC1, "subscriber {i}: RSV1 set");
        let len = usize::from(first[1] & 0x7F);
        assert_eq!(first.len(), 2 + len);
        let mut inflated = Vec::new();
        crate::protocol::deflate::inflate(&first[2..], 1 << 20, &mut inflated).unwrap();
        assert_eq!(inflated, long.as_bytes());
    }
    assert_eq!(got[0], got[1], "the same window, the same bytes");
    // Three compressed deliveries counted, at their plain and wire sizes.
    let wire = (got[0].len() + got[1].len() + got[2].len() - 3 * short_frame.len()) as u64;
    assert_eq!(counts.deflate_wire, wire);
    assert_eq!(counts.deflate_plain, 3 * (4 + long.len() as u64));
}
