"""Run the functions the way Lambda does: built artifact, runtime interface client, Function URL
events, on the shared stores (moto's DynamoDB and Redis on loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.local_stack import DynamoDBServer, RedisServer
from agentscope_serverless.packaging import sam
from tests.support.http import free_port, issue_key
from tests.support.lambda_runtime import Invocation, LambdaRuntimeAPI, function_url_event

ROOT = Path(__file__).resolve().parents[2]
WEB_ADAPTER = ROOT / "tests" / "support" / "web_adapter.py"


@dataclass
class Artifact:
    """A built function: its code directory and the layer directory on its path."""

    code_dir: Path
    layer_dir: Path


@pytest.fixture(scope="session")
def lambda_artifacts(sam_build_dir: Path) -> Callable[[str], Artifact]:
    """The SAM-built function ``name`` (logical id), with the built shared layer."""

    def artifact(name: str) -> Artifact:
        return Artifact(sam_build_dir / name, sam_build_dir / "SharedLayer" / "python")

    return artifact


@pytest.fixture(scope="session")
def function_environment(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
    dynamodb_server: DynamoDBServer,
) -> dict[str, str]:
    """The settings every function gets: durable stores on loopback and a file of API keys."""
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    return {
        "SESSION_HISTORY_BACKEND": "dynamodb",
        "STATE_BACKEND": "dynamodb",
        "MEMORY_BACKEND": "redis",
        "REDIS_URL": redis_server.url,
        "DYNAMODB_ENDPOINT_URL": dynamodb_server.endpoint_url,
        "DYNAMODB_SESSIONS_TABLE": dynamodb_server.sessions_table,
        "DYNAMODB_STATE_TABLE": dynamodb_server.state_table,
        "AWS_REGION": dynamodb_server.region,
        "AWS_DEFAULT_REGION": dynamodb_server.region,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys_file),
        "SSE_PING_INTERVAL_SECONDS": "5",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }


@pytest.fixture(scope="session")
def api_key(function_environment: dict[str, str]) -> str:
    return issue_key(FileKeyStore(Path(function_environment["AUTH_KEYS_FILE"])), "lambda-user")


class RunningFunction:
    """One function in its own processes, fed Function URL events through the Runtime API."""

    def __init__(self, runtime: LambdaRuntimeAPI, processes: list[subprocess.Popen[bytes]]):
        self.runtime = runtime
        self.processes = processes

    def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        body: Any = None,
        query: str = "",
        iam: dict[str, str] | None = None,
        time_limit: float = 60.0,
    ) -> tuple[int, dict[str, str], bytes, Invocation]:
        """Invoke the function with a Function URL request; it has ``time_limit`` seconds
        to answer (the invocation's deadline), as if that were its ``Timeout``."""
        headers = {"content-type": "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        payload = None if body is None else json.dumps(body)
        invocation = self.runtime.invoke(
            function_url_event(method, path, headers=headers, body=payload, query=query, iam=iam),
            timeout=time_limit,
        )
        status, response_headers, content = invocation.http_response()
        return status, {k.lower(): v for k, v in response_headers.items()}, content, invocation

    def stop(self) -> None:
        # Lambda freezes and discards execution environments without notice: so do we,
        # with every process of the environment (the adapter's web server too).
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        self.runtime.stop()


def _environment(artifact: Artifact, runtime: LambdaRuntimeAPI, extra: dict[str, str]) -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "AWS_LAMBDA_RUNTIME_API": runtime.address,
        "AWS_LAMBDA_FUNCTION_NAME": artifact.code_dir.name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
        "LAMBDA_TASK_ROOT": str(artifact.code_dir),
        "PYTHONPATH": f"{artifact.code_dir}:{artifact.layer_dir}",
        **extra,
    }


def web_adapter_settings(artifact: Artifact) -> dict[str, str]:
    """The Web Adapter's settings (``AWS_LWA_*``) the built template gives the function."""
    template = sam.load_template(artifact.code_dir.parent / "template.yaml")
    variables = template["Resources"][artifact.code_dir.name]["Properties"]["Environment"][
        "Variables"
    ]
    return {k: str(v) for k, v in variables.items() if k.startswith("AWS_LWA_")}


def start_built_function(
    artifact: Artifact, settings: dict[str, str], *, output: IO[bytes] | None = None
) -> RunningFunction:
    """Start a built function with ``settings`` in its environment: under the runtime interface
    client, or (the streaming function, with its ``run.sh``) behind the web adapter. Its
    output (stdout and stderr, its log) goes to ``output`` when given."""
    runtime = LambdaRuntimeAPI().start()
    env = _environment(artifact, runtime, settings)
    if (artifact.code_dir / "run.sh").exists():
        port = free_port()
        env.update(web_adapter_settings(artifact))
        env.update({"AWS_LWA_PORT": str(port), "PORT": str(port)})
        command = [sys.executable, "-I", str(WEB_ADAPTER), "./run.sh"]
    else:
        command = [sys.executable, "-m", "awslambdaric", "agentscope_handler.handler"]
    process = subprocess.Popen(
        command,
        cwd=artifact.code_dir,
        env=env,
        start_new_session=True,
        stdout=output,
        stderr=None if output is None else subprocess.STDOUT,
    )
    return RunningFunction(runtime, [process])


@pytest.fixture(scope="session")
def start_function(
    lambda_artifacts: Callable[[str], Artifact], function_environment: dict[str, str]
) -> Iterator[Callable[..., RunningFunction]]:
    """Start a function by logical id; each is started once per session and shared."""
    running: dict[tuple[str, tuple[tuple[str, str], ...]], RunningFunction] = {}

    def start(name: str, **settings: str) -> RunningFunction:
        """``settings`` are extra environment variables, e.g. ``AUTH_MODE="iam"``."""
        cache_key = (name, tuple(sorted(settings.items())))
        if cache_key in running:
            return running[cache_key]
        artifact = lambda_artifacts(name)
        running[cache_key] = start_built_function(artifact, {**function_environment, **settings})
        return running[cache_key]

    yield start
    for function in running.values():
        function.stop()
