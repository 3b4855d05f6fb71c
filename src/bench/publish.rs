//! Push mode's publisher: threads that POST messages to the HTTP publish API at a
//! steady total rate, round-robin over the bench channels, and remember the seqs
//! the server returned (or, with `--seq-from payload`, the count each payload
//! carries) so fan-out completeness can be checked. Under `--protocol pusher` a
//! message is an event `bench` sent through Pusher's signed `POST
//! /apps/ID/events`, its `data` the same stamped payload.
//!
//! An `https://` publish URL goes through `https.rs` (TLS as `--insecure` and
//! `--ca` say), an `http://` one through `crate::client`.
//!
//! It owns pacing and the publish requests. It must not touch WebSocket
//! connections or print: the driver starts and stops it and hands its
//! [`PublishSummary`] to the report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::SeqFrom;
use super::client::unix_nanos;
use super::https::HttpsSession;
use super::report::PublishSummary;
use super::tls::TlsTarget;
use crate::client::{ClientError, HttpUrl, Response, Session};
use crate::pusher::App;
use crate::pusher::sign::signed_query;

/// Timeout of one publish request.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// What the publisher threads need.
#[derive(Debug, Clone)]
pub struct PublishPlan {
    /// The server; its prefix is already part of `path`.
    pub url: HttpUrl,
    /// `https://`: TLS to the server.
    pub tls: Option<TlsTarget>,
    /// Request path with `{channel}` in it (`/api/publish/{channel}` for throng),
    /// or Pusher's `/apps/ID/events`.
    pub path: String,
    /// Publish through Pusher's signed API as this app.
    pub pusher: Option<App>,
    pub api_key: Option<String>,
    pub channel_prefix: String,
    pub channels: u64,
    /// Messages per second over all channels.
    pub rate: f64,
    pub threads: usize,
    pub size: usize,
    pub seq_from: SeqFrom,
    /// Each publish carries a key of its own (`--idempotency-keys`).
    pub idempotency_keys: bool,
}

impl PublishPlan {
    /// `url` with a `{channel}` in its path is the whole publish URL; otherwise the
    /// throng API's path follows whatever prefix it has.
    pub fn target(mut url: HttpUrl) -> (HttpUrl, String) {
        let path = if url.prefix.contains("{channel}") {
            std::mem::take(&mut url.prefix)
        } else {
            format!(
                "{}/api/publish/{{channel}}",
                std::mem::take(&mut url.prefix)
            )
        };
        (url, path)
    }

    /// Pusher's events endpoint of `app`, after whatever prefix `url` has.
    pub fn pusher_target(mut url: HttpUrl, app: &App) -> (HttpUrl, String) {
        let path = format!("{}/apps/{}/events", std::mem::take(&mut url.prefix), app.id);
        (url, path)
    }
}

/// One Pusher publish: the signed path (with its query) and the JSON body of
/// event `bench` on `channel` carrying `data` (and `key` as its idempotency key),
/// signed at `timestamp` (Unix s).
pub(super) fn pusher_request(
    app: &App,
    path: &str,
    channel: &str,
    data: &str,
    key: Option<&str>,
    timestamp: u64,
) -> (String, Vec<u8>) {
    let mut event = serde_json::json!({ "name": "bench", "channel": channel, "data": data });
    if let Some(key) = key {
        event["idempotency_key"] = key.into();
    }
    let body = event.to_string();
    let query = signed_query(app, "POST", path, body.as_bytes(), timestamp);
    (format!("{path}?{query}"), body.into_bytes())
}

/// One publisher thread's kept-alive connection, plain or TLS.
enum PublishSession {
    Plain(Session),
    Tls(Box<HttpsSession>),
}

impl PublishSession {
    fn new(plan: &PublishPlan) -> Self {
        match &plan.tls {
            Some(tls) => PublishSession::Tls(Box::new(HttpsSession::new(
                plan.url.clone(),
                tls.clone(),
                PUBLISH_TIMEOUT,
            ))),
            None => PublishSession::Plain(Session::new(plan.url.clone(), PUBLISH_TIMEOUT)),
        }
    }

    fn request(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, ClientError> {
        match self {
            PublishSession::Plain(s) => s.request("POST", path, headers, body),
            PublishSession::Tls(s) => s.request("POST", path, headers, body),
        }
    }
}

pub struct Publisher {
    stop: Arc<AtomicBool>,
    /// Messages the server accepted so far, over all threads (for the timeline).
    published: Arc<AtomicU64>,
    threads: Vec<JoinHandle<PublishSummary>>,
}

impl Publisher {
    /// Starts publishing now.
    pub fn start(plan: PublishPlan) -> std::io::Result<Publisher> {
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicU64::new(0));
        let plan = Arc::new(plan);
        let start = Instant::now();
        let mut threads = Vec::new();
        for id in 0..plan.threads.max(1) {
            let plan = Arc::clone(&plan);
            let stop = Arc::clone(&stop);
            let published = Arc::clone(&published);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("bench-pub-{id}"))
                    .spawn(move || publish_loop(id, &plan, &stop, &published, start))?,
            );
        }
        Ok(Publisher {
            stop,
            published,
            threads,
        })
    }

    /// Messages the server has accepted so far.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Stops publishing and returns what was published.
    pub fn stop(self) -> PublishSummary {
        self.stop.store(true, Ordering::Release);
        let mut total = PublishSummary::default();
        for t in self.threads {
            match t.join() {
                Ok(s) => total.merge(&s),
                Err(_) => {
                    total.errors += 1;
                    *total
                        .errors_by_reason
                        .entry("publisher thread panicked".into())
                        .or_default() += 1;
                }
            }
        }
        total
    }
}

fn publish_loop(
    id: usize,
    plan: &PublishPlan,
    stop: &AtomicBool,
    published: &AtomicU64,
    start: Instant,
) -> PublishSummary {
    let mut summary = PublishSummary::default();
    let step = plan.threads.max(1) as u64;
    let auth = plan.api_key.as_ref().map(|k| format!("Bearer {k}"));
    let content_type = match plan.pusher {
        Some(_) => "application/json",
        None => "text/plain",
    };
    let mut headers = vec![("Content-Type", content_type)];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    // One kept-alive connection per publisher thread (reconnecting if the server
    // closes it), so high rates do not pile up TIME_WAIT sockets.
    let mut session = PublishSession::new(plan);
    let start_nanos = unix_nanos();
    // Payload numbering: a channel's messages must leave in order, so thread `id`
    // owns the channels `c % threads == id` (walking every message index, taking
    // its own); with the server's seqs, threads simply take turns.
    let channels = plan.channels.max(1);
    let owns = |i: u64| plan.seq_from == SeqFrom::Server || (i % channels) % step == id as u64;
    if plan.seq_from == SeqFrom::Payload && id as u64 >= channels {
        return summary; // more threads than channels: this one owns none
    }
    let (mut i, advance) = match plan.seq_from {
        SeqFrom::Payload => (0, 1),
        SeqFrom::Server => (id as u64, step),
    };
    while !stop.load(Ordering::Acquire) {
        if !owns(i) {
            i += advance;
            continue;
        }
        let due = start + Duration::from_secs_f64(i as f64 / plan.rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        let channel = (i % channels) as usize;
        // The n-th message of its channel, whichever thread sends it.
        let count = i / channels + 1;
        let now = unix_nanos();
        let mut body = format!("{now} {count} ").into_bytes();
        if body.len() < plan.size {
            body.resize(plan.size, b'x');
        }
        let name = format!("{}{}", plan.channel_prefix, channel);
        // Unique per run, thread and message.
        let key = plan
            .idempotency_keys
            .then(|| format!("bench-{}-{id}-{i}", start_nanos));
        let (path, body) = match &plan.pusher {
            Some(app) => {
                // The payload is ASCII digits, spaces and 'x': it is its own text.
                let data = String::from_utf8_lossy(&body);
                let key = key.as_deref();
                pusher_request(app, &plan.path, &name, &data, key, now / 1_000_000_000)
            }
            None => (plan.path.replace("{channel}", &name), body),
        };
        let asked = Instant::now();
        let outcome = match (&key, &plan.pusher) {
            (Some(key), None) => {
                let mut keyed = headers.clone();
                keyed.push(("Idempotency-Key", key.as_str()));
                session.request(&path, &keyed, &body)
            }
            _ => session.request(&path, &headers, &body),
        };
        if matches!(&outcome, Ok(r) if (200..300).contains(&r.status)) {
            summary.answered_after(asked.elapsed());
        }
        match outcome {
            Ok(r) if plan.seq_from == SeqFrom::Payload && (200..300).contains(&r.status) => {
                summary.record(channel, count);
                published.fetch_add(1, Ordering::Relaxed);
            }
            Ok(r) if r.status == 200 => {
                let seq = serde_json::from_slice::<serde_json::Value>(&r.body)
                    .ok()
                    .and_then(|v| v.get("seq")?.as_u64());
                match seq {
                    Some(seq) => {
                        summary.record(channel, seq);
                        published.fetch_add(1, Ordering::Relaxed);
                    }
                    None => fail(&mut summary, "answer without a seq".into()),
                }
            }
            Ok(r) => fail(&mut summary, format!("status {}", r.status)),
            Err(e) => fail(&mut summary, with_causes(&e)),
        }
        i += advance;
    }
    summary
}

/// An error and its causes, so a failed publish says what the socket said
/// (timed out, reset, closed) and not only that the request failed.
pub(super) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn fail(summary: &mut PublishSummary, reason: String) {
    summary.errors += 1;
    *summary.errors_by_reason.entry(reason).or_default() += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pusher::sign::{Request, check_request, decode_query};

    #[test]
    fn a_pusher_publish_is_a_signed_event_carrying_the_stamped_payload() {
        let app: App = "7:key:secret".parse().unwrap();
        let (url, path) =
            PublishPlan::pusher_target(HttpUrl::parse("http://h:9/pre").unwrap(), &app);
        assert_eq!(
            (url.prefix.as_str(), path.as_str()),
            ("", "/pre/apps/7/events")
        );
        let (target, body) = pusher_request(
            &app,
            "/apps/7/events",
            "bench-3",
            "17 2 xx",
            None,
            1_800_000_000,
        );
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            event,
            serde_json::json!({"name": "bench", "channel": "bench-3", "data": "17 2 xx"})
        );
        let (at, query) = target.split_once('?').unwrap();
        assert_eq!(at, "/apps/7/events");
        let pairs = decode_query(query).unwrap();
        let req = Request {
            method: "POST",
            path: at,
            query: &pairs,
            body: &body,
        };
        assert_eq!(check_request(&app, &req, 1_800_000_000), Ok(()));
        let (_, body) = pusher_request(&app, "/apps/7/events", "c", "d", Some("k-1"), 1);
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(event["idempotency_key"], "k-1");
    }

    #[test]
    fn a_failed_publish_says_what_the_socket_said() {
        let e = ClientError::Io {
            addr: "127.0.0.1:8080".into(),
            source: std::io::ErrorKind::TimedOut.into(),
        };
        assert_eq!(
            with_causes(&e),
            format!(
                "request to 127.0.0.1:8080 failed: {}",
                std::io::Error::from(std::io::ErrorKind::TimedOut)
            )
        );
    }
}
