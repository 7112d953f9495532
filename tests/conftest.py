"""Fixtures shared by the whole suite: unique user ids, the local stores, a sandbox server.

The stores are real servers on loopback ports, started once per test session by
:mod:`agentscope_serverless.local_stack` (Redis needs ``redis-server``: without it the
tests that use it fail with the command that installs it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_serverless.local_stack import DynamoDBServer, RedisClusterServer, RedisServer
from tests.support.sandbox_server import LIMITS, RunningServer, start_server, stop_server

# Servers run in threads of the test process and log a JSON line per request; keep them out
# of the test output (set POWERTOOLS_LOG_LEVEL=INFO to see them). The logging itself is
# tested on a server process of its own (tests/cli). Set before the logger is first imported.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")


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
