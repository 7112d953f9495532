"""A stand-in for the AWS Lambda Web Adapter, to run the streaming function without Docker.

In Lambda, the Web Adapter layer (``AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap``) starts the
function's ``run.sh`` (a web server on ``AWS_LWA_PORT``), waits until it answers on
``AWS_LWA_READINESS_CHECK_PATH`` (or, with ``AWS_LWA_READINESS_CHECK_PROTOCOL=tcp``, takes a
connection), then turns every invocation into an HTTP request and, with
``AWS_LWA_INVOKE_MODE=response_stream``, streams the response back to the Runtime API as
it is produced. This module does the same, so a test runs the very ``run.sh`` that ships.

Usage: ``python -m tests.support.web_adapter ./run.sh`` with ``AWS_LAMBDA_RUNTIME_API`` set.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}
NEXT = "/2018-06-01/runtime/invocation/next"


def is_ready(port: int, path: str, protocol: str) -> bool:
    """The adapter's readiness check: over ``tcp``, the port takes a connection; over
    ``http``, ``path`` answers with a status below 500."""
    if protocol == "tcp":
        with socket.socket() as probe:
            probe.settimeout(1)
            return probe.connect_ex(("127.0.0.1", port)) == 0
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code < 500
    except httpx.TransportError:
        return False


def wait_until_ready(port: int, path: str, protocol: str, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if child.poll() is not None:
            sys.exit(f"the web server exited with {child.returncode} before it was ready")
        if is_ready(port, path, protocol):
            return
        time.sleep(0.05)
    sys.exit("the web server did not become ready within 30 s")


def forward(
    client: httpx.Client, base_url: str, event: dict[str, Any], lambda_context: dict[str, Any]
) -> httpx.Response:
    body = event.get("body") or ""
    content = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
    query = event.get("rawQueryString") or ""
    url = base_url + event.get("rawPath", "/") + (f"?{query}" if query else "")
    method = event["requestContext"]["http"]["method"]
    headers = {k: v for k, v in (event.get("headers") or {}).items() if k not in HOP_BY_HOP}
    # Like the Web Adapter: the request context (with the IAM caller) and the Lambda context
    # (with the invocation's deadline) travel in headers, replacing whatever a client may have
    # sent under those names.
    headers["x-amzn-request-context"] = json.dumps(event.get("requestContext") or {})
    headers["x-amzn-lambda-context"] = json.dumps(lambda_context)
    request = client.build_request(method, url, headers=headers, content=content)
    return client.send(request, stream=True)


def streamed_body(upstream: httpx.Response) -> Iterator[bytes]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
    yield json.dumps({"statusCode": upstream.status_code, "headers": headers}).encode()
    yield b"\x00" * 8
    try:
        yield from upstream.iter_raw()
    finally:
        upstream.close()


def main() -> None:
    api = os.environ["AWS_LAMBDA_RUNTIME_API"]
    port = int(os.environ.get("AWS_LWA_PORT", os.environ.get("PORT", "8080")))
    readiness = os.environ.get("AWS_LWA_READINESS_CHECK_PATH", "/")
    protocol = os.environ.get("AWS_LWA_READINESS_CHECK_PROTOCOL", "http")
    base_url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen(sys.argv[1:])
    try:
        wait_until_ready(port, readiness, protocol, child)
        with httpx.Client(timeout=None) as runtime, httpx.Client(timeout=None) as app:
            while True:
                invocation = runtime.get(f"http://{api}{NEXT}")
                request_id = invocation.headers["lambda-runtime-aws-request-id"]
                lambda_context = {
                    "request_id": request_id,
                    "deadline": int(invocation.headers["lambda-runtime-deadline-ms"]),
                    "invoked_function_arn": invocation.headers.get(
                        "lambda-runtime-invoked-function-arn", ""
                    ),
                }
                upstream = forward(app, base_url, invocation.json(), lambda_context)
                runtime.post(
                    f"http://{api}/2018-06-01/runtime/invocation/{request_id}/response",
                    headers={
                        "Lambda-Runtime-Function-Response-Mode": "streaming",
                        "Content-Type": "application/vnd.awslambda.http-integration-response",
                    },
                    content=streamed_body(upstream),
                )
    finally:
        child.terminate()
        child.wait(10)


if __name__ == "__main__":
    main()
