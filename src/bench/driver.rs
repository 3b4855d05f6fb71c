//! The run of `throng bench`: starts the fleet (this process's loops or `--procs`
//! children), drives the timeline (connect at `--rate` behind a progress bar, load
//! for `--duration` with a status line every `--interval`, drain for `--grace`,
//! close), samples the counters once a second, and prints the report (text or
//! JSON, and `--report`'s HTML page).
//!
//! It owns the phases' order and timing and the status lines. It must not hold
//! connections (the [`Fleet`]'s loops do) or compute figures (the report does).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::args::{BenchArgs, Mode, Protocol};
use super::client::phase;
use super::fleet::{self, ChildFleet, Fleet, LocalFleet};
use super::handshakes;
use super::publish::{PublishPlan, Publisher};
use super::report::{
    self, Counters, Machine, Phase, PublishSummary, RawResult, Report, RunInfo, Timeline,
    TimelineSample,
};
use super::setup::split_conns;
use super::{BenchError, html};

/// Runs `throng bench`. Prints the report (or JSON) on stdout; returns
/// [`BenchError::Failures`] after the report when connections failed or dropped.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    let started = SystemTime::now();
    let url = args.validate()?;
    let plan = args.plan(&url)?;
    // Ctrl-C (or SIGTERM) ends the load early and still prints the report; a second
    // one exits at once. Children ignore the terminal's Ctrl-C: their parent, which
    // got it too, tells them when to stop.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if args.child_index.is_none() {
            signal_hook::flag::register_conditional_shutdown(
                signal,
                130,
                Arc::clone(&interrupted),
            )?;
        }
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    if args.mode == Mode::Handshakes {
        return handshakes::run(&args, &url, &interrupted);
    }
    if args.child_index.is_some() {
        return fleet::run_child(plan);
    }
    let mut fleet: Box<dyn Fleet> = if args.procs > 1 {
        let ips = args.source_ips.as_ref().map(|s| s.0.as_slice());
        let lists = split_conns(args.conns, args.procs)
            .into_iter()
            .enumerate()
            .map(|(i, (offset, n))| {
                let slice = ips.map(|ips| {
                    if ips.len() >= args.procs {
                        let per = ips.len() / args.procs;
                        &ips[i * per..(i + 1) * per]
                    } else {
                        ips
                    }
                });
                args.child_args(i, offset, n, slice)
            })
            .collect();
        // The Pusher app (its secret) as the children's THRONG_PUSHER_APP.
        let pusher_app = match args.protocol {
            Protocol::Pusher => args
                .pusher()?
                .map(|a| format!("{}:{}:{}", a.id, a.key, a.secret)),
            Protocol::Throng => None,
        };
        let secrets: Vec<(&str, &str)> = args
            .token
            .as_deref()
            .map(|t| ("THRONG_TOKEN", t))
            .into_iter()
            .chain(pusher_app.as_deref().map(|a| ("THRONG_PUSHER_APP", a)))
            .collect();
        Box::new(ChildFleet::spawn(lists, &secrets)?)
    } else {
        Box::new(LocalFleet::start(plan)?)
    };
    let publisher = if args.mode == Mode::Push {
        Some(args.publish_plan()?)
    } else {
        None
    };
    let Driven {
        timing,
        publish,
        timeline,
    } = drive(&args, fleet.as_mut(), publisher, &interrupted)?;
    let raw = {
        let mut merged = fleet.finish()?;
        merged.at_load_start = timing.at_load_start;
        merged.at_load_end = timing.at_load_end;
        merged.load_secs = timing.load_secs;
        merged.connect_secs = timing.connect_secs;
        if args.procs > 1 {
            // The parent's own share: the publisher and the bookkeeping.
            merged.cpu_secs += report::self_cpu_secs();
            merged.max_rss_kb += report::proc_status_kb("VmHWM");
        }
        merged
    };
    let info = RunInfo {
        mode: args.mode.name().into(),
        url: args.url.clone(),
        conns: args.conns,
        threads: args.threads() as u64,
        echo: args.mode == Mode::Echo,
        chat: args.mode == Mode::Chat,
        transport: match args.protocol {
            Protocol::Pusher => Some("pusher".into()),
            Protocol::Throng => {
                (args.mode == Mode::Push).then(|| args.transport.name().to_string())
            }
        },
    };
    let mut report = Report::build(&info, &raw, publish.as_ref());
    report.timeline = timeline;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Loop(format!("cannot encode the report: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", report.to_text());
    }
    if let Some(path) = &args.report {
        write_html(&args, &report, &raw.latency_us, started, path)?;
    }
    let failures = report.errors;
    if failures > 0 && !args.allow_failures {
        return Err(BenchError::Failures(failures));
    }
    Ok(())
}

/// `--report`: renders the HTML page and writes it.
fn write_html(
    args: &BenchArgs,
    report: &Report,
    latency_pairs: &[[u64; 2]],
    started: SystemTime,
    path: &Path,
) -> Result<(), BenchError> {
    let argv: Vec<String> = std::env::args().collect();
    let page = html::Page {
        report,
        latency_pairs,
        settings: &args.report_settings(),
        machine: &Machine::detect(),
        command: &html::command_line(&argv),
        started_unix_secs: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let text = html::render(&page);
    std::fs::write(path, &text).map_err(|source| BenchError::Report {
        path: path.display().to_string(),
        source,
    })?;
    eprintln!(
        "HTML report written to {} ({} kB)",
        path.display(),
        text.len().div_ceil(1024)
    );
    Ok(())
}

/// How often the driver samples the fleet's counters for the timeline.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What [`drive`] hands back; the caller then finishes the fleet.
struct Driven {
    /// The timing figures, in a `RawResult` whose other fields are empty.
    timing: RawResult,
    /// Push: the publisher's summary.
    publish: Option<PublishSummary>,
    timeline: Vec<TimelineSample>,
}

/// The next sampling moment after `now`, on the `from + k * SAMPLE_EVERY` grid
/// (a late wake-up skips the moments it missed rather than sampling in a burst).
fn next_sample_after(from: Instant, now: Instant) -> Instant {
    let k = (now.saturating_duration_since(from).as_secs_f64() / SAMPLE_EVERY.as_secs_f64()).floor()
        as u32;
    from + SAMPLE_EVERY * (k + 1)
}

/// The timeline: connect, load, drain, close; the counters sampled once a second.
fn drive(
    args: &BenchArgs,
    fleet: &mut dyn Fleet,
    publish: Option<PublishPlan>,
    interrupted: &AtomicBool,
) -> Result<Driven, BenchError> {
    let t0 = Instant::now();
    let secs = |at: Instant| at.saturating_duration_since(t0).as_secs_f64();
    let mut timeline = Timeline::default();
    let mut next_sample = t0 + SAMPLE_EVERY;
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(Some(args.conns), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "connecting {bar:40} {pos}/{len} ({per_sec}, {elapsed}) {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    };
    // With --json there is no bar: a status line every --interval says how far it got.
    let mut next_status = (args.json && !args.interval.is_zero()).then(|| t0 + args.interval);
    loop {
        if let Some(why) = fleet.broken() {
            bar.abandon();
            return Err(BenchError::Child {
                index: 0,
                reason: why,
            });
        }
        let c = fleet.live();
        let now = Instant::now();
        if now >= next_sample {
            timeline.record(secs(now), Phase::Connect, &c, c.messages_out);
            next_sample = next_sample_after(t0, now);
        }
        if let Some(at) = next_status
            && now >= at
        {
            eprintln!(
                "[connecting {:6.1}s] open {} of {} | failed {}",
                secs(now),
                c.open_now,
                args.conns,
                c.failed
            );
            next_status = Some(at + args.interval);
        }
        bar.set_position(c.opened + c.failed);
        if c.failed > 0 {
            bar.set_message(format!("{} failed", c.failed));
        }
        if c.target >= args.conns && c.connecting_done() {
            break;
        }
        if interrupted.load(Ordering::Relaxed) {
            eprintln!("interrupted while connecting: reporting what is open");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bar.finish_and_clear();
    let connect_secs = t0.elapsed().as_secs_f64();
    let at_load_start = fleet.live();
    // Push's senders are the publisher's threads, which start with the load.
    let push = args.mode == Mode::Push;
    let start_sent = if push { 0 } else { at_load_start.messages_out };
    timeline.close_phase(connect_secs, Phase::Connect, &at_load_start, start_sent);
    eprintln!(
        "opened {}/{} connections in {connect_secs:.2} s ({} failed); load for {:?}",
        at_load_start.opened, args.conns, at_load_start.failed, args.duration
    );
    fleet.set_phase(phase::LOAD)?;
    let load_t0 = Instant::now();
    let publisher = match publish {
        Some(p) => Some(Publisher::start(p)?),
        None => None,
    };
    let sent = |c: &Counters, publisher: &Option<Publisher>| match publisher {
        Some(p) => p.published(),
        None if push => 0,
        None => c.messages_out,
    };
    let end = load_t0 + args.duration;
    let mut last = at_load_start;
    // Sent (push: published) as of the last status line.
    let mut last_sent = start_sent;
    let mut last_t = load_t0;
    let mut next_status = (!args.interval.is_zero()).then(|| load_t0 + args.interval);
    let mut next_sample = load_t0 + SAMPLE_EVERY;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if interrupted.load(Ordering::Relaxed) {
            eprintln!("interrupted: ending the load early (Ctrl-C again exits at once)");
            break;
        }
        if let Some(why) = fleet.broken() {
            return Err(BenchError::Child {
                index: 0,
                reason: why,
            });
        }
        if now >= next_sample {
            let c = fleet.live();
            timeline.record(secs(now), Phase::Load, &c, sent(&c, &publisher));
            next_sample = next_sample_after(load_t0, now);
        }
        if let Some(at) = next_status
            && now >= at
        {
            let c = fleet.live();
            let sent_now = sent(&c, &publisher);
            eprintln!(
                "{}",
                status_line(
                    &c,
                    &last,
                    (sent_now, last_sent),
                    (now - last_t).as_secs_f64(),
                    (now - load_t0).as_secs_f64()
                )
            );
            last = c;
            last_sent = sent_now;
            last_t = now;
            next_status = Some(at + args.interval);
        }
        let mut wait = (end - now).min(next_sample.saturating_duration_since(now));
        if let Some(at) = next_status {
            wait = wait.min(at.saturating_duration_since(now));
        }
        std::thread::sleep(wait.min(Duration::from_millis(200)));
    }
    let at_load_end = fleet.live();
    let load_end = Instant::now();
    let load_secs = (load_end - load_t0).as_secs_f64();
    timeline.close_phase(
        secs(load_end),
        Phase::Load,
        &at_load_end,
        sent(&at_load_end, &publisher),
    );
    let summary = publisher.map(Publisher::stop);
    fleet.set_phase(phase::DRAIN)?;
    // Let what is in flight land: echoes come back, deliveries arrive.
    let grace_end = Instant::now() + args.grace;
    while Instant::now() < grace_end {
        if args.mode == Mode::Echo && fleet.live().in_flight == 0 {
            break;
        }
        if args.mode == Mode::Idle {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    fleet.set_phase(phase::CLOSE)?;
    let timing = RawResult {
        at_load_start,
        at_load_end,
        load_secs,
        connect_secs,
        ..RawResult::default()
    };
    Ok(Driven {
        timing,
        publish: summary,
        timeline: timeline.into_samples(connect_secs),
    })
}

/// One status line: open sockets, rates over the last interval, failures.
/// `sent`: messages sent (push: published) now and at the previous line.
pub(super) fn status_line(
    c: &Counters,
    last: &Counters,
    sent: (u64, u64),
    secs: f64,
    since_start: f64,
) -> String {
    let secs = secs.max(1e-9);
    let samples = c.latency_samples.saturating_sub(last.latency_samples);
    let latency = if samples > 0 {
        let sum = c.latency_us_sum.saturating_sub(last.latency_us_sum);
        format!(
            " | latency avg {:.3} ms",
            sum as f64 / samples as f64 / 1000.0
        )
    } else {
        String::new()
    };
    format!(
        "[{since_start:6.1}s] open {} | received {} msgs ({:.0}/s) | sent {} ({:.0}/s){latency} | pings {} | failed {} dropped {}",
        c.open_now,
        c.messages_in,
        c.messages_in.saturating_sub(last.messages_in) as f64 / secs,
        sent.0,
        sent.0.saturating_sub(sent.1) as f64 / secs,
        c.pings,
        c.failed,
        c.dropped
    )
}
