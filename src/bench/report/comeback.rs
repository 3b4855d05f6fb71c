//! Push: subscribers the server let go of with a "come back" signal, and their
//! return: [`ComebackTally`] (what one process counted, merged across processes)
//! and [`ComebackReport`] (as reported). It must not hold connections: the
//! client loops mark each event.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::histogram::{Latency, add_pairs, histogram_pairs, new_histogram};

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
