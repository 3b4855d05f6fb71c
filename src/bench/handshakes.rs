//! `throng bench handshakes`: how many TLS handshakes a server completes per
//! second, full and resumed. Each of `--threads` threads opens connections one
//! after another (TCP connect, the handshake, a GET of `--url`'s path with
//! `Connection: close`, `close_notify`) until `--conns` are done or
//! `--duration` is over. The first pass never resumes (every handshake is
//! full); the second (left out with `--no-resume`) keeps rustls's in-memory
//! session cache, so after the first few a connection resumes with a ticket
//! an earlier one was given. Each pass reports its handshakes/s, how many
//! really resumed (rustls's `handshake_kind`), the handshake's time (from
//! ClientHello to done, the TCP connect left out), the protocol versions, the
//! answers' statuses, and failures by reason.
//!
//! It owns this mode's run and its report. The TLS config is `tls.rs`'s and the
//! connection `https.rs`'s; it must not touch the event loop or the other
//! modes' report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::HandshakeKind;
use serde::Serialize;

use super::BenchError;
use super::args::{BenchArgs, WsUrl};
use super::https;
use super::publish::with_causes;
use super::report::{Latency, histogram_pairs, new_histogram};
use super::tls::TlsTarget;
use crate::client::HttpUrl;

/// One pass: every connection with session resumption off, or on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pass {
    pub resumption: bool,
    pub attempted: u64,
    /// Handshakes completed (whatever came after).
    pub handshakes: u64,
    pub full: u64,
    pub resumed: u64,
    /// Connections that got their answer too.
    pub answered: u64,
    pub failed: u64,
    pub failures: BTreeMap<String, u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub versions: BTreeMap<String, u64>,
    pub secs: f64,
    pub handshakes_per_sec: f64,
    /// From ClientHello to the handshake's end, in microseconds.
    pub handshake_time: Latency,
    /// The threads' handshake times as `[value, count]` pairs, until merged
    /// into `handshake_time`.
    #[serde(skip)]
    pub(super) pairs: Vec<[u64; 2]>,
}

impl Pass {
    fn fail(&mut self, reason: String) {
        self.failed += 1;
        *self.failures.entry(reason).or_default() += 1;
    }

    fn merge(&mut self, other: Pass) {
        self.attempted += other.attempted;
        self.handshakes += other.handshakes;
        self.full += other.full;
        self.resumed += other.resumed;
        self.answered += other.answered;
        self.failed += other.failed;
        for (k, v) in other.failures {
            *self.failures.entry(k).or_default() += v;
        }
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        for (k, v) in other.versions {
            *self.versions.entry(k).or_default() += v;
        }
        self.pairs.extend(other.pairs);
    }
}

/// The whole run, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct HandshakeReport {
    pub mode: &'static str,
    pub url: String,
    pub threads: u64,
    pub conns: u64,
    pub passes: Vec<Pass>,
    pub errors: u64,
}

/// What every thread of one pass shares.
struct Shared {
    url: HttpUrl,
    target: TlsTarget,
    request: Vec<u8>,
    timeout: Duration,
    conns: u64,
    deadline: Instant,
    next: AtomicU64,
}

/// Runs both passes (one with `--no-resume`) and prints the report.
pub(super) fn run(
    args: &BenchArgs,
    url: &WsUrl,
    interrupted: &Arc<AtomicBool>,
) -> Result<(), BenchError> {
    let base = HttpUrl {
        host: url.host.clone(),
        port: url.port,
        prefix: String::new(),
    };
    let threads = args.threads().max(1);
    let mut passes = Vec::new();
    for resumption in [false, true] {
        if resumption && (args.tls.no_resume || interrupted.load(Ordering::Relaxed)) {
            break;
        }
        let shared = Arc::new(Shared {
            request: crate::client::encode_request(&base, "GET", &url.path, &[], &[], false),
            url: base.clone(),
            target: args.tls_target(&url.host, resumption)?,
            timeout: args.connect_timeout,
            conns: args.conns,
            deadline: Instant::now() + args.duration,
            next: AtomicU64::new(0),
        });
        let started = Instant::now();
        let mut workers = Vec::new();
        for id in 0..threads {
            let shared = Arc::clone(&shared);
            let interrupted = Arc::clone(interrupted);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("bench-tls-{id}"))
                    .spawn(move || connect_loop(&shared, &interrupted))?,
            );
        }
        let mut pass = Pass {
            resumption,
            ..Pass::default()
        };
        for w in workers {
            match w.join() {
                Ok(p) => pass.merge(p),
                Err(_) => pass.fail("a handshake thread panicked".into()),
            }
        }
        pass.secs = started.elapsed().as_secs_f64();
        pass.handshakes_per_sec = pass.handshakes as f64 / pass.secs.max(1e-9);
        pass.handshake_time = Latency::from_pairs(&std::mem::take(&mut pass.pairs));
        passes.push(pass);
    }
    let report = HandshakeReport {
        mode: "handshakes",
        url: args.url.clone(),
        threads: threads as u64,
        conns: args.conns,
        errors: passes.iter().map(|p| p.failed).sum(),
        passes,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Loop(format!("cannot encode the report: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", to_text(&report));
    }
    if report.errors > 0 && !args.allow_failures {
        return Err(BenchError::Failures(report.errors));
    }
    Ok(())
}

/// One thread: connections one after another until the pass's count or time
/// is used up.
fn connect_loop(shared: &Shared, interrupted: &AtomicBool) -> Pass {
    let mut pass = Pass::default();
    let mut times = new_histogram();
    let mut buf = Vec::new();
    let addr = shared.url.authority();
    while Instant::now() < shared.deadline
        && !interrupted.load(Ordering::Relaxed)
        && shared.next.fetch_add(1, Ordering::Relaxed) < shared.conns
    {
        pass.attempted += 1;
        let socket = match https::tcp(&shared.url, shared.timeout) {
            Ok(s) => s,
            Err(e) => {
                pass.fail(with_causes(&e));
                continue;
            }
        };
        let began = Instant::now();
        let mut stream = match https::handshake(socket, &addr, &shared.target) {
            Ok(s) => s,
            Err(e) => {
                pass.fail(with_causes(&e));
                continue;
            }
        };
        times.saturating_record((began.elapsed().as_micros() as u64).max(1));
        pass.handshakes += 1;
        match stream.conn.handshake_kind() {
            Some(HandshakeKind::Resumed) => pass.resumed += 1,
            _ => pass.full += 1,
        }
        if let Some(v) = stream.conn.protocol_version() {
            *pass.versions.entry(format!("{v:?}")).or_default() += 1;
        }
        match https::exchange(&mut stream, &addr, &shared.request, &mut buf) {
            Ok((answer, _)) => {
                pass.answered += 1;
                *pass.statuses.entry(answer.status).or_default() += 1;
            }
            Err(e) => pass.fail(with_causes(&e)),
        }
        // Best effort: the server may have closed already.
        stream.conn.send_close_notify();
        let _ = stream.conn.complete_io(&mut stream.sock);
    }
    pass.pairs = histogram_pairs(&times);
    pass
}

/// The text report: one block per pass.
pub fn to_text(r: &HandshakeReport) -> String {
    let ms = |us: f64| us / 1000.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "TLS handshakes against {} ({} threads, at most {} connections a pass)",
        r.url, r.threads, r.conns
    );
    for p in &r.passes {
        let _ = writeln!(
            out,
            "\nresumption {}: {} handshakes in {:.2} s = {:.1} handshakes/s",
            if p.resumption { "on" } else { "off" },
            p.handshakes,
            p.secs,
            p.handshakes_per_sec
        );
        let _ = writeln!(
            out,
            "  full {}, resumed {} | answered {} | failed {}",
            p.full, p.resumed, p.answered, p.failed
        );
        let t = &p.handshake_time;
        if t.samples > 0 {
            let _ = writeln!(
                out,
                "  handshake time: avg {:.3} ms, median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
                ms(t.avg_us),
                ms(t.median_us as f64),
                ms(t.p99_us as f64),
                ms(t.max_us as f64)
            );
        }
        if !p.versions.is_empty() {
            let list: Vec<String> = p
                .versions
                .iter()
                .map(|(v, n)| format!("{v} ×{n}"))
                .collect();
            let _ = writeln!(out, "  versions: {}", list.join(", "));
        }
        if !p.statuses.is_empty() {
            let list: Vec<String> = p
                .statuses
                .iter()
                .map(|(s, n)| format!("{s} ×{n}"))
                .collect();
            let _ = writeln!(out, "  answers: {}", list.join(", "));
        }
        for (reason, n) in &p.failures {
            let _ = writeln!(out, "  failed ×{n}: {reason}");
        }
    }
    out
}
