"""The project's structured logger: JSON lines on stdout, via aws-lambda-powertools.

Every line carries the request id of the request being served (set once per request by
the HTTP layer), so one request's lines can be found together::

    from agentscope_serverless.log import logger
    logger.info("session created", extra={"session_id": "s1"})

The level comes from ``POWERTOOLS_LOG_LEVEL`` (or ``LOG_LEVEL``), the service name from
``POWERTOOLS_SERVICE_NAME``. Never pass keys, tokens or request bodies to the logger.
"""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "agentscope-serverless")


def bind_request_id(request_id: str) -> None:
    """Tag every line logged by the current task (and tasks it starts) with ``request_id``."""
    logger.thread_safe_append_keys(request_id=request_id)


__all__ = ["bind_request_id", "logger"]
