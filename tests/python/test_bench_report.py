"""`throng bench ... --report FILE.html`: one self-contained HTML page per run.

Each run here also passes --json, so the page can be checked against the JSON
report of the same run: the page must be one document that loads nothing (no
external src/href, no CSS url() or @import), show the run's mode and connections,
the same latency percentiles (each cell carries its value in µs as `data-us`),
and an <svg> per chart (data-chart="throughput", "connections",
"latency-timeline", "histogram") whose lines have one point per second of the run
(the JSON's `timeline`). Strings from the command line are escaped. A report path
in a missing directory is refused with a usage error (exit 2) before any load.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from support.bench import assert_no_panic, run_bench

MAX_PAGE_BYTES = 200 * 1024
# Tags that would load something, and attributes that name what to load.
LOADING_TAGS = {"link", "img", "iframe", "object", "embed", "audio", "video", "source", "base"}
URL_ATTRS = {"src", "href", "xlink:href", "srcset", "action", "poster", "data", "formaction"}


class Page(HTMLParser):
    """What the checks need from the page, gathered in one pass."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.doctype: str | None = None
        self.counts: dict[str, int] = {}
        self.head_tags: list[str] = []
        self.external: list[str] = []
        self.style = ""
        self.text: list[str] = []
        self.svgs: list[dict] = []
        self.percentiles: dict[str, dict] = {}
        self.kv: dict[str, dict[str, str]] = {}
        self._stack: list[str] = []
        self._section: str | None = None
        self._th: str | None = None
        self._td: dict | None = None
        self._kv_td: str | None = None
        self.feed(text)
        self.close()

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if "head" in self._stack:
            self.head_tags.append(tag)
        if tag in LOADING_TAGS or (tag == "script" and "src" in a):
            self.external.append(f"<{tag} {a}>")
        for name, value in attrs:
            v = (value or "").strip().lower()
            if name in URL_ATTRS or "http:" in v or "https:" in v or v.startswith("//"):
                self.external.append(f"<{tag} {name}={value!r}>")
        if tag == "section":
            self._section = a.get("id")
        if tag == "svg":
            self.svgs.append({"chart": a.get("data-chart"), "polylines": [], "bars": 0, "circles": 0})
        elif self.svgs and "svg" in self._stack:
            svg = self.svgs[-1]
            if tag == "polyline":
                svg["polylines"].append((a.get("class", ""), (a.get("points") or "").split()))
            elif tag == "rect" and "bar" in (a.get("class") or "").split():
                svg["bars"] += 1
            elif tag == "circle":
                svg["circles"] += 1
        if tag == "td" and "data-key" in a:
            self._td = {"key": a["data-key"], "us": a.get("data-us"), "text": ""}
        if tag == "th" and self._section:
            self._th = ""
        if tag == "td" and self._th is not None:
            self._kv_td = ""
        if tag not in ("meta", "br", "line", "rect", "circle", "polyline", "path"):
            self._stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_endtag(self, tag):
        if tag in self._stack:
            while self._stack and self._stack.pop() != tag:
                pass
        if tag == "td" and self._td is not None:
            self.percentiles[self._td["key"]] = self._td
            self._td = None
        if tag == "td" and self._kv_td is not None and self._th is not None:
            self.kv.setdefault(self._section or "", {})[self._th.strip()] = self._kv_td.strip()
            self._kv_td = None
            self._th = None
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._stack and self._stack[-1] == "style":
            self.style += data
            return
        self.text.append(data)
        if self._td is not None:
            self._td["text"] += data
        if self._kv_td is not None:
            self._kv_td += data
        elif self._th is not None:
            self._th += data

    def chart(self, name: str) -> dict:
        found = [s for s in self.svgs if s["chart"] == name]
        assert len(found) == 1, f"expected one <svg data-chart={name!r}>, found {len(found)}"
        return found[0]

    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())


def bench_with_report(tmp_path: Path, name: str, *args) -> tuple[dict, Page, str, str]:
    out = tmp_path / f"{name}.html"
    run = run_bench(*args, "--interval", "1s", "--json", "--report", out)
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert out.exists(), f"no report written\n{ctx}"
    assert f"HTML report written to {out}" in run.stderr, ctx
    raw = out.read_bytes()
    assert len(raw) < MAX_PAGE_BYTES, f"page is {len(raw)} bytes\n{ctx}"
    text = raw.decode("utf-8")
    return r, Page(text), text, ctx


def assert_self_contained(page: Page, text: str, ctx: str) -> None:
    assert page.doctype and page.doctype.lower() == "doctype html", ctx
    for tag in ("html", "head", "body", "main"):
        assert page.counts.get(tag) == 1, (tag, page.counts.get(tag), ctx)
    assert sorted(page.head_tags) == ["meta", "meta", "style", "title"], (page.head_tags, ctx)
    assert text.rstrip().endswith("</html>"), ctx
    assert page.external == [], (page.external, ctx)
    style = page.style.lower()
    assert "url(" not in style and "@import" not in style, ctx
    assert page.counts.get("script", 0) == 0, ctx


def assert_percentiles_match(page: Page, latency: dict, ctx: str) -> None:
    keys = ["avg_us", "median_us", "p90_us", "p95_us", "p99_us", "max_us"]
    assert sorted(page.percentiles) == sorted(keys), (page.percentiles, ctx)
    for key in keys:
        cell = page.percentiles[key]
        assert float(cell["us"]) == latency[key], (key, cell, latency, ctx)
        assert cell["text"].strip().startswith(f"{latency[key] / 1000:.3f}"), (key, cell, ctx)


def assert_timeline_charts(page: Page, r: dict, seconds: int, ctx: str) -> None:
    timeline = r.get("timeline")
    assert isinstance(timeline, list) and timeline, f"no timeline in the JSON\n{ctx}"
    assert abs(len(timeline) - seconds) <= 1, (len(timeline), ctx)
    ts = [s["t_secs"] for s in timeline]
    assert ts == sorted(ts) and ts[-1] <= seconds + 1, (ts, ctx)
    assert all(s["phase"] in ("connect", "load") for s in timeline), ctx
    for name in ("throughput", "connections"):
        svg = page.chart(name)
        assert svg["polylines"], (name, ctx)
        for cls, points in svg["polylines"]:
            assert len(points) == len(timeline), (name, cls, len(points), len(timeline), ctx)
            assert abs(len(points) - seconds) <= 1, (name, cls, len(points), ctx)
            for p in points:
                x, y = (float(v) for v in p.split(","))
                assert 0 <= x <= 1100 and 0 <= y <= 400, (name, p, ctx)
    hist = page.chart("histogram")
    assert hist["bars"] >= 1, ctx


@pytest.mark.parametrize("procs", [1, 2])
def test_echo_report_matches_the_json(start_server, tmp_path, procs):
    srv = start_server()
    conns, seconds = 8, 3
    r, page, text, ctx = bench_with_report(
        tmp_path, "echo", "echo", "--url", srv.url("/echo"), "--conns", conns,
        "--procs", procs, "--duration", f"{seconds}s",
    )
    assert_self_contained(page, text, ctx)
    body = page.all_text()
    assert "throng bench echo" in body, ctx
    settings = page.kv.get("settings", {})
    assert settings.get("mode") == "echo", (settings, ctx)
    assert settings.get("connections") == str(conns), (settings, ctx)
    assert settings.get("url") == srv.url("/echo"), (settings, ctx)
    assert settings.get("processes × threads", "").startswith(f"{procs} ×"), (settings, ctx)
    machine = page.kv.get("machine", {})
    assert machine.get("cores", "").isdigit(), (machine, ctx)
    assert machine.get("kernel") not in (None, "", "unknown"), (machine, ctx)
    assert r["latency"]["samples"] > 0, ctx
    assert_percentiles_match(page, r["latency"], ctx)
    assert_timeline_charts(page, r, seconds, ctx)
    # The load phase keeps every connection open; the chart says so too.
    load = [s for s in r["timeline"] if s["phase"] == "load"]
    assert load and all(s["open"] == conns for s in load), (r["timeline"], ctx)
    assert sum(s["received_per_sec"] for s in load) > 0, ctx
    assert page.chart("latency-timeline")["polylines"], ctx
    assert f"{r['error_rate_pct']:.3f} %" in body, ctx
    assert "No connection failed or dropped" in body, ctx


def test_push_report_shows_the_fanout(start_server, tmp_path):
    srv = start_server()
    conns, channels, seconds = 6, 2, 3
    r, page, text, ctx = bench_with_report(
        tmp_path, "push", "push", "--url", f"http://127.0.0.1:{srv.port}", "--transport", "sse",
        "--conns", conns, "--channels", channels, "--channel-prefix", "report-",
        "--publish-rate", 40, "--grace", "1s", "--duration", f"{seconds}s",
    )
    assert_self_contained(page, text, ctx)
    assert "throng bench push over sse" in page.all_text(), ctx
    settings = page.kv.get("settings", {})
    assert settings.get("mode") == "push" and settings.get("transport") == "sse", (settings, ctx)
    assert settings.get("connections") == str(conns), (settings, ctx)
    assert settings.get("channels") == str(channels), (settings, ctx)
    assert_percentiles_match(page, r["latency"], ctx)
    assert_timeline_charts(page, r, seconds, ctx)
    p = r["push"]
    assert p["published"] > 0 and p["lost"] == 0, ctx
    fanout = page.kv.get("fanout", {})
    for label, key in [("published", "published"), ("delivered", "delivered"), ("lost", "lost"),
                       ("duplicated", "duplicated"), ("reconnects", "reconnects"),
                       ("expected deliveries", "expected_deliveries")]:
        assert fanout.get(label, "").replace(",", "") == str(p[key]), (label, fanout, p, ctx)
    # The publisher's rate is the "published" line: ~40/s in the load's seconds.
    sent = [s["sent_per_sec"] for s in r["timeline"] if s["phase"] == "load"]
    assert sum(sent) > 0, (r["timeline"], ctx)


def test_failed_run_report_escapes_what_it_was_given(tmp_path):
    # Nothing listens: every connection is refused. The URL's path carries markup
    # that must come out as text.
    port = free_port()
    url = f"ws://127.0.0.1:{port}/<script>alert('x&y')</script>"
    conns = 4
    r, page, text, ctx = bench_with_report(
        tmp_path, "refused", "echo", "--url", url, "--conns", conns, "--duration", "1s",
        "--allow-failures",
    )
    assert_self_contained(page, text, ctx)
    assert "<script>" not in text, ctx
    assert page.kv.get("settings", {}).get("url") == url, ctx
    assert r["failed"] == conns, ctx
    body = page.all_text()
    assert f"{conns} errors" in body and "refused" in body, ctx
    assert page.percentiles == {}, ctx  # no latency samples, no table
    assert "No latency samples" in body, ctx


@pytest.mark.parametrize("where", ["missing/dir/report.html", "a-directory"])
def test_report_path_is_checked_before_the_load(start_server, tmp_path, where):
    srv = start_server()
    (tmp_path / "a-directory").mkdir()
    target = tmp_path / where
    def accepted() -> int:
        return httpx.get(f"http://127.0.0.1:{srv.port}/api/stats", timeout=10).json()["accepted"]

    before = accepted()
    # An hour's load: only a check made before it can end the run within the
    # harness's timeout.
    run = run_bench(
        "echo", "--url", srv.url("/echo"), "--conns", 4, "--duration", "1h", "--json",
        "--report", target,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 2, ctx
    # Nothing reached the server: the one connection since is this request's own.
    assert accepted() - before == 1, ctx
    assert run.stdout == "", ctx
    assert "--report" in run.stderr, ctx
    assert ("does not exist" in run.stderr) if where.startswith("missing") else ("is a directory" in run.stderr), ctx
    assert "opened" not in run.stderr, ctx
    assert not (tmp_path / "missing").exists(), ctx
