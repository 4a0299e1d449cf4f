"""structlog set-up for every minibroker process (docs/design.md §7.2).

Does I/O: writes log lines to stderr (or a file given by the launcher). One event per state
transition, with its facts as key-value pairs; JSON lines when stderr is not a TTY (the launcher's
log files, which `watch` and people read), a readable console format on a TTY.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(
    component: str, *, node_id: int | None = None, json: bool | None = None, level: str = "INFO"
) -> None:
    """Configure structlog once per process; `component` and `node_id` go on every line."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    bound: dict[str, Any] = {"component": component}
    if node_id is not None:
        bound["node_id"] = node_id
    structlog.contextvars.bind_contextvars(**bound)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
