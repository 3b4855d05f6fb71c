//! The text `throng tune` prints: the machine, each setting current against
//! needed, why each matters, memory, ephemeral ports, and the commands that fix
//! what is too low.
//!
//! It owns wording and layout only: every figure comes from the [`Report`], so
//! it reads nothing from the machine and decides nothing. (`--json` prints the
//! report itself.)

use super::plan::{
    BENCH_BYTES_PER_CONN, EHASH_CHAIN, LOOPBACK_SOURCES, Report, Transport, Verdict,
};
use super::system::{EHASH, NOFILE_HARD, PORT_RANGE, SYN_BACKLOG, TCP_MEM, join};
use crate::os::{self, LISTEN_BACKLOG, thousands};

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
            EHASH => format!("{} sockets", thousands(mem.sockets)),
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
    if m.tcp_mem.is_none() {
        line(format!(
            "{TCP_MEM:<30} {:<45} CHECK",
            "not shown in this network namespace: the host's applies (run tune there)"
        ));
    }
    line(format!(
        "{:<30} {:<24} {:<20} {}",
        "memory (idle connections)",
        format!("{} available", bytes(mem.available_bytes)),
        bytes(mem.total_bytes),
        mem.verdict.label()
    ));

    let mut why = vec![
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
    if let Some(entries) = m.tcp_ehash_entries {
        why.push((
            "tcp_ehash",
            format!(
                "every TCP packet finds its socket by walking one chain of this table:\n\
                 {} sockets in {} buckets are chains of {:.1} (SLOW above {EHASH_CHAIN});\n\
                 it is sized at boot, or when a network namespace is made",
                thousands(mem.sockets),
                thousands(entries),
                mem.sockets as f64 / entries.max(1) as f64
            ),
        ));
    }
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
    if let (Some(boot), Some(namespace)) = (&f.boot, &f.namespace_sysctl) {
        line(
            "\nThe socket table (no sysctl -w resizes it; it holds the connections as it is, slower):"
                .into(),
        );
        line(format!("  the kernel command line, then reboot:  {boot}"));
        line(format!(
            "  a container's network namespace, on its host before it is made:  {namespace}"
        ));
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
