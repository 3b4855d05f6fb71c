//! Push: finding lost, duplicated and out-of-order deliveries from their seqs.
//!
//! Owns [`SeqTrack`] (one subscriber's window over the seqs it received),
//! [`SeqCounts`] (the anomalies found) and [`ChannelAgg`] (a channel's subscribers
//! summed, so the loss at the edges of the publisher's range can be computed after
//! merging). It must not know about sockets or the publisher's HTTP calls.

use serde::{Deserialize, Serialize};

/// Seq bookkeeping for one subscriber: `first` seq seen, the `next` expected, and
/// which of the 64 seqs below `next` arrived (bit i = seq `next - 1 - i`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SeqTrack {
    pub first: u64,
    pub next: u64,
    window: u64,
}

/// Delivery anomalies found while messages arrive.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqCounts {
    /// Distinct seqs received.
    pub received: u64,
    /// Seqs skipped over (a later seq arrived first); late arrivals are taken back.
    pub gaps: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Gaps the server itself reported to resuming subscribers (json or SSE
    /// `gap` events, a poll answer's `gap`): what it could no longer give.
    #[serde(default)]
    pub reported_gaps: u64,
}

impl SeqTrack {
    pub fn seen_any(&self) -> bool {
        self.next != 0
    }

    pub fn observe(&mut self, seq: u64, counts: &mut SeqCounts) {
        if self.next == 0 {
            self.first = seq;
            self.next = seq.saturating_add(1);
            self.window = 1;
            counts.received += 1;
            return;
        }
        if seq >= self.next {
            let skipped = seq - self.next;
            counts.gaps += skipped;
            let shift = skipped + 1;
            self.window = if shift >= 64 { 0 } else { self.window << shift } | 1;
            self.next = seq.saturating_add(1);
            counts.received += 1;
            return;
        }
        let age = self.next - 1 - seq;
        if seq < self.first {
            // Older than the baseline: it was never counted as a gap.
            counts.out_of_order += 1;
            counts.received += 1;
        } else if age < 64 && self.window & (1 << age) != 0 {
            counts.duplicated += 1;
        } else {
            if age < 64 {
                self.window |= 1 << age;
            }
            counts.out_of_order += 1;
            counts.received += 1;
            counts.gaps = counts.gaps.saturating_sub(1);
        }
    }
}

/// What one process's subscribers of one channel saw, summed so that the loss
/// against the publisher's seq range can be computed after merging.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelAgg {
    /// Subscribers open at the end.
    pub subs: u64,
    /// Of those, the ones that received at least one message.
    pub seen: u64,
    pub sum_first: u64,
    pub sum_next: u64,
}

impl ChannelAgg {
    pub fn add_track(&mut self, t: &SeqTrack) {
        self.subs += 1;
        if t.seen_any() {
            self.seen += 1;
            self.sum_first += t.first;
            self.sum_next += t.next;
        }
    }

    pub fn add(&mut self, o: &ChannelAgg) {
        self.subs += o.subs;
        self.seen += o.seen;
        self.sum_first += o.sum_first;
        self.sum_next += o.sum_next;
    }

    /// Messages these subscribers missed before their first and after their last
    /// delivery, given that the publisher got seqs `min..=max` for the channel.
    pub fn edge_loss(&self, published: Option<(u64, u64)>) -> u64 {
        let Some((min, max)) = published else {
            return 0;
        };
        let range = i128::from(max) - i128::from(min) + 1;
        let seen = i128::from(self.seen);
        let head = i128::from(self.sum_first) - seen * i128::from(min);
        let tail = seen * (i128::from(max) + 1) - i128::from(self.sum_next);
        let unseen = i128::from(self.subs - self.seen) * range;
        u64::try_from((head.max(0) + tail.max(0) + unseen).max(0)).unwrap_or(u64::MAX)
    }
}
