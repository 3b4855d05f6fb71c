//! What a bench run measured, and how it is merged, printed and drawn.
//!
//! This module owns the numbers, one concept per file:
//! - `histogram`: the latency histogram, its `[value, count]` pairs, [`Latency`];
//! - `counters`: the live [`Counters`] and one process's [`RawResult`], merged
//!   across loops and child processes;
//! - `seq`: the seq tracker that finds lost, duplicated and out-of-order
//!   deliveries;
//! - `comeback`: subscribers the server let go and their return;
//! - `push`: the publisher's summary and [`PushReport`];
//! - `timeline`: the per-second [`Timeline`];
//! - `summary`: the final [`Report`] (stats block, latency, error rate,
//!   throughput; text or JSON);
//! - `machine`: the client's machine and its own CPU and memory;
//! - [`html`]: the report drawn as one self-contained page (`--report`).
//!
//! It must not touch sockets, threads or processes: the drivers hand it numbers
//! and print what it formats. Everything is re-exported here, so callers name
//! `report::Counters`, not the file it lives in.

mod comeback;
mod counters;
mod histogram;
pub mod html;
mod machine;
mod push;
mod seq;
mod summary;
mod timeline;

pub use comeback::{ComebackReport, ComebackTally};
pub use counters::{Counters, RawResult};
pub use histogram::{Latency, add_pairs, histogram_pairs, new_histogram};
pub use machine::{Machine, proc_status_kb, self_cpu_secs};
pub use push::{PublishSummary, PushReport};
pub use seq::{ChannelAgg, SeqCounts, SeqTrack};
pub use summary::{Report, RunInfo};
pub use timeline::{Phase, Timeline, TimelineSample};

#[cfg(test)]
mod tests;
