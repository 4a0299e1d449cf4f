"""`python -m minibroker.deploy.healthcheck HOST:PORT`: the containers' health check.

Does network I/O: one `grpc.health.v1.Health/Check` call to the address given, with a deadline.
Exits 0 when the process answers SERVING and 1 otherwise (NOT_SERVING, unreachable, deadline
passed), printing one line either way, which is what Docker keeps in `docker inspect` as the
probe's output. A controller reports SERVING once it serves (in a quorum: as a voter, leader or
not; the compose file's brokers wait for all three); a broker only once it has registered with
the active controller, so "healthy" means "part of the cluster" and
`depends_on: condition: service_healthy` orders start-up the way `minibroker cluster up` waits.

Single-threaded and short-lived: one channel, one call, exit.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_TIMEOUT_S = 3.0


def check(
    address: str,
    service: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    command_config: str | None = None,
) -> tuple[bool, str]:
    """Ask `address` for the health of `service` ("" = the whole process).

    Returns (serving, a one-line description of the answer or of the failure).
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from minibroker.client.common.config import load_file
    from minibroker.client.common.tls import client_tls_from_properties, sync_channel

    tls = client_tls_from_properties(load_file(command_config)) if command_config else None
    with sync_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout_s,
                # Wait for the connection within the deadline instead of failing at once while
                # the server is still binding its port: one probe then covers a slow start.
                wait_for_ready=True,
            )
        except grpc.RpcError as err:
            code = err.code()
            name = code.name if code is not None else "UNKNOWN"
            return False, f"{address}: {name} {err.details() or ''}".rstrip()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minibroker.deploy.healthcheck",
        description="Exit 0 when the minibroker process at HOST:PORT reports SERVING over gRPC "
        "health checking, 1 otherwise.",
    )
    parser.add_argument("address", metavar="HOST:PORT", help="the process's gRPC address")
    parser.add_argument(
        "--service",
        default="",
        help="service name to ask about (default: the whole process; e.g. "
        "minibroker.BrokerService)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"deadline of the call (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=None,
        help="Kafka client properties for an SSL listener (security.protocol=SSL, "
        "ssl.ca.location, ssl.certificate.location, ssl.key.location)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serving, line = check(args.address, args.service, args.timeout, args.command_config)
    print(line)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
