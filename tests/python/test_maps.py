"""The maps stay true: what lib.rs's layout, the docs and bench/README.md name
exists, and what exists is named. File checks only, no server."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
DOCS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("src", "bench", "tests", "scripts", "deploy", "docs", "web", "fuzz", "benches")
# Folders a tool makes when it has something to put there (cargo-fuzz's crashes).
MADE_LATER = ("fuzz/artifacts",)


def test_every_module_of_the_crate_is_in_lib_rs_layout():
    lib = (SRC / "lib.rs").read_text()
    layout = "\n".join(line for line in lib.splitlines() if line.startswith("//!"))
    modules = re.findall(r"^pub mod (\w+);", lib, re.M)
    assert modules, "no pub mod in lib.rs"
    missing = [m for m in modules if f"[`{m}`]" not in layout]
    assert not missing, f"lib.rs's layout does not name: {missing}"


def test_every_source_file_opens_with_what_it_owns():
    bare = [
        str(rs.relative_to(REPO))
        for rs in SRC.rglob("*.rs")
        if rs.name != "tests.rs" and "tests" not in rs.relative_to(SRC).parts[:-1]
        and not rs.read_text().startswith("//!")
    ]
    assert not bare, f"files without a //! opening doc: {bare}"


def test_every_bench_script_is_indexed_in_bench_readme():
    index = (REPO / "bench" / "README.md").read_text()
    scripts = sorted(p.name for p in (REPO / "bench").iterdir() if p.suffix in (".py", ".sh"))
    missing = [s for s in scripts if f"`{s}`" not in index]
    assert not missing, f"bench/README.md does not index: {missing}"


def cited_paths(text: str) -> set[str]:
    """Repository paths written in backticks (a top folder, a slash, the rest)."""
    out = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.rstrip(".,:;)").split("::")[0]
        if token.split("/", 1)[0] in TOP and "/" in token:
            out.add(token)
    return out


def exists(cited: str) -> bool:
    # A placeholder (`bench/results/fanout-STAMP.json`, `fuzz/corpus/TARGET`,
    # `{a,b}` alternatives, globs) is checked up to the folder it names.
    if re.search(r"[A-Z]{4,}|[{*]", cited):
        cited = cited[: re.search(r"[A-Z]{4,}|[{*]", cited).start()].rsplit("/", 1)[0]
    if cited.startswith(MADE_LATER):
        return True
    path = REPO / cited
    if path.exists():
        return True
    # A raw result named by its stem stands for its .json and .md.
    return any(path.parent.glob(path.name + ".*")) if path.parent.is_dir() else False


def test_every_path_the_docs_cite_exists():
    gone = []
    for doc in DOCS:
        for cited in sorted(cited_paths(doc.read_text())):
            if not exists(cited):
                gone.append(f"{doc.relative_to(REPO)}: {cited}")
    assert not gone, "cited but not there:\n" + "\n".join(gone)


def test_every_path_the_test_and_bench_scripts_cite_exists():
    scripts = [
        *(REPO / "tests" / "python").glob("*.py"),
        *(REPO / "bench").glob("*.py"),
        *(REPO / "bench").glob("*.sh"),
        *(p for p in (REPO / "scripts").iterdir() if p.is_file()),
    ]
    gone = [
        f"{script.relative_to(REPO)}: {cited}"
        for script in scripts
        for cited in sorted(cited_paths(script.read_text(errors="replace")))
        if not exists(cited)
    ]
    assert not gone, "cited but not there:\n" + "\n".join(gone)


def test_every_rust_file_architecture_names_exists():
    names = {p.name for p in SRC.rglob("*.rs")}
    tails = {str(p.relative_to(SRC)) for p in SRC.rglob("*.rs")}
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    gone = []
    for token in set(re.findall(r"`([a-z_/]+\.rs)`", text)):
        if token.startswith("src/"):
            continue  # checked with every cited path
        if "/" in token:
            if not any(t == token or t.endswith("/" + token) for t in tails):
                gone.append(token)
        elif token not in names:
            gone.append(token)
    assert not gone, f"docs/ARCHITECTURE.md names files src/ does not have: {sorted(gone)}"
