"""The streaming process function's web application, served by uvicorn from ``run.sh``.

The Lambda Web Adapter turns each invocation into an HTTP request to it and streams the
response (``InvokeMode: RESPONSE_STREAM``), so ``/process`` events reach the client as
they are produced. uvicorn calls :func:`create` at start-up (``--factory``), so importing
this module connects to nothing.
"""

from fastapi import FastAPI

from agentscope_serverless.http.lambda_handler import build_app


def create() -> FastAPI:
    """The application with the process router, its secrets read."""
    return build_app(["process", "users"])
