"""The streaming process function's web application, served by uvicorn from ``run.sh``.

The Lambda Web Adapter turns each invocation into an HTTP request to it and streams the
response (``InvokeMode: RESPONSE_STREAM``), so ``/process`` events reach the client as
they are produced. uvicorn calls :func:`create` at start-up (``--factory``), so importing
this module connects to nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The HTTP package imports FastAPI itself, as a cold start wants it (see http/_fastapi.py).
from agentscope_serverless.http.lambda_handler import build_web_adapter_app, import_runtime

if TYPE_CHECKING:
    from starlette.types import ASGIApp

ROUTERS = ("process", "users")
import_runtime(ROUTERS)


def create() -> ASGIApp:
    """The application with the process router, its secrets read as the server starts (one
    that cannot start answers 503, and starts at a later request once it can); each
    request's work ends before the time limit of the invocation it came in."""
    return build_web_adapter_app(ROUTERS)
