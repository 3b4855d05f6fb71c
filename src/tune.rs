//! `throng tune`: what N connections need from this machine's operating system.
//!
//! It owns reading the limits that decide how many connections one machine holds
//! (this process's open-files limits, a few `/proc/sys` values, `MemAvailable`),
//! judging each against what N connections need from the per-socket figures measured
//! on this machine (docs/TUNE.md), printing the exact commands that fix what is too
//! low, and, with `--apply` only, writing the `/proc/sys` values that are too low.
//! It must not touch anything else: it writes no file under `/etc` (it prints what
//! to put there), leaves every open-files limit as it found it, and changes nothing
//! in how `serve` or `bench` run. All reading and writing goes through [`System`],
//! so tests can feed it a made-up machine.

use std::io;

use serde::{Serialize, Serializer};

use crate::bench::Transport;
use crate::os::{self, FileLimit, thousands};
use crate::server::LISTEN_BACKLOG;

/// Kernel memory of one idle TCP socket (the socket, its inode, dentry and file, an
/// epoll entry): Slab grew 5,069 B per socket holding 10,000 loopback pairs
/// (`scripts/socket-cost.py`, median of 3, Linux 6.18 on the 2-core VM; 5,011 B with
/// `throng serve` and `throng bench idle` holding 9,000). A loopback pair is two sockets.
pub const KERNEL_BYTES_PER_SOCKET: u64 = 5_070;
/// Kernel memory of the io_uring receive `serve --io-uring auto` keeps armed on
/// each busy connection (one that read 8 times in a second; not in the total: idle
/// connections read through epoll and hold none): its request (256 B in the
/// `io_kiocb` cache) and its poll entry. Measured when every connection was armed
/// at once: Slab grew 10,267–10,342 B per loopback pair with `auto` against
/// 9,901–9,994 B with `off`, `throng serve --threads 1` holding 9,000 connections
/// from `throng bench idle` (docs/BENCHMARKS.md §16).
pub const IO_URING_BYTES_PER_CONN: u64 = 360;
/// TCP memory (what `net.ipv4.tcp_mem` counts, in pages) of a socket while data
/// waits in it: one small unread message took 0.97 pages per socket (same script).
/// An idle socket holds none.
pub const TCP_PAGES_PER_BUSY_SOCKET: u64 = 1;
/// `throng bench`'s userspace memory per idle connection (docs/BENCHMARKS.md §3).
const BENCH_BYTES_PER_CONN: u64 = 168;
/// A planned source address fills at most 1/this of its ephemeral range.
const PORT_FILL_DIVISOR: u64 = 4;

/// Loopback source addresses `throng bench --source-ips` can spread over (127.0.0.2–254).
const LOOPBACK_SOURCES: u64 = 253;
/// The capability that lets a process raise its hard limits (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;
const NOFILE_SOFT: &str = "RLIMIT_NOFILE soft";
const NOFILE_HARD: &str = "RLIMIT_NOFILE hard";
const SYN_BACKLOG: &str = "net.ipv4.tcp_max_syn_backlog";
const PORT_RANGE: &str = "net.ipv4.ip_local_port_range";
const TCP_MEM: &str = "net.ipv4.tcp_mem";

/// throng's userspace memory per idle connection, measured at 15,000
/// (docs/BENCHMARKS.md: §12 for WebSocket, §6 for SSE and long-poll).
fn throng_bytes_per_conn(transport: Transport) -> u64 {
    match transport {
        Transport::Ws => 97,
        Transport::Sse => 103,
        Transport::Poll => 177,
    }
}

/// `throng tune` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TuneArgs {
    /// Connections this machine should hold
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub conns: u64,
    /// Write the /proc/sys values that are too low (until reboot) and say what could
    /// not be set
    #[arg(long)]
    pub apply: bool,
    /// throng bench runs on this machine too (over loopback): count its sockets,
    /// descriptors and memory as well
    #[arg(long)]
    pub loopback: bool,
    /// What the connections are, for throng's memory per connection
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: Transport,
    /// Print one JSON object instead of the text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot make sense of {text:?}")]
    Parse { path: String, text: String },
    #[error("cannot read the open-files limit")]
    Limit(#[source] io::Error),
}

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
fn proc_path(key: &str) -> String {
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
    pub tcp_mem: [u64; 3],
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
            tcp_mem: numbers(sys, &proc_path(TCP_MEM))?,
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

fn read(sys: &impl System, path: &str) -> Result<String, TuneError> {
    sys.read(path).map_err(|source| TuneError::Read {
        path: path.into(),
        source,
    })
}

/// Exactly `N` whitespace-separated numbers, as /proc/sys files hold them.
fn numbers<const N: usize>(sys: &impl System, path: &str) -> Result<[u64; N], TuneError> {
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

/// What the connections are and where their clients run.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub conns: u64,
    pub loopback: bool,
    pub transport: Transport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "OK")]
    Ok,
    #[serde(rename = "TOO LOW")]
    TooLow,
    /// Enough only when the load generator spreads over several source addresses.
    #[serde(rename = "SPREAD")]
    Spread,
}

impl Verdict {
    fn of(ok: bool) -> Verdict {
        if ok { Verdict::Ok } else { Verdict::TooLow }
    }
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::TooLow => "TOO LOW",
            Verdict::Spread => "SPREAD",
        }
    }
}

/// One setting, current against needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// The sysctl key, or `RLIMIT_NOFILE soft` / `RLIMIT_NOFILE hard` (this process's).
    pub name: &'static str,
    /// As read: one number, or the numbers of a vector (the port range, tcp_mem).
    #[serde(serialize_with = "one_or_many")]
    pub current: Vec<u64>,
    /// What N connections need: of tcp_mem its pressure threshold, of the port
    /// range its size (ports one source address offers towards one server port).
    pub needed: u64,
    pub verdict: Verdict,
    /// When too low: the value that fixes it (`sysctl -w name="fix"`, `nofile fix`).
    pub fix: Option<String>,
    #[serde(skip)]
    sysctl: bool,
}

fn one_or_many<S: Serializer>(v: &[u64], s: S) -> Result<S::Ok, S::Error> {
    match v {
        [one] => s.serialize_u64(*one),
        many => many.serialize(s),
    }
}

fn transport_name<S: Serializer>(t: &Transport, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match t {
        Transport::Ws => "ws",
        Transport::Sse => "sse",
        Transport::Poll => "poll",
    })
}

impl Item {
    fn new(name: &'static str, current: Vec<u64>, needed: u64, verdict: Verdict) -> Item {
        Item {
            name,
            current,
            needed,
            verdict,
            fix: (verdict == Verdict::TooLow).then(|| needed.to_string()),
            sysctl: name.contains('.'),
        }
    }
    /// A one-number setting that must be at least `needed`.
    fn at_least(name: &'static str, current: u64, needed: u64) -> Item {
        Item::new(name, vec![current], needed, Verdict::of(current >= needed))
    }
}

/// The memory N idle connections take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Sockets on this machine: N, twice that with the load generator here.
    pub sockets: u64,
    pub kernel_bytes_per_socket: u64,
    pub kernel_bytes: u64,
    /// Kernel memory the armed receives of `--io-uring auto` would add if every
    /// connection were busy (not in the total: idle ones hold none).
    pub receive_bytes_per_conn: u64,
    pub receive_bytes: u64,
    pub throng_bytes_per_conn: u64,
    pub throng_bytes: u64,
    /// `throng bench`'s userspace (with `--loopback`; else 0).
    pub bench_bytes: u64,
    pub total_bytes: u64,
    pub available_bytes: u64,
    /// TCP memory while every connection holds one unread message (a broadcast
    /// its clients have not read yet): on top of the total, bounded by tcp_mem.
    pub queued_bytes: u64,
    pub verdict: Verdict,
}

/// Ephemeral ports of a load generator opening N connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ports {
    /// Connections one source address can open to one server port.
    pub per_source_address: u64,
    /// Source addresses to spread N connections to one server port over, each
    /// filling at most a quarter of its range: connect() looks for a free port by
    /// trying them in turn, so a crowded address makes every connect scan (a
    /// million over 54 addresses spent a third of two cores in
    /// `__inet_check_established`; over 253, nothing measurable: docs/SCALE.md).
    pub source_addresses: u64,
    /// Server ports needed when 127.0.0.2–127.0.0.254 are not enough.
    pub server_ports: u64,
}

/// How to hold N connections under this hard open-files limit: several processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Connections one `serve` worker holds (its limit less reserve and listeners).
    pub per_worker: u64,
    pub workers: u64,
    /// Connections one `bench` process holds.
    pub per_proc: u64,
    pub procs: u64,
    pub serve: String,
    pub bench: String,
}

/// The commands that fix what is too low.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Fixes {
    /// Now, until reboot (`--apply` does these).
    pub sysctl: Vec<String>,
    /// For /etc/sysctl.d/99-throng.conf, at every boot (with `--apply`: also
    /// what it set, which lasts only until reboot).
    pub sysctl_conf: Vec<String>,
    /// For /etc/security/limits.conf (login sessions; `*` does not cover root).
    pub limits_conf: Vec<String>,
    /// For a systemd unit's `[Service]`.
    pub systemd: Option<String>,
    /// In a root shell, before starting `serve` or `bench` from it.
    pub shell: Option<String>,
}

/// What `--apply` did about one setting that was too low.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub name: &'static str,
    pub applied: bool,
    pub detail: String,
}

/// Everything `throng tune` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub conns: u64,
    pub loopback: bool,
    #[serde(serialize_with = "transport_name")]
    pub transport: Transport,
    pub machine: Machine,
    pub items: Vec<Item>,
    pub memory: Memory,
    pub ports: Ports,
    pub fixes: Fixes,
    /// Present when the hard open-files limit is below what one process needs.
    pub plan: Option<Plan>,
    /// What `--apply` did (empty without it).
    pub applied: Vec<Outcome>,
    /// Everything N connections need is in place (the exit status is 0).
    pub ok: bool,
}

/// Judges `m` against what `want` needs. Pure: no I/O.
pub fn check(m: &Machine, want: Want) -> Report {
    let n = want.conns;
    let [low, high] = m.ip_local_port_range;
    let span = if high >= low { high - low + 1 } else { 0 };
    let source_addresses = n.div_ceil((span / PORT_FILL_DIVISOR).max(1));
    let ports = Ports {
        per_source_address: span,
        source_addresses,
        server_ports: source_addresses.div_ceil(LOOPBACK_SOURCES),
    };
    // One process holding all N: a descriptor each, the reserve, one listener per
    // I/O thread and port.
    let listeners = m.cores as u64 * ports.server_ports.max(1);
    let per_process = n + os::RESERVED_FDS + listeners;
    let sockets = if want.loopback { 2 * n } else { n };
    let backlog = n.min(LISTEN_BACKLOG as u64);
    let busy_pages = n * TCP_PAGES_PER_BUSY_SOCKET;

    let mut tcp_mem = Item::new(
        TCP_MEM,
        m.tcp_mem.to_vec(),
        busy_pages,
        Verdict::of(m.tcp_mem[1] >= busy_pages),
    );
    if tcp_mem.verdict == Verdict::TooLow {
        // Keep the kernel's own shape: max = 1.5 x pressure.
        let pressure = busy_pages;
        let max = m.tcp_mem[2].max(pressure + pressure / 2);
        tcp_mem.fix = Some(format!("{} {pressure} {max}", m.tcp_mem[0]));
    }
    let items = vec![
        Item::new(
            NOFILE_SOFT,
            vec![m.nofile_soft],
            per_process,
            // serve and bench raise their soft limit to the hard limit at start.
            Verdict::of(m.nofile_soft.max(m.nofile_hard) >= per_process),
        ),
        Item::at_least(NOFILE_HARD, m.nofile_hard, per_process),
        Item::at_least("fs.nr_open", m.nr_open, per_process),
        Item::at_least("fs.file-max", m.file_max, m.files_open + sockets),
        Item::at_least("net.core.somaxconn", m.somaxconn, backlog),
        // The kernel consults it only without SYN cookies (tcp_conn_request): with
        // them, a full SYN queue is answered with cookies instead of drops.
        Item::new(
            SYN_BACKLOG,
            vec![m.tcp_max_syn_backlog],
            backlog,
            Verdict::of(m.tcp_max_syn_backlog >= backlog || m.tcp_syncookies != 0),
        ),
        Item::new(
            PORT_RANGE,
            m.ip_local_port_range.to_vec(),
            n,
            if span >= n {
                Verdict::Ok
            } else {
                Verdict::Spread
            },
        ),
        tcp_mem,
    ];

    let throng_bytes_per_conn = throng_bytes_per_conn(want.transport);
    let kernel_bytes = sockets * KERNEL_BYTES_PER_SOCKET;
    let receive_bytes = n * IO_URING_BYTES_PER_CONN;
    let throng_bytes = n * throng_bytes_per_conn;
    let bench_bytes = if want.loopback {
        n * BENCH_BYTES_PER_CONN
    } else {
        0
    };
    let total_bytes = kernel_bytes + throng_bytes + bench_bytes;
    let memory = Memory {
        sockets,
        kernel_bytes_per_socket: KERNEL_BYTES_PER_SOCKET,
        kernel_bytes,
        receive_bytes_per_conn: IO_URING_BYTES_PER_CONN,
        receive_bytes,
        throng_bytes_per_conn,
        throng_bytes,
        bench_bytes,
        total_bytes,
        available_bytes: m.mem_available_bytes,
        queued_bytes: busy_pages * m.page_size,
        verdict: Verdict::of(total_bytes <= m.mem_available_bytes),
    };

    let plan = (m.nofile_hard < per_process).then(|| plan(m, n, &ports));
    let fixes = fixes(&items, per_process);
    let ok = memory.verdict == Verdict::Ok && items.iter().all(|i| i.verdict != Verdict::TooLow);
    Report {
        conns: n,
        loopback: want.loopback,
        transport: want.transport,
        machine: m.clone(),
        items,
        memory,
        ports,
        fixes,
        plan,
        applied: Vec::new(),
        ok,
    }
}

/// `--workers` and `--procs` for N connections under the current hard limit.
/// Workers for `n` connections of at most `per_worker` each. The kernel spreads
/// them over the workers by a hash (SO_REUSEPORT), not evenly: each gets about n/w,
/// give or take √(n/w). Plan for four of those above the mean, so no worker is
/// likely to reach its open-files limit (at a million, 51 workers of 19,898 left
/// one at 19,990 connections and refusing more in two runs of three).
fn workers_for(n: u64, per_worker: u64) -> u64 {
    if n <= per_worker {
        return 1;
    }
    let mut workers = n.div_ceil(per_worker);
    loop {
        let mean = n as f64 / workers as f64;
        if mean + 4.0 * mean.sqrt() <= per_worker as f64 || workers >= n {
            return workers;
        }
        workers += 1;
    }
}

fn plan(m: &Machine, n: u64, ports: &Ports) -> Plan {
    let limit = FileLimit {
        soft: m.nofile_hard,
        hard: m.nofile_hard,
    };
    let listeners = m.cores * usize::try_from(ports.server_ports.max(1)).unwrap_or(1);
    let per_worker = limit.connection_ceiling(listeners).max(1);
    let per_proc = m.nofile_hard.saturating_sub(os::RESERVED_FDS).max(1);
    let workers = workers_for(n, per_worker);
    let procs = n.div_ceil(per_proc);
    let (listen, bench_ports) = if ports.server_ports > 1 {
        let last = 8080 + ports.server_ports - 1;
        (format!("8080-{last}"), format!(" --ports 8080-{last}"))
    } else {
        ("8080".to_string(), String::new())
    };
    let sources = match ports.source_addresses {
        0 | 1 => String::new(),
        // bench gives each child an equal share of the addresses when there are
        // at least as many as children, so round up to a multiple of --procs.
        k => {
            let k = if k >= procs {
                k.div_ceil(procs) * procs
            } else {
                k
            };
            format!(
                " --source-ips 127.0.0.2-127.0.0.{}",
                1 + k.min(LOOPBACK_SOURCES)
            )
        }
    };
    Plan {
        per_worker,
        workers,
        per_proc,
        procs,
        serve: format!(
            "throng serve --workers {workers} --broker redis://127.0.0.1:6379 --listen 127.0.0.1:{listen}"
        ),
        bench: format!(
            "throng bench idle --url ws://127.0.0.1:8080/{bench_ports} --conns {n} --procs {procs}{sources}"
        ),
    }
}

fn fixes(items: &[Item], per_process: u64) -> Fixes {
    let mut fixes = Fixes::default();
    for item in items.iter().filter(|i| i.sysctl) {
        if let Some(value) = &item.fix {
            let quoted = if value.contains(' ') {
                format!("\"{value}\"")
            } else {
                value.clone()
            };
            fixes
                .sysctl
                .push(format!("sysctl -w {}={quoted}", item.name));
            fixes.sysctl_conf.push(format!("{} = {value}", item.name));
        }
    }
    if items
        .iter()
        .any(|i| i.name == NOFILE_HARD && i.verdict == Verdict::TooLow)
    {
        fixes.limits_conf = ["*", "root"]
            .iter()
            .flat_map(|who| {
                ["soft", "hard"].map(|kind| format!("{who:<4} {kind} nofile {per_process}"))
            })
            .collect();
        fixes.systemd = Some(format!("LimitNOFILE={per_process}"));
        fixes.shell = Some(format!(
            "ulimit -Hn {per_process} && ulimit -Sn {per_process}"
        ));
    }
    fixes
}

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

/// The line `serve` and `bench` print when a limit will stop them.
pub fn hint(conns: u64) -> String {
    format!("`throng tune --conns {conns}` says what to raise, or how to spread the connections")
}

/// Ports one source address can use towards one server port (`ip_local_port_range`).
pub fn ephemeral_ports() -> Option<u64> {
    let [low, high] = numbers(&Host, &proc_path(PORT_RANGE)).ok()?;
    (high >= low).then(|| high - low + 1)
}

/// Reads `sys`, judges it, and with `apply` sets what it can and judges again.
pub fn tune(sys: &mut impl System, want: Want, apply_fixes: bool) -> Result<Report, TuneError> {
    let report = check(&Machine::read(sys)?, want);
    if !apply_fixes {
        return Ok(report);
    }
    let applied = apply(sys, &report);
    let mut after = check(&Machine::read(sys)?, want);
    after.applied = applied;
    // What was set now must still go into /etc/sysctl.d to outlive a reboot.
    after.fixes.sysctl_conf = report.fixes.sysctl_conf;
    Ok(after)
}

/// Runs `throng tune`: prints the report; `Ok(true)` when nothing stops N connections.
pub fn run(args: &TuneArgs) -> Result<bool, TuneError> {
    let want = Want {
        conns: args.conns,
        loopback: args.loopback,
        transport: args.transport,
    };
    let report = tune(&mut Host, want, args.apply)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", render(&report, args.apply));
    }
    Ok(report.ok)
}

fn join(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
}

/// 4.72 GiB, 92.5 MiB, 512 B.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = b as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        format!("{b} B")
    } else {
        format!("{value:.1} {unit}")
    }
}

/// The text form of the report.
pub fn render(r: &Report, applying: bool) -> String {
    let m = &r.machine;
    let mem = &r.memory;
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    let what = match r.transport {
        Transport::Ws => "WebSockets",
        Transport::Sse => "SSE streams",
        Transport::Poll => "waiting long-polls",
    };
    let who = if r.loopback {
        "server and throng bench on this machine (loopback)"
    } else {
        "the server only (--loopback: throng bench runs here too)"
    };
    line(format!("throng tune: {} {what}, {who}", thousands(r.conns)));
    line(format!(
        "this machine: {} cores, {} available, pages of {} B",
        m.cores,
        bytes(m.mem_available_bytes),
        m.page_size
    ));
    if applying {
        line("\n--apply:".into());
        if r.applied.is_empty() {
            line("  nothing to set: no setting was too low".into());
        }
        for o in &r.applied {
            let verb = if o.applied { "set" } else { "NOT SET" };
            line(format!("  {verb} {}: {}", o.name, o.detail));
        }
        if r.applied.iter().any(|o| o.applied) {
            line("  (until reboot: /etc/sysctl.d/99-throng.conf, below, keeps them)".into());
        }
    }

    line(format!(
        "\n{:<30} {:<24} {:<20} verdict",
        "setting", "current", "needed"
    ));
    for i in &r.items {
        let current = match i.current.as_slice() {
            [one] => thousands(*one),
            many => join(many),
        };
        let needed = match i.name {
            TCP_MEM => format!("pressure {}", thousands(i.needed)),
            PORT_RANGE => format!("{} ports", thousands(i.needed)),
            SYN_BACKLOG if m.tcp_syncookies != 0 => format!("{} w/o cookies", thousands(i.needed)),
            _ => thousands(i.needed),
        };
        line(format!(
            "{:<30} {current:<24} {needed:<20} {}",
            i.name,
            i.verdict.label()
        ));
    }
    line(format!(
        "{:<30} {:<24} {:<20} {}",
        "memory (idle connections)",
        format!("{} available", bytes(mem.available_bytes)),
        bytes(mem.total_bytes),
        mem.verdict.label()
    ));

    let why = [
        (
            "RLIMIT_NOFILE",
            format!(
                "a descriptor per connection in one process, {} kept back, {} listeners\n\
                 (one per I/O thread and port). These are this shell's limits, which serve\n\
                 and bench started from it inherit; each raises its soft limit to the hard one.",
                os::RESERVED_FDS,
                r.items
                    .iter()
                    .find(|i| i.name == NOFILE_HARD)
                    .map_or(0, |i| i.needed - r.conns - os::RESERVED_FDS)
            ),
        ),
        (
            "fs.nr_open",
            "the highest hard open-files limit a process may be given".into(),
        ),
        (
            "fs.file-max",
            format!(
                "descriptors of the whole machine: {} open now + {} sockets",
                thousands(m.files_open),
                thousands(mem.sockets)
            ),
        ),
        (
            "somaxconn",
            format!(
                "throng listens with a backlog of {LISTEN_BACKLOG} (at most N); the kernel cuts it\n\
                 to somaxconn, and a burst of connects beyond it waits for a SYN retry"
            ),
        ),
        (
            "syn_backlog",
            format!(
                "counts only with net.ipv4.tcp_syncookies=0 (here {})",
                m.tcp_syncookies
            ),
        ),
        (
            "tcp_mem",
            format!(
                "a {} B page per connection holding an unread message: a broadcast to\n\
                 all at once takes {}; above pressure the kernel shrinks buffers,\n\
                 above max it drops data",
                thousands(m.page_size),
                bytes(mem.queued_bytes)
            ),
        ),
    ];
    line("\nWhy:".into());
    for (key, text) in why {
        for (i, part) in text.lines().enumerate() {
            line(format!("  {:<14} {part}", if i == 0 { key } else { "" }));
        }
    }

    line(format!(
        "\nMemory for {} idle connections (measured per socket, docs/TUNE.md):",
        thousands(r.conns)
    ));
    let row = |who: &str, count: u64, what: &str, each: u64, total: u64| {
        format!(
            "  {who:<7} {:>11} {what} x {} B = {}",
            thousands(count),
            thousands(each),
            bytes(total)
        )
    };
    line(row(
        "kernel",
        mem.sockets,
        "sockets",
        mem.kernel_bytes_per_socket,
        mem.kernel_bytes,
    ));
    line(row(
        "kernel",
        r.conns,
        "io_uring receives if all were busy (idle: none; not in the total)",
        mem.receive_bytes_per_conn,
        mem.receive_bytes,
    ));
    line(row(
        "throng",
        r.conns,
        what,
        mem.throng_bytes_per_conn,
        mem.throng_bytes,
    ));
    if r.loopback {
        line(row(
            "bench",
            r.conns,
            "connections",
            BENCH_BYTES_PER_CONN,
            mem.bench_bytes,
        ));
    }
    line(format!(
        "  total   {} of {} available: {}",
        bytes(mem.total_bytes),
        bytes(mem.available_bytes),
        mem.verdict.label()
    ));

    let p = &r.ports;
    line(format!(
        "\nEphemeral ports (the load generator's): one source address opens at most {}\n\
         connections to one server port (net.ipv4.ip_local_port_range).",
        thousands(p.per_source_address)
    ));
    if p.source_addresses > 1 {
        line(format!(
            "{} connections to one port: spread them over {} source addresses (each a quarter \
             full, so connect() finds a free port at once): throng bench --source-ips \
             127.0.0.2-127.0.0.{}",
            thousands(r.conns),
            p.source_addresses,
            1 + p.source_addresses.min(LOOPBACK_SOURCES)
        ));
        if p.server_ports > 1 {
            line(format!(
                "That is more than 127.0.0.x offers: listen on {} ports too (serve --listen \
                 HOST:A-B, bench --ports A-B).",
                p.server_ports
            ));
        }
        line(
            "A wider range (sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\") needs fewer \
             addresses;\nkeep it clear of the ports servers listen on."
                .into(),
        );
    }

    if r.loopback && m.cores > 1 {
        line(format!(
            "\nI/O threads: serve runs one event loop per core (--threads {}). With throng bench on\n\
             the same cores, give serve --threads 1 (per worker): half-busy loops sleep and wake\n\
             more often, 1.3x the CPU per handshake (docs/BENCHMARKS.md, sections 15 and 17).",
            m.cores
        ));
    }

    let f = &r.fixes;
    if !f.sysctl.is_empty() {
        line("\nTo fix, now (until reboot; --apply does this):".into());
        for l in &f.sysctl {
            line(format!("  {l}"));
        }
    }
    if !f.sysctl_conf.is_empty() {
        line("\nAt every boot: in /etc/sysctl.d/99-throng.conf (then: sysctl --system):".into());
        for l in &f.sysctl_conf {
            line(format!("  {l}"));
        }
    }
    if let (Some(systemd), Some(shell)) = (&f.systemd, &f.shell) {
        line("\nOpen files (each process's own limit, inherited from what starts it):".into());
        line(format!("  a systemd unit, under [Service]:  {systemd}"));
        line(format!(
            "  a root shell, then start throng from it:  {shell}"
        ));
        line("  login sessions, /etc/security/limits.conf (`*` does not cover root):".into());
        for l in &f.limits_conf {
            line(format!("    {l}"));
        }
        if !m.cap_sys_resource {
            line(format!(
                "  Here this process lacks CAP_SYS_RESOURCE (the container or VM withholds it):\n  \
                 not even root can raise the hard limit above {}.",
                thousands(m.nofile_hard)
            ));
        }
    }
    if let Some(plan) = &r.plan {
        line(format!(
            "\nWith the hard open-files limit at {}, one process holds at most {} connections\n\
             (a serve worker) or {} (a bench process), so spread them over processes:\n  {}\n  {}",
            thousands(m.nofile_hard),
            thousands(plan.per_worker),
            thousands(plan.per_proc),
            plan.serve,
            plan.bench
        ));
    }

    let stopping: Vec<&str> = r
        .items
        .iter()
        .filter(|i| i.verdict == Verdict::TooLow)
        .map(|i| i.name)
        .chain((mem.verdict == Verdict::TooLow).then_some("memory"))
        .collect();
    if stopping.is_empty() {
        line(format!(
            "\nEverything {} connections need is in place.",
            thousands(r.conns)
        ));
    } else {
        line(format!(
            "\nStill too low for {} connections: {} (exit status 1).",
            thousands(r.conns),
            stopping.join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A made-up machine: /proc files from a map, limits in fields.
    struct Fake {
        files: HashMap<String, String>,
        limit: FileLimit,
        may_raise: bool,
        writable: bool,
    }

    impl Fake {
        /// The 2-core VM these figures were measured on.
        fn vm() -> Fake {
            let files = [
                ("/proc/sys/fs/file-nr", "343\t0\t2466170\n"),
                ("/proc/sys/fs/nr_open", "1048576\n"),
                ("/proc/sys/fs/file-max", "2466170\n"),
                ("/proc/sys/net/core/somaxconn", "4096\n"),
                ("/proc/sys/net/ipv4/tcp_max_syn_backlog", "2048\n"),
                ("/proc/sys/net/ipv4/tcp_syncookies", "1\n"),
                ("/proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n"),
                ("/proc/sys/net/ipv4/tcp_mem", "287898\t383867\t575796\n"),
                (
                    "/proc/meminfo",
                    "MemTotal:       24684084 kB\nMemFree:        1 kB\nMemAvailable:   24234272 kB\n",
                ),
                (
                    "/proc/self/status",
                    "Name:\tthrong\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n",
                ),
            ];
            Fake {
                files: files
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                limit: FileLimit {
                    soft: 20_000,
                    hard: 20_000,
                },
                may_raise: false,
                writable: true,
            }
        }
        fn set(&mut self, path: &str, text: &str) {
            self.files.insert(path.into(), text.into());
        }
    }

    impl System for Fake {
        fn read(&self, path: &str) -> io::Result<String> {
            self.files
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn write(&mut self, path: &str, value: &str) -> io::Result<()> {
            if !self.writable {
                return Err(io::Error::from(io::ErrorKind::ReadOnlyFilesystem));
            }
            self.files.insert(path.into(), format!("{value}\n"));
            Ok(())
        }
        fn open_files(&self) -> io::Result<FileLimit> {
            Ok(self.limit)
        }
        fn set_open_files(&mut self, limit: FileLimit) -> io::Result<()> {
            if limit.hard > self.limit.hard && !self.may_raise {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            self.limit = limit;
            Ok(())
        }
        fn cores(&self) -> usize {
            2
        }
        fn page_size(&self) -> u64 {
            4096
        }
    }

    fn want(conns: u64) -> Want {
        Want {
            conns,
            loopback: false,
            transport: Transport::Ws,
        }
    }

    fn item<'a>(r: &'a Report, name: &str) -> &'a Item {
        r.items.iter().find(|i| i.name == name).unwrap()
    }

    #[test]
    fn reads_proc_values_and_limits() {
        let m = Machine::read(&Fake::vm()).unwrap();
        assert_eq!(m.nofile_hard, 20_000);
        assert_eq!(m.nr_open, 1_048_576);
        assert_eq!(m.file_max, 2_466_170);
        assert_eq!(m.files_open, 343);
        assert_eq!(m.somaxconn, 4096);
        assert_eq!(m.tcp_max_syn_backlog, 2048);
        assert_eq!(m.ip_local_port_range, [32768, 60999]);
        assert_eq!(m.tcp_mem, [287_898, 383_867, 575_796]);
        assert_eq!(m.mem_available_bytes, 24_234_272 * 1024);
        assert!(!m.cap_sys_resource, "bit 24 is clear in 1fffeffffff");
        let mut fake = Fake::vm();
        fake.set("/proc/self/status", "CapEff:\t000001ffffffffff\n");
        fake.set("/proc/sys/fs/file-max", "9223372036854775807\n");
        let m = Machine::read(&fake).unwrap();
        assert!(m.cap_sys_resource);
        assert_eq!(m.file_max, u64::MAX / 2);
    }

    #[test]
    fn malformed_or_missing_files_are_errors_that_name_the_file() {
        let mut fake = Fake::vm();
        fake.set("/proc/sys/net/ipv4/tcp_mem", "287898 383867\n");
        let err = Machine::read(&fake).unwrap_err().to_string();
        assert!(
            err.contains("tcp_mem") && err.contains("287898 383867"),
            "{err}"
        );
        fake = Fake::vm();
        fake.set("/proc/sys/net/core/somaxconn", "lots\n");
        assert!(matches!(Machine::read(&fake), Err(TuneError::Parse { .. })));
        fake = Fake::vm();
        fake.set("/proc/meminfo", "MemTotal: 1 kB\n");
        let err = Machine::read(&fake).unwrap_err().to_string();
        assert!(err.contains("MemAvailable"), "{err}");
        fake = Fake::vm();
        fake.files.remove("/proc/sys/fs/nr_open");
        assert!(matches!(Machine::read(&fake), Err(TuneError::Read { .. })));
    }

    #[test]
    fn workers_leave_room_for_the_kernels_uneven_spread() {
        assert_eq!(workers_for(15_000, 19_898), 1);
        assert_eq!(workers_for(100_000, 19_898), 6);
        // 51 would hold 1,000,000 if the kernel spread them evenly; it does not.
        assert_eq!(workers_for(1_000_000, 19_898), 52);
        let w = workers_for(2_000_000, 19_898);
        let mean = 2_000_000.0 / w as f64;
        assert!(mean + 4.0 * mean.sqrt() <= 19_898.0 && w > 2_000_000u64.div_ceil(19_898));
    }

    #[test]
    fn a_million_on_the_vm_needs_workers_and_tcp_mem() {
        let r = check(&Machine::read(&Fake::vm()).unwrap(), want(1_000_000));
        assert!(!r.ok);
        let hard = item(&r, NOFILE_HARD);
        assert_eq!(hard.needed, 1_000_102, "N + 100 reserved + 2 listeners");
        assert_eq!(hard.verdict, Verdict::TooLow);
        assert_eq!(item(&r, "fs.nr_open").verdict, Verdict::Ok);
        assert_eq!(item(&r, "fs.file-max").needed, 1_000_343);
        assert_eq!(item(&r, "net.core.somaxconn").verdict, Verdict::Ok);
        let syn = item(&r, SYN_BACKLOG);
        assert_eq!(
            (syn.needed, syn.verdict),
            (4096, Verdict::Ok),
            "SYN cookies are on"
        );
        let tcp = item(&r, TCP_MEM);
        assert_eq!(tcp.verdict, Verdict::TooLow);
        assert_eq!(tcp.fix.as_deref(), Some("287898 1000000 1500000"));
        assert_eq!(item(&r, PORT_RANGE).verdict, Verdict::Spread);
        assert_eq!(r.ports.per_source_address, 28_232);
        assert_eq!(r.ports.source_addresses, 142);
        assert_eq!(r.memory.kernel_bytes, 1_000_000 * KERNEL_BYTES_PER_SOCKET);
        assert_eq!(r.memory.receive_bytes, 1_000_000 * IO_URING_BYTES_PER_CONN);
        assert_eq!(r.memory.throng_bytes, 97_000_000);
        assert_eq!(r.memory.verdict, Verdict::Ok);
        let plan = r.plan.as_ref().unwrap();
        assert_eq!((plan.per_worker, plan.workers), (19_898, 52));
        assert_eq!((plan.per_proc, plan.procs), (19_900, 51));
        assert!(plan.serve.contains("--workers 52"), "{}", plan.serve);
        assert!(
            plan.bench
                .ends_with("--conns 1000000 --procs 51 --source-ips 127.0.0.2-127.0.0.154"),
            "{}",
            plan.bench
        );
        assert_eq!(
            r.fixes.sysctl,
            ["sysctl -w net.ipv4.tcp_mem=\"287898 1000000 1500000\""]
        );
        assert_eq!(
            r.fixes.sysctl_conf,
            ["net.ipv4.tcp_mem = 287898 1000000 1500000"]
        );
        assert_eq!(r.fixes.systemd.as_deref(), Some("LimitNOFILE=1000102"));
        assert!(
            r.fixes
                .limits_conf
                .contains(&"root hard nofile 1000102".to_string())
        );
    }

    #[test]
    fn without_syn_cookies_the_syn_backlog_must_hold_the_listen_backlog() {
        let mut fake = Fake::vm();
        fake.set("/proc/sys/net/ipv4/tcp_syncookies", "0\n");
        let m = Machine::read(&fake).unwrap();
        let syn = |n| item(&check(&m, want(n)), SYN_BACKLOG).clone();
        assert_eq!(syn(1_000_000).verdict, Verdict::TooLow);
        assert_eq!(syn(1_000_000).fix.as_deref(), Some("4096"));
        assert_eq!((syn(2000).needed, syn(2000).verdict), (2000, Verdict::Ok));
    }

    #[test]
    fn a_small_count_fits_and_exits_zero() {
        let r = check(&Machine::read(&Fake::vm()).unwrap(), want(1000));
        assert!(r.ok, "{r:#?}");
        assert_eq!(item(&r, "net.ipv4.tcp_max_syn_backlog").needed, 1000);
        assert!(r.plan.is_none());
        assert_eq!(r.fixes, Fixes::default());
        assert_eq!(r.ports.source_addresses, 1);
    }

    #[test]
    fn loopback_counts_both_ends() {
        let m = Machine::read(&Fake::vm()).unwrap();
        let alone = check(&m, want(100_000));
        let both = check(
            &m,
            Want {
                loopback: true,
                ..want(100_000)
            },
        );
        assert_eq!(both.memory.sockets, 2 * alone.memory.sockets);
        assert_eq!(both.memory.bench_bytes, 100_000 * BENCH_BYTES_PER_CONN);
        assert_eq!(item(&both, "fs.file-max").needed, 343 + 200_000);
        assert_eq!(alone.memory.bench_bytes, 0);
    }

    #[test]
    fn memory_beyond_what_is_available_is_too_low() {
        let mut fake = Fake::vm();
        fake.set("/proc/meminfo", "MemAvailable:   1048576 kB\n");
        fake.limit = FileLimit {
            soft: 1 << 20,
            hard: 1 << 20,
        };
        let r = check(
            &Machine::read(&fake).unwrap(),
            Want {
                transport: Transport::Poll,
                ..want(300_000)
            },
        );
        assert_eq!(r.memory.throng_bytes, 300_000 * 177);
        assert_eq!(r.memory.verdict, Verdict::TooLow);
        assert!(!r.ok);
        assert!(render(&r, false).contains("Still too low for 300,000 connections: memory"));
    }

    #[test]
    fn apply_writes_sysctls_and_explains_the_open_files_limit() {
        let mut fake = Fake::vm();
        fake.set("/proc/sys/net/core/somaxconn", "128\n");
        let r = check(&Machine::read(&fake).unwrap(), want(1_000_000));
        let out = apply(&mut fake, &r);
        let by = |n: &str| out.iter().find(|o| o.name == n).unwrap();
        assert!(by("net.core.somaxconn").applied);
        assert_eq!(by("net.core.somaxconn").detail, "128 -> 4096");
        assert_eq!(fake.read("/proc/sys/net/core/somaxconn").unwrap(), "4096\n");
        assert!(by(TCP_MEM).applied);
        assert_eq!(
            fake.read("/proc/sys/net/ipv4/tcp_mem").unwrap(),
            "287898 1000000 1500000\n"
        );
        let hard = by(NOFILE_HARD);
        assert!(!hard.applied);
        assert!(hard.detail.contains("CAP_SYS_RESOURCE"), "{}", hard.detail);
        assert!(!by(NOFILE_SOFT).applied);
        assert_eq!(fake.limit.hard, 20_000);
        let after = check(&Machine::read(&fake).unwrap(), want(1_000_000));
        assert_eq!(item(&after, TCP_MEM).verdict, Verdict::Ok);
        assert!(!after.ok, "the open-files limit still stops a million");

        // Where the limit may be raised, tune says so and leaves its own as it was.
        let mut fake = Fake::vm();
        fake.may_raise = true;
        let out = apply(&mut fake, &r);
        assert!(
            out.iter()
                .any(|o| o.detail.contains("it can be raised here"))
        );
        assert_eq!(fake.limit.hard, 20_000);
    }

    #[test]
    fn after_apply_the_report_judges_what_was_set_and_keeps_it_for_boot() {
        let mut fake = Fake::vm();
        fake.limit = FileLimit {
            soft: 1 << 20,
            hard: 1 << 20,
        };
        let r = tune(&mut fake, want(1_000_000), true).unwrap();
        assert!(r.ok, "{r:#?}");
        assert_eq!(r.applied.len(), 1);
        assert!(r.fixes.sysctl.is_empty(), "nothing left to set now");
        assert_eq!(
            r.fixes.sysctl_conf,
            ["net.ipv4.tcp_mem = 287898 1000000 1500000"]
        );
        let text = render(&r, true);
        assert!(
            text.contains("set net.ipv4.tcp_mem: 287898 383867 575796 -> 287898 1000000 1500000")
        );
        assert!(text.contains("/etc/sysctl.d/99-throng.conf"));
        assert!(text.contains("Everything 1,000,000 connections need is in place."));
    }

    #[test]
    fn apply_says_what_it_could_not_write() {
        let mut fake = Fake::vm();
        fake.writable = false;
        fake.set("/proc/sys/net/core/somaxconn", "128\n");
        let r = check(&Machine::read(&fake).unwrap(), want(5000));
        let out = apply(&mut fake, &r);
        assert_eq!(out.len(), 1);
        assert!(!out[0].applied);
        assert!(
            out[0].detail.contains("could not write"),
            "{}",
            out[0].detail
        );
    }

    #[test]
    fn text_names_every_item_and_json_keeps_proc_shapes() {
        let r = check(&Machine::read(&Fake::vm()).unwrap(), want(1_000_000));
        let text = render(&r, false);
        for i in &r.items {
            assert!(text.contains(i.name), "{} missing from\n{text}", i.name);
        }
        assert!(text.contains("throng serve --workers 52"));
        assert!(text.contains("Still too low for 1,000,000 connections"));
        // The server alone gets no advice on sharing cores with the bench...
        assert!(!text.contains("I/O threads"), "{text}");
        // ...but with the bench on the same cores, one loop per worker.
        let shared = Want {
            loopback: true,
            ..want(1_000_000)
        };
        let text = render(&check(&Machine::read(&Fake::vm()).unwrap(), shared), false);
        assert!(
            text.contains("I/O threads") && text.contains("--threads 1"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["items"][4]["current"], 4096);
        assert_eq!(
            json["items"][6]["current"],
            serde_json::json!([32768, 60999])
        );
        assert_eq!(json["items"][7]["verdict"], "TOO LOW");
        assert_eq!(json["items"][7]["fix"], "287898 1000000 1500000");
    }
}
