//! The latency histogram and the figures read from it.
//!
//! Owns the histogram's bounds and precision, its `[value, count]` pairs (how
//! children hand theirs to the parent, and how results merge) and [`Latency`], the
//! percentiles a report shows. It must not know what was timed or where the
//! samples came from.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency the histogram holds, in microseconds (10 minutes); larger
/// samples are recorded as this value.
const MAX_LATENCY_US: u64 = 600_000_000;

/// A latency histogram in microseconds with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

/// The histogram as `[value, count]` pairs (what children send their parent).
pub fn histogram_pairs(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect()
}

/// Adds `[value, count]` pairs into a histogram.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[[u64; 2]]) {
    for [value, count] in pairs {
        h.saturating_record_n((*value).clamp(1, MAX_LATENCY_US), *count);
    }
}

/// Latency figures in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub samples: u64,
    pub avg_us: f64,
    pub median_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Latency {
    pub fn from_pairs(pairs: &[[u64; 2]]) -> Latency {
        let mut h = new_histogram();
        add_pairs(&mut h, pairs);
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            samples: h.len(),
            avg_us: h.mean(),
            median_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p95_us: h.value_at_quantile(0.95),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        }
    }
}
