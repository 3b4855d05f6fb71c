//! Renders `throng bench --report` pages from saved `--json` reports, so that a
//! change to the page's code can be checked against the pages it wrote before.
//!
//! Ignored by default. Run it before and after a change and compare the folders:
//!
//! ```text
//! REPORT_OUT=/tmp/report-before cargo test --release --test report_page -- --ignored
//! # change the code
//! REPORT_OUT=/tmp/report-after cargo test --release --test report_page -- --ignored
//! diff -r /tmp/report-before /tmp/report-after
//! ```
//!
//! The input is every report object (one with an `error_rule`) in
//! `bench/results/*.json` (or `REPORT_JSON_DIR`), drawn as saved, plus variants of
//! a few of them for what those runs did not do (echo, idle and chat modes, no
//! latency samples, no timeline, a timeline long enough to be averaged down,
//! failures, strings that need escaping). The JSON holds no histogram, so its
//! `[value, count]` pairs are made up from the saved percentiles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use throng::bench::html::{Page, command_line, render};
use throng::bench::report::{Latency, Machine, Phase, PushReport, Report, TimelineSample};

/// The fields of a saved report (`Report` itself only serializes).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Saved {
    mode: String,
    url: String,
    transport: Option<String>,
    conns: u64,
    processes: u64,
    threads: u64,
    attempted: u64,
    opened: u64,
    failed: u64,
    dropped: u64,
    failures: BTreeMap<String, u64>,
    connect_secs: f64,
    duration_secs: f64,
    sockets: u64,
    frames_total: u64,
    messages_total: u64,
    frames_per_min: f64,
    messages_per_min: f64,
    messages_sent: u64,
    messages_received_in_load: u64,
    throughput_msgs_per_sec: f64,
    sent_per_sec: f64,
    pings: u64,
    latency: Latency,
    lost_messages: u64,
    error_rate_pct: f64,
    errors: u64,
    samples: u64,
    error_rule: String,
    push: Option<PushReport>,
    client_cpu_secs: f64,
    client_cpu_pct_of_one_core: f64,
    client_max_rss_kb: u64,
    client_rss_per_conn_bytes: Option<f64>,
    timeline: Vec<SavedSample>,
}

#[derive(Deserialize)]
struct SavedSample {
    t_secs: f64,
    phase: String,
    open: u64,
    received_per_sec: f64,
    sent_per_sec: f64,
    #[serde(default)]
    pings_per_sec: f64,
    #[serde(default)]
    latency_avg_us: Option<f64>,
    failed: u64,
    dropped: u64,
}

impl Saved {
    fn into_report(self) -> Report {
        Report {
            mode: self.mode,
            url: self.url,
            transport: self.transport,
            conns: self.conns,
            processes: self.processes,
            threads: self.threads,
            attempted: self.attempted,
            opened: self.opened,
            failed: self.failed,
            dropped: self.dropped,
            failures: self.failures,
            connect_secs: self.connect_secs,
            duration_secs: self.duration_secs,
            sockets: self.sockets,
            frames_total: self.frames_total,
            messages_total: self.messages_total,
            frames_per_min: self.frames_per_min,
            messages_per_min: self.messages_per_min,
            messages_sent: self.messages_sent,
            messages_received_in_load: self.messages_received_in_load,
            throughput_msgs_per_sec: self.throughput_msgs_per_sec,
            sent_per_sec: self.sent_per_sec,
            pings: self.pings,
            latency: self.latency,
            lost_messages: self.lost_messages,
            error_rate_pct: self.error_rate_pct,
            errors: self.errors,
            samples: self.samples,
            error_rule: Box::leak(self.error_rule.into_boxed_str()),
            push: self.push,
            client_cpu_secs: self.client_cpu_secs,
            client_cpu_pct_of_one_core: self.client_cpu_pct_of_one_core,
            client_max_rss_kb: self.client_max_rss_kb,
            client_rss_per_conn_bytes: self.client_rss_per_conn_bytes,
            timeline: self
                .timeline
                .into_iter()
                .map(|s| TimelineSample {
                    t_secs: s.t_secs,
                    phase: if s.phase == "connect" {
                        Phase::Connect
                    } else {
                        Phase::Load
                    },
                    open: s.open,
                    received_per_sec: s.received_per_sec,
                    sent_per_sec: s.sent_per_sec,
                    pings_per_sec: s.pings_per_sec,
                    latency_avg_us: s.latency_avg_us,
                    failed: s.failed,
                    dropped: s.dropped,
                })
                .collect(),
        }
    }
}

/// Every object under `v` that has an `error_rule`, with where it was found.
fn reports(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(map) => {
            if map.contains_key("error_rule") {
                out.push((at.clone(), v.clone()));
            }
            for (k, child) in map {
                reports(child, format!("{at}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                reports(child, format!("{at}.{i}"), out);
            }
        }
        _ => {}
    }
}

/// Histogram pairs with roughly the saved percentiles.
fn pairs_for(l: &Latency) -> Vec<[u64; 2]> {
    if l.samples == 0 {
        return Vec::new();
    }
    let n = l.samples;
    vec![
        [l.median_us.max(1), n / 2 + 1],
        [l.p90_us.max(1), n * 4 / 10],
        [l.p95_us.max(1), n / 20],
        [l.p99_us.max(1), n / 25],
        [l.max_us.max(1), 1],
    ]
}

struct Case {
    name: String,
    report: Report,
    machine: Machine,
    settings: Vec<(&'static str, String)>,
    argv: Vec<String>,
}

fn machine() -> Machine {
    Machine {
        cores: 2,
        cpu_model: "Intel(R) Xeon(R) Processor".into(),
        kernel: "6.18.44-fc-v669".into(),
        memory_kb: 24_641_536,
        hostname: "bench-<1>".into(),
    }
}

fn settings(r: &Report) -> Vec<(&'static str, String)> {
    vec![
        ("mode", r.mode.clone()),
        ("url", r.url.clone()),
        ("connections", r.conns.to_string()),
        ("payload", "64 B & \"quoted\"".into()),
    ]
}

fn argv(r: &Report) -> Vec<String> {
    [
        "/x/throng",
        "bench",
        &r.mode,
        "--url",
        &r.url,
        "--api-key",
        "s3cret",
        "--report",
        "out dir/r.html",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Variants of `base` for what the saved runs did not do.
fn variants(stem: &str, base: &Report, out: &mut Vec<Case>) {
    let mut add = |suffix: &str, f: &dyn Fn(&mut Report), m: Machine| {
        let mut r = base.clone();
        f(&mut r);
        out.push(Case {
            name: format!("{stem}-{suffix}"),
            settings: settings(&r),
            argv: argv(&r),
            report: r,
            machine: m,
        });
    };
    let not_push = |r: &mut Report, mode: &str| {
        r.mode = mode.into();
        r.transport = None;
        r.push = None;
    };
    add("echo", &|r| not_push(r, "echo"), machine());
    add(
        "idle",
        &|r| {
            not_push(r, "idle");
            r.latency = Latency::default();
            for s in &mut r.timeline {
                s.latency_avg_us = None;
            }
        },
        Machine::default(),
    );
    add(
        "chat-failures",
        &|r| {
            not_push(r, "chat");
            r.url = "ws://h:1/{{title}}/<x>?a=1&b='2'".into();
            r.failed = 3;
            r.dropped = 2;
            r.lost_messages = 7;
            r.errors = 12;
            r.pings = 0;
            r.client_rss_per_conn_bytes = None;
            r.failures.insert("refused <econnrefused>".into(), 3);
            for (i, s) in r.timeline.iter_mut().enumerate() {
                s.failed = (i as u64).min(3);
                s.dropped = (i as u64 / 10).min(2);
                s.pings_per_sec = 0.0;
            }
        },
        machine(),
    );
    add(
        "push-errors",
        &|r| {
            r.errors = 1;
            r.dropped = 1;
            if let Some(p) = &mut r.push {
                p.foreign_seqs = 2;
                p.lost = 5;
                p.duplicated = 1;
                p.expected_deliveries = 0;
                p.publish_errors_by_reason.insert("status 503".into(), 4);
                p.comeback.lost = 10;
                p.comeback.back = 9;
                p.comeback.attempts = 30;
            }
        },
        machine(),
    );
    add(
        "no-timeline",
        &|r| {
            r.timeline.clear();
            r.latency = Latency::default();
        },
        machine(),
    );
    add(
        "long",
        &|r| {
            let one = r.timeline.clone();
            let span = one.last().map_or(1.0, |s| s.t_secs) + 1.0;
            r.timeline = (0..40)
                .flat_map(|k| {
                    one.iter()
                        .filter(move |s| k == 0 || s.phase == Phase::Load)
                        .map(move |s| {
                            let mut s = *s;
                            s.t_secs += k as f64 * span;
                            s
                        })
                })
                .collect();
        },
        machine(),
    );
}

fn json_dir() -> PathBuf {
    std::env::var_os("REPORT_JSON_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results"),
        PathBuf::from,
    )
}

#[test]
#[ignore = "renders pages for a before/after comparison; set REPORT_OUT"]
fn render_saved_reports() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(json_dir())
        .expect("the JSON folder")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    let mut varied = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a JSON file");
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let mut found = Vec::new();
        reports(&v, String::new(), &mut found);
        let stem = path
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into());
        for (at, value) in found {
            let saved: Saved = serde_json::from_value(value).expect("a saved report");
            let report = saved.into_report();
            let name = format!("{stem}{at}");
            if varied < 3 && report.timeline.len() > 20 {
                varied += 1;
                variants(&name, &report, &mut cases);
            }
            cases.push(Case {
                name,
                settings: settings(&report),
                argv: argv(&report),
                report,
                machine: machine(),
            });
        }
    }
    assert!(cases.len() > 10, "only {} reports found", cases.len());
    let out = std::env::var_os("REPORT_OUT").map(PathBuf::from);
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).expect("the output folder");
    }
    for (i, case) in cases.iter().enumerate() {
        let pairs = pairs_for(&case.report.latency);
        let html = render(&Page {
            report: &case.report,
            latency_pairs: &pairs,
            settings: &case.settings,
            machine: &case.machine,
            command: &command_line(&case.argv),
            started_unix_secs: 1_764_000_000 + i as u64 * 3_607,
        });
        assert!(html.ends_with("</html>\n"));
        if let Some(dir) = &out {
            std::fs::write(dir.join(format!("{}.html", case.name)), html).expect("written");
        }
    }
}
