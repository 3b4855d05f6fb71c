//! Unit tests of the client loop's pure parts: the plan's spreading, backoff,
//! close codes, payload and path helpers.

use std::net::IpAddr;
use std::time::Duration;

use super::delivery::{leading_number, publish_stamp};
use super::lifecycle::{BACKOFF_CAP, backoff_delay};
use super::plan::{with_query, without_param};
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
        seq_from: SeqFrom::Server,
        reconnect: 0.0,
        reconnect_interval: Duration::from_secs(2),
        comeback_backoff: Duration::from_millis(500),
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
            .map(|_| backoff_delay(base, retries, &mut rng))
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
    assert!(backoff_delay(base, 255, &mut rng) < BACKOFF_CAP);
    assert_eq!(backoff_delay(Duration::ZERO, 3, &mut rng), Duration::ZERO);
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
