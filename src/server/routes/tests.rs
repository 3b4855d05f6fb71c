//! The router's answers, request by request, without sockets.

use super::api::constant_time_eq;
use super::*;
use crate::broker::Resume;
use crate::protocol::http::parse_request;
use crate::server::tests_support::test_shared;
use crate::stats::HandshakeFailure;
use crate::transport::{Format, Handover};

fn answer_from(raw: &str, peer: IpAddr, shared: &Shared) -> (Outcome, String) {
    let bytes = raw.as_bytes();
    let (req, head) = parse_request(bytes).unwrap().unwrap();
    let mut out = Vec::new();
    let ctx = RouteContext {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        shared,
        peer,
        local: peer.is_loopback(),
        body: &bytes[head..],
        head_len: head,
    };
    let outcome = route(&req, ctx, &mut out, &mut TurnCounts::default());
    (outcome, String::from_utf8(out).unwrap())
}

fn answer(raw: &str) -> (Outcome, String) {
    let (shared, _polls) = test_shared(None);
    answer_from(raw, [127, 0, 0, 1].into(), &shared)
}

#[test]
fn plain_requests_get_the_documented_statuses() {
    let (_, r) = answer("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("ok"));
    let (_, r) = answer("POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 405"));
    let (_, r) = answer("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 404") && r.contains("no route for /nope"));
    let (_, r) = answer("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 426") && r.contains("Upgrade: websocket"));
    let (_, r) = answer("GET /ws/news HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 426"));
    let (_, r) = answer("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200") && r.contains("text/html"));
    let (_, r) = answer("GET /throng.js HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200") && r.contains("text/javascript"));
    let (_, r) = answer("POST /chat HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 405"));
}

const UPGRADE: &str = "HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

#[test]
fn upgrades_route_to_echo_and_channels() {
    let (outcome, out) = answer(&format!("GET /echo?x=1 {UPGRADE}"));
    assert!(matches!(
        outcome,
        Outcome::Open(Opening {
            handover: Handover::WebSocket { .. },
            subscribe: None,
        })
    ));
    assert!(out.is_empty());
    let (outcome, _) = answer(&format!("GET /ws/chat:lobby?format=json {UPGRADE}"));
    match outcome {
        Outcome::Open(Opening {
            subscribe: Some(sub),
            ..
        }) => {
            assert_eq!(sub.channel, "chat:lobby");
            assert_eq!(sub.format, Format::WsJson);
            assert_eq!(sub.resume, None);
        }
        other => panic!("{other:?}"),
    }
    let (_, out) = answer(&format!(
        "GET /echo {}",
        UPGRADE.replace("Version: 13", "Version: 7")
    ));
    assert!(out.starts_with("HTTP/1.1 426") && out.contains("Sec-WebSocket-Version: 13"));
}

#[test]
fn bad_channel_names_and_formats_get_400_with_the_reason() {
    let (_, out) = answer(&format!("GET /ws/a%20b {UPGRADE}"));
    assert!(out.starts_with("HTTP/1.1 400") && out.contains("channel name has '%'"));
    let long = "a".repeat(201);
    let (_, out) = answer(&format!("GET /ws/{long} {UPGRADE}"));
    assert!(out.starts_with("HTTP/1.1 400") && out.contains("longer than 200"));
    let (_, out) = answer(&format!("GET /ws/ {UPGRADE}"));
    assert!(out.starts_with("HTTP/1.1 400") && out.contains("empty"));
    let (_, out) = answer(&format!("GET /ws/x?format=xml {UPGRADE}"));
    assert!(out.starts_with("HTTP/1.1 400") && out.contains("format must be raw or json"));
    let (_, out) = answer("POST /api/publish/a*b HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"));
}

#[test]
fn since_and_epoch_are_checked() {
    let (outcome, _) = answer(&format!(
        "GET /ws/news?since=7&epoch=00000000000000ff {UPGRADE}"
    ));
    match outcome {
        Outcome::Open(Opening {
            subscribe: Some(sub),
            ..
        }) => assert_eq!(
            sub.resume,
            Some(Resume {
                since: 7,
                epoch: Some(255)
            })
        ),
        other => panic!("{other:?}"),
    }
    for (query, reason) in [
        ("since=abc", "since must be a seq"),
        ("since=-1", "since must be a seq"),
        ("since=", "since must be a seq"),
        ("since=1&epoch=xyz", "epoch must be 16 hex digits"),
        ("since=1&epoch=123", "epoch must be 16 hex digits"),
        ("epoch=00000000000000ff", "epoch goes with since"),
    ] {
        let (_, out) = answer(&format!("GET /ws/news?{query} {UPGRADE}"));
        assert!(
            out.starts_with("HTTP/1.1 400") && out.contains(reason),
            "{query}: {out}"
        );
    }
}

#[test]
fn publish_assigns_seq_and_waits_for_the_whole_body() {
    let (shared, _polls) = test_shared(None);
    let local: IpAddr = [127, 0, 0, 1].into();
    let partial = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhel";
    let (outcome, _) = answer_from(partial, local, &shared);
    assert!(matches!(outcome, Outcome::NeedBody));
    let whole = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
    let (_, out) = answer_from(whole, local, &shared);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with(r#"{"seq":1}"#),
        "{out}"
    );
    let (_, out) = answer_from(whole, local, &shared);
    assert!(out.ends_with(r#"{"seq":2}"#));
    let (_, out) = answer_from(
        "GET /api/channels/news HTTP/1.1\r\nHost: x\r\n\r\n",
        local,
        &shared,
    );
    assert!(out.contains(r#""last_seq":2"#) && out.contains(r#""subscribers":0"#));
}

#[test]
fn publish_limits_and_access_rules() {
    let (shared, _polls) = test_shared(None);
    let remote: IpAddr = [192, 0, 2, 7].into();
    let local: IpAddr = [127, 0, 0, 1].into();
    let req = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
    let (_, out) = answer_from(req, remote, &shared);
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("loopback"),
        "{out}"
    );
    let (_, out) = answer_from(req, local, &shared);
    assert!(out.starts_with("HTTP/1.1 200"));
    let big = format!(
        "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        shared.config.max_message_size + 1
    );
    let (_, out) = answer_from(&big, local, &shared);
    assert!(out.starts_with("HTTP/1.1 413"));

    let (keyed, _polls) = test_shared(Some("s3cret"));
    let (_, out) = answer_from(req, remote, &keyed);
    assert!(out.starts_with("HTTP/1.1 401"));
    let wrong = req.replace("Host: x", "Host: x\r\nAuthorization: Bearer nope");
    let (_, out) = answer_from(&wrong, local, &keyed);
    assert!(out.starts_with("HTTP/1.1 401"));
    let right = req.replace("Host: x", "Host: x\r\nAuthorization: Bearer s3cret");
    let (_, out) = answer_from(&right, remote, &keyed);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (_, out) = answer_from(
        "GET /api/publish/news HTTP/1.1\r\nHost: x\r\n\r\n",
        local,
        &shared,
    );
    assert!(out.starts_with("HTTP/1.1 405"));
}

#[test]
fn successful_api_answers_keep_http11_connections_open() {
    let (shared, _polls) = test_shared(None);
    let local: IpAddr = [127, 0, 0, 1].into();
    let req = "POST /api/publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /next";
    let (outcome, out) = answer_from(req, local, &shared);
    assert!(out.contains("Connection: keep-alive"), "{out}");
    match outcome {
        Outcome::KeepAlive { consumed } => assert_eq!(&req[consumed..], "GET /next"),
        other => panic!("{other:?}"),
    }
    let close = "GET /api/channels/news HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let (outcome, out) = answer_from(close, local, &shared);
    assert!(matches!(outcome, Outcome::Responded) && out.contains("Connection: close"));
    let old = "GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n";
    assert!(matches!(
        answer_from(old, local, &shared).0,
        Outcome::Responded
    ));
    // Errors always close.
    let (outcome, _) = answer_from("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", local, &shared);
    assert!(matches!(outcome, Outcome::Responded));
}

/// The reasons counted while routing `raw` (from loopback).
fn failures_of(raw: &str) -> Vec<&'static str> {
    let (shared, _polls) = test_shared(None);
    let bytes = raw.as_bytes();
    let (req, head) = parse_request(bytes).unwrap().unwrap();
    let ctx = RouteContext {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        shared: &shared,
        peer: [127, 0, 0, 1].into(),
        local: true,
        body: &bytes[head..],
        head_len: head,
    };
    let mut counts = TurnCounts::default();
    route(&req, ctx, &mut Vec::new(), &mut counts);
    HandshakeFailure::ALL
        .into_iter()
        .filter(|&why| counts.handshake_failures[why as usize] > 0)
        .map(HandshakeFailure::as_str)
        .collect()
}

#[test]
fn refused_transport_requests_are_counted_by_reason() {
    let v8 = UPGRADE.replace("Version: 13", "Version: 8");
    let no_key = UPGRADE.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "");
    for (raw, want) in [
        (format!("GET /echo {v8}"), vec!["unsupported_version"]),
        (format!("GET /ws/news {no_key}"), vec!["bad_request"]),
        (format!("GET /ws/a%20b {UPGRADE}"), vec!["bad_request"]),
        (format!("GET /ws/x?since=no {UPGRADE}"), vec!["bad_request"]),
        (
            "GET /sse/a*b HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            vec!["bad_request"],
        ),
        (
            "POST /sse/a HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            vec!["bad_request"],
        ),
        (
            "GET /poll/a?timeout=99 HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            vec!["bad_request"],
        ),
        // Not handshakes: a good one, plain GETs, the API.
        (format!("GET /ws/news {UPGRADE}"), vec![]),
        ("GET /ws/a%20b HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
        ("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
        ("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n".into(), vec![]),
        (
            "POST /api/publish/a*b HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            vec![],
        ),
    ] {
        assert_eq!(failures_of(&raw), want, "{raw}");
    }
}

#[test]
fn metrics_are_prometheus_text_and_kept_alive() {
    let (outcome, out) = answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{out}"
    );
    assert!(matches!(outcome, Outcome::KeepAlive { .. }));
    let body = &out[out.find("\r\n\r\n").unwrap() + 4..];
    assert!(body.contains("\nthrong_broker_up 1\n"), "{body}");
    assert!(body.contains("\nthrong_channels 0\n"), "{body}");
    let (_, out) = answer("POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 405"));
}

#[test]
fn constant_time_comparison() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
}
