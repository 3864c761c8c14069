"""HTTP, HTTPS and raw TCP clients for the tests: no proxies, no magic."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass, field

from .proc import LOOPBACK


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    body: str

    def json(self):
        return json.loads(self.body)


def http_request(
    port: int,
    path: str = "/",
    method: str = "GET",
    headers: dict[str, str] | None = None,
    host: str = LOOPBACK,
    timeout: float = 5.0,
) -> Reply:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read().decode("utf-8", "replace")
        return Reply(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, body)
    finally:
        conn.close()


def raw_http(
    port: int, payload: bytes, host: str = LOOPBACK, timeout: float = 5.0, source: str | None = None
) -> bytes:
    """Send exact bytes (e.g. HAProxy's ``OPTIONS / HTTP/1.0\\r\\n\\r\\n``), read until EOF."""
    src = (source, 0) if source else None
    with socket.create_connection((host, port), timeout=timeout, source_address=src) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks)


def tls_context(cafile: str, certfile: str | None = None, keyfile: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


@dataclass
class TLSReply(Reply):
    peer_cert: dict = field(default_factory=dict)
    tls_version: str = ""


def https_request(
    port: int,
    tls_name: str,
    ctx: ssl.SSLContext,
    path: str,
    method: str = "GET",
    host: str = LOOPBACK,
    timeout: float = 10.0,
) -> TLSReply:
    """HTTPS to ``host:port`` verifying the server as ``tls_name`` (SNI = Host = tls_name)."""
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        s = ctx.wrap_socket(raw, server_hostname=tls_name)
    except BaseException:
        raw.close()
        raise
    with s:
        req = (
            f"{method} {path} HTTP/1.1\r\nHost: {tls_name}\r\n"
            "Accept: application/json, text/plain\r\nConnection: close\r\n\r\n"
        )
        s.sendall(req.encode())
        r = http.client.HTTPResponse(s, method=method)
        r.begin()
        body = r.read().decode("utf-8", "replace")
        return TLSReply(
            r.status,
            r.reason,
            {k.lower(): v for k, v in r.getheaders()},
            body,
            peer_cert=s.getpeercert() or {},
            tls_version=s.version() or "",
        )
