//! What `--deflate-level` and `--deflate-min-size` trade: for realistic JSON
//! messages (market ticks and chat lines, content varying message to message)
//! of several sizes, the compressed frame's size as a share of the plain one
//! and the CPU time to compress it once (throng compresses a message once for
//! all its subscribers, so this is paid per message, not per delivery), and
//! the time to inflate it (what a client pays, and throng for client messages).
//!
//! Run: `cargo bench --bench deflate -- [MESSAGES]` (default 2000 per cell).
//! Prints a table, then one JSON object per cell.

use std::hint::black_box;
use std::time::Instant;

use throng::protocol::deflate::{compress, inflate};

/// A deterministic xorshift, so every run measures the same messages.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const SYMBOLS: &[&str] = &[
    "EURUSD", "GBPUSD", "USDJPY", "AUDUSD", "BTC-USD", "ETH-USD", "AAPL", "MSFT", "NVDA", "TSLA",
];
const VENUES: &[&str] = &["LMAX", "EBS", "NASDAQ", "NYSE", "COINBASE", "KRAKEN"];
const USERS: &[&str] = &[
    "alice",
    "bob_77",
    "carol.d",
    "dmitri",
    "eve-online",
    "frank",
    "grace_h",
    "heidi",
];
const WORDS: &[&str] = &[
    "the", "market", "is", "up", "again", "today", "did", "you", "see", "that", "move", "on",
    "rates", "I", "think", "we", "should", "wait", "for", "the", "close", "before", "buying",
    "more", "lol", "ok", "meeting", "at", "three", "sounds", "good", "thanks", "everyone",
];

/// One tick: the kind of object a market-data feed publishes.
fn tick(rng: &mut Rng, out: &mut String) {
    let symbol = rng.pick(SYMBOLS);
    let base = 100_000 + rng.below(900_000);
    let spread = 1 + rng.below(40);
    out.push_str(&format!(
        "{{\"type\":\"tick\",\"symbol\":\"{symbol}\",\"venue\":\"{}\",\"bid\":{}.{:05},\"ask\":{}.{:05},\"size\":{},\"ts\":{},\"seq\":{}}}",
        rng.pick(VENUES),
        base / 100_000,
        base % 100_000,
        (base + spread) / 100_000,
        (base + spread) % 100_000,
        rng.below(1_000_000),
        1_764_190_000_000u64 + rng.below(10_000_000),
        rng.below(1 << 40),
    ));
}

/// One chat line.
fn chat(rng: &mut Rng, out: &mut String) {
    let mut text = String::new();
    for i in 0..(4 + rng.below(20)) {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(rng.pick(WORDS));
    }
    out.push_str(&format!(
        "{{\"type\":\"message\",\"room\":\"lobby-{}\",\"user\":\"{}\",\"id\":\"m{:016x}\",\"ts\":{},\"text\":\"{text}\"}}",
        rng.below(50),
        rng.pick(USERS),
        rng.next(),
        1_764_190_000_000u64 + rng.below(10_000_000),
    ));
}

/// A JSON message of about `size` bytes: a batch of ticks or chat lines.
fn message(rng: &mut Rng, size: usize) -> Vec<u8> {
    let ticks = rng.below(2) == 0;
    let mut out = String::from(if ticks { "[" } else { "{\"lines\":[" });
    loop {
        let mut one = String::new();
        if ticks {
            tick(rng, &mut one);
        } else {
            chat(rng, &mut one);
        }
        if out.len() > 12 && out.len() + one.len() + 2 > size {
            break;
        }
        if out.len() > 12 {
            out.push(',');
        }
        out.push_str(&one);
    }
    out.push_str(if ticks { "]" } else { "]}" });
    out.into_bytes()
}

fn main() {
    let per_cell: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let sizes = [64usize, 128, 256, 512, 1024, 1536, 2048, 8192];
    let levels = [1u32, 3, 6, 9];
    println!(
        "{:>6} {:>5} {:>10} {:>10} {:>12} {:>12}",
        "size", "level", "plain B", "sent B", "compress µs", "inflate µs"
    );
    let mut rows = Vec::new();
    for &size in &sizes {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ size as u64);
        let messages: Vec<Vec<u8>> = (0..per_cell).map(|_| message(&mut rng, size)).collect();
        let plain: usize = messages.iter().map(|m| m.len()).sum();
        for &level in &levels {
            let mut packed: Vec<Vec<u8>> = Vec::with_capacity(per_cell);
            let start = Instant::now();
            for m in &messages {
                let mut out = Vec::new();
                if compress(black_box(m), 15, level, &mut out).is_err() {
                    eprintln!("compress failed at level {level}");
                    return;
                }
                packed.push(out);
            }
            let compress_us = start.elapsed().as_secs_f64() * 1e6 / per_cell as f64;
            // A frame goes plain when compressing does not make it smaller.
            let sent: usize = packed
                .iter()
                .zip(&messages)
                .map(|(p, m)| p.len().min(m.len()))
                .sum();
            let mut inflated = Vec::new();
            let start = Instant::now();
            for p in &packed {
                inflated.clear();
                if inflate(black_box(p), 1 << 20, &mut inflated).is_err() {
                    eprintln!("inflate failed at level {level}");
                    return;
                }
            }
            let inflate_us = start.elapsed().as_secs_f64() * 1e6 / per_cell as f64;
            let avg_plain = plain as f64 / per_cell as f64;
            let avg_sent = sent as f64 / per_cell as f64;
            println!(
                "{size:>6} {level:>5} {avg_plain:>10.0} {avg_sent:>10.0} {compress_us:>12.2} {inflate_us:>12.2}"
            );
            rows.push(format!(
                "{{\"size\":{size},\"level\":{level},\"messages\":{per_cell},\"plain_bytes\":{avg_plain:.1},\"sent_bytes\":{avg_sent:.1},\"ratio\":{:.4},\"compress_us\":{compress_us:.3},\"inflate_us\":{inflate_us:.3}}}",
                avg_sent / avg_plain
            ));
        }
    }
    for row in rows {
        println!("{row}");
    }
}
