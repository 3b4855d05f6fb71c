//! The client side's machine and its own cost.
//!
//! Owns [`Machine`] (cores, CPU, kernel, memory, host name, for the HTML page)
//! and this process's CPU time and memory as Linux reports them. It must not
//! measure the load: it only reads `/proc` and `getrusage`.

/// The machine the bench ran on, for the HTML report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    pub cores: usize,
    /// `model name` of /proc/cpuinfo; empty when unknown.
    pub cpu_model: String,
    /// `uname -r`; empty when unknown.
    pub kernel: String,
    pub memory_kb: u64,
    pub hostname: String,
}

impl Machine {
    /// Reads what Linux tells about this machine; what it cannot read stays empty.
    pub fn detect() -> Machine {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == "model name").then(|| v.trim().to_string())
                })
                .unwrap_or_default(),
            kernel: read("/proc/sys/kernel/osrelease"),
            memory_kb: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0),
            hostname: read("/proc/sys/kernel/hostname"),
        }
    }
}

/// This process's CPU time (utime + stime) in seconds.
pub fn self_cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to our own rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A `/proc/self/status` field in kB (`VmRSS`, `VmHWM`); 0 when unavailable.
pub fn proc_status_kb(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
