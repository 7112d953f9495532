"""The OpenAPI document is the contract: schemathesis fuzzes the real server against it.

The server runs every router on the local stack (history and state on moto's DynamoDB
server, memory on redis-server, idempotency records with the history). The run is
bounded (a fixed seed and a number of examples per operation, a couple of minutes) and
fails on any server error but a deliberate 503, any response that breaks its schema, and
any status code or content type the document does not list.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.settings import load_settings
from tests.support.http import issue_key, running

SEED = 20261122
MAX_EXAMPLES = 15
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)
# A store that is down answers 503 on purpose; nothing else may be a server error.
CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""


@pytest.fixture(scope="module")
def local_stack_server(
    redis_server: RedisServer, dynamodb_server: DynamoDBServer
) -> Iterator[tuple[str, str]]:
    """The API on the local stack, and a user key."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(
            session_history_backend="dynamodb",
            state_backend="dynamodb",
            memory_backend="redis",
            redis_url=redis_server.url,
            dynamodb_endpoint_url=dynamodb_server.endpoint_url,
            aws_region=dynamodb_server.region,
        )
        store = InMemoryKeyStore()
        key = issue_key(store, f"fuzz-{uuid.uuid4().hex[:8]}")
        with running(create_app(settings=settings, agent_app=demo_app, key_store=store)) as url:
            yield url, key


@pytest.mark.timeout(600)
def test_the_server_keeps_its_openapi_contract_under_fuzzing(
    local_stack_server: tuple[str, str], tmp_path: Path
) -> None:
    url, key = local_stack_server
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--no-color",
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        "--checks",
        ",".join(CHECKS),
        "--seed",
        str(SEED),
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--max-time",
        "150",
        "--header",
        f"Authorization: Bearer {key}",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        cwd=tmp_path,  # its caches and crash files stay out of the repository
        check=False,
    )
    output = result.stdout + result.stderr
    print(output[-4000:])
    cases = re.search(r"(\d+) generated", output)
    assert cases is not None and int(cases.group(1)) > 500, output[-4000:]
    assert result.returncode == 0, output[-8000:]
