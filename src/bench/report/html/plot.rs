//! The maths behind the charts: axes, ticks, log-scale buckets, timeline points.
//!
//! Owns linear axes with "nice" 1-2-5 steps ([`Axis`]), the histogram's log axis
//! ([`LogAxis`]) and its buckets, averaging a long timeline down, and where each
//! sample's interval starts. Pure numbers: it must not write SVG or HTML.

use super::super::{Phase, TimelineSample};

/// The smallest 1, 2 or 5 × 10^k at least `raw` (> 0).
pub(super) fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let f = raw / p;
    let n = if f <= 1.0 + 1e-9 {
        1.0
    } else if f <= 2.0 + 1e-9 {
        2.0
    } else if f <= 5.0 + 1e-9 {
        5.0
    } else {
        10.0
    };
    n * p
}

/// A linear axis from `lo` to `hi`, ticks every `step`; all three "nice" numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Axis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) step: f64,
}

impl Axis {
    /// Covers `min..=max` with about `ticks` intervals; `integer` keeps the step
    /// at 1 or more (counts of things).
    pub(super) fn nice(min: f64, max: f64, ticks: usize, integer: bool) -> Axis {
        let (min, max) = if min.is_finite() && max.is_finite() && max > min {
            (min, max)
        } else {
            let m = if min.is_finite() { min } else { 0.0 };
            (m, m + 1.0)
        };
        let mut step = nice_step((max - min) / ticks.max(1) as f64);
        if integer {
            step = step.max(1.0);
        }
        let lo = (min / step).floor() * step;
        let mut hi = (max / step).ceil() * step;
        if hi <= lo {
            hi = lo + step;
        }
        Axis { lo, hi, step }
    }

    /// Exactly `min..=max` (a time axis that ends where the data ends), ticks on
    /// the multiples of a nice step inside it.
    pub(super) fn exact(min: f64, max: f64, ticks: usize) -> Axis {
        let nice = Axis::nice(min, max, ticks, true);
        let (lo, hi) = if max > min {
            (min, max)
        } else {
            (nice.lo, nice.hi)
        };
        Axis {
            lo,
            hi,
            step: nice.step,
        }
    }

    /// The multiples of `step` from `lo` to `hi`.
    pub(super) fn ticks(&self) -> Vec<f64> {
        let first = (self.lo / self.step - 1e-9).ceil() as i64;
        let last = (self.hi / self.step + 1e-9).floor() as i64;
        // Rounded to the step's decimals: 3 × 0.1 is 0.30000000000000004.
        let scale = 10f64.powi((-self.step.log10().floor()).max(0.0) as i32);
        (first..=last)
            .map(|i| {
                let v = (i as f64 * self.step * scale).round() / scale;
                if v == 0.0 { 0.0 } else { v }
            })
            .collect()
    }

    /// Where `v` sits, 0 at `lo` and 1 at `hi`.
    pub(super) fn frac(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

/// A log-scale axis between two 1-2-5 values `lo < hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LogAxis {
    pub(super) lo: f64,
    pub(super) hi: f64,
}

/// The 1-2-5 values of decade `10^e`.
fn one_two_five(e: i32) -> [f64; 3] {
    let p = 10f64.powi(e);
    [p, 2.0 * p, 5.0 * p]
}

impl LogAxis {
    /// From the largest 1-2-5 value at most `min` to the smallest above `max`, so
    /// that buckets `[from, to)` hold every value.
    pub(super) fn covering(min: f64, max: f64) -> LogAxis {
        let min = min.max(1.0);
        let max = max.max(min);
        let e = min.log10().floor() as i32;
        let lo = (e - 1..=e + 1)
            .flat_map(one_two_five)
            .filter(|&v| v <= min * (1.0 + 1e-12))
            .fold(1.0, f64::max);
        let e = max.log10().floor() as i32;
        let hi = (e..=e + 1)
            .flat_map(one_two_five)
            .find(|&v| v > max)
            .unwrap_or(max * 2.0);
        LogAxis { lo, hi }
    }

    pub(super) fn frac(&self, v: f64) -> f64 {
        (v / self.lo).ln() / (self.hi / self.lo).ln()
    }

    /// Tick values: 1-2-5 per decade over up to 2.5 decades, powers of ten over
    /// more; a narrow axis (fewer than 3 of those) gets linear ticks instead.
    pub(super) fn ticks(&self) -> Vec<f64> {
        let decades = (self.hi / self.lo).log10();
        let (e0, e1) = (
            self.lo.log10().floor() as i32,
            self.hi.log10().ceil() as i32,
        );
        let inside = |v: &f64| *v >= self.lo * (1.0 - 1e-9) && *v <= self.hi * (1.0 + 1e-9);
        let mut t: Vec<f64> = if decades <= 2.5 {
            (e0..=e1).flat_map(one_two_five).filter(inside).collect()
        } else {
            (e0..=e1).map(|e| 10f64.powi(e)).filter(inside).collect()
        };
        if t.len() < 3 {
            t = Axis::nice(self.lo, self.hi, 5, false)
                .ticks()
                .into_iter()
                .filter(|v| *v > 0.0 && inside(v))
                .collect();
        }
        t
    }
}

/// One histogram bar: the samples in `[from, to)` µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Bucket {
    pub(super) from: f64,
    pub(super) to: f64,
    pub(super) count: u64,
}

/// The histogram's `[value, count]` pairs summed into `bins` buckets of equal
/// width on `axis`'s log scale.
pub(super) fn log_buckets(pairs: &[[u64; 2]], axis: &LogAxis, bins: usize) -> Vec<Bucket> {
    let bins = bins.max(1);
    let ratio = axis.hi / axis.lo;
    let mut out: Vec<Bucket> = (0..bins)
        .map(|i| Bucket {
            from: axis.lo * ratio.powf(i as f64 / bins as f64),
            to: axis.lo * ratio.powf((i + 1) as f64 / bins as f64),
            count: 0,
        })
        .collect();
    for &[value, count] in pairs {
        let i = (axis.frac(value.max(1) as f64) * bins as f64).floor();
        let i = (i.max(0.0) as usize).min(bins - 1);
        out[i].count += count;
    }
    out
}

/// A timeline averaged down to at most `max` samples (groups of consecutive
/// samples: rates and latency averaged, counts as of the group's end).
pub(super) fn downsample(samples: &[TimelineSample], max: usize) -> Vec<TimelineSample> {
    if samples.len() <= max || max == 0 {
        return samples.to_vec();
    }
    let group = samples.len().div_ceil(max);
    samples
        .chunks(group)
        .filter_map(|chunk| {
            let last = *chunk.last()?;
            let n = chunk.len() as f64;
            let lat: Vec<f64> = chunk.iter().filter_map(|s| s.latency_avg_us).collect();
            Some(TimelineSample {
                received_per_sec: chunk.iter().map(|s| s.received_per_sec).sum::<f64>() / n,
                sent_per_sec: chunk.iter().map(|s| s.sent_per_sec).sum::<f64>() / n,
                pings_per_sec: chunk.iter().map(|s| s.pings_per_sec).sum::<f64>() / n,
                latency_avg_us: (!lat.is_empty())
                    .then(|| lat.iter().sum::<f64>() / lat.len() as f64),
                ..last
            })
        })
        .collect()
}

/// Where each sample's interval starts: at the previous sample, but not before its
/// phase began (the load at 0, the connect phase at `-connect_secs`).
pub(super) fn interval_starts(samples: &[TimelineSample], connect_secs: f64) -> Vec<f64> {
    let mut prev = -connect_secs;
    samples
        .iter()
        .map(|s| {
            let phase_start = match s.phase {
                Phase::Connect => -connect_secs,
                Phase::Load => 0.0,
            };
            let start = prev.max(phase_start).min(s.t_secs);
            prev = s.t_secs;
            start
        })
        .collect()
}
