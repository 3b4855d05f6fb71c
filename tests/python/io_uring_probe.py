"""Whether this machine can make an io_uring instance: imported by the tests that
need one, and run by scripts/test.sh before the rings' own unit tests
(`python3 tests/python/io_uring_probe.py`: exit 0 if it can, else 1 with the
reason on stdout). Standard library only."""

from __future__ import annotations

import ctypes
import os
import sys


def io_uring_unavailable() -> str | None:
    """Why this machine cannot make an io_uring instance, or None if it can: the
    kernel.io_uring_disabled sysctl, then io_uring_setup itself (an old kernel,
    or a seccomp filter such as a container's, refuses it)."""
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            disabled = f.read().strip()
        if disabled != "0":
            return f"kernel.io_uring_disabled is {disabled}"
    except OSError:
        pass  # a kernel older than the sysctl: ask the system call
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 1, params)  # io_uring_setup(1 entry)
    if fd < 0:
        err = ctypes.get_errno()
        return f"io_uring_setup failed: {os.strerror(err)}"
    os.close(fd)
    return None


if __name__ == "__main__":
    why = io_uring_unavailable()
    print(why or "io_uring available")
    sys.exit(1 if why else 0)
