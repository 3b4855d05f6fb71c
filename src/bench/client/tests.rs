//! Unit tests of the client loop's pure parts: the plan's spreading, backoff,
//! close codes, payload and path helpers, and reading and writing Pusher's
//! messages.

use std::net::IpAddr;
use std::time::Duration;

use super::delivery::{leading_number, publish_stamp};
use super::lifecycle::{BACKOFF_CAP, backoff_delay};
use super::plan::{with_query, without_param};
use super::pusher::{Incoming, PONG, code_says_come_back, parse, presence_data, subscribe_message};
use super::websocket::{close_says_come_back, padded};
use super::*;
use crate::bench::SeqFrom;

fn plan(mode: Mode) -> Plan {
    Plan {
        mode,
        ip: IpAddr::from([127, 0, 0, 1]),
        first_port: 9000,
        last_port: 9002,
        host_header: "h".into(),
        tls: None,
        path: "/ws/{channel}?format=json".into(),
        source_ips: vec![IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 3])],
        size: 32,
        connect_timeout: Duration::from_secs(1),
        send_interval: Duration::from_secs(1),
        room_size: 10,
        senders: 0.8,
        channels: 4,
        channel_prefix: "bench-".into(),
        room_prefix: "room-".into(),
        transport: Transport::Ws,
        protocol: Protocol::Throng,
        pusher: None,
        seq_from: SeqFrom::Server,
        reconnect: 0.0,
        reconnect_interval: Duration::from_secs(2),
        comeback_backoff: Duration::from_millis(500),
        comeback_backoff_cap: BACKOFF_CAP,
        conn_offset: 0,
        conns: 100,
        threads: 2,
        rate: 0.0,
        max_opening: 0,
    }
}

#[test]
fn backoff_is_full_jitter_doubling_up_to_the_cap() {
    let base = Duration::from_millis(500);
    let mut rng = 0x1234_5678_9abc_def1;
    for retries in 0..12u8 {
        let ceiling = (base * (1u32 << retries)).min(BACKOFF_CAP);
        let delays: Vec<Duration> = (0..2000)
            .map(|_| backoff_delay(base, BACKOFF_CAP, retries, &mut rng))
            .collect();
        assert!(delays.iter().all(|d| *d < ceiling), "retries {retries}");
        // Spread over the whole window, not bunched: both ends are reached.
        assert!(
            delays.iter().any(|d| *d < ceiling / 10),
            "retries {retries}"
        );
        assert!(
            delays.iter().any(|d| *d > ceiling * 9 / 10),
            "retries {retries}"
        );
    }
    assert!(backoff_delay(base, BACKOFF_CAP, 255, &mut rng) < BACKOFF_CAP);
    assert_eq!(
        backoff_delay(Duration::ZERO, BACKOFF_CAP, 3, &mut rng),
        Duration::ZERO
    );
}

#[test]
fn backoff_stops_doubling_at_the_cap_given() {
    let base = Duration::from_millis(500);
    let cap = Duration::from_secs(2);
    let mut rng = 0x0fed_cba9_8765_4321;
    // 500 ms, 1 s, 2 s, then held at the 2 s cap however many tries failed.
    for (retries, ceiling) in [
        (0u8, 500),
        (1, 1000),
        (2, 2000),
        (3, 2000),
        (9, 2000),
        (255, 2000),
    ] {
        let ceiling = Duration::from_millis(ceiling);
        let delays: Vec<Duration> = (0..2000)
            .map(|_| backoff_delay(base, cap, retries, &mut rng))
            .collect();
        assert!(delays.iter().all(|d| *d < ceiling), "retries {retries}");
        assert!(
            delays.iter().any(|d| *d > ceiling * 9 / 10),
            "retries {retries}: the whole window up to the cap is used"
        );
    }
    // A cap equal to the base: every wait is within the first window.
    assert!((0..200).all(|r| backoff_delay(base, base, r, &mut rng) < base));
}

#[test]
fn close_codes_say_come_back_or_stop_as_the_readme_table_does() {
    for code in [1001, 1006, 1011, 1012, 1013] {
        assert!(close_says_come_back(Some(code), ""), "{code}");
    }
    assert!(close_says_come_back(None, ""));
    assert!(close_says_come_back(Some(1008), "slow consumer"));
    for code in [1000, 1002, 1003, 1007, 1008, 1009, 4001] {
        assert!(!close_says_come_back(Some(code), "other"), "{code}");
    }
}

#[test]
fn connections_spread_over_ports_sources_and_channels() {
    let p = plan(Mode::Push);
    assert_eq!(p.target(0).port(), 9000);
    assert_eq!(p.target(4).port(), 9001);
    assert_eq!(p.source(3), Some(IpAddr::from([127, 0, 0, 3])));
    assert_eq!(p.path_for(5), "/ws/bench-1?format=json");
    let c = plan(Mode::Chat);
    assert_eq!(c.path_for(25), "/ws/chat:room-2?format=json");
}

#[test]
fn sender_fraction_is_exact_per_room() {
    let p = plan(Mode::Chat);
    let senders = (0..100).filter(|&i| p.is_sender(i)).count();
    assert_eq!(senders, 80);
    let first_room = (0..10).filter(|&i| p.is_sender(i)).count();
    assert_eq!(first_room, 8);
}

#[test]
fn payload_helpers() {
    let mut v = Vec::new();
    padded(&mut v, "b1:2:", 8);
    assert_eq!(v, b"b1:2:xxx");
    padded(&mut v, "longer than size", 4);
    assert_eq!(v, b"longer than size");
    assert_eq!(leading_number("123 abc"), Some(123));
    assert_eq!(leading_number("abc"), None);
    assert_eq!(publish_stamp("1700 42 xx"), (Some(1700), Some(42)));
    assert_eq!(publish_stamp("1700"), (Some(1700), None));
    assert_eq!(
        with_query("/p?timeout=30", "since", 5),
        "/p?timeout=30&since=5"
    );
    assert_eq!(with_query("/ws/a", "since", 5), "/ws/a?since=5");
    assert_eq!(without_param("/p?timeout=30&x=1", "timeout"), "/p?x=1");
    assert_eq!(without_param("/p?timeout=30", "timeout"), "/p");
    assert_eq!(without_param("/p", "timeout"), "/p");
    let mut s = 7;
    assert_ne!(next_mask(&mut s), next_mask(&mut s));
}

#[test]
fn pusher_greetings_subscriptions_and_errors_are_read() {
    // As throng and Pusher send them: data is a JSON string holding JSON.
    let hello = br#"{"event":"pusher:connection_established","data":"{\"socket_id\":\"123.456\",\"activity_timeout\":120}"}"#;
    assert_eq!(
        parse(hello),
        Some(Incoming::Established {
            socket_id: "123.456".into()
        })
    );
    // A server that sends data as an object is understood too.
    let hello = br#"{"event":"pusher:connection_established","data":{"socket_id":"1.2"}}"#;
    assert_eq!(
        parse(hello),
        Some(Incoming::Established {
            socket_id: "1.2".into()
        })
    );
    let ok =
        br#"{"event":"pusher_internal:subscription_succeeded","channel":"bench-3","data":"{}"}"#;
    assert_eq!(
        parse(ok),
        Some(Incoming::Subscribed {
            channel: "bench-3".into()
        })
    );
    let refused = br#"{"event":"pusher:subscription_error","channel":"private-a","data":{"type":"AuthError","error":"invalid signature","status":401}}"#;
    assert_eq!(
        parse(refused),
        Some(Incoming::SubscriptionError {
            status: Some(401),
            message: "invalid signature".into()
        })
    );
    let error = br#"{"event":"pusher:error","data":{"message":"App key nope not in this cluster","code":4001}}"#;
    assert_eq!(
        parse(error),
        Some(Incoming::Error {
            code: Some(4001),
            message: "App key nope not in this cluster".into()
        })
    );
    // Numbers in what the server says (socket ids) do not split the report's reasons.
    let refused = br#"{"event":"pusher:subscription_error","data":{"error":"bad auth for 748004923.91:private-b-10","status":401}}"#;
    assert_eq!(
        parse(refused),
        Some(Incoming::SubscriptionError {
            status: Some(401),
            message: "bad auth for N.N:private-b-N".into()
        })
    );
    let error =
        br#"{"event":"pusher:error","data":"{\"message\":\"over capacity\",\"code\":4100}"}"#;
    assert!(matches!(
        parse(error),
        Some(Incoming::Error {
            code: Some(4100),
            ..
        })
    ));
    assert_eq!(
        parse(br#"{"event":"pusher:ping","data":{}}"#),
        Some(Incoming::Ping)
    );
    assert_eq!(
        parse(br#"{"event":"pusher:pong","data":"{}"}"#),
        Some(Incoming::Other)
    );
    for junk in [&b"not json"[..], b"{}", b"[1]", br#"{"event":5}"#, b""] {
        assert_eq!(parse(junk), None, "{}", String::from_utf8_lossy(junk));
    }
    assert!(code_says_come_back(Some(4100)) && code_says_come_back(Some(4299)));
    assert!(!code_says_come_back(Some(4001)) && !code_says_come_back(None));
}

#[test]
fn pusher_events_give_their_data_string_borrowed_when_it_has_no_escapes() {
    let frame = br#"{"event":"bench","channel":"bench-1","data":"1700000000000000000 42 xxxx"}"#;
    let Some(Incoming::Event { channel, data }) = parse(frame) else {
        panic!("not an event");
    };
    assert_eq!(channel, "bench-1");
    assert_eq!(data, "1700000000000000000 42 xxxx");
    assert!(matches!(data, std::borrow::Cow::Borrowed(_)));
    assert_eq!(
        super::delivery::publish_stamp(&data),
        (Some(1_700_000_000_000_000_000), Some(42))
    );
    // Escapes are decoded (and then owned).
    let frame = br#"{"channel":"c","event":"e","data":"a\"b\u00e9"}"#;
    assert!(matches!(
        parse(frame),
        Some(Incoming::Event { data, .. }) if data == "a\"bé"
    ));
    // Data that is not text (an object, a number) is no delivery.
    for frame in [
        &br#"{"event":"e","channel":"c","data":{"a":[1,{"b":2}]}}"#[..],
        br#"{"event":"e","channel":"c","data":5}"#,
        br#"{"event":"e","data":"no channel"}"#,
    ] {
        assert_eq!(parse(frame), Some(Incoming::Other));
    }
}

#[test]
fn pusher_subscriptions_are_written_and_private_ones_signed() {
    let public: serde_json::Value =
        serde_json::from_str(&subscribe_message("bench-0", None, None)).unwrap();
    assert_eq!(
        public,
        serde_json::json!({"event": "pusher:subscribe", "data": {"channel": "bench-0"}})
    );
    let app: crate::pusher::App = "3:278d425bdf160c739803:7ad3773142a6692b25b8"
        .parse()
        .unwrap();
    // Pusher's documented example of a private channel's auth.
    let auth = crate::pusher::sign::channel_auth(&app, "1234.1234", "private-foobar", None);
    let private: serde_json::Value =
        serde_json::from_str(&subscribe_message("private-foobar", Some(&auth), None)).unwrap();
    assert_eq!(
        private["data"]["auth"],
        "278d425bdf160c739803:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
    );
    let data = presence_data(7);
    let auth = crate::pusher::sign::channel_auth(&app, "1.2", "presence-x", Some(&data));
    let presence: serde_json::Value =
        serde_json::from_str(&subscribe_message("presence-x", Some(&auth), Some(&data))).unwrap();
    assert_eq!(presence["data"]["channel_data"], data);
    let member: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(member["user_id"], "u7");
    assert!(
        crate::pusher::sign::check_channel_auth(
            &app,
            "1.2",
            "presence-x",
            Some(&data),
            Some(&auth)
        )
        .is_ok()
    );
    let pong: serde_json::Value = serde_json::from_slice(PONG).unwrap();
    assert_eq!(pong["event"], "pusher:pong");
}

#[test]
fn a_pusher_event_is_matched_to_its_subscribers_channel_by_name() {
    let p = plan(Mode::Push);
    assert_eq!(p.channel_name(5), "bench-1");
    assert!(p.is_channel_of(5, "bench-1"));
    for other in ["bench-2", "bench-", "bench-+1", "bench-1x", "other-1", ""] {
        assert!(!p.is_channel_of(5, other), "{other}");
    }
}
