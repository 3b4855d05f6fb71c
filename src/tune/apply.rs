//! `throng tune --apply`: writes the `/proc/sys` values [`check`](super::check)
//! found too low, reads each back, and says what it could not do.
//!
//! It owns those writes and finding out whether the hard open-files limit could be
//! raised here (by raising this process's own and putting it back). It must not
//! change any limit for good: open-files limits belong to each process, and files
//! under `/etc` are printed by `render`, never written.

use super::plan::{Item, Outcome, Report, Verdict};
use super::system::{Machine, NOFILE_HARD, System, join, proc_path};
use crate::os::{FileLimit, thousands};

/// Writes each sysctl that is too low, reads it back, and says what it could not do.
/// Open-files limits are not changed: they belong to each process.
pub fn apply(sys: &mut impl System, report: &Report) -> Vec<Outcome> {
    let m = &report.machine;
    let mut out = Vec::new();
    for item in report.items.iter().filter(|i| i.verdict == Verdict::TooLow) {
        let (applied, detail) = match (item.sysctl, &item.fix) {
            (true, Some(value)) => write_sysctl(sys, item, value),
            _ if item.name == NOFILE_HARD => (false, try_hard_limit(sys, m, item.needed)),
            _ => (
                false,
                "not changed: raising this process's soft limit helps no other process; \
                 serve and bench raise their own soft limit to their hard limit at start"
                    .into(),
            ),
        };
        out.push(Outcome {
            name: item.name,
            applied,
            detail,
        });
    }
    out
}

fn write_sysctl(sys: &mut impl System, item: &Item, value: &str) -> (bool, String) {
    let path = proc_path(item.name);
    let before = join(&item.current);
    if let Err(e) = sys.write(&path, value) {
        return (false, format!("could not write {path}: {e}"));
    }
    match sys.read(&path) {
        Ok(text) if text.split_whitespace().eq(value.split_whitespace()) => {
            (true, format!("{before} -> {value}"))
        }
        Ok(text) => (
            false,
            format!("wrote {value} to {path}, but it reads {}", text.trim()),
        ),
        Err(e) => (
            false,
            format!("wrote {value} to {path}, but cannot read it back: {e}"),
        ),
    }
}

/// Finds out whether the hard limit could be raised here (raising this process's
/// own and putting it back), to say which fix can work.
fn try_hard_limit(sys: &mut impl System, m: &Machine, needed: u64) -> String {
    let now = FileLimit {
        soft: m.nofile_soft,
        hard: m.nofile_hard,
    };
    let trial = FileLimit {
        soft: now.soft,
        hard: needed,
    };
    match sys.set_open_files(trial) {
        Ok(()) => {
            let restored = sys.set_open_files(now);
            format!(
                "not changed: the limit is per process and passes only to processes it starts, \
                 so tune cannot raise it for serve and bench; it can be raised here (this process \
                 raised its own to {needed}{}): use one of the open-files fixes below",
                if restored.is_ok() {
                    " and put it back"
                } else {
                    ""
                }
            )
        }
        Err(e) => {
            let why = if needed > m.nr_open {
                format!("; it is above fs.nr_open ({})", thousands(m.nr_open))
            } else if !m.cap_sys_resource {
                format!(
                    "; this process lacks CAP_SYS_RESOURCE (the container or VM withholds it), \
                     so not even root can raise it above {} here",
                    thousands(m.nofile_hard)
                )
            } else {
                String::new()
            };
            format!("cannot be raised: setrlimit to {needed} failed ({e}){why}")
        }
    }
}
