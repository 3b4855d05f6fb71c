//! Unit tests of `throng tune`, on a made-up machine ([`System`] fed from a map).

use std::collections::HashMap;

use super::plan::{BENCH_BYTES_PER_CONN, workers_for};
use super::system::{EHASH, NOFILE_HARD, NOFILE_SOFT, PORT_RANGE, SYN_BACKLOG, TCP_MEM};
use super::*;
use crate::os::FileLimit;

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
    assert_eq!(m.tcp_mem, Some([287_898, 383_867, 575_796]));
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
    assert!(text.contains("set net.ipv4.tcp_mem: 287898 383867 575796 -> 287898 1000000 1500000"));
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

#[test]
fn a_socket_table_smaller_than_the_sockets_is_slow_and_fixed_at_boot_not_by_sysctl() {
    let mut fake = Fake::vm();
    // Before Linux 6.1 the table's size is not shown: nothing to judge.
    let r = check(&Machine::read(&fake).unwrap(), want(1_000_000));
    assert!(r.items.iter().all(|i| i.name != EHASH));
    assert_eq!(r.fixes.boot, None);

    fake.set("/proc/sys/net/ipv4/tcp_ehash_entries", "262144\n");
    let loopback = Want {
        loopback: true,
        ..want(1_000_000)
    };
    let r = check(&Machine::read(&fake).unwrap(), loopback);
    let ehash = item(&r, EHASH);
    assert_eq!(ehash.current, [262_144]);
    assert_eq!(
        ehash.needed, 2_097_152,
        "two sockets a connection, a power of two"
    );
    assert_eq!(ehash.verdict, Verdict::Slow);
    let json = serde_json::to_value(ehash).unwrap();
    assert_eq!(
        (&json["verdict"], &json["fix"]),
        (&serde_json::json!("SLOW"), &serde_json::Value::Null)
    );
    assert_eq!(r.fixes.boot.as_deref(), Some("thash_entries=2097152"));
    assert_eq!(
        r.fixes.namespace_sysctl.as_deref(),
        Some("sysctl -w net.ipv4.tcp_child_ehash_entries=2097152")
    );
    // No sysctl -w resizes it, so --apply has nothing to try.
    assert!(
        r.fixes.sysctl.iter().all(|l| !l.contains("ehash")),
        "{:?}",
        r.fixes.sysctl
    );
    let text = render(&r, false);
    assert!(text.contains("chains of 7.6"), "{text}");
    assert!(text.contains("thash_entries=2097152"), "{text}");
    assert!(
        !text.contains("Still too low for 1,000,000 connections: net.ipv4.tcp_ehash"),
        "{text}"
    );

    // Chains of two at most are fine, and a slow table alone fails nothing.
    let r = check(&Machine::read(&fake).unwrap(), want(500_000));
    assert_eq!(item(&r, EHASH).verdict, Verdict::Ok);
    assert_eq!(r.fixes.boot, None);
    fake.set("/proc/sys/net/ipv4/tcp_mem", "287898 1000000 1500000\n");
    fake.limit = FileLimit {
        soft: 2_000_000,
        hard: 2_000_000,
    };
    let r = check(&Machine::read(&fake).unwrap(), loopback);
    assert_eq!(item(&r, EHASH).verdict, Verdict::Slow);
    assert!(r.ok, "{:?}", r.items);
}

#[test]
fn in_a_network_namespace_of_its_own_tcp_mem_is_the_hosts_and_said_so() {
    let mut fake = Fake::vm();
    fake.files.remove("/proc/sys/net/ipv4/tcp_mem");
    let m = Machine::read(&fake).unwrap();
    assert_eq!(m.tcp_mem, None);
    let r = check(&m, want(1_000_000));
    assert!(r.items.iter().all(|i| i.name != TCP_MEM));
    assert!(r.fixes.sysctl.iter().all(|l| !l.contains("tcp_mem")));
    let text = render(&r, false);
    assert!(
        text.contains("not shown in this network namespace: the host's applies"),
        "{text}"
    );
}
