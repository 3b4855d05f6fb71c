//! Unit tests of the page: escaping, the command line, number formats, axes and
//! buckets, the template's slots, and the size of a day-long run's page.

use super::super::{Machine, Phase, Report, TimelineSample};
use super::charts::MAX_POINTS;
use super::plot::{Axis, LogAxis, downsample, interval_starts, log_buckets, nice_step};
use super::template::{TEMPLATE, fill};
use super::text::{duration_label, rate, si, utc};
use super::{Esc, Page, command_line, escape, render};

#[test]
fn escaping_covers_markup_quotes_and_control_characters() {
    assert_eq!(
        escape(r#"<script>alert("x&'y')</script>"#),
        "&lt;script&gt;alert(&quot;x&amp;&#39;y&#39;)&lt;/script&gt;"
    );
    assert_eq!(escape("plain µs text"), "plain µs text");
    assert_eq!(escape("a\u{0}b\u{1b}c\nd"), "a\u{FFFD}b\u{FFFD}c\nd");
    assert_eq!(escape(""), "");
    assert_eq!(format!("<td>{}</td>", Esc("é<")), "<td>é&lt;</td>");
}

#[test]
fn command_lines_are_quoted_and_hide_the_api_key() {
    let argv: Vec<String> = [
        "/x/throng",
        "bench",
        "push",
        "--url",
        "http://h:1/sse/{channel}",
        "--api-key",
        "s3cret",
        "--api-key=other",
        "--token=eyJ.x.y",
        "--token",
        "eyJ.z.w",
        "--pusher-app",
        "1:k:psecret",
        "--pusher-secret=psecret",
        "it's",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = command_line(&argv);
    assert_eq!(
        c,
        r"throng bench push --url 'http://h:1/sse/{channel}' --api-key *** --api-key=*** --token=*** --token *** --pusher-app *** --pusher-secret=*** 'it'\''s'"
    );
    assert!(!c.contains("s3cret") && !c.contains("other") && !c.contains("eyJ"));
    assert!(!c.contains("psecret"));
}

#[test]
fn nice_steps_and_linear_axes() {
    assert_eq!(nice_step(0.7), 1.0);
    assert_eq!(nice_step(1.3), 2.0);
    assert_eq!(nice_step(3.0), 5.0);
    assert_eq!(nice_step(7.0), 10.0);
    assert_eq!(nice_step(17.4), 20.0);
    assert_eq!(nice_step(2000.0), 2000.0);
    let a = Axis::nice(0.0, 87.0, 5, false);
    assert_eq!((a.lo, a.hi, a.step), (0.0, 100.0, 20.0));
    assert_eq!(a.ticks(), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
    assert_eq!(a.frac(50.0), 0.5);
    // Small ranges: fractional steps, or 1 for counts.
    let a = Axis::nice(0.0, 0.3, 5, false);
    assert_eq!(a.ticks(), vec![0.0, 0.1, 0.2, 0.3]);
    let a = Axis::nice(0.0, 2.0, 5, true);
    assert_eq!((a.step, a.hi), (1.0, 2.0));
    // Nothing to show: still an axis.
    let a = Axis::nice(0.0, 0.0, 5, true);
    assert!(a.hi > a.lo && a.ticks().len() >= 2);
    // A max on a step stays the top.
    assert_eq!(Axis::nice(0.0, 10.0, 10, true).hi, 10.0);
}

#[test]
fn exact_axes_end_where_the_data_ends() {
    let a = Axis::exact(-2.8, 4.0, 10);
    assert_eq!((a.lo, a.hi, a.step), (-2.8, 4.0, 1.0));
    assert_eq!(a.ticks(), vec![-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
    assert!((a.frac(0.0) - 2.8 / 6.8).abs() < 1e-12);
    let a = Axis::exact(0.0, 125.0, 10);
    assert_eq!(a.step, 20.0);
    assert_eq!(a.ticks().last(), Some(&120.0));
    assert_eq!(a.hi, 125.0);
}

#[test]
fn sample_intervals_start_at_the_previous_sample_or_their_phase() {
    let at = |t: f64, phase| TimelineSample {
        t_secs: t,
        phase,
        open: 0,
        received_per_sec: 0.0,
        sent_per_sec: 0.0,
        pings_per_sec: 0.0,
        latency_avg_us: None,
        failed: 0,
        dropped: 0,
    };
    let s = [
        at(-1.8, Phase::Connect),
        at(-0.8, Phase::Connect),
        at(1.0, Phase::Load),
        at(2.0, Phase::Load),
    ];
    assert_eq!(interval_starts(&s, 2.8), vec![-2.8, -1.8, 0.0, 1.0]);
    assert_eq!(interval_starts(&s[2..], 0.05), vec![0.0, 1.0]);
}

#[test]
fn log_axes_snap_to_one_two_five_and_hold_the_max() {
    let a = LogAxis::covering(130.0, 870.0);
    assert_eq!((a.lo, a.hi), (100.0, 1000.0));
    assert_eq!(a.ticks(), vec![100.0, 200.0, 500.0, 1000.0]);
    // The max lies strictly inside, so the last bucket holds it.
    let a = LogAxis::covering(100.0, 500.0);
    assert_eq!((a.lo, a.hi), (100.0, 1000.0));
    assert!((a.frac(100.0)).abs() < 1e-12 && (a.frac(1000.0) - 1.0).abs() < 1e-12);
    // Many decades: powers of ten only.
    let a = LogAxis::covering(3.0, 2_000_000.0);
    assert_eq!((a.lo, a.hi), (2.0, 5_000_000.0));
    assert_eq!(
        a.ticks(),
        vec![10.0, 100.0, 1000.0, 10_000.0, 100_000.0, 1_000_000.0]
    );
    // Narrow: linear ticks inside the range.
    let a = LogAxis::covering(105.0, 130.0);
    assert_eq!((a.lo, a.hi), (100.0, 200.0));
    let t = a.ticks();
    assert!(
        t.len() >= 3 && t.iter().all(|v| (100.0..=200.0).contains(v)),
        "{t:?}"
    );
}

#[test]
fn log_buckets_keep_every_sample_in_its_place() {
    let pairs = [[100, 5], [150, 3], [999, 2], [1000, 1], [20_000, 4]];
    let axis = LogAxis::covering(100.0, 20_000.0);
    assert_eq!((axis.lo, axis.hi), (100.0, 50_000.0));
    let b = log_buckets(&pairs, &axis, 30);
    assert_eq!(b.len(), 30);
    assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 15);
    for &[v, n] in &pairs {
        let v = v as f64;
        let holder = b.iter().find(|b| b.from <= v && v < b.to).unwrap();
        assert!(holder.count >= n, "{v} not in its bucket");
    }
    assert_eq!(b[0].count, 5);
    // Buckets are equally wide on the log scale.
    let r0 = b[0].to / b[0].from;
    assert!(b.iter().all(|x| (x.to / x.from - r0).abs() < 1e-9));
}

#[test]
fn long_timelines_are_averaged_down() {
    let s: Vec<TimelineSample> = (0..1500)
        .map(|i| TimelineSample {
            t_secs: i as f64 + 1.0,
            phase: Phase::Load,
            open: i,
            received_per_sec: 10.0,
            sent_per_sec: (i % 2) as f64,
            pings_per_sec: 40.0,
            latency_avg_us: (i % 3 == 0).then_some(300.0),
            failed: 0,
            dropped: 0,
        })
        .collect();
    let d = downsample(&s, 600);
    assert!(d.len() <= 600 && d.len() >= 500, "{}", d.len());
    assert_eq!(d.last().unwrap().t_secs, 1500.0);
    assert_eq!(d.last().unwrap().open, 1499);
    assert!(d.iter().all(|x| x.received_per_sec == 10.0));
    assert!(d.iter().all(|x| x.pings_per_sec == 40.0));
    assert!(d.iter().all(|x| x.latency_avg_us == Some(300.0)));
    assert_eq!(downsample(&s[..10], 600).len(), 10);
}

#[test]
fn a_day_long_run_still_makes_a_small_page() {
    use crate::bench::report::{RawResult, RunInfo};
    let info = RunInfo {
        mode: "echo".into(),
        url: "ws://h:1/<x>".into(),
        conns: 100_000,
        threads: 2,
        echo: true,
        chat: false,
        transport: None,
    };
    let mut report = Report::build(&info, &RawResult::default(), None);
    report.timeline = (0..86_400)
        .map(|i| TimelineSample {
            t_secs: i as f64 + 1.0,
            phase: Phase::Load,
            open: 100_000,
            received_per_sec: 123_456.0 + (i % 7) as f64,
            sent_per_sec: 123_456.0,
            pings_per_sec: 40_000.0,
            latency_avg_us: Some(250.0 + (i % 13) as f64),
            failed: 0,
            dropped: i / 1000,
        })
        .collect();
    // Every value the histogram can hold, from 1 µs to 10 minutes.
    let pairs: Vec<[u64; 2]> = (0..60)
        .map(|i| [10u64.pow(i / 7).max(1) * (1 + i as u64 % 7), 1])
        .collect();
    let settings = [("url", "ws://h:1/<x>".to_string())];
    let html = render(&Page {
        report: &report,
        latency_pairs: &pairs,
        settings: &settings,
        machine: &Machine::default(),
        command: "throng bench echo --url 'ws://h:1/<x>'",
        started_unix_secs: 0,
    });
    assert!(html.len() < 200 * 1024, "{} bytes", html.len());
    assert!(html.contains("ws://h:1/&lt;x&gt;") && !html.contains("<x>"));
    for points in html.split("points=\"").skip(1) {
        let n = points.split('"').next().unwrap().split(' ').count();
        assert!(n <= MAX_POINTS, "{n} points");
    }
    assert!(html.matches("class=\"bar\"").count() > 10);
    assert!(html.contains("server pings"), "the pings' series is drawn");
}

#[test]
fn numbers_read_well() {
    assert_eq!(si(0.0), "0");
    assert_eq!(si(950.0), "950");
    assert_eq!(si(1500.0), "1.5k");
    assert_eq!(si(12_000.0), "12k");
    assert_eq!(si(2_500_000.0), "2.5M");
    assert_eq!(si(0.25), "0.25");
    assert_eq!(duration_label(250.0), "250 µs");
    assert_eq!(duration_label(1500.0), "1.5 ms");
    assert_eq!(duration_label(2_000_000.0), "2 s");
    assert_eq!(rate(12_345.6), "12,346");
    assert_eq!(rate(47.64), "47.6");
    assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
}

/// The `{{name}}` slots of a template, in order.
fn slots(template: &str) -> Vec<&str> {
    template
        .split("{{")
        .skip(1)
        .filter_map(|s| Some(s.split_once("}}")?.0))
        .collect()
}

#[test]
fn fill_puts_each_value_in_its_slot_once() {
    let filled = fill(
        "<p>{{a}} and {{b}}, {{a}} again; {{unknown}} {{ and }}</p>",
        &[("a", "A"), ("b", "{{a}}")],
    );
    // Values are not searched for slots; unknown names stay as written.
    assert_eq!(filled, "<p>A and {{a}}, A again; {{unknown}} {{ and }}</p>");
    assert_eq!(fill("no slots", &[("a", "A")]), "no slots");
    assert_eq!(fill("{{a}}", &[("a", "")]), "");
    assert_eq!(fill("{{", &[]), "{{");
}

#[test]
fn the_template_has_each_slot_once_and_render_fills_them_all() {
    let names = slots(TEMPLATE);
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert!(names.contains(&"css") && names.contains(&"timeline"));
    let info = crate::bench::report::RunInfo {
        mode: "push".into(),
        url: "http://h:1/sse/{channel}".into(),
        conns: 10,
        threads: 1,
        echo: false,
        chat: false,
        transport: Some("sse".into()),
    };
    let report = Report::build(
        &info,
        &crate::bench::report::RawResult::default(),
        Some(&crate::bench::report::PublishSummary::default()),
    );
    let html = render(&Page {
        report: &report,
        latency_pairs: &[],
        settings: &[],
        machine: &Machine::default(),
        command: "throng bench push",
        started_unix_secs: 0,
    });
    // (The CSS closes nested rules with `}}`; only an opening `{{` marks a slot.)
    assert!(!html.contains("{{"), "a slot left");
    assert!(html.starts_with("<!DOCTYPE html>\n") && html.ends_with("</html>\n"));
    assert!(html.contains("<style>\n:root{") && html.contains("}\n</style>"));
    assert!(html.contains("id=\"fanout\"") && html.contains("id=\"totals\""));
}
