"""Prometheus metrics serving for a process (docs/design.md §7.3).

Does I/O: `serve(port)` starts prometheus-client's HTTP server thread on 127.0.0.1 (port 0
picks a free port; the bound port is returned). Each process keeps its own registry so tests
that run several components in one interpreter do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics; returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
