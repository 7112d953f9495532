"""The project's structured logger: JSON lines on stdout, via aws-lambda-powertools.

Every line carries the request id of the request being served (set once per request by
the HTTP layer), so one request's lines can be found together::

    from agentscope_serverless.log import logger
    logger.info("session created", extra={"session_id": "s1"})

The level comes from ``POWERTOOLS_LOG_LEVEL`` (or ``LOG_LEVEL``), the service name from
``POWERTOOLS_SERVICE_NAME``. Never pass keys, tokens or request bodies to the logger.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from aws_lambda_powertools import Logger

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "agentscope-serverless"
logger = Logger(service=SERVICE)


def bind_request_id(request_id: str) -> None:
    """Tag every line logged by the current task (and tasks it starts) with ``request_id``."""
    logger.thread_safe_append_keys(request_id=request_id)


def log_request(
    request_id: str, method: str | None, path: str | None, status: int, duration_ms: float
) -> None:
    """The one line logged per request, with the keys of the logger's lines.

    It is on every request, so it is built only when INFO is enabled and written as one
    ``json.dumps`` to stdout, without the logging machinery (which costs ten times more).
    Never pass it anything from the request but these fields.
    """
    if logger.log_level > logging.INFO:
        return
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
    line = {
        "level": "INFO",
        "location": "request",
        "message": "request",
        "timestamp": f"{stamp},{int(now * 1000) % 1000:03d}+0000",
        "service": SERVICE,
        "request_id": request_id,
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": duration_ms,
    }
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


__all__ = ["SERVICE", "bind_request_id", "log_request", "logger"]
