//! The names that outlive one connection: a [`SocketId`] (which node, which
//! client) that every node of a cluster understands, this process's node tag, and
//! history epochs. The hub, the brokers and history all speak of them, so they
//! live here, below all three; this module must not know what a channel, a
//! message or a broker is.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// A connection as every node of a cluster names it (a Pusher socket id,
/// `NODE.CLIENT`): the tag of the process that holds it and its client id. A
/// message may name one to leave it out (the sender of a client event, a
/// publisher's own socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketId {
    pub node: u32,
    pub client: u32,
}

impl SocketId {
    /// Client `client` of this process.
    pub fn local(client: u32) -> SocketId {
        SocketId {
            node: this_node(),
            client,
        }
    }
}

/// This process's tag in socket ids: random, so tags differ between nodes,
/// `--workers` and runs.
pub fn this_node() -> u32 {
    static TAG: OnceLock<u32> = OnceLock::new();
    *TAG.get_or_init(|| (new_epoch() % 1_000_000_000) as u32)
}

/// A new history epoch: unique within this process and, with the start time mixed
/// in, all but certainly different from any epoch of an earlier run.
pub fn new_epoch() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    // splitmix64: consecutive counts give unrelated-looking epochs.
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    let mut z = seed.wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
