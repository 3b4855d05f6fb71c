//! Counting a push delivery: its position in its channel (the server's seq, or
//! the count the publisher wrote in the payload) and its latency from the
//! publish time the payload carries.
//!
//! Shared by the three transports' readers; it must not touch connections.

use std::time::{SystemTime, UNIX_EPOCH};

use super::Tally;
use crate::bench::SeqFrom;
use crate::bench::report::SeqTrack;

/// A published payload's stamp: `<unix ns> <count> ...` (the count is the
/// publisher's own numbering of the channel's messages).
pub(super) fn publish_stamp(data: &str) -> (Option<u64>, Option<u64>) {
    let sent = leading_number(data);
    let count = data
        .split_once(' ')
        .and_then(|(_, rest)| leading_number(rest));
    (sent, count)
}

/// Counts one push delivery: its position (the server's seq or the payload's
/// count, as the plan says) and its latency from the publish time it carries.
pub(super) fn observe_delivery(
    tally: &mut Tally,
    track: &mut SeqTrack,
    seq_from: SeqFrom,
    server_seq: Option<u64>,
    data: &str,
    now_unix: u64,
) {
    let (sent, count) = publish_stamp(data);
    let seq = match seq_from {
        SeqFrom::Server => server_seq,
        SeqFrom::Payload => count,
    };
    if let Some(seq) = seq {
        track.observe(seq, &mut tally.seq);
    }
    if let Some(sent) = sent {
        let us = now_unix.saturating_sub(sent) / 1000;
        tally.hist.saturating_record(us.max(1));
        tally.c.latency_samples += 1;
        tally.c.latency_us_sum += us;
    }
}

/// Leading decimal digits of `s` as a number.
pub(super) fn leading_number(s: &str) -> Option<u64> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
