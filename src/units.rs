//! Human units on the command line: durations (`25s`, `500ms`, `5m`) and byte
//! sizes (`64KiB`, `1MiB`), parsed the same way by `serve`, `bench` and `tune`.
//! Pure functions; it must not know what a value is for.

use std::time::Duration;

/// Parses `25s`, `500ms`, `5m`; a bare `0` means zero (off).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration like 500ms, 25s or 5m: {e}"))
}

/// Parses a byte size: `65536`, `64KiB`, `1MiB`, `2GB`, `64k`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size like 65536, 64KiB or 1MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        other => return Err(format!("unknown size unit '{other}' in '{s}'")),
    };
    n.checked_mul(mult)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("size '{s}' is too large"))
}
