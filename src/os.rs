//! Operating-system limits that decide how many connections one process can hold,
//! the few socket options the standard library does not reach, and a thread's own
//! CPU clock.
//!
//! It owns reading and raising the open-files limit and turning it into the
//! connection ceiling the server announces. It must not change anything but this
//! process's own limits (system-wide tuning belongs to `throng tune`, in `tune`).

use std::io;

/// Descriptors kept back for listeners, epoll, wakers, logs and the like.
pub const RESERVED_FDS: u64 = 100;

/// Pending connections the kernel may queue per listener (capped by somaxconn):
/// what the server asks for and `throng tune` checks.
pub const LISTEN_BACKLOG: i32 = 4096;

/// The open-files limits after raising the soft limit to the hard limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    pub soft: u64,
    pub hard: u64,
}

impl FileLimit {
    /// Connections this process can hold: the soft limit less what the server
    /// itself keeps open (`listeners` listening sockets, plus a reserve).
    pub fn connection_ceiling(&self, listeners: usize) -> u64 {
        self.soft
            .saturating_sub(RESERVED_FDS)
            .saturating_sub(listeners as u64)
    }
}

/// Bytes a TCP socket's kernel send queue still holds (not yet acknowledged by
/// the peer); 0 if the kernel will not say.
pub fn unsent_bytes(fd: std::os::fd::RawFd) -> usize {
    let mut unsent: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one c_int for a socket fd; a bad fd only fails.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut unsent) };
    if rc == 0 {
        usize::try_from(unsent).unwrap_or(0)
    } else {
        0
    }
}

/// Asks the kernel to queue a listener's connection for `accept` only once its
/// first bytes have arrived (`TCP_DEFER_ACCEPT`), or after about `seconds` if none
/// come: every client of ours speaks first, so accepting and reading the request
/// become one wake-up of the loop instead of two.
pub fn defer_accept(fd: std::os::fd::RawFd, seconds: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(seconds).unwrap_or(libc::c_int::MAX);
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, value)
}

/// Sets a socket option whose value is one `c_int`, for the options `socket2`
/// does not name.
pub fn set_int_option(
    fd: std::os::fd::RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option reads one c_int of the given size; a bad fd or an option
    // the kernel does not know only fails.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This process's RLIMIT_NOFILE as it stands (nothing raised).
pub fn open_files_limit() -> io::Result<FileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; the pointer is valid.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FileLimit {
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// Sets this process's RLIMIT_NOFILE. Raising the hard limit needs
/// CAP_SYS_RESOURCE (and stays within `fs.nr_open`); lowering it never does.
pub fn set_open_files_limit(limit: FileLimit) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: limit.soft,
        rlim_max: limit.hard,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit and returns both.
pub fn raise_open_files_limit() -> io::Result<FileLimit> {
    let mut lim = open_files_limit()?;
    if lim.soft < lim.hard {
        let raised = FileLimit {
            soft: lim.hard,
            hard: lim.hard,
        };
        if set_open_files_limit(raised).is_ok() {
            lim = raised;
        }
    }
    Ok(lim)
}

/// The CPU time this thread has had (user and system), from
/// `CLOCK_THREAD_CPUTIME_ID`: a budget counted in it is spent by work, not by the
/// wall time a preempted thread waits on a crowded box.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives on this stack frame.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        // Every Linux has this clock; without it a budget is never spent early.
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Groups digits in thousands, for log lines people read (19,900).
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_listener_defers_accepts() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        defer_accept(listener.as_raw_fd(), 1).unwrap();
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one c_int into `value`, whose size is in `len`.
        let rc = unsafe {
            libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert!(value >= 1, "TCP_DEFER_ACCEPT reads back as {value}");
        assert!(defer_accept(-1, 1).is_err());
    }

    use super::*;

    #[test]
    fn ceiling_leaves_room_for_the_server_itself() {
        let lim = FileLimit {
            soft: 20_000,
            hard: 20_000,
        };
        assert_eq!(lim.connection_ceiling(0), 19_900);
        assert_eq!(lim.connection_ceiling(500), 19_400);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let lim = raise_open_files_limit().unwrap();
        assert!(lim.soft <= lim.hard);
        assert_eq!(thousands(19_900), "19,900");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(thousands(999), "999");
    }
}
