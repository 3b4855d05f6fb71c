//! What this machine has, as `throng tune` reads it from the OS: this process's
//! open-files limits and capabilities, a few `/proc/sys` values, `MemAvailable`,
//! cores and the page size.
//!
//! It owns the [`System`] seam (the real [`Host`], or a made-up machine in tests),
//! the [`Machine`] it reads, and the names and `/proc` paths of the settings. It
//! only reads; judging the figures is `plan`'s, and writing them is `apply`'s.

use std::io;

use serde::Serialize;

use super::TuneError;
use crate::os::{self, FileLimit};

/// The capability that lets a process raise its hard limits (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;
pub(super) const NOFILE_SOFT: &str = "RLIMIT_NOFILE soft";
pub(super) const NOFILE_HARD: &str = "RLIMIT_NOFILE hard";
pub(super) const SYN_BACKLOG: &str = "net.ipv4.tcp_max_syn_backlog";
pub(super) const PORT_RANGE: &str = "net.ipv4.ip_local_port_range";
pub(super) const TCP_MEM: &str = "net.ipv4.tcp_mem";
pub(super) const EHASH: &str = "net.ipv4.tcp_ehash_entries";

/// Where the figures come from and where `--apply` writes: the real machine
/// ([`Host`]) or, in tests, a made-up one.
pub trait System {
    /// The contents of a file under /proc.
    fn read(&self, path: &str) -> io::Result<String>;
    /// Writes a /proc/sys file (as `sysctl -w` does).
    fn write(&mut self, path: &str, value: &str) -> io::Result<()>;
    /// This process's RLIMIT_NOFILE.
    fn open_files(&self) -> io::Result<FileLimit>;
    /// Sets this process's RLIMIT_NOFILE.
    fn set_open_files(&mut self, limit: FileLimit) -> io::Result<()>;
    /// Cores: `serve` runs one I/O thread, so one listener, per core by default.
    fn cores(&self) -> usize;
    /// The page size, `net.ipv4.tcp_mem`'s unit.
    fn page_size(&self) -> u64;
}

/// This machine.
pub struct Host;

impl System for Host {
    fn read(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&mut self, path: &str, value: &str) -> io::Result<()> {
        std::fs::write(path, value)
    }
    fn open_files(&self) -> io::Result<FileLimit> {
        os::open_files_limit()
    }
    fn set_open_files(&mut self, limit: FileLimit) -> io::Result<()> {
        os::set_open_files_limit(limit)
    }
    fn cores(&self) -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    fn page_size(&self) -> u64 {
        // SAFETY: sysconf only reads a constant of the system.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
    }
}

/// `/proc/sys/net/core/somaxconn` for `net.core.somaxconn`.
pub(super) fn proc_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

/// What decides how many connections this machine holds, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    pub nr_open: u64,
    pub file_max: u64,
    /// Descriptors open on the whole machine now (`fs.file-nr`).
    pub files_open: u64,
    pub somaxconn: u64,
    pub tcp_max_syn_backlog: u64,
    /// 0: no SYN cookies, so `tcp_max_syn_backlog` bounds half-open connections.
    pub tcp_syncookies: u64,
    pub ip_local_port_range: [u64; 2],
    /// `None` in a network namespace of its own (a container's), which does not
    /// show it: the host's applies there.
    pub tcp_mem: Option<[u64; 3]>,
    /// Buckets of the table every TCP packet finds its socket in (this network
    /// namespace's); `None` before Linux 6.1, which does not show it.
    pub tcp_ehash_entries: Option<u64>,
    pub mem_available_bytes: u64,
    /// Whether this process may raise its hard limits (CapEff).
    pub cap_sys_resource: bool,
    pub cores: usize,
    pub page_size: u64,
}

impl Machine {
    pub fn read(sys: &impl System) -> Result<Machine, TuneError> {
        let files = sys.open_files().map_err(TuneError::Limit)?;
        let [allocated, free, _] = numbers(sys, &proc_path("fs.file-nr"))?;
        let [nr_open] = numbers(sys, &proc_path("fs.nr_open"))?;
        let [file_max] = numbers(sys, &proc_path("fs.file-max"))?;
        let [somaxconn] = numbers(sys, &proc_path("net.core.somaxconn"))?;
        let [tcp_max_syn_backlog] = numbers(sys, &proc_path(SYN_BACKLOG))?;
        let [tcp_syncookies] = numbers(sys, &proc_path("net.ipv4.tcp_syncookies"))?;
        Ok(Machine {
            nofile_soft: files.soft,
            nofile_hard: files.hard,
            nr_open,
            file_max,
            files_open: allocated.saturating_sub(free),
            somaxconn,
            tcp_max_syn_backlog,
            tcp_syncookies,
            ip_local_port_range: numbers(sys, &proc_path(PORT_RANGE))?,
            tcp_mem: shown(numbers(sys, &proc_path(TCP_MEM)))?,
            tcp_ehash_entries: shown(numbers(sys, &proc_path(EHASH)))?.map(|[entries]| entries),
            mem_available_bytes: field(sys, "/proc/meminfo", "MemAvailable:", |v| {
                v.strip_suffix(" kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()?
                    .checked_mul(1024)
            })?,
            cap_sys_resource: field(sys, "/proc/self/status", "CapEff:", |v| {
                u64::from_str_radix(v, 16).ok()
            })? & (1 << CAP_SYS_RESOURCE)
                != 0,
            cores: sys.cores().max(1),
            page_size: sys.page_size(),
        })
    }
}

/// A setting this kernel or network namespace may not show: `None` if its file
/// is missing, an error if it is there and cannot be read or parsed.
fn shown<T>(read: Result<T, TuneError>) -> Result<Option<T>, TuneError> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(TuneError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn read(sys: &impl System, path: &str) -> Result<String, TuneError> {
    sys.read(path).map_err(|source| TuneError::Read {
        path: path.into(),
        source,
    })
}

/// Exactly `N` whitespace-separated numbers, as /proc/sys files hold them.
pub(super) fn numbers<const N: usize>(
    sys: &impl System,
    path: &str,
) -> Result<[u64; N], TuneError> {
    let text = read(sys, path)?;
    let parsed: Option<Vec<u64>> = text.split_whitespace().map(|w| w.parse().ok()).collect();
    parsed
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| TuneError::Parse {
            path: path.into(),
            text: text.trim().into(),
        })
}

/// The value of the `key` line of a `Key: value` file such as /proc/meminfo.
fn field(
    sys: &impl System,
    path: &str,
    key: &str,
    parse: impl Fn(&str) -> Option<u64>,
) -> Result<u64, TuneError> {
    let text = read(sys, path)?;
    text.lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|v| parse(v.trim()))
        .ok_or_else(|| TuneError::Parse {
            path: path.into(),
            text: format!("no {key} line with a number"),
        })
}

/// Numbers as a /proc/sys file holds them: `287898 383867 575796`.
pub(super) fn join(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
}
