"""docs/FIGURES.md is what bench/figures.py writes from bench/results/, so the page of
today's figures cannot drift from the raw results; and every raw file it cites is
there. File checks only, no server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "FIGURES.md"


def full_git_history() -> bool:
    # bench/figures.py asks git which of two measured builds is the older one.
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "false"


@pytest.mark.skipif(not full_git_history(), reason="needs the repository's whole git history")
def test_figures_page_is_what_the_script_writes(tmp_path):
    out = tmp_path / "FIGURES.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "figures.py"), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_text() == PAGE.read_text(), (
        "docs/FIGURES.md differs from what bench/figures.py writes: run `python3 bench/figures.py`")


def test_figures_page_cites_raw_files_that_exist():
    cited = re.findall(r"`(bench/results/[^`]+)`", PAGE.read_text())
    assert cited, "docs/FIGURES.md cites no raw file"
    gone = sorted({c for c in cited if not (REPO / c).is_file()})
    assert not gone, f"docs/FIGURES.md cites raw files that are not there: {gone}"


def test_figures_page_says_it_is_generated_and_where_the_how_is():
    head = "\n".join(PAGE.read_text().splitlines()[:12])
    assert "python3 bench/figures.py" in head and "do not" in head.lower()
    assert "(BENCHMARKS.md)" in head
