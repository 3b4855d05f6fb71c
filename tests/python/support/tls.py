"""TLS helpers: a self-signed certificate (`make_cert`), a client context that
trusts it, the certificate a server serves, and a GET over a resumable session."""

from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path


def make_cert(directory: Path, name: str, key_type: str = "ec") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, with its key."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"] if key_type == "ec" else ["-newkey", "rsa:2048"]
    subprocess.run(
        ["openssl", "req", "-x509", *newkey, "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def client_context(cert: Path, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cert))
    if version is not None:
        ctx.minimum_version = version
        ctx.maximum_version = version
    return ctx


def served_cert(port: int) -> bytes:
    """The DER certificate a new handshake is given (not verified)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.getpeercert(binary_form=True)


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def https_get(port: int, ctx: ssl.SSLContext, session=None):
    """GET /healthz over a new TLS connection; (session, whether it resumed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            body = b""
            while chunk := s.recv(4096):
                body += chunk
            assert body.startswith(b"HTTP/1.1 200"), body
            return s.session, s.session_reused
