"""nginx configurations the tests run (with procs.Nginx): `fronting` renders
deploy/nginx.conf in front of some throng nodes, `nchan_conf` the nchan peer from
bench/peers/nchan/nginx.conf.template."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEPLOY_CONF = ROOT / "deploy/nginx.conf"


def fronting(node_ports: list[int], worker_connections: int = 1024):
    """deploy/nginx.conf with its upstream pointed at the nodes, round-robin. Each
    client through nginx takes two of its `worker_connections` (one upstream)."""
    site = DEPLOY_CONF.read_text()
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in node_ports)
    site, n = re.subn(r"(?m)^    server 127\.0\.0\.1:\d+ .*\n(    server 127\.0\.0\.1:\d+ .*\n)*", servers + "\n", site)
    assert n == 1, "deploy/nginx.conf: the upstream's server lines were not found"
    site = site.replace("    ip_hash;\n", "")

    def render(d: Path, port: int, user: str) -> str:
        (d / "site.conf").write_text(site.replace("listen 80;", f"listen 127.0.0.1:{port};"))
        return f"""{user}
daemon off;
worker_processes 1;
worker_rlimit_nofile {worker_connections + 100};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections {worker_connections}; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    include {d}/site.conf;
}}
"""

    return render


TEMPLATE = ROOT / "bench/peers/nchan/nginx.conf.template"
MODULES = [Path("/usr/lib/nginx/modules/ngx_nchan_module.so"), Path("/usr/share/nginx/modules/ngx_nchan_module.so")]


def nchan_conf(directory: Path, port: int, user: str) -> str:
    module = next((m for m in MODULES if m.exists()), None)
    assert module, "libnginx-mod-nchan is not installed (scripts/test.sh installs it)"
    return (
        TEMPLATE.read_text()
        .replace("@MODULE@", str(module))
        .replace("@WORKERS@", "1")
        .replace("@PORT@", str(port))
        .replace("@DIR@", str(directory))
        .replace("@USER@", user)
    )
