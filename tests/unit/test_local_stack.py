"""The local stack explains what is missing, and the table definitions stay in one place."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.infra.dynamodb_tables import as_json
from agentscope_serverless.local_stack import RedisServer, free_port

REPOSITORY = Path(__file__).resolve().parents[2]


def test_a_missing_redis_server_fails_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agentscope_serverless.local_stack.shutil.which", lambda name: None)
    with pytest.raises(ConfigurationError, match=r"apt-get install -y redis-server"):
        RedisServer()


def test_the_table_json_in_infra_is_generated_from_the_definitions() -> None:
    # Regenerate: python -m agentscope_serverless.infra.dynamodb_tables > infra/dynamodb-tables.json
    assert (REPOSITORY / "infra" / "dynamodb-tables.json").read_text() == as_json()


def test_a_port_is_given_once_even_when_the_kernel_offers_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The servers of a stack get their ports before any of them binds: the kernel may offer
    the same free port twice (moto was once given Redis's)."""
    offered = iter([40001, 40001, 40001, 40002])

    class Probe(socket.socket):
        def getsockname(self) -> Any:
            return ("127.0.0.1", next(offered))

    monkeypatch.setattr("agentscope_serverless.local_stack._GIVEN_PORTS", set())
    monkeypatch.setattr("agentscope_serverless.local_stack.socket.socket", Probe)
    assert [free_port(), free_port()] == [40001, 40002]
