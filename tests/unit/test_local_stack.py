"""The local stack explains what is missing, and the table definitions stay in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.infra.dynamodb_tables import as_json
from agentscope_serverless.local_stack import RedisServer

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
