//! Unit tests of `throng bench`'s flags, their validation, children's arguments
//! and the status line.

use std::time::Duration;

use clap::Parser;

use super::driver::status_line;
use super::report::Counters;
use super::setup::split_conns;
use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
}

#[test]
fn status_lines_show_the_interval_average_latency() {
    let last = Counters {
        latency_samples: 10,
        latency_us_sum: 10_000,
        ..Counters::default()
    };
    let now = Counters {
        messages_in: 30,
        latency_samples: 30,
        latency_us_sum: 70_000,
        ..Counters::default()
    };
    let line = status_line(&now, &last, (12, 2), 1.0, 5.0);
    assert!(line.contains("latency avg 3.000 ms"), "{line}");
    assert!(line.contains("sent 12 (10/s)"), "{line}");
    assert!(!status_line(&last, &last, (0, 0), 1.0, 5.0).contains("latency"));
}

#[test]
fn defaults_and_flags() {
    let a = parse(&["echo"]).unwrap();
    assert_eq!(a.mode, Mode::Echo);
    assert_eq!(a.conns, 100);
    assert_eq!(a.size(), 32);
    assert_eq!(a.duration, Duration::from_secs(10));
    let a = parse(&[
        "chat",
        "--url",
        "ws://h:9/x",
        "--ports",
        "9000-9003",
        "--size",
        "2KiB",
        "--source-ips",
        "127.0.0.2-127.0.0.4,10.0.0.1",
        "--senders",
        "0.5",
    ])
    .unwrap();
    assert_eq!(a.size(), 2048);
    assert_eq!(a.ports, Some(PortRange(9000, 9003)));
    assert_eq!(a.source_ips.as_ref().map(|s| s.0.len()), Some(4));
    assert_eq!(parse(&["chat"]).unwrap().size(), 1024);
}

#[test]
fn bad_flags_are_errors_not_panics() {
    assert!(parse(&["flood"]).is_err());
    assert!(parse(&["echo", "--ports", "9-3"]).is_err());
    assert!(parse(&["echo", "--ports", "x"]).is_err());
    assert!(parse(&["echo", "--duration", "ten"]).is_err());
    assert!(parse(&["echo", "--source-ips", "127.0.0.9-127.0.0.1"]).is_err());
    assert!(parse(&["echo", "--source-ips", "nope"]).is_err());
    let bad =
        |args: &[&str]| matches!(parse(args).unwrap().validate(), Err(BenchError::BadArgs(_)));
    assert!(bad(&["echo", "--conns", "0"]));
    assert!(bad(&["echo", "--url", "http://x"]));
    assert!(bad(&["echo", "--url", "https://x"]));
    assert!(bad(&["echo", "--url", "ftp://x"]));
    assert!(bad(&["echo", "--rate=-1"]));
    assert!(bad(&["echo", "--conns", "2", "--procs", "3"]));
    assert!(bad(&["chat", "--senders", "1.5"]));
    assert!(bad(&["push", "--publish-rate", "0"]));
    assert!(bad(&["echo", "--conns", "100000000"]));
    assert!(parse(&["echo"]).unwrap().validate().is_ok());
}

#[test]
fn backoff_cap_defaults_to_the_constant_and_is_at_least_the_base() {
    let a = parse(&["push"]).unwrap();
    assert_eq!(a.backoff_cap, crate::bench::client::BACKOFF_CAP);
    let a = parse(&["push", "--backoff", "500ms", "--backoff-cap", "2s"]).unwrap();
    assert!(a.validate().is_ok());
    let plan = a.plan(&WsUrl::parse(&a.url).unwrap()).unwrap();
    assert_eq!(plan.comeback_backoff_cap, Duration::from_secs(2));
    // Equal is fine: every wait is then within the first window.
    let a = parse(&["push", "--backoff", "2s", "--backoff-cap", "2s"]).unwrap();
    assert!(a.validate().is_ok());
    let a = parse(&["push", "--backoff", "2s", "--backoff-cap", "1s"]).unwrap();
    match a.validate() {
        Err(BenchError::BadArgs(m)) => {
            assert!(
                m.contains("--backoff-cap 1s must be at least --backoff 2s"),
                "{m}"
            )
        }
        other => panic!("a cap below the base must be refused, got {other:?}"),
    }
    // Without come-backs (--backoff 0) there is nothing to cap.
    let a = parse(&["push", "--backoff", "0", "--backoff-cap", "1s"]).unwrap();
    assert!(a.validate().is_ok());
    assert!(parse(&["push", "--backoff-cap", "soon"]).is_err());
}

#[test]
fn urls() {
    let u = WsUrl::parse("ws://127.0.0.1:9000/echo?x=1").unwrap();
    assert_eq!(
        (u.host.as_str(), u.port, u.path.as_str()),
        ("127.0.0.1", 9000, "/echo?x=1")
    );
    let u = WsUrl::parse("ws://example.com").unwrap();
    assert_eq!(
        (u.port, u.path.as_str(), u.authority.as_str()),
        (80, "/", "example.com")
    );
    let u = WsUrl::parse("ws://h:1?q").unwrap();
    assert_eq!(u.path, "/?q");
    assert!(WsUrl::parse("ws://h:99999/").is_err());
}

#[test]
fn procs_split_connections_and_children_get_their_share() {
    assert_eq!(split_conns(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
    let a = parse(&[
        "push",
        "--conns",
        "10",
        "--procs",
        "2",
        "--rate",
        "100",
        "--backoff-cap",
        "3s",
    ])
    .unwrap();
    let args = a.child_args(1, 5, 5, None);
    let child = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!(child.child_index, Some(1));
    assert_eq!(child.backoff_cap, Duration::from_secs(3));
    assert_eq!(child.conn_offset, 5);
    assert_eq!(child.conns, 5);
    assert_eq!(child.rate, 50.0);
    assert_eq!(child.size(), 64);
    assert!(child.json);
    let u = WsUrl::parse(&child.url).unwrap();
    let plan = child.plan(&u).unwrap();
    assert_eq!(plan.rate, 50.0);
    assert_eq!(plan.path, "/ws/{channel}?format=json");
}

#[test]
fn pusher_flags_give_one_app_and_are_refused_where_they_mean_nothing() {
    let a = parse(&["push", "--protocol", "pusher", "--pusher-app", "1:k:s"]).unwrap();
    assert!(a.validate().is_ok());
    assert_eq!(a.seq_from(), SeqFrom::Payload);
    let app = a.pusher().unwrap().unwrap();
    assert_eq!((&*app.id, &*app.key, &*app.secret), ("1", "k", "s"));
    let parts = parse(&[
        "idle",
        "--protocol",
        "pusher",
        "--pusher-app-id",
        "2",
        "--pusher-key",
        "key",
        "--pusher-secret",
        "sec",
        "--channels",
        "10",
    ])
    .unwrap();
    assert!(parts.validate().is_ok());
    let app = parts.pusher().unwrap().unwrap();
    assert_eq!((&*app.id, &*app.key, &*app.secret), ("2", "key", "sec"));
    let plan = parts.plan(&WsUrl::parse(&parts.url).unwrap()).unwrap();
    assert_eq!(plan.protocol, Protocol::Pusher);
    assert!(
        plan.path
            .starts_with("/app/key?protocol=7&client=throng-bench"),
        "{}",
        plan.path
    );
    assert!(
        !format!("{plan:?}").contains("sec\""),
        "the secret stays out of Debug"
    );
    let bad = |args: &[&str]| {
        let mut all = vec!["--protocol", "pusher"];
        all.extend_from_slice(args);
        matches!(parse(&all).unwrap().validate(), Err(BenchError::BadArgs(_)))
    };
    assert!(bad(&["push"]), "no app");
    assert!(
        bad(&["push", "--pusher-key", "k", "--pusher-app-id", "1"]),
        "no secret"
    );
    assert!(bad(&["echo", "--pusher-app", "1:k:s"]));
    assert!(bad(&["chat", "--pusher-app", "1:k:s"]));
    assert!(bad(&[
        "push",
        "--pusher-app",
        "1:k:s",
        "--transport",
        "sse"
    ]));
    assert!(bad(&[
        "push",
        "--pusher-app",
        "1:k:s",
        "--reconnect",
        "0.5"
    ]));
    assert!(!bad(&[
        "push",
        "--pusher-app",
        "1:k:s",
        "--channel-prefix",
        "presence-"
    ]));
    assert!(bad(&[
        "push",
        "--pusher-app",
        "1:k:s",
        "--channel-prefix",
        "a:b"
    ]));
    assert!(parse(&["push", "--pusher-app", "1:k"]).is_err());
    // A private prefix is fine: the bench signs with the secret.
    let private = parse(&[
        "push",
        "--protocol",
        "pusher",
        "--pusher-app",
        "1:k:s",
        "--channel-prefix",
        "private-b-",
    ])
    .unwrap();
    assert!(private.validate().is_ok());
    let publish = private.publish_plan().unwrap();
    assert_eq!(publish.path, "/apps/1/events");
    assert_eq!(publish.seq_from, SeqFrom::Payload);
}

#[test]
fn pusher_children_are_told_the_protocol_and_not_the_secret() {
    let a = parse(&[
        "push",
        "--protocol",
        "pusher",
        "--pusher-app",
        "1:k:topsecret",
        "--conns",
        "4",
        "--procs",
        "2",
    ])
    .unwrap();
    let args = a.child_args(0, 0, 2, None);
    assert!(!args.iter().any(|x| x.contains("topsecret")), "{args:?}");
    let child = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!(child.protocol, Protocol::Pusher);
    assert_eq!(child.seq_from(), SeqFrom::Payload);
}

#[test]
fn tls_urls_say_tls_and_default_to_port_443() {
    let u = WsUrl::parse("wss://example.com/ws?x=1").unwrap();
    assert!(u.tls && !u.http);
    assert_eq!(
        (
            u.host.as_str(),
            u.port,
            u.authority.as_str(),
            u.path.as_str()
        ),
        ("example.com", 443, "example.com", "/ws?x=1")
    );
    assert_eq!(u.scheme(), "wss");
    let u = WsUrl::parse("https://127.0.0.1:8443").unwrap();
    assert!(u.tls && u.http);
    assert_eq!((u.port, u.path.as_str(), u.scheme()), (8443, "/", "https"));
    let u = WsUrl::parse("wss://[::1]:9/").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("::1", 9));
    assert_eq!(WsUrl::parse("wss://[::1]/").unwrap().port, 443);
    let u = WsUrl::parse("ws://h").unwrap();
    assert!(!u.tls);
    assert_eq!((u.port, u.scheme()), (80, "ws"));
    assert!(WsUrl::parse("wss://h:99999/").is_err());
}

#[test]
fn tls_flags_reach_the_plan_the_publisher_and_the_children() {
    let a = parse(&[
        "push",
        "--url",
        "wss://localhost:9/",
        "--insecure",
        "--conns",
        "4",
        "--procs",
        "2",
    ])
    .unwrap();
    assert!(a.tls.insecure && a.tls.ca.is_none());
    let url = a.validate().unwrap();
    let plan = a.plan(&url).unwrap();
    let tls = plan.tls.as_ref().expect("a TLS plan");
    assert_eq!(
        format!("{:?}", tls.name),
        format!(
            "{:?}",
            rustls::pki_types::ServerName::try_from("localhost").unwrap()
        )
    );
    // The publisher follows --url: https on the same host and port.
    let publish = a.publish_plan().unwrap();
    assert!(publish.tls.is_some());
    assert_eq!(
        (publish.url.host.as_str(), publish.url.port),
        ("localhost", 9)
    );
    let child = a.child_args(1, 2, 2, None);
    let child = parse(&child.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert!(child.tls.insecure);
    // An explicit https:// publish URL under a plain --url; 443 by default.
    let a = parse(&[
        "push",
        "--publish-url",
        "https://api.example/pre",
        "--insecure",
    ])
    .unwrap();
    assert!(a.validate().is_ok());
    let publish = a.publish_plan().unwrap();
    assert!(publish.tls.is_some());
    assert_eq!(publish.url.port, 443);
    assert_eq!(publish.path, "/pre/api/publish/{channel}");
    assert!(a.plan(&a.validate().unwrap()).unwrap().tls.is_none());
    // Plain stays plain.
    let a = parse(&["push"]).unwrap();
    assert!(a.publish_plan().unwrap().tls.is_none());
    assert!(a.plan(&a.validate().unwrap()).unwrap().tls.is_none());
}

#[test]
fn tls_flags_are_refused_where_they_mean_nothing_or_cannot_work() {
    let bad =
        |args: &[&str]| matches!(parse(args).unwrap().validate(), Err(BenchError::BadArgs(_)));
    assert!(
        bad(&["echo", "--insecure"]),
        "plain ws:// has no certificate"
    );
    assert!(bad(&[
        "echo",
        "--url",
        "wss://h:1/",
        "--ca",
        "/nonexistent/ca.pem"
    ]));
    assert!(
        bad(&["echo", "--url", "wss://h:1/", "--ca", "Cargo.toml"]),
        "no CERTIFICATE in it"
    );
    assert!(parse(&["echo", "--url", "wss://h:1/", "--insecure", "--ca", "x.pem"]).is_err());
    assert!(
        bad(&["handshakes", "--url", "http://h:1/"]),
        "handshakes needs TLS"
    );
    assert!(bad(&[
        "handshakes",
        "--url",
        "https://h:1/",
        "--insecure",
        "--procs",
        "2",
        "--conns",
        "4"
    ]));
    assert!(!bad(&[
        "handshakes",
        "--url",
        "https://h:1/healthz",
        "--insecure"
    ]));
    assert!(!bad(&[
        "handshakes",
        "--url",
        "wss://h:1/",
        "--insecure",
        "--no-resume"
    ]));
    assert!(!bad(&[
        "push",
        "--transport",
        "sse",
        "--url",
        "https://h:1/",
        "--insecure"
    ]));
    assert!(bad(&[
        "push",
        "--transport",
        "ws",
        "--url",
        "https://h:1/",
        "--insecure"
    ]));
}

#[test]
fn a_handshakes_report_says_each_pass_its_rate_and_resumptions() {
    use super::handshakes::{HandshakeReport, Pass, to_text};
    let pass = |resumption, full, resumed| Pass {
        resumption,
        attempted: 10,
        handshakes: 10,
        full,
        resumed,
        answered: 10,
        secs: 0.5,
        handshakes_per_sec: 20.0,
        statuses: [(200, 10)].into(),
        ..Pass::default()
    };
    let report = HandshakeReport {
        mode: "handshakes",
        url: "https://h:1/healthz".into(),
        threads: 1,
        conns: 10,
        passes: vec![pass(false, 10, 0), pass(true, 1, 9)],
        errors: 0,
    };
    let text = to_text(&report);
    assert!(
        text.contains("resumption off: 10 handshakes in 0.50 s = 20.0 handshakes/s"),
        "{text}"
    );
    assert!(text.contains("full 1, resumed 9"), "{text}");
    assert!(text.contains("answers: 200 ×10"), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["passes"][1]["resumed"], 9);
    assert_eq!(json["passes"][0]["statuses"]["200"], 10);
}
