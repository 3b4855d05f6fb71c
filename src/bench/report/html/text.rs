//! The text that goes into the page: escaping, the command line, number formats.
//!
//! Owns [`Esc`] (every string put in the page goes through it), the command line
//! as shown (quoted, secrets hidden) and how numbers, durations and dates read.
//! It must not build markup: the cards, charts and template put these strings in
//! place.

use std::fmt::{self, Display};

use crate::os::thousands;

/// Text made safe to put in HTML text and in quoted attribute values: `& < > " '`
/// become entities, control characters (but tab and newline) U+FFFD.
pub struct Esc<'a>(pub &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(|c: char| {
            matches!(c, '&' | '<' | '>' | '"' | '\'') || (c.is_control() && c != '\n' && c != '\t')
        }) {
            f.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or('\u{FFFD}');
            f.write_str(match c {
                '&' => "&amp;",
                '<' => "&lt;",
                '>' => "&gt;",
                '"' => "&quot;",
                '\'' => "&#39;",
                _ => "\u{FFFD}",
            })?;
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// [`Esc`] as a `String`.
pub fn escape(s: &str) -> String {
    Esc(s).to_string()
}

/// Flags whose value is a secret: [`command_line`] shows it as `***`.
const SECRET_FLAGS: [&str; 4] = ["--api-key", "--token", "--pusher-secret", "--pusher-app"];

/// The command line for the page: the program as `throng`, arguments quoted for a
/// POSIX shell, and the values of `--api-key`, `--token`, `--pusher-secret` and
/// `--pusher-app` (secrets, or holding one) replaced by `***`.
pub fn command_line(argv: &[String]) -> String {
    let mut out = vec!["throng".to_string()];
    let mut hide_next = false;
    for arg in argv.iter().skip(1) {
        if hide_next {
            out.push("***".into());
            hide_next = false;
        } else if SECRET_FLAGS.contains(&arg.as_str()) {
            out.push(arg.clone());
            hide_next = true;
        } else if let Some(flag) = SECRET_FLAGS.iter().find(|f| {
            arg.strip_prefix(**f)
                .is_some_and(|rest| rest.starts_with('='))
        }) {
            out.push(format!("{flag}=***"));
        } else {
            out.push(shell_quote(arg));
        }
    }
    out.join(" ")
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A tick label or a big number: 950, 1.5k, 12k, 3.2M.
pub(super) fn si(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if x.abs() >= 100.0 || x.fract() == 0.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{x:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    format!("{text}{unit}")
}

/// A rate for the summary: thousands separators from 100 up, one decimal below.
pub(super) fn rate(v: f64) -> String {
    if v >= 100.0 {
        thousands(v.round() as u64)
    } else {
        format!("{v:.1}")
    }
}

/// Microseconds as milliseconds with three decimals (the text report's form).
pub(super) fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

/// A latency axis label: 250 µs, 1.5 ms, 2 s.
pub(super) fn duration_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", si(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", si(us / 1e3))
    } else {
        format!("{} µs", si(us))
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` for seconds since the Unix epoch.
pub(super) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
