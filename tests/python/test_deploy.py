"""The files in deploy/ work as written.

- deploy/Dockerfile: its build stage compiles from exactly what its COPY lines bring
  in. No container runtime is needed: the COPY instructions of the build stage are
  read, exactly those paths are copied into an empty folder laid out as the
  stage's filesystem. There every file the source embeds (include_str!,
  include_bytes!) must be, and `cargo metadata --locked --offline` (for this host's platform) must read the
  manifest, find every target's source file and resolve every dependency from
  Cargo.lock unchanged: what a missing file would break in the stage's `cargo
  build --release --locked`, checked in a second instead of a minute's build.
- deploy/throng.service: every unit named in After= is also in Wants= or Requires=
  (After= alone only orders; it does not start the unit).
- deploy/nginx.conf: every proxied location passes the client's address.
"""

from __future__ import annotations

import json
import tomllib
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DEPLOY = REPO / "deploy"


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions as (KEYWORD, arguments), continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def build_stage(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """The stage the final image copies its binary from: (name, instructions)."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append((name, []))
        elif stages:
            stages[-1][1].append((keyword, args))
    froms = {m.group(1) for _, body in stages for kw, a in body if kw == "COPY"
             for m in [re.search(r"--from=(\S+)", a)] if m}
    built = [s for s in stages if s[0] in froms]
    assert len(built) == 1, f"expected one stage the image copies from, found {[s[0] for s in built]}"
    return built[0]


def copy_args(args: str) -> tuple[list[str], str]:
    """A COPY's sources and destination (shell or JSON form, flags dropped)."""
    words = json.loads(args) if args.startswith("[") else shlex.split(args)
    while words and words[0].startswith("--"):
        assert not words[0].startswith("--from"), "a COPY --from in the build stage"
        words = words[1:]
    assert len(words) >= 2, f"COPY {args}"
    return words[:-1], words[-1]


def stage_into(stage: list[tuple[str, str]], root: Path) -> Path:
    """Lays out the build stage's COPYs under root (root = the stage's '/'), from the
    repository as the build context. Returns the directory RUN commands run in."""
    workdir = PurePosixPath("/")
    for keyword, args in stage:
        if keyword == "WORKDIR":
            workdir = workdir / args
        elif keyword == "COPY":
            sources, dest = copy_args(args)
            target = workdir / dest
            for src in sources:
                origin = REPO / src
                assert origin.exists(), f"COPY {src}: not in the build context"
                into = root / target.relative_to("/")
                if origin.is_dir():
                    # COPY dir dest: the directory's contents go into dest.
                    shutil.copytree(origin, into, dirs_exist_ok=True)
                else:
                    if dest.endswith("/") or len(sources) > 1:
                        into = into / origin.name
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, into)
    return root / workdir.relative_to("/")


def host_triple(cargo: str) -> str:
    """This machine's target triple (the stage builds for its own): the crates of
    other platforms were never downloaded here, and --offline cannot fetch them."""
    rustc = Path(cargo).with_name("rustc")
    out = subprocess.run([str(rustc) if rustc.exists() else "rustc", "-vV"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("host: "))


def test_the_dockerfile_build_stage_has_every_file_the_build_reads():
    name, stage = build_stage(DEPLOY / "Dockerfile")
    runs = [a for kw, a in stage if kw == "RUN"]
    assert any("cargo build --release --locked" in r for r in runs), runs
    # Every file the source embeds must come in with a COPY (checked directly too,
    # so a missing one is named even before the compiler says so).
    embedded = set()
    for rs in (REPO / "src").rglob("*.rs"):
        for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)', rs.read_text()):
            embedded.add(os.path.normpath(rs.parent / m.group(1)))
    assert embedded, "no include_str!/include_bytes! found in src/"

    cargo = shutil.which("cargo") or str(Path.home() / ".cargo/bin/cargo")
    if not Path(cargo).exists():
        pytest.skip("cargo is not installed")
    import tempfile
    with tempfile.TemporaryDirectory(prefix="throng-docker-") as tmp:
        root = Path(tmp)
        workdir = stage_into(stage, root)
        for path in sorted(embedded):
            rel = Path(path).relative_to(REPO)
            assert (workdir / rel).is_file(), f"{rel} is embedded by src/ but not copied by deploy/Dockerfile"
        proc = subprocess.run([cargo, "metadata", "--locked", "--offline", "--format-version", "1",
                               "--filter-platform", host_triple(cargo)],
                              cwd=workdir, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"cargo metadata in the build stage's files failed:\n{proc.stderr[-4000:]}"
        packages = json.loads(proc.stdout)["packages"]
        ours = [p for p in packages if p["name"] == "throng"]
        assert len(ours) == 1, [p["name"] for p in packages if p["source"] is None]
        for target in ours[0]["targets"]:
            path = Path(target["src_path"])
            assert path.is_file() and path.is_relative_to(workdir), (target["name"], str(path))
        # A declared target whose file is missing is left out of the metadata
        # without a word, but fails the stage's build: each must be there.
        manifest = tomllib.loads((workdir / "Cargo.toml").read_text())
        found = {(kind, t["name"]) for t in ours[0]["targets"] for kind in t["kind"]}
        for kind in ("bench", "test", "example", "bin"):
            for declared in manifest.get(kind, []):
                assert (kind, declared["name"]) in found, f"{kind} {declared['name']}: its file is not copied"
        # Every module file the crate's sources name comes in with them.
        for rs in (REPO / "src").rglob("*.rs"):
            rel = rs.relative_to(REPO)
            assert (workdir / rel).is_file(), f"{rel} is not copied by deploy/Dockerfile"


def unit_sections(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).extend(value.split())
    return sections


@pytest.mark.parametrize("unit", sorted(p.name for p in DEPLOY.glob("*.service")))
def test_every_unit_the_service_starts_after_is_also_wanted(unit):
    sections = unit_sections(DEPLOY / unit)
    u = sections.get("Unit", {})
    after = set(u.get("After", []))
    pulled = set(u.get("Wants", [])) | set(u.get("Requires", []))
    assert after, f"{unit} names no After="
    missing = sorted(after - pulled)
    assert not missing, f"{unit}: After= names {missing} without Wants=/Requires=: ordering alone does not start them"


def test_every_proxied_nginx_location_passes_the_clients_address():
    text = (DEPLOY / "nginx.conf").read_text()
    text = re.sub(r"#[^\n]*", "", text)
    locations = re.findall(r"location\s+(\S+)\s*\{([^}]*)\}", text)
    proxied = [(where, body) for where, body in locations if "proxy_pass" in body]
    assert proxied, "no proxied location in deploy/nginx.conf"
    for where, body in proxied:
        assert re.search(r"proxy_set_header\s+X-Forwarded-For\s+\$proxy_add_x_forwarded_for\s*;", body), \
            f"location {where}: no X-Forwarded-For"


def test_compose_nodes_trust_only_nginx_and_need_an_api_key():
    """Behind nginx every client comes from 127.0.0.1: each node must believe
    nginx's X-Forwarded-For and must not run without an API key (else a client
    nginx forwards for could not publish, or, without the proxy flag, anyone
    could). The flag and variable are checked against the binary's own help."""
    text = (DEPLOY / "docker-compose.yml").read_text()
    nodes = re.findall(r"(?ms)^  (node\d+):\n(.*?)(?=^  \S|\Z)", text)
    assert nodes, "no throng node in deploy/docker-compose.yml"
    for name, body in nodes:
        command = re.search(r"command:\s*(\[.*\])", body)
        assert command, f"{name}: no command"
        args = json.loads(command.group(1))
        assert "--trusted-proxy" in args, f"{name}: {args}"
        assert args[args.index("--trusted-proxy") + 1] == "127.0.0.1", f"{name}: {args}"
        assert re.search(r"THRONG_API_KEY:\s*\$\{THRONG_API_KEY:\?", body), \
            f"{name}: THRONG_API_KEY is not required"
    binary = Path(os.environ.get("THRONG_BIN", REPO / "target/release/throng"))
    help_text = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--trusted-proxy" in help_text and "THRONG_TRUSTED_PROXY" in help_text
    assert "THRONG_API_KEY" in help_text
