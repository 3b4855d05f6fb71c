"""Running `throng bench` as the tests do (`run_bench`, `bench_cmd`, `bench_env`,
`short`: the flags every short run shares) and the asserts on its JSON report
(`assert_clean`, `assert_latency_sane`, `assert_no_panic`). It starts no server."""

from __future__ import annotations

import json
import os
import subprocess
import time

from conftest import throng_bin


BENCH_TIMEOUT = 30.0


class BenchRun:
    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str, elapsed: float):
        self.args = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed

    def describe(self, limit: int = 4000) -> str:
        def tail(s: str) -> str:
            return s if len(s) <= limit else "...[truncated]...\n" + s[-limit:]

        return (
            f"command: {' '.join(self.args)}\nexit {self.returncode} after {self.elapsed:.2f}s\n"
            f"--- stdout ---\n{tail(self.stdout)}\n--- stderr ---\n{tail(self.stderr)}"
        )

    def report(self) -> dict:
        """The one JSON object on stdout (json.loads rejects anything after it)."""
        try:
            obj = json.loads(self.stdout)
        except ValueError as e:
            raise AssertionError(f"stdout is not one JSON object ({e})\n{self.describe()}") from None
        assert isinstance(obj, dict), f"stdout JSON is not an object\n{self.describe()}"
        return obj


def bench_env() -> dict:
    # THRONG_API_KEY etc. from the caller's environment must not leak into the run.
    return {k: v for k, v in os.environ.items() if not k.startswith("THRONG_")}


def bench_cmd(*args) -> list[str]:
    return [str(throng_bin()), "bench", *[str(a) for a in args]]


def run_bench(*args, timeout: float = BENCH_TIMEOUT) -> BenchRun:
    cmd = bench_cmd(*args)
    t0 = time.monotonic()
    p = subprocess.run(
        cmd, capture_output=True, timeout=timeout, env=bench_env(), stdin=subprocess.DEVNULL
    )
    return BenchRun(
        cmd, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
        time.monotonic() - t0,
    )


def short(*extra, duration: str = "1s") -> list[str]:
    """Flags every run here shares: short load, status every second, JSON out."""
    return ["--duration", duration, "--interval", "1s", "--json", *extra]


def assert_no_panic(run: BenchRun) -> None:
    assert "panicked" not in run.stderr, f"bench panicked\n{run.describe()}"
    assert "RUST_BACKTRACE" not in run.stderr, f"bench panicked\n{run.describe()}"


def assert_clean(r: dict, conns: int, ctx: str) -> None:
    """Every connection opened, none failed or dropped, all still open at the end."""
    assert r["attempted"] == conns, ctx
    assert r["opened"] == conns, ctx
    assert r["failed"] == 0, ctx
    assert r["dropped"] == 0, ctx
    assert r["failures"] == {}, ctx
    assert r["sockets"] == conns, ctx


def assert_latency_sane(lat: dict, ctx: str) -> None:
    assert lat["samples"] > 0, ctx
    assert 0 < lat["median_us"] <= lat["p90_us"] <= lat["p95_us"] <= lat["p99_us"] <= lat["max_us"], ctx
    assert 0 < lat["avg_us"] <= lat["max_us"], ctx
    # Loopback, a few connections: nothing near 5 s.
    assert lat["max_us"] < 5_000_000, ctx
