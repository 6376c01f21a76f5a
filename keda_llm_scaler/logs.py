"""The scaler's logs: structlog, JSON lines on stdout (console rendering on a TTY), configured once at start.

Its own module so that every process that logs (``serve``, its scrape workers, the demo) configures logging
without importing the metrics (``keda_llm_scaler.telemetry``) and everything they read.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog (and stdlib logging from grpc/httpx) once, at process start."""
    if json is None:
        json = not sys.stdout.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # httpx logs every request at INFO
