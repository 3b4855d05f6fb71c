//! Push: the publisher's side, subscribers that came back, and the fan-out check.
//!
//! Owns [`PublishSummary`] (the seqs the API returned per channel),
//! [`ComebackTally`] / [`ComebackReport`] (subscribers the server let go and their
//! return) and [`PushReport`], which sets what was published against what was
//! delivered. It must not publish or hold connections: the drivers feed it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::counters::RawResult;
use super::histogram::{Latency, add_pairs, histogram_pairs, new_histogram};

/// What the publisher did, per channel: the seqs the API returned.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishSummary {
    pub published: u64,
    pub errors: u64,
    pub errors_by_reason: BTreeMap<String, u64>,
    /// Per channel: (first seq, last seq, count) of this run's publishes.
    pub channels: Vec<Option<(u64, u64, u64)>>,
}

impl PublishSummary {
    pub fn record(&mut self, channel: usize, seq: u64) {
        self.published += 1;
        if self.channels.len() <= channel {
            self.channels.resize(channel + 1, None);
        }
        let slot = &mut self.channels[channel];
        *slot = Some(match *slot {
            None => (seq, seq, 1),
            Some((lo, hi, n)) => (lo.min(seq), hi.max(seq), n + 1),
        });
    }

    pub fn merge(&mut self, o: &PublishSummary) {
        self.published += o.published;
        self.errors += o.errors;
        for (k, v) in &o.errors_by_reason {
            *self.errors_by_reason.entry(k.clone()).or_default() += v;
        }
        for (i, c) in o.channels.iter().enumerate() {
            if let Some((lo, hi, n)) = *c {
                if self.channels.len() <= i {
                    self.channels.resize(i + 1, None);
                }
                let slot = &mut self.channels[i];
                *slot = Some(match *slot {
                    None => (lo, hi, n),
                    Some((a, b, m)) => (a.min(lo), b.max(hi), m + n),
                });
            }
        }
    }
}

/// Push: subscribers the server let go of with a "come back" signal (1001, a
/// reset, a 502 from a proxy ...), and how they came back (`--backoff`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComebackTally {
    /// Times a subscriber was let go and set to come back.
    pub lost: u64,
    /// Times one was back: its request sent again on a new connection.
    pub back: u64,
    /// Connect attempts made to come back, the failed ones included.
    pub attempts: u64,
    /// Time away per return, in ms, as histogram pairs.
    pub away_ms: Vec<[u64; 2]>,
    /// Per 100 ms of wall-clock time (unix ms / 100): [lost, attempts, back].
    pub curve: BTreeMap<u64, [u64; 3]>,
    /// Why they were let go, and why tries to come back failed.
    pub reasons: BTreeMap<String, u64>,
}

impl ComebackTally {
    /// Counts one event in the 100 ms slot of `unix_ms`: 0 lost, 1 attempt, 2 back.
    pub fn mark(&mut self, unix_ms: u64, what: usize) {
        self.curve.entry(unix_ms / 100).or_default()[what] += 1;
        match what {
            0 => self.lost += 1,
            1 => self.attempts += 1,
            _ => self.back += 1,
        }
    }

    pub fn merge(&mut self, o: &ComebackTally) {
        self.lost += o.lost;
        self.back += o.back;
        self.attempts += o.attempts;
        let mut h = new_histogram();
        add_pairs(&mut h, &self.away_ms);
        add_pairs(&mut h, &o.away_ms);
        self.away_ms = histogram_pairs(&h);
        for (slot, v) in &o.curve {
            let mine = self.curve.entry(*slot).or_default();
            for (m, t) in mine.iter_mut().zip(v) {
                *m += t;
            }
        }
        for (k, v) in &o.reasons {
            *self.reasons.entry(k.clone()).or_default() += v;
        }
    }
}

/// Push: how the subscribers the server let go came back, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComebackReport {
    pub lost: u64,
    pub back: u64,
    /// Still away when the run ended.
    pub away_at_end: u64,
    pub attempts: u64,
    /// Time from being let go to being back, in ms.
    pub away_median_ms: u64,
    pub away_p99_ms: u64,
    pub away_max_ms: u64,
    /// The busiest 100 ms for connect attempts, and for returns.
    pub peak_attempts_per_100ms: u64,
    pub peak_back_per_100ms: u64,
    /// Why they were let go, and why tries to come back failed.
    pub reasons: BTreeMap<String, u64>,
    /// The reconnect curve: [unix ms, lost, attempts, back] per 100 ms slot with any.
    pub curve: Vec<[u64; 4]>,
}

impl ComebackReport {
    pub fn build(t: &ComebackTally) -> ComebackReport {
        let away = Latency::from_pairs(&t.away_ms);
        ComebackReport {
            lost: t.lost,
            back: t.back,
            away_at_end: t.lost.saturating_sub(t.back),
            attempts: t.attempts,
            away_median_ms: away.median_us,
            away_p99_ms: away.p99_us,
            away_max_ms: away.max_us,
            peak_attempts_per_100ms: t.curve.values().map(|v| v[1]).max().unwrap_or(0),
            peak_back_per_100ms: t.curve.values().map(|v| v[2]).max().unwrap_or(0),
            reasons: t.reasons.clone(),
            curve: t
                .curve
                .iter()
                .map(|(slot, v)| [slot * 100, v[0], v[1], v[2]])
                .collect(),
        }
    }
}

/// Push mode's fan-out check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushReport {
    pub published: u64,
    pub publish_errors: u64,
    pub publish_errors_by_reason: BTreeMap<String, u64>,
    /// Σ over subscribers open at the end of the messages published to their channel.
    pub expected_deliveries: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Channels whose seqs were not all ours (another publisher was active).
    pub foreign_seqs: u64,
    /// Subscribers dropped on purpose and resumed during the load (`--reconnect`).
    pub reconnects: u64,
    /// Gaps the server reported to resuming subscribers.
    pub server_reported_gaps: u64,
    /// Subscribers the server let go with a "come back" signal, and their return.
    #[serde(default)]
    pub comeback: ComebackReport,
}

impl PushReport {
    pub fn build(raw: &RawResult, publish: &PublishSummary) -> PushReport {
        let mut expected = 0u64;
        let mut edge = 0u64;
        let mut foreign = 0u64;
        for (i, agg) in raw.channels.iter().enumerate() {
            let range = publish.channels.get(i).copied().flatten();
            if let Some((lo, hi, n)) = range {
                expected += agg.subs * (hi - lo + 1);
                if hi - lo + 1 != n {
                    foreign += 1;
                }
            }
            edge += agg.edge_loss(range.map(|(lo, hi, _)| (lo, hi)));
        }
        PushReport {
            published: publish.published,
            publish_errors: publish.errors,
            publish_errors_by_reason: publish.errors_by_reason.clone(),
            expected_deliveries: expected,
            delivered: raw.seq.received,
            lost: raw.seq.gaps + edge,
            duplicated: raw.seq.duplicated,
            out_of_order: raw.seq.out_of_order,
            foreign_seqs: foreign,
            reconnects: raw.counters.reconnects,
            server_reported_gaps: raw.seq.reported_gaps,
            comeback: ComebackReport::build(&raw.comeback),
        }
    }
}
