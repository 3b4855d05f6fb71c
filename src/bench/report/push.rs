//! Push: the publisher's side, subscribers that came back, and the fan-out check.
//!
//! Owns [`PublishSummary`] (the seqs the API returned per channel) and
//! [`PushReport`], which sets what was published against what was delivered
//! (with the subscribers that came back, `comeback`). It must not publish or hold connections: the drivers feed it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::comeback::ComebackReport;
use super::counters::RawResult;

/// What the publisher did, per channel: the seqs the API returned.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishSummary {
    pub published: u64,
    pub errors: u64,
    pub errors_by_reason: BTreeMap<String, u64>,
    /// Per channel: (first seq, last seq, count) of this run's publishes.
    pub channels: Vec<Option<(u64, u64, u64)>>,
    /// How long the server took to answer each accepted publish: a count per whole
    /// millisecond (rounded up), so a long run at a high rate stays small.
    #[serde(default)]
    pub answered_ms: BTreeMap<u64, u64>,
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

    /// Notes that a publish was answered after `took`.
    pub fn answered_after(&mut self, took: std::time::Duration) {
        let ms = took.as_micros().div_ceil(1000) as u64;
        *self.answered_ms.entry(ms).or_default() += 1;
    }

    /// The answer time (ms) that `fraction` of the answered publishes took at most.
    fn answer_quantile_ms(&self, fraction: f64) -> u64 {
        let total: u64 = self.answered_ms.values().sum();
        let wanted = ((total as f64) * fraction).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (&ms, &n) in &self.answered_ms {
            seen += n;
            if seen >= wanted {
                return ms;
            }
        }
        0
    }

    pub fn merge(&mut self, o: &PublishSummary) {
        self.published += o.published;
        for (ms, n) in &o.answered_ms {
            *self.answered_ms.entry(*ms).or_default() += n;
        }
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

/// Push mode's fan-out check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushReport {
    pub published: u64,
    pub publish_errors: u64,
    pub publish_errors_by_reason: BTreeMap<String, u64>,
    /// How long accepted publishes waited for their answer (whole ms, rounded up);
    /// a publish that got none is among the errors.
    #[serde(default)]
    pub publish_answer_p50_ms: u64,
    #[serde(default)]
    pub publish_answer_p99_ms: u64,
    #[serde(default)]
    pub publish_answer_max_ms: u64,
    /// Accepted publishes answered after more than a second.
    #[serde(default)]
    pub publish_answers_over_1s: u64,
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
            publish_answer_p50_ms: publish.answer_quantile_ms(0.5),
            publish_answer_p99_ms: publish.answer_quantile_ms(0.99),
            publish_answer_max_ms: publish.answered_ms.keys().next_back().copied().unwrap_or(0),
            publish_answers_over_1s: publish.answered_ms.range(1001..).map(|(_, n)| n).sum(),
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
