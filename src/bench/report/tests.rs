//! Unit tests of the report's numbers: seq tracking, merging, comebacks, the
//! timeline's rates and the report's rates.

use super::*;

#[test]
fn comebacks_merge_and_report_the_curve_and_time_away() {
    let mut a = ComebackTally::default();
    a.mark(1_000_050, 0);
    a.mark(1_000_120, 1);
    a.mark(1_000_180, 1);
    a.mark(1_000_250, 2);
    *a.reasons.entry("closed with code 1001".into()).or_default() += 1;
    let mut h = new_histogram();
    h.saturating_record(200);
    a.away_ms = histogram_pairs(&h);
    let mut b = ComebackTally::default();
    b.mark(1_000_099, 0);
    b.mark(1_000_130, 1);
    *b.reasons.entry("closed with code 1001".into()).or_default() += 1;
    let mut merged = a.clone();
    merged.merge(&b);
    assert_eq!((merged.lost, merged.attempts, merged.back), (2, 3, 1));
    let r = ComebackReport::build(&merged);
    assert_eq!(r.away_at_end, 1);
    assert_eq!(r.away_median_ms, 200);
    assert_eq!(r.peak_attempts_per_100ms, 3);
    assert_eq!(r.peak_back_per_100ms, 1);
    assert_eq!(r.reasons["closed with code 1001"], 2);
    assert_eq!(
        r.curve,
        vec![
            [1_000_000, 2, 0, 0],
            [1_000_100, 0, 3, 0],
            [1_000_200, 0, 0, 1]
        ]
    );
}

fn feed(t: &mut SeqTrack, seqs: &[u64]) -> SeqCounts {
    let mut c = SeqCounts::default();
    for &s in seqs {
        t.observe(s, &mut c);
    }
    c
}

#[test]
fn in_order_delivery_has_no_anomalies() {
    let mut t = SeqTrack::default();
    let c = feed(&mut t, &[5, 6, 7, 8]);
    assert_eq!(
        c,
        SeqCounts {
            received: 4,
            ..SeqCounts::default()
        }
    );
    assert_eq!((t.first, t.next), (5, 9));
}

#[test]
fn gaps_duplicates_and_late_arrivals() {
    let mut t = SeqTrack::default();
    let c = feed(&mut t, &[1, 2, 5, 5, 3, 3, 7]);
    // 3,4 skipped at 5; 6 skipped at 7; 3 arrived late (taken back), then a dup.
    assert_eq!(c.gaps, 2);
    assert_eq!(c.duplicated, 2);
    assert_eq!(c.out_of_order, 1);
    assert_eq!(c.received, 5);
}

#[test]
fn far_gaps_clear_the_window() {
    let mut t = SeqTrack::default();
    let c = feed(&mut t, &[1, 200, 199, 2]);
    assert_eq!(c.out_of_order, 2);
    assert_eq!(c.gaps, 198 - 2);
    assert_eq!(c.duplicated, 0);
}

#[test]
fn edge_loss_counts_head_tail_and_silent_subscribers() {
    let mut agg = ChannelAgg::default();
    let mut a = SeqTrack::default();
    feed(&mut a, &[10, 11, 12]); // published 10..=14: misses 13, 14
    let mut b = SeqTrack::default();
    feed(&mut b, &[12, 13, 14]); // misses 10, 11
    agg.add_track(&a);
    agg.add_track(&b);
    agg.add_track(&SeqTrack::default()); // saw nothing: misses 5
    assert_eq!(agg.edge_loss(Some((10, 14))), 2 + 2 + 5);
    assert_eq!(agg.edge_loss(None), 0);
}

#[test]
fn timeline_turns_counter_changes_into_rates() {
    let mut timeline = Timeline::default();
    let mut c = Counters {
        open_now: 10,
        ..Counters::default()
    };
    timeline.record(1.0, Phase::Load, &c, 0);
    c.messages_in = 30;
    c.pings = 8;
    timeline.record(3.0, Phase::Load, &c, 4);
    let samples = timeline.into_samples(1.0);
    let last = samples[1];
    assert_eq!(last.t_secs, 2.0);
    assert_eq!(last.received_per_sec, 15.0);
    assert_eq!(last.pings_per_sec, 4.0);
    assert_eq!(last.sent_per_sec, 2.0);
    assert_eq!(last.open, 10);
}

#[test]
fn publish_summary_tracks_ranges_and_merges() {
    let mut p = PublishSummary::default();
    p.record(1, 7);
    p.record(1, 5);
    let mut q = PublishSummary::default();
    q.record(0, 1);
    q.record(1, 9);
    p.merge(&q);
    assert_eq!(p.published, 4);
    assert_eq!(p.channels, vec![Some((1, 1, 1)), Some((5, 9, 3))]);
}

#[test]
fn publish_answer_times_give_quantiles_and_the_slow_ones() {
    use std::time::Duration;
    let mut p = PublishSummary::default();
    for ms in 1..=98 {
        p.answered_after(Duration::from_micros(ms * 1000 - 300));
    }
    let mut q = PublishSummary::default();
    q.answered_after(Duration::from_millis(1500));
    q.answered_after(Duration::from_micros(1_000_001));
    p.merge(&q);
    let report = PushReport::build(&RawResult::default(), &p);
    assert_eq!(report.publish_answer_p50_ms, 50);
    assert_eq!(report.publish_answer_p99_ms, 1001);
    assert_eq!(report.publish_answer_max_ms, 1500);
    assert_eq!(report.publish_answers_over_1s, 2);
}

#[test]
fn merging_results_adds_counters_and_histograms() {
    let mut h1 = new_histogram();
    h1.saturating_record(100);
    h1.saturating_record(200);
    let mut h2 = new_histogram();
    h2.saturating_record(1_000_000);
    let mut a = RawResult {
        latency_us: histogram_pairs(&h1),
        processes: 1,
        ..RawResult::default()
    };
    a.counters.opened = 3;
    a.failures.insert("refused".into(), 1);
    let mut b = RawResult {
        latency_us: histogram_pairs(&h2),
        processes: 1,
        load_secs: 2.0,
        ..RawResult::default()
    };
    b.counters.opened = 4;
    b.failures.insert("refused".into(), 2);
    b.failures.insert("timed out".into(), 1);
    a.merge(&b);
    assert_eq!(a.counters.opened, 7);
    assert_eq!(a.processes, 2);
    assert_eq!(a.load_secs, 2.0);
    assert_eq!(a.failures["refused"], 3);
    assert_eq!(a.failures["timed out"], 1);
    let l = Latency::from_pairs(&a.latency_us);
    assert_eq!(l.samples, 3);
    assert!(l.max_us >= 999_000 && l.max_us <= 1_001_000);
    assert!(l.median_us >= 199 && l.median_us <= 201);
}

#[test]
fn timeline_samples_are_rates_over_each_interval() {
    let mut t = Timeline::default();
    let c = |open, msgs_in, lat_n, lat_sum| Counters {
        open_now: open,
        messages_in: msgs_in,
        latency_samples: lat_n,
        latency_us_sum: lat_sum,
        ..Counters::default()
    };
    t.record(1.0, Phase::Connect, &c(5, 0, 0, 0), 0);
    // A short tail of the connect phase only moves the starting point.
    t.close_phase(1.2, Phase::Connect, &c(10, 4, 0, 0), 0);
    t.record(2.2, Phase::Load, &c(10, 104, 100, 50_000), 100);
    t.close_phase(2.8, Phase::Load, &c(9, 164, 100, 50_000), 130);
    let s = t.into_samples(1.2);
    assert_eq!(s.len(), 3);
    assert!((s[0].t_secs + 0.2).abs() < 1e-9 && (s[1].t_secs - 1.0).abs() < 1e-9);
    assert_eq!((s[0].open, s[0].received_per_sec), (5, 0.0));
    assert_eq!(s[1].phase, Phase::Load);
    assert!((s[1].received_per_sec - 100.0).abs() < 1e-9);
    assert!((s[1].sent_per_sec - 100.0).abs() < 1e-9);
    assert_eq!(s[1].latency_avg_us, Some(500.0));
    assert!((s[2].received_per_sec - 100.0).abs() < 1e-6);
    assert!((s[2].sent_per_sec - 50.0).abs() < 1e-6);
    assert_eq!(s[2].latency_avg_us, None);
    assert_eq!(s[2].open, 9);
}

#[test]
fn report_rates_use_the_load_window() {
    let mut raw = RawResult {
        load_secs: 10.0,
        connect_secs: 1.0,
        processes: 1,
        ..RawResult::default()
    };
    raw.counters = Counters {
        target: 10,
        attempted: 10,
        opened: 9,
        failed: 1,
        messages_in: 1200,
        messages_out: 1200,
        frames_in: 1210,
        ..Counters::default()
    };
    raw.at_load_end = Counters {
        messages_in: 1100,
        frames_in: 1100,
        messages_out: 1100,
        ..Counters::default()
    };
    raw.at_load_start.messages_in = 100;
    raw.at_load_start.frames_in = 100;
    let info = RunInfo {
        transport: None,
        mode: "echo".into(),
        url: "ws://x".into(),
        conns: 10,
        threads: 1,
        echo: true,
        chat: false,
    };
    let r = Report::build(&info, &raw, None);
    assert_eq!(r.messages_per_min, 6000.0);
    assert_eq!(r.throughput_msgs_per_sec, 100.0);
    assert_eq!(r.connection_failures(), 1);
    assert_eq!(r.errors, 1);
    assert!(r.to_text().contains("MESSAGES_PER_MIN: 6000.0"));
}
