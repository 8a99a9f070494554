"""Log records that name the request and the trace they belong to.

The API layers set `current_request_id` and `current_trace_id` while they handle a request
(context variables follow asyncio tasks), and the filter copies them onto every record, so a
log line can be joined with its trace and with the client's request id.
"""

from __future__ import annotations

import logging
import os
from contextvars import ContextVar

current_request_id: ContextVar[str] = ContextVar("minedraft_request_id", default="-")
current_trace_id: ContextVar[str] = ContextVar("minedraft_trace_id", default="-")

LOG_FORMAT = "%(asctime)s {service} %(levelname)s [request=%(request_id)s trace=%(trace_id)s] %(message)s"


class RequestContextFilter(logging.Filter):
    """Adds `request_id` and `trace_id` (32 hex digits, or '-') to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        record.trace_id = current_trace_id.get()
        return True


def configure_logging(service: str, level: int | None = None) -> None:
    """Root logging for one service process (called by its main, never at import). The level: `level`, else
    MINEDRAFT_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR), else INFO."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestContextFilter())
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(service=service)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    named = os.environ.get("MINEDRAFT_LOG_LEVEL", "INFO").strip().upper()
    chosen = logging.getLevelNamesMapping().get(named)
    root.setLevel(level if level is not None else chosen if chosen is not None else logging.INFO)
    if level is None and chosen is None:
        root.warning("MINEDRAFT_LOG_LEVEL=%r is not a level (DEBUG, INFO, WARNING, ERROR): logging at INFO", named)
