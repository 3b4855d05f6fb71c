//! Channel names, client names, event ids and query strings, each against a simple
//! reference definition written here, and through the router the way a client
//! reaches them.
//!
//! Input: any bytes, taken as text (invalid UTF-8 replaced). Checks:
//! - `validate_channel_name` / `validate_client_name` agree with the documented
//!   definitions (1-200 bytes of `A-Z a-z 0-9 _ - . : @ = , ;`; 1-32 bytes of
//!   `A-Z a-z 0-9 _ - .`), including which error;
//! - `sse::parse_event_id` reads `SEQ` or `SEQ:EPOCH` (16 hex digits) as defined,
//!   and reads back every id the server writes (`{seq}:{epoch:016x}`);
//! - through `routes::route`, `GET /ws/x?{input}` (a valid upgrade),
//!   `GET /poll/x?{input}`, `GET /sse/x?{input}`, `GET /sse/x` with
//!   `Last-Event-ID: {input}`, and `GET /ws/{input}` open the transport with the
//!   format, resume point, client name and timeout the reference reads from the
//!   query, or answer 400 with a JSON body exactly when the reference refuses it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use throng::broker::Resume;
use throng::protocol::http::{Request, parse_request};
use throng::rules::{MAX_CHANNEL_NAME, NameError, validate_channel_name, validate_client_name};
use throng::server::routes::{Outcome, RouteContext, route};
use throng::stats::TurnCounts;
use throng::transport::{Format, Handover, Opening, sse};
use throng_fuzz::{Options, TICKET, fresh_shared, peer, single_response};

const UPGRADE: &str = "Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

// ---- The reference definitions -------------------------------------------------

fn channel_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.:@=,;".contains(c)
}

fn reference_channel(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        Err(NameError::Empty)
    } else if name.len() > MAX_CHANNEL_NAME {
        Err(NameError::TooLong)
    } else if let Some(c) = name.chars().find(|&c| !channel_char(c)) {
        Err(NameError::BadChar(c))
    } else {
        Ok(())
    }
}

fn reference_client_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// A whole number from 0 that fits 64 bits. Like Rust's integer parsing, a
/// leading `+` is allowed.
fn whole_number(v: &str) -> Option<u64> {
    let digits = v.strip_prefix('+').unwrap_or(v);
    if digits.is_empty() {
        return None;
    }
    digits.chars().try_fold(0u64, |n, c| {
        n.checked_mul(10)?.checked_add(u64::from(c.to_digit(10)?))
    })
}

/// Exactly 16 hex digits, as the server writes an epoch.
fn epoch(v: &str) -> Option<u64> {
    if v.len() != 16 {
        return None;
    }
    v.chars()
        .try_fold(0u64, |n, c| Some((n << 4) | u64::from(c.to_digit(16)?)))
}

/// `SEQ` or `SEQ:EPOCH`; whitespace around SEQ is forgiven.
fn reference_event_id(id: &str) -> Option<Resume> {
    let (seq, epoch_part) = match id.find(':') {
        Some(i) => (&id[..i], Some(&id[i + 1..])),
        None => (id, None),
    };
    let epoch = match epoch_part {
        Some(e) => Some(epoch(e)?),
        None => None,
    };
    Some(Resume {
        since: whole_number(seq.trim())?,
        epoch,
    })
}

/// The first `key=value` pair with this key (a bare `key` has an empty value).
fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    for pair in query.split('&') {
        let (k, v) = match pair.find('=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, ""),
        };
        if k == key {
            return Some(v);
        }
    }
    None
}

/// `since=SEQ[&epoch=E]`; `Err` when the query is refused.
fn reference_resume(query: &str) -> Result<Option<Resume>, ()> {
    let since = match param(query, "since") {
        None => None,
        Some(v) => Some(whole_number(v).ok_or(())?),
    };
    let epoch = match param(query, "epoch") {
        None => None,
        Some(v) => Some(epoch(v).ok_or(())?),
    };
    match (since, epoch) {
        (Some(since), epoch) => Ok(Some(Resume { since, epoch })),
        (None, Some(_)) => Err(()),
        (None, None) => Ok(None),
    }
}

/// What `/ws/x?{query}` should open: format, resume, name.
fn reference_ws(query: &str) -> Result<(Format, Option<Resume>, Option<String>), ()> {
    let format = match param(query, "format") {
        None | Some("raw") => Format::WsRaw,
        Some("json") => Format::WsJson,
        Some(_) => return Err(()),
    };
    let resume = reference_resume(query)?;
    let name = match param(query, "name") {
        None => None,
        Some(n) if reference_client_name(n) => Some(n.to_string()),
        Some(_) => return Err(()),
    };
    Ok((format, resume, name))
}

/// What `/poll/x?{query}` should open: timeout in seconds, resume.
fn reference_poll(query: &str) -> Result<(u64, Resume), ()> {
    let timeout = match param(query, "timeout") {
        None => 30,
        Some(v) => match whole_number(v) {
            Some(s) if s <= 60 => s,
            _ => return Err(()),
        },
    };
    let resume = reference_resume(query)?.unwrap_or(Resume {
        since: 0,
        epoch: None,
    });
    Ok((timeout, resume))
}

// ---- Driving the router --------------------------------------------------------

/// Parses `raw`; `None` unless it is one complete request whose target is `target`
/// (the input may hold bytes a request line cannot carry).
fn with_request<T>(raw: &str, target: &str, f: impl FnOnce(&Request<'_>) -> T) -> Option<T> {
    match parse_request(raw.as_bytes()) {
        Ok(Some((req, len))) if len == raw.len() && req.target == target => Some(f(&req)),
        _ => None,
    }
}

/// Routes `req`; the opening, or `None` after checking the answer is a JSON 400.
fn open_or_400(req: &Request<'_>) -> Option<Opening> {
    let shared = fresh_shared(Options::default());
    let ctx = RouteContext {
        shared: &shared,
        ticket: TICKET,
        peer: peer(false),
        local: true,
        body: &[],
        head_len: 0,
    };
    let mut out = Vec::new();
    match route(req, ctx, &mut out, &mut TurnCounts::default()) {
        Outcome::Open(opening) => {
            assert!(out.is_empty());
            Some(opening)
        }
        Outcome::Responded => {
            let response = single_response(&out);
            assert_eq!(response.status, 400, "{}", String::from_utf8_lossy(&out));
            response.assert_json_error();
            None
        }
        other => panic!("{} gave {other:?}", req.target),
    }
}

fn check_ws_query(query: &str) {
    let target = format!("/ws/x?{query}");
    let raw = format!("GET {target} HTTP/1.1\r\n{UPGRADE}\r\n");
    with_request(&raw, &target, |req| {
        let q = req.query().unwrap_or("");
        let got = open_or_400(req).map(|opening| {
            assert!(matches!(opening.handover, Handover::WebSocket { .. }));
            let sub = opening.subscribe.expect("a channel subscription");
            assert_eq!(sub.channel, "x");
            (sub.format, sub.resume, sub.name.map(String::from))
        });
        assert_eq!(got.ok_or(()), reference_ws(q), "/ws/x?{q}");
    });
}

fn check_poll_query(query: &str) {
    let target = format!("/poll/x?{query}");
    let raw = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
    with_request(&raw, &target, |req| {
        let q = req.query().unwrap_or("");
        let got = open_or_400(req).map(|opening| {
            let Handover::Poll { timeout } = opening.handover else {
                panic!("{:?}", opening.handover);
            };
            let sub = opening.subscribe.expect("a subscription");
            assert_eq!((sub.channel.as_str(), sub.format), ("x", Format::Poll));
            (
                timeout.as_secs(),
                sub.resume.expect("a poll always resumes"),
            )
        });
        assert_eq!(got.ok_or(()), reference_poll(q), "/poll/x?{q}");
    });
}

fn sse_resume(req: &Request<'_>) -> Result<Option<Resume>, ()> {
    let opening = open_or_400(req).ok_or(())?;
    assert!(matches!(opening.handover, Handover::Sse));
    let sub = opening.subscribe.expect("a subscription");
    assert_eq!((sub.channel.as_str(), sub.format), ("x", Format::Sse));
    Ok(sub.resume)
}

fn check_sse(text: &str) {
    let target = format!("/sse/x?{text}");
    let raw = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
    with_request(&raw, &target, |req| {
        let q = req.query().unwrap_or("");
        assert_eq!(sse_resume(req), reference_resume(q), "/sse/x?{q}");
    });
    // Last-Event-ID wins over a `since=` in the URL, even a bad one.
    let target = "/sse/x?since=bad";
    let raw = format!("GET {target} HTTP/1.1\r\nHost: x\r\nLast-Event-ID: {text}\r\n\r\n");
    with_request(&raw, target, |req| {
        let Some(value) = req.header("last-event-id") else {
            return;
        };
        let want = std::str::from_utf8(value)
            .ok()
            .and_then(reference_event_id)
            .map(Some)
            .ok_or(());
        assert_eq!(sse_resume(req), want, "Last-Event-ID: {value:?}");
    });
}

fn check_channel_path(text: &str) {
    let target = format!("/ws/{text}");
    let raw = format!("GET {target} HTTP/1.1\r\n{UPGRADE}\r\n");
    with_request(&raw, &target, |req| {
        let channel = req.path().strip_prefix("/ws/").expect("a /ws/ path");
        let query = req.query().unwrap_or("");
        let want = reference_channel(channel)
            .ok()
            .and_then(|()| reference_ws(query).ok());
        let got = open_or_400(req).map(|opening| {
            let sub = opening.subscribe.expect("a channel subscription");
            assert_eq!(sub.channel, channel);
            (sub.format, sub.resume, sub.name.map(String::from))
        });
        assert_eq!(got, want, "{target}");
    });
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text: &str = &text;

    assert_eq!(
        validate_channel_name(text),
        reference_channel(text),
        "{text:?}"
    );
    if let Err(e) = validate_channel_name(text) {
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(
        validate_client_name(text).is_ok(),
        reference_client_name(text),
        "{text:?}"
    );

    assert_eq!(
        sse::parse_event_id(text),
        reference_event_id(text),
        "{text:?}"
    );
    // Every id the server writes reads back.
    if data.len() >= 16 {
        let seq = u64::from_le_bytes(data[..8].try_into().unwrap());
        let ep = u64::from_le_bytes(data[8..16].try_into().unwrap());
        assert_eq!(
            sse::parse_event_id(&format!("{seq}:{ep:016x}")),
            Some(Resume {
                since: seq,
                epoch: Some(ep)
            })
        );
        assert_eq!(
            sse::parse_event_id(&seq.to_string()),
            Some(Resume {
                since: seq,
                epoch: None
            })
        );
    }

    check_ws_query(text);
    check_poll_query(text);
    check_sse(text);
    check_channel_path(text);
});
