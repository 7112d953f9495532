"""Fixtures shared by the whole suite: unique user ids, the local stores, a sandbox server,
the SAM build.

The stores are real servers on loopback ports, started once per test session by
:mod:`agentscope_serverless.local_stack` (Redis needs ``redis-server``: without it the
tests that use it fail with the command that installs it).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.local_stack import DynamoDBServer, RedisClusterServer, RedisServer
from tests.support.sandbox_server import LIMITS, RunningServer, start_server, stop_server

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Servers run in threads of the test process and log a JSON line per request; keep them out
# of the test output (set POWERTOOLS_LOG_LEVEL=INFO to see them). The logging itself is
# tested on a server process of its own (tests/cli). Set before the logger is first imported.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")


@pytest.fixture
def warnings_logged() -> Iterator[None]:
    """The runtime's logger at WARNING for one test (the suite logs only critical lines)."""
    from agentscope_serverless.log import logger

    level = logger.level
    logger.setLevel("WARNING")
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.fixture
def user_id() -> str:
    """A user id no other test uses, so durable backends need no cleaning between tests."""
    return f"user-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A standalone Redis shared by the session's tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster_server() -> Iterator[RedisClusterServer]:
    """A three-node Redis Cluster shared by the session's tests."""
    with RedisClusterServer() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def dynamodb_server() -> Iterator[DynamoDBServer]:
    """moto's DynamoDB server with the project's tables, shared by the session's tests."""
    with DynamoDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[RunningServer]:
    """One server for the whole session, with tight limits."""
    # Not under pytest's own temp dir: the sandbox uid must be able to reach the workspaces.
    root = Path(tempfile.mkdtemp(prefix="sandbox-server-"))
    server = start_server(root, *LIMITS)
    yield server
    stop_server(server)
    shutil.rmtree(root, ignore_errors=True)


def without_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave botocore's credential chain nothing to find: no AWS_* variables, no files, no IMDS."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, build: Callable[[], Any]
) -> dict[str, Any]:
    """``build()``'s report, made once per test run: the first worker process to need it
    builds, the others wait for its report (its files are in that worker's temp dir)."""
    if worker_id == "master":  # not distributed
        built: dict[str, Any] = build()
        return built
    run_dir = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers
    report = run_dir / f"{name}.json"
    with (run_dir / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not report.exists():
            report.write_text(json.dumps(build(), default=str))
        reported: dict[str, Any] = json.loads(report.read_text())
        return reported


@pytest.fixture(scope="session")
def sam_offline_deploy(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """What ``SAMDeployManager.deploy()`` reports without AWS credentials: it validated and
    built the stack (``sam build``, no Docker) and deployed nothing. Runs once per test run
    (about a minute: the layer installs every pinned dependency)."""
    from agentscope_serverless.deployers import SAMDeployManager

    def deploy() -> dict[str, Any]:
        build_dir = tmp_path_factory.mktemp("sam") / "build"
        manager = SAMDeployManager(PROJECT_ROOT, "agentscope-serverless-test", build_dir=build_dir)
        with pytest.MonkeyPatch.context() as monkeypatch:
            without_aws_credentials(monkeypatch)
            return manager.deploy_sync()

    return once_per_run(tmp_path_factory, worker_id, "sam-offline-deploy", deploy)


@pytest.fixture(scope="session")
def sam_build_dir(sam_offline_deploy: dict[str, Any]) -> Path:
    """The ``sam build`` output of template.yaml: ``<LogicalId>/`` per function (both process
    variants), ``SharedLayer/python/`` and the built ``template.yaml``. Built once per session;
    the first test to use it needs a time limit above a minute (``@pytest.mark.timeout``)."""
    return Path(sam_offline_deploy["build_dir"])
