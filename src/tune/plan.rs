//! What N connections need from this machine, judged against what it has.
//!
//! It owns the per-socket figures measured on this machine (docs/TUNE.md), what
//! the connections are ([`Want`], [`Transport`]), and [`check`]: a pure function
//! from a [`Machine`] to the [`Report`] (each setting current against needed,
//! memory, ephemeral ports, the fixes, and a plan over several processes when one
//! cannot hold them all). It does no I/O: reading is `system`'s, writing
//! `apply`'s, printing `render`'s.

use serde::{Serialize, Serializer};

use super::system::{EHASH, Machine, NOFILE_HARD, NOFILE_SOFT, PORT_RANGE, SYN_BACKLOG, TCP_MEM};
use crate::os::{self, FileLimit, LISTEN_BACKLOG};

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
pub(super) const BENCH_BYTES_PER_CONN: u64 = 168;
/// The longest average chain of the established-socket table called fine.
pub(super) const EHASH_CHAIN: u64 = 2;
/// A planned source address fills at most 1/this of its ephemeral range.
const PORT_FILL_DIVISOR: u64 = 4;

/// Loopback source addresses `throng bench --source-ips` can spread over (127.0.0.2–254).
pub(super) const LOOPBACK_SOURCES: u64 = 253;

/// What the connections are (`--transport`), for throng's memory per connection:
/// the same kinds, names and help as `throng bench --transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// WebSocket (`/ws/{channel}?format=json`)
    Ws,
    /// Server-Sent Events (`/sse/{channel}`), plain or chunked
    Sse,
    /// HTTP long-polling (`/poll/{channel}?timeout=30`), polling again with `since=next`
    Poll,
}

/// throng's userspace memory per idle connection, measured at 15,000
/// (docs/BENCHMARKS.md: §12 for WebSocket, §6 for SSE and long-poll).
fn throng_bytes_per_conn(transport: Transport) -> u64 {
    match transport {
        Transport::Ws => 97,
        Transport::Sse => 103,
        Transport::Poll => 177,
    }
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
    /// Holds the connections, but costs every packet time: a table sized at boot.
    #[serde(rename = "SLOW")]
    Slow,
}

impl Verdict {
    pub(super) fn of(ok: bool) -> Verdict {
        if ok { Verdict::Ok } else { Verdict::TooLow }
    }
    pub(super) fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::TooLow => "TOO LOW",
            Verdict::Spread => "SPREAD",
            Verdict::Slow => "SLOW",
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
    pub(super) sysctl: bool,
}

fn one_or_many<S: Serializer>(v: &[u64], s: S) -> Result<S::Ok, S::Error> {
    match v {
        [one] => s.serialize_u64(*one),
        many => many.serialize(s),
    }
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
    /// For the kernel command line (a table sized at boot only).
    pub boot: Option<String>,
    /// Before a container's network namespace is made, on its host.
    pub namespace_sysctl: Option<String>,
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

    let tcp_mem = m.tcp_mem.map(|[min, pressure, max]| {
        let mut item = Item::new(
            TCP_MEM,
            vec![min, pressure, max],
            busy_pages,
            Verdict::of(pressure >= busy_pages),
        );
        if item.verdict == Verdict::TooLow {
            // Keep the kernel's own shape: max = 1.5 x pressure.
            let max = max.max(busy_pages + busy_pages / 2);
            item.fix = Some(format!("{min} {busy_pages} {max}"));
        }
        item
    });
    let mut items = vec![
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
    ];
    items.extend(tcp_mem);
    items.extend(m.tcp_ehash_entries.map(|entries| ehash(entries, sockets)));

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

/// The established-socket table against the sockets: every packet walks one of
/// its chains to find its socket, `sockets / entries` long on average. At a
/// million on the VM (2,000,000 sockets in 262,144 buckets, chains of 8) the
/// lookup was one of the two costliest kernel functions while a broadcast went out, and a
/// table of 2,097,152 took a second off it (docs/BENCHMARKS.md §33). It is sized
/// once, at boot or when a network namespace is made: no `sysctl -w` changes it.
fn ehash(entries: u64, sockets: u64) -> Item {
    let needed = sockets.next_power_of_two();
    let mut item = Item::new(
        EHASH,
        vec![entries],
        needed,
        if entries.saturating_mul(EHASH_CHAIN) >= sockets {
            Verdict::Ok
        } else {
            Verdict::Slow
        },
    );
    item.sysctl = false;
    item
}

/// Workers for `n` connections of at most `per_worker` each. The kernel spreads
/// them over the workers by a hash (SO_REUSEPORT), not evenly: each gets about n/w,
/// give or take √(n/w). Plan for four of those above the mean, so no worker is
/// likely to reach its open-files limit (at a million, 51 workers of 19,898 left
/// one at 19,990 connections and refusing more in two runs of three).
pub(super) fn workers_for(n: u64, per_worker: u64) -> u64 {
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

/// `--workers` and `--procs` for N connections under the current hard limit.
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
    if let Some(ehash) = items
        .iter()
        .find(|i| i.name == EHASH && i.verdict == Verdict::Slow)
    {
        fixes.boot = Some(format!("thash_entries={}", ehash.needed));
        fixes.namespace_sysctl = Some(format!(
            "sysctl -w net.ipv4.tcp_child_ehash_entries={}",
            ehash.needed
        ));
    }
    fixes
}
